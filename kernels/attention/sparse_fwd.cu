// CUDA baseline of kernels/attention/sparse_fwd.py (DeepSeek-V4 sparse attention forward), written
// for clarity, not speed: the same bits by the same arithmetic in the same order.
//
// A CTA of two warpgroups owns 64 heads of one token and runs mla_tile.cuh's step over the
// token's key blocks: the top-k list's blocks of 64 slots in list order, then the window's. A
// slot's key is the kv row its index names, clamped into the cache (the TileLang kernel loads
// that row too); a slot whose index is outside [0, n) is masked (-inf). After the last block the
// sink joins the sum, l += exp2(fma(sink, log2 e, -m_scaled)); then o = O * (1 / l) rounded to bf16
// (one division per row; 0 where l == 0) and lse = (m_scaled + log2 l) * ln 2 (-inf there).
#include <cuda_bf16.h>
#include <math.h>

#include "../moe/common.cuh"
#include "mla_tile.cuh"

namespace {

using tvm::ffi::TensorView;
using namespace mla_tile;

constexpr int kDim = 512, kPanels = kDim / 64;

template <bool kOneChain>
__global__ void __launch_bounds__(kThreads) sparse_fwd_kernel(const __nv_bfloat16* q, const __nv_bfloat16* kv,
                                                              const int* idx, const float* sink,
                                                              const __nv_bfloat16* wkv, const int* widx,
                                                              __nv_bfloat16* o, float* lse, int seq, int heads,
                                                              int n, int topk, int n_window, int window,
                                                              float scale_log2) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  Smem<kPanels>& s = aligned_smem<kPanels>(smem_raw);
  __shared__ int valid[kKeys];
  const int token = blockIdx.x, h0 = blockIdx.y * kRows, b = blockIdx.z;
  const int64_t at = static_cast<int64_t>(b) * seq + token;  // the token's row of q, idx, widx, o, lse
  const Lane t(threadIdx.x);
  for (int i = t.tid; i < kRows * kDim / 8; i += kThreads) {  // 16-byte pieces of Q
    int row = i / (kDim / 8), c = (i % (kDim / 8)) * 8;
    uint4 v = *reinterpret_cast<const uint4*>(q + (at * heads + h0 + row) * kDim + c);
    put_q(s, row, c, v);
  }
  Softmax st;
  st.init();
  const int blocks = (topk + window) / kKeys;
  for (int kb = 0; kb < blocks; ++kb) {
    const bool top = kb < topk / kKeys;  // else a window block
    const int* list = top ? idx + at * topk + kb * kKeys : widx + at * window + (kb - topk / kKeys) * kKeys;
    const __nv_bfloat16* cache = (top ? kv : wkv) + static_cast<int64_t>(b) * (top ? n : n_window) * kDim;
    const int rows = top ? n : n_window;
    __syncthreads();  // the previous block's products are done with the tiles and `valid`
    if (t.tid < kKeys) valid[t.tid] = list[t.tid] >= 0 && list[t.tid] < rows;
    for (int i = t.tid; i < kKeys * kDim; i += kThreads) {
      int j = i / kDim, c = i % kDim;
      __nv_bfloat16 v = cache[static_cast<int64_t>(min(max(list[j], 0), rows - 1)) * kDim + c];
      put_key(s, j, c, v, v);
    }
    __syncthreads();
    step<kPanels, kOneChain>(s, t, st, scale_log2, [&](int, int r) { return !valid[t.key_of(r)]; });
  }
  for (int h = 0; h < 2; ++h)
    st.l[h] = __fadd_rn(st.l[h], exp2f(__fmaf_rn(sink[h0 + t.row_of(h)], kLog2e, -st.m_scaled[h])));
  for (int nb = 0; nb < 4; ++nb)
    for (int r = 0; r < 32; ++r) {
      int row = t.row_of((r / 2) % 2), col = (t.wg * 4 + nb) * 64 + t.key_of(r);
      o[(at * heads + h0 + row) * kDim + col] = __float2bfloat16_rn(st.output_by_reciprocal(nb, r));
    }
  if (t.wg == 0 && t.quad == 0)
    for (int h = 0; h < 2; ++h) lse[at * heads + h0 + t.row_of(h)] = st.lse(h);
}

// q [B, S, H, 512], kv [B, N, 512], idx [B, S, K] int32, sink [H] fp32, wkv [B, NW, 512],
// widx [B, S, W] int32 (window: W, or 0 to read neither), o [B, S, H, 512] bf16, lse [B, S, H]
// fp32; bf16 tensors; H a multiple of 64, K and W multiples of 64. scale_log2 = softmax_scale *
// log2(e), rounded to fp32 here as the TileLang kernel's constant is. one_chain: the row sums of
// the "independent" schedule (mla_tile.cuh's kOneChain), else those of the other two.
void sparse_attention_fwd(TensorView q, TensorView kv, TensorView idx, TensorView sink, TensorView wkv,
                          TensorView widx, TensorView o, TensorView lse, double scale_log2, int64_t window,
                          bool one_chain) {
  using namespace moe_baseline;
  const char* fn = "sparse_attention_fwd baseline";
  require(is(q, kDLBfloat, 16, 4) && is(kv, kDLBfloat, 16, 3) && is(wkv, kDLBfloat, 16, 3) && is(o, kDLBfloat, 16, 4),
          fn, "q, kv, wkv, o: contiguous bf16");
  require(is(idx, kDLInt, 32, 3) && is(widx, kDLInt, 32, 3) && is(sink, kDLFloat, 32, 1) && is(lse, kDLFloat, 32, 3),
          fn, "idx, widx int32 [B, S, *]; sink fp32 [H]; lse fp32 [B, S, H]");
  int b = static_cast<int>(q.size(0)), seq = static_cast<int>(q.size(1)), heads = static_cast<int>(q.size(2));
  int n = static_cast<int>(kv.size(1)), topk = static_cast<int>(idx.size(2)), n_window = static_cast<int>(wkv.size(1));
  require(q.size(3) == kDim && kv.size(2) == kDim && wkv.size(2) == kDim && heads % kRows == 0, fn, "shapes");
  require(topk % kKeys == 0 && window % kKeys == 0 && (window == 0 || widx.size(2) == window), fn, "top-k and window");
  if (b == 0 || seq == 0 || n == 0 || (window > 0 && n_window == 0)) return;
  int smem = static_cast<int>(sizeof(Smem<kPanels>)) + 1024;
  auto kernel = one_chain ? sparse_fwd_kernel<true> : sparse_fwd_kernel<false>;
  cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  kernel<<<dim3(seq, heads / kRows, b), kThreads, smem, stream_of(q)>>>(
      static_cast<const __nv_bfloat16*>(q.data_ptr()), static_cast<const __nv_bfloat16*>(kv.data_ptr()),
      static_cast<const int*>(idx.data_ptr()), static_cast<const float*>(sink.data_ptr()),
      static_cast<const __nv_bfloat16*>(wkv.data_ptr()), static_cast<const int*>(widx.data_ptr()),
      static_cast<__nv_bfloat16*>(o.data_ptr()), static_cast<float*>(lse.data_ptr()), seq, heads, n, topk, n_window,
      static_cast<int>(window), static_cast<float>(scale_log2));
  check_launch(fn);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(sparse_attention_fwd, sparse_attention_fwd);
