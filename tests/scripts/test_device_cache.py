"""scripts/device-cache without a GPU: the newest cache entries that fit the budget go out in
parts (aliases left out), come back joined, and unpack into another cache byte for byte; `local`
does both here, without the entries built before tlx's sources were last written; no carried
archive is a no-op; unpack says whether the archive's tool versions are this machine's."""

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args, cache: Path):
    proc = subprocess.run([sys.executable, "scripts/device-cache", *map(str, args)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, TLX_CACHE_DIR=str(cache)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def _entry(cache: Path, name: str, seed: int, mtime: int) -> bytes:
    entry = cache / "kernels" / name
    entry.mkdir(parents=True)
    data = os.urandom(1 << 20) if seed else b""  # incompressible: the budget decides how many fit
    (entry / "kernel.cubin").write_bytes(data)
    (entry / "MANIFEST").write_text("{}")
    os.utime(entry, (mtime, mtime))
    return data


def test_round_trip_keeps_the_newest_entries(tmp_path):
    cache, out, archive = tmp_path / "cache", tmp_path / "out", tmp_path / "carry" / "tlx-cache.tar.xz"
    blobs = {f"k{i}": _entry(cache, f"k{i}", 1, 1_000_000 + i) for i in range(4)}
    (cache / "kernels" / "unfinished").mkdir()  # no MANIFEST: a build in progress, never packed
    os.symlink("k3", cache / "kernels" / "alias")  # a fingerprint's alias: this Python's only, never packed
    said = _run("pack", out, "--budget", "2.5", cache=cache)
    assert "2 of 4 entries" in said  # 4 MiB do not fit 2.5, the newest 2 do
    assert [p.name for p in sorted(out.iterdir())] == ["tlx-cache.tar.xz.part00"]
    _run("keep", out, "--archive", archive, cache=cache)
    other = tmp_path / "other"
    said = _run("unpack", "--archive", archive, cache=other)
    assert "built with this machine's tools: the entries can hit" in said
    assert sorted(p.name for p in (other / "kernels").iterdir()) == ["k2", "k3"]
    for name in ("k2", "k3"):
        assert (other / "kernels" / name / "kernel.cubin").read_bytes() == blobs[name]


def test_unpack_without_archive_is_a_no_op(tmp_path):
    said = _run("unpack", "--archive", tmp_path / "none.tar.xz", cache=tmp_path / "cache")
    assert "no carried cache" in said and not (tmp_path / "cache").exists()


def test_local_packs_this_machines_cache_for_the_device(tmp_path):
    """``local`` leaves out entries built before tlx's sources here were last written: their keys
    name other sources, so they cannot hit."""
    cache, archive = tmp_path / "cache", tmp_path / "carry" / "tlx-cache.tar.xz"
    _entry(cache, "stale", 1, 1_000_000)
    blob = _entry(cache, "k0", 1, int(time.time()) + 60)
    os.symlink("k0", cache / "kernels" / "alias")
    assert "1 of 1 entries" in _run("local", "--archive", archive, cache=cache)
    other = tmp_path / "other"
    _run("unpack", "--archive", archive, cache=other)
    assert [p.name for p in (other / "kernels").iterdir()] == ["k0"]
    assert (other / "kernels" / "k0" / "kernel.cubin").read_bytes() == blob


def test_unpack_says_when_the_archive_was_built_with_other_tools():
    """Entries keyed by other tool versions never hit: unpack says which tool differs (every
    device call compiled every kernel again until the toolkit was keyed by its release)."""
    import runpy

    tools_verdict = runpy.run_path(str(ROOT / "scripts" / "device-cache"))["tools_verdict"]
    here = {"tilelang": "0.1.15", "nvcc": "cuda 13.0", "tlx": "abc"}
    assert "can hit" in tools_verdict(dict(here), here)
    said = tools_verdict({**here, "nvcc": "/usr/local/cuda:30153384:1792191843000000000"}, here)
    assert said.startswith("device-cache: WARNING") and "nvcc '/usr/local/cuda:" in said and "'cuda 13.0' here" in said
    assert "does not say" in tools_verdict(None, here)
