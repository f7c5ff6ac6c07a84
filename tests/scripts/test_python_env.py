"""scripts/python-env: the README's two commands never pip-install into a distribution Python.

A fake ``python3`` first on PATH behaves like Debian's: it runs Python, but refuses
``python3 -m pip install`` with PEP 668's "externally-managed-environment". The scripts must then
create and use ``.venv`` in the checkout; inside an active virtual environment they use it as is.
"""

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "python-env"


def _fake_distribution_python(bin_dir: Path, real: str) -> None:
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    fake.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = -m ] && [ "$2" = pip ] && [ "$3" = install ]; then\n'
        '  echo "error: externally-managed-environment" >&2; exit 1\n'
        "fi\n"
        f'exec "{real}" "$@"\n'
    )
    fake.chmod(0o755)


def _checkout_copy(tmp_path: Path) -> Path:
    root = tmp_path / "checkout"
    (root / "scripts").mkdir(parents=True)
    shutil.copy(SCRIPT, root / "scripts" / "python-env")
    return root


def _env_without_venv(path_head: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONHOME")}
    env["PATH"] = f"{path_head}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture
def base_python() -> str:
    """An interpreter outside any virtual environment (the base of the one running the tests)."""
    exe = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not exe.exists():
        pytest.skip(f"no base interpreter at {exe}")
    return str(exe)


def test_outside_a_venv_the_scripts_create_and_use_dot_venv(tmp_path, base_python):
    _fake_distribution_python(tmp_path / "bin", base_python)
    root = _checkout_copy(tmp_path)
    env = _env_without_venv(tmp_path / "bin")
    refused = subprocess.run(["python3", "-m", "pip", "install", "nothing"], env=env, capture_output=True, text=True)
    assert refused.returncode == 1 and "externally-managed-environment" in refused.stderr  # the fake is faithful

    out = subprocess.run(["bash", str(root / "scripts" / "python-env")], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    py = Path(out.stdout.strip())
    assert py == root / ".venv" / "bin" / "python"
    probe = subprocess.run([str(py), "-c", "import sys; print(sys.prefix != sys.base_prefix)"], capture_output=True, text=True)
    assert probe.stdout.strip() == "True"
    assert subprocess.run([str(py), "-m", "pip", "--version"], capture_output=True).returncode == 0

    again = subprocess.run(["bash", str(root / "scripts" / "python-env")], env=env, capture_output=True, text=True)
    assert again.stdout.strip() == str(py)  # reused, not recreated


def test_inside_an_active_venv_the_scripts_use_it_and_create_nothing(tmp_path, base_python):
    active = tmp_path / "active"
    venv.EnvBuilder(with_pip=False).create(active)
    root = _checkout_copy(tmp_path)
    env = _env_without_venv(active / "bin")
    env["VIRTUAL_ENV"] = str(active)
    out = subprocess.run(["bash", str(root / "scripts" / "python-env")], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).parent == active / "bin"
    assert not (root / ".venv").exists()


def test_readme_commands_install_through_python_env():
    scripts = SCRIPT.parent
    for name in ("test", "quickstart"):
        text = (scripts / name).read_text()
        assert "scripts/python-env" in text
        assert "python3 -m pip" not in text
