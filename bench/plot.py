#!/usr/bin/env python3
"""plot.py: the benchmarks' tables as PNG figures (matplotlib, Agg).

  bandwidth  bandwidth against size, Zeppelin and its peers (Open MPI, Gloo),
             with the machine's copy limit per rank as a line; from the JSON
             of compare.py --json or compare_collectives.py --json (one panel
             per operation)
  nics       bytes each NIC sent per call in a routed run, per pattern and
             routing mode; from route_perf's output (its "tx MiB" column)
  sim        zpplan --json as a stacked step-time breakdown (attention,
             exposed communication, remap, linear, idle) per strategy, one
             panel per rank count

    python3 bench/compare.py --build build -N 4 -b 64K -e 64M -f 4 --json a2a.json
    python3 bench/plot.py bandwidth a2a.json -o docs/img/alltoallv_bw.png
    build/zprun --nodes 2 ... build/bench/route_perf ... > route.txt
    python3 bench/plot.py nics route.txt -o docs/img/route_nics.png
    build/zpplan --file tests/data/prolong64k.txt --json > sim.json
    python3 bench/plot.py sim sim.json -o docs/img/sim.png --skip ring_all
"""

import argparse
import json
import sys
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PEERS = [("zeppelin", "Zeppelin", "#c44e52", "o"), ("mpi", "Open MPI", "#4c72b0", "s"),
         ("gloo", "Gloo (torch)", "#55a868", "^")]


def size_label(b):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= div and b % div == 0:
            return f"{b // div}{unit}"
    return str(b)


def plot_bandwidth(a):
    """One panel per operation: bandwidth (the JSON rows' metric) against size."""
    d = json.load(open(a.table))
    metric = a.metric
    ops = list(dict.fromkeys(r["op"] for r in d["rows"]))
    cols = min(2, len(ops))
    rows_n = (len(ops) + cols - 1) // cols
    fig, axes = plt.subplots(rows_n, cols, figsize=(6.4 if cols == 1 else 10, 0.4 + 3.6 * rows_n), squeeze=False)
    limit = d.get("limit_per_rank_GBps")
    for ax in axes.flat[len(ops):]:
        ax.set_visible(False)
    for ax, op in zip(axes.flat, ops):
        rows = sorted((r for r in d["rows"] if r["op"] == op), key=lambda r: r["size"])
        sizes = [r["size"] for r in rows]
        for key, label, color, marker in PEERS:
            pts = [(r["size"], r[key][metric]) for r in rows if r.get(key) and r[key].get(metric) is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker=marker, color=color, label=label)
        if limit:
            ax.axhline(limit, color="#444444", linestyle="--", linewidth=1,
                       label=f"memcpy limit / rank ({limit:.1f} GB/s)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(sizes)
        ax.set_xticklabels([size_label(s) for s in sizes], fontsize=7, rotation=45)
        ax.set_xlabel("bytes per rank")
        ax.set_ylabel(f"{metric} (GB/s)")
        ax.set_title(op, fontsize=9)
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)
    axes[0][0].legend(fontsize=7)
    extra = f", pattern {d['pattern']}" if d.get("pattern") else ""
    fig.suptitle(textwrap.fill(a.title or f"{d['nranks']} ranks on one machine{extra}; median of "
                               f"{d.get('repeat', 1)} interleaved runs (a shared machine)", 90), fontsize=9)
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)
    print("wrote " + a.output)


def parse_route_perf(text):
    """[(pattern, size, mode, time_us, [node 0 NIC MiB], [node 1 NIC MiB])] from route_perf's table."""
    rows = []
    for line in text.splitlines():
        if line.startswith("#") or "|" not in line:
            continue
        head, node1 = line.split("|")
        f = head.split()
        if len(f) < 9 or f[0] == "pattern":
            continue
        try:
            rows.append((f[0], int(f[1]), f[2], float(f[3]), [float(x) for x in f[8:]],
                         [float(x) for x in node1.split()]))
        except ValueError:
            continue
    return rows


def plot_nics(a):
    """Grouped bars: each NIC of nodes 0 and 1, per routing mode, one panel per (pattern, size)."""
    rows = parse_route_perf(open(a.table).read())
    if not rows:
        sys.exit(f"plot.py: no route_perf rows in {a.table}")
    cases = list(dict.fromkeys((r[0], r[1]) for r in rows))
    fig, axes = plt.subplots(1, len(cases), figsize=(max(6.4, 4.0 * len(cases)), 3.8), squeeze=False, sharey=False)
    for ax, (pattern, size) in zip(axes[0], cases):
        modes = [r for r in rows if (r[0], r[1]) == (pattern, size)]
        nics = len(modes[0][4])
        width = 0.8 / nics
        for k in range(nics):
            xs = [m + (k - (nics - 1) / 2) * width for m in range(len(modes))]
            ax.bar([x - 0.0 for x in xs], [r[4][k] for r in modes], width * 0.9,
                   color=plt.cm.tab10(k), label=f"NIC {k}")
        for m, r in enumerate(modes):
            ax.text(m, max(r[4]) * 1.02, f"{r[3] / 1e3:.0f} ms", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(modes)))
        ax.set_xticklabels([r[2] for r in modes])
        ax.set_title(f"{pattern}, {size_label(size)}iB", fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
        top = max(max(r[4]) for r in modes)
        ax.set_ylim(0, top * 1.15)
    axes[0][0].set_ylabel("MiB sent per call, node 0's NICs")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(textwrap.fill(a.title or "route_perf: bytes each NIC of node 0 sent per call (tx counters), "
                               "time per call above the bars", 120), fontsize=9)
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)
    print("wrote " + a.output)


def plot_sim(a):
    """Stacked breakdown of zpplan's simulated step per strategy, one panel per rank count."""
    d = json.load(open(a.table))
    skip = set(a.skip.split(",")) if a.skip else set()
    parts = ["attn", "comm", "remap", "linear", "idle"]
    colors = ["#4c72b0", "#dd8452", "#c44e52", "#8c8c8c", "#e5e5e5"]
    results = d["results"]
    names = [n for n in results[0]["strategies"] if n not in skip]
    fig, axes = plt.subplots(1, len(results), figsize=(3.2 * len(results), 4.2), sharey=True, squeeze=False)
    for ax, r in zip(axes[0], results):
        bottom = [0.0] * len(names)
        for p, col in zip(parts, colors):
            vals = [r["strategies"][n]["breakdown_s"][p] for n in names]
            ax.bar(range(len(names)), vals, bottom=bottom, color=col, label=p, edgecolor="white", linewidth=0.3)
            bottom = [b + v for b, v in zip(bottom, vals)]
        for i, n in enumerate(names):
            if r["strategies"][n]["feasible"] < 1:
                ax.text(i, bottom[i], "%d%% fit" % (100 * r["strategies"][n]["feasible"]), ha="center",
                        va="bottom", fontsize=6)
        ax.set_xticks(range(len(names)))
        ax.set_xticklabels([n.replace("zeppelin", "zp") for n in names], rotation=70, fontsize=7)
        title = "%d ranks: zp / best %.2fx" % (r["ranks"], r["speedup_over_best"]["median"])
        if "bound_over_zeppelin" in r:
            title += "\nbound / zp %.3f" % r["bound_over_zeppelin"]["median"]
        ax.set_title(title, fontsize=8)
    axes[0][0].set_ylabel("step (s), mean over batches")
    axes[0][0].legend(fontsize=7, loc="upper left")
    fig.suptitle(a.title or "%s, %s, %d batches x %d seeds per rank count" % (
        d["machine"], d["model"]["name"], d["batches"], d["seeds"]), fontsize=9)
    fig.tight_layout()
    fig.savefig(a.output, dpi=110)
    print("wrote " + a.output)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="figure", required=True)
    b = sub.add_parser("bandwidth", help="bandwidth against size from compare.py / compare_collectives.py --json")
    b.add_argument("--metric", default="busbw", choices=["busbw", "algbw"],
                   help="which bandwidth (compare_collectives.py has busbw only; default busbw)")
    n = sub.add_parser("nics", help="per-NIC bytes from route_perf's output")
    s = sub.add_parser("sim", help="zpplan --json as stacked step times")
    s.add_argument("--skip", default="", help="strategies to leave out, comma-separated (e.g. ring_all)")
    for p in (b, n, s):
        p.add_argument("table", help="the JSON or text table")
        p.add_argument("-o", "--output", required=True, help="PNG to write")
        p.add_argument("--title", help="the figure's title (default: from the table)")
    a = ap.parse_args(argv)
    {"bandwidth": plot_bandwidth, "nics": plot_nics, "sim": plot_sim}[a.figure](a)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
