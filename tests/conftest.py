"""Shared pytest set-up: the `gpu` marker skips cleanly where no CUDA GPU is visible."""

import functools

import pytest


@functools.cache
def gpu_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if gpu_available():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


CPU_TARGET = {"kind": "cuda", "arch": "sm_90a"}


@pytest.fixture
def cpu_target():
    """The target every compile-only test uses: Hopper, compiled without a GPU."""
    return dict(CPU_TARGET)
