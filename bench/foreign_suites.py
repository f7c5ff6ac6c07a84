"""What running another project's TileLang test suite takes here: the import its newer TileLang
has, and a sample of its parametrized items.

DeepSeek's TileKernels is written against a newer TileLang than 0.1.15. Its one import that
0.1.15 lacks, ``tilelang.utils.target.determine_target``, is 0.1.15's
``tilelang.backend.target.determine_target``. Its suite parametrizes each test over thousands of
shapes and dtypes; ``sample_per_test`` keeps each test function's first item and a seeded sample.
"""

from __future__ import annotations

import random
import sys
import types


def serve_newer_imports(auto_target: dict | None = None) -> None:
    """Serve ``tilelang.utils.target`` where TileLang lacks it; with ``auto_target``, its
    ``determine_target("auto")`` answers that target (a machine with no device to probe)."""
    import tilelang.utils

    try:
        import tilelang.utils.target  # noqa: F401  (a TileLang that has it: nothing to serve)

        return
    except ImportError:
        pass
    import tilelang.backend.target as backend_target

    shim = types.ModuleType("tilelang.utils.target")

    def determine_target(target="auto", return_object=False):
        chosen = auto_target if target == "auto" and auto_target is not None else target
        return backend_target.determine_target(chosen, return_object=return_object)

    shim.determine_target = determine_target
    sys.modules["tilelang.utils.target"] = shim
    tilelang.utils.target = shim


def sample_per_test(nodeids: list[str], per_test: int, seed: int = 0) -> list[str]:
    """Of each test function's items (``file::name[params]``, in order): the first and a sample of
    ``per_test - 1`` others drawn with ``seed``; items named ``*benchmark*`` are left out."""
    groups: dict[str, list[str]] = {}
    for nodeid in nodeids:
        if "benchmark" in nodeid.split("::", 1)[-1]:
            continue
        groups.setdefault(nodeid.split("[", 1)[0], []).append(nodeid)
    rng = random.Random(seed)
    return [n for group in groups.values() for n in group[:1] + rng.sample(group[1:], min(per_test - 1, len(group) - 1))]
