"""Zeppelin under torch.distributed: a process-group backend named "zeppelin",
and Zeppelin communicators over the ranks of an existing process group.

    import torch.distributed as dist
    import zeppelin.distributed              # registers the "zeppelin" backend
    dist.init_process_group("zeppelin")      # as for "gloo": torchrun's variables, or init_method=
    dist.all_reduce(t)
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    ddp = torch.nn.parallel.DistributedDataParallel(model)   # gradients through Zeppelin

    comm = zeppelin.distributed.communicator(group)   # e.g. a gloo or nccl group you have

The backend's process group holds one Communicator (its `.comm`) and maps
each torch.distributed call onto it: all_reduce, broadcast, reduce,
all_gather (and all_gather_into_tensor), reduce_scatter (and
reduce_scatter_tensor), all_to_all_single, all_to_all, gather, scatter,
barrier, all_reduce_coalesced, send, recv, isend, irecv, batch_isend_irecv. The calls take what Communicator takes: CPU
tensors, and CUDA tensors in a build with CUDA (on the current stream). A
collective on host tensors is done when it returns, so async_op=True gives a
Work that is already complete. isend and irecv (and batch_isend_irecv's ops)
return at once; the posted ops run together as one group when any of them is
waited on, or before the group's next other call (see _p2p.py), so any order
of posting completes. ReduceOp SUM, PRODUCT, MIN, MAX and AVG map to
Zeppelin's; the bitwise ops, PREMUL_SUM and monitored_barrier are refused
by name. Sends and receives between two ranks match per tag, in posting
order; recv / irecv without src take the first message found from any rank
(tag 0, host tensors) and report its sender as Gloo does (_p2p.py).

init_process_group's timeout is the communicator's: every call of the group
waits that long for a silent peer, then fails on every rank naming the call.
Without one, ZP_TIMEOUT's (300 s by default).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Callable, List, Optional, Sequence

from ._torch import torch  # an ImportError that says how to get torch when it is missing
import torch.distributed as dist

from .comm import AVG, MAX, MIN, PROD, SUM, Communicator, ReduceOp, _share_through_store, _timeout_seconds, group
from .comm import get_unique_id
from ._p2p import Pending
from .errors import InvalidArgument, ZeppelinError

BACKEND = "zeppelin"

# (torch 1.13's type stubs lack ReduceOp.AVG, its ProcessGroup constructor
# and the methods' C++ signatures, which the calls below follow: the
# "type: ignore"s are for the stubs.)
_OPS = {dist.ReduceOp.SUM: SUM, dist.ReduceOp.PRODUCT: PROD, dist.ReduceOp.MIN: MIN, dist.ReduceOp.MAX: MAX,
        dist.ReduceOp.AVG: AVG}  # type: ignore[attr-defined]


def _op_name(op: Any) -> str:
    """ReduceOp.BOR, not the object's repr."""
    for name in ("SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "PREMUL_SUM"):
        theirs = getattr(dist.ReduceOp, name, None)
        if theirs is not None and op == theirs:
            return "ReduceOp." + name
    return repr(op)


def _op(op: Any) -> ReduceOp:
    for theirs, ours in _OPS.items():
        if op == theirs:
            return ours
    raise InvalidArgument("the zeppelin backend reduces with SUM, PRODUCT, MIN, MAX and AVG, not %s" % _op_name(op))


def _done(result: Any) -> Any:
    """The Work of a call that completed before it returned: a C++ Work made
    from a completed future. (With a Python subclass of Work,
    DistributedDataParallel's parameter check waited forever in C++,
    apparently in the base class's wait once the Python half was gone.)"""
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(fut)  # type: ignore[attr-defined]


class ProcessGroupZeppelin(dist.ProcessGroup):  # type: ignore[misc]
    """A torch.distributed process group whose calls run on a Communicator.
    Point-to-point calls are posted and run together at the first wait
    (see _p2p.py); every other call first runs what is pending."""

    def __init__(self, comm: Communicator) -> None:
        super().__init__(comm.rank, comm.size)  # type: ignore[call-arg]
        self.comm = comm
        self._p2p = Pending(comm, self._run)

    def getBackendName(self) -> str:
        return BACKEND

    def _run(self, name: str, body: Callable[[], Any]) -> Any:
        """body() as torch.distributed's call name: an error names it."""
        try:
            return body()
        except ZeppelinError as e:
            if e.message.startswith(name + ":"):
                raise
            raise type(e)("%s: %s" % (name, e.message), e.code) from None

    def _call(self, name: str, body: Callable[[], Any], result: Any) -> Any:
        """A collective: the pending point-to-point ops first (program order),
        then body; a Work that is complete."""
        self._p2p.run()
        self._run(name, body)
        return _done(result)

    def allreduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]
        op = _op(opts.reduceOp) if opts is not None else SUM

        def body() -> None:
            for t in tensors:
                self.comm.all_reduce(t, op=op)
        return self._call("all_reduce", body, tensors)

    def broadcast(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]
        root = opts.rootRank if opts is not None else 0

        def body() -> None:
            for t in tensors:
                self.comm.broadcast(t, root=root)
        return self._call("broadcast", body, tensors)

    def reduce(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]
        root, op = (opts.rootRank, _op(opts.reduceOp)) if opts is not None else (0, SUM)

        def body() -> None:
            for t in tensors:
                self.comm.reduce(t, root=root, op=op)
        return self._call("reduce", body, tensors)

    def _allgather_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        return self._call("all_gather_into_tensor", lambda: self.comm.all_gather(input, output), [output])

    def allgather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],  # type: ignore[override]
                  opts: Any = None) -> Any:
        def body() -> None:
            for outs, t in zip(output_tensors, input_tensors):
                flat = t.new_empty((self.comm.size * t.numel(),))
                self.comm.all_gather(t, flat)
                for r, out in enumerate(outs):
                    out.copy_(flat[r * t.numel():(r + 1) * t.numel()].view_as(out))
        return self._call("all_gather", body, output_tensors)

    def _reduce_scatter_base(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> Any:
        op = _op(opts.reduceOp) if opts is not None else SUM
        return self._call("reduce_scatter_tensor", lambda: self.comm.reduce_scatter(input, output, op=op), [output])

    def reduce_scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]],  # type: ignore[override]
                       opts: Any = None) -> Any:
        op = _op(opts.reduceOp) if opts is not None else SUM

        def body() -> None:
            for out, ins in zip(output_tensors, input_tensors):
                self.comm.reduce_scatter(torch.cat([x.reshape(-1) for x in ins]), out, op=op)
        return self._call("reduce_scatter", body, output_tensors)

    def alltoall_base(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: Sequence[int],
                      input_split_sizes: Sequence[int], opts: Any = None) -> Any:
        # torch passes empty lists for "equal splits".
        return self._call("all_to_all_single", lambda: self.comm.all_to_all_single(
            output, input, list(output_split_sizes) or None, list(input_split_sizes) or None), [output])

    def alltoall(self, output_tensors: List[torch.Tensor], input_tensors: List[torch.Tensor],
                 opts: Any = None) -> Any:
        def body() -> None:
            send = torch.cat([t.reshape(-1) for t in input_tensors])
            recv = send.new_empty((sum(t.numel() for t in output_tensors),))
            self.comm.alltoallv(send, [t.numel() for t in input_tensors], recv, [t.numel() for t in output_tensors])
            at = 0
            for t in output_tensors:
                t.copy_(recv[at:at + t.numel()].view_as(t))
                at += t.numel()
        return self._call("all_to_all", body, output_tensors)

    def barrier(self, opts: Any = None) -> Any:
        return self._call("barrier", self.comm.barrier, [])

    # ---- point to point: posted, run at the first wait (_p2p.py) ----
    def send(self, tensors: List[torch.Tensor], dstRank: int, tag: int = 0) -> Any:
        return self._p2p.post(True, tensors, dstRank, tag)

    def recv(self, tensors: List[torch.Tensor], srcRank: int, tag: int = 0) -> Any:
        return self._p2p.post(False, tensors, srcRank, tag)

    def recv_anysource(self, tensors: List[torch.Tensor], tag: int = 0) -> Any:
        """irecv / recv without src: a receive from any source (_p2p.py)."""
        return self._p2p.post(False, tensors, None, tag)

    def _start_coalescing(self) -> None:
        """batch_isend_irecv: its ops are posted like any isend / irecv and
        run as one group at the first wait."""

    def _end_coalescing(self, reqs: Any = None) -> None:
        pass

    def gather(self, output_tensors: List[List[torch.Tensor]], input_tensors: List[torch.Tensor],  # type: ignore[override]
               opts: Any = None) -> Any:
        """Every rank's tensor to root's gather_list, as one group of sends
        and receives."""
        root = opts.rootRank if opts is not None else 0
        outs = output_tensors[0] if output_tensors else []
        if self.comm.rank == root and len(outs) != self.comm.size:
            raise InvalidArgument("gather: gather_list has %d tensors, the group %d ranks" % (len(outs), self.comm.size))

        def body() -> None:
            if self.comm.rank != root:
                self.comm.send(input_tensors[0].contiguous(), root)
                return
            tmp = [o if o.is_contiguous() else torch.empty_like(o, memory_format=torch.contiguous_format)
                   for o in outs]
            with group():
                for r, t in enumerate(tmp):
                    if r != root:
                        self.comm.recv(t, r)
            tmp[root].copy_(input_tensors[0].reshape(tmp[root].shape))
            for o, t in zip(outs, tmp):
                if o is not t:
                    o.copy_(t)
        return self._call("gather", body, output_tensors)

    def scatter(self, output_tensors: List[torch.Tensor], input_tensors: List[List[torch.Tensor]],  # type: ignore[override]
                opts: Any = None) -> Any:
        """root's scatter_list[r] to rank r, as one group of sends and receives."""
        root = opts.rootRank if opts is not None else 0
        ins = input_tensors[0] if input_tensors else []
        if self.comm.rank == root and len(ins) != self.comm.size:
            raise InvalidArgument("scatter: scatter_list has %d tensors, the group %d ranks" % (len(ins), self.comm.size))
        out = output_tensors[0]

        def body() -> None:
            if self.comm.rank != root:
                target = out if out.is_contiguous() else torch.empty_like(out, memory_format=torch.contiguous_format)
                self.comm.recv(target, root)
                if target is not out:
                    out.copy_(target)
                return
            with group():
                for r, t in enumerate(ins):
                    if r != root:
                        self.comm.send(t.contiguous(), r)
            out.copy_(ins[root].reshape(out.shape))
        return self._call("scatter", body, output_tensors)

    def allreduce_coalesced(self, tensors: List[torch.Tensor], opts: Any = None) -> Any:  # type: ignore[override]
        return self.allreduce(tensors, opts)

    def monitored_barrier(self, *args: Any, **kwargs: Any) -> Any:
        raise InvalidArgument("the zeppelin backend has no monitored_barrier (Gloo's): use barrier; a rank that "
                              "does not arrive fails every rank at the group's timeout, naming it")


def _group_timeout(timeout: timedelta) -> float:
    """Seconds: init_process_group's timeout, or ZP_TIMEOUT's when it was not
    given (torch passes its default, 30 minutes, then)."""
    from torch.distributed.constants import default_pg_timeout
    return _timeout_seconds() if timeout == default_pg_timeout else timeout.total_seconds()


def _create(store: Any, rank: int, size: int, timeout: timedelta) -> ProcessGroupZeppelin:
    """torch.distributed's constructor of the backend: rank 0 draws a
    unique id and hands it out through the process group's store. The
    group's timeout is its communicator's: every call of the group waits
    that long for a silent peer."""
    seconds = _group_timeout(timeout)
    uid = get_unique_id().hex() if rank == 0 else None
    shared = _share_through_store(store, "zeppelin/unique_id", uid, seconds,
                                  "the process group's store has no unique id from rank 0")
    return ProcessGroupZeppelin(Communicator.from_unique_id(bytes.fromhex(shared), size, rank, timeout=seconds))


def communicator(group: Any = None, timeout: Optional[float] = None) -> Communicator:
    """A Communicator over the ranks of an existing process group (default:
    the world), ranked as in it: its first rank draws a unique id and
    broadcasts it over the group. Collective over the group. timeout:
    seconds to wait for a silent peer (None: ZP_TIMEOUT's)."""
    g = group if group is not None else dist.group.WORLD
    rank, size = dist.get_rank(g), dist.get_world_size(g)
    box = [get_unique_id() if rank == 0 else None]
    src = dist.get_global_rank(g, 0) if g is not dist.group.WORLD else 0
    dist.broadcast_object_list(box, src=src, group=g)
    uid = box[0]
    if not isinstance(uid, bytes):
        raise InvalidArgument("communicator: the group's first rank sent %r, not a unique id" % (uid,))
    return Communicator.from_unique_id(uid, size, rank, timeout=timeout)


dist.Backend.register_backend(BACKEND, _create)
