"""labcells.py -- the shared part of the conformance checks (check.py, check_ibcm.py): the cell
results, reading a run's files and captures, and the protocol audit of many connections.

Stdlib only; pcaptool decodes the captures."""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
import pcaptool  # noqa: E402

results = []    # (cell name, passed), in order; check.py's main counts them


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
