#!/usr/bin/env python3
"""Two builds' instructions per send/recv, function by function.

A sub-microsecond call moves by a few percent with where the linker puts
its functions and with the machine's phase (layout_ab.py measures time
over layouts); the instructions a call runs do not. This runs `zprun -n 2
sendrecv_perf` under `valgrind --tool=callgrind` with each build's
library and zprun (the same --bench program for both), reads each rank's
profile with callgrind_annotate, and prints per function the instructions
per call of each build (self cost, inlined code counted where it lands),
the largest differences first, with the whole run's total per call.

A poll's count is how long it polled, which depends on timing: functions
that wait (moveNow's poll, the executor's wait, inboundReady) differ from
run to run; every other count is exact. Start-up is divided over the
calls too: use enough calls (--iters) that it is small.

  python3 bench/instr_ab.py --build build --build /path/to/other/build --size 8
"""
import argparse
import collections
import glob
import os
import re
import subprocess
import tempfile


def profile(build, bench, size, iters, out_dir):
    """Per-function self instructions (summed over both ranks' profiles)."""
    prefix = os.path.join(out_dir, "cg")
    cmd = [os.path.join(build, "zprun"), "-n", "2", "valgrind", "--tool=callgrind",
           f"--callgrind-out-file={prefix}.%p", os.path.abspath(bench), "-b", str(size), "-e", str(size),
           "-n", str(iters), "-w", str(max(1, iters // 100)), "-c", "1"]
    env = dict(os.environ, LD_LIBRARY_PATH=os.path.abspath(build))
    run = subprocess.run(cmd, env=env, capture_output=True, text=True)
    files = glob.glob(prefix + ".*")
    if run.returncode != 0 or len(files) != 2:
        raise SystemExit(f"{build}: the profiled run failed ({run.returncode}):\n{run.stderr[-2000:]}")
    counts, total = collections.Counter(), 0
    for f in files:
        out = subprocess.run(["callgrind_annotate", "--auto=no", "--threshold=100", f], capture_output=True, text=True,
                             check=True).stdout
        for line in out.splitlines():
            m = re.match(r"\s*([\d,]+) \([^)]*\)\s+(.*)$", line)
            if not m or "=>" in line:
                continue
            n = int(m.group(1).replace(",", ""))
            if "PROGRAM TOTALS" in line:
                total += n
                continue
            # file:function [object]: the function without its parameters.
            fn = re.sub(r"\s\[[^\]]*\]$", "", m.group(2)).split(":", 1)[-1]
            counts[re.sub(r"\(.*", "", fn)] += n
    return counts, total


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", action="append", required=True, help="a build directory (twice: the two builds)")
    ap.add_argument("--bench", default="build/bench/sendrecv_perf", help="the benchmark program both runs use")
    ap.add_argument("--size", default="8", help="message size (sendrecv_perf's -b and -e)")
    ap.add_argument("--iters", type=int, default=20000, help="timed calls")
    ap.add_argument("--top", type=int, default=25, help="functions to print")
    args = ap.parse_args()
    if len(args.build) != 2:
        raise SystemExit("give --build twice")
    calls = 2 * (args.iters + max(1, args.iters // 100))  # both ranks, timed and untimed
    results = []
    with tempfile.TemporaryDirectory(prefix="zp-instr-") as tmp:
        for i, b in enumerate(args.build):
            d = os.path.join(tmp, str(i))
            os.makedirs(d)
            results.append(profile(b, args.bench, args.size, args.iters, d))
    (a, ta), (b, tb) = results
    for i, path in enumerate(args.build):
        print(f"build{i + 1}: {path}")
    print(f"{args.size} B, instructions per call and rank (self cost; a poll's count depends on timing)")
    print(f"  {'all':60s} {ta / calls:9.1f} {tb / calls:9.1f} {(tb - ta) / calls:+9.1f}")
    for fn in sorted(set(a) | set(b), key=lambda f: -abs(b[f] - a[f]))[:args.top]:
        print(f"  {fn[:60]:60s} {a[fn] / calls:9.1f} {b[fn] / calls:9.1f} {(b[fn] - a[fn]) / calls:+9.1f}")


if __name__ == "__main__":
    main()
