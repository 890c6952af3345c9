#!/bin/sh
# xrc-rxe.sh -- conformance-lab scenario: ibcm-xrc's rdma-core backend on Soft-RoCE (rxe).
# rxe has no XRC (docs/xrc.md §5), so xrc-probe must fail with the typed error
# "device rxe0 has no XRC (IBV_DEVICE_XRC not set in device_cap_flags 0x...)", exit status 2,
# and the forced ibv_open_xrcd must come back "not supported" (EOPNOTSUPP).
# tests/conformance/run runs it with LAB_PEER_BIN="out/bin/xrc-probe out/bin/xrcd-keeper"
# (`lab.sh run-single xrc-rxe`); check.py's xrc_rxe_cells reads the results.
# ibcmd --backend verbs (the suite's build, with rdma) on rxe0, through umad0 (so no kernel
# CM: nocm): the daemon serves, and libibcm's ibcm_xrcd_open gets IBCM_EUNSUPPORTED with
# rxe's own answer (cell capi-xrc-rxe).
# lab-mods-a: nocm
# lab-timeout: 120
. /lab/lib.sh
if [ ! -x /lab/bin/xrc-probe ]; then say "SKIP no /lab/bin/xrc-probe (pass it with LAB_PEER_BIN)"; exit 1; fi
run devinfo 20 sh -c 'ibv_devinfo -v -d rxe0 | grep -E "hca_id|device_cap_flags|XRC|xrc"'
run xrc-probe 30 /lab/bin/xrc-probe --device rxe0
run xrc-probe-force 30 /lab/bin/xrc-probe --device rxe0 --force
run xrc-probe-any 30 /lab/bin/xrc-probe
# The keeper on the real backend must refuse to start the same way (optional binary).
if [ -x /lab/bin/xrcd-keeper ]; then
  run keeper-verbs 30 /lab/bin/xrcd-keeper serve --socket /tmp/xrcd-keeper.sock --backend verbs --device rxe0
fi
if [ -x /lab/bin/ibcmd ] && [ -x /lab/bin/capi-peer ]; then
  bg ibcmd-verbs 60 ibcmd --backend verbs --addr $MYIP --socket /tmp/ibcmd.sock \
    --state /tmp/ibcmd.state --umad /dev/infiniband/umad0 --gid-index $(gid_index)
  wait_line ibcmd-verbs 'ibcmd serving' 30
  run capi-xrc-rxe 30 capi-peer xrcd /tmp/ibcmd.sock /tmp/lab.xrcd
  bgkill ibcmd-verbs; bgwait ibcmd-verbs 10 > /dev/null
else
  say "FAIL no /lab/bin/ibcmd or /lab/bin/capi-peer (the suite's build step makes them)"
fi
lab_exit
