#!/usr/bin/env python3
"""check_pyverbs.py -- the results of rdma-core's rdma_cm test suite (tests/test_rdmacm.py,
pyverbs) from `lab.sh run-single rdmacm-pyverbs`: one line per test and a summary.

    check_pyverbs.py [RUN_DIR | FILE]      (default: $LAB_OUT/rdmacm-pyverbs, else
                                            tests/conformance/out/rdmacm-pyverbs)

RUN_DIR is a lab run directory (its share/results/a.pyverbs.out is read); FILE is the output of
scenarios/rdmacm-pyverbs.py, or the plain output of `python3 -m unittest -v ...` /
rdma-core's run_tests.py -v.  It prints

    pyverbs CMTestCase.test_rdmacm_async_read: PASS
    pyverbs CMTestCase.test_rdmacm_sync_traffic: FAIL <reason>
    pyverbs CMTestCase.test_rdmacm_async_udp_traffic: SKIP <reason>
    pyverbs rdmacm tests P passed, F failed, S skipped

(before the summary, `pyverbs librdmacm: ...` names the librdmacm the tests loaded and
`pyverbs tests source: ...` where the test files came from, when the output says so), and exits
0 when no test failed and at least one ran, else 1.

A test FAILs when unittest says FAIL, ERROR or "unexpected success", when the runner killed it
at its time limit, when it has no result at all, or when one of its processes died of a signal
(PYVERBS-CHILD-SIGNAL / "Fatal Python error": rdma-core 44's harness counts such a test as
passed).  The reason is the exception line of the traceback, with what the passive and active
processes printed ("Player active got: ...").  Stdlib only; check.py may import
pyverbs_report().
"""
import os
import re
import signal
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)
from labcells import read  # noqa: E402
RUN = "rdmacm-pyverbs"
RESULT_FILE = os.path.join("share", "results", "a.pyverbs.out")
SOURCE_FILE = os.path.join("a.console.log")

# "test_x (tests.test_rdmacm.CMTestCase.test_x) ... " (3.11) or "test_x (tests.test_rdmacm.CMTestCase) ... "
START_RE = re.compile(r"^(test\w*) \(([\w.]+)\)(?: \.\.\. ?(.*))?$")   # no " ... ": a docstring line follows
RESULT_RE = re.compile(r"^(ok|FAIL|ERROR|expected failure|unexpected success|skipped (['\"])(.*)\2)$")
DETAIL_RE = re.compile(r"^(FAIL|ERROR|UNEXPECTED SUCCESS): (test\w*) \(([\w.]+)\)")
BAR1, BAR2 = "=" * 70, "-" * 70


def test_id(name, inner):
    return inner if inner.endswith("." + name) else inner + "." + name


def short(tid):
    """tests.test_rdmacm.CMTestCase.test_x -> CMTestCase.test_x"""
    parts = tid.split(".")
    return ".".join(parts[-2:]) if len(parts) >= 2 else tid


def signame(n):
    try:
        return signal.Signals(n).name
    except ValueError:
        return "signal %d" % n


def parse_unittest(text):
    """{test id: {"status": ok|FAIL|ERROR|skip|xfail|xpass, "reason": str, "output": [lines]}}
    in the order the tests ran, from unittest's -v output (with other processes' output mixed
    in)."""
    res = {}
    cur = None
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        m = START_RE.match(line)
        if m:
            cur = test_id(m.group(1), m.group(2))
            res[cur] = {"status": None, "reason": "", "output": []}
            rest = m.group(3)
            if rest is None:        # "test_x (id)\nFirst docstring line ... ok"
                nxt = lines[i + 1] if i + 1 < len(lines) else ""
                rest = nxt.partition(" ... ")[2] if " ... " in nxt else ""
                i += 1 if " ... " in nxt else 0
            rest = rest.strip()
            if rest:
                r = RESULT_RE.match(rest)
                if r:
                    set_result(res[cur], r)
                    cur = None
                else:
                    res[cur]["output"].append(rest)
            i += 1
            continue
        if line == BAR1 and i + 1 < len(lines):
            d = DETAIL_RE.match(lines[i + 1])
            if d:
                tid = test_id(d.group(2), d.group(3))
                j = i + 3
                tb = []
                while j < len(lines) and lines[j] not in (BAR1, BAR2):
                    tb.append(lines[j])
                    j += 1
                ent = res.setdefault(tid, {"status": d.group(1), "reason": "", "output": []})
                ent["traceback"] = tb
                i = j
                continue
        if cur is not None:
            r = RESULT_RE.match(line.strip())
            if r:
                set_result(res[cur], r)
                cur = None
            elif line.strip():
                res[cur]["output"].append(line.strip())
        i += 1
    for ent in res.values():
        tb = [l for l in ent.get("traceback", []) if l.strip()]
        if tb and not ent["reason"]:
            ent["reason"] = tb[-1].strip()
    return res


def set_result(ent, r):
    word = r.group(1)
    if word.startswith("skipped"):
        ent["status"], ent["reason"] = "skip", r.group(3)
    else:
        ent["status"] = {"ok": "ok", "FAIL": "FAIL", "ERROR": "ERROR", "expected failure": "xfail",
                         "unexpected success": "xpass"}[word]


def split_runner(text):
    """the runner's output -> (ids listed, {id: (segment text, end fields)}, preamble)"""
    listed = []
    m = re.search(r"^PYVERBS-TESTS \d+ (.*)$", text, re.M)
    if m:
        listed = m.group(1).split()
    segs = {}
    for m in re.finditer(r"^=== PYVERBS-TEST (\S+)\n(.*?)(?:^=== PYVERBS-END \1 ([^\n]*)$|\Z)", text, re.M | re.S):
        end = {}
        if m.group(3) is not None:
            for kv in m.group(3).split():
                k, _, v = kv.partition("=")
                end[k] = v
        else:
            end["unfinished"] = "1"
        segs[m.group(1)] = (m.group(2), end)
    return listed, segs


def crash_notes(seg):
    """processes of the test that died of a signal the harness did not send"""
    notes = []
    for m in re.finditer(r"^PYVERBS-CHILD-SIGNAL pid=(\d+) signal=(\d+)$", seg, re.M):
        notes.append("process %s died of %s" % (m.group(1), signame(int(m.group(2)))))
    for m in re.finditer(r"Fatal Python error: (.*)$", seg, re.M):
        notes.append("Fatal Python error: %s" % m.group(1).strip())
    return notes


CM_ORDER = ("req", "mra", "rej", "rep", "rtu", "dreq", "drep", "sidr_req", "sidr_rep", "lap", "apr")


def cm_sent(seg):
    """'cm tx req=1 rep=1 ...' from the runner's PYVERBS-COUNTERS line: the kernel CM's messages
    sent during the test ('' when none, e.g. multicast, or with a CM outside the kernel)"""
    m = re.search(r"^PYVERBS-COUNTERS \S+ (.*)$", seg, re.M)
    if not m:
        return ""
    tx = dict(re.findall(r"\bcm_tx_msgs/(\w+)=(-?\d+)", m.group(1)))
    if not tx:
        return "no kernel CM message"
    order = [k for k in CM_ORDER if k in tx] + sorted(k for k in tx if k not in CM_ORDER)
    return "cm tx " + " ".join("%s=%s" % (k, tx[k]) for k in order)


def verdict(ent, seg="", end=None):
    """-> (PASS|FAIL|SKIP, reason)"""
    end = end or {}
    players = [l for l in ent.get("output", []) if l.startswith("Player ")] if ent else []
    crashes = crash_notes(seg)
    if "timeout" in end:
        return "FAIL", "killed at the %s s limit (no result)%s" % (
            end["timeout"], ("; " + "; ".join(players)) if players else "")
    if not ent or ent.get("status") is None:
        why = "no unittest result"
        if "unfinished" in end:
            why += " (the runner stopped during this test)"
        elif end.get("rc"):
            why += " (rc=%s)" % end["rc"]
        tail = [l for l in seg.splitlines() if l.strip() and not l.startswith("PYVERBS-")]
        if tail:
            why += ": " + tail[-1].strip()[:200]
        return "FAIL", why
    st = ent["status"]
    if st in ("FAIL", "ERROR", "xpass"):
        reason = {"xpass": "unexpected success"}.get(st, st)
        if ent.get("reason"):
            reason += ": " + ent["reason"]
        parts = [reason] + players + crashes
        return "FAIL", "; ".join(parts)
    if crashes:
        return "FAIL", "unittest said %s, but %s (rdma-core 44's harness ignores a process killed by a signal)" % (
            st, "; ".join(crashes))
    if st == "skip":
        return "SKIP", ent.get("reason", "")
    if st == "xfail":
        return "PASS", "expected failure"
    notes = []
    n = len(re.findall(r"^PYVERBS-CHILD-SIGNAL pid=\d+ signal=15 by-harness$", seg, re.M))
    if n:
        notes.append("the harness stopped %d hanging process%s, as a bad-flow test expects" % (n, "es" if n > 1 else ""))
    if "killed-leftovers" in end:
        notes.append("left processes behind (killed)")
    return "PASS", "; ".join(notes)


def pyverbs_report(text, source=""):
    """-> (lines, summary line, ok)"""
    listed, segs = split_runner(text)
    rows = []
    if segs or listed:
        for tid in listed or list(segs):
            if tid not in segs:
                rows.append((tid, "FAIL", "not run (the runner ended before it)"))
                continue
            seg, end = segs[tid]
            parsed = parse_unittest(seg)
            ent = parsed.get(tid) or (next(iter(parsed.values())) if len(parsed) == 1 else None)
            st, why = verdict(ent, seg, end)
            if "secs" in end and st == "PASS":
                why = ("(%s s) %s" % (end["secs"], why)).strip()
            cm = cm_sent(seg)
            if cm and st != "SKIP":
                why = ("%s [%s]" % (why, cm)).strip()
            rows.append((tid, st, why))
    else:
        for tid, ent in parse_unittest(text).items():
            st, why = verdict(ent, "\n".join(ent.get("output", [])))
            rows.append((tid, st, why))
    lines = []
    libs = sorted(set(re.findall(r"^PYVERBS-ENV librdmacm=(.*?) LD_LIBRARY_PATH", text, re.M)))
    if libs:
        lines.append("pyverbs librdmacm: %s" % "; ".join(libs))
    if re.search(r"^PYVERBS-ENV .*netdev-fallback=on", text, re.M):
        lines.append("pyverbs netdev: rxe's netdev found with `rdma link show` (rdma-core >= 46's get_net_name; "
                     "44's sysfs lookup finds none for rxe0)")
    if source:
        lines.append("pyverbs tests source: %s" % source)
    m = re.search(r"^PYVERBS-LIST-FAILED.*$", text, re.M)
    if m:
        lines.append("pyverbs: %s" % m.group(0))
    for tid, st, why in rows:
        lines.append(("pyverbs %s: %s %s" % (short(tid), st, why)).rstrip())
    n = {k: sum(1 for r in rows if r[1] == k) for k in ("PASS", "FAIL", "SKIP")}
    summary = "pyverbs rdmacm tests %d passed, %d failed, %d skipped" % (n["PASS"], n["FAIL"], n["SKIP"])
    return lines, summary, bool(rows) and n["FAIL"] == 0


def main(argv):
    arg = argv[1] if len(argv) > 1 else os.path.join(os.environ.get("LAB_OUT", os.path.join(HERE, "out")), RUN)
    source = ""
    if os.path.isdir(arg):
        path = os.path.join(arg, RESULT_FILE)
        m = re.search(r"initramfs-pyverbs: (.*)$", read(os.path.join(arg, SOURCE_FILE)), re.M)
        source = m.group(1).strip() if m else ""
    else:
        path = arg
    text = read(path)
    if not text:
        print("pyverbs: no output in %s" % path)
        print("pyverbs rdmacm tests 0 passed, 0 failed, 0 skipped")
        return 1
    lines, summary, ok = pyverbs_report(text, source)
    for l in lines:
        print(l)
    print(summary)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
