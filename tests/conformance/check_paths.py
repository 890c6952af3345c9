"""check_paths.py -- the kp-* cells of the conformance suite, called by check.py: the protocol
paths the kernel CM can play against ibcm (scenarios/kernel-paths.sh, one VM pair: the kernel CM
on VM a, ibcm's cm-ping over umad on VM b).

Every cell asserts the protocol from the wire capture (message sequence, comm IDs, QPNs, REJ
reasons and ARI, MRA fields, identical retransmissions) and from the outputs of both sides.
Retransmission gaps are checked against the timer that sends them, with wide bounds (TCG
timers run late under load); counts that timing can change are never asserted exactly."""
import json
import os
import re

from check_ibcm import cut_cells
from labcells import Check, cell, cm_list, handshake_audit, read, resent, seq, summary_of, want_summary

KIP, IIP = "10.77.0.1", "10.77.0.2"
KIP6, IIP6 = "fd00:77::1", "fd00:77::2"
PD_REQ_I = b"hello-from-ibcm".hex()
PD_REP_K = b"kernel-rep".hex()
PD_REQ_K = b"hello-from-kernel".hex()
PD_REP_I = b"ibcm-rep".hex()
PD_REJ_REP_I = b"ibcm-rejects-rep".hex()
PD_REJ_REP_K = b"kernel-rejects-rep".hex()
FAKE_QPN = "0xc0ffe0"          # cmpeer's made-up QPN (--no-qp, --same-qpn, --stale)
SIDR_QPN = "0x5a1d40"          # cm-ping --sidr-qpn of kp-pas-sidr
UDP_QKEY = "0x01234567"        # rdma_cm's RDMA_UDP_QKEY
UDADDY_SID = "0x0000000001111c06"   # RDMA_PS_UDP << 16 | 7174 (udaddy's fixed port)

ACT = ("rep-lost", "rtu-lost", "drep-lost", "dreq-lost", "req-retries-out", "rej-rep", "mra-rep", "ipv6", "sidr",
       "cmtime-1000", "rep-retries-out", "drep-lost-timewait", "stale")
PAS = ("rep-lost", "rep-lost-dup-req", "rtu-lost", "drep-lost", "dreq-lost", "gaveup-ari", "stale",
       "qpn-reuse-timewait", "rej-rep", "mra-rep", "mra-dup-req", "ipv6", "sidr", "cmtime-1000", "unreachable")
REF = ("stale", "qpn-reuse-timewait")
NAMES = (["kp-act-" + c for c in ACT] + ["kp-pas-" + c for c in PAS] + ["kp-kernel-" + c for c in REF])


class Run:
    """one lab run's cells (OUT/NAME): the capture cut at the markers (cells/CELL.pcap) and what
    each role left in share/results (ROLE.CELL.out, ROLE.CELL.rc)"""

    def __init__(self, out, name):
        self.name = name
        self.dir = os.path.join(out, name)
        self.res = os.path.join(self.dir, "share", "results")

    def cut(self, names):
        """cut the capture into cells; without one, every cell of names fails (False)"""
        if cut_cells(self.dir):
            return True
        for n in names:
            cell(n, False, "no capture: the %s run did not happen (see %s.log)" % (self.name, self.dir))
        return False

    def o(self, role, n):
        return read(os.path.join(self.res, "%s.%s.out" % (role, n)))

    def rc(self, role, n):
        return read(os.path.join(self.res, "%s.%s.rc" % (role, n))).strip()

    def cms(self, n):
        return cm_list(os.path.join(self.dir, "cells", n + ".pcap"))


def wire(c, m, want):
    return c(seq(m) == want, "wire %r != %r" % (seq(m), want))


def kernel_paths_cells(out):
    run = Run(out, "kernel-paths")
    if not run.cut(NAMES):
        return
    o, rc, cms = run.o, run.rc, run.cms

    def stats(n):
        """cm-ping --listen's last line: the endpoint's counters (JSON)"""
        lines = [l for l in o("b", n).splitlines() if l.startswith("{")]
        try:
            return json.loads(lines[-1]) if lines else {}
        except ValueError:
            return {}

    def path(c, m, head_re, dreq_from):
        """the messages before the first DREQ match the regex head_re (over the names); the rest is
        the teardown: a DREQ first, a DREP last, the DREQs identical (retransmissions: timing may
        add some) and from dreq_from, the DREPs from the other side with the same comm IDs.
        -> (head, DREQs, DREPs), or None when the wire does not match"""
        i = next((k for k, d in enumerate(m) if d["msg"] == "DREQ"), len(m))
        head, tail = m[:i], m[i:]
        ok = c(re.fullmatch(head_re, seq(head)) is not None, "wire %r: before the DREQ not %r" % (seq(m), head_re))
        dreqs = [d for d in tail if d["msg"] == "DREQ"]
        dreps = [d for d in tail if d["msg"] == "DREP"]
        good = c(bool(tail) and tail[-1]["msg"] == "DREP" and len(dreqs) + len(dreps) == len(tail),
                 "teardown %r (want DREQ ... DREP)" % seq(tail))
        if good:
            c(all(d["mad"] == dreqs[0]["mad"] for d in dreqs), "the DREQs differ (not retransmissions)")
            c(all(d["src"] == dreq_from for d in dreqs) and all(d["src"] != dreq_from for d in dreps),
              "teardown directions (DREQ from %s)" % dreq_from)
            c(all({d["lcid"], d["rcid"]} == {dreqs[0]["lcid"], dreqs[0]["rcid"]} for d in dreps), "DREP comm IDs")
        return (head, dreqs, dreps) if ok and good else None

    def dropped(c, role, n, least=1):
        t = o(role, n + "-tc")
        mm = re.search(r"dropped (\d+)", t)
        c(mm is not None and int(mm.group(1)) >= least, "tc at %s's ingress dropped %s (want >= %d)"
          % ("the kernel" if role == "a" else "ibcm", mm.group(1) if mm else "nothing", least))

    def same(c, x, y, what):
        c(x["mad"] == y["mad"], "the resent %s differs from the first" % what)

    def gap(c, x, y, lo, hi, what):
        g = y["t"] - x["t"]
        c(lo < g < hi, "%s after %.2f s (timer bounds %.1f-%.1f s)" % (what, g, lo, hi))
        return g

    def ids(c, m, req, rep):
        """REP answers the REQ; every later message carries the pair of comm IDs"""
        c(rep["rcid"] == req["lcid"], "REP remote comm ID %s != REQ %s" % (rep["rcid"], req["lcid"]))
        pair = {req["lcid"], rep["lcid"]}
        bad = [d["msg"] for d in m if d["msg"] not in ("REQ", "REP") and {d["lcid"], d["rcid"]} != pair]
        c(not bad, "messages without the connection's comm IDs: %s" % bad)

    def from_(c, m, msg, src):
        bad = [d["frame"] for d in m if d["msg"] == msg and d["src"] != src]
        c(not bad, "%s not from %s (frames %s)" % (msg, src, bad))

    def ksays(c, n, text):
        c(text in o("a", n), "kernel side lacks %r" % text)

    def isays(c, n, text):
        c(text in o("b", n), "cm-ping lacks %r" % text)

    def isum(c, n, want, code=None):
        got = summary_of(o("b", n))
        c(got == want_summary(want), "cm-ping summary %s != %s" % (got, want_summary(want)))
        if code is not None:
            c(rc("b", n) == code, "cm-ping exit status %r, want %r" % (rc("b", n), code))

    K_OK = "RESULT ok"

    # ------------------------------------------------------------ ibcm active -> kernel passive
    n = "kp-act-rep-lost"
    c, m, g = Check(), cms(n), 0
    dropped(c, "b", n)
    if path(c, m, r"REQ REP( REP)+ RTU", IIP):
        ids(c, m, m[0], m[1])
        same(c, m[1], m[2], "REP")
        # the kernel's REP timer: ms(REQ Local CM Response Timeout 18) = 1 s
        g = gap(c, m[1], m[2], 0.7, 3.0, "the kernel resent its REP")
        from_(c, m, "REP", KIP)
    ksays(c, n, K_OK)
    isum(c, n, (1, 0, 0, 1), "0")
    c.done(n, "first REP lost at ibcm's ingress; the kernel resends the identical REP after %.2f s "
           "(ms(18) of ibcm's REQ), ibcm RTUs it; no REQ resent" % g)

    n = "kp-act-rtu-lost"
    c, m, g = Check(), cms(n), 0
    dropped(c, "a", n)
    if path(c, m, r"REQ REP RTU( REP RTU)+", KIP):
        ids(c, m, m[0], m[1])
        same(c, m[1], m[3], "REP")
        g = gap(c, m[1], m[3], 0.7, 3.0, "the kernel resent its REP")
        c(m[2]["mad"] == m[4]["mad"] and m[4]["src"] == IIP, "the second RTU is not ibcm's first again")
    ksays(c, n, "EVENT ESTABLISHED")
    ksays(c, n, K_OK)
    isum(c, n, (1, 0, 0, 1), "0")
    c.done(n, "ibcm's RTU lost at the kernel's ingress; the kernel resends its REP after %.2f s and ibcm, "
           "established, answers the duplicate REP with the RTU again; the kernel establishes" % g)

    n = "kp-act-drep-lost"
    c, m, g = Check(), cms(n), 0
    dropped(c, "b", n)
    t = path(c, m, r"REQ REP RTU", IIP)
    if t:
        ids(c, m, m[0], m[1])
        _, dreqs, dreps = t
        if c(len(dreqs) >= 2 and len(dreps) >= 2 and dreps[0]["t"] < dreqs[1]["t"],
             "teardown %r: want DREQ DREP DREQ DREP" % seq(dreqs + dreps)):
            # ibcm's DREQ timer: the REQ's, 2*ms(18) + ms(17) = 2.7 s
            g = gap(c, dreqs[0], dreqs[1], 2.0, 4.0, "ibcm resent its DREQ")
    ksays(c, n, K_OK)
    isum(c, n, (1, 0, 0, 1), "0")
    isays(c, n, "(disconnected (locally))")
    c.done(n, "the kernel's DREP lost at ibcm's ingress; ibcm resends the identical DREQ after %.2f s, the kernel "
           "answers the duplicate with a DREP again; no disconnect timed out" % g)

    n = "kp-act-dreq-lost"
    c, m, k = Check(), cms(n), 0
    dropped(c, "b", n)
    t = path(c, m, r"REQ REP RTU", KIP)
    if t:
        _, dreqs, dreps = t
        k = len(dreqs)
        ids(c, m, m[0], m[1])
        if c(k >= 2 and dreps[0]["t"] > dreqs[1]["t"], "teardown %r: want DREQ DREQ.. DREP" % seq(dreqs + dreps)):
            # the passive kernel's DREQ timer: ms(REQ Local CM Response Timeout 18) = 1 s
            gap(c, dreqs[0], dreqs[1], 0.7, 3.0, "the kernel resent its DREQ")
        c(dreqs[0]["rqpn"] == m[0]["qpn"], "DREQ remote QPN %s != ibcm's %s" % (dreqs[0]["rqpn"], m[0]["qpn"]))
    ksays(c, n, K_OK)
    isum(c, n, (1, 0, 0, 1), "0")
    isays(c, n, "(disconnected (by the peer))")
    c.done(n, "the kernel's first DREQ lost at ibcm's ingress; the kernel resends the identical DREQ (%d sent, "
           "~1 s apart), ibcm answers DREP" % k)

    n = "kp-act-req-retries-out"
    c, m = Check(), cms(n)
    dropped(c, "a", n)
    if wire(c, m, "REQ REQ REQ REJ"):
        r, j = m[0], m[3]
        c(r["max_cm_retries"] == 2, "REQ Max CM Retries %s" % r["max_cm_retries"])
        same(c, m[0], m[1], "REQ")
        same(c, m[0], m[2], "REQ")
        for x, y in zip(m, m[1:]):
            # 2*ms(18) + ms(16) = 2.4 s: each resend, and the give-up after the last
            gap(c, x, y, 1.8, 3.5, "next " + y["msg"])
        c(j["src"] == IIP and j["reason"] == 4 and j["rejected"] == 2 and j["lcid"] == r["lcid"] and j["rcid"] == "0x00000000",
          "REJ %s" % {k_: j[k_] for k_ in ("src", "reason", "rejected", "lcid", "rcid")})
        c(j["ari_len"] == 8 and j["ari"] == r["ca_guid"][2:], "REJ ARI %s (len %s) != ibcm's CA GUID %s" % (j["ari"], j["ari_len"], r["ca_guid"]))
    ksays(c, n, "0 of 1 requests seen")
    isays(c, n, "timed out")
    isum(c, n, (0, 0, 1, 0), "2")
    c.done(n, "every REQ lost: ibcm sends 1 + 2 identical REQs (Max CM Retries 2) 2.4 s apart, then gives up with "
           "REJ 4 (timeout, MsgRejected 2) whose ARI is its CA GUID, as Linux does")

    n = "kp-act-rej-rep"
    c, m = Check(), cms(n)
    if wire(c, m, "REQ REP REJ"):
        j = m[2]
        c(j["src"] == IIP and j["reason"] == 28 and j["rejected"] == 1, "REJ %s reason %s MsgRejected %s" % (j["src"], j["reason"], j["rejected"]))
        c(j["lcid"] == m[0]["lcid"] and j["rcid"] == m[1]["lcid"], "REJ comm IDs")
        c(j["pd"] == PD_REJ_REP_I, "REJ private data %s" % j["pd"])
    ksays(c, n, "EVENT REJECTED status=28 pd=%s " % PD_REJ_REP_I)
    ksays(c, n, K_OK)
    isays(c, n, "rejected the REP")
    isum(c, n, (0, 1, 0, 0), "2")
    c.done(n, "ibcm rejects the kernel's REP (REJ 28, MsgRejected = REP, private data); the accepted kernel id gets "
           "REJECTED status=28 with the data")

    n = "kp-act-mra-rep"
    c, m, g = Check(), cms(n), 0
    # the MRA answers the first duplicate REP; a REP the kernel sent before the MRA arrived
    # (load) is answered with the MRA again; after the MRA the kernel waits
    t = path(c, m, r"REQ REP REP MRA( REP MRA)* RTU", IIP)
    if t:
        ids(c, m, m[0], m[1])
        reps, mras = [d for d in t[0] if d["msg"] == "REP"], [d for d in t[0] if d["msg"] == "MRA"]
        same(c, reps[0], reps[-1], "REP")
        gap(c, m[1], m[2], 0.7, 3.0, "the kernel resent its REP")
        a = m[3]
        c(a["src"] == IIP and a["mraed"] == 1 and a["service_timeout"] == 20 and a["rcid"] == m[1]["lcid"],
          "MRA %s" % {k_: a[k_] for k_ in ("src", "mraed", "service_timeout", "rcid")})
        c(all(x["mad"] == a["mad"] for x in mras), "the MRAs differ")
        c(all(r_["t"] - x["t"] < 1.0 for r_, x in zip(reps[2:], mras)), "a REP long after ibcm's MRA")
        # cm-ping held the RTU for 3 s; the kernel, MRAed, sends no more REPs meanwhile
        g = t[0][-1]["t"] - m[1]["t"]
        c(g > 2.5, "RTU %.2f s after the REP: the RTU delay was not exercised" % g)
    ksays(c, n, K_OK)
    isays(c, n, "rtu in 3000 ms")
    isum(c, n, (1, 0, 0, 1), "0")
    c.done(n, "ibcm holds its RTU (the application's QP work); the kernel resends its REP, ibcm MRAs the duplicate "
           "(MRAed = REP, service timeout 20), the kernel waits: no more REPs; RTU at %.2f s" % g)

    n = "kp-act-ipv6"
    c, m = Check(), cms(n)
    if path(c, m, "REQ REP RTU", IIP6):
        ids(c, m, m[0], m[1])
        c(all(d["ipver"] == 6 for d in m), "not all over IPv6: %s" % [d["ipver"] for d in m])
        c(m[0]["src"] == IIP6 and m[0]["dst"] == KIP6, "REQ %s -> %s" % (m[0]["src"], m[0]["dst"]))
        r = m[0]
        c(r.get("cma_ipver") == 6 and r.get("cma_src") == IIP6 and r.get("cma_dst") == KIP6,
          "CMA header v%s %s -> %s" % (r.get("cma_ipver"), r.get("cma_src"), r.get("cma_dst")))
        c(r.get("upd") == PD_REQ_I, "REQ user private data %s" % r.get("upd"))
        c(m[1]["pd"] == PD_REP_K, "REP private data %s" % m[1]["pd"])
    ksays(c, n, "EVENT CONNECT_REQUEST pd=%s " % PD_REQ_I)
    ksays(c, n, "PEER addr=%s " % IIP6)
    ksays(c, n, K_OK)
    isays(c, n, "pd=%s" % PD_REP_K)
    isum(c, n, (1, 0, 0, 1), "0")
    c.done(n, "ibcm on rxe0's fd00:77::2 GID -> kernel listener on fd00:77::1: RoCEv2 over IPv6, CMA header "
           "version 6 (%s -> %s), private data both ways" % (IIP6, KIP6))

    n = "kp-act-sidr"
    c, m = Check(), cms(n)
    if wire(c, m, "SIDR_REQ SIDR_REP"):
        q, p = m[0], m[1]
        c(q["src"] == IIP and q["sid"] == UDADDY_SID, "SIDR_REQ from %s sid %s" % (q["src"], q["sid"]))
        c(q.get("cma_ipver") == 4 and q.get("cma_src") == IIP and q.get("cma_dst") == KIP,
          "SIDR_REQ CMA header v%s %s -> %s" % (q.get("cma_ipver"), q.get("cma_src"), q.get("cma_dst")))
        c(p["status"] == 0 and p["qpn"] != "0x000000" and p["qkey"] == UDP_QKEY and p["request_id"] == q["request_id"]
          and p["sid"] == q["sid"], "SIDR_REP status %s qpn %s qkey %s request ID %s sid %s"
          % (p["status"], p["qpn"], p["qkey"], p["request_id"], p["sid"]))
        isays(c, n, "sidr reply status=Success qpn=%s qkey=%s" % (p["qpn"], UDP_QKEY))
    c(rc("b", n) == "0", "cm-ping --sidr exit status %r" % rc("b", n))
    c.done(n, "ibcm's SIDR_REQ (RDMA_PS_UDP, CMA header) to udaddy's server: SIDR_REP success with udaddy's UD QPN "
           "and Q_Key 0x01234567 reaches cm-ping")

    n = "kp-act-cmtime-1000"
    c, m = Check(), cms(n)
    bad, counts = handshake_audit(m, 1000)
    for b in bad:
        c(False, "wire: " + b)
    mm = re.search(r"connect step: (\d+) connections in ([0-9.]+) s", o("b", n))
    c(mm is not None and mm.group(1) == "1000", "connect step line: %s" % (mm.group(0) if mm else None))
    isum(c, n, (1000, 0, 0, 1000), "0")
    c.done(n, "cm-ping --count 1000 --parallel 1000 --hold -> cmtime server (real RC QPs on the kernel side): every "
           "connection REQ/REP/RTU/DREQ/DREP, no REJ; connect step %s s; %s" % (mm.group(2) if mm else "?", resent(counts, 1000)))

    n = "kp-act-rep-retries-out"
    c, m, k = Check(), cms(n), 0
    dropped(c, "b", n, 3)
    if wire(c, m, "REQ REP REP REP REJ"):
        r, reps, j = m[0], m[1:4], m[4]
        c(r["src"] == IIP and r["max_cm_retries"] == 2 and r["lcmrt"] == 17 and r["rcmrt"] == 22,
          "REQ Max CM Retries %s, Local/Remote CM Response Timeout %s/%s (want 2, 17/22)"
          % (r["max_cm_retries"], r["lcmrt"], r["rcmrt"]))
        from_(c, m, "REP", KIP)
        c(reps[0]["rcid"] == r["lcid"], "REP remote comm ID %s != REQ %s" % (reps[0]["rcid"], r["lcid"]))
        for x, y in zip(reps, reps[1:]):
            same(c, reps[0], y, "REP")
            # the kernel's REP timer: ms(REQ Local CM Response Timeout 17) = 0.54 s
            gap(c, x, y, 0.3, 2.5, "the kernel resent its REP")
        k = len(reps)
        # ibcm never saw a REP: its REJ names only its own comm ID
        c(j["src"] == IIP and j["reason"] == 4 and j["rejected"] == 2 and j["lcid"] == r["lcid"] and j["rcid"] == "0x00000000",
          "REJ %s" % {k_: j[k_] for k_ in ("src", "reason", "rejected", "lcid", "rcid")})
        c(j["ari_len"] == 8 and j["ari"] == r["ca_guid"][2:], "REJ ARI %s (len %s) != ibcm's CA GUID %s" % (j["ari"], j["ari_len"], r["ca_guid"]))
    # UNREACHABLE (not REJECTED) on the accepted id: the kernel gave up before ibcm's REJ came
    ksays(c, n, "ACTION ACCEPT")
    ksays(c, n, "EVENT UNREACHABLE status=-110")
    ksays(c, n, "RESULT ok established=0 rejected=0 unreachable=1")
    isays(c, n, "timed out")
    isum(c, n, (0, 0, 1, 0), "2")
    c.done(n, "every REP lost at ibcm's ingress: the kernel sends Max CM Retries 2 + 1 = %d identical REPs ms(17) "
           "apart, then gives up with nothing on the wire (cm.c: REP_SENT send error -> cm_reset_to_idle, "
           "IB_CM_REP_ERROR = RDMA_CM_EVENT_UNREACHABLE -110 to cmpeer); ibcm, whose REQ timer (19 s) never "
           "fired, ends at its 10 s connect bound with REJ 4 (timeout) + ARI, exit 2" % k)

    n = "kp-act-drep-lost-timewait"
    c, m, g, tw = Check(), cms(n), 0, None
    dropped(c, "b", n)
    t = path(c, m, r"REQ REP RTU", IIP)
    if t:
        ids(c, m, m[0], m[1])
        c(m[0]["ack_timeout"] == 21, "REQ Local ACK Timeout %s (want 21: the kernel's TimeWait ms(21) = 8.6 s)"
          % m[0]["ack_timeout"])
        _, dreqs, dreps = t
        if c(seq(m[3:]) == "DREQ DREP DREQ DREP",
             "teardown %r: want DREQ DREP DREQ DREP" % seq(m[3:])):
            same(c, dreqs[0], dreqs[1], "DREQ")
            # ibcm's DREQ timer: the REQ's, 2*ms(18) + ms(17) = 2.7 s
            g = gap(c, dreqs[0], dreqs[1], 2.0, 4.0, "ibcm resent its DREQ")
            c(dreps[1]["lcid"] == dreps[0]["lcid"] and dreps[1]["rcid"] == dreps[0]["rcid"], "the DREPs' comm IDs differ")
    tm = re.search(r"^TIMEWAIT-ENTER conn=0 dreq_duplicates=(\d+)$", o("a", n), re.M)
    tx = re.search(r"^TIMEWAIT-EXIT conn=0 dreq_duplicates=(\d+) in_timewait=(\d+)$", o("a", n), re.M)
    if c(tm is not None and tx is not None, "cmpeer's TIMEWAIT-ENTER/EXIT lines missing"):
        tw = int(tx.group(2))
        # counted after the kernel's DREP went out (state TIMEWAIT) and before TIMEWAIT_EXIT,
        # with the id alive: cm_dreq_handler's IB_CM_TIMEWAIT case, which answers with a DREP
        c(tw >= 1, "no duplicate DREQ reached the kernel while its cm_id was in TimeWait (in_timewait=%d)" % tw)
    ksays(c, n, "EVENT TIMEWAIT_EXIT")
    ksays(c, n, K_OK)
    isum(c, n, (1, 0, 0, 1), "0")
    isays(c, n, "(disconnected (locally))")
    c.done(n, "the kernel's first DREP lost at ibcm's ingress; ibcm resends the identical DREQ after %.2f s, while the "
           "kernel's cm_id is in TimeWait (ms(21) from ibcm's REQ Local ACK Timeout; cm_rx_duplicates/dreq +%s "
           "between TimeWait's start and its exit): the kernel answers it from TimeWait with a DREP again" % (g, tw))

    # ------------------------------------------------------------ kernel active -> ibcm passive
    n = "kp-pas-rep-lost"
    c, m, g = Check(), cms(n), 0
    dropped(c, "a", n)
    if path(c, m, "REQ REP REP RTU", KIP):
        ids(c, m, m[0], m[1])
        same(c, m[1], m[2], "REP")
        # ibcm's REP timer: ms(REQ Local CM Response Timeout 20) = 4.3 s; the kernel's REQ
        # timer (6.1 s) has not fired
        g = gap(c, m[1], m[2], 3.5, 6.0, "ibcm resent its REP")
        from_(c, m, "REP", IIP)
    ksays(c, n, K_OK)
    c(o("b", n).count("request from") == 1, "cm-ping saw %d requests" % o("b", n).count("request from"))
    isum(c, n, (1, 0, 0, 1), "0")
    c.done(n, "ibcm's REP lost at the kernel's ingress; ibcm resends the identical REP after %.2f s (ms(20) of the "
           "kernel's REQ), before the kernel's REQ timer" % g)

    n = "kp-pas-rep-lost-dup-req"
    c, m, g = Check(), cms(n), 0
    dropped(c, "a", n, 2)
    if path(c, m, "REQ REP REP REQ REP RTU", KIP):
        ids(c, m, m[0], m[1])
        same(c, m[0], m[3], "REQ")
        same(c, m[1], m[2], "REP")
        same(c, m[1], m[4], "REP")
        # the kernel's REQ timer: 2*ms(18) + ms(20) = 6.1 s
        gap(c, m[0], m[3], 5.0, 8.0, "the kernel resent its REQ")
        g = gap(c, m[3], m[4], 0.0, 1.0, "ibcm answered the duplicate REQ")
    c(stats(n).get("duplicate_replies", 0) >= 1, "cm-ping counted no duplicate reply: %s" % stats(n).get("duplicate_replies"))
    ksays(c, n, K_OK)
    isum(c, n, (1, 0, 0, 1), "0")
    c.done(n, "ibcm's first two REPs lost; the kernel resends its REQ (6.1 s) and ibcm answers the duplicate REQ with "
           "the identical REP at once (%.3f s), without waiting for its REP timer" % g)

    n = "kp-pas-rtu-lost"
    c, m, g = Check(), cms(n), 0
    dropped(c, "b", n)
    if path(c, m, "REQ REP RTU REP RTU", KIP):
        ids(c, m, m[0], m[1])
        same(c, m[1], m[3], "REP")
        g = gap(c, m[1], m[3], 3.5, 6.0, "ibcm resent its REP")
        c(m[4]["src"] == KIP and m[4]["lcid"] == m[2]["lcid"], "the second RTU is not the kernel's for this connection")
    ksays(c, n, K_OK)
    isum(c, n, (1, 0, 0, 1), "0")
    c.done(n, "the kernel's RTU lost at ibcm's ingress; ibcm resends its REP after %.2f s, the established kernel "
           "answers the duplicate REP with the RTU again" % g)

    n = "kp-pas-drep-lost"
    c, m, g = Check(), cms(n), 0
    dropped(c, "a", n)
    t = path(c, m, "REQ REP RTU", KIP)
    if t:
        ids(c, m, m[0], m[1])
        _, dreqs, dreps = t
        if c(len(dreqs) >= 2 and len(dreps) >= 2 and dreps[0]["t"] < dreqs[1]["t"],
             "teardown %r: want DREQ DREP DREQ DREP" % seq(dreqs + dreps)):
            # the kernel's DREQ timer is its REQ's: 2*ms(0) + ms(20) = 4.1 s (--ack-timeout 1)
            g = gap(c, dreqs[0], dreqs[1], 3.5, 6.0, "the kernel resent its DREQ")
    st = stats(n)
    c(st.get("orphan_dreps") == 0, "the duplicate DREQ was answered as an unknown one (orphan_dreps %s), not from TimeWait"
      % st.get("orphan_dreps"))
    ksays(c, n, K_OK)
    isum(c, n, (1, 0, 0, 1))
    c.done(n, "ibcm's DREP lost at the kernel's ingress; the kernel resends the identical DREQ after %.2f s and ibcm, "
           "in TimeWait (cm-ping --timewait-slack), answers the duplicate DREQ with a DREP again" % g)

    n = "kp-pas-dreq-lost"
    c, m, k = Check(), cms(n), 0
    dropped(c, "a", n)
    s = seq(m)
    if c(re.fullmatch(r"REQ REP RTU( DREQ){2,} DREP", s) is not None, "wire %r (want REQ REP RTU DREQ DREQ.. DREP)" % s):
        dreqs = [d for d in m if d["msg"] == "DREQ"]
        k = len(dreqs)
        ids(c, m, m[0], m[1])
        for x, y in zip(dreqs, dreqs[1:]):
            same(c, dreqs[0], y, "DREQ")
            # ibcm's DREQ timer: ms(the kernel's REQ Local CM Response Timeout 20) = 4.3 s
            gap(c, x, y, 3.5, 6.0, "ibcm resent its DREQ")
        from_(c, m, "DREQ", IIP)
        c(m[-1]["src"] == KIP, "DREP not from the kernel")
        c(dreqs[0]["rqpn"] == m[0]["qpn"], "DREQ remote QPN %s != the kernel's %s" % (dreqs[0]["rqpn"], m[0]["qpn"]))
    ksays(c, n, "EVENT DISCONNECTED")
    ksays(c, n, K_OK)
    isays(c, n, "(disconnected (locally))")
    isum(c, n, (1, 0, 0, 1))
    c.done(n, "ibcm's first DREQ lost at the kernel's ingress; ibcm resends the identical DREQ (%d sent), the "
           "kernel answers DREP; no disconnect timed out" % k)

    n = "kp-pas-gaveup-ari"
    c, m = Check(), cms(n)
    if wire(c, m, "REQ MRA REJ"):
        r, a, j = m
        c(a["src"] == IIP and a["mraed"] == 0 and a["service_timeout"] == 22 and a["rcid"] == r["lcid"],
          "MRA %s" % {k_: a[k_] for k_ in ("src", "mraed", "service_timeout", "rcid")})
        c(j["src"] == KIP and j["reason"] == 4 and j["rejected"] == 2 and j["lcid"] == r["lcid"],
          "REJ %s" % {k_: j[k_] for k_ in ("src", "reason", "rejected", "lcid", "rcid")})
        c(j["ari_len"] == 8 and j["ari"] == r["ca_guid"][2:], "REJ ARI %s (len %s) != the kernel's node GUID %s"
          % (j["ari"], j["ari_len"], r["ca_guid"]))
        c(j["t"] - r["t"] > 2.0, "REJ %.2f s after the REQ: before cmpeer's 2.5 s give-up" % (j["t"] - r["t"]))
    ksays(c, n, "ACTION GIVE-UP")
    ksays(c, n, K_OK)
    c(stats(n).get("rej_received") == 1 and stats(n).get("established") == 0,
      "cm-ping's counters: rej_received %s established %s" % (stats(n).get("rej_received"), stats(n).get("established")))
    isum(c, n, (0, 0, 0, 0))
    c.done(n, "ibcm MRAs the kernel's REQ (service timeout 22); the kernel gives up (rdma_destroy_id while connecting) "
           "with REJ 4 (timeout, MsgRejected 2), ARI = its node GUID, the REQ's CA GUID; ibcm drops the pending REQ")

    def stale(c, m, detector, requester, qpn=FAKE_QPN):
        """REQ REP RTU, a second REQ with the first one's QPN (and CA GUID), REJ 10 to it and a
        DREQ to the first connection from the detector; qpn None: whatever the first REQ said"""
        if wire(c, m, "REQ REP RTU REQ REJ DREQ DREP"):
            r0, p0, r1, j, dq = m[0], m[1], m[3], m[4], m[5]
            qpn = qpn or r0["qpn"]
            c(r0["qpn"] == r1["qpn"] == qpn and r0["ca_guid"] == r1["ca_guid"] and r0["lcid"] != r1["lcid"],
              "REQ QPNs %s %s CA GUIDs %s %s comm IDs %s %s"
              % (r0["qpn"], r1["qpn"], r0["ca_guid"], r1["ca_guid"], r0["lcid"], r1["lcid"]))
            c(j["src"] == detector and j["reason"] == 10 and j["rejected"] == 0 and j["lcid"] == "0x00000000"
              and j["rcid"] == r1["lcid"], "REJ %s" % {k_: j[k_] for k_ in ("src", "reason", "rejected", "lcid", "rcid")})
            c(dq["src"] == detector and dq["lcid"] == p0["lcid"] and dq["rcid"] == r0["lcid"] and dq["rqpn"] == qpn,
              "DREQ %s for the old connection? lcid %s rcid %s rqpn %s" % (dq["src"], dq["lcid"], dq["rcid"], dq["rqpn"]))
            c(m[6]["src"] == requester, "DREP not from the requester")

    n = "kp-pas-stale"
    c, m = Check(), cms(n)
    stale(c, m, IIP, KIP)
    ksays(c, n, "CONN 1 REJECTED status=10")
    ksays(c, n, "CONN 0 DISCONNECTED")
    ksays(c, n, K_OK)
    c(stats(n).get("stale", 0) >= 1, "cm-ping counted no stale connection")
    c.done(n, "the kernel connects twice with one QPN while the first connection is established: ibcm rejects the "
           "second REQ with REJ 10 (stale connection, local comm ID 0) and sends the first a DREQ, as the kernel does "
           "(kp-kernel-stale)")

    n = "kp-kernel-stale"
    c, m = Check(), cms(n)
    stale(c, m, KIP, IIP)
    c(rc("b", "kernel-cm-load") == "0", "modprobe rdma_ucm on VM b failed")
    c("CONN 1 REJECTED status=10" in o("b", n) and "CONN 0 DISCONNECTED" in o("b", n) and K_OK in o("b", n),
      "kernel client: %s" % o("b", n).strip().splitlines()[-1:])
    c(K_OK in o("a", n), "kernel server not ok")
    c.done(n, "reference, kernel <-> kernel: the kernel's passive side rejects the reused QPN with REJ 10 and sends "
           "the established connection a DREQ; the same sequence as ibcm's (kp-pas-stale)")

    n = "kp-act-stale"
    c, m = Check(), cms(n)
    stale(c, m, KIP, IIP, qpn=None)
    ksays(c, n, "EVENT DISCONNECTED")
    ksays(c, n, "RESULT ok established=1")
    isays(c, n, "connection 1: stale connection")
    c(re.search(r"^conn 0 closed by peer after \d+ ms: DREQ", o("b", n), re.M),
      "cm-ping lacks 'conn 0 closed by peer after … ms: DREQ'")
    isays(c, n, "cm-ping: 1 established, 1 rejected, 0 timed out, 0 disconnected, 1 closed by peer")
    c(rc("b", n) == "2", "cm-ping exit status %r, want '2'" % rc("b", n))
    c.done(n, "cm-ping --same-qpn (test only) --stay connects twice with one QPN while the first connection is "
           "established: the kernel rejects the second REQ with REJ 10 (stale connection) and sends the first a "
           "DREQ, which ibcm answers; the second fails as stale, exit 2")

    def reuse(c, m, passive):
        if wire(c, m, "REQ REP RTU DREQ DREP REQ REP RTU DREQ DREP"):
            c(m[0]["qpn"] == m[5]["qpn"] == FAKE_QPN and m[0]["lcid"] != m[5]["lcid"], "the REQs do not share the QPN")
            c(m[1]["src"] == passive and m[6]["src"] == passive, "REPs not from %s" % passive)
            return m[5]["t"] - m[4]["t"]
        return 0

    n = "kp-pas-qpn-reuse-timewait"
    c, m = Check(), cms(n)
    g = reuse(c, m, IIP)
    ksays(c, n, "RESULT ok established=2")
    isum(c, n, (2, 0, 0, 2))
    c.done(n, "the kernel reuses a QPN %.3f s after ibcm's DREP, within ibcm's TimeWait: not stale (TimeWait leaves "
           "the stale-connection index, as in Linux): ibcm accepts, no REJ 10" % g)

    n = "kp-kernel-qpn-reuse-timewait"
    c, m = Check(), cms(n)
    g = reuse(c, m, KIP)
    c("RESULT ok established=2" in o("a", n) and "RESULT ok established=2" in o("b", n), "kernel server/client not ok")
    c.done(n, "reference, kernel <-> kernel: the kernel's passive side accepts the QPN reused %.3f s after its DREP "
           "(in TimeWait), as ibcm does (kp-pas-qpn-reuse-timewait)" % g)

    n = "kp-pas-rej-rep"
    c, m = Check(), cms(n)
    if wire(c, m, "REQ REP REJ"):
        j = m[2]
        c(j["src"] == KIP and j["reason"] == 28 and j["rejected"] == 1, "REJ %s reason %s MsgRejected %s" % (j["src"], j["reason"], j["rejected"]))
        c(j["lcid"] == m[0]["lcid"] and j["rcid"] == m[1]["lcid"], "REJ comm IDs")
        c(j["pd"] == PD_REJ_REP_K, "REJ private data %s" % j["pd"])
    ksays(c, n, "ACTION REJECT-REP")
    ksays(c, n, "RESULT ok established=0 rejected=1")
    isays(c, n, "rejected by the peer: consumer defined (28)")
    isum(c, n, (0, 1, 0, 0))
    c.done(n, "the kernel rejects ibcm's REP (rdma_reject on CONNECT_RESPONSE): REJ 28, MsgRejected = REP, private "
           "data; ibcm's accepted connection fails with the reason")

    n = "kp-pas-mra-rep"
    c, m, g = Check(), cms(n), 0
    if path(c, m, "REQ REP REP MRA RTU", KIP):
        ids(c, m, m[0], m[1])
        same(c, m[1], m[2], "REP")
        gap(c, m[1], m[2], 3.5, 6.0, "ibcm resent its REP")
        a = m[3]
        c(a["src"] == KIP and a["mraed"] == 1 and a["service_timeout"] == 24 and a["rcid"] == m[1]["lcid"],
          "MRA %s" % {k_: a[k_] for k_ in ("src", "mraed", "service_timeout", "rcid")})
        g = m[4]["t"] - m[1]["t"]
        c(g > 6.0, "RTU %.2f s after the REP: the delayed rdma_establish was not exercised" % g)
    c(stats(n).get("mra_received") == 1, "cm-ping counted %s MRAs" % stats(n).get("mra_received"))
    ksays(c, n, "ACTION DELAY-RTU")
    ksays(c, n, K_OK)
    isum(c, n, (1, 0, 0, 1))
    c.done(n, "the kernel delays rdma_establish (7 s); ibcm resends its REP, the kernel MRAs the duplicate REP "
           "(MRAed = REP, service timeout 24), ibcm waits: no third REP; RTU at %.2f s" % g)

    n = "kp-pas-mra-dup-req"
    c, m, g = Check(), cms(n), 0
    if path(c, m, "REQ REQ MRA REP RTU", KIP):
        same(c, m[0], m[1], "REQ")
        gap(c, m[0], m[1], 3.5, 6.0, "the kernel resent its REQ")
        a = m[2]
        c(a["src"] == IIP and a["mraed"] == 0 and a["service_timeout"] == 20 and a["rcid"] == m[0]["lcid"],
          "MRA %s" % {k_: a[k_] for k_ in ("src", "mraed", "service_timeout", "rcid")})
        gap(c, m[1], a, 0.0, 1.0, "ibcm's MRA for the duplicate REQ")
        g = m[3]["t"] - m[0]["t"]
        c(g > 5.0, "REP %.2f s after the REQ: the delayed accept was not exercised" % g)
    st = stats(n)
    c(st.get("mra_sent") == 1 and st.get("duplicate_replies", 0) >= 1, "cm-ping counters mra_sent %s duplicate_replies %s"
      % (st.get("mra_sent"), st.get("duplicate_replies")))
    isays(c, n, "(MRA on a duplicate REQ)")
    ksays(c, n, K_OK)
    isum(c, n, (1, 0, 0, 1))
    c.done(n, "ibcm delays its accept without an MRA; the kernel resends its REQ (4.1 s) and ibcm answers the "
           "duplicate with an MRA (service timeout 20), as Linux does; REP at %.2f s, established" % g)

    n = "kp-pas-ipv6"
    c, m = Check(), cms(n)
    if path(c, m, "REQ REP RTU", KIP6):
        ids(c, m, m[0], m[1])
        c(all(d["ipver"] == 6 for d in m), "not all over IPv6")
        r = m[0]
        c(r["src"] == KIP6 and r.get("cma_ipver") == 6 and r.get("cma_src") == KIP6 and r.get("cma_dst") == IIP6,
          "REQ from %s, CMA header v%s %s -> %s" % (r["src"], r.get("cma_ipver"), r.get("cma_src"), r.get("cma_dst")))
        c(r.get("upd") == PD_REQ_K and m[1]["pd"] == PD_REP_I, "private data REQ %s REP %s" % (r.get("upd"), m[1]["pd"]))
        mm = re.search(r"^request from .* cma=(\S+):(\d+)->(\S+) pd=(\S+)", o("b", n), re.M)
        c(mm is not None and mm.group(1) == KIP6 and mm.group(3) == IIP6 and int(mm.group(2)) == r.get("cma_sport")
          and mm.group(4) == PD_REQ_K, "cm-ping's request line: %s" % (mm.groups() if mm else None,))
    ksays(c, n, "EVENT ESTABLISHED pd=%s " % PD_REP_I)
    ksays(c, n, K_OK)
    isum(c, n, (1, 0, 0, 1))
    c.done(n, "kernel client on fd00:77::1 -> ibcm listener on its IPv6 GID: RoCEv2 over IPv6, CMA header version 6 "
           "parsed by ibcm (address, port, private data); ibcm's REP data reaches the kernel")

    n = "kp-pas-sidr"
    c, m = Check(), cms(n)
    if wire(c, m, "SIDR_REQ SIDR_REP"):
        q, p = m
        c(q["src"] == KIP and q["sid"] == UDADDY_SID and q.get("cma_src") == KIP and q.get("cma_dst") == IIP,
          "SIDR_REQ from %s sid %s CMA %s -> %s" % (q["src"], q["sid"], q.get("cma_src"), q.get("cma_dst")))
        c(p["src"] == IIP and p["status"] == 0 and p["qpn"] == SIDR_QPN and p["qkey"] == UDP_QKEY
          and p["request_id"] == q["request_id"], "SIDR_REP %s status %s qpn %s qkey %s request ID %s"
          % (p["src"], p["status"], p["qpn"], p["qkey"], p["request_id"]))
    isays(c, n, "sidr request from")
    c(rc("a", n) == "0", "udaddy client exit status %r: %s" % (rc("a", n), o("a", n).strip().splitlines()[-2:]))
    c.done(n, "udaddy's SIDR_REQ (RDMA_PS_UDP, CMA header) -> ibcm: SIDR_REP success, QPN %s, Q_Key %s; udaddy "
           "takes it (exit 0)" % (SIDR_QPN, UDP_QKEY))

    n = "kp-pas-cmtime-1000"
    c, m = Check(), cms(n)
    bad, counts = handshake_audit(m, 1000)
    for b in bad:
        c(False, "wire: " + b)
    mm = re.search(r"^connect\s*:\s*([0-9.]+)", o("a", n), re.M)
    c(rc("a", n) == "0" and mm is not None, "cmtime client exit %r, connect line %s" % (rc("a", n), mm is not None))
    isum(c, n, (1000, 0, 0, 1000))
    c.done(n, "cmtime -c 1000 client (real RC QPs) -> ibcm listener: every connection REQ/REP/RTU/DREQ/DREP, no REJ; "
           "cmtime connect step %s ms; %s" % (mm.group(1) if mm else "?", resent(counts, 1000)))

    n = "kp-pas-unreachable"
    c, m = Check(), cms(n)
    s = seq(m)
    if c(s == " ".join(["REQ"] * 16), "wire %r (want 16 REQs and nothing else)" % s):
        c(m[0]["max_cm_retries"] == 15, "REQ Max CM Retries %s" % m[0]["max_cm_retries"])
        for x, y in zip(m, m[1:]):
            same(c, m[0], y, "REQ")
            gap(c, x, y, 3.5, 6.0, "the kernel resent its REQ")
    ksays(c, n, "EVENT UNREACHABLE status=-110")
    ksays(c, n, "RESULT ok established=0 rejected=0 unreachable=1")
    c.done(n, "nobody answers (no CM agent on VM b): the kernel sends 1 + 15 identical REQs ~4.1 s apart "
           "(--ack-timeout 1), then reports RDMA_CM_EVENT_UNREACHABLE (-ETIMEDOUT)")


# ------------------------------------------------------------------------------------------
# IPv6 over ibcm's RoCEv2/UDP transport (scenarios/ibcm-udp.sh + .host, run ibcm-udp): the
# VM's kernel CM on rxe0's fd00:78::2 GID, cm-ping on the host's UDP socket at fd00:78::1
UDP_KIP6, UDP_IIP6 = "fd00:78::2", "fd00:78::1"


def udp_ipv6_cells(out):
    run = Run(out, "ibcm-udp")
    if not run.cut(("udp-act-ipv6", "udp-pas-ipv6")):
        return
    o, rc, cms = run.o, run.rc, run.cms

    def v6(c, m, src, dst):
        """all over IPv6, ICRCs correct both ways, ibcm's from UDP source port 4791; the REQ's
        CMA header version 6 from src to dst"""
        c(m and all(d["ipver"] == 6 for d in m), "not all over IPv6: %s" % [d["ipver"] for d in m])
        bad = [d["frame"] for d in m if not d["icrc_ok"]]
        c(not bad, "frames with a bad ICRC: %s" % bad)
        c(all(d["sport"] == 4791 for d in m if d["src"] == UDP_IIP6), "ibcm's frames not from UDP port 4791")
        r = m[0]
        c(r["src"] == src and r["dst"] == dst, "REQ %s -> %s" % (r["src"], r["dst"]))
        c(r.get("cma_ipver") == 6 and r.get("cma_src") == src and r.get("cma_dst") == dst,
          "CMA header v%s %s -> %s" % (r.get("cma_ipver"), r.get("cma_src"), r.get("cma_dst")))

    n = "udp-act-ipv6"
    c, m = Check(), cms(n)
    if wire(c, m, "REQ REP RTU DREQ DREP"):
        v6(c, m, UDP_IIP6, UDP_KIP6)
        c(m[1]["rcid"] == m[0]["lcid"] and m[3]["src"] == UDP_IIP6, "comm IDs / DREQ direction")
        c(m[0].get("upd") == PD_REQ_I and m[1]["pd"] == PD_REP_K, "private data REQ %s REP %s" % (m[0].get("upd"), m[1]["pd"]))
    c("EVENT CONNECT_REQUEST pd=%s " % PD_REQ_I in o("a", n) and "RESULT ok" in o("a", n),
      "kernel server: %s" % o("a", n).strip().splitlines()[-1:])
    c("pd=%s" % PD_REP_K in o("host", n), "cm-ping lacks the REP's private data")
    c(summary_of(o("host", n)) == want_summary((1, 0, 0, 1)), "cm-ping summary %s" % (summary_of(o("host", n)),))
    c(rc("host", n) == "0", "cm-ping exit status %r" % rc("host", n))
    c.done(n, "cm-ping on the host's UDP socket (fd00:78::1) -> kernel listener on rxe0's fd00:78::2: RoCEv2 over "
           "IPv6 with ICRCs both sides accept, CMA header version 6, private data both ways, exit 0")

    n = "udp-pas-ipv6"
    c, m = Check(), cms(n)
    if wire(c, m, "REQ REP RTU DREQ DREP"):
        v6(c, m, UDP_KIP6, UDP_IIP6)
        c(m[1]["rcid"] == m[0]["lcid"] and m[1]["src"] == UDP_IIP6 and m[3]["src"] == UDP_KIP6, "comm IDs / directions")
        c(m[0].get("upd") == PD_REQ_K and m[1]["pd"] == PD_REP_I, "private data REQ %s REP %s" % (m[0].get("upd"), m[1]["pd"]))
        mm = re.search(r"^request from .* cma=(\S+):(\d+)->(\S+) pd=(\S+)", o("host", n), re.M)
        c(mm is not None and mm.group(1) == UDP_KIP6 and mm.group(3) == UDP_IIP6 and int(mm.group(2)) == m[0].get("cma_sport")
          and mm.group(4) == PD_REQ_K, "cm-ping's request line: %s" % (mm.groups() if mm else None,))
    c("EVENT ESTABLISHED pd=%s " % PD_REP_I in o("a", n) and "RESULT ok" in o("a", n),
      "kernel client: %s" % o("a", n).strip().splitlines()[-1:])
    c(rc("a", n) == "0", "kernel client exit status")
    c(summary_of(o("host", n)) == want_summary((1, 0, 0, 1)), "cm-ping summary %s" % (summary_of(o("host", n)),))
    c.done(n, "kernel client on rxe0's fd00:78::2 -> cm-ping listening on the host's UDP socket at fd00:78::1: "
           "RoCEv2 over IPv6, CMA header version 6 parsed by ibcm, ICRCs verified, established and disconnected")
