"""Attention for prefill and training on one GPU, side by side with torch SDPA in one run.

Rows (printed as they are measured, so a timeout still leaves the earlier ones), all bf16:

* dense forward, MHA, non-causal and causal, at b 8 h 32 s 4096 with d 64 and 128, and b 4 h 16
  s 4096 with d 256: tlx (``kernels/attention/dense_fwd.py``, both schedules: "pipelined",
  TileLang's warp specialization, and "overlap", the hand-scheduled softmax / tensor-core overlap)
  against torch SDPA (``scaled_dot_product_attention`` on the same [b, s, h, d] tensors, viewed
  [b, h, s, d]); 4 b h s^2 d FLOPs, half of it causal;
* dense backward at the same shapes: tlx (``dense_bwd.py``: delta, dK/dV, dQ, deterministic)
  against SDPA's backward (``torch.autograd.grad`` of its output); 2.5 times the forward's FLOPs
  (the usual count: five s x s GEMMs of which the forward has two);
* DeepSeek-V4 sparse forward (``sparse_fwd.py``) at b 1 s 4096 h 128 n 8192 d 512 top-k 1024,
  no torch counterpart (anchors in the issue); 4 b s h k 512 FLOPs;
* its deterministic backward (``sparse_bwd.py``) at the same shape, from the forward's o and lse;
  2.5 times the forward's FLOPs (five s x k GEMMs per head where the forward has two: S, dP,
  dQ and the two of G; the delta / dsink / per-key sums not counted). Checked, before timing:
  every gradient element written (no NaN, outputs poisoned), dq of the first 32 tokens against
  autograd of the fp32 reference on those tokens (a token's dq depends on that token only), and
  dkv and dsink of the backward run on those 32 tokens alone against the same autograd (the
  full shape's dkv and dsink sum over all 4096 tokens: not checked there).

Targets (issue 22): dense forward >= 650 / 580 TFLOP/s at d 128 and faster than SDPA at d 64 and
256; backward >= SDPA's; sparse forward >= 550.

Timing: ``bench.timing.interleaved_ms`` (CUDA events around each call, one call of each
candidate in turn, warm-up, median); inputs random normal, fresh per row. Before timing, every
tlx output (poisoned with NaN first) is checked: dense against SDPA (relative error < 1e-2
forward, < 3e-2 backward per gradient, no NaN), sparse against the fp32 reference on its first
32 tokens; a failed check is reported in the row and that candidate is not timed.

Every kernel the run uses is compiled first, in parallel processes (a hit in the disk cache,
``$TLX_CACHE_DIR``, costs milliseconds), so the timed part never waits for a compile. Without a
warm cache (another cache directory, or any edit under tlx/, whose source hash is part of every
cache key) each kernel was built serially at first use, about a minute each on one core: the
first row alone needs two forward kernels (57 s and 92 s in the H200 precompile log), the likely
reason the H200 run of 2026-12-02 printed no row within 150 s.

Sweep (``--sweep``): the candidate configurations of the dense kernels (``SWEEP_FORWARD``,
``SWEEP_BACKWARD``: consumer warpgroups, ping-pong turns, stages of the forward; block sizes of
the backward) at the same shapes, each beside SDPA in one interleaved timing per row; every
candidate is checked against SDPA as above and, as they all keep the sums' order, for the same
bits as the first candidate (``bits`` column); the fastest passing candidate of each row
is printed last (``winner``). Compiles only the sweep's kernels in parallel (about three rounds
of a minute on 16 cores).

Usage: python bench/attention_prefill.py [--out FILE.json] [--reps N]
       python bench/attention_prefill.py --sweep [--out FILE.json] [--reps N]
       python bench/attention_prefill.py --sweep-backward [--out FILE.json] [--reps N]   (the
       backward's candidates alone, from the default forward's output)
       python bench/attention_prefill.py --sweep-forward [--out FILE.json] [--reps N]   (the forward's alone)
       ... --sweep[-forward|-backward] --dim D   (one head dim's candidates: a device call may not fit all)
       ... --sweep-forward --only "WORDS[|WORDS...]"   (the forward candidates whose name contains one; =NAME: that one)
       python bench/attention_prefill.py --precompile-sweep [WORKERS]   (the sweep's kernels only)
       python bench/attention_prefill.py --precompile [WORKERS]   (no GPU needed: compiles every
       kernel configuration the attention GPU tests and this benchmark use, WORKERS processes at
       once, into $TLX_CACHE_DIR, so that a fresh GPU machine spends its time running, not compiling;
       where the CUDA driver library is installed, also the tests' nvcc build of dense_fwd.cu)
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

ROWS = []
SHAPES = [(8, 32, 4096, 64), (8, 32, 4096, 128), (4, 16, 4096, 256)]  # b, h, s, d
SPARSE_SHAPE = (1, 4096, 128, 8192, 1024)  # b, s, h, n, top-k (d = 512)
SCHEDULE_NAMES = ("pipelined", "overlap")


# ---- the kernels the run and the tests compile --------------------------------------------------
def dense_forward_configs(dims=(64, 128, 256), dtypes=("bfloat16",)):
    return [("forward", sc, dt, d, c) for sc in SCHEDULE_NAMES for dt in dtypes for d in dims for c in (False, True)]


def backward_configs(dims=(64, 128, 256)):
    return [("backward", d, c) for d in dims for c in (False, True)]


SPARSE_SCHEDULES = ("pipelined", "producer", "independent", "alternate")  # kernels/attention/sparse_fwd.py's SCHEDULES, timed side by side


BENCH_CONFIGS = (dense_forward_configs() + backward_configs()
                 + [("sparse", SPARSE_SHAPE[2], SPARSE_SHAPE[4], 0, schedule) for schedule in SPARSE_SCHEDULES]
                 + [("sparse_bwd", SPARSE_SHAPE[2], SPARSE_SHAPE[4], 0)])
TEST_CONFIGS = (dense_forward_configs(dims=(128,), dtypes=("float16",))
                + [("forward", "overlap", "bfloat16", 64, False, 0.3)]
                + [("sparse", h, k, w, schedule) for h, k, w in ((64, 512, 0), (128, 2048, 0), (64, 512, 128), (128, 512, 0),
                                                                  (64, 1024, 0)) for schedule in SPARSE_SCHEDULES]
                + [("sparse_bwd", h, k, w) for h, k, w in ((64, 512, 0), (128, 512, 0), (64, 1024, 0), (128, 1024, 0),
                                                            (64, 512, 128), (128, 512, 64))])


# ---- the sweep's candidates: name -> keyword options (forward) or tiles (backward) -----------
def _sweep_forward():
    """Forward candidates per head dim ("overlap" schedule; the first is the reference of the
    ``bits`` column; the default is ``dense_fwd.DEFAULT_OPTIONS``, set from this sweep). Three
    consumers only at d 64 (160 registers a thread hold its 32 + 64 + 32 fragment registers;
    d 128 and 256 need more); three stages only where they fit shared memory (d <= 128). Wider or
    narrower key blocks than ``block_n_for`` (176 at d 128, 80 at d 256: FlashAttention-3's tiles;
    224 KB of shared memory at d 256) give other bits than its blocks (``dense_fwd.cu`` takes the
    block too)."""
    base = {"overlap": {}, "pingpong": {"pingpong": True}}
    fast = {"fast_exp2": True}  # exp2 as one instruction (dense_fwd_overlap_kernel)
    heavy = {"heavy_first": True}  # causal: the tiles with the most keys first (a no-op without causal)
    persist = {"persistent": True}  # one CTA a SM walking the tiles (dense_fwd_persistent_kernel)
    lazy = {"lazy_rescale": True}  # O's rescale skipped by a thread whose rows' maxima did not move (same bits)
    pinned = {"pinned_softmax": True}  # the softmax pinned above the wait for P V (same bits)
    return {64: {**base, "3 consumers": {"consumers": 3}, "3 consumers pingpong": {"consumers": 3, "pingpong": True},
                 "3 consumers, fast exp2": {"consumers": 3, **fast}, "3 consumers, heavy first": {"consumers": 3, **heavy},
                 "3 consumers, 3 stages, fast exp2": {"consumers": 3, "num_stages": 3, **fast},
                 "3 consumers, fast exp2, persistent": {"consumers": 3, **fast, **persist},
                 "3 consumers, fast exp2, lazy rescale": {"consumers": 3, **fast, **lazy},
                 "3 consumers, fast exp2, pinned softmax": {"consumers": 3, **fast, **pinned}},
            128: {**base, "3 stages": {"num_stages": 3}, "3 stages pingpong": {"num_stages": 3, "pingpong": True},
                  "3 stages, fast exp2": {"num_stages": 3, **fast}, "176 keys a block": {"block_n": 176},
                  "176 keys a block, fast exp2": {"block_n": 176, **fast},
                  "3 stages, fast exp2, heavy first": {"num_stages": 3, **fast, **heavy},
                  "fast exp2, persistent": {**fast, **persist}, "3 stages, fast exp2, persistent": {"num_stages": 3, **fast, **persist},
                  "3 stages, fast exp2, lazy rescale": {"num_stages": 3, **fast, **lazy},
                  "3 stages, fast exp2, pinned softmax": {"num_stages": 3, **fast, **pinned},
                  "3 stages, fast exp2, pinned softmax, pingpong": {"num_stages": 3, **fast, **pinned, "pingpong": True}},
            256: {**base, "overlap, fast exp2": fast, "pingpong, fast exp2": {"pingpong": True, **fast},
                  "overlap, heavy first": heavy, "80 keys a block": {"block_n": 80},
                  "80 keys a block, fast exp2": {"block_n": 80, **fast},
                  "80 keys a block, fast exp2, persistent": {"block_n": 80, **fast, **persist},
                  "80 keys a block, fast exp2, lazy rescale": {"block_n": 80, **fast, **lazy},
                  "80 keys a block, fast exp2, lazy rescale, pinned softmax": {"block_n": 80, **fast, **lazy, **pinned}}}


def _sweep_backward():
    """Backward candidates per head dim (the first is the default; d 256 is not swept)."""
    from kernels.attention.dense_bwd import FUSED_FAST_EXP2_TILES, FUSED_TILES, SPLIT_WIDE_DQ_TILES, WIDE_DQ_TILES

    return {d: {"dq 128 x 128 (default)": WIDE_DQ_TILES, "dK / dV split, dq 128 x 128": SPLIT_WIDE_DQ_TILES,
                "fused, dQ added in order": FUSED_TILES, "fused, fast exp2": FUSED_FAST_EXP2_TILES} for d in (64, 128)}


SWEEP_FORWARD = _sweep_forward()
SWEEP_BACKWARD = _sweep_backward()


def sweep_configs(backward_only: bool = False):
    """One compile job per kernel (the pool balances better than with a job per tile set);
    ``backward_only``: the backward candidates and the default forward they start from."""
    fwd = ([("forward", "overlap", "bfloat16", d, c) for d in SWEEP_BACKWARD for c in (False, True)] if backward_only else
           [("forward options", d, c, tuple(sorted(opts.items()))) for d, cands in SWEEP_FORWARD.items()
            for opts in cands.values() for c in (False, True)])
    bwd = {(kind, d, c, blocks) for d, cands in SWEEP_BACKWARD.items() for t in cands.values() for c in (False, True)
           for kind, blocks in ([("fused", (t.fast_exp2,))] if t.fused else
                                [("dkdv", (grads, t.dkdv_keys, t.dkdv_queries)) for grads in (("dv", "dk") if t.split else ("dkdv",))]
                                + [("dq", (t.dq_queries, t.dq_keys))])}
    return fwd + sorted(bwd) + [("delta", d) for d in SWEEP_BACKWARD]


def baseline_configs():
    """The CUDA baseline of the forward's bitwise GPU tests (tests/kernels/attention/conftest.py
    builds it the same way), where the CUDA driver library is installed: linking needs it. Built
    once here, the test workers load it instead of building the same file at once."""
    import ctypes.util

    return [("baseline", "dense_fwd")] if ctypes.util.find_library("cuda") else []


SWEEP_KINDS = ("forward options", "dkdv", "dq", "delta", "fused")


def compile_config(cfg) -> str:
    """Compile (or load from the disk cache) the kernels of one configuration; runs in a worker
    process. The arguments are those the wrappers pass, so the wrappers then hit the cache. A
    sweep candidate that does not build is reported in the line, not raised: the sweep then
    reports that candidate as failed and runs the others."""
    if cfg[0] in SWEEP_KINDS:
        try:
            return _compile_config(cfg)
        except Exception as e:  # noqa: BLE001 (any build error: the line names it)
            return f"{cfg}: FAILED {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    return _compile_config(cfg)


def _compile_config(cfg) -> str:
    from kernels.attention.common import LOG2E

    t0 = time.time()
    kind, args = cfg[0], cfg[1:]
    if kind == "baseline":
        import kernels.attention
        from tlx.numerics.parity import build_baseline

        build_baseline(Path(kernels.attention.__file__).parent / f"{args[0]}.cu", with_cutlass=True)
    elif kind == "forward":
        from kernels.attention.dense_fwd import SCHEDULES, kernel_options

        schedule, dtype, d, causal, *scale = args
        SCHEDULES[schedule](d, causal, (scale[0] if scale else 1.0 / math.sqrt(d)) * LOG2E, dtype,
                            **kernel_options(schedule, d, None))  # what dense_attention builds
    elif kind == "forward options":
        from kernels.attention.dense_fwd import overlap_kernel

        d, causal, options = args
        overlap_kernel(d, causal, 1.0 / math.sqrt(d) * LOG2E, "bfloat16", **dict(options))
    elif kind in ("backward", "fused"):
        from kernels.attention.dense_bwd import FUSED_TILES, backward_kernels

        d, causal, *options = args  # fused: ((fast_exp2,),)
        tiles = FUSED_TILES._replace(fast_exp2=options[0][0]) if kind == "fused" else None
        backward_kernels(d, causal, 1.0 / math.sqrt(d), "bfloat16", tiles)
    elif kind in ("dkdv", "dq", "delta"):
        from kernels.attention.dense_bwd import bwd_delta_kernel, bwd_dkdv_kernel, bwd_dq_kernel

        if kind == "delta":
            bwd_delta_kernel(args[0], "bfloat16")
        else:
            d, causal, blocks = args
            scale = 1.0 / math.sqrt(d)
            if kind == "dkdv":  # blocks: (grads, keys, queries)
                bwd_dkdv_kernel(d, causal, scale * LOG2E, scale, "bfloat16", *blocks)
            else:
                bwd_dq_kernel(d, causal, scale * LOG2E, scale, "bfloat16", *blocks)
    elif kind == "sparse_bwd":
        from kernels.attention.sparse_bwd import DIM, backward_kernels

        backward_kernels(*args, 1.0 / math.sqrt(DIM))
    else:
        from kernels.attention.sparse_fwd import DIM, SCHEDULES

        *shape, schedule = args
        SCHEDULES[schedule](*shape, 1.0 / math.sqrt(DIM) * LOG2E)
    return f"{cfg}: {time.time() - t0:.1f} s"


def precompile(configs, workers: int) -> None:
    from bench.precompile import compile_in_processes

    compile_in_processes(compile_config, configs, workers)


# ---- rows ---------------------------------------------------------------------------------------
def emit(**row):
    ROWS.append(row)
    print("| " + " | ".join(str(v) for v in row.values()) + " |", flush=True)


def randn(shape, g, dtype):
    import torch

    return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)


def rel_err(got, ref) -> float:
    return float((got.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


def checked(outs, refs, tol: float) -> str:
    """"ok (worst error)" when every output is free of NaN (they were poisoned) and within ``tol``
    of its reference, else "FAILED (...)"."""
    import torch

    errs = [rel_err(o, r) for o, r in zip(outs, refs)]
    worst = max(errs)
    if all(e < tol for e in errs) and not any(bool(torch.isnan(o).any()) for o in outs):
        return f"ok ({worst:.1e})"
    return f"FAILED ({worst:.2e})"


def timed_rows(what, shape, flops, candidates, checks, sdpa, reps, anchors=()):
    """Time the candidates that passed their check beside ``sdpa`` (None: no torch counterpart);
    returns (name, ms, TFLOP/s, ratio to SDPA) of the fastest of them ("none passed": dashes).
    ``anchors``: names among the candidates that are not tlx's (their rows say so; never the
    fastest returned)."""
    from bench.timing import interleaved_ms

    fns = {name: fn for name, fn in candidates.items() if checks[name].startswith("ok")}
    if sdpa is not None:
        fns["sdpa"] = sdpa
    ms = interleaved_ms(fns, reps) if fns else {}
    tf = {n: flops / t / 1e9 for n, t in ms.items()}
    base = ("-", "-") if sdpa is None else (round(ms["sdpa"], 3), round(tf["sdpa"]))
    for name in candidates:
        label = f"{what}, {name}" if name in anchors else f"{what}, tlx {name}"
        if name in ms:
            ratio = round(tf[name] / tf["sdpa"], 3) if sdpa is not None else "-"
            emit(what=label, shape=shape, tlx_ms=round(ms[name], 3), tlx_TFLOPs=round(tf[name]),
                 sdpa_ms=base[0], sdpa_TFLOPs=base[1], ratio=ratio, check=checks[name])
        else:
            emit(what=label, shape=shape, tlx_ms="-", tlx_TFLOPs="-", sdpa_ms=base[0], sdpa_TFLOPs=base[1],
                 ratio="-", check=checks[name])
    passed = [n for n in candidates if n in ms and n not in anchors]
    if not passed:
        return "none passed", "-", "-", "-"
    best = min(passed, key=ms.get)
    return best, round(ms[best], 3), round(tf[best]), round(tf[best] / tf["sdpa"], 3) if sdpa is not None else "-"


def sdpa_backward(q, k, v, do, causal):
    """SDPA's backward as a callable (the anchor timed beside tlx's) and its gradients in tlx's
    [b, s, h, d] layout (the references tlx's are checked against)."""
    import torch
    import torch.nn.functional as F

    leaves = [t.transpose(1, 2).detach().requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
    do_t = do.transpose(1, 2)

    def sdpa_bwd():
        return torch.autograd.grad(out, leaves, do_t, retain_graph=True)

    return sdpa_bwd, [r.transpose(1, 2) for r in sdpa_bwd()]


def dense_rows(b, h, s, d, causal, reps, seed):
    import torch
    import torch.nn.functional as F

    from kernels.attention.dense_bwd import dense_attention_backward
    from kernels.attention.dense_fwd import dense_attention

    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (randn((b, s, h, d), g, torch.bfloat16) for _ in range(4))
    shape = f"b{b} h{h} s{s} d{d}{' causal' if causal else ''}"
    fwd_flops = 4 * b * h * s * s * d / (2 if causal else 1)

    # forward
    o = torch.empty_like(q)
    lse = torch.empty((h, b * s), dtype=torch.float32, device="cuda")
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)
    fwd, checks = {}, {}
    for schedule in SCHEDULE_NAMES:
        fwd[schedule] = (lambda sc: lambda: dense_attention(q, k, v, causal=causal, out=(o, lse), schedule=sc))(schedule)
        o.fill_(float("nan"))
        lse.fill_(float("nan"))
        fwd[schedule]()
        checks[schedule] = checked([o], [ref], 1e-2) if not bool(torch.isnan(lse).any()) else "FAILED (lse NaN)"
    timed_rows("dense fwd bf16", shape, fwd_flops, fwd, checks,
               lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), reps)

    # backward, from the default forward's o and lse
    o_fwd, lse_fwd = dense_attention(q, k, v, causal=causal)
    sdpa_bwd, refs = sdpa_backward(q, k, v, do, causal)
    grads = tuple(torch.empty_like(t) for t in (q, k, v))

    def tlx_bwd():
        return dense_attention_backward(do, q, k, v, o_fwd, lse_fwd, causal=causal, out=grads)

    for t in grads:
        t.fill_(float("nan"))
    tlx_bwd()
    check = checked(grads, refs, 3e-2)
    timed_rows("dense bwd bf16", shape, 2.5 * fwd_flops, {"deterministic": tlx_bwd}, {"deterministic": check}, sdpa_bwd, reps)


def first_call(fn) -> str | None:
    """Run a candidate once; the error's first line where it raises (a build that failed in the
    compile step fails here again), else None."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (reported in the candidate's row)
        return f"FAILED ({type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''})"
    return None


def winner(what, shape, won):
    """The row naming a sweep's fastest candidate that passed its checks."""
    emit(what=f"winner {what}", shape=shape, tlx_ms=won[1], tlx_TFLOPs=won[2], sdpa_ms="-", sdpa_TFLOPs="-",
         ratio=won[3], check=won[0])


def same_bits(outs, first) -> str:
    """Whether ``outs`` hold the bits of the first candidate's outputs (NaN never equals: a
    candidate that left poison reads "DIFFER" as well as failing its check)."""
    import torch

    return "bits " + ("same" if all(torch.equal(a, r) for a, r in zip(outs, first)) else "DIFFER")


def sweep_shape(b, h, s, d, causal, reps, seed, backward_only=False):
    """One shape of the sweep: its forward candidates, then (where swept) its backward ones, each
    set beside SDPA in one interleaved timing, then the winners. ``backward_only``: the backward
    candidates alone, from the default forward's output."""
    import torch
    import torch.nn.functional as F

    from kernels.attention.dense_bwd import dense_attention_backward
    from kernels.attention.dense_fwd import dense_attention

    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v, do = (randn((b, s, h, d), g, torch.bfloat16) for _ in range(4))
    shape = f"b{b} h{h} s{s} d{d}{' causal' if causal else ''}"
    fwd_flops = 4 * b * h * s * s * d / (2 if causal else 1)
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
    ref = F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal).transpose(1, 2)

    fwd, checks, first = {}, {}, None
    if backward_only:
        first = (torch.empty_like(q), torch.empty((h, b * s), device="cuda"))
        dense_attention(q, k, v, causal=causal, out=first)
    for name, options in {} if backward_only else SWEEP_FORWARD[d].items():
        out = (torch.full_like(q, float("nan")), torch.full((h, b * s), float("nan"), device="cuda"))
        fwd[name] = (lambda opts, out: lambda: dense_attention(q, k, v, causal=causal, out=out, schedule="overlap",
                                                               options=opts))(options, out)
        error = first_call(fwd[name])
        if error:
            checks[name] = error
            continue
        checks[name] = checked([out[0]], [ref], 1e-2) if not bool(torch.isnan(out[1]).any()) else "FAILED (lse NaN)"
        first = first or out
        checks[name] += ", " + same_bits(out, first)
    if not backward_only:
        winner("fwd bf16", shape, timed_rows("sweep fwd bf16", shape, fwd_flops, fwd, checks,
                                             lambda: F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), reps))
    if d not in SWEEP_BACKWARD or first is None:
        return

    o_fwd, lse_fwd = first[0], first[1].view(h, b, s).permute(1, 0, 2)
    sdpa_bwd, refs = sdpa_backward(q, k, v, do, causal)
    bwd, checks, first = {}, {}, None
    for name, tiles in SWEEP_BACKWARD[d].items():
        grads = tuple(torch.full_like(t, float("nan")) for t in (q, k, v))
        bwd[name] = (lambda t, out: lambda: dense_attention_backward(do, q, k, v, o_fwd, lse_fwd, causal=causal, out=out,
                                                                     tiles=t))(tiles, grads)
        error = first_call(bwd[name])
        if error:
            checks[name] = error
            continue
        first = first or grads
        checks[name] = checked(grads, refs, 3e-2) + ", " + same_bits(grads, first)
    winner("bwd bf16", shape, timed_rows("sweep bwd bf16", shape, 2.5 * fwd_flops, bwd, checks, sdpa_bwd, reps))


def sweep(reps, backward_only=False):
    """Every shape of ``SHAPES`` (``backward_only``: those whose backward is swept), non-causal
    and causal, through ``sweep_shape``."""
    import torch

    seed = 100
    for b, h, s, d in SHAPES:
        for causal in (False, True):
            seed += 1
            if d not in (SWEEP_BACKWARD if backward_only else SWEEP_FORWARD):
                continue  # no candidates at this head dim (``--dim``)
            sweep_shape(b, h, s, d, causal, reps, seed, backward_only)
            torch.cuda.empty_cache()


def sparse_inputs(seed):
    """The generator and the sparse rows' random q, kv, indices (the last eighth of each list
    masked) and sink at ``SPARSE_SHAPE``."""
    import torch

    from kernels.attention.sparse_fwd import DIM

    b, s, h, n, topk = SPARSE_SHAPE
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, kv = randn((b, s, h, DIM), g, torch.bfloat16), randn((b, n, DIM), g, torch.bfloat16)
    idx = torch.randint(0, n, (b, s, topk), generator=g, device="cuda", dtype=torch.int32)
    idx[:, :, -topk // 8:] = -1  # some masked slots
    return g, q, kv, idx, randn((h,), g, torch.float32)


def sparse_row(reps, seed):
    import torch

    from kernels.attention import reference as R
    from kernels.attention.sparse_fwd import DIM, ONE_CHAIN, sparse_attention

    b, s, h, n, topk = SPARSE_SHAPE
    _, q, kv, idx, sink = sparse_inputs(seed)
    ref_o, ref_lse = R.sparse_attention_ref(q[:, :32], kv, idx[:, :32], sink)
    checks, first = {}, {}  # the first output of each row-sum order
    for schedule in SPARSE_SCHEDULES:
        # the wrapper allocates its outputs: poison a first result and free it, so that the caching
        # allocator hands the same (poisoned) blocks to the checked call; said in the row if it did not
        o, lse = sparse_attention(q, kv, idx, sink, schedule=schedule)
        poisoned = (o.fill_(float("nan")).data_ptr(), lse.fill_(float("nan")).data_ptr())
        del o, lse
        o, lse = sparse_attention(q, kv, idx, sink, schedule=schedule)
        checks[schedule] = checked([o[:, :32], lse[:, :32]], [ref_o, ref_lse], 1e-2)
        if (o.data_ptr(), lse.data_ptr()) != poisoned:
            checks[schedule] += ", outputs not poisoned"
        order = schedule in ONE_CHAIN
        if order not in first:
            first[order] = (o, lse)
        elif not (torch.equal(o.view(torch.int16), first[order][0].view(torch.int16))
                  and torch.equal(lse.view(torch.int32), first[order][1].view(torch.int32))):
            checks[schedule] += ", bits differ from those of the first schedule with its row-sum order"
    candidates = {sc: (lambda sc=sc: sparse_attention(q, kv, idx, sink, schedule=sc)) for sc in SPARSE_SCHEDULES}
    anchor = "upstream TileLang example"  # TileLang's own V4 example (fast math, no LSE, a bf16 sink)
    upstream = upstream_sparse_fwd(q, kv, idx, sink)
    if upstream is not None:
        candidates[anchor], checks[anchor] = upstream
    timed_rows("sparse fwd bf16 (V4)", f"b{b} s{s} h{h} n{n} d{DIM} k{topk}", 4 * b * s * h * topk * DIM, candidates,
               checks, None, reps, anchors={anchor})


def upstream_sparse_fwd(q, kv, idx, sink):
    """TileLang's ``examples/deepseek_v4/sparse_attn_fwd_sm90.py`` (compiled by TileLang itself, as
    its author wrote it) on the same inputs, when the carried examples copy has it: (callable, its
    check against the fp32 reference on the first 32 tokens, with the sink rounded to bf16 as the
    example takes it); None without the copy."""
    import torch

    from bench.attention_decode import CARRIED_EXAMPLES, load_upstream
    from kernels.attention import reference as R

    path = CARRIED_EXAMPLES / "deepseek_v4/sparse_attn_fwd_sm90.py"
    if not path.is_file():
        return None
    module = load_upstream(str(path), "upstream_sparse_attn_fwd")
    b, s, h, d = q.shape
    kernel = module.sparse_attn_fwd(b, h, s, kv.shape[1], d, idx.shape[2])
    sink_bf16 = sink.to(torch.bfloat16)
    out = kernel(q, kv, idx, sink_bf16)
    ref_o, _ = R.sparse_attention_ref(q[:, :32], kv, idx[:, :32], sink_bf16.float())
    return (lambda: kernel(q, kv, idx, sink_bf16)), checked([out[:, :32]], [ref_o], 1e-2)


def sparse_bwd_row(reps, seed):
    import torch

    from kernels.attention import reference as R
    from kernels.attention.sparse_bwd import sparse_attention_backward
    from kernels.attention.sparse_fwd import DIM, sparse_attention

    b, s, h, n, topk = SPARSE_SHAPE
    g, q, kv, idx, sink = sparse_inputs(seed)
    do = randn((b, s, h, DIM), g, torch.bfloat16)
    o, lse = sparse_attention(q, kv, idx, sink)
    grads = (torch.full_like(q, float("nan")), torch.full_like(kv, float("nan")), torch.full_like(sink, float("nan")))

    def tlx_bwd():
        return sparse_attention_backward(q, kv, idx, sink, o, lse, do, out=grads)

    tlx_bwd()
    few = 32  # see the module docstring for what is checked where
    leaves = [t.detach().float().requires_grad_() for t in (q[:, :few], kv, sink)]  # detach: sink stays a plain tensor
    ref_o, _ = R.sparse_attention_ref(leaves[0], leaves[1], idx[:, :few], leaves[2])
    ref_o.backward(do[:, :few].float())
    q_few, idx_few, o_few, lse_few, do_few = (t[:, :few].contiguous() for t in (q, idx, o, lse, do))
    part = sparse_attention_backward(q_few, kv, idx_few, sink, o_few, lse_few, do_few)
    check = checked([grads[0][:, :few], part[1], part[2]], [t.grad for t in leaves], 3e-2)
    if any(bool(torch.isnan(t).any()) for t in grads):
        check = "FAILED (NaN: a gradient element not written)"
    timed_rows("sparse bwd bf16 (V4)", f"b{b} s{s} h{h} n{n} d{DIM} k{topk}", 2.5 * 4 * b * s * h * topk * DIM,
               {"deterministic": tlx_bwd}, {"deterministic": check}, None, reps)


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("--precompile", "--precompile-sweep"):
        configs = sweep_configs() if sys.argv[1] == "--precompile-sweep" else baseline_configs() + BENCH_CONFIGS + TEST_CONFIGS
        precompile(configs, int(sys.argv[2]) if len(sys.argv) > 2 else os.cpu_count() or 1)
        return
    backward_only = "--sweep-backward" in sys.argv
    sweeping = backward_only or "--sweep" in sys.argv or "--sweep-forward" in sys.argv
    if "--sweep-forward" in sys.argv:
        SWEEP_BACKWARD.clear()
    for flag in ("--sweep", "--sweep-backward", "--sweep-forward"):
        if flag in sys.argv:
            sys.argv.remove(flag)
    if "--dim" in sys.argv:
        at = sys.argv.index("--dim")
        dim = int(sys.argv.pop(at + 1))
        sys.argv.pop(at)
        for candidates in (SWEEP_FORWARD, SWEEP_BACKWARD):
            for d in [d for d in candidates if d != dim]:
                del candidates[d]
    if "--only" in sys.argv:  # forward candidates whose name contains one of the "|"-separated words ("=NAME": is NAME)
        at = sys.argv.index("--only")
        words = sys.argv.pop(at + 1).split("|")
        sys.argv.pop(at)
        for cands in SWEEP_FORWARD.values():
            for name in [n for n in cands if not any(n == w[1:] if w.startswith("=") else w in n for w in words)]:
                del cands[name]
    from bench.timing import gpu_bench_args

    # NVML's device count, not the CUDA runtime's: the compile workers are forked after this check,
    # and a CUDA context in the parent would be unusable in them
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    args = gpu_bench_args(__doc__, "bench/attention_prefill.py", reps=20)
    # no CUDA context yet: the forked workers only compile
    precompile(sweep_configs(backward_only) if sweeping else BENCH_CONFIGS, os.cpu_count() or 1)

    import torch

    print(f"GPU: {torch.cuda.get_device_name()}")
    print("| what | shape | tlx ms | tlx TFLOP/s | SDPA ms | SDPA TFLOP/s | tlx / SDPA | check |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    if sweeping:
        sweep(args.reps, backward_only)
        if args.out:
            Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": ROWS}, indent=1))
        return
    seed = 0
    for b, h, s, d in SHAPES:
        for causal in (False, True):
            seed += 1
            dense_rows(b, h, s, d, causal, args.reps, seed)
            torch.cuda.empty_cache()
    sparse_row(args.reps, seed + 1)
    sparse_bwd_row(args.reps, seed + 2)
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": ROWS}, indent=1))


if __name__ == "__main__":
    main()
