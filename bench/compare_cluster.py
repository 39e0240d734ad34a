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

Standard library only; the table parsing is compare.py's.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare  # noqa: E402  (parse_table, median_table, fmt, ratio, tail)


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
    ap.add_argument("-b", default="1M", help="smallest size, bytes per rank (default 1M)")
    ap.add_argument("-e", default="64M", help="largest size (default 64M)")
    ap.add_argument("-f", default="4", help="step factor (default 4)")
    ap.add_argument("-P", default="uniform", help="uniform | random | zipf | matrix:FILE")
    ap.add_argument("-s", default="1", help="pattern seed (default 1)")
    ap.add_argument("-n", default="20", help="timed iterations (default 20)")
    ap.add_argument("-w", default="5", help="warmup iterations (default 5)")
    ap.add_argument("-d", default="float", help="datatype (default float)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per run (default 1800)")
    ap.add_argument("--no-mpi", action="store_true", help="skip the MPI runs")
    ap.add_argument("--show", action="store_true", help="also print each program's output")
    ap.add_argument("--repeat", "-R", type=int, default=3,
                    help="runs of each program, interleaved; the table shows each size's median (default 3)")
    a = ap.parse_args(argv)
    for opt in ("nodes", "ranks_per_node", "nics_per_node", "repeat", "timeout"):
        if getattr(a, opt) < 1:
            ap.error(f"--{opt.replace('_', '-')} must be >= 1")

    build = os.path.abspath(a.build)
    zprun = os.path.join(build, "zprun")
    zp_prog = os.path.join(build, "bench", "alltoallv_perf")
    mpi_prog = os.path.join(build, "bench", "mpi_alltoallv_perf")
    for path in (zprun, zp_prog):
        if not os.access(path, os.X_OK):
            print(f"compare_cluster.py: {path} not found: build first (cmake --build {a.build})",
                  file=sys.stderr)
            return 2
    cluster = [zprun, "--nodes", str(a.nodes), "--ranks-per-node", str(a.ranks_per_node),
               "--nics-per-node", str(a.nics_per_node), "--timeout", str(a.timeout)]
    if a.nic_rate != "unlimited":
        cluster += ["--nic-rate", a.nic_rate]
    if a.mtu:
        cluster += ["--mtu", a.mtu]
    sweep = ["-b", a.b, "-e", a.e, "-f", a.f, "-P", a.P, "-s", a.s, "-n", a.n, "-w", a.w,
             "-d", a.d, "-c", "1"]
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

    zp_runs, mpi_runs = [], []
    zp_failed, zp_wrong = False, 0
    for rep in range(a.repeat):
        rc, out, err = run(f"zeppelin (run {rep + 1})", zp_cmd, a.timeout, a.show)
        t = add_nic_column(out, compare.parse_table(out))
        if rc != 0 or not t:
            zp_failed = True
            print(f"compare_cluster.py: the Zeppelin run failed (rc {rc}):\n"
                  f"{compare.tail(out)}\n{compare.tail(err)}", file=sys.stderr)
            break
        zp_runs.append(t)
        zp_wrong += sum(r["wrong"] or 0 for r in t.values())
        if rep == 0:
            for line in out.splitlines():
                if line.startswith("# nranks"):
                    notes.append("zeppelin " + line[2:])
        if mpi_cmd:
            rc, out, err = run(f"mpi (run {rep + 1})", mpi_cmd, a.timeout, a.show)
            t = add_nic_column(out, compare.parse_table(out))
            if rc != 0 or not t:
                notes.append(f"mpi: failed (rc {rc}); its numbers are n/a\n"
                             f"{compare.tail(out + err)}")
                mpi_cmd, mpi_runs = None, []
            else:
                mpi_runs.append(t)
                if rep == 0:
                    for line in out.splitlines():
                        if line.startswith("# mpi_alltoallv_perf:") or (
                                line.startswith("# ") and "skipped" in line):
                            notes.append("mpi: " + line[2:])
    zp, mpi = compare.median_table(zp_runs), compare.median_table(mpi_runs)

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
    for note in notes:
        print("# " + note.replace("\n", "\n# "))
    if zp_failed:
        print("# zeppelin: FAILED (see above)")
        return 1
    if zp_wrong:
        print(f"# zeppelin: {zp_wrong} wrong bytes: FAILED")
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print("compare_cluster.py: interrupted", file=sys.stderr)
        sys.exit(130)
