#!/bin/sh
# ibcm-umad.sh -- ibcm against the Linux kernel CM over rxe, umad transport (cells umad-*).
# VM a (10.77.0.1) = kernel CM (lab.mods=cm): cmpeer / rping / ucmatose.
# VM b (10.77.0.2) = NO kernel CM (lab.mods=nocm): the host-built ibcm `cm-ping` on umad0,
# passed in with LAB_PEER_BIN (tests/conformance/run does that).  The cell list is in
# ibcm-cells.sh; check_ibcm.py asserts cmpeer's and cm-ping's outputs and the wire.
# lab-mods-a: cm
# lab-mods-b: nocm
# lab-timeout: 300
. /lab/lib.sh
pair_up
. /lab/scenarios/ibcm-cells.sh
TP=umad KIP=10.77.0.1 IIP=10.77.0.2
CMPING=cm-ping
CM_ARGS="--umad /dev/infiniband/umad0 --gid-index $(gid_index) --local-ip $IIP"
drop_first_req() { tc_drop_first_req; }
wait_dropped() { tc_wait_dropped "$1"; }
if [ "$ROLE" = a ]; then
  kernel_side
  run counters 10 sh -c '. /lab/lib.sh; counters'
  mark a.done
else
  if [ ! -x /lab/bin/cm-ping ]; then say "SKIP no /lab/bin/cm-ping (pass it with LAB_PEER_BIN)"; exit 1; fi
  ibcm_side
  run counters 10 sh -c '. /lab/lib.sh; counters'
  waitfor a.done 60
fi
lab_exit
