#!/bin/sh
# rdmacm-kernel.sh -- rdma-core's rdmacm-utils on ibcm's librdmacm drop-in against the
# kernel's rdma_cm, both directions (cells PROGRAM-pas: drop-in server, kernel client;
# PROGRAM-act: kernel server, drop-in client), mckey on the drop-in, and a drop-in client
# SIGKILLed under its connection (rdmacm-exit). Cells: see
# rdmacm-cells.sh; expectations: check_rdmacm.py.
# VM a (10.77.0.1) = kernel CM (lab.mods=cm): rdma-core's librdmacm over rdma_ucm.
# VM b (10.77.0.2) = NO kernel CM (lab.mods=nocm): ibcmd on umad0 + the drop-in.
# lab-mods-a: cm
# lab-mods-b: nocm
# lab-timeout: 600
. /lab/lib.sh
. /lab/scenarios/rdmacm-cells.sh
DROPIN_A=0 DROPIN_B=1
pair_up
dropin_up
# next to the kernel CM: ibcmd on VM a's umad0, where ib_cm holds the CM class (rdmacm-coexist)
[ "$ROLE" = a ] && run coexist 20 ibcmd --addr "$MYIP" --socket /tmp/coexist.sock \
  --state /tmp/coexist.state --umad /dev/infiniband/umad0 --gid-index "$(gid_index)"
rdmacm_cells pas b 10.77.0.2
rdmacm_cells act a 10.77.0.1
mckey_cell b
exit_cell a 10.77.0.1
dropin_down
mark "$ROLE.finished"
if [ "$ROLE" = a ]; then waitfor b.finished 60; else waitfor a.finished 60; fi
lab_exit
