// Shared pieces of the quantization baselines: the rounding rules of reference.py spelled with
// CUDA's own conversions and explicit IEEE intrinsics, so nothing depends on contraction.
#pragma once
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

namespace quant {

constexpr float kE4m3Max = 448.0f, kE4m3Clamp = 1e-4f;
constexpr float kE2m1Max = 6.0f, kE2m1Clamp = 6.0f * 0x1p-126f;

// Rules 2 and 3: the scale of a group with amax `a`; `code` gets the UE8M0 byte when pow2.
__device__ inline float group_scale(float a, bool e2m1, bool pow2, uint32_t* code) {
  float s = __fdiv_rn(fmaxf(a, e2m1 ? kE2m1Clamp : kE4m3Clamp), e2m1 ? kE2m1Max : kE4m3Max);
  if (!pow2) return s;
  // CUDA's own UE8M0 conversion, rounding toward +inf, saturating at 2^127.
  uint32_t c = __nv_cvt_float_to_e8m0(s, __NV_SATFINITE, cudaRoundPosInf);
  *code = c;
  uint32_t bits = c << 23;
  float p;
  memcpy(&p, &bits, 4);
  return p;
}

__host__ __device__ inline uint8_t to_e4m3(float v) {
  return __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

__host__ __device__ inline uint8_t to_e2m1(float v) {
  return __nv_cvt_float_to_fp4(v, __NV_E2M1, cudaRoundNearest);
}

__host__ __device__ inline float e2m1_value(uint32_t code) {
  __nv_fp4_e2m1 v;
  v.__x = static_cast<__nv_fp4_storage_t>(code & 0xF);
  return static_cast<float>(v);
}

__host__ __device__ inline float e4m3_value(uint8_t bits) {
  __nv_fp8_e4m3 v;
  v.__x = bits;
  return static_cast<float>(v);
}

__host__ __device__ inline float ue8m0_value(uint32_t code) {
  uint32_t bits = code << 23;
  float p;
  memcpy(&p, &bits, 4);
  return p;
}

inline bool is_dtype(const tvm::ffi::TensorView& t, int code, int bits) {
  return t.dtype().code == code && t.dtype().bits == bits && t.dtype().lanes == 1;
}

inline cudaStream_t stream_of(const tvm::ffi::TensorView& t) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, t.device().device_id));
}

inline void check_launch(const char* what) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) TVM_FFI_THROW(RuntimeError) << what << ": " << cudaGetErrorString(err);
}

inline int blocks_for(int64_t n, int threads) { return static_cast<int>((n + threads - 1) / threads); }

}  // namespace quant
