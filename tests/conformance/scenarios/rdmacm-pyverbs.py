#!/usr/bin/env python3
"""rdmacm-pyverbs.py -- runs rdma-core's own rdma_cm tests (tests/test_rdmacm.py, pyverbs) in a
lab guest, one test per python process, each with a time limit.  Used by rdmacm-pyverbs.sh;
python3 stdlib only.  The test tree is the one lab.sh build took from rdma-core's Debian source
package (/opt/rdma-core/tests in the pyverbs initramfs); nothing of it is kept in this
repository.

    rdmacm-pyverbs.py [--tree DIR] [--module tests.test_rdmacm] [--dev rxe0] [--port 1]
                      [--gid N] [--timeout SECS] [--no-netdev-fallback] [TEST_ID ...]

Without TEST_IDs it lists the module's tests (in a child process) and runs each of them as
`unittest -v TEST_ID` in a child of its own, in a session of its own: when a test exceeds
--timeout seconds, the whole process group (the test and the passive/active processes that
test_rdmacm forks) is killed with SIGKILL, and the run goes on with the next test.  Around each
test it prints

    === PYVERBS-TEST <id>
    ... unittest -v output of that test (stderr and stdout of all its processes) ...
    PYVERBS-COUNTERS <id> <name>=<delta> ...   (kernel CM and rxe0 counters that moved)
    === PYVERBS-END <id> rc=<N> secs=<S> [timeout=<T>] [killed-leftovers]

which check_pyverbs.py turns into PASS/FAIL/SKIP lines.

rdma-core 44's two_nodes_rdmacm_traffic fails a test when its passive or active process exits
with status 1-4, or hangs; a process killed by a signal (exit code < 0: a crash inside
librdmacm, say) is not counted at all, so the test passes.  This runner only observes: in the
test's process every child that ends by a signal is reported as
`PYVERBS-CHILD-SIGNAL pid=<P> signal=<N>` (and PYTHONFAULTHANDLER=1 prints the crashing
process's Python stack), and check_pyverbs.py fails such a test -- except for the SIGTERM of
the harness's own terminate() of a process that hangs ("by-harness"; the bad-flow test
test_rdmacm_async_ex_leave_multicast_traffic passes that way).  The exit status is 0 when every test
passed or was skipped, 1 when one failed or timed out, 2 when the tests could not be listed.

Device, port and GID: test_rdmacm's RDMACMBaseTest takes them from args_parser (--dev, --port,
--gid) and needs an IP address, which rdma-core 44's RDMATestCase._get_ip_mac finds only through
/sys/class/infiniband/DEV/device/net/ -- a directory a software device such as rxe0 has not
(it is a virtual device without a parent), so every test would be skipped with "Device rxe0
doesn't have net interface".  rdma-core 46 (linux-rdma/rdma-core PR #1326 and #1328) finds the
netdev with `rdma link show -j` by device and port instead.  Unless --no-netdev-fallback is
given, this runner applies that lookup when (and only when) the sysfs directory is missing:
the port's netdev (eth0), its first address (ip -j addr show) as the tests' IP address.  The
test files themselves are not changed.
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time

HERE = os.path.abspath(__file__)


def rdma_link_netdev(dev, port):
    """The netdev of DEV/PORT from `rdma link show -j` (rdma-core >= 46's get_net_name)."""
    try:
        rows = json.loads(subprocess.check_output(['rdma', 'link', 'show', '-j']).decode())
    except (OSError, subprocess.CalledProcessError, ValueError):
        return None
    for row in rows:
        if row.get('ifname') == dev and row.get('port') == port and row.get('netdev'):
            return row['netdev']
    return None


def install_netdev_fallback():
    import tests.base as base
    stock = base.RDMATestCase._get_ip_mac

    def _get_ip_mac(self, dev, port, idx):
        if os.path.exists('/sys/class/infiniband/{}/device/net/'.format(dev)):
            return stock(self, dev, port, idx)
        net_name = rdma_link_netdev(dev, port)
        if net_name is None:
            self.args.append([dev, port, idx, None, None])
            return
        try:
            ip_addr, mac_addr = self.get_ip_mac_address(net_name)
        except (KeyError, IndexError):
            self.args.append([dev, port, idx, None, None])
        else:
            self.args.append([dev, port, idx, ip_addr, mac_addr])

    base.RDMATestCase._get_ip_mac = _get_ip_mac


def test_args(opts):
    a = []
    for k in ('dev', 'port', 'gid'):
        v = getattr(opts, k)
        if v is not None:
            a += ['--' + k, str(v)]
    return a


def setup_tree(opts):
    """Import rdma-core's tests package the way its run_tests.py does (args_parser first)."""
    sys.path[:0] = [opts.tree, os.path.join(opts.tree, 'tests')]
    from args_parser import parser
    sys.argv[1:] = test_args(opts)
    parser.parse_args()             # leaves sys.argv[1:] empty; the tests read parser.args
    import tests                    # noqa: F401  (imports every tests/test_*.py)
    if not opts.no_netdev_fallback:
        install_netdev_fallback()


def loaded_librdmacm():
    try:
        with open('/proc/self/maps') as f:
            paths = {l.split()[-1] for l in f if 'librdmacm' in l}
        return ' '.join(sorted(paths)) or 'not loaded'
    except OSError as e:
        return 'unknown (%s)' % e


def watch_child_signals():
    """Report every multiprocessing child that ended by a signal (observation only).  The
    harness itself stops the processes of a test that hangs (on purpose in a bad-flow test)
    with terminate(), i.e. SIGTERM: those are marked by-harness."""
    import multiprocessing.popen_fork as pf
    stock_poll, stock_terminate = pf.Popen.poll, pf.Popen.terminate

    def poll(self, flag=os.WNOHANG):
        rc = stock_poll(self, flag)
        if rc is not None and rc < 0 and not getattr(self, '_lab_reported', False):
            self._lab_reported = True
            by = ' by-harness' if getattr(self, '_lab_terminated', False) and -rc == signal.SIGTERM else ''
            print('PYVERBS-CHILD-SIGNAL pid=%d signal=%d%s' % (self.pid, -rc, by), file=sys.stderr, flush=True)
        return rc

    def terminate(self):
        self._lab_terminated = True
        return stock_terminate(self)
    pf.Popen.poll, pf.Popen.terminate = poll, terminate


# the kernel CM's counters (a port attribute group since Linux 5.14) and rxe's packet counters
COUNTER_DIRS = ('/sys/class/infiniband/{dev}/ports/{port}/cm_tx_msgs',
                '/sys/class/infiniband/{dev}/ports/{port}/cm_rx_msgs',
                '/sys/class/infiniband/{dev}/ports/{port}/cm_tx_retries',
                '/sys/class/infiniband/{dev}/ports/{port}/cm_rx_duplicates',
                '/sys/class/infiniband/{dev}/ports/{port}/hw_counters')


def counters(dev, port):
    """{name: value} of the kernel CM's counters and the device's hw counters (when present)"""
    c = {}
    for d in COUNTER_DIRS:
        d = d.format(dev=dev, port=port)
        try:
            names = os.listdir(d)
        except OSError:
            continue
        tag = os.path.basename(d)
        for n in names:
            try:
                with open(os.path.join(d, n)) as f:
                    c['%s/%s' % (tag, n)] = int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                pass
    return c


def child_list(opts):
    import unittest
    setup_tree(opts)
    suite = unittest.defaultTestLoader.loadTestsFromName(opts.module)

    def walk(s):
        for t in s:
            if isinstance(t, unittest.TestSuite):
                yield from walk(t)
            else:
                yield t.id()
    for tid in walk(suite):
        print(tid)
    return 0


def child_one(opts):
    import unittest
    setup_tree(opts)
    watch_child_signals()
    try:
        import pyverbs.cmid         # noqa: F401  (links librdmacm.so.1)
    except ImportError as e:
        print('PYVERBS-IMPORT-ERROR pyverbs.cmid: %s' % e, flush=True)
    print('PYVERBS-ENV librdmacm=%s LD_LIBRARY_PATH=%s netdev-fallback=%s' % (
        loaded_librdmacm(), os.environ.get('LD_LIBRARY_PATH', ''),
        'off' if opts.no_netdev_fallback else 'on'), flush=True)
    prog = unittest.main(module=None, argv=['unittest', '-v', opts.one], exit=False)
    r = prog.result
    return 0 if r.wasSuccessful() else 1


def child_cmd(opts, *extra):
    cmd = [sys.executable, HERE, '--tree', opts.tree, '--module', opts.module]
    cmd += test_args(opts)
    if opts.no_netdev_fallback:
        cmd.append('--no-netdev-fallback')
    return cmd + list(extra)


def run_limited(cmd, limit, out):
    """Run CMD in a session of its own, copy its output to OUT as it comes; after LIMIT seconds
    kill its whole process group.  Returns (rc, seconds, timed_out, leftovers_killed)."""
    env = dict(os.environ, PYTHONUNBUFFERED='1', PYTHONFAULTHANDLER='1')
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         start_new_session=True, env=env)

    def pump():
        for line in iter(p.stdout.readline, b''):
            out.write(line.decode('utf-8', 'replace'))
            out.flush()
    th = threading.Thread(target=pump, daemon=True)
    th.start()
    timed_out = False
    try:
        p.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        timed_out = True
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()
    # processes the test forked and left behind (they hold the pipe open, and rdma_cm ids)
    leftovers = False
    try:
        os.killpg(p.pid, 0)
        leftovers = True
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    th.join(10)
    return p.returncode, time.monotonic() - t0, timed_out, leftovers


def main():
    ap = argparse.ArgumentParser(description=__doc__.split('\n')[0])
    ap.add_argument('--tree', default='/opt/rdma-core',
                    help='the directory that holds rdma-core\'s tests/ (default /opt/rdma-core)')
    ap.add_argument('--module', default='tests.test_rdmacm')
    ap.add_argument('--dev')
    ap.add_argument('--port', type=int)
    ap.add_argument('--gid', type=int)
    ap.add_argument('--timeout', type=float, default=120.0, help='seconds per test')
    ap.add_argument('--no-netdev-fallback', action='store_true')
    ap.add_argument('--one', help=argparse.SUPPRESS)
    ap.add_argument('--list', action='store_true', help='list the tests and exit')
    ap.add_argument('tests', nargs='*')
    opts = ap.parse_args()

    if opts.one:
        return child_one(opts)
    if opts.list:
        return child_list(opts)

    ids = opts.tests
    if not ids:
        lst = subprocess.run(child_cmd(opts, '--list'), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, timeout=max(opts.timeout, 60))
        text = lst.stdout.decode('utf-8', 'replace')
        ids = [l.strip() for l in text.splitlines() if l.startswith(opts.module + '.')]
        if lst.returncode != 0 or not ids:
            sys.stdout.write(text)
            print('PYVERBS-LIST-FAILED rc=%d (no tests of %s)' % (lst.returncode, opts.module))
            return 2
    print('PYVERBS-TESTS %d %s' % (len(ids), ' '.join(ids)), flush=True)
    bad = 0
    for tid in ids:
        print('=== PYVERBS-TEST %s' % tid, flush=True)
        c0 = counters(opts.dev or 'rxe0', opts.port or 1)
        rc, secs, timed_out, leftovers = run_limited(child_cmd(opts, '--one', tid),
                                                     opts.timeout, sys.stdout)
        c1 = counters(opts.dev or 'rxe0', opts.port or 1)
        moved = ['%s=%d' % (k, c1[k] - c0.get(k, 0)) for k in sorted(c1) if c1[k] != c0.get(k, 0)]
        print('PYVERBS-COUNTERS %s %s' % (tid, ' '.join(moved) or '(none moved)'), flush=True)
        extra = (' timeout=%g' % opts.timeout if timed_out else '') + \
                (' killed-leftovers' if leftovers else '')
        print('=== PYVERBS-END %s rc=%s secs=%.1f%s' % (tid, rc, secs, extra), flush=True)
        if rc != 0 or timed_out:
            bad += 1
    return 1 if bad else 0


if __name__ == '__main__':
    sys.exit(main())
