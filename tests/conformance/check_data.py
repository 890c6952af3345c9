"""check_data.py -- the data cells (scenarios/ibcm-data.sh), called by check.py: ibcm's
`cm-ping --verbs rxe0` brings up real RC QPs through its CM and exchanges data with the
kernel's rping and ucmatose, both directions.

data_cells(out) prints one cell line per data cell and returns the `data:` summary line."""
import os
import re

from check_ibcm import cut_cells
from labcells import Check, cell, cm_list, handshake_audit, read, resent, seq, summary_of
import pcaptool

RUN = "ibcm-data"
K, I = "10.77.0.1", "10.77.0.2"
RPING_PINGS, RPING_SIZE = 20, 64
UCMA_MSGS, UCMA_SIZE = 10, 100
NCMT = 100
CELLS = ("data-rping-pas", "data-rping-act", "data-ucmatose-pas", "data-ucmatose-act", "data-cmtime-pas",
         "data-cmtime-act", "capi-ucmatose-act", "capi-ucmatose-pas")
# the capi-* cells: libibcm's C peer (tests/conformance/src/capi_peer.c) through ibcmd
CAPI_PORTS = {"capi-ucmatose-act": 7505, "capi-ucmatose-pas": 7506}

# BTH opcodes of RC (IBTA 9.2): what the data of each cell must show on the wire
OP_NAMES = {0x04: "SEND", 0x0a: "WRITE", 0x0c: "READ-REQ", 0x10: "READ-RESP", 0x11: "ACK"}


def rping_pattern(ping, size):
    """rping's buffer for ping number PING (librdmacm/examples/rping.c rping_test_client)"""
    b = bytearray(("rdma-ping-%d: " % ping).encode()[:size - 1])
    c = 65 + ping % 58
    while len(b) < size:
        b.append(c)
        c = 65 if c >= 122 else c + 1
    b[-1] = 0
    return bytes(b)


def data_summary(txt):
    """cm-ping's ', N data verified, F data failed, B bytes verified' -> (N, F, B) or None"""
    m = re.findall(r"^cm-ping: .*, (\d+) data verified, (\d+) data failed, (\d+) bytes verified", txt, re.M)
    return tuple(int(x) for x in m[-1]) if m else None


def rc_ops(pcap):
    """RC opcodes on the wire of one cell: {name: count} for RoCEv2 packets not to QP1"""
    if not os.path.exists(pcap):
        return {}
    _, frames = pcaptool.read_pcap(pcap)
    ops = {}
    for _, _, pkt in frames:
        r = pcaptool.ip_udp(pkt)
        if not r or r[2][2:4] != b"\x12\xb7" or len(r[3]) < 16:
            continue
        pay = r[3]
        if int.from_bytes(pay[5:8], "big") == 1:
            continue
        name = OP_NAMES.get(pay[0], "0x%02x" % pay[0])
        ops[name] = ops.get(name, 0) + 1
    return ops


def data_cells(out):
    run = os.path.join(out, RUN)
    res = os.path.join(run, "share", "results")
    have_pcap = cut_cells(run)
    outp = lambda role, n: read(os.path.join(res, "%s.%s.out" % (role, n)))  # noqa: E731
    rc = lambda role, n: read(os.path.join(res, "%s.%s.rc" % (role, n))).strip()  # noqa: E731
    summary = []

    def common(c, name, ibcm_role, want_bytes, ops_needed):
        """cm-ping's summary (1 connection, data verified), the wire (REQ REP RTU ... DREQ
        DREP and RC data of the kinds OPS_NEEDED); -> ibcm's verified bytes"""
        txt = outp("b", name)
        s, d = summary_of(txt), data_summary(txt)
        c(s is not None and s[0] == 1 and s[1:3] == (0, 0) and s[3] == 1 and s[4] == 0,
          "cm-ping summary %s (want 1 established, 1 disconnected)" % (s,))
        c(d == (1, 0, want_bytes), "cm-ping data %s, want (1 verified, 0 failed, %d bytes)" % (d, want_bytes))
        c("data verified conn=" in txt, "no 'data verified' line from cm-ping")
        pc = os.path.join(run, "cells", name + ".pcap")
        m = cm_list(pc)
        c(have_pcap and seq(m).startswith("REQ REP RTU") and seq(m).endswith("DREQ DREP"),
          "wire %r" % seq(m))
        ops = rc_ops(pc)
        for op in ops_needed:
            c(ops.get(op, 0) > 0, "no RC %s on the wire (%s)" % (op, ops))
        return (d[2] if d else 0), ops

    # kernel rping client -> ibcm rping server
    name = "data-rping-pas"
    c = Check()
    k = outp("a", name)
    lines = re.findall(r"^ping data: (.*)$", k, re.M)
    c(rc("a", name) == "0", "kernel rping -c exit %r: %s" % (rc("a", name), k.strip()[-300:]))
    c("data mismatch" not in k, "kernel rping -V: data mismatch")
    c(len(lines) == RPING_PINGS, "kernel rping printed %d pings, want %d" % (len(lines), RPING_PINGS))
    want = RPING_PINGS * RPING_SIZE
    ib, ops = common(c, name, "b", want, ("SEND", "READ-REQ", "READ-RESP", "WRITE"))
    kb = RPING_SIZE * len(lines) if rc("a", name) == "0" else 0
    c.done(name, "kernel rping -c -V -C %d: %d B compared by the kernel after ibcm's RDMA WRITE, %d B of its "
           "pattern checked by ibcm after its RDMA READ; wire %s" % (RPING_PINGS, kb, ib, ops))
    summary.append("%s %d B (ibcm %d + kernel %d)" % (name, ib + kb, ib, kb))

    # ibcm rping client -> kernel rping server
    name = "data-rping-act"
    c = Check()
    k = outp("a", name)
    lines = re.findall(r"^server ping data: (.*)$", k, re.M)
    c(rc("b", name) == "0", "cm-ping exit %r" % rc("b", name))
    c(rc("a", name) == "0", "kernel rping -s exit %r: %s" % (rc("a", name), k.strip()[-300:]))
    good = sum(1 for i, l in enumerate(lines) if l.encode() == rping_pattern(i, RPING_SIZE)[:-1])
    c(len(lines) == RPING_PINGS and good == RPING_PINGS,
      "kernel rping -s printed %d pings, %d of them rping's pattern" % (len(lines), good))
    ib, ops = common(c, name, "b", want, ("SEND", "READ-REQ", "READ-RESP", "WRITE"))
    kb = RPING_SIZE * good
    c.done(name, "cm-ping --verbs --pings %d vs kernel rping -s: %d B read by the kernel match rping's pattern, "
           "%d B compared by ibcm after the kernel's RDMA WRITE; wire %s" % (RPING_PINGS, kb, ib, ops))
    summary.append("%s %d B (ibcm %d + kernel %d)" % (name, ib + kb, ib, kb))

    # ucmatose both ways: the kernel checks nothing (it sends an uninitialised buffer); ibcm
    # checks that every message arrived with its length
    for name, kind in (("data-ucmatose-pas", "client"), ("data-ucmatose-act", "server")):
        c = Check()
        k = outp("a", name)
        c(rc("a", name) == "0" and "return status 0" in k,
          "kernel ucmatose %s exit %r: %s" % (kind, rc("a", name), k.strip()[-300:]))
        if name.endswith("act"):
            c(rc("b", name) == "0", "cm-ping exit %r" % rc("b", name))
        ib, ops = common(c, name, "b", UCMA_MSGS * UCMA_SIZE, ("SEND",))
        sends = ops.get("SEND", 0)
        c(sends >= 2 * UCMA_MSGS, "%d RC SENDs on the wire, want %d" % (sends, 2 * UCMA_MSGS))
        c.done(name, "kernel ucmatose %s -C %d -S %d: %d messages each way; ibcm received %d B, every message "
               "%d B long (ucmatose's contents are uninitialised); wire %s"
               % (kind, UCMA_MSGS, UCMA_SIZE, UCMA_MSGS, ib, UCMA_SIZE, ops))
        summary.append("%s %d B (ibcm, lengths)" % (name, ib))

    # cmtime both ways: real QPs on both sides, no data; every REQ/REP names a QP that ibcm
    # created on rxe0 (its "established ... qpn=" lines) and the protocol is complete
    for name, kind in (("data-cmtime-pas", "client"), ("data-cmtime-act", "server")):
        c = Check()
        k, txt = outp("a", name), outp("b", name)
        if kind == "client":
            c(rc("a", name) == "0", "kernel cmtime client exit %r: %s" % (rc("a", name), k.strip()[-300:]))
        else:
            c(rc("b", name) == "0", "cm-ping exit %r: %s" % (rc("b", name), txt.strip()[-300:]))
        s = summary_of(txt)
        c(s == (NCMT, 0, 0, NCMT, 0), "cm-ping summary %s, want %d established and disconnected" % (s, NCMT))
        # the listener's event lines are rate-limited (200/s), so some "established" lines may
        # be missing there: every printed QP must be on the wire, and the wire must name NCMT
        # distinct QPs
        qpns = {"0x%x" % int(q, 16) for q in re.findall(r"^established conn=\S+ qpn=(0x[0-9a-f]+) .*RTS$", txt, re.M)}
        m = cm_list(os.path.join(run, "cells", name + ".pcap"))
        bad, totals = handshake_audit(m, NCMT)
        for b in bad:
            c(False, "wire: " + b)
        ibcm_msgs = [d for d in m if d["src"] == I and d["msg"] == ("REP" if kind == "client" else "REQ")]
        wire_qpns = {"0x%x" % int(d["qpn"], 16) for d in ibcm_msgs if "qpn" in d}
        c(len(wire_qpns) == NCMT, "%d distinct QPNs in ibcm's messages, want %d" % (len(wire_qpns), NCMT))
        c(qpns and qpns <= wire_qpns, "the QPs cm-ping brought to RTS (%d printed) are not those on the wire"
          % len(qpns))
        if kind == "server":
            c(len(qpns) == NCMT, "%d QPs brought to RTS by cm-ping, want %d" % (len(qpns), NCMT))
        c.done(name, "kernel cmtime %s -c %d: %d connections, each on a real rxe QP of ibcm's (INIT/RTR/RTS from "
               "ibcm::qp_attr) named in its %s (%d distinct; %d of them printed at RTS); %s"
               % (kind, NCMT, NCMT, "REP" if kind == "client" else "REQ", len(wire_qpns), len(qpns),
                  resent(totals, NCMT)))
        summary.append("%s %d QPs, 0 B" % (name, len(wire_qpns)))
    # a C program on libibcm, through ibcmd on umad0, and the kernel's rdma_cm by IP and port
    for name, kind in (("capi-ucmatose-act", "server"), ("capi-ucmatose-pas", "client")):
        c = Check()
        k, txt = outp("a", name), outp("b", name)
        port = CAPI_PORTS[name]
        c(rc("a", name) == "0" and "return status 0" in k,
          "kernel ucmatose %s exit %r: %s" % (kind, rc("a", name), k.strip()[-300:]))
        c(rc("b", name) == "0" and "capi-peer: ok" in txt,
          "capi-peer exit %r: %s" % (rc("b", name), txt.strip()[-400:]))
        c(re.search(r"^event ESTABLISHED ", txt, re.M) is not None, "capi-peer saw no ESTABLISHED")
        by_peer = "1" if kind == "server" else "0"
        c(re.search(r"^event DISCONNECTED .*status=0 .*by_peer=%s " % by_peer, txt, re.M) is not None,
          "capi-peer's DISCONNECTED is not by_peer=%s with status 0" % by_peer)
        if kind == "client":
            c(re.search(r"^event CONNECT_REQUEST .*rdma_cm_src=%s:\d+ rdma_cm_dst=%s:%d " % (K, I, port), txt, re.M)
              is not None, "CONNECT_REQUEST without the kernel client's CMA header addresses")
        m = cm_list(os.path.join(run, "cells", name + ".pcap"))
        c(have_pcap and seq(m).startswith("REQ REP RTU") and seq(m).endswith("DREQ DREP"),
          "wire %r, want REQ REP RTU ... DREQ DREP" % seq(m))
        reqs = [d for d in m if d["msg"] == "REQ"]
        sid = "0x%016x" % (0x0106 << 16 | port)
        c(len(reqs) == 1 and reqs[0].get("sid") == sid and reqs[0]["src"] == (I if kind == "server" else K),
          "REQ %s, want one from %s to service ID %s" % (reqs, I if kind == "server" else K, sid))
        c.done(name, "%s kernel ucmatose %s -C 0 (rdma_cm port %d, service ID %s): %s; the %s through "
               "ibcmd" % ("libibcm connects by IP and port to the" if kind == "server"
                         else "libibcm serves the", kind, port, sid, seq(m),
                         "REQ's CMA header built" if kind == "server" else "CMA header's addresses decoded"))
    return "data: " + ", ".join(summary)
