"""zeppelin: Python bindings of Zeppelin's public C API (include/zeppelin.h).

The bindings are plain ctypes over libzeppelin.so: no compiled module,
nothing from PyPI, and they call the one public header exactly as any user's
program could (no private symbols). torch and NumPy are optional: the data
calls take torch tensors (CPU, or CUDA in a build with CUDA, on the current
torch stream), NumPy arrays, any object with __dlpack__, or any
buffer-protocol object, and check dtype, device, contiguity and lengths in
Python before calling C. Every zpResult_t maps to an exception class under
ZeppelinError carrying Zeppelin's error text.

    import torch, zeppelin
    with zeppelin.init() as comm:                 # zprun, torchrun, mpirun or srun
        x = torch.full((4,), float(comm.rank))
        comm.all_reduce(x)                         # in place, op=zeppelin.SUM
        plan = zeppelin.plan_batch([4096, 1024, 512], comm)
        remap = zeppelin.Remap(plan.linear_layout, plan.attention_layout, comm)

Where libzeppelin.so is found: see zeppelin._lib (ZEPPELIN_LIBRARY, next to
the package, the source tree's build/, the system loader).
"""

from . import _lib
from ._buffers import BFLOAT16, FLOAT16, FLOAT32, FLOAT64, INT8, INT32, INT64, UINT8, UINT32, UINT64, dtype_of
from .comm import (ANY_SOURCE, AVG, MAX, MIN, PROD, SPLIT_NOCOLOR, SUM, UNIQUE_ID_BYTES, Communicator, ReduceOp,
                   Source, get_unique_id, group, init, version)
from .errors import (CudaError, InProgress, InternalError, InvalidArgument, InvalidUsage, RemoteError,
                     ZeppelinError, ZpSystemError, error_class)
from .plan import (INTER_NODE, INTRA_NODE, LOCAL, Attention, AttnBlock, BatchPlan, Layout, Remap, Ring,
                   lengths_from_cu_seqlens, plan_ahead, plan_batch, ulysses_alltoall, ulysses_heads)

library_path = _lib.path
__version__ = "%d.%d.%d" % version()  # the loaded library's (zpGetVersion)

__all__ = [
    "AVG", "MAX", "MIN", "PROD", "SUM", "SPLIT_NOCOLOR", "ANY_SOURCE", "UNIQUE_ID_BYTES", "ReduceOp",
    "Communicator", "Source", "init", "get_unique_id", "group", "version",
    "ZeppelinError", "CudaError", "ZpSystemError", "InternalError", "InvalidArgument", "InvalidUsage",
    "RemoteError", "InProgress", "error_class",
    "BatchPlan", "Layout", "Remap", "Ring", "Attention", "AttnBlock", "plan_batch", "plan_ahead", "lengths_from_cu_seqlens",
    "ulysses_alltoall",
    "ulysses_heads", "LOCAL", "INTRA_NODE", "INTER_NODE",
    "INT8", "UINT8", "INT32", "UINT32", "INT64", "UINT64", "FLOAT16", "FLOAT32", "FLOAT64", "BFLOAT16",
    "dtype_of", "library_path", "__version__",
]
