"""The e4m3 -> bf16 dequant rate of an SM (the project's rule, ``bf16(float(x) * scale)``), in registers.

What bounds an e4m3 decode kernel's conversions: each path converts values held in registers (no
memory traffic) as fast as the SM issues them, and the rate gives the least time the conversions of
the MLA H16 e4m3 decode case (B 128, context 8192: 604M values) take on the device's SMs.

* native: ``cvt`` e4m3x2 -> f16x2, f16 -> f32, one fp32 multiply, ``cvt`` f32x2 -> bf16x2 (what the
  decode kernels compile to);
* integer: the e4m3 bits placed into an fp32 (sign, exponent and mantissa shifted; a value
  2^-120 times the e4m3 one, subnormals included), times 2^120, times the scale, ``cvt`` pack;
* half: half the values each way.

The integer path is first checked equal to the native one on every non-NaN e4m3 pair at four
scales (a difference ends the run). Usage: ``python3 bench/dequant_rate.py [--out FILE.json]``."""
import argparse
import json
import sys
from pathlib import Path

import torch

SRC = r"""
#include <cuda_fp8.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
__device__ __forceinline__ unsigned native2(unsigned pair, float s) {  // two e4m3 bytes -> bf16x2 bits
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(pair & 0xFFFF), __NV_E4M3);
  float2 f = __half22float2(*(__half2*)&h);
  __nv_bfloat162 b = __floats2bfloat162_rn(f.x * s, f.y * s);
  return *(unsigned*)&b;
}
__device__ __forceinline__ unsigned native4(unsigned w, float s) { return native2(w, s) ^ native2(w >> 16, s); }
__device__ __forceinline__ float bits_of(unsigned w, int sh) {  // byte (sh / 8) as an fp32 * 2^-120
  unsigned em = sh <= 20 ? w << (20 - sh) : w >> (sh - 20);  // sh is a constant: one shift
  return __uint_as_float(((w << (24 - sh)) & 0x80000000u) | (em & 0x07F00000u));
}
__device__ __forceinline__ unsigned integer2(unsigned w, int sh, float s) {  // bytes sh / 8 and sh / 8 + 1
  const float k = 0x1p120f;  // exact
  __nv_bfloat162 b = __floats2bfloat162_rn(bits_of(w, sh) * k * s, bits_of(w, sh + 8) * k * s);
  return *(unsigned*)&b;
}
__device__ __forceinline__ unsigned integer4(unsigned w, float s) { return integer2(w, 0, s) ^ integer2(w, 16, s); }
template <int MODE> __device__ void run_body(unsigned seed, float s, int iters, unsigned* out) {
  unsigned w0 = seed * (threadIdx.x + 1) * 2654435761u, w1 = w0 ^ 0x5a5a5a5au, acc = 0;
  for (int i = 0; i < iters; ++i) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      unsigned a = w0 + j * 0x01030507u, b = w1 + j * 0x07050301u;
      if (MODE == 0) acc ^= native4(a, s) ^ native4(b, s);
      else if (MODE == 1) acc ^= integer4(a, s) ^ integer4(b, s);
      else acc ^= native4(a, s) ^ integer4(b, s);
    }
    w0 += 0x11111111u; w1 += 0x01010101u;
  }
  if (acc == 0x12345678u) out[0] = acc;
}
extern "C" __global__ void __launch_bounds__(512) run_native(unsigned seed, float s, int iters, unsigned* out) { run_body<0>(seed, s, iters, out); }
extern "C" __global__ void __launch_bounds__(512) run_integer(unsigned seed, float s, int iters, unsigned* out) { run_body<1>(seed, s, iters, out); }
extern "C" __global__ void __launch_bounds__(512) run_half(unsigned seed, float s, int iters, unsigned* out) { run_body<2>(seed, s, iters, out); }
extern "C" __global__ void check(const unsigned* w, float s, unsigned* o_native, unsigned* o_int, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    o_native[i] = native2(w[i], s);
    o_int[i] = integer2(w[i], 0, s);
  }
}
"""


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench/dequant_rate.py needs a CUDA GPU")
    import cupy as cp  # the device machine's (NVRTC); not a dependency of tlx

    print(f"# {torch.cuda.get_device_name()}")
    mod = cp.RawModule(code=SRC, options=("-arch=sm_90a", "-std=c++17", f"-I{cp.cuda.get_cuda_path()}/include"))
    check = mod.get_function("check")
    # the integer path against the native one on every byte pair whose value is not NaN, four scales
    w = torch.arange(1 << 16, dtype=torch.int64, device="cuda").to(torch.int32)
    lo, hi = w & 0xFF, (w >> 8) & 0xFF
    finite = ((lo & 0x7F) != 0x7F) & ((hi & 0x7F) != 0x7F)
    w = w[finite].contiguous()
    for s in (1.0, 0.0173, 3.1e-5, 200.0):
        a, b = torch.empty_like(w), torch.empty_like(w)
        n = w.numel()
        check(((n + 255) // 256,), (256,), (cp.from_dlpack(w), cp.float32(s), cp.from_dlpack(a), cp.from_dlpack(b), cp.int32(n)))
        torch.cuda.synchronize()
        if not torch.equal(a, b):
            sys.exit(f"scale {s}: the integer path differs from the native one on {int((a != b).sum())} of {n} pairs")
    print("# the integer path equals the native one on every finite pair at four scales")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    out = torch.zeros(1, dtype=torch.int32, device="cuda")
    iters = 2048
    elems = sms * 2 * 512 * iters * 8 * 8  # 2 CTAs of 512 a SM, 8 pairs of 4-value words an iteration
    rows = []
    for name in ("native", "integer", "half"):
        run = mod.get_function(f"run_{name}")
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2)]
        ts = []
        for rep in range(7):
            ev[0].record()
            run((2 * sms,), (512,), (cp.uint32(rep + 1), cp.float32(0.37), cp.int32(iters), cp.from_dlpack(out)))
            ev[1].record()
            torch.cuda.synchronize()
            ts.append(ev[0].elapsed_time(ev[1]))
        ms = sorted(ts)[3]
        per_sm_per_ns = elems / sms / (ms * 1e6)
        mla_us = 604e6 / sms / per_sm_per_ns / 1e3
        rows.append({"path": name, "ms": ms, "values_per_sm_ns": per_sm_per_ns, "mla_h16_e4m3_us": mla_us})
        print(f"| {name} | {ms:.3f} ms | {per_sm_per_ns:.2f} values / SM / ns | 604M values on {sms} SMs: "
              f"{mla_us:.0f} us |", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
