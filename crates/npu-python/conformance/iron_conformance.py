#!/usr/bin/env python3
"""Runs IRON's own host scripts and host-runtime tests on npud, through one ``npud.iron.install()``.

    python3 crates/npu-python/conformance/iron_conformance.py /path/to/mlir-aie [--era NAME]

It assembles IRON's pure-Python host packages (``python/utils`` as ``aie.utils``, ``python/iron``
as ``aie.iron``) from the mlir-aie checkout into a temporary directory, with
``iron_stubs.py`` as its ``sitecustomize`` (the stand-ins for what needs compiled MLIR, listed
in that file, and the one ``npud.iron.install()``); starts a private npud on the emulator;
writes the emulated designs the scripts load with ``npuctl emu-design``; runs each example host
script unchanged, and IRON's host-runtime tests with pytest; and prints a table of script, era,
result and, for what did not run, why. The exit status is 1 when anything failed.

Needs: the ``npud`` package (with its daemon and npuctl built: ``cargo build -p npud --bins -p
npu-client``), numpy, ``ml_dtypes`` and pytest in the interpreter that runs this script. No IRON
code is kept: the temporary directory goes when the run ends (``--keep`` keeps it).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Callable

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[2]


@dataclasses.dataclass
class Case:
    """One host script (or pytest file) of mlir-aie, as the checkout lays it out."""

    name: str
    path: str  # relative to the checkout
    argv: Callable[[dict[str, pathlib.Path]], list[str]]
    # Emulated designs the case loads from files: label -> (kernel, n, dtype, scalar).
    designs: dict[str, tuple[str, int, str, int]] = dataclasses.field(default_factory=dict)
    pytest: bool = False
    # Tests of a pytest file that cannot run on npud, with why.
    deselect: dict[str, str] = dataclasses.field(default_factory=dict)
    # Text the script must hold for this case to apply (an option it parses, say); a script
    # without any of IRON's runtime entry points is a design generator in that tree.
    needs: tuple[str, ...] = ()


def _x(d: pathlib.Path) -> str:
    return str(d / "final.xclbin")


def _i(d: pathlib.Path) -> str:
    return str(d / "insts.bin")


CASES = [
    # The newer era (IRON's @iron.jit examples and their bring-your-own-artifacts mode).
    Case("passthrough_kernel (JIT)", "programming_examples/basic/passthrough_kernel/"
         "passthrough_kernel.py", lambda d: ["-w", "1", "-n", "2"], needs=("iron.jit",)),
    Case("vector_scalar_add (JIT)", "programming_examples/basic/vector_scalar_add/"
         "vector_scalar_add.py", lambda d: [], needs=("iron.jit",)),
    Case("vector_scalar_add (from xclbin + insts)", "programming_examples/basic/"
         "vector_scalar_add/vector_scalar_add.py",
         lambda d: ["--from-xclbin", _x(d["vsa"]), "--from-insts", _i(d["vsa"])],
         designs={"vsa": ("vector_scalar_add", 1024, "i32", 1)}, needs=("--from-xclbin",)),
    Case("vector_vector_add (JIT)", "programming_examples/basic/vector_vector_add/"
         "vector_vector_add.py", lambda d: ["-n", "1024"]),
    Case("algorithms/transform (JIT)", "programming_examples/algorithms/transform.py",
         lambda d: []),
    Case("algorithms/transform_binary (JIT)", "programming_examples/algorithms/"
         "transform_binary.py", lambda d: []),
    Case("algorithms/for_each (JIT; in place)", "programming_examples/algorithms/for_each.py",
         lambda d: []),
    Case("algorithms/transform_parallel (JIT)", "programming_examples/algorithms/"
         "transform_parallel.py", lambda d: []),
    Case("algorithms/transform_parallel_binary (JIT)", "programming_examples/algorithms/"
         "transform_parallel_binary.py", lambda d: []),
    Case("vector_vector_mul (JIT)", "programming_examples/basic/vector_vector_mul/"
         "vector_vector_mul.py", lambda d: [], needs=("iron.jit",)),
    # basic/vector_scalar_mul: c = a * factor, the factor an i32 in a one-element buffer. The
    # JIT passes (a, c, factor); the host script's order changed in 2026 (the tree's design
    # changed with it), so the emulated design standing for aiecc's output follows the script.
    Case("vector_scalar_mul (JIT)", "programming_examples/basic/vector_scalar_mul/"
         "vector_scalar_mul.py", lambda d: [], needs=("iron.jit",)),
    Case("vector_scalar_mul_jit.py (JIT)", "programming_examples/basic/vector_scalar_mul/"
         "vector_scalar_mul_jit.py", lambda d: []),
    Case("vector_scalar_mul test.py (xclbin + insts; in, out, factor)",
         "programming_examples/basic/vector_scalar_mul/test.py",
         lambda d: ["--xclbin", _x(d["vsm"]), "--instr", _i(d["vsm"]), "--kernel", "MLIR_AIE",
                    "--in1-size", "8192", "--in2-size", "4", "--out-size", "8192"],
         designs={"vsm": ("vector_scale", 4096, "i16", 0)}, needs=("[in1, out, in2]",)),
    Case("vector_scalar_mul test.py (xclbin + insts; in, factor, out)",
         "programming_examples/basic/vector_scalar_mul/test.py",
         lambda d: ["--xclbin", _x(d["vsm_mid"]), "--instr", _i(d["vsm_mid"]), "--kernel",
                    "MLIR_AIE", "--in1-size", "8192", "--in2-size", "4", "--out-size", "8192"],
         designs={"vsm_mid": ("vector_scale_mid", 4096, "i16", 0)}, needs=("[in1, in2, out]",)),
    Case("test_chain_hrx.py (IRON's chain tests)", "test/python/npu-hrx/test_chain_hrx.py",
         lambda d: [], pytest=True,
         deselect={"test_chain_survives_executable_eviction":
                   "builds IRON's HRX runtime itself (CachedHRXRuntime over libhrx), not the "
                   "default runtime"}),
    # The older era (host scripts that load aiecc's artifacts, and the older JIT).
    Case("passthrough_kernel test.py (xclbin + insts)", "programming_examples/basic/"
         "passthrough_kernel/test.py",
         lambda d: ["--xclbin", _x(d["pt"]), "--instr", _i(d["pt"]), "--kernel", "MLIR_AIE",
                    "--in1-size", "4096", "--out-size", "4096"],
         designs={"pt": ("passthrough", 4096, "u8", 0)}),
    # IRON's runtime test: u32 out = in + 41 with an unused second input.
    Case("test/npu-xrt/add_one_objFifo/test.py (xclbin + insts)",
         "test/npu-xrt/add_one_objFifo/test.py",
         lambda d: ["--xclbin", _x(d["a41"]), "--instr", _i(d["a41"]), "--kernel", "MLIR_AIE"],
         designs={"a41": ("vector_scalar_add_unused", 64, "u32", 41)}),
    Case("passthrough_pykernel test.py (xclbin + insts)", "programming_examples/basic/"
         "passthrough_pykernel/test.py",
         lambda d: ["--xclbin", _x(d["pt"]), "--instr", _i(d["pt"]), "--kernel", "MLIR_AIE",
                    "-s", "4096"],
         designs={"pt": ("passthrough", 4096, "u8", 0)}),
]

# Scripts of mlir-aie that need what the emulator does not do: (script and arguments, text the
# script must hold for the row to apply, why). Listed in the table when the checkout's script
# is a host script holding that text.
CANNOT = [
    ("programming_examples/basic/passthrough_kernel/passthrough_kernel.py --trace_size 8192",
     ("iron.jit",), "trace capture: npud does not capture traces"),
    ("programming_examples/basic/passthrough_kernel/test.py -t 8192", (),
     "trace capture: npud does not capture traces"),
    ("test/python/npu-xrt/test_tensor_subview_device.py", (),
     "constructs XRTTensor (pyxrt) itself"),
    ("test/python/npu-xrt/test_cached_xrt_runtime.py", (),
     "tests IRON's CachedXRTRuntime (pyxrt) itself"),
]


def era_of(root: pathlib.Path) -> str:
    """``"newer"`` (IRON's tensor base is ``NpuTensor``) or ``"older"`` (``Tensor``)."""
    tc = root / "python/utils/hostruntime/tensor_class.py"
    text = tc.read_text(encoding="utf-8") if tc.is_file() else ""
    return "newer" if "class NpuTensor" in text else "older"


def commit_of(root: pathlib.Path) -> str:
    try:
        return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], check=True,
                              capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (not a git checkout)"


def assemble(root: pathlib.Path, into: pathlib.Path) -> None:
    """IRON's pure-Python host packages as ``aie.utils`` and ``aie.iron``, and the stubs."""
    aie = into / "aie"
    aie.mkdir(parents=True)
    (aie / "__init__.py").write_text("", encoding="utf-8")
    # aie's own pure-Python modules (the older tree's aie.util, say).
    for f in (root / "python").glob("*.py"):
        if f.name != "__init__.py":
            shutil.copy(f, aie / f.name)
    ignore = shutil.ignore_patterns("*.in", "*.cpp", "CMakeLists.txt", "__pycache__")
    shutil.copytree(root / "python/utils", aie / "utils", ignore=ignore)
    for pkg in ("iron", "helpers"):
        if (root / "python" / pkg).is_dir():
            shutil.copytree(root / "python" / pkg, aie / pkg, ignore=ignore)
    shutil.copy(HERE / "iron_stubs.py", into / "sitecustomize.py")


def binary(name: str, given: str | None) -> str:
    if given:
        return given
    for profile in ("debug", "release"):
        p = REPO / "target" / profile / name
        if p.is_file():
            return str(p)
    sys.exit(f"no {name} binary: build it (cargo build -p npud --bins -p npu-client) or pass "
             f"--{name}")


def emu_design(npuctl: str, addr: str, out: pathlib.Path, kernel: str, n: int, dtype: str,
               scalar: int) -> None:
    cmd = [npuctl, "--addr", addr, "emu-design", kernel, "--n", str(n), "--dtype", dtype,
           "--out", str(out)]
    if kernel.startswith("vector_scalar_add"):
        cmd += ["--scalar", str(scalar)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    # aiecc leaves the PDI beside the xclbin; npud loads the PDI (the xclbin is a stand-in).
    (out / "final.xclbin").write_bytes(b"npud loads main.pdi beside this file")


# What makes a script a host script (it runs a design), not a design generator (it prints one).
RUNTIME_MARKERS = ("DefaultNPURuntime", "iron.jit", "NPUKernel", "create_npu_kernel",
                   "run_test", "load_and_run", "pytest")


def applies(c: Case, root: pathlib.Path) -> str | None:
    """Why the case does not apply to this checkout, or None when it does."""
    script = root / c.path
    if not script.is_file():
        return "not in this checkout"
    text = script.read_text(encoding="utf-8", errors="replace")
    if not any(m in text for m in RUNTIME_MARKERS):
        return "a design generator in this checkout, not a host script"
    missing = [n for n in c.needs if n not in text]
    if missing:
        return f"this checkout's script has no {', '.join(missing)}"
    return None


def run_case(c: Case, root: pathlib.Path, site: pathlib.Path, work: pathlib.Path,
             env: dict[str, str], designs: dict[str, pathlib.Path],
             timeout: float) -> tuple[str, str]:
    script = root / c.path
    why = applies(c, root)
    if why is not None:
        return "SKIP", why
    argv = c.argv(designs)
    if c.pytest:
        cmd = [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider",
               str(script)]
        if c.deselect:
            cmd += ["-k", " and ".join(f"not {t}" for t in c.deselect)]
    else:
        cmd = [sys.executable, str(script), *argv]
    cwd = work / re.sub(r"\W+", "_", c.name)
    cwd.mkdir(exist_ok=True)
    # IRON's JIT caches under ~/.npu: one home per case, as the stand-in designs' MLIR is alike.
    env = dict(env, HOME=str(cwd))
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return "FAIL", f"timed out after {timeout:.0f} s"
    out = p.stdout + p.stderr
    if p.returncode == 0 and (c.pytest or re.search(r"PASS", out)):
        if c.pytest:
            m = re.search(r"(\d+) passed", out)
            extra = "; ".join(f"{t} not run: {w}" for t, w in c.deselect.items())
            return "PASS", f"{m.group(1) if m else '?'} passed" + (f"; {extra}" if extra else "")
        return "PASS", ""
    tail = [line for line in out.strip().splitlines() if line.strip()][-3:]
    return "FAIL", f"exit {p.returncode}: " + " | ".join(tail)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mlir_aie", type=pathlib.Path, help="an mlir-aie checkout")
    ap.add_argument("--era", help="the name printed for this checkout (default: its IRON "
                    "tensor base and commit)")
    ap.add_argument("--commit", help="the checkout's commit, when it is not a git checkout "
                    "(a tree extracted from a repository)")
    ap.add_argument("--npud", help="the npud binary (default: target/{debug,release}/npud)")
    ap.add_argument("--npuctl", help="the npuctl binary (default: target/{debug,release}/npuctl)")
    ap.add_argument("--only", help="run only the cases whose name contains this")
    ap.add_argument("--timeout", type=float, default=180.0, help="seconds per case")
    ap.add_argument("--keep", action="store_true", help="keep the assembled directory")
    o = ap.parse_args()

    import npud  # the package under test, in this interpreter

    root = o.mlir_aie.resolve()
    if not (root / "python/utils/__init__.py").is_file():
        sys.exit(f"{root} is not an mlir-aie checkout (no python/utils/__init__.py)")
    commit = o.commit or commit_of(root)
    kind = era_of(root)
    known = re.fullmatch(r"[0-9a-f]{40}", commit) is not None
    era = o.era or (f"{kind} ({commit[:12]})" if known else kind)
    npud_bin, npuctl = binary("npud", o.npud), binary("npuctl", o.npuctl)

    tmp = pathlib.Path(tempfile.mkdtemp(prefix="npud-iron-conformance-"))
    rows: list[tuple[str, str, str, str]] = []
    daemon = None
    try:
        site = tmp / "site"
        assemble(root, site)
        daemon = npud.LocalDaemon(npud_bin, tcp=False)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(site)] + [p for p in sys.path if p and "site-packages" in p])
        env["NPUD_ADDR"] = daemon.address
        env["NPUD_CONFORMANCE_NPUCTL"] = npuctl
        env["NPUD_CONFORMANCE_CACHE"] = str(tmp / "jit-cache")
        env.pop("NPUD_IRON", None)
        if not (root / "python/utils/trace/events/aie2.py").is_file() and \
                (root / "python/utils/trace/events").is_dir() and \
                "from . import aie2" in (root / "python/utils/trace/events/__init__.py").read_text(
                    encoding="utf-8"):
            env["NPUD_CONFORMANCE_STUB_TRACE"] = "1"
        designs: dict[str, pathlib.Path] = {}
        work = tmp / "work"
        work.mkdir()
        for c in CASES:
            if o.only and o.only not in c.name:
                continue
            if applies(c, root) is not None:
                rows.append((c.name, era, "SKIP", applies(c, root) or ""))
                continue
            for label, (kernel, n, dtype, scalar) in c.designs.items():
                if label not in designs:
                    d = tmp / "designs" / label
                    emu_design(npuctl, daemon.address, d, kernel, n, dtype, scalar)
                    designs[label] = d
            result, why = run_case(c, root, site, work, env, designs, o.timeout)
            rows.append((c.name, era, result, why))
        for path, needs, why in CANNOT:
            if applies(Case(path, path.split(" ")[0], lambda d: [], needs=needs), root) is None:
                rows.append((path, era, "CANNOT", why))
    finally:
        if daemon is not None:
            daemon.stop()
        if o.keep:
            print(f"kept {tmp}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)

    print(f"mlir-aie {root} at {commit}")
    w = [max(len(r[i]) for r in rows + [("script", "era", "result", "")]) for i in range(3)]
    print(f"{'script':<{w[0]}}  {'era':<{w[1]}}  {'result':<{w[2]}}  why")
    for r in rows:
        print(f"{r[0]:<{w[0]}}  {r[1]:<{w[1]}}  {r[2]:<{w[2]}}  {r[3]}")
    return 1 if any(r[2] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
