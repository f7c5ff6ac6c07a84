// CUDA C++ baseline of kernels/moe/permute.py: row gathers (bf16, e4m3 + scales) and the
// combine with the same fp32 fma chain in k order and one rounding to bf16.
#include <cuda_bf16.h>

#include "common.cuh"

namespace {

constexpr int kThreads = 256;

// Copies rows of `row_bytes` (a multiple of 16) by 16-byte words; padding rows get zeros.
__global__ void gather_rows(const uint8_t* __restrict__ x, int64_t row_bytes, const int* __restrict__ entry_of_row,
                            const int* __restrict__ offsets, int n_local, int topk, uint8_t* __restrict__ xp,
                            const float* __restrict__ sx, int n_groups, float* __restrict__ sxp) {
  int r = blockIdx.x;
  if (r >= offsets[n_local]) return;
  int entry = entry_of_row[r];
  uint4* dst = reinterpret_cast<uint4*>(xp + (int64_t)r * row_bytes);
  int64_t words = row_bytes / 16;
  if (entry >= 0) {
    const uint4* src = reinterpret_cast<const uint4*>(x + (int64_t)(entry / topk) * row_bytes);
    for (int64_t i = threadIdx.x; i < words; i += kThreads) dst[i] = src[i];
    if (sx)
      for (int g = threadIdx.x; g < n_groups; g += kThreads) sxp[(int64_t)r * n_groups + g] = sx[(int64_t)(entry / topk) * n_groups + g];
  } else {
    for (int64_t i = threadIdx.x; i < words; i += kThreads) dst[i] = make_uint4(0, 0, 0, 0);
    if (sx)
      for (int g = threadIdx.x; g < n_groups; g += kThreads) sxp[(int64_t)r * n_groups + g] = 0.0f;
  }
}

__global__ void combine_kernel(const __nv_bfloat16* __restrict__ y, const int* __restrict__ row_of,
                               const float* __restrict__ weights, int topk, int hidden,
                               __nv_bfloat16* __restrict__ out) {
  int t = blockIdx.x;
  for (int h = threadIdx.x; h < hidden; h += kThreads) {
    float acc = 0.0f;
    for (int j = 0; j < topk; ++j) {
      int row = row_of[(int64_t)t * topk + j];
      if (row >= 0) acc = __fmaf_rn(weights[(int64_t)t * topk + j], __bfloat162float(y[(int64_t)row * hidden + h]), acc);
    }
    out[(int64_t)t * hidden + h] = __float2bfloat16_rn(acc);
  }
}

void permute_impl(const char* fn, tvm::ffi::TensorView x, const tvm::ffi::TensorView* sx, tvm::ffi::TensorView entry_of_row,
                  tvm::ffi::TensorView offsets, int64_t topk, tvm::ffi::TensorView xp, const tvm::ffi::TensorView* sxp) {
  using namespace moe_baseline;
  require(x.ndim() == 2 && x.IsContiguous() && xp.ndim() == 2 && xp.IsContiguous(), fn, "x and xp must be contiguous 2-D");
  require(x.dtype().bits == xp.dtype().bits && x.size(1) == xp.size(1), fn, "x and xp must agree in dtype and width");
  require(is(entry_of_row, kDLInt, 32, 1) && entry_of_row.size(0) == xp.size(0), fn, "entry_of_row must be [R] int32");
  require(is(offsets, kDLInt, 32, 1), fn, "offsets must be [El + 1] int32");
  int64_t row_bytes = x.size(1) * x.dtype().bits / 8;
  require(row_bytes % 16 == 0, fn, "row width must be a multiple of 16 bytes");
  int n_groups = 0;
  if (sx) {
    require(is(*sx, kDLFloat, 32, 2) && is(*sxp, kDLFloat, 32, 2) && sx->size(1) == sxp->size(1), fn, "scales f32 2-D");
    n_groups = (int)sx->size(1);
  }
  if (xp.size(0) == 0) return;
  gather_rows<<<(unsigned)xp.size(0), kThreads, 0, stream_of(x)>>>(
      static_cast<const uint8_t*>(x.data_ptr()), row_bytes, static_cast<const int*>(entry_of_row.data_ptr()),
      static_cast<const int*>(offsets.data_ptr()), (int)offsets.size(0) - 1, (int)topk,
      static_cast<uint8_t*>(xp.data_ptr()), sx ? static_cast<const float*>(sx->data_ptr()) : nullptr, n_groups,
      sxp ? static_cast<float*>(sxp->data_ptr()) : nullptr);
  check_launch(fn);
}

void moe_permute(tvm::ffi::TensorView x, tvm::ffi::TensorView entry_of_row, tvm::ffi::TensorView offsets, int64_t topk,
                 tvm::ffi::TensorView xp) {
  permute_impl("moe_permute", x, nullptr, entry_of_row, offsets, topk, xp, nullptr);
}

void moe_permute_fp8(tvm::ffi::TensorView x, tvm::ffi::TensorView sx, tvm::ffi::TensorView entry_of_row,
                     tvm::ffi::TensorView offsets, int64_t topk, tvm::ffi::TensorView xp, tvm::ffi::TensorView sxp) {
  permute_impl("moe_permute_fp8", x, &sx, entry_of_row, offsets, topk, xp, &sxp);
}

void moe_combine(tvm::ffi::TensorView y, tvm::ffi::TensorView row_of, tvm::ffi::TensorView weights,
                 tvm::ffi::TensorView out) {
  using namespace moe_baseline;
  const char* fn = "moe_combine";
  require(is(y, kDLBfloat, 16, 2) && is(out, kDLBfloat, 16, 2) && y.size(1) == out.size(1), fn, "y, out bf16 [*, H]");
  require(is(row_of, kDLInt, 32, 2) && is(weights, kDLFloat, 32, 2), fn, "row_of int32 / weights f32 [T, k]");
  require(row_of.size(0) == out.size(0) && weights.size(0) == out.size(0) && row_of.size(1) == weights.size(1), fn,
          "row_of/weights/out shapes");
  if (out.size(0) == 0) return;
  combine_kernel<<<(unsigned)out.size(0), kThreads, 0, stream_of(y)>>>(
      static_cast<const __nv_bfloat16*>(y.data_ptr()), static_cast<const int*>(row_of.data_ptr()),
      static_cast<const float*>(weights.data_ptr()), (int)row_of.size(1), (int)y.size(1),
      static_cast<__nv_bfloat16*>(out.data_ptr()));
  check_launch(fn);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_permute, moe_permute);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_permute_fp8, moe_permute_fp8);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_combine, moe_combine);
