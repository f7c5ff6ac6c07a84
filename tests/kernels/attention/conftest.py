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
