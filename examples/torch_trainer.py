#!/usr/bin/env python3
"""torch_trainer.py: a small decoder-only transformer trained on Zeppelin, checked
against the same model in one process.

    /usr/bin/python3 examples/torch_trainer.py --ranks 1          one process, float64 (the reference)
    build/zprun -n 4 /usr/bin/python3 examples/torch_trainer.py   distributed, checked, PASS
    python3 -m torch.distributed.run --nproc-per-node 4 examples/torch_trainer.py
    build/zprun --nodes 2 --ranks-per-node 2 ... examples/torch_trainer.py

The model (tiny, so a step takes well under a second on a CPU): token
embedding, --layers blocks of [RMSNorm, attention with RoPE and grouped-query
heads (4 query heads, 2 key/value heads), RMSNorm, SwiGLU MLP], RMSNorm, an
output head; next-token cross-entropy over every sequence of a packed batch.
Batches: sequence lengths drawn at random from tests/data/prolong64k.txt,
divided by --scale, until a batch holds --tokens tokens; the tokens follow a
noisy rule (next = 5 * token + 3 mod vocab, 1 in 8 at random) so the loss falls.

Distributed (more than one rank in the environment): every rank builds the same
model and draws the same batches. zeppelin.plan_batch plans each batch; the
embedding, projections, MLP and loss run in the plan's linear (token-balanced)
layout, each rank on its own tokens; q, k and v move to the attention layout
with one remap, ring attention runs over the plan's rings (Zeppelin's driver,
the package's torch block kernel, float32), and the output remaps back. The
weight gradients are summed across ranks with all_reduce. Every step, every rank
also runs the one-process model in float64 on the whole batch and compares the
loss and every gradient; rank 0 prints PASS when they agree within --rtol
(attention is float32 in the distributed run), and the step time per phase.
"""

import argparse
import math
import os
import sys
import time

import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "tests", "data", "prolong64k.txt")


# ---- data ----

def draw_batches(path, steps, tokens, scale, vocab, seed):
    """steps batches of (lengths, token ids); the same on every rank for the same seed."""
    with open(path) as f:
        pool = [int(line) for line in f if line.strip()]
    g = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(steps):
        lengths, total = [], 0
        while total < tokens:
            n = max(2, pool[int(torch.randint(len(pool), (1,), generator=g))] // scale)
            n = min(n, tokens - total) if tokens - total >= 2 else n
            lengths.append(n)
            total += n
        ids = torch.empty(total, dtype=torch.long)
        at = 0
        for n in lengths:
            t = int(torch.randint(vocab, (1,), generator=g))
            noise = torch.rand(n, generator=g) < 0.125
            rnd = torch.randint(vocab, (n,), generator=g)
            for i in range(n):
                ids[at + i] = t
                t = int(rnd[i]) if noise[i] else (5 * t + 3) % vocab
            at += n
        batches.append((lengths, ids))
    return batches


def token_positions(lengths, segments):
    """For the tokens of segments [(seq, start, count)] in order: their index in the
    packed batch, their position in their sequence, and their target's index (-1: none)."""
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    index, pos, target = [], [], []
    for seq, start, count in segments:
        p = torch.arange(start, start + count)
        pos.append(p)
        index.append(starts[seq] + p)
        target.append(torch.where(p + 1 < lengths[seq], starts[seq] + p + 1, torch.full_like(p, -1)))
    return torch.cat(index), torch.cat(pos), torch.cat(target)


# ---- the model ----

class Config:
    def __init__(self, a):
        self.vocab, self.dim, self.layers = a.vocab, a.dim, a.layers
        self.heads, self.kv_heads = a.heads, a.kv_heads
        self.head_dim = a.dim // a.heads
        self.mlp = a.mlp


def rms_norm(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, base=10000.0):
    """Rotary position embedding of x [T, heads, d] at positions pos [T] (halves rotated)."""
    d = x.shape[-1]
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = (pos.to(torch.float64)[:, None] * inv[None, :]).to(x.dtype)
    cos, sin = ang.cos()[:, None, :], ang.sin()[:, None, :]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Model(torch.nn.Module):
    """Parameters in one flat dict so ranks can sum their gradients in one call."""

    def __init__(self, c, seed, dtype=torch.float64):
        super().__init__()
        self.c = c
        g = torch.Generator().manual_seed(seed)

        def p(*shape, std):
            return torch.nn.Parameter((torch.randn(*shape, generator=g, dtype=torch.float64) * std).to(dtype))

        def ones(n):
            return torch.nn.Parameter(torch.ones(n, dtype=dtype))

        qkv = (c.heads + 2 * c.kv_heads) * c.head_dim
        self.embed = p(c.vocab, c.dim, std=1.0)
        self.blocks = torch.nn.ModuleList()
        for _ in range(c.layers):
            b = torch.nn.Module()
            b.norm1, b.norm2 = ones(c.dim), ones(c.dim)
            b.wqkv = p(c.dim, qkv, std=c.dim ** -0.5)
            b.wo = p(c.heads * c.head_dim, c.dim, std=(c.heads * c.head_dim) ** -0.5 / c.layers)
            b.w1 = p(c.dim, c.mlp, std=c.dim ** -0.5)
            b.w3 = p(c.dim, c.mlp, std=c.dim ** -0.5)
            b.w2 = p(c.mlp, c.dim, std=c.mlp ** -0.5 / c.layers)
            self.blocks.append(b)
        self.norm = ones(c.dim)
        self.head = p(c.dim, c.vocab, std=c.dim ** -0.5)

    def forward(self, ids, pos, targets, ntargets, attend, timer):
        """Summed next-token loss of these tokens over ntargets (the batch's count).

        ids, pos, targets: this process's tokens (targets: token ids, -1 none).
        attend(qkv [T, (H + 2 Hkv) * d]) -> o [T, H * d]: attention over the
        batch's sequences, in whatever layout the tokens are."""
        c = self.c
        with timer("linear"):
            x = self.embed[ids]
        for b in self.blocks:
            with timer("linear"):
                h = rms_norm(x, b.norm1) @ b.wqkv
                T = h.shape[0]
                q, k, v = h.split([c.heads * c.head_dim, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim], dim=1)
                q = rope(q.reshape(T, c.heads, c.head_dim), pos)
                k = rope(k.reshape(T, c.kv_heads, c.head_dim), pos)
                qkv = torch.cat([q.reshape(T, -1), k.reshape(T, -1), v], dim=1)
            o = attend(qkv)
            with timer("linear"):
                x = x + o @ b.wo
                h = rms_norm(x, b.norm2)
                x = x + (F.silu(h @ b.w1) * (h @ b.w3)) @ b.w2
        with timer("linear"):
            logits = rms_norm(x, self.norm) @ self.head
            keep = targets >= 0
            return F.cross_entropy(logits[keep], targets[keep], reduction="sum") / ntargets


def split_qkv(qkv, c):
    T = qkv.shape[0]
    q, k, v = qkv.split([c.heads * c.head_dim, c.kv_heads * c.head_dim, c.kv_heads * c.head_dim], dim=1)
    return (q.reshape(T, c.heads, c.head_dim), k.reshape(T, c.kv_heads, c.head_dim),
            v.reshape(T, c.kv_heads, c.head_dim))


def reference_attention(qkv, lengths, c):
    """Causal attention of each sequence of a packed batch (all its tokens here, in order)."""
    q, k, v = split_qkv(qkv, c)
    rep = c.heads // c.kv_heads
    out, at = [], 0
    for n in lengths:
        qs = q[at:at + n].transpose(0, 1)                                   # [H, n, d]
        ks = k[at:at + n].repeat_interleave(rep, dim=1).transpose(0, 1)
        vs = v[at:at + n].repeat_interleave(rep, dim=1).transpose(0, 1)
        s = qs @ ks.transpose(1, 2) / math.sqrt(c.head_dim)
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out.append((s.softmax(-1) @ vs).transpose(0, 1).reshape(n, -1))
        at += n
    return torch.cat(out)


# ---- timing ----

class Timer:
    """Seconds per phase, summed over a step; backward regions are marked with
    identity autograd functions (their backward runs in reverse order)."""

    def __init__(self):
        self.t = {}

    def add(self, name, dt):
        self.t[name] = self.t.get(name, 0.0) + dt

    def __call__(self, name):
        timer = self

        class Scope:
            def __enter__(self):
                self.t0 = time.perf_counter()

            def __exit__(self, *exc):
                timer.add(name, time.perf_counter() - self.t0)
        return Scope()

    def region(self, name, fn, x):
        """y = fn(x), timing fn's forward as name and its backward as name + "_bwd"."""
        with self(name):
            y = fn(_Mark.apply(x, self, name + "_bwd", 1))
        return _Mark.apply(y, self, name + "_bwd", 0)


class _Mark(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, timer, name, start):
        ctx.timer, ctx.name, ctx.start = timer, name, start
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        now = time.perf_counter()
        if ctx.start:   # the region's input: its backward is over
            ctx.timer.add(ctx.name, now - ctx.timer.t.pop("_open_" + ctx.name))
        else:           # the region's output: its backward begins
            ctx.timer.t["_open_" + ctx.name] = now
        return g, None, None, None


# ---- the runs ----

def reference_step(model, lengths, ids, timer=None):
    """Loss and gradients of the whole batch in one process."""
    timer = timer or Timer()
    c = model.c
    index, pos, target = token_positions(lengths, [(s, 0, n) for s, n in enumerate(lengths)])
    targets = torch.where(target >= 0, ids[target.clamp(min=0)], torch.full_like(target, -1))
    ntargets = int((targets >= 0).sum())
    model.zero_grad()
    loss = model(ids[index], pos, targets, ntargets,
                 lambda qkv: timer.region("attention", lambda x: reference_attention(x, lengths, c), qkv), timer)
    with timer("backward"):
        loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def compare(name, got, want):
    """Largest difference relative to the reference's largest magnitude."""
    return float((got - want).abs().max() / want.abs().max().clamp(min=1e-30))


# ---- the distributed run ----

def import_zeppelin():
    """The zeppelin package: installed, or this source tree's python/."""
    try:
        import zeppelin
    except ImportError:
        sys.path.insert(0, os.path.join(HERE, "..", "python"))
        import zeppelin
    import zeppelin.autograd
    return zeppelin


def flat_grads(model):
    return torch.cat([p.grad.reshape(-1) for p in model.parameters()])


def set_flat_grads(model, flat):
    at = 0
    for p in model.parameters():
        n = p.numel()
        p.grad.copy_(flat[at:at + n].view_as(p))
        at += n


PHASES = ["plan", "linear", "remap", "attention", "backward", "linear_bwd", "remap_bwd", "attention_bwd",
          "all_reduce", "optimizer", "step"]


def distributed_step(model, comm, zp, lengths, ids, kernel, plan_kind, timer):
    """One step on this rank's share of the batch; returns the batch's loss (summed over ranks)."""
    c = model.c
    za = zp.autograd
    with timer("plan"):
        if plan_kind == "planner":
            # The planner weighs attention compute against communication; it is given
            # its default shape (a llama-8b layer: 32 query / 8 key-value heads of 128,
            # bf16) so that it places this toy model's batch as it would a real one's
            # (with the toy's own shape every sequence is cheapest kept local).
            plan = zp.plan_batch(lengths, comm, causal=True)
        else:  # ring-all: plain ring attention, every sequence of >= 2 tokens per rank over all ranks
            n = comm.size
            rings = [list(range(n)) if L >= 2 * n else [s % n] for s, L in enumerate(lengths)]
            per_node = int(os.environ.get("ZP_LOCAL_NRANKS", os.environ.get("LOCAL_WORLD_SIZE", "0")))
            plan = zp.BatchPlan.from_rings(lengths, rings, n, causal=True, ranks_per_node=per_node)
        index, pos, target = token_positions(lengths, plan.linear_layout.segments(comm.rank))
        targets = torch.where(target >= 0, ids[target.clamp(min=0)], torch.full_like(target, -1))
        ntargets = sum(n - 1 for n in lengths)

    def attend(qkv):
        """qkv of my linear-layout tokens -> attention output of the same tokens."""
        def attention(x):
            q, k, v = split_qkv(x, c)
            out = za.ring_attention(q, k, v, plan, comm, kernel=kernel)
            return out.reshape(x.shape[0], c.heads * c.head_dim)
        x = timer.region("remap", lambda y: za.remap(y, plan, "linear->attention", comm), qkv)
        o = timer.region("attention", attention, x)
        return timer.region("remap", lambda y: za.remap(y, plan, "attention->linear", comm), o)

    model.zero_grad()
    loss = model(ids[index], pos, targets, ntargets, attend, timer)
    with timer("backward"):
        loss.backward()
    with timer("all_reduce"):
        flat = flat_grads(model)
        comm.all_reduce(flat)
        set_flat_grads(model, flat)
        total = loss.detach().reshape(1).clone()
        comm.all_reduce(total)
    classes = [plan.sequence(s)[0] for s in range(len(lengths))]
    return total[0], [classes.count(k) for k in (zp.LOCAL, zp.INTRA_NODE, zp.INTER_NODE)]


def run_distributed(a, c, batches):
    zp = import_zeppelin()
    with zp.init() as comm:
        me = comm.rank
        model = Model(c, a.seed)
        opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
        ref = None if a.no_check else Model(c, a.seed)
        ref_opt = None if ref is None else torch.optim.AdamW(ref.parameters(), lr=a.lr)
        worst = 0.0
        times = []
        if me == 0:
            print(f"torch_trainer: {comm.size} ranks, {a.steps} steps of {a.tokens} tokens (lengths from "
                  f"{os.path.basename(a.lengths)} / {a.scale}), {c.layers} layers, dim {c.dim}, {c.heads} query / "
                  f"{c.kv_heads} key-value heads, plan {a.plan}, kernel {a.kernel}", flush=True)
        for step, (lengths, ids) in enumerate(batches):
            timer = Timer()
            t0 = time.perf_counter()
            loss, rings = distributed_step(model, comm, zp, lengths, ids, a.kernel, a.plan, timer)
            with timer("optimizer"):
                opt.step()
            timer.add("step", time.perf_counter() - t0)
            times.append(timer.t)
            line = (f"step {step}: {len(lengths)} sequences ({rings[0]} local, {rings[1]} on rings within a node, "
                    f"{rings[2]} across nodes), {len(ids)} tokens, loss {loss.item():.6f}")
            if ref is not None:
                ref_loss, ref_grads = reference_step(ref, lengths, ids)
                ref_opt.step()
                diffs = {"loss": abs(loss.item() - ref_loss.item()) / abs(ref_loss.item())}
                for n, p in model.named_parameters():
                    diffs[n] = compare(n, p.grad, ref_grads[n])
                name = max(diffs, key=diffs.get)
                worst = max(worst, diffs[name])
                line += (f" (one process, float64: {ref_loss.item():.6f}); largest difference {diffs[name]:.2e} "
                         f"({name})")
            if me == 0:
                print(line, flush=True)
        # The slowest rank's time per phase, mean over the steps after the first.
        keep = times[1:] or times
        for t in keep:  # the backward of everything but remaps and attention
            t["linear_bwd"] = t["backward"] - t.get("remap_bwd", 0.0) - t.get("attention_bwd", 0.0)
        mean = torch.tensor([sum(t.get(p, 0.0) for t in keep) / len(keep) for p in PHASES] + [worst],
                            dtype=torch.float64)
        comm.all_reduce(mean, op=zp.MAX)
        if me == 0:
            ms = dict(zip(PHASES, (mean[:-1] * 1e3).tolist()))
            print("time per step, ms (slowest rank, mean of steps 1..%d): " % (len(times) - 1) +
                  ", ".join("%s %.1f" % (p, ms[p]) for p in ["step", "plan", "linear", "remap", "attention",
                                                           "backward", "linear_bwd", "remap_bwd",
                                                           "attention_bwd", "all_reduce", "optimizer"]),
                  flush=True)
        worst = float(mean[-1])
        if a.no_check:
            return 0
        ok = worst <= a.rtol
        if me == 0:
            print("%s: loss and every gradient of %d steps on %d ranks within %.1e of the one-process float64 "
                  "run (largest difference %.2e)" % ("PASS" if ok else "FAIL", len(times), comm.size, a.rtol, worst),
                  flush=True)
        return 0 if ok else 1


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=1024, help="tokens per batch (default 1024)")
    ap.add_argument("--scale", type=int, default=64, help="divide prolong64k's lengths by this (default 64)")
    ap.add_argument("--lengths", default=DATA, help="sequence lengths, one per line")
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--mlp", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--rtol", type=float, default=1e-5,
                    help="largest allowed difference to the reference, relative to its largest magnitude")
    ap.add_argument("--ranks", type=int, default=0, help="1: the one-process run only (default: from the environment)")
    ap.add_argument("--no-check", action="store_true", help="distributed: skip the one-process reference")
    ap.add_argument("--plan", default="planner", choices=["planner", "ring-all"],
                    help="planner: zeppelin.plan_batch (default); ring-all: every sequence on a ring of all ranks")
    ap.add_argument("--kernel", default="torch", help="ring attention's block kernel: torch, reference (C) or flash")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    c = Config(a)
    if c.heads % c.kv_heads or a.dim % a.heads:
        ap.error("--kv-heads must divide --heads, and --heads --dim")
    batches = draw_batches(a.lengths, a.steps, a.tokens, a.scale, a.vocab, a.seed)
    world = a.ranks or int(os.environ.get("ZP_NRANKS", os.environ.get("WORLD_SIZE",
                                          os.environ.get("OMPI_COMM_WORLD_SIZE", os.environ.get("SLURM_NTASKS", "1")))))
    if world > 1:
        return run_distributed(a, c, batches)

    model = Model(c, a.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr)
    for step, (lengths, ids) in enumerate(batches):
        timer = Timer()
        t0 = time.perf_counter()
        loss, _ = reference_step(model, lengths, ids, timer)
        opt.step()
        dt = time.perf_counter() - t0
        print(f"step {step}: {len(lengths)} sequences, {len(ids)} tokens, loss {loss.item():.6f}, "
              f"{dt * 1e3:.1f} ms (attention {timer.t.get('attention', 0) * 1e3:.1f} ms, "
              f"backward {timer.t.get('backward', 0) * 1e3:.1f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
