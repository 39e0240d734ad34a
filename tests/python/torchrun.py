#!/usr/bin/env python3
"""Runs `python3 -m torch.distributed.run ARGS...` on this machine with a
master port P whose next port is free too: torchrun's store takes P and
Zeppelin's rendezvous P + 1 (torchrun's --standalone picks only P, and on a
shared machine P + 1 may be taken). Exits with torchrun's exit code."""
import socket
import subprocess
import sys


def free_port_pair():
    for _ in range(100):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            port = a.getsockname()[1]
            try:
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    sys.exit("torchrun.py: no free pair of loopback ports")


port = free_port_pair()
cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--master_addr", "127.0.0.1",
       "--master_port", str(port)] + sys.argv[1:]
sys.exit(subprocess.call(cmd))
