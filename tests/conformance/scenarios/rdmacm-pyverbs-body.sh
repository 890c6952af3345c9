# rdmacm-pyverbs-body.sh -- NOT a scenario: rdma-core's own rdma_cm test suite,
# tests/test_rdmacm.py (pyverbs), on rxe0; sourced by rdmacm-pyverbs.sh (on ibcm's librdmacm
# drop-in) and rdmacm-pyverbs-kernel.sh (on rdma-core's librdmacm and the kernel CM, the
# baseline); check_pyverbs.py reads the results.
#
# The guest boots the common initramfs plus initramfs-pyverbs.cpio.gz (python3.11, pyverbs
# 44.0-2, rdma-core's tests/ in /opt/rdma-core, taken by `lab.sh build` from the Debian source
# package; /opt/rdma-core/SOURCE says from where).  test_rdmacm runs every test as a passive and
# an active process (multiprocessing, fork) on this one node, both on rxe0 and the IPv4 address
# of eth0; rdmacm-pyverbs.py runs each test in a python process of its own, killed with its
# process group after PYVERBS_TEST_TIMEOUT seconds (default 120).
#
# With RDMACM_LIB_DIR set (the sourcing scenario, or the host through LAB_GUEST_ENV) the tests
# run with LD_LIBRARY_PATH=$RDMACM_LIB_DIR; every test's output then names the librdmacm it
# loaded (PYVERBS-ENV line).
#
# Results: /lab/results/a.pyverbs.out (the runner's output), a.pyverbs.rc (0 all passed or
# skipped, 1 some failed, 2 the tests could not be listed), a.pyverbs-mem.out (guest memory).
# The scenario itself exits 0 when the suite ran (whatever its results), 1 when it could not.
# before_pyverbs / after_pyverbs: defined by the sourcing scenario (they start and stop what
# the librdmacm under test needs).

meminfo() { awk '/^(MemTotal|MemFree|MemAvailable|Shmem):/ {printf "%s %s kB  ", $1, $2} END {print ""}' /proc/meminfo; }
say "initramfs-pyverbs: $(cat /opt/rdma-core/SOURCE 2>/dev/null || echo 'MISSING (boot with # lab-initrd-extra: pyverbs)')"
BOOTMEM=$(meminfo)
say "memory after boot: $BOOTMEM"
if ! command -v python3 >/dev/null || [ ! -e /opt/rdma-core/tests/test_rdmacm.py ]; then
  say "FAIL no python3 or no /opt/rdma-core/tests in this guest"; exit 1
fi
run pyverbs-env 60 sh -c 'python3 -VV; python3 -c "import pyverbs, sys; print(pyverbs.__file__)";
  rdma link show -j; /bin/ip -j addr show eth0; ibv_devinfo -d rxe0 | grep -E "state|link_layer|max_mcast"'

GID=$(gid_index)
TIMEOUT=${PYVERBS_TEST_TIMEOUT:-120}
if [ -n "${RDMACM_LIB_DIR:-}" ]; then
  [ -e "$RDMACM_LIB_DIR/librdmacm.so.1" ] || say "WARNING: no $RDMACM_LIB_DIR/librdmacm.so.1"
  export LD_LIBRARY_PATH=$RDMACM_LIB_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  say "RDMACM_LIB_DIR=$RDMACM_LIB_DIR: the tests run with LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
fi
before_pyverbs

# the lowest MemAvailable while the tests run, sampled every second
( min=; while :; do
    a=$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)
    [ -z "$min" ] || [ "$a" -lt "$min" ] && { min=$a; echo "$min" > /tmp/mem.min; }
    sleep 1
  done ) &
SAMPLER=$!

NTESTS=$(grep -c '^    def test_' /opt/rdma-core/tests/test_rdmacm.py)
# per test at most TIMEOUT, plus listing the tests; bounded by lab-timeout anyway
run pyverbs "$(awk -v n="$NTESTS" -v t="$TIMEOUT" 'BEGIN {printf "%d", (n + 2) * t + 10}')" python3 /lab/scenarios/rdmacm-pyverbs.py \
    --tree /opt/rdma-core --module tests.test_rdmacm \
    --dev rxe0 --port 1 --gid "$GID" --timeout "$TIMEOUT" ${PYVERBS_ARGS:-}
rc=$?
after_pyverbs
say "python processes left after the suite: $(pgrep -f python3 | grep -vx "$SAMPLER" | wc -l)"
kill "$SAMPLER" 2>/dev/null
{
  echo "after boot: $BOOTMEM"
  echo "after the tests: $(meminfo)"
  awk '/^MemTotal:/ {t=$2} END {printf "MemTotal %d kB\n", t}' /proc/meminfo
  echo "lowest MemAvailable during the tests: $(cat /tmp/mem.min 2>/dev/null) kB"
  echo "rootfs (initramfs) files: $(du -sk / -x 2>/dev/null | cut -f1) kB"
} > "$RES/$ROLE.pyverbs-mem.out"
cat "$RES/$ROLE.pyverbs-mem.out"
say "pyverbs runner rc=$rc"
[ "$rc" -le 1 ] || exit 1
lab_exit
