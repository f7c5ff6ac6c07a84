"""scripts/gpu-check without a GPU: the GPU tests skip, the script still writes its summary and log
archive, and the precompile it starts beside pytest (for a path that covers the MegaMoE tests)
is stopped with all its worker processes when pytest ends."""

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(tmp_path, *paths, **env):
    out = tmp_path / "out"
    proc = subprocess.run(["bash", "scripts/gpu-check", *paths], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          # the script runs `python3`: this interpreter's (a virtual environment's), not the system's
                          env=dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                                   OUT=str(out), TLX_BENCH="none", TLX_GPU_WORKERS="1",
                                   TLX_CACHE_DIR=str(tmp_path / "cache"), **env))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    with tarfile.open(out / "gpu-logs.tar.gz") as tar:
        names = {Path(n).name for n in tar.getnames()}
    return (out / "summary.txt").read_text(), names


def _precompile_processes() -> list[str]:
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout.splitlines()
    return [line for line in ps if "bench/mega_moe.py --tokens" in line]


def test_summary_without_gpu(tmp_path):
    summary, names = _run(tmp_path, "tests/test_jit.py")
    assert "gpu tests:" in summary and "skipped" in summary
    assert "gpu-tests.log" in names and "precompile-mega.log" not in names  # a single file starts no precompile


def test_precompile_stopped_with_its_workers(tmp_path):
    assert not _precompile_processes()
    summary, names = _run(tmp_path, "tests/kernels/moe/mega")
    assert "precompile-mega.log" in names and "precompile-decode.log" not in names
    time.sleep(1)
    assert not _precompile_processes()
    _, names = _run(tmp_path, "tests/kernels/moe/mega", TLX_PRECOMPILE="0")
    assert "precompile-mega.log" not in names
