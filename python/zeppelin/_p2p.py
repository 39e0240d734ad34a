"""The zeppelin backend's point-to-point calls: isend, irecv and
batch_isend_irecv post their op and return at once; the posted ops run later,
together, as one zpGroupStart / zpGroupEnd group.

Why a group at the first wait, not a progress thread: zpSend and zpRecv on
host memory complete before they return, and a send past the eager size
waits for its receive to be posted. Run one by one in posting order, a ring
of isend-then-irecv deadlocks (every rank in its send). Run as one group,
the library progresses every op of it at once, so any order of posting
completes, as with Gloo. A progress thread would have to run the same
groups and could not know when the caller has posted the last op of a batch
(it would start the send of a ring before its receive was posted); and
two threads on one communicator would need a lock around every call.

So: the pending ops of a process group run as one group when any of them is
waited on (Work.wait, is_completed, get_future, dist.send / dist.recv, which
wait), and before any other call of the process group (a collective), so the
calls of a group still happen in program order. Ops posted after that form
the next group.

A receive from any source (irecv without src, recv_anysource) is a
ZP_ANY_SOURCE receive of the group: it takes the first message found to have
come from any rank, each rank's in the order sent, after the receives of the
same group that name that rank (zeppelin.h); its Work's _source_rank() is
the sender's rank, as with Gloo. Tag 0 only.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from ._torch import torch  # an ImportError that says how to get torch when it is missing
import torch.distributed as dist

from .comm import Communicator, Source, group
from .errors import InvalidArgument, InvalidUsage

_MAGIC = 0x7A7074616721  # "zptag!": a tagged message's header


class _Op:
    """One posted isend or irecv."""
    __slots__ = ("send", "tensor", "peer", "tag", "done", "error", "source")

    def __init__(self, send: bool, tensor: torch.Tensor, peer: Optional[int], tag: int) -> None:
        self.send, self.tensor, self.peer, self.tag = send, tensor, peer, tag  # peer None: any source
        self.done = False
        self.error: Optional[BaseException] = None
        self.source: Optional[Source] = None  # a receive from any source's, once posted


class Pending:
    """The posted, not yet run point-to-point ops of one communicator."""

    def __init__(self, comm: Communicator, call: Callable[[str, Callable[[], Any]], Any]) -> None:
        self.comm = comm
        self._call = call  # runs a function as the named call (the process group's error wrapper)
        self._ops: List[_Op] = []

    def post(self, send: bool, tensors: List[torch.Tensor], peer: Optional[int], tag: int) -> "P2PWork":
        """peer None: a receive from any source."""
        fn = "isend" if send else "irecv"
        if len(tensors) != 1:
            raise InvalidArgument("%s: one tensor per call, got %d" % (fn, len(tensors)))
        if peer is None and send:
            raise InvalidArgument("isend: a destination rank is needed")
        if peer is not None and (not isinstance(peer, int) or not 0 <= peer < self.comm.size):
            raise InvalidArgument("%s: peer %r is not a rank in [0, %d)" % (fn, peer, self.comm.size))
        if not isinstance(tag, int) or tag < 0:
            raise InvalidArgument("%s: tag %r: a non-negative integer" % (fn, tag))
        if peer is None and tag:
            # A tagged message is a header and its data from one rank: a
            # receive from any source could take another rank's data.
            raise InvalidArgument("irecv / recv from any source (src=None) with tag %d: the zeppelin backend "
                                  "receives from any source with tag 0 only; give src, or use tag 0" % tag)
        if peer is None and tensors[0].is_cuda:
            raise InvalidArgument("irecv / recv from any source (src=None) of a CUDA tensor: NCCL has no "
                                  "receive from any source; give src")
        op = _Op(send, tensors[0], peer, tag)
        self._ops.append(op)
        return P2PWork(self, op)

    def run(self) -> None:
        """Runs every pending op as one group; each op's Work then holds
        its result or the group's error. Tags: the library matches a pair's
        messages in call order, so the group posts them ordered by tag
        (then by posting order); both sides ordering the same messages the
        same way, each tag's messages match in order. A tagged message is
        preceded by a header (magic, tag) that the receiver checks, so a
        message matched with the wrong tag (the two sides ran different
        batches) is an error, not silently wrong data."""
        ops, self._ops = self._ops, []
        if not ops:
            return
        ordered = sorted(ops, key=lambda op: op.tag)  # stable: posting order within a tag
        headers = [(torch.tensor([_MAGIC, op.tag], dtype=torch.int64) if op.send else torch.zeros(2, dtype=torch.int64))
                   if op.tag else None for op in ordered]

        def body() -> None:
            with group():
                for op, hdr in zip(ordered, headers):
                    if op.peer is None:
                        op.source = self.comm.recv_any(op.tensor)
                        continue
                    move = self.comm.send if op.send else self.comm.recv
                    if hdr is not None:
                        move(hdr, op.peer)
                    move(op.tensor, op.peer)
            for op, hdr in zip(ordered, headers):
                if hdr is not None and not op.send and hdr.tolist() != [_MAGIC, op.tag]:
                    got = "tag %d" % hdr[1] if int(hdr[0]) == _MAGIC else "no tag"
                    raise InvalidUsage("recv from rank %d with tag %d matched a message sent with %s: tags are "
                                       "matched among the operations run together (posted before the same wait); "
                                       "post both sides' tagged operations before waiting on them"
                                       % (op.peer or 0, op.tag, got))  # tagged: never from any source
        try:
            self._call("send/recv" if len(ops) > 1 else ("send" if ops[0].send else "recv"), body)
        except BaseException as e:
            for op in ops:
                op.error = e
            raise
        finally:
            for op in ops:
                op.done = True


class P2PWork(dist.Work):  # type: ignore[misc]
    """The Work of an isend or irecv. Its wait runs the pending ops (this one
    among them) and raises the group's error, if any."""

    def __init__(self, pending: Pending, op: _Op) -> None:
        super().__init__()
        self._pending, self._op = pending, op

    def _complete(self) -> None:
        if not self._op.done:
            self._pending.run()
        if self._op.error is not None:
            raise self._op.error

    def wait(self, timeout: Any = None) -> bool:
        self._complete()
        return True

    def is_completed(self) -> bool:
        # Runs the pending group (blocking) rather than answer False forever:
        # nothing else would run it while the caller polls.
        try:
            self._complete()
        except Exception:
            pass
        return True

    def is_success(self) -> bool:
        return self._op.done and self._op.error is None

    def exception(self) -> Optional[BaseException]:
        return self._op.error

    def result(self) -> List[torch.Tensor]:
        self._complete()
        return [self._op.tensor]

    def source_rank(self) -> int:
        return self._source_rank()

    def _source_rank(self) -> int:
        """The sender's rank (in the process group), as Gloo's Work gives it."""
        if self._op.peer is not None:
            return self._op.peer
        self._complete()
        assert self._op.source is not None
        return int(self._op.source)

    def get_future(self) -> torch.futures.Future:
        self._complete()
        fut: torch.futures.Future = torch.futures.Future()
        fut.set_result([self._op.tensor])
        return fut

    def synchronize(self) -> None:
        self._complete()
