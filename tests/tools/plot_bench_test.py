#!/usr/bin/python3
"""Tests of scripts/plot-bench.py, run as a user runs it: the script itself, on gradwire-bench
output made here (rows shaped like the bench's, with values chosen so that each figure's lines
can be told apart), in a fresh directory.

Usage: plot_bench_test.py PATH_TO_plot-bench.py
Exits 77 (CTest's "skipped") when this interpreter cannot import matplotlib, which only
scripts/install-deps.sh --bench installs.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

SCRIPT = None
FIGURES = ("allreduce_busbw.svg", "ddp_step.svg", "ps_samples.svg", "ps_scaling.svg",
           "rpc_latency_cdf.svg")


def allreduce_rows():
    rows = []
    for size, shm, gloo, torch in ((1 << 20, 7.1, 0.9, 0.8), (16 << 20, 4.0, 0.94, 0.82),
                                   (64 << 20, 4.1, 1.07, 0.87)):
        rows.append({"metric": "c10d.allreduce_busbw_gbps", "value": shm, "unit": "GB/s",
                     "params": {"bytes": size, "ranks": 2, "dtype": "float32",
                                "backend": "shm (ProcessGroupShm, processes on one host)",
                                "pytorch_gbps": torch, "gloo_gbps": gloo}})
        rows.append({"metric": "c10d.allreduce_busbw_gbps", "value": gloo, "unit": "GB/s",
                     "params": {"bytes": size, "ranks": 2, "dtype": "float32",
                                "backend": "gloo (ProcessGroupGloo, loopback TCP)",
                                "pytorch_gbps": torch}})
    return rows


def ddp_rows():
    return [
        {"metric": "ddp.step_ms", "value": 28.3, "unit": "ms",
         "params": {"ranks": 2, "backend": "shm (ProcessGroupShm)", "pytorch_ms": 51.7,
                    "single_ms": 24.2}},
        {"metric": "ddp.step_ms", "value": 66.3, "unit": "ms",
         "params": {"ranks": 4, "backend": "shm (ProcessGroupShm)", "pytorch_ms": None,
                    "single_ms": 24.2}},
        # Not a step against ranks: the figure leaves it out.
        {"metric": "ddp.step_ms_bucket_mb", "value": 999.0, "unit": "ms",
         "params": {"ranks": 8, "backend": "bogus (must not be drawn)"}},
    ]


def ps_rows(with_pytorch=True):
    rows = []
    for trainers, ours, theirs in ((1, 50218.3, 13339.3), (2, 45964.7, 16561.6),
                                   (4, 47500.0, 17800.0)):
        rows.append({"metric": "ps.samples_per_s_trainers", "value": ours, "unit": "samples/s",
                     "params": {"trainers": trainers,
                                "pytorch_samples_per_s": theirs if with_pytorch else None}})
    return rows


def ps_scaling_rows(with_bound=True, servers=(1, 2, 4)):
    rows = []
    for s in servers:
        for trainers in (1, 2, 4, 8, 16):
            value = 66000.0 / s * min(trainers, 1.15)
            rows.append({"metric": "ps.samples_per_s_scaling", "value": value,
                         "unit": "samples/s",
                         "params": {"servers": s, "trainers": trainers, "cores": 2,
                                    "bound_samples_per_s":
                                        (190000.0 / s if with_bound else None)}})
    return rows


def rpc_rows():
    rows = []
    for transport, base in (("local", 30.0), ("tcp", 45.0)):
        cdf = " ".join(f"{p}:{base * (1 + p / 200):.1f}" for p in (1, 10, 50, 90, 99))
        rows.append({"metric": "rpc.transport_latency_us", "value": base * 1.25, "unit": "us",
                     "params": {"transport": transport, "cdf_percent_us": cdf,
                                "tcp_pingpong_us": 24.1}})
    return rows


def svg_comments(path):
    """The texts matplotlib drew (it writes each text drawn as paths after an XML comment)."""
    with open(path, encoding="utf-8") as f:
        body = f.read()
    texts = []
    start = 0
    while True:
        i = body.find("<!--", start)
        if i < 0:
            return texts
        j = body.find("-->", i)
        texts.append(body[i + 4:j].strip())
        start = j + 3


class PlotBench(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory(prefix="plot-bench-test-")
        self.addCleanup(self.dir.cleanup)

    def write_input(self, name, rows, extra_lines=()):
        path = os.path.join(self.dir.name, name)
        with open(path, "w", encoding="utf-8") as f:
            for line in extra_lines:
                f.write(line + "\n")
            for row in rows:
                f.write(json.dumps(row) + "\n")
        return path

    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True,
                              timeout=120)

    def test_every_figure_is_drawn_with_its_lines(self):
        data = self.write_input(
            "bench.jsonl",
            allreduce_rows() + ddp_rows() + ps_rows() + ps_scaling_rows() + rpc_rows(),
            extra_lines=["gradwire-bench: progress on stderr, captured with 2>&1", ""])
        out = os.path.join(self.dir.name, "svg")  # made by the script
        result = self.run_script(data, "-o", out)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(sorted(os.path.basename(p) for p in result.stdout.split()),
                         sorted(FIGURES))
        for name in FIGURES:
            ET.parse(os.path.join(out, name))  # well-formed SVG
        legends = {name: svg_comments(os.path.join(out, name)) for name in FIGURES}
        for name, wanted in (
                ("allreduce_busbw.svg", ["gradwire gloo", "gradwire shm",
                                         "PyTorch gloo (same run)", "16 MiB", "64 MiB"]),
                ("ddp_step.svg", ["gradwire DDP, shm", "PyTorch DDP, gloo (same run)",
                                  "single-process step (same run)"]),
                ("ps_samples.svg", ["gradwire", "PyTorch rpc + dist_autograd (same run)"]),
                ("ps_scaling.svg", ["1 server", "2 servers", "4 servers",
                                    "bound from the floors, 1 server",
                                    "bound from the floors, 4 servers", "16",
                                    "parameter server scaling (2 cores, one host)"]),
                ("rpc_latency_cdf.svg", ["local", "tcp", "raw TCP ping-pong p50"])):
            for text in wanted:
                self.assertIn(text, legends[name], f"{name} lacks '{text}'")
        # The bucket-size row is no step against ranks: no "bogus" backend, no 8 ranks.
        self.assertFalse(any("bogus" in t for t in legends["ddp_step.svg"]))
        self.assertNotIn("8", legends["ddp_step.svg"])

    def test_the_same_input_gives_the_same_files(self):
        data = self.write_input("bench.jsonl", allreduce_rows() + ps_rows())
        first = os.path.join(self.dir.name, "a")
        second = os.path.join(self.dir.name, "b")
        for out in (first, second):
            result = self.run_script(data, "-o", out)
            self.assertEqual(result.returncode, 0, result.stderr)
        for name in ("allreduce_busbw.svg", "ps_samples.svg"):
            with open(os.path.join(first, name), "rb") as a, open(os.path.join(second, name),
                                                                  "rb") as b:
                self.assertEqual(a.read(), b.read(), f"{name} differs between two runs")

    def test_an_absent_metric_is_skipped_and_said(self):
        data = self.write_input("ps.jsonl", ps_rows(with_pytorch=False))
        out = os.path.join(self.dir.name, "svg")
        result = self.run_script(data, "-o", out)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(sorted(os.listdir(out)), ["ps_samples.svg"])
        for name in ("all_reduce bus bandwidth", "DDP step", "parameter-server scaling",
                     "rpc latency CDF"):
            self.assertIn(f"no rows for the {name} figure; skipped", result.stderr)
        # PyTorch's rate was not measured (null): no PyTorch line is drawn.
        legend = svg_comments(os.path.join(out, "ps_samples.svg"))
        self.assertIn("gradwire", legend)
        self.assertFalse(any("PyTorch" in t for t in legend), legend)

    def test_scaling_lines_per_server_count_without_a_bound_when_none_was_measured(self):
        # Two server counts, no bound: one line each, no dashed bound line, and the other
        # parameter-server figure (ps.samples_per_s_trainers) is not drawn from these rows.
        data = self.write_input("scaling.jsonl",
                                ps_scaling_rows(with_bound=False, servers=(1, 2)))
        out = os.path.join(self.dir.name, "svg")
        result = self.run_script(data, "-o", out)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(sorted(os.listdir(out)), ["ps_scaling.svg"])
        self.assertIn("no rows for the parameter-server samples/s figure; skipped",
                      result.stderr)
        legend = svg_comments(os.path.join(out, "ps_scaling.svg"))
        self.assertIn("1 server", legend)
        self.assertIn("2 servers", legend)
        self.assertNotIn("4 servers", legend)
        self.assertFalse(any("bound" in t for t in legend), legend)
        for tick in ("1", "2", "4", "8", "16"):
            self.assertIn(tick, legend)

    def test_input_without_rows_is_refused(self):
        data = self.write_input("empty.jsonl", [], extra_lines=["no figures here"])
        result = self.run_script(data, "-o", os.path.join(self.dir.name, "svg"))
        self.assertNotEqual(result.returncode, 0)
        self.assertIn("no gradwire-bench rows in " + data, result.stderr)

    def test_a_broken_json_line_is_named(self):
        data = self.write_input("broken.jsonl", ps_rows(), extra_lines=['{"metric": "x", '])
        result = self.run_script(data, "-o", os.path.join(self.dir.name, "svg"))
        self.assertNotEqual(result.returncode, 0)
        self.assertIn(f"plot-bench: {data}:1: not valid JSON", result.stderr)


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.path.isfile(sys.argv[1]):
        sys.exit("usage: plot_bench_test.py PATH_TO_plot-bench.py")
    SCRIPT = sys.argv.pop(1)
    try:
        import matplotlib  # noqa: F401  (only whether it can be imported)
    except ImportError as e:
        print(f"skipped: {sys.executable} cannot import matplotlib ({e}); "
              "scripts/install-deps.sh --bench installs it")
        sys.exit(77)
    sys.exit(0 if unittest.main(exit=False, verbosity=2).result.wasSuccessful() else 1)
