"""Point-to-point on the "zeppelin" torch.distributed backend, under torchrun
on every rank: isend / irecv return at once, and the posted ops complete
together at the first wait in any order of posting, at sizes below and far
above the library's eager size (8 B, 64 KiB, 16 MiB). Every element of
every received tensor is checked against the sender's values, which every
rank computes from its rank; receive buffers are poisoned with NaN first.

The process group's timeout is short (20 s) so that a deadlock fails
instead of hanging: a blocking isend deadlocks the rings below."""
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import zeppelin.distributed  # noqa: F401 (registers the backend)

SIZES = [8, 64 << 10, 16 << 20]  # bytes


@pytest.fixture(scope="module", autouse=True)
def world():
    dist.init_process_group("zeppelin", timeout=timedelta(seconds=20))
    yield
    dist.destroy_process_group()


def block(rank, nbytes, salt=0):
    """rank's float32 block of nbytes: distinct per rank, position and salt,
    exact in float32."""
    n = nbytes // 4
    return ((torch.arange(n, dtype=torch.int64) * 7 + rank * 1000003 + salt * 7919) % (1 << 24)).to(torch.float32)


def poisoned(nbytes):
    return torch.full((nbytes // 4,), float("nan"), dtype=torch.float32)


def check(got, want):
    assert got.shape == want.shape
    bad = (got != want).nonzero()
    assert bad.numel() == 0, "%d of %d elements differ, first at %d: %r != %r" % (
        bad.numel(), want.numel(), int(bad[0]), float(got[bad[0]]), float(want[bad[0]]))


@pytest.mark.parametrize("nbytes", SIZES)
def test_ring_of_isend_then_irecv(nbytes):
    rank, n = dist.get_rank(), dist.get_world_size()
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    out = block(rank, nbytes)
    got = poisoned(nbytes)
    s = dist.isend(out, nxt)
    r = dist.irecv(got, prv)
    assert s is not None and r is not None
    s.wait()
    r.wait()
    check(got, block(prv, nbytes))
    # waited the other way round, receive posted first
    got2 = poisoned(nbytes)
    r = dist.irecv(got2, prv)
    s = dist.isend(block(rank, nbytes, salt=1), nxt)
    r.wait()
    s.wait()
    check(got2, block(prv, nbytes, salt=1))


class RingComm:
    """ring-flash-attn's RingComm (ring_flash_attn/utils.py): a batch of
    P2POps, batch_isend_irecv, then wait on every request."""

    def __init__(self, group=None):
        self._group = group
        self._ops = []
        self._reqs = None
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.send_rank = (self.rank + 1) % self.world_size
        self.recv_rank = (self.rank - 1) % self.world_size

    def send_recv(self, to_send, recv_tensor=None):
        res = torch.empty_like(to_send) if recv_tensor is None else recv_tensor
        self._ops.append(dist.P2POp(dist.isend, to_send, self.send_rank, group=self._group))
        self._ops.append(dist.P2POp(dist.irecv, res, self.recv_rank, group=self._group))
        return res

    def commit(self):
        self._reqs = dist.batch_isend_irecv(self._ops)

    def wait(self):
        for req in self._reqs:
            req.wait()
        self._reqs, self._ops = None, []

    def send_recv_kv(self, k, v):
        next_k, next_v = self.send_recv(k, poisoned(k.numel() * 4)), self.send_recv(v, poisoned(v.numel() * 4))
        self.commit()
        return next_k, next_v


@pytest.mark.parametrize("nbytes", SIZES)
def test_ring_comm_passes_k_and_v_blocks_round_the_ring(nbytes):
    """Every step sends this rank's current k and v on and receives the
    previous rank's; after step i a rank holds rank - i - 1's blocks."""
    rank, n = dist.get_rank(), dist.get_world_size()
    comm = RingComm()
    k, v = block(rank, nbytes, salt=2), block(rank, nbytes, salt=3)
    for step in range(n - 1):
        next_k, next_v = comm.send_recv_kv(k, v)
        comm.wait()
        src = (rank - step - 1) % n
        check(next_k, block(src, nbytes, salt=2))
        check(next_v, block(src, nbytes, salt=3))
        k, v = next_k, next_v


def test_pending_ops_run_before_a_collective():
    """isend on one rank and irecv on its peer, then all_reduce before either
    wait: the pending ops run first, as one group on each rank (program
    order), then the all_reduce; the waits after it find them done."""
    rank, n = dist.get_rank(), dist.get_world_size()
    nbytes = 64 << 10
    sender, receiver = rank % 2 == 0 and rank + 1 < n, rank % 2 == 1  # pairs (0, 1), (2, 3), ...
    got = poisoned(nbytes)
    work = None
    if sender:
        work = dist.isend(block(rank, nbytes, salt=4), rank + 1)
    elif receiver:
        work = dist.irecv(got, rank - 1)
    x = torch.ones(3)
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((3,), float(n)))
    if work is not None:
        assert work.is_success()  # ran before the all_reduce
        work.wait()
    if receiver:
        check(got, block(rank - 1, nbytes, salt=4))


def test_bad_point_to_point_calls_say_so():
    rank, n = dist.get_rank(), dist.get_world_size()
    with pytest.raises(ValueError, match="peer 99 is not a rank"):
        dist.isend(torch.ones(2), 99)
    with pytest.raises(ValueError, match="any source .* tag 0 only"):
        dist.irecv(torch.ones(2), tag=3)
    dist.barrier()  # nothing was posted: still usable


@pytest.mark.parametrize("nbytes", SIZES)
def test_recv_without_src_returns_each_sender_in_its_order(nbytes):
    """Rank 0 receives every other rank's three messages (one at 16 MiB, to
    keep the test's time) with dist.recv without src (the sender's rank returned, as Gloo's recv returns it),
    then one more per rank with irecv without src (work._source_rank()):
    each sender's messages come in the order sent, every element checked."""
    rank, n = dist.get_rank(), dist.get_world_size()
    got = [0] * n
    k_each = 3 if nbytes < (1 << 20) else 1
    if rank != 0:
        for k in range(k_each):
            dist.send(block(rank, nbytes, salt=10 + k), 0)
    else:
        for _ in range(k_each * (n - 1)):
            t = poisoned(nbytes)
            src = dist.recv(t)
            assert isinstance(src, int) and 0 < src < n and got[src] < k_each, src
            check(t, block(src, nbytes, salt=10 + got[src]))
            got[src] += 1
    dist.barrier()  # the last messages cannot meet the first receives
    if rank != 0:
        dist.send(block(rank, nbytes, salt=10 + k_each), 0)
    else:
        works = [(dist.irecv(t), t) for t in [poisoned(nbytes) for _ in range(n - 1)]]
        for w, t in works:
            w.wait()
            src = w._source_rank()
            assert 0 < src < n and got[src] == k_each, (src, got)
            check(t, block(src, nbytes, salt=10 + k_each))
            got[src] += 1
    dist.barrier()


@pytest.mark.parametrize("nbytes", SIZES)
def test_ring_of_isend_then_irecv_without_src(nbytes):
    """The ring of isend-then-irecv with irecv from any source: each rank's
    receive gets its predecessor's block, at every size (the ops run as one
    group: a send past the eager size cannot deadlock against the wildcard)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    got = poisoned(nbytes)
    s = dist.isend(block(rank, nbytes, salt=20), (rank + 1) % n)
    r = dist.irecv(got)
    r.wait()
    s.wait()
    assert r._source_rank() == (rank - 1) % n
    check(got, block((rank - 1) % n, nbytes, salt=20))
    dist.barrier()


def test_irecv_without_src_then_with_src_match_in_posting_order():
    """Rank 1 sends rank 0 two messages; rank 0 posts irecv without src, then
    irecv from 1: as with Gloo (and MPI), the first posted takes the first."""
    rank = dist.get_rank()
    if rank == 1:
        dist.send(block(1, 64 << 10, salt=30), 0)
        dist.send(block(1, 64 << 10, salt=31), 0)
    elif rank == 0:
        a, b = poisoned(64 << 10), poisoned(64 << 10)
        wa = dist.irecv(a)
        wb = dist.irecv(b, 1)
        wb.wait()
        wa.wait()
        assert wa._source_rank() == 1
        check(a, block(1, 64 << 10, salt=30))
        check(b, block(1, 64 << 10, salt=31))
    dist.barrier()
