"""The bindings in one process: the library's location, the exceptions,
buffers and dtypes, plans built from a rank count, and the attention driver
with Python kernels on a one-rank communicator."""

import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

import zeppelin
from zeppelin import _lib

PYTHON_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "python")


@pytest.fixture(scope="module")
def comm():
    c = zeppelin.Communicator.from_unique_id(zeppelin.get_unique_id(), 1, 0)
    yield c
    c.destroy()


def run_python(code, env_extra=None, drop=()):
    env = dict(os.environ)
    env["PYTHONPATH"] = PYTHON_DIR
    for k in drop:
        env.pop(k, None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          cwd="/")


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Every launcher's variables, cleared before a test describes its own job.
LAUNCHER_VARS = ("ZP_RANK", "ZP_NRANKS", "ZP_UNIQUE_ID", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                 "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_LOCALID",
                 "SLURM_NTASKS")


def start_ranks(code, job_env, rank_env, stdin=None):
    """Two processes running code, in the job job_env describes (launcher
    variables of the test's own process cleared), rank r with rank_env(r)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(job_env, PYTHONPATH=PYTHON_DIR, ZP_TIMEOUT="30")
    return [subprocess.Popen([sys.executable, "-c", code], env=dict(env, **rank_env(r)), stdin=stdin,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd="/") for r in range(2)]


def test_every_result_code_has_its_class():
    classes = [zeppelin.error_class(c) for c in range(1, 8)]
    assert classes == [zeppelin.CudaError, zeppelin.ZpSystemError, zeppelin.InternalError, zeppelin.InvalidArgument,
                       zeppelin.InvalidUsage, zeppelin.RemoteError, zeppelin.InProgress]
    for code, cls in enumerate(classes, start=1):
        assert issubclass(cls, zeppelin.ZeppelinError) and cls.code == code
        # the library's own name for the code is what the class stands for
        assert _lib.lib.zpGetErrorString(code).decode()
    assert zeppelin.error_class(99) is zeppelin.ZeppelinError
    assert issubclass(zeppelin.InvalidArgument, ValueError)
    assert not issubclass(zeppelin.ZpSystemError, SystemError)


def test_a_c_error_carries_the_library_text():
    # zpLayoutCreate refuses a token on no rank; the exception holds C's own message.
    with pytest.raises(zeppelin.InvalidArgument) as info:
        zeppelin.Layout.create([4], [[(0, 0, 3)]])
    assert info.value.code == 4
    assert info.value.message == str(info.value)
    assert info.value.message == _lib.lib.zpGetLastError(None).decode()
    assert "token" in info.value.message or "seq" in info.value.message


def test_library_location():
    assert os.path.samefile(zeppelin.library_path, os.environ.get("ZEPPELIN_LIBRARY", zeppelin.library_path))
    r = run_python("import zeppelin", {"ZEPPELIN_LIBRARY": "/nonexistent/libzeppelin.so"})
    assert r.returncode != 0 and "cannot load libzeppelin.so" in r.stderr and "/nonexistent" in r.stderr


def test_imports_and_works_without_torch_or_numpy():
    code = ("import sys; sys.modules['torch'] = None; sys.modules['numpy'] = None\n"
            "import zeppelin\n"
            "c = zeppelin.Communicator.from_unique_id(zeppelin.get_unique_id(), 1, 0)\n"
            "import array; x = array.array('d', [1.5, 2.5]); c.all_reduce(x, op='max')\n"
            "out = bytearray(8); c.alltoallv(b'zeppelin', [8], out, [8]); assert out == b'zeppelin'\n"
            "c.destroy(); print('ok', list(x))")
    r = run_python(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok [1.5, 2.5]"


def test_the_torch_parts_say_how_to_get_torch():
    """Without torch, the modules built on it fail to import with advice
    (a venv with the system's packages, or pip install torch), not a bare
    ModuleNotFoundError."""
    for module in ("zeppelin.distributed", "zeppelin.autograd", "zeppelin.kernels", "zeppelin.ring_flash_attn"):
        r = run_python("import sys; sys.modules['torch'] = None\nimport %s" % module)
        assert r.returncode != 0, module
        assert "needs PyTorch" in r.stderr and "venv --system-site-packages" in r.stderr, (module, r.stderr[-600:])


def test_zp_debug_version_prints_the_version_line_once():
    code = ("import zeppelin\n"
            "for _ in range(2):\n"
            "    c = zeppelin.Communicator.from_unique_id(zeppelin.get_unique_id(), 1, 0); c.barrier(); c.destroy()\n")
    r = run_python(code, env_extra={"ZP_DEBUG": "VERSION"})
    assert r.returncode == 0, r.stderr
    import zeppelin
    lines = [x for x in r.stderr.splitlines() if "ZP INFO Zeppelin version" in x]
    assert len(lines) == 1 and lines[0].endswith("Zeppelin version %d.%d.%d" % zeppelin.version()), r.stderr
    assert "ZP INFO" not in run_python(code, drop=("ZP_DEBUG",)).stderr


def test_the_public_api_has_type_hints():
    """Every public function and method (zeppelin.__all__, the autograd
    functions, the backend, the kernels) annotates each parameter but self and cls, and its
    return: the package ships py.typed, so type checkers take its hints as
    complete. (The python_types test runs mypy over them.)"""
    import enum
    import inspect
    import zeppelin.autograd
    import zeppelin.distributed
    import zeppelin.kernels

    missing = []

    def check(name, fn):
        sig = inspect.signature(fn)
        for p in sig.parameters.values():
            if p.name in ("self", "cls") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if p.annotation is inspect.Parameter.empty:
                missing.append("%s(%s)" % (name, p.name))
        if sig.return_annotation is inspect.Signature.empty:
            missing.append("%s: return" % name)

    public = [(zeppelin, zeppelin.__all__),
              (zeppelin.autograd, ["plan_remap", "remap", "ulysses", "ring_attention"]),
              (zeppelin.distributed, ["ProcessGroupZeppelin", "communicator"]),
              (zeppelin.kernels, ["BlockKernel", "TorchKernel", "FlashKernel", "flash_available", "kernel_of"])]
    checked = 0
    for mod, names in public:
        for name in names:
            obj = getattr(mod, name)
            if inspect.isfunction(obj):
                check(name, obj)
                checked += 1
            elif inspect.isclass(obj) and not issubclass(obj, (BaseException, enum.Enum)):
                for mname, m in vars(obj).items():
                    if mname.startswith("_") and mname != "__init__":
                        continue
                    f = m.__func__ if isinstance(m, (classmethod, staticmethod)) else getattr(m, "fget", m)
                    if inspect.isfunction(f):
                        check(name + "." + mname, f)
                        checked += 1
    assert checked > 60, checked  # the walk found the API
    assert not missing, missing


def test_dtypes():
    for t, code in [(torch.int8, 0), (torch.uint8, 1), (torch.int32, 2), (torch.int64, 4), (torch.float16, 6),
                    (torch.float32, 7), (torch.float64, 8), (torch.bfloat16, 9)]:
        assert zeppelin.dtype_of(t) == code and zeppelin.dtype_of(torch.zeros(1, dtype=t)) == code
    for name, code in [("int8", 0), ("uint8", 1), ("int32", 2), ("uint32", 3), ("int64", 4), ("uint64", 5),
                       ("float16", 6), ("float32", 7), ("float64", 8)]:
        assert zeppelin.dtype_of(np.dtype(name)) == code
        assert _lib.lib.zpTypeSize(code) == np.dtype(name).itemsize
    assert zeppelin.dtype_of(torch.bool) is None and zeppelin.dtype_of(np.complex64) is None


def test_one_rank_calls_and_offsets(comm):
    assert (comm.rank, comm.size) == (0, 1)
    # a view's data_ptr includes its offset
    base = torch.arange(10, dtype=torch.float32)
    out = torch.zeros(4)
    comm.alltoallv(base[3:7], [4], out, [4])
    assert out.tolist() == [3, 4, 5, 6]
    # numpy slices too, and a big-endian array is refused
    a = np.arange(10, dtype=np.int64)
    o = np.zeros(3, dtype=np.int64)
    comm.broadcast(a[5:8], out=o)
    assert o.tolist() == [5, 6, 7]
    with pytest.raises(zeppelin.InvalidArgument):
        comm.all_reduce(np.zeros(3, dtype=">f4"))


def test_counts_must_be_integers(comm):
    """Counts and displacements that are not integers (4.7, '4') are refused,
    not truncated or parsed; NumPy and torch integers pass."""
    out = torch.zeros(4)
    for bad in ([4.7], ["4"], [None]):
        with pytest.raises(zeppelin.InvalidArgument, match="integers"):
            comm.alltoallv(torch.arange(4, dtype=torch.float32), bad, out, [4])
        with pytest.raises(zeppelin.InvalidArgument, match="integers"):
            comm.alltoallv(torch.arange(4, dtype=torch.float32), [4], out, [4], rdispls=bad)
    for good in ([np.int64(4)], np.array([4]), torch.tensor([4])):
        out.zero_()
        comm.alltoallv(torch.arange(4, dtype=torch.float32), good, out, good)
        assert out.tolist() == [0, 1, 2, 3]


def test_outputs_over_read_only_memory_are_refused(comm, tmp_path):
    """A CPU tensor over a read-only mapping as an output: refused before any
    C call (writing it would kill the process with SIGSEGV). torch keeps no
    read-only flag, so the pages are asked. (A tensor over a bytes object is
    writable memory and is not refused: docs/reliability.md, item 9.)"""
    import mmap
    import warnings

    src = torch.arange(64, dtype=torch.uint8)
    path = tmp_path / "ro"
    path.write_bytes(b"\1" * 3 * 4096)
    with open(path, "rb") as f:
        ro = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        with warnings.catch_warnings():  # torch's own warning about such buffers
            warnings.simplefilter("ignore", UserWarning)
            outs = [torch.frombuffer(ro, dtype=torch.uint8, count=64),  # first page
                    torch.frombuffer(ro, dtype=torch.uint8, count=64, offset=2 * 4096 + 100)]  # last page
        for out in outs:
            with pytest.raises(zeppelin.InvalidArgument, match="read-only"):
                comm.broadcast(src, out=out)
            with pytest.raises(zeppelin.InvalidArgument, match="read-only"):
                comm.all_reduce(out)
            comm.broadcast(out, out=torch.zeros(64, dtype=torch.uint8))  # as an input it is fine
        del outs, out
        ro.close()
    assert path.read_bytes() == b"\1" * 3 * 4096
    # a tensor that starts on a writable page and ends on a read-only one
    import ctypes
    rw = mmap.mmap(-1, 2 * 4096)
    base = ctypes.addressof(ctypes.c_char.from_buffer(rw))
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.mprotect(ctypes.c_void_p(base + 4096), ctypes.c_size_t(4096), mmap.PROT_READ) == 0
    straddling = torch.frombuffer(rw, dtype=torch.uint8, offset=4096 - 32, count=64)
    with pytest.raises(zeppelin.InvalidArgument, match="read-only"):
        comm.broadcast(src, out=straddling)
    del straddling
    libc.mprotect(ctypes.c_void_p(base + 4096), ctypes.c_size_t(4096), mmap.PROT_READ | mmap.PROT_WRITE)
    rw.close()
    # writable memory of every kind is taken, twice (the second time from the checked tensors' cache)
    for out in (torch.zeros(64, dtype=torch.uint8), torch.frombuffer(bytearray(64), dtype=torch.uint8),
                torch.from_numpy(np.zeros(64, dtype=np.uint8)), torch.zeros(128, dtype=torch.uint8)[64:]):
        for _ in range(2):
            out.zero_()
            comm.broadcast(src, out=out)
            assert out.tolist() == list(range(64))


def test_plans_from_a_rank_count_and_from_rings():
    lens = [1000, 300, 40, 7, 2000]
    plan = zeppelin.plan_batch(lens, 4, nodes=2)
    assert plan.nranks == 4 and plan.lengths == lens and plan.causal
    for lay in (plan.attention_layout, plan.linear_layout):
        assert sorted(i for r in range(4) for i in lay.index_list(r)) == list(range(sum(lens)))
        assert lay.indices(1).dtype == torch.int64
    rings = [[0, 1, 2, 3], [1], [2], [3], [3, 2]]
    p2 = zeppelin.BatchPlan.from_rings(lens, rings, 4, causal=False)
    for s, ring in enumerate(rings):
        assert p2.sequence(s)[1] == ring
    # sequence 0 is split over all 4 ranks, 250 tokens each (not causal: contiguous quarters)
    assert [(q, a, c) for r in range(4) for (q, a, c) in p2.attention_layout.segments(r) if q == 0] == \
        [(0, 0, 250), (0, 250, 250), (0, 500, 250), (0, 750, 250)]
    with pytest.raises(zeppelin.InvalidArgument):
        zeppelin.BatchPlan.from_rings(lens, [[0, 0]] + rings[1:], 4)  # a rank twice in a ring
    with pytest.raises(zeppelin.InvalidArgument):
        zeppelin.plan_batch([], 4)


def numpy_forward(block):
    """A block kernel in NumPy (float64 inside), the reference's contract."""
    q, k, v = block.array("q").astype(np.float64), block.array("k"), block.array("v")
    H, K = block.q_heads, block.kv_heads
    out, lse = block.array("out"), block.array("lse")
    for h in range(H):
        s = q[:, h, :] @ k[:, h // (H // K), :].T.astype(np.float64) * block.scale
        if block.mask == 1:
            s = np.where(np.tril(np.ones(s.shape, bool)), s, -np.inf)
        m = s.max(axis=1, keepdims=True)
        p = np.exp(s - m)
        out[:, h, :] = (p / p.sum(axis=1, keepdims=True)) @ v[:, h // (H // K), :]
        lse[h, :] = (m + np.log(p.sum(axis=1, keepdims=True)))[:, 0]


def test_python_kernels_match_the_reference_and_their_exceptions_surface(comm):
    lens = [37, 5, 64]
    plan = zeppelin.BatchPlan.from_rings(lens, [[0]] * 3, 1)
    g = np.random.default_rng(7)
    T = sum(lens)
    q, k, v = (g.standard_normal((T, h, 16)).astype(np.float32) for h in (4, 2, 2))
    ref = zeppelin.Attention(plan, comm, 4, 2, 16)
    o1, l1 = np.zeros((T, 4, 16), np.float32), np.zeros((4, T), np.float32)
    ref.forward(q, k, v, o1, l1)
    mine = zeppelin.Attention(plan, comm, 4, 2, 16, forward=numpy_forward)
    o2, l2 = np.full_like(o1, np.nan), np.full_like(l1, np.nan)
    mine.forward(q, k, v, o2, l2)
    np.testing.assert_allclose(o2, o1, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(l2, l1, rtol=1e-5, atol=1e-6)

    def failing(block):
        raise ValueError("kernel broke on purpose")
    bad = zeppelin.Attention(plan, comm, 4, 2, 16, forward=failing)
    with pytest.raises(zeppelin.ZeppelinError) as info:
        bad.forward(q, k, v, o2, l2)
    assert isinstance(info.value.__cause__, ValueError)
    assert "kernel broke on purpose" in str(info.value)
    mine.forward(q, k, v, o2, l2)  # the communicator and the other driver still work
    np.testing.assert_allclose(o2, o1, rtol=1e-5, atol=1e-6)


def test_init_under_an_srun_environment():
    # Two processes described as srun describes its tasks; the master is the
    # first host of the compressed node list (127.0.0.[1-2] -> 127.0.0.1).
    code = ("import zeppelin, numpy as np\n"
            "with zeppelin.init() as c:\n"
            "    x = np.array([c.rank + 1], dtype=np.int64); c.all_reduce(x)\n"
            "    print(c.rank, c.size, x[0])\n")
    procs = start_ranks(code, dict(SLURM_NTASKS="2", SLURM_STEP_NODELIST="127.0.0.[1-2]", SLURM_JOB_ID="4242",
                                   ZP_MASTER_PORT=str(free_port())),
                        lambda r: dict(SLURM_PROCID=str(r), SLURM_LOCALID=str(r)))
    outs = [p.communicate(timeout=60) for p in procs]
    for r, (p, (out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0, err
        assert out.split() == [str(r), "2", "3"]


def test_a_caught_error_prints_nothing_unless_asked():
    # The exception carries the message: the library does not print it as a
    # WARN line too (ZP_DEBUG_ERRORS=INFO, the package's default), unless
    # the user asks for WARN or for INFO logging.
    code = ("import zeppelin, numpy as np\n"
            "c = zeppelin.Communicator.from_unique_id(zeppelin.get_unique_id(), 1, 0)\n"
            "x = np.zeros(4, dtype=np.float32)\n"
            "try:\n"
            "    c.all_gather(x[0:2], x[1:3])  # overlapping buffers: refused by the library\n"
            "except zeppelin.InvalidArgument as e:\n"
            "    print('caught', e)\n"
            "c.destroy()\n")
    quiet = run_python(code, drop=("ZP_DEBUG", "ZP_DEBUG_ERRORS"))
    assert quiet.returncode == 0 and "caught" in quiet.stdout, quiet.stderr
    assert "overlap" in quiet.stdout, quiet.stdout
    assert "ZP WARN" not in quiet.stderr and "overlap" not in quiet.stderr, quiet.stderr
    for extra in ({"ZP_DEBUG_ERRORS": "WARN"}, {"ZP_DEBUG": "INFO"}):
        loud = run_python(code, env_extra=extra, drop=("ZP_DEBUG", "ZP_DEBUG_ERRORS"))
        assert loud.returncode == 0 and "overlap" in loud.stderr, (extra, loud.stderr)


def test_ctrl_c_ends_a_blocked_call_within_a_second():
    # Rank 0 blocks in an all-reduce that rank 1 has not joined; Ctrl-C
    # (SIGINT) must raise KeyboardInterrupt in rank 0 within a second, and
    # rank 1's all-reduce must then fail at once, not after ZP_TIMEOUT.
    import signal
    port = free_port()
    code = ("import sys, time, zeppelin, numpy as np\n"
            "c = zeppelin.init()\n"
            "x = np.ones(4, dtype=np.float32)\n"
            "print('waiting', flush=True)\n"
            "if c.rank == 1:\n"
            "    sys.stdin.readline()\n"
            "    t = time.monotonic()\n"
            "    try:\n"
            "        c.all_reduce(x)\n"
            "    except zeppelin.RemoteError as e:\n"
            "        print('remote %.2f' % (time.monotonic() - t), str(e), flush=True)\n"
            "else:\n"
            "    try:\n"
            "        c.all_reduce(x)\n"
            "    except KeyboardInterrupt as e:\n"
            "        print('interrupted', str(e), flush=True)\n"
            "    try:\n"
            "        c.all_reduce(x)\n"
            "    except zeppelin.ZeppelinError:\n"
            "        print('broken', flush=True)\n"
            "    try:\n"
            "        time.sleep(0.2); import os, signal; os.kill(os.getpid(), signal.SIGINT); time.sleep(5)\n"
            "    except KeyboardInterrupt:\n"
            "        print('outside a call too', flush=True)\n"
            "c.destroy()\n")
    procs = start_ranks(code, dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port - 1), ZP_MASTER_PORT=str(port),
                                   WORLD_SIZE="2"),
                        lambda r: dict(RANK=str(r), LOCAL_RANK=str(r)), stdin=subprocess.PIPE)
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "waiting", p.stderr.read()
        time.sleep(0.5)  # rank 0 is in its all-reduce by now
        t = time.monotonic()
        procs[0].send_signal(signal.SIGINT)
        line = procs[0].stdout.readline()
        took = time.monotonic() - t
        assert line.startswith("interrupted"), line + procs[0].stderr.read()
        assert "interrupted" in line[len("interrupted"):], line
        assert took < 1.0, "KeyboardInterrupt came %.2f s after Ctrl-C" % took
        procs[1].stdin.write("go\n")
        procs[1].stdin.close()
        # Read on through the same buffered files: communicate() would skip
        # what readline() has already buffered.
        out1, err1 = procs[1].stdout.read(), procs[1].stderr.read()
        assert out1.startswith("remote "), out1 + err1
        assert float(out1.split()[1]) < 5.0, out1
        out0, err0 = procs[0].stdout.read(), procs[0].stderr.read()
        for p in procs:
            p.wait(timeout=60)
        assert out0.split("\n")[:2] == ["broken", "outside a call too"], out0 + err0
        assert procs[0].returncode == 0 and procs[1].returncode == 0, err0 + err1
    finally:
        for p in procs:
            p.kill()


def test_cu_seqlens_and_thd_shardings():
    # The packed-batch inputs of flash-attn / TE / Megatron: int32 cu_seqlens.
    cu = torch.tensor([0, 8, 24, 32], dtype=torch.int32)
    assert zeppelin.lengths_from_cu_seqlens(cu) == [8, 16, 8]
    plan = zeppelin.plan_batch(cu_seqlens=cu, comm_or_nranks=4)
    assert plan.linear_layout.lengths == [8, 16, 8]
    with pytest.raises(zeppelin.InvalidArgument, match="cu_seqlens"):
        zeppelin.plan_batch(cu, 4)  # offsets passed as lengths: told what they look like
    for bad in ([0], [1, 8], [0, 8, 8], [0, 8, 4]):
        with pytest.raises(zeppelin.InvalidArgument):
            zeppelin.lengths_from_cu_seqlens(bad)
    # Contiguous: rank r holds chunk r of every sequence. Zigzag: chunks r
    # and 2n-1-r. Every token on exactly one rank, in the packed order given.
    lay = zeppelin.Layout.from_thd(cu, 2)
    assert lay.segments(0) == [(0, 0, 4), (1, 0, 8), (2, 0, 4)]
    assert lay.segments(1) == [(0, 4, 4), (1, 8, 8), (2, 4, 4)]
    zig = zeppelin.Layout.from_thd(cu, 2, mode="zigzag")
    assert zig.segments(0) == [(0, 0, 2), (0, 6, 2), (1, 0, 4), (1, 12, 4), (2, 0, 2), (2, 6, 2)]
    assert zig.segments(1) == [(0, 2, 2), (0, 4, 2), (1, 4, 4), (1, 8, 4), (2, 2, 2), (2, 4, 2)]
    packed = torch.arange(32)
    assert torch.equal(zig.unshard([zig.shard(packed, r) for r in range(2)]), packed)
    assert zig.local_cu_seqlens(1) == ([0, 2, 4, 8, 12, 14, 16], 4)
    with pytest.raises(zeppelin.InvalidArgument, match="multiple of 4"):
        zeppelin.Layout.from_thd([0, 6], 2, mode="zigzag")


def test_ring_order_of_a_planned_and_a_user_plan():
    # The planner's plan: every sequence once (its default order until the
    # planner schedules one); a new order reads back.
    lens = [1000, 300, 40, 7, 2000]
    plan = zeppelin.plan_batch(lens, 4, nodes=2)
    order = plan.ring_order()
    assert sorted(order) == list(range(len(lens)))
    plan.set_ring_order(list(reversed(order)))
    assert plan.ring_order() == list(reversed(order))
    # A user's plan: inter-node rings, intra-node rings, locals, each by id;
    # then its own order (a NumPy array works too).
    rings = [[0, 1], [2], [1, 2], [3], [3, 0]]
    p2 = zeppelin.BatchPlan.from_rings(lens, rings, 4, ranks_per_node=2)
    assert p2.ring_order() == [2, 4, 0, 1, 3]
    p2.set_ring_order(np.array([3, 0, 4, 1, 2]))
    assert p2.ring_order() == [3, 0, 4, 1, 2]
    for bad in ([0, 1, 2, 3], [0, 1, 2, 2, 4], [0, 1, 5, 3, 4], [-1, 0, 1, 2, 3], [], ["a"] * 5):
        with pytest.raises(zeppelin.InvalidArgument):
            p2.set_ring_order(bad)
        assert p2.ring_order() == [3, 0, 4, 1, 2]
    with pytest.raises(zeppelin.InvalidArgument, match="twice"):
        p2.set_ring_order([0, 0, 1, 2, 3])
