// CUDA baseline of block_cast.py: one thread per block x block tile, scalar loops (clarity,
// not speed); same rules and operation order as the TileLang kernel (reference.py).
// Input: a bf16/fp32 matrix, or MXFP4 (FP4 -> FP8 re-blocking).
#include "quant_common.cuh"

using tvm::ffi::TensorView;

namespace {

// Element (r, c) of the input as fp32: a bf16/fp32 matrix, or MXFP4 decoded exactly.
struct Dense {
  const void* x;
  bool bf16;
  int k;
  __device__ float operator()(int r, int c) const {
    int64_t at = static_cast<int64_t>(r) * k + c;
    return bf16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(x)[at]) : static_cast<const float*>(x)[at];
  }
};

struct Mxfp4 {
  const uint8_t* packed;
  const uint8_t* codes;
  int k;
  __device__ float operator()(int r, int c) const {
    uint32_t byte = packed[static_cast<int64_t>(r) * (k / 2) + c / 2];
    float v = quant::e2m1_value(c % 2 ? byte >> 4 : byte & 0xF);
    return __fmul_rn(v, quant::ue8m0_value(codes[static_cast<int64_t>(r) * (k / 32) + c / 32]));
  }
};

template <typename Load>
__global__ void block_cast_kernel(Load x, uint8_t* q, float* s, int n, int k, int block, bool pow2) {
  int nbk = k / block;
  int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= static_cast<int64_t>(n / block) * nbk) return;
  int br = static_cast<int>(id / nbk), bc = static_cast<int>(id % nbk);
  float amax = 0.0f;
  for (int i = 0; i < block; ++i)
    for (int j = 0; j < block; ++j) amax = fmaxf(amax, fabsf(x(br * block + i, bc * block + j)));
  uint32_t code;
  float scale = quant::group_scale(amax, false, pow2, &code);
  float inv = __frcp_rn(scale);
  for (int i = 0; i < block; ++i)
    for (int j = 0; j < block; ++j) {
      int r = br * block + i, c = bc * block + j;
      q[static_cast<int64_t>(r) * k + c] = quant::to_e4m3(__fmul_rn(x(r, c), inv));
    }
  s[id] = scale;
}

template <typename Load>
void launch(Load load, TensorView q, TensorView s, int64_t block, int64_t pow2) {
  int n = static_cast<int>(q.size(0)), k = static_cast<int>(q.size(1));
  if (block <= 0 || n % block || k % block) TVM_FFI_THROW(ValueError) << "block " << block << " does not tile " << n << "x" << k;
  int64_t tiles = static_cast<int64_t>(n / block) * (k / block);
  if (tiles == 0) return;
  block_cast_kernel<<<quant::blocks_for(tiles, 64), 64, 0, quant::stream_of(q)>>>(
      load, static_cast<uint8_t*>(q.data_ptr()), static_cast<float*>(s.data_ptr()), n, k, static_cast<int>(block), pow2 != 0);
  quant::check_launch("block_cast baseline");
}

// w: [N, K] bf16/fp32, q: [N, K] e4m3, s: [N/block, K/block] fp32.
void block_cast(TensorView w, TensorView q, TensorView s, int64_t block, int64_t pow2) {
  launch(Dense{w.data_ptr(), quant::is_dtype(w, kDLBfloat, 16), static_cast<int>(q.size(1))}, q, s, block, pow2);
}

// MXFP4 packed [N, K/2] uint8 with UE8M0 codes [N, K/32] -> q [N, K] e4m3, s [N/block, K/block] fp32.
void block_cast_e2m1(TensorView packed, TensorView codes, TensorView q, TensorView s, int64_t block, int64_t pow2) {
  Mxfp4 load{static_cast<const uint8_t*>(packed.data_ptr()), static_cast<const uint8_t*>(codes.data_ptr()), static_cast<int>(q.size(1))};
  launch(load, q, s, block, pow2);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(block_cast, block_cast);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(block_cast_e2m1, block_cast_e2m1);
