"""The IRON adapter, driven the way IRON drives a host runtime.

IRON itself is not installed here. Scripts run in their own interpreter with
``tests/iron_standin`` (IRON's host interface: ``NpuTensor``, ``HostRuntime``,
``_DefaultNPURuntime``, ``set_tensor_class``, ``NPUKernel``) on their path, so ``npud.iron``
subclasses its base classes as it does IRON's, and each script checks what IRON checks. The
conformance script (``conformance/iron_conformance.py``) runs IRON's own code; see the README.
Without the stand-in, the classes stand alone (the tests at the end)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import npud
import npud.iron as iron

N = 1024
STANDIN = pathlib.Path(__file__).resolve().parent / "iron_standin"


def run_py(code: str, daemon, *, standin: bool = True, args: list[str] | None = None,
           timeout: float = 120, env: dict[str, str] | None = None) -> str:
    """Runs ``code`` as a script in a fresh interpreter against ``daemon``; returns its stdout
    (the test fails with its output when it exits non-zero)."""
    e = dict(os.environ, NPUD_ADDR=daemon.address, **(env or {}))
    paths = [p for p in sys.path if p]
    e["PYTHONPATH"] = os.pathsep.join(([str(STANDIN)] if standin else []) + paths)
    e.pop("NPUD_IRON", None)
    argv = args if args is not None else ["-c", textwrap.dedent(code)]
    p = subprocess.run([sys.executable, *argv],
                       capture_output=True, text=True, timeout=timeout, env=e)
    assert p.returncode == 0, f"exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


@pytest.fixture
def design(tmp_path, client):
    npud.Program.write_emulated(tmp_path, "vector_scalar_add", N, generation=client.generation,
                                dtype="i32", scalar=1)
    (tmp_path / "final.xclbin").write_bytes(b"xclbin stand-in: npud reads main.pdi beside it")
    return tmp_path


def test_install_after_scripts_bound_the_runtime(design, daemon):
    # A script that bound `DefaultNPURuntime` (None: no XRT here) before install gets npud's,
    # get_current_device reads _DefaultNPURuntime, and IRON's checks take npud's classes.
    run_py(f"""
        import numpy as np
        import aie.utils as u
        from aie.utils import DefaultNPURuntime, NPUKernel
        from aie.utils.hostruntime.tensor_class import NpuTensor
        from aie.utils.hostruntime.hostruntime import HostRuntime, HostRuntimeError
        assert DefaultNPURuntime is None
        import npud.iron
        rt = npud.iron.install()
        assert npud.iron.iron_version() == "NpuTensor"
        assert DefaultNPURuntime is rt and u.DefaultNPURuntime is rt
        assert u._DefaultNPURuntime is rt and isinstance(rt, HostRuntime)
        assert type(u.get_current_device()).__name__ == rt.client.generation.upper()
        assert u.ensure_current_device() is not None
        a = u.tensor(np.arange({N}, dtype=np.int32), dtype=np.int32)
        b = u.zeros(({N},), dtype=np.int32)
        assert isinstance(a, NpuTensor) and isinstance(a, npud.iron.NpudTensor)
        k = NPUKernel("{design}/final.xclbin", "{design}/insts.bin")
        handle, result = k(a, b)
        assert result.is_success() and result.npu_time > 0
        assert (b.numpy() == np.arange({N}) + 1).all()
        assert rt.run_test(k, [a, b], {{1: np.arange({N}) + 1}}) == 0
        small = u.zeros((4,), dtype=np.int32)
        try:
            rt.run(handle, [a, small])
        except HostRuntimeError as e:
            assert isinstance(e, npud.InvalidArgument), type(e).__mro__
            assert "args[1]" in str(e), e
        else:
            raise AssertionError("a too-small output ran")
        bad = rt.run(handle, [a, small], fail_on_error=False)
        assert not bad.is_success() and isinstance(bad.error, HostRuntimeError)
        print("ok")
        """, daemon)


def test_a_runtime_object_bound_before_install_runs_on_npud(design, daemon):
    # Where IRON made its XRT runtime and a script bound it, install() makes that object
    # delegate to npud's runtime.
    run_py(f"""
        import numpy as np
        from aie.utils import DefaultNPURuntime, NPUKernel, tensor, zeros
        assert type(DefaultNPURuntime).__name__ == "CachedXRTRuntime"
        import npud.iron
        rt = npud.iron.install()
        a = tensor(np.arange({N}, dtype=np.int32), dtype=np.int32)
        b = zeros(({N},), dtype=np.int32)
        DefaultNPURuntime.load_and_run(NPUKernel("{design}/final.xclbin", "{design}/insts.bin"),
                                       [a, b])
        assert (b.numpy() == np.arange({N}) + 1).all()
        assert type(DefaultNPURuntime.device()) is type(rt.device())
        print("ok")
        """, daemon, env={"IRON_STANDIN_XRT": "1"})


def test_install_before_aie_utils_is_imported(design, daemon, tmp_path):
    # `python -m npud.iron SCRIPT`: npud is installed the moment the script imports aie.utils,
    # so the script's own `from aie.utils import DefaultNPURuntime` binds npud's runtime.
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        import numpy as np
        from aie.utils import DefaultNPURuntime, NPUKernel, tensor, zeros
        assert type(DefaultNPURuntime).__name__ == "NpudRuntime", DefaultNPURuntime
        a = tensor(np.arange({N}, dtype=np.int32), dtype=np.int32)
        b = zeros(({N},), dtype=np.int32)
        NPUKernel("{design}/final.xclbin", "{design}/insts.bin")(a, b)
        assert (b.numpy() == np.arange({N}) + 1).all()
        print("ran", sys.argv[1:])
        """))
    out = run_py("", daemon, args=["-m", "npud.iron", str(script), "x", "--y"])
    assert "ran ['x', '--y']" in out


def test_tensors_as_irons(daemon):
    # Rows 4-7: factories keep their dtype and take IRON's signatures; members IRON's code reads.
    run_py("""
        import numpy as np
        import aie.utils as u
        import npud.iron
        npud.iron.install()
        t = u.arange(0.0, 1.0, 0.25)
        assert t.dtype == np.float32 and list(t.numpy()) == [0.0, 0.25, 0.5, 0.75], t
        assert u.arange(3).dtype == np.int64
        z = u.zeros(4, 4, dtype=np.int16)
        assert z.shape == (4, 4) and z.dtype == np.int16
        assert u.ones((2, 3)).dtype == np.float32 and u.ones((2, 3)).numpy().sum() == 6
        f = u.full((3,), 7, dtype=np.int32)
        assert list(f.numpy()) == [7, 7, 7] and f.dtype == np.int32
        r = npud.iron.NpudTensor.randint(0, 5, (8,), dtype=np.int16)
        assert r.dtype == np.int16 and r.numpy().max() < 5
        q = npud.iron.NpudTensor.rand(2, 2, dtype=np.float32)
        assert q.dtype == np.float32 and (q.numpy() < 1).all()
        a = u.zeros((256,), dtype=np.int32)
        assert a.numel() == 256 and a.element_size == 4 and a.nbytes == 1024
        assert npud.iron.NpudTensor.FOLDS_DDR_ADDR_OFFSET is True
        v = a.subview(512, (128,))
        assert v.is_view and v.base is a and v.storage_offset == 512 and not a.is_view
        with v.mutate() as arr:
            arr[:] = 9
        assert (a.numpy()[128:] == 9).all() and (a.numpy()[:128] == 0).all()
        with a.overwrite() as arr:
            arr[:] = 1
        assert (v.numpy() == 1).all()
        print("ok")
        """, daemon)


def test_device_checks_insts_and_fewer_buffers(tmp_path, daemon, client):
    # Row 8: a design for another device is refused; evict_context, read_insts_binary.
    # Row 11: a design that declares more buffers than the script passes (IRON's passthrough
    # leaves out the trace slot) runs, as XRT runs it.
    npud.Program.write_emulated(tmp_path, "passthrough", 4096, generation=client.generation)
    (tmp_path / "final.xclbin").write_bytes(b"")
    other = "NPU1" if client.generation == "npu2" else "NPU2"
    run_py(f"""
        import numpy as np
        import aie.utils as u
        from aie.iron.device import {other}
        from aie.utils import NPUKernel
        import npud.iron
        rt = npud.iron.install()
        k = NPUKernel("{tmp_path}/final.xclbin", "{tmp_path}/insts.bin")
        assert len(rt.read_insts_binary(__import__("pathlib").Path("{tmp_path}/insts.bin"))) > 0
        rt.evict_context("{tmp_path}/final.xclbin")
        a = u.tensor(np.arange(4096, dtype=np.uint8), dtype=np.uint8)
        b = u.zeros((4096,), dtype=np.uint8)
        k(a, b)  # two of the design's three buffers
        assert (b.numpy() == a.numpy()).all()
        u.set_current_device({other}())
        try:
            rt.load(NPUKernel("{tmp_path}/final.xclbin", "{tmp_path}/insts.bin"))
        except RuntimeError as e:
            assert "not loadable" in str(e), e
        else:
            raise AssertionError("a design for {other} loaded")
        print("ok")
        """, daemon)


def test_subviews_as_dispatch_arguments(design, daemon):
    # A sub-view dispatches as a byte range of its owner's tensor (no copy) where the package
    # has byte ranges; where it has none, the refusal says so rather than running the whole.
    run_py(f"""
        import numpy as np
        import aie.utils as u
        from aie.utils import NPUKernel
        from aie.utils.hostruntime.hostruntime import HostRuntimeError
        import npud, npud.iron
        npud.iron.install()
        k = NPUKernel("{design}/final.xclbin", "{design}/insts.bin")
        big = u.tensor(np.arange(2 * {N}, dtype=np.int32), dtype=np.int32)
        out = u.zeros((2 * {N},), dtype=np.int32)
        a, b = big.subview(4 * {N}, ({N},)), out.subview(0, ({N},))
        try:
            k(a, b)
        except HostRuntimeError as e:
            assert not hasattr(npud, "view_of"), e
            assert "sub-view" in str(e) and "npud.view_of" in str(e), e
        else:
            assert (out.numpy()[:{N}] == np.arange({N}, 2 * {N}) + 1).all()
            assert (out.numpy()[{N}:] == 0).all()
        print("ok")
        """, daemon)


def test_verify_results_counts_references(daemon):
    # Row 12: IRON counts one error per reference that does not match, not per element.
    run_py("""
        import numpy as np
        import aie.utils as u
        import npud.iron
        rt = npud.iron.install()
        a = u.tensor(np.arange(64, dtype=np.int32), dtype=np.int32)
        b = u.tensor(np.arange(64, dtype=np.int32), dtype=np.int32)
        assert rt.verify_results([a, b], {0: np.arange(64), 1: np.arange(64) + 1}) == 1
        assert rt.verify_results([a, b], {0: np.zeros(64), 1: np.zeros(64)}) == 2
        print("ok")
        """, daemon)


def test_load_and_run_keywords_scalars_and_per_call_insts(design, daemon):
    # Row 13: every keyword of load_and_run reaches load and none the run, as IRON's own
    # HostRuntime.load_and_run sends them (the JIT passes a design's tile_size=16 this way; it
    # was refused as a runtime scalar); run's own runtime scalars are refused by name, never
    # dropped (a dispatch carries buffers only); a per-call instruction stream (dispatch_insts,
    # where IRON's DispatchTime values are written) runs with the design's PDI.
    run_py(f"""
        import numpy as np
        import aie.utils as u
        from aie.utils import NPUKernel
        from aie.utils.hostruntime.hostruntime import HostRuntimeError
        import npud, npud.iron
        rt = npud.iron.install()
        seen = {{}}
        load = rt.load
        def spy(k, **kw):
            seen.update(kw)
            return load(k, **kw)
        rt.load = spy
        k = NPUKernel("{design}/final.xclbin", "{design}/insts.bin")
        a = u.tensor(np.arange({N}, dtype=np.int32), dtype=np.int32)
        b = u.zeros(({N},), dtype=np.int32)
        h, r = rt.load_and_run(k, [a, b], tile_size=16)
        assert r.is_success() and seen == {{"tile_size": 16}}, seen
        assert (b.numpy() == np.arange({N}) + 1).all()
        k(a, b, tile_size=16, dtype=np.int32)
        assert seen == {{"tile_size": 16, "dtype": np.int32}}, seen
        try:
            rt.run(h, [a, b], dispatch_scalars=[5])
        except HostRuntimeError as e:
            assert "runtime scalar arguments [5]" in str(e) and "dispatch_insts" in str(e), e
        else:
            raise AssertionError("scalars were dropped")
        try:
            rt.run(h, [a, b], factor=3)
        except HostRuntimeError as e:
            assert "[3]" in str(e), e
        else:
            raise AssertionError("a named scalar was dropped")
        h = rt.load(k)
        other = npud.Program.emulated("vector_scalar_add", {N}, generation=rt.client.generation,
                                      dtype="i32", scalar=7)
        r = rt.run(h, [a, b], dispatch_insts=np.frombuffer(other.insts, dtype=np.uint32))
        assert r.is_success()
        print("ok")
        """, daemon)


def test_full_elf_kernels(tmp_path, npud_bin):
    # Row 10: NPUKernel(elf_path=...) with no xclbin or insts, on a runtime that loads code
    # objects (the emulator's kernel-object profile; an aie2p device).
    npuctl = pathlib.Path(os.environ.get("NPUCTL_BIN") or
                          pathlib.Path(npud_bin).with_name("npuctl"))
    if not npuctl.is_file():
        pytest.skip("no npuctl: set NPUCTL_BIN, or build it beside npud "
                    "(cargo build -p npu-client --bin npuctl)")
    d = npud.LocalDaemon(npud_bin, tcp=False, args=["--emulator-profile", "kernel-object"])
    try:
        elf = tmp_path / "design.elf"
        subprocess.run([str(npuctl), "--addr", d.address, "emu-design", "vector_scalar_add",
                        "--n", str(N), "--format", "full-elf", "--generation", "npu2",
                        "--out", str(elf)], check=True, timeout=60, capture_output=True)
        run_py(f"""
            import numpy as np
            import aie.utils as u
            from aie.utils import NPUKernel
            import npud.iron
            npud.iron.install()
            k = NPUKernel(elf_path="{elf}", kernel_name="main:sequence")
            a = u.tensor(np.arange({N}, dtype=np.int32), dtype=np.int32)
            b = u.zeros(({N},), dtype=np.int32)
            k(a, b)
            assert (b.numpy() == np.arange({N}) + 1).all(), b.numpy()[:4]
            print("ok")
            """, d)
    finally:
        d.stop()


def test_install_without_iron_says_what_to_install(daemon):
    out = run_py("""
        import npud.iron
        try:
            npud.iron.install()
        except npud.iron.IronMissing as e:
            assert isinstance(e, ImportError)
            print(e)
        else:
            raise AssertionError("installed without IRON")
        """, daemon, standin=False)
    assert "pip install mlir_aie" in out and "npud.iron.NpudRuntime" in out, out


def test_twenty_short_scripts_in_a_row(daemon, npud_bin):
    # Sessions are closed at interpreter exit and by the adapter's cleanup: a daemon that
    # allows 16 sessions runs 20 short scripts in a row (each would otherwise hold its session
    # through the grace period).
    d = npud.LocalDaemon(npud_bin, tcp=False)
    try:
        for i in range(20):
            code = """
                import numpy as np
                import aie.utils as u
                import npud.iron
                npud.iron.install()
                t = u.zeros((16,), dtype=np.int32)
                """ if i % 2 else """
                import npud
                c = npud.Client()
                c.alloc((16,), "int32")
                """
            run_py(code, d, standin=True)
    finally:
        d.stop()


# --- without IRON ------------------------------------------------------------------------------

def test_standalone_classes_run_test_chains_and_failures(design, client):
    if iron.iron_version() is not None:
        pytest.skip("IRON is importable here: the classes are IRON's subclasses")

    class Kernel:
        xclbin_path = design / "final.xclbin"
        insts_path = design / "insts.bin"
        kernel_name = "MLIR_AIE"
        trace_config = None

    rt = iron.NpudRuntime(client=client)
    a = iron.NpudTensor(np.arange(N, dtype=np.int32), client=client)
    b = iron.NpudTensor((N,), np.int32, client=client)
    assert rt.run_test(Kernel(), [a, b], {1: np.arange(N) + 1}) == 0
    h = rt.load(Kernel())
    c = iron.NpudTensor((N,), np.int32, client=client)
    r = rt.run_chain([(h, [a, b]), (h, [b, c])])
    assert r.is_success() and (c.numpy() == np.arange(N) + 2).all()
    assert rt.verify_results([a, b], {0: np.zeros(N), 1: np.zeros(N)}) == 2
    # A chain's links take sub-views: the data moves through one tensor's ranges in place.
    big = iron.NpudTensor(np.concatenate([np.arange(N), np.zeros(2 * N)]).astype(np.int32),
                          client=client)
    v0, v1, v2 = (big.subview(4 * N * i, (N,)) for i in range(3))
    assert rt.run_chain([(h, [v0, v1]), (h, [v1, v2])]).is_success()
    assert (big.numpy()[2 * N:] == np.arange(N) + 2).all()
    assert (big.numpy()[:N] == np.arange(N)).all()
    with pytest.raises(iron.HostRuntimeError):
        rt.run(h, [a, iron.NpudTensor((4,), np.int32, client=client)])
    t = iron.NpudTensor.arange(0.0, 1.0, 0.25, client=client)
    assert t.dtype == np.float32 and list(t.numpy()) == [0.0, 0.25, 0.5, 0.75]
    assert iron.NpudTensor.full((2,), 3, dtype=np.int8, client=client).numpy().tolist() == [3, 3]


def test_designs_npud_cannot_load(tmp_path, client):
    rt = iron.NpudRuntime(client=client)

    class K:
        xclbin_path = tmp_path / "final.xclbin"
        insts_path = tmp_path / "insts.bin"
        kernel_name = "MLIR_AIE"
        trace_config = None

    with pytest.raises(iron.HostRuntimeError, match="no PDI beside"):
        rt.load(K())
    K.trace_config = object()
    with pytest.raises(iron.HostRuntimeError, match="trace capture"):
        rt.load(K())
