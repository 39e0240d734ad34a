"""Ctrl-C during a blocked call (zpSetInterruptCheck in include/zeppelin.h).

CPython runs a signal's Python handler only between bytecodes of the main
thread, so a call blocked in C would see Ctrl-C only when it ends (up to
ZP_TIMEOUT later). The library asks an interrupt check every 100 ms while a
call waits on its peers; ours is a Python function, so entering it runs the
pending SIGINT handler first. The package's handler, put where Python's
default one was, notes the interrupt when it runs there; the check then says
yes, the call breaks its communicator (peers fail at once) and returns, and
the binding raises KeyboardInterrupt. Anywhere else the handler raises
KeyboardInterrupt, as Python's default does. Where the program has a SIGINT
handler of its own, nothing is installed and Ctrl-C waits for the call.
"""

import signal
import threading

from . import _lib

_pending = False      # SIGINT arrived while the check ran: the check says yes
_interrupted = False  # the check said yes: the call's failure is a KeyboardInterrupt
_installed = False


def _ask(_arg):
    global _pending, _interrupted
    if _pending:
        _pending, _interrupted = False, True
        return 1
    return 0


_ASK_CODE = _ask.__code__
_check = _lib.InterruptCheck(_ask)  # kept alive here: the library holds only its address


def _sigint(signum, frame):
    global _pending
    if frame is not None and frame.f_code is _ASK_CODE:
        _pending = True
        return
    signal.default_int_handler(signum, frame)


def install():
    """Once, on the main thread, while SIGINT has Python's default handler."""
    global _installed
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return
    signal.signal(signal.SIGINT, _sigint)
    _lib.lib.zpSetInterruptCheck(_check, None)
    _installed = True


def take():
    """True once after the check ended a call."""
    global _interrupted
    was, _interrupted = _interrupted, False
    return was
