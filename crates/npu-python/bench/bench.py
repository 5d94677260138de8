#!/usr/bin/env python3
"""Dispatch from Python, side by side with the Rust client and a pure-grpcio client, in one run.

Starts one npud on the emulator (a private LocalDaemon) and measures, against it, the same
design (the emulator's ``noop``: three 4 KiB buffers, no device work) on tensors shared by fd:

- unary dispatch, per-call latency: the ``npud`` package, the Rust client (npu-client, through
  the ``npud-python-bench`` binary), and ``examples/python/raw_client.py`` (grpcio);
- pipelined dispatch, time per dispatch with DEPTH in flight: the package and the Rust client.

Then the ratios the goals are stated in: Python unary p50 <= 1.3x Rust's; Python pipelined per
dispatch <= 2x Rust's. This machine's speed moves between minutes, so the two sides are measured
side by side: the Rust client runs as one long-lived process answering a command at a time, and
each of ``--rounds`` rounds splits its rows into ``--slices`` slices, Rust and Python taking turns
(who goes first alternates). A slice's ratio compares rows measured seconds apart; a round's
ratio is the median of its slices'; the report gives each round's and their median. Build everything in release first (``--bin`` names one binary, so npud's are built by
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


class PythonRows:
    """The Python side: one client, three tensors and one pipeline, kept across slices."""

    def __init__(self, address: str, depth: int):
        self.c = npud.Client(address)
        self.p = npud.Program.emulated("noop", 4096, generation=self.c.generation)
        self.t = [self.c.alloc(4096, np.uint8) for _ in range(3)]
        self.pl = self.c.pipeline(depth)
        self.pipelined(depth * 2)

    def unary(self, n: int) -> dict[str, int]:
        return unary(lambda: self.c.dispatch(self.p, *self.t), n)

    def pipelined(self, n: int) -> dict[str, int]:
        t0 = time.perf_counter_ns()
        for _ in range(n):
            self.pl.submit(self.p, *self.t)
        done = self.pl.finish()
        total = time.perf_counter_ns() - t0
        assert len(done) == n and all(d.error is None for d in done)
        return {"pipelined_ns_per_dispatch": total // n}

    def close(self) -> None:
        self.c.close()


class RustRows:
    """The Rust side: ``npud-python-bench``, one command a line, one JSON line back."""

    def __init__(self, binary: pathlib.Path, address: str, depth: int):
        self.proc = subprocess.Popen([str(binary), address, str(depth)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)

    def ask(self, line: str) -> dict[str, int]:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        out = self.proc.stdout.readline()
        if not out:
            raise RuntimeError(f"npud-python-bench ended (exit {self.proc.wait(10)}) on {line!r}")
        return json.loads(out)

    def close(self) -> None:
        self.proc.stdin.close()
        if self.proc.wait(60) != 0:
            raise RuntimeError(f"npud-python-bench exited {self.proc.returncode}")


def median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


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
    ap.add_argument("--rounds", type=int, default=3, help="measure the rows this many times "
                    "(the last round's rows are printed)")
    ap.add_argument("--slices", type=int, default=5, help="split each round's rows into this "
                    "many slices, alternating Rust and Python; a round's ratio is the median of "
                    "its slices' ratios")
    ap.add_argument("--json", action="store_true", help="print JSON")
    a = ap.parse_args()
    target = pathlib.Path(a.target)
    d = npud.LocalDaemon(str(target / "npud"), tcp=False)
    rounds = []
    try:
        rs = RustRows(target / "npud-python-bench", d.address, a.depth)
        py = PythonRows(d.address, a.depth)
        n, m = max(1, a.iterations // a.slices), max(a.depth, a.pipelined // a.slices)
        for _ in range(max(1, a.rounds)):
            unary_r, piped_r = [], []
            rows: dict[str, list[dict[str, int]]] = {"rust": [], "python": []}
            for i in range(a.slices):
                # Rust first in even slices, Python first in odd ones: neither side always
                # meets the machine as the other left it.
                order = [("rust", rs), ("python", py)]
                for side, who in order if i % 2 == 0 else order[::-1]:
                    r = who.ask(f"unary {n}") if side == "rust" else who.unary(n)
                    r |= who.ask(f"pipelined {m}") if side == "rust" else who.pipelined(m)
                    rows[side].append(r)
                unary_r.append(rows["python"][-1]["unary_p50_ns"] / rows["rust"][-1]["unary_p50_ns"])
                piped_r.append(rows["python"][-1]["pipelined_ns_per_dispatch"]
                               / rows["rust"][-1]["pipelined_ns_per_dispatch"])
            rounds.append((median(unary_r), median(piped_r)))
            # The rows printed: each side's median slice (by unary p50).
            rust = sorted(rows["rust"], key=lambda r: r["unary_p50_ns"])[a.slices // 2]
            pyr = sorted(rows["python"], key=lambda r: r["unary_p50_ns"])[a.slices // 2]
        py.close()
        rs.close()
        grpcio = grpcio_rows(d.address, a.iterations)
    finally:
        d.stop()
    py = pyr
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
    m = report["median_of_rounds"]
    # The goals are read on the median of the rounds' ratios (each a median of side-by-side
    # slices); the rows above are the last round's median slices, one moment of the run.
    print(f"Python/Rust unary p50: {m['python_unary_p50_over_rust']:.2f}x (goal <= 1.3x); "
          f"Python/Rust pipelined: {m['python_pipelined_over_rust']:.2f}x (goal <= 2x); "
          f"medians of {len(rounds)} rounds")
    print("rounds (unary, pipelined): " + ", ".join(f"{u:.2f}x/{p:.2f}x" for u, p in rounds)
          + f"; the rows above: {r['python_unary_p50_over_rust']:.2f}x/"
          f"{r['python_pipelined_over_rust']:.2f}x; grpcio/Rust: "
          f"{r['grpcio_unary_p50_over_rust']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
