#!/usr/bin/env python3
"""gloo_alltoallv.py: the alltoallv_perf sweep on PyTorch's Gloo backend (CPU).

Starts N processes on this machine (torch.multiprocessing), each with one
torch thread, that meet over 127.0.0.1 and run dist.all_to_all_single with
the split sizes of the same traffic pattern as alltoallv_perf. The PRNG, the
patterns and the check data are a port of bench/common.cc and must stay bit
for bit identical to it. Prints the same table as alltoallv_perf.

    python3 bench/gloo_alltoallv.py -N 4 -b 1M -e 64M -f 2 -P random
"""

import argparse
import math
import os
import socket
import sys
import time

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
POISON = 0xA5
GUARD_BYTES = 4096


# ---- splitmix64, as in common.h ----
def slowest_seconds(call, warmup, iters):
    """Runs call() warmup times, then iters times after a barrier; the
    slowest rank's seconds per call (every rank gets the same number)."""
    import torch
    import torch.distributed as dist
    for _ in range(warmup):
        call()
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        call()
    t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def mix64(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


class SplitMix64:
    def __init__(self, seed):
        self.state = seed & MASK

    def next(self):
        self.state = (self.state + GOLDEN) & MASK
        return mix64(self.state)


# ---- datatypes: name -> (size, is_float, torch dtype name) ----
# Torch 1.13's Gloo has no all-to-all for uint32 / uint64 (no such torch
# types), bfloat16 or int16: those move as a type of the same size, which
# moves the same bytes (bfloat16 as float16: the check data clears bit 14, the
# top exponent bit of both, so every value is also a finite float16).
TYPES = {
    "int8": (1, False, "int8"), "uint8": (1, False, "uint8"),
    "int32": (4, False, "int32"), "uint32": (4, False, "int32"),
    "int64": (8, False, "int64"), "uint64": (8, False, "int64"),
    "half": (2, True, "float16"), "float": (4, True, "float32"),
    "double": (8, True, "float64"), "bfloat16": (2, True, "float16"),
}
ALIASES = {"float16": "half", "float32": "float", "float64": "double", "bf16": "bfloat16",
           "char": "int8", "int": "int32"}


# ---- options (the same flags as alltoallv_perf) ----
def parse_bytes(text):
    t = text
    if t[-1:] in ("B", "b") and len(t) > 1 and t[-2] in "kKmMgG":
        t = t[:-1]
    shift = {"k": 10, "m": 20, "g": 30}.get(t[-1:].lower(), 0)
    if shift:
        t = t[:-1]
    if not (t.isascii() and t.isdigit()):
        raise argparse.ArgumentTypeError(f"bad size '{text}'")
    return int(t) << shift


def parse_args(argv):
    p = argparse.ArgumentParser(description="alltoallv sweep on torch.distributed / Gloo (CPU)")
    p.add_argument("-N", "--nranks", type=int, default=4, help="processes to start (default 4)")
    p.add_argument("-b", type=parse_bytes, default=32 << 20, dest="min_bytes")
    p.add_argument("-e", type=parse_bytes, default=32 << 20, dest="max_bytes")
    p.add_argument("-f", type=float, default=None, dest="factor")
    p.add_argument("-i", type=parse_bytes, default=1 << 20, dest="step_bytes")
    p.add_argument("-n", type=int, default=20, dest="iters")
    p.add_argument("-w", type=int, default=5, dest="warmup")
    p.add_argument("-c", type=int, default=1, choices=(0, 1), dest="check")
    p.add_argument("-d", default="float", dest="dtype")
    p.add_argument("-P", default="uniform", dest="pattern",
                   help="uniform | random | zipf | matrix:FILE")
    p.add_argument("-s", type=lambda x: int(x, 0), default=1, dest="seed")
    a = p.parse_args(argv)
    a.dtype = ALIASES.get(a.dtype, a.dtype)
    if a.dtype not in TYPES:
        p.error(f"unknown datatype '{a.dtype}'")
    if a.nranks < 1:
        p.error("-N must be >= 1")
    if a.iters < 1 or a.warmup < 0:
        p.error("-n must be >= 1 and -w >= 0")
    if a.seed < 0:
        p.error("-s must be >= 0")
    if a.factor is not None and not (a.factor >= 1.0 and math.isfinite(a.factor)):
        p.error("-f must be a number >= 1")
    if a.factor is None:
        a.factor = 1.0
    if a.min_bytes > a.max_bytes:
        p.error("-b is larger than -e")
    if a.min_bytes < a.max_bytes:
        if a.factor > 1.0 and a.min_bytes == 0:
            p.error("-f needs -b > 0")
        if a.factor == 1.0 and a.step_bytes == 0:
            p.error("-i 0 with no -f > 1 never reaches -e")
    a.matrix_file = None
    if a.pattern.startswith("matrix:"):
        a.matrix_file = a.pattern[len("matrix:"):]
        if not a.matrix_file:
            p.error("-P matrix: needs a file name")
        a.pattern = "matrix"
    elif a.pattern not in ("uniform", "random", "zipf"):
        p.error(f"unknown pattern '{a.pattern}'")
    return a


def size_sweep(a):
    sizes, s = [], a.min_bytes
    while True:
        sizes.append(s)
        if s >= a.max_bytes:
            break
        nxt = float(s) * a.factor if a.factor > 1.0 else float(s) + float(a.step_bytes)
        if nxt > float(a.max_bytes):
            break
        n = int(nxt)
        s = n if n > s else s + 1
    return sizes


# ---- patterns, as in common.cc ----
def row_elems(size, n, ts):
    return size // (n * ts) * n


def read_matrix_file(path, n):
    weights, rows = [], 0
    with open(path) as f:
        for line_no, line in enumerate(f, 1):
            toks = line.split("#", 1)[0].split()
            if not toks:
                continue
            if len(toks) != n:
                raise ValueError(f"{path}:{line_no}: {len(toks)} numbers, expected {n} (one per rank)")
            for t in toks:
                try:
                    v = float(t)
                except ValueError:
                    v = -1.0
                if not math.isfinite(v) or v < 0:
                    raise ValueError(f"{path}:{line_no}: '{t}' is not a non-negative number")
                weights.append(v)
            rows += 1
    if rows != n:
        raise ValueError(f"{path}: {rows} rows, expected {n} (one per rank)")
    return weights


def scale_row(w, total):
    n = len(w)
    s = 0.0
    for x in w:
        s += x
    out = [0] * n
    if not (s > 0) or total == 0:
        return out
    assigned = 0
    for j in range(n):
        out[j] = math.floor(float(total) * (w[j] / s))
        assigned += out[j]
    while assigned > total:
        big = max(range(n), key=lambda j: (out[j], -j))  # first largest
        out[big] -= 1
        assigned -= 1
    j = 0
    while assigned < total:
        if w[j] > 0:
            out[j] += 1
            assigned += 1
        j = (j + 1) % n
    return out


def build_matrix(a, n, size, file_weights):
    """counts[src][dst] in elements, identical to buildMatrix in common.cc."""
    ts = TYPES[a.dtype][0]
    total = row_elems(size, n, ts)
    mean = total // n
    rng = SplitMix64(a.seed)
    m = []
    for src in range(n):
        if a.pattern == "uniform":
            row = [mean] * n
        elif a.pattern == "random":
            row = [rng.next() % (2 * mean + 1) for _ in range(n)]
        elif a.pattern == "zipf":
            perm = list(range(n))
            for i in range(n - 1, 0, -1):
                j = rng.next() % (i + 1)
                perm[i], perm[j] = perm[j], perm[i]
            w = [0.0] * n
            for k in range(n):
                w[perm[k]] = 1.0 / math.pow(float(k + 1), 1.2)
            row = scale_row(w, total)
        else:
            row = scale_row(file_weights[src * n:(src + 1) * n], total)
        m.append(row)
    return m


def max_rank_bytes(m, ts):
    n = len(m)
    best = 0
    for r in range(n):
        sent = sum(m[r])
        recvd = sum(m[p][r] for p in range(n))
        best = max(best, max(sent, recvd) * ts)
    return best


# ---- check data, as in common.cc (vectorized with numpy) ----
def size_seed(seed, size):
    return mix64((seed + GOLDEN * (size + 1)) & MASK)


def block_base(seed, src, dst):
    return mix64((mix64((seed + src) & MASK) + dst) & MASK)


def block_bytes(np, seed, src, dst, count, ts, is_float):
    """The bytes fillBlock writes for count elements of block src -> dst."""
    u = np.uint64
    base = u(block_base(seed, src, dst))
    out = np.empty(count * ts, dtype=np.uint8)
    chunk = 1 << 20
    for lo in range(0, count, chunk):
        hi = min(count, lo + chunk)
        z = base + (np.arange(lo + 1, hi + 1, dtype=np.uint64) * u(GOLDEN))  # wraps mod 2^64
        z = (z ^ (z >> u(30))) * u(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> u(27))) * u(0x94D049BB133111EB)
        z = z ^ (z >> u(31))
        if is_float:
            z &= u(MASK ^ (1 << (8 * ts - 2)))  # clear the exponent's top bit: no NaN / Inf
        b = z.astype("<u8").view(np.uint8).reshape(hi - lo, 8)[:, :ts]
        out[lo * ts:hi * ts] = b.reshape(-1)
    return out


# ---- the worker ----
def fmt_row(size, count, tname, time_us, algbw, busbw, wrong):
    w = "N/A" if wrong is None else str(wrong)
    # Spaces between the columns: a time of 100 ms or more fills its 9 places.
    return f" {size:11d} {count:13d} {tname:>9s} {time_us:9.2f} {algbw:7.2f} {busbw:7.2f} {w:>7s}"


def worker(rank, a, port, file_weights):
    import numpy as np
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    n = a.nranks
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n)
    ts, is_float, tdt = TYPES[a.dtype]
    dtype = getattr(torch, tdt)
    root = rank == 0
    if root:
        print(f"# gloo_alltoallv: torch {torch.__version__} Gloo all_to_all_single")
        print(f"# nranks {n}  pattern {a.pattern}{':' + a.matrix_file if a.matrix_file else ''}"
              f"  seed {a.seed}  iters {a.iters}  warmup {a.warmup}  datatype {a.dtype}"
              f"  check {a.check}  (moved as torch.{tdt})")
        print("#")
        print(f"#{'size':>11s}{'count':>14s}{'type':>10s}{'time':>9s}{'algbw':>8s}{'busbw':>8s}{'#wrong':>8s}")
        print(f"#{'(B)':>11s}{'(elements)':>14s}{'':>10s}{'(us)':>9s}{'(GB/s)':>8s}{'(GB/s)':>8s}{'':>8s}")
        sys.stdout.flush()

    total_wrong, busbw_sum, rows = 0, 0.0, 0
    for size in size_sweep(a):
        m = build_matrix(a, n, size, file_weights)
        elems = row_elems(size, n, ts)
        in_splits = [m[rank][p] for p in range(n)]
        out_splits = [m[p][rank] for p in range(n)]
        send = torch.full((sum(in_splits),), 1, dtype=dtype)  # touches the pages
        guard = GUARD_BYTES // ts
        recv_full = torch.zeros(sum(out_splits) + guard, dtype=dtype)
        recv = recv_full[:sum(out_splits)]  # the guard follows the last range

        time_us = slowest_seconds(lambda: dist.all_to_all_single(recv, send, out_splits, in_splits), a.warmup,
                                  a.iters) * 1e6

        wrong = None
        if a.check:
            seed = size_seed(a.seed, size)
            send_bytes = send.view(torch.uint8).numpy()
            pos = 0
            for p in range(n):
                c = in_splits[p]
                send_bytes[pos:pos + c * ts] = block_bytes(np, seed, rank, p, c, ts, is_float)
                pos += c * ts
            recv_bytes = recv_full.view(torch.uint8).numpy()
            recv_bytes[:] = POISON
            dist.all_to_all_single(recv, send, out_splits, in_splits)
            local, pos = 0, 0
            for p in range(n):
                c = out_splits[p]
                want = block_bytes(np, seed, p, rank, c, ts, is_float)
                local += int(np.count_nonzero(recv_bytes[pos:pos + c * ts] != want))
                pos += c * ts
            local += int(np.count_nonzero(recv_bytes[pos:] != POISON))
            pos = 0
            for p in range(n):  # the send buffer must be unchanged
                c = in_splits[p]
                want = block_bytes(np, seed, rank, p, c, ts, is_float)
                local += int(np.count_nonzero(send_bytes[pos:pos + c * ts] != want))
                pos += c * ts
            if local:
                print(f"rank {rank}: {local} wrong bytes at size {elems * ts}", file=sys.stderr)
            w = torch.tensor([local], dtype=torch.int64)
            dist.all_reduce(w, op=dist.ReduceOp.SUM)
            wrong = int(w.item())
            total_wrong += wrong

        algbw = max_rank_bytes(m, ts) / (time_us * 1e3) if time_us > 0 else 0.0
        busbw = algbw * (n - 1) / n
        busbw_sum += busbw
        rows += 1
        if root:
            print(fmt_row(elems * ts, elems, a.dtype, time_us, algbw, busbw, wrong))
            sys.stdout.flush()
    if root:
        if a.check:
            print(f"# Out of bounds values : {total_wrong} {'OK' if total_wrong == 0 else 'FAILED'}")
        else:
            print("# Out of bounds values : N/A (check disabled)")
        print(f"# Avg bus bandwidth    : {busbw_sum / rows if rows else 0.0:g}")
        print("#")
        sys.stdout.flush()
    dist.destroy_process_group()
    if total_wrong:
        sys.exit(1)


def free_port():
    # Bound and released at once; the tiny race with another program is acceptable here.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv):
    a = parse_args(argv)
    file_weights = None
    if a.pattern == "matrix":
        try:
            file_weights = read_matrix_file(a.matrix_file, a.nranks)
        except (OSError, ValueError) as e:
            print(f"gloo_alltoallv.py: {e}", file=sys.stderr)
            return 2
    try:
        import numpy  # noqa: F401  (the check needs it; fail here, not in N workers)
        import torch.multiprocessing as mp
    except ImportError as e:
        print(f"gloo_alltoallv.py: {e}", file=sys.stderr)
        return 3
    # Keep Gloo on the loopback interface: no traffic leaves the machine.
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        mp.spawn(worker, args=(a, free_port(), file_weights), nprocs=a.nranks, join=True)
    except Exception as e:  # a worker failed or found wrong bytes
        print(f"gloo_alltoallv.py: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
