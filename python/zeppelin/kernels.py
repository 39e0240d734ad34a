"""Attention block kernels for the ring-attention driver, written in Python.

The driver (zpAttentionForward / zpAttentionBackward, plan.Attention) calls a
kernel once for every (query block, key/value block) pair it does not skip
(see "Attention block kernels" in zeppelin.h). A BlockKernel works on torch
tensors that alias the driver's float32 buffers (plan.AttnBlock.tensor):

  forward(q [sq, H, d], k, v [sk, Hk, d], causal, scale) -> (out [sq, H, d], lse [H, sq])
  backward(q, k, v, out, lse, dout, causal, scale) -> (dq, dk, dv) of this block

The driver merges the blocks' outputs by their log-sum-exp and passes the
merged out and lse of the whole row to backward (flash-attention's contract);
block_forward / block_backward write the results where the driver wants them
(backward adds its share, as the contract says).

TorchKernel computes in float32 with torch (any CPU). FlashKernel runs
flash-attention's varlen kernels on a GPU; it exists only where flash_attn
imports and CUDA is available (flash_available()); the package imports and
tests without it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Tuple

from ._torch import torch  # an ImportError that says how to get torch when it is missing

from .errors import ZeppelinError

if TYPE_CHECKING:
    from .plan import AttnBlock

MASK_CAUSAL = 1


class BlockKernel:
    """Base of Python kernels: subclass and define forward and backward on torch
    tensors (see the module's text)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def backward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 dout: torch.Tensor, causal: bool, scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def block_forward(self, blk: AttnBlock) -> None:
        """The driver's forward call on one plan.AttnBlock."""
        out, lse = self.forward(blk.tensor("q"), blk.tensor("k"), blk.tensor("v"), blk.mask == MASK_CAUSAL,
                                blk.scale)
        blk.tensor("out").copy_(out)
        blk.tensor("lse").copy_(lse)

    def block_backward(self, blk: AttnBlock) -> None:
        """The driver's backward call on one plan.AttnBlock: adds this block's gradients."""
        t = blk.tensor
        dq, dk, dv = self.backward(t("q"), t("k"), t("v"), t("out"), t("lse"), t("dout"), blk.mask == MASK_CAUSAL,
                                   blk.scale)
        t("dq").add_(dq)
        t("dk").add_(dk)
        t("dv").add_(dv)


def _scores(q, k, causal, scale):
    """Scaled scores [H, sq, sk] with k's heads shared by H / Hk query heads each; causal masks j > i."""
    rep = q.shape[1] // k.shape[1]
    kk = k.repeat_interleave(rep, dim=1) if rep > 1 else k
    s = torch.einsum("ihd,jhd->hij", q, kk) * scale
    if causal:
        sq, sk = q.shape[0], k.shape[0]
        s = s.masked_fill(torch.ones(sq, sk, dtype=torch.bool).triu(1), float("-inf"))
    return s


class TorchKernel(BlockKernel):
    """Exact attention of one block in float32 with torch (the driver's buffers are
    float32; inputs of bfloat16 or float64 reach the kernel as float32)."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
        rep = q.shape[1] // k.shape[1]
        s = _scores(q, k, causal, scale)
        lse = torch.logsumexp(s, dim=-1)                              # [H, sq]
        p = torch.exp(s - lse[..., None])
        vv = v.repeat_interleave(rep, dim=1) if rep > 1 else v
        out = torch.einsum("hij,jhd->ihd", p, vv)
        return out, lse

    def backward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 dout: torch.Tensor, causal: bool, scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        H, Hk = q.shape[1], k.shape[1]
        rep = H // Hk
        p = torch.exp(_scores(q, k, causal, scale) - lse[..., None])  # the row's probabilities in this block
        vv = v.repeat_interleave(rep, dim=1) if rep > 1 else v
        kk = k.repeat_interleave(rep, dim=1) if rep > 1 else k
        dv = torch.einsum("hij,ihd->jhd", p, dout)
        dp = torch.einsum("ihd,jhd->hij", dout, vv)
        delta = (dout * out).sum(-1).transpose(0, 1)                  # [H, sq]
        ds = p * (dp - delta[..., None]) * scale
        dq = torch.einsum("hij,jhd->ihd", ds, kk)
        dk = torch.einsum("hij,ihd->jhd", ds, q)
        if rep > 1:  # the query heads that shared a key/value head add up
            dk = dk.view(dk.shape[0], Hk, rep, -1).sum(2)
            dv = dv.view(dv.shape[0], Hk, rep, -1).sum(2)
        return dq, dk, dv


def flash_available() -> bool:
    """True when flash-attention's varlen kernels can run here (flash_attn and a GPU)."""
    try:
        import flash_attn  # noqa: F401
    except Exception:
        return False
    return torch.cuda.is_available()


class FlashKernel(BlockKernel):
    """flash-attention's varlen forward and backward on a GPU, for each block: the
    block's float32 host rows go to the GPU in dtype (bfloat16 by default), and
    out, lse and the gradients come back as float32. Needs flash_available().

    Not exercised by the test suite on machines without a GPU and flash_attn."""

    def __init__(self, dtype: torch.dtype = torch.bfloat16, device: Any = "cuda") -> None:
        if not flash_available():
            raise ZeppelinError("FlashKernel: flash_attn does not import or no GPU is present; "
                                "use kernel='torch'")
        from flash_attn import flash_attn_interface as fai
        self.fai, self.dtype, self.device = fai, dtype, device

    def _cu(self, n):
        return torch.tensor([0, n], dtype=torch.int32, device=self.device)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
        g = [t.to(self.device, self.dtype) for t in (q, k, v)]
        sq, sk = q.shape[0], k.shape[0]
        out, lse, _ = self.fai.flash_attn_varlen_func(g[0], g[1], g[2], self._cu(sq), self._cu(sk), sq, sk,
                                                      softmax_scale=scale, causal=causal, return_attn_probs=True)
        # lse is [H, total_q] or, in older releases, [batch, H, max_seqlen]
        return out.float().cpu(), lse.reshape(-1, lse.shape[-1])[:, :sq].float().cpu()

    def backward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 dout: torch.Tensor, causal: bool, scale: float) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # The low-level backward, since it takes the row's merged lse (a block's own
        # forward would not); its parameters differ between releases, so by name.
        import inspect
        fn = self.fai._flash_attn_varlen_backward
        g = [t.to(self.device, self.dtype) for t in (q, k, v, out, dout)]
        sq, sk = q.shape[0], k.shape[0]
        dq, dk, dv = (torch.empty_like(t) for t in g[:3])
        args = {"dout": g[4], "q": g[0], "k": g[1], "v": g[2], "out": g[3],
                "softmax_lse": lse.to(self.device).contiguous(), "dq": dq, "dk": dk, "dv": dv,
                "cu_seqlens_q": self._cu(sq), "cu_seqlens_k": self._cu(sk), "max_seqlen_q": sq, "max_seqlen_k": sk,
                "dropout_p": 0.0, "softmax_scale": scale, "causal": causal, "window_size": (-1, -1),
                "window_size_left": -1, "window_size_right": -1, "softcap": 0.0, "alibi_slopes": None,
                "deterministic": False, "rng_state": None}
        params = inspect.signature(fn).parameters
        fn(**{name: args[name] for name in params if name in args})
        return dq.float().cpu(), dk.float().cpu(), dv.float().cpu()


def kernel_of(kernel: Any) -> Optional[BlockKernel]:
    """A BlockKernel from kernel: "torch", "flash", a BlockKernel, or None for
    "reference" (the C reference kernels, zpAttnRefForward / Backward)."""
    if isinstance(kernel, BlockKernel):
        return kernel
    if kernel == "torch":
        return TorchKernel()
    if kernel == "flash":
        return FlashKernel()
    if kernel == "reference":
        return None
    raise ValueError("kernel must be 'torch', 'flash', 'reference' or a BlockKernel, not %r" % (kernel,))
