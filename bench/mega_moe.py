"""MegaMoE against the unfused layer on one GPU, side by side in one run, both replayed from CUDA graphs.

Rows (printed as measured, so a timeout still leaves the earlier ones):
* ceilings measured in this run: device copy bandwidth (``bench.timing.large_copy_ms``, read +
  write) and the dense FP8 ``torch._scaled_mm`` rate (per-tensor scales, M = 8192, the L1 and L2
  shapes of each model; the faster of the two);
* per model and T (tokens per rank), n = 1: ``mega_moe`` with L1 + SwiGLU fused (``fused``),
  ``mega_moe(fusion="none")`` (the same protocol and waves, L1 / SwiGLU cast / L2 as three launches
  a wave: ``mega_3k``), ``mega_moe(fusion="wave")`` (L1 + SwiGLU and L2 in one kernel a wave:
  ``wave``) and the unfused layer ``moe_layer`` (``unfused``), as CUDA-graph replays
  timed in turn (``interleaved_ms``), the roofline
  max(expert weight bytes read / copy bandwidth, routed GEMM FLOPs / _scaled_mm rate) and each
  time over it. Weight bytes: the e4m3 weights and fp32 block scales of the experts that the
  routing of this input activates (each read once); FLOPs: 2 * T * k * (2I * H + H * I);
* n virtual ranks on the GPU: the same four against ``moe_layer(..., n_ranks=n)``, all as graph
  replays, and the share of the dispatch (pull) time that overlaps the rank's compute, from CUDA events on
  the ranks' streams in one eager call: (dispatch end - wave 0 ready) / dispatch time, clamped
  to [0, 1], averaged over ranks (wave 0 must arrive before any compute starts, so the part of
  the dispatch after it runs under the GEMMs of earlier waves).

Every output is compared bit for bit with the eager unfused layer before it is timed (graph replay
into a NaN-poisoned buffer). ``--precompile`` builds every kernel of the run (and of
tests/kernels/moe/mega) in parallel processes first, so that no compile lands inside a timing or a wait.
``--breakdown`` then prints each timed graph's kernels from the profiler (one replay: each kernel's
duration and the idle time before it).
Usage: python bench/mega_moe.py [--out FILE.json] [--reps N] [--models V4-Flash,V4-Pro]
       [--tokens 8,512,8192] [--ranks 2,4,8] [--rank-tokens 64,512] [--precompile] [--precompile-tests]
       [--breakdown]
(``--tokens '' --ranks '' --precompile-tests``: only build the tests' kernels.)
"""

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SMS = 132  # H200; --precompile builds for this count (the run checks it)
MODELS = {"V4-Flash": dict(hidden=4096, inter=2048, n_experts=256, topk=6, scaling=1.5),
          "V4-Pro": dict(hidden=7168, inter=3072, n_experts=384, topk=6, scaling=2.5)}
ROWS = []
# the mega_moe layers of a row: (column, fusion)
MEGA_VARIANTS = (("fused", "l1_swiglu"), ("wave", "wave"), ("mega_3k", "none"))


# (model, ranks, waves, fusions) layers of tests/kernels/moe/mega (waves None: the plan's default)
TEST_LAYERS = ([("V4-Flash", n, None, ("l1_swiglu", "wave")) for n in (1, 2, 8)]
               + [("V4-Flash", 4, None, ("l1_swiglu",)), ("V4-Flash", 1, None, ("none",)), ("V4-Flash", 2, None, ("none",))]
               + [("V4-Flash", 4, 1, ("l1_swiglu",)), ("V4-Flash", 4, 4, ("l1_swiglu", "none", "wave")),
                  ("V4-Flash", 4, 16, ("l1_swiglu",))]
               + [("V4-Pro", n, None, ("l1_swiglu", "wave")) for n in (1, 8)] + [("V4-Pro", 2, None, ("l1_swiglu",))])


# (N = 2I, K = H) of test_grouped_gemm_swiglu_bitwise_equal_to_gemm_then_swiglu_cast (tests/kernels/moe)
TEST_SWIGLU_GEMMS = ((4096, 4096), (6144, 7168), (768, 1152))


def swiglu_test_specs():
    """The fused L1 + SwiGLU GEMMs of tests/kernels/moe and the unfused pair each is compared with."""
    specs = set()
    for n, k in TEST_SWIGLU_GEMMS:
        sms = (("num_sms", SMS),)
        specs |= {("kernels.moe.grouped_gemm", "grouped_gemm_swiglu_kernel", (n, k, 10.0), sms),
                  ("kernels.moe.grouped_gemm", "grouped_gemm_contiguous_kernel", (n, k), sms),
                  ("kernels.quant.group_cast", "group_cast_kernel",
                   (n // 2, 128, "swiglu", "bfloat16", "e4m3", "fp32", False, 10.0, False, False), ())}
    return specs


def kernel_specs(layers, tests=False):
    """Every kernel that the (model, ranks, waves, fusions) layers and their unfused baselines launch (up to 16896 tokens in all, one metadata chunk size); ``tests``:
    also those of ``swiglu_test_specs``."""
    from kernels.moe.grouped_gemm_decode import CHUNKED_WIDTH, TOKENS
    from kernels.moe.mega.layer import compute_kernel_specs, make_plan
    from kernels.moe.pipeline import V4_FLASH, V4_PRO

    specs = {("kernels.moe.mega.protocol", "step_kernel", (), ()), ("kernels.moe.mega.protocol", "announce_kernel", (), ())}
    if tests:
        specs |= swiglu_test_specs()
    for name, n, waves, fusions in layers:
        m = MODELS[name]
        h, i, e, k = m["hidden"], m["inter"], m["n_experts"], m["topk"]
        p = make_plan(n, 8, h, i, e, k, SMS, waves=waves)
        specs |= {("kernels.moe.gating", "gating_kernel", (e, k, "sqrtsoftplus", 1, 1, True, m["scaling"]), ()),
                  ("kernels.quant.group_cast", "group_cast_kernel", (h, 128, "plain", "bfloat16", "e4m3", "fp32", False), ()),
                  ("kernels.quant.group_cast", "group_cast_kernel",
                   (i, 128, "swiglu", "bfloat16", "e4m3", "fp32", False, 10.0, False, True), ()),
                  ("kernels.moe.permute", "permute_fp8_kernel", (h, k), ()),
                  ("kernels.moe.permute", "permute_fp8_kernel", (h, k), (("zero_padding", False),)),  # moe_layer's
                  ("kernels.moe.permute", "combine_kernel", (h, k), ()),
                  ("kernels.moe.metadata", "metadata_kernel", (k, e // n, 128, 128), ()),
                  ("kernels.moe.metadata", "metadata_kernel", (k, e // n, 128, 128), (("single", True),)),  # one chunk
                  ("kernels.moe.mega.protocol", "exchange_kernel", (n,), ()),
                  ("kernels.moe.mega.protocol", "gather_ids_kernel", (n, k), ()),
                  ("kernels.moe.mega.protocol", "combine_kernel", (n, h, k, e // n), ()),
                  ("kernels.moe.mega.protocol", "gate_kernel", (n, p.n_waves), ())}
        # the dispatch: on one rank the triggering permute, across ranks the pull
        specs.add(("kernels.moe.permute", "permute_fp8_kernel", (h, k), (("trigger", True), ("zero_padding", False)))
                  if p.solo else ("kernels.moe.mega.protocol", "dispatch_kernel",
                                  (n, h, k, p.n_waves, p.wave_experts, p.n_local, p.dispatch_ctas), ()))
        for fusion in fusions:  # the layer's wave GEMMs on the rank's SM share, for either tile rule
            clamp = (V4_FLASH if name == "V4-Flash" else V4_PRO)["cfg"].clamp
            # a decode batch (the weights-on-M kernel) and a large one (the persistent kernels)
            for plan in (p, make_plan(n, 512, h, i, e, k, SMS, waves=waves)):
                for tiles in (plan, dataclasses.replace(plan, narrow_tiles=True)):
                    specs |= {(mod, fn, args, tuple(sorted(kw.items())))
                              for mod, fn, args, kw in compute_kernel_specs(tiles, clamp, fusion).values()}
        # moe_layer's GEMMs on every SM, in both tile widths (``streaming_block_n`` picks by T and
        # device; only the 128-wide one stores routed rows alone), and the decode kernel at every width
        specs |= {("kernels.moe.grouped_gemm", "grouped_gemm_contiguous_kernel", nk,
                   (("block_n", bn), ("num_sms", SMS), ("row_mask", bn == 128)))
                  for nk in ((2 * i, h), (h, i)) for bn in (None, 128)}
        specs |= {("kernels.moe.grouped_gemm_decode", "grouped_gemm_decode_kernel", (*nk, width), (("bounded", bounded),))
                  for nk in ((2 * i, h), (h, i)) for width, bounded in ((TOKENS[0], True), (CHUNKED_WIDTH, False))}
    return sorted(specs, key=lambda s: (not s[1].startswith("grouped_gemm"), str(s)))  # slowest first


def precompile(layers, tests=False):
    from bench.precompile import build_spec, compile_in_processes

    compile_in_processes(build_spec, [(m, f, a, dict(kw)) for m, f, a, kw in kernel_specs(layers, tests)], os.cpu_count() or 1)


def emit(**row):
    ROWS.append(row)
    cells = [str(row.get(k, "")) for k in ("model", "what", "n", "T", "fused_us", "wave_us", "mega_3k_us", "unfused_us",
                                            "roof_us", "note")]
    print("| " + " | ".join(cells) + " |", flush=True)


def scaled_mm_tflops(m, reps):
    """Dense FP8 rate of torch._scaled_mm (per-tensor scales) at M = 8192 on the L1 and L2 shapes: the faster."""
    import torch

    from bench.timing import median_ms

    best = 0.0
    for n, k in ((2 * m["inter"], m["hidden"]), (m["hidden"], m["inter"])):
        a = (torch.randn(8192, k, device="cuda") * 2).clamp(-8, 8).to(torch.float8_e4m3fn)
        b = (torch.randn(n, k, device="cuda") * 2).clamp(-8, 8).to(torch.float8_e4m3fn)
        one = torch.tensor(1.0, device="cuda")
        out = torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        assert torch.isfinite(out.float()).all()
        ms = median_ms(lambda: torch._scaled_mm(a, b.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16), reps)
        best = max(best, 2 * 8192 * n * k / ms / 1e9)
    return best


def captured(fn):
    """(graph, output) of ``fn()`` captured on a side stream; the output is poisoned before the first replay."""
    import torch

    graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        out = fn()
    torch.cuda.current_stream().wait_stream(stream)
    out.fill_(float("nan"))
    return graph, out


def overlap_share(layer, x, logits):
    """Mean over ranks of the share of the dispatch that runs after wave 0 is ready (under compute)."""
    import torch

    layer.timeline = {}
    layer(x, logits)
    torch.cuda.synchronize()
    shares = []
    for ev in layer.timeline.values():
        pull = ev["dispatch_start"].elapsed_time(ev["dispatch_end"])
        under = ev["wave0_ready"].elapsed_time(ev["dispatch_end"])
        shares.append(min(max(under, 0.0), pull) / pull if pull > 0 else 0.0)
    layer.timeline = None
    return sum(shares) / len(shares)


def print_breakdown(what, replay):
    """One replay's kernels in launch order (duration, and the idle time before each), as comment lines."""
    from bench.timing import kernel_timeline

    timeline = kernel_timeline(replay)
    end, lines = 0.0, []
    for kname, start, dur in timeline:
        lines.append(f"#   {dur:7.1f} us  (+{max(start - end, 0.0):5.1f} idle)  {kname[:90]}")
        end = max(end, start + dur)
    busy = sum(d for _, _, d in timeline)
    print(f"# breakdown {what}: {len(timeline)} kernels, {end:.1f} us from the first start to the last end, "
          f"{busy:.1f} us of kernels", *lines, sep="\n", flush=True)


def compare(name, m, layer_w, cfg, n, t, copy_gbs, tflops, reps, breakdown=False):
    """One row: mega_moe fused (L1 + SwiGLU; the whole wave) and with three-launch waves, and
    moe_layer, over n ranks at T tokens per rank, graph replays in turn; ``breakdown``: then each
    replay's kernels."""
    import torch

    from bench.timing import interleaved_ms
    from kernels.moe.mega import layer_for, mega_moe
    from kernels.moe.pipeline import moe_layer

    total = n * t
    g = torch.Generator(device="cuda").manual_seed(1000 + total)
    x = torch.randn(total, m["hidden"], device="cuda", generator=g).to(torch.bfloat16)
    logits = torch.randn(total, m["n_experts"], device="cuda", generator=g)
    ref, ids, _ = moe_layer(x, logits, *layer_w, cfg, n_ranks=n, return_routing=True)
    graphs, failed, layers = {}, {}, {}
    for what, fusion in MEGA_VARIANTS:  # a variant that fails (bits or a timeout) is named in the row, not timed
        try:
            mega_moe(x, logits, *layer_w, cfg, n_virtual_ranks=n, fusion=fusion)  # compiles nothing (precompiled), warms
            graph, out = captured(
                lambda f=fusion: mega_moe(x, logits, *layer_w, cfg, n_virtual_ranks=n, check=False, fusion=f))
            graph.replay()
            torch.cuda.synchronize()
            layers[what] = layer_for(x, *layer_w, cfg, n_virtual_ranks=n, fusion=fusion)
            layers[what].check()
            if not torch.equal(out.view(torch.int16), ref.view(torch.int16)):
                raise AssertionError("the graph replay differs from the eager unfused layer")
            graphs[what] = graph
        except (AssertionError, RuntimeError) as exc:
            failed[what] = f"{what} FAILED: {exc}"[:160]
    graph, out = captured(lambda: moe_layer(x, logits, *layer_w, cfg, n_ranks=n))
    graph.replay()
    torch.cuda.synchronize()
    if not torch.equal(out.view(torch.int16), ref.view(torch.int16)):
        raise AssertionError(f"{name} n={n} T={t}: the graph replay of moe_layer differs from the eager call")
    graphs["unfused"] = graph
    ms = interleaved_ms({what: g.replay for what, g in graphs.items()}, reps)
    for what in graphs:
        if what in layers:
            layers[what].check()
    h, i = m["hidden"], m["inter"]
    active = int(torch.unique(ids).numel())
    weight_bytes = active * (3 * i * h + (2 * i // 128) * (h // 128) * 4 + (h // 128) * (i // 128) * 4)
    flops = 2 * total * m["topk"] * 3 * i * h
    roof_us = max(weight_bytes / (copy_gbs * 1e3), flops / (tflops * 1e6))
    us = {what: ms[what] * 1e3 for what in ms}
    note = "; ".join([", ".join(f"{what} {us[what] / roof_us:.2f}x" for what in us) + " roof",
                      f"{active} experts active, {weight_bytes / 1e9:.2f} GB weights, {flops / 1e12:.2f} TFLOP",
                      *failed.values()])
    row = dict(model=name, what="layer, graph replay", n=n, T=t, roof_us=f"{roof_us:.0f}", note=note,
               active_experts=active, **{f"{what}_us": f"{us[what]:.0f}" for what in us},
               **{f"{what}_over_roof": us[what] / roof_us for what in us})
    if "fused" in us:
        row["speedup"] = us["unfused"] / us["fused"]
    if n > 1 and "fused" in layers:
        row["overlap"] = overlap_share(layers["fused"], x, logits)
        row["note"] += f"; dispatch under compute {row['overlap']:.0%}"
    emit(**row)
    if breakdown:
        for what, g in graphs.items():
            print_breakdown(f"{name} n={n} T={t} {what}", g.replay)
    del graphs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--models", default="V4-Flash")
    ap.add_argument("--tokens", default="8,512,8192", help="T (tokens per rank) of the n = 1 rows")
    ap.add_argument("--ranks", default="2,4,8", help="virtual rank counts of the EP rows ('' for none)")
    ap.add_argument("--rank-tokens", default="64,512", help="T (tokens per rank) of the EP rows")
    ap.add_argument("--precompile", action="store_true", help="build every kernel of the run first, in parallel processes")
    ap.add_argument("--breakdown", action="store_true", help="print each graph's kernels and the idle time between them")
    ap.add_argument("--precompile-tests", action="store_true",
                    help="also build the kernels of tests/kernels/moe/mega; with --tokens '' only that")
    args = ap.parse_args()
    models = args.models.split(",")
    if set(models) - set(MODELS):
        ap.error(f"--models: expected a subset of {','.join(MODELS)}, got {args.models}")
    ranks = [int(r) for r in args.ranks.split(",") if r]
    tokens = [int(v) for v in args.tokens.split(",") if v]
    layers = [(name, n, None, tuple(f for _, f in MEGA_VARIANTS)) for name in models for n in ({1} if tokens else set()) | set(ranks)]
    if args.precompile or args.precompile_tests:
        precompile(layers + (TEST_LAYERS if args.precompile_tests else []), args.precompile_tests)
    if not tokens and not ranks:
        return
    import torch

    from bench.timing import large_copy_ms
    from kernels.moe.pipeline import V4_FLASH, V4_PRO
    from kernels.moe.reference import random_layer

    if not torch.cuda.is_available():
        sys.exit("bench/mega_moe.py needs a CUDA GPU")
    if torch.cuda.get_device_properties(0).multi_processor_count != SMS and args.precompile:
        print(f"# note: {torch.cuda.get_device_properties(0).multi_processor_count} SMs, precompiled for {SMS}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # a timeout still writes --out
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    t0 = time.time()
    try:
        copy_ms, moved = large_copy_ms(args.reps)
        copy_gbs = moved / copy_ms / 1e6
        emit(what="copy d2d (read + write)", note=f"{copy_gbs:.0f} GB/s")
        print("| model | what | n | T | mega L1+SwiGLU fused us | mega wave kernel us | mega 3-launch waves us | "
              "moe_layer us | roofline us | note |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |", flush=True)
        for name in models:
            m = MODELS[name]
            cfg = (V4_FLASH if name == "V4-Flash" else V4_PRO)["cfg"]
            tflops = scaled_mm_tflops(m, args.reps)
            emit(model=name, what="dense FP8 torch._scaled_mm, M=8192", note=f"{tflops:.0f} TFLOP/s")
            layer_w = random_layer(m, seed=1)
            rows = [(1, t) for t in tokens] + [(n, int(t)) for n in ranks for t in args.rank_tokens.split(",") if t]
            for n, t in rows:
                try:
                    compare(name, m, layer_w, cfg, n, t, copy_gbs, tflops, args.reps, args.breakdown)
                except (AssertionError, RuntimeError) as exc:  # a wrong or timed-out row: say so, go on
                    emit(model=name, what="layer, graph replay", n=n, T=t, note=f"FAILED: {exc}"[:200], failed=True)
            del layer_w
            torch.cuda.empty_cache()
    finally:
        if args.out:
            Path(args.out).write_text(json.dumps({"rows": ROWS, "seconds": round(time.time() - t0, 1)}, indent=1))
    print(f"# done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
