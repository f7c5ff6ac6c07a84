"""tlx.ieee parity figures on one GPU: mismatches against the nvcc-built CUDA reference over the
full sweeps, and the throughput of the conversion kernel next to the CUDA reference kernel.

Sweeps (as in tests/numerics/test_ieee_gpu.py, but counting every mismatch instead of stopping):
all 2^32 fp32 inputs for each conversion (against the CUDA intrinsic and against the
independent specification) and for sqrt/rcp in four rounding modes; 10^8 random operand sets
(specials, near exponents, ties) for add/sub/mul/div/fma in fp32 and fp64 and for fp64
sqrt/rcp. Throughput: median of 20 CUDA-event-timed launches after 3 warm-ups, on 2^28 fresh
random inputs, outputs poisoned before timing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import tlx  # noqa: E402
from bench.timing import median_ms  # noqa: E402
from tests.numerics import ieee_kernels as K  # noqa: E402
from tlx.numerics.parity import build_baseline  # noqa: E402
from tlx.numerics.sweep import all_fp32_chunks, bits, poisoned, random_operands  # noqa: E402

CHUNK = 1 << 28
RANDOM_TOTAL = 100_000_000
RANDOM_CHUNK = 1 << 25


def differing(a, b) -> int:
    return int((bits(a) != bits(b)).sum())


def sweep_conversions(ref) -> list[dict]:
    vs_cuda = dict.fromkeys((name for name, _ in K.CONVERSIONS), 0)
    spec_vs_cuda = dict(vs_cuda)
    t0 = time.perf_counter()
    for _, name, got, cuda, spec in K.conversion_sweep(ref, CHUNK):
        vs_cuda[name] += differing(got, cuda)
        spec_vs_cuda[name] += differing(spec, cuda)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    return [{"op": name, "inputs": 1 << 32, "mismatches": vs_cuda[name], "spec_mismatches": spec_vs_cuda[name],
             "seconds": seconds} for name in vs_cuda]


def arith_kernel(op, dtype):
    return tlx.jit(K.arith)(op, str(dtype).removeprefix("torch."))


def sweep_unary_fp32(ref) -> list[dict]:
    rows = []
    for op in K.UNARY_OPS:
        kernel, code, bad = arith_kernel(op, torch.float32), K.ARITH_OPS.index(op), 0
        t0 = time.perf_counter()
        for x in all_fp32_chunks(CHUNK):
            out, want = poisoned((4, CHUNK), torch.float32), poisoned((4, CHUNK), torch.float32)
            kernel(x, x, x, out)
            ref.arith(code, x, x, x, want)
            bad += differing(out, want)
        torch.cuda.synchronize()
        rows.append({"op": f"{op} fp32 (rn/rz/ru/rd)", "inputs": 4 << 32, "mismatches": bad, "seconds": time.perf_counter() - t0})
    return rows


def sweep_random(ref) -> list[dict]:
    rows = []
    cases = [(op, dt) for dt in (torch.float32, torch.float64) for op in (*K.BINARY_OPS, "fma")]
    cases += [(op, torch.float64) for op in K.UNARY_OPS]
    for op, dtype in cases:
        kernel, code, bad, done = arith_kernel(op, dtype), K.ARITH_OPS.index(op), 0, 0
        gen = torch.Generator(device="cuda").manual_seed(3000 + code)
        t0 = time.perf_counter()
        while done < RANDOM_TOTAL:
            x, y, z = random_operands(RANDOM_CHUNK, dtype, gen, 3)
            out, want = poisoned((4, RANDOM_CHUNK), dtype), poisoned((4, RANDOM_CHUNK), dtype)
            kernel(x, y, z, out)
            ref.arith(code, x, y, z, want)
            bad += differing(out, want)
            done += RANDOM_CHUNK
        torch.cuda.synchronize()
        name = f"{op} {str(dtype).removeprefix('torch.')} (rn/rz/ru/rd)"
        rows.append({"op": name, "inputs": 4 * done, "mismatches": bad, "seconds": time.perf_counter() - t0})
    return rows


def time_ms(fn, outs, reps=20) -> float:
    """Median milliseconds of ``fn``, its outputs poisoned (untimed) before each call."""
    return median_ms(fn, reps, warmup=3, before=lambda: [o.view(torch.uint8).fill_(0xA5) for o in outs], isolated=True)


def conversion_throughput(ref) -> dict:
    kernel = tlx.jit(K.convert)()
    x = torch.randn(CHUNK, device="cuda") * 100
    got = [poisoned(CHUNK, getattr(torch, d)) for _, d in K.CONVERSIONS]
    cuda = [poisoned(CHUNK, getattr(torch, d)) for d in K.CONVERSION_BITS]
    nbytes = CHUNK * (4 + sum(t.element_size() for t in got))
    tlx_ms = time_ms(lambda: kernel(x, *got), got)
    ref_ms = time_ms(lambda: ref.convert_cuda(x, *cuda), cuda)
    for g, c in zip(got, cuda):
        if differing(g, c):
            raise AssertionError("conversion outputs differ from the CUDA reference during timing")
    return {"elements": CHUNK, "tlx_ms": tlx_ms, "cuda_ms": ref_ms, "tlx_gbs": nbytes / tlx_ms / 1e6, "cuda_gbs": nbytes / ref_ms / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("numerics_sweep: no GPU is visible")
    ref = build_baseline(ROOT / "tests" / "numerics" / "intrinsics_ref.cu")
    rows = sweep_conversions(ref) + sweep_unary_fp32(ref) + sweep_random(ref)
    thr = conversion_throughput(ref)
    print("| op | inputs | mismatches vs CUDA | spec vs CUDA | seconds |\n| --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['op']} | {r['inputs']:,} | {r['mismatches']} | {r.get('spec_mismatches', '—')} | {r['seconds']:.1f} |")
    print("\n| conversion kernel (all 6 outputs, 2^28 inputs) | median ms | GB/s |\n| --- | --- | --- |")
    print(f"| tlx.ieee (TileLang) | {thr['tlx_ms']:.3f} | {thr['tlx_gbs']:.0f} |")
    print(f"| CUDA reference | {thr['cuda_ms']:.3f} | {thr['cuda_gbs']:.0f} |")
    if args.out:
        Path(args.out).write_text(json.dumps({"sweeps": rows, "conversion_throughput": thr}, indent=1))
    if any(r["mismatches"] or r.get("spec_mismatches") for r in rows):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
