"""Communicators, groups and the data calls (point to point, alltoallv, collectives)."""

from __future__ import annotations

import contextlib
import ctypes
import enum
import functools
import operator
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Iterator, List, Optional, Sequence, Tuple, Union

from . import _interrupt, _lib
from ._buffers import buffer, same_dtype
from .errors import InvalidArgument, InvalidUsage, RemoteError, ZeppelinError, check, error_from

if TYPE_CHECKING:
    import numpy
    import torch

# What the data calls take (see _buffers.py): a torch tensor (CPU, or CUDA
# with a stream), a NumPy array, a DLPack object or a writable buffer-protocol
# object such as a bytearray. Counts: a sequence of ints, or a 1-D tensor or
# array of them.
Buffer = Any
Counts = Union[Sequence[int], "torch.Tensor", "numpy.ndarray"]
# A CUDA stream: a torch.cuda.Stream, or its handle as an int (cudaStream_t).
Stream = Any
Op = Union["ReduceOp", int]

SPLIT_NOCOLOR = _lib.SPLIT_NOCOLOR
ANY_SOURCE = _lib.ANY_SOURCE  # a receive's peer: any rank (Communicator.recv_any)
UNIQUE_ID_BYTES = _lib.UNIQUE_ID_BYTES


class ReduceOp(enum.IntEnum):
    """zpRedOp_t. float16 and bfloat16 are reduced in float32; AVG on integers truncates."""
    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4


SUM, PROD, MAX, MIN, AVG = ReduceOp.SUM, ReduceOp.PROD, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.AVG
_ROUTING = {None: -1, "default": -1, "off": 0, "rail": 1, "balanced": 2}


def _as_tuple(values):
    """A hashable, comparable copy of counts (lists, tuples, arrays, tensors)."""
    if values is None:
        return None
    if hasattr(values, "tolist"):
        values = values.tolist()
    try:
        return tuple(values)
    except TypeError:
        return (values,)  # not a sequence: _counts says so


def _end(count, displ):
    return displ + count if count else 0


def _op(op):
    if isinstance(op, str):
        try:
            return ReduceOp[op.upper()]
        except KeyError:
            raise InvalidArgument("unknown reduction %r (sum, prod, max, min, avg)" % op) from None
    try:
        return ReduceOp(op)
    except ValueError:
        raise InvalidArgument("unknown reduction %r (sum, prod, max, min, avg)" % (op,)) from None


def _config(timeout=None, routing=None, node_id=None, net_devices=None):
    """A zpConfig_t (None when nothing is set: the environment's settings)."""
    if timeout is None and routing is None and node_id is None and net_devices is None:
        return None
    c = _lib.Config(ctypes.sizeof(_lib.Config), _lib.CONFIG_MAGIC, _version_code(), _lib.CONFIG_UNDEF_INT,
                    _lib.CONFIG_UNDEF_INT, None, None)
    if timeout is not None:
        ms = int(round(float(timeout) * 1000))
        if ms < 1:
            raise InvalidArgument("timeout=%r: give seconds, at least 0.001" % (timeout,))
        c.timeoutMs = ms
    if routing is not None:
        if routing not in _ROUTING:
            raise InvalidArgument("routing=%r: one of off, rail, balanced" % (routing,))
        c.routing = _ROUTING[routing]
    if node_id is not None:
        c.nodeId = str(node_id).encode()
    if net_devices is not None:
        c.netDevices = (net_devices if isinstance(net_devices, str) else ",".join(net_devices)).encode()
    return c


def _rows_for_elements(fn, send, recv, sendcounts, recvcounts):
    """The counts of alltoallv are elements. Counts that sum to exactly the
    rows of two multi-dimensional tensors (torch.distributed's split sizes)
    would move a fraction of each block and leave the rest of recv as it was:
    that is refused, not silently done."""
    shapes = [tuple(getattr(t, "shape", ())) for t in (send, recv)]
    if any(len(sh) < 2 for sh in shapes):
        return
    row = 1
    for d in shapes[0][1:]:
        row *= d
    # (rows of one element, or nothing to move either way, are no fraction)
    sent, received = sum(sendcounts), sum(recvcounts)
    if row > 1 and sent + received > 0 and sent == shapes[0][0] and received == shapes[1][0]:
        raise InvalidArgument(
            "%s: the counts are elements, but these sum to the rows of send %s and recv %s, so they would move "
            "1/%d of each block: multiply them by %d, or call all_to_all_single, which takes split sizes in rows"
            % (fn, list(shapes[0]), list(shapes[1]), row, row))


def _profiled(method):
    """While torch.profiler records, the call is a range named
    zeppelin:<method> in its trace (as Gloo's calls are gloo:all_reduce and
    so on); otherwise it costs one check. torch is not imported for it."""
    label = "zeppelin:" + method.__name__

    @functools.wraps(method)
    def call(*args, **kwargs):
        torch = sys.modules.get("torch")
        if torch is None or not torch.autograd._profiler_enabled():
            return method(*args, **kwargs)
        with torch.autograd.profiler.record_function(label):
            return method(*args, **kwargs)
    return call


def _version_code():
    v = ctypes.c_int()
    check(_lib.lib.zpGetVersion(ctypes.byref(v)))
    return v.value


def version() -> Tuple[int, int, int]:
    """The library's version as (major, minor, patch)."""
    v = _version_code()
    return v // 10000, v // 100 % 100, v % 100


# ---- groups ----
_tls = threading.local()


_groups_open = [0]  # groups open in any thread: the thread-local is read only then
_groups_lock = threading.Lock()


def _group_keep():
    """The buffers of calls queued in this thread's open group (None outside
    one): they must live until zpGroupEnd runs the calls."""
    return getattr(_tls, "keep", None) if _groups_open[0] else None


class Source:
    """Where a receive from any source (Communicator.recv_any) took its
    message from: int(source), or source.rank, once the call has run."""
    __slots__ = ("_box",)

    def __init__(self) -> None:
        self._box = ctypes.c_int(ANY_SOURCE)

    @property
    def rank(self) -> int:
        if self._box.value == ANY_SOURCE:
            raise InvalidUsage("recv_any: its group has not run yet: the source is known at the group's end")
        return self._box.value

    def __int__(self) -> int:
        return self.rank

    def __index__(self) -> int:
        return self.rank

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, (int, Source)):
            return NotImplemented
        return self.rank == int(other)

    def __hash__(self) -> int:
        return hash(self.rank)

    def __repr__(self) -> str:
        return "Source(%s)" % ("pending" if self._box.value == ANY_SOURCE else self._box.value)


@contextlib.contextmanager
def group() -> Iterator[None]:
    """zpGroupStart / zpGroupEnd: the calls inside run together when the
    outermost group ends (a rank can then send to and receive from many
    peers without deadlock). The buffers passed inside are kept alive until
    then. Nests."""
    check(_lib.lib.zpGroupStart())
    outer = getattr(_tls, "keep", None) is None
    if outer:
        _tls.keep = []
        with _groups_lock:
            _groups_open[0] += 1
    try:
        yield
    except BaseException:
        _lib.lib.zpGroupEnd()  # ends the group; the body's exception is the one to see
        raise
    else:
        check(_lib.lib.zpGroupEnd())
    finally:
        if outer:
            _tls.keep = None
            with _groups_lock:
                _groups_open[0] -= 1


def get_unique_id() -> bytes:
    """A new zpUniqueId as bytes (and, in this process, the rendezvous
    service the ranks meet at). Share it with the other ranks out of band;
    it holds a secret: treat it as a password."""
    uid = _lib.UniqueId()
    check(_lib.lib.zpGetUniqueId(ctypes.byref(uid)))
    return ctypes.string_at(ctypes.addressof(uid), UNIQUE_ID_BYTES)


def _share_through_store(store: Any, key: str, value: Optional[str], seconds: float, what: str) -> str:
    """A string from the rank that has it (value not None) to every rank,
    through a torch.distributed store; the first value set stays (a second
    init, a restarted communicator, gets the first). compare_set with an
    empty expected value sets only a missing key; with "-" it sets nothing
    and returns the key's value, or "-" while it is missing. Polled:
    PyTorch 1.13's blocking get() sometimes never saw the key another client
    set meanwhile (its timeout, in about 1 run of 3 here)."""
    import time
    if value is not None:
        store.compare_set(key, "", value)
    deadline = time.monotonic() + seconds
    while True:
        got = store.compare_set(key, "-", "-")
        if got != b"-":
            return got.decode()
        if time.monotonic() > deadline:
            raise RemoteError("%s after %g s (ZP_TIMEOUT)" % (what, seconds))
        time.sleep(0.01)


def param(name: str) -> str:
    """The value in effect of a ZP_* setting as the library reads it (the
    environment's, else the library's default; zpGetParam)."""
    v = ctypes.c_char_p()
    check(_lib.lib.zpGetParam(name.encode(), ctypes.byref(v)))
    return (v.value or b"").decode()


def _timeout_seconds() -> float:
    return float(param("ZP_TIMEOUT"))  # fractions allowed, as the library reads it


def _secret_from_torchrun_store() -> None:
    """Under torchrun, without ZP_SECRET: rank 0 draws a secret and hands it
    out through torchrun's own store (which its workers reach at MASTER_ADDR:
    MASTER_PORT), so that the rendezvous secret is not derived from public
    variables alone. The store is torch.distributed's and as open as it is."""
    env = os.environ
    if env.get("ZP_SECRET") or env.get("TORCHELASTIC_USE_AGENT_STORE") != "True" or env.get("ZP_UNIQUE_ID"):
        return
    import datetime
    import torch.distributed as dist
    seconds = _timeout_seconds()
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False,
                          timeout=datetime.timedelta(seconds=seconds))
    mine = os.urandom(16).hex() if env.get("RANK") == "0" else None
    env["ZP_SECRET"] = _share_through_store(store, "zeppelin/secret", mine, seconds,
                                            "torchrun's store has no rendezvous secret from rank 0")


def init(timeout: Optional[float] = None, routing: Optional[str] = None, node_id: Optional[int] = None,
         net_devices: Optional[str] = None) -> Communicator:
    """The communicator a launcher describes in the environment
    (zpCommInitFromEnv): zprun, torchrun (python3 -m torch.distributed.run),
    Open MPI's mpirun, Slurm's srun. Collective over the job's ranks.
    timeout (seconds), routing, node_id, net_devices: zpConfig_t's fields
    (None: from ZP_TIMEOUT etc.)."""
    _interrupt.install()
    _secret_from_torchrun_store()
    h = _lib.Comm()
    c = _config(timeout, routing, node_id, net_devices)
    check(_lib.lib.zpCommInitFromEnv(ctypes.byref(h), ctypes.byref(c) if c else None))
    return Communicator(h.value)


class Communicator:
    """A zpComm_t. Use as a context manager: leaving the block destroys it, or
    aborts it if the block raised (so peers fail at once instead of waiting
    for the timeout)."""

    def __init__(self, handle: Optional[int]) -> None:
        if not handle:
            raise InvalidArgument("Communicator: no handle")
        self._h: Optional[int] = handle
        n, r = ctypes.c_int(), ctypes.c_int()
        check(_lib.lib.zpCommCount(handle, ctypes.byref(n)), handle)
        check(_lib.lib.zpCommUserRank(handle, ctypes.byref(r)), handle)
        self._size, self._rank = n.value, r.value
        self._has_device: Optional[bool] = None
        self._a2a: Optional[Tuple[Any, ...]] = None  # (key, size_t arrays, send extent, recv extent, lists) of the last alltoallv

    @classmethod
    def from_unique_id(cls, unique_id: bytes, size: int, rank: int, timeout: Optional[float] = None,
                       routing: Optional[str] = None, node_id: Optional[int] = None,
                       net_devices: Optional[str] = None) -> Communicator:
        """zpCommInitRankConfig: collective over size processes that share unique_id
        (bytes from get_unique_id)."""
        uid = bytes(unique_id)
        if len(uid) != UNIQUE_ID_BYTES:
            raise InvalidArgument("unique_id: %d bytes, a zpUniqueId has %d" % (len(uid), UNIQUE_ID_BYTES))
        cid = _lib.UniqueId()
        ctypes.memmove(ctypes.addressof(cid), uid, UNIQUE_ID_BYTES)  # bytes with NULs: not a c_char assignment
        _interrupt.install()
        h = _lib.Comm()
        c = _config(timeout, routing, node_id, net_devices)
        check(_lib.lib.zpCommInitRankConfig(ctypes.byref(h), int(size), cid, int(rank),
                                            ctypes.byref(c) if c else None))
        return cls(h.value)

    # ---- identity and lifetime ----
    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    @property
    def handle(self) -> Optional[int]:
        """The zpComm_t as an int (for other bindings), or None once destroyed."""
        return self._h

    def _handle(self):
        if not self._h:
            raise InvalidUsage("the communicator was destroyed or aborted")
        return self._h

    def _check(self, r, fn=None):
        if r != 0:
            e = error_from(r, self._h)
            if fn and isinstance(e, ZeppelinError) and "send/recv" in e.message:
                # A collective runs as send/recv steps, which the library's
                # message names: the caller called fn.
                e = type(e)(e.message.replace("send/recv", fn), e.code)
            raise e

    @property
    def has_device(self) -> bool:
        """Whether device (CUDA) buffers can be used: a build with CUDA, a GPU
        and ZP_CUDA_DEVICE not none."""
        if self._has_device is None:
            nccl = ctypes.c_void_p()
            self._has_device = _lib.lib.zpCommGetNcclComm(self._handle(), ctypes.byref(nccl)) == 0
        return self._has_device

    def destroy(self) -> None:
        """zpCommDestroy (local; waits for queued device work)."""
        if self._h:
            h, self._h = self._h, None
            check(_lib.lib.zpCommDestroy(h), None)

    def abort(self) -> None:
        """zpCommAbort: destroys it and tells every peer to fail its pending and
        future calls on this communicator at once."""
        if self._h:
            h, self._h = self._h, None
            check(_lib.lib.zpCommAbort(h), None)

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.destroy()
        else:
            self.abort()

    def __del__(self):
        try:
            if self._h and _lib is not None and _lib.lib is not None:
                _lib.lib.zpCommDestroy(self._h)
                self._h = None
        except Exception:
            pass

    def __repr__(self) -> str:
        return "<zeppelin.Communicator rank %d of %d%s>" % (self._rank, self._size, "" if self._h else " destroyed")

    def get_async_error(self) -> Optional[BaseException]:
        """None, or the exception (not raised) of the error that broke the
        communicator: a dead peer, a peer that aborted, failed device work.
        Polling also moves pending work forward."""
        e = ctypes.c_int()
        self._check(_lib.lib.zpCommGetAsyncError(self._handle(), ctypes.byref(e)))
        if e.value == 0:
            return None
        return error_from(e.value, self._h)

    def wait_report(self) -> Tuple[int, List[dict]]:
        """zpCommGetWaitReport: (calls, entries). Over this communicator's
        last calls that heard from their peers (collectives, alltoallvs,
        receives; calls of them), the peers this rank waited for, the most
        waited for first: each a dict with rank, calls_last (calls in which
        its first message came last), total_wait and max_wait (seconds)."""
        n, calls = ctypes.c_int(), ctypes.c_int()
        self._check(_lib.lib.zpCommGetWaitReport(self._handle(), None, 0, ctypes.byref(n), ctypes.byref(calls)))
        entries = (_lib.WaitEntry * max(n.value, 1))()
        self._check(_lib.lib.zpCommGetWaitReport(self._handle(), entries, n.value, ctypes.byref(n),
                                                 ctypes.byref(calls)))
        return calls.value, [{"rank": e.rank, "calls_last": e.callsLast, "total_wait": e.totalWaitSec,
                              "max_wait": e.maxWaitSec} for e in entries[:n.value]]

    def rail_report(self) -> List[dict]:
        """zpCommGetRailReport: this node's rails as routing measures them,
        one dict per NIC in rail order: rail, nic, nominal_bps, measured_bps
        (0: no evidence yet), slow (routed around), changes. Empty when this
        communicator does not route (one node, one rail, routing off)."""
        n = ctypes.c_int()
        self._check(_lib.lib.zpCommGetRailReport(self._handle(), None, 0, ctypes.byref(n)))
        entries = (_lib.RailEntry * max(n.value, 1))()
        self._check(_lib.lib.zpCommGetRailReport(self._handle(), entries, n.value, ctypes.byref(n)))
        return [{"rail": e.rail, "nic": e.nic.decode(), "nominal_bps": e.nominalBitsPerSec,
                 "measured_bps": e.bitsPerSec, "slow": bool(e.slow), "changes": e.changes}
                for e in entries[:n.value]]

    def split(self, color: int, key: Optional[int] = None, timeout: Optional[float] = None,
              routing: Optional[str] = None, node_id: Optional[int] = None,
              net_devices: Optional[str] = None) -> Optional[Communicator]:
        """zpCommSplit: collective; ranks with the same color >= 0 form a new
        communicator ranked by key (default: this rank). SPLIT_NOCOLOR: take
        part, get None. Settings not given are this communicator's."""
        h = _lib.Comm()
        c = _config(timeout, routing, node_id, net_devices)
        if key is None:
            key = self._rank
        self._check(_lib.lib.zpCommSplit(self._handle(), int(color), int(key), ctypes.byref(h),
                                         ctypes.byref(c) if c else None))
        return Communicator(h.value) if h.value else None

    # ---- buffers ----
    def _bufs(self, fn, args, stream, same_dtypes=True):
        """Checks the (object, name, writable) args of one call; returns their
        Bufs and the stream to pass (None: host memory)."""
        stream = getattr(stream, "cuda_stream", stream)  # a torch.cuda.Stream: its handle
        try:
            bufs = [buffer(o, name, writable, stream) for o, name, writable in args]
        except InvalidArgument as e:  # named here, not formatted on every call
            raise InvalidArgument("%s: %s" % (fn, e)) from None
        first = bufs[0]
        for b in bufs:
            if same_dtypes and b.dtype != first.dtype:
                same_dtype(bufs, fn)
            if b.device != first.device or b.device_index != first.device_index:
                raise InvalidArgument("%s: buffers on different devices: %s" % (fn, ", ".join(
                    "%s:%d" % (x.device, x.device_index) if x.device == "cuda" else x.device for x in bufs)))
        if first.device == "cuda":
            if not self.has_device:
                raise InvalidArgument("%s: CUDA buffers, but this communicator has no device data plane (a build "
                                      "without CUDA, no GPU, or ZP_CUDA_DEVICE=none); pass CPU tensors" % fn)
            if stream is None:
                stream = first.stream
                if stream is None:
                    raise InvalidArgument("%s: device buffers need a stream (stream=...)" % fn)
            for b in bufs:
                self._check(_lib.lib.zpCommCheckBuffer(self._h, b.ptr, stream))
        elif stream is not None:
            raise InvalidArgument("%s: a stream was given for host buffers (a stream means CUDA memory)" % fn)
        keep = _group_keep()
        if keep is not None:
            keep.extend(bufs)
        return bufs, stream

    # ---- point to point ----
    def _peer(self, fn, peer):
        if not isinstance(peer, int) or not 0 <= peer < self._size:
            raise InvalidArgument("%s: peer %r is not a rank in [0, %d)" % (fn, peer, self._size))
        return peer

    @_profiled
    def send(self, tensor: Buffer, peer: int, stream: Stream = None) -> None:
        """zpSend of the whole tensor to peer (matched in call order with its recv)."""
        h = self._handle()
        self._peer("send", peer)
        (b,), s = self._bufs("send", [(tensor, "tensor", False)], stream)
        self._check(_lib.lib.zpSend(b.ptr, b.numel, b.dtype, peer, h, s))

    @_profiled
    def recv_any(self, tensor: Buffer) -> "Source":
        """zpRecvFrom with ZP_ANY_SOURCE: the first message found to have
        come from any rank (each rank's in the order sent; its size must
        equal the tensor's), into the whole tensor (host memory). Returns
        its Source: int(source) is the sender's rank, at once outside a
        group, at the group's end inside one (zeppelin.h has the rule)."""
        h = self._handle()
        (b,), s = self._bufs("recv_any", [(tensor, "tensor", True)], None)
        src = Source()
        keep = _group_keep()
        if keep is not None:
            keep.append(src)
        self._check(_lib.lib.zpRecvFrom(b.ptr, b.numel, b.dtype, ANY_SOURCE, ctypes.byref(src._box), h, s))
        return src

    @_profiled
    def recv(self, tensor: Buffer, peer: int, stream: Stream = None) -> Buffer:
        """zpRecv into the whole tensor from peer; its size must equal the send's."""
        h = self._handle()
        self._peer("recv", peer)
        (b,), s = self._bufs("recv", [(tensor, "tensor", True)], stream)
        self._check(_lib.lib.zpRecv(b.ptr, b.numel, b.dtype, peer, h, s))
        return tensor

    # ---- alltoallv ----
    def _counts(self, fn, name, values, default_from=None):
        if values is None:
            out, acc = [], 0
            for c in default_from:  # exclusive prefix sums: blocks back to back
                out.append(acc)
                acc += c
            return out
        try:
            # operator.index, not int: 4.7 would be truncated and '4' parsed.
            vals = [operator.index(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]
        except TypeError:
            raise InvalidArgument("%s: %s must be %d integers, not %r" % (fn, name, self._size, values)) from None
        if len(vals) != self._size:
            raise InvalidArgument("%s: %s has %d entries, the communicator %d ranks" % (fn, name, len(vals),
                                                                                       self._size))
        if vals and min(vals) < 0:
            p = next(i for i, v in enumerate(vals) if v < 0)
            raise InvalidArgument("%s: %s[%d] = %d is negative" % (fn, name, p, vals[p]))
        return vals

    @_profiled
    def alltoallv(self, send: Buffer, sendcounts: Counts, recv: Buffer, recvcounts: Counts,
                  sdispls: Optional[Counts] = None, rdispls: Optional[Counts] = None,
                  stream: Stream = None) -> Buffer:
        """zpAlltoallv: sendcounts[p] elements from element sdispls[p] of send go
        to rank p, which receives them at element rdispls[rank] of recv. Counts
        and displacements in elements; displacements default to the blocks back
        to back. Returns recv."""
        fn = "alltoallv"
        h = self._handle()
        (sb, rb), s = self._bufs(fn, [(send, "send", False), (recv, "recv", True)], stream)
        # A training loop repeats its counts: the last ones' checks and size_t
        # arrays are kept, keyed by the values passed.
        key = (_as_tuple(sendcounts), _as_tuple(recvcounts), _as_tuple(sdispls), _as_tuple(rdispls))
        last = self._a2a
        if last is None or last[0] != key:
            sc = self._counts(fn, "sendcounts", sendcounts)
            rc = self._counts(fn, "recvcounts", recvcounts)
            sd = self._counts(fn, "sdispls", sdispls, sc)
            rd = self._counts(fn, "rdispls", rdispls, rc)
            A = _lib.c_size_t * self._size
            last = (key, (A(*sc), A(*sd), A(*rc), A(*rd)), max(map(_end, sc, sd)), max(map(_end, rc, rd)),
                    (sc, sd, rc, rd))
            self._a2a = last
        if last[2] > sb.numel or last[3] > rb.numel:
            sc, sd, rc, rd = last[4]
            for counts, displs, b, what in ((sc, sd, sb, "send"), (rc, rd, rb, "recv")):
                for p in range(self._size):
                    if counts[p] and displs[p] + counts[p] > b.numel:
                        raise InvalidArgument("%s: %s block for rank %d is elements [%d, %d) but %s has %d elements"
                                              % (fn, what, p, displs[p], displs[p] + counts[p], what, b.numel))
        if last[2] * 2 <= sb.numel and last[3] * 2 <= rb.numel:
            _rows_for_elements(fn, send, recv, last[4][0], last[4][2])
        a = last[1]
        keep = _group_keep()
        if keep is not None:
            # zpAlltoallv reads its count arrays when the group runs, and the
            # next call may replace them here: the group keeps these alive.
            keep.append(a)
        self._check(_lib.lib.zpAlltoallv(sb.ptr, a[0], a[1], rb.ptr, a[2], a[3], sb.dtype, h, s), fn)
        return recv

    @_profiled
    def all_to_all_single(self, output: Buffer, input: Buffer, output_split_sizes: Optional[Counts] = None,
                          input_split_sizes: Optional[Counts] = None, stream: Stream = None) -> Buffer:
        """torch.distributed.all_to_all_single's semantics on zpAlltoallv: split
        sizes are rows of dimension 0 (None: equal splits); rows go back to
        back in rank order. Returns output."""
        fn, n = "all_to_all_single", self._size

        def splits(t, sizes, what):
            shape = tuple(getattr(t, "shape", ()))
            if not shape:
                raise InvalidArgument("%s: %s needs a shape (a tensor or an array), got %r" % (fn, what, type(t)))
            rows = shape[0]
            row = 1
            for d in shape[1:]:
                row *= d
            if sizes is None:
                if rows % n:
                    raise InvalidArgument("%s: %s has %d rows, not divisible by %d ranks: give split sizes"
                                          % (fn, what, rows, n))
                sizes = [rows // n] * n
            sizes = [int(x) for x in _as_tuple(sizes)]
            if len(sizes) != n or min(sizes) < 0:
                raise InvalidArgument("%s: %s split sizes %r: need %d sizes >= 0" % (fn, what, sizes, n))
            if sum(sizes) != rows:
                raise InvalidArgument("%s: %s split sizes %r sum to %d rows but it has %d"
                                      % (fn, what, sizes, sum(sizes), rows))
            return [x * row for x in sizes]

        sc = splits(input, input_split_sizes, "input")
        rc = splits(output, output_split_sizes, "output")
        return self.alltoallv(input, sc, output, rc, stream=stream)

    # ---- collectives ----
    @staticmethod
    def _numel(fn, buf, name, want, why):
        if buf.numel != want:
            raise InvalidArgument("%s: %s has %d elements, it needs %d (%s)" % (fn, name, buf.numel, want, why))

    def _root(self, fn, root):
        if not isinstance(root, int) or not 0 <= root < self._size:
            raise InvalidArgument("%s: root %r is not a rank in [0, %d)" % (fn, root, self._size))
        return root

    @_profiled
    def all_reduce(self, tensor: Buffer, op: Op = SUM, out: Optional[Buffer] = None, stream: Stream = None) -> Buffer:
        """zpAllReduce; in place unless out is given. Returns the result."""
        fn, h, op = "all_reduce", self._handle(), _op(op)
        target = tensor if out is None else out
        (sb, rb), s = self._bufs(fn, [(tensor, "tensor", out is None), (target, "out", True)], stream)
        self._numel(fn, rb, "out", sb.numel, "as many as tensor")
        self._check(_lib.lib.zpAllReduce(sb.ptr, rb.ptr, sb.numel, sb.dtype, op, h, s), fn)
        return target

    @_profiled
    def broadcast(self, tensor: Buffer, root: int = 0, out: Optional[Buffer] = None, stream: Stream = None) -> Buffer:
        """zpBroadcast of root's tensor; in place unless out is given."""
        fn, h = "broadcast", self._handle()
        self._root(fn, root)
        target = tensor if out is None else out
        (sb, rb), s = self._bufs(fn, [(tensor, "tensor", out is None), (target, "out", True)], stream)
        self._numel(fn, rb, "out", sb.numel, "as many as tensor")
        self._check(_lib.lib.zpBroadcast(sb.ptr, rb.ptr, sb.numel, sb.dtype, root, h, s), fn)
        return target

    @_profiled
    def reduce(self, tensor: Buffer, root: int = 0, op: Op = SUM, out: Optional[Buffer] = None,
               stream: Stream = None) -> Buffer:
        """zpReduce to root (in place unless out is given; only root's is written)."""
        fn, h, op = "reduce", self._handle(), _op(op)
        self._root(fn, root)
        target = tensor if out is None else out
        (sb, rb), s = self._bufs(fn, [(tensor, "tensor", out is None), (target, "out", True)], stream)
        self._numel(fn, rb, "out", sb.numel, "as many as tensor")
        self._check(_lib.lib.zpReduce(sb.ptr, rb.ptr, sb.numel, sb.dtype, op, root, h, s), fn)
        return target

    @_profiled
    def all_gather(self, tensor: Buffer, out: Buffer, stream: Stream = None) -> Buffer:
        """zpAllGather: out holds size x tensor's elements, rank r's at r x count."""
        fn, h = "all_gather", self._handle()
        (sb, rb), s = self._bufs(fn, [(tensor, "tensor", False), (out, "out", True)], stream)
        self._numel(fn, rb, "out", sb.numel * self._size, "%d ranks x %d" % (self._size, sb.numel))
        self._check(_lib.lib.zpAllGather(sb.ptr, rb.ptr, sb.numel, sb.dtype, h, s), fn)
        return out

    @_profiled
    def reduce_scatter(self, tensor: Buffer, out: Buffer, op: Op = SUM, stream: Stream = None) -> Buffer:
        """zpReduceScatter: tensor holds size x out's elements; out gets the
        reduction of every rank's block number rank."""
        fn, h, op = "reduce_scatter", self._handle(), _op(op)
        (sb, rb), s = self._bufs(fn, [(tensor, "tensor", False), (out, "out", True)], stream)
        self._numel(fn, sb, "tensor", rb.numel * self._size, "%d ranks x %d" % (self._size, rb.numel))
        self._check(_lib.lib.zpReduceScatter(sb.ptr, rb.ptr, rb.numel, sb.dtype, op, h, s), fn)
        return out

    @_profiled
    def all_gatherv(self, tensor: Buffer, out: Buffer, recvcounts: Counts, rdispls: Optional[Counts] = None,
                    stream: Stream = None) -> Buffer:
        """zpAllGatherv: rank r's tensor (recvcounts[r] elements) lands at
        element rdispls[r] of out (default: blocks back to back); recvcounts
        must be the same on every rank."""
        fn, h = "all_gatherv", self._handle()
        (sb, rb), s = self._bufs(fn, [(tensor, "tensor", False), (out, "out", True)], stream)
        rc = self._counts(fn, "recvcounts", recvcounts)
        rd = self._counts(fn, "rdispls", rdispls, rc)
        self._numel(fn, sb, "tensor", rc[self._rank], "recvcounts[%d]" % self._rank)
        end = max(map(_end, rc, rd))
        if end > rb.numel:
            raise InvalidArgument("%s: out has %d elements, the blocks end at element %d" % (fn, rb.numel, end))
        A = _lib.c_size_t * self._size
        self._check(_lib.lib.zpAllGatherv(sb.ptr, sb.numel, rb.ptr, A(*rc), A(*rd), sb.dtype, h, s), fn)
        return out

    @_profiled
    def reduce_scatterv(self, tensor: Buffer, out: Buffer, recvcounts: Counts, op: Op = SUM,
                        stream: Stream = None) -> Buffer:
        """zpReduceScatterv: tensor holds sum(recvcounts) elements; out gets
        the recvcounts[rank] of them at this rank's offset, reduced over every
        rank; recvcounts must be the same on every rank."""
        fn, h, op = "reduce_scatterv", self._handle(), _op(op)
        (sb, rb), s = self._bufs(fn, [(tensor, "tensor", False), (out, "out", True)], stream)
        rc = self._counts(fn, "recvcounts", recvcounts)
        self._numel(fn, sb, "tensor", sum(rc), "the sum of recvcounts")
        self._numel(fn, rb, "out", rc[self._rank], "recvcounts[%d]" % self._rank)
        A = _lib.c_size_t * self._size
        self._check(_lib.lib.zpReduceScatterv(sb.ptr, rb.ptr, A(*rc), sb.dtype, op, h, s), fn)
        return out

    @_profiled
    def barrier(self) -> None:
        """zpBarrier: returns once every rank has called it (a host barrier)."""
        self._check(_lib.lib.zpBarrier(self._handle(), None), "barrier")
