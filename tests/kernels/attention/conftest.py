"""Fixtures of the attention kernel tests: CUDA baselines, built once per session (GPU tests)."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def attention_baseline():
    """name -> loaded tvm_ffi module of kernels/attention/<name>.cu (with CuTe's headers)."""
    import kernels.attention
    from tlx.numerics.parity import build_baseline

    kdir = Path(kernels.attention.__file__).parent
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = build_baseline(kdir / f"{name}.cu", with_cutlass=True)
        return cache[name]

    return get


@pytest.fixture(scope="session")
def derived_preconditions():
    """kernel -> the launch conditions the bounds verifier added beyond the kernel's assume list.
    None may restrict real launches: a precondition search once settled on 'NB <= 1' (an empty
    grid), which the launcher would have enforced on every call."""
    return lambda kernel: [p["text"] for p in kernel.metadata["preconditions"] if p["origin"] != "assume"]


@pytest.fixture(scope="session")
def deterministic():
    """kernel -> the static determinism verdict its build recorded (``tlx check --only
    determinism``): True, False or "unknown". Issue 22 asks for True on every prefill kernel."""
    return lambda kernel: kernel.metadata["reports"]["determinism"]["deterministic"]
