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
__device__ __forceinline__ unsigned native4(unsigned w, float s) {
  __half2_raw h0 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w & 0xFFFF), __NV_E4M3);
  __half2_raw h1 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(w >> 16), __NV_E4M3);
  float2 f0 = __half22float2(*(__half2*)&h0), f1 = __half22float2(*(__half2*)&h1);
  __nv_bfloat162 b0 = __floats2bfloat162_rn(f0.x * s, f0.y * s), b1 = __floats2bfloat162_rn(f1.x * s, f1.y * s);
  return *(unsigned*)&b0 ^ *(unsigned*)&b1;
}
__device__ __forceinline__ float bits_of(unsigned w, int sh) {  // byte (sh / 8) as an fp32 * 2^-120
  unsigned u = ((w << (24 - sh)) & 0x80000000u) | ((w << (20 - sh)) & 0x07F00000u);
  return __uint_as_float(u);
}
__device__ __forceinline__ unsigned integer4(unsigned w, float s) {
  const float k = 0x1p120f;  // exact
  float a = bits_of(w, 0) * k, b = __uint_as_float(((w << 16) & 0x80000000u) | ((w << 12) & 0x07F00000u)) * k;
  float c = __uint_as_float(((w << 8) & 0x80000000u) | ((w << 4) & 0x07F00000u)) * k;
  float d = __uint_as_float((w & 0x80000000u) | ((w >> 4) & 0x07F00000u)) * k;
  __nv_bfloat162 b0 = __floats2bfloat162_rn(a * s, b * s), b1 = __floats2bfloat162_rn(c * s, d * s);
  return *(unsigned*)&b0 ^ *(unsigned*)&b1;
}
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
    unsigned v = w[i];
    __half2_raw h0 = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xFFFF), __NV_E4M3);
    float2 f0 = __half22float2(*(__half2*)&h0);
    __nv_bfloat162 b0 = __floats2bfloat162_rn(f0.x * s, f0.y * s);
    o_native[i] = *(unsigned*)&b0;
    const float k = 0x1p120f;
    __nv_bfloat162 b1 = __floats2bfloat162_rn(bits_of(v, 0) * k * s, __uint_as_float(((v << 16) & 0x80000000u) | ((v << 12) & 0x07F00000u)) * k * s);
    o_int[i] = *(unsigned*)&b1;
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
