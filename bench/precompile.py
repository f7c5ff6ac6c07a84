"""Compile a benchmark's kernel configurations in parallel processes before it touches the GPU.

One attention kernel takes about a minute to build on one core; compiled serially at first use,
a fresh GPU machine spends its time compiling, not running. Compiled here first, every later
build of the same configuration is a hit in the disk cache (``$TLX_CACHE_DIR``): milliseconds.
"""

from __future__ import annotations

import time


def compile_in_processes(compile_one, configs, workers: int) -> None:
    """``compile_one(cfg)`` (a module-level function: it runs in a worker; it returns one line of
    text) for every configuration, ``workers`` forked processes at once; prints each line and the
    total. Call it before the calling process creates a CUDA context (forked children cannot use
    one)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    t0 = time.time()
    configs = list(configs)
    with ProcessPoolExecutor(max(1, min(workers, len(configs))), mp_context=multiprocessing.get_context("fork")) as pool:
        for line in pool.map(compile_one, configs):
            print(f"# {line}", flush=True)
    print(f"# {len(configs)} configurations ready in {time.time() - t0:.0f} s", flush=True)


def build_spec(spec) -> str:
    """Build one kernel in a worker: ``spec`` = (module, factory, args, kwargs), the factory called as
    ``module.factory(*args, **kwargs)`` (``compile_in_processes``' ``compile_one`` for such specs)."""
    import importlib

    module, name, args, kwargs = spec
    t0 = time.time()
    getattr(importlib.import_module(module), name)(*args, **kwargs)
    return f"built {name}{args} in {time.time() - t0:.0f} s"
