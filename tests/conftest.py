"""Shared pytest set-up: the `gpu` marker skips cleanly where no CUDA GPU is visible.

Under pytest-xdist (``scripts/gpu-check`` runs ``-n N --dist loadgroup``) several workers share
one GPU: modules that hold tens of GiB (full V4 layers) carry ``xdist_group("gpu_memory")`` so they
run one after another in one worker, the IEEE sweeps (a few GiB each) share a second group, and
every GPU test hands its cached blocks back to the driver when it ends, so that one worker's cache
cannot starve the others into out-of-memory failures."""

import functools

import pytest


@functools.cache
def gpu_available() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except Exception:
        return False


def pytest_configure(config):
    # xdist registers this marker itself; without xdist (the CPU CI) it is only a label.
    config.addinivalue_line("markers", "xdist_group(name): run in one xdist worker with its group")


@pytest.fixture(autouse=True)
def _release_gpu_cache(request):
    yield
    if "gpu" in request.keywords and gpu_available():
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()


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
