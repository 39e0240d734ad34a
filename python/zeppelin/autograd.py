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
- ring_attention(q, k, v, plan, comm, kernel="torch"): causal (as the plan
  says) attention of every sequence over the plan's rings, q [T, H, d], k, v
  [T, Hk, d] in the attention layout; backward runs zpAttentionBackward. The
  driver works in float32: float32, bfloat16 and float64 inputs are computed in
  float32 and the results returned in the input's dtype. kernel: "torch"
  (kernels.TorchKernel), "flash" (flash-attention's varlen kernels, GPU),
  "reference" (Zeppelin's C kernels), or a kernels.BlockKernel.

An exception in a Python block kernel fails the driver's call on that rank;
ring_attention then aborts the communicator, so the ring's other ranks fail at
once with RemoteError (not at the timeout), and raises the error, whose
__cause__ is the kernel's exception. The communicator is unusable afterwards,
as after any failed collective in NCCL.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

import torch

from .errors import InvalidArgument, ZeppelinError
from .kernels import kernel_of
from .plan import Attention, Remap, ulysses_alltoall, ulysses_heads

if TYPE_CHECKING:
    from .comm import Communicator
    from .plan import BatchPlan, Layout

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
class RingAttention:
    """The attention driver for one plan, communicator, shape and kernel."""

    def __init__(self, plan, comm, q_heads, kv_heads, head_dim, kernel="torch", scale=None):
        self.kernel = kernel_of(kernel)
        self.comm = comm
        fw = self.kernel.block_forward if self.kernel else None
        bw = self.kernel.block_backward if self.kernel else None
        self.attn = Attention(plan, comm, q_heads, kv_heads, head_dim, 0.0 if scale is None else scale, fw, bw)

    def _call(self, method, *args):
        try:
            return method(*args)
        except ZeppelinError as e:
            if e.__cause__ is not None:
                # A Python kernel raised: fail the ring's other ranks now, not at the timeout.
                self.comm.abort()
            raise

    def forward(self, q, k, v):
        T, H, d = q.shape
        out = torch.empty(T, H, d, dtype=torch.float32)
        lse = torch.empty(H, T, dtype=torch.float32)
        self._call(self.attn.forward, q, k, v, out, lse)
        return out, lse

    def backward(self, q, k, v, out, lse, dout):
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        self._call(self.attn.backward, q, k, v, out, lse, dout, dq, dk, dv)
        return dq, dk, dv


class _RingAttentionFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, ra):
        dtype = q.dtype
        q32, k32, v32 = (t.detach().to(torch.float32).contiguous() for t in (q, k, v))
        out, lse = ra.forward(q32, k32, v32)
        ctx.save_for_backward(q32, k32, v32, out, lse)
        ctx.ra, ctx.dtypes = ra, (q.dtype, k.dtype, v.dtype)
        return out.to(dtype)

    @staticmethod
    def backward(ctx, g):
        q32, k32, v32, out, lse = ctx.saved_tensors
        dq, dk, dv = ctx.ra.backward(q32, k32, v32, out, lse, g.to(torch.float32).contiguous())
        tq, tk, tv = ctx.dtypes
        return dq.to(tq), dk.to(tk), dv.to(tv), None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: BatchPlan,
                   comm: Optional[Communicator] = None, kernel: Any = "torch",
                   scale: Optional[float] = None) -> torch.Tensor:
    """Attention of every sequence of plan over its rings: q [T, H, d], k, v
    [T, Hk, d], this rank's tokens of the plan's attention layout (Hk divides H).
    Returns out [T, H, d] in q's dtype. scale: default 1/sqrt(d)."""
    comm = _plan_comm(plan, comm, "ring_attention")
    if q.dim() != 3 or k.dim() != 3 or v.dim() != 3 or k.shape != v.shape or q.shape[0] != k.shape[0] \
            or q.shape[2] != k.shape[2]:
        raise InvalidArgument("ring_attention: q [T, H, d], k and v [T, Hk, d] expected, got %s, %s, %s"
                              % (tuple(q.shape), tuple(k.shape), tuple(v.shape)))
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dtype not in (torch.float32, torch.bfloat16, torch.float16, torch.float64):
            raise InvalidArgument("ring_attention: %s has dtype %s; float32, bfloat16, float16 or float64"
                                  % (name, t.dtype))
        if t.device.type != "cpu":
            raise InvalidArgument("ring_attention: %s is on %s; the driver takes host tensors" % (name, t.device))
    H, Hk, d = q.shape[1], k.shape[1], q.shape[2]
    key = ("attention", id(comm), H, Hk, d, kernel if isinstance(kernel, str) else id(kernel), scale)
    c = _cache(plan)
    if key not in c:
        c[key] = RingAttention(plan, comm, H, Hk, d, kernel, scale)
    return _RingAttentionFn.apply(q, k, v, c[key])


__all__ = ["remap", "ulysses", "ulysses_heads", "ring_attention", "RingAttention", "plan_remap"]
