#!/usr/bin/env python3
"""gloo_coll.py: the standard collectives on torch.distributed / Gloo (CPU), nccl-tests style.

The peer of all_reduce_perf, all_gather_perf and broadcast_perf in compare_coll.py:
float32, op sum, the same sizes (nccl-tests': all-reduce and broadcast the buffer,
all-gather the whole output), the same table and busbw factors. Gloo in PyTorch has
no reduce_scatter, so -C reduce_scatter exits 3 saying so.

    python3 bench/gloo_coll.py -C all_reduce -N 4 -b 1M -e 64M -f 2

-c 1 fills rank r's element i with ((7 r + i) mod 17) - 8 and checks every element
of the result exactly (small integers: every summation order gives the same sum).
"""

import argparse
import os
import socket
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from gloo_alltoallv import parse_bytes, size_sweep, free_port  # noqa: E402


def fmt_row(size, count, tname, time_us, algbw, busbw, wrong):
    # Spaces between every column: a time of a second or more still parses.
    w = "N/A" if wrong is None else str(wrong)
    return f" {size:11d} {count:13d} {tname:>9s} {time_us:9.2f} {algbw:7.2f} {busbw:7.2f} {w:>7s}"

COLLS = ("all_reduce", "all_gather", "broadcast", "reduce_scatter")


def parse_args(argv):
    p = argparse.ArgumentParser(description="standard collectives on torch.distributed / Gloo (CPU)")
    p.add_argument("-C", "--coll", choices=COLLS, default="all_reduce")
    p.add_argument("-N", "--nranks", type=int, default=4)
    p.add_argument("-b", type=parse_bytes, default=32 << 20, dest="min_bytes")
    p.add_argument("-e", type=parse_bytes, default=32 << 20, dest="max_bytes")
    p.add_argument("-f", type=float, default=None, dest="factor")
    p.add_argument("-i", type=parse_bytes, default=1 << 20, dest="step_bytes")
    p.add_argument("-n", type=int, default=20, dest="iters")
    p.add_argument("-w", type=int, default=5, dest="warmup")
    p.add_argument("-c", type=int, default=1, choices=(0, 1), dest="check")
    a = p.parse_args(argv)
    if a.factor is None:
        a.factor = 1.0
    return a


def worker(rank, a, port):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    n = a.nranks
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    if rank == 0:
        print(f"# gloo_coll: torch {torch.__version__} Gloo {a.coll}")
        print(f"# nranks {n}  op sum  iters {a.iters}  warmup {a.warmup}  datatype float  check {a.check}")
        print("#")
        print(f"#{'size':>11s}{'count':>14s}{'type':>10s}{'time':>9s}{'algbw':>8s}{'busbw':>8s}{'#wrong':>8s}")
        print(f"#{'(B)':>11s}{'(elements)':>14s}{'':>10s}{'(us)':>9s}{'(GB/s)':>8s}{'(GB/s)':>8s}{'':>8s}")
        sys.stdout.flush()
    total_wrong = 0
    for size in size_sweep(a):
        gather = a.coll == "all_gather"
        count = size // 4 // n if gather else size // 4  # per block for the gather
        total = count * n if gather else count
        send = torch.full((count,), 1.0, dtype=torch.float32)
        outs = [torch.zeros(count, dtype=torch.float32) for _ in range(n)] if gather else None

        def call():
            if a.coll == "all_reduce":
                dist.all_reduce(send)  # Gloo reduces in place
            elif gather:
                dist.all_gather(outs, send)
            else:
                dist.broadcast(send, 0)

        for _ in range(a.warmup):
            call()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(a.iters):
            call()
        t = torch.tensor([(time.perf_counter() - t0) / a.iters], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        time_us = t.item() * 1e6

        wrong = None
        if a.check:
            idx = torch.arange(count, dtype=torch.int64)
            x = lambda r: (((7 * r + idx) % 17) - 8).to(torch.float32)  # noqa: E731
            send.copy_(x(rank) if a.coll != "broadcast" or rank == 0 else torch.full((count,), 99.0))
            call()
            if a.coll == "all_reduce":
                bad = int((send != sum(x(r) for r in range(n))).sum())
            elif gather:
                bad = sum(int((outs[r] != x(r)).sum()) for r in range(n))
            else:
                bad = int((send != x(0)).sum())
            w = torch.tensor([bad * 4], dtype=torch.int64)
            dist.all_reduce(w)
            wrong = int(w.item())
            total_wrong += wrong
        algbw = total * 4 / (time_us * 1e3) if time_us > 0 else 0.0
        factor = {"all_reduce": 2.0 * (n - 1) / n, "all_gather": (n - 1) / n, "broadcast": 1.0}[a.coll]
        if rank == 0:
            print(fmt_row(total * 4, count, "float", time_us, algbw, algbw * factor, wrong))
            sys.stdout.flush()
    if rank == 0:
        print(f"# Out of bounds values : {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}")
    dist.destroy_process_group()
    if total_wrong:
        sys.exit(1)


def main(argv):
    a = parse_args(argv)
    if a.coll == "reduce_scatter":
        print("gloo_coll.py: PyTorch's Gloo backend has no reduce_scatter", file=sys.stderr)
        return 3
    try:
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"gloo_coll.py: {e}", file=sys.stderr)
        return 3
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"  # loopback only
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        mp.spawn(worker, args=(a, free_port()), nprocs=a.nranks, join=True)
    except Exception as e:
        print(f"gloo_coll.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
