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


def main():
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
