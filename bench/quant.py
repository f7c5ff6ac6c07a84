"""Quantization kernels at the memory-bandwidth limit, side by side with the copy bandwidth.

Rows (printed as they are measured, so a timeout still leaves the earlier ones):
* copy: torch ``copy_`` of a 2 GiB buffer, bytes read + written: the yardstick;
* every quantization kernel at T = 16384, H = 7168: time, bytes read + written, GB/s and the
  share of the copy's bandwidth (target >= 90%);
* per-token-group cast of 8192 x 8192 fp32 with 1 x 128 groups: tlx next to the torch
  reference (the upstream TileLang example was measured at 0.09 ms, Triton 0.32 ms).

Timing: CUDA events around each launch, warm-up, median; the kernels run on preallocated
outputs and rotate over 3 freshly drawn random inputs. Each kernel's output is first checked
bit for bit against the torch reference (``kernels/quant/reference.py``); a failed check is
reported in the row and that kernel is not timed.
Usage: python bench/quant.py [--out FILE.json] [--reps N]
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import gpu_bench_args, large_copy_ms, median_ms, same_size_copies  # noqa: E402
from kernels.quant import reference as R  # noqa: E402
from kernels.quant.block_cast import block_cast_kernel  # noqa: E402
from kernels.quant.channel_cast import channel_cast_kernel  # noqa: E402
from kernels.quant.dequant import dequant_kernel  # noqa: E402
from kernels.quant.group_cast import _alloc_scales, group_cast_kernel, mxfp4_cast  # noqa: E402
from tlx.numerics.parity import assert_bitwise  # noqa: E402

ROWS = []
ROTATE = 3
E4M3 = torch.float8_e4m3fn
R_DT = {torch.bfloat16: "bfloat16", torch.float32: "float32"}


def nbytes(*tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def emit(**row):
    ROWS.append(row)
    cells = [str(row.get(k, "")) for k in ("what", "shape", "MB", "us", "GB/s", "% of copy", "% of same-size copy", "check")]
    print("| " + " | ".join(cells) + " |", flush=True)


def randn(shape, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return (torch.randn(shape, device="cuda", generator=g) * 3).to(dtype)


def measure(what, shape, make_case, reps, copy_gbps):
    """``make_case(seed)`` -> (run, outputs, expected outputs, bytes moved); the expected outputs
    are computed (and checked) for seed 0 only."""
    try:
        cases = [make_case(seed) for seed in range(ROTATE)]
        run, outs, expected, moved = cases[0]
        run()
        torch.cuda.synchronize()
        for i, (o, e) in enumerate(zip(outs, expected)):
            assert_bitwise(o, e, name=f"{what} output {i}")
        ms = median_ms([c[0] for c in cases], reps)
    except Exception as err:  # report the row, keep benchmarking the others
        emit(what=what, shape=shape, check=f"FAILED: {type(err).__name__}: {str(err)[:160]}")
        return
    gbps = moved / ms / 1e6
    emit(what=what, shape=shape, MB=round(moved / 1e6, 1), us=round(ms * 1e3, 1), **{
        "GB/s": round(gbps), "% of copy": round(100 * gbps / copy_gbps, 1),
        "% of same-size copy": round(100 * same_size_copy_ms(moved, reps) / ms, 1), "check": "bitwise ok"})


def same_size_copy_ms(moved, reps):
    """A torch copy moving the same bytes (read + write) as the kernel: at ~100-600 MB the
    launch and the last wave cost a copy too, so this is the rate a kernel of this size can reach."""
    return median_ms(same_size_copies(moved, ROTATE), reps)


def group_case(t, h, dtype, group, scale_fmt, col_major):
    kernel = group_cast_kernel(h, group, "plain", R_DT[dtype], "e4m3", scale_fmt, col_major)

    def make(seed):
        x = randn((t, h), dtype, seed)
        q = torch.empty((t, h), dtype=E4M3, device="cuda")
        s_arg, s_out = _alloc_scales(t, h // group, scale_fmt, col_major, "cuda")
        eq, es = R.per_token_group_cast(x, group, scale_fmt, col_major) if seed == 0 else (q, s_out)
        return (lambda: kernel(x, q, s_arg)), (q, s_out), (eq, es), nbytes(x, q, s_arg)

    return make


def main():
    args = gpu_bench_args(__doc__, "bench/quant.py")
    reps = args.reps
    print(f"GPU: {torch.cuda.get_device_name()}")
    print("| what | shape | MB moved | us | GB/s | % of copy | % of same-size copy | check |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")

    copy_ms, copy_bytes = large_copy_ms(reps)
    copy_gbps = copy_bytes / copy_ms / 1e6
    emit(what="copy (torch copy_)", shape="2 GiB", MB=round(copy_bytes / 1e6, 1), us=round(copy_ms * 1e3, 1),
         **{"GB/s": round(copy_gbps), "% of copy": 100.0, "% of same-size copy": "-", "check": "-"})

    T, H = 16384, 7168
    shape = f"{T}x{H}"
    for dtype, scale_fmt, col_major in ((torch.bfloat16, "fp32", False), (torch.bfloat16, "ue8m0_packed", True),
                                       (torch.float32, "ue8m0", False)):
        name = f"per-token 1x128 {R_DT[dtype]} -> e4m3, {scale_fmt}{' col-major' if col_major else ''}"
        measure(name, shape, group_case(T, H, dtype, 128, scale_fmt, col_major), reps, copy_gbps)

    swiglu = group_cast_kernel(H, 128, "swiglu", "bfloat16", "e4m3", "fp32", False, 10.0, True)

    def swiglu_case(seed):
        x = randn((T, 2 * H), torch.bfloat16, seed)
        w = torch.rand(T, device="cuda")
        q, s = torch.empty((T, H), dtype=E4M3, device="cuda"), torch.empty((T, H // 128), device="cuda")
        exp = R.swiglu_cast(x, 10.0, w) if seed == 0 else (q, s)
        return (lambda: swiglu(x, w, q, s)), (q, s), exp, nbytes(x, w, q, s)

    measure("SwiGLU + per-token 1x128 cast (bf16 [T, 2H] -> e4m3 [T, H])", shape, swiglu_case, reps, copy_gbps)

    mx = group_cast_kernel(H, 32, "plain", "bfloat16", "e2m1")

    def mxfp4_case(seed):
        x = randn((T, H), torch.bfloat16, seed)
        q, s = torch.empty((T, H // 2), dtype=torch.uint8, device="cuda"), torch.empty((T, H // 32), dtype=torch.uint8, device="cuda")
        exp = R.mxfp4_cast(x) if seed == 0 else (q, s)
        return (lambda: mx(x, q, s)), (q, s), exp, nbytes(x, q, s)

    measure("MXFP4 cast bf16 -> e2m1 + UE8M0 1x32", shape, mxfp4_case, reps, copy_gbps)

    reblock = group_cast_kernel(H, 128, "e2m1", "uint8", "e4m3", "ue8m0", False)

    def reblock_case(seed):
        p, c = mxfp4_cast(randn((T, H), torch.bfloat16, seed))
        q, s = torch.empty((T, H), dtype=E4M3, device="cuda"), torch.empty((T, H // 128), device="cuda")
        exp = R.fp4_to_fp8(p, c) if seed == 0 else (q, s)
        return (lambda: reblock(p, c, q, s)), (q, s), exp, nbytes(p, c, q, s)

    measure("FP4 -> FP8 re-blocking (1x32 UE8M0 -> 1x128 UE8M0)", shape, reblock_case, reps, copy_gbps)

    block = block_cast_kernel(H, 128, "bfloat16", False)

    def block_case(seed):
        w = randn((T, H), torch.bfloat16, seed)
        q, s = torch.empty((T, H), dtype=E4M3, device="cuda"), torch.empty((T // 128, H // 128), device="cuda")
        exp = R.per_block_cast(w, 128) if seed == 0 else (q, s)
        return (lambda: block(w, q, s)), (q, s), exp, nbytes(w, q, s)

    measure("per-block 128x128 bf16 -> e4m3", shape, block_case, reps, copy_gbps)

    reblock2 = block_cast_kernel(H, 128, "e2m1", True)

    def reblock2_case(seed):
        p, c = mxfp4_cast(randn((T, H), torch.bfloat16, seed))
        q, s = torch.empty((T, H), dtype=E4M3, device="cuda"), torch.empty((T // 128, H // 128), device="cuda")
        exp = R.fp4_to_fp8(p, c, (128, 128)) if seed == 0 else (q, s)
        return (lambda: reblock2(p, c, q, s)), (q, s), exp, nbytes(p, c, q, s)

    measure("FP4 -> FP8 re-blocking (1x32 UE8M0 -> 128x128 power-of-two)", shape, reblock2_case, reps, copy_gbps)

    deq = dequant_kernel(H, "e4m3", 1, 128, "bfloat16")

    def deq_case(seed):
        q, s = R.per_token_group_cast(randn((T, H), torch.bfloat16, seed), 128)
        y = torch.empty((T, H), dtype=torch.bfloat16, device="cuda")
        exp = (R.dequant_e4m3(q, s, (1, 128)),) if seed == 0 else (y,)
        return (lambda: deq(q, s, y)), (y,), exp, nbytes(q, s, y)

    measure("dequant e4m3 + 1x128 fp32 -> bf16", shape, deq_case, reps, copy_gbps)

    deq4 = dequant_kernel(H, "e2m1", 1, 32, "bfloat16")

    def deq4_case(seed):
        p, c = mxfp4_cast(randn((T, H), torch.bfloat16, seed))
        y = torch.empty((T, H), dtype=torch.bfloat16, device="cuda")
        exp = (R.dequant_e2m1(p, c),) if seed == 0 else (y,)
        return (lambda: deq4(p, c, y)), (y,), exp, nbytes(p, c, y)

    measure("dequant MXFP4 -> bf16", shape, deq4_case, reps, copy_gbps)

    chan = channel_cast_kernel(H, "bfloat16", False)

    def chan_case(seed):
        x = randn((T, H), torch.bfloat16, seed)
        q, s = torch.empty((H, T), dtype=E4M3, device="cuda"), torch.empty((H, T // 128), device="cuda")
        exp = R.per_channel_cast_transpose(x) if seed == 0 else (q, s)
        return (lambda: chan(x.view(T // 16, 16, H), q.view(H, T // 16, 16), s)), (q, s), exp, nbytes(x, q, s)

    measure("per-channel 128-token cast with transpose bf16 -> e4m3 [H, T]", shape, chan_case, reps, copy_gbps)

    # The upstream comparison point: 8192 x 8192 fp32, groups of 1 x 128, fp32 scales.
    measure("per-token 1x128 fp32 -> e4m3 (TileLang example 0.09 ms, Triton 0.32 ms)", "8192x8192",
            group_case(8192, 8192, torch.float32, 128, "fp32", False), reps, copy_gbps)
    xs = [randn((8192, 8192), torch.float32, seed) for seed in range(ROTATE)]
    ref_ms = median_ms([lambda x=x: R.per_token_group_cast(x, 128) for x in xs], max(5, reps // 3))
    emit(what="same, torch reference (reference.py)", shape="8192x8192", us=round(ref_ms * 1e3, 1), check="-")

    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "copy_GBps": copy_gbps, "rows": ROWS}, indent=1))


if __name__ == "__main__":
    main()
