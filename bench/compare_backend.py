#!/usr/bin/env python3
"""compare_backend.py: torch.distributed's own calls on the "zeppelin" backend against Gloo, in one run.

Runs bench/gloo_collectives.py (dist.all_reduce, dist.all_gather or
dist.broadcast on CPU float32 tensors, N processes on this machine) with
--backend gloo and --backend zeppelin, interleaved --repeat times, every
element checked in each run. Prints the median time per call
(microseconds) of each per size and the ratio zeppelin / gloo (below 1:
Zeppelin's backend is faster).

    python3 bench/compare_backend.py --build build -N 4 -o allreduce -b 1K -e 16M -f 4 -R 3

Standard library only (the workers need torch). Exits non-zero if a run
fails or reports wrong elements.
"""

import argparse
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare import parse_table  # noqa: E402

BACKENDS = ("gloo", "zeppelin")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("-N", "--nranks", type=int, default=4)
    ap.add_argument("-o", "--op", choices=["allreduce", "allgather", "broadcast"], default="allreduce")
    ap.add_argument("-b", default="1K")
    ap.add_argument("-e", default="16M")
    ap.add_argument("-f", default="4")
    ap.add_argument("-n", "--iters", default="20")
    ap.add_argument("-R", "--repeat", type=int, default=3)
    a = ap.parse_args()
    env = dict(os.environ)
    env["ZEPPELIN_LIBRARY"] = os.path.abspath(os.path.join(a.build, "libzeppelin.so"))
    env["PYTHONPATH"] = os.path.join(os.path.dirname(HERE), "python") + os.pathsep + env.get("PYTHONPATH", "")
    runs = {b: [] for b in BACKENDS}
    for r in range(a.repeat):
        for b in BACKENDS:
            cmd = [sys.executable, os.path.join(HERE, "gloo_collectives.py"), "--backend", b, "-o", a.op,
                   "-N", str(a.nranks), "-b", a.b, "-e", a.e, "-f", a.f, "-n", a.iters, "-c", "1"]
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
            rows = parse_table(p.stdout)
            if p.returncode != 0 or not rows or any(row["wrong"] for row in rows.values()):
                print("compare_backend: %s failed (exit %d):\n%s%s" % (" ".join(cmd), p.returncode, p.stdout,
                                                                       p.stderr), file=sys.stderr)
                return 1
            runs[b].append(rows)
    print("# %s, %d ranks, CPU float32: time per call in microseconds, median of %d interleaved runs; "
          "ratio = zeppelin / gloo" % (a.op, a.nranks, a.repeat))
    print("%11s %10s %10s %7s" % ("size(B)", "gloo", "zeppelin", "ratio"))
    for size in sorted(runs["gloo"][0]):
        t = {b: statistics.median(r[size]["time"] for r in runs[b]) for b in BACKENDS}
        print("%11d %10.1f %10.1f %7.2f" % (size, t["gloo"], t["zeppelin"], t["zeppelin"] / t["gloo"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
