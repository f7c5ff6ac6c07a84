"""Fixtures of the MoE kernel tests: CUDA baselines (built once per session) and inputs."""

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def baseline():
    """name -> loaded tvm_ffi module of kernels/moe/<name>.cu (GPU tests only)."""
    import kernels.moe
    from tlx.numerics.parity import build_baseline

    kdir = Path(kernels.moe.__file__).parent
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = build_baseline(kdir / f"{name}.cu")
        return cache[name]

    return get


def _random_e4m3(shape, device):
    """Random finite e4m3 values over the whole code range (NaN codes 0x7F/0xFF excluded)."""
    import torch

    bits = torch.randint(0, 0x7F, shape, dtype=torch.uint8, device=device)
    sign = torch.randint(0, 2, shape, dtype=torch.uint8, device=device) << 7
    return (bits | sign).view(torch.float8_e4m3fn)


def _small_e4m3(shape, device):
    """e4m3 values of moderate size (|v| <= 8) from a normal draw, like quantized activations."""
    import torch

    return (torch.randn(shape, device=device) * 2).clamp(-8, 8).to(torch.float8_e4m3fn)


@pytest.fixture(scope="session")
def e4m3():
    """Random e4m3 tensor makers: ``e4m3.wide(shape, dev)`` (all finite codes), ``e4m3.small``."""
    from types import SimpleNamespace

    return SimpleNamespace(wide=_random_e4m3, small=_small_e4m3)


class _FakeGroup:
    """What the expert-parallel layers ask of a process group before any communication: its
    size and this process's rank."""

    def __init__(self, size, rank=0):
        self._size, self._rank = size, rank

    def size(self):
        return self._size

    def rank(self):
        return self._rank


@pytest.fixture
def fake_group():
    """``fake_group(size, rank=0)``: a stand-in process group for argument checks (CPU)."""
    return _FakeGroup
