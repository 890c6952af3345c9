#!/bin/sh
# unresolvable.sh -- a manual run, not part of the suite (tests/conformance/README.md,
# "A source that never answers ARP"). A listener on rxe0 -- ibcm's `cm-ping --listen
# --stateless` on umad, or with LISTENER=kernel the kernel CM's `cmtime` -- is flooded as in
# hostile.sh while one more spoofed source, 10.78.0.120, sends REQs; the host part drops
# 10.78.0.120's ARP answers (not with STALL_ON=0: the control). On RoCE the kernel resolves
# every received MAD's sender before any CM sees it, waiting up to 1 s (docs/protocol.md,
# section 5.11). Host part: unresolvable.host, which takes LISTENER and STALL_ON from lab.sh's
# environment. Run:
#   [LISTENER=kernel] [STALL_ON=0] LAB_PEER_BIN="out/bin/cm-ping out/bin/cm-bench" \
#     tests/conformance/lab.sh run-netns unresolvable
# The figures: results/host.unres.out (the attacker's line) and wire.pcap.
# lab-mods-a: nocm
# lab-timeout: 240
. /lab/lib.sh
I=$MYIP
CM_ARGS="--umad /dev/infiniband/umad0 --gid-index $(gid_index) --local-ip $I"
mark vm.ready
waitfor host.ready 60
KIND=$(cat "$LAB_DIR/sync/listener" 2>/dev/null || echo ibcm)
run resolve 40 sh -c '. /lab/lib.sh; ping_each 10.78.0 101 110'
cell_begin unres
if [ "$KIND" = kernel ]; then
  run modprobe 20 modprobe rdma_ucm
  bg unres 120 cmtime -p 7601 -c 20000
  wait_cm_listen 100
else
  bg unres 120 cm-ping --listen $I $CM_ARGS --port 7600 --stateless --stateless-threshold 64 --peer-counts --quiet
  wait_line unres '^listening on' 20
fi
mark unres.ready
waitfor unres.flooded 100
run neigh 10 ip neigh show
bgkill unres; bgwait unres 20
mark unres.stopped
cell_end unres
mark vm.done
lab_exit
