// Shared helpers of the MoE CUDA baselines: argument checks and the launch stream.
#pragma once
#include <cuda_runtime.h>
#include <stdint.h>

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

namespace moe_baseline {

inline void require(bool ok, const char* fn, const char* what) {
  if (!ok) TVM_FFI_THROW(ValueError) << fn << ": " << what;
}

inline bool is(const tvm::ffi::TensorView& t, DLDataTypeCode code, int bits, int ndim) {
  return t.dtype().code == code && t.dtype().bits == bits && t.ndim() == ndim && t.IsContiguous();
}

inline cudaStream_t stream_of(const tvm::ffi::TensorView& t) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, t.device().device_id));
}

inline void check_launch(const char* fn) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) TVM_FFI_THROW(RuntimeError) << fn << " launch: " << cudaGetErrorString(err);
}

}  // namespace moe_baseline
