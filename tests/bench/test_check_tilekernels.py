"""bench/check_tilekernels.py on a stand-in for the TileKernels checkout, written here: a pytest
suite whose kernel module imports ``tilelang.utils.target`` (the newer TileLang's module) and whose
tests build CUDA tensors, run end to end on the CPU: capture, sampling, tlx check, tlx's build and
TileLang's own lowering."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import bench.check_tilekernels as ck

KERNEL = '''
import tilelang
import tilelang.language as T
from tilelang.utils.target import determine_target  # the newer TileLang's module


@tilelang.jit(pass_configs={tilelang.PassConfigKey.TL_DISABLE_WARP_SPECIALIZED: True})
def scale_kernel(block: int):
    assert determine_target(return_object=True).kind.name == "cuda"
    n = T.dynamic("n")

    @T.prim_func
    def scale(x: T.Tensor((n,), "float32"), y: T.Tensor((n,), "float32")):
        with T.Kernel(T.ceildiv(n, block), threads=block) as bx:
            for i in T.Parallel(block):
                if bx * block + i < n:
                    y[bx * block + i] = x[bx * block + i] * 2.0

    return scale


def scale(x, block=128):
    import torch

    y = torch.empty_like(x)
    scale_kernel(block)(x, y)
    return y
'''

TEST = '''
import pytest
import torch

from fakekernels import scale


@pytest.mark.parametrize("block", [64, 128, 256])
@pytest.mark.parametrize("n", [1, 1000])
def test_scale(n, block):
    x = torch.randn(n, device="cuda")
    assert torch.equal(scale(x, block), x * 2)


def test_scale_benchmark():
    scale(torch.randn(8, device="cuda"))
'''


@pytest.fixture(scope="module")
def checkout(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tilekernels")
    (root / "fakekernels.py").write_text(textwrap.dedent(KERNEL))
    (root / "tests").mkdir()
    (root / "tests" / "test_scale.py").write_text(textwrap.dedent(TEST))
    return root


def _env() -> dict:
    return {**os.environ, "TILELANG_DEFAULT_TARGET": json.dumps(ck.TARGET), "CUDA_VISIBLE_DEVICES": ""}


def test_capture_samples_each_test_and_records_its_first_compile(checkout):
    out = subprocess.run([sys.executable, ck.HERE, str(checkout), "--capture-only", "--per-test", "2"],
                         capture_output=True, text=True, env=_env(), check=True).stdout
    records = json.loads(out.strip().splitlines()[-1])
    # two of the six parametrized items (the first and one sampled), the benchmark left out
    assert len(records) == 2
    assert all(r["factory"] == "fakekernels.scale_kernel" for r in records)
    assert records[0]["nodeid"] == "tests/test_scale.py::test_scale[1-64]"
    assert records[0]["key"].startswith("fakekernels.scale_kernel(64,)")
    assert [r["key"] for r in ck._distinct(records + records, per_factory=5)] == [r["key"] for r in dict(
        (r["key"], r) for r in records).values()]
    assert len(ck._distinct(records, per_factory=1)) == 1


def test_a_captured_kernel_is_checked_built_and_lowered_as_tilelang_does(checkout):
    row = ck._check_one(checkout, {"nodeid": "tests/test_scale.py::test_scale[1000-128]", "factory": "scale_kernel"}, 600)
    assert row["status"] == "ok", row
    assert row["bounds"] == "ok" and row["accesses"] == row["proven"] >= 2
    assert row["dropin_build"] == "linked"
    assert row["dropin_cuda"] == "same CUDA"


def test_sample_per_test_keeps_each_functions_first_item_and_a_seeded_sample():
    from bench.foreign_suites import sample_per_test

    ids = [f"t.py::test_a[{i}]" for i in range(10)] + ["t.py::test_b[0]", "t.py::test_a_benchmark[0]", "u.py::test_a[0]"]
    kept = sample_per_test(ids, 3)
    assert kept[0] == "t.py::test_a[0]" and len([k for k in kept if k.startswith("t.py::test_a[")]) == 3
    assert "t.py::test_b[0]" in kept and "u.py::test_a[0]" in kept and not any("benchmark" in k for k in kept)
    assert kept == sample_per_test(ids, 3) and len(kept) == 5
