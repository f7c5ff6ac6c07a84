"""The MoE layer's GEMM tile width on this GPU: 128-wide routed-row tiles against 192-wide tiles at every T.

``grouped_gemm.streaming_block_n`` picks the width of the layer's plain grouped GEMMs per device
(``NARROW_EVERYWHERE``); this sweep is what such a choice rests on. For each model and T the layer
(``moe_layer``) is captured as two CUDA graphs, one with the 128-wide kernel that stores routed rows
only at every T, one with the 192-wide kernel storing every row; the outputs are compared bit for
bit, then the replays are timed in turn (``bench.timing.interleaved_ms``: CUDA events, warm-up,
median). With ``--timeline T,...`` one replay of each graph at those V4-Flash sizes also runs under
the profiler: each kernel's time and the gaps between kernels.

    python3 bench/moe_tile_width.py [--flash 8,32,...] [--pro 8,128,...] [--timeline 8,512] [--reps 20] [--out FILE]
"""

import argparse
import json
import signal
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROWS = []  # the measured rows, for --out
WIDTHS = {"128 wide": lambda rows, experts, *_: 128, "192 wide": lambda rows, experts, *_: None}


def replay_timeline(graphs: dict, t: int) -> None:
    """Each kernel of one replay of each graph: start, duration and the gap after the previous kernel."""
    from torch.profiler import ProfilerActivity, profile

    for name, graph in graphs.items():
        graph.replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            graph.replay()
            torch.cuda.synchronize()
        events = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
        t0 = end = events[0].time_range.start
        gaps = 0.0
        for e in events:
            gap = e.time_range.start - end
            gaps += max(gap, 0.0)
            print(f"# T={t} {name}: at {e.time_range.start - t0:8.1f} us, gap {gap:5.1f}, {e.name[:40]:40s} "
                  f"{e.time_range.elapsed_us():8.1f} us")
            end = max(end, e.time_range.end)
        print(f"# T={t} {name}: {len(events)} kernels, span {end - t0:.1f} us, gaps {gaps:.1f} us", flush=True)


def sweep(model_name: str, tokens: list[int], timeline: set[int], reps: int) -> None:
    import kernels.moe.grouped_gemm as G
    from bench.mega_moe import captured
    from bench.timing import interleaved_ms
    from kernels.moe.pipeline import V4_FLASH, V4_PRO, moe_layer
    from kernels.moe.reference import random_layer

    model = V4_FLASH if model_name == "V4-Flash" else V4_PRO
    cfg = model["cfg"]
    layer = random_layer(model, seed=1)
    rule = G.streaming_block_n
    try:
        for t in tokens:
            g = torch.Generator(device="cuda").manual_seed(t)
            x = torch.randn(t, model["hidden"], device="cuda", generator=g).to(torch.bfloat16)
            logits = torch.randn(t, model["n_experts"], device="cuda", generator=g)
            graphs, outs = {}, {}
            for name, width in WIDTHS.items():
                G.streaming_block_n = width
                moe_layer(x, logits, *layer, cfg)  # compiles and warms outside the capture
                graphs[name], outs[name] = captured(lambda: moe_layer(x, logits, *layer, cfg))
                graphs[name].replay()
            G.streaming_block_n = rule
            torch.cuda.synchronize()
            a, b = (o.view(torch.int16) for o in outs.values())
            if not torch.equal(a, b):
                raise SystemExit(f"{model_name} T = {t}: the two widths gave different bits")
            if model_name == "V4-Flash" and t in timeline:
                replay_timeline(graphs, t)
            ms = interleaved_ms({k: v.replay for k, v in graphs.items()}, reps)
            narrow, wide = ms["128 wide"] * 1e3, ms["192 wide"] * 1e3
            print(f"| {model_name} | {t} | {narrow:.1f} | {wide:.1f} | {wide / narrow:.3f}x | bit for bit |", flush=True)
            ROWS.append({"model": model_name, "T": t, "us_128_wide": narrow, "us_192_wide": wide})
            del graphs, outs
    finally:
        G.streaming_block_n = rule
        del layer
        torch.cuda.empty_cache()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--flash", default="8,32,64,128,256,512,1024,2048,8192", help="V4-Flash T values ('' for none)")
    ap.add_argument("--pro", default="8,128,512,2048,8192", help="V4-Pro T values ('' for none)")
    ap.add_argument("--timeline", default="8,512", help="V4-Flash T values profiled as one replay")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/moe_tile_width.py needs a CUDA GPU")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # a timeout still writes --out
    ints = lambda text: [int(v) for v in text.split(",") if v]  # noqa: E731
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| model | T | 128 wide, routed rows (us) | 192 wide, every row (us) | 192 / 128 | outputs |")
    print("| --- | --- | --- | --- | --- | --- |", flush=True)
    try:
        for name, tokens in (("V4-Flash", ints(args.flash)), ("V4-Pro", ints(args.pro))):
            sweep(name, tokens, set(ints(args.timeline)), args.reps)
    finally:
        if args.out:
            Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": ROWS}, indent=1))


if __name__ == "__main__":
    main()
