"""How fast a plain stream with a given read : write byte mix runs on this GPU, at the quantization
kernels' sizes: the ceiling against which their "% of copy" should be read.

A stream kernel reads N 16-byte vectors and writes each to ``ratio`` output planes (``out[q * N + i]``,
every store coalesced), or reads ``ratio`` vectors and writes their XOR (the read-heavy mix). One
vector per thread (or 2 in flight), 256-thread CTAs, one-shot grid (grid-stride loops measured
slower on every mix). Sizes (bytes read + written): 183 MB (the FP4 -> FP8 re-blockings, 1 : 2),
297 MB (MXFP4 dequant, ~1 : 4), 356 MB (the transposing cast, 2 : 1) and 2 GiB. Rates are shares
of a 2 GiB torch ``copy_`` timed in the same run. Timing: ``bench.timing.median_ms`` (CUDA events,
back to back, median), 3 rotating random non-zero buffer sets, each output checked first.

The kernels are compiled at run time by cupy (NVRTC), which the lent GPU machine has; tlx does not
depend on it. Usage: python bench/stream_ceiling.py [--out FILE.json] [--reps N]
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.timing import gpu_bench_args, large_copy_ms, median_ms  # noqa: E402

SIZES = ((183_500_000, "183 MB"), (297_300_000, "297 MB"), (356_000_000, "356 MB"), (2 << 30, "2 GiB"))
MIXES = (("write", 1), ("write", 2), ("write", 4), ("read", 2))  # ("write", 1) is a copy
ILPS = (1, 2)
THREADS = 256


def _source() -> str:
    out = []
    for r in (1, 2, 4):
        for i in ILPS:
            out.append(f"""
extern "C" __global__ void __launch_bounds__({THREADS}) write_{r}_{i}(const uint4* __restrict__ in, uint4* __restrict__ out, long long n) {{
  long long base = (long long)blockIdx.x * {THREADS * i} + threadIdx.x;
  uint4 v[{i}];
  #pragma unroll
  for (int j = 0; j < {i}; ++j) if (base + j * {THREADS} < n) v[j] = in[base + j * {THREADS}];
  #pragma unroll
  for (int j = 0; j < {i}; ++j) if (base + j * {THREADS} < n) {{
    #pragma unroll
    for (int q = 0; q < {r}; ++q) {{ uint4 w = v[j]; w.x ^= q; out[q * n + base + j * {THREADS}] = w; }}
  }}
}}""")
    out.append(f"""
extern "C" __global__ void __launch_bounds__({THREADS}) read_2(const uint4* __restrict__ in, uint4* __restrict__ out, long long n) {{
  long long i = (long long)blockIdx.x * {THREADS} + threadIdx.x;
  if (i < n) {{ uint4 a = in[2 * i], b = in[2 * i + 1]; a.x ^= b.x; a.y ^= b.y; a.z ^= b.z; a.w ^= b.w; out[i] = a; }}
}}""")
    return "\n".join(out)


def _random_words(count: int, seed: int) -> torch.Tensor:
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randint(1, 1 << 31, (count, 4), dtype=torch.int32, device="cuda", generator=g)


def stream_case(module, total: int, kind: str, ratio: int, ilp: int):
    """(callables over 3 buffer sets, bytes moved); checks the first set's output."""
    import cupy as cp

    if kind == "write":
        n = total // (16 * (1 + ratio))
        ins = [_random_words(n, s) for s in range(3)]
        outs = [torch.empty(n * ratio, 4, dtype=torch.int32, device="cuda") for _ in range(3)]
        f, grid, count = module.get_function(f"write_{ratio}_{ilp}"), -(-n // (THREADS * ilp)), n
    else:
        n = total // (16 * (1 + ratio))
        ins = [_random_words(n * ratio, s) for s in range(3)]
        outs = [torch.empty(n, 4, dtype=torch.int32, device="cuda") for _ in range(3)]
        f, grid, count = module.get_function("read_2"), -(-n // THREADS), n
    # cupy views made once (a conversion per call would starve the GPU); cupy launches on the
    # legacy default stream, torch's too (checked in main), so the events order with them.
    fns = [lambda a=cp.asarray(a), b=cp.asarray(b): f((grid,), (THREADS,), (a, b, cp.int64(count)))
           for a, b in zip(ins, outs)]
    outs[0].fill_(-1)
    fns[0]()
    torch.cuda.synchronize()
    if kind == "write":
        tag = torch.zeros(ratio, 4, dtype=torch.int32, device="cuda")
        tag[:, 0] = torch.arange(ratio, device="cuda")
        expected = (ins[0].unsqueeze(0) ^ tag.unsqueeze(1)).reshape(-1, 4)
    else:
        expected = ins[0][0::2] ^ ins[0][1::2]
    if not torch.equal(outs[0], expected):
        raise AssertionError(f"{kind}_{ratio}_{ilp}: wrong output")
    return fns, (ins[0].numel() + outs[0].numel()) * 4


def main():
    args = gpu_bench_args(__doc__, "bench/stream_ceiling.py")
    try:
        import cupy as cp
    except ImportError:
        sys.exit("bench/stream_ceiling.py needs cupy (it compiles the stream kernels with NVRTC)")
    if torch.cuda.current_stream().cuda_stream != 0:
        sys.exit("bench/stream_ceiling.py expects torch on the default stream (cupy launches there)")
    module = cp.RawModule(code=_source())
    copy_ms, copy_bytes = large_copy_ms(args.reps)
    copy_gbps = copy_bytes / copy_ms / 1e6
    print(f"GPU: {torch.cuda.get_device_name()}; torch copy_ of 2 GiB: {copy_gbps:.0f} GB/s")
    print("| size (read + written) | " + " | ".join(f"read : write {1 if k == 'write' else r} : {r if k == 'write' else 1}" for k, r in MIXES) + " |")
    print("| --- |" + " --- |" * len(MIXES))
    rows = []
    for total, label in SIZES:
        cells = []
        for kind, ratio in MIXES:
            best = 0.0
            for ilp in ILPS if kind == "write" else (1,):
                fns, moved = stream_case(module, total, kind, ratio, ilp)
                share = 100 * moved / median_ms(fns, args.reps) / 1e6 / copy_gbps
                rows.append({"size": label, "read:write": f"{1 if kind == 'write' else ratio}:{ratio if kind == 'write' else 1}", "ilp": ilp, "% of copy": round(share, 1)})
                best = max(best, share)
                del fns
            cells.append(f"{best:.1f}%")
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"copy_gbps": copy_gbps, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
