#!/usr/bin/env python3
"""compare_cluster.py: Zeppelin's alltoallv against Open MPI's on one emulated cluster shape.

Runs, one after another, each in an emulated cluster of its own with the same
shape (zprun --nodes: a network namespace per node, K rate-limited NICs each):
  1. zprun --nodes N ... alltoallv_perf ...                 Zeppelin
  2. zprun --nodes N ... --mpirun -- mpi_alltoallv_perf ... Open MPI's MPI_Alltoallv
                                                            (same source, same traffic)
R times over, interleaved, and prints one table of each size's median: bus
bandwidths, their ratio, and how much of the NICs' rate each one used (%nic).
Open MPI runs with zprun's settings: tcp BTL over every zpnic, shared memory
(vader) within a node, its runtime on zpnic0 (see zprun --help, --mpirun).
A peer that is missing or fails shows "n/a" with a note; nothing is
estimated. Exits non-zero if the Zeppelin run fails or reports wrong bytes.
Needs root (zprun builds the clusters).

    python3 bench/compare_cluster.py --build build --nodes 2 --ranks-per-node 4 \\
        --nics-per-node 4 --nic-rate 1gbit -b 1M -e 64M -f 4

Standard library only; the option sweep, the interleaved runs, the tables'
parsing and medians and the verdict are compare.py's.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402


def add_nic_column(text, rows):
    """Adds each row's %nic (the column after #wrong, when the cluster has a rate)."""
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 8 and not line.lstrip().startswith("#"):
            try:
                size = int(f[0])
                if size in rows:
                    rows[size]["nic"] = float(f[7])
            except ValueError:
                continue
    return rows


def run(name, cmd, timeout, show):
    """Runs one zprun; returns (returncode or None, stdout, stderr).

    zprun must never be SIGKILLed (its cluster would stay until zprun
    --cleanup), so the timeout is zprun's own --timeout, with SIGTERM as the
    backstop here, and on Ctrl-C (which the terminal also sends zprun) this
    waits for zprun to remove its cluster.
    """
    print(f"## {name}: {' '.join(cmd)}", flush=True)
    try:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except OSError as e:
        return None, "", str(e)
    try:
        out, err = p.communicate(timeout=timeout + 60)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate()
        return None, out, err + f"\ntimed out after {timeout} s"
    except KeyboardInterrupt:
        p.send_signal(signal.SIGINT)  # in case the terminal did not
        p.communicate()  # keeps reading, so zprun never blocks on a full pipe
        raise
    if show:
        sys.stdout.write(out)
    return p.returncode, out, err


def main(argv):
    ap = argparse.ArgumentParser(
        description="Zeppelin alltoallv vs Open MPI on the same emulated cluster (needs root)")
    ap.add_argument("--build", default="build", help="build directory (default build/)")
    ap.add_argument("--nodes", type=int, default=2, help="nodes (default 2)")
    ap.add_argument("--ranks-per-node", type=int, default=4, help="ranks per node (default 4)")
    ap.add_argument("--nics-per-node", type=int, default=4, help="NICs per node (default 4)")
    ap.add_argument("--nic-rate", default="1gbit",
                    help="rate of each NIC, tc syntax, or 'unlimited' (default 1gbit)")
    ap.add_argument("--mtu", default=None, help="MTU of the NICs (default zprun's)")
    compare.add_sweep_options(ap, "4")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per run (default 1800)")
    ap.add_argument("--no-mpi", action="store_true", help="skip the MPI runs")
    compare.add_output_options(ap)
    a = ap.parse_args(argv)
    for opt in ("nodes", "ranks_per_node", "nics_per_node", "repeat", "timeout"):
        if getattr(a, opt) < 1:
            ap.error(f"--{opt.replace('_', '-')} must be >= 1")

    build = os.path.abspath(a.build)
    zprun = os.path.join(build, "zprun")
    zp_prog = os.path.join(build, "bench", "alltoallv_perf")
    mpi_prog = os.path.join(build, "bench", "mpi_alltoallv_perf")
    if compare.missing_program("compare_cluster.py", a.build, (zprun, zp_prog)):
        return 2
    cluster = [zprun, "--nodes", str(a.nodes), "--ranks-per-node", str(a.ranks_per_node),
               "--nics-per-node", str(a.nics_per_node), "--timeout", str(a.timeout)]
    if a.nic_rate != "unlimited":
        cluster += ["--nic-rate", a.nic_rate]
    if a.mtu:
        cluster += ["--mtu", a.mtu]
    sweep = compare.sweep_args(a)
    notes = []

    mpi_cmd = None
    if a.no_mpi:
        notes.append("mpi: skipped (--no-mpi)")
    elif shutil.which("mpirun") is None:
        notes.append("mpi: n/a: mpirun not on PATH")
    elif not os.access(mpi_prog, os.X_OK):
        notes.append(f"mpi: n/a: {mpi_prog} not built (MPI not found by CMake)")
    else:
        mpi_cmd = cluster + ["--mpirun", "--", mpi_prog] + sweep
    zp_cmd = cluster + [zp_prog] + sweep

    def run_zprun(name, cmd):
        return run(name, cmd, a.timeout, a.show)

    def parse(out):
        return add_nic_column(out, compare.parse_table(out))

    zeppelin = compare.Program("zeppelin", zp_cmd, run_zprun, parse)
    mpi_peer = compare.Program(
        "mpi", mpi_cmd, run_zprun, parse,
        keep_note=lambda line: line.startswith("# mpi_alltoallv_perf:") or (
            line.startswith("# ") and "skipped" in line))
    zp_failed, zp_wrong = compare.run_rounds("compare_cluster.py", a.repeat, zeppelin, [mpi_peer],
                                             notes)
    zp, mpi = compare.median_table(zeppelin.runs), compare.median_table(mpi_peer.runs)

    fmt, ratio = compare.fmt, compare.ratio
    n = a.nodes * a.ranks_per_node
    print()
    print(f"# alltoallv on an emulated cluster: {a.nodes} nodes x {a.ranks_per_node} ranks "
          f"({n} ranks), {a.nics_per_node} NICs per node at {a.nic_rate}"
          f"{', MTU ' + a.mtu if a.mtu else ''}; pattern {a.P}, seed {a.s}, datatype {a.d}, "
          f"iters {a.n}, warmup {a.w}; each figure the median of {a.repeat} interleaved runs")
    print("# busbw = algbw*(n-1)/n, algbw = largest per-rank byte count / time (GB/s); "
          "zp/mpi = mpi time / zp time (the busbw ratio, unrounded);\n"
          "# %nic = the busiest rank's cross-node bytes/s over its share of its NIC's rate")
    hdr = ("size(B)", "zp_busbw", "mpi_busbw", "zp/mpi", "zp_%nic", "mpi_%nic", "zp_wrong", "mpi_wrong")
    print("%12s %9s %9s %7s %8s %8s %8s %9s" % hdr)

    def wrong(row):
        return "n/a" if row is None else ("N/A" if row["wrong"] is None else str(row["wrong"]))

    for size in sorted(zp):
        z, m = zp[size], mpi.get(size)
        mb = m["busbw"] if m else None
        print("%12d %9s %9s %7s %8s %8s %8s %9s" % (
            size, fmt(z["busbw"]), fmt(mb), fmt(ratio(m["time"] if m else None, z["time"]), ".2f"),
            fmt(z.get("nic"), ".1f"), fmt(m.get("nic") if m else None, ".1f"),
            wrong(z), wrong(m)))
    return compare.report(notes, zp_failed, zp_wrong)


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print("compare_cluster.py: interrupted", file=sys.stderr)
        sys.exit(130)
