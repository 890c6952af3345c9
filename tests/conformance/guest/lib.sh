# lib.sh -- sourced by the guest scenario scripts (busybox sh); lives on the 9p share (/lab).
# It first sources /lab/env.sh: the host variables named in LAB_GUEST_ENV (see lab.sh).
#
#   run NAME SECS cmd...    run with a time limit; output -> console and /lab/results/ROLE.NAME.out;
#                           prints "=== END NAME rc=N secs=S"
#   bg NAME SECS cmd...     same, in the background;  bgwait NAME [SECS];  bgkill NAME
#   mark NAME / waitfor NAME [SECS]   cross-VM barrier through /lab/sync (the 9p share)
#   pair_up                 run-pair scenarios, first: wait until the other VM runs its script
#   cell_begin NAME / cell_end NAME   in-band cell markers: a UDP datagram "LAB-CELL-BEGIN NAME"
#                           to the peer's port 9, so the wire pcap can be cut per cell
#   gid_index               index of rxe0's RoCEv2 IPv4-mapped GID (1 in this lab)
#   wait_cm_listen [N]      until an rdma_cm id is in LISTEN (rdma res show cm_id)
#   ping_each PFX FIRST LAST  one ping to each of PFX.FIRST .. PFX.LAST (so that their neighbour
#                           entries are valid): a line per address, 1 if it answered, else 0;
#                           then the neighbour table (check_hostile.py reads the first lines)
#   lab_exit                the scenario's last command: exit 1 if a waitfor / wait_line /
#                           wait_cm_listen of this role timed out (a step never happened, so
#                           the run is broken whatever the cells say), else exit 0
# Every such timeout is also appended to /lab/results/ROLE.sync-timeouts.
# A host part of a run-netns scenario may source it too, with LAB_DIR=$LAB_SHARE and ROLE=host
# (bash; only run/bg/bgwait/bgkill/mark/waitfor/wait_line make sense there).
LAB_DIR=${LAB_DIR:-/lab}
# host variables named in LAB_GUEST_ENV (lab.sh writes them to the share as env.sh)
[ -r "$LAB_DIR/env.sh" ] && . "$LAB_DIR/env.sh"
MYIP=${LAB_ip%/*}
PEER=${LAB_peer:-}
ROLE=${ROLE:-${LAB_role:-a}}
RES=$LAB_DIR/results
up() { cut -d' ' -f1 /proc/uptime; }
say() { echo "[lab $(up)] $*"; }
run() {
  _n=$1; _t=$2; shift 2
  echo "=== BEGIN $_n: $*"
  _s=$(up)
  timeout "$_t" "$@" > "$RES/$ROLE.$_n.out" 2>&1
  _rc=$?
  cat "$RES/$ROLE.$_n.out"
  echo "=== END $_n rc=$_rc secs=$(echo "$(up) $_s" | awk '{printf "%.2f", $1-$2}')"
  echo "$_rc" > "$RES/$ROLE.$_n.rc"
  return $_rc
}
bg() {
  _n=$1; _t=$2; shift 2
  rm -f "/tmp/$_n.rc" "/tmp/$_n.pid" "$RES/$ROLE.$_n.rc"
  echo "=== BEGIN $_n (background): $*"
  ( timeout "$_t" "$@" > "$RES/$ROLE.$_n.out" 2>&1 & echo $! > "/tmp/$_n.pid"; wait $!; echo $? > "/tmp/$_n.rc" ) &
  while [ ! -s "/tmp/$_n.pid" ]; do sleep 0.05; done
}
bgkill() { kill "$(cat "/tmp/$1.pid")" 2>/dev/null; }
bgwait() {
  _n=$1; _i=0; _lim=$(( ${2:-60} * 10 ))
  while [ ! -e "/tmp/$_n.rc" ] && [ $_i -lt $_lim ]; do sleep 0.1; _i=$((_i+1)); done
  [ -e "/tmp/$_n.rc" ] || { bgkill "$_n"; sleep 0.3; }
  cat "$RES/$ROLE.$_n.out"
  _rc=$(cat "/tmp/$_n.rc" 2>/dev/null || echo timeout)
  echo "$_rc" > "$RES/$ROLE.$_n.rc"
  echo "=== END $_n rc=$_rc (background)"
}
mark() { echo "$(up)" > "$LAB_DIR/sync/$1"; }
# pair_up: both VMs of a run-pair are up before the first cell. VM a's first in-band marker
# would otherwise wait for the ARP reply of a peer still booting, and be lost with its cell.
pair_up() {
  mark "$ROLE.up"
  if [ "$ROLE" = a ]; then waitfor b.up 120; else waitfor a.up 120; fi
}
sync_timeout() { say "$1 timed out"; echo "$1" >> "$RES/$ROLE.sync-timeouts"; }
lab_exit() {
  if [ -s "$RES/$ROLE.sync-timeouts" ]; then
    say "LAB-SYNC-FAILED: $(tr '\n' ';' < "$RES/$ROLE.sync-timeouts")"
    exit 1
  fi
  exit 0
}
waitfor() {
  _i=0; _lim=$(( ${2:-60} * 10 ))
  while [ ! -e "$LAB_DIR/sync/$1" ]; do
    sleep 0.1; _i=$((_i+1)); [ $_i -ge $_lim ] && { sync_timeout "waitfor $1"; return 1; }
  done
  return 0
}
# in-band cell boundaries (only VM a sends them; they are on the wire pcap of VM a's NIC)
cell_begin() { say "CELL-BEGIN $1"; cmpeer mark "${PEER:-127.0.0.1}" "LAB-CELL-BEGIN $1" >/dev/null 2>&1; sleep 0.2; }
cell_end() { sleep 0.2; cmpeer mark "${PEER:-127.0.0.1}" "LAB-CELL-END $1" >/dev/null 2>&1; say "CELL-END $1"; }
gid_index() {
  for _f in /sys/class/infiniband/rxe0/ports/1/gids/*; do
    case $(cat "$_f" 2>/dev/null) in 0000:0000:0000:0000:0000:ffff:*) basename "$_f"; return ;; esac
  done
  echo 1
}
wait_cm_listen() {
  _i=0
  while ! rdma res show cm_id 2>/dev/null | grep -q LISTEN; do
    sleep 0.1; _i=$((_i+1)); [ $_i -ge ${1:-100} ] && { sync_timeout "wait_cm_listen"; return 1; }
  done
  return 0
}
ping_each() {
  for _i in $(seq "$2" "$3"); do ping -c 1 -W 2 "$1.$_i" | grep -c "bytes from"; done
  ip neigh show
}
counters() { for _f in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do printf '%s=%s ' "$(basename "$_f")" "$(cat "$_f")"; done; echo; }
# wait_line NAME REGEX [SECS]: until the output of run/bg job NAME has a matching line
wait_line() {
  _i=0; _lim=$(( ${3:-20} * 10 ))
  while ! grep -qE "$2" "$RES/$ROLE.$1.out" 2>/dev/null; do
    sleep 0.1; _i=$((_i+1)); [ $_i -ge $_lim ] && { sync_timeout "wait_line $1 '$2'"; return 1; }
  done
  return 0
}
