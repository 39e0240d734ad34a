#!/usr/bin/env python3
"""coll_threshold.py: where the standard collectives' rings start to beat the latency algorithms.

Runs each of all_reduce_perf, all_gather_perf, reduce_scatter_perf and
broadcast_perf under zprun twice per repeat, interleaved, with
ZP_COLL_ALGO=tree (the latency algorithms: recursive doubling, binomial
trees, direct exchange) and the bandwidth family (--bandwidth: direct, what
one node uses, or ring, what several nodes use), every element checked;
prints the median time of each per size, and per collective the smallest
size from which the bandwidth family is at least as fast at that size and
every larger one. (On one node all-gather and reduce-scatter are direct
exchange in both families.) Extra zprun options (an emulated cluster) go
after --. The threshold
(ZP_COLL_RING_ABOVE) is in bytes per rank, as the library compares it: the
all-reduce's buffer, and the others' size / nranks.

    python3 bench/coll_threshold.py --build build -N 4 -b 4K -e 4M -f 2
    python3 bench/coll_threshold.py --build build --bandwidth ring -- --nodes 2 --ranks-per-node 4 --nics-per-node 4 --nic-rate 1gbit

Standard library only.
"""

import argparse
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare import parse_table  # noqa: E402
from compare_collectives import PROGS  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("-N", "--nranks", type=int, default=4)
    ap.add_argument("-b", default="4K")
    ap.add_argument("-e", default="4M")
    ap.add_argument("-f", default="2")
    ap.add_argument("-R", "--repeat", type=int, default=3)
    ap.add_argument("--bandwidth", choices=["direct", "ring"], default="direct")
    ap.add_argument("zprun_args", nargs="*", help="more zprun options, after --")
    a = ap.parse_args()
    launch = a.zprun_args if a.zprun_args else ["-n", str(a.nranks)]
    sweep = ["-b", a.b, "-e", a.e, "-f", a.f, "-c", "1"]
    print(f"# {a.nranks} ranks, median time per call in us of {a.repeat} interleaved runs")
    print(f"{'collective':>20} {'size(B)':>10} {'per rank':>10} {a.bandwidth:>9} {'tree':>9} {'tree/' + a.bandwidth:>12}")
    for prog in PROGS:
        runs = {a.bandwidth: [], "tree": []}
        for _ in range(a.repeat):
            for algo in runs:
                env = dict(os.environ, ZP_COLL_ALGO=algo)
                cmd = [os.path.join(a.build, "zprun")] + launch + [os.path.join(a.build, "bench", prog)] + sweep
                p = subprocess.run(cmd, capture_output=True, text=True, env=env)
                t = parse_table(p.stdout)
                if p.returncode != 0 or not t or any(r["wrong"] for r in t.values()):
                    print(f"{prog} ({algo}) failed (rc {p.returncode}):\n{p.stdout[-2000:]}{p.stderr[-2000:]}",
                          file=sys.stderr)
                    return 1
                runs[algo].append(t)
        sizes = sorted(runs[a.bandwidth][0])
        ring_wins = []
        for size in sizes:
            r = statistics.median(t[size]["time"] for t in runs[a.bandwidth])
            tr = statistics.median(t[size]["time"] for t in runs["tree"])
            per_rank = size if prog == "all_reduce_perf" else size // a.nranks
            ring_wins.append((per_rank, r <= tr))
            print(f"{prog:>20} {size:>10} {per_rank:>10} {r:9.1f} {tr:9.1f} {tr / r:12.2f}")
        threshold = None
        for per_rank, wins in reversed(ring_wins):
            if not wins:
                break
            threshold = per_rank
        print(f"# {prog}: {a.bandwidth} at least as fast from {threshold} bytes per rank on" if threshold
              else f"# {prog}: the latency algorithm is faster at the largest size")
    return 0


if __name__ == "__main__":
    sys.exit(main())
