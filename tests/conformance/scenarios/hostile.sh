#!/bin/sh
# hostile.sh -- an off-path attacker on the RoCEv2 network (cells hostile-*; issue 12): the
# host part (hostile.host, in the lab netns) runs `cm-bench flood --target` against a
# listener in this VM (10.78.0.2, rxe0): a REQ flood from spoofed sources the host owns
# (10.78.0.101..108), legitimate connects from 10.78.0.1 during it, blind RTUs and spoofed
# teardowns from 10.78.0.109 against connections of 10.78.0.110. The VM boots without the
# kernel CM (lab.mods=nocm):
#   hostile-ibcm    ibcm's `cm-ping --listen --stateless` on umad0 (port 7600); stopped with
#                   TERM while the host still holds its connections, so that its last lines
#                   (--peer-counts, the JSON counters) show its side of them
#   hostile-kernel  then `modprobe rdma_ucm` (cm-ping's umad agent is closed) and the kernel
#                   CM's listener, `cmtime` as server (port 7601, a QP per request); the same
#                   attacks, recorded for reference
# check_hostile.py asserts the figures.
# lab-mods-a: nocm
# lab-timeout: 240
. /lab/lib.sh
I=$MYIP
CM_ARGS="--umad /dev/infiniband/umad0 --gid-index $(gid_index) --local-ip $I"
mark vm.ready
waitfor host.ready 60
# The attacker's addresses (the flood's 8 sources .101-.108, the attack source .109, the
# victims' client .110) are resolved before the cells begin. On RoCE the kernel resolves every
# received MAD's sender MAC before umad (or the kernel CM) sees it, synchronously in the port's
# MAD receive path (recv_handler in drivers/infiniband/core/user_mad.c calls
# ib_init_ah_attr_from_wc, which calls ib_resolve_unicast_gid_dmac in verbs.c: rdma_resolve_ip
# with a 1 s timeout in addr.c). For a sender without a valid neighbour entry that held up
# every MAD of the port, in this lab, for about 1 s for some of the sources (2 of 8 in a run
# traced on 2026-12-02), whatever listens on umad: seconds of silence at the flood's start that
# decided whether the legitimate connects (given up after about 4.5 s) got through. The cells
# measure the listener, not that resolution (docs/protocol.md, section 5.11).
run resolve 40 sh -c '. /lab/lib.sh; ping_each 10.78.0 101 110'

cell_begin hostile-ibcm
bg hostile-ibcm 120 cm-ping --listen $I $CM_ARGS --port 7600 --stateless --stateless-threshold 64 --peer-counts --quiet
wait_line hostile-ibcm '^listening on' 20; mark hostile-ibcm.ready
waitfor hostile-ibcm.flooded 100
bgkill hostile-ibcm; bgwait hostile-ibcm 20
mark hostile-ibcm.stopped
cell_end hostile-ibcm

run modprobe 20 modprobe rdma_ucm
cell_begin hostile-kernel
# the cmtime server never exits by itself: stopped once the attacker is done. -c: its table
# of connections, indexed by request (with its default it segfaulted under the flood)
bg hostile-kernel 120 cmtime -p 7601 -c 20000
wait_cm_listen 100; mark hostile-kernel.ready
waitfor hostile-kernel.flooded 100
run hostile-kernel-res 10 sh -c 'rdma res show cm_id | wc -l; rdma res show qp | wc -l'
bgkill hostile-kernel; bgwait hostile-kernel 20
mark hostile-kernel.stopped
cell_end hostile-kernel
run counters 10 sh -c '. /lab/lib.sh; counters'
mark vm.done
lab_exit
