#!/usr/bin/env python3
"""busy_latency.py: send/recv latency (or all-reduce time) with and without a busy CPU, Zeppelin beside Open MPI and Gloo.

Two ranks on this machine exchange --bytes bytes (a ring shift: each sends
to the other and receives from it) with Zeppelin (sendrecv_perf under
zprun), Open MPI (mpi_sendrecv_perf under mpirun, shared memory) and
PyTorch's Gloo (dist.isend + dist.irecv over 127.0.0.1); with --op
allreduce, --ranks ranks all-reduce --bytes bytes instead (all_reduce_perf,
mpi_all_reduce_perf, and bench/gloo_collectives.py for Gloo), every element
checked. Each round runs
every library once without and once with --load busy processes per core
(`sh -c 'while :; do :; done'`, started 0.5 s before the library's run and
killed after it), the libraries' order rotating each round, so that every
ratio compares runs made minutes apart at most. Prints each library's median
time per call quiet and loaded, the loaded / quiet ratio, and for each run
the worst rank's time per call on a core and waiting for one
(/proc/thread-self/schedstat of the calling thread over the timed calls):
when the waiting dominates, the latency is the scheduler's, whatever the
library does.

    python3 bench/busy_latency.py --build build --load 2 --rounds 5
    python3 bench/busy_latency.py --build build --op allreduce --ranks 4 --bytes 64M --iters 5 --warmup 1 --rounds 3

With --libs floor-spin, floor-futex or floor-hybrid (--op sendrecv, 8 B on
2 ranks only), the same exchange with no library (bench/sched_floor.cc:
polling, sleeping on a futex, or 50 µs of polling then sleeping): what the
scheduler alone allows, a floor for any library's loaded latency.

    python3 bench/busy_latency.py --build build --libs zeppelin,mpi,floor-spin,floor-futex,floor-hybrid --rounds 5

Needs torch for Gloo (skipped with a note if missing) and mpirun for Open
MPI (likewise). Exits non-zero if a run fails.
"""

import argparse
import os
import re
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare import parse_table  # noqa: E402
from gloo_alltoallv import parse_bytes  # noqa: E402

SCHED = re.compile(r"#\s+sched \d+ B: per call \(worst rank\) ([\d.]+) us on a core, ([\d.]+) us waiting for one")


def sched_now():
    with open("/proc/thread-self/schedstat") as f:
        run, wait, _ = (int(x) for x in f.read().split())
    return run, wait


def gloo_worker(rank, a, port, out):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    peer = 1 - rank
    send = torch.full((max(1, a.bytes // 4),), float(rank))
    recv = torch.empty_like(send)

    def call():
        r = dist.irecv(recv, peer)
        s = dist.isend(send, peer)
        s.wait()
        r.wait()

    for _ in range(a.warmup):
        call()
    dist.barrier()
    run0, wait0 = sched_now()
    t0 = time.perf_counter()
    for _ in range(a.gloo_iters):
        call()
    t = time.perf_counter() - t0
    run1, wait1 = sched_now()
    wrong = int((recv != float(peer)).sum())
    v = torch.tensor([t / a.gloo_iters, (run1 - run0) / a.gloo_iters, (wait1 - wait0) / a.gloo_iters, wrong],
                     dtype=torch.float64)
    dist.all_reduce(v, op=dist.ReduceOp.MAX)
    if rank == 0:
        with open(out, "w") as f:
            f.write("%g %g %g %d\n" % (v[0].item() * 1e6, v[1].item() * 1e-3, v[2].item() * 1e-3, int(v[3].item())))
    dist.destroy_process_group()


def gloo_run(a):
    import tempfile

    import torch.multiprocessing as mp

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "result")
        mp.spawn(gloo_worker, args=(a, port, out), nprocs=2, join=True)
        with open(out) as f:
            print(f.read().strip())


def run(cmd, env):
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError("%s failed (exit %d):\n%s%s" % (" ".join(cmd), p.returncode, p.stdout[-1500:], p.stderr[-1500:]))
    return p.stdout


def measure(lib, a, env):
    """(us per call, us on a core per call, us waiting for a core per call; -1: not known) of one run."""
    size = str(a.bytes)
    flags = ["-b", size, "-e", size, "-n", str(a.iters), "-w", str(a.warmup), "-c", "1"]
    if lib == "gloo" and a.op == "sendrecv":
        f = run([sys.executable, os.path.abspath(__file__), "--gloo-run", "--bytes", size, "--gloo-iters",
                 str(a.gloo_iters), "--warmup", str(a.warmup)], env).split()
        if f[3] != "0":
            raise RuntimeError("gloo: %s wrong elements" % f[3])
        return float(f[0]), float(f[1]), float(f[2])
    if lib.startswith("floor-"):
        f = run([os.path.join(a.build, "bench", "sched_floor"), "--mode", lib[len("floor-"):], "-n", str(a.iters),
                 "-w", str(a.warmup)], env).split()
        return float(f[0]), float(f[1]), float(f[2])
    prog = "sendrecv_perf" if a.op == "sendrecv" else "all_reduce_perf"
    if lib == "gloo":
        cmd = [sys.executable, os.path.join(HERE, "gloo_collectives.py"), "-o", "allreduce", "-N", str(a.ranks),
               "-b", size, "-e", size, "-n", str(a.gloo_iters), "-w", str(a.warmup), "-c", "1"]
    elif lib == "zeppelin":
        cmd = [os.path.join(a.build, "zprun"), "-n", str(a.ranks), os.path.join(a.build, "bench", prog)] + flags
    else:
        cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(a.ranks), "--mca", "pml", "ob1", "--mca",
               "btl", "self,vader", "--mca", "oob_tcp_if_include", "lo",
               os.path.join(a.build, "bench", "mpi_" + prog)] + flags
    out = run(cmd, env)
    rows = parse_table(out)
    if a.bytes not in rows or rows[a.bytes]["wrong"]:
        raise RuntimeError("%s: no row for %d bytes or wrong elements:\n%s" % (lib, a.bytes, out[-1500:]))
    m = SCHED.search(out)
    return rows[a.bytes]["time"], float(m.group(1)) if m else -1, float(m.group(2)) if m else -1


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build")
    ap.add_argument("--op", choices=["sendrecv", "allreduce"], default="sendrecv")
    ap.add_argument("--ranks", type=int, default=2, help="ranks (a ring shift with Gloo needs 2)")
    ap.add_argument("--bytes", type=parse_bytes, default=8)
    ap.add_argument("--load", type=int, default=2, help="busy processes per core in the loaded runs")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10000, help="timed calls per Zeppelin and Open MPI run")
    ap.add_argument("--gloo-iters", type=int, default=None, help="timed calls per Gloo run (default: 2000 "
                    "send/recv, --iters all-reduce)")
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--libs", default="zeppelin,mpi,gloo")
    ap.add_argument("--only", choices=["quiet", "loaded"], help="only the runs without (quiet) or with the load")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME:VAR=VALUE[,VAR=VALUE]",
                    help="also Zeppelin with these settings, as library NAME (repeatable)")
    ap.add_argument("--gloo-run", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.gloo_iters is None:
        a.gloo_iters = 2000 if a.op == "sendrecv" else a.iters
    if a.gloo_run:
        gloo_run(a)
        return 0
    env = dict(os.environ)
    env["PYTHONPATH"] = os.path.join(os.path.dirname(HERE), "python") + os.pathsep + env.get("PYTHONPATH", "")
    libs = a.libs.split(",")
    variants = {}
    for v in a.variant:
        name, _, settings = v.partition(":")
        variants[name] = dict(kv.split("=", 1) for kv in settings.split(",") if kv)
        libs.append(name)
    try:
        import torch  # noqa: F401
    except ImportError:
        if "gloo" in libs:
            print("# no torch: Gloo left out")
            libs.remove("gloo")
    if "gloo" in libs and a.op == "sendrecv" and a.ranks != 2:
        print("# Gloo's ring shift runs on 2 ranks only: left out")
        libs.remove("gloo")
    floors = [lib for lib in libs if lib.startswith("floor-")]
    if floors and (a.op != "sendrecv" or a.ranks != 2 or a.bytes != 8):
        print("# the floors are an 8-byte ring shift on 2 ranks: left out")
        libs = [lib for lib in libs if lib not in floors]
    if "mpi" in libs and subprocess.run(["which", "mpirun"], capture_output=True).returncode != 0:
        print("# no mpirun: Open MPI left out")
        libs.remove("mpi")
    res = {(lib, loaded): [] for lib in libs for loaded in (False, True)}
    ncores = os.cpu_count() or 1
    for name, settings in variants.items():
        print(f"# {name}: Zeppelin with {settings}")
    what = "ring shift" if a.op == "sendrecv" else "all-reduce"
    print(f"# busy_latency: {a.bytes} B {what} on {a.ranks} ranks; loaded: {a.load} busy processes per core "
          f"({a.load * ncores}); load average before: {open('/proc/loadavg').read().split()[0]}", flush=True)
    for r in range(a.rounds):
        order = libs[r % len(libs):] + libs[:r % len(libs)]
        for lib in order:
            for loaded in (False, True) if r % 2 == 0 else (True, False):
                if a.only and loaded != (a.only == "loaded"):
                    continue
                before = open("/proc/loadavg").read().split()[0]  # the load average, the other users' share of it
                load = []
                if loaded:
                    load = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(a.load * ncores)]
                    time.sleep(0.5)
                try:
                    got = measure("zeppelin" if lib in variants else lib, a, dict(env, **variants.get(lib, {})))
                finally:
                    for p in load:
                        p.kill()
                    for p in load:
                        p.wait()
                res[(lib, loaded)].append(got)
                print(f"# round {r + 1} {lib:8s} {'loaded' if loaded else 'quiet ':6s} {got[0]:10.2f} us/call  "
                      f"on a core {got[1]:8.2f} us  waiting for one {got[2]:10.2f} us  load average before {before}",
                      flush=True)
    print(f"{'library':>9} {'quiet(us)':>10} {'loaded(us)':>11} {'loaded/quiet':>13} {'oncpu(us)':>10} {'queued(us)':>11}")

    def med(lib, loaded, i):
        got = [x[i] for x in res[(lib, loaded)]]
        return statistics.median(got) if got else 0

    for lib in libs:
        q, ld = med(lib, False, 0), med(lib, True, 0)
        print(f"{lib:>9} {q:10.2f} {ld:11.2f} {ld / q if q else 0:13.1f} {med(lib, True, 1):10.2f} "
              f"{med(lib, True, 2):11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
