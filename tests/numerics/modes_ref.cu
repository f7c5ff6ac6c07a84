// CUDA baseline for the numerics-mode parity test: the same elementwise expression as
// tests/numerics/modes_kernels.py, written as plain C++ so nvcc applies (or, with
// --fmad=false, withholds) FMA contraction exactly as it does for the TileLang kernel.

#include <cstdint>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

namespace {

using tvm::ffi::TensorView;

// One element per thread, like the TileLang kernel, so nvcc sees the same expression shape.
__global__ void mix_kernel(const float* a, const float* b, const float* c, float* out, int64_t n) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = a[i] * b[i] + c[i] * c[i] + a[i] / b[i] + sqrtf(fabsf(c[i]));
}

void mix(TensorView a, TensorView b, TensorView c, TensorView out) {
  int64_t n = a.numel();
  for (const TensorView* t : {&a, &b, &c, &out}) {
    if (t->device().device_type != kDLCUDA || t->dtype().code != kDLFloat || t->dtype().bits != 32 ||
        !t->IsContiguous() || t->numel() != n)
      TVM_FFI_THROW(ValueError) << "mix: expected four contiguous float32 CUDA tensors of " << n << " elements";
  }
  if (n == 0) return;
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, a.device().device_id));
  if (n > (int64_t{1} << 31) - 256) TVM_FFI_THROW(ValueError) << "mix: expected fewer than 2^31 - 256 elements, got " << n;
  int blocks = static_cast<int>((n + 255) / 256);
  mix_kernel<<<blocks, 256, 0, stream>>>(static_cast<const float*>(a.data_ptr()), static_cast<const float*>(b.data_ptr()),
                                         static_cast<const float*>(c.data_ptr()), static_cast<float*>(out.data_ptr()), n);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) TVM_FFI_THROW(RuntimeError) << "mix_kernel: " << cudaGetErrorString(err);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(mix, mix);
