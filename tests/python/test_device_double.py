"""The package's device path, against the CUDA/NCCL test double: every rank
runs this file under zprun with ZEPPELIN_LIBRARY set to libzeppelin_double.so
(the library linked with tests/fakecuda) and FAKECUDA_LIB to the double.

torch here has no CUDA, so the device buffers are the double's own memory,
handed to the package through DLPack (device type CUDA), as CuPy's or JAX's
arrays would be; the double kills a process that touches them from the host.
What only a GPU can check: torch CUDA tensors and torch's current stream
(the same calls, with the stream taken from the tensor), flash-attention's
kernels, and the device kernels' speed.
"""

import ctypes
import math
import os
import zlib

import pytest
import torch

import zeppelin
from zeppelin import _buffers

SEED = int(os.environ.get("ZP_TEST_SEED", "20261127"))
cuda = ctypes.CDLL(os.environ["FAKECUDA_LIB"])
cuda.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
cuda.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
cuda.cudaFree.argtypes = [ctypes.c_void_p]
cuda.cudaStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
cuda.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]
cuda.cudaStreamDestroy.argtypes = [ctypes.c_void_p]
cuda.cudaMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
cuda.cudaSetDevice.argtypes = [ctypes.c_int]
H2D, D2H = 1, 2


def ok(r, what):
    assert r == 0, "%s: cudaError %d" % (what, r)


class _DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", _buffers._DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]
_DL = {torch.float32: (2, 32), torch.bfloat16: (4, 16), torch.float16: (2, 16)}


class DeviceArray:
    """Device memory of the double as a DLPack object; filled from and read
    into torch CPU tensors by cudaMemcpy, poisoned (0xFF: NaN) when made."""

    def __init__(self, shape, dtype, device):
        self.shape, self.dtype, self.device = tuple(shape), dtype, device
        self.numel = math.prod(self.shape)
        self.nbytes = self.numel * torch.tensor([], dtype=dtype).element_size()
        p = ctypes.c_void_p()
        ok(cuda.cudaMalloc(ctypes.byref(p), self.nbytes), "cudaMalloc")
        self.ptr = p.value
        ok(cuda.cudaMemset(self.ptr, 0xFF, self.nbytes), "cudaMemset")
        self._shape = (ctypes.c_int64 * len(self.shape))(*self.shape)
        code, bits = _DL[dtype]
        t = _buffers._DLTensor(self.ptr, _buffers._DLDevice(2, device), len(self.shape),
                               _buffers._DLDataType(code, bits, 1), self._shape, None, 0)
        self._managed = _DLManagedTensor(t, None, None)

    @classmethod
    def of(cls, tensor, device):
        a = cls(tensor.shape, tensor.dtype, device)
        host = tensor.contiguous()
        ok(cuda.cudaMemcpy(a.ptr, host.data_ptr(), a.nbytes, H2D), "cudaMemcpy to device")
        return a

    def __dlpack__(self, stream=None):
        return _capsule_new(ctypes.addressof(self._managed), b"dltensor", None)

    def __dlpack_device__(self):
        return (2, self.device)

    def cpu(self):
        out = torch.empty(self.shape, dtype=self.dtype)
        ok(cuda.cudaMemcpy(out.data_ptr(), self.ptr, self.nbytes, D2H), "cudaMemcpy to host")
        return out

    def __del__(self):
        cuda.cudaFree(self.ptr)


@pytest.fixture(scope="module")
def comm():
    c = zeppelin.init()
    ok(cuda.cudaSetDevice(c.rank), "cudaSetDevice")  # the communicator's device: zprun's local rank
    yield c
    c.destroy()


def gen(*key):
    return torch.Generator().manual_seed(SEED ^ zlib.crc32(repr(key).encode()))


def run(attn, q, k, v, dout, make, stream=None):
    """Forward, then backward from its own out and lse; make(shape, dtype)
    gives the outputs. Returns out, lse, dq, dk, dv."""
    T, H, d = q.shape
    out, lse = make((T, H, d), q.dtype), make((H, T), torch.float32)
    attn.forward(q, k, v, out, lse, stream=stream)
    dq, dk, dv = make(q.shape, q.dtype), make(k.shape, k.dtype), make(v.shape, v.dtype)
    attn.backward(q, k, v, out, lse, dout, dq, dk, dv, stream=stream)
    return out, lse, dq, dk, dv


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_device_ring_attention_matches_the_host_driver(comm, dtype):
    """The C device driver on the double's memory (reference kernels on the
    device, the whole pass on one stream) against the host driver: on the
    same 16-bit (or float32) buffers, the same bytes (the double runs the
    same functors in the same order; a GPU adds gradients atomically, in any
    order); and against the host driver in float32 on the same values, out
    and the gradients correctly rounded (within half a unit in the last
    place of dtype: both round a float32 result once) and lse equal. Every
    element of every output is written (they start as NaN)."""
    n, me = comm.size, comm.rank
    assert comm.has_device, "the double's library has a device data plane"
    lengths = [4 * n + 3, 9, 2 * n, 5]
    rings = [list(range(n)), [0], [n - 1 - i for i in range(n)], [n - 1]]
    plan = zeppelin.BatchPlan.from_rings(lengths, rings, n, causal=True)
    H, Hk, d = 4, 2, 8
    mine = plan.attention_layout.indices(me)
    g = gen("attn", str(dtype))
    q, k, v, dout = (torch.randn(sum(lengths), h, d, generator=g).to(dtype)[mine].contiguous()
                     for h in (H, Hk, Hk, H))
    code = {torch.bfloat16: zeppelin.BFLOAT16, torch.float16: zeppelin.FLOAT16, torch.float32: zeppelin.FLOAT32}

    s = ctypes.c_void_p()
    ok(cuda.cudaStreamCreate(ctypes.byref(s)), "cudaStreamCreate")
    with zeppelin.Attention(plan, comm, H, Hk, d, dtype=code[dtype]) as attn:
        got = run(attn, *(DeviceArray.of(t, me) for t in (q, k, v, dout)),
                  lambda shape, dt: DeviceArray(shape, dt, me), stream=s.value)
        ok(cuda.cudaStreamSynchronize(s.value), "cudaStreamSynchronize")
    cuda.cudaStreamDestroy(s.value)
    got = [a.cpu() for a in got]
    names = ("out", "lse", "dq", "dk", "dv")
    for name, t in zip(names, got):
        assert torch.isfinite(t.float()).all(), "%s has elements never written (the NaN poison is left)" % name

    with zeppelin.Attention(plan, comm, H, Hk, d, dtype=code[dtype]) as attn:
        same = run(attn, q, k, v, dout, lambda shape, dt: torch.full(shape, float("nan"), dtype=dt))
    for name, a, b in zip(names, got, same):
        assert torch.equal(a, b), "%s: the device's bytes differ from the host driver's on the same buffers" % name

    # float32 on the same values; backward from the device's own out and lse.
    out, lse = got[0].float(), got[1]
    with zeppelin.Attention(plan, comm, H, Hk, d) as attn:
        out32, lse32 = torch.empty(out.shape), torch.empty(lse.shape)
        attn.forward(q.float(), k.float(), v.float(), out32, lse32)
        grads32 = [torch.empty(t.shape) for t in (q, k, v)]
        attn.backward(q.float(), k.float(), v.float(), out, lse, dout.float(), *grads32)
    assert torch.equal(lse, lse32), "lse"
    for name, a, want in (("out", got[0], out32), ("dq", got[2], grads32[0]), ("dk", got[3], grads32[1]),
                          ("dv", got[4], grads32[2])):
        assert torch.equal(a, want.to(dtype)), "%s: not the float32 result rounded to %s" % (name, dtype)


def test_device_buffers_are_checked(comm):
    n, me = comm.size, comm.rank
    plan = zeppelin.BatchPlan.from_rings([2 * n], [list(range(n))], n)
    T = plan.attention_layout.tokens(me)
    dev = zeppelin.Attention(plan, comm, 2, 1, 4, dtype=zeppelin.BFLOAT16)
    q = DeviceArray((T, 2, 4), torch.bfloat16, me)
    k, v = DeviceArray((T, 1, 4), torch.bfloat16, me), DeviceArray((T, 1, 4), torch.bfloat16, me)
    out, lse = DeviceArray((T, 2, 4), torch.bfloat16, me), DeviceArray((2, T), torch.float32, me)
    s = ctypes.c_void_p()
    ok(cuda.cudaStreamCreate(ctypes.byref(s)), "cudaStreamCreate")
    with pytest.raises(zeppelin.InvalidArgument, match="need a stream"):
        dev.forward(q, k, v, out, lse)  # DLPack buffers carry no stream
    with pytest.raises(zeppelin.InvalidArgument, match="lse is bfloat16"):
        dev.forward(q, k, v, out, DeviceArray((2, T), torch.bfloat16, me), stream=s.value)
    with pytest.raises(zeppelin.InvalidArgument, match="out has"):
        dev.forward(q, k, v, DeviceArray((T + 1, 2, 4), torch.bfloat16, me), lse, stream=s.value)
    with pytest.raises(zeppelin.InvalidArgument, match="different devices"):
        dev.forward(q, k, v, torch.zeros(T, 2, 4, dtype=torch.bfloat16), lse, stream=s.value)
    dev.close()
    cuda.cudaStreamDestroy(s.value)
    with pytest.raises(zeppelin.InvalidArgument, match="q is float32, bfloat16 expected"):
        zeppelin.Attention(plan, comm, 2, 1, 4, dtype=zeppelin.BFLOAT16).forward(
            *(torch.zeros(T, h, 4) for h in (2, 1, 1, 2)), torch.zeros(2, T))
    with pytest.raises(zeppelin.InvalidArgument, match="float32, bfloat16 or float16"):
        zeppelin.Attention(plan, comm, 2, 1, 4, dtype=zeppelin.FLOAT64)


def test_varlen_plan_on_device_matches_float64_attention(comm):
    """What ring_attention_varlen runs on CUDA tensors, on the double's
    memory: varlen_plan's rings (every sequence over every rank) and the
    device driver in bfloat16, forward and backward, against float64
    attention in torch on the same bfloat16 values. Bound: 2**-7 relative
    to the largest element of each result (a few bf16 roundings of inputs
    and outputs; the driver itself is exact to rounding, test above)."""
    import zeppelin.autograd as za
    n, me = comm.size, comm.rank
    lengths = [8 * n + 3, 5, 3 * n]
    cu = [0]
    for L in lengths:
        cu.append(cu[-1] + L)
    plan = za.varlen_plan(torch.tensor(cu, dtype=torch.int32), n, causal=True)
    mine = plan.attention_layout.indices(me)
    H, Hk, d = 4, 2, 8
    g = gen("varlen")
    q, k, v, dout = (torch.randn(cu[-1], h, d, generator=g).to(torch.bfloat16) for h in (H, Hk, Hk, H))
    s = ctypes.c_void_p()
    ok(cuda.cudaStreamCreate(ctypes.byref(s)), "cudaStreamCreate")
    with zeppelin.Attention(plan, comm, H, Hk, d, dtype=zeppelin.BFLOAT16) as attn:
        got = run(attn, *(DeviceArray.of(t[mine], me) for t in (q, k, v, dout)),
                  lambda shape, dt: DeviceArray(shape, dt, me), stream=s.value)
        ok(cuda.cudaStreamSynchronize(s.value), "cudaStreamSynchronize")
    cuda.cudaStreamDestroy(s.value)
    out, _, dq, dk, dv = (a.cpu().double() for a in got)

    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    rep, at, ref = H // Hk, 0, []
    for L in lengths:
        qs, ks, vs = (t[at:at + L].transpose(0, 1) for t in (q64, k64, v64))
        ks, vs = ks.repeat_interleave(rep, 0), vs.repeat_interleave(rep, 0)
        sc = (qs @ ks.transpose(1, 2) / math.sqrt(d)).masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1),
                                                                   float("-inf"))
        ref.append((sc.softmax(-1) @ vs).transpose(0, 1))
        at += L
    ref = torch.cat(ref)
    grads = torch.autograd.grad(ref, (q64, k64, v64), dout.double())
    for name, a, b in (("out", out, ref.detach()[mine]), ("dq", dq, grads[0][mine]), ("dk", dk, grads[1][mine]),
                       ("dv", dv, grads[2][mine])):
        assert (a - b).abs().max().item() <= 2 ** -7 * b.abs().max().item(), name
