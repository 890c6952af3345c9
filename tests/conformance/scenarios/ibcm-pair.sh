#!/bin/sh
# ibcm-pair.sh -- ibcm <-> ibcm over rxe/umad in two nocm VMs (no kernel CM at boot), then the
# kernel-vs-ibcm rate comparison on the very same VM pair and link:
#   ibcm-xrc, ibcm-xrc-dreq-passive   cm-ping --xrc (INI, VM b) -> cm-ping --listen (TGT, VM a)
#   ibcm-rate-R    cm-ping --count 1000 --parallel 1000 --hold --verbs rxe0 --data none on
#                  both sides (a real RC QP per connection, created, taken through INIT/RTR/RTS
#                  in the kernel's order and destroyed, as cmtime does; the active side creates
#                  its QPs before the connect step, as cmtime does): the connect step of 1000
#                  connections, all in flight at once as cmtime does
#   kernel-rate-R  then rdma_ucm (ib_cm, rdma_cm) is loaded in both VMs and `cmtime -c 1000`
#                  runs over the same link: its "connect" step is the kernel's figure; then the
#                  kernel CM is unloaded again (umad's CM class is free for ibcm)
#   two rounds R = 1, 2, alternating ibcm and kernel; check_ibcm.py takes the best of each (TCG
#   timing noise only ever slows a run down)
# lab-mods-a: nocm
# lab-mods-b: nocm
# lab-timeout: 300
. /lab/lib.sh
pair_up
. /lab/scenarios/ibcm-cells.sh
A=10.77.0.1 B=10.77.0.2
RATE_N=1000 RATE_K=1000
# the fair race: ibcm does cmtime's QP work per connection
RATE_QPS="--verbs rxe0 --data none"
CM_ARGS="--umad /dev/infiniband/umad0 --gid-index $(gid_index) --local-ip $MYIP"
if [ ! -x /lab/bin/cm-ping ]; then say "SKIP no /lab/bin/cm-ping (pass it with LAB_PEER_BIN)"; exit 1; fi
# lpassive CELL SECS args: VM a's cm-ping listener for one cell (cell markers around it)
lpassive() {
  _c=$1; _t=$2; shift 2
  cell_begin "$_c"
  bg "$_c" "$_t" cm-ping --listen $A $CM_ARGS "$@"
  wait_line "$_c" '^listening on' 20
  mark "$_c.ready"; waitfor "$_c.done" "$_t"; sleep 0.5; bgkill "$_c"; bgwait "$_c" 10
  cell_end "$_c"
}
lactive() {
  _c=$1; _t=$2; shift 2
  waitfor "$_c.ready" 120 && run "$_c" "$_t" cm-ping $CM_ARGS "$@"
  mark "$_c.done"
}
if [ "$ROLE" = a ]; then
  lpassive ibcm-xrc 30 --port 7401 --accept-data $PD_REP_I
  lpassive ibcm-xrc-dreq-passive 30 --port 7402
  for r in 1 2; do
    lpassive ibcm-rate-$r 120 --port 740$((2 + r)) --quiet $RATE_QPS
    # the kernel CM on the same pair: every umad agent of cm-ping is closed now
    run kernel-cm-load-$r 20 modprobe rdma_ucm
    mark a.kernel-cm-$r
    cell_begin kernel-rate-$r
    bg kernel-rate-$r 120 cmtime -c $RATE_N; wait_cm_listen 100; mark kernel-rate-$r.ready
    waitfor kernel-rate-$r.done 120; sleep 1; bgkill kernel-rate-$r; bgwait kernel-rate-$r 20
    cell_end kernel-rate-$r
    run kernel-cm-unload-$r 20 sh -c 'modprobe -r rdma_ucm; modprobe -r rdma_cm iw_cm ib_cm 2>/dev/null; ! grep -q "^ib_cm " /proc/modules'
    mark a.unloaded-$r
  done
  run counters 10 sh -c '. /lab/lib.sh; counters'
  mark a.done
else
  lactive ibcm-xrc 30 --xrc --connect $A:7401 --private-data $PD_REQ_I
  lactive ibcm-xrc-dreq-passive 30 --xrc --connect $A:7402 --disconnect-from passive
  for r in 1 2; do
    lactive ibcm-rate-$r 120 --connect $A:740$((2 + r)) --count $RATE_N --parallel $RATE_K --hold --quiet $RATE_QPS
    run kernel-cm-load-$r 20 modprobe rdma_ucm
    waitfor a.kernel-cm-$r 30
    waitfor kernel-rate-$r.ready 60 && run kernel-rate-$r 120 cmtime -s $A -c $RATE_N
    mark kernel-rate-$r.done
    run kernel-cm-unload-$r 20 sh -c 'modprobe -r rdma_ucm; modprobe -r rdma_cm iw_cm ib_cm 2>/dev/null; ! grep -q "^ib_cm " /proc/modules'
    waitfor a.unloaded-$r 30
  done
  run counters 10 sh -c '. /lab/lib.sh; counters'
  waitfor a.done 60
fi
lab_exit
