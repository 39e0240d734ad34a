"""The autograd functions (zeppelin.autograd) on a real job: every rank runs this
file under zprun -n N (N = 2..4) and runs the same tests in the same order.

torch.autograd.gradcheck needs every rank to evaluate the function the same
number of times, so each test's function takes the WHOLE packed batch (the
same float64 tensor on every rank, drawn from one seed), gives each rank its
rows (the layout's indices), runs the distributed op, and sums every rank's
output rows into a whole batch again with all_reduce. Two helper functions
make that sum differentiable: _Replicated (forward identity, backward
all_reduce: every rank's input gradient counts) and _Summed (forward
all_reduce, backward identity: each rank back-propagates the whole output
gradient once). gradcheck then checks the distributed backward (remaps,
Ulysses exchanges, zpAttentionBackward) against finite differences of the
distributed forward. The ring-attention driver computes in float32, so its
gradcheck uses a larger step and tolerance, and a second test compares it
with a float64 attention in torch at float32 precision.
"""

import math
import zlib

import pytest
import torch

import zeppelin
import zeppelin.autograd as za
from zeppelin.kernels import TorchKernel, flash_available

# The job's communicator (a module fixture) and the seed every rank shares.
from test_ranks import SEED, comm  # noqa: E402,F401


def gen(*key):
    """The same torch generator on every rank for the same key."""
    return torch.Generator().manual_seed(SEED ^ zlib.crc32(repr(key).encode()))


class _Replicated(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        ctx.comm = comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        ctx.comm.all_reduce(g)
        return g, None


class _Summed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, comm):
        y = x.contiguous().clone()
        comm.all_reduce(y)
        return y

    @staticmethod
    def backward(ctx, g):
        return g, None


def whole(y, index, total, comm):
    """This rank's rows y (at batch rows index) summed with every rank's into [total, ...]."""
    z = torch.zeros((total,) + tuple(y.shape[1:]), dtype=y.dtype).index_add(0, index, y)
    return _Summed.apply(z, comm)


def lengths_for(n, key):
    """n + 1 short sequences (gradcheck calls the function twice per input element)."""
    g = gen("lengths", n, key)
    return [int(x) for x in torch.randint(1, n + 3, (n + 1,), generator=g)]


def ring_plan(comm, lengths, causal=True):
    """A plan with rings of our choosing: sequence s on a ring of N - s % N ranks
    (the first on all ranks) in a rotated order, so all-rank rings, partial rings
    and local sequences mix."""
    n = comm.size
    rings = []
    for s in range(len(lengths)):
        size = n - s % n
        rings.append([(s + i) % n for i in range(size)])
    return zeppelin.BatchPlan.from_rings(lengths, rings, n, causal=causal)


def planner_plan(comm, lengths):
    return zeppelin.plan_batch(lengths, comm, causal=True, q_heads=4, kv_heads=2, head_dim=4, elem_bytes=4)


PLANS = {"rings": ring_plan, "planner": planner_plan}


@pytest.mark.parametrize("kind", sorted(PLANS))
@pytest.mark.parametrize("direction", ["linear->attention", "attention->linear"])
def test_remap_gradcheck(comm, kind, direction):
    lengths = lengths_for(comm.size, "remap")
    plan = PLANS[kind](comm, lengths)
    src, dst = plan.linear_layout, plan.attention_layout
    if direction == "attention->linear":
        src, dst = dst, src
    total = src.total_tokens
    si, di = src.indices(comm.rank), dst.indices(comm.rank)
    w = torch.rand(total, 1, generator=gen("remap w", kind), dtype=torch.float64) + 0.5
    x = torch.randn(total, 1, generator=gen("remap x", kind), dtype=torch.float64, requires_grad=True)

    def f(x):
        mine = _Replicated.apply(x, comm).index_select(0, si)
        # plan_batch's plans know their communicator; from_rings' need it passed
        y = za.remap(mine, plan, direction) if kind == "planner" else za.remap(mine, plan, direction, comm)
        assert y.shape == (dst.tokens(comm.rank), 1)
        return whole(y * w.index_select(0, di), di, total, comm)

    assert torch.equal(f(x).detach(), x.detach() * w)  # the rows land where the other layout says
    assert torch.autograd.gradcheck(f, (x,))


@pytest.mark.parametrize("q_heads,heads", [(4, 4), (4, 2), (3, 1)])
def test_ulysses_gradcheck(comm, q_heads, heads):
    lengths = lengths_for(comm.size, "ulysses")
    layout = ring_plan(comm, lengths).linear_layout
    total, d = layout.total_tokens, 1
    lo, hi = zeppelin.ulysses_heads(comm.rank, comm.size, q_heads, heads)
    mine = layout.indices(comm.rank)
    x = torch.randn(total, heads, d, generator=gen("uly x", q_heads, heads), dtype=torch.float64,
                    requires_grad=True)
    w = torch.rand(total, heads, d, generator=gen("uly w", q_heads, heads), dtype=torch.float64) + 0.5
    copies = torch.zeros(heads, dtype=torch.float64)  # how many ranks hold each head
    for r in range(comm.size):
        a, b = zeppelin.ulysses_heads(r, comm.size, q_heads, heads)
        copies[a:b] += 1

    def f(x):
        y = za.ulysses(_Replicated.apply(x, comm).index_select(0, mine), layout, heads, comm, q_heads=q_heads)
        assert y.shape == (total, hi - lo, d)
        z = torch.zeros(total, heads, d, dtype=x.dtype)
        z[:, lo:hi] = y * w[:, lo:hi]
        return _Summed.apply(z, comm)

    assert torch.equal(f(x).detach(), x.detach() * w * copies[None, :, None])

    def back(x):  # the inverse exchange: head-parallel [all tokens, my heads] -> my tokens, every head
        part = _Replicated.apply(x, comm)[:, lo:hi]
        y = za.ulysses(part.contiguous(), layout, heads, comm, q_heads=q_heads, inverse=True)
        return whole(y * w.index_select(0, mine), mine, total, comm)

    assert torch.allclose(back(x).detach(), x.detach() * w * copies[None, :, None])
    assert torch.autograd.gradcheck(f, (x,))
    assert torch.autograd.gradcheck(back, (x,))


def test_ulysses_bfloat16_gqa(comm):
    """Key/value heads shared by several ranks' query heads, in bfloat16: the way back
    sums the copies (in float32: the C library sums float32 and float64 only)."""
    layout = ring_plan(comm, lengths_for(comm.size, "uly bf16")).linear_layout
    lo, hi = zeppelin.ulysses_heads(comm.rank, comm.size, 8, 2)
    mine = layout.indices(comm.rank)
    x = torch.randn(layout.total_tokens, 2, 4, generator=gen("uly bf16"), dtype=torch.float64)
    mx = x.index_select(0, mine).to(torch.bfloat16).requires_grad_()
    y = za.ulysses(mx, layout, 2, comm, q_heads=8)
    assert y.dtype == torch.bfloat16 and torch.equal(y.double(), x[:, lo:hi].to(torch.bfloat16).double())
    y.backward(torch.ones_like(y))
    copies = torch.zeros(2)
    for r in range(comm.size):
        a, b = zeppelin.ulysses_heads(r, comm.size, 8, 2)
        copies[a:b] += 1
    assert torch.equal(mx.grad.float(), copies[None, :, None].expand(mx.shape))


def reference_attention(q, k, v, lengths, causal=True):
    """float64 attention of every sequence of a packed batch, in torch."""
    rep = q.shape[1] // k.shape[1]
    out, at = [], 0
    for n in lengths:
        qs, ks, vs = (t[at:at + n].transpose(0, 1) for t in (q, k, v))
        ks, vs = ks.repeat_interleave(rep, 0), vs.repeat_interleave(rep, 0)
        s = qs @ ks.transpose(1, 2) / math.sqrt(q.shape[2])
        if causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out.append((s.softmax(-1) @ vs).transpose(0, 1))
        at += n
    return torch.cat(out)


def attention_inputs(total, H, Hk, d, key, dtype=torch.float64):
    g = gen("attn", key)
    return [torch.randn(total, h, d, generator=g, dtype=torch.float64).to(dtype).requires_grad_()
            for h in (H, Hk, Hk)]


def distributed_attention(comm, plan, kernel):
    """The whole-batch function of ring_attention on this rank's rows."""
    mine = plan.attention_layout.indices(comm.rank)
    total = plan.attention_layout.total_tokens

    def f(q, k, v):
        q, k, v = (_Replicated.apply(t, comm).index_select(0, mine) for t in (q, k, v))
        return whole(za.ring_attention(q, k, v, plan, comm, kernel=kernel), mine, total, comm)
    return f


@pytest.mark.parametrize("kernel", ["torch", "reference"])
@pytest.mark.parametrize("causal", [True, False])
def test_ring_attention_matches_float64(comm, kernel, causal):
    lengths = [2 * comm.size * 2 + 3, 5, 9, 1, 4 * comm.size + 1, 7]
    plan = ring_plan(comm, lengths, causal)
    H, Hk, d = 4, 2, 4
    q, k, v = attention_inputs(sum(lengths), H, Hk, d, ("match", kernel, causal))
    out = distributed_attention(comm, plan, kernel)(q, k, v)
    want = reference_attention(q, k, v, lengths, causal)
    assert (out - want).abs().max() < 1e-5
    g = torch.randn(out.shape, generator=gen("dout", kernel, causal), dtype=torch.float64)
    got = torch.autograd.grad(out, (q, k, v), g)
    ref = torch.autograd.grad(want, (q, k, v), g)
    for a, b in zip(got, ref):
        assert (a - b).abs().max() < 1e-5 * max(1.0, float(b.abs().max()))


def test_ring_attention_gradcheck(comm):
    lengths = [2 * comm.size + 1, 3, 2]  # on rings of N, N - 1 and N - 2 ranks
    plan = ring_plan(comm, lengths)
    f = distributed_attention(comm, plan, "torch")
    # float32 inside: a step of 1e-3 keeps rounding (~1e-7 / 1e-3) under the tolerance.
    assert torch.autograd.gradcheck(f, tuple(attention_inputs(sum(lengths), 2, 1, 1, "gradcheck")),
                                    eps=1e-3, atol=2e-3, rtol=1e-2)


def test_ring_attention_bfloat16(comm):
    lengths = [4 * comm.size + 1, 6, 3]
    plan = ring_plan(comm, lengths)
    q, k, v = attention_inputs(sum(lengths), 4, 2, 8, "bf16", dtype=torch.bfloat16)
    out = distributed_attention(comm, plan, "torch")(q, k, v)
    assert out.dtype == torch.bfloat16
    want = reference_attention(*(t.detach().double() for t in (q, k, v)), lengths)
    assert (out.double() - want).abs().max() < 2e-2
    out.sum().backward()
    assert q.grad.dtype == torch.bfloat16 and torch.isfinite(q.grad.float()).all()


@pytest.mark.parametrize("causal", [True, False])
def test_ring_attention_varlen_as_ring_flash_attn_is_called(comm, causal):
    """cu_seqlens of the whole packed batch (int32, with a sequence shorter
    than the ring), this rank's shard of varlen_plan's layout; out, lse and
    the gradients against float64 attention in torch."""
    n = comm.size
    lengths = [6 * n + 5, 3, 2 * n, 1, 4 * n + 1]
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int32)
    plan = za.varlen_plan(cu, n, causal)
    assert za.varlen_plan(cu, n, causal) is plan  # made once
    assert all(plan.sequence(s)[1] == list(range(n)) for s in range(len(lengths)))
    mine = plan.attention_layout.indices(comm.rank)
    total = sum(lengths)
    H, Hk, d = 4, 2, 4
    q, k, v = attention_inputs(total, H, Hk, d, ("varlen", causal))
    lse_got = []

    def f(q, k, v):
        q, k, v = (_Replicated.apply(t, comm).index_select(0, mine) for t in (q, k, v))
        out, lse = za.ring_attention_varlen(q, k, v, cu, max(lengths), causal=causal, layout="plan", group=comm,
                                            return_lse=True)
        lse_got.append(lse)
        return whole(out, mine, total, comm)
    out = f(q, k, v)
    want = reference_attention(q, k, v, lengths, causal)
    assert (out - want).abs().max() < 1e-5
    g = torch.randn(out.shape, generator=gen("varlen dout", causal), dtype=torch.float64)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(want, (q, k, v), g)):
        assert (a - b).abs().max() < 1e-5 * max(1.0, float(b.abs().max()))
    # lse [H, my tokens]: log of each query row's softmax denominator
    rep = H // Hk
    at, lse_want = 0, []
    for L in lengths:
        s = q[at:at + L].detach().transpose(0, 1) @ k[at:at + L].detach().repeat_interleave(rep, 1).permute(1, 2, 0)
        s = s / math.sqrt(d)
        if causal:
            s = s.masked_fill(torch.ones(L, L, dtype=torch.bool).triu(1), float("-inf"))
        lse_want.append(s.logsumexp(-1))
        at += L
    lse_want = torch.cat(lse_want, 1)[:, mine]
    assert lse_got[0].dtype == torch.float32 and lse_got[0].shape == (H, len(mine))
    assert (lse_got[0].double() - lse_want).abs().max() < 1e-5


def test_ring_attention_varlen_says_what_is_wrong(comm):
    cu = [0, 4 * comm.size, 4 * comm.size + 3]
    plan = za.varlen_plan(cu, comm.size)
    T = plan.attention_layout.tokens(comm.rank)
    q, k = torch.zeros(T, 2, 4), torch.zeros(T, 1, 4)
    say = {"causal": True, "layout": "plan"}
    with pytest.raises(zeppelin.InvalidArgument, match="shard it with varlen_plan"):
        za.ring_attention_varlen(q[:T - 1], k[:T - 1], k[:T - 1], cu, group=comm, **say)
    with pytest.raises(zeppelin.InvalidArgument, match="max_seqlen 3"):
        za.ring_attention_varlen(q, k, k, cu, 3, group=comm, **say)
    with pytest.raises(zeppelin.InvalidArgument, match="group="):
        za.ring_attention_varlen(q, k, k, cu, **say)
    with pytest.raises(zeppelin.InvalidArgument, match="cu_seqlens"):
        za.ring_attention_varlen(q, k, k, [4 * comm.size, 3], group=comm, **say)  # lengths, not offsets
    with pytest.raises(zeppelin.InvalidArgument, match="causal=1"):
        za.ring_attention_varlen(q, k, k, cu, group=comm, causal=1, layout="plan")
    out = za.ring_attention_varlen(q, k, k, cu, group=comm, **say)
    assert out.shape == q.shape


def test_torch_kernel_is_the_reference_kernel(comm):
    """The package's torch block kernel and Zeppelin's C reference kernel give the same
    results block by block (both through the driver, on the planner's plan)."""
    lengths = [40, 17, 3, 25]
    plan = planner_plan(comm, lengths)
    q, k, v = attention_inputs(sum(lengths), 4, 2, 4, "kernels")
    outs = [distributed_attention(comm, plan, kern)(q, k, v) for kern in ("torch", "reference", TorchKernel())]
    assert (outs[0] - outs[1]).abs().max() < 1e-5
    assert torch.equal(outs[0], outs[2])


def test_bad_inputs_leave_the_communicator_usable(comm):
    plan = ring_plan(comm, [5, 6])
    T = plan.attention_layout.tokens(comm.rank)
    q, k = torch.zeros(T, 4, 2), torch.zeros(T, 2, 2)
    with pytest.raises(zeppelin.InvalidArgument, match="dtype"):
        za.ring_attention(q.int(), k, k, plan, comm)
    with pytest.raises(zeppelin.InvalidArgument, match="q .T, H, d."):
        za.ring_attention(q, k[:, :, :1], k, plan, comm)
    if not flash_available():  # the capability check: a clear error, nothing sent
        with pytest.raises(zeppelin.ZeppelinError, match="flash_attn does not import or no GPU"):
            za.ring_attention(q, k, k, plan, comm, kernel="flash")
    with pytest.raises(ValueError, match="kernel must be"):
        za.ring_attention(q, k, k, plan, comm, kernel="fast")
    with pytest.raises(zeppelin.InvalidArgument, match="communicator"):
        za.remap(torch.zeros(T, 3), plan, "attention->linear")
    with pytest.raises(zeppelin.InvalidArgument, match="direction"):
        za.remap(q, plan, "linear->ulysses", comm)
    with pytest.raises(zeppelin.InvalidArgument, match="rows|tokens"):
        za.remap(torch.zeros(T + 1, 3), plan, "attention->linear", comm)
    x = torch.full((3,), 1.0)
    comm.all_reduce(x)
    assert torch.equal(x, torch.full((3,), float(comm.size)))
