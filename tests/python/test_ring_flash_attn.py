"""zeppelin.ring_flash_attn, called exactly as ring-flash-attn's own tests
call its functions (test/test_ring_flash_attn_varlen_func.py,
test_zigzag_ring_flash_attn_varlen_func.py, test_llama3_flash_attn_varlen_func.py
in zhuzilin/ring-flash-attention), under torchrun on the "zeppelin" backend
(group=None: the default group). Each rank's shard is cut from a packed batch
that every rank draws from one seed, in the layout of that function's test;
out, softmax_lse and the gradients of q, k and v are compared with attention
computed in float64 on the same (rounded) inputs: float32 within 1e-5 and
bfloat16 within 2^-7 of each result's largest element. GQA (4 query heads,
2 key/value heads) and sequences of different lengths throughout.

Also Zeppelin's own ring_attention_varlen: causal and layout must be said,
and a contiguous shard with causal=True is right when it says so."""
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

import zeppelin
import zeppelin.autograd as za
import zeppelin.distributed  # noqa: F401 (registers the backend)
from zeppelin.ring_flash_attn import (llama3_flash_attn_prepare_cu_seqlens, llama3_flash_attn_varlen_func,
                                      ring_flash_attn_varlen_func, zigzag_ring_flash_attn_varlen_func)

H, HK, D = 4, 2, 8
TOL = {torch.float32: 1e-5, torch.bfloat16: 2.0 ** -7}


@pytest.fixture(scope="module", autouse=True)
def world():
    dist.init_process_group("zeppelin", timeout=timedelta(seconds=60))
    yield
    dist.destroy_process_group()


def batch(lengths, dtype, seed):
    """The packed q, k, v, dout of the whole batch, the same on every rank,
    rounded to dtype."""
    g = torch.Generator().manual_seed(seed)
    T = sum(lengths)
    return [torch.randn(T, h, D, generator=g, dtype=torch.float64).to(dtype) for h in (H, HK, HK, H)]


def reference(q, k, v, dout, cu, causal):
    """float64 attention of every sequence: out [T, H, d], lse [H, T] and the
    gradients of q, k, v for dout."""
    q, k, v = (t.detach().to(torch.float64).requires_grad_() for t in (q, k, v))
    rep = H // HK
    outs, lses = [], []
    for a, b in zip(cu, cu[1:]):
        qi = q[a:b].transpose(0, 1)
        ki = k[a:b].repeat_interleave(rep, dim=1).transpose(0, 1)
        vi = v[a:b].repeat_interleave(rep, dim=1).transpose(0, 1)
        s = qi @ ki.transpose(1, 2) * D ** -0.5
        if causal:
            s = s.masked_fill(torch.ones(b - a, b - a, dtype=torch.bool).triu(1), float("-inf"))
        lse = torch.logsumexp(s, -1)
        outs.append((torch.exp(s - lse[..., None]) @ vi).transpose(0, 1))
        lses.append(lse)
    out, lse = torch.cat(outs), torch.cat(lses, dim=1)
    out.backward(dout.to(torch.float64))
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def close(name, got, want, dtype):
    bound = TOL[dtype] * want.abs().max().item()
    err = (got.to(torch.float64) - want).abs().max().item()
    assert err <= bound, "%s: largest difference %.3g, bound %.3g" % (name, err, bound)


def cu_of(lengths):
    cu = [0]
    for L in lengths:
        cu.append(cu[-1] + L)
    return cu


def extract_local(value, cu, rank, world_size):
    """ring-flash-attn's test helper: chunk rank of every sequence."""
    return torch.cat([value[a:b].chunk(world_size, dim=0)[rank] for a, b in zip(cu, cu[1:])]).contiguous()


def extract_zigzag(value, cu, rank, world_size):
    """ring-flash-attn's zigzag test helper: chunks rank and 2W-1-rank of every sequence."""
    parts = []
    for a, b in zip(cu, cu[1:]):
        chunks = value[a:b].chunk(2 * world_size, dim=0)
        parts += [chunks[rank], chunks[2 * world_size - 1 - rank]]
    return torch.cat(parts).contiguous()


def leaves(*ts):
    return [t.detach().clone().requires_grad_() for t in ts]


def check_all(out, lse_per_seq, q, k, v, want, extract, dtype):
    w_out, w_lse, w_dq, w_dk, w_dv = want
    close("out", out, extract(w_out), dtype)
    for i, (got, ref) in enumerate(lse_per_seq(w_lse)):
        close("lse of sequence %d" % i, got, ref, torch.float32)
    close("dq", q.grad, extract(w_dq), dtype)
    close("dk", k.grad, extract(w_dk), dtype)
    close("dv", v.grad, extract(w_dv), dtype)


def check_per_sequence_shards(fn, extract, chunk_lengths, causal, dtype, seed):
    """fn (ring's or zigzag's function) on a batch whose sequences are W
    times chunk_lengths long, each rank's shard cut by extract, called as
    ring-flash-attn's tests call it (local cu_seqlens and max_seqlen)."""
    rank, W = dist.get_rank(), dist.get_world_size()
    lengths = [W * L for L in chunk_lengths]
    cu = cu_of(lengths)
    q, k, v, dout = batch(lengths, dtype, seed=seed)
    want = reference(q, k, v, dout, cu, causal)
    local_cu = torch.tensor(cu, dtype=torch.int32) // W
    local_max = max(lengths) // W
    lq, lk, lv = leaves(*(extract(t, cu, rank, W) for t in (q, k, v)))
    out, lse, none = fn(lq, lk, lv, local_cu, local_max, dropout_p=0, causal=causal, window_size=(-1, -1),
                        alibi_slopes=None, deterministic=False, return_attn_probs=True)
    assert none is None and out.dtype == dtype and lse.shape == (len(lengths), H, local_max)
    out.backward(extract(dout, cu, rank, W))

    def lse_per_seq(w_lse):  # each sequence's lse [H, its local tokens], padded in ring-flash-attn's layout
        for i, (a, b) in enumerate(zip(cu, cu[1:])):
            yield lse[i, :, :(b - a) // W], extract(w_lse[:, a:b].t(), [0, b - a], rank, W).t()
    check_all(out, lse_per_seq, lq, lk, lv, want, lambda t: extract(t, cu, rank, W), dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False])
def test_ring_flash_attn_varlen_func(causal, dtype):
    check_per_sequence_shards(ring_flash_attn_varlen_func, extract_local, (3, 8, 1, 5), causal, dtype, seed=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zigzag_ring_flash_attn_varlen_func(dtype):
    check_per_sequence_shards(zigzag_ring_flash_attn_varlen_func, extract_zigzag, (4, 10, 2, 6), True, dtype, seed=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal", [True, False])
def test_llama3_flash_attn_varlen_func(causal, dtype):
    """Rank r holds tokens [r T/W, (r+1) T/W) of the packed batch; sequences
    cross the ranks' boundaries."""
    rank, W = dist.get_rank(), dist.get_world_size()
    lengths = [5, 17, 3, 11] if W in (2, 4) else [W * 9]
    cu = cu_of(lengths)
    T, t = cu[-1], cu[-1] // W
    q, k, v, dout = batch(lengths, dtype, seed=3)
    want = reference(q, k, v, dout, cu, causal)
    cu_q, cu_k, max_q, max_k, k_slice = llama3_flash_attn_prepare_cu_seqlens(
        torch.tensor(cu, dtype=torch.int32), causal=causal, rank=rank, world_size=W)
    lq, lk, lv = leaves(*(x[rank * t:(rank + 1) * t] for x in (q, k, v)))
    out, lse, _ = llama3_flash_attn_varlen_func(lq, lk, lv, cu_q, cu_k, max_q, max_k, heads_k_stride=1,
                                                local_k_slice=k_slice, dropout_p=0, causal=causal,
                                                window_size=(-1, -1), alibi_slopes=None, deterministic=False,
                                                return_attn_probs=True)
    assert lse.shape == (H, t)
    out.backward(dout[rank * t:(rank + 1) * t])
    check_all(out, lambda w_lse: [(lse, w_lse[:, rank * t:(rank + 1) * t])], lq, lk, lv, want,
              lambda x: x[rank * t:(rank + 1) * t], dtype)


def test_llama3_prepare_cu_seqlens_as_ring_flash_attn_computes_it():
    """Worked example: 4 ranks of 9 tokens over sequences [5, 17, 3, 11]."""
    cu = torch.tensor([0, 5, 22, 25, 36], dtype=torch.int32)
    cu_q, cu_k, max_q, max_k, ks = llama3_flash_attn_prepare_cu_seqlens(cu, causal=True, rank=1, world_size=4)
    # tokens 9..17: the middle of sequence 1 (5..22)
    assert cu_q.tolist() == [0, 9] and cu_k.tolist() == [0, 13] and (max_q, max_k) == (9, 13)
    assert ks == slice(5, 18)
    cu_q, cu_k, max_q, max_k, ks = llama3_flash_attn_prepare_cu_seqlens(cu, causal=False, rank=2, world_size=4)
    # tokens 18..26: the end of sequence 1, sequence 2, the start of sequence 3
    assert cu_q.tolist() == [0, 4, 7, 9] and cu_k.tolist() == [0, 17, 20, 31] and (max_q, max_k) == (4, 17)
    assert ks == slice(5, 36) and cu_q.dtype == torch.int32


def test_defaults_and_positional_calls_follow_ring_flash_attn():
    """causal defaults to False; the positional order is (q, k, v,
    cu_seqlens, max_seqlen, dropout_p, softmax_scale, causal, ...)."""
    rank, W = dist.get_rank(), dist.get_world_size()
    lengths = [W * 4, W * 2]
    cu = cu_of(lengths)
    q, k, v, dout = batch(lengths, torch.float32, seed=4)
    local = [extract_local(t, cu, rank, W) for t in (q, k, v)]
    local_cu = torch.tensor(cu, dtype=torch.int32) // W
    plain = ring_flash_attn_varlen_func(*local, local_cu, 4)
    close("default (causal=False)", plain, extract_local(reference(q, k, v, dout, cu, False)[0], cu, rank, W),
          torch.float32)
    positional = ring_flash_attn_varlen_func(*local, local_cu, 4, 0.0, None, True)
    close("positional causal=True", positional, extract_local(reference(q, k, v, dout, cu, True)[0], cu, rank, W),
          torch.float32)


def test_unsupported_arguments_are_refused_by_name():
    rank, W = dist.get_rank(), dist.get_world_size()
    lengths = [2 * W * 2]
    cu = torch.tensor(cu_of(lengths), dtype=torch.int32)
    q, k, v, _ = batch(lengths, torch.float32, seed=5)
    local = [extract_local(t, cu.tolist(), rank, W) for t in (q, k, v)]
    for kwargs, name in (({"dropout_p": 0.1}, "dropout_p=0.1"), ({"window_size": (8, 0)}, "window_size"),
                         ({"alibi_slopes": torch.ones(H)}, "alibi_slopes")):
        with pytest.raises(zeppelin.InvalidArgument, match=name):
            ring_flash_attn_varlen_func(*local, cu // W, 4, causal=True, **kwargs)
    with pytest.raises(zeppelin.InvalidArgument, match="causal=False"):
        zigzag_ring_flash_attn_varlen_func(*local, cu // W, 4)
    dist.barrier()  # nothing ran: the group still works


def test_zeppelin_ring_attention_varlen_needs_causal_and_layout():
    """The two silent cases of ring_attention_varlen used as ring-flash-attn's
    function: causal left out, and a contiguous shard with causal=True. Both
    must now be said; said, the contiguous shard is remapped and right."""
    rank, W = dist.get_rank(), dist.get_world_size()
    lengths = [W * 6, W * 3]
    cu = cu_of(lengths)
    q, k, v, dout = batch(lengths, torch.float32, seed=6)
    local = [extract_local(t, cu, rank, W) for t in (q, k, v)]
    cu_t = torch.tensor(cu, dtype=torch.int32)
    with pytest.raises(TypeError, match="causal"):
        za.ring_attention_varlen(*local, cu_t, max(lengths), layout="contiguous", group=dist.group.WORLD)
    with pytest.raises(TypeError, match="layout"):
        za.ring_attention_varlen(*local, cu_t, max(lengths), causal=True, group=dist.group.WORLD)
    with pytest.raises(TypeError):
        za.ring_attention_varlen(*local, cu_t, max(lengths), 0.0, None, True)
    with pytest.raises(zeppelin.InvalidArgument, match="say how q, k and v are sharded"):
        za.ring_attention_varlen(*local, cu_t, causal=True, layout="rows", group=dist.group.WORLD)
    lq, lk, lv = leaves(*local)
    out, lse = za.ring_attention_varlen(lq, lk, lv, cu_t, max(lengths), causal=True, layout="contiguous",
                                        group=dist.group.WORLD, return_lse=True)
    out.backward(extract_local(dout, cu, rank, W))
    want = reference(q, k, v, dout, cu, True)
    ext = lambda t: extract_local(t, cu, rank, W)  # noqa: E731
    check_all(out, lambda w_lse: [(lse, ext(w_lse.t()).t())], lq, lk, lv, want, ext, torch.float32)
