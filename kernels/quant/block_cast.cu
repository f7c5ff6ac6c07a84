// CUDA baseline of block_cast.py: one thread per block x block tile, scalar loops (clarity,
// not speed); same rules and operation order as the TileLang kernel (reference.py).
#include "quant_common.cuh"

using tvm::ffi::TensorView;

namespace {

template <typename In>
__global__ void block_cast_kernel(const In* x, uint8_t* q, float* s, int n, int k, int block, bool pow2) {
  int nbk = k / block;
  int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= static_cast<int64_t>(n / block) * nbk) return;
  int br = static_cast<int>(id / nbk), bc = static_cast<int>(id % nbk);
  float amax = 0.0f;
  for (int i = 0; i < block; ++i)
    for (int j = 0; j < block; ++j)
      amax = fmaxf(amax, fabsf(static_cast<float>(x[static_cast<int64_t>(br * block + i) * k + bc * block + j])));
  uint32_t code;
  float scale = quant::group_scale(amax, false, pow2, &code);
  float inv = __frcp_rn(scale);
  for (int i = 0; i < block; ++i)
    for (int j = 0; j < block; ++j) {
      int64_t at = static_cast<int64_t>(br * block + i) * k + bc * block + j;
      q[at] = quant::to_e4m3(__fmul_rn(static_cast<float>(x[at]), inv));
    }
  s[id] = scale;
}

// w: [N, K] bf16/fp32, q: [N, K] e4m3, s: [N/block, K/block] fp32.
void block_cast(TensorView w, TensorView q, TensorView s, int64_t block, int64_t pow2) {
  int n = static_cast<int>(w.size(0)), k = static_cast<int>(w.size(1));
  if (block <= 0 || n % block || k % block) TVM_FFI_THROW(ValueError) << "block " << block << " does not tile " << n << "x" << k;
  int64_t tiles = static_cast<int64_t>(n / block) * (k / block);
  if (tiles == 0) return;
  cudaStream_t stream = quant::stream_of(w);
  auto* qp = static_cast<uint8_t*>(q.data_ptr());
  auto* sp = static_cast<float*>(s.data_ptr());
  if (quant::is_dtype(w, kDLBfloat, 16)) {
    block_cast_kernel<<<quant::blocks_for(tiles, 64), 64, 0, stream>>>(static_cast<const __nv_bfloat16*>(w.data_ptr()), qp, sp, n, k, static_cast<int>(block), pow2 != 0);
  } else {
    block_cast_kernel<<<quant::blocks_for(tiles, 64), 64, 0, stream>>>(static_cast<const float*>(w.data_ptr()), qp, sp, n, k, static_cast<int>(block), pow2 != 0);
  }
  quant::check_launch("block_cast baseline");
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(block_cast, block_cast);
