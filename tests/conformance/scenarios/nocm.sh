#!/bin/sh
# nocm.sh -- one VM booted with lab.mods=nocm (rdma_rxe + ib_uverbs + ib_umad, no kernel CM):
# the environment a user-space CM (ibcm over umad) runs in.  Also proves that host-built
# binaries (a dynamic C program, a rustc-built program, and anything passed in LAB_PEER_BIN)
# run from /lab/bin in the guest.
# lab-mods-a: nocm
# lab-timeout: 120
. /lab/lib.sh
run modules 10 sh -c 'cut -d" " -f1 /proc/modules | sort | tr "\n" " "; echo'
run kernel-cm 5 sh -c 'if grep -qE "^(ib_cm|rdma_cm|iw_cm|rdma_ucm) " /proc/modules; then echo "KERNEL-CM loaded"; else echo "KERNEL-CM absent"; fi'
run devnodes 5 ls /dev/infiniband
run umad-sysfs 5 sh -c 'for d in /sys/class/infiniband_mad/umad*; do echo "$(basename $d) ibdev=$(cat $d/ibdev) port=$(cat $d/port)"; done'
run gids 5 sh -c 'for i in 0 1 2 3; do g=/sys/class/infiniband/rxe0/ports/1/gids/$i; v=$(cat $g); [ "$v" = 0000:0000:0000:0000:0000:0000:0000:0000 ] || echo "gid $(basename $g) $v $(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/$(basename $g) 2>/dev/null)"; done; . /lab/lib.sh; echo "GID-INDEX-IPV4 $(gid_index)"'
run umadprobe 10 umadprobe /dev/infiniband/umad0 0
run hello-c 5 hello-c
run hello-rs 5 hello-rs
# anything the caller passed with LAB_PEER_BIN (e.g. a host-built cm-ping): show it runs
for f in /lab/bin/*; do
  case $(basename "$f") in cmpeer|umadprobe|hello-c|hello-rs) continue ;; esac
  run "peer-$(basename "$f")" 10 "$f" --help
done
lab_exit
