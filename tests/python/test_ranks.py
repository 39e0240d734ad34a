"""The bindings on a real job: every rank runs this file under a launcher
(zprun -n N, python3 -m torch.distributed.run --nproc-per-node N), makes its
communicator with zeppelin.init() and runs the same tests in the same order.

Every expected result is computed here, independently of the library: all
ranks draw every rank's inputs from one seed (ZP_TEST_SEED, printed), so each
can work out what it must receive. Outputs are poisoned first, and bytes
outside the written ranges are checked to stay poisoned. Bad inputs must
raise the right exception, and the communicator must still work after them.
"""

import ctypes
import os
import time
import zlib

import numpy as np
import pytest
import torch

import zeppelin

SEED = int(os.environ.get("ZP_TEST_SEED", "20261125"))


@pytest.fixture(scope="module")
def comm():
    c = zeppelin.init()
    if c.rank == 0:
        print("\nseed %d (ZP_TEST_SEED), %d ranks" % (SEED, c.size))
    yield c
    c.destroy()


def rng(*key):
    """The same generator on every rank for the same key."""
    return np.random.default_rng([SEED] + [zlib.crc32(str(k).encode()) for k in key])


def still_works(comm):
    """An all-reduce whose result every rank can check: the communicator is usable."""
    x = np.full(7, comm.rank + 1, dtype=np.int64)
    comm.all_reduce(x)
    assert (x == comm.size * (comm.size + 1) // 2).all()


def env_world():
    for k in ("ZP_NRANKS", "WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"):
        if os.environ.get(k):
            return int(os.environ[k])


def test_rank_and_size(comm):
    assert comm.size == env_world()
    got = np.zeros(comm.size, dtype=np.int32)
    comm.all_gather(np.array([comm.rank], dtype=np.int32), got)
    assert got.tolist() == list(range(comm.size))


def test_torchrun_secret_comes_from_the_store(comm):
    # Under torchrun init() draws the rendezvous secret through torchrun's
    # store: every rank has the same random one, not one derived from public
    # variables. Elsewhere it leaves ZP_SECRET alone.
    secret = os.environ.get("ZP_SECRET", "")
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        assert secret == ""
        return
    assert len(secret) == 32 and int(secret, 16) >= 0
    got = np.zeros((comm.size, 16), dtype=np.uint8)
    comm.all_gather(np.frombuffer(bytes.fromhex(secret), dtype=np.uint8).copy(), got)
    assert (got == got[0]).all()


# ---- data of every dtype ----
NP_TYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64"]
TORCH_TYPES = [torch.int8, torch.uint8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
               torch.float64]


def values(g, n, dtype, small=False):
    """n random values exactly representable in dtype (small integers for sums)."""
    hi = 8 if small else 100
    v = g.integers(-hi if "uint" not in str(dtype) else 0, hi, size=n)
    if isinstance(dtype, torch.dtype):
        return torch.from_numpy(v).to(dtype)
    return v.astype(dtype)


def poison_like(x):
    if isinstance(x, torch.Tensor):
        return torch.full_like(x, 111)
    return np.full_like(x, 111)


def as_np(x):
    return x.float().numpy() if isinstance(x, torch.Tensor) and x.dtype == torch.bfloat16 else np.asarray(x)


@pytest.mark.parametrize("kind", ["numpy", "torch", "dlpack", "buffer"])
@pytest.mark.parametrize("case", range(3))
def test_alltoallv(comm, kind, case):
    n, me = comm.size, comm.rank
    g = rng("alltoallv", kind, case)
    types = {"numpy": NP_TYPES, "dlpack": NP_TYPES, "torch": TORCH_TYPES, "buffer": ["int32"]}[kind]
    dtype = types[int(g.integers(0, len(types)))]
    counts = g.integers(0, 3000, size=(n, n))
    counts[g.random((n, n)) < 0.2] = 0  # some empty blocks
    gaps = g.integers(0, 5, size=(n, n, 2))  # displacements with gaps between blocks
    # blocks[s][d]: what rank s sends to rank d
    blocks = [[values(rng("block", kind, case, s, d), counts[s, d], dtype) for d in range(n)] for s in range(n)]

    def displs(cs, gs):
        out, at = [], 0
        for c, gap in zip(cs, gs):
            at += gap
            out.append(at)
            at += c
        return out, at

    sd, stotal = displs(counts[me], gaps[me, :, 0])
    rd, rtotal = displs(counts[:, me], gaps[:, me, 1])
    mk = (lambda n_: torch.zeros(n_, dtype=dtype)) if kind == "torch" else (lambda n_: np.zeros(n_, dtype=dtype))
    send, recv = mk(stotal), poison_like(mk(rtotal + 3))
    for d in range(n):
        send[sd[d]:sd[d] + counts[me, d]] = blocks[me][d]
    if kind == "dlpack":  # an object that only speaks DLPack
        class Only:
            def __init__(self, a):
                self.a = a

            def __dlpack__(self, stream=None):
                return self.a.__dlpack__()
        args = (Only(send), counts[me], Only(recv), counts[:, me])
    elif kind == "buffer":
        send_b, recv_b = bytearray(send.tobytes()), bytearray(recv.tobytes())
        args = (memoryview(send_b).cast("i"), counts[me], memoryview(recv_b).cast("i"), counts[:, me])
    else:
        args = (send, counts[me], recv, counts[:, me])
    comm.alltoallv(*args, sdispls=sd, rdispls=rd)
    if kind == "buffer":
        recv = np.frombuffer(recv_b, dtype=np.int32)
    expect = as_np(poison_like(mk(rtotal + 3))).copy()
    for s in range(n):
        expect[rd[s]:rd[s] + counts[s, me]] = as_np(blocks[s][me])
    np.testing.assert_array_equal(as_np(recv), expect)


def test_alltoallv_default_displacements_and_return(comm):
    # Rank s sends (s + 1) * (d + 2) elements to rank d: send and receive counts
    # differ, so each buffer's blocks lie back to back by its own counts.
    n, me = comm.size, comm.rank
    cnt = [[(s + 1) * (d + 2) for d in range(n)] for s in range(n)]
    send = torch.cat([torch.full((cnt[me][d],), float(100 * me + d)) for d in range(n)])
    recv = torch.full((sum(cnt[s][me] for s in range(n)),), -1.0)
    out = comm.alltoallv(send, cnt[me], recv, [cnt[s][me] for s in range(n)])
    assert out is recv
    expect = torch.cat([torch.full((cnt[s][me],), float(100 * s + me)) for s in range(n)])
    assert torch.equal(recv, expect)


def test_alltoallv_repeated_counts_are_still_checked(comm):
    # The package keeps the last counts' checks: the same counts with a buffer
    # that is too short must still be refused, and new counts taken.
    n = comm.size
    send, recv = torch.ones(5 * n), torch.zeros(5 * n)
    for _ in range(2):
        comm.alltoallv(send, [5] * n, recv, [5] * n)
    with pytest.raises(zeppelin.InvalidArgument):
        comm.alltoallv(send, [5] * n, torch.zeros(5 * n - 1), [5] * n)
    with pytest.raises(zeppelin.InvalidArgument):
        comm.alltoallv(send[:-1], np.array([5] * n), recv, [5] * n)
    recv.zero_()
    comm.alltoallv(send, [4] * n, recv, torch.tensor([4] * n))
    assert recv.sum() == 4 * n and (recv[:4 * n] == 1).all()
    still_works(comm)


def test_all_to_all_single_takes_rows_as_torch_does(comm):
    # torch.distributed.all_to_all_single's call: split sizes in rows of a
    # [N, 64] tensor, uneven, and None for equal splits.
    n, me = comm.size, comm.rank
    rows = [[1 + (s * 7 + d * 3) % 5 for d in range(n)] for s in range(n)]  # rank s sends rows[s][d] rows to d
    send = torch.cat([torch.arange(rows[me][d] * 64, dtype=torch.float32).reshape(-1, 64) + 1000 * me + 100 * d
                      for d in range(n)])
    recv = torch.full((sum(rows[s][me] for s in range(n)), 64), -1.0)
    out = comm.all_to_all_single(recv, send, [rows[s][me] for s in range(n)], rows[me])
    assert out is recv
    want = torch.cat([torch.arange(rows[s][me] * 64, dtype=torch.float32).reshape(-1, 64) + 1000 * s + 100 * me
                      for s in range(n)])
    assert torch.equal(recv, want)
    equal = torch.full((3 * n, 5), float(me))
    got = torch.full((3 * n, 5), -1.0)
    comm.all_to_all_single(got, equal)
    assert torch.equal(got, torch.arange(n, dtype=torch.float32).repeat_interleave(3)[:, None].expand(3 * n, 5))
    with pytest.raises(zeppelin.InvalidArgument, match="rows"):
        comm.all_to_all_single(got, equal, [1] * n, [1] * n)  # sizes that do not cover the rows


def test_alltoallv_refuses_split_sizes_given_as_rows(comm):
    # The silent wrong answer of issue 26: split sizes in rows passed as
    # element counts moved 1/64 of each block and left the rest of recv as it
    # was. Now it is an error that says what to do, and nothing moves.
    n = comm.size
    send, recv = torch.ones(2 * n, 64), torch.full((2 * n, 64), -1.0)
    with pytest.raises(zeppelin.InvalidArgument, match="multiply them by 64"):
        comm.alltoallv(send, [2] * n, recv, [2] * n)
    assert (recv == -1).all()
    comm.alltoallv(send, [128] * n, recv, [128] * n)  # elements: the whole blocks
    assert (recv == 1).all()
    comm.alltoallv(torch.ones(0, 64), [0] * n, torch.ones(0, 64), [0] * n)  # nothing to move is no fraction
    still_works(comm)


def test_profiler_shows_zeppelin_ranges(comm):
    # As Gloo's calls show as gloo:all_reduce: torch.profiler's trace names
    # each Zeppelin call zeppelin:<method> (issue 26, item 6).
    x = torch.ones(16)
    with torch.profiler.profile() as prof:
        comm.all_reduce(x)
        comm.alltoallv(torch.ones(comm.size), [1] * comm.size, torch.zeros(comm.size), [1] * comm.size)
        comm.barrier()
    names = {e.name for e in prof.events()}
    for want in ("zeppelin:all_reduce", "zeppelin:alltoallv", "zeppelin:barrier"):
        assert want in names, (want, sorted(n for n in names if "zeppelin" in n))
    assert (x == comm.size).all()


def test_send_recv_in_a_group(comm):
    n, me = comm.size, comm.rank
    # Everyone sends a different-size message to everyone else at once.
    outs = {p: torch.full((10 + 7 * me + p,), float(me * 1000 + p), dtype=torch.float64) for p in range(n) if p != me}
    ins = {p: torch.zeros(10 + 7 * p + me, dtype=torch.float64) for p in range(n) if p != me}
    with zeppelin.group():
        for p in outs:
            comm.send(outs[p] * 1, p)  # a temporary: the group keeps it alive until it runs
            comm.recv(ins[p], p)
    for p in ins:
        assert (ins[p] == p * 1000 + me).all(), p


def test_alltoallv_calls_with_different_counts_in_a_group(comm):
    # zpAlltoallv reads its counts when the group runs: the first call's
    # arrays must outlive the second call's (issue 28: a use-after-free).
    n, me = comm.size, comm.rank
    calls = []
    for k in range(3):
        counts = [1 + (k * 3 + me + p) % 5 for p in range(n)]      # what I send to p
        rcounts = [1 + (k * 3 + p + me) % 5 for p in range(n)]     # what p sends me
        send = torch.cat([torch.full((c,), float(1000 * k + 10 * me + p)) for p, c in enumerate(counts)])
        calls.append((send, counts, torch.full((sum(rcounts),), -1.0), rcounts, k))
    with zeppelin.group():
        for send, counts, recv, rcounts, _ in calls:
            comm.alltoallv(send, counts, recv, rcounts)
    for send, counts, recv, rcounts, k in calls:
        want = torch.cat([torch.full((c,), float(1000 * k + 10 * p + me)) for p, c in enumerate(rcounts)])
        assert torch.equal(recv, want), k


def test_send_recv_ring_numpy(comm):
    n, me = comm.size, comm.rank
    data = [values(rng("ringdata", s), 5000, "float32") for s in range(n)]
    got = np.zeros(5000, dtype=np.float32)
    with zeppelin.group():
        comm.send(data[me], (me + 1) % n)
        comm.recv(got, (me - 1) % n)
    np.testing.assert_array_equal(got, data[(me - 1) % n])


# ---- collectives ----
REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}


def expected_reduce(op, stack, dtype):
    if op == "avg":
        s = np.sum(stack.astype(np.float64), axis=0)
        if "int" in dtype:
            return np.trunc(s / len(stack))
        return s / len(stack)
    return REDUCE[op](stack.astype(np.float64), axis=0)


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "avg"])
@pytest.mark.parametrize("dtype", ["int32", "int64", "float16", "float32", "float64", torch.bfloat16])
def test_all_reduce(comm, op, dtype):
    n, me = comm.size, comm.rank
    count = 1001
    key = ("allreduce", op, str(dtype))
    # small values: sums and products stay exact in every type
    inputs = [values(rng(*key, r), count, dtype, small=True) for r in range(n)]
    if op == "prod":  # factors in [-2, 2]
        inputs = [(torch.from_numpy(np.clip(as_np(x), -2, 2)).to(dtype) if isinstance(x, torch.Tensor)
                   else np.clip(x, -2, 2).astype(dtype)) for x in inputs]
    mine = inputs[me].clone() if isinstance(dtype, torch.dtype) else inputs[me].copy()
    out = comm.all_reduce(mine, op=op)
    assert out is mine
    expect = expected_reduce(op, np.stack([as_np(x).astype(np.float64) for x in inputs]), str(dtype).replace("torch.", ""))
    if op == "avg" and "float" in str(dtype):
        tol = 1e-2 if "16" in str(dtype) else 1e-6
        np.testing.assert_allclose(as_np(out).astype(np.float64), expect, rtol=tol, atol=tol)
    else:
        np.testing.assert_array_equal(as_np(out).astype(np.float64), expect)


def test_all_reduce_out_of_place_and_enum_op(comm):
    n, me = comm.size, comm.rank
    x = torch.full((33,), float(me))
    out = torch.zeros(33)
    comm.all_reduce(x, op=zeppelin.MAX, out=out)
    assert (out == n - 1).all() and (x == me).all()


@pytest.mark.parametrize("root", [0, -1])
def test_broadcast_and_reduce(comm, root):
    n, me = comm.size, comm.rank
    root = root % n
    data = [values(rng("bcast", r), 777, "float64") for r in range(n)]
    x = data[me].copy()
    comm.broadcast(x, root=root)
    np.testing.assert_array_equal(x, data[root])
    # reduce: only root's output is written
    out = np.full(777, -5.0)
    comm.reduce(data[me], root=root, op="sum", out=out)
    if me == root:
        np.testing.assert_array_equal(out, np.sum(np.stack(data), axis=0))
    else:
        assert (out == -5.0).all()


def test_all_gather_and_reduce_scatter(comm):
    n, me = comm.size, comm.rank
    count = 501
    data = [values(rng("gather", r), count, torch.int64) for r in range(n)]
    out = torch.full((n * count,), -1, dtype=torch.int64)
    comm.all_gather(data[me], out)
    assert torch.equal(out, torch.cat(data))
    # in place: this rank's slot of the output is the input
    buf = torch.full((n * count,), -1, dtype=torch.int64)
    buf[me * count:(me + 1) * count] = data[me]
    comm.all_gather(buf[me * count:(me + 1) * count], buf)
    assert torch.equal(buf, torch.cat(data))
    # reduce-scatter: block `me` of every rank's input, summed
    full = [values(rng("rs", r), n * count, torch.float32, small=True) for r in range(n)]
    got = torch.zeros(count)
    comm.reduce_scatter(full[me], got, op=zeppelin.SUM)
    assert torch.equal(got, sum(f[me * count:(me + 1) * count] for f in full))


def test_all_gatherv_and_reduce_scatterv(comm):
    n, me = comm.size, comm.rank
    counts = [(7 * r + 3) % 11 for r in range(n)]  # uneven, one may be 0
    displs = [sum(counts[:r]) + 2 * r for r in range(n)]  # gaps of 2 that must stay untouched
    total = displs[-1] + counts[-1] + 1
    data = [values(rng("gatherv", r), counts[r], torch.int32) for r in range(n)]
    out = torch.full((total,), -1, dtype=torch.int32)
    comm.all_gatherv(data[me], out, counts, displs)
    want = torch.full((total,), -1, dtype=torch.int32)
    for r in range(n):
        want[displs[r]:displs[r] + counts[r]] = data[r]
    assert torch.equal(out, want)
    full = [values(rng("rsv", r), sum(counts), torch.int64) for r in range(n)]
    got = torch.full((counts[me],), -1, dtype=torch.int64)
    comm.reduce_scatterv(full[me], got, counts, op=zeppelin.MAX)
    lo = sum(counts[:me])
    assert torch.equal(got, torch.stack([f[lo:lo + counts[me]] for f in full]).max(dim=0).values)
    with pytest.raises(zeppelin.InvalidArgument, match="recvcounts"):
        comm.all_gatherv(data[me], out, counts[:-1])
    comm.barrier()  # still usable


def test_barrier(comm):
    comm.barrier()
    comm.barrier()


# ---- split ----
def test_split(comm):
    n, me = comm.size, comm.rank
    color = zeppelin.SPLIT_NOCOLOR if (n > 2 and me == 0) else me % 2
    sub = comm.split(color, key=-me)  # reversed order within each color
    if color == zeppelin.SPLIT_NOCOLOR:
        assert sub is None
        return
    members = [r for r in range(n) if r % 2 == color and not (n > 2 and r == 0)]
    with sub:
        assert sub.size == len(members)
        assert sub.rank == sorted(members, reverse=True).index(me)
        x = np.array([me], dtype=np.int64)
        sub.all_reduce(x)
        assert x[0] == sum(members)


def test_from_unique_id_and_context_manager(comm):
    # Rank 0 makes an id, broadcast over the existing communicator.
    uid = bytearray(zeppelin.get_unique_id() if comm.rank == 0 else bytes(zeppelin.UNIQUE_ID_BYTES))
    comm.broadcast(uid, root=0)
    with zeppelin.Communicator.from_unique_id(bytes(uid), comm.size, comm.size - 1 - comm.rank) as c2:
        assert c2.rank == comm.size - 1 - comm.rank and c2.size == comm.size
        x = np.array([c2.rank], dtype=np.int32)
        c2.all_reduce(x)
        assert x[0] == comm.size * (comm.size - 1) // 2
        assert c2.get_async_error() is None
    assert c2.handle is None
    with pytest.raises(zeppelin.InvalidUsage):
        c2.barrier()


def test_abort_reaches_the_peers(comm):
    # Rank 0 aborts a communicator of every rank; the others' next call on it
    # fails with RemoteError (at once, not after the timeout), and its
    # asynchronous error says so too. The parent communicator is untouched.
    sub = comm.split(0)
    if comm.rank == 0:
        sub.abort()
        assert sub.handle is None
    else:
        t0 = time.monotonic()
        with pytest.raises(zeppelin.RemoteError):
            sub.barrier()
        assert time.monotonic() - t0 < min(10.0, float(os.environ.get("ZP_TIMEOUT", "300")) / 2)
        assert isinstance(sub.get_async_error(), zeppelin.RemoteError)
        sub.destroy()
    still_works(comm)


# ---- bad inputs: the right exception, and the communicator still works ----
class FakeCudaArray:
    """A DLPack producer that claims CUDA memory (torch here has no CUDA)."""

    class _DLManaged(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32),
                    ("ndim", ctypes.c_int32), ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                    ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                    ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64),
                    ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]

    def __init__(self, n):
        self.mem = (ctypes.c_float * n)()
        self.shape = (ctypes.c_int64 * 1)(n)
        self.t = self._DLManaged(ctypes.addressof(self.mem), 2, 0, 1, 2, 32, 1, self.shape, None, 0, None, None)

    def __dlpack__(self, stream=None):
        new = ctypes.pythonapi.PyCapsule_New
        new.restype, new.argtypes = ctypes.py_object, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
        return new(ctypes.addressof(self.t), b"dltensor", None)


def bad_calls(comm):
    n, me = comm.size, comm.rank
    f32, i32 = torch.zeros(4 * n), torch.zeros(4 * n, dtype=torch.int32)
    ro = np.zeros(4 * n, dtype=np.float32)
    ro.flags.writeable = False
    A, U = zeppelin.InvalidArgument, zeppelin.InvalidUsage
    return [
        ("dtypes differ", A, lambda: comm.alltoallv(f32, [4] * n, i32, [4] * n)),
        ("non-contiguous", A, lambda: comm.all_reduce(torch.zeros(4, 4).t())),
        ("non-contiguous numpy", A, lambda: comm.all_reduce(np.zeros((4, 4))[:, 1])),
        ("bool dtype", A, lambda: comm.all_reduce(torch.zeros(4, dtype=torch.bool))),
        ("complex dtype", A, lambda: comm.all_reduce(np.zeros(4, dtype=np.complex64))),
        ("read-only output", A, lambda: comm.all_reduce(np.zeros(4 * n, np.float32), out=ro)),
        ("counts too few", A, lambda: comm.alltoallv(f32, [4] * (n - 1), f32.clone(), [4] * n)),
        ("negative count", A, lambda: comm.alltoallv(f32, [-1] + [4] * (n - 1), f32.clone(), [4] * n)),
        ("send block past the end", A, lambda: comm.alltoallv(f32, [5] * n, f32.clone(), [4] * n)),
        ("recv block past the end", A, lambda: comm.alltoallv(f32, [4] * n, torch.zeros(3), [4] * n)),
        ("wrong all_gather length", A, lambda: comm.all_gather(f32, torch.zeros(4 * n * n - 1))),
        ("wrong reduce_scatter length", A, lambda: comm.reduce_scatter(f32, torch.zeros(5))),
        ("out length differs", A, lambda: comm.all_reduce(f32, out=torch.zeros(3))),
        ("peer out of range", A, lambda: comm.send(f32, n)),
        ("root out of range", A, lambda: comm.broadcast(f32, root=-1)),
        ("unknown op", A, lambda: comm.all_reduce(f32, op="median")),
        ("not a buffer", A, lambda: comm.all_reduce("abc")),
        ("meta tensor", A, lambda: comm.all_reduce(torch.zeros(4, device="meta"))),
        ("CUDA memory without a device data plane", A, lambda: comm.all_reduce(FakeCudaArray(8))),
        ("stream for host memory", A, lambda: comm.all_reduce(f32, stream=1)),
        # Checked in C, across ranks: every rank fails with InvalidUsage, or
        # InvalidArgument on the rank whose argument was bad.
        ("ranks disagree on counts", U,
         lambda: comm.alltoallv(f32, [4 if p != (me + 1) % n or me != 0 else 3 for p in range(n)], f32.clone(),
                                [4] * n)),
        ("ranks disagree on all_reduce count", U,
         lambda: comm.all_reduce(torch.zeros(5 if me == n - 1 else 6))),
    ]


@pytest.mark.parametrize("i", range(22))
def test_bad_input_raises_and_comm_still_works(comm, i):
    cases = bad_calls(comm)
    assert len(cases) == 22
    name, exc, call = cases[i]
    with pytest.raises(exc) as info:
        call()
    assert str(info.value), name
    assert isinstance(info.value, zeppelin.ZeppelinError)
    still_works(comm)


# ---- plans, layouts, remaps ----
def batch(comm, key):
    g = rng("batch", key)
    return [int(x) for x in g.integers(1, 3000, size=int(g.integers(comm.size, 3 * comm.size)))]


def test_plan_layouts_cover_the_batch(comm):
    lens = batch(comm, "plan")
    plan = zeppelin.plan_batch(lens, comm, causal=True)
    assert plan.nranks == comm.size and plan.lengths == lens
    for lay in (plan.attention_layout, plan.linear_layout):
        every = sorted(i for r in range(comm.size) for i in lay.index_list(r))
        assert every == list(range(sum(lens)))
        assert sum(lay.tokens_per_rank) == sum(lens)
    # linear: balanced within one token
    tpr = plan.linear_layout.tokens_per_rank
    assert max(tpr) - min(tpr) <= 1
    # the same plan on every rank
    mine = np.array([zlib.crc32(repr([plan.attention_layout.segments(r) for r in range(comm.size)]).encode())],
                    dtype=np.int64)
    allh = np.zeros(comm.size, dtype=np.int64)
    comm.all_gather(mine, allh)
    assert (allh == allh[0]).all()
    for s in range(len(lens)):
        cls, ranks = plan.sequence(s)
        assert cls in (zeppelin.LOCAL, zeppelin.INTRA_NODE, zeppelin.INTER_NODE) and len(ranks) >= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, "float64"])
def test_remap_both_ways(comm, dtype):
    lens = batch(comm, ("remap", str(dtype)))
    plan = zeppelin.plan_batch(lens, comm)
    hidden = 24
    g = rng("remapdata", str(dtype))
    packed = values(g, sum(lens) * hidden, dtype).reshape(sum(lens), hidden)
    lin, att = plan.linear_layout, plan.attention_layout
    remap = zeppelin.Remap(lin, att, comm)
    x = lin.shard(packed, comm.rank)
    y = remap.execute(x)
    np.testing.assert_array_equal(as_np(y), as_np(att.shard(packed, comm.rank)))
    back = poison_like(x)
    remap.execute(y, back, inverse=True)
    np.testing.assert_array_equal(as_np(back), as_np(x))
    # a wrong row count is refused before C, and the remap still works
    with pytest.raises(zeppelin.InvalidArgument):
        remap.execute(x[:-1] if len(x) else packed[:1])
    np.testing.assert_array_equal(as_np(remap(x)), as_np(y))


def test_user_layout_and_unshard(comm):
    n = comm.size
    lens = [5 * n + 3, 2 * n]
    # sequence 0 cut into n pieces round the ranks; sequence 1 all on the last rank
    cuts = [i * lens[0] // n for i in range(n + 1)]
    segs = [[(0, cuts[r], cuts[r + 1] - cuts[r])] for r in range(n)]
    segs[-1].append((1, 0, lens[1]))
    lay = zeppelin.Layout.create(lens, segs)
    packed = torch.arange(sum(lens) * 2, dtype=torch.float32).reshape(-1, 2)
    shards = [lay.shard(packed, r) for r in range(n)]
    assert torch.equal(lay.unshard(shards), packed)
    with pytest.raises(zeppelin.InvalidArgument):
        zeppelin.Layout.create(lens, [[(0, 0, lens[0])]] + [[] for _ in range(n - 1)])  # sequence 1 nowhere


# ---- Ulysses ----
@pytest.mark.parametrize("q_heads,heads", [(8, 8), (8, 2), (5, 5), (6, 3)])
def test_ulysses_alltoall(comm, q_heads, heads):
    n, me = comm.size, comm.rank
    lens = batch(comm, ("ulysses", q_heads, heads))
    plan = zeppelin.plan_batch(lens, comm)
    lay, D = plan.attention_layout, 4
    g = rng("ulyssesdata", q_heads, heads)
    packed = torch.from_numpy(g.standard_normal((sum(lens), heads, D)).astype(np.float32))
    x = lay.shard(packed, me)
    lo, hi = zeppelin.ulysses_heads(me, n, q_heads, heads)
    y = zeppelin.ulysses_alltoall(x, lay, q_heads, heads, D, 0, comm)
    assert torch.equal(y, packed[:, lo:hi, :])
    back = zeppelin.ulysses_alltoall(y, lay, q_heads, heads, D, 1, comm)
    # heads held by several ranks (GQA) come back summed
    holders = torch.zeros(heads)
    for r in range(n):
        a, b = zeppelin.ulysses_heads(r, n, q_heads, heads)
        holders[a:b] += 1
    torch.testing.assert_close(back, x * holders.view(1, heads, 1), rtol=0, atol=1e-5)


# ---- rings ----
@pytest.mark.parametrize("bidirectional", [False, True])
def test_ring_exchange(comm, bidirectional):
    n, me = comm.size, comm.rank
    order = list(reversed(range(n)))
    pos = order.index(me)
    prev, nxt = order[(pos - 1) % n], order[(pos + 1) % n]
    with zeppelin.Ring(comm, order, bidirectional=bidirectional) as ring:
        for step in range(3):
            size = 1000 + 64 * step  # every rank's block the same size in a step
            send = np.full(size, me * 10 + step, dtype=np.int32)
            recv = np.zeros(size, dtype=np.int32)
            ring.start(send, recv)
            ring.wait()
            if bidirectional:
                half = size // 2
                assert (recv[:half] == prev * 10 + step).all() and (recv[half:] == nxt * 10 + step).all()
            else:
                assert (recv == prev * 10 + step).all()
        with pytest.raises(zeppelin.InvalidUsage):
            ring.wait()  # nothing in flight
    still_works(comm)


# ---- the attention driver against attention computed here ----
def reference_attention(q, k, v, lens, causal):
    """Softmax attention per sequence of a packed batch, float64; GQA by repeat."""
    H, K = q.shape[1], k.shape[1]
    out = np.zeros_like(q, dtype=np.float64)
    lse = np.zeros((H, q.shape[0]))
    at = 0
    for L in lens:
        qs, ks, vs = (a[at:at + L].astype(np.float64) for a in (q, k, v))
        for h in range(H):
            s = qs[:, h, :] @ ks[:, h // (H // K), :].T / np.sqrt(q.shape[2])
            if causal:
                s = np.where(np.tril(np.ones((L, L), bool)), s, -np.inf)
            m = s.max(axis=1, keepdims=True)
            p = np.exp(s - m)
            out[at:at + L, h, :] = (p / p.sum(axis=1, keepdims=True)) @ vs[:, h // (H // K), :]
            lse[h, at:at + L] = (m + np.log(p.sum(axis=1, keepdims=True)))[:, 0]
        at += L
    return out, lse


def test_attention_driver_forward(comm):
    n, me = comm.size, comm.rank
    lens = [int(x) for x in rng("attn").integers(1, 200, size=2 * n)]
    plan = zeppelin.plan_batch(lens, comm, q_heads=4, kv_heads=2, head_dim=8)
    lay = plan.attention_layout
    g = rng("attndata")
    q, k, v = (g.standard_normal((sum(lens), h, 8)).astype(np.float32) for h in (4, 2, 2))
    ref_out, ref_lse = reference_attention(q, k, v, lens, True)
    idx = np.array(lay.index_list(me), dtype=np.int64)
    attn = zeppelin.Attention(plan, comm, 4, 2, 8)
    T = lay.tokens(me)
    out, lse = np.full((T, 4, 8), np.nan, np.float32), np.full((4, T), np.nan, np.float32)
    attn.forward(q[idx], k[idx], v[idx], out, lse)
    np.testing.assert_allclose(out, ref_out[idx], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(lse, ref_lse[:, idx], rtol=1e-4, atol=1e-5)
    with pytest.raises(zeppelin.InvalidArgument):
        attn.forward(q[idx].astype(np.float64), k[idx], v[idx], out, lse)
    attn.close()
    still_works(comm)


def test_rail_report_is_empty_without_routing(comm):
    # One node: nothing is routed, so there are no rails to report.
    assert comm.rail_report() == []


def test_wait_report_names_a_rank_that_lags(comm):
    # The last rank sleeps 50 ms before each of 100 all-reduces; every other
    # rank finds it the one it waited for.
    laggard = comm.size - 1
    x = torch.ones(8)
    for _ in range(100):
        if comm.rank == laggard:
            time.sleep(0.05)
        comm.all_reduce(x)
    calls, entries = comm.wait_report()
    assert calls == 100
    if comm.rank != laggard:
        assert entries and entries[0]["rank"] == laggard, entries
        assert entries[0]["calls_last"] >= 90, entries
        assert entries[0]["total_wait"] > 100 * 0.04, entries
    for e in entries:
        assert set(e) == {"rank", "calls_last", "total_wait", "max_wait"}
        assert 0 <= e["max_wait"] <= e["total_wait"]
