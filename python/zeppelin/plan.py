"""Batch plans, layouts, remaps, and thin bindings of the Ulysses exchange,
rings and the ring-attention driver (for autograd functions built on them)."""

from __future__ import annotations

import ctypes
import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from . import _lib
from ._buffers import BFLOAT16, DTYPE_NAMES, FLOAT16, FLOAT32, buffer
from .comm import Communicator
from .errors import INVALID_USAGE, InvalidArgument, InvalidUsage, check, error_from

# Sequences of ints, or 1-D tensors or arrays of them; buffers and streams
# as the data calls take them (comm.py).
Ints = Union[Sequence[int], Any]
Segment = Tuple[int, int, int]  # (seq, start, count)

ATTENTION, LINEAR = 0, 1  # zpLayoutKind_t
LOCAL, INTRA_NODE, INTER_NODE = 0, 1, 2  # a sequence's class in a plan


def _int64s(values, what):
    try:
        vals = [int(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]
    except (TypeError, ValueError):
        raise InvalidArgument("%s must be a sequence of integers" % what) from None
    return vals, (ctypes.c_int64 * max(len(vals), 1))(*vals)


def lengths_from_cu_seqlens(cu_seqlens: Ints) -> List[int]:
    """Sequence lengths from a packed batch's cumulative offsets (flash-attn's,
    Transformer Engine's and Megatron's int32 cu_seqlens: 0, then each
    sequence's end). Empty sequences (padding entries) are refused."""
    cu, _ = _int64s(cu_seqlens, "cu_seqlens")
    if len(cu) < 2 or cu[0] != 0:
        raise InvalidArgument("cu_seqlens must start with 0 and hold at least one sequence's end, got %s"
                              % cu[:8])
    lens = [b - a for a, b in zip(cu, cu[1:])]
    for i, L in enumerate(lens):
        if L <= 0:
            raise InvalidArgument("cu_seqlens: sequence %d has length %d (offsets %d, %d); drop empty entries"
                                  % (i, L, cu[i], cu[i + 1]))
    return lens


def _looks_like_cu_seqlens(lens):
    return len(lens) > 1 and lens[0] == 0 and all(a <= b for a, b in zip(lens, lens[1:]))


def _comm_handle(comm):
    if not isinstance(comm, Communicator):
        raise InvalidArgument("expected a zeppelin.Communicator, got %s" % type(comm).__name__)
    return comm._handle()


def _shape(obj):
    s = getattr(obj, "shape", None)
    return tuple(int(x) for x in s) if s is not None else None


def _empty_like(obj, shape):
    """An uninitialised tensor or array of obj's kind, dtype and device."""
    mod = type(obj).__module__
    if mod.startswith("torch"):
        import torch
        return torch.empty(shape, dtype=obj.dtype, device=obj.device)
    if mod == "numpy":
        import numpy
        return numpy.empty(shape, dtype=obj.dtype)
    raise InvalidArgument("out=None needs a torch tensor or NumPy array input (got %s); pass out"
                          % type(obj).__name__)


# ---- layouts ----
class _Owned:
    """A C handle freed by close(), by leaving a with block, or when collected."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Layout(_Owned):
    """Where every token of a batch lives: per rank, an ordered list of
    segments (seq, start, count); a rank's buffer holds its segments' tokens
    back to back, each token as elems_per_token elements."""

    def __init__(self, handle: Optional[int], owner: Optional[BatchPlan] = None) -> None:
        self._h: Optional[int] = handle
        self._owner = owner  # the plan that owns a plan's layout; None: this object owns it
        n, s, lens = ctypes.c_int(), ctypes.c_int(), ctypes.POINTER(ctypes.c_int64)()
        check(_lib.lib.zpLayoutGetInfo(handle, ctypes.byref(n), ctypes.byref(s), ctypes.byref(lens)))
        self.nranks = n.value
        self.lengths = [lens[i] for i in range(s.value)]
        self.cu_seqlens = [0]
        for L in self.lengths:
            self.cu_seqlens.append(self.cu_seqlens[-1] + L)
        self._segs = []
        for r in range(self.nranks):
            p, c = ctypes.POINTER(_lib.Segment)(), _lib.c_size_t()
            check(_lib.lib.zpLayoutRankSegments(handle, r, ctypes.byref(p), ctypes.byref(c)))
            self._segs.append([(p[i].seq, p[i].start, p[i].count) for i in range(c.value)])
        self.tokens_per_rank = [sum(c for _, _, c in segs) for segs in self._segs]

    @classmethod
    def from_thd(cls, cu_seqlens: Ints, nranks: int, mode: str = "contiguous") -> Layout:
        """The layout of a THD batch sharded as context-parallel trainers shard
        it: every sequence cut into nranks equal chunks, rank r holding chunk
        r ("contiguous"), or into 2 x nranks chunks, rank r holding chunks r
        and 2 x nranks - 1 - r ("zigzag", load-balanced for causal masks;
        Megatron's and Transformer Engine's). Each length must divide evenly."""
        lens = lengths_from_cu_seqlens(cu_seqlens)
        n = int(nranks)
        if n < 1 or mode not in ("contiguous", "zigzag"):
            raise InvalidArgument("from_thd: nranks must be >= 1 and mode contiguous or zigzag, got %r, %r"
                                  % (nranks, mode))
        parts = n if mode == "contiguous" else 2 * n
        segments: List[List[Segment]] = [[] for _ in range(n)]
        for seq, L in enumerate(lens):
            if L % parts:
                raise InvalidArgument("from_thd: sequence %d has %d tokens, not a multiple of %d (%s over %d ranks)"
                                      % (seq, L, parts, mode, n))
            c = L // parts
            for r in range(n):
                chunks = [r] if mode == "contiguous" else [r, parts - 1 - r]
                segments[r].extend((seq, k * c, c) for k in chunks)
        return cls.create(lens, segments)

    def local_cu_seqlens(self, rank: int) -> Tuple[List[int], int]:
        """Rank's buffer as a packed batch of its segments, for its own
        attention kernel: (cu_seqlens, max_seqlen), each segment one sequence."""
        cu = [0]
        for _, _, c in self._segs[rank]:
            cu.append(cu[-1] + c)
        return cu, max((c for _, _, c in self._segs[rank]), default=0)

    @classmethod
    def create(cls, lengths: Ints, segments: Sequence[Sequence[Segment]]) -> Layout:
        """zpLayoutCreate: segments[r] is rank r's list of (seq, start, count);
        every token of every sequence must be on exactly one rank."""
        lens, arr = _int64s(lengths, "lengths")
        offs, flat = [0], []
        for segs in segments:
            for seq, start, count in segs:
                flat.append(_lib.Segment(int(seq), int(start), int(count)))
            offs.append(len(flat))
        h = _lib.LayoutH()
        check(_lib.lib.zpLayoutCreate(ctypes.byref(h), len(lens), arr, len(segments), _lib.size_array(offs),
                                      (_lib.Segment * max(len(flat), 1))(*flat)))
        return cls(h.value)

    @property
    def handle(self) -> Optional[int]:
        return self._h

    @property
    def total_tokens(self) -> int:
        return self.cu_seqlens[-1]

    def segments(self, rank: int) -> List[Segment]:
        """Rank's segments, in buffer order: a list of (seq, start, count)."""
        return list(self._segs[rank])

    def tokens(self, rank: int) -> int:
        return self.tokens_per_rank[rank]

    def ranges(self, rank: int) -> List[Tuple[int, int]]:
        """Rank's tokens as [begin, end) ranges of the packed batch (sequences
        back to back in order, cu_seqlens), in buffer order."""
        return [(self.cu_seqlens[s] + a, self.cu_seqlens[s] + a + c) for s, a, c in self._segs[rank]]

    def index_list(self, rank: int) -> List[int]:
        """Rank's tokens as indices into the packed batch, in buffer order."""
        return [i for b, e in self.ranges(rank) for i in range(b, e)]

    def indices(self, rank: int, device: Any = None) -> Any:
        """index_list as a torch int64 tensor (for index_select on a packed batch)."""
        import torch
        return torch.tensor(self.index_list(rank), dtype=torch.int64, device=device)

    def shard(self, packed: Any, rank: int) -> Any:
        """Rank's rows of a packed batch [total_tokens, ...] (torch or NumPy), in buffer order."""
        if _shape(packed) is None or _shape(packed)[0] != self.total_tokens:
            raise InvalidArgument("shard: the packed batch needs %d rows, got shape %s" % (self.total_tokens,
                                                                                        _shape(packed)))
        if type(packed).__module__.startswith("torch"):
            return packed.index_select(0, self.indices(rank, packed.device))
        import numpy
        return packed[numpy.asarray(self.index_list(rank), dtype=numpy.int64)]

    def unshard(self, shards: Sequence[Any], out: Any = None) -> Any:
        """The packed batch from every rank's shard (the inverse of shard)."""
        if len(shards) != self.nranks:
            raise InvalidArgument("unshard: %d shards for %d ranks" % (len(shards), self.nranks))
        first = shards[0]
        if out is None:
            out = _empty_like(first, (self.total_tokens,) + tuple(_shape(first)[1:]))
        for r, s in enumerate(shards):
            if _shape(s)[0] != self.tokens(r):
                raise InvalidArgument("unshard: rank %d's shard has %d rows, the layout gives it %d"
                                      % (r, _shape(s)[0], self.tokens(r)))
            at = 0
            for b, e in self.ranges(r):
                out[b:e] = s[at:at + e - b]
                at += e - b
        return out

    def close(self) -> None:
        if self._h and self._owner is None:
            _lib.lib.zpLayoutDestroy(self._h)
        self._h = None

    def __repr__(self):
        return "<zeppelin.Layout %d ranks, %d sequences, tokens per rank %s>" % (
            self.nranks, len(self.lengths), self.tokens_per_rank)


# ---- plans ----
class BatchPlan(_Owned):
    """A zpBatchPlan_t: which ranks attend each sequence (its ring), and the
    attention and linear layouts of the batch."""

    def __init__(self, handle: Optional[int]) -> None:
        self._h: Optional[int] = handle
        n, s, lens, causal = ctypes.c_int(), ctypes.c_int(), ctypes.POINTER(ctypes.c_int64)(), ctypes.c_int()
        check(_lib.lib.zpPlanGetInfo(handle, ctypes.byref(n), ctypes.byref(s), ctypes.byref(lens),
                                     ctypes.byref(causal)))
        self.nranks, self.causal = n.value, bool(causal.value)
        self.lengths = [lens[i] for i in range(s.value)]
        self._layouts: Dict[int, Layout] = {}
        self.comm: Optional[Communicator] = None  # plan_batch's Communicator, if it was given one (the autograd functions' default)

    @classmethod
    def from_rings(cls, lengths: Ints, rings: Sequence[Sequence[int]], nranks: int, causal: bool = True,
                   ranks_per_node: int = 0) -> BatchPlan:
        """zpPlanCreate: sequence s runs on the ranks rings[s] in ring order
        (one rank: local), chunked as the planner does."""
        lens, arr = _int64s(lengths, "lengths")
        if len(rings) != len(lens):
            raise InvalidArgument("from_rings: %d rings for %d sequences" % (len(rings), len(lens)))
        offs, flat = [0], []  # type: List[int], List[int]
        for ring in rings:
            flat.extend(int(r) for r in ring)
            offs.append(len(flat))
        h = _lib.Plan()
        check(_lib.lib.zpPlanCreate(ctypes.byref(h), len(lens), arr, int(bool(causal)), int(nranks),
                                    int(ranks_per_node), _lib.size_array(offs),
                                    (ctypes.c_int * max(len(flat), 1))(*flat)))
        return cls(h.value)

    @property
    def handle(self) -> Optional[int]:
        return self._h

    def _layout(self, kind):
        if kind not in self._layouts:
            h = _lib.LayoutH()
            check(_lib.lib.zpPlanGetLayout(self._h, kind, ctypes.byref(h)))
            self._layouts[kind] = Layout(h.value, owner=self)
        return self._layouts[kind]

    @property
    def attention_layout(self) -> Layout:
        return self._layout(ATTENTION)

    @property
    def linear_layout(self) -> Layout:
        """Tokens balanced across ranks (contiguous runs), for the linear layers."""
        return self._layout(LINEAR)

    def sequence(self, seq: int) -> Tuple[int, List[int]]:
        """(class, ranks) of sequence seq: class LOCAL, INTRA_NODE or INTER_NODE,
        ranks its ring in order."""
        cls, n, ranks = ctypes.c_int(), ctypes.c_int(), ctypes.POINTER(ctypes.c_int)()
        check(_lib.lib.zpPlanSequence(self._h, int(seq), ctypes.byref(cls), ctypes.byref(n), ctypes.byref(ranks)))
        return cls.value, [ranks[i] for i in range(n.value)]

    def ring_order(self) -> List[int]:
        """zpPlanRingOrder: the order attention runs in, every sequence id once
        (a ring at the place of the first of its sequences; reversed backward)."""
        seqs, n = ctypes.POINTER(ctypes.c_int64)(), ctypes.c_int()
        check(_lib.lib.zpPlanRingOrder(self._h, ctypes.byref(seqs), ctypes.byref(n)))
        return [seqs[i] for i in range(n.value)]

    def set_ring_order(self, seqs: Ints) -> None:
        """zpPlanSetRingOrder: run in this order (every sequence id once, the
        same on every rank) from now on; InvalidArgument, the plan unchanged,
        otherwise. Drivers made before keep their order."""
        vals, arr = _int64s(seqs, "set_ring_order: seqs")
        check(_lib.lib.zpPlanSetRingOrder(self._h, len(vals), arr))

    def close(self) -> None:
        if self._h:
            for lay in self._layouts.values():
                lay._h = None
            _lib.lib.zpPlanDestroy(self._h)
        self._h = None

    def __repr__(self):
        return "<zeppelin.BatchPlan %d ranks, %d sequences%s>" % (self.nranks, len(self.lengths),
                                                                  ", causal" if self.causal else "")


def plan_batch(lengths: Optional[Ints] = None, comm_or_nranks: Union[Communicator, int, None] = None,
               causal: bool = True, q_heads: int = 32, kv_heads: int = 8, head_dim: int = 128, elem_bytes: int = 2,
               nodes: int = 1, nics_per_node: int = 1, nic_gbps: float = 200.0, intra_node_gbps: float = 200.0,
               tflops: float = 312.0, efficiency: float = 0.5, cu_seqlens: Optional[Ints] = None) -> BatchPlan:
    """zpPlanBatch: the hierarchical partition of a batch of sequence lengths
    (or of cu_seqlens=, a packed batch's offsets as flash-attn takes them).
    With a Communicator, for its cluster (nodes, ranks per node, NICs and
    their measured rate); with a rank count, for the cluster model the other
    arguments give (default one A800-like node). The attention shape
    (heads, head_dim, elem_bytes) weighs compute against communication."""
    lens, arr, shape, cluster, comm = _plan_input("plan_batch", lengths, comm_or_nranks, causal, q_heads, kv_heads,
                                                  head_dim, elem_bytes, nodes, nics_per_node, nic_gbps,
                                                  intra_node_gbps, tflops, efficiency, cu_seqlens)
    h = _lib.Plan()
    check(_lib.lib.zpPlanBatch(ctypes.byref(h), len(lens), arr, ctypes.byref(shape), cluster, comm), comm)
    plan = BatchPlan(h.value)
    if isinstance(comm_or_nranks, Communicator):
        plan.comm = comm_or_nranks
    return plan


def _plan_input(fn, lengths, comm_or_nranks, causal, q_heads, kv_heads, head_dim, elem_bytes, nodes, nics_per_node,
                nic_gbps, intra_node_gbps, tflops, efficiency, cu_seqlens):
    """plan_batch's and plan_ahead's arguments as zpPlanBatch takes them:
    (lengths, their int64 array, the shape, a cluster pointer or None, the
    communicator handle or None)."""
    if lengths is None and cu_seqlens is None:
        raise InvalidArgument("%s: pass lengths or cu_seqlens" % fn)
    if comm_or_nranks is None:
        raise InvalidArgument("%s: pass a Communicator or a rank count" % fn)
    if cu_seqlens is not None:
        if lengths is not None:
            raise InvalidArgument("%s: pass lengths or cu_seqlens, not both" % fn)
        lengths = lengths_from_cu_seqlens(cu_seqlens)
    lens, arr = _int64s(lengths, "lengths")
    if _looks_like_cu_seqlens(lens):
        raise InvalidArgument("%s: lengths %s... start with 0 and never fall: cu_seqlens? Pass "
                              "%s(cu_seqlens=...)" % (fn, lens[:4], fn))
    shape = _lib.AttnShape(int(q_heads), int(kv_heads), int(head_dim), int(elem_bytes), int(bool(causal)))
    cluster: Any
    if isinstance(comm_or_nranks, Communicator):
        return lens, arr, shape, None, comm_or_nranks._handle()
    n = int(comm_or_nranks)
    if n < 1 or n % int(nodes):
        raise InvalidArgument("%s: %d ranks do not fill %d nodes evenly" % (fn, n, nodes))
    cluster = _lib.ClusterModel(int(nodes), n // int(nodes), int(nics_per_node), float(nic_gbps),
                                float(intra_node_gbps), float(tflops), float(efficiency))
    return lens, arr, shape, ctypes.byref(cluster), None


# zpPlanBatchAhead and zpPlanAheadWait (declared here: _lib.py's table
# predates them).
_P = ctypes.POINTER
_lib.lib.zpPlanBatchAhead.restype = _lib.Result
_lib.lib.zpPlanBatchAhead.argtypes = [_P(ctypes.c_void_p), ctypes.c_int, _P(ctypes.c_int64), _P(_lib.AttnShape),
                                      _P(_lib.ClusterModel), _lib.Comm]
_lib.lib.zpPlanAheadWait.restype = _lib.Result
_lib.lib.zpPlanAheadWait.argtypes = [ctypes.c_void_p, _P(_lib.Plan)]


class PlanAhead:
    """A batch being planned on a thread of its own (plan_ahead): wait()
    returns its BatchPlan, the same plan_batch makes of the same input. Wait
    exactly once (the handle is freed then; a PlanAhead dropped unwaited is
    waited for by its finalizer)."""

    def __init__(self, handle, comm):
        self._h = handle
        self._comm = comm

    def wait(self) -> BatchPlan:
        if self._h is None:
            raise InvalidUsage("PlanAhead.wait: already waited for")
        h, self._h = self._h, None
        plan = _lib.Plan()
        comm = self._comm._handle() if isinstance(self._comm, Communicator) else None
        check(_lib.lib.zpPlanAheadWait(h, ctypes.byref(plan)), comm)
        out = BatchPlan(plan.value)
        if isinstance(self._comm, Communicator):
            out.comm = self._comm
        return out

    def __del__(self):
        if getattr(self, "_h", None) is not None:
            _lib.lib.zpPlanAheadWait(self._h, None)
            self._h = None


def plan_ahead(lengths: Optional[Ints] = None, comm_or_nranks: Union[Communicator, int, None] = None,
               causal: bool = True, q_heads: int = 32, kv_heads: int = 8, head_dim: int = 128, elem_bytes: int = 2,
               nodes: int = 1, nics_per_node: int = 1, nic_gbps: float = 200.0, intra_node_gbps: float = 200.0,
               tflops: float = 312.0, efficiency: float = 0.5, cu_seqlens: Optional[Ints] = None) -> PlanAhead:
    """zpPlanBatchAhead: plan_batch's planning of the next batch started on
    a thread of its own, so that it runs while the current step does;
    returns at once (the arguments are checked and copied first). The
    PlanAhead's wait() returns the plan."""
    lens, arr, shape, cluster, comm = _plan_input("plan_ahead", lengths, comm_or_nranks, causal, q_heads, kv_heads,
                                                  head_dim, elem_bytes, nodes, nics_per_node, nic_gbps,
                                                  intra_node_gbps, tflops, efficiency, cu_seqlens)
    h = ctypes.c_void_p()
    check(_lib.lib.zpPlanBatchAhead(ctypes.byref(h), len(lens), arr, ctypes.byref(shape), cluster, comm), comm)
    return PlanAhead(h.value, comm_or_nranks)


# ---- remaps ----
def _rows(fn, obj, tokens, elems_per_token, name):
    """Elements per token of a [tokens, ...] buffer."""
    shape = _shape(obj)
    if elems_per_token is None:
        if not shape:
            raise InvalidArgument("%s: %s has no shape; pass elems_per_token" % (fn, name))
        if shape[0] != tokens:
            raise InvalidArgument("%s: %s has %d rows (shape %s), this rank's layout holds %d tokens"
                                  % (fn, name, shape[0], shape, tokens))
        return math.prod(shape[1:])
    return int(elems_per_token)


class Remap(_Owned):
    """zpRemapCreate: moves tokens from one layout to another (and back with
    inverse=True) over comm, whose size must equal the layouts' rank count."""

    def __init__(self, from_layout: Layout, to_layout: Layout, comm: Communicator) -> None:
        self.source, self.target, self.comm = from_layout, to_layout, comm
        h = _lib.RemapH()
        ch = _comm_handle(comm)
        check(_lib.lib.zpRemapCreate(ctypes.byref(h), from_layout.handle, to_layout.handle, ch), ch)
        self._h = h.value

    def execute(self, inp: Any, out: Any = None, inverse: bool = False, elems_per_token: Optional[int] = None,
                stream: Any = None) -> Any:
        """zpRemapExecute: inp holds this rank's tokens of the source layout
        (the target's if inverse) as [tokens, ...]; returns out (allocated
        like inp when None) in the other layout. in and out must not overlap."""
        fn = "Remap.execute"
        if not self._h:
            raise InvalidUsage("%s: the remap was closed" % fn)
        src, dst = (self.target, self.source) if inverse else (self.source, self.target)
        r = self.comm.rank
        ept = _rows(fn, inp, src.tokens(r), elems_per_token, "inp")
        if out is None:
            out = _empty_like(inp, (dst.tokens(r),) + _shape(inp)[1:])
        (ib, ob), s = self.comm._bufs(fn, [(inp, "inp", False), (out, "out", True)], stream)
        if ib.numel != src.tokens(r) * ept:
            raise InvalidArgument("%s: inp has %d elements, %d tokens x %d per token expected"
                                  % (fn, ib.numel, src.tokens(r), ept))
        if ob.numel != dst.tokens(r) * ept:
            raise InvalidArgument("%s: out has %d elements, %d tokens x %d per token expected"
                                  % (fn, ob.numel, dst.tokens(r), ept))
        h = self.comm._handle()
        check(_lib.lib.zpRemapExecute(self._h, ib.ptr, ob.ptr, ept, ib.dtype, int(bool(inverse)), h, s), h)
        return out

    __call__ = execute

    def close(self) -> None:
        if self._h:
            _lib.lib.zpRemapDestroy(self._h)
        self._h = None


# ---- Ulysses ----
def ulysses_heads(rank: int, size: int, q_heads: int, heads: int) -> Tuple[int, int]:
    """[lo, hi) of the heads (of a tensor with `heads` heads) that rank holds
    in the head-parallel layout (as the C library assigns them)."""
    qlo, qhi = rank * q_heads // size, (rank + 1) * q_heads // size
    if qlo == qhi:
        return 0, 0
    g = q_heads // heads
    return qlo // g, (qhi + g - 1) // g


def ulysses_alltoall(inp: Any, layout: Layout, q_heads: int, heads: int, head_dim: int, direction: int,
                     comm: Communicator, out: Any = None, stream: Any = None) -> Any:
    """zpUlyssesAlltoall. direction 0: inp [this rank's tokens, heads, head_dim]
    in layout order -> out [all tokens in cu_seqlens order, my heads,
    head_dim]; direction 1 the reverse (heads held by several ranks, GQA,
    are summed: float32 / float64). Returns out (allocated when None)."""
    fn = "ulysses_alltoall"
    if direction not in (0, 1):
        raise InvalidArgument("%s: direction %r is 0 or 1" % (fn, direction))
    if q_heads < 1 or heads < 1 or head_dim < 1 or q_heads % heads:
        raise InvalidArgument("%s: %d query heads, %d heads, head_dim %d: need >= 1 and heads dividing query heads"
                              % (fn, q_heads, heads, head_dim))
    r = comm.rank
    lo, hi = ulysses_heads(r, comm.size, q_heads, heads)
    seq_shape = (layout.tokens(r), heads, head_dim)
    head_shape = (layout.total_tokens, hi - lo, head_dim)
    in_shape, out_shape = (seq_shape, head_shape) if direction == 0 else (head_shape, seq_shape)
    if out is None:
        out = _empty_like(inp, out_shape)
    (ib, ob), s = comm._bufs(fn, [(inp, "inp", False), (out, "out", True)], stream)
    for b, shp, name in ((ib, in_shape, "inp"), (ob, out_shape, "out")):
        if b.numel != math.prod(shp):
            raise InvalidArgument("%s: %s has %d elements, shape %s expected" % (fn, name, b.numel, shp))
    h = comm._handle()
    check(_lib.lib.zpUlyssesAlltoall(ib.ptr, ob.ptr, layout.handle, int(q_heads), int(heads), int(head_dim),
                                     ib.dtype, int(direction), h, s), h)
    return out


# ---- rings ----
class Ring(_Owned):
    """zpRingCreate over ranks of comm (in ring order; default all). An
    exchange sends this rank's block to the next rank and receives the
    previous rank's: start() returns at once, wait() returns its result.
    The buffers are kept alive until wait()."""

    def __init__(self, comm: Communicator, ranks: Optional[Sequence[int]] = None, bidirectional: bool = False) -> None:
        self.comm = comm
        self.ranks = list(range(comm.size)) if ranks is None else [int(x) for x in ranks]
        h = _lib.RingH()
        ch = _comm_handle(comm)
        check(_lib.lib.zpRingCreate(ctypes.byref(h), ch, len(self.ranks),
                                    (ctypes.c_int * max(len(self.ranks), 1))(*self.ranks),
                                    int(bool(bidirectional))), ch)
        self._h = h.value
        self._inflight: Optional[Tuple[Any, Any]] = None

    def start(self, send: Any, recv: Any, stream: Any = None) -> Any:
        """zpRingExchangeStart of all of send's bytes into all of recv's."""
        fn = "Ring.start"
        if not self._h:
            raise InvalidUsage("%s: the ring was closed" % fn)
        if self._inflight is not None:
            raise InvalidUsage("%s: an exchange is in flight; wait() for it first" % fn)
        (sb, rb), s = self.comm._bufs(fn, [(send, "send", False), (recv, "recv", True)], stream,
                                      same_dtypes=False)
        check(_lib.lib.zpRingExchangeStart(self._h, sb.ptr, sb.nbytes, rb.ptr, rb.nbytes, s), self.comm.handle)
        self._inflight = (sb, rb)
        return recv

    def wait(self) -> None:
        """zpRingExchangeWait: the exchange's result (raises its error)."""
        if self._inflight is None:
            raise InvalidUsage("Ring.wait: no exchange in flight")
        r = _lib.lib.zpRingExchangeWait(self._h)
        self._inflight = None
        check(r, self.comm.handle)

    def exchange(self, send: Any, recv: Any, stream: Any = None) -> Any:
        self.start(send, recv, stream)
        self.wait()
        return recv

    def close(self) -> None:
        if self._h:
            if self._inflight is not None:
                _lib.lib.zpRingExchangeWait(self._h)
                self._inflight = None
            _lib.lib.zpRingDestroy(self._h)
        self._h = None


# ---- the ring-attention driver ----
MASK_FULL, MASK_CAUSAL = 0, 1


class AttnBlock:
    """One (query block, key/value block) pair handed to a Python kernel: the
    zpAttnBlock_t's sizes, and its buffers as float32 arrays (array(name)) or
    torch tensors (tensor(name)) that alias Zeppelin's memory."""

    def __init__(self, ptr: Any) -> None:
        b = ptr.contents
        self._b = b
        self.sq, self.sk = b.sq, b.sk
        self.q_heads, self.kv_heads, self.head_dim = b.qHeads, b.kvHeads, b.headDim
        self.scale, self.mask, self.accumulate = b.scale, b.mask, bool(b.accumulate)
        if b.datatype != FLOAT32 or b.stream:
            # The package runs the driver on float32 host buffers only (Attention below).
            raise InvalidArgument("AttnBlock: a float32 host block was expected (datatype %d, stream %s)" %
                                  (b.datatype, b.stream))

    def _shape(self, name):
        if name in ("q", "out", "dout", "dq"):
            return (self.sq, self.q_heads, self.head_dim)
        if name in ("k", "v", "dk", "dv"):
            return (self.sk, self.kv_heads, self.head_dim)
        if name == "lse":
            return (self.q_heads, self.sq)
        raise KeyError(name)

    def has(self, name: str) -> bool:
        return bool(getattr(self._b, name))

    def array(self, name: str) -> Any:
        import numpy
        shape = self._shape(name)
        p = getattr(self._b, name)
        if not p:
            raise InvalidArgument("AttnBlock: %s is not set in this call" % name)
        return numpy.ctypeslib.as_array(p, shape=shape)

    def tensor(self, name: str) -> Any:
        import torch
        return torch.from_numpy(self.array(name))


class Attention(_Owned):
    """zpAttentionCreate: ring attention over plan's rings on comm. forward /
    backward: Python callables kernel(AttnBlock) (an exception in one becomes
    this rank's error, re-raised from forward()/backward(); the ring peers
    then fail with RemoteError), or None for the C reference kernels. Buffers
    are in the plan's attention layout of this rank, of dtype (float32,
    bfloat16 or float16; lse is always float32): host buffers, or device
    buffers (CUDA tensors, DLPack) with a stream, on which the whole pass is
    enqueued (the reference kernels then run on the device)."""

    def __init__(self, plan: BatchPlan, comm: Communicator, q_heads: int, kv_heads: int, head_dim: int,
                 scale: float = 0.0, forward: Optional[Callable[[AttnBlock], None]] = None,
                 backward: Optional[Callable[[AttnBlock], None]] = None, kernel_accumulates: bool = False,
                 dtype: int = FLOAT32) -> None:
        if dtype not in (FLOAT32, BFLOAT16, FLOAT16):
            raise InvalidArgument("Attention: dtype %s; float32, bfloat16 or float16" % DTYPE_NAMES.get(dtype, dtype))
        self.plan, self.comm, self.dtype = plan, comm, dtype
        self.q_heads, self.kv_heads, self.head_dim = int(q_heads), int(kv_heads), int(head_dim)
        self._error = None
        self._fw = _lib.AttnKernel(self._wrap(forward)) if forward else None
        self._bw = _lib.AttnKernel(self._wrap(backward)) if backward else None
        cfg = _lib.AttnConfig(self.q_heads, self.kv_heads, self.head_dim, float(scale),
                              ctypes.cast(self._fw, ctypes.c_void_p).value if self._fw else _lib.ATTN_REF_FORWARD,
                              ctypes.cast(self._bw, ctypes.c_void_p).value if self._bw else _lib.ATTN_REF_BACKWARD,
                              None, int(bool(kernel_accumulates)), dtype)
        h = _lib.AttentionH()
        ch = _comm_handle(comm)
        check(_lib.lib.zpAttentionCreate(ctypes.byref(h), plan.handle, ctypes.byref(cfg), ch), ch)
        self._h = h.value
        self.tokens = plan.attention_layout.tokens(comm.rank)

    def _wrap(self, kernel):
        def call(block_ptr, user):
            try:
                kernel(AttnBlock(block_ptr))
                return 0
            except BaseException as e:  # noqa: B902 (a kernel's exception must not cross into C)
                if self._error is None:
                    self._error = e
                _lib.lib.zpSetLastError(ctypes.c_void_p(self.comm.handle), ctypes.c_int(INVALID_USAGE),
                                        b"%s", ("attention kernel raised %s: %s" % (type(e).__name__, e)).encode())
                return INVALID_USAGE
        return call

    def _args(self, fn, named, stream):
        """The checked buffers of a pass, and its stream (None: host buffers)."""
        T, H, K, D = self.tokens, self.q_heads, self.kv_heads, self.head_dim
        want = {"q": T * H * D, "k": T * K * D, "v": T * K * D, "out": T * H * D, "lse": H * T,
                "dout": T * H * D, "dq": T * H * D, "dk": T * K * D, "dv": T * K * D}
        bufs, stream = self.comm._bufs(fn, [(obj, name, writable) for name, obj, writable in named], stream,
                                       same_dtypes=False)
        for (name, _, _), b in zip(named, bufs):
            dtype = FLOAT32 if name == "lse" else self.dtype
            if b.dtype != dtype:
                raise InvalidArgument("%s: %s is %s, %s expected" % (fn, name, DTYPE_NAMES[b.dtype], DTYPE_NAMES[dtype]))
            if b.numel != want[name]:
                raise InvalidArgument("%s: %s has %d elements, %d expected (%d tokens)" % (fn, name, b.numel,
                                                                                        want[name], T))
        return bufs, stream

    def _run(self, f, bufs, stream):
        self._error = None
        r = f(self._h, *[b.ptr for b in bufs], stream)
        if r != 0:
            err, self._error = self._error, None
            exc = error_from(r, self.comm.handle)
            if err is not None:
                raise exc from err
            raise exc

    def forward(self, q: Any, k: Any, v: Any, out: Any, lse: Any, stream: Any = None) -> Tuple[Any, Any]:
        """zpAttentionForward: fills out [T, q_heads, head_dim] and lse [q_heads, T]
        (device buffers: enqueued on stream, by default a CUDA tensor's current one)."""
        bufs, s = self._args("Attention.forward", [("q", q, False), ("k", k, False), ("v", v, False),
                                                   ("out", out, True), ("lse", lse, True)], stream)
        self._run(_lib.lib.zpAttentionForward, bufs, s)
        return out, lse

    def backward(self, q: Any, k: Any, v: Any, out: Any, lse: Any, dout: Any, dq: Any, dk: Any,
                 dv: Any, stream: Any = None) -> Tuple[Any, Any, Any]:
        """zpAttentionBackward: fills dq, dk and dv (device buffers: as forward)."""
        bufs, s = self._args("Attention.backward", [("q", q, False), ("k", k, False), ("v", v, False),
                                                    ("out", out, False), ("lse", lse, False), ("dout", dout, False),
                                                    ("dq", dq, True), ("dk", dk, True), ("dv", dv, True)], stream)
        self._run(_lib.lib.zpAttentionBackward, bufs, s)
        return dq, dk, dv

    def close(self) -> None:
        if self._h:
            _lib.lib.zpAttentionDestroy(self._h)
        self._h = None
