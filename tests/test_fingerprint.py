"""The program fingerprint (the disk-cache key of a ``@tlx.jit`` factory): it changes with every
helper, closure and imported constant the generated code depends on, and needs no source file,
so ``@tlx.jit`` works from ``python -c``, stdin, ``exec`` and notebook cells."""

import linecache
import subprocess
import sys
import textwrap
from pathlib import Path


from tlx.fingerprint import program_fingerprint

ROOT = str(Path(__file__).resolve().parents[1])

HELPERS = """
import tilelang.language as T

SHIFT = {shift}


@T.macro
def put_scaled(Y, X, i):
    Y[i] = X[i] * {factor}
"""

KERNEL = """
import tilelang.language as T
import tlx

import helpers
from helpers import put_scaled

SM90 = {"kind": "cuda", "arch": "sm_90a"}


@tlx.jit(out_idx=[-1], target=SM90)
def scaled(N, block=128):
    @T.prim_func
    def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
        with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
            for i in T.Parallel(block):
                if bx * block + i + helpers.SHIFT < N:
                    put_scaled(Y, X, bx * block + i)

    return main


def build(N, block=128):
    return scaled.get_tir(N, block)
"""


def write_modules(where: Path, factor="2.0", shift=0):
    where.mkdir(exist_ok=True)
    (where / "helpers.py").write_text(HELPERS.format(factor=factor, shift=shift))
    (where / "kern.py").write_text(KERNEL)


def run(code: str, where: Path, cache: Path, stdin: str | None = None) -> str:
    """Run ``code`` in a fresh Python (``-c``) or feed it on stdin; returns its stdout."""
    env = {"PYTHONPATH": f"{where}:{ROOT}", "TLX_CACHE_DIR": str(cache), "PATH": "/usr/local/cuda/bin:/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"}
    import os

    env = {**os.environ, **env}
    args = [sys.executable, "-"] if stdin is not None else [sys.executable, "-c", code]
    out = subprocess.run(args, input=stdin, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


PRINT_KEY = "import kern; print(kern.scaled._fingerprint())"


def test_editing_a_helper_only_the_prim_func_calls_changes_the_key(tmp_path):
    write_modules(tmp_path / "m")
    before = run(PRINT_KEY, tmp_path / "m", tmp_path / "c")
    assert run(PRINT_KEY, tmp_path / "m", tmp_path / "c") == before  # stable across processes
    write_modules(tmp_path / "m", factor="3.0")
    assert run(PRINT_KEY, tmp_path / "m", tmp_path / "c") != before


def test_editing_an_imported_constant_changes_the_key(tmp_path):
    write_modules(tmp_path / "m")
    before = run(PRINT_KEY, tmp_path / "m", tmp_path / "c")
    write_modules(tmp_path / "m", shift=1)
    assert run(PRINT_KEY, tmp_path / "m", tmp_path / "c") != before


def test_a_helper_edit_gives_a_new_build_and_a_cache_hit_otherwise(tmp_path):
    code = "import kern; k = kern.scaled(1024); print(k.directory.name, 'Y[' in k.get_kernel_source())"
    write_modules(tmp_path / "m")
    first = run(code, tmp_path / "m", tmp_path / "c")
    assert run(code, tmp_path / "m", tmp_path / "c") == first
    write_modules(tmp_path / "m", factor="3.0")
    second = run(code, tmp_path / "m", tmp_path / "c")
    assert second.split()[0] != first.split()[0]
    assert "/*3.000000e+00*/" in (tmp_path / "c" / "kernels" / second.split()[0] / "kernel.cu").read_text()


FACTORY = """
import tlx, kern
def make(N, block=128):
    return kern.build(N, block)
jf = tlx.jit(out_idx=[-1], target=kern.SM90)(make)
k = jf(1024)
print(k.directory.name, jf._fingerprint().split(':')[1][:12])
"""


def test_works_from_python_c_and_stdin(tmp_path):
    write_modules(tmp_path / "m")
    from_c = run(FACTORY, tmp_path / "m", tmp_path / "c")
    from_stdin = run("", tmp_path / "m", tmp_path / "c", stdin=FACTORY)
    assert from_c == from_stdin  # same program, same key: the second is a cache hit


def test_works_from_exec_and_from_a_notebook_cell(tmp_path):
    write_modules(tmp_path / "m")
    cell = textwrap.dedent("""
        import tilelang.language as T
        import tlx
        @tlx.jit(out_idx=[-1], target={"kind": "cuda", "arch": "sm_90a"})
        def cell_kernel(N, block=64):
            @T.prim_func
            def main(X: T.Tensor((N,), "float32"), Y: T.Tensor((N,), "float32")):
                with T.Kernel(T.ceildiv(N, block), threads=block) as bx:
                    for i in T.Parallel(block):
                        Y[bx * block + i] = X[bx * block + i] + 1.0
            return main
        """)
    notebook = f"""
import linecache
src = {cell!r}
name = "<ipython-input-7-0123456789ab>"
linecache.cache[name] = (len(src), None, src.splitlines(True), name)
ns = {{}}
exec(compile(src, name, "exec"), ns)
k = ns["cell_kernel"](256)
print(k.directory.name, k.metadata["launches"][0]["block"][0])
"""
    assert run(notebook, tmp_path / "m", tmp_path / "c").split()[1] == "64"
    plain_exec = f"ns = {{}}\nexec({FACTORY!r}, ns)"
    from_exec, from_c = run(plain_exec, tmp_path / "m", tmp_path / "c").split(), run(FACTORY, tmp_path / "m", tmp_path / "c").split()
    assert from_exec[1] == from_c[1]  # the same program (the key also names the module: builtins vs __main__)


def test_closures_defaults_and_module_attributes_are_covered():
    def make(scale):
        def f(N, block=64):
            return N * scale + block

        return f

    assert program_fingerprint(make(2)) != program_fingerprint(make(3))

    def g(N, block=64):
        return N + block

    def h(N, block=32):
        return N + block

    assert program_fingerprint(g) != program_fingerprint(h)

    class Config:
        def __init__(self, block):
            self.block = block

    def with_config(cfg):
        def f(N):
            return N + cfg.block

        return f

    assert program_fingerprint(with_config(Config(64))) != program_fingerprint(with_config(Config(128)))
    assert program_fingerprint(with_config(Config(64))) == program_fingerprint(with_config(Config(64)))
    src = "def k(N):\n    return N + 1\n"
    ns = {}
    exec(src, ns)  # no file, no linecache entry
    assert len(program_fingerprint(ns["k"])) == 64
    assert linecache.getlines("<string>") == []


def test_fingerprint_is_fast():
    import time

    import tests.jit_kernels as J

    t0 = time.perf_counter()
    program_fingerprint(J.scale.factory)
    assert time.perf_counter() - t0 < 0.01
