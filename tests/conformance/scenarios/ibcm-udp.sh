#!/bin/sh
# ibcm-udp.sh -- ibcm against the Linux kernel CM over rxe, RoCEv2-UDP transport (cells udp-*).
# The VM (10.78.0.2, lab.mods=cm) is the kernel side; ibcm's cm-ping runs on the host inside
# the lab netns (10.78.0.1, UDP 4791), started by ibcm-udp.host.  Same cells as ibcm-umad.sh
# (ibcm-cells.sh), and udp-act-ipv6 / udp-pas-ipv6: the same transport over IPv6 (the VM's
# fd00:78::2, the host's fd00:78::1), CMA header version 6.
# lab-mods-a: cm
# lab-timeout: 300
. /lab/lib.sh
. /lab/scenarios/ibcm-cells.sh
TP=udp KIP=${MYIP} IIP=$LAB_peer
mark vm.ready
waitfor host.ready 30
kernel_side
# ---- IPv6: RoCEv2 over IPv6 between rxe0's fd00:78::2 GID and ibcm's UDP socket
KIP6=${LAB_ip6%/*} IIP6=$LAB_peer6
kpassive udp-act-ipv6 30 --port 7213 --bind "$KIP6" --accept-pd $PD_REP_K
cell_begin udp-pas-ipv6
waitfor udp-pas-ipv6.ready 60 && run udp-pas-ipv6 30 cmpeer client --addr "$IIP6" --port 7309 --pd $PD_REQ_K --disconnect-after 300
mark udp-pas-ipv6.done; waitfor udp-pas-ipv6.stopped 30; cell_end udp-pas-ipv6
run counters 10 sh -c '. /lab/lib.sh; counters'
mark vm.done
lab_exit
