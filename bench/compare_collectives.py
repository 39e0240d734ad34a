#!/usr/bin/env python3
"""compare_collectives.py: Zeppelin's standard collectives against Open MPI's, in one run.

For each of all_reduce_perf, all_gather_perf, reduce_scatter_perf and
broadcast_perf: zprun -n N <prog> and mpirun -np N mpi_<prog> (the same
source, the same sizes, every element checked), interleaved --repeat times;
and PyTorch's Gloo (bench/gloo_collectives.py, float32; it has no
reduce_scatter), prints one table of median busbw per size and the ratios.
Exits non-zero if a Zeppelin run fails or reports wrong elements.

    python3 bench/compare_collectives.py --build build -N 4 -b 1M -e 64M -f 2

Standard library only.
"""

import argparse
import os
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import find_torch_python, parse_table, write_json  # noqa: E402

PROGS = ["all_reduce_perf", "all_gather_perf", "reduce_scatter_perf", "broadcast_perf"]
GLOO_OPS = {"all_reduce_perf": "allreduce", "all_gather_perf": "allgather", "broadcast_perf": "broadcast"}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("-N", "--nranks", type=int, default=4)
    ap.add_argument("-b", default="1M")
    ap.add_argument("-e", default="64M")
    ap.add_argument("-f", default="2")
    ap.add_argument("-R", "--repeat", type=int, default=3)
    ap.add_argument("--json", metavar="FILE", help="also write the table (and memcpy_limit's limit) to FILE as JSON")
    a = ap.parse_args()
    sweep = ["-b", a.b, "-e", a.e, "-f", a.f, "-c", "1"]
    mpirun = shutil.which("mpirun")
    mpi = [mpirun, "--oversubscribe", "--allow-run-as-root", "-np", str(a.nranks), "--mca", "pml", "ob1",
           "--mca", "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo"]
    torch_py = find_torch_python()
    here = os.path.dirname(os.path.abspath(__file__))
    bad = 0
    limit = None  # the machine's copy limit per rank, for the figures of bench/plot.py
    if a.json:
        p = subprocess.run([os.path.join(a.build, "bench", "memcpy_limit"), "-r", str(a.nranks)],
                           capture_output=True, text=True)
        for line in p.stdout.splitlines():
            if line.startswith("copy_limit_per_rank_GBps="):
                limit = float(line.split("=", 1)[1])
        print(f"# memcpy_limit -r {a.nranks}: {limit} GB/s per rank")
    json_rows = []
    print(f"# {a.nranks} ranks, busbw in GB/s (nccl-tests' formulas), median of {a.repeat} interleaved runs")
    print(f"{'collective':>20} {'size(B)':>11} {'zeppelin':>9} {'open_mpi':>9} {'zp/mpi':>7} {'gloo':>9} {'zp/gloo':>8}"
          f" {'zp_wrong':>9}")
    for prog in PROGS:
        zp_runs, mpi_runs, gloo_runs = [], [], []
        for _ in range(a.repeat):
            cmd = [os.path.join(a.build, "zprun"), "-n", str(a.nranks), os.path.join(a.build, "bench", prog)] + sweep
            p = subprocess.run(cmd, capture_output=True, text=True)
            t = parse_table(p.stdout)
            if p.returncode != 0 or not t:
                print(f"{prog}: Zeppelin failed (rc {p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}",
                      file=sys.stderr)
                return 1
            zp_runs.append(t)
            if mpirun:
                p = subprocess.run(mpi + [os.path.join(a.build, "bench", "mpi_" + prog)] + sweep,
                                   capture_output=True, text=True)
                t = parse_table(p.stdout)
                if p.returncode == 0 and t:
                    mpi_runs.append(t)
            if torch_py and prog in GLOO_OPS:
                p = subprocess.run([torch_py, os.path.join(here, "gloo_collectives.py"), "-o", GLOO_OPS[prog], "-N",
                                    str(a.nranks), "-b", a.b, "-e", a.e, "-f", a.f], capture_output=True, text=True)
                t = parse_table(p.stdout)
                if p.returncode == 0 and t:
                    gloo_runs.append(t)
        for size in sorted(zp_runs[0]):
            z = statistics.median(r[size]["busbw"] for r in zp_runs)
            wrong = sum(r[size]["wrong"] or 0 for r in zp_runs)
            bad += wrong
            mv = [r[size]["busbw"] for r in mpi_runs if size in r]
            m = statistics.median(mv) if mv else None
            gv = [r[size]["busbw"] for r in gloo_runs if size in r]
            g = statistics.median(gv) if gv else None
            ratio = f"{z / m:7.2f}" if m else "    n/a"
            ms = f"{m:9.2f}" if m else "      n/a"
            gs = f"{g:9.2f}" if g else "      n/a"
            gratio = f"{z / g:8.2f}" if g else "     n/a"
            print(f"{prog:>20} {size:>11} {z:9.2f} {ms} {ratio} {gs} {gratio} {wrong:>9}")
            json_rows.append({"op": prog.replace("_perf", ""), "size": size, "zeppelin": {"busbw": z},
                              "mpi": {"busbw": m} if m else None, "gloo": {"busbw": g} if g else None})
    if a.json:
        write_json(a.json, {"bench": "compare_collectives.py", "nranks": a.nranks, "repeat": a.repeat,
                            "limit_per_rank_GBps": limit}, json_rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
