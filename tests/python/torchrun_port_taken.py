#!/usr/bin/env python3
"""Checks that tests/python/torchrun.py survives a port taken between its
check and its use: the first pair it draws has P + 1 (Zeppelin's
rendezvous port) taken by a listener here, as another process on a busy
machine could take it. That run must fail with "Address already in use"
on rank 0, and torchrun.py must run the job again on other ports, where
it succeeds. Exits 0 when it did; run under ctest as python_torchrun_port_taken."""
import importlib.util
import os
import socket
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("torchrun", os.path.join(here, "torchrun.py"))
torchrun = importlib.util.module_from_spec(spec)
spec.loader.exec_module(torchrun)

thief = socket.socket()
thief.bind(("127.0.0.1", 0))
thief.listen(1)
taken = thief.getsockname()[1] - 1  # P, whose P + 1 is taken
draws = []
free_pair = torchrun.free_port_pair


def rigged(rng):
    draws.append(1)
    return taken if len(draws) == 1 else free_pair(rng)


torchrun.free_port_pair = rigged
with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
    f.write("import sys\n"
            "sys.path.insert(0, %r)\n" % os.path.join(os.path.dirname(os.path.dirname(here)), "python") +
            "import zeppelin, numpy as np\n"
            "c = zeppelin.init()\n"
            "x = np.ones(8, dtype=np.float32)\n"
            "c.all_reduce(x)\n"
            "assert (x == c.size).all(), x\n"
            "c.destroy()\n")
    job = f.name
sys.argv = ["torchrun.py", "--nproc_per_node", "2", "--redirects", "2", "--tee", "2", "--monitor_interval", "0.2", job]
try:
    code = torchrun.main()
finally:
    os.unlink(job)
if code != 0 or len(draws) != 2:
    sys.exit("torchrun_port_taken.py: exit code %d after %d draws (want 0 after 2)" % (code, len(draws)))
print("torchrun_port_taken.py: the run on a taken port was retried and passed")
