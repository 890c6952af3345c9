#!/bin/sh
# ibcm-data.sh -- data on QPs brought up by the other side's CM (cells data-*): ibcm's
# `cm-ping --verbs rxe0` (a real RC QP per connection, umad CM) against the kernel's rdmacm
# tools over rxe, both directions.
# VM a (10.77.0.1) = kernel CM (lab.mods=cm): rping / ucmatose.
# VM b (10.77.0.2) = NO kernel CM (lab.mods=nocm): the host-built cm-ping (feature verbs),
# passed in with LAB_PEER_BIN.
#   data-rping-pas      kernel `rping -c -v -V -C 20` -> cm-ping --listen --verbs (rping server)
#   data-rping-act      cm-ping --connect --verbs --pings 20 -> kernel `rping -s -v -V`
#   data-ucmatose-pas   kernel `ucmatose -C 10 -S 100` client -> cm-ping --listen --data ucmatose
#   data-ucmatose-act   cm-ping --connect --data ucmatose -> kernel `ucmatose` server
#   data-cmtime-pas     kernel `cmtime -s -c 100` (a QP per connection) -> cm-ping --listen
#                       --data none (a QP per connection, brought up and destroyed)
#   data-cmtime-act     cm-ping --connect --data none --count 100 --parallel 100 --hold ->
#                       kernel `cmtime -c 100`
#   capi-ucmatose-act   a C program on libibcm (capi-peer, through ibcmd on umad0) connects by
#                       IP and port (IBCM_CONNECT_RDMA_CM) -> kernel `ucmatose -C 0` server
#   capi-ucmatose-pas   kernel `ucmatose -C 0` client -> capi-peer listening on rdma_cm's
#                       port 7506 through ibcmd
# check_data.py asserts the outputs and prints the `data:` line.
# lab-mods-a: cm
# lab-mods-b: nocm
# lab-timeout: 300
. /lab/lib.sh
pair_up
K=10.77.0.1 I=10.77.0.2 NCMT=100
VERBS="--verbs rxe0"
CM_ARGS="--umad /dev/infiniband/umad0 --gid-index $(gid_index) --local-ip $MYIP"

# kclient CELL SECS cmd...: VM a runs a kernel client once VM b's cm-ping listens
kclient() {
  _c=$1; _t=$2; shift 2
  cell_begin "$_c"
  waitfor "$_c.ready" 60 && run "$_c" "$_t" "$@"
  mark "$_c.done"; waitfor "$_c.stopped" 40
  cell_end "$_c"
}
# kserver CELL SECS cmd...: VM a runs a kernel server until it exits by itself (after the
# client's disconnect)
kserver() {
  _c=$1; _t=$2; shift 2
  cell_begin "$_c"
  bg "$_c" "$_t" "$@"; wait_cm_listen 100; mark "$_c.ready"
  waitfor "$_c.done" "$_t"; bgwait "$_c" 20
  cell_end "$_c"
}
# ilisten CELL SECS args: VM b's cm-ping listener until the kernel client is done
ilisten() {
  _c=$1; _t=$2; shift 2
  bg "$_c" "$_t" cm-ping --listen $I $CM_ARGS $VERBS "$@"
  wait_line "$_c" '^listening on' 20; mark "$_c.ready"
  waitfor "$_c.done" "$_t"; sleep 0.5; bgkill "$_c"; bgwait "$_c" 10
  mark "$_c.stopped"
}
# iconnect CELL SECS args: VM b's cm-ping client once the kernel server listens
iconnect() {
  _c=$1; _t=$2; shift 2
  waitfor "$_c.ready" 60 && run "$_c" "$_t" cm-ping $CM_ARGS $VERBS "$@"
  mark "$_c.done"
}

if [ "$ROLE" = a ]; then
  kclient data-rping-pas 60 rping -c -a $I -p 7501 -C 20 -v -V
  kserver data-rping-act 60 rping -s -a $K -p 7502 -v -V
  kclient data-ucmatose-pas 60 ucmatose -s $I -p 7503 -C 10 -S 100
  kserver data-ucmatose-act 60 ucmatose -p 7504 -C 10 -S 100
  kclient data-cmtime-pas 90 cmtime -s $I -c $NCMT
  # the cmtime server does not exit by itself: stopped once the client is done
  cell_begin data-cmtime-act
  bg data-cmtime-act 90 cmtime -c $NCMT; wait_cm_listen 100; mark data-cmtime-act.ready
  waitfor data-cmtime-act.done 90; sleep 1; bgkill data-cmtime-act; bgwait data-cmtime-act 20
  cell_end data-cmtime-act
  # -C 0: no messages; the server disconnects once connected, the client waits for that
  kserver capi-ucmatose-act 60 ucmatose -p 7505 -C 0 -c 1
  kclient capi-ucmatose-pas 60 ucmatose -s $I -p 7506 -C 0 -c 1
  run counters 10 sh -c '. /lab/lib.sh; counters'
  mark a.done
else
  if [ ! -x /lab/bin/cm-ping ]; then say "SKIP no /lab/bin/cm-ping (pass it with LAB_PEER_BIN)"; exit 1; fi
  run ibv-devices 10 ibv_devices
  ilisten data-rping-pas 60 --port 7501
  iconnect data-rping-act 60 --connect $K:7502 --pings 20
  ilisten data-ucmatose-pas 60 --port 7503 --data ucmatose --size 100 --pings 10
  iconnect data-ucmatose-act 60 --connect $K:7504 --data ucmatose --size 100 --pings 10 --disconnect-from passive
  ilisten data-cmtime-pas 90 --port 7471 --data none
  iconnect data-cmtime-act 90 --connect $K:7471 --data none --count $NCMT --parallel $NCMT --hold
  # libibcm through ibcmd, which takes umad0 now that cm-ping has exited
  SOCK=/tmp/ibcmd.sock
  if [ -x /lab/bin/capi-peer ] && [ -x /lab/bin/ibcmd ]; then
    bg ibcmd 200 ibcmd --addr $I --socket $SOCK --state /tmp/ibcmd.state \
      --umad /dev/infiniband/umad0 --gid-index $(gid_index)
    wait_line ibcmd 'ibcmd serving' 30
  else
    say "FAIL no /lab/bin/capi-peer or /lab/bin/ibcmd (the suite's build step makes them)"
  fi
  waitfor capi-ucmatose-act.ready 60 &&
    run capi-ucmatose-act 60 capi-peer connect $SOCK $K:7505 0x3001
  mark capi-ucmatose-act.done
  bg capi-ucmatose-pas 60 capi-peer listen $SOCK 7506 0x3002
  wait_line capi-ucmatose-pas '^listening on' 20; mark capi-ucmatose-pas.ready
  waitfor capi-ucmatose-pas.done 60; bgwait capi-ucmatose-pas 20
  mark capi-ucmatose-pas.stopped
  if [ -e /tmp/ibcmd.pid ]; then bgkill ibcmd; bgwait ibcmd 10 > /dev/null; fi
  run counters 10 sh -c '. /lab/lib.sh; counters'
  waitfor a.done 60
fi
lab_exit
