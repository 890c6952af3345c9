#!/bin/sh
# rdmacm-ibcm.sh -- rdma-core's rdmacm-utils on ibcm's librdmacm drop-in on both sides
# (cells PROGRAM-ii: server on VM b, client on VM a). Cells: see rdmacm-cells.sh;
# expectations: check_rdmacm.py.
# VM a (10.77.0.1), VM b (10.77.0.2): NO kernel CM (lab.mods=nocm), ibcmd on umad0 + the
# drop-in.
# lab-mods-a: nocm
# lab-mods-b: nocm
# lab-timeout: 600
. /lab/lib.sh
. /lab/scenarios/rdmacm-cells.sh
DROPIN_A=1 DROPIN_B=1
pair_up
dropin_up
rdmacm_cells ii b 10.77.0.2
dropin_down
mark "$ROLE.finished"
if [ "$ROLE" = a ]; then waitfor b.finished 60; else waitfor a.finished 60; fi
lab_exit
