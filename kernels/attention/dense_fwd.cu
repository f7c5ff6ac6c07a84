// CUDA C++ baseline of kernels/attention/dense_fwd.py, written for clarity, not speed: the same
// bits by the same arithmetic in the same order (the fixed orders in dense_fwd.py's docstring).
//
// One warpgroup (128 threads) computes 64 query rows of one head: the rows one consumer
// warpgroup of the TileLang kernel computes. Per key block (128 keys, 64 at d = 256, or the
// kernel option block_n's 176 at d = 128 / 80 at d = 256; ascending, as many blocks as the
// enclosing 128-row tile needs):
//   S = Q K^T      wgmma m64n{BN}k16 (CuTe's SM90 GMMA atom), d ascending in steps of 16, from 0
//   mask           S = -inf where the key is past the sequence or (causal) right of the diagonal
//   m              row max (thread's registers, then the quad)
//   alpha          exp2(m_scaled_old - m_scaled), 0 while the old max is -inf
//   m_scaled       m * scale_log2 (rounded multiply), 0 while m is -inf
//   P              exp2(fma(S, scale_log2, -m_scaled))
//   l              fma(l, alpha, rowsum(P)); rowsum: the thread's entries of the row in register
//                  order 0, 4, 8, ... then 1, 5, 9, ... (of its row half), then shfl xor 2, xor 1
//   O              O * alpha, then wgmma m64n{D}k16 with P (rounded to the input type) from
//                  registers, keys ascending in steps of 16
// and at the end o = O / l (0 where l == 0), lse = (m_scaled + log2(l)) * ln 2 (-inf there).
// exp2 is exp2f, or with fast_exp2 the one instruction ex2.approx.ftz.f32 (results below 2^-126
// flushed to 0), as the TileLang kernel built with that option computes it.
// Shared tiles use the 128-byte swizzle in 64-column panels, as TMA writes them for the TileLang
// kernel; they are filled with plain loads (zeros past the tensor's last row, as TMA does).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <utility>

#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED  // m64n80k16 and m64n176k16: the block_n candidates' score products
#include <cute/arch/mma_sm90_gmma.hpp>

#include "../moe/common.cuh"

namespace {

namespace G = cute::SM90::GMMA;

constexpr int kRows = 64;  // query rows per CTA (one warpgroup)
constexpr float kLn2 = 0.693147180559945309f;

template <class Elem> struct Gmma;
template <> struct Gmma<__nv_bfloat16> {
  template <int N> struct SS;
  template <int N> struct RS;
};
template <> struct Gmma<__half> {
  template <int N> struct SS;
  template <int N> struct RS;
};
#define TLX_ATTN_GMMA(ELEM, TAG, N)                                                                 \
  template <> struct Gmma<ELEM>::SS<N> { using Op = G::MMA_64x##N##x16_F32##TAG##_SS<G::Major::K, G::Major::K>; }; \
  template <> struct Gmma<ELEM>::RS<N> { using Op = G::MMA_64x##N##x16_F32##TAG##_RS<G::Major::K, G::Major::MN>; };
TLX_ATTN_GMMA(__nv_bfloat16, BF16BF16, 64)
TLX_ATTN_GMMA(__nv_bfloat16, BF16BF16, 80)
TLX_ATTN_GMMA(__nv_bfloat16, BF16BF16, 128)
TLX_ATTN_GMMA(__nv_bfloat16, BF16BF16, 176)
TLX_ATTN_GMMA(__nv_bfloat16, BF16BF16, 256)
TLX_ATTN_GMMA(__half, F16F16, 64)
TLX_ATTN_GMMA(__half, F16F16, 80)
TLX_ATTN_GMMA(__half, F16F16, 128)
TLX_ATTN_GMMA(__half, F16F16, 176)
TLX_ATTN_GMMA(__half, F16F16, 256)
#undef TLX_ATTN_GMMA

template <class Op, size_t... I>
__device__ __forceinline__ void gmma_ss(uint64_t da, uint64_t db, float* d, bool accumulate, std::index_sequence<I...>) {
  Op::fma(da, db, d[I]..., accumulate ? G::ScaleOut::One : G::ScaleOut::Zero);
}

template <class Op, size_t... I>
__device__ __forceinline__ void gmma_rs(const uint32_t* a, uint64_t db, float* d, std::index_sequence<I...>) {
  Op::fma(a[0], a[1], a[2], a[3], db, d[I]..., G::ScaleOut::One);
}

template <int N>
__device__ __forceinline__ void fence_regs(float* d) {
  for (int r = 0; r < N; ++r) asm volatile("" : "+f"(d[r])::"memory");
}

// Byte offset of element (row, col) of a [rows, cols] 2-byte tile stored as 64-column panels of
// 128-byte rows with the 128-byte swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)).
__device__ __forceinline__ int panel_offset(int rows, int row, int col) {
  int byte = (col % 64) * 2;
  return (col / 64) * rows * 128 + row * 128 + (((byte >> 4) ^ (row & 7)) << 4) + (byte & 15);
}

// sm_90 shared-memory matrix descriptor: address, leading / stride byte offsets (>> 4 each),
// 128-byte swizzle.
__device__ __forceinline__ uint64_t smem_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  uint64_t addr = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return ((addr & 0x3FFFF) >> 4) | (uint64_t(lbo) << 16) | (uint64_t(sbo) << 32) | (uint64_t(1) << 62);
}

// rows [row0, row0 + rows) of head `head` of x [total, heads, D] into a swizzled tile; rows past
// `total` are zero.
template <class Elem, int D>
__device__ void load_tile(uint8_t* tile, const Elem* x, int64_t row0, int rows, int64_t total, int heads, int head) {
  for (int i = threadIdx.x; i < rows * D / 8; i += blockDim.x) {
    int row = i / (D / 8), col = (i % (D / 8)) * 8;
    uint4 val = make_uint4(0, 0, 0, 0);
    if (row0 + row < total) val = *reinterpret_cast<const uint4*>(x + ((row0 + row) * heads + head) * D + col);
    *reinterpret_cast<uint4*>(tile + panel_offset(rows, row, col)) = val;
  }
}

__device__ __forceinline__ uint32_t pack(float a, float b, __nv_bfloat16*) {
  __nv_bfloat162 h = __float22bfloat162_rn(make_float2(a, b));
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ uint32_t pack(float a, float b, __half*) {
  __half2 h = __float22half2_rn(make_float2(a, b));
  return *reinterpret_cast<uint32_t*>(&h);
}
__device__ __forceinline__ __nv_bfloat16 round_to(float x, __nv_bfloat16*) { return __float2bfloat16_rn(x); }
__device__ __forceinline__ __half round_to(float x, __half*) { return __float2half_rn(x); }

__device__ __forceinline__ float exp2_of(float x, bool fast) {
  if (!fast) return exp2f(x);
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

template <class Elem, int D, int BN, bool kCausal>
__global__ void __launch_bounds__(128) fwd_kernel(const Elem* q, const Elem* k, const Elem* v, const int* cu_q,
                                                  const int* cu_k, int heads, int kv_heads, int total_q, int total_k,
                                                  float scale_log2, bool fast_exp2, Elem* o, float* lse) {
  extern __shared__ __align__(1024) uint8_t smem[];
  uint8_t* q_s = smem;
  uint8_t* k_s = q_s + kRows * D * 2;
  uint8_t* v_s = k_s + BN * D * 2;
  const int head = blockIdx.y, kv_head = head / (heads / kv_heads), b = blockIdx.z;
  // offsets clamped into [0, total] as the TileLang kernel does (a no-op for valid offsets)
  const int q0 = min(max(cu_q[b], 0), total_q), len_q = min(max(cu_q[b + 1], q0), total_q) - q0;
  const int k0 = min(max(cu_k[b], 0), total_k), len_k = min(max(cu_k[b + 1], k0), total_k) - k0;
  const int row0 = blockIdx.x * kRows;
  if (row0 >= len_q) return;
  const int tile0 = row0 / 128 * 128;  // the TileLang kernel's 128-row tile decides the key blocks
  const int seen = kCausal ? min(len_k, tile0 + 128 + len_k - len_q) : len_k;
  const int n_blocks = (max(seen, 0) + BN - 1) / BN;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int my_row = warp * 16 + lane / 4;  // + 8 for the second half of the registers

  load_tile<Elem, D>(q_s, q, (int64_t)q0 + row0, kRows, total_q, heads, head);
  float s[BN / 2], acc[D / 2], m[2], m_scaled[2], l[2];
  uint32_t p[BN / 4];
  #pragma unroll
  for (int r = 0; r < D / 2; ++r) acc[r] = 0.0f;
  #pragma unroll
  for (int h = 0; h < 2; ++h) m[h] = -INFINITY, m_scaled[h] = 0.0f, l[h] = 0.0f;

  for (int kb = 0; kb < n_blocks; ++kb) {
    __syncthreads();  // the previous block's wgmma reads of k_s / v_s are done
    load_tile<Elem, D>(k_s, k, (int64_t)k0 + kb * BN, BN, total_k, kv_heads, kv_head);
    load_tile<Elem, D>(v_s, v, (int64_t)k0 + kb * BN, BN, total_k, kv_heads, kv_head);
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();

    fence_regs<BN / 2>(s);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    #pragma unroll
    for (int ki = 0; ki < D / 16; ++ki) {
      int at = (ki % 4) * 32;  // byte offset of the k16 step inside its 64-column panel
      uint64_t da = smem_desc(q_s + (ki / 4) * kRows * 128 + at, 1, 64);
      uint64_t db = smem_desc(k_s + (ki / 4) * BN * 128 + at, 1, 64);
      gmma_ss<typename Gmma<Elem>::template SS<BN>::Op>(da, db, s, ki > 0, std::make_index_sequence<BN / 2>{});
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    fence_regs<BN / 2>(s);

    // Register r: row my_row + 8 * ((r / 2) % 2), column (r / 4) * 8 + (lane % 4) * 2 + r % 2.
    #pragma unroll
    for (int r = 0; r < BN / 2; ++r) {
      int col = kb * BN + (r / 4) * 8 + (lane % 4) * 2 + r % 2;
      int row = row0 + my_row + 8 * ((r / 2) % 2);
      bool ok = col < len_k && (!kCausal || col <= row + len_k - len_q);
      if (!ok) s[r] = -INFINITY;
    }
    float alpha[2];
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
      #pragma unroll
      for (int t = 0; t < BN / 8; ++t) mx = fmaxf(mx, fmaxf(s[4 * t + 2 * h], s[4 * t + 2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      float m_new = fmaxf(m[h], mx);
      float new_scaled = m_new == -INFINITY ? 0.0f : __fmul_rn(m_new, scale_log2);
      alpha[h] = m[h] == -INFINITY ? 0.0f : exp2_of(__fsub_rn(m_scaled[h], new_scaled), fast_exp2);
      m[h] = m_new;
      m_scaled[h] = new_scaled;
    }
    #pragma unroll
    for (int r = 0; r < BN / 2; ++r) s[r] = exp2_of(__fmaf_rn(s[r], scale_log2, -m_scaled[(r / 2) % 2]), fast_exp2);
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      float sum = 0.0f;
      #pragma unroll
      for (int t = 0; t < BN / 8; ++t) sum = sum + s[4 * t + 2 * h];
      #pragma unroll
      for (int t = 0; t < BN / 8; ++t) sum = sum + s[4 * t + 2 * h + 1];
      sum = sum + __shfl_xor_sync(0xffffffffu, sum, 2);
      sum = sum + __shfl_xor_sync(0xffffffffu, sum, 1);
      l[h] = __fmaf_rn(l[h], alpha[h], sum);
    }
    #pragma unroll
    for (int r = 0; r < BN / 4; ++r) p[r] = pack(s[2 * r], s[2 * r + 1], (Elem*)nullptr);
    #pragma unroll
    for (int r = 0; r < D / 2; ++r) acc[r] = acc[r] * alpha[(r / 2) % 2];

    fence_regs<D / 2>(acc);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    #pragma unroll
    for (int ki = 0; ki < BN / 16; ++ki) {
      // V is the B operand in MN-major (d-contiguous) panels: leading byte offset = one panel
      // (unused, and 0 as TileLang sets it, when d = 64 fits one panel)
      uint64_t db = smem_desc(v_s + ki * 16 * 128, D > 64 ? BN * 128 / 16 : 0, 64);
      gmma_rs<typename Gmma<Elem>::template RS<D>::Op>(p + 4 * ki, db, acc, std::make_index_sequence<D / 2>{});
    }
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    fence_regs<D / 2>(acc);
  }

  #pragma unroll
  for (int r = 0; r < D / 2; ++r) {
    int h = (r / 2) % 2, row = row0 + my_row + 8 * h;
    int col = (r / 4) * 8 + (lane % 4) * 2 + r % 2;
    if (row < len_q) o[((int64_t)(q0 + row) * heads + head) * D + col] = round_to(l[h] == 0.0f ? 0.0f : acc[r] / l[h], (Elem*)nullptr);
  }
  if (lane % 4 == 0) {
    #pragma unroll
    for (int h = 0; h < 2; ++h) {
      int row = row0 + my_row + 8 * h;
      if (row < len_q) lse[(int64_t)head * total_q + q0 + row] = l[h] == 0.0f ? -INFINITY : (m_scaled[h] + log2f(l[h])) * kLn2;
    }
  }
}

template <class Elem, int D, int BN, bool kCausal>
void launch(tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView v, tvm::ffi::TensorView cu_q,
            tvm::ffi::TensorView cu_k, tvm::ffi::TensorView o, tvm::ffi::TensorView lse, double scale_log2, bool fast_exp2, int q_tiles) {
  auto kernel = fwd_kernel<Elem, D, BN, kCausal>;
  int smem = (kRows + 2 * BN) * D * 2;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  dim3 grid((unsigned)q_tiles, (unsigned)q.size(1), (unsigned)(cu_q.size(0) - 1));
  kernel<<<grid, 128, smem, moe_baseline::stream_of(q)>>>(
      static_cast<const Elem*>(q.data_ptr()), static_cast<const Elem*>(k.data_ptr()), static_cast<const Elem*>(v.data_ptr()),
      static_cast<const int*>(cu_q.data_ptr()), static_cast<const int*>(cu_k.data_ptr()), (int)q.size(1), (int)k.size(1),
      (int)q.size(0), (int)k.size(0), (float)scale_log2, fast_exp2, static_cast<Elem*>(o.data_ptr()), static_cast<float*>(lse.data_ptr()));
}

template <class Elem>
void dispatch(int d, bool causal, tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView v,
              tvm::ffi::TensorView cu_q, tvm::ffi::TensorView cu_k, tvm::ffi::TensorView o, tvm::ffi::TensorView lse,
              double scale_log2, bool fast_exp2, int q_tiles, int block_n) {
#define TLX_ATTN_CASE(D, BN)                                                                              \
  if (d == D && block_n == BN) {                                                                          \
    if (causal) launch<Elem, D, BN, true>(q, k, v, cu_q, cu_k, o, lse, scale_log2, fast_exp2, q_tiles);  \
    else launch<Elem, D, BN, false>(q, k, v, cu_q, cu_k, o, lse, scale_log2, fast_exp2, q_tiles);        \
    return;                                                                                               \
  }
  TLX_ATTN_CASE(64, 128)
  TLX_ATTN_CASE(128, 128)
  TLX_ATTN_CASE(128, 176)
  TLX_ATTN_CASE(256, 64)
  TLX_ATTN_CASE(256, 80)
#undef TLX_ATTN_CASE
}

// q [TQ, H, D], k, v [TK, HK, D] (bf16 or fp16), cu_q, cu_k [B + 1] int32, o [TQ, H, D],
// lse [H, TQ] fp32; q_tiles >= ceil(max len_q / 64); fast_exp2: exp2 as ex2.approx.ftz.f32;
// block_n: keys a block, 0 for the TileLang kernel's default (128, 64 at d = 256), else 176 at
// d = 128 or 80 at d = 256 (its block_n candidates).
void attention_dense_fwd(tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView v,
                         tvm::ffi::TensorView cu_q, tvm::ffi::TensorView cu_k, tvm::ffi::TensorView o,
                         tvm::ffi::TensorView lse, double scale_log2, int64_t q_tiles, bool causal,
                         bool fast_exp2, int64_t block_n) {
  using namespace moe_baseline;
  const char* fn = "attention_dense_fwd";
  auto code = static_cast<DLDataTypeCode>(q.dtype().code);
  require((code == kDLBfloat || code == kDLFloat) && q.dtype().bits == 16 && q.ndim() == 3 && q.IsContiguous(), fn,
          "q must be a contiguous [TQ, H, D] bf16 / fp16 tensor");
  require(is(k, code, 16, 3) && is(v, code, 16, 3) && is(o, code, 16, 3), fn, "k, v, o must be contiguous, q's dtype");
  int64_t d = q.size(2);
  require(d == 64 || d == 128 || d == 256, fn, "head dim 64, 128 or 256");
  const int bn = block_n != 0 ? static_cast<int>(block_n) : d == 256 ? 64 : 128;
  require(bn == (d == 256 ? 64 : 128) || (d == 128 && bn == 176) || (d == 256 && bn == 80), fn,
          "block_n: 0, 176 at head dim 128 or 80 at head dim 256");
  require(k.size(2) == d && v.size(2) == d && v.size(0) == k.size(0) && v.size(1) == k.size(1), fn, "k, v [TK, HK, D]");
  require(k.size(1) > 0 && q.size(1) % k.size(1) == 0, fn, "kv heads divide query heads");
  require(o.size(0) == q.size(0) && o.size(1) == q.size(1) && o.size(2) == d, fn, "o [TQ, H, D]");
  require(is(cu_q, kDLInt, 32, 1) && is(cu_k, kDLInt, 32, 1) && cu_q.size(0) == cu_k.size(0) && cu_q.size(0) >= 2, fn,
          "cu_q, cu_k int32 [B + 1]");
  require(is(lse, kDLFloat, 32, 2) && lse.size(0) == q.size(1) && lse.size(1) == q.size(0), fn, "lse [H, TQ] fp32");
  if (q_tiles <= 0 || q.size(0) == 0) return;
  if (code == kDLBfloat) dispatch<__nv_bfloat16>((int)d, causal, q, k, v, cu_q, cu_k, o, lse, scale_log2, fast_exp2, (int)q_tiles, bn);
  else dispatch<__half>((int)d, causal, q, k, v, cu_q, cu_k, o, lse, scale_log2, fast_exp2, (int)q_tiles, bn);
  check_launch(fn);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(attention_dense_fwd, attention_dense_fwd);
