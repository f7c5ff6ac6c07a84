// CUDA baseline of kernels/attention/decode_mla.py (dense MLA decode), written for clarity, not
// speed: the same bits by the same arithmetic in the same order.
//
// Split kernel: a CTA of two warpgroups owns 64 query rows (token-major t * H + h) and one split
// (split_pages pages, the Python side's split_pages) of one sequence, and runs mla_tile.cuh's step over its pages (the 576 dims: 9
// panels), the mask being key <= seq_len - T + t. Cache slots past the sequence enter V as zeros;
// e4m3 pages are dequantized to bf16 first (float(q) * scale, one multiply). At the end o = O / l
// (0 where l == 0), lse = (m_scaled + log2 l) * ln 2 (-inf there); a table entry outside [0, P)
// makes the split's rows NaN.
// Combine kernel: the splits in order, as decode_mla.py's docstring says.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <math.h>

#include "../moe/common.cuh"
#include "mla_tile.cuh"

namespace {

using tvm::ffi::TensorView;
using namespace mla_tile;

constexpr int kPage = kKeys, kDqk = 576, kPanels = kDqk / 64, kGroup = 64;

// One cache element of page `page`, token slot `j`, column `c` as bf16 (e4m3: dequantized).
__device__ __forceinline__ __nv_bfloat16 cache_at(const void* kv, const float* kvs, bool fp8, int64_t page, int j,
                                                  int c) {
  int64_t at = (page * kPage + j) * kDqk + c;
  if (!fp8) return static_cast<const __nv_bfloat16*>(kv)[at];
  __nv_fp8_e4m3 v;
  v.__x = static_cast<const uint8_t*>(kv)[at];
  return __float2bfloat16_rn(__fmul_rn(static_cast<float>(v), kvs[(page * kPage + j) * (kDqk / kGroup) + c / kGroup]));
}

__global__ void __launch_bounds__(kThreads) split_kernel(const __nv_bfloat16* q, const void* kv, const float* kvs,
                                                         const int* bt, const int* sl, float* op, float* lp,
                                                         int tokens, int heads, int pages, int max_pages, bool fp8,
                                                         float scale_log2, int split_pages) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  Smem<kPanels>& s = aligned_smem<kPanels>(smem_raw);
  int rows = tokens * heads, r0 = blockIdx.x * kRows, sp = blockIdx.y, b = blockIdx.z;
  int splits = (max_pages + split_pages - 1) / split_pages;
  int seq = min(sl[b], max_pages * kPage);
  int seq_pages = seq / kPage + (seq % kPage > 0 ? 1 : 0);
  int first = sp * split_pages, count = min(seq_pages - first, split_pages);
  if (count <= 0) return;
  const Lane t(threadIdx.x);
  for (int i = t.tid; i < kRows * kDqk / 8; i += kThreads) {  // 16-byte pieces of Q
    int row = i / (kDqk / 8), c = (i % (kDqk / 8)) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r0 + row < rows) {
      int tok = (r0 + row) / heads, h = (r0 + row) % heads;
      v = *reinterpret_cast<const uint4*>(q + ((static_cast<int64_t>(b) * tokens + tok) * heads + h) * kDqk + c);
    }
    put_q(s, row, c, v);
  }
  Softmax st;
  st.init();
  bool bad = false;
  for (int pg = 0; pg < count; ++pg) {
    int k0 = (first + pg) * kPage;
    int entry = bt[static_cast<int64_t>(b) * max_pages + first + pg];
    bad = bad || entry < 0 || entry >= pages;
    int64_t page = min(max(entry, 0), pages - 1);
    __syncthreads();  // the previous page's products are done with the tiles
    for (int i = t.tid; i < kPage * kDqk; i += kThreads) {
      int j = i / kDqk, c = i % kDqk;
      __nv_bfloat16 v = cache_at(kv, kvs, fp8, page, j, c);
      put_key(s, j, c, v, k0 + j < seq ? v : __float2bfloat16_rn(0.0f));
    }
    __syncthreads();
    step(s, t, st, scale_log2,
         [&](int h, int r) { return k0 + t.key_of(r) > seq - tokens + (r0 + t.row_of(h)) / heads; });
  }
  for (int nb = 0; nb < 4; ++nb)
    for (int r = 0; r < 32; ++r) {
      int row = t.row_of((r / 2) % 2), col = (t.wg * 4 + nb) * 64 + t.key_of(r);
      if (r0 + row >= rows) continue;
      op[((static_cast<int64_t>(b) * splits + sp) * rows + r0 + row) * kDv + col] = bad ? __int_as_float(0x7FC00000) : st.output(nb, r);
    }
  if (t.wg == 0 && t.quad == 0)
    for (int h = 0; h < 2; ++h) {
      int row = t.row_of(h);
      if (r0 + row >= rows) continue;
      lp[(static_cast<int64_t>(b) * splits + sp) * rows + r0 + row] = bad ? __int_as_float(0x7FC00000) : st.lse(h);
    }
}

__global__ void combine_kernel(const int* sl, const float* op, const float* lp, __nv_bfloat16* o, float* lse,
                               int rows, int max_pages, int split_pages) {
  int r = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  int splits = (max_pages + split_pages - 1) / split_pages;
  int seq = max(min(sl[b], max_pages * kPage), 0);
  int seq_pages = seq / kPage + (seq % kPage > 0 ? 1 : 0);
  int n = seq_pages / split_pages + (seq_pages % split_pages > 0 ? 1 : 0);
  const float* lrow = lp + static_cast<int64_t>(b) * splits * rows + r;
  float mx = -INFINITY;
  bool bad = false;
  for (int i = 0; i < n; ++i) {
    float v = lrow[static_cast<int64_t>(i) * rows];
    mx = v > mx ? v : mx;
    bad = bad || v != v;
  }
  float sum = 0.0f;
  for (int i = 0; i < n; ++i) sum = __fadd_rn(sum, exp2f(__fmul_rn(__fsub_rn(lrow[static_cast<int64_t>(i) * rows], mx), kLog2e)));
  for (int c = tid; c < kDv; c += blockDim.x) {
    float acc = 0.0f;
    for (int i = 0; i < n; ++i) {
      float w = __fdiv_rn(exp2f(__fmul_rn(__fsub_rn(lrow[static_cast<int64_t>(i) * rows], mx), kLog2e)), sum);
      acc = __fmaf_rn(w, op[((static_cast<int64_t>(b) * splits + i) * rows + r) * kDv + c], acc);
    }
    float v = bad ? __int_as_float(0x7FC00000) : (mx == -INFINITY ? 0.0f : acc);
    o[(static_cast<int64_t>(b) * rows + r) * kDv + c] = __float2bfloat16_rn(v);
  }
  if (tid == 0)
    lse[static_cast<int64_t>(b) * rows + r] =
        bad ? __int_as_float(0x7FC00000) : (mx == -INFINITY ? -INFINITY : __fadd_rn(mx, logf(sum)));
}

// q [B, T, H, 576] bf16; kv [P, 64, 576] bf16 or e4m3 with kvs [P, 64, 9] (e4m3 only, else any);
// bt [B, MP], sl [B] int32; o [B, T, H, 512] bf16, lse [B, T, H] fp32. scale_log2 =
// softmax_scale * log2(e), rounded to fp32 here as the TileLang kernel's constant is.
void mla_decode(TensorView q, TensorView kv, TensorView kvs, TensorView bt, TensorView sl, TensorView o,
                TensorView lse, double scale_log2, int64_t split_pages) {
  using namespace moe_baseline;
  const char* fn = "mla_decode baseline";
  int b = static_cast<int>(q.size(0)), tokens = static_cast<int>(q.size(1)), heads = static_cast<int>(q.size(2));
  int pages = static_cast<int>(kv.size(0)), max_pages = static_cast<int>(bt.size(1));
  bool fp8 = kv.dtype().bits == 8;
  require(q.size(3) == kDqk && kv.size(1) == kPage && kv.size(2) == kDqk, fn, "shapes");
  require(split_pages >= 1 && split_pages <= 1024, fn, "split_pages");
  if (b == 0) return;
  int split = static_cast<int>(split_pages);
  int rows = tokens * heads, splits = (max_pages + split - 1) / split;
  float* op = nullptr;
  float* lp = nullptr;
  cudaStream_t stream = stream_of(q);
  size_t op_bytes = static_cast<size_t>(b) * splits * rows * kDv * sizeof(float);
  size_t lp_bytes = static_cast<size_t>(b) * splits * rows * sizeof(float);
  require(cudaMallocAsync(reinterpret_cast<void**>(&op), op_bytes, stream) == cudaSuccess &&
              cudaMallocAsync(reinterpret_cast<void**>(&lp), lp_bytes, stream) == cudaSuccess,
          fn, "workspace allocation");
  int smem = static_cast<int>(sizeof(Smem<kPanels>)) + 1024;
  cudaFuncSetAttribute(split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  dim3 grid((rows + kRows - 1) / kRows, splits, b);
  split_kernel<<<grid, kThreads, smem, stream>>>(
      static_cast<const __nv_bfloat16*>(q.data_ptr()), kv.data_ptr(), static_cast<const float*>(kvs.data_ptr()),
      static_cast<const int*>(bt.data_ptr()), static_cast<const int*>(sl.data_ptr()), op, lp, tokens, heads, pages,
      max_pages, fp8, static_cast<float>(scale_log2), split);
  check_launch(fn);
  combine_kernel<<<dim3(rows, b), 128, 0, stream>>>(static_cast<const int*>(sl.data_ptr()), op, lp,
                                                    static_cast<__nv_bfloat16*>(o.data_ptr()),
                                                    static_cast<float*>(lse.data_ptr()), rows, max_pages, split);
  check_launch(fn);
  cudaFreeAsync(op, stream);
  cudaFreeAsync(lp, stream);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(mla_decode, mla_decode);
