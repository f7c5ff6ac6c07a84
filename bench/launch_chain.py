"""A chain of dependent kernels, launched as programmatic dependents (``T.pdl_sync()``) against
ordinary launches: what a launch boundary costs on the GPU, and what tlx's launcher saves by
honouring ``has_cuda_pdl_sync`` as TileLang's wrapper does.

Each link is ``y = x * 0.5 + 1`` over 2^20 floats (4 MiB in, 4 MiB out: a few microseconds), the
next link reading the last one's output; the dependent form lets its own dependents launch at
once (``T.pdl_trigger()``) and waits for its input (``T.pdl_sync()``) before it reads it. Both
chains are captured in CUDA graphs and replayed (CUDA events, warm-up, median), on fresh random
inputs, their outputs compared bit for bit with each other and with torch first.

    python3 bench/launch_chain.py [--links N] [--reps N] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tilelang.language as T  # noqa: E402

import tlx  # noqa: E402

TARGET = {"kind": "cuda", "arch": "sm_90a"}
ELEMENTS = 1 << 20
THREADS = 256


@tlx.jit(target=TARGET)
def link(dependent: bool, n: int = ELEMENTS):
    """``Y = X * 0.5 + 1``; ``dependent``: a programmatic dependent launch."""

    @T.prim_func
    def main(X: T.Tensor((n,), "float32"), Y: T.Tensor((n,), "float32")):
        with T.Kernel(n // THREADS, threads=THREADS) as b:
            if dependent:
                T.pdl_trigger()
                T.pdl_sync()
            for i in T.Parallel(THREADS):
                Y[b * THREADS + i] = X[b * THREADS + i] * T.float32(0.5) + T.float32(1)

    return main


def chain_graph(kernel, bufs):
    """A CUDA graph of the chain bufs[0] -> bufs[1] -> ... (the kernel launched in place)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for x, y in zip(bufs, bufs[1:]):
            kernel.launch(x, y)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for x, y in zip(bufs, bufs[1:]):
            kernel.launch(x, y)
    return graph


def replay_us(graph, reps: int) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(5):
        graph.replay()
    times = []
    for _ in range(reps):
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--links", type=int, default=16)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--out")
    args = ap.parse_args()
    kernels = {"ordinary": link(False), "dependent": link(True)}
    assert [lc["programmatic_dependent"] for lc in kernels["dependent"].metadata["launches"]] == [True]
    chains = {name: [torch.empty(ELEMENTS, device="cuda") for _ in range(args.links + 1)] for name in kernels}
    graphs = {name: chain_graph(k, chains[name]) for name, k in kernels.items()}
    rows = []
    for trial in range(3):  # fresh inputs each time; the two chains' results compared first
        x = torch.randn(ELEMENTS, device="cuda")
        expected = x
        for _ in range(args.links):
            expected = expected * 0.5 + 1
        for name, bufs in chains.items():
            bufs[0].copy_(x)
            for b in bufs[1:]:
                b.fill_(float("nan"))
            graphs[name].replay()
        torch.cuda.synchronize()
        assert all(torch.equal(bufs[-1], expected) for bufs in chains.values()), "a chain's output differs from torch"
        times = {name: replay_us(g, args.reps) for name, g in graphs.items()}
        rows.append(times)
        print(f"| trial {trial} | {args.links} links | ordinary {times['ordinary']:.1f} us "
              f"({times['ordinary'] / args.links:.2f} a link) | dependent {times['dependent']:.1f} us "
              f"({times['dependent'] / args.links:.2f} a link) | saved {(times['ordinary'] - times['dependent']) / args.links:.2f} us a link |")
    if args.out:
        Path(args.out).write_text(json.dumps({"links": args.links, "elements": ELEMENTS, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
