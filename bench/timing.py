"""The one GPU timer every benchmark uses, so that their figures are comparable: CUDA events
around each call, warm-up calls first, the median over the timed calls."""

from __future__ import annotations

import statistics


def median_ms(fns, reps: int, warmup: int = 5, before=None, isolated: bool = False) -> float:
    """Median milliseconds of one call over ``reps`` calls.

    ``fns`` is a callable or a list of them cycled through (one per input set, so a call does not
    find the previous call's inputs in L2). ``before`` runs, untimed, ahead of each timed call
    (e.g. to poison the outputs). ``isolated`` waits for each call to finish before the next is
    issued, so the figure includes the host's launch path (a "per call" time); otherwise calls
    queue back to back and the figure is the GPU's time.
    """
    import torch

    fns = list(fns) if isinstance(fns, (list, tuple)) else [fns]
    for i in range(warmup):
        fns[i % len(fns)]()
    torch.cuda.synchronize()
    events = []
    for i in range(reps):
        if before is not None:
            before()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fns[i % len(fns)]()
        end.record()
        if isolated:
            end.synchronize()
        events.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def large_copy_ms(reps: int) -> tuple[float, int]:
    """The yardstick every "% of copy" is read against: a torch ``copy_`` of a 2 GiB buffer of
    random values. Returns (median ms, bytes read + written)."""
    import torch

    src = torch.randn(1 << 29, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms([lambda: dst.copy_(src)], reps)
    assert torch.equal(dst, src), "the yardstick copy is wrong"
    return ms, 2 * src.numel() * src.element_size()


def same_size_copies(moved: int, count: int = 1) -> list:
    """``count`` callables, each a torch ``copy_`` between its own pair of buffers of random bytes
    that moves ``moved`` bytes (half read, half written): the yardstick for a kernel of that size,
    whose launch (and last wave) a copy pays too. Each checks its own result first."""
    import torch

    g = torch.Generator(device="cuda").manual_seed(1)
    fns = []
    for _ in range(count):
        src = torch.randint(1, 256, (max(moved // 2, 1),), dtype=torch.uint8, device="cuda", generator=g)
        dst = torch.empty_like(src)
        dst.copy_(src)
        assert torch.equal(dst, src)
        fns.append(lambda s=src, d=dst: d.copy_(s))
    return fns


def interleaved_ms(fns: dict, reps: int, warmup: int = 3, queued: bool = False) -> dict:
    """Median milliseconds of each named callable in ``fns``, timed one call of each in turn, so
    that every candidate meets the same clocks and temperature: a board at its power limit moves
    its clocks within seconds, and timing candidates one after another favours whichever runs
    first. Each call is waited for (the figure includes the host's path to the launch), unless
    ``queued``: then the calls queue back to back and each figure is the GPU's time of its call
    (for kernels that outlast their host path, e.g. a wrapper's checks and allocations)."""
    import torch

    for f in fns.values():
        for _ in range(warmup):
            f()
    torch.cuda.synchronize()
    times = {name: [] for name in fns}
    for _ in range(reps):
        for name, f in fns.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            f()
            end.record()
            if not queued:
                end.synchronize()
            times[name].append((start, end))
    torch.cuda.synchronize()
    return {name: statistics.median(s.elapsed_time(e) for s, e in t) for name, t in times.items()}


def gpu_bench_args(doc: str, script: str, reps: int = 30):
    """The command line of a GPU-only benchmark: ``--out`` (its rows as JSON) and ``--reps``;
    exits with a message where no CUDA GPU is visible."""
    import argparse
    import sys

    import torch

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--out", help="write the rows as JSON here")
    parser.add_argument("--reps", type=int, default=reps)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit(f"{script} needs a CUDA GPU")
    return args


def kernel_timeline(fn) -> list:
    """(name, start µs, duration µs) of every GPU kernel, copy and memset of one ``fn()`` (after a
    warm call; times from its first kernel's start), from the profiler: where a layer's time goes
    between its kernels, gaps included (a CUDA graph's replay shows each node)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    t0 = events[0].time_range.start if events else 0
    return [(e.name, e.time_range.start - t0, e.time_range.end - e.time_range.start) for e in events]
