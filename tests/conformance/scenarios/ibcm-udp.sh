#!/bin/sh
# ibcm-udp.sh -- ibcm against the Linux kernel CM over rxe, RoCEv2-UDP transport (cells udp-*).
# The VM (10.78.0.2, lab.mods=cm) is the kernel side; ibcm's cm-ping runs on the host inside
# the lab netns (10.78.0.1, UDP 4791), started by ibcm-udp.host.  Same cells as ibcm-umad.sh
# (ibcm-cells.sh).
# lab-mods-a: cm
# lab-timeout: 300
. /lab/lib.sh
. /lab/scenarios/ibcm-cells.sh
TP=udp KIP=${MYIP} IIP=$LAB_peer
mark vm.ready
waitfor host.ready 30
kernel_side
run counters 10 sh -c '. /lab/lib.sh; counters'
mark vm.done
lab_exit
