#!/usr/bin/env python3
"""gloo_collectives.py: all_reduce_perf / all_gather_perf / broadcast_perf's sweep on PyTorch's Gloo (CPU).

Starts N processes on this machine, one torch thread each, that meet over
127.0.0.1 and run dist.all_reduce (sum, in place), dist.all_gather or
dist.broadcast on float32 tensors of the same sizes as the Zeppelin and MPI
programs; prints the same table (nccl-tests' busbw formulas). -c 1 checks
every element (inputs are small integers: exact sums). Torch 1.13's Gloo has
no reduce_scatter: -o reducescatter exits 4.

--backend zeppelin runs the same calls through Zeppelin's torch.distributed
backend (zeppelin.distributed; the library from ZEPPELIN_LIBRARY or the
tree's build), to put it beside Gloo under the same torch calls.

    python3 bench/gloo_collectives.py -o allreduce -N 4 -b 1M -e 64M -f 2
    ZEPPELIN_LIBRARY=build/libzeppelin.so python3 bench/gloo_collectives.py --backend zeppelin -o allreduce -N 4
"""

import argparse
import os
import socket
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gloo_alltoallv import fmt_row, parse_bytes, slowest_seconds  # noqa: E402


def worker(rank, a, port):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    n = a.nranks
    if a.backend == "zeppelin":
        import zeppelin.distributed  # noqa: F401 (registers the backend)
    dist.init_process_group(a.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    if rank == 0:
        print(f"# gloo_collectives: torch {torch.__version__} backend {a.backend} {a.op}")
        print(f"# nranks {n}  iters {a.iters}  warmup {a.warmup}  datatype float  check {a.check}")
        print("#")
        sys.stdout.flush()
    size, total_wrong = parse_bytes(a.b), 0
    while True:
        count = size // 4 // (n if a.op == "allgather" else 1)
        t = torch.full((count,), 1.0)
        out = [torch.empty(count) for _ in range(n)] if a.op == "allgather" else None

        def call():
            if a.op == "allreduce":
                dist.all_reduce(t)
            elif a.op == "allgather":
                dist.all_gather(out, t)
            else:
                dist.broadcast(t, 0)

        time_us = slowest_seconds(call, a.warmup, a.iters) * 1e6
        wrong = None
        if a.check:
            idx = torch.arange(count)
            t.copy_(((rank + idx) % 8).float())
            call()
            if a.op == "allreduce":
                want = sum(((r + idx) % 8).float() for r in range(n))
                local = int((t != want).sum())
            elif a.op == "allgather":
                local = sum(int((out[r] != ((r + idx) % 8).float()).sum()) for r in range(n))
            else:
                local = int((t != (idx % 8).float()).sum())
            w = torch.tensor([local], dtype=torch.int64)
            dist.all_reduce(w)
            wrong = int(w.item())
            total_wrong += wrong
        nbytes = count * 4 * (n if a.op == "allgather" else 1)
        algbw = nbytes / (time_us * 1e3) if time_us > 0 else 0.0
        factor = 2 * (n - 1) / n if a.op == "allreduce" else (n - 1) / n if a.op == "allgather" else 1
        if rank == 0:
            print(fmt_row(nbytes, nbytes // 4, "float", time_us, algbw, algbw * factor, wrong))
            sys.stdout.flush()
        if size >= parse_bytes(a.e):
            break
        size = int(size * float(a.f))
    dist.destroy_process_group()
    if total_wrong:
        sys.exit(1)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--op", choices=["allreduce", "allgather", "broadcast", "reducescatter"], required=True)
    ap.add_argument("-N", "--nranks", type=int, default=4)
    ap.add_argument("-b", default="1M")
    ap.add_argument("-e", default="64M")
    ap.add_argument("-f", default="2")
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("-w", "--warmup", type=int, default=5)
    ap.add_argument("-c", "--check", type=int, default=1)
    ap.add_argument("--backend", choices=["gloo", "zeppelin"], default="gloo")
    a = ap.parse_args(argv)
    if a.op == "reducescatter":
        print("gloo_collectives.py: torch 1.13's Gloo has no reduce_scatter", file=sys.stderr)
        return 4
    import torch.multiprocessing as mp
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # no traffic leaves the machine
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        mp.spawn(worker, args=(a, port), nprocs=a.nranks, join=True)
    except Exception as e:
        print(f"gloo_collectives.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
