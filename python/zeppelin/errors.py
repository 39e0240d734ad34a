"""Exceptions: one class per zpResult_t code, all under ZeppelinError.

A failed C call raises the class of its code with Zeppelin's own message
(zpGetLastError of the thread, else of the communicator): what was wrong, with
the ranks and values involved. Checks the package makes in Python before it
calls C (dtype, device, contiguity, lengths) raise InvalidArgument the same
way, so one `except zeppelin.InvalidArgument` covers both.
"""

from __future__ import annotations

from typing import Dict, Optional, Type

from . import _interrupt, _lib

SUCCESS, UNHANDLED_CUDA_ERROR, SYSTEM_ERROR, INTERNAL_ERROR = 0, 1, 2, 3
INVALID_ARGUMENT, INVALID_USAGE, REMOTE_ERROR, IN_PROGRESS = 4, 5, 6, 7


class ZeppelinError(Exception):
    """A Zeppelin call failed. .code is the zpResult_t, .message Zeppelin's text."""

    code: Optional[int] = None

    def __init__(self, message: str, code: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class CudaError(ZeppelinError):
    """zpUnhandledCudaError: a CUDA call failed."""
    code = UNHANDLED_CUDA_ERROR


class ZpSystemError(ZeppelinError):
    """zpSystemError: a system call failed (socket, shared memory, ...).
    Not named SystemError, which is Python's own."""
    code = SYSTEM_ERROR


class InternalError(ZeppelinError):
    """zpInternalError: a bug in Zeppelin."""
    code = INTERNAL_ERROR


class InvalidArgument(ZeppelinError, ValueError):
    """zpInvalidArgument, or a check in Python before the call: bad dtype,
    device, shape, contiguity, count, peer, ..."""
    code = INVALID_ARGUMENT


class InvalidUsage(ZeppelinError):
    """zpInvalidUsage: the arguments are fine but the ranks disagree, or the
    call order is wrong."""
    code = INVALID_USAGE


class RemoteError(ZeppelinError):
    """zpRemoteError: a peer died, aborted, or stopped answering within the
    timeout (ZP_TIMEOUT). After it, abort the communicator."""
    code = REMOTE_ERROR


class InProgress(ZeppelinError):
    """zpInProgress: an operation is still running (not a failure)."""
    code = IN_PROGRESS


_BY_CODE: Dict[Optional[int], Type[ZeppelinError]] = {c.code: c for c in (CudaError, ZpSystemError, InternalError, InvalidArgument, InvalidUsage,
                                 RemoteError, InProgress)}


def error_class(code: int) -> Type[ZeppelinError]:
    """The exception class of a zpResult_t (ZeppelinError for an unknown one)."""
    return _BY_CODE.get(code, ZeppelinError)


def error_from(code: int, comm_handle: Optional[int] = None) -> BaseException:
    """The exception for a failed call: its class and Zeppelin's last error text
    (KeyboardInterrupt for a call that Ctrl-C ended)."""
    # The thread's last error is this call's (every failure records it there);
    # the communicator's may be another thread's.
    text = _lib.lib.zpGetLastError(None) or (_lib.lib.zpGetLastError(comm_handle) if comm_handle else b"")
    text = text.decode(errors="replace") if text else ""
    if not text:
        text = (_lib.lib.zpGetErrorString(code) or b"unknown error").decode(errors="replace")
    if code == SYSTEM_ERROR and _interrupt.take():
        return KeyboardInterrupt(text)  # Ctrl-C ended the call (see _interrupt)
    return error_class(code)(text, code)


def check(code: int, comm_handle: Optional[int] = None) -> None:
    """Raises the exception of a zpResult_t that is not zpSuccess."""
    if code != SUCCESS:
        raise error_from(code, comm_handle)
