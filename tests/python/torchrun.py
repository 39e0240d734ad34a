#!/usr/bin/env python3
"""Runs `python3 -m torch.distributed.run ARGS...` on this machine with a
master port P whose next port is free too: torchrun's store takes P and
Zeppelin's rendezvous P + 1 (torchrun's --standalone picks only P, and on a
shared machine P + 1 may be taken). Exits with torchrun's exit code.

A port found free can still be taken before torchrun's store or rank 0's
rendezvous listens on it. Ports that the kernel hands out by itself (to
every connect() and bind to port 0 on the machine: the ephemeral range)
are the likeliest to be, so P is drawn below that range; and a run that
failed because a port was in use ("Address already in use", from the
store or from Zeppelin's rendezvous) is run again on another pair, up to
three times in all. Any other failure is final."""
import random
import socket
import subprocess
import sys

IN_USE = "Address already in use"


def ephemeral_low():
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_pair(rng):
    top = ephemeral_low() - 2
    for _ in range(200):
        port = rng.randrange(10000, top) if top > 10000 else rng.randrange(1024, 65534)
        with socket.socket() as a, socket.socket() as b:
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
            return port
    sys.exit("torchrun.py: no free pair of loopback ports")


def run(port):
    """torchrun on `port`, its output passed through as it comes; (exit code, output)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--master_addr", "127.0.0.1",
           "--master_port", str(port)] + sys.argv[1:]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = []
    for line in iter(p.stdout.readline, b""):
        sys.stdout.buffer.write(line)
        sys.stdout.buffer.flush()
        out.append(line.decode(errors="replace"))
    return p.wait(), "".join(out)


def main():
    rng = random.Random()
    for attempt in range(3):
        port = free_port_pair(rng)
        code, out = run(port)
        if code == 0 or IN_USE not in out:
            return code
        print("torchrun.py: port %d or %d was taken before it was listened on; again on other ports" % (port, port + 1),
              flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
