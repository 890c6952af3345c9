#!/bin/sh
# kernel-paths.sh -- the protocol paths the kernel CM can play against ibcm (cells kp-*):
# lost REP / RTU / DREQ / DREP and the retransmissions that repair them, retries that run
# out (the REQ's and the kernel's REP's), the kernel's TimeWait answering a duplicate DREQ,
# stale connections (detected by either side) and QPN reuse, REJ of a REP, MRAs for a REP and
# for a duplicate REQ, REJ 4 with ARI, IPv6 (CMA header v6 over a v6 GID), SIDR with udaddy,
# and 1000 connections with cmtime, in both directions.
# VM a (10.77.0.1, fd00:77::1) = kernel CM (lab.mods=cm): cmpeer, udaddy, cmtime.
# VM b (10.77.0.2, fd00:77::2) = no kernel CM (lab.mods=nocm): ibcm's cm-ping on umad0.
#   kp-act-*  ibcm active  -> kernel passive        kp-pas-*  kernel active -> ibcm passive
# A message is "lost" by a tc u32 filter at the receiving VM's eth0 ingress (MAD class at IP
# offset 49, attribute ID at 64, as ibcm-cells.sh does for the first REQ); the wire capture
# (VM a's NIC, before the guest) still shows it.  check_paths.py holds the expectations.
# lab-mods-a: cm
# lab-mods-b: nocm
# lab-timeout: 600
. /lab/lib.sh
pair_up
. /lab/scenarios/ibcm-cells.sh
KIP=10.77.0.1 IIP=10.77.0.2 KIP6=fd00:77::1 IIP6=fd00:77::2
PD_REJ_REP_I=6962636d2d72656a656374732d726570     # "ibcm-rejects-rep"
PD_REJ_REP_K=6b65726e656c2d72656a656374732d726570 # "kernel-rejects-rep"
CMPING=cm-ping

# IPv6 on eth0: rxe adds the GID (RoCE v2) for it
[ "$ROLE" = a ] && MY6=$KIP6 || MY6=$IIP6
/bin/ip -6 addr add "$MY6/64" dev eth0 nodad
gid_index6() {   # index of rxe0's GID for $MY6 (waits for rxe to add it)
  _w=$(echo "$MY6" | sed 's/::/:0000:0000:0000:0000:0000:/; s/fd00:77/fd00:0077/; s/:1$/:0001/; s/:2$/:0002/')
  _i=0
  while [ $_i -lt 100 ]; do
    for _f in /sys/class/infiniband/rxe0/ports/1/gids/*; do
      [ "$(cat "$_f" 2>/dev/null)" = "$_w" ] && { basename "$_f"; return; }
    done
    sleep 0.1; _i=$((_i+1))
  done
  echo none
}
GID6=$(gid_index6)
say "IPv6 $MY6: GID index $GID6"
CM_ARGS="--umad /dev/infiniband/umad0 --gid-index $(gid_index) --local-ip $IIP"
CM_ARGS6="--umad /dev/infiniband/umad0 --gid-index $GID6 --local-ip $IIP6"

# tc_lose ATTR N NAME: drop the CM MADs of attribute ATTR (0x0010 REQ, 0x0013 REP, 0x0014 RTU,
# 0x0015 DREQ, 0x0016 DREP) arriving at this VM until N are dropped (N=0: until tc_lose_end);
# a background poller then removes the filter and writes "TC-DROPPED attr=ATTR dropped K" to
# RES/ROLE.NAME.out.  tc_lose_end NAME: stop (if still dropping) and wait for that line.
tc_lose() {
  modprobe -a sch_ingress cls_u32 act_gact
  /sbin/tc qdisc add dev eth0 ingress
  /sbin/tc filter add dev eth0 parent ffff: protocol ip prio 1 u32 match ip protocol 17 0xff \
     match ip dport 4791 0xffff match u8 0x07 0xff at 49 match u16 "$1" 0xffff at 64 action drop
  rm -f "/tmp/$3.stop" "$RES/$ROLE.$3.out"
  ( _k=0; _j=0
    while [ $_j -lt 3000 ] && [ ! -e "/tmp/$3.stop" ]; do
      _k=$(/sbin/tc -s filter show dev eth0 parent ffff: | grep -oE 'dropped [0-9]+' | head -1 | cut -d' ' -f2)
      [ "$2" != 0 ] && [ "${_k:-0}" -ge "$2" ] && break
      sleep 0.05; _j=$((_j+1))
    done
    _k=$(/sbin/tc -s filter show dev eth0 parent ffff: | grep -oE 'dropped [0-9]+' | head -1 | cut -d' ' -f2)
    /sbin/tc qdisc del dev eth0 ingress
    echo "TC-DROPPED attr=$1 dropped ${_k:-0}" > "$RES/$ROLE.$3.out" ) &
}
tc_lose_end() {
  touch "/tmp/$1.stop"
  _i=0; while [ ! -s "$RES/$ROLE.$1.out" ] && [ $_i -lt 100 ]; do sleep 0.1; _i=$((_i+1)); done
  cat "$RES/$ROLE.$1.out"
}

# kernel-side helpers that lose a message at the kernel's ingress
klose_passive() {   # klose_passive CELL SECS ATTR N cmpeer-server-args
  _c=$1; _t=$2; _a=$3; _n=$4; shift 4
  cell_begin "$_c"
  tc_lose "$_a" "$_n" "$_c-tc"
  bg "$_c" "$_t" cmpeer server "$@"
  wait_line "$_c" '^LISTEN' 20
  mark "$_c.ready"; waitfor "$_c.done" "$_t"; bgwait "$_c" 30
  tc_lose_end "$_c-tc"
  cell_end "$_c"
}
klose_active() {    # klose_active CELL SECS ATTR N cmpeer-client-args
  _c=$1; _t=$2; _a=$3; _n=$4; shift 4
  cell_begin "$_c"
  waitfor "$_c.ready" 60 && { tc_lose "$_a" "$_n" "$_c-tc"; run "$_c" "$_t" cmpeer client --addr "$IIP" "$@"; }
  tc_lose_end "$_c-tc"
  mark "$_c.done"; waitfor "$_c.stopped" 30
  cell_end "$_c"
}
# ibcm-side helpers that lose a message at ibcm's ingress
ilose_active() {    # ilose_active CELL SECS ATTR N cm-ping-args
  _c=$1; _t=$2; _a=$3; _n=$4; shift 4
  waitfor "$_c.ready" 120 && { tc_lose "$_a" "$_n" "$_c-tc"; run "$_c" "$_t" $CMPING $CM_ARGS "$@"; }
  tc_lose_end "$_c-tc"
  mark "$_c.done"
}
ilose_passive() {   # ilose_passive CELL SECS ATTR N cm-ping-listen-args
  _c=$1; _t=$2; _a=$3; _n=$4; shift 4
  tc_lose "$_a" "$_n" "$_c-tc"
  bg "$_c" "$_t" $CMPING --listen "$IIP" $CM_ARGS "$@"
  wait_line "$_c" '^listening on' 20
  mark "$_c.ready"; waitfor "$_c.done" "$_t"; sleep 0.5; bgkill "$_c"; bgwait "$_c" 10
  tc_lose_end "$_c-tc"
  mark "$_c.stopped"
}

if [ "$ROLE" = a ]; then
  say "kernel side of the kp cells: kernel $KIP/$KIP6, ibcm $IIP/$IIP6"
  # ---- ibcm active -> kernel passive
  kpassive kp-act-rep-lost 30 --port 7501
  klose_passive kp-act-rtu-lost 40 0x0014 1 --port 7502 --disconnect-after 2000
  kpassive kp-act-drep-lost 40 --port 7503
  kpassive kp-act-dreq-lost 40 --port 7504 --disconnect-after 300
  klose_passive kp-act-req-retries-out 40 0x0010 0 --port 7505 --timeout 12000
  kpassive kp-act-rej-rep 30 --port 7506 --expect rejected
  kpassive kp-act-mra-rep 40 --port 7507
  kpassive kp-act-ipv6 30 --port 7508 --bind $KIP6 --accept-pd $PD_REP_K
  # udaddy's port is fixed: 7174 (its -p is the port space)
  ktool kp-act-sidr 30 udaddy -C 0
  # the cmtime server never exits by itself (kernel.sh stops it too)
  ktool kp-act-cmtime-1000 150 cmtime -p 7510 -c 1000
  # the kernel's REP retries run out (every REP lost at ibcm's ingress): UNREACHABLE, no REJ
  kpassive kp-act-rep-retries-out 40 --port 7511 --expect unreachable
  # the kernel's cm_id stays in TimeWait (the id is held until TIMEWAIT_EXIT) and answers
  # ibcm's duplicate DREQ; the port's duplicate-DREQ counter is read on both sides of TimeWait
  kpassive kp-act-drep-lost-timewait 40 --port 7512 --hold-timewait
  # ibcm announces its established connection's QPN again: the kernel detects the stale one
  kpassive kp-act-stale 30 --port 7513
  # ---- kernel active -> ibcm passive
  klose_active kp-pas-rep-lost 40 0x0013 1 --port 7521 --disconnect-after 300
  klose_active kp-pas-rep-lost-dup-req 40 0x0013 2 --port 7522 --disconnect-after 300
  kactive kp-pas-rtu-lost 40 --port 7523 --disconnect-after 7000
  klose_active kp-pas-drep-lost 40 0x0016 1 --port 7524 --ack-timeout 1 --disconnect-after 300
  klose_active kp-pas-dreq-lost 40 0x0015 1 --port 7525 --pd $PD_PASSIVE_DISC
  kactive kp-pas-gaveup-ari 30 --port 7526 --timeout 2500 --expect gaveup
  kactive kp-pas-stale 30 --port 7527 --stale
  kactive kp-pas-qpn-reuse-timewait 30 --port 7528 --no-qp --same-qpn --count 2 --disconnect-after 300
  kactive kp-pas-rej-rep 30 --port 7529 --no-qp --reject-rep $PD_REJ_REP_K --expect rejected
  kactive kp-pas-mra-rep 40 --port 7530 --no-qp --establish-delay 7000 --disconnect-after 300
  kactive kp-pas-mra-dup-req 40 --port 7531 --ack-timeout 1 --disconnect-after 300
  cell_begin kp-pas-ipv6
  waitfor kp-pas-ipv6.ready 60 && run kp-pas-ipv6 30 cmpeer client --addr $IIP6 --port 7532 --pd $PD_REQ_K --disconnect-after 300
  mark kp-pas-ipv6.done; waitfor kp-pas-ipv6.stopped 30; cell_end kp-pas-ipv6
  cell_begin kp-pas-sidr
  waitfor kp-pas-sidr.ready 60 && run kp-pas-sidr 30 udaddy -s $IIP -C 0
  mark kp-pas-sidr.done; waitfor kp-pas-sidr.stopped 30; cell_end kp-pas-sidr
  cell_begin kp-pas-cmtime-1000
  waitfor kp-pas-cmtime-1000.ready 60 && run kp-pas-cmtime-1000 150 cmtime -s $IIP -p 7534 -c 1000
  mark kp-pas-cmtime-1000.done; waitfor kp-pas-cmtime-1000.stopped 30; cell_end kp-pas-cmtime-1000
  # the kernel's REQ retries run out (16 REQs, 4.1 s apart): nothing on VM b answers class 0x07
  # once cm-ping is gone (ib_mad drops MADs no agent registered for)
  cell_begin kp-pas-unreachable
  waitfor kp-pas-unreachable.ready 60 && run kp-pas-unreachable 100 cmpeer client --addr $IIP --port 7535 --ack-timeout 1 --expect unreachable --timeout 90000
  mark kp-pas-unreachable.done; cell_end kp-pas-unreachable
  # ---- kernel <-> kernel references (VM b loads the kernel CM once cm-ping is done)
  waitfor b.kernel-cm 60
  server_ref() { _c=$1; shift; cell_begin "$_c"; bg "$_c" 30 cmpeer server "$@"; wait_line "$_c" '^LISTEN' 20
    mark "$_c.ready"; waitfor "$_c.done" 40; bgwait "$_c" 30; cell_end "$_c"; }
  server_ref kp-kernel-stale --port 7541
  server_ref kp-kernel-qpn-reuse-timewait --port 7542 --count 2
  run counters 10 sh -c '. /lab/lib.sh; counters'
  mark a.done
else
  if [ ! -x /lab/bin/cm-ping ]; then say "SKIP no /lab/bin/cm-ping (pass it with LAB_PEER_BIN)"; exit 1; fi
  say "ibcm side of the kp cells: $CM_ARGS; IPv6: $CM_ARGS6"
  # ---- ibcm active -> kernel passive
  # --timeout-exp 18: ibcm's REQ timeout 2*ms(18) + ms(18) = 3.2 s; the kernel's REP (and
  # passive DREQ) timeout = ms(18) = 1 s, so the kernel's retransmission comes first
  ilose_active kp-act-rep-lost 30 0x0013 1 --connect $KIP:7501 --timeout-exp 18
  iactive kp-act-rtu-lost 40 --connect $KIP:7502 --timeout-exp 18 --disconnect-from passive
  # --timeout-exp 17: ibcm's DREQ timeout (its REQ's) 2*ms(18) + ms(17) = 2.7 s
  ilose_active kp-act-drep-lost 40 0x0016 1 --connect $KIP:7503 --timeout-exp 17
  ilose_active kp-act-dreq-lost 40 0x0015 1 --connect $KIP:7504 --timeout-exp 18 --disconnect-from passive
  iactive kp-act-req-retries-out 40 --connect $KIP:7505 --timeout-exp 16 --retries 2
  iactive kp-act-rej-rep 30 --connect $KIP:7506 --reject-rep 28 --reject-data $PD_REJ_REP_I
  iactive kp-act-mra-rep 40 --connect $KIP:7507 --timeout-exp 18 --rtu-delay 3000
  waitfor kp-act-ipv6.ready 120 && run kp-act-ipv6 30 $CMPING $CM_ARGS6 --connect "[$KIP6]:7508" --private-data $PD_REQ_I
  mark kp-act-ipv6.done
  iactive kp-act-sidr 30 --sidr --connect $KIP:7174
  iactive kp-act-cmtime-1000 150 --connect $KIP:7510 --count 1000 --parallel 1000 --hold -q
  # Max CM Retries 2, Local CM Response Timeout 17: the kernel sends its REP every ms(17) =
  # 0.54 s, 3 times, then gives up; Remote CM Response Timeout 22: ibcm's REQ timer
  # 2*ms(18) + ms(22) = 19 s is later than cm-ping's 10 s connect bound (ConnectParams::
  # connect_timeout), so ibcm sends one REQ and ends with REJ 4 (timeout)
  ilose_active kp-act-rep-retries-out 40 0x0013 0 --connect $KIP:7511 --timeout-exp 22 --local-timeout-exp 17 --retries 2
  # Local ACK Timeout 21: the kernel stays ms(21) = 8.6 s in TimeWait; ibcm's DREQ timer (its
  # REQ's) is 2*ms(18) + ms(17) = 2.7 s; the kernel's first DREP is lost at ibcm's ingress
  ilose_active kp-act-drep-lost-timewait 40 0x0016 1 --connect $KIP:7512 --timeout-exp 17 --local-ack-timeout 21
  # --same-qpn (test only): connection 1 announces connection 0's QPN while 0 is held.
  # --stay: cm-ping never disconnects connection 0 itself, so the kernel's DREQ is the only
  # one (with --hold cm-ping disconnected it right after the REJ: its DREQ and the kernel's
  # crossed in one CI run, a legal exchange the cell did not expect)
  iactive kp-act-stale 30 --connect $KIP:7513 --same-qpn --count 2 --stay
  # ---- kernel active -> ibcm passive
  ipassive kp-pas-rep-lost 40 --port 7521
  ipassive kp-pas-rep-lost-dup-req 40 --port 7522
  ilose_passive kp-pas-rtu-lost 40 0x0014 1 --port 7523
  ipassive kp-pas-drep-lost 40 --port 7524 --timewait-slack 10000
  ipassive kp-pas-dreq-lost 40 --port 7525
  ipassive kp-pas-gaveup-ari 40 --port 7526 --accept-delay 6000
  ipassive kp-pas-stale 40 --port 7527
  ipassive kp-pas-qpn-reuse-timewait 40 --port 7528
  ipassive kp-pas-rej-rep 40 --port 7529
  ipassive kp-pas-mra-rep 40 --port 7530
  ipassive kp-pas-mra-dup-req 50 --port 7531 --accept-delay 6000 --mra-on-duplicate
  bg kp-pas-ipv6 40 $CMPING --listen $IIP6 $CM_ARGS6 --port 7532 --accept-data $PD_REP_I
  wait_line kp-pas-ipv6 '^listening on' 20; mark kp-pas-ipv6.ready
  waitfor kp-pas-ipv6.done 40; sleep 0.5; bgkill kp-pas-ipv6; bgwait kp-pas-ipv6 10; mark kp-pas-ipv6.stopped
  ipassive kp-pas-sidr 40 --port 7174 --sidr-qpn 0x5a1d40
  ipassive kp-pas-cmtime-1000 150 --port 7534 -q
  mark kp-pas-unreachable.ready
  waitfor kp-pas-unreachable.done 110
  # ---- kernel <-> kernel references: what the kernel does where ibcm was the passive side
  # above (kp-pas-stale, kp-pas-qpn-reuse-timewait); as in ibcm-pair.sh, loading the kernel CM
  # in this VM takes umad's CM class, so it comes after the last cm-ping
  run kernel-cm-load 30 modprobe rdma_ucm
  mark b.kernel-cm
  client_ref() { _c=$1; shift; waitfor "$_c.ready" 60 && run "$_c" 30 cmpeer client --addr $KIP "$@"; mark "$_c.done"; }
  client_ref kp-kernel-stale --port 7541 --stale
  client_ref kp-kernel-qpn-reuse-timewait --port 7542 --no-qp --same-qpn --count 2 --disconnect-after 300
  run counters 10 sh -c '. /lab/lib.sh; counters'
  waitfor a.done 60
fi
lab_exit
