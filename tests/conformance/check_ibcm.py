"""check_ibcm.py -- the ibcm cells of the conformance suite, called by check.py: ibcm <-> kernel
CM over umad and RoCEv2/UDP (umad-*, udp-*, udp-wire) and ibcm <-> ibcm with the rate
comparison on one VM pair (ibcm-xrc*, ibcm-rate, kernel-rate)."""
import os
import re
import shutil
import sys

from labcells import Check, cell, cm_list, handshake_audit, read, resent, seq, summary_of, want_summary
import pcaptool

A, B = "10.77.0.1", "10.77.0.2"
PD_REQ = b"hello-from-kernel".hex()
PD_REJ = b"kernel-says-no".hex()


# ------------------------------------------------------------------------------------------
# ibcm <-> kernel cells (scenarios/ibcm-cells.sh); the constants repeat the scenario's
PD_REQ_I = b"hello-from-ibcm".hex()
PD_REP_K = b"kernel-rep".hex()
PD_REJ_K = PD_REJ
PD_REQ_K = PD_REQ
PD_REP_I = b"ibcm-rep".hex()
PD_REJ_I = b"ibcm-says-no".hex()
PD_PASSIVE_DISC = b"cm-ping:passive-disconnect".hex()
PD_REQ_FULL = bytes((i % 251) + 1 for i in range(56)).hex()
PD_REP_FULL = bytes(((i * 3) % 251) + 1 for i in range(196)).hex()
IBCM_XRC_TGT = "0xabcdef"       # cm-ping --listen's TGT QPN
KERNEL_FAKE_QPN = "0xc0ffe0"    # cmpeer's made-up QPN (--no-qp, XRC)
IBCM_ACT_CELLS = ("establish", "dreq-kernel", "rej-nolistener", "rej-consumer", "mra", "retrans", "pdata",
                  "xrc-rc-listener", "xrc-rping", "xrc", "rping", "ucmatose")
IBCM_PAS_CELLS = ("establish", "dreq-ibcm", "rej-nolistener", "rej-consumer", "mra", "retrans", "pdata", "xrc")


def cut_cells(run):
    """cut RUN/wire.pcap at the in-band markers into RUN/cells/; False without a capture"""
    pcap = os.path.join(run, "wire.pcap")
    cells_dir = os.path.join(run, "cells")
    if not os.path.exists(pcap):
        return False
    shutil.rmtree(cells_dir, ignore_errors=True)
    with open(os.devnull, "w") as dn:
        old = sys.stdout
        sys.stdout = dn
        try:
            pcaptool.cmd_cells(pcap, cells_dir)
        finally:
            sys.stdout = old
    return True


def udp_wire_cell(out):
    """what ibcm's RoCEv2/UDP transport puts on the wire, as rxe accepted it"""
    run = os.path.join(out, "ibcm-udp")
    ms = cm_list(os.path.join(run, "wire.pcap"))
    host = [d for d in ms if d["src"] == "10.78.0.1"]
    vm = [d for d in ms if d["src"] == "10.78.0.2"]
    c = Check()
    c(len(host) >= 40, "only %d MADs from ibcm on the wire" % len(host))
    bad = [d["frame"] for d in host if not (d["icrc_ok"] and d.get("ip_id") == 0 and d.get("ip_df") and d["sport"] == 4791)]
    c(not bad, "ibcm frames with a bad ICRC / IP ID != 0 / no DF / source port != 4791: %s" % bad[:10])
    c(vm and all(d["icrc_ok"] for d in vm), "rxe frames with a bad ICRC")
    c.done("udp-wire", "%d MADs from ibcm's UDP socket: IPv4 ID 0, DF, source port 4791, ICRC correct (rxe accepted them); "
           "%d from rxe (IP IDs %s..., so cm-ping needs --icrc-lenient)" % (len(host), len(vm), ",".join(str(d.get("ip_id")) for d in vm[:3])))


QPS_BOTH = []   # per ibcm-rate round: both cm-pings ran with --verbs (a QP per connection)


def qps_both():
    """'both' when every ibcm-rate round had real QPs on both sides (as cmtime has)"""
    return "both" if QPS_BOTH and all(QPS_BOTH) else "kernel only"


def ibcm_pair_cells(out):
    """ibcm <-> ibcm XRC over umad, and the rate comparison on the same VM pair; -> (kernel, ibcm) conn/s"""
    run = os.path.join(out, "ibcm-pair")
    res = os.path.join(run, "share", "results")
    names = ("ibcm-xrc", "ibcm-xrc-dreq-passive", "ibcm-rate", "kernel-rate")  # the rate cells hold 2 rounds each
    if not cut_cells(run):
        for n in names:
            cell(n, False, "no capture: the ibcm-pair run did not happen (see %s.log)" % run)
        return None, None
    A_, B_ = A, B

    def o(role, n):
        return read(os.path.join(res, "%s.%s.out" % (role, n)))

    def rc(role, n):
        return read(os.path.join(res, "%s.%s.rc" % (role, n))).strip()

    def cms(n):
        return cm_list(os.path.join(run, "cells", n + ".pcap"))

    for n, dreq_from, pd in (("ibcm-xrc", B_, PD_REQ_I), ("ibcm-xrc-dreq-passive", A_, PD_PASSIVE_DISC)):
        c, m = Check(), cms(n)
        c(seq(m) == "REQ REP RTU DREQ DREP", "wire %r" % seq(m))
        if len(m) == 5:
            r, p = m[0], m[1]
            c(r["tst"] == 3 and r["ext"] == 1 and r["sid"].startswith("0x00000000013f"), "REQ tst %s ext %s sid %s" % (r["tst"], r["ext"], r["sid"]))
            c(r.get("upd") == pd, "REQ private data %s" % r.get("upd"))
            c(p["qpn"] == "0x000000" and p["eecn"] == IBCM_XRC_TGT and p["srq"] == 1, "REP qpn %s eecn %s srq %s" % (p["qpn"], p["eecn"], p["srq"]))
            c(p["rcid"] == r["lcid"] and m[2]["rcid"] == p["lcid"], "comm IDs do not chain")
            c(m[3]["src"] == dreq_from and m[4]["src"] != dreq_from, "DREQ from %s" % m[3]["src"])
            want_rqpn = IBCM_XRC_TGT if dreq_from == B_ else r["qpn"]
            c(m[3]["rqpn"] == want_rqpn, "DREQ remote QPN %s != %s" % (m[3]["rqpn"], want_rqpn))
            if n == "ibcm-xrc":
                c(p["pd"] == PD_REP_I, "REP private data %s" % p["pd"])
        c(" XRC " in o("a", n) and summary_of(o("a", n)) == want_summary((1, 0, 0, 1)), "TGT cm-ping: %s" % (summary_of(o("a", n)),))
        c(summary_of(o("b", n)) == want_summary((1, 0, 0, 1)), "INI cm-ping: %s" % (summary_of(o("b", n)),))
        c(rc("a", n) == "0" and rc("b", n) == "0", "cm-ping exit status TGT %r INI %r" % (rc("a", n), rc("b", n)))
        mm = re.search(r"^established conn=\S+ qpn=\S+ remote_qpn=(\S+) pd=(\S+)", o("b", n), re.M)
        c(mm is not None and mm.group(1) == IBCM_XRC_TGT and mm.group(2) == (PD_REP_I if n == "ibcm-xrc" else "-"),
          "INI cm-ping's REP: %s" % (mm.groups() if mm else None,))
        c.done(n, "ibcm XRC INI -> ibcm XRC TGT over umad: REQ(tst 3, ext 1), REP(QPN 0, EECN %s, SRQ 1), RTU, DREQ from the %s side, DREP"
               % (IBCM_XRC_TGT, "INI" if dreq_from == B_ else "TGT"))

    # two alternating rounds (ibcm, kernel, ibcm, kernel); the rate is the best round of each
    ibcm_r, kern_r = [], []
    c, notes = Check(), []
    for r in (1, 2):
        n = "ibcm-rate-%d" % r
        m = cms(n)
        bad, counts = handshake_audit(m, 1000)
        for b in bad:
            c(False, "round %d wire: %s" % (r, b))
        mm = re.search(r"connect step: (\d+) connections in ([0-9.]+) s", o("b", n))
        if c(mm is not None, "round %d: no connect step line" % r):
            c(mm.group(1) == "1000", "round %d: the connect step held %s connections" % (r, mm.group(1)))
            ibcm_r.append(int(mm.group(1)) / float(mm.group(2)))
        want = want_summary((1000, 0, 0, 1000))
        c(summary_of(o("b", n)) == want, "round %d active: %s" % (r, summary_of(o("b", n))))
        c(summary_of(o("a", n)) == want, "round %d passive: %s" % (r, summary_of(o("a", n))))
        c(rc("b", n) == "0" and rc("a", n) == "0", "round %d: cm-ping exit status active %r passive %r" % (r, rc("b", n), rc("a", n)))
        # --verbs on both sides: the summary carries the data counters (none failed)
        qps = all(re.search(r", 0 data failed, ", o(x, n)) for x in "ab")
        c(qps, "round %d: cm-ping did not run with real QPs (--verbs) on both sides" % r)
        QPS_BOTH.append(qps)
        notes.append("%s s = %s conn/s (%s)" % (mm.group(2) if mm else "?", "%.0f" % ibcm_r[-1] if mm else "?",
                                               resent(counts, 1000)))
    ibcm = max(ibcm_r) if len(ibcm_r) == 2 else None
    c.done("ibcm-rate", "cm-ping --count 1000 --parallel 1000 --hold --verbs rxe0 --data none (a real QP per "
           "connection, both sides) over umad between two nocm VMs, connect step, "
           "2 rounds, every connection REQ/REP/RTU/DREQ/DREP on the wire: %s; best %s conn/s"
           % ("; ".join(notes), "%.0f" % ibcm if ibcm else "?"))

    c, notes = Check(), []
    for r in (1, 2):
        n = "kernel-rate-%d" % r
        m = cms(n)
        txt = o("b", n)
        mm = re.search(r"^connect\s*:\s*([0-9.]+)\s+([0-9.]+)", txt, re.M)
        c(all(read(os.path.join(res, "%s.kernel-cm-load-%d.rc" % (x, r))).strip() == "0" for x in "ab"), "round %d: modprobe rdma_ucm failed" % r)
        c(all(read(os.path.join(res, "%s.kernel-cm-unload-%d.rc" % (x, r))).strip() == "0" for x in "ab"), "round %d: the kernel CM did not unload" % r)
        c(read(os.path.join(res, "b.%s.rc" % n)).strip() == "0", "round %d: cmtime client rc" % r)
        bad, counts = handshake_audit(m, 1000)
        for b in bad:
            c(False, "round %d wire: %s" % (r, b))
        if c(mm is not None, "round %d: no connect line in cmtime output" % r):
            kern_r.append(1000.0 / (float(mm.group(1)) / 1000.0))
        notes.append("%s ms = %s conn/s (%s)" % (mm.group(1) if mm else "?", "%.0f" % kern_r[-1] if mm else "?",
                                               resent(counts, 1000)))
    kern = max(kern_r) if len(kern_r) == 2 else None
    c.done("kernel-rate", "the same VM pair with the kernel CM loaded (modprobe rdma_ucm, unloaded again after each round): "
           "cmtime -c 1000 connect step, 2 rounds: %s; best %s conn/s" % ("; ".join(notes), "%.0f" % kern if kern else "?"))
    return kern, ibcm


def ibcm_cells(out, scen, tp, kip, iip, irole):
    """the TP-act-* (ibcm active) and TP-pas-* (ibcm passive) cells of one run against the kernel CM;
    kernel outputs are a.<cell>.out, ibcm's (cm-ping) <irole>.<cell>.out"""
    run = os.path.join(out, scen)
    res = os.path.join(run, "share", "results")
    names = ["%s-act-%s" % (tp, c) for c in IBCM_ACT_CELLS] + ["%s-pas-%s" % (tp, c) for c in IBCM_PAS_CELLS]
    if not cut_cells(run):
        for n in names:
            cell(n, False, "no capture: the %s run did not happen (see %s.log)" % (scen, run))
        return
    same_tid = (lambda x, y: x == y) if tp == "udp" else (lambda x, y: x[-8:] == y[-8:])

    def kout(c):
        return read(os.path.join(res, "a.%s-%s.out" % (tp, c)))

    def iout(c):
        return read(os.path.join(res, "%s.%s-%s.out" % (irole, tp, c)))

    def irc(c):
        return read(os.path.join(res, "%s.%s-%s.rc" % (irole, tp, c))).strip()

    def cms(c):
        return cm_list(os.path.join(run, "cells", "%s-%s.pcap" % (tp, c)))

    def wire(c, m, want):
        c(seq(m) == want, "wire %r != %r" % (seq(m), want))
        return seq(m) == want

    def chain(c, m):
        """REQ/REP/RTU comm IDs and TIDs"""
        req, rep, rtu = m[0], m[1], m[2]
        c(rep["rcid"] == req["lcid"] and rtu["rcid"] == rep["lcid"] and rtu["lcid"] == req["lcid"], "comm IDs do not chain")
        c(same_tid(rep["tid"], req["tid"]), "REP TID %s vs REQ TID %s" % (rep["tid"], req["tid"]))

    def ksays(c, cname, text):
        c(text in kout(cname), "kernel side lacks %r" % text)

    def isays(c, cname, text):
        c(text in iout(cname), "cm-ping lacks %r" % text)

    def irep(c, cname, qpn, pd):
        """cm-ping (active) prints the REP it took: remote QPN (XRC: the TGT QPN) and private data"""
        mm = re.search(r"^established conn=\S+ qpn=\S+ remote_qpn=(\S+) pd=(\S+)", iout(cname), re.M)
        if c(mm is not None, "cm-ping printed no REP"):
            c(qpn is None or mm.group(1) == qpn, "cm-ping's REP remote QPN %s != %s" % (mm.group(1), qpn))
            c(mm.group(2) == pd, "cm-ping got REP private data %s" % mm.group(2))

    def irc_is(c, cname, want):
        """cm-ping's exit status: --connect exits 0 when its connection was established and
        torn down, 2 when not; --listen (stopped with TERM after the cell) exits 0"""
        c(irc(cname) == want, "cm-ping exit status %r, want %r" % (irc(cname), want))

    def isum(c, cname, want):
        got = summary_of(iout(cname))
        c(got == want_summary(want), "cm-ping summary %s != %s" % (got, want_summary(want)))
        irc_is(c, cname, "0" if cname.startswith("pas-") or want[0] == 1 else "2")

    K_OK = "RESULT ok"
    # ---------------------------------------------------------------- ibcm active
    n = tp + "-act-"
    c, m = Check(), cms("act-establish")
    if wire(c, m, "REQ REP RTU DREQ DREP"):
        chain(c, m)
        c(m[0]["src"] == iip and m[3]["src"] == iip and m[4]["src"] == kip, "directions (DREQ must come from ibcm)")
        c(m[0].get("upd") == PD_REQ_I, "REQ user private data %s" % m[0].get("upd"))
        c(m[0].get("cma_src") == iip and m[0].get("cma_dst") == kip, "CMA header %s->%s" % (m[0].get("cma_src"), m[0].get("cma_dst")))
        c(m[1]["pd"] == PD_REP_K, "REP private data %s" % m[1]["pd"])
        c(m[3]["rqpn"] == m[1]["qpn"], "DREQ remote QPN %s != REP QPN %s" % (m[3]["rqpn"], m[1]["qpn"]))
    ksays(c, "act-establish", "EVENT CONNECT_REQUEST pd=%s " % PD_REQ_I)
    ksays(c, "act-establish", K_OK)
    isum(c, "act-establish", (1, 0, 0, 1))
    isays(c, "act-establish", "(disconnected (locally))")
    irep(c, "act-establish", m[1]["qpn"] if len(m) > 1 else None, PD_REP_K)
    c.done(n + "establish", "REQ/REP/RTU/DREQ(ibcm)/DREP; REQ private data + CMA header reach the kernel, REP private data reaches ibcm")

    c, m = Check(), cms("act-dreq-kernel")
    if wire(c, m, "REQ REP RTU DREQ DREP"):
        chain(c, m)
        c(m[3]["src"] == kip and m[4]["src"] == iip, "DREQ not from the kernel")
        # cm-ping's QPNs are random: the DREQ must name the QPN ibcm's REQ announced
        c(m[3]["rqpn"] == m[0]["qpn"], "DREQ remote QPN %s (ibcm's REQ said %s)" % (m[3]["rqpn"], m[0]["qpn"]))
    ksays(c, "act-dreq-kernel", K_OK)
    isum(c, "act-dreq-kernel", (1, 0, 0, 1))
    isays(c, "act-dreq-kernel", "(disconnected (by the peer))")
    c.done(n + "dreq-kernel", "kernel passive sends the DREQ, ibcm answers DREP")

    c, m = Check(), cms("act-rej-nolistener")
    if wire(c, m, "REQ REJ"):
        c(m[1]["reason"] == 8 and m[1]["rejected"] == 0 and m[1]["rcid"] == m[0]["lcid"],
          "REJ reason %s msg %s rcid %s" % (m[1]["reason"], m[1]["rejected"], m[1]["rcid"]))
    isays(c, "act-rej-nolistener", "rejected by the peer: invalid service ID (8)")
    isum(c, "act-rej-nolistener", (0, 1, 0, 0))
    c.done(n + "rej-nolistener", "kernel REJ 8 (no listener on the port) reaches ibcm")

    c, m = Check(), cms("act-rej-consumer")
    if wire(c, m, "REQ REJ"):
        c(m[1]["reason"] == 28 and m[1]["rejected"] == 0, "REJ reason %s msg %s" % (m[1]["reason"], m[1]["rejected"]))
        c(m[1]["pd"] == PD_REJ_K, "REJ private data %s" % m[1]["pd"])
        c(same_tid(m[1]["tid"], m[0]["tid"]), "REJ TID")
    ksays(c, "act-rej-consumer", "EVENT CONNECT_REQUEST pd=%s " % PD_REQ_I)
    isays(c, "act-rej-consumer", "consumer defined (28) pd=%s" % PD_REJ_K)
    isum(c, "act-rej-consumer", (0, 1, 0, 0))
    c.done(n + "rej-consumer", "kernel consumer REJ 28 with private data; ibcm reports reason and data")

    c, m = Check(), cms("act-mra")
    gap = rep_at = None
    if wire(c, m, "REQ REQ MRA REP RTU DREQ DREP"):
        gap, rep_at = m[1]["t"] - m[0]["t"], m[3]["t"] - m[0]["t"]
        c(m[0]["mad"] == m[1]["mad"], "the resent REQ differs from the first")
        c(2.2 < gap < 3.6, "ibcm resent the REQ after %.2f s (expected 2.7)" % gap)
        c(m[2]["src"] == kip and m[2]["mraed"] == 0 and m[2]["service_timeout"] == 24 and m[2]["rcid"] == m[0]["lcid"],
          "MRA %s" % {k: m[2][k] for k in ("src", "mraed", "service_timeout", "rcid")})
        c(rep_at > 5.4, "REP after %.2f s: the MRA wait was not exercised" % rep_at)
    ksays(c, "act-mra", K_OK)
    isum(c, "act-mra", (1, 0, 0, 1))
    c.done(n + "mra", "ibcm resends its REQ after %.2f s, kernel MRAs the duplicate (service timeout 24), "
           "ibcm waits (no 3rd REQ at 5.4 s), REP at %.2f s" % (gap or 0, rep_at or 0))

    c, m = Check(), cms("act-retrans")
    gap = None
    c(re.search(r"dropped [1-9]", kout("act-retrans-tc")) is not None, "tc did not drop the REQ")
    if wire(c, m, "REQ REQ REP RTU DREQ DREP"):
        gap = m[1]["t"] - m[0]["t"]
        c(m[0]["mad"] == m[1]["mad"], "the resent REQ differs from the first")
        c(2.2 < gap < 3.6, "REQ resent after %.2f s (expected 2.7)" % gap)
    ksays(c, "act-retrans", K_OK)
    isum(c, "act-retrans", (1, 0, 0, 1))
    c.done(n + "retrans", "first REQ dropped at the kernel's ingress (tc); ibcm resends the identical REQ after %.2f s" % (gap or 0))

    c, m = Check(), cms("act-pdata")
    if wire(c, m, "REQ REP RTU DREQ DREP"):
        r = m[0]
        c(r.get("upd") == PD_REQ_FULL, "REQ user private data %s" % r.get("upd"))
        c(r.get("cma_ipver") == 4 and r.get("cma_src") == iip and r.get("cma_dst") == kip and r["pd"][:2] == "00",
          "CMA header version/ip %s %s->%s" % (r.get("cma_ipver"), r.get("cma_src"), r.get("cma_dst")))
        c(r.get("cma_sport") == 0xC000, "CMA source port %s" % r.get("cma_sport"))
        c(m[1]["pd"] == PD_REP_FULL, "REP private data (196 bytes) %s" % m[1]["pd"])
    ksays(c, "act-pdata", "EVENT CONNECT_REQUEST pd=%s pdlen=56" % PD_REQ_FULL)
    isum(c, "act-pdata", (1, 0, 0, 1))
    irep(c, "act-pdata", None, PD_REP_FULL)
    c.done(n + "pdata", "56 bytes of REQ private data after the CMA header (v4, %s:49152->%s) and 196 bytes of REP private data delivered intact" % (iip, kip))

    def xrc_req(c, r):
        c(r["tst"] == 3 and r["ext"] == 1, "REQ transport %s ext %s (want 3, 1)" % (r["tst"], r["ext"]))
        c(r["sid"].startswith("0x00000000013f"), "REQ Service ID %s (RDMA_PS_IB)" % r["sid"])

    c, m = Check(), cms("act-xrc-rc-listener")
    if wire(c, m, "REQ REJ"):
        xrc_req(c, m[0])
        c(m[1]["reason"] == 28 and m[1]["pd"] == "-", "REJ reason %s pd %s" % (m[1]["reason"], m[1]["pd"]))
    ksays(c, "act-xrc-rc-listener", "0 of 1 requests seen")
    isays(c, "act-xrc-rc-listener", "consumer defined (28)")
    isum(c, "act-xrc-rc-listener", (0, 1, 0, 0))
    c.done(n + "xrc-rc-listener", "XRC REQ to an RC listener (RDMA_PS_IB): the kernel rejects with REJ 28 (QP type mismatch), "
           "the listener never sees it")

    c, m = Check(), cms("act-xrc-rping")
    if wire(c, m, "REQ REJ"):
        xrc_req(c, m[0])
        c(m[1]["reason"] == 8, "REJ reason %s" % m[1]["reason"])
    isays(c, "act-xrc-rping", "invalid service ID (8)")
    isum(c, "act-xrc-rping", (0, 1, 0, 0))
    c.done(n + "xrc-rping", "XRC REQ to rping -s: REJ 8 (rping listens in RDMA_PS_TCP, XRC uses RDMA_PS_IB)")

    c, m = Check(), cms("act-xrc")
    if wire(c, m, "REQ REP RTU DREQ DREP"):
        xrc_req(c, m[0])
        chain(c, m)
        p = m[1]
        c(p["qpn"] == "0x000000" and p["eecn"] == KERNEL_FAKE_QPN and p["srq"] == 1,
          "REP qpn %s eecn %s srq %s" % (p["qpn"], p["eecn"], p["srq"]))
        c(p["pd"] == PD_REP_K, "REP private data %s" % p["pd"])
        c(m[3]["src"] == iip and m[3]["rqpn"] == KERNEL_FAKE_QPN, "DREQ %s rqpn %s (want the TGT QPN)" % (m[3]["src"], m[3]["rqpn"]))
    ksays(c, "act-xrc", K_OK)
    isum(c, "act-xrc", (1, 0, 0, 1))
    irep(c, "act-xrc", KERNEL_FAKE_QPN, PD_REP_K)
    c.done(n + "xrc", "XRC REQ to an XRC listener without a QP (cmpeer --qp xrc): kernel REP with QPN 0, "
           "EECN = TGT QPN %s, SRQ 1; ibcm RTU, DREQ to the TGT QPN, DREP" % KERNEL_FAKE_QPN)

    c, m = Check(), cms("act-rping")
    if wire(c, m, "REQ REP RTU DREQ DREP"):
        chain(c, m)
        c(m[3]["src"] == iip, "DREQ not from ibcm")
    isum(c, "act-rping", (1, 0, 0, 1))
    c("DISCONNECT EVENT" in kout("act-rping"), "rping did not see the disconnect")
    c.done(n + "rping", "rping -s accepts ibcm (real RC QP on the kernel side), ibcm disconnects; "
           "rping reports the DISCONNECT (no data: ibcm has no QP)")

    c, m = Check(), cms("act-ucmatose")
    if wire(c, m, "REQ REP RTU DREQ DREP"):
        chain(c, m)
        c(m[3]["src"] == kip, "DREQ not from ucmatose")
    c("test complete" in kout("act-ucmatose") and "return status 0" in kout("act-ucmatose"), "ucmatose did not complete")
    isum(c, "act-ucmatose", (1, 0, 0, 1))
    c.done(n + "ucmatose", "ucmatose -c 1 -C 0 (server) accepts ibcm and disconnects; status 0")

    # ---------------------------------------------------------------- ibcm passive
    n = tp + "-pas-"

    def ireq(c, cname, kpd):
        """cm-ping's "request from" line: the kernel's private data and CMA header"""
        mm = re.search(r"^request from .* cma=([0-9.]+):(\d+)->([0-9.]+) pd=(\S+)", iout(cname), re.M)
        if c(mm is not None, "cm-ping saw no request with a CMA header"):
            c(mm.group(1) == kip and mm.group(3) == iip, "CMA header %s->%s" % (mm.group(1), mm.group(3)))
            c(mm.group(4) == kpd, "cm-ping got private data %s" % mm.group(4))
        return mm

    c, m = Check(), cms("pas-establish")
    if wire(c, m, "REQ REP RTU DREQ DREP"):
        chain(c, m)
        c(m[0]["src"] == kip and m[1]["src"] == iip and m[3]["src"] == kip, "directions")
        c(m[1]["pd"] == PD_REP_I, "REP private data %s" % m[1]["pd"])
        c(m[3]["rqpn"] == m[1]["qpn"], "DREQ remote QPN %s != REP QPN %s" % (m[3]["rqpn"], m[1]["qpn"]))
    ksays(c, "pas-establish", "EVENT ESTABLISHED pd=%s " % PD_REP_I)
    ksays(c, "pas-establish", K_OK)
    mm = ireq(c, "pas-establish", PD_REQ_K)
    if mm and len(m) > 0:
        c(int(mm.group(2)) == m[0].get("cma_sport"), "CMA source port %s vs wire %s" % (mm.group(2), m[0].get("cma_sport")))
    isum(c, "pas-establish", (1, 0, 0, 1))
    isays(c, "pas-establish", "(disconnected (by the peer))")
    c.done(n + "establish", "kernel REQ -> ibcm REP (private data to the kernel) -> RTU; kernel DREQ, ibcm DREP; "
           "ibcm got the REQ private data and CMA header")

    c, m = Check(), cms("pas-dreq-ibcm")
    if wire(c, m, "REQ REP RTU DREQ DREP"):
        c(m[3]["src"] == iip and m[4]["src"] == kip, "DREQ not from ibcm")
        c(m[3]["rqpn"] == m[0]["qpn"], "DREQ remote QPN %s != kernel QPN %s" % (m[3]["rqpn"], m[0]["qpn"]))
    ksays(c, "pas-dreq-ibcm", "EVENT DISCONNECTED")
    ksays(c, "pas-dreq-ibcm", K_OK)
    isum(c, "pas-dreq-ibcm", (1, 0, 0, 1))
    isays(c, "pas-dreq-ibcm", "(disconnected (locally))")
    c.done(n + "dreq-ibcm", "ibcm (passive) sends the DREQ, the kernel answers DREP")

    c, m = Check(), cms("pas-rej-nolistener")
    if wire(c, m, "REQ REJ"):
        r = m[1]
        c(r["src"] == iip and r["reason"] == 8 and r["rejected"] == 0 and r["lcid"] == "0x00000000" and r["rcid"] == m[0]["lcid"],
          "REJ %s" % {k: r[k] for k in ("src", "reason", "rejected", "lcid", "rcid")})
    ksays(c, "pas-rej-nolistener", "EVENT REJECTED status=8 ")
    ksays(c, "pas-rej-nolistener", K_OK)
    c("request from" not in iout("pas-rej-nolistener"), "cm-ping's listener on another port saw the request")
    isum(c, "pas-rej-nolistener", (0, 0, 0, 0))
    c.done(n + "rej-nolistener", "ibcm answers a REQ for an unknown service with REJ 8 (local comm ID 0); the kernel reports status 8")

    c, m = Check(), cms("pas-rej-consumer")
    if wire(c, m, "REQ REJ"):
        r = m[1]
        c(r["reason"] == 28 and r["rejected"] == 0 and r["pd"] == PD_REJ_I, "REJ reason %s msg %s pd %s" % (r["reason"], r["rejected"], r["pd"]))
        c(same_tid(r["tid"], m[0]["tid"]), "REJ TID")
    ksays(c, "pas-rej-consumer", "EVENT REJECTED status=28 pd=%s " % PD_REJ_I)
    ksays(c, "pas-rej-consumer", K_OK)
    ireq(c, "pas-rej-consumer", PD_REQ_K)
    isum(c, "pas-rej-consumer", (0, 1, 0, 0))
    c.done(n + "rej-consumer", "ibcm consumer REJ 28 with private data; the kernel delivers status 28 and the data")

    c, m = Check(), cms("pas-mra")
    rep_at = None
    if wire(c, m, "REQ MRA REP RTU DREQ DREP"):
        mra = m[1]
        rep_at = m[2]["t"] - m[0]["t"]
        c(mra["src"] == iip and mra["mraed"] == 0 and mra["rcid"] == m[0]["lcid"] and mra["service_timeout"] == 22,
          "MRA %s" % {k: mra[k] for k in ("src", "mraed", "rcid", "service_timeout")})
        c(rep_at > 5.0, "REP after %.2f s: not beyond the kernel's 4.1 s REQ timeout" % rep_at)
    ksays(c, "pas-mra", K_OK)
    isays(c, "pas-mra", "mra sent")
    isum(c, "pas-mra", (1, 0, 0, 1))
    c.done(n + "mra", "ibcm MRAs the REQ (service timeout 22) and accepts after 6 s; the kernel honours it "
           "(no REQ resent at its 4.1 s timeout), REP at %.2f s, established" % (rep_at or 0))

    c, m = Check(), cms("pas-retrans")
    gap = None
    c(re.search(r"(dropped|packets) [1-9]", iout("pas-retrans-tc")) is not None, "the first REQ was not dropped: %s" % iout("pas-retrans-tc").strip())
    if wire(c, m, "REQ REQ REP RTU DREQ DREP"):
        gap = m[1]["t"] - m[0]["t"]
        c(m[0]["mad"] == m[1]["mad"], "the kernel's resent REQ differs")
        c(3.5 < gap < 7.0, "REQ resent after %.2f s" % gap)
    ksays(c, "pas-retrans", K_OK)
    c(iout("pas-retrans").count("request from") == 1, "cm-ping saw %d requests" % iout("pas-retrans").count("request from"))
    isum(c, "pas-retrans", (1, 0, 0, 1))
    c.done(n + "retrans", "first REQ dropped at ibcm's ingress; the kernel resends it after %.2f s; ibcm accepts once" % (gap or 0))

    c, m = Check(), cms("pas-pdata")
    if wire(c, m, "REQ REP RTU DREQ DREP"):
        c(m[0].get("upd") == PD_REQ_FULL, "REQ user private data %s" % m[0].get("upd"))
        c(m[1]["pd"] == PD_REP_FULL, "REP private data %s" % m[1]["pd"])
    ksays(c, "pas-pdata", "EVENT ESTABLISHED pd=%s pdlen=196" % PD_REP_FULL)
    ireq(c, "pas-pdata", PD_REQ_FULL)
    isum(c, "pas-pdata", (1, 0, 0, 1))
    c.done(n + "pdata", "56-byte REQ private data + CMA header reach ibcm intact; ibcm's 196-byte REP private data reaches the kernel")

    c, m = Check(), cms("pas-xrc")
    if wire(c, m, "REQ REP RTU DREQ DREP"):
        xrc_req(c, m[0])
        c(m[0]["qpn"] == KERNEL_FAKE_QPN, "REQ INI QPN %s" % m[0]["qpn"])
        chain(c, m)
        p = m[1]
        c(p["qpn"] == "0x000000" and p["eecn"] == IBCM_XRC_TGT and p["srq"] == 1, "REP qpn %s eecn %s srq %s" % (p["qpn"], p["eecn"], p["srq"]))
        c(m[3]["src"] == kip and m[3]["rqpn"] == IBCM_XRC_TGT, "DREQ %s rqpn %s" % (m[3]["src"], m[3]["rqpn"]))
    ksays(c, "pas-xrc", "EVENT CONNECT_RESPONSE")
    ksays(c, "pas-xrc", K_OK)
    isays(c, "pas-xrc", " XRC ")
    isum(c, "pas-xrc", (1, 0, 0, 1))
    c.done(n + "xrc", "kernel XRC INI REQ -> ibcm XRC TGT REP (QPN 0, EECN %s, SRQ 1) -> kernel RTU "
           "(rdma_establish) -> DREQ to the TGT QPN, DREP" % IBCM_XRC_TGT)
