"""bench/tilelang_examples.py without a GPU: the table on fake results, the recorder and the GPU
lock in process, the whole driver on a small fake checkout (pass, fail, skip marks, a runtime
skip, a timeout, a deadline, a stop), and the tlx arm's patch on one of TileLang's own examples."""

import fcntl
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

import bench.tilelang_examples as te

_ROOT = Path(__file__).resolve().parents[2]
CHECKOUT = Path(os.environ.get("TLX_TILELANG_CHECKOUT", "/work/tilelang-src"))


def _arm(status="pass", checksums=(), bench_ms=(), seconds=1.0, error="", replays=None, kernels=None, call_kernels=None):
    """One arm's result as run_item returns it: ``checksums`` one list per recorded call,
    ``replays`` the self-replay verdict of each call (None: not replayed)."""
    calls = []
    for i, c in enumerate(checksums):
        call = {"kernel": (call_kernels or [0] * len(checksums))[i], "checksums": list(c)}
        if replays and replays[i] is not None:
            call["replay"] = replays[i]
        calls.append(call)
    kernels = kernels if kernels is not None else [{"name": "k", "cuda_sha256": "s0", "nvcc_flags": ["-O3"]}]
    return {"status": status, "rc": 0 if status == "pass" else 1, "seconds": seconds, "error": error, "skip_reason": "",
            "oom": False, "calls": calls, "kernels": kernels, "bench_ms": list(bench_ms), "lock_wait_s": 0.0}


def test_compare_equal_outputs_and_time_ratio():
    row = te.compare({"tilelang": _arm(checksums=[["a"], ["b"]], bench_ms=[1.0, 3.0]),
                      "tlx": _arm(checksums=[["a"], ["b"]], bench_ms=[1.0, 3.2])})
    assert row["tilelang"] == row["tlx"] == "pass"
    assert row["outputs"] == "bitwise equal" and row["outputs class"] == "equal" and row["code"] == "same CUDA, same flags"
    assert row["ratio"] == pytest.approx(4.2 / 4.0)
    assert row["time tlx/tilelang"] == "1.050 (2 timings, beside other items)"


def test_compare_differing_outputs_and_failures():
    differ = te.compare({"tilelang": _arm(checksums=[["a"], ["b"]]), "tlx": _arm(checksums=[["a"], ["c"]])})
    assert differ["outputs"].startswith("DIFFER in 1/2 calls, 1 of them before any nondeterminism")
    assert differ["outputs class"] == "real" and differ["first differing call"] == 1
    assert "ratio" not in differ and differ["time tlx/tilelang"] == "n/a"
    count = te.compare({"tilelang": _arm(checksums=[["a"]]), "tlx": _arm(checksums=[["a"], ["a"]])})
    assert count["outputs"] == "n/a (1 vs 2 calls recorded)"
    failed = te.compare({"tilelang": _arm(checksums=[["a"]], bench_ms=[1.0]), "tlx": _arm("FAIL", error="E boom")})
    assert failed["tlx"] == "FAIL" and failed["outputs"] == "n/a (not both passed)" and "ratio" not in failed


def test_classify_tilelang_nondeterminism_apart_from_a_real_divergence():
    """Kernel 0 (an atomics split-K, say) did not reproduce itself under tilelang.jit: its call
    and the later call of kernel 1 that reads its output differ, explained; a difference at a
    call before any nondeterministic kernel is real, whatever comes after."""
    kernels = [{"name": "splitk", "cuda_sha256": "s0", "nvcc_flags": ["-O3"]}, {"name": "post", "cuda_sha256": "s1", "nvcc_flags": ["-O3"]}]
    tl = _arm(checksums=[["x0"], ["y0"]], replays=["differs (run 2)", "same"], kernels=kernels, call_kernels=[0, 1])
    tx = _arm(checksums=[["x1"], ["y1"]], replays=["same", "same"], kernels=kernels, call_kernels=[0, 1])
    row = te.compare({"tilelang": tl, "tlx": tx})
    assert row["outputs class"] == "tilelang nondeterministic"
    assert row["outputs"] == ("DIFFER in 2/2 calls (tilelang not reproducible itself: 1/2 replayed calls; tlx 0/2; "
                              "same CUDA, same flags)")
    assert row["replays"]["tilelang"] == {"replayed": 2, "same": 1, "differs": 1, "not compared": []}

    # the first call (a deterministic kernel, reproduced in both arms) already differs: real
    tl = _arm(checksums=[["a0"], ["x0"]], replays=["same", "differs (run 3)"], kernels=kernels, call_kernels=[1, 0])
    tx = _arm(checksums=[["a1"], ["x1"]], replays=["same", "same"], kernels=[kernels[0], {**kernels[1], "cuda_sha256": "other"}],
              call_kernels=[1, 0])
    row = te.compare({"tilelang": tl, "tlx": tx})
    assert row["outputs class"] == "real"
    assert row["outputs"] == ("DIFFER in 2/2 calls, 1 of them before any nondeterminism (tilelang not reproducible itself: "
                              "1/2 replayed calls; tlx reproduces itself: 2/2 replayed calls; CUDA differs in 1/2 kernels, same flags)")


def test_same_code_says_what_differs():
    k = {"name": "k", "cuda_sha256": "s", "nvcc_flags": ["-O3", "-arch=sm_90a"]}
    assert te._same_code([k], [k], {0}) == "same CUDA, same flags"
    assert te._same_code([k], [{**k, "nvcc_flags": ["-O3", "-arch=sm_90a", "--use_fast_math"]}], {0}) == "same CUDA, flags differ in 1/1"
    assert te._same_code([{**k, "nvcc_flags": None}], [k], {0}) == "same CUDA, flags unknown for 1/1 (tilelang cache hit)"
    assert te._same_code([k], [{**k, "cuda_sha256": None}], {0}).startswith("CUDA differs in 1/1 kernels")
    assert te._same_code([k], [k, k], {0}) == "1 vs 2 kernels"
    # two builds whose sources differ only in TileLang's numbering of reduction workspaces
    one = "float* workspace_1; float* workspace_2; run(workspace_1); run(workspace_2);"
    two = "float* workspace_1; float* workspace_2; run(workspace_2); run(workspace_1);"
    other = "float* workspace_1; run(workspace_1); run(workspace_1);"
    built = [{**k, "cuda_sha256": sha, "cuda_sha256_renamed": renamed} for sha, renamed in map(te._cuda_hashes, (one, two, other))]
    assert te._same_code([built[0], built[0]], [built[1], built[1]], {0, 1}) == \
        "CUDA differs in 2/2 kernels (all up to workspace numbering), same flags"
    assert te._same_code([built[0], built[0]], [built[1], built[2]], {0, 1}) == \
        "CUDA differs in 2/2 kernels (1 up to workspace numbering), same flags"


def test_nvcc_flags_drop_paths_and_sort():
    tlx_command = ["--cubin", "-O3", "-lineinfo", "-arch=sm_90a", "-std=c++20", "-I/x/include", "-o", "/b/kernel.cubin", "/b/kernel.cu"]
    assert te._nvcc_flags(tlx_command) == ["--cubin", "-O3", "-arch=sm_90a", "-lineinfo", "-std=c++20"]
    assert te._nvcc_flags(["-ccbin=/usr/bin/g++", "-O3", "--use_fast_math"]) == ["--use_fast_math", "-O3"]


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
    # timed beside other items only: no measure of its noise, so it does not count toward the target
    assert state["summary"]["of those timed alone, with each arm's rounds within 2% of each other"] == 0
    assert state["not_reached"] == ["d/test_d.py::test_late"] and "c/test_c.py::test_long" in state["running"]
    md = (tmp_path / "results.md").read_text()
    assert "| `a/test_a.py::test_ok` | pass | pass | bitwise equal | n/a | 1.010 (1 timings, beside other items) |" in md
    assert "FAIL: E   AttributeError: 'Kernel' has no \\| attribute" in md  # the error, its pipe escaped
    assert "Not applicable here: skipped by the test's own marks or by itself (reason given): 1" in md
    assert "- `d/test_d.py::test_late`" in md and "Running when written (cut): 1" in md


class _FakeKernel:
    """A compiled kernel's stand-in: its CUDA source and a body."""

    def __init__(self, body, source="__global__ void k() {}", name="k"):
        self.body, self.source, self.name = body, source, name

    def get_kernel_source(self, kernel_only=True):
        return self.source


def _recorder(tmp_path):
    return te._Recorder(str(tmp_path / "log.json"), te._GpuLock(str(tmp_path / "gpu.lock")))


def test_recorder_checksums_kernel_calls_outside_benchmarks(tmp_path):
    recorder = _recorder(tmp_path)
    kernel = recorder.kernel_call(lambda self, a, b: self.body(a, b))
    add = _FakeKernel(lambda a, b: a + b)
    a, b = torch.arange(6, dtype=torch.float32), torch.ones(6)
    out = kernel(add, a, b)
    timed = recorder.bench(lambda fn: (fn(), 0.25)[1])
    assert timed(lambda: kernel(add, a, b)) == 0.25
    assert recorder.bench(lambda: 1.5)() == 1.5  # a reference's timing: no kernel ran, not recorded
    recorder.save()

    log = json.loads((tmp_path / "log.json").read_text())
    assert log["bench_ms"] == [0.25]
    assert len(log["calls"]) == 1  # the call inside the benchmark is not recorded
    assert log["calls"][0] == {"kernel": 0, "checksums": [te._checksum(out), te._checksum(a), te._checksum(b)], "replay": "same"}
    sha = __import__("hashlib").sha256(add.source.encode()).hexdigest()
    assert log["kernels"] == [{"name": "k", "cuda_sha256": sha, "cuda_sha256_renamed": te._cuda_hashes(add.source)[1], "nvcc_flags": None}]
    changed = out.clone()
    changed.view(torch.uint8)[5] ^= 1
    assert te._checksum(changed) != te._checksum(out)


def test_replay_finds_a_nondeterministic_kernel_and_leaves_in_place_state_whole(tmp_path):
    """An accumulating kernel (``c += a``, written in place) replayed from restored inputs
    reproduces itself and leaves ``c`` as one call left it; a kernel whose bytes change from
    run to run (as atomics' order does) is caught; only the first calls of a kernel replay."""
    recorder = _recorder(tmp_path)
    kernel = recorder.kernel_call(lambda self, *args: self.body(*args))
    accumulate = _FakeKernel(lambda a, c: c.add_(a), name="accumulate")
    a, c = torch.arange(4, dtype=torch.float32), torch.ones(4)
    kernel(accumulate, a, c)
    assert c.tolist() == [1.0, 2.0, 3.0, 4.0]  # three replays ran, each from the restored c
    noisy = _FakeKernel(lambda out: out.copy_(torch.tensor(list(os.urandom(64)), dtype=torch.uint8)), name="noisy")
    buffer = torch.zeros(64, dtype=torch.uint8)
    for _ in range(3):
        kernel(noisy, buffer)
    kernel(accumulate, a, c)
    assert [(call["kernel"], call.get("replay")) for call in recorder.calls] == [
        (0, "same"), (1, "differs (run 2)"), (1, "differs (run 2)"), (1, None), (0, "same")]
    assert [k["name"] for k in recorder.kernels] == ["accumulate", "noisy"]
    broadcast = _FakeKernel(lambda a, b: a + b, name="broadcast")
    kernel(broadcast, torch.ones(1).expand(4), a)  # an expanded input cannot be restored in place: not replayed
    assert recorder.calls[-1]["replay"] == "not replayed: an argument's elements share memory"


def test_replay_leaves_a_tensor_saved_for_backward_usable(tmp_path):
    """Restoring a replayed call's inputs must not advance their autograd version: an example's
    backward through a tensor a kernel read (and the replay wrote back) still runs."""
    recorder = _recorder(tmp_path)
    kernel = recorder.kernel_call(lambda self, *args: self.body(*args))
    x = torch.randn(4, requires_grad=True)
    saved = x * 2
    loss = (saved * saved).sum()
    read = _FakeKernel(lambda t, out: out.copy_(t.detach()), name="read")
    out = torch.empty(4)
    kernel(read, saved, out)
    assert recorder.calls[0]["replay"] == "same"
    assert torch.equal(out, saved.detach())
    loss.backward()
    assert torch.equal(x.grad, 8 * x.detach())


def test_pointer_table_checksums_the_tensors_it_points_to(tmp_path):
    """A ``T.ptr`` table holds addresses, which differ between processes: two calls whose
    tables point at equal bytes at different addresses record equal checksums, and the
    replay restores the pointed-to tensors (the kernel writes through the table)."""
    recorder = _recorder(tmp_path)
    kernel = recorder.kernel_call(lambda self, *args: self.body(*args))

    def grouped(outputs):
        def body(ptrs, scale):
            for t in outputs:
                t.mul_(scale)  # written through the pointers; in place, so a replay without restore would compound
        return _FakeKernel(body, name="grouped")

    sums = []
    for pad in (1, 1000):  # other allocations first: other addresses
        keep = torch.empty(pad)
        outputs = [torch.full((3,), 2.0), torch.full((5,), 3.0)]
        views = [outputs[0][:2], outputs[1][:1]]  # the example's own c[:n]: same addresses, fewer bytes
        table = torch.tensor([t.data_ptr() for t in outputs], dtype=torch.int64)
        kernel(grouped(outputs), table, torch.tensor([2.0]))
        assert [t.tolist() for t in outputs] == [[4.0] * 3, [6.0] * 5]
        sums.append(recorder.calls[-1]["checksums"])
        assert sums[-1] == [te._checksum(outputs[0]), te._checksum(outputs[1]), te._checksum(torch.tensor([2.0]))]
        del keep, views
    assert sums[0] == sums[1] and recorder.calls[-1]["replay"] == "same"
    assert te._pointer_targets(torch.tensor([1, 2, 3])) is None  # small integers are indices, not addresses
    assert te._pointer_targets(torch.tensor([1 << 40], dtype=torch.int64)) is None  # no live tensor there


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


def test_paired_times_alternate_arms_and_size_samples():
    """Two warm-up and one sizing call per arm, then rounds of one sample per arm in
    alternating order, each sample as many calls as fill about 2 ms; medians and spreads."""
    seen = []
    per_call = {"tilelang": [0.5, 0.5, 0.5, 0.5, 0.6, 0.5, 0.5], "tlx": [0.25] * 7}

    def clock(run, n):
        arm = run()
        seen.append((arm, n))
        return per_call[arm][sum(a == arm for a, _ in seen) - 3] if len([a for a, _ in seen if a == arm]) > 2 else 0.5

    out = te.paired_times({"tilelang": lambda: "tilelang", "tlx": lambda: "tlx"}, clock, rounds=5)
    assert seen[:4] == [("tilelang", 2), ("tlx", 2), ("tilelang", 1), ("tlx", 1)]
    assert [a for a, _ in seen[4:]] == ["tilelang", "tlx", "tlx", "tilelang", "tilelang", "tlx", "tlx", "tilelang", "tilelang", "tlx"]
    assert {n for _, n in seen[4:]} == {4}  # 2 ms / 0.5 ms, the slower arm's single call
    assert out["ms"] == {"tilelang": 0.5, "tlx": 0.25} and out["calls per sample"] == 4 and out["rounds"] == 5
    assert out["spread"]["tlx"] == 0.0 and out["spread"]["tilelang"] > 0


def test_recorder_times_a_kernel_against_its_twin_and_restores_its_arguments(tmp_path):
    """The tlx arm's first call of a kernel is timed against TileLang's build of it (here a
    stand-in twin) with the same arguments; an accumulating kernel's output is left as one call
    left it; a later call of the same kernel and a kernel without a twin are not timed."""
    recorder = _recorder(tmp_path)
    accumulate = _FakeKernel(lambda a, c: c.add_(a), name="accumulate")
    twin = _Twin(accumulate)

    def twin_of(k):
        if k is not accumulate:
            raise LookupError("no program")
        return twin

    def clock(run, n):
        t = time.perf_counter()
        for _ in range(n):
            run()
        return (time.perf_counter() - t) * 1e3 / n

    recorder.twin, recorder.clock, recorder.paired_rounds = twin_of, clock, 3
    kernel = recorder.kernel_call(lambda self, *args: self.body(*args))
    a, c = torch.arange(4, dtype=torch.float32), torch.ones(4)
    kernel(accumulate, a, c)
    assert c.tolist() == [1.0, 2.0, 3.0, 4.0]  # replays and timed calls ran, each undone
    assert twin.calls >= 6  # the twin ran: warm-up, sizing and three samples
    kernel(accumulate, a, c)
    kernel(_FakeKernel(lambda a: a, name="lonely", source="other"), a)
    assert [p["kernel"] for p in recorder.paired] == [0, 1]
    timed, lonely = recorder.paired
    assert timed["same CUDA"] is True and set(timed["ms"]) == {"tilelang", "tlx"} and timed["rounds"] == 3
    assert lonely == {"kernel": 1, "not timed": "no TileLang build: LookupError: no program"}


class _Twin:
    """TileLang's build of a kernel, as the paired timing sees it: its source, counted calls."""

    def __init__(self, kernel):
        self.kernel, self.calls = kernel, 0

    def get_kernel_source(self, kernel_only=True):
        return self.kernel.source

    def __call__(self, *args):
        self.calls += 1
        return self.kernel.body(*args)


def test_paired_row_and_summary():
    tl = _arm(checksums=[["a"]])
    tx = {**_arm(checksums=[["a"]]), "paired": [
        {"kernel": 0, "same CUDA": True, "ms": {"tilelang": 1.0, "tlx": 1.01}, "spread": {"tilelang": 0.004, "tlx": 0.01}},
        {"kernel": 1, "same CUDA": te._WORKSPACES, "ms": {"tilelang": 0.01, "tlx": 0.008}, "spread": {"tilelang": 0.03, "tlx": 0.01}},
        {"kernel": 2, "not timed": "no TileLang build: LookupError: x"}]}
    row = te.compare({"tilelang": tl, "tlx": tx})
    assert row["paired ratio"] == pytest.approx(1.018 / 1.01) and row["paired spread"] == 0.03
    assert row["kernel time tlx/tilelang"] == "1.008 (2 kernels, 1 not timed, 1010.0 us a call set under TileLang; spread 3.0%; same CUDA 1/2, 1 more up to workspace numbering)"
    untimed = te.compare({"tilelang": tl, "tlx": {**tx, "paired": tx["paired"][2:]}})
    assert untimed["kernel time tlx/tilelang"] == "n/a (no TileLang build: LookupError: x)" and "paired ratio" not in untimed
    summary = te.paired_summary([row, untimed, {**row, "paired ratio": 1.05, "paired spread": 0.01}])
    assert summary["kernel-timed (paired, in one process)"] == 2 and summary["kernel time within 2%"] == 1
    assert summary["of those kernel-timed, spread within 2%"] == 1 and summary["of those, kernel time within 2%"] == 0


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


def test_driver_exclude_and_longest_first(fake_checkout, tmp_path):
    """--exclude drops a file and an item by text; --longest-first queues the costliest first
    (seen in the not-reached list a zero deadline leaves)."""
    (fake_checkout / "family" / "test_other.py").write_text(
        "def test_small():\n    pass\n\ndef test_mha_bwd_autotune():\n    pass\n\ndef test_left_out():\n    pass\n")
    out = tmp_path / "out"
    assert te.main([str(fake_checkout), "--out", str(out), "--deadline", "0", "--exclude", "test_family.py",
                    "--exclude", "::test_left_out", "--longest-first"]) == 0
    state = json.loads((out / "results.json").read_text())
    assert state["not_reached"] == ["family/test_other.py::test_mha_bwd_autotune", "family/test_other.py::test_small"]
    assert state["not_applicable"] == {} and state["rows"] == {}


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


FAKE_KERNEL_TESTS = """
    import fcntl
    import os
    import tempfile
    from pathlib import Path

    import torch

    SOURCE = "__global__ void fake(float *out) {}"


    def compiled(body, name):
        '''A compiled kernel of the arm this process runs, as the recorder sees one: its calls go
        through the class the arm's hook wraps (tlx's Kernel, TileLang's JITKernel).'''
        if os.environ["TLX_DROPIN_ARM"] == "tlx":
            from tlx.kernel import Kernel

            build = Path(tempfile.mkdtemp())
            (build / "kernel.cu").write_text(SOURCE)
            command = ["nvcc", "--cubin", "-O3", "-lineinfo", "-arch=sm_90a", "-std=c++20", "-o", str(build / "k.cubin"), "k.cu"]
            os.environ["TLX_TORCH_BRIDGE"] = "0"  # the launcher module is a dict of Python functions here
            return Kernel(build, {"name": name, "entry": "launch", "params": [], "nvcc_command": command}, {"launch": body})
        from tilelang.jit.kernel import JITKernel

        kernel = JITKernel.__new__(JITKernel)
        kernel.torch_function = body
        kernel.get_kernel_source = lambda kernel_only=True: SOURCE
        return kernel


    def test_deterministic():
        out = torch.empty(8)
        compiled(lambda a, o: o.copy_(a * 2), "double")(torch.randn(8), out)


    def test_nondeterministic():
        # bytes that change from run to run, as an atomic accumulation's order does
        noisy = compiled(lambda o: o.copy_(torch.tensor(list(os.urandom(32)), dtype=torch.uint8)), "noisy")
        out = torch.empty(32, dtype=torch.uint8)
        noisy(out)
        compiled(lambda a, o: o.copy_(a.float()), "widen")(out, torch.empty(32))


    def test_diverges():
        shift = 1.0 if os.environ["TLX_DROPIN_ARM"] == "tlx" else 0.0
        compiled(lambda a, o: o.copy_(a + shift), "shifted")(torch.randn(4), torch.empty(4))


    def test_holds_the_gpu_lock():
        # the timing phase: this test holds the lock exclusively, nobody else may take it
        fd = os.open(os.environ["TLX_DROPIN_GPU_LOCK"], os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        raise AssertionError("the GPU lock was free during the test")
"""


@pytest.fixture
def fake_kernels(tmp_path):
    examples = tmp_path / "examples"
    (examples / "fake").mkdir(parents=True)
    (examples / "fake" / "test_fake.py").write_text(textwrap.dedent(FAKE_KERNEL_TESTS))
    return examples


def test_driver_classifies_fake_kernels_through_both_arms_hooks(fake_kernels, tmp_path):
    """Stand-in kernels called through the classes each arm hooks: a deterministic kernel is
    bitwise equal with the same CUDA; a kernel whose bytes change run to run is
    nondeterministic under tilelang.jit, and so is the difference of the kernel reading its
    output; a deterministic kernel whose output depends on the arm is a real divergence."""
    out = tmp_path / "out"
    targets = [f"fake/test_fake.py::{name}" for name in ("test_deterministic", "test_nondeterministic", "test_diverges")]
    assert te.main([str(fake_kernels), *targets, "--out", str(out), "--jobs", "3", "--timeout", "120"]) == 0
    state = json.loads((out / "results.json").read_text())
    rows = {n.split("::")[1]: r for n, r in state["rows"].items()}
    deterministic = rows["test_deterministic"]
    assert deterministic["outputs"] == "bitwise equal", deterministic
    assert deterministic["code"] == "same CUDA, flags unknown for 1/1 (tilelang cache hit)"  # no TileLang compile ran
    nondet = rows["test_nondeterministic"]
    assert nondet["outputs class"] == "tilelang nondeterministic", nondet["outputs"]
    assert nondet["outputs"].startswith("DIFFER in 2/2 calls (tilelang not reproducible itself: 1/2 replayed calls; tlx 1/2;")
    assert [c.get("replay") for c in nondet["detail"]["tlx"]["calls"]] == ["differs (run 2)", "same"]
    diverges = rows["test_diverges"]
    assert diverges["outputs class"] == "real" and "1 of them before any nondeterminism" in diverges["outputs"]
    assert state["summary"]["outputs differ after tilelang's own nondeterminism"] == 1
    assert state["summary"]["of those, same CUDA source in both arms"] == 1
    assert state["summary"]["outputs differ with both arms reproducing themselves (real)"] == 1


def test_timing_run_holds_the_gpu_lock_for_the_whole_test(fake_kernels, tmp_path):
    runner = te.Runner(tmp_path, tmp_path / "gpu.lock")
    lock_test = "fake/test_fake.py::test_holds_the_gpu_lock"
    assert te.run_item(runner, fake_kernels, lock_test, "tilelang", 120, timing_round=1)["status"] == "pass"
    assert te.run_item(runner, fake_kernels, lock_test, "tilelang", 120)["status"] == "FAIL"  # the first phase: per kernel call only


def test_apply_timing_takes_the_median_of_round_ratios(tmp_path):
    row = {"ratio": 0.55, "time tlx/tilelang": "0.550 (1 timings, beside other items)"}
    rounds = [{"tilelang": _arm(bench_ms=[1.0, 1.0]), "tlx": _arm(bench_ms=[1.0, 1.02])},
              {"tilelang": _arm(bench_ms=[2.0]), "tlx": _arm(bench_ms=[1.0, 1.0])},  # another count of timings: no ratio
              {"tilelang": _arm(bench_ms=[1.0, 1.0]), "tlx": _arm(bench_ms=[1.0, 0.98])},
              {"tilelang": _arm(bench_ms=[1.0, 1.0]), "tlx": _arm(bench_ms=[1.0, 1.1])}]
    te.apply_timing(row, rounds)
    assert row["ratio"] == pytest.approx(1.01) and row["ratio beside other items"] == 0.55
    assert row["timing"]["ratios"] == pytest.approx([1.01, 0.99, 1.05])
    assert row["timing"]["problems"] == ["round 2: 1 vs 2 timings"]
    assert row["noise"] == pytest.approx(2.1 / 1.98 - 1)  # tlx's own rounds: 2.02, 1.98, 2.1 ms
    table = te.Table(tmp_path, {"command": "x"})
    steady = {"tilelang": "pass", "tlx": "pass", "outputs": "bitwise equal", "time tlx/tilelang": ""}
    te.apply_timing(steady, [{"tilelang": _arm(bench_ms=[1.0]), "tlx": _arm(bench_ms=[t])} for t in (1.01, 1.005, 1.012)])
    table.rows = {"noisy": {**row, "tilelang": "pass", "tlx": "pass", "outputs": "bitwise equal"}, "steady": steady}
    summary = table.summary()
    assert summary["of those timed alone, with each arm's rounds within 2% of each other"] == 1 and summary["of those, time within 2%"] == 1
    assert row["time tlx/tilelang"] == ("1.010 (alone; median of 3 rounds: 1.010, 0.990, 1.050; an arm's own rounds differ by up to 6.1%; "
                                        "round 2: 1 vs 2 timings; beside other items 0.550)")
    failed = {"ratio": 0.9, "time tlx/tilelang": "0.900 (1 timings, beside other items)"}
    te.apply_timing(failed, [{"tilelang": _arm(bench_ms=[1.0]), "tlx": _arm("timeout")}])
    assert failed["ratio"] == 0.9 and failed["time tlx/tilelang"].endswith("(timing phase gave none: round 1: tilelang pass, tlx timeout)")


def test_timing_phase_alternates_arms_on_timed_rows_only(tmp_path, monkeypatch):
    """Only rows timed in both arms run again, cheapest first, each as rounds of tilelang then
    tlx in timing mode; the summary counts them as timed alone; a merged table keeps its rows."""
    runs = []

    def fake_run_item(runner, examples, nodeid, arm, timeout, timing_round=None):
        runs.append((nodeid, arm, timing_round))
        return _arm(bench_ms=[1.0 if arm == "tilelang" else 1.0 + 0.01 * timing_round])

    monkeypatch.setattr(te, "run_item", fake_run_item)
    table = te.Table(tmp_path, {"command": "x"})
    timed = {"tilelang": _arm(checksums=[["a"]], bench_ms=[1.0], seconds=9.0), "tlx": _arm(checksums=[["a"]], bench_ms=[0.5], seconds=9.0)}
    table.rows["a/test_a.py::test_slow"] = {**te.compare(timed), "detail": timed}
    quick = {arm: {**r, "seconds": 1.0} for arm, r in timed.items()}
    table.rows["a/test_a.py::test_quick"] = {**te.compare(quick), "detail": quick}
    untimed = {arm: _arm(checksums=[["a"]]) for arm in te.ARMS}
    table.rows["a/test_a.py::test_untimed"] = {**te.compare(untimed), "detail": untimed}
    table.write()
    merged = tmp_path / "first.json"
    merged.write_bytes((tmp_path / "results.json").read_bytes())
    (tmp_path / "examples").mkdir()
    (tmp_path / "examples" / "test_none.py").write_text("")
    out = tmp_path / "out"
    assert te.main([str(tmp_path / "examples"), "--merge", str(merged), "--out", str(out), "--timing-jobs", "1", "--timing-rounds", "2"]) == 0
    assert runs == [(n, arm, r) for n in ("a/test_a.py::test_quick", "a/test_a.py::test_slow") for r in (1, 2) for arm in te.ARMS]
    state = json.loads((out / "results.json").read_text())
    assert state["rows"]["a/test_a.py::test_slow"]["ratio"] == pytest.approx(1.015)
    assert state["rows"]["a/test_a.py::test_slow"]["ratio beside other items"] == 0.5
    assert "timing" not in state["rows"]["a/test_a.py::test_untimed"]
    assert state["summary"]["timed"] == 2 and state["summary"]["of those, timed alone"] == 2
    assert state["timing_not_reached"] == [] and state["meta"]["merged"][0]["command"] == "x"
    assert "Continues the table of " in (out / "results.md").read_text()


@pytest.mark.skipif(not (CHECKOUT / "examples" / "gemm" / "example_gemm.py").is_file(), reason="no TileLang checkout at $TLX_TILELANG_CHECKOUT")
def test_tlx_arm_patches_an_example_and_compiles_it(tmp_path, cpu_target):
    """Under the tlx arm TileLang's gemm example's ``@tilelang.jit`` is tlx's, and its own
    ``matmul.compile(M=..., ...)`` (eager style, ``T.const``/``T.empty``) builds a tlx kernel
    for sm_90a whose ``get_kernel_source`` is the CUDA tlx compiled, the same as TileLang's own
    build of that program (the paired timing's counterpart); a call through the
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
        # the paired timing's counterpart: TileLang's own build of the program tlx compiled
        twin = bench.tilelang_examples._recorder.twin(kernel)
        assert type(twin).__name__ == "JITKernel" and twin.get_kernel_source() == source, "TileLang's build differs"
        a = torch.zeros(1024, 1024, dtype=torch.float16)  # on the CPU: through the recorder to the launcher's check
        try:
            kernel(a, a)
        except ValueError as e:
            print("OK", kernel, "launcher refused:", e)
    """)
    gemm = CHECKOUT / "examples" / "gemm"
    env = {**os.environ, te._ENV_ARM: "tlx", te._ENV_LOG: str(tmp_path / "log.json"), te._ENV_PAIRED: "3", "TLX_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(_ROOT), str(gemm)])}
    proc = subprocess.run([sys.executable, "-c", code], cwd=gemm, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "OK" in proc.stdout and "launcher refused" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-4000:]
