#!/usr/bin/env python3
"""Writes a calibration file for zpplan (--calibration FILE) from the
project's own benchmarks on the machine at hand (docs/simulator.md):

  intra_latency_us, intra_gbytes_per_s   zprun -n 2 sendrecv_perf: the time of
                                         the smallest message, the best algbw
  tflops, attention_efficiency           micro_bench BM_AttnRefCausal: the
                                         reference kernel's FLOP/s by chunk
                                         length; tflops = the best, efficiency
                                         = each length's share of it
  nic_gbps, inter_latency_us,            with --cluster (root; an emulated
  route_efficiency, nics_per_node        cluster, under flock
                                         /tmp/zp-cluster.lock): route_perf's
                                         single pair with routing off (rate
                                         and small-message time) and its
                                         inter-node ring hop with routing
                                         balanced (%nics / 100)

Everything else (memory, linear efficiency, ranks per node) comes from the
--base preset. The file says what was measured and how in "source".

    python3 bench/calibrate.py --build build --out machine.json [--cluster] [--base a800]
"""
import argparse
import json
import os
import subprocess
import sys


def run(cmd):
    print("calibrate: " + " ".join(cmd), file=sys.stderr)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    if p.returncode != 0:
        sys.exit("calibrate: %s failed (exit %d):\n%s" % (cmd[0], p.returncode, p.stdout[-2000:]))
    return p.stdout


def rows(text):
    """Non-comment lines split into words."""
    return [l.split() for l in text.splitlines() if l.strip() and not l.startswith("#")]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build directory (default build)")
    ap.add_argument("--out", required=True, help="the calibration file to write")
    ap.add_argument("--base", default="a800", help="preset for what is not measured (default a800)")
    ap.add_argument("--cluster", action="store_true", help="also measure across nodes on an emulated cluster (root)")
    ap.add_argument("--nic-rate", default="1gbit", help="emulated NIC rate with --cluster (default 1gbit)")
    a = ap.parse_args()
    b = a.build
    for prog in ("zprun", "bench/sendrecv_perf", "bench/micro_bench"):
        if not os.access(os.path.join(b, prog), os.X_OK):
            sys.exit("calibrate: %s/%s is not built" % (b, prog))
    cal = {"base": a.base, "name": "measured"}
    notes = []

    out = run([b + "/zprun", "-n", "2", b + "/bench/sendrecv_perf", "-b", "8", "-e", "64M", "-f", "8", "-n", "10", "-w", "2"])
    r = [x for x in rows(out) if len(x) >= 6 and x[0].isdigit()]
    if not r:
        sys.exit("calibrate: no rows in sendrecv_perf's output:\n" + out)
    cal["intra_latency_us"] = float(r[0][3])
    cal["intra_gbytes_per_s"] = max(float(x[4]) for x in r)
    notes.append("intra: sendrecv_perf 2 ranks (%s B: %.1f us; best algbw %.2f GB/s)" %
                 (r[0][0], cal["intra_latency_us"], cal["intra_gbytes_per_s"]))

    # The median of 5 runs per length: a loaded or virtual machine's rate
    # wanders by tens of percent from one short run to the next.
    out = run([b + "/bench/micro_bench", "--benchmark_filter=BM_AttnRefCausal", "--benchmark_format=json",
               "--benchmark_min_time=0.05", "--benchmark_repetitions=5", "--benchmark_report_aggregates_only=true"])
    bench = json.loads(out[out.index("{"):])["benchmarks"]
    pts = [(int(x["run_name"].split("/")[1]), float(x["flops"])) for x in bench
           if "flops" in x and x.get("aggregate_name") == "median"]
    if not pts:
        sys.exit("calibrate: no BM_AttnRefCausal results")
    best = max(f for _, f in pts)
    cal["tflops"] = best / 1e12
    cal["attention_efficiency"] = [[n, round(f / best, 4)] for n, f in sorted(pts)]
    notes.append("attention: the reference CPU kernel (micro_bench BM_AttnRefCausal, median of 5), %.2f GFLOP/s at best" % (best / 1e9))

    if a.cluster:
        cmd = ["flock", "/tmp/zp-cluster.lock", b + "/zprun", "--nodes", "2", "--ranks-per-node", "2", "--nics-per-node",
               "2", "--nic-rate", a.nic_rate, b + "/bench/route_perf", "-b", "4K", "-e", "16M", "-f", "4096", "-p",
               "single,ring", "-m", "off,balanced", "-n", "3", "-c", "0"]
        out = run(cmd)
        t = {(x[0], int(x[1]), x[2]): x for x in rows(out) if len(x) >= 7 and x[1].isdigit()}
        try:
            small = t[("single", 4096, "off")]
            big = t[("single", 16 << 20, "off")]
            ring = t[("ring", 16 << 20, "balanced")]
        except KeyError as e:
            sys.exit("calibrate: route_perf printed no row %s:\n%s" % (e, out))
        cal["nics_per_node"] = 2
        cal["nic_gbps"] = float(big[4]) * 8
        cal["inter_latency_us"] = float(small[3])
        cal["route_efficiency"] = min(1.0, float(ring[5]) / 100)
        notes.append("inter: route_perf on zprun --nodes 2 --ranks-per-node 2 --nics-per-node 2 --nic-rate %s "
                     "(single pair off: %.3f GB/s, 4 KiB in %.0f us; ring hop balanced: %s%% of the NICs)" %
                     (a.nic_rate, float(big[4]), float(small[3]), ring[5]))
    cal["source"] = "bench/calibrate.py on %s: %s; the rest from preset %s" % (os.uname().nodename, "; ".join(notes), a.base)
    with open(a.out, "w") as f:
        json.dump(cal, f, indent=2)
        f.write("\n")
    print("calibrate: wrote %s" % a.out, file=sys.stderr)


if __name__ == "__main__":
    main()
