"""ring-flash-attn's varlen functions, with its names, signatures, defaults
and conventions, computed by Zeppelin:

    from zeppelin.ring_flash_attn import ring_flash_attn_varlen_func
    out = ring_flash_attn_varlen_func(q, k, v, local_cu_seqlens, local_max_seqlen, causal=True)

- ring_flash_attn_varlen_func: rank r holds chunk r of every sequence cut
  into W equal chunks (W ranks in group); cu_seqlens and max_seqlen are this
  rank's (each sequence's length / W).
- zigzag_ring_flash_attn_varlen_func: rank r holds chunks r and 2W-1-r of
  every sequence cut into 2W; cu_seqlens and max_seqlen are this rank's.
  causal=True only, as in ring-flash-attn.
- llama3_flash_attn_varlen_func: rank r holds tokens [r T/W, (r+1) T/W) of
  the packed batch of T tokens; its cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
  max_seqlen_k and local_k_slice come from llama3_flash_attn_prepare_cu_seqlens.
  heads_k_stride is accepted (it only sets ring-flash-attn's memory use).

Every function takes q [t, H, d], k and v [t, Hk, d] (Hk divides H: GQA),
returns out [t, H, d] in q's dtype, and with return_attn_probs=True
(out, softmax_lse, None) as ring-flash-attn does: softmax_lse float32,
[number of sequences, H, max_seqlen] for the ring and zigzag functions
(padding beyond a sequence's length is 0), [H, t] for llama3's. group=None
is the default process group. dropout_p must be 0, window_size (-1, -1) and
alibi_slopes None: anything else is refused by name. deterministic is
accepted; Zeppelin's result is the same in every run either way.

How: the shards are a Zeppelin layout of the whole batch. Zeppelin's plan
for it (every sequence on one ring of all ranks, zigzag chunks when causal,
contiguous otherwise) runs the ring-attention driver; when the caller's
layout is not the plan's (ring's contiguous chunks when causal, llama3's
slices), q, k and v are remapped to the plan's layout and out (and its
gradients) back, over the same communicator. On CPU tensors attention is
computed in float32 (see autograd.ring_attention).
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from ._torch import torch  # an ImportError that says how to get torch when it is missing

from .autograd import _attend, _group_comm
from .errors import InvalidArgument
from .plan import lengths_from_cu_seqlens

__all__ = ["ring_flash_attn_varlen_func", "zigzag_ring_flash_attn_varlen_func", "llama3_flash_attn_varlen_func",
           "llama3_flash_attn_prepare_cu_seqlens"]


def _refuse_unsupported(fn: str, dropout_p: Any, window_size: Any, alibi_slopes: Any) -> None:
    if dropout_p != 0:
        raise InvalidArgument("%s: dropout_p=%r is not supported (Zeppelin's attention has no dropout): pass 0"
                              % (fn, dropout_p))
    if tuple(window_size) != (-1, -1):
        raise InvalidArgument("%s: window_size=%r is not supported (no sliding window): pass (-1, -1)"
                              % (fn, tuple(window_size)))
    if alibi_slopes is not None:
        raise InvalidArgument("%s: alibi_slopes is not supported: pass None" % fn)


def _group(group: Any, fn: str) -> Any:
    if group is None:
        import torch.distributed as dist
        if not dist.is_initialized():
            raise InvalidArgument("%s: group=None means the default process group, and there is none: call "
                                  "torch.distributed.init_process_group first, or pass group=" % fn)
        group = dist.group.WORLD
    return _group_comm(group, fn)


def _local_lengths(fn: str, cu_seqlens: Any, max_seqlen: Any, parts: int) -> List[int]:
    lens = lengths_from_cu_seqlens(cu_seqlens)
    for i, L in enumerate(lens):
        if L % parts:
            raise InvalidArgument("%s: local sequence %d has %d tokens, not a multiple of %d" % (fn, i, L, parts))
    if max_seqlen is not None and int(max_seqlen) < max(lens):
        raise InvalidArgument("%s: max_seqlen %d, but cu_seqlens has a local sequence of %d tokens"
                              % (fn, int(max_seqlen), max(lens)))
    return lens


def _padded_lse(lse: torch.Tensor, lens: Sequence[int], max_seqlen: Any) -> torch.Tensor:
    """[H, t] -> [sequences, H, max_seqlen], ring-flash-attn's varlen softmax_lse."""
    width = max(int(max_seqlen) if max_seqlen is not None else 0, max(lens))
    out = lse.new_zeros((len(lens), lse.shape[0], width))
    at = 0
    for i, L in enumerate(lens):
        out[i, :, :L] = lse[:, at:at + L]
        at += L
    return out


def _result(out: torch.Tensor, lse: Any, return_attn_probs: bool) -> Any:
    return (out, lse, None) if return_attn_probs else out


def ring_flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Any, max_seqlen: Any,
                                dropout_p: float = 0.0, softmax_scale: Optional[float] = None, causal: bool = False,
                                window_size: Tuple[int, int] = (-1, -1), alibi_slopes: Any = None,
                                deterministic: bool = False, return_attn_probs: bool = False,
                                group: Any = None) -> Any:
    """ring-flash-attn's ring_flash_attn_varlen_func: rank r holds chunk r of
    each sequence split in W; cu_seqlens and max_seqlen are this rank's."""
    fn = "ring_flash_attn_varlen_func"
    _refuse_unsupported(fn, dropout_p, window_size, alibi_slopes)
    comm = _group(group, fn)
    W = comm.size
    local = _local_lengths(fn, cu_seqlens, max_seqlen, 1)
    segments = [[(s, r * L, L) for s, L in enumerate(local)] for r in range(W)]
    out, lse = _attend(fn, q, k, v, [L * W for L in local], segments, causal, softmax_scale, comm)
    return _result(out, _padded_lse(lse, local, max_seqlen) if return_attn_probs else None, return_attn_probs)


def zigzag_ring_flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Any,
                                       max_seqlen: Any, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                       causal: bool = False, window_size: Tuple[int, int] = (-1, -1),
                                       alibi_slopes: Any = None, deterministic: bool = False,
                                       return_attn_probs: bool = False, group: Any = None) -> Any:
    """ring-flash-attn's zigzag_ring_flash_attn_varlen_func: rank r holds
    chunks r and 2W-1-r of each sequence split in 2W, back to back;
    cu_seqlens and max_seqlen are this rank's. causal=True only."""
    fn = "zigzag_ring_flash_attn_varlen_func"
    _refuse_unsupported(fn, dropout_p, window_size, alibi_slopes)
    if not causal:
        raise InvalidArgument("%s: causal=False is not supported (as in ring-flash-attn, where the zigzag layout "
                              "only balances causal work): pass causal=True, or use ring_flash_attn_varlen_func"
                              % fn)
    comm = _group(group, fn)
    W = comm.size
    local = _local_lengths(fn, cu_seqlens, max_seqlen, 2)
    segments = [[(s, c * L // 2, L // 2) for s, L in enumerate(local) for c in (r, 2 * W - 1 - r)]
                for r in range(W)]
    # (each sequence's two chunks back to back: the segment list above is per
    # sequence, chunk r then chunk 2W-1-r)
    out, lse = _attend(fn, q, k, v, [L * W for L in local], segments, causal, softmax_scale, comm)
    return _result(out, _padded_lse(lse, local, max_seqlen) if return_attn_probs else None, return_attn_probs)


def llama3_flash_attn_prepare_cu_seqlens(cu_seqlens: torch.Tensor, causal: bool, rank: int,
                                         world_size: int) -> Tuple[torch.Tensor, torch.Tensor, int, int, slice]:
    """ring-flash-attn's helper: for rank's slice [rank T/W, (rank+1) T/W) of
    the packed batch (cu_seqlens: its int32 offsets), the local
    (cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, local_k_slice).
    q's sequences are the slice's pieces of the batch's sequences; each
    piece's keys start where its sequence starts and end at the slice's end
    (causal) or at the sequence's end; local_k_slice is their range in the
    gathered keys of the whole batch."""
    cu = [int(x) for x in cu_seqlens.tolist()]
    total = cu[-1]
    if total % world_size:
        raise InvalidArgument("llama3_flash_attn_prepare_cu_seqlens: %d tokens do not split over %d ranks"
                              % (total, world_size))
    per = total // world_size
    lo, hi = rank * per, (rank + 1) * per
    first = max(i for i in range(len(cu) - 1) if cu[i] <= lo)  # the sequence holding token lo
    last = min(i for i in range(1, len(cu)) if cu[i] >= hi)    # the end at or after the slice's end
    bounds = cu[first:last + 1]
    q_cu = [0] + [b - lo for b in bounds[1:-1]] + [per]
    k_left, k_right = bounds[0], hi if causal else bounds[-1]
    k_cu = [b - k_left for b in bounds[:-1]] + [k_right - k_left]
    device = cu_seqlens.device
    cu_q = torch.tensor(q_cu, dtype=cu_seqlens.dtype, device=device)
    cu_k = torch.tensor(k_cu, dtype=cu_seqlens.dtype, device=device)
    max_q = max(b - a for a, b in zip(q_cu, q_cu[1:]))
    max_k = max(b - a for a, b in zip(k_cu, k_cu[1:]))
    return cu_q, cu_k, max_q, max_k, slice(k_left, k_right)


def _llama3_batch(fn: str, cu_seqlens_q: Any, local_k_slice: slice, t: int, comm: Any) -> List[int]:
    """The whole batch's lengths from every rank's cu_seqlens_q and
    local_k_slice: each rank knows where the sequences on its slice start
    (local_k_slice.start is where its first one does). Collective."""
    cu_q = [int(x) for x in (cu_seqlens_q.tolist() if hasattr(cu_seqlens_q, "tolist") else cu_seqlens_q)]
    if len(cu_q) < 2 or cu_q[0] != 0 or cu_q[-1] != t:
        raise InvalidArgument("%s: cu_seqlens_q must run from 0 to this rank's %d tokens, got %s"
                              % (fn, t, cu_q[:8]))
    lo = comm.rank * t
    starts = [local_k_slice.start] + [lo + c for c in cu_q[1:-1]]
    # every rank's start list, padded with -1 to the longest
    n = torch.tensor([len(starts)], dtype=torch.int64)
    comm.all_reduce(n, op="max")
    mine = torch.full((int(n),), -1, dtype=torch.int64)
    mine[:len(starts)] = torch.tensor(starts, dtype=torch.int64)
    every = torch.empty(int(n) * comm.size, dtype=torch.int64)
    comm.all_gather(mine, every)
    total = t * comm.size
    bounds = sorted({int(x) for x in every.tolist() if x >= 0} | {total})
    if bounds[0] != 0:
        raise InvalidArgument("%s: no rank's slice starts a sequence at token 0: local_k_slice and cu_seqlens_q "
                              "must come from llama3_flash_attn_prepare_cu_seqlens" % fn)
    return [b - a for a, b in zip(bounds, bounds[1:])]


def llama3_flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: Any,
                                  cu_seqlens_k: Any, max_seqlen_q: Any, max_seqlen_k: Any, heads_k_stride: int,
                                  local_k_slice: slice, dropout_p: float = 0.0, softmax_scale: Optional[float] = None,
                                  causal: bool = False, window_size: Tuple[int, int] = (-1, -1),
                                  alibi_slopes: Any = None, deterministic: bool = False,
                                  return_attn_probs: bool = False, group: Any = None) -> Any:
    """ring-flash-attn's llama3_flash_attn_varlen_func: rank r holds tokens
    [r t, (r+1) t) of the packed batch (t = q.shape[0]); the cu_seqlens,
    max_seqlens and local_k_slice from llama3_flash_attn_prepare_cu_seqlens."""
    fn = "llama3_flash_attn_varlen_func"
    _refuse_unsupported(fn, dropout_p, window_size, alibi_slopes)
    if not isinstance(heads_k_stride, int) or heads_k_stride < 1 or (k.dim() == 3 and k.shape[1] % heads_k_stride):
        raise InvalidArgument("%s: heads_k_stride=%r must be a positive divisor of k's %s heads"
                              % (fn, heads_k_stride, k.shape[1] if k.dim() == 3 else "?"))
    if not isinstance(local_k_slice, slice):
        raise InvalidArgument("%s: local_k_slice must be the slice llama3_flash_attn_prepare_cu_seqlens returns"
                              % fn)
    comm = _group(group, fn)
    t = q.shape[0]
    lengths = _llama3_batch(fn, cu_seqlens_q, local_k_slice, t, comm)
    segments: List[List[Tuple[int, int, int]]] = [[] for _ in range(comm.size)]
    at = 0
    for s, L in enumerate(lengths):
        for r in range(comm.size):
            b, e = max(at, r * t), min(at + L, (r + 1) * t)
            if b < e:
                segments[r].append((s, b - at, e - b))
        at += L
    out, lse = _attend(fn, q, k, v, lengths, segments, causal, softmax_scale, comm)
    return _result(out, lse, return_attn_probs)
