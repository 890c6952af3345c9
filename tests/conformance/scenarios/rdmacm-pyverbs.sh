#!/bin/sh
# rdmacm-pyverbs.sh -- rdma-core's tests/test_rdmacm.py on ibcm's librdmacm drop-in: no kernel
# CM (lab.mods=nocm), ibcmd on umad0, the tests with LD_LIBRARY_PATH=/tmp/rdmacm (the drop-in,
# /lab/bin/librdmacm-ibcm.so.1 copied as librdmacm.so.1) and IBCM_SOCKET. Both processes of
# each test (passive and active) are on this node, so both go through the one ibcmd, which
# sends the CM messages to its own address. See rdmacm-pyverbs-body.sh; rdmacm-pyverbs-kernel.sh
# is the same suite on the kernel CM.
# lab-mods-a: nocm
# lab-initrd-extra: pyverbs
# lab-timeout: 1800
. /lab/lib.sh
SOCK=/tmp/ibcmd.sock
before_pyverbs() {
  bg ibcmd 1700 ibcmd --addr "$MYIP" --socket $SOCK --state /tmp/ibcmd.state \
    --umad /dev/infiniband/umad0 --gid-index "$(gid_index)"
  wait_line ibcmd 'ibcmd serving' 30
  export IBCM_SOCKET=$SOCK
}
after_pyverbs() {
  bgkill ibcmd; bgwait ibcmd 10 > /dev/null
}
mkdir -p /tmp/rdmacm
cp /lab/bin/librdmacm-ibcm.so.1 /tmp/rdmacm/librdmacm.so.1
RDMACM_LIB_DIR=/tmp/rdmacm
. /lab/scenarios/rdmacm-pyverbs-body.sh
