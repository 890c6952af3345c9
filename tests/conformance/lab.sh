#!/usr/bin/env bash
# lab.sh -- the ibcm conformance lab: the Linux kernel CM over Soft-RoCE (rdma_rxe) in QEMU.
#
# Everything the guest and QEMU need comes from pinned Debian 12 packages (packages.lock),
# fetched with `apt-get download` and unpacked with `dpkg -x`; nothing is installed on the host.
# QEMU 7.2 runs straight from its unpacked .deb through the unpacked ld-linux (TCG).
#
#   lab.sh pin                 re-resolve the package closure and rewrite packages.lock
#   lab.sh build               fetch pinned debs (cached), unpack, build guest + helpers
#                              (idempotent: a second run with nothing changed takes ~1 s)
#   lab.sh run-pair SCENARIO   two VMs (a, b) on a UDP-over-127.0.0.1 wire, pcap of the wire
#   lab.sh run-single SCENARIO one VM (role a), same wire (nothing on the other end)
#   lab.sh run-netns SCENARIO  one VM on a tap inside a netns this script creates; an optional
#                              host part scenarios/SCENARIO.host runs inside that netns
#   lab.sh shell [MODS]        one VM with a shell on the console (debugging)
#   lab.sh clean               remove the build dir (the download cache too if it is inside)
#
# A scenario is scenarios/SCENARIO.sh, run inside each guest (busybox sh) with lab.* kernel
# arguments exported as LAB_* variables.  Header lines choose the module sets:
#   # lab-mods-a: cm|nocm      # lab-mods-b: cm|nocm      # lab-timeout: SECONDS
#   # lab-initrd-extra: pyverbs  boot with build/initramfs-pyverbs.cpio.gz appended to the
#                                common initramfs (python3 + pyverbs + rdma-core's tests/)
# Results go to $LAB_OUT/SCENARIO/: a.console.log, b.console.log, wire.pcap, share/ (the 9p
# share mounted on /lab in the guests: results/, sync/, bin/), host.log (netns), lab.log.
#
# Environment:
#   LAB_BUILD  build dir (default tests/conformance/build; git-ignored)
#   LAB_CACHE  .deb download cache (default $LAB_BUILD/debs) -- point it outside the checkout
#              to keep it between fresh clones (CI)
#   LAB_OUT    results dir (default tests/conformance/out; git-ignored)
#   LAB_PEER_BIN  space-separated host files copied into /lab/bin of every guest of a run
#                 (e.g. the host-built ibcm cm-ping)
#   LAB_TIMEOUT   hard limit per run in seconds (default: scenario header, else 300)
#   LAB_PIN=strict  fail when a pinned version is no longer downloadable, even after an
#                   `apt-get update` (default: substitute the refreshed lists' candidate, with a
#                   loud warning, recorded in versions-used.txt and in the suite's summary line
#                   `lab-packages:`)
#   LAB_ACCEL  tcg (default) | kvm         LAB_MEM  guest MiB (default 512)
#   LAB_GUEST_ENV  names of host environment variables handed to the guests: written to
#                  /lab/env.sh (the 9p share), which guest/lib.sh sources
#                  (e.g. LAB_GUEST_ENV=RDMACM_LIB_DIR RDMACM_LIB_DIR=/lab/bin)
#   LAB_INITRD_EXTRA=pyverbs  `lab.sh shell` with the second initramfs too (python3, pyverbs)
#   LAB_RDMA_TESTS=orig  fail the build when rdma-core's orig tarball cannot be downloaded
#                  (default: fall back to the copy of tests/ in the pinned python3-pyverbs deb,
#                  with a loud warning, recorded in build/rdma-core-tests/SOURCE)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
B=${LAB_BUILD:-$HERE/build}
CACHE=${LAB_CACHE:-$B/debs}
OUT=${LAB_OUT:-$HERE/out}
LOCK=${LAB_LOCK:-$HERE/packages.lock}
SR=$B/sysroot
ACCEL=${LAB_ACCEL:-tcg}
MEM=${LAB_MEM:-512}

# What the guest needs (userland) + the -dev packages to compile the lab's C programs against
# the very same libraries + QEMU for the host side.  The kernel is added by `pin`.
# python3-pyverbs (and with it python3.11) goes only into the second initramfs,
# initramfs-pyverbs.cpio.gz, which a scenario asks for with `# lab-initrd-extra: pyverbs`.
PKGS="busybox-static iproute2 ibverbs-utils ibverbs-providers rdmacm-utils libibumad3 \
      librdmacm-dev libibverbs-dev libibumad-dev qemu-system-x86 python3-pyverbs"
# maintainer-script plumbing never needed from the dependency closure
SKIP_RE='^(adduser|debconf|cdebconf|dpkg|tar|passwd|perl|perl-base|perl-modules-[0-9.]+|libperl[0-9.]+|udev|install-info|usrmerge|usr-is-merged|iso-codes|init-system-helpers|lsb-base|sysvinit-utils|libdebian-installer4|libnewt0.52|libslang2|libtextwrap1|libsemanage[0-9]*|libsemanage-common|readline-common|pci.ids|mailcap|mime-support|libfile-find-rule-perl|libnumber-compare-perl|libtext-glob-perl|libc6-dev|libc-dev-bin|linux-libc-dev|libcrypt-dev|libnsl-dev|rpcsvc-proto|libtirpc-dev|gcc-12-base)$'
# guest kernel modules (dependencies are added from modules.dep)
MODULES="virtio_pci virtio_net 9pnet_virtio 9p crc32_generic rdma_rxe ib_uverbs ib_umad \
         rdma_ucm ib_cm rdma_cm iw_cm sch_ingress cls_u32 act_gact"

# rdma-core's own test suite (tests/ of the Debian source package rdma-core 44.0-2, the source
# of the pinned python3-pyverbs): downloaded at build time into $CACHE, never kept in this
# repository.  SHA256 from bookworm's main/source/Sources and from rdma-core_44.0-2.dsc.
RDMA_TESTS_TARBALL=rdma-core_44.0.orig.tar.gz
RDMA_TESTS_SHA256=25d6601e60f27bbcd75e07fe340400cb80e6c3c487679700535385cfc9d9858b
RDMA_TESTS_TOP=rdma-core-44.0
RDMA_TESTS_URL=${LAB_DEBIAN_POOL:-http://deb.debian.org/debian/pool}/main/r/rdma-core/$RDMA_TESTS_TARBALL
RDMA_TESTS_DEB=python3-pyverbs     # the fallback: its /usr/share/doc/rdma-core/tests

ts() { date +%T; }
log() { echo "[lab $(ts)] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

LDSO=$SR/lib64/ld-linux-x86-64.so.2
LIBPATH=$SR/lib/x86_64-linux-gnu:$SR/usr/lib/x86_64-linux-gnu
export QEMU_MODULE_DIR=$SR/usr/lib/x86_64-linux-gnu/qemu   # Debian builds accel-tcg as a module
QEMU=("$LDSO" --library-path "$LIBPATH" "$SR/usr/bin/qemu-system-x86_64"
      -L "$SR/usr/share/qemu" -L "$SR/usr/share/seabios" -L "$SR/usr/lib/ipxe/qemu")

APT_REFRESHED=0
# apt_refresh: `apt-get update`, at most once per lab.sh invocation
apt_refresh() {
  [ "$APT_REFRESHED" = 1 ] && return 0
  log "apt-get update ($*)"
  apt-get update -qq || die "apt-get update failed"
  APT_REFRESHED=1
}
ensure_apt_lists() {
  if [ "${LAB_APT_UPDATE:-0}" = 1 ]; then apt_refresh "LAB_APT_UPDATE=1"
  elif ! apt-cache show busybox-static >/dev/null 2>&1; then apt_refresh "no package lists"; fi
}

# ------------------------------------------------------------------------------------------
# pin: packages.lock = one line per .deb: NAME VERSION ARCH SIZE SHA256
cmd_pin() {
  ensure_apt_lists
  local kpkg tmp
  kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
  [ -n "$kpkg" ] || die "cannot resolve the kernel package behind linux-image-amd64"
  tmp=$(mktemp)
  # shellcheck disable=SC2086
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
      --no-replaces --no-enhances $PKGS 2>/dev/null | grep -E '^[a-z0-9]' | sort -u \
    | grep -Ev "$SKIP_RE" > "$tmp"
  echo "$kpkg" >> "$tmp"
  {
    echo "# ibcm conformance lab: pinned Debian 12 (bookworm) packages, written by 'lab.sh pin' on $(date -u +%F)"
    echo "# NAME VERSION ARCH SIZE SHA256"
    # shellcheck disable=SC2046
    apt-get download --print-uris $(cat "$tmp") 2>/dev/null | awk '{
        f=$2; n=split(f, p, "_"); ver=p[2]; gsub("%3a", ":", ver); arch=p[3]; sub(/\.deb$/, "", arch);
        sha=$4; sub(/^SHA256:/, "", sha); print p[1], ver, arch, $3, sha }' | sort
  } > "$LOCK.new"
  rm -f "$tmp"
  [ "$(grep -vc '^#' "$LOCK.new")" -gt 50 ] || die "pin produced too few packages (see $LOCK.new)"
  mv "$LOCK.new" "$LOCK"
  log "wrote $LOCK: $(grep -vc '^#' "$LOCK") packages, kernel $kpkg"
}

deb_file() { local v=${2//:/%3a}; echo "${1}_${v}_${3}.deb"; }

# pinned_avail NAME=VER...: the NAME=VER among them that the package lists offer
pinned_avail() {
  apt-cache madison "${@%%=*}" 2>/dev/null \
    | awk -F'|' '{gsub(/ /,"",$1); gsub(/ /,"",$2); print $1"="$2}' | sort -u | grep -xF -f <(printf '%s\n' "$@") || true
}
# download NAME=VER into $CACHE; true when the .deb is there afterwards
download_deb() {
  local name=${1%%=*} ver=${1#*=} arch=$2
  [ -e "$CACHE/$(deb_file "$name" "$ver" "$arch")" ] && return 0
  ( cd "$CACHE" && apt-get download -q -o APT::Sandbox::User=root "$name=$ver" >/dev/null 2>&1 ) || true
  [ -e "$CACHE/$(deb_file "$name" "$ver" "$arch")" ]
}

# fetch every pinned deb into $CACHE (verified by SHA256); writes $B/versions-used.txt and
# $OUT/lab-packages.txt (the summary check.py prints: pinned count, every substitution).
# A pinned version the package lists do not offer, or whose download fails, first makes the
# lists refresh (`apt-get update`, once): lists months old name versions the archive has
# dropped and lack the ones pinned since.  Only a version still missing after the refresh is
# substituted -- by the refreshed lists' candidate, which is downloaded and recorded -- unless
# LAB_PIN=strict, which makes it an error.
fetch_debs() {
  mkdir -p "$CACHE" "$B" "$OUT"
  local name ver arch size sha f want=() missing=() pinned=0
  : > "$B/versions-used.txt.new"
  : > "$OUT/lab-packages.txt.new"
  while read -r name ver arch size sha; do
    case $name in ''|\#*) continue ;; esac
    pinned=$((pinned + 1))
    f=$(deb_file "$name" "$ver" "$arch")
    if [ -e "$CACHE/$f" ] && [ "$(sha256sum < "$CACHE/$f" | cut -d' ' -f1)" = "$sha" ]; then
      echo "$name $ver $arch $f" >> "$B/versions-used.txt.new"; continue
    fi
    want+=("$name=$ver"); missing+=("$name $ver $arch $sha")
  done < "$LOCK"
  if [ ${#want[@]} -gt 0 ]; then
    ensure_apt_lists
    local avail n_ok
    avail=$(pinned_avail "${want[@]}")
    n_ok=$(grep -c . <<< "$avail" || true)
    if [ "$n_ok" -lt ${#want[@]} ]; then
      apt_refresh "$(( ${#want[@]} - n_ok )) of ${#want[@]} pinned versions not in the package lists"
      avail=$(pinned_avail "${want[@]}")
      n_ok=$(grep -c . <<< "$avail" || true)
    fi
    log "downloading $n_ok pinned packages into $CACHE ($(( ${#want[@]} - n_ok )) pinned versions not offered)"
    # one batch for speed (it stops at the first failure; the loop below fetches the rest)
    [ "$n_ok" -eq 0 ] || ( cd "$CACHE" && xargs apt-get download -q -o APT::Sandbox::User=root <<< "$avail" >/dev/null 2>&1 ) || true
    local line alt cand got
    for line in "${missing[@]}"; do
      read -r name ver arch sha <<< "$line"
      f=$(deb_file "$name" "$ver" "$arch")
      if ! download_deb "$name=$ver" "$arch" && [ "$APT_REFRESHED" = 0 ]; then
        apt_refresh "download of pinned $name=$ver failed"
        download_deb "$name=$ver" "$arch" || true
      fi
      if [ -e "$CACHE/$f" ]; then
        got=$(sha256sum < "$CACHE/$f" | cut -d' ' -f1)
        [ "$got" = "$sha" ] || die "SHA256 mismatch for $f (pinned $sha, got $got)"
        echo "$name $ver $arch $f" >> "$B/versions-used.txt.new"; continue
      fi
      [ "${LAB_PIN:-}" = strict ] && die "pinned $name=$ver is not downloadable after apt-get update (LAB_PIN=strict); run 'lab.sh pin'"
      # substitute: the refreshed lists' candidate (for the kernel: what linux-image-amd64 is now)
      alt=$name
      case $name in linux-image-[0-9]*) alt=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}') ;; esac
      cand=$(apt-cache policy "$alt" 2>/dev/null | awk '/Candidate:/{print $2; exit}')
      { [ -n "$cand" ] && [ "$cand" != "(none)" ]; } || die "pinned $name=$ver is gone and the archive has no $alt at all"
      download_deb "$alt=$cand" "$arch" || die "pinned $name=$ver is gone and its substitute $alt=$cand cannot be downloaded either"
      log "WARNING: pinned $name=$ver is gone from the archive; SUBSTITUTED $alt=$cand (re-pin with 'lab.sh pin')"
      f=$(deb_file "$alt" "$cand" "$arch")
      echo "$alt $cand $arch $f SUBSTITUTED" >> "$B/versions-used.txt.new"
      echo "$name $ver -> $alt $cand" >> "$OUT/lab-packages.txt.new"
    done
  fi
  sort "$B/versions-used.txt.new" > "$B/versions-used.txt"; rm -f "$B/versions-used.txt.new"
  { echo "pinned $pinned"; cat "$OUT/lab-packages.txt.new"; } > "$OUT/lab-packages.txt"
  rm -f "$OUT/lab-packages.txt.new"
}

# fetch rdma-core's orig tarball into $CACHE, checked against RDMA_TESTS_SHA256 (a wrong hash
# is fatal).  Writes $B/rdma-tests.fetched: "orig FILE SHA256", or "deb ..." when the tarball
# cannot be downloaded (the tests then come from the pinned python3-pyverbs deb, which Debian
# built from that same source package) -- unless LAB_RDMA_TESTS=orig.
fetch_rdma_tests() {
  local f=$CACHE/$RDMA_TESTS_TARBALL got
  mkdir -p "$CACHE" "$B"
  if [ ! -e "$f" ] || [ "$(sha256sum < "$f" | cut -d' ' -f1)" != "$RDMA_TESTS_SHA256" ]; then
    rm -f "$f" "$f.part"
    log "downloading $RDMA_TESTS_URL"
    if curl -fsSL --retry 2 -o "$f.part" "$RDMA_TESTS_URL" 2>"$B/rdma-tests.curl.log" \
       || wget -q -O "$f.part" "$RDMA_TESTS_URL" 2>>"$B/rdma-tests.curl.log"; then
      got=$(sha256sum < "$f.part" | cut -d' ' -f1)
      [ "$got" = "$RDMA_TESTS_SHA256" ] || { rm -f "$f.part"; die "SHA256 mismatch for $RDMA_TESTS_TARBALL (pinned $RDMA_TESTS_SHA256, got $got)"; }
      mv "$f.part" "$f"
    else
      rm -f "$f.part"
      [ "${LAB_RDMA_TESTS:-}" = orig ] && die "cannot download $RDMA_TESTS_URL (LAB_RDMA_TESTS=orig): $(tr '\n' ' ' < "$B/rdma-tests.curl.log")"
      local deb; deb=$(awk -v n="$RDMA_TESTS_DEB" '$1 == n {print $4}' "$B/versions-used.txt")
      [ -n "$deb" ] || die "no $RDMA_TESTS_TARBALL and no $RDMA_TESTS_DEB deb to take rdma-core's tests/ from"
      log "WARNING: $RDMA_TESTS_URL could not be downloaded ($(tr '\n' ' ' < "$B/rdma-tests.curl.log"| cut -c1-120)); rdma-core's tests/ come from the pinned $deb instead (LAB_RDMA_TESTS=orig makes this an error)"
      echo "deb $deb $(sha256sum < "$CACHE/$deb" | cut -d' ' -f1) $RDMA_TESTS_TARBALL could not be downloaded" > "$B/rdma-tests.fetched"
      return 0
    fi
  fi
  echo "orig $RDMA_TESTS_TARBALL $RDMA_TESTS_SHA256" > "$B/rdma-tests.fetched"
}

# $B/rdma-core-tests/tests: rdma-core's tests/ (test_rdmacm.py imports tests.base, tests.utils,
# tests.rdmacm_utils and args_parser, and tests/__init__.py imports every test_*.py, so the
# whole directory is needed; nothing else of the source tree is)
extract_rdma_tests() {
  local d=$B/rdma-core-tests kind file sha rest
  read -r kind file sha rest < "$B/rdma-tests.fetched"
  rm -rf "$d"; mkdir -p "$d"
  case $kind in
    orig)
      tar -xzf "$CACHE/$file" -C "$d" --strip-components=1 "$RDMA_TESTS_TOP/tests"
      echo "rdma-core tests/ from the Debian source package: $file sha256 $sha ($RDMA_TESTS_URL)" > "$d/SOURCE" ;;
    deb)
      cp -r "$SR/usr/share/doc/rdma-core/tests" "$d/tests"
      gunzip -f "$d"/tests/*.gz
      echo "rdma-core tests/ FALLBACK from $file sha256 $sha (its /usr/share/doc/rdma-core/tests): $rest" > "$d/SOURCE" ;;
  esac
  [ -e "$d/tests/test_rdmacm.py" ] && [ -e "$d/tests/run_tests.py" ] || die "no test_rdmacm.py in $d/tests"
  log "$(cat "$d/SOURCE"): $(ls "$d/tests" | wc -l) files"
}

# ------------------------------------------------------------------------------------------
# build
build_stamp() {
  cat "$B/versions-used.txt" "$B/rdma-tests.fetched" "$HERE/lab.sh" "$HERE/guest/init" "$HERE"/src/* 2>/dev/null | sha256sum | cut -d' ' -f1
}
cmd_build() {
  local t0=$SECONDS
  [ -s "$LOCK" ] || die "no $LOCK (run 'lab.sh pin')"
  fetch_debs
  fetch_rdma_tests
  local stamp; stamp=$(build_stamp)
  if [ -e "$B/stamp" ] && [ "$(cat "$B/stamp")" = "$stamp" ] && [ -e "$B/initramfs.cpio.gz" ] \
       && [ -e "$B/initramfs-pyverbs.cpio.gz" ] && [ -e "$B/vmlinuz" ] && [ -x "$LDSO" ]; then
    log "build is up to date ($((SECONDS - t0)) s)"; return 0
  fi
  rm -f "$B/stamp"
  log "unpacking $(wc -l < "$B/versions-used.txt") debs"
  local kr=$B/kernel name ver arch f rest
  rm -rf "$SR" "$kr"; mkdir -p "$SR" "$kr"
  while read -r name ver arch f rest; do
    case $name in
      linux-image-[0-9]*) dpkg -x "$CACHE/$f" "$kr" ;;
      *) dpkg -x "$CACHE/$f" "$SR" ;;
    esac
  done < "$B/versions-used.txt"
  [ -x "$LDSO" ] || die "no dynamic loader in the sysroot"
  "${QEMU[@]}" --version | head -1 | sed 's/^/  /' >&2
  build_bins
  extract_rdma_tests
  build_initramfs "$kr"
  [ "${LAB_KEEP_KERNEL:-0}" = 1 ] || rm -rf "$kr"
  echo "$stamp" > "$B/stamp"
  log "build done in $((SECONDS - t0)) s"
}

# host-built programs that run in the guest (copied to /lab/bin of every run)
build_bins() {
  local bin=$B/bin
  rm -rf "$bin"; mkdir -p "$bin"
  local L=$SR/usr/lib/x86_64-linux-gnu
  # cmpeer: dynamic, against the sysroot's librdmacm/libibverbs (the same .so files are in the guest)
  gcc -O2 -Wall -Wextra -idirafter "$SR/usr/include" -o "$bin/cmpeer" "$HERE/src/cmpeer.c" \
      -L"$L" -Wl,-rpath-link,"$L":"$SR/lib/x86_64-linux-gnu" -lrdmacm -libverbs
  # umadprobe: static, only needs the kernel's umad ioctl ABI
  gcc -O2 -Wall -static -o "$bin/umadprobe" "$HERE/src/umadprobe.c"
  # "is a normal host build good enough for the guest?" probes: a dynamic C and a Rust binary
  gcc -O2 -Wall -o "$bin/hello-c" "$HERE/src/hello.c"
  if command -v rustc >/dev/null; then
    rustc -O --edition 2021 -o "$bin/hello-rs" "$HERE/src/hello.rs" 2>/dev/null || log "warning: rustc failed"
  fi
  log "host-built guest programs: $(ls "$bin" | tr '\n' ' ')"
}

sr_list_libs() {  # the sysroot's ld.so resolves only against the sysroot
  "$LDSO" --library-path "$LIBPATH" --list "$1" 2>/dev/null |
    awk '/=>/ && $3 ~ /^\// {print $3} !/=>/ && $1 ~ /^\// {print $1}'
}
ir_add() {  # ir_add IR /path/in/sysroot... : copy with the libraries it needs
  # (libraries already in $IR_BASE, the common initramfs tree, are left out when it is set)
  local ir=$1 f lib; shift
  for f in "$@"; do
    [ -e "$SR$f" ] || { log "warning: $f not in the sysroot"; continue; }
    mkdir -p "$ir$(dirname "$f")"; cp -L "$SR$f" "$ir$f"
    for lib in $(sr_list_libs "$SR$f"); do
      lib=${lib#"$SR"}
      [ -e "$ir$lib" ] && continue
      [ -n "${IR_BASE:-}" ] && [ -e "$IR_BASE$lib" ] && continue
      mkdir -p "$ir$(dirname "$lib")"; cp -L "$SR$lib" "$ir$lib"
    done
  done
}

build_initramfs() {
  local kr=$1 kver ir=$B/initramfs bb=$SR/bin/busybox a f m path
  kver=$(ls "$kr/lib/modules" | head -1)
  log "assembling the initramfs (kernel $kver)"
  cp "$kr/boot/vmlinuz-$kver" "$B/vmlinuz"
  "$bb" depmod -b "$kr" "$kver"
  rm -rf "$ir"
  mkdir -p "$ir"/{bin,sbin,usr/bin,usr/sbin,lib,lib64,proc,sys,dev,tmp,run,lab,etc,root}
  cp "$bb" "$ir/bin/busybox"
  for a in $("$bb" --list); do [ "$a" = busybox ] || ln -s busybox "$ir/bin/$a"; done
  rm -f "$ir/bin/ip" "$ir/bin/tc"                      # iproute2's ip/tc, not busybox's
  ir_add "$ir" /bin/ip /sbin/tc /usr/bin/rdma
  for f in "$SR"/usr/bin/ibv_* "$SR"/usr/bin/{cmtime,rping,ucmatose,udaddy,mckey,rdma_client,rdma_server,rdma_xclient,rdma_xserver,rcopy,riostream,rstream,udpong}; do
    [ -e "$f" ] && ir_add "$ir" "${f#"$SR"}"
  done
  ir_add "$ir" /usr/lib/x86_64-linux-gnu/libibumad.so.3 /usr/lib/x86_64-linux-gnu/librdmacm.so.1 \
         /lib/x86_64-linux-gnu/libgcc_s.so.1          # libgcc_s: dlopen()ed by pthread_exit
  mkdir -p "$ir/etc/libibverbs.d"
  cp "$SR/etc/libibverbs.d/rxe.driver" "$ir/etc/libibverbs.d/"
  for f in "$SR"/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav*.so; do ir_add "$ir" "${f#"$SR"}"; done
  local dep=$kr/lib/modules/$kver/modules.dep want=()
  for m in $MODULES; do
    path=$(grep -E "/${m}\.ko(\.[a-z]+)?:" "$dep" | head -1 | cut -d: -f1) || true
    [ -n "$path" ] || { log "warning: module $m not found"; continue; }
    # shellcheck disable=SC2207
    want+=("$path" $(grep -E "^$path:" "$dep" | cut -d: -f2))
  done
  for path in $(printf '%s\n' "${want[@]}" | sort -u); do
    mkdir -p "$ir/lib/modules/$kver/$(dirname "$path")"
    cp "$kr/lib/modules/$kver/$path" "$ir/lib/modules/$kver/$path"
  done
  cp "$kr/lib/modules/$kver"/modules.{order,builtin} "$ir/lib/modules/$kver/" 2>/dev/null || true
  "$bb" depmod -b "$ir" "$kver"
  cp "$HERE/guest/init" "$ir/init"; chmod +x "$ir/init"
  echo "root:x:0:0:root:/root:/bin/sh" > "$ir/etc/passwd"; echo "root:x:0:" > "$ir/etc/group"
  printf '127.0.0.1 localhost\n' > "$ir/etc/hosts"
  ( cd "$ir" && find . | LC_ALL=C sort | "$bb" cpio -o -H newc 2>/dev/null ) | gzip -1 > "$B/initramfs.cpio.gz"
  log "initramfs: $(du -h "$B/initramfs.cpio.gz" | cut -f1) gz, $(find "$ir" -name '*.ko*' | wc -l) modules"
  build_pyverbs_initramfs "$ir"
  rm -rf "$ir"
}

# The second initramfs, only for scenarios with `# lab-initrd-extra: pyverbs`: appended to the
# common one at boot (the kernel unpacks concatenated cpio archives in order), so every other
# run boots exactly what it booted before.  It holds python3.11 with the part of its stdlib
# that a test run can reach, pyverbs, the libraries they need that the common initramfs lacks
# (libpython3.11, the mlx5/efa providers that pyverbs' provider modules link), and rdma-core's
# tests/ in /opt/rdma-core/tests.
PY_STDLIB_DROP="test pydoc_data idlelib tkinter turtledemo lib2to3 ensurepip venv distutils \
  sqlite3 curses dbm tomllib xmlrpc wsgiref asyncio turtle.py pydoc.py doctest.py _pydecimal.py \
  mailbox.py imaplib.py nntplib.py smtplib.py smtpd.py ftplib.py poplib.py telnetlib.py"
PY_DYNLOAD_DROP_RE='^(_test|_xx|xxlimited|_ctypes_test|_curses|_dbm|_gdbm|nis|ossaudiodev|audioop|readline|_sqlite3|_ssl|_hashlib|_crypt|_codecs_|_tkinter|_asyncio|_decimal|_lsprof)'
build_pyverbs_initramfs() {
  local base=$1 ir=$B/initramfs-pyverbs bb=$SR/bin/busybox f n py=/usr/lib/python3.11
  rm -rf "$ir"; mkdir -p "$ir/usr/bin" "$ir/opt/rdma-core" "$ir/etc"
  IR_BASE=$base ir_add "$ir" /usr/bin/python3.11
  ln -s python3.11 "$ir/usr/bin/python3"
  # the pure-python stdlib (Debian's site.py and its sitecustomize symlink into /etc included)
  # shellcheck disable=SC2046
  tar -C "$SR" -cf - $(for n in $PY_STDLIB_DROP lib-dynload; do printf -- '--exclude=.%s/%s ' "$py" "$n"; done) \
      --exclude='__pycache__' ".$py" | tar -C "$ir" -xf -
  cp -r "$SR/etc/python3.11" "$ir/etc/"
  mkdir -p "$ir$py/lib-dynload"
  for f in "$SR$py"/lib-dynload/*.so; do
    n=$(basename "$f"); echo "$n" | grep -qE "$PY_DYNLOAD_DROP_RE" && continue
    IR_BASE=$base ir_add "$ir" "${f#"$SR"}"
  done
  for f in $(cd "$SR" && find usr/lib/python3/dist-packages/pyverbs -type f); do
    case $f in *.so) IR_BASE=$base ir_add "$ir" "/$f" ;; *) mkdir -p "$ir/$(dirname "$f")"; cp "$SR/$f" "$ir/$f" ;; esac
  done
  cp -r "$B/rdma-core-tests/tests" "$B/rdma-core-tests/SOURCE" "$ir/opt/rdma-core/"
  # the guest's python must find every library through the loader's default path
  for f in $(find "$ir" -name '*.so*' -type f); do
    "$LDSO" --library-path "$ir/lib/x86_64-linux-gnu:$ir/usr/lib/x86_64-linux-gnu:$base/lib/x86_64-linux-gnu:$base/usr/lib/x86_64-linux-gnu" \
        --list "$f" 2>&1 | grep -q 'not found' && die "initramfs-pyverbs: $f has a library missing"
  done
  ( cd "$ir" && find . | LC_ALL=C sort | "$bb" cpio -o -H newc 2>/dev/null ) | gzip -6 > "$B/initramfs-pyverbs.cpio.gz"   # -6: 11 % smaller than -1, 1.5 s more
  log "initramfs-pyverbs: $(du -h "$B/initramfs-pyverbs.cpio.gz" | cut -f1) gz ($(du -sh "$ir" | cut -f1) unpacked)"
  rm -rf "$ir"
}

need_build() { [ -e "$B/initramfs.cpio.gz" ] && [ -x "$LDSO" ] || die "run 'lab.sh build' first"; }

# ------------------------------------------------------------------------------------------
# VMs, cleanup
QPIDS=()     # qemu processes of this invocation
HPIDS=()     # host-side helpers of this invocation
NETNS=""     # netns created by this invocation
cleanup() {
  local p
  for p in "${HPIDS[@]}" "${QPIDS[@]}"; do
    [ -n "$p" ] || continue
    if kill -0 "$p" 2>/dev/null; then kill "$p" 2>/dev/null && log "killed pid $p"; fi
  done
  for p in "${HPIDS[@]}" "${QPIDS[@]}"; do
    [ -n "$p" ] || continue
    local i=0; while kill -0 "$p" 2>/dev/null && [ $i -lt 20 ]; do sleep 0.1; i=$((i+1)); done
    kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null
  done
  HPIDS=(); QPIDS=()
  if [ -n "$NETNS" ]; then
    ip netns del "$NETNS" 2>/dev/null && log "deleted netns $NETNS (and its tap)"
    NETNS=""
  fi
  return 0
}
trap cleanup EXIT
trap 'log "interrupted"; cleanup; exit 130' INT
trap 'log "terminated"; cleanup; exit 143' TERM

scenario_opt() {  # scenario_opt FILE KEY DEFAULT
  local v; v=$(sed -n "s/^# lab-$2: *\([^ ]*\).*/\1/p" "$1" | head -1)
  echo "${v:-$3}"
}

# prepare $RD (run dir) and its 9p share
new_run() {
  RUN=$1
  SCEN=$HERE/scenarios/$RUN.sh
  [ -e "$SCEN" ] || die "no scenario $SCEN"
  need_build
  RD=$OUT/$RUN
  rm -rf "$RD"; mkdir -p "$RD/share"/{sync,results,bin,scenarios}
  cp "$HERE/guest/lib.sh" "$RD/share/"
  cp "$HERE"/scenarios/*.sh "$HERE"/scenarios/*.py "$RD/share/scenarios/"
  cp "$B"/bin/* "$RD/share/bin/"
  local f
  for f in ${LAB_PEER_BIN:-}; do
    [ -e "$f" ] || die "LAB_PEER_BIN: no file $f"
    cp -L "$f" "$RD/share/bin/"; log "peer binary $(basename "$f") -> /lab/bin/$(basename "$f")"
  done
  guest_env > "$RD/share/env.sh"
  chmod -R a+rwX "$RD/share"
  INITRD=$B/initramfs.cpio.gz
  local extra; extra=$(scenario_opt "$SCEN" initrd-extra "")
  if [ -n "$extra" ]; then
    [ -e "$B/initramfs-$extra.cpio.gz" ] || die "no $B/initramfs-$extra.cpio.gz (run 'lab.sh build')"
    INITRD=$RD/initramfs+$extra.cpio.gz
    cat "$B/initramfs.cpio.gz" "$B/initramfs-$extra.cpio.gz" > "$INITRD"
    log "initramfs: common + $extra ($(du -h "$INITRD" | cut -f1))"
  fi
  TIMEOUT=${LAB_TIMEOUT:-$(scenario_opt "$SCEN" timeout 300)}
  DEADLINE=$((SECONDS + TIMEOUT))
  log "run $RUN (timeout ${TIMEOUT} s) -> $RD"
}

# /lab/env.sh: `export NAME='VALUE'` for every name in LAB_GUEST_ENV that is set on the host
guest_env() {
  local n v
  echo "# written by lab.sh from LAB_GUEST_ENV=${LAB_GUEST_ENV:-}"
  for n in ${LAB_GUEST_ENV:-}; do
    case $n in *[!A-Za-z0-9_]*|[0-9]*|'') die "LAB_GUEST_ENV: bad name '$n'" ;; esac
    [ -n "${!n+x}" ] || continue
    v=${!n}; v=${v//\'/\'\\\'\'}
    echo "export $n='$v'"
  done
}

nic() { echo "-device virtio-net-pci,netdev=$1,mac=$2,romfile="; }

# vm_start NAME NETNS(or "") APPEND -- extra qemu args...
vm_start() {
  local name=$1 ns=$2 append=$3; shift 3
  local pre=()
  [ -n "$ns" ] && pre=(ip netns exec "$ns")
  date +%s.%N > "$RD/$name.t0"
  "${pre[@]}" "${QEMU[@]}" -accel "$ACCEL" -nodefaults -no-user-config -display none \
      -m "$MEM" -smp 1 -kernel "$B/vmlinuz" -initrd "$INITRD" \
      -append "console=ttyS0 quiet panic=-1 lab.name=$name $append" -no-reboot \
      -serial "file:$RD/$name.console.log" \
      -virtfs "local,path=$RD/share,mount_tag=lab,security_model=none,id=lab" \
      "$@" > "$RD/$name.qemu.log" 2>&1 &
  QPIDS+=("$!")
  log "VM $name pid $! ($ACCEL, $MEM MiB): $append"
}

# wait for every qemu of this run to exit, or the deadline
vm_wait_all() {
  local p alive
  while :; do
    alive=0
    for p in "${QPIDS[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive = 0 ] && break
    if [ $SECONDS -ge $DEADLINE ]; then
      log "TIMEOUT: run $RUN exceeded ${TIMEOUT} s; killing its VMs"
      cleanup; return 1
    fi
    sleep 0.2
  done
  for p in "${QPIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  QPIDS=()
}

# summarise a run: ready times and script results; 0 iff every VM became ready (rxe0 ACTIVE:
# guest/init prints LAB-READY only then) and its scenario script exited 0 (LAB-SCRIPT-DONE rc=0)
run_report() {
  local rc=0 name con t0 line src
  for con in "$RD"/*.console.log; do
    name=$(basename "$con" .console.log)
    line=$(grep -m1 -E 'LAB-(NOT-)?READY' "$con" || true)
    case $line in
      *LAB-READY*) echo "$RUN/$name: $line" ;;
      *LAB-NOT-READY*) echo "$RUN/$name: not ready: $line"; rc=1 ;;
      *) echo "$RUN/$name: never ready"; rc=1 ;;
    esac
    line=$(grep -m1 'LAB-SCRIPT-DONE' "$con" || true)
    src=$(echo "$line" | sed -n 's/.*LAB-SCRIPT-DONE rc=\([0-9]*\).*/\1/p')
    if [ -z "$line" ]; then echo "$RUN/$name: script did not finish"; rc=1
    elif [ "$src" != 0 ]; then echo "$RUN/$name: script FAILED: $line"; rc=1
    else echo "$RUN/$name: $line"; fi
  done
  echo "$RUN: wall $((SECONDS - RUN_T0)) s"
  return $rc
}

LAB_PORT=${LAB_PORT:-$((20000 + ($$ % 20000) * 2))}

cmd_run_pair() {
  new_run "$1"; RUN_T0=$SECONDS
  local pa=$LAB_PORT pb=$((LAB_PORT + 1))
  local ma mb; ma=$(scenario_opt "$SCEN" mods-a cm); mb=$(scenario_opt "$SCEN" mods-b cm)
  vm_start a "" "lab.ip=10.77.0.1/24 lab.peer=10.77.0.2 lab.role=a lab.mods=$ma lab.script=$RUN.sh" \
      -netdev socket,id=n0,udp=127.0.0.1:$pb,localaddr=127.0.0.1:$pa $(nic n0 52:54:00:77:00:01) \
      -object filter-dump,id=cap0,netdev=n0,file="$RD/wire.pcap",maxlen=4096
  vm_start b "" "lab.ip=10.77.0.2/24 lab.peer=10.77.0.1 lab.role=b lab.mods=$mb lab.script=$RUN.sh" \
      -netdev socket,id=n0,udp=127.0.0.1:$pa,localaddr=127.0.0.1:$pb $(nic n0 52:54:00:77:00:02)
  vm_wait_all || { run_report || true; return 1; }
  run_report
}

cmd_run_single() {
  new_run "$1"; RUN_T0=$SECONDS
  local ma; ma=$(scenario_opt "$SCEN" mods-a cm)
  vm_start a "" "lab.ip=10.77.0.1/24 lab.peer=10.77.0.2 lab.role=a lab.mods=$ma lab.script=$RUN.sh" \
      -netdev socket,id=n0,udp=127.0.0.1:$((LAB_PORT+1)),localaddr=127.0.0.1:$LAB_PORT $(nic n0 52:54:00:77:00:01) \
      -object filter-dump,id=cap0,netdev=n0,file="$RD/wire.pcap",maxlen=4096
  vm_wait_all || { run_report || true; return 1; }
  run_report
}

# run-netns: NETNS holds the tap "ibcmtap0" with 10.78.0.1/24 and fd00:78::1/64; the VM
# (10.78.0.2/24, fd00:78::2/64) is attached to it.  No bridge, no route out of the netns.
NS_HOST4=10.78.0.1 NS_VM4=10.78.0.2 NS_HOST6=fd00:78::1 NS_VM6=fd00:78::2 NS_TAP=ibcmtap0
cmd_run_netns() {
  [ "$(id -u)" = 0 ] || die "run-netns needs root (ip netns, tap)"
  new_run "$1"; RUN_T0=$SECONDS
  local ma; ma=$(scenario_opt "$SCEN" mods-a cm)
  NETNS=ibcmlab-$$
  ip netns add "$NETNS"
  log "created netns $NETNS"
  ip -n "$NETNS" link set lo up
  ip -n "$NETNS" tuntap add dev $NS_TAP mode tap
  ip -n "$NETNS" addr add $NS_HOST4/24 dev $NS_TAP
  ip -n "$NETNS" -6 addr add $NS_HOST6/64 dev $NS_TAP nodad
  ip -n "$NETNS" link set $NS_TAP up
  vm_start a "$NETNS" "lab.ip=$NS_VM4/24 lab.ip6=$NS_VM6/64 lab.peer=$NS_HOST4 lab.peer6=$NS_HOST6 lab.role=a lab.mods=$ma lab.script=$RUN.sh" \
      -netdev tap,id=n0,ifname=$NS_TAP,script=no,downscript=no,vnet_hdr=off $(nic n0 52:54:00:78:00:02) \
      -object filter-dump,id=cap0,netdev=n0,file="$RD/wire.pcap",maxlen=4096
  local hp=$HERE/scenarios/$RUN.host hrc=0
  if [ -x "$hp" ]; then
    # the host part runs inside the netns; it talks to the guest through $LAB_SHARE/sync
    ip netns exec "$NETNS" env LAB_NETNS="$NETNS" LAB_HOST_IP=$NS_HOST4 LAB_VM_IP=$NS_VM4 \
        LAB_HOST_IP6=$NS_HOST6 LAB_VM_IP6=$NS_VM6 LAB_TAP=$NS_TAP LAB_SHARE="$RD/share" \
        LAB_RUN_DIR="$RD" LAB_HERE="$HERE" "$hp" > "$RD/host.log" 2>&1 &
    HPIDS+=("$!")
    log "host part $(basename "$hp") pid $! in netns $NETNS"
  fi
  vm_wait_all || { run_report || true; return 1; }
  local p
  for p in "${HPIDS[@]}"; do
    local i=0; while kill -0 "$p" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
    wait "$p" 2>/dev/null || hrc=$?
  done
  HPIDS=()
  echo "$RUN/host: exit $hrc ($RD/host.log)"
  cleanup
  ip netns list | grep -q "^$NETNS\b" 2>/dev/null && log "WARNING: netns still present"
  run_report && [ $hrc = 0 ]
}

cmd_shell() {
  RUN=shell; need_build; RD=$OUT/shell
  rm -rf "$RD"; mkdir -p "$RD/share"/{sync,results,bin,scenarios}
  cp "$HERE/guest/lib.sh" "$RD/share/"; cp "$HERE"/scenarios/*.sh "$HERE"/scenarios/*.py "$RD/share/scenarios/"; cp "$B"/bin/* "$RD/share/bin/"
  guest_env > "$RD/share/env.sh"
  INITRD=$B/initramfs.cpio.gz   # LAB_INITRD_EXTRA=pyverbs: the shell VM gets the second one too
  if [ -n "${LAB_INITRD_EXTRA:-}" ]; then
    INITRD=$RD/initramfs+$LAB_INITRD_EXTRA.cpio.gz
    cat "$B/initramfs.cpio.gz" "$B/initramfs-$LAB_INITRD_EXTRA.cpio.gz" > "$INITRD"
  fi
  "${QEMU[@]}" -accel "$ACCEL" -nodefaults -no-user-config -display none -m "$MEM" -smp 1 \
      -kernel "$B/vmlinuz" -initrd "$INITRD" -no-reboot -serial stdio \
      -append "console=ttyS0 panic=-1 lab.ip=10.77.0.1/24 lab.role=a lab.mods=${1:-cm}" \
      -virtfs "local,path=$RD/share,mount_tag=lab,security_model=none,id=lab" \
      -netdev socket,id=n0,udp=127.0.0.1:$((LAB_PORT+1)),localaddr=127.0.0.1:$LAB_PORT $(nic n0 52:54:00:77:00:01)
}

cmd_clean() { rm -rf "$B"; log "removed $B"; }

case "${1:-}" in
  pin) cmd_pin ;;
  build) cmd_build ;;
  run-pair) [ -n "${2:-}" ] || die "usage: lab.sh run-pair SCENARIO"; cmd_run_pair "$2" ;;
  run-single) [ -n "${2:-}" ] || die "usage: lab.sh run-single SCENARIO"; cmd_run_single "$2" ;;
  run-netns) [ -n "${2:-}" ] || die "usage: lab.sh run-netns SCENARIO"; cmd_run_netns "$2" ;;
  shell) cmd_shell "${2:-cm}" ;;
  clean) cmd_clean ;;
  *) sed -n '2,32p' "$0"; exit 2 ;;
esac
