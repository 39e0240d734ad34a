#!/usr/bin/env python3
"""compare.py: Zeppelin's alltoallv against its peers and the machine, in one run.

Runs, one after another on this machine:
  1. memcpy_limit -r N                      the copy bandwidth limit per rank
  2. zprun -n N alltoallv_perf ...          Zeppelin
  3. mpirun -np N mpi_alltoallv_perf ...    Open MPI's MPI_Alltoallv (same source, same traffic)
  4. gloo_alltoallv.py -N N ...             PyTorch's Gloo all_to_all_single (if torch imports)
and prints one table of bus bandwidths and ratios per size. A peer that is
missing or fails shows "n/a" with a note; nothing is estimated. Exits non-zero
if the Zeppelin run fails or reports wrong bytes.

    python3 bench/compare.py --build build --nranks 4 -b 1M -e 64M -f 2 -P random

Standard library only.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def parse_table(text):
    """Rows of an nccl-tests style table: {size: dict(time, algbw, busbw, wrong)}."""
    rows = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        f = line.split()
        if len(f) < 7:  # size count type time algbw busbw #wrong [%nic]
            continue
        try:
            size = int(f[0])
            rows[size] = {
                "time": float(f[3]), "algbw": float(f[4]), "busbw": float(f[5]),
                "wrong": None if f[6] == "N/A" else int(f[6]),
            }
        except ValueError:
            continue
    return rows


def run(name, cmd, env, timeout, log):
    """Runs cmd; returns (returncode or None on timeout / missing binary, stdout, stderr)."""
    print(f"## {name}: {' '.join(cmd)}", flush=True)
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return None, out, f"timed out after {timeout} s"
    except OSError as e:
        return None, "", str(e)
    if log:
        sys.stdout.write(p.stdout)
    return p.returncode, p.stdout, p.stderr


def tail(text, lines=8):
    return "\n".join("    " + l for l in text.strip().splitlines()[-lines:])


def find_torch_python():
    """A python that can import torch.distributed with Gloo, or None."""
    candidates = [sys.executable, shutil.which("python3"), "/usr/bin/python3"]
    seen = set()
    for py in candidates:
        if not py or py in seen or not os.path.exists(py):
            continue
        seen.add(py)
        r = subprocess.run([py, "-c", "import torch, numpy, torch.distributed as d;"
                            "import sys; sys.exit(0 if d.is_gloo_available() else 1)"],
                           capture_output=True, text=True)
        if r.returncode == 0:
            return py
    return None


def median_table(runs):
    """Per size, the run with the median time (the row is kept whole)."""
    out = {}
    for size in set().union(*runs) if runs else ():
        rows = sorted((r[size] for r in runs if size in r), key=lambda row: row["time"])
        row = dict(rows[len(rows) // 2])
        row["wrong"] = sum(r["wrong"] or 0 for r in rows) if any(r["wrong"] is not None for r in rows) else None
        out[size] = row
    return out


def fmt(x, spec="8.2f"):
    return format(x, spec) if x is not None else "n/a"


def ratio(a, b):
    return a / b if a is not None and b is not None and b > 0 else None


def add_sweep_options(ap, factor):
    """The sizes, pattern and iterations of the perf programs' sweep (-b ... -d)."""
    ap.add_argument("-b", default="1M", help="smallest size, bytes per rank (default 1M)")
    ap.add_argument("-e", default="64M", help="largest size (default 64M)")
    ap.add_argument("-f", default=factor, help=f"step factor (default {factor})")
    ap.add_argument("-P", default="uniform", help="uniform | random | zipf | matrix:FILE")
    ap.add_argument("-s", default="1", help="pattern seed (default 1)")
    ap.add_argument("-n", default="20", help="timed iterations (default 20)")
    ap.add_argument("-w", default="5", help="warmup iterations (default 5)")
    ap.add_argument("-d", default="float", help="datatype (default float)")


def add_output_options(ap):
    """--show, --repeat and --json."""
    ap.add_argument("--show", action="store_true", help="also print each program's output")
    ap.add_argument("--json", metavar="FILE", help="also write the table to FILE as JSON (for bench/plot.py)")
    ap.add_argument("--repeat", "-R", type=int, default=3,
                    help="runs of each program, interleaved; the table shows each size's median (default 3)")


def sweep_args(a):
    """The perf programs' arguments for the sweep of add_sweep_options."""
    return ["-b", a.b, "-e", a.e, "-f", a.f, "-P", a.P, "-s", a.s, "-n", a.n, "-w", a.w,
            "-d", a.d, "-c", "1"]


def missing_program(script, build_arg, paths):
    """Says which of paths is not built, if one is; True then."""
    for path in paths:
        if not os.access(path, os.X_OK):
            print(f"{script}: {path} not found: build first (cmake --build {build_arg})",
                  file=sys.stderr)
            return True
    return False


class Program:
    """One program of a comparison: its command (None: not run), how to run it
    (run(name, cmd) -> (returncode, stdout, stderr)) and read its table
    (parse(stdout) -> rows), which lines of its first run's output become notes
    (keep_note(line)), and the tables of its runs so far."""

    def __init__(self, name, cmd, run, parse=parse_table, keep_note=lambda line: False):
        self.name, self.cmd, self.run, self.parse, self.keep_note = name, cmd, run, parse, keep_note
        self.runs = []
        self.first_output = ""


def run_rounds(script, repeat, zp, peers, notes):
    """Zeppelin (required), then each peer, one after another, repeat times over:
    interleaving spreads the machine's slow moments over all of them.

    A failing Zeppelin run is reported on stderr and ends the rounds; a failing
    peer gets a note and is dropped (no runs, no command). Returns
    (Zeppelin failed, Zeppelin's wrong bytes).
    """
    zp_wrong = 0
    for rep in range(repeat):
        rc, out, err = zp.run(f"{zp.name} (run {rep + 1})", zp.cmd)
        t = zp.parse(out)
        if rc != 0 or not t:
            print(f"{script}: the Zeppelin run failed (rc {rc}):\n{tail(out)}\n{tail(err)}",
                  file=sys.stderr)
            return True, zp_wrong
        zp.runs.append(t)
        zp_wrong += sum(r["wrong"] or 0 for r in t.values())
        if rep == 0:
            zp.first_output = out
            for line in out.splitlines():
                if line.startswith("# nranks"):
                    notes.append("zeppelin " + line[2:])
        for p in peers:
            if not p.cmd:
                continue
            rc, out, err = p.run(f"{p.name} (run {rep + 1})", p.cmd)
            t = p.parse(out)
            if rc != 0 or not t:
                notes.append(f"{p.name}: failed (rc {rc}); its numbers are n/a\n{tail(out + err)}")
                p.cmd, p.runs = None, []
            else:
                p.runs.append(t)
                if rep == 0:
                    for line in out.splitlines():
                        if p.keep_note(line):
                            notes.append(f"{p.name}: " + line[2:])
    return False, zp_wrong


def write_json(path, meta, rows):
    """The side by side table as JSON for bench/plot.py: meta (nranks, limit_per_rank_GBps,
    ...) and rows, one per (op, size), each peer's {time, algbw, busbw} or null."""
    with open(path, "w") as f:
        json.dump(dict(meta, rows=rows), f, indent=1)
    print(f"# wrote {path}")


def report(notes, zp_failed, zp_wrong):
    """Prints the notes and the verdict under the table; the exit code."""
    for n in notes:
        print("# " + n.replace("\n", "\n# "))
    if zp_failed:
        print("# zeppelin: FAILED (see above)")
        return 1
    if zp_wrong:
        print(f"# zeppelin: {zp_wrong} wrong bytes: FAILED")
        return 1
    return 0


def main(argv):
    ap = argparse.ArgumentParser(description="Zeppelin alltoallv vs MPI, Gloo and memcpy")
    ap.add_argument("--nranks", "-N", type=int, default=4)
    add_sweep_options(ap, "2")
    ap.add_argument("--build", default="build", help="build directory (default build/)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per program")
    ap.add_argument("--no-gloo", action="store_true", help="skip the Gloo run")
    ap.add_argument("--no-mpi", action="store_true", help="skip the MPI run")
    add_output_options(ap)
    a = ap.parse_args(argv)
    if a.nranks < 1:
        ap.error("--nranks must be >= 1")
    if a.repeat < 1:
        ap.error("--repeat must be >= 1")

    build = os.path.abspath(a.build)
    bench = os.path.join(build, "bench")
    zprun = os.path.join(build, "zprun")
    zp_prog = os.path.join(bench, "alltoallv_perf")
    if missing_program("compare.py", a.build, (zprun, zp_prog)):
        return 2
    sweep = sweep_args(a)
    env = dict(os.environ)
    notes = []
    N = a.nranks

    # 1. The machine's limit.
    limit = None
    mc = os.path.join(bench, "memcpy_limit")
    rc, out, err = run("memcpy_limit", [mc, "-r", str(N)], env, a.timeout, a.show)
    if rc == 0:
        for line in out.splitlines():
            if line.startswith("copy_limit_per_rank_GBps="):
                limit = float(line.split("=", 1)[1])
            if line.startswith("copy_limit_GBps="):
                notes.append(f"memcpy_limit: {line.split('=', 1)[1]} GB/s aggregate over all cores")
    else:
        notes.append(f"memcpy_limit failed (rc {rc}): limit n/a\n{tail(err)}")

    # 2-4. Zeppelin (required), Open MPI and Gloo, one after another, R times
    # over: interleaving spreads the machine's slow moments over all of them.
    mpi_prog = os.path.join(bench, "mpi_alltoallv_perf")
    mpirun = shutil.which("mpirun")
    mpi_cmd = None
    if a.no_mpi:
        notes.append("mpi: skipped (--no-mpi)")
    elif not os.access(mpi_prog, os.X_OK) or mpirun is None:
        notes.append("mpi: n/a: " + ("mpirun not on PATH" if mpirun is None else
                                      f"{mpi_prog} not built (MPI not found by CMake)"))
    else:
        # Shared memory (vader) only, and the runtime's own sockets on loopback.
        mpi_cmd = [mpirun, "--oversubscribe", "--allow-run-as-root", "-np", str(N),
                   "--mca", "pml", "ob1", "--mca", "btl", "self,vader",
                   "--mca", "oob_tcp_if_include", "lo", mpi_prog] + sweep
    menv = dict(env, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    gloo_cmd = None
    if a.no_gloo:
        notes.append("gloo: skipped (--no-gloo)")
    else:
        py = find_torch_python()
        if py is None:
            notes.append("gloo: n/a: no python3 here imports torch + numpy with Gloo")
        else:
            gloo_cmd = [py, os.path.join(HERE, "gloo_alltoallv.py"), "-N", str(N)] + sweep

    def runner(run_env):
        return lambda name, cmd: run(name, cmd, run_env, a.timeout, a.show)

    zeppelin = Program("zeppelin", [zprun, "-n", str(N), zp_prog] + sweep, runner(env))
    mpi_peer = Program("mpi", mpi_cmd, runner(menv),
                       keep_note=lambda line: line.startswith("# ") and "skipped" in line)
    gloo_peer = Program("gloo", gloo_cmd, runner(env))
    zp_failed, zp_wrong = run_rounds("compare.py", a.repeat, zeppelin, [mpi_peer, gloo_peer], notes)
    zp, mpi, gloo = (median_table(p.runs) for p in (zeppelin, mpi_peer, gloo_peer))
    zp_table = zeppelin.first_output
    if zp_table:
        print()
        print("# Zeppelin's own table, first run:")
        sys.stdout.write(zp_table)

    # The side by side table.
    print()
    print(f"# alltoallv, {N} ranks, pattern {a.P}, seed {a.s}, datatype {a.d}, "
          f"iters {a.n}, warmup {a.w}; each figure the median of {a.repeat} interleaved runs")
    print("# busbw = algbw*(n-1)/n, algbw = largest per-rank byte count / time (GB/s);"
          " limit = aggregate memcpy bandwidth / nranks")
    hdr = ("size(B)", "zp_busbw", "mpi_busbw", "zp/mpi", "gloo_busbw", "zp/gloo",
           "zp_algbw", "limit/rk", "algbw/lim", "zp_wrong")
    print("%12s %9s %9s %7s %10s %7s %9s %9s %9s %8s" % hdr)
    json_rows = []
    for size in sorted(zp):
        z = zp[size]
        m = mpi.get(size)
        g = gloo.get(size)
        json_rows.append({"op": "alltoallv", "size": size, "zeppelin": z, "mpi": m, "gloo": g})
        mb = m["busbw"] if m else None
        gb = g["busbw"] if g else None
        print("%12d %9s %9s %7s %10s %7s %9s %9s %9s %8s" % (
            size, fmt(z["busbw"]), fmt(mb), fmt(ratio(z["busbw"], mb), ".2f"),
            fmt(gb), fmt(ratio(z["busbw"], gb), ".2f"), fmt(z["algbw"]), fmt(limit),
            fmt(ratio(z["algbw"], limit), ".2f"),
            "N/A" if z["wrong"] is None else str(z["wrong"])))
    if a.json:
        write_json(a.json, {"bench": "compare.py", "nranks": N, "pattern": a.P, "datatype": a.d,
                            "repeat": a.repeat, "limit_per_rank_GBps": limit}, json_rows)
    return report(notes, zp_failed, zp_wrong)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
