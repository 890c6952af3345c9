#!/bin/sh
# unresolvable-kernel.sh -- a manual run, not part of the suite (tests/conformance/README.md,
# "A source that never answers ARP"). The kernel CM's listener (`cmtime`) on rxe0 (umad) is
# flooded as in hostile.sh while one more spoofed source, 10.78.0.120, sends REQs; the host
# part drops 10.78.0.120's ARP answers. On RoCE the kernel resolves every received MAD's
# sender before any CM sees it, waiting up to 1 s in the port's MAD receive path
# (docs/protocol.md, section 5.11). Host part: unresolvable-kernel.host; with STALL_ON=0 in lab.sh's
# environment the host answers 10.78.0.120's ARP (the control). Run:
#   LAB_PEER_BIN="out/bin/cm-ping out/bin/cm-bench" tests/conformance/lab.sh run-netns unresolvable-kernel
# The figures: results/host.unres-kernel.out (the attacker's line) and wire.pcap.
# lab-mods-a: nocm
# lab-timeout: 240
. /lab/lib.sh
I=$MYIP
CM_ARGS="--umad /dev/infiniband/umad0 --gid-index $(gid_index) --local-ip $I"
mark vm.ready
waitfor host.ready 60
run resolve 40 sh -c 'for i in $(seq 101 110); do ping -c 1 -W 2 10.78.0.$i | grep -c "bytes from"; done; ip neigh show'
cell_begin unres-kernel
run modprobe 20 modprobe rdma_ucm
bg unres-kernel 120 cmtime -p 7601 -c 20000
wait_cm_listen 100; mark unres-kernel.ready
waitfor unres-kernel.flooded 100
run neigh 10 ip neigh show
bgkill unres-kernel; bgwait unres-kernel 20
mark unres-kernel.stopped
cell_end unres-kernel
mark vm.done
lab_exit
