#!/usr/bin/env python3
"""ddp_step.py: DistributedDataParallel's training step on the "zeppelin" backend against Gloo, under a busy CPU.

Trains a plain MLP (--layers Linear(width, width) layers with ReLU between,
width 512 by default: about 1.05 M float32 parameters, 4 MiB of gradients
per step in DDP's buckets) on random data with SGD, N processes on this
machine, one torch thread each, meeting over 127.0.0.1. Each run times
--steps steps after --warmup untimed ones and reports the slowest rank's
mean step time. Runs alternate between the backends (gloo, zeppelin, then
zeppelin, gloo, ...) --pairs times; the table gives each backend's median
and the median of the pairs' ratios zeppelin / gloo (below 1: Zeppelin's
step is shorter).

--load K starts K busy processes per core (`python3 -c 'while True: pass'`)
before the first run and kills them after the last, as a trainer's data
loaders, logging and Python keep its CPU busy; --load 0 measures the quiet
machine.

    python3 bench/ddp_step.py --build build -N 4 --pairs 5 --load 2

Needs torch (Debian's python3-torch); the library comes from --build
(ZEPPELIN_LIBRARY) and the package from this tree's python/. Exits non-zero
if a run fails or the ranks' parameters differ after training.
"""

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gloo_alltoallv import slowest_seconds  # noqa: E402
BACKENDS = ("gloo", "zeppelin")


def worker(rank, a, port, out):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if a.backend == "zeppelin":
        import zeppelin.distributed  # noqa: F401 (registers the backend)
    dist.init_process_group(a.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=a.nranks)
    torch.manual_seed(1)  # the same model on every rank (DDP also broadcasts rank 0's)
    layers = []
    for i in range(a.layers):
        layers.append(torch.nn.Linear(a.width, a.width))
        if i + 1 < a.layers:
            layers.append(torch.nn.ReLU())
    ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Sequential(*layers))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(100 + rank)
    x, y = torch.randn(a.batch, a.width, generator=g), torch.randn(a.batch, a.width, generator=g)

    def step():
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()  # the gradients' all-reduce runs here
        opt.step()

    seconds = slowest_seconds(step, a.warmup, a.steps)
    # Every rank must hold the same parameters: compare each with rank 0's.
    flat = torch.cat([p.detach().reshape(-1) for p in ddp.parameters()])
    ref = flat.clone()
    dist.broadcast(ref, 0)
    differ = torch.tensor([int(not torch.equal(flat, ref))], dtype=torch.int64)
    dist.all_reduce(differ)
    if rank == 0:
        with open(out, "w") as f:
            f.write(f"{seconds} {int(differ.item())}\n")
    dist.destroy_process_group()


def run_one(a):
    """The worker side: one backend, one run; prints 'step_seconds ranks_differing'."""
    import tempfile

    import torch.multiprocessing as mp

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # no traffic leaves the machine
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result")
        mp.spawn(worker, args=(a, port, out), nprocs=a.nranks, join=True)
        with open(out) as f:
            print(f.read().strip())


def start_load(per_core):
    n = per_core * (os.cpu_count() or 1)
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("-N", "--nranks", type=int, default=4)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8, help="samples per rank and step")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per run")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps per run first")
    ap.add_argument("--pairs", type=int, default=5, help="runs of each backend, alternating")
    ap.add_argument("--load", type=int, default=2, help="busy processes per core in the background (0: none)")
    ap.add_argument("--backend", choices=BACKENDS, help=argparse.SUPPRESS)  # one run (internal)
    a = ap.parse_args(argv)
    if a.backend:
        run_one(a)
        return 0
    env = dict(os.environ)
    env["ZEPPELIN_LIBRARY"] = os.path.abspath(os.path.join(a.build, "libzeppelin.so"))
    env["PYTHONPATH"] = os.path.join(os.path.dirname(HERE), "python") + os.pathsep + env.get("PYTHONPATH", "")
    times = {b: [] for b in BACKENDS}
    ratios = []
    load = start_load(a.load) if a.load > 0 else []
    bad = 0
    try:
        time.sleep(0.5)  # the load is running
        for pair in range(a.pairs):
            order = BACKENDS if pair % 2 == 0 else BACKENDS[::-1]
            before = open("/proc/loadavg").read().split()[0]  # the load average, this script's load included
            got = {}
            for b in order:
                cmd = [sys.executable, os.path.abspath(__file__), "--backend", b, "-N", str(a.nranks),
                       "--width", str(a.width), "--layers", str(a.layers), "--batch", str(a.batch),
                       "--steps", str(a.steps), "--warmup", str(a.warmup)]
                p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
                fields = p.stdout.split()
                if p.returncode != 0 or len(fields) != 2:
                    print(f"ddp_step.py: the {b} run failed (exit {p.returncode}):\n{p.stderr[-2000:]}", file=sys.stderr)
                    return 1
                if fields[1] != "0":
                    print(f"ddp_step.py: the {b} run ended with {fields[1]} ranks' parameters differing from rank 0's",
                          file=sys.stderr)
                    bad = 1
                got[b] = float(fields[0])
                times[b].append(got[b])
            ratios.append(got["zeppelin"] / got["gloo"])
            print(f"# pair {pair + 1}: gloo {got['gloo'] * 1e3:.2f} ms  zeppelin {got['zeppelin'] * 1e3:.2f} ms  "
                  f"ratio {ratios[-1]:.2f}  load average before {before}", flush=True)
    finally:
        for p in load:
            p.kill()
        for p in load:
            p.wait()
    print(f"# ddp_step: {a.nranks} ranks, MLP {a.layers} x Linear({a.width}, {a.width}), batch {a.batch} per rank, "
          f"{a.steps} steps per run; {a.load} busy processes per core ({len(load)} in all); median of {a.pairs} pairs")
    print(f"{'gloo(ms)':>9} {'zeppelin(ms)':>13} {'ratio':>6}")
    print(f"{statistics.median(times['gloo']) * 1e3:9.2f} {statistics.median(times['zeppelin']) * 1e3:13.2f} "
          f"{statistics.median(ratios):6.2f}")
    return bad


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
