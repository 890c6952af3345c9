#!/bin/sh
# ibcm-umad.sh -- TEMPLATE for the pending ibcm cells (not run by tests/conformance/run yet):
# VM a = kernel CM (lab.mods=cm, cmpeer as passive/active peer), VM b = NO kernel CM
# (lab.mods=nocm) running the host-built ibcm `cm-ping` over umad0.  Start it with
#   LAB_PEER_BIN=/path/to/target/debug/cm-ping tests/conformance/lab.sh run-pair ibcm-umad
# cm-ping is then /lab/bin/cm-ping in both guests.  Without it the scenario reports SKIP.
# lab-mods-a: cm
# lab-mods-b: nocm
# lab-timeout: 180
. /lab/lib.sh
A=10.77.0.1
if [ ! -x /lab/bin/cm-ping ]; then say "SKIP no /lab/bin/cm-ping (pass it with LAB_PEER_BIN)"; exit 0; fi
if [ "$ROLE" = a ]; then
  # ibcm active -> kernel passive: establish, then DREQ from ibcm
  cell_begin ibcm-active-establish
  bg ibcm-active-establish 40 cmpeer server --port 7201 --accept-pd 6b65726e656c2d726570
  wait_line ibcm-active-establish '^LISTEN' 20; mark ibcm-active-establish.ready
  waitfor ibcm-active-establish.done 60; bgwait ibcm-active-establish 30
  cell_end ibcm-active-establish
  # kernel active -> ibcm passive
  cell_begin ibcm-passive-establish
  waitfor ibcm-passive.ready 60 && run ibcm-passive-establish 40 cmpeer client --addr 10.77.0.2 --port 7202 --pd 68656c6c6f --disconnect-after 300
  mark ibcm-passive.done
  cell_end ibcm-passive-establish
  mark a.done
else
  waitfor ibcm-active-establish.ready 60 && \
    run ibcm-active-establish 40 cm-ping --connect $A:7201 --umad /dev/infiniband/umad0 --count 1 --private-data 68656c6c6f --disconnect-from active
  mark ibcm-active-establish.done
  bg ibcm-passive 60 cm-ping --listen 10.77.0.2 --port 7202 --umad /dev/infiniband/umad0
  sleep 1; mark ibcm-passive.ready
  waitfor ibcm-passive.done 60; bgkill ibcm-passive; bgwait ibcm-passive 10
  waitfor a.done 60
fi
exit 0
