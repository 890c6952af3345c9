#!/usr/bin/env python3
"""check.py -- asserts the conformance cells from what the lab runs left in $LAB_OUT.

  check.py OUT [--fixtures DIR] [--save-fixtures DIR]

Prints one line per cell, "cell <name>: PASS|FAIL <detail>", then
"kernel-vs-ibcm: ..." and, last, "conformance: P/N cells passed".  Exit 1 on any failure.
--fixtures DIR      also check the committed kernel fixtures in DIR and this run's wire captures
                    (OUT/*/wire.pcap) with tshark (parity cell)
--save-fixtures DIR write the trimmed per-cell captures of this run into DIR (see
                    fixtures/KERNEL-CAPTURES.md) and a listing to OUT/fixtures-listing.txt

The ibcm cells (umad-*, udp-*, ibcm-*: check_ibcm.py) read the ibcm-umad, ibcm-udp and ibcm-pair
runs, the kp-* cells (check_paths.py) the kernel-paths run; labcells.py holds what both use (cell results, captures, the protocol audit).
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

from labcells import (Check, cell, cm_list, handshake_audit, read, resent, results,  # noqa: E402
                      seq)
from check_ibcm import ibcm_cells, ibcm_pair_cells, qps_both, udp_wire_cell  # noqa: E402
from check_paths import kernel_paths_cells, udp_ipv6_cells  # noqa: E402
from check_data import data_cells  # noqa: E402
from check_hostile import hostile_cells  # noqa: E402
from check_rdmacm import rdmacm_cells  # noqa: E402

# the lab.sh runs of tests/conformance/run (steps.txt names, <name>.log)
LAB_RUNS = ("kernel", "nocm", "netns", "ibcm-udp", "ibcm-umad", "kernel-paths", "ibcm-pair", "xrc-rxe",
            "ibcm-data", "hostile", "rdmacm-kernel", "rdmacm-ibcm", "rdmacm-pyverbs",
            "rdmacm-pyverbs-kernel")


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
    c = Check()
    d, p = r("ibcmd-verbs"), r("capi-xrc-rxe")
    c("XRC unavailable" in d and "device rxe0 has no XRC" in d,
      "ibcmd --backend verbs did not say XRC is unavailable: %s" % d.strip()[-300:])
    c("ibcmd serving" in d, "ibcmd --backend verbs did not serve")
    c(rc("capi-xrc-rxe") == "0" and "capi-peer: ok" in p, "capi-peer exit %r: %s" % (rc("capi-xrc-rxe"), p.strip()[-300:]))
    for call in ("ibcm_xrcd_open", "ibcm_xrc_listen"):
        c(re.search(r"^%s: .*\(-12\): no-xrc: device rxe0 has no XRC .*, and ibv_open_xrcd fails: "
                    r"Operation not supported \(errno 95\)" % call, p, re.M) is not None,
          "%s did not return IBCM_EUNSUPPORTED with rxe's answer (its verbs errno): %s"
          % (call, p.strip()[-300:]))
    c.done("capi-xrc-rxe", "ibcmd --backend verbs on rxe0 serves (XRC unavailable, said at start); libibcm's "
           "ibcm_xrcd_open and ibcm_xrc_listen -> IBCM_EUNSUPPORTED: %s"
           % (re.findall(r"^ibcm_xrc_listen: (.*)$", p, re.M) or ["?"])[0][:160])


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
    """-> list of (attributeid int, tid str, rej reason or None) via tshark. Not the MADs that
    ICMP errors quote: when a host answers a late datagram with "port unreachable" (the
    hostile run's client closes its socket while the guest's last DREPs are on their way),
    tshark decodes the quoted packet as a MAD; pcaptool, like any CM, sees no MAD there."""
    p = subprocess.run(["tshark", "-r", pcap, "-Y", "infiniband.mad.mgmtclass == 0x07 && !icmp && !icmpv6", "-T", "fields",
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
    cell("ibcm-build", rc == 0, "cargo build --release -p ibcm-tools --features verbs --bin cm-ping --bin cm-bench; xrc-probe, xrcd-keeper (rdma) (%s s)" % secs)
    for s in LAB_RUNS:
        run_cell(out, s, steps.get(s, (1, "?")))
    rate = kernel_cells(out)
    nocm_cells(out)
    netns_cells(out)
    ibcm_cells(out, "ibcm-umad", "umad", A, B, "b")
    ibcm_cells(out, "ibcm-udp", "udp", "10.78.0.2", "10.78.0.1", "host")
    udp_wire_cell(out)
    udp_ipv6_cells(out)
    kernel_paths_cells(out)
    kern, ibcm = ibcm_pair_cells(out)
    xrc_rxe_cells(out)
    data_line = data_cells(out)
    hostile_line = hostile_cells(out)
    rdmacm_lines = rdmacm_cells(out)
    cleanup_cell(out)
    if "--save-fixtures" in argv:
        save_fixtures(out, argv[argv.index("--save-fixtures") + 1])
    if fixtures:
        tshark_cell(fixtures, out)
    passed = sum(1 for _, ok in results if ok)
    print(data_line)
    print(hostile_line)
    for line in rdmacm_lines:
        print(line)
    # cells kernel-rate and ibcm-rate: the connect steps of cmtime -c 1000 and cm-ping --count 1000
    # on one rxe VM pair (k-cmtime, in the kernel pair, is printed in its cell); ratio = ibcm/kernel
    print("kernel-vs-ibcm: kernel %s conn/s, ibcm %s conn/s, ratio %s (qps: %s)"
          % ("%.0f" % kern if kern else "?", "%.0f" % ibcm if ibcm else "?",
             "%.2f" % (ibcm / kern) if kern and ibcm else "n/a", qps_both()))
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
