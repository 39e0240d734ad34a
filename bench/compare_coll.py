#!/usr/bin/env python3
"""compare_coll.py: Zeppelin's standard collectives against Open MPI and Gloo, in one run.

For each of all-reduce, all-gather, reduce-scatter and broadcast, runs one after
another on this machine, --repeat times in turn:
  zprun -n N bench/<coll>_perf ...           Zeppelin
  mpirun -np N bench/mpi_<coll>_perf ...     Open MPI (MPI_Allreduce, MPI_Allgather,
                                             MPI_Reduce_scatter_block, MPI_Bcast; same source)
  gloo_coll.py -C <coll> -N N ...            PyTorch's Gloo (no reduce_scatter there)
and prints, per collective and size, each one's busbw (the median-time run of the
repeats) and Zeppelin's ratios. float32, op sum, -c 1: every row is checked.

    python3 bench/compare_coll.py --build build --nranks 4 -b 1M -e 64M -f 2 --repeat 3

Standard library only (the Gloo peer needs python3-torch: .ci/setup --bench).
"""

import argparse
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare import parse_table, run, tail, find_torch_python, median_table, fmt, ratio  # noqa: E402

COLLS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--build", default="build")
    ap.add_argument("--nranks", type=int, default=4)
    ap.add_argument("-b", default="1M")
    ap.add_argument("-e", default="64M")
    ap.add_argument("-f", default="2")
    ap.add_argument("-n", default="10")
    ap.add_argument("-w", default="3")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--colls", default=",".join(COLLS))
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--log", action="store_true", help="print every run's table")
    a = ap.parse_args(argv)
    n = str(a.nranks)
    sweep = ["-b", a.b, "-e", a.e, "-f", a.f, "-n", a.n, "-w", a.w, "-c", "1"]
    zprun = os.path.join(a.build, "zprun")
    mpirun = shutil.which("mpirun")
    torch_py = find_torch_python()
    env = dict(os.environ)
    failed = False
    for coll in a.colls.split(","):
        progs = {
            "zeppelin": [zprun, "-n", n, os.path.join(a.build, "bench", coll + "_perf")] + sweep,
            "mpi": ([mpirun, "--oversubscribe", "--allow-run-as-root", "--bind-to", "none", "-np", n,
                     os.path.join(a.build, "bench", "mpi_" + coll + "_perf")] + sweep) if mpirun else None,
            "gloo": ([torch_py, os.path.join(HERE, "gloo_coll.py"), "-C", coll, "-N", n] + sweep)
            if torch_py and coll != "reduce_scatter" else None,
        }
        notes = []
        if not mpirun:
            notes.append("mpi: n/a: mpirun not on PATH")
        if coll == "reduce_scatter":
            notes.append("gloo: n/a: PyTorch's Gloo backend has no reduce_scatter")
        elif not torch_py:
            notes.append("gloo: n/a: no python with torch.distributed and Gloo")
        tables = {k: [] for k in progs}
        for _ in range(a.repeat):
            for name, cmd in progs.items():
                if cmd is None:
                    continue
                rc, out, err = run(f"{coll} {name}", cmd, env, a.timeout, a.log)
                if rc != 0:
                    notes.append(f"{name}: run failed ({rc}): {tail(err, 3)}")
                    if name == "zeppelin":
                        failed = True
                    continue
                tables[name].append(parse_table(out))
        med = {k: median_table(v) if v else {} for k, v in tables.items()}
        print(f"\n# {coll}, {n} ranks, float32 sum, busbw in GB/s (median-time run of {a.repeat})")
        print(f"#{'size':>11s}{'zeppelin':>10s}{'mpi':>8s}{'gloo':>8s}{'zp/mpi':>8s}{'zp/gloo':>8s}{'#wrong':>8s}")
        for size in sorted(med["zeppelin"]):
            z = med["zeppelin"][size]
            m = med["mpi"].get(size)
            g = med["gloo"].get(size)
            zb, mb, gb = z["busbw"], m["busbw"] if m else None, g["busbw"] if g else None
            wrong = sum((t.get(size) or {}).get("wrong") or 0 for t in med.values())
            failed |= wrong != 0
            cols = [fmt(zb, "10.2f")] + [f"{fmt(x):>8s}" for x in (mb, gb, ratio(zb, mb), ratio(zb, gb))]
            print(f" {size:11d}" + "".join(cols) + f"{wrong:8d}")
        for note in notes:
            print("# " + note)
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
