"""Buffers: torch tensors, NumPy arrays, DLPack and buffer-protocol objects
as (address, elements, zpDataType_t, device), checked in Python before any C
call so a bad argument is a clear InvalidArgument and never reaches C.

torch and NumPy are not imported here: an object is recognised by its type's
module, so the package imports (and works on bytearrays) without either.
"""

from __future__ import annotations

import ctypes
import os
import weakref
from typing import Any, Dict, Optional, Tuple

from .errors import InvalidArgument

# zpDataType_t values, by the dtype names torch and NumPy use.
INT8, UINT8, INT32, UINT32, INT64, UINT64, FLOAT16, FLOAT32, FLOAT64, BFLOAT16 = range(10)
DTYPES = {"int8": INT8, "uint8": UINT8, "int32": INT32, "uint32": UINT32, "int64": INT64, "uint64": UINT64,
          "float16": FLOAT16, "float32": FLOAT32, "float64": FLOAT64, "bfloat16": BFLOAT16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
DTYPE_SIZES = {INT8: 1, UINT8: 1, INT32: 4, UINT32: 4, INT64: 8, UINT64: 8, FLOAT16: 2, FLOAT32: 4, FLOAT64: 8,
               BFLOAT16: 2}
# struct module format characters of the buffer protocol (native byte order).
_FORMATS = {"b": INT8, "B": UINT8, "c": UINT8, "i": INT32, "I": UINT32, "l": INT64, "L": UINT64, "q": INT64,
            "Q": UINT64, "e": FLOAT16, "f": FLOAT32, "d": FLOAT64}
# DLPack's (type code, bits).
_DLPACK = {(0, 8): INT8, (1, 8): UINT8, (0, 32): INT32, (1, 32): UINT32, (0, 64): INT64, (1, 64): UINT64,
           (2, 16): FLOAT16, (2, 32): FLOAT32, (2, 64): FLOAT64, (4, 16): BFLOAT16}


class Buf:
    """One checked buffer of a call."""
    __slots__ = ("obj", "ptr", "numel", "dtype", "device", "device_index", "keep", "stream")

    def __init__(self, obj, ptr, numel, dtype, device="cpu", device_index=-1, keep=None, stream=None):
        self.obj, self.ptr, self.numel, self.dtype = obj, ptr, numel, dtype
        self.device, self.device_index, self.keep, self.stream = device, device_index, keep, stream

    @property
    def nbytes(self):
        return self.numel * DTYPE_SIZES[self.dtype]

    def at(self, elems):
        """The address elems elements in."""
        return self.ptr + elems * DTYPE_SIZES[self.dtype]


def _is_torch(obj):
    return type(obj).__module__.startswith("torch") and hasattr(obj, "data_ptr")


def _is_numpy(obj):
    return type(obj).__module__ == "numpy" and hasattr(obj, "__array_interface__")


def dtype_of(obj: Any) -> Optional[int]:
    """The zpDataType_t of a tensor, array or dtype (torch or NumPy), or None."""
    name = str(getattr(obj, "dtype", obj))
    name = name[6:] if name.startswith("torch.") else name
    return DTYPES.get(name)


_TORCH_CODES: Dict[Any, Optional[int]] = {}  # torch.dtype -> zpDataType_t (None: unsupported), filled as dtypes are seen


def _torch(obj, what, writable):
    # The hot path of every call: a few attribute reads, no string work.
    dt = obj.dtype
    code = _TORCH_CODES.get(dt, -1)
    if code == -1:
        code = _TORCH_CODES[dt] = DTYPES.get(str(dt)[6:])
    if code is None:
        raise InvalidArgument("%s: torch dtype %s is not supported (one of %s)" % (what, dt, ", ".join(DTYPES)))
    if obj.is_sparse:
        raise InvalidArgument("%s: a sparse tensor cannot be sent; pass a dense one" % what)
    if not obj.is_contiguous():
        raise InvalidArgument("%s: the tensor is not contiguous (shape %s, strides %s); pass .contiguous()"
                              % (what, tuple(obj.shape), tuple(obj.stride())))
    if obj.is_cuda:
        import torch
        dev = obj.device
        return Buf(obj, obj.data_ptr(), obj.numel(), code, "cuda", dev.index,
                   stream=torch.cuda.current_stream(dev).cuda_stream)
    if not obj.is_cpu:
        raise InvalidArgument("%s: a tensor on device %s; Zeppelin takes CPU tensors, or CUDA tensors in a "
                              "build with CUDA" % (what, obj.device))
    b = Buf(obj, obj.data_ptr(), obj.numel(), code)
    if writable and b.numel:
        _check_torch_writable(obj, b, what)
    return b


# ---- Is a CPU tensor's memory writable? ----
# torch (1.13) keeps no read-only flag: torch.frombuffer over a read-only mmap
# only warns, and writing the tensor then kills the process with SIGSEGV. So
# an output tensor's pages are asked directly: one byte of the tensor is read
# from /proc/self/mem (which reads any mapped memory without faulting) into
# the tensor itself, and the kernel's copy into it fails with EFAULT where
# the page may not be written. The byte written back is the one just read,
# and the call is about to overwrite this output anyway. The first and the
# last page are asked; a tensor whose middle pages alone are read-only is
# not found. Memory that is writable but belongs to an immutable Python
# object (torch.frombuffer(bytes)) cannot be told apart soundly: a header
# search found stale headers of freed bytes objects in torch's own
# allocations, so there is none (docs/reliability.md).
# A tensor found writable is remembered (weakly, with its address), since
# outputs are reused call after call; the check then costs a dict lookup.
# id(tensor) -> (a weak reference to it, (address, bytes)); by id, since a
# tensor's == is elementwise and WeakKeyDictionary compares keys with it.
_checked: Dict[int, Tuple[Any, Tuple[int, int]]] = {}
_mem: Dict[str, Any] = {}  # "pid", "fd": /proc/self/mem of this process (reopened after fork)


def _self_mem():
    if _mem.get("pid") != os.getpid():
        try:
            _mem["fd"] = os.open("/proc/self/mem", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            _mem["fd"] = None  # no procfs: the check is skipped, as docs/reliability.md says
        _mem["pid"] = os.getpid()
    return _mem["fd"]


_pread = ctypes.CDLL(None, use_errno=True).pread
_pread.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_long]
_pread.restype = ctypes.c_ssize_t


def _check_torch_writable(obj, b, what):
    key = (b.ptr, b.nbytes)
    seen = _checked.get(id(obj))
    if seen is not None and seen[0]() is obj and seen[1] == key:
        return
    fd = _self_mem()
    if fd is None:
        return
    last = b.ptr + b.nbytes - 1
    for at in (b.ptr,) if last // 4096 == b.ptr // 4096 else (b.ptr, last):
        if _pread(fd, at, 1, at) != 1:
            raise InvalidArgument("%s: the tensor's memory is read-only (torch.frombuffer over a read-only "
                                  "buffer?); pass a writable tensor" % what)
    ident = id(obj)
    _checked[ident] = (weakref.ref(obj, lambda _, ident=ident: _checked.pop(ident, None)), key)


def _numpy(obj, what, writable):
    if not obj.dtype.isnative:
        raise InvalidArgument("%s: a non-native byte order (%s)" % (what, obj.dtype))
    code = DTYPES.get(obj.dtype.name)
    if code is None:
        raise InvalidArgument("%s: NumPy dtype %s is not supported (one of %s)" % (what, obj.dtype,
                                                                                    ", ".join(DTYPES)))
    if not obj.flags.c_contiguous:
        raise InvalidArgument("%s: the array is not C-contiguous (shape %s, strides %s); pass "
                              "numpy.ascontiguousarray(...)" % (what, obj.shape, obj.strides))
    if writable and not obj.flags.writeable:
        raise InvalidArgument("%s: the array is read-only" % what)
    return Buf(obj, obj.__array_interface__["data"][0], int(obj.size), code)


# ---- DLPack (any object with __dlpack__: CuPy, JAX, ...) ----
class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", _DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


_capsule_ptr = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_ptr.restype = ctypes.c_void_p
_capsule_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]


def _dlpack(obj, what, stream):
    # The capsule is not consumed: its destructor frees the DLManagedTensor
    # (whose DLTensor comes first) once the call no longer holds it.
    cap = obj.__dlpack__() if stream is None else obj.__dlpack__(stream=stream)
    t = _DLTensor.from_address(_capsule_ptr(cap, b"dltensor"))
    code = _DLPACK.get((t.dtype.code, t.dtype.bits)) if t.dtype.lanes == 1 else None
    if code is None:
        raise InvalidArgument("%s: DLPack dtype (code %d, %d bits, %d lanes) is not supported"
                              % (what, t.dtype.code, t.dtype.bits, t.dtype.lanes))
    shape = [t.shape[i] for i in range(t.ndim)]
    numel = 1
    for s in shape:
        numel *= s
    if t.strides and numel > 1:
        expect = 1
        for i in reversed(range(t.ndim)):
            if shape[i] != 1 and t.strides[i] != expect:
                raise InvalidArgument("%s: the array is not contiguous (shape %s)" % (what, shape))
            expect *= shape[i]
    if t.device.device_type not in (1, 2, 3):  # CPU, CUDA, CUDA host
        raise InvalidArgument("%s: DLPack device type %d; Zeppelin takes host memory, or CUDA memory in a "
                              "build with CUDA" % (what, t.device.device_type))
    device = "cuda" if t.device.device_type == 2 else "cpu"
    return Buf(obj, (t.data or 0) + t.byte_offset, numel, code, device, t.device.device_id, keep=cap)


def _memoryview(obj, what, writable):
    try:
        mv = memoryview(obj)
    except TypeError:
        raise InvalidArgument("%s: %s is not a tensor, an array, a DLPack object or a buffer"
                              % (what, type(obj).__name__)) from None
    fmt = mv.format.lstrip("@=")
    code = _FORMATS.get(fmt)
    if code is None or mv.itemsize != DTYPE_SIZES[code]:
        raise InvalidArgument("%s: buffer format %r is not supported" % (what, mv.format))
    if not mv.c_contiguous:
        raise InvalidArgument("%s: the buffer is not C-contiguous" % what)
    if writable and mv.readonly:
        raise InvalidArgument("%s: the buffer is read-only" % what)
    # The address through the buffer protocol itself (read-only buffers too);
    # mv keeps its own export, so the memory stays put while the call holds it.
    pb = _PyBuffer()
    if _get_buffer(mv, ctypes.byref(pb), 0) != 0:
        raise InvalidArgument("%s: cannot read the buffer's address" % what)
    ptr = pb.buf or 0
    _release_buffer(ctypes.byref(pb))
    return Buf(obj, ptr, mv.nbytes // mv.itemsize, code, keep=mv)


class _PyBuffer(ctypes.Structure):  # CPython's Py_buffer
    _fields_ = [("buf", ctypes.c_void_p), ("obj", ctypes.c_void_p), ("len", ctypes.c_ssize_t),
                ("itemsize", ctypes.c_ssize_t), ("readonly", ctypes.c_int), ("ndim", ctypes.c_int),
                ("format", ctypes.c_char_p), ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p),
                ("suboffsets", ctypes.c_void_p), ("internal", ctypes.c_void_p)]


_get_buffer = ctypes.pythonapi.PyObject_GetBuffer
_get_buffer.argtypes = [ctypes.py_object, ctypes.POINTER(_PyBuffer), ctypes.c_int]
_get_buffer.restype = ctypes.c_int
_release_buffer = ctypes.pythonapi.PyBuffer_Release
_release_buffer.argtypes = [ctypes.POINTER(_PyBuffer)]
_release_buffer.restype = None


_KIND: Dict[type, str] = {}  # type -> "torch" | "numpy" | "dlpack" | "buffer"


def _kind(obj):
    t = type(obj)
    k = _KIND.get(t)
    if k is None:
        k = _KIND[t] = ("torch" if _is_torch(obj) else "numpy" if _is_numpy(obj) else
                        "dlpack" if hasattr(obj, "__dlpack__") else "buffer")
    return k


def buffer(obj, what, writable=False, stream=None):
    """The Buf of one call argument (what names it in errors)."""
    if obj is None:
        raise InvalidArgument("%s is None" % what)
    k = _kind(obj)
    if k == "torch":
        return _torch(obj, what, writable)
    if k == "numpy":
        return _numpy(obj, what, writable)
    if k == "dlpack":
        return _dlpack(obj, what, stream)
    return _memoryview(obj, what, writable)


def same_dtype(bufs, fn):
    first = bufs[0]
    for b in bufs[1:]:
        if b.dtype != first.dtype:
            raise InvalidArgument("%s: dtypes differ: %s and %s" % (fn, DTYPE_NAMES[first.dtype],
                                                                    DTYPE_NAMES[b.dtype]))
