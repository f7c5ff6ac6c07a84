"""On the GPU: the static bank-conflict prediction equals Nsight Compute's counters."""

import csv
import io
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.passes.layout_corpus.kernels import NCU_CASES
from tlx.lowering import lower
from tlx.passes.banks import predict_ncu

REPO = Path(__file__).resolve().parents[2]
METRICS = {"ld": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum", "st": "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum"}


def measure(name: str) -> dict:
    """Run the case once under ncu and return the two counters of its (single) kernel launch."""
    ncu = shutil.which("ncu")
    if ncu is None:
        pytest.skip("ncu not on PATH")
    cmd = [ncu, "--clock-control", "none", "--csv", "--kernel-name", "regex:main_kernel", "--metrics", ",".join(METRICS.values()),
           sys.executable, "-m", "tests.passes.layout_corpus.ncu_driver", name]
    env = dict(os.environ, PYTHONPATH=f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = [line for line in out.stdout.splitlines() if line.startswith('"')]
    assert rows, f"no ncu CSV rows:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    got = {}
    for row in csv.DictReader(io.StringIO("\n".join(rows))):
        for key, metric in METRICS.items():
            if row.get("Metric Name") == metric:
                got[key] = got.get(key, 0) + int(float(row["Metric Value"].replace(",", "")))
    assert set(got) == {"ld", "st"}, got
    return got


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(NCU_CASES))
def test_static_bank_conflicts_equal_ncu(name):
    func, configs = NCU_CASES[name]()
    predicted = predict_ncu(lower(func, {"kind": "cuda", "arch": "sm_90a"}, configs))
    assert measure(name) == predicted
