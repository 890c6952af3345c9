#!/usr/bin/env bash
# run-xrc-rxe.sh -- boot one rxe VM of the conformance lab (tests/conformance) and check that
# ibcm-xrc's rdma-core backend reports "device has no XRC" there.
#
#   xrc/lab/run-xrc-rxe.sh        prints "cell xrc-rxe-no-xrc: PASS|FAIL ..." and exits 0|1
#
# The lab is used unchanged: its scripts are copied to a scratch directory together with
# xrc-rxe.sh and run against the lab's own build directory (LAB_BUILD, default
# tests/conformance/build; `lab.sh build` is a no-op when it is up to date). Needs what the
# lab needs (root, gcc, python3, apt on Debian 12) plus libibverbs-dev and pkg-config on the
# host to build xrc-probe.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
LAB=$ROOT/tests/conformance
TD=${CARGO_TARGET_DIR:-$ROOT/target}
(cd "$ROOT" && cargo build -q -p ibcm-xrc --features rdma --bin xrc-probe)
PROBE=$TD/debug/xrc-probe
# xrcd-keeper --backend verbs too, when the tools crate builds with the rdma feature.
BINS=$PROBE
if (cd "$ROOT" && cargo build -q -p ibcm-tools --features rdma --bin xrcd-keeper); then
  BINS="$BINS $TD/debug/xrcd-keeper"
else
  echo "run-xrc-rxe: xrcd-keeper did not build; its cell is skipped" >&2
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
cp -r "$LAB/lab.sh" "$LAB/guest" "$LAB/src" "$LAB/host" "$LAB/packages.lock" "$LAB/scenarios" "$W/"
cp "$HERE/xrc-rxe.sh" "$W/scenarios/"
export LAB_BUILD=${LAB_BUILD:-$LAB/build}
export LAB_OUT=${LAB_OUT:-$W/out}
"$W/lab.sh" build
LAB_PEER_BIN=$BINS "$W/lab.sh" run-single xrc-rxe || true
R=$LAB_OUT/xrc-rxe/share/results
show() { echo "--- $1"; cat "$R/a.$1.out" 2>/dev/null || echo "(missing)"; echo "--- rc $(cat "$R/a.$1.rc" 2>/dev/null || echo '?')"; }
show devinfo; show xrc-probe; show xrc-probe-force; show xrc-probe-any
[ -e "$R/a.keeper-verbs.out" ] && show keeper-verbs
fail=""
[ "$(cat "$R/a.xrc-probe.rc" 2>/dev/null)" = 2 ] || fail="$fail xrc-probe-rc"
grep -q "device rxe0 has no XRC (IBV_DEVICE_XRC not set" "$R/a.xrc-probe.out" 2>/dev/null || fail="$fail no-xrc-text"
grep -q "^RESULT no-xrc device=rxe0" "$R/a.xrc-probe.out" 2>/dev/null || fail="$fail result-line"
grep -qi "ibv_open_xrcd (forced): .*not supported" "$R/a.xrc-probe-force.out" 2>/dev/null || fail="$fail forced-open-xrcd"
[ "$(cat "$R/a.xrc-probe-any.rc" 2>/dev/null)" = 2 ] || fail="$fail first-device"
if [ -e "$R/a.keeper-verbs.out" ]; then
  if [ "$(cat "$R/a.keeper-verbs.rc")" != 0 ] && grep -q "device rxe0 has no XRC" "$R/a.keeper-verbs.out"; then
    echo "cell xrc-rxe-keeper-verbs: PASS xrcd-keeper --backend verbs refuses rxe0: no XRC"
  else
    echo "cell xrc-rxe-keeper-verbs: FAIL"; fail="$fail keeper-verbs"
  fi
fi
if [ -z "$fail" ]; then
  echo "cell xrc-rxe-no-xrc: PASS device rxe0 has no XRC; forced ibv_open_xrcd not supported"
else
  echo "cell xrc-rxe-no-xrc: FAIL$fail"; exit 1
fi
