#!/bin/sh
# netns.sh -- one VM (lab.mods=cm) on a tap inside the lab's network namespace; the host part
# (scenarios/netns.host -> host/roce_probe.py) runs in the same netns with 10.78.0.1 /
# fd00:78::1 and speaks raw RoCEv2 over UDP 4791 to this VM's rxe (10.78.0.2 / fd00:78::2).
# lab-mods-a: cm
# lab-timeout: 150
. /lab/lib.sh
H=$LAB_peer
run addrs 5 sh -c '/bin/ip -br addr show dev eth0'
run gids 5 sh -c 'for i in 0 1 2 3 4; do echo "gid $i $(cat /sys/class/infiniband/rxe0/ports/1/gids/$i) $(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$i 2>/dev/null)"; done'
run ping4 10 ping -c 2 -W 2 $H
run ping6 10 ping -6 -c 2 -W 2 $LAB_peer6
mark vm.ready
waitfor host.probes.done 60
cell_begin host-passive
# kernel CM active -> the host program (passive): it answers REJ 28 + private data
run host-passive 30 cmpeer client --addr $H --port 7100 --pd 66726f6d2d766d --expect rejected --timeout 10000
cell_end host-passive
run counters 10 sh -c '. /lab/lib.sh; counters'
mark vm.done
lab_exit
