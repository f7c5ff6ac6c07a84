"""bench/attention_prefill.py without a GPU: its compile step builds every kernel its rows launch.

A kernel missing from the compile step is built serially at first use, a minute each on one
core, inside the timed part: on the H200 (2026-12-02) that kept the first row from printing
within 150 s. The kernels' JIT calls and the device check are replaced by recorders here, so
the wrappers run their argument logic on CPU tensors and name the kernels they would launch.
"""

import importlib

import torch

import bench.attention_prefill as bench
from kernels.attention import dense_bwd, dense_fwd, sparse_fwd


def record_kernel_requests(monkeypatch) -> list:
    """Replace the kernels' JIT calls by a recorder (factory name, cache key), the device check by
    nothing and the device's properties by an H200's SM count; returns the list the requests go to."""
    jit = importlib.import_module("tlx.jit")
    requested = []

    def record(self, *args, **kwargs):
        requested.append((self.factory.__name__, self._key(args, kwargs)))
        return lambda *launch_args: None

    monkeypatch.setattr(jit.JITFunction, "__call__", record)
    for module in (dense_fwd, dense_bwd, sparse_fwd):
        monkeypatch.setattr(module.C, "check_cuda", lambda **tensors: None)
    # the persistent forward sizes its grid by the SM count (an H200's)
    monkeypatch.setattr(dense_fwd, "sm_count", lambda device_index: 132)
    return requested


def compiled_and_launched(monkeypatch, configs, launch_rows) -> tuple[set, set]:
    """The kernels the compile step builds for ``configs``, and those ``launch_rows(q, d, causal)``
    then asks for at every bench shape."""
    requested = record_kernel_requests(monkeypatch)
    for cfg in configs:
        bench.compile_config(cfg)
    compiled = set(requested)
    requested.clear()
    for _, _, _, d in bench.SHAPES:
        q = torch.zeros(1, 4, 2, d, dtype=torch.bfloat16)
        for causal in (False, True):
            launch_rows(q, d, causal)
    return compiled, requested


def test_compile_step_covers_every_kernel_of_the_rows(monkeypatch):
    def rows(q, d, causal):
        for schedule in bench.SCHEDULE_NAMES:
            dense_fwd.dense_attention(q, q, q, causal=causal, schedule=schedule)
        dense_bwd.dense_attention_backward(q, q, q, q, q, torch.zeros(1, 2, 4), causal=causal)

    compiled, requested = compiled_and_launched(monkeypatch, bench.BENCH_CONFIGS, rows)
    _, _, h, _, k = bench.SPARSE_SHAPE
    for schedule in bench.SPARSE_SCHEDULES:
        sparse_fwd.sparse_attention(torch.zeros(1, 1, h, sparse_fwd.DIM, dtype=torch.bfloat16),
                                    torch.zeros(1, 8, sparse_fwd.DIM, dtype=torch.bfloat16),
                                    torch.zeros(1, 1, k, dtype=torch.int32), torch.zeros(h), schedule=schedule)
    launched = set(requested)

    assert len(launched) == 29 + len(bench.SPARSE_SCHEDULES)  # 12 forward, 3 or 4 backward per (d, causal), one sparse per schedule
    assert launched <= compiled, f"launched but not compiled first: {sorted(launched - compiled)}"


def test_sweep_compile_step_covers_every_candidate(monkeypatch):
    def rows(q, d, causal):
        for options in bench.SWEEP_FORWARD[d].values():
            dense_fwd.dense_attention(q, q, q, causal=causal, schedule="overlap", options=options)
        for tiles in bench.SWEEP_BACKWARD.get(d, {}).values():
            dense_bwd.dense_attention_backward(q, q, q, q, q, torch.zeros(1, 2, 4), causal=causal, tiles=tiles)

    compiled, requested = compiled_and_launched(monkeypatch, bench.sweep_configs(), rows)
    launched = set(requested)

    forward = sum(len(c) for c in bench.SWEEP_FORWARD.values()) * 2
    assert len({k for k in launched if k[0] in ("dense_fwd_overlap_kernel", "dense_fwd_persistent_kernel")}) == forward
    assert launched <= compiled, f"launched but not compiled first: {sorted(launched - compiled)}"
