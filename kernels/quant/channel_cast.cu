// CUDA baseline of channel_cast.py: one thread per (channel, 128-token block), scalar loops;
// same rules and operation order as the TileLang kernel (reference.py).
#include "quant_common.cuh"

using tvm::ffi::TensorView;

namespace {

template <typename In>
__global__ void channel_cast_kernel(const In* x, uint8_t* q, float* s, int t, int h, bool pow2) {
  int nb = (t + 127) / 128;
  int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= static_cast<int64_t>(h) * nb) return;
  int ch = static_cast<int>(id / nb), b = static_cast<int>(id % nb);
  int end = min(t, (b + 1) * 128);
  float amax = 0.0f;
  for (int i = b * 128; i < end; ++i) amax = fmaxf(amax, fabsf(static_cast<float>(x[static_cast<int64_t>(i) * h + ch])));
  uint32_t code;
  float scale = quant::group_scale(amax, false, pow2, &code);
  float inv = __frcp_rn(scale);
  for (int i = b * 128; i < end; ++i)
    q[static_cast<int64_t>(ch) * t + i] = quant::to_e4m3(__fmul_rn(static_cast<float>(x[static_cast<int64_t>(i) * h + ch]), inv));
  s[static_cast<int64_t>(ch) * nb + b] = scale;
}

// x: [T, H] bf16/fp32, q: [H, T] e4m3, s: [H, ceil(T/128)] fp32.
void channel_cast(TensorView x, TensorView q, TensorView s, int64_t pow2) {
  int t = static_cast<int>(x.size(0)), h = static_cast<int>(x.size(1));
  int64_t work = static_cast<int64_t>(h) * ((t + 127) / 128);
  if (work == 0) return;
  cudaStream_t stream = quant::stream_of(x);
  auto* qp = static_cast<uint8_t*>(q.data_ptr());
  auto* sp = static_cast<float*>(s.data_ptr());
  if (quant::is_dtype(x, kDLBfloat, 16)) {
    channel_cast_kernel<<<quant::blocks_for(work, 128), 128, 0, stream>>>(static_cast<const __nv_bfloat16*>(x.data_ptr()), qp, sp, t, h, pow2 != 0);
  } else {
    channel_cast_kernel<<<quant::blocks_for(work, 128), 128, 0, stream>>>(static_cast<const float*>(x.data_ptr()), qp, sp, t, h, pow2 != 0);
  }
  quant::check_launch("channel_cast baseline");
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(channel_cast, channel_cast);
