# ibcm-cells.sh -- NOT a scenario: the ibcm <-> kernel CM cell list, sourced by
# ibcm-umad.sh (both sides in VMs: ibcm on umad0 of a nocm VM) and by ibcm-udp.sh /
# ibcm-udp.host (ibcm on the host in the lab netns, RoCEv2 over a UDP socket).
#
#   TP-act-*  ibcm active   -> kernel passive (cmpeer server, rping -s, ucmatose)
#   TP-pas-*  kernel active -> ibcm passive   (cmpeer client -> cm-ping --listen)
#
# The sourcing script sets, before calling kernel_side (the VM with the kernel CM, role a,
# which brackets the cells with in-band markers) or ibcm_side:
#   TP       cell prefix (umad | udp)          KIP, IIP   kernel / ibcm IP address
#   CMPING   the cm-ping command               CM_ARGS    its transport arguments
#   drop_first_req / wait_dropped NAME        drop the first CM REQ arriving at the ibcm side
# check_ibcm.py (ibcm_cells) holds the expectations; the constants below are repeated there.
PD_REQ_I=68656c6c6f2d66726f6d2d6962636d            # "hello-from-ibcm"
PD_REP_K=6b65726e656c2d726570                      # "kernel-rep"
PD_REJ_K=6b65726e656c2d736179732d6e6f              # "kernel-says-no"
PD_REQ_K=68656c6c6f2d66726f6d2d6b65726e656c        # "hello-from-kernel"
PD_REP_I=6962636d2d726570                          # "ibcm-rep"
PD_REJ_I=6962636d2d736179732d6e6f                  # "ibcm-says-no"
PD_PASSIVE_DISC=636d2d70696e673a706173736976652d646973636f6e6e656374  # cm-ping's marker
# full-length private data: 56 bytes after the CMA header in a REQ, 196 in a REP
PD_REQ_FULL=0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f202122232425262728292a2b2c2d2e2f303132333435363738
PD_REP_FULL=0104070a0d101316191c1f2225282b2e3134373a3d404346494c4f5255585b5e6164676a6d707376797c7f8285888b8e9194979a9da0a3a6a9acafb2b5b8bbbec1c4c7cacdd0d3d6d9dcdfe2e5e8ebeef1f4f7fa0205080b0e1114171a1d202326292c2f3235383b3e4144474a4d505356595c5f6265686b6e7174777a7d808386898c8f9295989b9ea1a4a7aaadb0b3b6b9bcbfc2c5c8cbced1d4d7dadde0e3e6e9eceff2f5f8fb0306090c0f1215181b1e2124272a2d303336393c3f4245484b4e5154

# tc_drop_first_req / tc_wait_dropped NAME: drop the first incoming CM REQ (MAD class 0x07 at
# IP offset 49, attribute 0x0010 at 64) at eth0 ingress of a guest (README finding 3)
tc_drop_first_req() {
  modprobe -a sch_ingress cls_u32 act_gact
  /sbin/tc qdisc add dev eth0 ingress
  /sbin/tc filter add dev eth0 parent ffff: protocol ip prio 1 u32 match ip protocol 17 0xff \
     match ip dport 4791 0xffff match u8 0x07 0xff at 49 match u16 0x0010 0xffff at 64 action drop
}
tc_wait_dropped() {
  _i=0; while ! /sbin/tc -s filter show dev eth0 parent ffff: | grep -qE 'dropped [1-9]'; do sleep 0.05; _i=$((_i+1)); [ $_i -ge 300 ] && break; done
  echo "TC-DROPPED $(/sbin/tc -s filter show dev eth0 parent ffff: | grep -oE 'dropped [0-9]+' | head -1)" | tee "$RES/$ROLE.$1.out"
  /sbin/tc qdisc del dev eth0 ingress
}

# ---------------------------------------------------------------------------------------
# the kernel side (a guest with lab.mods=cm)
kpassive() {  # kpassive CELL SECS cmpeer-server-args: kernel listener for an ibcm-active cell
  _c=$1; _t=$2; shift 2
  cell_begin "$_c"
  bg "$_c" "$_t" cmpeer server "$@"
  wait_line "$_c" '^LISTEN' 20
  mark "$_c.ready"; waitfor "$_c.done" "$_t"; bgwait "$_c" 30
  cell_end "$_c"
}
ktool() {     # ktool CELL SECS cmd...: an rdmacm-utils tool as the kernel listener
  _c=$1; _t=$2; shift 2
  cell_begin "$_c"
  bg "$_c" "$_t" "$@"; wait_cm_listen 100
  mark "$_c.ready"; waitfor "$_c.done" "$_t"; sleep 1; bgkill "$_c"; bgwait "$_c" 10
  cell_end "$_c"
}
kactive() {   # kactive CELL SECS cmpeer-client-args: kernel client for an ibcm-passive cell
  _c=$1; _t=$2; shift 2
  cell_begin "$_c"
  waitfor "$_c.ready" 60 && run "$_c" "$_t" cmpeer client --addr "$IIP" "$@"
  mark "$_c.done"; waitfor "$_c.stopped" 30
  cell_end "$_c"
}

kernel_side() {
  say "kernel side of the $TP cells: kernel $KIP, ibcm $IIP"
  # ---- ibcm active -> kernel passive
  kpassive $TP-act-establish 30 --port 7201 --accept-pd $PD_REP_K
  kpassive $TP-act-dreq-kernel 30 --port 7202 --disconnect-after 300
  cell_begin $TP-act-rej-nolistener; mark $TP-act-rej-nolistener.ready
  waitfor $TP-act-rej-nolistener.done 60; cell_end $TP-act-rej-nolistener
  kpassive $TP-act-rej-consumer 30 --port 7204 --reject-pd $PD_REJ_K
  kpassive $TP-act-mra 40 --port 7205 --accept-delay 6500
  cell_begin $TP-act-retrans
  tc_drop_first_req
  bg $TP-act-retrans 40 cmpeer server --port 7206
  wait_line $TP-act-retrans '^LISTEN' 20; mark $TP-act-retrans.ready
  tc_wait_dropped $TP-act-retrans-tc
  waitfor $TP-act-retrans.done 40; bgwait $TP-act-retrans 30
  cell_end $TP-act-retrans
  kpassive $TP-act-pdata 30 --port 7207 --accept-pd $PD_REP_FULL
  # XRC REQ from ibcm to three kinds of kernel listener (README: XRC findings)
  kpassive $TP-act-xrc-rc-listener 12 --port 7208 --ps ib --timeout 4000
  ktool $TP-act-xrc-rping 20 rping -s -a "$KIP" -p 7209 -C 1 -v
  kpassive $TP-act-xrc 30 --port 7210 --qp xrc --accept-pd $PD_REP_K
  ktool $TP-act-rping 30 rping -s -a "$KIP" -p 7211 -C 1 -v
  ktool $TP-act-ucmatose 30 ucmatose -p 7212 -c 1 -C 0
  # ---- kernel active -> ibcm passive
  kactive $TP-pas-establish 30 --port 7301 --pd $PD_REQ_K --disconnect-after 300
  kactive $TP-pas-dreq-ibcm 30 --port 7302 --pd $PD_PASSIVE_DISC
  kactive $TP-pas-rej-nolistener 30 --port 7393 --expect rejected
  kactive $TP-pas-rej-consumer 30 --port 7304 --pd $PD_REQ_K --expect rejected
  kactive $TP-pas-mra 40 --port 7305 --ack-timeout 1 --disconnect-after 300
  kactive $TP-pas-retrans 40 --port 7306 --ack-timeout 1 --disconnect-after 300
  kactive $TP-pas-pdata 30 --port 7307 --pd $PD_REQ_FULL --disconnect-after 300
  kactive $TP-pas-xrc 30 --port 7308 --qp xrc --pd $PD_REQ_K --disconnect-after 300
}

# ---------------------------------------------------------------------------------------
# the ibcm side
iactive() {   # iactive CELL SECS cm-ping-args: cm-ping --connect once the kernel listens
  _c=$1; _t=$2; shift 2
  waitfor "$_c.ready" 120 && run "$_c" "$_t" $CMPING $CM_ARGS "$@"
  mark "$_c.done"
}
ipassive() {  # ipassive CELL SECS cm-ping-listen-args: cm-ping --listen until the kernel is done
  _c=$1; _t=$2; shift 2
  bg "$_c" "$_t" $CMPING --listen "$IIP" $CM_ARGS "$@"
  wait_line "$_c" '^listening on' 20
  [ "${_drop:-}" = 1 ] && { mark "$_c.ready"; wait_dropped "$_c-tc"; } || mark "$_c.ready"
  waitfor "$_c.done" "$_t"; sleep 0.5; bgkill "$_c"; bgwait "$_c" 10
  mark "$_c.stopped"
}

ibcm_side() {
  say "ibcm side of the $TP cells: ibcm $IIP ($CM_ARGS), kernel $KIP"
  run cm-ping-version 5 $CMPING --version
  iactive $TP-act-establish 30 --connect $KIP:7201 --private-data $PD_REQ_I
  iactive $TP-act-dreq-kernel 30 --connect $KIP:7202 --disconnect-from passive
  iactive $TP-act-rej-nolistener 30 --connect $KIP:7203 --private-data $PD_REQ_I
  iactive $TP-act-rej-consumer 30 --connect $KIP:7204 --private-data $PD_REQ_I
  # REQ timeout 2*ms(18) + ms(17) = 2.7 s: ibcm resends the REQ while the kernel delays its
  # accept (6.5 s); the kernel MRAs the duplicate; ibcm must then wait, not resend at 5.4 s
  iactive $TP-act-mra 40 --connect $KIP:7205 --timeout-exp 17
  iactive $TP-act-retrans 40 --connect $KIP:7206 --timeout-exp 17
  iactive $TP-act-pdata 30 --connect $KIP:7207 --private-data $PD_REQ_FULL
  iactive $TP-act-xrc-rc-listener 20 --connect $KIP:7208 --xrc
  iactive $TP-act-xrc-rping 20 --connect $KIP:7209 --xrc
  iactive $TP-act-xrc 30 --connect $KIP:7210 --xrc
  iactive $TP-act-rping 30 --connect $KIP:7211
  iactive $TP-act-ucmatose 30 --connect $KIP:7212 --disconnect-from passive
  ipassive $TP-pas-establish 40 --port 7301 --accept-data $PD_REP_I
  ipassive $TP-pas-dreq-ibcm 40 --port 7302
  ipassive $TP-pas-rej-nolistener 40 --port 7303
  ipassive $TP-pas-rej-consumer 40 --port 7304 --reject 28 --reject-data $PD_REJ_I
  ipassive $TP-pas-mra 50 --port 7305 --accept-delay 6000
  drop_first_req
  _drop=1; ipassive $TP-pas-retrans 50 --port 7306; _drop=0
  ipassive $TP-pas-pdata 40 --port 7307 --accept-data $PD_REP_FULL
  ipassive $TP-pas-xrc 40 --port 7308
}
