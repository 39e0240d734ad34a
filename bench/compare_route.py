#!/usr/bin/env python3
"""compare_route.py: the routing modes and Open MPI on one emulated cluster shape.

Runs R times over, interleaved, each run in a cluster of its own:
  1. zprun --nodes N ... route_perf ...                 Zeppelin, modes off, rail, balanced
  2. zprun --nodes N ... --mpirun -- mpi_route_perf ... Open MPI (tcp BTL on every zpnic)
and prints the median time of every (pattern, size, mode) with its speedup
over routing off and Zeppelin balanced's speedup over Open MPI. Both
programs move the same traffic and check every byte (-c 1). Needs root.

    python3 bench/compare_route.py --build build -b 64M -e 64M --repeat 3

Standard library only.
"""

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from compare_cluster import run  # noqa: E402


def parse(text):
    """{(pattern, size, mode): (time_us, pct_nics, wrong)} from a route_perf table."""
    rows = {}
    for line in text.splitlines():
        f = line.split()
        if len(f) < 8 or line.startswith("#") or f[0] == "pattern":
            continue
        try:
            rows[(f[0], int(f[1]), f[2])] = (float(f[3]), float(f[5]), int(f[7]))
        except ValueError:
            continue
    return rows


def main(argv):
    ap = argparse.ArgumentParser(description="route_perf: routing modes and Open MPI side by side (needs root)")
    ap.add_argument("--build", default="build")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--ranks-per-node", type=int, default=4)
    ap.add_argument("--nics-per-node", type=int, default=4)
    ap.add_argument("--nic-rate", default="1gbit")
    ap.add_argument("-b", default="64M")
    ap.add_argument("-e", default="64M")
    ap.add_argument("-n", default="3", help="timed calls per row")
    ap.add_argument("-p", default="single,ring,zipf,uniform")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-mpi", action="store_true")
    ap.add_argument("--timeout", type=int, default=1800)
    a = ap.parse_args(argv)
    build = os.path.abspath(a.build)
    cluster = [os.path.join(build, "zprun"), "--timeout", str(a.timeout), "--nodes", str(a.nodes),
               "--ranks-per-node", str(a.ranks_per_node), "--nics-per-node", str(a.nics_per_node),
               "--nic-rate", a.nic_rate]
    args = ["-b", a.b, "-e", a.e, "-n", a.n, "-w", "1", "-c", "1", "-p", a.p]
    runs = {}
    failed = False
    for i in range(a.repeat):
        jobs = [("zeppelin", cluster + [os.path.join(build, "bench", "route_perf")] + args)]
        if not a.no_mpi:
            jobs.append(("mpi", cluster + ["--mpirun", "--", os.path.join(build, "bench", "mpi_route_perf")] + args))
        for name, cmd in jobs:
            rc, out, err = run(f"{name} run {i + 1}/{a.repeat}", cmd, a.timeout, i == 0)
            if rc != 0:
                print(f"## {name} failed ({rc}):\n{err[-2000:]}", flush=True)
                failed = failed or name == "zeppelin"
                continue
            for key, val in parse(out).items():
                runs.setdefault(key, []).append(val)
    print(f"\n## medians of {a.repeat} runs; x_off: time(off) / time(mode); "
          "zp/mpi: time(mpi) / time(balanced)")
    print(f"{'pattern':8} {'size':>11} {'mode':9} {'time(us)':>11} {'%nics':>6} {'x_off':>6} {'zp/mpi':>7} {'#wrong':>6}")
    keys = sorted({(p, s) for (p, s, _) in runs}, key=lambda k: (a.p.split(",").index(k[0]), k[1]))
    for pattern, size in keys:
        med = {}
        for mode in ("off", "rail", "balanced", "mpi"):
            vals = runs.get((pattern, size, mode))
            if vals:
                med[mode] = (statistics.median(v[0] for v in vals), statistics.median(v[1] for v in vals),
                             sum(v[2] for v in vals))
        for mode, (t, pct, wrong) in med.items():
            xoff = f"{med['off'][0] / t:.2f}" if "off" in med else "-"
            zpmpi = f"{med['mpi'][0] / t:.2f}" if mode == "balanced" and "mpi" in med else ""
            print(f"{pattern:8} {size:11d} {mode:9} {t:11.0f} {pct:6.1f} {xoff:>6} {zpmpi:>7} {wrong:6d}")
            failed = failed or wrong != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
