"""Attention for prefill and training on one GPU, side by side with torch SDPA in one run.

Rows (printed as they are measured, so a timeout still leaves the earlier ones): dense forward,
bf16, MHA, non-causal and causal, at b 8 h 32 s 4096 with d 64 and 128, and b 4 h 16 s 4096
with d 256: tlx (``kernels/attention/dense_fwd.py``) and torch SDPA
(``scaled_dot_product_attention`` on the same [b, s, h, d] tensors, viewed [b, h, s, d]), in
TFLOP/s (4 b h s^2 d per forward, half of it causal). Targets (issue 22): >= 650 / 580 at d 128,
faster than SDPA at d 64 and 256.

Both forward schedules are timed ("pipelined": TileLang's warp specialization; "overlap": the
hand-scheduled softmax / tensor-core overlap).

Timing: ``bench.timing.interleaved_ms`` (CUDA events around each call, one call of each
candidate in turn, warm-up, median); inputs random normal, fresh per row. Before timing, the
tlx output (poisoned with NaN first) is checked against SDPA's (relative error < 1e-2, no NaN);
a failed check is reported in the row and that row is not timed.
Usage: python bench/attention_prefill.py [--out FILE.json] [--reps N]
       python bench/attention_prefill.py --precompile [WORKERS]   (no GPU needed: compiles every
       kernel configuration the attention GPU tests and this benchmark use, WORKERS processes at
       once, into $TLX_CACHE_DIR, so that a fresh GPU machine spends its time running, not compiling)
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import gpu_bench_args, interleaved_ms  # noqa: E402
from kernels.attention.dense_fwd import SCHEDULES, dense_attention  # noqa: E402

ROWS = []
SHAPES = [(8, 32, 4096, 64), (8, 32, 4096, 128), (4, 16, 4096, 256)]  # b, h, s, d


def emit(**row):
    ROWS.append(row)
    print("| " + " | ".join(str(v) for v in row.values()) + " |", flush=True)


def dense_row(b, h, s, d, causal, reps, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn((b, s, h, d), generator=g, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o = torch.full_like(q, float("nan"))
    lse = torch.empty((h, b * s), dtype=torch.float32, device="cuda")

    def tlx_fwd(schedule):
        return lambda: dense_attention(q, k, v, causal=causal, out=(o, lse), schedule=schedule)

    def sdpa():
        return torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=causal)

    ref = sdpa().transpose(1, 2).float()
    flops = 4 * b * h * s * s * d / (2 if causal else 1)
    shape = f"b{b} h{h} s{s} d{d}{' causal' if causal else ''}"
    fns, checks = {"sdpa": sdpa}, {}
    for schedule in SCHEDULES:
        o.fill_(float("nan"))
        tlx_fwd(schedule)()
        err = float((o.float() - ref).norm() / ref.norm())
        ok = err < 1e-2 and not bool(torch.isnan(o).any())
        checks[schedule] = f"ok ({err:.1e})" if ok else f"FAILED ({err:.2e})"
        if ok:
            fns[schedule] = tlx_fwd(schedule)
    ms = interleaved_ms(fns, reps)
    tf = {n: flops / t / 1e9 for n, t in ms.items()}
    for schedule in SCHEDULES:
        if schedule in ms:
            emit(what=f"dense fwd bf16, tlx {schedule}", shape=shape, tlx_ms=round(ms[schedule], 3), tlx_TFLOPs=round(tf[schedule]),
                 sdpa_ms=round(ms["sdpa"], 3), sdpa_TFLOPs=round(tf["sdpa"]), ratio=round(tf[schedule] / tf["sdpa"], 3), check=checks[schedule])
        else:
            emit(what=f"dense fwd bf16, tlx {schedule}", shape=shape, tlx_ms="-", tlx_TFLOPs="-", sdpa_ms=round(ms["sdpa"], 3),
                 sdpa_TFLOPs=round(tf["sdpa"]), ratio="-", check=checks[schedule])


def compile_config(cfg):
    """Compile one kernel configuration of ``CONFIGS`` (runs in a worker process)."""
    import math
    import time

    from kernels.attention.common import LOG2E

    t0 = time.time()
    kind, args = cfg[0], cfg[1:]
    if kind in SCHEDULES:
        dtype, d, causal, *scale = args
        SCHEDULES[kind](d, causal, (scale[0] if scale else 1 / math.sqrt(d)) * LOG2E, dtype)
    elif kind == "backward":
        from kernels.attention.dense_bwd import bwd_delta_kernel, bwd_dkdv_kernel, bwd_dq_kernel

        d, causal = args
        s = 1 / math.sqrt(d)
        bwd_delta_kernel(d)
        bwd_dkdv_kernel(d, causal, s * LOG2E, s)
        bwd_dq_kernel(d, causal, s * LOG2E, s)
    else:
        from kernels.attention.sparse_fwd import sparse_fwd_kernel

        sparse_fwd_kernel(*args, LOG2E / math.sqrt(512))
    return f"{cfg}: {time.time() - t0:.0f} s"


CONFIGS = ([(sc, "bfloat16", d, c) for sc in SCHEDULES for d in (64, 128, 256) for c in (False, True)]
           + [(sc, "float16", 128, c) for sc in SCHEDULES for c in (False, True)]
           + [("pipelined", "bfloat16", 64, False, 0.3)]
           + [("backward", d, c) for d in (64, 128) for c in (False, True)]
           + [("sparse", h, k, w) for h, k, w in ((64, 512, 0), (128, 1024, 0), (128, 2048, 0), (64, 512, 128))])


def precompile(workers: int):
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(workers) as pool:
        for line in pool.map(compile_config, CONFIGS):
            print(line, flush=True)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--precompile":
        precompile(int(sys.argv[2]) if len(sys.argv) > 2 else 8)
        return
    args = gpu_bench_args(__doc__, "bench/attention_prefill.py", reps=20)
    print(f"GPU: {torch.cuda.get_device_name()}")
    print("| what | shape | tlx ms | tlx TFLOP/s | SDPA ms | SDPA TFLOP/s | tlx / SDPA | check |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    seed = 0
    for b, h, s, d in SHAPES:
        for causal in (False, True):
            seed += 1
            dense_row(b, h, s, d, causal, args.reps, seed)
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": ROWS}, indent=1))


if __name__ == "__main__":
    main()
