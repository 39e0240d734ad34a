#!/usr/bin/env python3
"""compare_latency.py: Zeppelin's small-message latency against Open MPI's, in one run.

For each rank count (-N, default 2 and 4) and each operation (a ring
send/recv, an all-reduce and a barrier): Zeppelin's program under zprun and
the same source built against MPI under mpirun (shared memory: pml ob1, btl
self,vader), interleaved --repeat times, every element checked in a last
run. Prints the median time per call (microseconds) of each per size and the
ratio Zeppelin / Open MPI (below 1: Zeppelin is faster).

    python3 bench/compare_latency.py --build build -N 2 4 -R 5

  send/recv:  sendrecv_perf / mpi_sendrecv_perf, 8 B to 256 KiB
  all-reduce: all_reduce_perf / mpi_all_reduce_perf, float32, 8 B to 64 KiB
  barrier:    barrier_perf / mpi_barrier_perf (zpBarrier / MPI_Barrier)

Standard library only. Exits non-zero if a run fails or reports wrong
elements.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import parse_table  # noqa: E402

OPS = [
    # name, Zeppelin's program, extra flags, largest size
    ("sendrecv", "sendrecv_perf", [], "256K"),
    ("allreduce", "all_reduce_perf", [], "64K"),
    ("barrier", "barrier_perf", [], "8"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("-N", "--nranks", type=int, nargs="+", default=[2, 4])
    ap.add_argument("-R", "--repeat", type=int, default=5)
    # As OSU's latency tests: 10,000 timed calls after 1,000 untimed ones (a
    # small message's run is then a few milliseconds, not a fraction of one).
    ap.add_argument("-n", "--iters", default="10000", help="timed calls per size (each program's -n)")
    ap.add_argument("-w", "--warmup", default="1000", help="untimed calls per size first (each program's -w)")
    ap.add_argument("--ops", nargs="+", default=[o[0] for o in OPS], choices=[o[0] for o in OPS])
    a = ap.parse_args()
    mpirun = shutil.which("mpirun")
    if not mpirun:
        print("compare_latency: mpirun not found (apt-get install openmpi-bin libopenmpi-dev)", file=sys.stderr)
        return 2
    bad = 0
    print(f"# time per call in microseconds, median of {a.repeat} interleaved runs; ratio = zeppelin / open_mpi")
    print(f"{'ranks':>5} {'op':>10} {'size(B)':>8} {'zeppelin':>9} {'open_mpi':>9} {'ratio':>6}")
    for n in a.nranks:
        mpi = [mpirun, "--oversubscribe", "--allow-run-as-root", "-np", str(n), "--mca", "pml", "ob1",
               "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo"]
        for name, prog, extra, largest in OPS:
            if name not in a.ops:
                continue
            sweep = ["-b", "8", "-e", largest, "-f", "8", "-n", a.iters, "-w", a.warmup] + extra
            zp_cmd = [os.path.join(a.build, "zprun"), "-n", str(n), os.path.join(a.build, "bench", prog)] + sweep
            mpi_cmd = mpi + [os.path.join(a.build, "bench", "mpi_" + prog)] + sweep
            zp_runs, mpi_runs = [], []
            for r in range(a.repeat):
                check = ["-c", "1" if r == a.repeat - 1 else "0"]
                for cmd, runs, who in ((zp_cmd, zp_runs, "Zeppelin"), (mpi_cmd, mpi_runs, "Open MPI")):
                    p = subprocess.run(cmd + check, capture_output=True, text=True)
                    t = parse_table(p.stdout)
                    if p.returncode != 0 or not t:
                        print(f"{name}: {who} failed (rc {p.returncode}):\n{p.stdout[-1500:]}{p.stderr[-1500:]}",
                              file=sys.stderr)
                        return 1
                    runs.append(t)
                    bad += sum(row["wrong"] or 0 for row in t.values())
            for size in sorted(zp_runs[0]):
                z = statistics.median(t[size]["time"] for t in zp_runs)
                m = statistics.median(t[size]["time"] for t in mpi_runs)
                print(f"{n:>5} {name:>10} {size:>8} {z:9.2f} {m:9.2f} {z / m:6.2f}", flush=True)
    if bad:
        print(f"compare_latency: {bad} wrong elements", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
