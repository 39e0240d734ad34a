"""Autograd functions over Zeppelin's remaps, Ulysses exchange and ring-attention
driver, for PyTorch models trained on variable-length packed batches.

    plan = zeppelin.plan_batch(lengths, comm, q_heads=H, kv_heads=Hk, head_dim=d)
    qkv = zeppelin.autograd.remap(qkv, plan, "linear->attention", comm)
    out = zeppelin.autograd.ring_attention(q, k, v, plan, comm, kernel="torch")
    out = zeppelin.autograd.remap(out, plan, "attention->linear", comm)

- remap(x, plan, direction, comm): x [tokens, ...] in one of the plan's
  layouts to the other; backward is the inverse remap of the gradient (a remap
  is a permutation of the batch's rows, so its adjoint is its inverse).
- ulysses(x, layout, heads, comm, q_heads=None, inverse=False): the Ulysses
  exchange, [my tokens, heads, d] -> [all tokens, my heads, d] (inverse: back);
  backward is the exchange the other way. For GQA keys and values (heads <
  q_heads) a head goes to every rank whose query heads use it, and the way back
  sums those copies: that sum is the key/value gradient of the shared head
  (in float32 for bfloat16 and float16, which the C library does not sum).
- ring_attention(q, k, v, plan, comm, kernel=None): causal (as the plan
  says) attention of every sequence over the plan's rings, q [T, H, d], k, v
  [T, Hk, d] in the attention layout; backward runs zpAttentionBackward. On
  CPU tensors the driver works in float32: float32, bfloat16 and float64
  inputs are computed in float32 and the results returned in the input's
  dtype; kernel: "torch" (kernels.TorchKernel, the default), "flash"
  (flash-attention's varlen kernels, each block copied to the GPU),
  "reference" (Zeppelin's C kernels), or a kernels.BlockKernel. On CUDA
  tensors (float32, bfloat16 or float16) it runs on the device in their
  dtype, with Zeppelin's device kernels, on torch's current stream.
- ring_attention_varlen(q, k, v, cu_seqlens, ..., group=...): the same for a
  packed batch described as flash-attention describes it, every sequence on
  one ring of all ranks (varlen_plan), called as ring-flash-attn's varlen
  function is.

An exception in a Python block kernel fails the driver's call on that rank;
ring_attention then aborts the communicator, so the ring's other ranks fail at
once with RemoteError (not at the timeout), and raises the error, whose
__cause__ is the kernel's exception. The communicator is unusable afterwards,
as after any failed collective in NCCL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from ._torch import torch  # an ImportError that says how to get torch when it is missing

from ._buffers import BFLOAT16, FLOAT16, FLOAT32
from .errors import InvalidArgument, ZeppelinError
from .kernels import kernel_of
from .plan import Attention, BatchPlan, Layout, Remap, lengths_from_cu_seqlens, ulysses_alltoall, ulysses_heads

if TYPE_CHECKING:
    from .comm import Communicator

_DIRECTIONS = {"linear->attention": False, "attention->linear": True}


def _plan_comm(plan: BatchPlan, comm: Optional[Communicator], fn: str) -> Communicator:
    comm = comm if comm is not None else getattr(plan, "comm", None)
    if comm is None:
        raise InvalidArgument("%s: pass the plan's communicator (comm=...)" % fn)
    if comm.size != plan.nranks:
        raise InvalidArgument("%s: the plan is for %d ranks, the communicator has %d" % (fn, plan.nranks, comm.size))
    return comm


def _cache(plan):
    """Objects built for a plan (remaps, attention drivers), kept with it."""
    return plan.__dict__.setdefault("_autograd_cache", {})


# ---- remap ----
def plan_remap(plan: BatchPlan, comm: Communicator) -> Remap:
    """The plan's linear -> attention Remap on comm (made once per plan and communicator)."""
    key = ("remap", id(comm))
    c = _cache(plan)
    if key not in c:
        c[key] = Remap(plan.linear_layout, plan.attention_layout, comm)
    return c[key]


class _RemapFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, remap, inverse):
        ctx.remap, ctx.inverse = remap, inverse
        return remap.execute(x.contiguous(), inverse=inverse)

    @staticmethod
    def backward(ctx, g):
        return ctx.remap.execute(g.contiguous(), inverse=not ctx.inverse), None, None


def remap(x: torch.Tensor, plan: BatchPlan, direction: str = "linear->attention",
          comm: Optional[Communicator] = None) -> torch.Tensor:
    """x's rows (this rank's tokens of one of plan's layouts, [tokens, ...]) moved
    to the other layout: direction "linear->attention" or "attention->linear"."""
    if direction not in _DIRECTIONS:
        raise InvalidArgument("remap: direction %r is one of %s" % (direction, ", ".join(_DIRECTIONS)))
    comm = _plan_comm(plan, comm, "remap")
    return _RemapFn.apply(x, plan_remap(plan, comm), _DIRECTIONS[direction])


# ---- Ulysses ----
def _exchange(x, layout, q_heads, heads, comm, direction):
    """ulysses_alltoall of x; the way back sums copies of shared heads, which the C
    library does in float32 or float64 only: other dtypes go through float32."""
    if direction == 1 and heads < q_heads and x.dtype not in (torch.float32, torch.float64):
        return _exchange(x.float(), layout, q_heads, heads, comm, direction).to(x.dtype)
    return ulysses_alltoall(x.contiguous(), layout, q_heads, heads, x.shape[-1], direction, comm)


class _UlyssesFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, layout, q_heads, heads, comm, direction):
        ctx.args = (layout, q_heads, heads, comm, direction)
        return _exchange(x, layout, q_heads, heads, comm, direction)

    @staticmethod
    def backward(ctx, g):
        layout, q_heads, heads, comm, direction = ctx.args
        return _exchange(g, layout, q_heads, heads, comm, 1 - direction), None, None, None, None, None


def ulysses(x: torch.Tensor, layout: Layout, heads: int, comm: Communicator, q_heads: Optional[int] = None,
            inverse: bool = False) -> torch.Tensor:
    """The Ulysses exchange over comm for a batch laid out as layout says.
    Forward: x [this rank's tokens, heads, d] -> [every token in cu_seqlens order,
    this rank's heads, d] (ulysses_heads tells which); inverse=True: back.
    q_heads (default heads): the query heads; keys and values of GQA pass
    heads = q_heads / group. Copies of a head are summed in float32 for 16-bit dtypes."""
    q_heads = heads if q_heads is None else q_heads
    if x.dim() != 3:
        raise InvalidArgument("ulysses: x must be [tokens, heads, head_dim], got shape %s" % (tuple(x.shape),))
    return _UlyssesFn.apply(x, layout, int(q_heads), int(heads), comm, 1 if inverse else 0)


# ---- ring attention ----
_DEVICE_DTYPES = {torch.float32: FLOAT32, torch.bfloat16: BFLOAT16, torch.float16: FLOAT16}


class RingAttention:
    """The attention driver for one plan, communicator, shape and kernel: on
    the host in float32, or on CUDA tensors in their own dtype (device_dtype)."""

    def __init__(self, plan, comm, q_heads, kv_heads, head_dim, kernel="torch", scale=None, device_dtype=None):
        self.device = device_dtype is not None
        self.kernel = kernel_of(kernel)
        self.comm = comm
        fw = self.kernel.block_forward if self.kernel else None
        bw = self.kernel.block_backward if self.kernel else None
        self.attn = Attention(plan, comm, q_heads, kv_heads, head_dim, 0.0 if scale is None else scale, fw, bw,
                              dtype=_DEVICE_DTYPES[device_dtype] if self.device else FLOAT32)

    def _call(self, method, *args):
        try:
            return method(*args)
        except ZeppelinError as e:
            if e.__cause__ is not None:
                # A Python kernel raised: fail the ring's other ranks now, not at the timeout.
                self.comm.abort()
            raise

    def forward(self, q, k, v):
        """out [T, H, d] (q's dtype on a device, else float32) and lse [H, T] (float32)."""
        T, H, d = q.shape
        out = torch.empty(T, H, d, dtype=q.dtype if self.device else torch.float32, device=q.device)
        lse = torch.empty(H, T, dtype=torch.float32, device=q.device)
        self._call(self.attn.forward, q, k, v, out, lse)  # a CUDA tensor's current stream
        return out, lse

    def backward(self, q, k, v, out, lse, dout):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self._call(self.attn.backward, q, k, v, out, lse, dout, dq, dk, dv)
        return dq, dk, dv


class _RingAttentionFn(torch.autograd.Function):
    """(out, lse); lse is not differentiable. Host tensors go through float32;
    CUDA tensors stay in their dtype on the device."""

    @staticmethod
    def forward(ctx, q, k, v, ra):
        dtypes = (q.dtype, k.dtype, v.dtype)
        if not ra.device:
            q, k, v = (t.detach().to(torch.float32).contiguous() for t in (q, k, v))
        else:
            q, k, v = (t.detach().contiguous() for t in (q, k, v))
        out, lse = ra.forward(q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.ra, ctx.dtypes = ra, dtypes
        ctx.mark_non_differentiable(lse)
        return out.to(dtypes[0]), lse

    @staticmethod
    def backward(ctx, g, _g_lse):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.ra.backward(q, k, v, out, lse, g.to(out.dtype).contiguous())
        tq, tk, tv = ctx.dtypes
        return dq.to(tq), dk.to(tk), dv.to(tv), None


def _ring_attention(q, k, v, plan, comm, kernel, scale, fn):
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3 or k.shape != v.shape or q.shape[0] != k.shape[0] \
            or q.shape[2] != k.shape[2]:
        raise InvalidArgument("%s: q [T, H, d], k and v [T, Hk, d] expected, got %s, %s, %s"
                              % (fn, tuple(q.shape), tuple(k.shape), tuple(v.shape)))
    cuda = q.device.type == "cuda"
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.device != q.device:
            raise InvalidArgument("%s: %s is on %s, q on %s" % (fn, name, t.device, q.device))
        if cuda and t.dtype != q.dtype:
            raise InvalidArgument("%s: on CUDA q, k and v share one dtype; %s is %s, q %s" % (fn, name, t.dtype,
                                                                                         q.dtype))
        allowed = tuple(_DEVICE_DTYPES) if cuda else (torch.float32, torch.bfloat16, torch.float16, torch.float64)
        if t.dtype not in allowed:
            raise InvalidArgument("%s: %s has dtype %s; one of %s on %s" % (fn, name, t.dtype,
                                  ", ".join(str(a)[6:] for a in allowed), "CUDA" if cuda else "the CPU"))
        if t.device.type not in ("cpu", "cuda"):
            raise InvalidArgument("%s: %s is on %s; CPU or CUDA tensors" % (fn, name, t.device))
    if kernel is None:
        kernel = "reference" if cuda else "torch"
    if cuda and kernel != "reference":
        # The package's Python block kernels work on host tensors; on CUDA
        # tensors the driver runs Zeppelin's device kernels (flash-attention's
        # varlen kernels are not wired to device blocks yet).
        raise InvalidArgument("%s: on CUDA tensors the kernel is \"reference\" (Zeppelin's device kernels), "
                              "not %r" % (fn, kernel))
    H, Hk, d = q.shape[1], k.shape[1], q.shape[2]
    key = ("attention", id(comm), H, Hk, d, kernel if isinstance(kernel, str) else id(kernel), scale,
           q.dtype if cuda else None)
    c = _cache(plan)
    if key not in c:
        c[key] = RingAttention(plan, comm, H, Hk, d, kernel, scale, q.dtype if cuda else None)
    return _RingAttentionFn.apply(q, k, v, c[key])


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BatchPlan,
                   comm: Optional[Communicator] = None, kernel: Any = None,
                   scale: Optional[float] = None) -> torch.Tensor:
    """Attention of every sequence of plan over its rings: q [T, H, d], k, v
    [T, Hk, d], this rank's tokens of the plan's attention layout (Hk divides H).
    Returns out [T, H, d] in q's dtype. scale: default 1/sqrt(d).
    CPU tensors: computed in float32 by kernel ("torch", the default, "flash",
    "reference" or a kernels.BlockKernel). CUDA tensors (float32, bfloat16 or
    float16, one dtype): computed in that dtype on the device by Zeppelin's
    device kernels, forward and backward enqueued on torch's current stream,
    no block copied to the host."""
    comm = _plan_comm(plan, comm, "ring_attention")
    return _ring_attention(q, k, v, plan, comm, kernel, scale, "ring_attention")[0]


_VARLEN_PLANS: Dict[Tuple[Any, ...], BatchPlan] = {}  # (lengths, ranks, causal) -> plan, the last 64


def varlen_plan(cu_seqlens: Any, nranks: int, causal: bool = True) -> BatchPlan:
    """The plan ring_attention_varlen runs: every sequence of the packed batch
    (cu_seqlens: int32 offsets, as flash-attention's varlen functions take)
    on one ring of all nranks ranks, zigzag-split when causal (each rank a
    chunk from each end, so causal work balances), in even contiguous parts
    otherwise. Its attention_layout shards the packed batch:
    plan.attention_layout.shard(packed, rank) and .unshard(...)."""
    lengths = tuple(lengths_from_cu_seqlens(cu_seqlens))
    key = (lengths, int(nranks), bool(causal))
    plan = _VARLEN_PLANS.get(key)
    if plan is None:
        if len(_VARLEN_PLANS) >= 64:
            _VARLEN_PLANS.pop(next(iter(_VARLEN_PLANS)))
        everyone = list(range(int(nranks)))
        plan = _VARLEN_PLANS[key] = BatchPlan.from_rings(list(lengths), [everyone] * len(lengths), int(nranks),
                                                         causal=bool(causal))
    return plan


def _group_comm(group: Any, fn: str) -> Communicator:
    from .comm import Communicator
    if isinstance(group, Communicator):
        return group
    if group is None:
        raise InvalidArgument("%s: pass group= (a zeppelin.Communicator, or a torch.distributed process group)" % fn)
    made = _GROUP_COMMS.get(id(group))
    if made is None:
        from .distributed import communicator
        made = _GROUP_COMMS[id(group)] = (group, communicator(group))
    return made[1]


# A process group's communicator, made once (the group kept, so its id stays its own).
_GROUP_COMMS: Dict[int, Tuple[Any, Communicator]] = {}


# (lengths, segments of every rank, ranks, causal, communicator) -> (plan, Remap or None), the last 32
_REMAPS: Dict[Tuple[Any, ...], Tuple[Any, Optional[Remap]]] = {}


def _plan_and_remap(lengths: List[int], segments: List[List[Tuple[int, int, int]]], causal: bool,
                    comm: Any) -> Tuple[Any, Optional[Remap]]:
    key = (tuple(lengths), tuple(tuple(s) for s in segments), comm.size, causal, id(comm))
    got = _REMAPS.get(key)
    if got is None:
        plan = varlen_plan([0] + [sum(lengths[:i + 1]) for i in range(len(lengths))], comm.size, causal)
        theirs = plan.attention_layout
        same = all([tuple(x) for x in theirs.segments(r)] == list(segments[r]) for r in range(comm.size))
        remap = None if same else Remap(Layout.create(lengths, segments), theirs, comm)
        if len(_REMAPS) >= 32:
            _REMAPS.pop(next(iter(_REMAPS)))
        got = _REMAPS[key] = (plan, remap)
    return got


def _attend(fn: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: List[int],
            segments: List[List[Tuple[int, int, int]]], causal: bool, softmax_scale: Optional[float],
            comm: Any, kernel: Any = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Attention of the batch of these lengths whose tokens lie on the ranks
    as segments say: out [t, H, d] and lse [H, t] in this rank's order."""
    mine = sum(c for _, _, c in segments[comm.rank])
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 3 or t.shape[0] != mine:
            raise InvalidArgument("%s: %s has shape %s; this rank's tokens by cu_seqlens are %d: [%d, heads, "
                                  "head_dim] expected" % (fn, name, tuple(t.shape), mine, mine))
    plan, remap = _plan_and_remap(lengths, segments, bool(causal), comm)
    if remap is not None:
        q, k, v = (_RemapFn.apply(t, remap, False) for t in (q, k, v))
    out, lse = _ring_attention(q, k, v, plan, comm, kernel, softmax_scale, fn)
    if remap is not None:
        out = _RemapFn.apply(out, remap, True)
        lse = remap.execute(lse.t().contiguous(), inverse=True).t()
    return out, lse


_LAYOUTS = ("plan", "zigzag", "contiguous")


def _layout_segments(fn: str, layout: Any, lengths: List[int], nranks: int, plan: BatchPlan) -> Any:
    """Every rank's segments of the layout ring_attention_varlen was told."""
    if isinstance(layout, str) and layout in _LAYOUTS:
        if layout == "plan":
            lay = plan.attention_layout
        else:
            cu = [0]
            for L in lengths:
                cu.append(cu[-1] + L)
            lay = Layout.from_thd(cu, nranks, layout)
    elif isinstance(layout, Layout):
        if list(layout.lengths) != list(lengths) or layout.nranks != nranks:
            raise InvalidArgument("%s: layout holds %d sequences on %d ranks, cu_seqlens %d on %d"
                                  % (fn, len(layout.lengths), layout.nranks, len(lengths), nranks))
        lay = layout
    else:
        raise InvalidArgument("%s: layout=%r: say how q, k and v are sharded: \"plan\" (varlen_plan(cu_seqlens, "
                              "ranks, causal).attention_layout.shard made them), \"zigzag\", \"contiguous\" or a "
                              "Layout" % (fn, layout))
    return [[tuple(x) for x in lay.segments(r)] for r in range(nranks)]


def ring_attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: Any,
                          max_seqlen: Optional[int] = None, *, causal: bool, layout: Any,
                          softmax_scale: Optional[float] = None, group: Any = None, return_lse: bool = False,
                          kernel: Any = None) -> Any:
    """Ring attention of a packed batch over every rank of group: cu_seqlens
    (int32 offsets of the WHOLE batch, as flash-attention takes them);
    q [T, H, d], k, v [T, Hk, d] this rank's shard of the batch in the layout
    the call names (keyword-only and required, as causal is, so that neither
    can be assumed wrongly): "plan" (varlen_plan(cu_seqlens, size,
    causal).attention_layout: zigzag chunks r and 2W-1-r when causal,
    contiguous parts otherwise; its .shard(packed, rank) makes it),
    "zigzag", "contiguous" (Layout.from_thd's), or a Layout. A layout other
    than the plan's is remapped to it and back (gradients too). group: a
    Communicator or a torch.distributed process group (a communicator over
    its ranks is made once, collectively). max_seqlen is checked against the
    batch. Returns out [T, H, d], and with return_lse also lse [H, T]
    (float32, natural log, flash-attention's softmax_lse layout), both in the
    layout of q. CPU or CUDA tensors as ring_attention takes them."""
    fn = "ring_attention_varlen"
    if not isinstance(causal, bool):
        raise InvalidArgument("%s: causal=%r: True or False" % (fn, causal))
    comm = _group_comm(group, fn)
    plan = varlen_plan(cu_seqlens, comm.size, causal)
    if max_seqlen is not None and int(max_seqlen) < max(plan.lengths, default=0):
        raise InvalidArgument("%s: max_seqlen %d, but cu_seqlens has a sequence of %d tokens"
                              % (fn, int(max_seqlen), max(plan.lengths)))
    lengths = list(plan.lengths)
    segments = _layout_segments(fn, layout, lengths, comm.size, plan)
    mine = sum(c for _, _, c in segments[comm.rank])
    if q.dim() >= 1 and q.shape[0] != mine:
        raise InvalidArgument("%s: q has %d rows, but this rank holds %d tokens of the batch in layout %r: shard it "
                              "with varlen_plan(cu_seqlens, %d%s).attention_layout.shard(packed, %d) and pass "
                              "layout=\"plan\"" % (fn, q.shape[0], mine, layout if isinstance(layout, str) else
                                                   "Layout", comm.size, "" if causal else ", causal=False", comm.rank))
    out, lse = _attend(fn, q, k, v, lengths, segments, causal, softmax_scale, comm, kernel)
    return (out, lse) if return_lse else out


__all__ = ["remap", "ulysses", "ulysses_heads", "ring_attention", "ring_attention_varlen", "varlen_plan",
           "RingAttention", "plan_remap"]
