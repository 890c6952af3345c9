#!/usr/bin/env python3
"""roce_probe.py -- host side of the netns scenario (stdlib only, runs inside the lab netns).

The host has no RDMA stack.  This program speaks RoCEv2 (UDP 4791, BTH+DETH+MAD+ICRC) to the
VM's rdma_rxe directly, the way ibcm's RoCEv2-UDP transport will, and finds out which ways of
sending get past rxe's ICRC check.  rxe drops a packet with a bad ICRC silently, so each probe
sends a CM REQ for a Service ID nobody listens on: the VM's kernel CM answers REJ reason 8 if
(and only if) rxe accepted the packet.

The RoCEv2 ICRC covers the IPv4 header except TOS, TTL and checksum -- so also the IP ID, the
flags (DF) and the total length.  A program that sends through an ordinary UDP socket must
therefore predict the IP ID that the host kernel will put there.  Probes:

  udp4-pmtudisc-do  UDP socket bound to HOST:4791, IP_MTU_DISCOVER=IP_PMTUDISC_DO, sendto()
                    (never connect()ed): DF set and skb->ignore_df clear, so Linux's
                    ip_select_ident_segs() writes IP ID 0 -> predicted header: ID 0, DF
  udp4-default      unconnected, default IP_PMTUDISC_WANT: DF is set too, but ignore_df is,
                    so the kernel writes a hashed, unpredictable ID; predicted 0 (fails)
  udp4-connected    connect()ed socket (PMTUDISC_DO): the ID comes from a per-socket counter
                    seeded randomly at connect(); predicted ID 0 (fails)
  udp4-nodf         unconnected, IP_PMTUDISC_DONT: no DF, hashed ID; predicted 0 (fails)
  raw4-hdrincl      raw IPv4 socket, the program writes the IP header itself (ID 0x4242, DF)
  udp6              UDP over IPv6 (no ID field; traffic class/flow label/hop limit are masked)

Every frame leaving the host is also sniffed on the tap (AF_PACKET) to report the IP ID the
kernel really used.  After the probes it serves as a passive "CM": every REQ it receives on
UDP 4791 (from the VM's kernel, e.g. cmpeer client) is answered with REJ 28 + private data,
sent through the plain unconnected UDP socket with a predicted header.

Environment (set by lab.sh run-netns): LAB_HOST_IP LAB_VM_IP LAB_HOST_IP6 LAB_VM_IP6 LAB_TAP
LAB_SHARE.  Exit 0 iff the expected probes were answered and the expected ones were not."""
import os
import select
import socket
import struct
import sys
import time
import zlib

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import pcaptool  # noqa: E402  (icrc, decode_cm)

ROCE = 4791
GSI_QKEY = 0x80010000
HOST4, VM4 = os.environ["LAB_HOST_IP"], os.environ["LAB_VM_IP"]
HOST6, VM6 = os.environ["LAB_HOST_IP6"], os.environ["LAB_VM_IP6"]
TAP = os.environ.get("LAB_TAP", "ibcmtap0")
SYNC = os.path.join(os.environ["LAB_SHARE"], "sync")
CA_GUID = bytes.fromhex("02686f73742d6361")        # made-up host CA GUID
IP_MTU_DISCOVER, IP_PMTUDISC_DO = 10, 2


def say(*a):
    print(*a, flush=True)


def wait_file(name, secs):
    end = time.time() + secs
    while time.time() < end:
        if os.path.exists(os.path.join(SYNC, name)):
            return True
        time.sleep(0.1)
    return False


def mark(name):
    with open(os.path.join(SYNC, name), "w") as f:
        f.write("%f\n" % time.time())


def gid(addr):
    if ":" in addr:
        return socket.inet_pton(socket.AF_INET6, addr)
    return b"\x00" * 10 + b"\xff\xff" + socket.inet_aton(addr)


def build_req(lcid, tid, sid, src, dst, qpn):
    mad = bytearray(256)
    mad[0:4] = bytes([1, 0x07, 2, 0x03])                    # base 1, CM, class ver 2, Send
    mad[8:16] = struct.pack("!Q", tid)
    mad[16:18] = struct.pack("!H", 0x0010)
    m = bytearray(232)
    m[0:4] = struct.pack("!I", lcid)
    m[8:16] = struct.pack("!Q", sid)
    m[16:24] = CA_GUID
    m[32:35] = qpn.to_bytes(3, "big")
    m[35] = 1                                                # responder resources
    m[39] = 1                                                # initiator depth
    m[43] = (20 << 3) | (0 << 1)                             # remote CM resp timeout 20, RC
    m[44:47] = (0x123456).to_bytes(3, "big")
    m[47] = (20 << 3) | 7                                    # local CM resp timeout, retry 7
    m[48:50] = b"\xff\xff"
    m[50] = (3 << 4) | 7                                     # MTU 1024, RNR retry 7
    m[51] = (15 << 4)                                        # max CM retries 15
    m[52:56] = b"\xff\xff\xff\xff"                           # permissive LIDs (RoCEv2)
    m[56:72] = gid(src)
    m[72:88] = gid(dst)
    m[93] = 64                                               # hop limit
    m[95] = 19 << 3                                          # local ACK timeout
    mad[24:256] = m
    return bytes(mad)


def build_rej(req_mad, reason, pd):
    mad = bytearray(256)
    mad[0:4] = bytes([1, 0x07, 2, 0x03])
    mad[8:16] = req_mad[8:16]                                # TID of the REQ
    mad[16:18] = struct.pack("!H", 0x0012)
    mad[24:28] = struct.pack("!I", 0x686F7374)               # our local comm id ("host")
    mad[28:32] = req_mad[24:28]                              # remote comm id = REQ's local
    mad[32] = 0 << 6                                         # message rejected: REQ
    mad[34:36] = struct.pack("!H", reason)
    mad[108:108 + len(pd)] = pd
    return bytes(mad)


def bth_deth(mad, psn=0):
    return struct.pack("!BBHII", 0x64, 0, 0xFFFF, 1, 0x80000000 | psn) + struct.pack("!II", GSI_QKEY, 1) + mad


def ipv4_hdr(src, dst, payload_len, ip_id, df):
    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + payload_len, ip_id, 0x4000 if df else 0, 64, 17, 0,
                       socket.inet_aton(src), socket.inet_aton(dst))


def udp_payload_v4(src, dst, sport, ib, ip_id, df):
    """BTH..MAD + ICRC computed over the IPv4/UDP headers we predict the kernel will build"""
    udp_len = 8 + len(ib) + 4
    udp = struct.pack("!HHHH", sport, ROCE, udp_len, 0)
    ip = ipv4_hdr(src, dst, udp_len, ip_id, df)
    return ib + struct.pack("<I", pcaptool.icrc(4, ip, udp, ib))


def udp_payload_v6(src, dst, sport, ib):
    udp_len = 8 + len(ib) + 4
    udp = struct.pack("!HHHH", sport, ROCE, udp_len, 0)
    ip = struct.pack("!IHBB16s16s", 0x60000000, udp_len, 17, 64, socket.inet_pton(socket.AF_INET6, src),
                     socket.inet_pton(socket.AF_INET6, dst))
    return ib + struct.pack("<I", pcaptool.icrc(6, ip, udp, ib))


class Sniffer:
    """AF_PACKET on the tap: sees our own outgoing frames (real IP ID) and rxe's answers"""

    def __init__(self, ifname):
        self.s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
        self.s.bind((ifname, 0))
        self.s.setblocking(False)

    def drain(self):
        out = []
        while True:
            try:
                out.append(self.s.recv(65535))
            except BlockingIOError:
                return out


def roce_frames(frames):
    res = []
    for f in frames:
        r = pcaptool.ip_udp(f)
        if not r or struct.unpack("!H", r[2][2:4])[0] != ROCE:
            continue
        fam, ip, udp, pay, src, dst = r
        d = {"fam": fam, "src": src, "dst": dst, "icrc_ok": struct.unpack("<I", pay[-4:])[0] == pcaptool.icrc(fam, ip, udp, pay[:-4])}
        if fam == 4:
            d["ip_id"] = struct.unpack("!H", ip[4:6])[0]
            d["df"] = bool(ip[6] & 0x40)
        if len(pay) >= 20 + 256 and pay[20 + 1] == 0x07:
            d.update(pcaptool.decode_cm(pay[20:276]))
        res.append(d)
    return res


def main():
    say("roce_probe: host %s / %s, vm %s / %s, tap %s" % (HOST4, HOST6, VM4, VM6, TAP))
    if not wait_file("vm.ready", 90):
        say("roce_probe: VM never became ready")
        return 1
    sn = Sniffer(TAP)
    # the one socket that owns UDP 4791 on the host address: receives everything rxe sends us
    s4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s4.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)   # -> IP ID 0
    s4.bind((HOST4, ROCE))
    sdef = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # default PMTU discovery (WANT)
    sdef.bind((HOST4, 0))
    s6 = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    s6.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    try:
        s6.setsockopt(socket.IPPROTO_UDP, 102, 1)          # UDP_NO_CHECK6_RX: accept csum 0
    except OSError:
        pass
    s6.bind((HOST6, ROCE))
    sc = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)    # connected variant
    sc.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, IP_PMTUDISC_DO)
    sc.bind((HOST4, 0))
    sc.connect((VM4, ROCE))
    snd = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)   # no-DF variant
    snd.bind((HOST4, 0))
    snd.setsockopt(socket.IPPROTO_IP, IP_MTU_DISCOVER, 0)    # IP_PMTUDISC_DONT
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)   # IP_HDRINCL
    for s in (s4, s6):
        s.setblocking(False)
    sn.drain()

    results = {}
    probes = [("udp4-pmtudisc-do", True), ("udp4-default", False), ("udp4-connected", False), ("udp4-nodf", False),
              ("raw4-hdrincl", True), ("udp6", True)]
    for i, (name, expect) in enumerate(probes):
        lcid, tid = 0x70726f00 + i, 0x00000000AB000000 + i
        v6 = name == "udp6"
        src, dst = (HOST6, VM6) if v6 else (HOST4, VM4)
        mad = build_req(lcid, tid, 0x0000000001069999, src, dst, 0x100 + i)
        ib = bth_deth(mad, psn=i)
        if name == "udp4-pmtudisc-do":
            s4.sendto(udp_payload_v4(HOST4, VM4, ROCE, ib, 0, True), (VM4, ROCE))
        elif name == "udp4-default":
            sdef.sendto(udp_payload_v4(HOST4, VM4, sdef.getsockname()[1], ib, 0, True), (VM4, ROCE))
        elif name == "udp4-connected":
            sc.send(udp_payload_v4(HOST4, VM4, sc.getsockname()[1], ib, 0, True))
        elif name == "udp4-nodf":
            snd.sendto(udp_payload_v4(HOST4, VM4, snd.getsockname()[1], ib, 0, False), (VM4, ROCE))
        elif name == "raw4-hdrincl":
            udp_len = 8 + len(ib) + 4
            udp = struct.pack("!HHHH", ROCE, ROCE, udp_len, 0)
            ip = ipv4_hdr(HOST4, VM4, udp_len, 0x4242, True)
            raw.sendto(ip + udp + udp_payload_v4(HOST4, VM4, ROCE, ib, 0x4242, True), (VM4, 0))
        else:
            s6.sendto(udp_payload_v6(HOST6, VM6, ROCE, ib), (VM6, ROCE))
        # wait for the answer: a REJ whose remote comm id is ours
        got, sent_id, end = None, None, time.time() + 2.0
        while time.time() < end and not got:
            select.select([s4, s6, sn.s], [], [], 0.1)
            for s in (s4, s6):
                try:
                    s.recv(4096)
                except BlockingIOError:
                    pass
            for d in roce_frames(sn.drain()):
                if d.get("msg") == "REQ" and d.get("lcid") == "0x%08x" % lcid:
                    sent_id = d.get("ip_id")
                if d.get("msg") == "REJ" and d.get("rcid") == "0x%08x" % lcid:
                    got = d
        ok = (got is not None) == expect
        results[name] = ok
        if got:
            say("PROBE %s: ANSWERED by REJ reason=%d (rxe accepted our ICRC) wire_ip_id=%s rej_ip_id=%s rej_icrc_ok=%s -> %s"
                % (name, got["reason"], sent_id, got.get("ip_id"), got["icrc_ok"], "as expected" if ok else "UNEXPECTED"))
        else:
            say("PROBE %s: NO ANSWER (rxe dropped it: ICRC computed with predicted ID 0 but wire_ip_id=%s) -> %s"
                % (name, sent_id, "as expected" if ok else "UNEXPECTED"))
    mark("host.probes.done")

    # passive part: answer the VM kernel's REQs with REJ 28 + private data via the plain socket
    served, end = 0, time.time() + 60
    pd = b"host-ibcm-says-no"
    while time.time() < end and not os.path.exists(os.path.join(SYNC, "vm.done")):
        r, _, _ = select.select([s4], [], [], 0.2)
        frames = {d.get("lcid"): d for d in roce_frames(sn.drain()) if d.get("msg") == "REQ"}
        if not r:
            continue
        data, peer = s4.recvfrom(4096)
        if len(data) < 20 + 256 + 4 or data[0] != 0x64 or data[21] != 0x07:
            continue
        mad = data[20:276]
        d = pcaptool.decode_cm(mad)
        if d["msg"] != "REQ":
            say("HOST-RX %s from %s (ignored)" % (d["msg"], peer))
            continue
        w = frames.get(d["lcid"], {})
        say("HOST-RX REQ from %s:%d lcid=%s sid=%s upd=%s (wire ip_id=%s icrc_ok=%s; a UDP socket does not see the IP ID, so it cannot check the ICRC itself)"
            % (peer[0], peer[1], d["lcid"], d["sid"], d.get("upd"), w.get("ip_id"), w.get("icrc_ok")))
        rej = bth_deth(build_rej(mad, 28, pd), psn=served)
        s4.sendto(udp_payload_v4(HOST4, peer[0], ROCE, rej, 0, True), (peer[0], ROCE))
        served += 1
        say("HOST-TX REJ reason=28 pd=%s to %s:4791 (plain unconnected UDP socket with IP_PMTUDISC_DO, predicted IP ID 0)" % (pd.hex(), peer[0]))
    say("roce_probe: answered %d REQ(s)" % served)
    good = all(results.values()) and served >= 1
    say("ROCE-PROBE-RESULT %s %s" % ("ok" if good else "fail", " ".join("%s=%s" % kv for kv in results.items())))
    return 0 if good else 1


if __name__ == "__main__":
    sys.exit(main())
