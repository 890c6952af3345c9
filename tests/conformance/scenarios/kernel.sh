#!/bin/sh
# kernel.sh -- kernel CM <-> kernel CM over rxe, two VMs.  VM a (10.77.0.1) is the passive
# side (listeners), VM b (10.77.0.2) the active side.  Every cell is bracketed by in-band
# markers (UDP to port 9: "LAB-CELL-BEGIN/END name") so tests/conformance/run can cut the wire
# pcap per cell.  Cells are sequenced through /lab/sync markers.
# lab-mods-a: cm
# lab-mods-b: cm
# lab-timeout: 240
. /lab/lib.sh
pair_up
A=10.77.0.1
PD_REQ=68656c6c6f2d66726f6d2d6b65726e656c      # "hello-from-kernel"
PD_REP=6b65726e656c2d726570                    # "kernel-rep"
PD_REJ=6b65726e656c2d736179732d6e6f            # "kernel-says-no"

# server_cell NAME SECS cmpeer-server-args... : role a side of a cmpeer cell
server_cell() {
  _c=$1; _t=$2; shift 2
  cell_begin "$_c"
  bg "$_c" "$_t" cmpeer server "$@"
  wait_line "$_c" '^LISTEN' 20
  mark "$_c.ready"; waitfor "$_c.done" "$_t"; bgwait "$_c" 30
  cell_end "$_c"
}
# client_cell NAME SECS cmpeer-client-args... : role b side
client_cell() {
  _c=$1; _t=$2; shift 2
  waitfor "$_c.ready" 120 && run "$_c" "$_t" cmpeer client "$@"
  mark "$_c.done"
}

if [ "$ROLE" = a ]; then
  say "passive side, gid index $(gid_index)"
  run devinfo 10 sh -c 'ibv_devinfo | grep -E "hca_id|fw_ver|node_guid|state|active_mtu"'
  server_cell establish 30 --port 7001 --accept-pd $PD_REP
  server_cell dreq-passive 30 --port 7002 --disconnect-after 300
  server_cell rej-consumer 30 --port 7003 --reject-pd $PD_REJ
  cell_begin rej-nolistener; mark rej-nolistener.ready; waitfor rej-nolistener.done 60; cell_end rej-nolistener
  server_cell mra 40 --port 7005 --accept-delay 5500
  # retrans: drop the first incoming CM REQ (MAD class 0x07, attribute 0x0010) at eth0
  # ingress with tc u32+gact, remove the filter once it has dropped one packet
  cell_begin retrans
  # (busybox prefers its own applets: call iproute2's tc by path)
  modprobe -a sch_ingress cls_u32 act_gact
  /sbin/tc qdisc add dev eth0 ingress
  /sbin/tc filter add dev eth0 parent ffff: protocol ip prio 1 u32 match ip protocol 17 0xff \
     match ip dport 4791 0xffff match u8 0x07 0xff at 49 match u16 0x0010 0xffff at 64 action drop
  bg retrans 40 cmpeer server --port 7006
  wait_line retrans '^LISTEN' 20; mark retrans.ready
  i=0; while ! /sbin/tc -s filter show dev eth0 parent ffff: | grep -qE 'dropped [1-9]'; do sleep 0.05; i=$((i+1)); [ $i -ge 100 ] && break; done
  echo "TC-DROPPED $(/sbin/tc -s filter show dev eth0 parent ffff: | grep -oE 'dropped [0-9]+' | head -1)" | tee "$RES/a.retrans-tc.out"
  /sbin/tc qdisc del dev eth0 ingress
  waitfor retrans.done 40; bgwait retrans 30
  cell_end retrans
  server_cell noqp 30 --port 7007 --no-qp
  server_cell xrc 30 --port 7008 --qp xrc
  cell_begin rping; bg rping 30 rping -s -a $MYIP -C 3 -v; wait_cm_listen 100; mark rping.ready
  waitfor rping.done 40; bgwait rping 20; cell_end rping
  cell_begin ucmatose; bg ucmatose 30 ucmatose -c 2 -C 2; wait_cm_listen 100; mark ucmatose.ready
  waitfor ucmatose.done 40; bgwait ucmatose 20; cell_end ucmatose
  cell_begin cmtime; bg cmtime 120 cmtime -c 1000; wait_cm_listen 100; mark cmtime.ready
  waitfor cmtime.done 120; sleep 1; bgkill cmtime; bgwait cmtime 20; cell_end cmtime
  run counters 10 sh -c '. /lab/lib.sh; counters'
  mark a.done
else
  say "active side, gid index $(gid_index)"
  client_cell establish 30 --addr $A --port 7001 --pd $PD_REQ --disconnect-after 300
  client_cell dreq-passive 30 --addr $A --port 7002
  client_cell rej-consumer 30 --addr $A --port 7003 --pd $PD_REQ --expect rejected
  client_cell rej-nolistener 30 --addr $A --port 7999 --expect rejected
  client_cell mra 40 --addr $A --port 7005 --ack-timeout 1 --disconnect-after 300
  client_cell retrans 40 --addr $A --port 7006 --ack-timeout 1 --disconnect-after 300
  client_cell noqp 30 --addr $A --port 7007 --disconnect-after 300
  client_cell xrc 30 --addr $A --port 7008 --qp xrc --disconnect-after 300
  waitfor rping.ready 60 && run rping 30 rping -c -a $A -C 3 -v; mark rping.done
  waitfor ucmatose.ready 60 && run ucmatose 30 ucmatose -s $A -c 2 -C 2; mark ucmatose.done
  waitfor cmtime.ready 60 && run cmtime 120 cmtime -s $A -c 1000; mark cmtime.done
  run counters 10 sh -c '. /lab/lib.sh; counters'
  waitfor a.done 60
fi
lab_exit
