#!/usr/bin/env python3
"""Writes tests/data/longtail_mix.txt: a second length distribution for zpplan,
built to differ from ProLong64k (whose mean is about 3K tokens with a tail to
340K). A mix of three kinds of data, seeded (the file is the same every run):
  70%  chat and instruction turns: log-normal, median 600 tokens, sigma 1.0
  25%  documents and code files:   log-normal, median 6K tokens, sigma 0.8
   5%  long documents and books:   log-uniform between 32K and 256K tokens
Lengths are clipped to [16, 262144].
With KIND "pareto" it writes tests/data/pareto_code.txt instead: a third
distribution, heavy-tailed throughout the way repository-level code data is
(Pareto, alpha 1.2, from 256 tokens, clipped to 131072), seeded the same way.
    python3 bench/gen_lengths.py [OUT] [COUNT] [KIND: mix (default) | pareto]
"""
import math
import random
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "tests/data/longtail_mix.txt"
count = int(sys.argv[2]) if len(sys.argv) > 2 else 40000
kind = sys.argv[3] if len(sys.argv) > 3 else "mix"
if kind not in ("mix", "pareto"):
    sys.exit(f"gen_lengths.py: unknown kind {kind!r} (mix or pareto)")
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
with open(out, "w") as f:
    f.write("\n".join(lines) + "\n")
