"""check_rdmacm.py -- the rdmacm-* cells (scenarios/rdmacm-kernel.sh, rdmacm-ibcm.sh,
rdmacm-pyverbs.sh), called by check.py: rdma-core's own programs (the guests' unmodified
rdmacm-utils binaries) on ibcm's librdmacm drop-in (cm/rdmacm), against the kernel's rdma_cm
in both directions and with the drop-in on both sides, and rdma-core's pyverbs rdma_cm tests.

rdmacm_cells(out) prints one cell line per program and direction and returns the summary
lines: `rdmacm-cmtime: ...` (cmtime's per-step timings, drop-in vs kernel client on the same
VM pair) and, last, `rdmacm-compat: N/M programs passed unmodified; pyverbs rdmacm tests P
passed, F failed, S skipped`."""
import os
import re

from check_data import rping_pattern
from labcells import Check, cell, read

PINGS, PING_SIZE = 10, 64
# (run, cell suffix, server role, client role, which roles run the drop-in)
DIRECTIONS = (
    ("rdmacm-kernel", "pas", "b", "a", "b"),   # drop-in server <- kernel client
    ("rdmacm-kernel", "act", "a", "b", "b"),   # kernel server <- drop-in client
    ("rdmacm-ibcm", "ii", "b", "a", "ab"),     # drop-in on both sides
)
PROGRAMS = ("rping", "ucmatose", "udaddy", "cmtime", "rdma_server")
# the same programs with options that take other paths of the API (not counted as programs):
# rping -q (the QP created and moved by the application through rdma_init_qp_attr),
# ucmatose -m (rdma_migrate_id of every id to a new channel)
VARIANTS = ("rping_q", "ucmatose_m")
CMTIME_STEPS = ("create id", "resolve addr", "resolve route", "create qp", "connect", "disconnect",
                "destroy")


def without_trace(txt):
    """a program's output without the drop-in's trace lines (IBCM_RDMACM_TRACE=1)"""
    return "\n".join(l for l in txt.splitlines() if not l.startswith("librdmacm(ibcm) "))


def cmtime_table(txt):
    """cmtime's step table -> {step: (total ms, us per connection)}"""
    t = {}
    for m in re.finditer(r"^(\w[\w ]*?)\s*:\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)\s*$", txt, re.M):
        t[m.group(1).strip()] = (float(m.group(2)), float(m.group(5)))
    return t


def program_cell(res, prog, sfx, srv, cli, dropin):
    name = "rdmacm-%s-%s" % (prog, sfx)
    out = lambda role, part: read(os.path.join(res, "%s.%s-%s.%s.out" % (role, prog, sfx, part)))  # noqa: E731
    rc = lambda role, part: read(os.path.join(res, "%s.%s-%s.%s.rc" % (role, prog, sfx, part))).strip()  # noqa: E731
    s_txt, c_txt = without_trace(out(srv, "srv")), without_trace(out(cli, "cli"))
    s_rc, c_rc = rc(srv, "srv"), rc(cli, "cli")
    c = Check()
    sides = "server %s (%s), client %s (%s)" % (
        "drop-in" if srv in dropin else "kernel", srv, "drop-in" if cli in dropin else "kernel", cli)
    if prog == "cmtime":
        # the server never exits by itself: stopped (TERM, 143) once the client is done
        c(c_rc == "0", "client exit %r, want 0" % c_rc)
        c(s_rc in ("0", "143"), "server exit %r, want 0 or 143 (stopped)" % s_rc)
        t = cmtime_table(c_txt)
        c(all(s in t for s in CMTIME_STEPS), "client step table %s, want every step of %s" % (sorted(t), CMTIME_STEPS))
        c("failed" not in c_txt.lower() and "error" not in c_txt.lower(), "client reports an error")
        detail = "50 connections, each with a QP: %s; connect %.0f us/conn" % (
            sides, t.get("connect", (0, 0))[1])
    else:
        c(s_rc == "0", "server exit %r, want 0" % s_rc)
        c(c_rc == "0", "client exit %r, want 0" % c_rc)
        if prog in ("rping", "rping_q"):
            for i in range(PINGS):
                want = rping_pattern(i, PING_SIZE).rstrip(b"\0").decode()
                c(("ping data: " + want) in c_txt, "client lacks verified ping %d" % i)
                c(("server ping data: " + want) in s_txt, "server lacks ping %d" % i)
            c("data mismatch" not in c_txt + s_txt, "rping -V found a data mismatch")
            detail = "%d pings of %d B verified (-V) by both: %s" % (PINGS, PING_SIZE, sides)
            if prog == "rping_q":
                detail = "-q (QPs moved by rping with rdma_init_qp_attr), " + detail
        elif prog in ("ucmatose", "udaddy", "ucmatose_m"):
            for who, txt in (("server", s_txt), ("client", c_txt)):
                c("data transfers complete" in txt, "%s: no 'data transfers complete'" % who)
                c(re.search(r"^return status 0$", txt, re.M) is not None, "%s: no 'return status 0'" % who)
            n = 4 if prog == "ucmatose" else 2
            detail = "%d %s, 10 messages of 100 B each way: %s" % (
                n, "UD (SIDR) resolutions" if prog == "udaddy" else "RC connections", sides)
            if prog == "ucmatose_m":
                detail = "-m (rdma_migrate_id), " + detail
        else:
            c("rdma_server: end 0" in s_txt, "server: no 'rdma_server: end 0'")
            c("rdma_client: end 0" in c_txt, "client: no 'rdma_client: end 0'")
            detail = "rdma_create_ep/rdma_get_request (synchronous API), a send each way: %s" % sides
    c.done(name, detail)
    return not c.bad


def loader_cells(out):
    """each drop-in role's programs load /tmp/rdmacm/librdmacm.so.1 (glibc's loader says)"""
    for run, roles in (("rdmacm-kernel", "b"), ("rdmacm-ibcm", "ab")):
        res = os.path.join(out, run, "share", "results")
        c = Check()
        for r in roles:
            txt = read(os.path.join(res, "%s.loader.out" % r))
            c("librdmacm.so.1 => /tmp/rdmacm/librdmacm.so.1" in txt,
              "VM %s: rping does not load the drop-in (%r)" % (r, txt.strip()[:120]))
        c.done("rdmacm-loader-" + run, "rping on VM%s %s loads the drop-in: librdmacm.so.1 => "
               "/tmp/rdmacm/librdmacm.so.1 (no kernel CM there: lab.mods=nocm)"
               % ("s" if len(roles) > 1 else "", ",".join(roles)))


def mckey_cell(out):
    res = os.path.join(out, "rdmacm-kernel", "share", "results")
    txt, rc = without_trace(read(os.path.join(res, "b.mckey-b.out"))), read(os.path.join(res, "b.mckey-b.rc")).strip()
    c = Check()
    # mckey's failure is `return status -1`, exit 255; 124 is the time limit, 129..159 a signal
    c(rc.isdigit() and int(rc) not in (0, 124) and not 128 < int(rc) < 160,
      "exit %r, want a failure status (not 0, no crash, no timeout)" % rc)
    c("failure joining: Function not implemented" in txt, "no 'failure joining: Function not implemented'")
    c.done("rdmacm-mckey", "mckey on the drop-in fails at once and cleanly: rdma_join_multicast ENOSYS "
           "('failure joining: Function not implemented'), exit %s" % rc)
    return not c.bad


def exit_cell(out):
    """rdmacm-exit: the drop-in's rping client SIGKILLed under its connection; the kernel's rping
    server must hear DISCONNECTED and exit by itself"""
    res = os.path.join(out, "rdmacm-kernel", "share", "results")
    srv, rc = read(os.path.join(res, "a.exit.srv.out")), read(os.path.join(res, "a.exit.srv.rc")).strip()
    cli = without_trace(read(os.path.join(res, "b.exit.cli.out")))
    note = read(os.path.join(res, "a.exit.notice.out"))
    m = re.search(r"EXIT-NOTICED after ([\d.]+) s", note)
    c = Check()
    c("ping data: rdma-ping-20:" in cli, "the client never reached ping 20 (no established connection to kill)")
    c("DISCONNECT EVENT" in srv, "the kernel's rping server never reported DISCONNECT EVENT")
    # it exits by itself: not the time limit (124) nor bgwait's kill (143 / "timeout")
    c(rc.isdigit() and int(rc) not in (124, 143), "server exit %r: it did not end by itself" % rc)
    c(m is not None, "no EXIT-NOTICED line")
    c.done("rdmacm-exit", "drop-in rping client SIGKILLed after 20 pings: the kernel's rping server got "
           "DISCONNECTED and exited %s s after the kill was seen (9p barrier, TCG guests)" % (m.group(1) if m else "?"))


def coexist_cell(out):
    """rdmacm-coexist: ibcmd on the umad device of a VM whose kernel CM (ib_cm) is loaded must stop
    at once, saying the CM class is the kernel's"""
    res = os.path.join(out, "rdmacm-kernel", "share", "results")
    txt, rc = read(os.path.join(res, "a.coexist.out")), read(os.path.join(res, "a.coexist.rc")).strip()
    c = Check()
    c(rc.isdigit() and int(rc) not in (0, 124) and not 128 < int(rc) < 160,
      "ibcmd exit %r: want a refusal (not 0, not the time limit, no crash)" % rc)
    c("already registered" in txt and "ib_cm" in txt, "no 'already registered ... ib_cm' in %r" % txt.strip()[:200])
    c.done("rdmacm-coexist", "ibcmd on umad0 next to a loaded kernel CM stops at once (exit %s): the CM "
           "class is already registered, ib_cm owns it" % rc)


def cmtime_line(out):
    """cmtime's per-step timings: the drop-in's client (cmtime-act) vs the kernel's (cmtime-pas) on
    the rdmacm-kernel VM pair, and the drop-in's on both sides (cmtime-ii)"""
    def table(run, role, sfx):
        return cmtime_table(without_trace(read(os.path.join(out, run, "share", "results", "%s.cmtime-%s.cli.out" % (role, sfx)))))
    k, d, ii = table("rdmacm-kernel", "a", "pas"), table("rdmacm-kernel", "b", "act"), table("rdmacm-ibcm", "a", "ii")
    parts = []
    for s in CMTIME_STEPS:
        f = lambda t: "%.0f" % t[s][1] if s in t else "?"  # noqa: E731
        parts.append("%s %s/%s/%s" % (s, f(k), f(d), f(ii)))
    return ("rdmacm-cmtime: us/conn, 50 connections, kernel client->drop-in / drop-in client->kernel / "
            "drop-in<->drop-in: " + ", ".join(parts))


# the tests of rdma-core's test_rdmacm.py that fail on the drop-in by design: multicast is not
# supported (docs/rdmacm.md §4), so rdma_join_multicast fails with ENOSYS (errno 38)
PYVERBS_MULTICAST = ("test_rdmacm_async_multicast_traffic", "test_rdmacm_async_ex_multicast_traffic",
                     "test_rdmacm_async_ex_leave_multicast_traffic")


def pyverbs_rows(out, run):
    """(report lines, [(test, PASS|FAIL|SKIP, why)], (passed, failed, skipped)) of a pyverbs run,
    or None when it left no output"""
    from check_pyverbs import pyverbs_report
    res = os.path.join(out, run, "share", "results")
    text = read(os.path.join(res, "a.pyverbs.out"))
    if not text.strip():
        return None
    lines, summary, _ = pyverbs_report(text)
    rows = []
    for l in lines:
        m = re.match(r"^pyverbs \w+\.(test_\w+): (PASS|FAIL|SKIP) ?(.*)$", l)
        if m:
            rows.append(m.groups())
    n = tuple(int(x) for x in re.search(r"(\d+) passed, (\d+) failed, (\d+) skipped", summary).groups())
    return lines, rows, n


def pyverbs_cells(out):
    """rdmacm-pyverbs-kernel (the baseline: every test passes on rdma-core's librdmacm and the kernel
    CM) and rdmacm-pyverbs (on the drop-in: every test passes but the multicast ones, which must
    fail with ENOSYS); -> the drop-in's (passed, failed, skipped), or None"""
    base = pyverbs_rows(out, "rdmacm-pyverbs-kernel")
    c = Check()
    c(base is not None, "no output from the baseline run")
    if base:
        c(base[2][1] == 0 and base[2][0] > 0, "baseline: %d passed, %d failed, %d skipped" % base[2])
    c.done("rdmacm-pyverbs-kernel", "rdma-core's test_rdmacm.py on its own librdmacm and the kernel CM: "
           "%d passed, %d failed, %d skipped" % (base[2] if base else (0, 0, 0)))
    got = pyverbs_rows(out, "rdmacm-pyverbs")
    c = Check()
    c(got is not None, "no output from the drop-in run")
    if got:
        lines, rows, n = got
        for l in lines:
            print("  " + l)
        c(any("librdmacm: /tmp/rdmacm/librdmacm.so.1" in l for l in lines),
          "the tests did not load the drop-in")
        for test, st, why in rows:
            if test in PYVERBS_MULTICAST:
                c(st == "PASS" or (st == "FAIL" and "Errno: 38" in why),
                  "%s: %s %s (want multicast's ENOSYS)" % (test, st, why[:160]))
            else:
                c(st == "PASS", "%s: %s %s" % (test, st, why[:200]))
        c(len(rows) >= 10, "%d tests, want test_rdmacm.py's 10" % len(rows))
    c.done("rdmacm-pyverbs", "rdma-core's test_rdmacm.py on the drop-in (both sides through one ibcmd): "
           "%d passed, %d failed (multicast: rdma_join_multicast ENOSYS, by design), %d skipped"
           % (got[2] if got else (0, 0, 0)))
    return got[2] if got else None


def rdmacm_cells(out):
    passed = total = 0
    for run, sfx, srv, cli, dropin in DIRECTIONS:
        res = os.path.join(out, run, "share", "results")
        for prog in PROGRAMS:
            total += 1
            passed += program_cell(res, prog, sfx, srv, cli, dropin)
        for prog in VARIANTS:
            program_cell(res, prog, sfx, srv, cli, dropin)
    total += 1
    passed += mckey_cell(out)
    loader_cells(out)
    exit_cell(out)
    coexist_cell(out)
    py = pyverbs_cells(out)
    pyline = ("pyverbs rdmacm tests %d passed, %d failed, %d skipped" % py if py
              else "pyverbs rdmacm tests 0 passed, 0 failed, 0 skipped (not run)")
    return [cmtime_line(out),
            "rdmacm-compat: %d/%d programs passed unmodified; %s" % (passed, total, pyline)]
