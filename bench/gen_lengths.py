#!/usr/bin/env python3
"""Writes the length files zpplan and the tests read (one length per line),
seeded (the same file every run).

KIND "mix" (default), tests/data/longtail_mix.txt: a second length
distribution, built to differ from ProLong64k (whose mean is about 3K tokens
with a tail to 340K). A mix of three kinds of data:
  70%  chat and instruction turns: log-normal, median 600 tokens, sigma 1.0
  25%  documents and code files:   log-normal, median 6K tokens, sigma 0.8
   5%  long documents and books:   log-uniform between 32K and 256K tokens
Lengths are clipped to [16, 262144].
KIND "pareto", tests/data/pareto_code.txt: heavy-tailed throughout the way
repository-level code data is (Pareto, alpha 1.2, from 256 tokens, clipped to
131072).
KIND "bimodal", tests/data/bimodal_1m.txt: 99% short documents (log-uniform
1K-4K tokens) and 1% rare long ones (log-uniform 128K-1M tokens), which hold
most of the tokens.
KIND "pretrain", tests/data/pretrain_hist.txt: lengths drawn from the
histogram of 13.46M pretraining documents in
/work/shared/data/seqlens/pretrain_histogram.csv (MagiAttention's
"representative training dataset"; uniform within a bucket), as that
corpus's lengths for zpplan.
    python3 bench/gen_lengths.py [OUT] [COUNT] [KIND]
"""
import csv
import math
import os
import random
import sys

KINDS = ("mix", "pareto", "bimodal", "pretrain")
out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/longtail_mix.txt"
count = int(sys.argv[2]) if len(sys.argv) > 2 else 40000
kind = sys.argv[3] if len(sys.argv) > 3 else "mix"
if kind not in KINDS:
    sys.exit(f"gen_lengths.py: unknown kind {kind!r} ({', '.join(KINDS)})")
rng = random.Random(20260101)
lines = []
for _ in range(count if kind == "pareto" else 0):
    lines.append(str(min(131072, int(256 * rng.paretovariate(1.2)))))
for _ in range(count if kind == "mix" else 0):
    u = rng.random()
    if u < 0.70:
        x = rng.lognormvariate(math.log(600), 1.0)
    elif u < 0.95:
        x = rng.lognormvariate(math.log(6000), 0.8)
    else:
        x = math.exp(rng.uniform(math.log(32768), math.log(262144)))
    lines.append(str(min(262144, max(16, int(x)))))
for _ in range(count if kind == "bimodal" else 0):
    lo, hi = (1024, 4096) if rng.random() < 0.99 else (131072, 1048576)
    lines.append(str(int(math.exp(rng.uniform(math.log(lo), math.log(hi))))))
if kind == "pretrain":
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.join(here, "..", "..", "shared", "data", "seqlens", "pretrain_histogram.csv")
    if not os.path.exists(path):
        path = "/work/shared/data/seqlens/pretrain_histogram.csv"
    buckets = []
    with open(path) as f:
        for row in csv.DictReader(f):
            lo, hi = (int(x) for x in row["range"].strip("[]").split(","))
            buckets.append((max(lo, 1), hi, int(row["number"])))
    weights = [b[2] for b in buckets]
    for _ in range(count):
        lo, hi, _n = rng.choices(buckets, weights)[0]
        lines.append(str(rng.randint(lo, hi)))
with open(out, "w") as f:
    f.write("\n".join(lines) + "\n")
