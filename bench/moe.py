"""MoE building blocks and the unfused layer on one GPU, side by side in one run.

Rows (printed as they are measured, so a timeout still leaves the earlier ones):
* copy: device-to-device copy bandwidth (read + write) of ``bench.timing.large_copy_ms``, the
  yardstick of the memory-bound steps;
* gating / metadata / permute / combine at T = 8192 (V4-Flash and V4-Pro): time and bandwidth
  as a share of the copy's and against a copy of the same bytes timed the same way, per call
  (CUDA events around the Python call: host overhead included) and GPU time only (profiler
  kernel durations);
* grouped FP8 GEMM (L1 and L2 of both models, T = 8192 routing) in TFLOP/s over the routed
  rows, next to torch._scaled_mm on the dense shape of the same rows (row-wise and per-tensor
  scales; ``bench/grouped_gemm.py`` also times its blockwise form, the same recipe);
* the whole layer (gating -> combine) at T in {8, 512, 8192}, called from Python and replayed
  from a CUDA graph (bitwise equal).

Timing: CUDA events, warm-up, median of repeats; inputs random and fresh per row; outputs are
checked (finite, non-zero; GEMM rows against a float64 reference) before they are timed.
Usage: python bench/moe.py [--out FILE.json] [--reps N] [--models V4-Flash] [--layer-only] [--tokens 8,512]
"""

import argparse
import json
import signal
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import interleaved_ms, large_copy_ms, median_ms, same_size_copies  # noqa: E402
from kernels.moe import reference as R  # noqa: E402
from kernels.moe.gating import gating  # noqa: E402
from kernels.moe.grouped_gemm import grouped_gemm_contiguous  # noqa: E402
from kernels.moe.metadata import metadata_buffers, routing_metadata  # noqa: E402
from kernels.moe.permute import combine, permute  # noqa: E402
from kernels.moe.pipeline import V4_FLASH, V4_PRO, moe_layer  # noqa: E402

CUDA = "cuda"
ROWS = []


def per_call_ms(fn, reps):
    """Milliseconds per ``fn()`` as a caller sees it: each call waited for, host launch path included."""
    return median_ms(fn, reps, warmup=3, isolated=True)


def gpu_time(fn, reps):
    """Milliseconds of GPU work per ``fn()`` (summed kernel, copy and memset durations from the
    profiler): the kernels' own time, without the host's launch overhead that ``timeit`` sees."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return sum(e.self_device_time_total for e in prof.key_averages()) / reps / 1e3


def emit_both(name, what, t, fn, gb, copy_gbs, reps):
    """Two rows: per call (CUDA events around the Python call) and GPU time only, each against the
    large copy's rate and against a copy of the same bytes timed the same way (which pays the
    launch too: the rate a kernel of this size can reach)."""
    [copy] = same_size_copies(int(gb * 1e9))
    for how, timer in (("per call", per_call_ms), ("GPU time", gpu_time)):
        ms, copy_ms = timer(fn, reps), timer(copy, reps)
        rate = gb / ms * 1e3
        emit(model=name, what=f"{what} ({how})", T=t, ms=f"{ms:.3f}", rate=f"{rate:.0f} GB/s",
             vs=f"{rate / copy_gbs:.0%} of copy, {copy_ms / ms:.0%} of a same-size copy")


def emit(**row):
    ROWS.append(row)
    cells = [str(row.get(k, "")) for k in ("model", "what", "T", "ms", "rate", "vs")]
    print("| " + " | ".join(cells) + " |", flush=True)


def check(name, t):
    if not torch.isfinite(t.float()).all() or not t.float().abs().sum() > 0:
        raise AssertionError(f"{name}: output not finite or all zero")


def copy_bandwidth(reps):
    """The yardstick every other bench reads "% of copy" against (``bench.timing.large_copy_ms``)."""
    ms, moved = large_copy_ms(reps)
    gbs = moved / ms / 1e6
    emit(what="copy d2d", T="", ms=f"{ms:.3f}", rate=f"{gbs:.0f} GB/s", vs="")
    return gbs


def memory_steps(name, model, copy_gbs, reps):
    cfg = model["cfg"]
    t, h, e, k = 8192, model["hidden"], model["n_experts"], cfg.topk
    logits = torch.randn(t, e, device=CUDA)
    ids, w = gating(logits, None, k, cfg.score_func, routed_scaling=cfg.routed_scaling)
    assert ids.min() >= 0 and ids.max() < e and torch.isfinite(w).all()
    emit_both(name, "gating", t, lambda: gating(logits, None, k, cfg.score_func, routed_scaling=cfg.routed_scaling),
              (t * e * 4 + t * k * 8) / 1e9, copy_gbs, reps)
    meta = routing_metadata(ids, e)
    assert int(meta["counts"].sum()) == t * k
    # bytes any implementation moves: ids read once, row_of and the used entry_of_row rows written
    moved = (2 * t * k * 4 + int(meta["offsets"][-1]) * 4) / 1e9
    emit_both(name, "metadata", t, lambda: routing_metadata(ids, e), moved, copy_gbs, reps)
    # like the copy, into buffers that exist already
    bufs = metadata_buffers(ids, e)
    assert torch.equal(routing_metadata(ids, e, out=bufs)["row_of"], meta["row_of"])
    emit_both(name, "metadata, reused buffers", t, lambda: routing_metadata(ids, e, out=bufs), moved, copy_gbs, reps)
    xq = (torch.randn(t, h, device=CUDA) * 2).clamp(-8, 8).to(torch.float8_e4m3fn)
    xs = torch.rand(t, h // 128, device=CUDA)
    xp, _ = permute(xq, meta, k, xs)
    used = int(meta["offsets"][-1])
    check("permute", xp[:used].float())
    emit_both(name, "permute e4m3", t, lambda: permute(xq, meta, k, xs), 2 * used * (h + h // 128 * 4) / 1e9, copy_gbs, reps)
    y = torch.randn(xp.shape[0], h, device=CUDA).to(torch.bfloat16)
    check("combine", combine(y, meta["row_of"], w))
    emit_both(name, "combine", t, lambda: combine(y, meta["row_of"], w), (t * k * h * 2 + t * h * 2) / 1e9, copy_gbs, reps)
    return meta


def gemm_rows(name, model, layer, meta, reps):
    w1, s1, w2, s2 = layer
    used = int(meta["offsets"][-1])
    routed = int(meta["counts"].sum())
    for what, w, s in (("L1 GEMM", w1, s1), ("L2 GEMM", w2, s2)):
        n, k = w.shape[1], w.shape[2]
        rows = meta["entry_of_row"].shape[0]
        a = (torch.randn(rows, k, device=CUDA) * 2).clamp(-8, 8).to(torch.float8_e4m3fn)
        sa = torch.rand(rows, k // 128, device=CUDA) + 0.5
        out = grouped_gemm_contiguous(a, sa, w, s, meta["block_expert"])
        sample = torch.arange(0, used, max(1, used // 64), device=CUDA)
        blocks = meta["block_expert"][(sample // 128)].long()
        ref = torch.stack([R.dequant_rows_ref(a[r], sa[r]) @ R.dequant_blocks_ref(w[b], s[b]).T
                           for r, b in zip(sample.tolist(), blocks.tolist())])
        err = R.rel_error(out[sample], ref)
        assert err < 5e-3, f"{what}: rel err {err}"
        ms = per_call_ms(lambda: grouped_gemm_contiguous(a, sa, w, s, meta["block_expert"], out=out), reps)
        tf = 2 * routed * n * k / ms / 1e9
        tf_pad = 2 * used * n * k / ms / 1e9
        emit(model=name, what=f"{what} (N={n}, K={k}) tlx", T=8192, ms=f"{ms:.3f}",
             rate=f"{tf:.0f} TFLOP/s routed ({tf_pad:.0f} padded)", vs=f"rel err {err:.1e}")
        dense_a = a[:used]
        bt = w[0].t()  # [K, N] column-major, as _scaled_mm wants
        for label, sc_a, sc_b in (("row-wise", torch.rand(used, 1, device=CUDA) + 0.5, torch.rand(1, n, device=CUDA) + 0.5),
                                  ("per-tensor", torch.tensor(1.0, device=CUDA), torch.tensor(1.0, device=CUDA))):
            try:
                ms_d = per_call_ms(lambda: torch._scaled_mm(dense_a, bt, scale_a=sc_a, scale_b=sc_b, out_dtype=torch.bfloat16), reps)
            except Exception as exc:  # shapes or scale modes torch does not support
                emit(model=name, what=f"{what} torch._scaled_mm {label}", T=8192, ms="n/a", rate=repr(exc)[:60], vs="")
                continue
            tf_d = 2 * used * n * k / ms_d / 1e9
            emit(model=name, what=f"{what} dense torch._scaled_mm {label} (M={used})", T=8192, ms=f"{ms_d:.3f}",
                 rate=f"{tf_d:.0f} TFLOP/s", vs=f"tlx at {tf_pad / tf_d:.0%}")


def layer_rows(name, model, layer, reps, tokens=(8, 512, 8192)):
    cfg = model["cfg"]
    for t in tokens:
        x = torch.randn(t, model["hidden"], device=CUDA).to(torch.bfloat16)
        logits = torch.randn(t, model["n_experts"], device=CUDA)
        out = moe_layer(x, logits, *layer, cfg)
        check("layer", out)
        note = ""
        if t == 8:
            ref = R.moe_ref(x, logits, None, *layer, topk=cfg.topk, score_func=cfg.score_func,
                            routed_scaling=cfg.routed_scaling, clamp=cfg.clamp)
            note = f"rel err vs float64 {R.rel_error(out, ref):.1e}"
        # The same layer captured in a CUDA graph (no host launch path: what a serving loop pays).
        # Every shape is static given T and nothing syncs, so the capture replays it as it is.
        graph, stream = torch.cuda.CUDAGraph(), torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
            replayed = moe_layer(x, logits, *layer, cfg)
        torch.cuda.current_stream().wait_stream(stream)
        replayed.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        if not torch.equal(replayed.view(torch.int16), out.view(torch.int16)):
            raise AssertionError(f"{name} T={t}: the graph replay differs from the eager layer")
        # call by call in turn: the board's clocks move between seconds (power limit)
        ms = interleaved_ms({"eager": lambda: moe_layer(x, logits, *layer, cfg), "graph": graph.replay}, reps)
        emit(model=name, what="whole layer (unfused)", T=t, ms=f"{ms['eager']:.3f}",
             rate=f"{ms['eager'] * 1e3:.0f} us/layer", vs=note)
        emit(model=name, what="whole layer (CUDA graph replay)", T=t, ms=f"{ms['graph']:.3f}",
             rate=f"{ms['graph'] * 1e3:.0f} us/layer", vs="bitwise equal to the eager call")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the rows as JSON here")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--models", default="V4-Flash,V4-Pro", help="a subset of V4-Flash,V4-Pro")
    ap.add_argument("--layer-only", action="store_true", help="only the whole-layer rows")
    ap.add_argument("--tokens", default="8,512,8192", help="T of the whole-layer rows")
    args = ap.parse_args()
    tokens = [int(t) for t in args.tokens.split(",")]
    if set(args.models.split(",")) - {"V4-Flash", "V4-Pro"}:
        ap.error(f"--models: expected a subset of V4-Flash,V4-Pro, got {args.models}")
    torch.manual_seed(0)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(124))  # a timeout still writes --out
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| model | what | T | ms | rate | vs |")
    print("| --- | --- | --- | --- | --- | --- |", flush=True)
    t0 = time.time()
    try:
        copy_gbs = None if args.layer_only else copy_bandwidth(args.reps)
        models = {"V4-Flash": V4_FLASH, "V4-Pro": V4_PRO}
        for name in args.models.split(","):
            model = models[name]
            if not args.layer_only:
                meta = memory_steps(name, model, copy_gbs, args.reps)
            layer = R.random_layer(model, seed=1)
            if not args.layer_only:
                gemm_rows(name, model, layer, meta, args.reps)
            layer_rows(name, model, layer, args.reps, tokens)
            del layer
            torch.cuda.empty_cache()
    finally:
        if args.out:
            Path(args.out).write_text(json.dumps({"rows": ROWS, "seconds": round(time.time() - t0, 1)}, indent=1))
    print(f"# done in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
