"""An exception in a Python block kernel becomes an error on every rank, not a
hang: rank N-1's kernel raises (in forward, then in backward); ring_attention
raises there with the kernel's exception as __cause__, aborts the
communicator, and every other rank fails with RemoteError (in its attention
call, or in its next call if its share did not need the failing rank), long
before the timeout (ZP_TIMEOUT, 300 s unless set). Each case runs on a child
communicator (comm.split) so the parent, still usable, brings the ranks
back together afterwards. Run under zprun -n N, N >= 2.
"""

import time

import pytest
import torch

import zeppelin
import zeppelin.autograd as za
from zeppelin.kernels import TorchKernel


@pytest.fixture(scope="module")
def comm():
    c = zeppelin.init()
    yield c
    c.destroy()


class Failing(TorchKernel):
    """The torch kernel, except that on one rank the phase given raises on its first call."""

    def __init__(self, fail, phase):
        self.fail, self.phase = fail, phase

    def forward(self, *args):
        if self.fail and self.phase == "forward":
            raise RuntimeError("kernel failed on purpose (forward)")
        return super().forward(*args)

    def backward(self, *args):
        if self.fail and self.phase == "backward":
            raise RuntimeError("kernel failed on purpose (backward)")
        return super().backward(*args)


@pytest.mark.parametrize("phase", ["forward", "backward"])
def test_kernel_exception_fails_every_rank(comm, phase):
    child = comm.split(0)
    n, me = child.size, child.rank
    bad = me == n - 1
    lengths = [4 * n + 1, 3, 5]
    plan = zeppelin.BatchPlan.from_rings(lengths, [list(range(n)), [0], [n - 1]], n, causal=True)
    T = plan.attention_layout.tokens(me)
    q = torch.randn(T, 2, 4, requires_grad=True)
    k = torch.randn(T, 1, 4, requires_grad=True)
    v = torch.randn(T, 1, 4, requires_grad=True)
    t0 = time.monotonic()
    with pytest.raises(zeppelin.ZeppelinError) as info:
        out = za.ring_attention(q, k, v, plan, child, kernel=Failing(bad, phase))
        if phase == "backward":
            out.sum().backward()
        # A rank whose share did not wait on the failing rank's blocks may finish
        # its call (its sends were buffered); its next call on the communicator fails.
        child.barrier()
    took = time.monotonic() - t0
    e = info.value
    if bad:
        assert isinstance(e.__cause__, RuntimeError) and "on purpose (%s)" % phase in str(e.__cause__)
        assert "on purpose" in str(e)
        assert child.handle is None  # aborted
    else:
        assert isinstance(e, zeppelin.RemoteError), repr(e)
        child.abort()
    assert took < 30, "the error took %.1f s to reach rank %d" % (took, me)
    # The parent communicator still works, and every rank got here.
    x = torch.ones(2)
    comm.all_reduce(x)
    assert torch.equal(x, torch.full((2,), float(n)))
