#!/usr/bin/env python3
"""py_alltoallv.py: zeppelin's Python alltoallv on torch tensors against
alltoallv_perf (the same call from C), in one run, interleaved.

For every size (bytes per rank, the uniform pattern: every rank sends
size/N to every rank) and every round, runs alltoallv_perf under zprun and
this script's worker under zprun (which goes first alternates) (zeppelin.init(), torch float32 CPU tensors,
Communicator.alltoallv), and prints both bus bandwidths and their ratio
(median over the rounds). The worker also times the bare C function
through ctypes on the same tensors (a control: py/ctypes is the package's own
Python work alone). All measure alike: warmup, a barrier, `iters`
timed calls, time = the slowest rank's mean per call, algbw = bytes per rank /
time, busbw = algbw x (N-1)/N. The worker checks one call's every element.

    python3 bench/py_alltoallv.py --build build -N 4 -s 1M,64M -r 5
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_size(text):
    m = re.fullmatch(r"(\d+)([KMG]?)", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError("bad size %r" % text)
    return int(m.group(1)) << {"": 0, "K": 10, "M": 20, "G": 30}[m.group(2)]


def worker(args):
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))
    import ctypes
    import torch
    import zeppelin
    from zeppelin import _lib
    torch.set_num_threads(1)
    with zeppelin.init() as comm:
        n, me = comm.size, comm.rank
        for size in args.sizes:
            per = size // (n * 4)  # float32 elements to each rank (rowElems of alltoallv_perf)
            counts = [per] * n
            send = torch.arange(per * n, dtype=torch.float32) + me * per * n
            recv = torch.zeros(per * n, dtype=torch.float32)
            # One checked call: block s of recv is rank s's block `me`.
            comm.alltoallv(send, counts, recv, counts)
            expect = torch.cat([torch.arange(me * per, (me + 1) * per, dtype=torch.float32) + s * per * n
                                for s in range(n)])
            wrong = torch.tensor([int((recv != expect).sum())], dtype=torch.int64)
            comm.all_reduce(wrong)
            # The package's call, and (the control) the bare C function through
            # ctypes on the same tensors: their difference is the package's own
            # Python work, with this process's buffers and scheduling alike.
            arr = (ctypes.c_size_t * n)(*counts)
            disp = (ctypes.c_size_t * n)(*[per * p for p in range(n)])
            calls = {
                "py": lambda: comm.alltoallv(send, counts, recv, counts),
                "ctypes": lambda: _lib.lib.zpAlltoallv(send.data_ptr(), arr, disp, recv.data_ptr(), arr, disp,
                                                       zeppelin.FLOAT32, comm.handle, None),
            }
            for name in ("py", "ctypes"):
                call = calls[name]
                for _ in range(args.warmup):
                    call()
                comm.barrier()
                t0 = time.perf_counter()
                for _ in range(args.iters):
                    call()
                mine = torch.tensor([(time.perf_counter() - t0) / args.iters], dtype=torch.float64)
                comm.all_reduce(mine, op=zeppelin.MAX)
                t_us = float(mine[0]) * 1e6
                algbw = per * n * 4 / (t_us * 1e3)
                if me == 0:
                    print("%s %d %.2f %.3f %d" % (name, per * n * 4, t_us, algbw * (n - 1) / n, int(wrong[0])),
                          flush=True)


def run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit("py_alltoallv: %s failed (%d):\n%s%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    return p.stdout


def c_busbw(args, size):
    out = run([args.zprun, "-n", str(args.nranks), args.perf, "-b", str(size), "-e", str(size), "-P", "uniform",
               "-n", str(args.iters), "-w", str(args.warmup), "-c", "0"])
    rows = [l.split() for l in out.splitlines() if l.strip() and not l.lstrip().startswith("#")]
    # columns: bytes count type time algbw busbw wrong
    return float(rows[-1][3]), float(rows[-1][5])


def py_busbw(args, size):
    """(time, busbw) of the package's call and of the bare ctypes call."""
    out = run([args.zprun, "-n", str(args.nranks), sys.executable, os.path.abspath(__file__), "--worker",
               "-s", str(size), "-n", str(args.iters), "-w", str(args.warmup)])
    rows = {l.split()[0]: l.split() for l in out.splitlines() if l.startswith(("py ", "ctypes "))}
    if int(rows["py"][4]) != 0:
        sys.exit("py_alltoallv: %s wrong elements at %d bytes" % (rows["py"][4], size))
    return (float(rows["py"][2]), float(rows["py"][3])), (float(rows["ctypes"][2]), float(rows["ctypes"][3]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default="build", help="the build directory (default build)")
    ap.add_argument("-N", "--nranks", type=int, default=4)
    ap.add_argument("-s", "--sizes", default="1M,64M", help="bytes per rank, comma-separated (default 1M,64M)")
    ap.add_argument("-r", "--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("-w", "--warmup", type=int, default=5)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.sizes = [parse_size(s) for s in args.sizes.split(",")]
    if args.worker:
        return worker(args)
    args.zprun = os.path.join(args.build, "zprun")
    args.perf = os.path.join(args.build, "bench", "alltoallv_perf")
    os.environ.setdefault("ZEPPELIN_LIBRARY", os.path.abspath(os.path.join(args.build, "libzeppelin.so")))
    print("# %d ranks, float32, uniform pattern, %d iters + %d warmup per run, %d interleaved rounds; "
          "library %s" % (args.nranks, args.iters, args.warmup, args.rounds, os.environ["ZEPPELIN_LIBRARY"]))
    print("# %10s %11s %9s %11s %9s %11s %9s %7s %9s" % ("bytes", "C us", "C busbw", "py us", "py busbw",
                                                           "ctypes us", "ct busbw", "py/C", "py/ctypes"))
    worst = None
    for size in args.sizes:
        c, py, ct = [], [], []
        for rnd in range(args.rounds):  # which goes first alternates
            if rnd % 2 == 0:
                c.append(c_busbw(args, size))
            p, q = py_busbw(args, size)
            py.append(p)
            ct.append(q)
            if rnd % 2 == 1:
                c.append(c_busbw(args, size))
        med = [(statistics.median(t for t, _ in x), statistics.median(b for _, b in x)) for x in (c, py, ct)]
        ratio = med[1][1] / med[0][1] if med[0][1] > 0 else 0.0
        worst = ratio if worst is None else min(worst, ratio)
        print("  %10d %11.1f %9.3f %11.1f %9.3f %11.1f %9.3f %7.3f %9.3f" % (
            size, med[0][0], med[0][1], med[1][0], med[1][1], med[2][0], med[2][1], ratio, med[1][1] / med[2][1]),
            flush=True)
        for name, x in (("C", c), ("py", py), ("ctypes", ct)):
            print("#   %-6s busbw per round: %s" % (name, " ".join("%.3f" % b for _, b in x)))
    print("# worst py/C busbw ratio %.3f (goal >= 0.90: %s)" % (worst, "met" if worst >= 0.9 else "NOT met"))


if __name__ == "__main__":
    main()
