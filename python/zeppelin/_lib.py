"""The ctypes declarations of include/zeppelin.h, and where libzeppelin.so is.

Only this module touches ctypes' view of the library. Every function of the
public header that the package uses is declared here with its argument and
result types, so a wrong call is a Python TypeError rather than a crash.

Where the library is, first found wins:
  1. ZEPPELIN_LIBRARY: the path of libzeppelin.so (a name outside ZP_*, which
     the C library reserves for its own settings);
  2. libzeppelin.so next to this package (a copy placed there by hand or by a
     packager);
  3. the build tree of the source tree this package sits in (<tree>/build,
     where the README's `bash .ci/setup` builds);
  4. the system's loader (libzeppelin.so.0 installed by `cmake --install`).
"""

import ctypes
import os

# ---- the header's types ----
c_int, c_int64, c_size_t, c_void_p, c_char_p = ctypes.c_int, ctypes.c_int64, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_char_p
Result = ctypes.c_int  # zpResult_t (an enum: int)
Comm = c_void_p        # zpComm_t
Stream = c_void_p      # zpStream_t
Plan = c_void_p        # zpBatchPlan_t
LayoutH = c_void_p     # zpLayout_t
RemapH = c_void_p      # zpRemap_t
RingH = c_void_p       # zpRing_t
AttentionH = c_void_p  # zpAttention_t

UNIQUE_ID_BYTES = 128
CONFIG_UNDEF_INT = -2147483647 - 1
CONFIG_MAGIC = 0x7A70636E
SPLIT_NOCOLOR = -1
ANY_SOURCE = -1
MAX_CALL_BYTES = 1 << 48


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * UNIQUE_ID_BYTES)]


class WaitEntry(ctypes.Structure):
    _fields_ = [("rank", c_int), ("callsLast", c_int), ("totalWaitSec", ctypes.c_double),
                ("maxWaitSec", ctypes.c_double)]


class RailEntry(ctypes.Structure):
    _fields_ = [("rail", c_int), ("nic", ctypes.c_char * 32), ("nominalBitsPerSec", ctypes.c_double),
                ("bitsPerSec", ctypes.c_double), ("slow", c_int), ("changes", c_int)]


class Config(ctypes.Structure):
    _fields_ = [("size", c_size_t), ("magic", ctypes.c_uint), ("version", ctypes.c_uint),
                ("timeoutMs", c_int), ("routing", c_int), ("nodeId", c_char_p), ("netDevices", c_char_p)]


class AttnShape(ctypes.Structure):
    _fields_ = [("qHeads", c_int), ("kvHeads", c_int), ("headDim", c_int), ("elemBytes", c_int), ("causal", c_int)]


class ClusterModel(ctypes.Structure):
    _fields_ = [("nodes", c_int), ("ranksPerNode", c_int), ("nicsPerNode", c_int), ("nicGbps", ctypes.c_double),
                ("intraNodeGBps", ctypes.c_double), ("tflops", ctypes.c_double), ("efficiency", ctypes.c_double)]


class Segment(ctypes.Structure):
    _fields_ = [("seq", c_int64), ("start", c_int64), ("count", c_int64)]


_fp = ctypes.POINTER(ctypes.c_float)


class AttnBlock(ctypes.Structure):
    _fields_ = [("q", _fp), ("k", _fp), ("v", _fp), ("out", _fp), ("lse", _fp), ("dout", _fp),
                ("dq", _fp), ("dk", _fp), ("dv", _fp), ("sq", c_int64), ("sk", c_int64),
                ("qHeads", c_int), ("kvHeads", c_int), ("headDim", c_int), ("scale", ctypes.c_float),
                ("mask", c_int), ("accumulate", c_int), ("datatype", c_int), ("stream", c_void_p)]


AttnKernel = ctypes.CFUNCTYPE(Result, ctypes.POINTER(AttnBlock), c_void_p)
InterruptCheck = ctypes.CFUNCTYPE(c_int, c_void_p)  # zpInterruptCheck_t


class AttnConfig(ctypes.Structure):
    _fields_ = [("qHeads", c_int), ("kvHeads", c_int), ("headDim", c_int), ("scale", ctypes.c_float),
                ("forward", c_void_p), ("backward", c_void_p), ("user", c_void_p), ("kernelAccumulates", c_int),
                ("datatype", c_int)]


def _candidates():
    env = os.environ.get("ZEPPELIN_LIBRARY")
    if env:
        return [env], True
    try:  # an installed package (cmake --install) names its library
        from ._installed import LIBRARY
        return [LIBRARY], True
    except ImportError:
        pass
    here = os.path.dirname(os.path.abspath(__file__))
    tree = os.path.dirname(os.path.dirname(here))  # <tree>/python/zeppelin -> <tree>
    return [os.path.join(here, "libzeppelin.so"), os.path.join(tree, "build", "libzeppelin.so"),
            "libzeppelin.so.0", "libzeppelin.so"], False


def _load():
    paths, explicit = _candidates()
    tried = []
    for p in paths:
        if os.sep in p and not os.path.exists(p):
            tried.append(p + " (absent)")
            continue
        try:
            return ctypes.CDLL(p), p
        except OSError as e:
            tried.append("%s (%s)" % (p, e))
    hint = "" if explicit else "; build the tree (bash .ci/setup) or set ZEPPELIN_LIBRARY to libzeppelin.so"
    raise ImportError("zeppelin: cannot load libzeppelin.so: tried " + ", ".join(tried) + hint)


# A failed call raises an exception that carries the library's message, so
# the library logs returned errors at INFO, not WARN (unless the user chose;
# the log reads its settings once, at its first line).
os.environ.setdefault("ZP_DEBUG_ERRORS", "INFO")
lib, path = _load()

_P = ctypes.POINTER
_SIGNATURES = {
    "zpGetErrorString": (c_char_p, [c_int]),
    "zpGetLastError": (c_char_p, [Comm]),
    "zpGetVersion": (Result, [_P(c_int)]),
    "zpGetParam": (Result, [c_char_p, _P(c_char_p)]),
    "zpGetUniqueId": (Result, [_P(UniqueId)]),
    "zpCommInitRankConfig": (Result, [_P(Comm), c_int, UniqueId, c_int, _P(Config)]),
    "zpCommInitFromEnv": (Result, [_P(Comm), _P(Config)]),
    "zpCommDestroy": (Result, [Comm]),
    "zpCommAbort": (Result, [Comm]),
    "zpCommGetAsyncError": (Result, [Comm, _P(c_int)]),
    "zpSetInterruptCheck": (Result, [InterruptCheck, c_void_p]),
    "zpCommGetWaitReport": (Result, [Comm, _P(WaitEntry), c_int, _P(c_int), _P(c_int)]),
    "zpCommGetRailReport": (Result, [Comm, _P(RailEntry), c_int, _P(c_int)]),
    "zpCommCount": (Result, [Comm, _P(c_int)]),
    "zpCommUserRank": (Result, [Comm, _P(c_int)]),
    "zpCommCheckBuffer": (Result, [Comm, c_void_p, Stream]),
    "zpCommSplit": (Result, [Comm, c_int, c_int, _P(Comm), _P(Config)]),
    "zpCommGetNcclComm": (Result, [Comm, _P(c_void_p)]),
    "zpGroupStart": (Result, []),
    "zpGroupEnd": (Result, []),
    "zpSend": (Result, [c_void_p, c_size_t, c_int, c_int, Comm, Stream]),
    "zpRecv": (Result, [c_void_p, c_size_t, c_int, c_int, Comm, Stream]),
    "zpRecvFrom": (Result, [c_void_p, c_size_t, c_int, c_int, _P(c_int), Comm, Stream]),
    "zpAlltoallv": (Result, [c_void_p, _P(c_size_t), _P(c_size_t), c_void_p, _P(c_size_t), _P(c_size_t),
                             c_int, Comm, Stream]),
    "zpAllReduce": (Result, [c_void_p, c_void_p, c_size_t, c_int, c_int, Comm, Stream]),
    "zpBroadcast": (Result, [c_void_p, c_void_p, c_size_t, c_int, c_int, Comm, Stream]),
    "zpReduce": (Result, [c_void_p, c_void_p, c_size_t, c_int, c_int, c_int, Comm, Stream]),
    "zpAllGather": (Result, [c_void_p, c_void_p, c_size_t, c_int, Comm, Stream]),
    "zpReduceScatter": (Result, [c_void_p, c_void_p, c_size_t, c_int, c_int, Comm, Stream]),
    "zpAllGatherv": (Result, [c_void_p, c_size_t, c_void_p, c_void_p, c_void_p, c_int, Comm, Stream]),
    "zpReduceScatterv": (Result, [c_void_p, c_void_p, c_void_p, c_int, c_int, Comm, Stream]),
    "zpBarrier": (Result, [Comm, Stream]),
    "zpPlanBatch": (Result, [_P(Plan), c_int, _P(c_int64), _P(AttnShape), _P(ClusterModel), Comm]),
    "zpPlanCreate": (Result, [_P(Plan), c_int, _P(c_int64), c_int, c_int, c_int, _P(c_size_t), _P(c_int)]),
    "zpPlanDestroy": (Result, [Plan]),
    "zpPlanSequence": (Result, [Plan, c_int64, _P(c_int), _P(c_int), _P(_P(c_int))]),
    "zpPlanRingOrder": (Result, [Plan, _P(_P(c_int64)), _P(c_int)]),
    "zpPlanSetRingOrder": (Result, [Plan, c_int, _P(c_int64)]),
    "zpPlanGetLayout": (Result, [Plan, c_int, _P(LayoutH)]),
    "zpPlanGetInfo": (Result, [Plan, _P(c_int), _P(c_int), _P(_P(c_int64)), _P(c_int)]),
    "zpLayoutCreate": (Result, [_P(LayoutH), c_int, _P(c_int64), c_int, _P(c_size_t), _P(Segment)]),
    "zpLayoutDestroy": (Result, [LayoutH]),
    "zpLayoutRankTokens": (Result, [LayoutH, c_int, _P(c_int64)]),
    "zpLayoutRankSegments": (Result, [LayoutH, c_int, _P(_P(Segment)), _P(c_size_t)]),
    "zpLayoutGetInfo": (Result, [LayoutH, _P(c_int), _P(c_int), _P(_P(c_int64))]),
    "zpRemapCreate": (Result, [_P(RemapH), LayoutH, LayoutH, Comm]),
    "zpRemapExecute": (Result, [RemapH, c_void_p, c_void_p, c_size_t, c_int, c_int, Comm, Stream]),
    "zpRemapDestroy": (Result, [RemapH]),
    "zpUlyssesAlltoall": (Result, [c_void_p, c_void_p, LayoutH, c_int, c_int, c_int, c_int, c_int, Comm, Stream]),
    "zpRingCreate": (Result, [_P(RingH), Comm, c_int, _P(c_int), c_int]),
    "zpRingExchangeStart": (Result, [RingH, c_void_p, c_size_t, c_void_p, c_size_t, Stream]),
    "zpRingExchangeWait": (Result, [RingH]),
    "zpRingDestroy": (Result, [RingH]),
    "zpAttentionCreate": (Result, [_P(AttentionH), Plan, _P(AttnConfig), Comm]),
    "zpAttentionForward": (Result, [AttentionH] + [c_void_p] * 6),  # q k v out lse stream
    "zpAttentionBackward": (Result, [AttentionH] + [c_void_p] * 10),  # ... dq dk dv stream
    "zpAttentionDestroy": (Result, [AttentionH]),
    "zpAttnMergeLse": (Result, [c_void_p, c_void_p, c_void_p, c_void_p, c_int64, c_int, c_int, c_void_p]),
    "zpTypeSize": (c_size_t, [c_int]),
    "zpSetLastError": (Result, [Comm, c_int, c_char_p]),  # called with "%s" and one string
}
for _name, (_res, _args) in _SIGNATURES.items():
    _f = getattr(lib, _name)
    _f.restype = _res
    if _name != "zpSetLastError":  # variadic: argtypes would fix its arity
        _f.argtypes = _args

# The reference kernels, as plain addresses for zpAttnConfig_t.
ATTN_REF_FORWARD = ctypes.cast(lib.zpAttnRefForward, c_void_p).value
ATTN_REF_BACKWARD = ctypes.cast(lib.zpAttnRefBackward, c_void_p).value


def size_array(values):
    """A size_t[] holding values (None for no values)."""
    if values is None:
        return None
    return (c_size_t * len(values))(*values)
