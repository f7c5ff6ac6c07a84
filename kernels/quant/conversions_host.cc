// CUDA's own fp8 / fp4 / e8m0 conversions (the ones the baselines use), run on the host so CPU
// CI can pin them against reference.py's rules without a GPU. Built with the host compiler.
#include <cstdint>
#include <cuda_fp4.h>
#include <cuda_fp8.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/function.h>

// x: fp32 CPU tensor, out: uint8 CPU tensor of the same size.
// kind 0: e4m3 (satfinite, RNE); 1: e2m1 (RNE); 2: UE8M0 rounded toward +inf (satfinite).
void convert_host(tvm::ffi::TensorView x, tvm::ffi::TensorView out, int64_t kind) {
  bool ok = x.device().device_type == kDLCPU && out.device().device_type == kDLCPU && x.dtype().code == kDLFloat &&
            x.dtype().bits == 32 && out.dtype().code == kDLUInt && out.dtype().bits == 8 && x.numel() == out.numel();
  if (!ok) TVM_FFI_THROW(ValueError) << "convert_host: expected an fp32 and a uint8 CPU tensor of one size";
  if (kind < 0 || kind > 2) TVM_FFI_THROW(ValueError) << "convert_host: kind must be 0, 1 or 2, got " << kind;
  const float* in = static_cast<const float*>(x.data_ptr());
  uint8_t* o = static_cast<uint8_t*>(out.data_ptr());
  for (int64_t i = 0; i < x.numel(); ++i) {
    o[i] = kind == 0 ? __nv_cvt_float_to_fp8(in[i], __NV_SATFINITE, __NV_E4M3)
         : kind == 1 ? __nv_cvt_float_to_fp4(in[i], __NV_E2M1, cudaRoundNearest)
                     : __nv_cvt_float_to_e8m0(in[i], __NV_SATFINITE, cudaRoundPosInf);
  }
}

TVM_FFI_DLL_EXPORT_TYPED_FUNC(convert_host, convert_host);
