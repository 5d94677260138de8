#!/usr/bin/env python3
"""Dispatch from Python, side by side with the Rust client and a pure-grpcio client, in one run.

Starts one npud on the emulator (a private LocalDaemon) and measures, against it, the same
design (the emulator's ``noop``: three 4 KiB buffers, no device work) on tensors shared by fd:

- unary dispatch, per-call latency: the ``npud`` package, the Rust client (npu-client, through
  the ``npud-python-bench`` binary), and ``examples/python/raw_client.py`` (grpcio);
- pipelined dispatch, time per dispatch with DEPTH in flight: the package and the Rust client.

Then the ratios the goals are stated in: Python unary p50 <= 1.3x Rust's; Python pipelined per
dispatch <= 2x Rust's. ``--rounds`` measures the rows that many times, alternating Rust and
Python, and reports each round's ratios and their median (a loaded machine moves single
rounds). Build everything in release first (``--bin`` names one binary, so npud's are built by
their own command)::

    cargo build --release -p npud --bins
    cargo build --release -p npu-python --bin npud-python-bench
    pip install ./crates/npu-python          # (maturin: a release build of the package)
    python3 crates/npu-python/bench/bench.py --target target/release --rounds 3
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import subprocess
import sys
import time

import numpy as np

import npud

REPO = pathlib.Path(__file__).resolve().parents[3]


def pct(sorted_ns: list[int], p: float) -> int:
    return sorted_ns[round((len(sorted_ns) - 1) * p)]


def unary(call, n: int) -> dict[str, int]:
    for _ in range(n // 10 + 10):
        call()
    lat = []
    clock = time.perf_counter_ns
    for _ in range(n):
        t0 = clock()
        call()
        lat.append(clock() - t0)
    lat.sort()
    return {"unary_p50_ns": pct(lat, 0.5), "unary_p90_ns": pct(lat, 0.9),
            "unary_p99_ns": pct(lat, 0.99)}


def python_rows(address: str, n: int, piped: int, depth: int) -> dict[str, int]:
    c = npud.Client(address)
    p = npud.Program.emulated("noop", 4096, generation=c.generation)
    t = [c.alloc(4096, np.uint8) for _ in range(3)]
    out = unary(lambda: c.dispatch(p, *t), n)
    pl = c.pipeline(depth)
    for _ in range(depth * 2):
        pl.submit(p, *t)
    pl.finish()
    t0 = time.perf_counter_ns()
    for _ in range(piped):
        pl.submit(p, *t)
    done = pl.finish()
    total = time.perf_counter_ns() - t0
    assert len(done) == piped and all(d.error is None for d in done)
    out["pipelined_ns_per_dispatch"] = total // piped
    c.close()
    return out


def grpcio_rows(address: str, n: int) -> dict[str, int]:
    spec = importlib.util.spec_from_file_location(
        "raw_client", REPO / "examples" / "python" / "raw_client.py")
    raw = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(raw)
    s = raw.Session(address.removeprefix("unix:"), "bench-grpcio")
    p = npud.Program.emulated("noop", 4096, generation="npu2")
    prog = s.register_program(p.pdi, p.insts, "noop")
    tensors = [raw.shared_tensor(s, 4096) for _ in range(3)]
    ids = [tid for tid, _ in tensors]
    out = unary(lambda: s.dispatch(prog, ids), n)
    for _, m in tensors:
        m.close()
    s.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default=str(REPO / "target" / "release"),
                    help="the build directory holding npud and npud-python-bench")
    ap.add_argument("--iterations", type=int, default=5000, help="unary dispatches per row")
    ap.add_argument("--pipelined", type=int, default=20000, help="dispatches in pipelined rows")
    ap.add_argument("--depth", type=int, default=16, help="dispatches in flight")
    ap.add_argument("--rounds", type=int, default=1, help="measure the rows this many times, "
                    "alternating Rust and Python (the last round's rows are printed)")
    ap.add_argument("--json", action="store_true", help="print JSON")
    a = ap.parse_args()
    target = pathlib.Path(a.target)
    d = npud.LocalDaemon(str(target / "npud"), tcp=False)
    rounds = []
    try:
        for _ in range(max(1, a.rounds)):
            rust = json.loads(subprocess.run(
                [str(target / "npud-python-bench"), d.address, str(a.iterations),
                 str(a.pipelined), str(a.depth)], check=True, capture_output=True, text=True,
                timeout=600).stdout)
            py = python_rows(d.address, a.iterations, a.pipelined, a.depth)
            rounds.append((py["unary_p50_ns"] / rust["unary_p50_ns"],
                           py["pipelined_ns_per_dispatch"] / rust["pipelined_ns_per_dispatch"]))
        grpcio = grpcio_rows(d.address, a.iterations)
    finally:
        d.stop()
    median = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    report = {
        "rust": rust,
        "python": py,
        "grpcio": grpcio,
        "ratios": {
            "python_unary_p50_over_rust": py["unary_p50_ns"] / rust["unary_p50_ns"],
            "grpcio_unary_p50_over_rust": grpcio["unary_p50_ns"] / rust["unary_p50_ns"],
            "python_pipelined_over_rust":
                py["pipelined_ns_per_dispatch"] / rust["pipelined_ns_per_dispatch"],
        },
        "rounds": [{"python_unary_p50_over_rust": u, "python_pipelined_over_rust": p}
                   for u, p in rounds],
        "median_of_rounds": {"python_unary_p50_over_rust": median([u for u, _ in rounds]),
                             "python_pipelined_over_rust": median([p for _, p in rounds])},
        "iterations": a.iterations,
        "pipelined": a.pipelined,
        "depth": a.depth,
    }
    if a.json:
        print(json.dumps(report, indent=2))
        return 0
    us = lambda ns: f"{ns / 1000:8.1f}"  # noqa: E731
    print(f"{'row':<44}{'p50 µs':>9}{'p90 µs':>9}{'p99 µs':>9}")
    for name, r in [("unary dispatch, npud package (Python)", py),
                    ("unary dispatch, npu-client (Rust)", rust),
                    ("unary dispatch, raw_client.py (grpcio)", grpcio)]:
        print(f"{name:<44}{us(r['unary_p50_ns'])} {us(r['unary_p90_ns'])} {us(r['unary_p99_ns'])}")
    print(f"{'pipelined, depth ' + str(a.depth) + ', per dispatch':<44}"
          f"Python {us(py['pipelined_ns_per_dispatch'])}   Rust {us(rust['pipelined_ns_per_dispatch'])}")
    r = report["ratios"]
    print(f"Python/Rust unary p50: {r['python_unary_p50_over_rust']:.2f}x (goal <= 1.3x); "
          f"grpcio/Rust: {r['grpcio_unary_p50_over_rust']:.2f}x; "
          f"Python/Rust pipelined: {r['python_pipelined_over_rust']:.2f}x (goal <= 2x)")
    if len(rounds) > 1:
        print("rounds (unary, pipelined): " + ", ".join(f"{u:.2f}x/{p:.2f}x" for u, p in rounds)
              + f"; median {report['median_of_rounds']['python_unary_p50_over_rust']:.2f}x/"
              f"{report['median_of_rounds']['python_pipelined_over_rust']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
