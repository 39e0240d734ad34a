#!/usr/bin/env python3
"""Stacked breakdown of zpplan's simulated step per strategy and rank count
(matplotlib): attention, exposed communication, remap, linear, idle; the mean
over batches, as zpplan --json reports them.
    build/zpplan --file tests/data/prolong64k.txt --json > sim.json
    python3 bench/plot_sim.py sim.json docs/img/sim_prolong64k.png [--skip ring_all]
"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

args = [a for a in sys.argv[1:] if not a.startswith("--skip")]
skip = set()
for a in sys.argv[1:]:
    if a.startswith("--skip"):
        skip.update(a.split("=", 1)[1].split(",") if "=" in a else ["ring_all"])
if len(args) != 2:
    sys.exit(__doc__)
d = json.load(open(args[0]))
parts = ["attn", "comm", "remap", "linear", "idle"]
colors = ["#4c72b0", "#dd8452", "#c44e52", "#8c8c8c", "#e5e5e5"]
results = d["results"]
names = [n for n in results[0]["strategies"] if n not in skip]
fig, axes = plt.subplots(1, len(results), figsize=(3.2 * len(results), 4.2), sharey=True)
if len(results) == 1:
    axes = [axes]
for ax, r in zip(axes, results):
    bottom = [0.0] * len(names)
    for p, col in zip(parts, colors):
        vals = [r["strategies"][n]["breakdown_s"][p] for n in names]
        ax.bar(range(len(names)), vals, bottom=bottom, color=col, label=p, edgecolor="white", linewidth=0.3)
        bottom = [b + v for b, v in zip(bottom, vals)]
    for i, n in enumerate(names):
        if r["strategies"][n]["feasible"] < 1:
            ax.text(i, bottom[i], "%d%% fit" % (100 * r["strategies"][n]["feasible"]), ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([n.replace("zeppelin", "zp") for n in names], rotation=70, fontsize=7)
    ax.set_title("%d ranks: zp / best %.2fx" % (r["ranks"], r["speedup_over_best"]["median"]), fontsize=8)
axes[0].set_ylabel("step (s), mean over batches")
axes[0].legend(fontsize=7, loc="upper left")
fig.suptitle("%s, %s, %d batches x %d seeds per rank count" % (d["machine"], d["model"]["name"], d["batches"], d["seeds"]),
             fontsize=9)
fig.tight_layout()
fig.savefig(args[1], dpi=110)
print("wrote " + args[1])
