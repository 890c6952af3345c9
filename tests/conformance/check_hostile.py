"""check_hostile.py -- the hostile-* cells of `lab.sh run-netns hostile` (scenarios/hostile.sh,
hostile.host): an off-path attacker on the host (`cm-bench flood --target`) against ibcm's
`cm-ping --listen --stateless` on rxe0 (umad), and the same attacks against the kernel CM's
listener (cmtime) for reference.

The attacker's figures come from its own lines (`flood-remote: legit …`, host.<cell>.out);
what only the listener knows -- its side of the connections, per peer, and its drops by
reason -- from cm-ping's last lines (a.hostile-ibcm.out): `cm-ping: established now by peer:
…` (taken while the attacker still held its connections) and the JSON counters."""
import json
import os
import re

from labcells import Check, cell, cm_list, read

RUN = "hostile"
LEGIT = "10.78.0.1"                                    # the legitimate client
SPOOFED = ["10.78.0.%d" % i for i in range(101, 110)]  # 8 flood sources and the attack source
VICTIMS = "10.78.0.110"                                # the victims' client
VM = "10.78.0.2"
KERNEL_SID = "0x0000000001061db1"                      # rdma_cm port 7601: the kernel's listener
CELLS = ("hostile-ibcm-legit", "hostile-ibcm-blind-rtu", "hostile-ibcm-teardown",
         "hostile-ibcm-amplification", "hostile-ibcm-drops", "hostile-kernel-reference")

FIG = re.compile(r"^flood-remote: legit ([\d.]+) \((\d+)/(\d+)\) client side; connect ms p50 ([\d.]+) "
                 r"p99 ([\d.]+); amplification ([\d.]+) \((\d+)/(\d+) bytes\); blind-rtu sent (\d+); "
                 r"teardown (\d+)/(\d+) client side; held (\d+) legit \+ (\d+) victims; "
                 r"reqs (\d+) at (\d+)/s$", re.M)
KEYS = ("ratio", "ok", "n", "p50", "p99", "amp", "out", "in", "blind", "td_ok", "td", "held", "victims",
        "reqs", "rate")


def figures(txt):
    """the attacker's figures line -> dict, or None"""
    m = FIG.findall(txt)
    if not m:
        return None
    return {k: (float(v) if "." in v else int(v)) for k, v in zip(KEYS, m[-1])}


def peers(txt):
    """cm-ping's `established now by peer:` line -> {IPv4: count}"""
    m = re.findall(r"^cm-ping: established now by peer: (.*)$", txt, re.M)
    if not m:
        return None
    got = {}
    for item in m[-1].split():
        a = re.search(r"(\d+\.\d+\.\d+\.\d+)[^=]*=(\d+)$", item)
        if a:
            got[a.group(1)] = got.get(a.group(1), 0) + int(a.group(2))
    return got


def counters(txt):
    """cm-ping's last line, the JSON counters -> dict, or None"""
    lines = txt.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else None
    except ValueError:
        return None


def wire_dreps(m):
    """the capture, split where the kernel's cell begins (its first REQ) -> for each part, the
    listener's DREPs to the victims' client that answer no DREQ of that client: spoofed DREQs
    the listener acted on (it answers them to the connection's real peer)"""
    start = next((d["t"] for d in m if d["msg"] == "REQ" and d.get("sid") == KERNEL_SID), None)
    parts = ([d for d in m if start is None or d["t"] < start], [d for d in m if start is not None and d["t"] >= start])

    def extra(part):
        dreps = sum(1 for d in part if d["msg"] == "DREP" and d["src"] == VM and d["dst"] == VICTIMS)
        dreqs = sum(1 for d in part if d["msg"] == "DREQ" and d["src"] == VICTIMS and d["dst"] == VM)
        return max(0, dreps - dreqs)
    return extra(parts[0]), (extra(parts[1]) if start is not None else None)


def hostile_cells(out):
    """the hostile-* cells; returns the `hostile:` summary line"""
    res = os.path.join(out, RUN, "share", "results")
    wire = wire_dreps(cm_list(os.path.join(out, RUN, "wire.pcap")))
    atk = figures(read(os.path.join(res, "host.hostile-ibcm.out")))
    ltxt = read(os.path.join(res, "a.hostile-ibcm.out"))
    lrc = read(os.path.join(res, "a.hostile-ibcm.rc")).strip()
    per, js = peers(ltxt), counters(ltxt)
    ktxt = read(os.path.join(res, "host.hostile-kernel.out"))
    kern = figures(ktxt)
    # the kernel DREQs every connection it still has when cmtime exits: what the client still
    # has established after that, the kernel had dropped already
    khold = re.findall(r"^flood-remote: hold ended \(.*\); (\d+) of (\d+) connections", ktxt, re.M)
    if atk is None or per is None or js is None:
        why = ("no attacker figures (%s)" % os.path.join(res, "host.hostile-ibcm.out") if atk is None else
               "no per-peer line or JSON counters from cm-ping (%s)" % os.path.join(res, "a.hostile-ibcm.out"))
        for n in CELLS[:-1]:
            cell(n, False, why + "; see %s.log" % os.path.join(out, RUN))
    else:
        ibcm_cells(atk, per, js, lrc, wire[0], resolved(read(os.path.join(res, "a.resolve.out"))))
    kc = Check()
    if kc(kern is not None, "no attacker figures against the kernel listener"):
        res_lines = read(os.path.join(res, "a.hostile-kernel-res.out")).split()
        kc.done("hostile-kernel-reference",
                "kernel CM (cmtime server), recorded, not asserted: legitimate %d/%d established (client "
                "side) during %d REQs at %d/s; amplification %.2f (%d B to the spoofed sources for %d B); "
                "teardown %d/%d seen by the client; `rdma res` lists %s rdma_cm ids and %s QPs after the "
                "attack; once cmtime was stopped %s of %s connections (%d victims) were still established "
                "on the client's side (the kernel DREQs those it still has when its process exits); on the "
                "wire, %s DREPs of the kernel to the victims' client answer no DREQ of it: spoofed DREQs it "
                "acted on"
                % (kern["ok"], kern["n"], kern["reqs"], kern["rate"], kern["amp"], kern["out"], kern["in"],
                   kern["td_ok"], kern["td"], res_lines[0] if res_lines else "?",
                   res_lines[1] if len(res_lines) > 1 else "?", khold[-1][0] if khold else "?",
                   khold[-1][1] if khold else "?", kern["victims"], "?" if wire[1] is None else wire[1]))
    else:
        kc.done("hostile-kernel-reference", "")
    return "hostile: ibcm (stateless) %s; kernel %s" % (line(atk, per, wire[0]), line(kern, None, wire[1]))


def line(f, per, spoofed_dreqs):
    if f is None:
        return "no figures"
    both = min(f["ok"], per.get(LEGIT, 0)) if per is not None else None
    return ("legitimate %s/%d, amplification %.2f, teardown %d/%d client side and %s spoofed DREQs acted on "
            "(wire), %d REQs at %d/s"
            % ("%d" % both if both is not None else "%d (client side)" % f["ok"], f["n"], f["amp"],
               f["td_ok"], f["td"], "?" if spoofed_dreqs is None else spoofed_dreqs, f["reqs"], f["rate"]))


def resolved(txt):
    """the guest's `resolve` step (hostile.sh: `ping_each` of guest/lib.sh over the attacker's ten
    addresses, a line each, 1 if it answered) -> how many answered"""
    return sum(1 for l in txt.splitlines()[:10] if l.strip() == "1")


def ibcm_cells(f, per, js, lrc, wire_teardowns, n_resolved):
    dropped = js.get("dropped", {})
    # legitimate connects during the flood: established on both sides (the client's count and
    # the listener's own, for the client's address), at least 99 %, in the stateless mode
    c = Check()
    both = min(f["ok"], per.get(LEGIT, 0))
    c(both >= 0.99 * f["n"], "%d/%d legitimate connections established on both sides (< 99 %%)" % (both, f["n"]))
    c(per.get(LEGIT, 0) == f["ok"], "the listener holds %d connections of %s, the client %d"
      % (per.get(LEGIT, 0), LEGIT, f["ok"]))
    c(js.get("stateless_replies", 0) > 0, "no stateless REP: the listener never was under pressure")
    c(f["reqs"] > 0, "no flood")
    c(lrc == "0", "cm-ping exit status %s" % lrc)
    # unresolved senders stall the port's MAD receive path in the kernel, up to 1 s each
    # (docs/protocol.md §5.11): the cell measures the listener only with all ten resolved
    c(n_resolved == 10, "the guest resolved %d of the attacker's 10 addresses before the cells "
      "(a.resolve.out)" % n_resolved)
    c.done("hostile-ibcm-legit",
           "%d/%d established on both sides during a flood of %d REQs at %d/s (connect ms p50 %.1f p99 %.1f); "
           "listener: %d stateless REPs, %d stateless connections, %d MADs received in all; the attacker's "
           "10 addresses resolved by the guest first"
           % (both, f["n"], f["reqs"], f["rate"], f["p50"], f["p99"], js.get("stateless_replies", 0),
              js.get("stateless_established", 0), js.get("rx", 0)))
    # blind RTUs: no connection of the listener has a spoofed source; the guessed RTUs are
    # counted as drops by reason
    c = Check()
    blind = {a: n for a, n in per.items() if a in SPOOFED}
    rtu_drops = sum(dropped.get(k, 0) for k in ("bad_cookie", "unknown_comm_id", "mismatched_comm_id",
                                                 "expired_cookie", "replayed_cookie"))
    c(not blind, "connections established for spoofed sources: %s" % blind)
    c(rtu_drops >= 32 * f["blind"], "%d guessed RTUs dropped (by reason), %d sent" % (rtu_drops, 32 * f["blind"]))
    c.done("hostile-ibcm-blind-rtu",
           "0/%d blind RTU attempts established a connection; %d guessed RTUs dropped (bad_cookie %d, "
           "unknown_comm_id %d)" % (f["blind"], rtu_drops, dropped.get("bad_cookie", 0),
                                    dropped.get("unknown_comm_id", 0)))
    # spoofed teardowns: every victim still established on both sides when the listener stopped
    c = Check()
    c(f["victims"] > 0, "no victim was attacked")
    c(f["td_ok"] == 0, "%d/%d spoofed teardown messages tore a victim down on the client's side"
      % (f["td_ok"], f["td"]))
    c(per.get(VICTIMS, 0) == f["victims"], "the listener holds %d of the %d victims"
      % (per.get(VICTIMS, 0), f["victims"]))
    c(dropped.get("wrong_peer", 0) >= f["td"], "%d messages dropped as wrong_peer, %d spoofed"
      % (dropped.get("wrong_peer", 0), f["td"]))
    c(wire_teardowns == 0, "on the wire, %d DREPs of the listener to the victims' client answer no DREQ of "
      "it (spoofed DREQs acted on)" % wire_teardowns)
    c.done("hostile-ibcm-teardown",
           "0/%d spoofed DREQ / REJ 28 / REJ 4 / stale REQ tore a connection down (%d victims held on both "
           "sides; no DREP for a spoofed DREQ on the wire); %d dropped as wrong_peer"
           % (f["td"], f["victims"], dropped.get("wrong_peer", 0)))
    # amplification: bytes to the spoofed sources over bytes from them
    c = Check()
    c(f["amp"] <= 3.0, "amplification %.2f > 3" % f["amp"])
    c(f["in"] > 0, "the spoofed sources sent nothing")
    c.done("hostile-ibcm-amplification", "%.2f (%d B to the spoofed sources for %d B from them)"
           % (f["amp"], f["out"], f["in"]))
    # every drop counted by reason in the final JSON line
    c = Check()
    want = ("bad_cookie", "unknown_comm_id", "wrong_peer", "duplicate", "malformed")
    c(isinstance(dropped, dict) and all(k in dropped for k in want), "reasons missing from %s" % dropped)
    total = sum(v for v in dropped.values() if isinstance(v, int)) if isinstance(dropped, dict) else 0
    c(total >= 32 * f["blind"] + f["td"], "%d drops counted, %d hostile messages at least"
      % (total, 32 * f["blind"] + f["td"]))
    c.done("hostile-ibcm-drops", "cm-ping's last line: %d drops by reason: %s; half_open_evicted %d, "
           "amplification_limited %d" % (total, ", ".join("%s %d" % kv for kv in sorted(dropped.items()) if kv[1]),
                                         js.get("half_open_evicted", 0), js.get("amplification_limited", 0)))
