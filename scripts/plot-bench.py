#!/usr/bin/python3
"""Turn gradwire-bench output (one JSON object per line) into the figures of docs/benchmarks.md.

Usage:
    build/bench/gradwire-bench > bench.jsonl        # or --filter for a subset
    scripts/plot-bench.py bench.jsonl -o docs/images/bench

Reads every line that is a JSON object with "metric", "value" and "params" (other lines, such
as progress on stderr captured with 2>&1, are skipped) and writes, for the metrics present:

    allreduce_busbw.svg   c10d.allreduce_busbw_gbps: bus bandwidth against message size, one
                          line per backend (shared memory, Gloo) and PyTorch's Gloo from the
                          same run
    ddp_step.svg          ddp.step_ms*: the DDP step against the number of ranks, per backend,
                          with PyTorch's step and the single-process step of the same run
    ps_samples.svg        ps.samples_per_s_trainers: parameter-server samples/s against the
                          number of trainers, gradwire and PyTorch
    ps_scaling.svg        ps.samples_per_s_scaling: parameter-server samples/s against the
                          number of trainers, one line per server count, each with the bound
                          the host's floors allow (params.bound_samples_per_s), dashed
    rpc_latency_cdf.svg   rpc.transport_latency_us: the latency distribution of each transport
                          (params.cdf_percent_us), with the raw TCP ping-pong of the same run

A figure whose metric is absent is skipped (and said so). Needs matplotlib
(scripts/install-deps.sh --bench installs it). The SVGs are written without a date so that the same
input gives the same file.
"""

import argparse
import json
import math
import os
import sys
from collections import defaultdict


def read_rows(paths):
    rows = []
    for path in paths:
        stream = sys.stdin if path == "-" else open(path, encoding="utf-8")
        with stream:
            for number, line in enumerate(stream, 1):
                line = line.strip()
                if not line.startswith("{"):
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"plot-bench: {path}:{number}: not valid JSON ({e.msg})")
                if not isinstance(row, dict) or "metric" not in row or "value" not in row:
                    continue
                if not isinstance(row.get("params"), dict):
                    row["params"] = {}
                rows.append(row)
    return rows


def number(value):
    """A finite float, or None (NaN, missing, text)."""
    if isinstance(value, (int, float)) and math.isfinite(value):
        return float(value)
    return None


def backend_of(params, default):
    """The backend's short name: the first word of params.backend ("gloo (Process...)")."""
    text = params.get("backend")
    if not isinstance(text, str) or not text.strip():
        return default
    return text.split()[0].strip("(),;:")


def size_label(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:g} {unit}"
    return f"{n:g} B"


def new_figure(plt, title, xlabel, ylabel):
    fig, ax = plt.subplots(figsize=(7.0, 4.2))
    ax.set_title(title, fontsize=11)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="major", alpha=0.3)
    return fig, ax


def save(plt, fig, out_dir, name, written):
    path = os.path.join(out_dir, name)
    fig.tight_layout()
    fig.savefig(path, format="svg", metadata={"Date": None})
    plt.close(fig)
    written.append(path)


def plot_allreduce(plt, rows, out_dir, written):
    series = defaultdict(dict)  # backend -> bytes -> GB/s
    pytorch = {}
    ranks = set()
    for r in rows:
        if r["metric"] != "c10d.allreduce_busbw_gbps":
            continue
        p = r["params"]
        size = number(p.get("bytes"))
        value = number(r["value"])
        if size is None or value is None:
            continue
        series[backend_of(p, "gloo")][size] = value
        theirs = number(p.get("pytorch_gbps"))
        if theirs is not None:
            pytorch[size] = theirs
        if number(p.get("ranks")) is not None:
            ranks.add(int(p["ranks"]))
    if not series:
        return False
    rank_text = ", ".join(str(n) for n in sorted(ranks)) or "?"
    fig, ax = new_figure(plt, f"all_reduce bus bandwidth (float32, {rank_text} ranks, one host)",
                         "message size", "bus bandwidth (GB/s)")
    for name in sorted(series):
        xs = sorted(series[name])
        ax.plot(xs, [series[name][x] for x in xs], marker="o", label=f"gradwire {name}")
    if pytorch:
        xs = sorted(pytorch)
        ax.plot(xs, [pytorch[x] for x in xs], marker="s", linestyle="--",
                label="PyTorch gloo (same run)")
    ax.set_xscale("log", base=2)
    sizes = sorted({x for s in series.values() for x in s} | set(pytorch))
    ax.set_xticks(sizes)
    ax.set_xticklabels([size_label(x) for x in sizes], rotation=30, fontsize=8)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=9)
    save(plt, fig, out_dir, "allreduce_busbw.svg", written)
    return True


def plot_ddp(plt, rows, out_dir, written):
    ours = defaultdict(dict)  # backend -> ranks -> ms
    pytorch = {}
    single = []
    for r in rows:
        if not r["metric"].startswith("ddp.step_ms") or r["metric"] == "ddp.step_ms_bucket_mb":
            continue
        p = r["params"]
        n = number(p.get("ranks"))
        value = number(r["value"])
        if n is None or value is None:
            continue
        ours[backend_of(p, "gloo")][int(n)] = value
        theirs = number(p.get("pytorch_ms"))
        if theirs is not None:
            pytorch[int(n)] = theirs
        s = number(p.get("single_ms"))
        if s is not None:
            single.append(s)
    if not ours:
        return False
    fig, ax = new_figure(plt, "DDP step, 784-1024-1024-1024-10 MLP, batch 64 per rank",
                         "ranks (processes on one host)", "step (ms)")
    for name in sorted(ours):
        xs = sorted(ours[name])
        ax.plot(xs, [ours[name][x] for x in xs], marker="o", label=f"gradwire DDP, {name}")
    if pytorch:
        xs = sorted(pytorch)
        ax.plot(xs, [pytorch[x] for x in xs], marker="s", linestyle="--",
                label="PyTorch DDP, gloo (same run)")
    if single:
        ax.axhline(min(single), color="gray", linestyle=":",
                   label="single-process step (same run)")
    ax.set_xticks(sorted({x for s in ours.values() for x in s} | set(pytorch)))
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=9)
    save(plt, fig, out_dir, "ddp_step.svg", written)
    return True


def plot_ps(plt, rows, out_dir, written):
    ours = {}
    pytorch = {}
    for r in rows:
        if r["metric"] != "ps.samples_per_s_trainers":
            continue
        p = r["params"]
        n = number(p.get("trainers"))
        value = number(r["value"])
        if n is None or value is None:
            continue
        ours[int(n)] = value
        theirs = number(p.get("pytorch_samples_per_s"))
        if theirs is not None:
            pytorch[int(n)] = theirs
    if not ours:
        return False
    fig, ax = new_figure(plt, "parameter server: samples/s against trainers",
                         "trainers (processes on one host)", "samples/s (all trainers)")
    xs = sorted(ours)
    ax.plot(xs, [ours[x] for x in xs], marker="o", label="gradwire")
    if pytorch:
        ts = sorted(pytorch)
        ax.plot(ts, [pytorch[x] for x in ts], marker="s", linestyle="--",
                label="PyTorch rpc + dist_autograd (same run)")
    ax.set_xticks(sorted(set(xs) | set(pytorch)))
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=9)
    save(plt, fig, out_dir, "ps_samples.svg", written)
    return True


def plot_ps_scaling(plt, rows, out_dir, written):
    ours = defaultdict(dict)  # servers -> trainers -> samples/s
    bound = defaultdict(dict)  # servers -> trainers -> the bound from the floors
    cores = set()
    for r in rows:
        if r["metric"] != "ps.samples_per_s_scaling":
            continue
        p = r["params"]
        servers = number(p.get("servers"))
        trainers = number(p.get("trainers"))
        value = number(r["value"])
        if servers is None or trainers is None or value is None:
            continue
        ours[int(servers)][int(trainers)] = value
        b = number(p.get("bound_samples_per_s"))
        if b is not None:
            bound[int(servers)][int(trainers)] = b
        if number(p.get("cores")) is not None:
            cores.add(int(p["cores"]))
    if not ours:
        return False
    core_text = ", ".join(str(n) for n in sorted(cores)) or "?"
    fig, ax = new_figure(plt, f"parameter server scaling ({core_text} cores, one host)",
                         "trainers (processes on one host)", "samples/s (all trainers)")
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, servers in enumerate(sorted(ours)):
        color = colors[i % len(colors)]
        noun = "server" if servers == 1 else "servers"
        xs = sorted(ours[servers])
        ax.plot(xs, [ours[servers][x] for x in xs], marker="o", color=color,
                label=f"{servers} {noun}")
        if bound[servers]:
            bs = sorted(bound[servers])
            ax.plot(bs, [bound[servers][x] for x in bs], linestyle="--", linewidth=1,
                    color=color, label=f"bound from the floors, {servers} {noun}")
    ax.set_xscale("log", base=2)
    trainers = sorted({x for s in ours.values() for x in s})
    ax.set_xticks(trainers)
    ax.set_xticklabels([str(x) for x in trainers])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    save(plt, fig, out_dir, "ps_scaling.svg", written)
    return True


def parse_cdf(text):
    """'1:12.5 5:13.0 ...' -> [(percent, microseconds), ...] sorted by percent."""
    points = []
    if not isinstance(text, str):
        return points
    for item in text.split():
        percent, sep, us = item.partition(":")
        if not sep:
            continue
        try:
            points.append((float(percent), float(us)))
        except ValueError:
            continue
    return sorted(points)


def plot_rpc_cdf(plt, rows, out_dir, written):
    curves = {}
    ping = []
    for r in rows:
        if r["metric"] != "rpc.transport_latency_us":
            continue
        p = r["params"]
        points = parse_cdf(p.get("cdf_percent_us"))
        if len(points) < 2:
            continue
        curves[str(p.get("transport", "?"))] = points
        t = number(p.get("tcp_pingpong_us"))
        if t is not None:
            ping.append(t)
    if not curves:
        return False
    fig, ax = new_figure(plt, "rpc_sync latency between two processes, per transport",
                         "latency (µs)", "fraction of calls at or below")
    for name in sorted(curves):
        points = curves[name]
        ax.plot([us for _, us in points], [pc / 100 for pc, _ in points], marker=".",
                label=name)
    if ping:
        ax.axvline(min(ping), color="gray", linestyle=":", label="raw TCP ping-pong p50")
    ax.set_xscale("log")
    low = min(min(us for _, us in pts) for pts in curves.values())
    high = max(max(us for _, us in pts) for pts in curves.values())
    if ping:
        low = min(low, min(ping))
    ticks = [t for t in (5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
             if low / 1.5 <= t <= high * 1.5]
    ax.set_xticks(ticks)
    ax.set_xticklabels([f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_ylim(0, 1)
    ax.legend(fontsize=9)
    save(plt, fig, out_dir, "rpc_latency_cdf.svg", written)
    return True


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("inputs", nargs="+", help="gradwire-bench output files ('-' for stdin)")
    parser.add_argument("-o", "--out", default=".", help="directory for the SVGs (made if missing)")
    args = parser.parse_args()
    try:
        import matplotlib
        matplotlib.use("Agg")
        matplotlib.rcParams["svg.hashsalt"] = "gradwire"
        import matplotlib.pyplot as plt
    except ImportError as e:
        sys.exit("plot-bench: matplotlib cannot be imported by " + sys.executable + " (" + str(e) +
                 "); scripts/install-deps.sh --bench installs Debian's python3-matplotlib, for "
                 "/usr/bin/python3 (the interpreter this script names)")
    rows = read_rows(args.inputs)
    if not rows:
        sys.exit("plot-bench: no gradwire-bench rows in " + ", ".join(args.inputs))
    os.makedirs(args.out, exist_ok=True)
    written = []
    for name, plot in (("all_reduce bus bandwidth", plot_allreduce), ("DDP step", plot_ddp),
                       ("parameter-server samples/s", plot_ps),
                       ("parameter-server scaling", plot_ps_scaling),
                       ("rpc latency CDF", plot_rpc_cdf)):
        if not plot(plt, rows, args.out, written):
            print(f"plot-bench: no rows for the {name} figure; skipped", file=sys.stderr)
    for path in written:
        print(path)
    return 0 if written else 1


if __name__ == "__main__":
    sys.exit(main())
