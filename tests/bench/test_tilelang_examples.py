"""bench/tilelang_examples.py without a GPU: the table on fake results, the recorder and the GPU
lock in process, the whole driver on a small fake checkout (pass, fail, skip marks, a runtime
skip, a timeout, a deadline, a stop), and the tlx arm's patch on one of TileLang's own examples."""

import fcntl
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import bench.tilelang_examples as te

_ROOT = Path(__file__).resolve().parents[2]
CHECKOUT = Path(os.environ.get("TLX_TILELANG_CHECKOUT", "/work/tilelang-src"))


def _arm(status="pass", checksums=(), bench_ms=(), seconds=1.0, error=""):
    return {"status": status, "rc": 0 if status == "pass" else 1, "seconds": seconds, "error": error, "skip_reason": "",
            "oom": False, "checksums": [list(c) for c in checksums], "bench_ms": list(bench_ms), "lock_wait_s": 0.0}


def test_compare_equal_outputs_and_time_ratio():
    row = te.compare({"tilelang": _arm(checksums=[["a"], ["b"]], bench_ms=[1.0, 3.0]),
                      "tlx": _arm(checksums=[["a"], ["b"]], bench_ms=[1.0, 3.2])})
    assert row["tilelang"] == row["tlx"] == "pass"
    assert row["outputs"] == "bitwise equal"
    assert row["ratio"] == pytest.approx(4.2 / 4.0)
    assert row["time tlx/tilelang"] == "1.050 (2 timings)"


def test_compare_differing_outputs_and_failures():
    differ = te.compare({"tilelang": _arm(checksums=[["a"], ["b"]]), "tlx": _arm(checksums=[["a"], ["c"]])})
    assert differ["outputs"] == "DIFFER in 1/2 calls"
    assert "ratio" not in differ and differ["time tlx/tilelang"] == "n/a"
    count = te.compare({"tilelang": _arm(checksums=[["a"]]), "tlx": _arm(checksums=[["a"], ["a"]])})
    assert count["outputs"] == "n/a (1 vs 2 calls recorded)"
    failed = te.compare({"tilelang": _arm(checksums=[["a"]], bench_ms=[1.0]), "tlx": _arm("FAIL", error="E boom")})
    assert failed["tlx"] == "FAIL" and failed["outputs"] == "n/a (not both passed)" and "ratio" not in failed


def test_table_writes_rows_lists_and_summary(tmp_path):
    table = te.Table(tmp_path, {"command": "tilelang_examples.py x"})
    table.rows["a/test_a.py::test_ok"] = {**te.compare({"tilelang": _arm(checksums=[["x"]], bench_ms=[2.0]),
                                                        "tlx": _arm(checksums=[["x"]], bench_ms=[2.02])}), "detail": {}}
    bad = {"tilelang": _arm(checksums=[["x"]]), "tlx": _arm("FAIL", error="E   AttributeError: 'Kernel' has no | attribute")}
    table.rows["a/test_a.py::test_bad"] = {**te.compare(bad), "detail": bad}
    table.not_applicable["b/test_b.py::test_sm100"] = "requires CUDA compute version >= 10.0"
    table.running["c/test_c.py::test_long"] = "tilelang done"
    table.pending = ["d/test_d.py::test_late"]
    table.write()

    state = json.loads((tmp_path / "results.json").read_text())
    assert state["summary"]["pass under tilelang.jit"] == 2
    assert state["summary"]["of those, pass under tlx.jit"] == 1
    assert state["summary"]["of those, outputs bitwise equal"] == 1
    assert state["summary"]["time within 2%"] == 1 and state["summary"]["time ratio geomean"] == pytest.approx(1.01)
    assert state["not_reached"] == ["d/test_d.py::test_late"] and "c/test_c.py::test_long" in state["running"]
    md = (tmp_path / "results.md").read_text()
    assert "| `a/test_a.py::test_ok` | pass | pass | bitwise equal | 1.010 (1 timings) |" in md
    assert "FAIL: E   AttributeError: 'Kernel' has no \\| attribute" in md  # the error, its pipe escaped
    assert "Not applicable here: skipped by the test's own marks or by itself (reason given): 1" in md
    assert "- `d/test_d.py::test_late`" in md and "Running when written (cut): 1" in md


def test_recorder_checksums_kernel_calls_outside_benchmarks(tmp_path):
    recorder = te._Recorder(str(tmp_path / "log.json"), te._GpuLock(str(tmp_path / "gpu.lock")))
    kernel = recorder.kernel_call(lambda self, a, b: a + b)
    a, b = torch.arange(6, dtype=torch.float32), torch.ones(6)
    out = kernel(None, a, b)
    timed = recorder.bench(lambda fn: (fn(), 0.25)[1])
    assert timed(lambda: kernel(None, a, b)) == 0.25
    assert recorder.bench(lambda: 1.5)() == 1.5  # a reference's timing: no kernel ran, not recorded
    recorder.save()

    log = json.loads((tmp_path / "log.json").read_text())
    assert log["bench_ms"] == [0.25]
    assert len(log["checksums"]) == 1  # the call inside the benchmark is not recorded
    assert log["checksums"][0] == [te._checksum(out), te._checksum(a), te._checksum(b)]
    changed = out.clone()
    changed.view(torch.uint8)[5] ^= 1
    assert te._checksum(changed) != te._checksum(out)


def test_call_of_reaches_a_property_call_and_a_method():
    """tlx's Kernel makes ``__call__`` a property returning the launcher; TileLang's kernels define a method."""
    import operator

    class PropertyCall:
        def __init__(self):
            self._call = lambda *xs: ("launched", xs)

        __call__ = property(operator.attrgetter("_call"))

    class MethodCall:
        def __call__(self, *xs, scale=1):
            return [x * scale for x in xs]

    assert te._call_of(PropertyCall)(PropertyCall(), 1, 2) == ("launched", (1, 2))
    assert te._call_of(MethodCall)(MethodCall(), 1, 2, scale=3) == [3, 6]


def test_gpu_lock_shared_for_kernels_exclusive_for_benchmarks(tmp_path):
    path = str(tmp_path / "gpu.lock")
    other = os.open(path, os.O_RDWR | os.O_CREAT)
    lock = te._GpuLock(path)
    with lock.hold(exclusive=False):
        fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)  # another kernel call may run beside it
        fcntl.flock(other, fcntl.LOCK_UN)
        with pytest.raises(BlockingIOError):  # a benchmark may not
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with lock.hold(exclusive=True):
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_SH | fcntl.LOCK_NB)
    fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(other)


def test_order_by_estimate_or_measured_seconds(tmp_path):
    items = ["fa/test_fa.py::test_mha_bwd_autotune", "gemm/test_gemm.py::test_gemm", "x/test_x.py::test_attn"]
    assert sorted(items, key=lambda n: te._estimated_cost(n, {})) == [items[1], items[2], items[0]]
    assert te._estimated_cost(items[1], {}, tuned=True) > te._estimated_cost(items[1], {})
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"rows": {items[0]: {"detail": {"tilelang": {"seconds": 1.0}, "tlx": {"seconds": 2.0}}}}}))
    measured = te._measured_costs(old)
    assert measured == {items[0]: 3.0}
    assert sorted(items, key=lambda n: te._estimated_cost(n, measured))[0] == items[0]


FAKE_TESTS = """
    import time
    import pytest

    def test_passes():
        assert sum([1, 2]) == 3

    def test_fails():
        assert sum([1, 2]) == 4, "wrong sum"

    @pytest.mark.skipif(True, reason="needs an sm_100 GPU")
    def test_needs_other_gpu():
        pass

    def test_skips_itself():
        pytest.skip("no such hardware here")

    def test_hangs():
        time.sleep(600)
"""


@pytest.fixture
def fake_checkout(tmp_path):
    examples = tmp_path / "examples"
    (examples / "family").mkdir(parents=True)
    (examples / "family" / "test_family.py").write_text(textwrap.dedent(FAKE_TESTS))
    return examples


def test_driver_on_a_fake_checkout(fake_checkout, tmp_path):
    out = tmp_path / "out"
    assert te.main([str(fake_checkout.parent), "--out", str(out), "--jobs", "2", "--timeout", "45"]) == 0
    state = json.loads((out / "results.json").read_text())
    rows = state["rows"]
    ids = {n.split("::")[1]: n for n in rows}
    assert rows[ids["test_passes"]]["tilelang"] == rows[ids["test_passes"]]["tlx"] == "pass"
    assert rows[ids["test_passes"]]["outputs"] == "n/a (no kernel output recorded)"
    assert rows[ids["test_fails"]]["tilelang"] == rows[ids["test_fails"]]["tlx"] == "FAIL"
    assert "AssertionError: wrong sum" in rows[ids["test_fails"]]["detail"]["tlx"]["error"]
    assert "test_skips_itself" not in str(rows)  # skipped both ways at run time: listed, not a row
    assert rows[ids["test_hangs"]]["tilelang"] == "timeout"
    assert state["not_applicable"] == {"family/test_family.py::test_needs_other_gpu": "needs an sm_100 GPU",
                                       "family/test_family.py::test_skips_itself": "Skipped: no such hardware here"}
    assert "test_needs_other_gpu" not in str(rows)  # skipped by its mark: never run
    assert state["not_reached"] == [] and state["running"] == {}
    assert (out / "items" / "family__test_family.py--test_fails.tlx.log").read_text().count("wrong sum") >= 1


def test_driver_deadline_leaves_items_not_reached(fake_checkout, tmp_path):
    out = tmp_path / "out"
    assert te.main([str(fake_checkout), "family/test_family.py::test_passes", "--out", str(out), "--deadline", "0"]) == 0
    state = json.loads((out / "results.json").read_text())
    assert state["rows"] == {} and state["not_reached"] == ["family/test_family.py::test_passes"]
    assert "Not reached: 1" in (out / "results.md").read_text()


def test_driver_runs_an_item_out_of_gpu_memory_once_more(fake_checkout, tmp_path):
    (fake_checkout / "family" / "test_memory.py").write_text(
        "def test_runs_out():\n    raise RuntimeError('CUDA out of memory. Tried to allocate 8.00 TiB')\n")
    out = tmp_path / "out"
    assert te.main([str(fake_checkout), "family/test_memory.py", "--out", str(out), "--jobs", "2"]) == 0
    row = json.loads((out / "results.json").read_text())["rows"]["family/test_memory.py::test_runs_out"]
    assert row["tilelang"] == row["tlx"] == "FAIL" and row["detail"]["tlx"]["oom"]
    assert row["note"] == "second run: the first ran out of GPU memory beside other items"
    assert "(second run: the first ran out of GPU memory" in (out / "results.md").read_text()


def test_driver_stop_kills_running_items_and_lists_them(fake_checkout, tmp_path):
    out = tmp_path / "out"
    hangs = "family/test_family.py::test_hangs"
    assert te.main([str(fake_checkout), hangs, "--out", str(out), "--stop", "30", "--timeout", "300"]) == 0
    state = json.loads((out / "results.json").read_text())
    assert state["rows"] == {} and state["not_reached"] == []
    assert state["running"][hangs].startswith("tilelang stopped in ") and state["running"][hangs].endswith("tlx not run (stopped) in 0.0 s")


@pytest.mark.skipif(not (CHECKOUT / "examples" / "gemm" / "example_gemm.py").is_file(), reason="no TileLang checkout at $TLX_TILELANG_CHECKOUT")
def test_tlx_arm_patches_an_example_and_compiles_it(tmp_path, cpu_target):
    """Under the tlx arm TileLang's gemm example's ``@tilelang.jit`` is tlx's, and its own
    ``matmul.compile(M=..., ...)`` (eager style, ``T.const``/``T.empty``) builds a tlx kernel
    for sm_90a whose ``get_kernel_source`` is the CUDA tlx compiled; a call through the
    recorder's hook reaches the launcher (which refuses CPU tensors)."""
    code = textwrap.dedent(f"""
        import dataclasses
        import torch
        import bench.tilelang_examples
        import example_gemm
        from tlx.jit import JITFunction
        from tlx.kernel import Kernel
        from tlx.options import freeze

        assert type(example_gemm.matmul) is JITFunction, type(example_gemm.matmul)
        example_gemm.matmul.options = dataclasses.replace(example_gemm.matmul.options, target=freeze({cpu_target!r}))
        kernel = example_gemm.matmul.compile(M=1024, N=1024, K=1024, block_M=128, block_N=128, block_K=32)
        assert type(kernel) is Kernel, type(kernel)
        source = kernel.get_kernel_source()
        assert "__global__" in source, source[:400]
        a = torch.zeros(1024, 1024, dtype=torch.float16)  # on the CPU: through the recorder to the launcher's check
        try:
            kernel(a, a)
        except ValueError as e:
            print("OK", kernel, "launcher refused:", e)
    """)
    gemm = CHECKOUT / "examples" / "gemm"
    env = {**os.environ, te._ENV_ARM: "tlx", te._ENV_LOG: str(tmp_path / "log.json"), "TLX_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(_ROOT), str(gemm)])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=gemm, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout and "launcher refused" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
