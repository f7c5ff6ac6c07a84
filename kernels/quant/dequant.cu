// CUDA baseline of dequant.py: one thread per element, `float(q) * scale` with one IEEE
// multiply, then __float2bfloat16_rn (or the fp32 product itself).
#include "quant_common.cuh"

using tvm::ffi::TensorView;

namespace {

template <typename Out>
__device__ void put(Out* y, int64_t at, float v) {
  if constexpr (sizeof(Out) == 2) {
    y[at] = __float2bfloat16_rn(v);
  } else {
    y[at] = v;
  }
}

// e2m1 != 0: q is MXFP4 [M, N/2] with UE8M0 codes s [M, N/32]; else e4m3 [M, N] with fp32
// scales s [ceil(M/br), N/bc].
template <typename Out>
__global__ void dequant_kernel(const uint8_t* q, const void* s, Out* y, int m, int n, int br, int bc, bool e2m1) {
  int64_t at = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (at >= static_cast<int64_t>(m) * n) return;
  int row = static_cast<int>(at / n), col = static_cast<int>(at % n);
  float v;
  if (e2m1) {
    uint32_t byte = q[static_cast<int64_t>(row) * (n / 2) + col / 2];
    uint32_t code = static_cast<const uint8_t*>(s)[static_cast<int64_t>(row) * (n / 32) + col / 32];
    v = __fmul_rn(quant::e2m1_value(col % 2 ? byte >> 4 : byte & 0xF), quant::ue8m0_value(code));
  } else {
    float sc = static_cast<const float*>(s)[static_cast<int64_t>(row / br) * (n / bc) + col / bc];
    v = __fmul_rn(quant::e4m3_value(q[at]), sc);
  }
  put(y, at, v);
}

void dequant(TensorView q, TensorView s, TensorView y, int64_t e2m1, int64_t br, int64_t bc) {
  int m = static_cast<int>(y.size(0)), n = static_cast<int>(y.size(1));
  int64_t total = static_cast<int64_t>(m) * n;
  if (total == 0) return;
  cudaStream_t stream = quant::stream_of(y);
  auto* qp = static_cast<const uint8_t*>(q.data_ptr());
  int blocks = quant::blocks_for(total, 256);
  if (quant::is_dtype(y, kDLBfloat, 16)) {
    dequant_kernel<<<blocks, 256, 0, stream>>>(qp, s.data_ptr(), static_cast<__nv_bfloat16*>(y.data_ptr()), m, n, static_cast<int>(br), static_cast<int>(bc), e2m1 != 0);
  } else {
    dequant_kernel<<<blocks, 256, 0, stream>>>(qp, s.data_ptr(), static_cast<float*>(y.data_ptr()), m, n, static_cast<int>(br), static_cast<int>(bc), e2m1 != 0);
  }
  quant::check_launch("dequant baseline");
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(dequant, dequant);
