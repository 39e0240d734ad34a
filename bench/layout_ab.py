#!/usr/bin/env python3
"""Two builds' small-message latency, each over several code layouts.

The same code linked in another order places its functions elsewhere, and
on this kind of machine that alone moves a sub-microsecond send/recv by a
few percent. So a build-to-build comparison of a few percent means little
unless it holds across layouts. This relinks each build's libzeppelin.so
with its object files in `--layouts` orders (the build's own first; the
objects of build/CMakeFiles/zeppelin.dir/link.txt, shuffled by a seed),
then runs `zprun -n RANKS sendrecv_perf` (this checkout's --bench build's
program, each build's own zprun) with each library in alternated, shuffled
rounds, and prints per layout the 10th percentile and the median of the
rounds at each size.

Relinking whole objects leaves each object's functions where the compiler
put them, and code that only moves inside an object moves the figure as
much. With --shuffle-functions the builds must have been compiled with
-ffunction-sections (CMAKE_CXX_FLAGS); each layout is then linked by lld
with every function's section placed by the layout's seed
(--shuffle-sections), so the layouts sample where each function lands.

  python3 bench/layout_ab.py --build build --build /path/to/other/build
"""
import argparse
import os
import random
import re
import shlex
import statistics
import subprocess
import tempfile


def relink(build, seed, out_dir, shuffle_functions):
    """libzeppelin.so.0 of `build` with its objects in the order of `seed`
    (0: as built), or with its functions in that order."""
    link_txt = os.path.join(build, "CMakeFiles/zeppelin.dir/link.txt")
    cmd = shlex.split(open(link_txt).read().splitlines()[0])
    objs = [a for a in cmd if a.endswith(".o")]
    rest = [a for a in cmd if not a.endswith(".o")]
    if shuffle_functions:
        if not any(".text." in l for l in subprocess.run(["objdump", "-h", os.path.join(build, objs[0])],
                                                          capture_output=True, text=True).stdout.splitlines()):
            raise SystemExit(f"{build}: not compiled with -ffunction-sections")
        rest[1:1] = ["-fuse-ld=lld", f"-Wl,--shuffle-sections=.text.*={seed + 1}"]
    elif seed:
        random.Random(seed).shuffle(objs)
    at = rest.index("-o")
    os.makedirs(out_dir, exist_ok=True)
    rest[at + 1] = os.path.join(out_dir, "libzeppelin.so.0")
    subprocess.run(rest[:at + 2] + objs + rest[at + 2:], cwd=build, check=True)
    return out_dir


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="append", required=True, help="a build directory (twice: the two builds)")
    ap.add_argument("--bench", default="build/bench/sendrecv_perf", help="the benchmark program every run uses")
    ap.add_argument("--layouts", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--sizes", default="4K,32K", help="sendrecv_perf's -b and -e")
    ap.add_argument("--factor", type=int, default=8, help="sendrecv_perf's -f (sizes from -b to -e by this factor)")
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--shuffle-functions", action="store_true",
                    help="place every function by the layout's seed (builds compiled with -ffunction-sections)")
    args = ap.parse_args()
    lo, hi = args.sizes.split(",")
    tmp = tempfile.mkdtemp(prefix="zp-layouts-")
    variants = []  # (name, library dir, zprun)
    for b, build in enumerate(args.build):
        build = os.path.abspath(build)
        for seed in range(args.layouts):
            lib = relink(build, seed, os.path.join(tmp, f"b{b}-{seed}"), args.shuffle_functions)
            variants.append((f"build{b + 1} layout {seed}", lib, os.path.join(build, "zprun")))
    times = {v[0]: {} for v in variants}
    for r in range(args.rounds):
        order = variants[:]
        random.Random(r).shuffle(order)
        for name, lib, zprun in order:
            cmd = [zprun, "-n", str(args.ranks), os.path.abspath(args.bench), "-b", lo, "-e", hi, "-f", str(args.factor),
                   "-n", str(args.iters), "-w", str(args.iters // 10), "-c", "0"]
            env = dict(os.environ, LD_LIBRARY_PATH=lib)
            out = subprocess.run(cmd, env=env, capture_output=True, text=True).stdout
            for line in out.splitlines():
                m = re.match(r"\s+(\d+)\s+\d+\s+\w+\s+([\d.]+)", line)
                if m:
                    times[name].setdefault(int(m.group(1)), []).append(float(m.group(2)))
    for i, b in enumerate(args.build):
        print(f"build{i + 1}: {b}")
    for size in sorted({s for t in times.values() for s in t}):
        print(f"{size} B, us per call: p10 / median of {args.rounds} rounds")
        for name, *_ in variants:
            v = sorted(times[name].get(size, []))
            if v:
                print(f"  {name:18s} {v[len(v) // 10]:.3f} / {statistics.median(v):.3f}")


if __name__ == "__main__":
    main()
