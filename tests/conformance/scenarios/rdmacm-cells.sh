# rdmacm-cells.sh -- NOT a scenario: rdma-core's own rdmacm-utils programs (the guest's
# unmodified Debian binaries) on ibcm's librdmacm drop-in (cm/rdmacm), sourced by
# rdmacm-kernel.sh (VM a: the kernel CM; VM b: the drop-in over ibcmd, no kernel CM) and
# rdmacm-ibcm.sh (both VMs: the drop-in). check_rdmacm.py holds the expectations.
#
# A role "on the drop-in" runs ibcmd on umad0 and every program with
#   LD_LIBRARY_PATH=/tmp/rdmacm  (librdmacm.so.1 = the drop-in)  IBCM_SOCKET=/tmp/ibcmd.sock
# Its VM has no rdma_ucm module (lab.mods=nocm), so rdma-core's own librdmacm could not run
# there at all: a program that works on it works through the drop-in.
#
# The sourcing script sets DROPIN_A / DROPIN_B (1: that role runs the drop-in) and calls
# rdmacm_cells SUFFIX SRV CLI for each direction (SRV/CLI: the roles of server and client).
SOCK=/tmp/ibcmd.sock
UDADDY_PORT=7174   # udaddy has no port option

on_dropin() { if [ "$ROLE" = a ]; then [ "${DROPIN_A:-0}" = 1 ]; else [ "${DROPIN_B:-0}" = 1 ]; fi; }

# the role's program environment
penv() {
  if on_dropin; then
    echo "env LD_LIBRARY_PATH=/tmp/rdmacm IBCM_SOCKET=$SOCK IBCM_RDMACM_TRACE=1"
  else
    echo "env"
  fi
}

dropin_up() {
  on_dropin || return 0
  mkdir -p /tmp/rdmacm
  cp /lab/bin/librdmacm-ibcm.so.1 /tmp/rdmacm/librdmacm.so.1
  bg ibcmd 900 ibcmd --addr "$MYIP" --socket $SOCK --state /tmp/ibcmd.state \
    --umad /dev/infiniband/umad0 --gid-index "$(gid_index)"
  wait_line ibcmd 'ibcmd serving' 30
  # which librdmacm the programs load (glibc's loader lists it)
  run loader 10 env LD_LIBRARY_PATH=/tmp/rdmacm LD_TRACE_LOADED_OBJECTS=1 /usr/bin/rping
}

dropin_down() {
  on_dropin || return 0
  bgkill ibcmd; bgwait ibcmd 10 > /dev/null
}

# srv_ready JOB: the server JOB listens (kernel: an rdma_cm id in LISTEN; drop-in: its trace)
srv_ready() {
  if on_dropin; then wait_line "$1" 'listens on service ID' 30; else wait_cm_listen 300; fi
}

# pair CELL SRV SECS PERSISTS "server command" "client command": one program, server on role
# SRV, client on the other. PERSISTS=1: the server never exits by itself (stopped once the
# client is done).
pair() {
  _c=$1; _s=$2; _t=$3; _p=$4; _sc=$5; _cc=$6
  [ "$ROLE" = a ] && cell_begin "$_c"
  if [ "$ROLE" = "$_s" ]; then
    bg "$_c.srv" "$_t" $(penv) $_sc
    srv_ready "$_c.srv"; mark "$_c.ready"
    waitfor "$_c.done" "$_t"
    if [ "$_p" = 1 ]; then sleep 1; bgkill "$_c.srv"; fi
    bgwait "$_c.srv" 30
    mark "$_c.stopped"
  else
    waitfor "$_c.ready" 90 && run "$_c.cli" "$_t" $(penv) $_cc
    mark "$_c.done"; waitfor "$_c.stopped" 60
  fi
  [ "$ROLE" = a ] && cell_end "$_c"
}

# the programs, server on role S (address SIP), client on role C: cells PROGRAM-SUFFIX
rdmacm_cells() {
  _x=$1; _s=$2; SIP=$3
  pair "rping-$_x" "$_s" 60 0 "rping -s -a $SIP -p 7601 -v -V -C 10" \
    "rping -c -a $SIP -p 7601 -v -V -C 10"
  pair "ucmatose-$_x" "$_s" 60 0 "ucmatose -p 7602 -c 4 -C 10 -S 100" \
    "ucmatose -s $SIP -p 7602 -c 4 -C 10 -S 100"
  pair "udaddy-$_x" "$_s" 60 0 "udaddy -c 2 -C 10 -S 100" \
    "udaddy -s $SIP -c 2 -C 10 -S 100"
  pair "cmtime-$_x" "$_s" 90 1 "cmtime -p 7603" "cmtime -s $SIP -p 7603 -c 50"
  pair "rdma_server-$_x" "$_s" 60 0 "rdma_server -p 7604" "rdma_client -s $SIP -p 7604"
  # variants: rping -q (the application creates and moves its QP itself, with
  # rdma_init_qp_attr), ucmatose -m (each id moved to a new channel, rdma_migrate_id)
  pair "rping_q-$_x" "$_s" 60 0 "rping -s -q -a $SIP -p 7606 -v -V -C 10" \
    "rping -c -q -a $SIP -p 7606 -v -V -C 10"
  pair "ucmatose_m-$_x" "$_s" 60 0 "ucmatose -m -p 7607 -c 2 -C 10 -S 100" \
    "ucmatose -m -s $SIP -p 7607 -c 2 -C 10 -S 100"
}

# mckey on the drop-in: multicast is not supported, so it must fail at once and cleanly
mckey_cell() {
  [ "$ROLE" = a ] && cell_begin "mckey-$1"
  on_dropin && run "mckey-$1" 30 $(penv) mckey -m 239.1.1.1 -b "$MYIP" -C 1
  [ "$ROLE" = a ] && cell_end "mckey-$1"
}

# a drop-in process SIGKILLed under an established connection (it never calls
# rdma_disconnect or rdma_destroy_id): its ibcmd session ends, ibcmd ends the connection,
# and the kernel's rping server hears DISCONNECTED and exits by itself. The server runs on
# role S (address SIP, the kernel's side), the killed client on the drop-in role.
exit_cell() {
  _s=$1; SIP=$2
  [ "$ROLE" = a ] && cell_begin rdmacm-exit
  if [ "$ROLE" = "$_s" ]; then
    bg exit.srv 90 $(penv) rping -s -a "$SIP" -p 7605 -v
    srv_ready exit.srv; mark exit.ready
    waitfor exit.killed 90
    _k=$(up)
    bgwait exit.srv 30
    echo "EXIT-NOTICED after $(echo "$(up) $_k" | awk '{printf "%.2f", $1-$2}') s" > "$RES/$ROLE.exit.notice.out"
    mark exit.stopped
  else
    waitfor exit.ready 90
    bg exit.cli 90 $(penv) rping -c -a "$SIP" -p 7605 -v
    wait_line exit.cli 'ping data: rdma-ping-20:' 60
    kill -9 $(pidof rping)
    mark exit.killed
    bgwait exit.cli 10
    waitfor exit.stopped 60
  fi
  [ "$ROLE" = a ] && cell_end rdmacm-exit
}
