#!/bin/sh
# rdmacm-pyverbs-kernel.sh -- rdma-core's tests/test_rdmacm.py on rdma-core's own librdmacm and
# the kernel's rdma_cm (lab.mods=cm): the baseline of rdmacm-pyverbs.sh. See
# rdmacm-pyverbs-body.sh.
# lab-mods-a: cm
# lab-initrd-extra: pyverbs
# lab-timeout: 1800
. /lab/lib.sh
before_pyverbs() { :; }
after_pyverbs() { :; }
. /lab/scenarios/rdmacm-pyverbs-body.sh
