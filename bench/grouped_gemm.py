"""FP8 grouped GEMM variants side by side, next to torch._scaled_mm on the dense shape.

Shapes (contiguous layout, rows of each expert padded to 128):
* large groups: experts x rows per expert of one (N, K), no padding;
* V4 routed: T = 8192 tokens, top-6 of E experts drawn uniformly, for L1 (N = 2I, K = H) and
  L2 (N = H, K = I) of V4-Flash (E 256, H 4096, I 2048) and V4-Pro (E 384, H 7168, I 3072).

Each variant is a set of keyword arguments of ``grouped_gemm_contiguous_kernel``; its output is
compared bit for bit with the CUDA baseline (``grouped_gemm.cu``) before it is timed. Timing: CUDA
events around each call, warm-up, median; the candidates and ``_scaled_mm`` take turns call by
call, so all meet the same clocks (the board runs at its power limit). TFLOP/s count the routed
rows (and, in brackets, all computed rows including padding); the dense rates are ``_scaled_mm``
on [computed rows, K] x [K, N] with row-wise scales and, where the torch build has it, with the
same 1 x 128 / 128 x 128 block scales (the same promotion work). ``--clocks`` adds back-to-back rates with the
SM clock and board power read half way, and the board energy per call (NVML's counter).

Usage:
  python bench/grouped_gemm.py --compile [--jobs 8]   # build every (variant, shape) kernel in parallel
  python bench/grouped_gemm.py [--variants a,b] [--shapes x,y] [--out FILE.json] [--clocks]
  python bench/grouped_gemm.py --ncu --variants a,b --shapes x   # one launch per variant, for ncu
"""

import argparse
import functools
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import interleaved_ms  # noqa: E402
from kernels.moe.grouped_gemm import grouped_gemm_contiguous_kernel  # noqa: E402

# name -> keyword arguments of grouped_gemm_contiguous_kernel. Other schedules were measured here
# against "wide" and none was faster at the board's power limit (~690 W): two wgmma accumulators,
# 128 x 192 tiles as two m64n96 halves, A not multicast, 4-CTA clusters (not all resident at once),
# banded tile orders, the two warpgroups ordered or staggered by named barriers, 5 stages with a
# double-buffered C_s or no C_s, the epilogue under the next tile's first wgmma, and a narrow last
# column tile. Their figures are in the git history of this file; bench/RESULTS.md has today's.
VARIANTS = {
    "wide": {"num_sms": 132},  # the call grouped_gemm_contiguous makes on an H200 here (128 x 192 tiles)
    "n128": {"num_sms": 132, "block_n": 128},  # 128 x 128 tiles (N whose 192-wide tiles do not pair up)
    "rolled": {"num_sms": 132, "unroll_stages": False},  # the K loop not unrolled over the stages
}

# name -> (kind, experts, rows per expert or tokens, N, K)
SHAPES = {
    "big_n4096_k7168": ("group", 8, 4096, 4096, 7168),
    "big_n7168_k4096": ("group", 4, 8192, 7168, 4096),
    "flash_l1": ("routed", 256, 8192, 4096, 4096),
    "flash_l2": ("routed", 256, 8192, 4096, 2048),
    "pro_l1": ("routed", 384, 8192, 6144, 7168),
    "pro_l2": ("routed", 384, 8192, 7168, 3072),
}
TOPK = 6

# Which shapes each variant is built for and timed on (every pair is one compile), in build order.
PLAN = {
    "wide": list(SHAPES),
    "n128": list(SHAPES),
    "rolled": ["big_n4096_k7168", "big_n7168_k4096", "flash_l1", "pro_l1"],
}


BUILT = Path(os.environ.get("TLX_CACHE_DIR", Path.home() / ".cache" / "tlx")) / "bench_grouped_gemm_built.json"


def _build(args):
    name, shape = args
    n, k = SHAPES[shape][3], SHAPES[shape][4]
    t = time.time()
    kern = grouped_gemm_contiguous_kernel(n, k, **VARIANTS[name])
    return f"{name} {shape}: {time.time() - t:.0f} s, block {kern.metadata['launches'][0]['block']}"


def built_pairs():
    """(variant, shape) pairs the last --compile built; None when it did not run (build on demand)."""
    return {tuple(p) for p in json.loads(BUILT.read_text())} if BUILT.exists() else None


def compile_all(pairs, jobs):
    import multiprocessing as mp

    from tlx.numerics.parity import build_baseline

    with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
        futs = [pool.submit(_build, p) for p in pairs]
        try:
            build_baseline(Path(__file__).resolve().parents[1] / "kernels/moe/grouped_gemm.cu")
            print("baseline built", flush=True)
        except Exception as exc:  # no CUDA driver library on a CPU-only machine
            print(f"baseline build FAILED: {exc!r}"[:500], flush=True)
        done = []
        BUILT.parent.mkdir(parents=True, exist_ok=True)
        BUILT.write_text("[]")
        for p, f in zip(pairs, futs):
            try:
                print(f.result(), flush=True)
                done.append(p)
                BUILT.write_text(json.dumps(done))  # a compile phase cut short still runs what it built
            except Exception as exc:  # report and go on: one broken variant must not hide the others
                print(f"FAILED {p}: {exc!r}"[:2000], flush=True)


def make_inputs(shape, seed=0):
    import torch

    kind, e, m, n, k = SHAPES[shape]
    g = torch.Generator(device="cuda").manual_seed(seed)
    if kind == "group":
        counts = torch.full((e,), m, dtype=torch.int64, device="cuda")
    else:
        scores = torch.rand(m, e, device="cuda", generator=g)
        ids = scores.topk(TOPK, dim=1).indices
        counts = torch.bincount(ids.flatten(), minlength=e)
    padded = (counts + 127) // 128 * 128
    block_expert = torch.repeat_interleave(torch.arange(e, device="cuda", dtype=torch.int32), padded // 128)
    rows = int(padded.sum())

    def e4m3(*s):
        # moderate finite values (|v| in [0.5, 2)), random sign; built in uint8 to stay small
        bits = torch.randint(0x30, 0x40, s, dtype=torch.uint8, device="cuda", generator=g)
        bits |= torch.randint(0, 2, s, dtype=torch.uint8, device="cuda", generator=g) << 7
        return bits.view(torch.float8_e4m3fn)

    a = e4m3(rows, k)
    sa = torch.rand(rows, k // 128, device="cuda", generator=g) + 0.5
    b = torch.empty(e, n, k, dtype=torch.float8_e4m3fn, device="cuda")
    for i in range(e):
        b[i] = e4m3(n, k)
    sb = torch.rand(e, n // 128, k // 128, device="cuda", generator=g) * 0.01 + 0.001
    return dict(a=a, sa=sa, b=b, sb=sb, block_expert=block_expert, routed=int(counts.sum()), rows=rows, n=n, k=k)


def check_skipped_blocks(name, shape, base):
    """Uneven experts (empty ones, partial blocks) with -1 row blocks in the middle and at the
    end: the written rows bitwise equal to the baseline, the -1 blocks' rows left untouched."""
    import torch

    n, k = SHAPES[shape][3], SHAPES[shape][4]
    g = torch.Generator(device="cuda").manual_seed(1)
    counts = torch.tensor([0, 1, 129, 300, 0, 5, 700, 64], device="cuda")
    blocks = torch.repeat_interleave(torch.arange(8, device="cuda", dtype=torch.int32), (counts + 127) // 128)
    skip = torch.tensor([-1], device="cuda", dtype=torch.int32)
    block_expert = torch.cat([blocks[:4], skip, blocks[4:], skip, skip, skip])
    rows = block_expert.numel() * 128
    a = (torch.randn(rows, k, device="cuda", generator=g) * 2).clamp(-8, 8).to(torch.float8_e4m3fn)
    sa = torch.rand(rows, k // 128, device="cuda", generator=g) + 0.5
    b = (torch.randn(8, n, k, device="cuda", generator=g) * 2).clamp(-8, 8).to(torch.float8_e4m3fn)
    sb = torch.rand(8, n // 128, k // 128, device="cuda", generator=g) * 0.01 + 0.001
    out = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    ref = out.clone()
    grouped_gemm_contiguous_kernel(n, k, **VARIANTS[name])(a, sa, b, sb, block_expert, out)
    base.moe_grouped_gemm_contiguous(a, sa, b, sb, block_expert, ref)
    torch.cuda.synchronize()
    skipped = (block_expert < 0).repeat_interleave(128)
    ok = torch.equal(out.view(torch.int16), ref.view(torch.int16)) and bool(torch.isnan(out[skipped].float()).all())
    print(f"check {name:12s} on {shape} with skipped blocks: {'ok' if ok else 'FAILED'}", flush=True)
    return ok


def blockwise_scaled_mm(x, line, ref):
    """torch._scaled_mm with the same scale recipe (1 x 128 on A, 128 x 128 on B, cuBLAS on sm_90
    where the torch build has it) on the computed rows times expert 0's weights: the dense rate of
    the same work, promotion included. Records in ``line`` which scale layout torch took and how far
    its output is from ``ref`` (the CUDA baseline's, which every tlx row matches bit for bit) on
    expert 0's rows; returns the call, or None where torch refuses every layout (the error is
    recorded)."""
    import torch

    a, sa, b, sb, block_expert = x["a"], x["sa"], x["b"][0].t(), x["sb"][0].t(), x["block_expert"]
    layouts = {"row-major sa": sa, "column-major sa": sa.t().contiguous().t()}
    errors = []
    for label, scale_a in layouts.items():
        try:
            out = torch._scaled_mm(a, b, scale_a=scale_a, scale_b=sb, out_dtype=torch.bfloat16)
            torch.cuda.synchronize()
        except Exception as exc:  # this torch/cuBLAS has no such blockwise kernel
            errors.append(f"{label}: {exc!r}"[:300])
            continue
        rows = (block_expert == 0).repeat_interleave(128)
        mine, theirs = ref[rows].float(), out[rows].float()
        line["scaled_mm_blockwise"] = {
            "scale_a_layout": label,
            "bitwise_vs_baseline_on_expert0": torch.equal(ref[rows].view(torch.int16), out[rows].view(torch.int16)),
            "max_rel_diff_vs_baseline": float(((mine - theirs).abs() / theirs.abs().clamp_min(1e-3)).max()),
        }
        return lambda: torch._scaled_mm(a, b, scale_a=scale_a, scale_b=sb, out_dtype=torch.bfloat16)
    line["scaled_mm_blockwise"] = {"unavailable": errors}
    print(f"blockwise _scaled_mm unavailable: {errors}", flush=True)
    return None


@functools.cache
def _nvml_device():
    """NVML and its handle of the current CUDA device (by PCI bus id), or None without NVML."""
    import ctypes

    import torch

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    if not hasattr(props, "pci_bus_id"):
        return None
    bus_id = f"{props.pci_domain_id:08x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0".encode()
    handle = ctypes.c_void_p()
    if nvml.nvmlInit_v2() or nvml.nvmlDeviceGetHandleByPciBusId_v2(bus_id, ctypes.byref(handle)):
        return None
    return nvml, handle


def board_energy_mj():
    """The board's energy counter (mJ since the driver loaded; NVML), or None where it is missing."""
    import ctypes

    dev = _nvml_device()
    if dev is None:
        return None
    mj = ctypes.c_ulonglong()
    return None if dev[0].nvmlDeviceGetTotalEnergyConsumption(dev[1], ctypes.byref(mj)) else mj.value


def sustained(fn, calls=300):
    """Back-to-back calls for about a second: ms and board energy (NVML's counter) per call, and
    the SM clock and board power that nvidia-smi reads half way (FP8 GEMMs run into the power
    limit, so the rate follows the energy a kernel spends per flop)."""
    import subprocess

    import torch

    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0 = board_energy_mj()
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    smi = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader"],
                         capture_output=True, text=True).stdout.strip()
    end.synchronize()
    e1 = board_energy_mj()
    row = {"sustained_ms": round(start.elapsed_time(end) / calls, 4), "clock": smi}
    if e0 is not None and e1 is not None:
        row["mj_per_call"] = round((e1 - e0) / calls, 2)
    return row


def run(variants, shapes, out_json, ncu, reps=20, clocks=False):
    import torch

    from tlx.numerics.parity import build_baseline

    base = None if ncu else build_baseline(Path(__file__).resolve().parents[1] / "kernels/moe/grouped_gemm.cu")
    results = []
    built = built_pairs()
    if not ncu:
        for v in variants:
            shape = next((s for s in PLAN.get(v, ()) if built is None or (v, s) in built), None)
            if shape:
                check_skipped_blocks(v, shape, base)
    for shape in shapes:
        names = [v for v in variants if shape in PLAN.get(v, ()) and (built is None or (v, shape) in built)]
        if not names:
            continue
        x = make_inputs(shape)
        n, k, rows, routed = x["n"], x["k"], x["rows"], x["routed"]
        args = (x["a"], x["sa"], x["b"], x["sb"], x["block_expert"])
        flops_r, flops_p = 2 * routed * n * k, 2 * rows * n * k
        kerns = {v: grouped_gemm_contiguous_kernel(n, k, **VARIANTS[v]) for v in names}
        if ncu:
            for v in names:
                kerns[v](*args, torch.empty(rows, n, dtype=torch.bfloat16, device="cuda"))
            torch.cuda.synchronize()
            continue
        ref = torch.full((rows, n), float("nan"), dtype=torch.bfloat16, device="cuda")
        base.moe_grouped_gemm_contiguous(*args, ref)
        line = {"shape": shape, "rows": rows, "routed": routed, "n": n, "k": k}
        out = torch.full_like(ref, float("nan"))
        fns = {}
        for v in names:
            out.fill_(float("nan"))
            kerns[v](*args, out)
            torch.cuda.synchronize()
            line[v] = {"bitwise_vs_baseline": torch.equal(out.view(torch.int16), ref.view(torch.int16))}
            fns[v] = lambda v=v: kerns[v](*args, out)
        blockwise = blockwise_scaled_mm(x, line, ref)
        del ref
        dense_b = x["b"][0].t()  # [K, N] column-major, as _scaled_mm wants
        sca = torch.rand(rows, 1, device="cuda") + 0.5
        scb = torch.rand(1, n, device="cuda") + 0.5
        fns["_scaled_mm_rowwise"] = lambda: torch._scaled_mm(x["a"], dense_b, scale_a=sca, scale_b=scb, out_dtype=torch.bfloat16)
        if blockwise:
            fns["_scaled_mm_blockwise"] = blockwise
        # one call of each in turn, so that every candidate meets the same clocks and temperature
        times = interleaved_ms(fns, reps)
        for name, ms in times.items():
            if name.startswith("_scaled_mm"):
                row = line[name[1:]] = line.get(name[1:], {})
                row.update(ms=round(ms, 4), tflops=round(flops_p / ms / 1e9, 1))
                text = f"{row['tflops']:7.1f} TF dense on the computed rows"
            else:
                row = line[name]
                row.update(ms=round(ms, 4), tflops_routed=round(flops_r / ms / 1e9, 1),
                           tflops_padded=round(flops_p / ms / 1e9, 1))
                text = (f"{row['tflops_routed']:7.1f} TF routed ({row['tflops_padded']:7.1f} computed) "
                        f"bitwise={row['bitwise_vs_baseline']}")
            if clocks:
                row.update(sustained(fns[name], calls=max(20, int(1000 / ms))))
                text += f" | back to back {row['sustained_ms']:.3f} ms at {row['clock']}"
                if "mj_per_call" in row:  # every row computes flops_p (the dense ones on the same rows)
                    text += f", {row['mj_per_call']:.0f} mJ per call ({flops_p / row['mj_per_call'] / 1e9:.2f} TFLOP/J)"
            print(f"{shape:18s} {name:20s} {ms:8.3f} ms {text}", flush=True)
        del out
        results.append(line)
        if out_json:  # after every shape: a run cut short keeps what it measured
            Path(out_json).write_text(json.dumps(results, indent=1))
        del x, args, kerns
        torch.cuda.empty_cache()
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--ncu", action="store_true")
    ap.add_argument("--variants", default=",".join(PLAN))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--out", help="write the rows as JSON here (as the other benchmarks)")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--clocks", action="store_true", help="also sustained back-to-back rates with SM clock and power")
    args = ap.parse_args()
    variants, shapes = args.variants.split(","), args.shapes.split(",")
    if args.compile:
        compile_all([(v, s) for s in shapes for v in variants if s in PLAN.get(v, ())], args.jobs)
    else:
        run(variants, shapes, args.out, args.ncu, args.reps, args.clocks)


if __name__ == "__main__":
    main()
