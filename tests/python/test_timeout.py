"""Timeouts, under torchrun on 3 ranks with ZP_TIMEOUT=60 in the
environment: a process group's timeout (init_process_group / new_group
timeout=) and a Communicator's (timeout=) govern their calls, not
ZP_TIMEOUT. The last rank comes late to an all_reduce; every rank fails
within the timeout + 1 s, with the collective's name in the error. The
default group is gloo, which coordinates the ranks around the failures."""
import os
import time
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import zeppelin
import zeppelin.distributed
from zeppelin.comm import param


@pytest.fixture(scope="module", autouse=True)
def world():
    dist.init_process_group("gloo")
    yield
    dist.destroy_process_group()


def late_all_reduce(call, timeout, late_by):
    """call(x) on every rank, the last one late_by seconds late: the error
    and how long each rank's call took."""
    rank, n = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    if rank == n - 1:
        time.sleep(late_by)
    t0 = time.monotonic()
    with pytest.raises(zeppelin.RemoteError) as err:
        call(torch.ones(4))
    took = time.monotonic() - t0
    assert took <= timeout + 1.0, "rank %d failed after %.2f s (timeout %g s): %s" % (rank, took, timeout, err.value)
    if rank != n - 1:
        assert took >= timeout - 0.5, "rank %d failed after %.2f s, before its timeout %g s" % (rank, took, timeout)
    dist.barrier()  # gloo: the ranks meet again
    return str(err.value)


def test_the_timeout_default_is_the_librarys():
    assert param("ZP_TIMEOUT") == os.environ["ZP_TIMEOUT"]
    saved = os.environ.pop("ZP_TIMEOUT")
    try:
        assert float(param("ZP_TIMEOUT")) == 300  # zpGetParam: the library's default
    finally:
        os.environ["ZP_TIMEOUT"] = saved
    with pytest.raises(zeppelin.InvalidArgument, match="ZP_NO_SUCH"):
        param("ZP_NO_SUCH")


def test_a_communicators_timeout_governs_its_calls():
    comm = zeppelin.distributed.communicator(dist.group.WORLD, timeout=2)
    msg = late_all_reduce(comm.all_reduce, 2, late_by=4)
    assert "all_reduce" in msg and "send/recv" not in msg, msg
    comm.abort()


def test_a_process_groups_timeout_governs_every_call():
    group = dist.new_group(backend="zeppelin", timeout=timedelta(seconds=5))
    msg = late_all_reduce(lambda x: dist.all_reduce(x, group=group), 5, late_by=8)
    assert "all_reduce" in msg and "send/recv" not in msg, msg
    dist.destroy_process_group(group)
