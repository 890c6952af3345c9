#!/usr/bin/env python3
"""check.py -- asserts the conformance cells from what the lab runs left in $LAB_OUT.

  check.py OUT [--fixtures DIR] [--save-fixtures DIR]

Prints one line per cell, "cell <name>: PASS|FAIL <detail>", then
"kernel-vs-ibcm: ..." and, last, "conformance: P/N cells passed".  Exit 1 on any failure.
--fixtures DIR      also check the committed kernel fixtures in DIR and this run's wire captures
                    (OUT/*/wire.pcap) with tshark (parity cell)
--save-fixtures DIR write the trimmed per-cell captures of this run into DIR (see
                    fixtures/KERNEL-CAPTURES.md) and a listing to OUT/fixtures-listing.txt

The ibcm cells (umad-*, udp-*, ibcm-*) read the ibcm-umad, ibcm-udp and ibcm-pair runs.
"""
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import pcaptool  # noqa: E402

PD_REQ = b"hello-from-kernel".hex()
PD_REP = b"kernel-rep".hex()
PD_REJ = b"kernel-says-no".hex()
PD_VM = b"from-vm".hex()
PD_HOST = b"host-ibcm-says-no".hex()
A, B = "10.77.0.1", "10.77.0.2"

results = []
# the lab.sh runs of tests/conformance/run (steps.txt names, <name>.log)
LAB_RUNS = ("kernel", "nocm", "netns", "ibcm-udp", "ibcm-umad", "ibcm-pair", "xrc-rxe")


def cell(name, ok, detail=""):
    results.append((name, ok))
    print("cell %s: %s %s" % (name, "PASS" if ok else "FAIL", detail), flush=True)


def read(path):
    try:
        with open(path, errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def cm_list(pcap):
    if not os.path.exists(pcap):
        return []
    _, frames = pcaptool.read_pcap(pcap)
    return pcaptool.cm_frames(frames)


def seq(cms):
    return " ".join(d["msg"] for d in cms)


class Check:
    """collects failed conditions of one cell"""

    def __init__(self):
        self.bad = []

    def __call__(self, cond, what):
        if not cond:
            self.bad.append(what)
        return cond

    def done(self, name, good_detail):
        cell(name, not self.bad, good_detail if not self.bad else "; ".join(self.bad))


# ------------------------------------------------------------------------------------------
def kernel_cells(out):
    run = os.path.join(out, "kernel")
    res = os.path.join(run, "share", "results")
    cells_dir = os.path.join(run, "cells")
    pcap = os.path.join(run, "wire.pcap")
    if not os.path.exists(pcap):
        for n in ("k-establish", "k-dreq-passive", "k-rej-consumer", "k-rej-nolistener", "k-mra",
                  "k-retrans", "k-noqp", "k-xrc", "k-rping", "k-ucmatose", "k-cmtime", "k-icrc"):
            cell(n, False, "no capture: the kernel run did not happen (see %s/../kernel.log)" % run)
        return None
    shutil.rmtree(cells_dir, ignore_errors=True)
    with open(os.devnull, "w") as dn:
        old = sys.stdout
        sys.stdout = dn
        try:
            pcaptool.cmd_cells(pcap, cells_dir)
        finally:
            sys.stdout = old

    def outp(role, name):
        return read(os.path.join(res, "%s.%s.out" % (role, name)))

    def cms(name):
        return cm_list(os.path.join(cells_dir, name + ".pcap"))

    def ok_result(role, name):
        return "RESULT ok" in outp(role, name)

    # establish + DREQ from the active side, private data both ways
    c, m = Check(), cms("establish")
    c(seq(m) == "REQ REP RTU DREQ DREP", "wire %r != REQ REP RTU DREQ DREP" % seq(m))
    if len(m) == 5:
        c(len({d["tid"] for d in m}) == 1, "TIDs differ")
        c(m[0]["src"] == B and m[3]["src"] == B, "DREQ not from the active side")
        c(m[0].get("upd") == PD_REQ, "REQ user private data %s" % m[0].get("upd"))
        c(m[0].get("cma_src") == B and m[0].get("cma_dst") == A, "CMA header addresses %s->%s" % (m[0].get("cma_src"), m[0].get("cma_dst")))
        c(m[1].get("pd") == PD_REP, "REP private data %s" % m[1].get("pd"))
        c(m[1]["rcid"] == m[0]["lcid"] and m[2]["rcid"] == m[1]["lcid"], "comm IDs do not chain")
    c(("EVENT CONNECT_REQUEST pd=%s" % PD_REQ) in outp("a", "establish"), "server did not get the REQ private data")
    c(("EVENT ESTABLISHED pd=%s" % PD_REP) in outp("b", "establish"), "client did not get the REP private data")
    c(ok_result("a", "establish") and ok_result("b", "establish"), "cmpeer RESULT not ok")
    c.done("k-establish", "REQ/REP/RTU/DREQ(active)/DREP, private data + CMA header intact")

    c, m = Check(), cms("dreq-passive")
    c(seq(m) == "REQ REP RTU DREQ DREP", "wire %r" % seq(m))
    if len(m) == 5:
        c(m[3]["src"] == A and m[4]["src"] == B, "DREQ not from the passive side")
    c(ok_result("a", "dreq-passive") and ok_result("b", "dreq-passive"), "cmpeer RESULT not ok")
    c.done("k-dreq-passive", "DREQ from the passive side answered by DREP")

    c, m = Check(), cms("rej-consumer")
    c(seq(m) == "REQ REJ", "wire %r" % seq(m))
    if len(m) == 2:
        c(m[1]["reason"] == 28 and m[1]["rejected"] == 0, "REJ reason %s msg %s" % (m[1]["reason"], m[1]["rejected"]))
        c(m[1]["pd"] == PD_REJ, "REJ private data %s" % m[1]["pd"])
        c(m[1]["tid"] == m[0]["tid"], "REJ TID != REQ TID")
    c(("EVENT REJECTED status=28 pd=%s" % PD_REJ) in outp("b", "rej-consumer"), "client event")
    c.done("k-rej-consumer", "REJ reason 28 with private data delivered")

    c, m = Check(), cms("rej-nolistener")
    c(seq(m) == "REQ REJ", "wire %r" % seq(m))
    if len(m) == 2:
        c(m[1]["reason"] == 8 and m[1]["lcid"] == "0x00000000", "REJ reason %s lcid %s" % (m[1]["reason"], m[1]["lcid"]))
    c("EVENT REJECTED status=8 " in outp("b", "rej-nolistener"), "client event")
    c.done("k-rej-nolistener", "REJ reason 8 (invalid Service ID), local comm ID 0")

    c, m = Check(), cms("mra")
    c(seq(m) == "REQ REQ MRA REP RTU DREQ DREP", "wire %r" % seq(m))
    gap = None
    if len(m) == 7:
        gap = m[1]["t"] - m[0]["t"]
        c(m[0]["tid"] == m[1]["tid"] and m[0]["lcid"] == m[1]["lcid"], "retransmitted REQ differs")
        c(3.5 < gap < 7.0, "REQ retry after %.2f s" % gap)
        c(m[2]["mraed"] == 0 and m[2]["service_timeout"] == 24 and m[2]["src"] == A, "MRA %s" % m[2])
        c(m[2]["rcid"] == m[0]["lcid"], "MRA remote comm ID")
    c(ok_result("a", "mra") and ok_result("b", "mra"), "cmpeer RESULT not ok")
    c.done("k-mra", "duplicate REQ after %.2f s answered by MRA(REQ, service timeout 24), then REP" % (gap or 0))

    c, m = Check(), cms("retrans")
    tc = outp("a", "retrans-tc")
    c(re.search(r"dropped [1-9]", tc) is not None, "tc did not drop the REQ (%s)" % tc.strip())
    c(seq(m) == "REQ REQ REP RTU DREQ DREP", "wire %r" % seq(m))
    gap = None
    if len(m) == 6:
        gap = m[1]["t"] - m[0]["t"]
        c(m[0]["tid"] == m[1]["tid"] and m[0]["lcid"] == m[1]["lcid"] and m[0]["psn"] == m[1]["psn"], "retransmitted REQ differs")
        c(3.5 < gap < 7.0, "REQ retry after %.2f s" % gap)
    c(ok_result("a", "retrans") and ok_result("b", "retrans"), "cmpeer RESULT not ok")
    c.done("k-retrans", "first REQ dropped at ingress (tc), identical REQ resent after %.2f s, then established" % (gap or 0))

    c, m = Check(), cms("noqp")
    c(seq(m) == "REQ REP RTU DREQ DREP", "wire %r" % seq(m))
    if len(m) == 5:
        c(m[1]["qpn"] == "0xc0ffe0" and m[3]["rqpn"] == "0xc0ffe0", "REP qpn %s DREQ rqpn %s" % (m[1]["qpn"], m[3]["rqpn"]))
    c(ok_result("a", "noqp") and ok_result("b", "noqp"), "cmpeer RESULT not ok")
    c.done("k-noqp", "passive accept without a QP (REP QPN 0xc0ffe0), established + DREQ")

    c, m = Check(), cms("xrc")
    c(seq(m) == "REQ REP RTU DREQ DREP", "wire %r" % seq(m))
    if len(m) == 5:
        r, p = m[0], m[1]
        c(r["tst"] == 3 and r["ext"] == 1, "REQ transport %s ext %s" % (r["tst"], r["ext"]))
        c(r["sid"].startswith("0x00000000013f"), "REQ Service ID %s (PS_IB)" % r["sid"])
        c(p["qpn"] == "0x000000" and p["eecn"] == "0xc0ffe0" and p["srq"] == 1, "REP qpn %s eecn %s srq %s" % (p["qpn"], p["eecn"], p["srq"]))
    c(ok_result("a", "xrc") and ok_result("b", "xrc"), "cmpeer RESULT not ok")
    c.done("k-xrc", "kernel XRC INI->TGT handshake without QPs: REQ(tst 3, ext 1), REP(EECN=TGT QPN, SRQ=1), RTU, DREQ/DREP")

    c, m = Check(), cms("rping")
    c(read(os.path.join(res, "a.rping.rc")).strip() == "0" and read(os.path.join(res, "b.rping.rc")).strip() == "0", "rping rc")
    c(seq(m).startswith("REQ REP RTU") and "DREQ" in seq(m), "wire %r" % seq(m))
    c.done("k-rping", "rping -C 3: %s" % seq(m))

    c, m = Check(), cms("ucmatose")
    c(read(os.path.join(res, "a.ucmatose.rc")).strip() == "0" and read(os.path.join(res, "b.ucmatose.rc")).strip() == "0", "ucmatose rc")
    c(seq(m).split().count("REQ") == 2 and seq(m).split().count("RTU") == 2, "wire %r" % seq(m))
    c.done("k-ucmatose", "ucmatose -c 2: 2 connections")

    rate = None
    c, m = Check(), cms("cmtime")
    txt = outp("b", "cmtime")
    mm = re.search(r"^connect\s*:\s*([0-9.]+)\s+([0-9.]+)", txt, re.M)
    c(read(os.path.join(res, "b.cmtime.rc")).strip() == "0", "cmtime client rc")
    bad, counts = handshake_audit(m, 1000)
    for b in bad:
        c(False, "wire: " + b)
    if c(mm is not None, "no connect line in cmtime output"):
        total_ms = float(mm.group(1))
        rate = 1000.0 / (total_ms / 1000.0)
    reqs = [d for d in m if d["msg"] == "REQ"]
    rtus = [d for d in m if d["msg"] == "RTU"]
    wire = None
    if reqs and rtus:
        wire = 1000.0 / max(1e-6, rtus[-1]["t"] - reqs[0]["t"])
    c.done("k-cmtime", "cmtime -c 1000: connect step %s ms = %s conn/s (wire, first REQ to last RTU: %s conn/s); "
           "every connection REQ/REP/RTU/DREQ/DREP on the wire; %s"
           % (mm.group(1) if mm else "?", "%.0f" % rate if rate else "?", "%.0f" % wire if wire else "?",
              resent(counts, 1000)))

    _, frames = pcaptool.read_pcap(pcap)
    ok = bad = 0
    for _, _, pkt in frames:
        r = pcaptool.ip_udp(pkt)
        if not r or r[2][2:4] != b"\x12\xb7" or len(r[3]) < 16:
            continue
        fam, ip, udp, pay, _, _ = r
        if int.from_bytes(pay[-4:], "little") == pcaptool.icrc(fam, ip, udp, pay[:-4]):
            ok += 1
        else:
            bad += 1
    cell("k-icrc", ok > 5000 and bad == 0, "ICRC recomputed for %d rxe packets, %d mismatches" % (ok, bad))
    return rate


# ------------------------------------------------------------------------------------------
def nocm_cells(out):
    res = os.path.join(out, "nocm", "share", "results")
    r = lambda n: read(os.path.join(res, "a.%s.out" % n))  # noqa: E731
    c = Check()
    c("KERNEL-CM absent" in r("kernel-cm"), "kernel CM modules loaded: %s" % r("modules").strip())
    c("umad0" in r("devnodes") and "rdma_cm" not in r("devnodes"), "devnodes %s" % r("devnodes").split())
    c("umad0 ibdev=rxe0 port=1" in r("umad-sysfs"), "umad sysfs")
    c("GID-INDEX-IPV4 1" in r("gids"), "IPv4 GID index is not 1")
    c(": OK agent_id=" in r("umadprobe"), "CM class registration: %s" % r("umadprobe").strip())
    c.done("nocm-umad", "rdma_rxe+ib_uverbs+ib_umad only; umad0=rxe0 port 1; CM class 0x07 registered by a user process")
    c = Check()
    c("HELLO-C ok glibc=2.36" in r("hello-c"), "hello-c: %s" % r("hello-c").strip())
    c("HELLO-RS ok" in r("hello-rs") and "umad0=true" in r("hello-rs"), "hello-rs: %s" % r("hello-rs").strip())
    c("Usage: cm-ping" in r("peer-cm-ping") and read(os.path.join(res, "a.peer-cm-ping.rc")).strip() == "0",
      "the host-built cm-ping does not run in the guest: %s" % r("peer-cm-ping").strip()[:200])
    c.done("nocm-hostbin", "host-built dynamic C and Rust binaries, and ibcm's release cm-ping, run from /lab/bin (guest glibc 2.36)")


def xrc_rxe_cells(out):
    """ibcm-xrc's rdma-core backend on rxe0 (scenarios/xrc-rxe.sh): rxe has no XRC, so
    xrc-probe and xrcd-keeper --backend verbs must refuse with the typed error."""
    res = os.path.join(out, "xrc-rxe", "share", "results")
    r = lambda n: read(os.path.join(res, "a.%s.out" % n))  # noqa: E731
    rc = lambda n: read(os.path.join(res, "a.%s.rc" % n)).strip()  # noqa: E731
    c = Check()
    c(rc("xrc-probe") == "2", "xrc-probe --device rxe0 exit %r, want 2: %s" % (rc("xrc-probe"), r("xrc-probe").strip()[:300]))
    c("device rxe0 has no XRC (IBV_DEVICE_XRC not set" in r("xrc-probe"), "no typed no-XRC error: %s" % r("xrc-probe").strip()[:300])
    c(re.search(r"^RESULT no-xrc device=rxe0", r("xrc-probe"), re.M) is not None, "no RESULT no-xrc line")
    c(re.search(r"ibv_open_xrcd \(forced\): .*not supported", r("xrc-probe-force"), re.I) is not None,
      "forced ibv_open_xrcd: %s" % r("xrc-probe-force").strip()[:300])
    c(rc("xrc-probe-any") == "2", "xrc-probe on the first device exit %r, want 2" % rc("xrc-probe-any"))
    c.done("xrc-rxe-no-xrc", "xrc-probe: device rxe0 has no XRC (exit 2); a forced ibv_open_xrcd is not supported")
    c = Check()
    c(rc("keeper-verbs") not in ("", "0"), "xrcd-keeper --backend verbs exit %r, want non-zero" % rc("keeper-verbs"))
    c("device rxe0 has no XRC" in r("keeper-verbs"), "xrcd-keeper: %s" % r("keeper-verbs").strip()[:300])
    c.done("xrc-rxe-keeper-verbs", "xrcd-keeper serve --backend verbs refuses rxe0: no XRC")


def netns_cells(out):
    run = os.path.join(out, "netns")
    res = os.path.join(run, "share", "results")
    host = read(os.path.join(run, "host.log"))
    c = Check()
    c(read(os.path.join(res, "a.ping4.rc")).strip() == "0", "ping VM->host IPv4")
    c(read(os.path.join(res, "a.ping6.rc")).strip() == "0", "ping VM->host IPv6")
    c.done("netns-link", "VM on a tap in the lab netns reaches 10.78.0.1 and fd00:78::1")
    c = Check()
    c("ROCE-PROBE-RESULT ok" in host, "probe results: %s" % "; ".join(l for l in host.splitlines() if l.startswith("PROBE")))
    c.done("netns-icrc-ipid", "rxe accepts UDP-socket RoCEv2 with predicted IP ID 0 (unconnected + IP_PMTUDISC_DO), raw IPv4, IPv6; drops default/connected/no-DF sockets")
    c = Check()
    c("HOST-TX REJ" in host, "host sent no REJ")
    c(("EVENT REJECTED status=28 pd=%s" % PD_HOST) in read(os.path.join(res, "a.host-passive.out")), "VM kernel did not accept the host's REJ")
    c("upd=%s" % PD_VM in host, "host did not see the REQ private data")
    c.done("netns-host-passive", "VM kernel CM REQ -> host program over UDP 4791 -> REJ 28 + private data accepted by the VM")


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


def summary_of(txt):
    """cm-ping's last line -> (established, rejected, timed out, disconnected, disconnect timed out)
    or None; the fifth is None when the line lacks it (an older cm-ping)"""
    m = re.findall(r"^cm-ping: (\d+) established, (\d+) rejected, (\d+) timed out, (\d+) disconnected"
                   r"(?:, (\d+) disconnect timed out)?", txt, re.M)
    return tuple(int(x) if x != "" else None for x in m[-1]) if m else None


def want_summary(want):
    """an expected (established, rejected, timed out, disconnected) -> the 5-tuple summary_of
    gives when no disconnect timed out"""
    return tuple(want) + (0,)


def handshake_audit(m, n):
    """the CM protocol of N connections that must all be established and torn down, in one
    capture M (cm_list): every REQ answered by a REP, every REP by an RTU, every connection
    disconnected (a DREQ answered by a DREP), no REJ; retransmissions (duplicate REQ, REP,
    DREQ, and the RTU/DREP that answer duplicates) are legal up to the REQ's Max CM Retries.
    Exact message counts are not asserted: timing changes them.
    -> (list of problems, dict of totals)"""
    conns = {}      # active side's comm ID -> Counter of messages
    p2a = {}        # passive side's comm ID -> active side's comm ID (from the REP)
    retries = 15
    totals = {k: 0 for k in ("REQ", "REP", "RTU", "DREQ", "DREP", "MRA", "REJ", "other")}

    def conn_of(d):
        for cid in (d.get("lcid"), d.get("rcid")):
            if cid in conns:
                return conns[cid]
            if cid in p2a:
                return conns[p2a[cid]]
        return None

    stray = 0
    for d in m:
        msg = d["msg"]
        totals[msg if msg in totals else "other"] += 1
        if msg == "REQ":
            retries = min(retries, d.get("max_cm_retries", 15))
            c = conns.setdefault(d["lcid"], {})
        elif msg == "REP":
            p2a.setdefault(d["lcid"], d["rcid"])
            c = conns.get(d["rcid"])
        else:
            c = conn_of(d)
        if c is None:
            stray += 1
            continue
        c[msg] = c.get(msg, 0) + 1
    bad = []
    if len(conns) != n:
        bad.append("%d connections (distinct REQ comm IDs), want %d" % (len(conns), n))
    if stray:
        bad.append("%d CM messages of no connection" % stray)
    lim = 1 + retries
    checks = (
        ("no REP", lambda c: c.get("REP", 0) == 0),
        ("no RTU", lambda c: c.get("RTU", 0) == 0),
        ("no DREQ", lambda c: c.get("DREQ", 0) == 0),
        ("no DREP", lambda c: c.get("DREP", 0) == 0),
        ("a REJ", lambda c: c.get("REJ", 0) > 0),
        ("more than %d REQs" % lim, lambda c: c.get("REQ", 0) > lim),
        ("more than %d REPs" % lim, lambda c: c.get("REP", 0) > lim),
        ("more than %d DREQs" % lim, lambda c: c.get("DREQ", 0) > lim),
        ("more RTUs than REPs", lambda c: c.get("RTU", 0) > c.get("REP", 0)),
        ("more DREPs than DREQs", lambda c: c.get("DREP", 0) > c.get("DREQ", 0)),
    )
    for what, test in checks:
        k = sum(1 for c in conns.values() if test(c))
        if k:
            bad.append("%d connections with %s" % (k, what))
    return bad, totals


def resent(totals, n):
    """'R REQs, P REPs, D DREQs resent, M MRAs' from handshake_audit's totals"""
    return "%d REQs, %d REPs, %d DREQs resent, %d MRAs" % (totals["REQ"] - n, totals["REP"] - n, totals["DREQ"] - n,
                                                          totals["MRA"])


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
        notes.append("%s s = %s conn/s (%s)" % (mm.group(2) if mm else "?", "%.0f" % ibcm_r[-1] if mm else "?",
                                               resent(counts, 1000)))
    ibcm = max(ibcm_r) if len(ibcm_r) == 2 else None
    c.done("ibcm-rate", "cm-ping --count 1000 --parallel 1000 --hold over umad between two nocm VMs, connect step, "
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
        c(m[3]["rqpn"] == "0x001000", "DREQ remote QPN %s (ibcm's 0x001000)" % m[3]["rqpn"])
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


def cleanup_cell(out):
    # every netns lab.sh created must be gone, and no qemu of the lab may be left running
    logs = "".join(read(os.path.join(out, f + ".log")) for f in LAB_RUNS)
    names = re.findall(r"created netns (\S+)", logs)
    present = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    left = [n for n in names if re.search(r"^%s\b" % re.escape(n), present, re.M)]
    pids = re.findall(r"VM \w+ pid (\d+)", logs)
    alive = [p for p in pids if os.path.exists("/proc/%s" % p) and "qemu" in read("/proc/%s/cmdline" % p)]
    cell("lab-cleanup", bool(names) and not left and bool(pids) and not alive,
         "netns %s deleted, %d qemu pids all gone" % (",".join(names) or "?", len(pids)) if not left and not alive
         else "left: netns %s qemu %s" % (left, alive))


# ------------------------------------------------------------------------------------------
def tshark_cm(pcap):
    """-> list of (attributeid int, tid str, rej reason or None) via tshark"""
    p = subprocess.run(["tshark", "-r", pcap, "-Y", "infiniband.mad.mgmtclass == 0x07", "-T", "fields",
                        "-e", "infiniband.mad.attributeid", "-e", "infiniband.mad.transactionid",
                        "-e", "infiniband.cm.rej.reason"], capture_output=True, text=True)
    rows = []
    for line in p.stdout.splitlines():
        f = line.split("\t")
        rows.append((int(f[0], 16), "0x%016x" % int(f[1], 16), int(f[2], 16) if len(f) > 2 and f[2] else None))
    return rows


def ours_cm(pcap):
    names = {v: k for k, v in pcaptool.CM_NAMES.items()}
    return [(names[d["msg"]], d["tid"], d.get("reason")) for d in cm_list(pcap)]


def tshark_cell(fixtures, out):
    """tshark and pcaptool agree on every CM MAD of the committed kernel fixtures and of this
    run's wire captures (OUT/*/wire.pcap)"""
    if not shutil.which("tshark"):
        cell("fixtures-tshark", False, "tshark not installed")
        return
    files = sorted(os.path.join(fixtures, f) for f in os.listdir(fixtures) if f.endswith(".pcap")) if os.path.isdir(fixtures) else []
    runs = sorted(os.path.join(out, r, "wire.pcap") for r in LAB_RUNS if os.path.exists(os.path.join(out, r, "wire.pcap")))
    bad, n, nrun = [], 0, 0
    for p in files + runs:
        t, o = tshark_cm(p), ours_cm(p)
        n += len(o)
        if p in runs:
            nrun += len(o)
        # a fixture holds CM MADs by construction; a run's capture may have none (nocm, xrc-rxe)
        if t != o or (not o and p not in runs):
            diff = next((i for i, (x, y) in enumerate(zip(t, o)) if x != y), min(len(t), len(o)))
            bad.append("%s (tshark %d CM, pcaptool %d, first difference at CM MAD #%d: %s vs %s)"
                       % (os.path.relpath(p, out if p in runs else fixtures), len(t), len(o), diff,
                          t[diff] if diff < len(t) else "-", o[diff] if diff < len(o) else "-"))
    ok = bool(files) and len(runs) == len(LAB_RUNS) and not bad
    if ok:
        detail = ("%d kernel fixtures and this run's %d wire captures, %d CM MADs (%d of this run): tshark and pcaptool "
                  "agree on attribute/TID/REJ reason" % (len(files), len(runs), n, nrun))
    elif bad:
        detail = "mismatch: %s" % ", ".join(bad)
    elif not files:
        detail = "no fixtures in %s" % fixtures
    else:
        detail = "only %d of %d runs left a wire.pcap" % (len(runs), len(LAB_RUNS))
    cell("fixtures-tshark", ok, detail)


# fixture name -> (cell capture, max CM frames kept, drop RC data packets[, first N connections])
FIXTURES = {
    "establish_dreq_active.pcap": ("establish", None, False),
    "establish_dreq_passive.pcap": ("dreq-passive", None, False),
    "rej28_consumer_private_data.pcap": ("rej-consumer", None, False),
    "rej8_no_listener.pcap": ("rej-nolistener", None, False),
    "mra_slow_accept.pcap": ("mra", None, False),
    "req_retransmission_after_drop.pcap": ("retrans", None, False),
    "accept_without_qp.pcap": ("noqp", None, False),
    "xrc_handshake_no_qp.pcap": ("xrc", None, False),
    "rping_3.pcap": ("rping", None, False),
    "cmtime_first_20_connections.pcap": ("cmtime", None, True, 20),
}


def save_fixtures(out, dest):
    os.makedirs(dest, exist_ok=True)
    cells_dir = os.path.join(out, "kernel", "cells")
    listing = []
    for name, spec in FIXTURES.items():
        src, mx, nodata = spec[:3]
        first = spec[3] if len(spec) > 3 else None
        sp = os.path.join(cells_dir, src + ".pcap")
        if not os.path.exists(sp):
            print("save-fixtures: missing %s" % sp)
            continue
        dp = os.path.join(dest, name)
        with open(os.devnull, "w") as dn:
            old = sys.stdout
            sys.stdout = dn
            try:
                pcaptool.cmd_trim(sp, dp, mx, nodata, first)
            finally:
                sys.stdout = old
        _, frames = pcaptool.read_pcap(dp)
        m = cm_list(dp)
        listing.append("## %s (%d frames, %d bytes; %d CM: %s)" % (name, len(frames), os.path.getsize(dp), len(m),
                                                                  seq(m) if len(m) <= 12 else seq(m[:10]) + " ..."))
        for d in m[:12]:
            keys = [k for k in ("lcid", "rcid", "tid", "sid", "qpn", "eecn", "srq", "tst", "ext", "reason", "mraed",
                                "service_timeout", "upd", "pd") if k in d]
            listing.append("    %8.3f s %s -> %s %-4s %s" % (d["t"], d["src"], d["dst"], d["msg"],
                                                            " ".join("%s=%s" % (k, d[k]) for k in keys)))
    with open(os.path.join(out, "fixtures-listing.txt"), "w") as f:
        f.write("\n".join(listing) + "\n")
    print("save-fixtures: %d files into %s (listing: %s)" % (len(listing and FIXTURES), dest, os.path.join(out, "fixtures-listing.txt")))


def run_cell(out, run, step):
    """run-RUN: lab.sh's exit status, and its run report (OUT/RUN.log): every VM printed
    LAB-READY with rxe0 ACTIVE and LAB-SCRIPT-DONE rc=0, and a netns host part exited 0"""
    rc, secs = step
    log = read(os.path.join(out, run + ".log"))
    ready = dict(re.findall(r"^%s/(\w+): \[lab [^]]*\] LAB-READY .*rxe0=(.*)$" % re.escape(run), log, re.M))
    done = dict(re.findall(r"^%s/(\w+): .*LAB-SCRIPT-DONE rc=(\d+)" % re.escape(run), log, re.M))
    host = re.findall(r"^%s/host: exit (\d+)" % re.escape(run), log, re.M)
    c = Check()
    c(rc == 0, "lab.sh run exit %s" % rc)
    c(ready and sorted(ready) == sorted(done), "VMs ready %s, finished %s" % (sorted(ready), sorted(done)))
    c(all("ACTIVE" in v for v in ready.values()), "rxe0 not ACTIVE: %s" % ready)
    c(all(v == "0" for v in done.values()), "scenario exit status %s" % done)
    c(all(h == "0" for h in host), "host part exit %s" % host)
    c.done("run-" + run, "lab.sh run exit 0, %s s; VM%s %s: rxe0 ACTIVE, scenario rc=0%s"
           % (secs, "s" if len(ready) > 1 else "", ",".join(sorted(ready)), ", host part exit 0" if host else ""))


def main(argv):
    out = argv[1]
    fixtures = argv[argv.index("--fixtures") + 1] if "--fixtures" in argv else None
    steps = {}
    for line in read(os.path.join(out, "steps.txt")).splitlines():
        p = line.split()
        if len(p) >= 3:
            steps[p[0]] = (int(p[1]), p[2])
    rc, secs = steps.get("build", (1, "?"))
    cell("lab-build", rc == 0, "pinned debs cached, guest built (%s s)" % secs)
    rc, secs = steps.get("ibcm-build", (1, "?"))
    cell("ibcm-build", rc == 0, "cargo build --release -p ibcm-tools --bin cm-ping; xrc-probe, xrcd-keeper (rdma) (%s s)" % secs)
    for s in LAB_RUNS:
        run_cell(out, s, steps.get(s, (1, "?")))
    rate = kernel_cells(out)
    nocm_cells(out)
    netns_cells(out)
    ibcm_cells(out, "ibcm-umad", "umad", A, B, "b")
    ibcm_cells(out, "ibcm-udp", "udp", "10.78.0.2", "10.78.0.1", "host")
    udp_wire_cell(out)
    kern, ibcm = ibcm_pair_cells(out)
    xrc_rxe_cells(out)
    cleanup_cell(out)
    if "--save-fixtures" in argv:
        save_fixtures(out, argv[argv.index("--save-fixtures") + 1])
    if fixtures:
        tshark_cell(fixtures, out)
    passed = sum(1 for _, ok in results if ok)
    # cells kernel-rate and ibcm-rate: the connect steps of cmtime -c 1000 and cm-ping --count 1000
    # on one rxe VM pair (k-cmtime, in the kernel pair, is printed in its cell); ratio = ibcm/kernel
    print("kernel-vs-ibcm: kernel %s conn/s, ibcm %s conn/s, ratio %s"
          % ("%.0f" % kern if kern else "?", "%.0f" % ibcm if ibcm else "?",
             "%.2f" % (ibcm / kern) if kern and ibcm else "n/a"))
    # the lab's packages: how many were pinned, and every substitution lab.sh made for a pinned
    # version the archive no longer has (never silent: it is named here, in the summary)
    pk = read(os.path.join(out, "lab-packages.txt")).splitlines()
    if pk and pk[0].startswith("pinned "):
        subs = [l for l in pk[1:] if l.strip()]
        print("lab-packages: %s pinned, %d substituted%s" % (pk[0].split()[1], len(subs),
              (": " + "; ".join(subs)) if subs else " (every pinned version used)"))
    else:
        print("lab-packages: unknown (no %s: lab.sh build did not get to fetch)" % os.path.join(out, "lab-packages.txt"))
    if os.environ.get("LAB_SUITE_START"):
        import time
        print("conformance-time: %d s wall for the whole suite" % (time.time() - int(os.environ["LAB_SUITE_START"])))
    print("conformance: %d/%d cells passed" % (passed, len(results)))
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
