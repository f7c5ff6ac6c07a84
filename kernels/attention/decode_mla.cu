// CUDA baseline of kernels/attention/decode_mla.py (dense MLA decode), written for clarity, not
// speed: the same bits by the same arithmetic in the same order.
//
// Split kernel: a CTA of two warpgroups owns 64 query rows (token-major t * H + h) and one split
// (16 pages) of one sequence; both warpgroups compute the whole 64 x 64 score tile of a page
// (wgmma m64n64k16, bf16, the 576 dims ascending in steps of 16 from zero: the TileLang kernel's
// m64n32 tiles take the same steps), and each owns 256 of the 512 output columns. Per page, in
// common.py's order: mask (key <= seq_len - T + t), row max, m_scaled, alpha,
// p = exp2(fma(s, scale_log2, -m_scaled)), row sum in TileLang's order (per row and lane quad q:
// the keys 8j + 2q + c of each 32-key half in the order (j, c) = (0,0) (1,0) (2,0) (3,0) (0,1)
// (1,1) (2,1) (3,1), the halves added, then the quad's xor-2 and xor-1 shuffles), l = fma(l,
// alpha, sum), P rounded to bf16, O *= alpha, O += P V (wgmma m64n64k16, keys ascending). Cache
// slots past the sequence enter V as zeros; e4m3 pages are dequantized to bf16 first
// (float(q) * scale, one multiply). At the end o = O / l (0 where l == 0), lse = (m_scaled +
// log2 l) * ln 2 (-inf there); a table entry outside [0, P) makes the split's rows NaN.
// Combine kernel: the splits in order, as decode_mla.py's docstring says.
// Shared tiles are K-major with the 128-byte swizzle (V is stored transposed, keys contiguous,
// so both products use one descriptor form); filled with plain loads.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <math.h>

#include "../moe/common.cuh"
#include "../sm90.cuh"

namespace {

using tvm::ffi::TensorView;

constexpr int kRows = 64, kPage = 64, kDqk = 576, kDv = 512, kPanels = kDqk / 64, kGroup = 64;
constexpr int kSplitPages = 16, kThreads = 256;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

__device__ __forceinline__ void fence_regs(float (&d)[32]) {
  for (int r = 0; r < 32; ++r) asm volatile("" : "+f"(d[r])::"memory");
}

__device__ __forceinline__ void wgmma_begin() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_end() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
}

// One cache element of page `page`, token slot `j`, column `c` as bf16 (e4m3: dequantized).
__device__ __forceinline__ __nv_bfloat16 cache_at(const void* kv, const float* kvs, bool fp8, int64_t page, int j,
                                                  int c) {
  int64_t at = (page * kPage + j) * kDqk + c;
  if (!fp8) return static_cast<const __nv_bfloat16*>(kv)[at];
  __nv_fp8_e4m3 v;
  v.__x = static_cast<const uint8_t*>(kv)[at];
  return __float2bfloat16_rn(__fmul_rn(static_cast<float>(v), kvs[(page * kPage + j) * (kDqk / kGroup) + c / kGroup]));
}

struct Smem {
  uint8_t q[kPanels][kRows * 128];   // Q: 9 panels of 64 rows x 64 dims
  uint8_t k[kPanels][kPage * 128];   // K: 9 panels of 64 keys x 64 dims
  uint8_t vt[kDv * 128];             // V^T: 512 dims x 64 keys
  uint8_t p[kRows * 128];            // P: 64 rows x 64 keys
};

__global__ void __launch_bounds__(kThreads) split_kernel(const __nv_bfloat16* q, const void* kv, const float* kvs,
                                                         const int* bt, const int* sl, float* op, float* lp,
                                                         int tokens, int heads, int pages, int max_pages, bool fp8,
                                                         float scale_log2) {
  extern __shared__ __align__(1024) uint8_t smem_raw[];
  // the 128-byte swizzle needs 1024-byte aligned tiles: align the base (1024 spare bytes)
  uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_raw));
  Smem& s = *reinterpret_cast<Smem*>(smem_raw + ((1024 - (base & 1023)) & 1023));
  int rows = tokens * heads, r0 = blockIdx.x * kRows, sp = blockIdx.y, b = blockIdx.z;
  int splits = (max_pages + kSplitPages - 1) / kSplitPages;
  int seq = min(sl[b], max_pages * kPage);
  int seq_pages = seq / kPage + (seq % kPage > 0 ? 1 : 0);
  int first = sp * kSplitPages, count = min(seq_pages - first, kSplitPages);
  if (count <= 0) return;
  int tid = threadIdx.x, wg = tid / 128, t128 = tid % 128, warp = t128 / 32, lane = tid % 32, quad = lane % 4;
  for (int i = tid; i < kRows * kDqk / 8; i += kThreads) {  // 16-byte pieces of Q
    int row = i / (kDqk / 8), c = (i % (kDqk / 8)) * 8;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r0 + row < rows) {
      int tok = (r0 + row) / heads, h = (r0 + row) % heads;
      v = *reinterpret_cast<const uint4*>(q + ((static_cast<int64_t>(b) * tokens + tok) * heads + h) * kDqk + c);
    }
    *reinterpret_cast<uint4*>(s.q[c / 64] + swizzle128(row, (c % 64) * 2)) = v;
  }
  float m[2], m_scaled[2], l[2], o[4][32];
  for (int h = 0; h < 2; ++h) m[h] = -INFINITY, m_scaled[h] = 0.0f, l[h] = 0.0f;
  for (int nb = 0; nb < 4; ++nb)
    for (int r = 0; r < 32; ++r) o[nb][r] = 0.0f;
  bool bad = false;
  for (int t = 0; t < count; ++t) {
    int k0 = (first + t) * kPage;
    int entry = bt[static_cast<int64_t>(b) * max_pages + first + t];
    bad = bad || entry < 0 || entry >= pages;
    int64_t page = min(max(entry, 0), pages - 1);
    __syncthreads();  // the previous page's products are done with the tiles
    for (int i = tid; i < kPage * kDqk; i += kThreads) {
      int j = i / kDqk, c = i % kDqk;
      __nv_bfloat16 v = cache_at(kv, kvs, fp8, page, j, c);
      *reinterpret_cast<__nv_bfloat16*>(s.k[c / 64] + swizzle128(j, (c % 64) * 2)) = v;
      if (c < kDv) *reinterpret_cast<__nv_bfloat16*>(s.vt + swizzle128(c, j * 2)) = k0 + j < seq ? v : __float2bfloat16_rn(0.0f);
    }
    __syncthreads();
    float sc[32];
    for (int r = 0; r < 32; ++r) sc[r] = 0.0f;
    fence_regs(sc);
    wgmma_begin();
    for (int p = 0; p < kPanels; ++p)
      for (int ki = 0; ki < 4; ++ki) wgmma_bf16_m64n64k16(sc, smem_desc(s.q[p] + ki * 32), smem_desc(s.k[p] + ki * 32));
    wgmma_end();
    fence_regs(sc);
    // accumulator register r: row warp*16 + lane/4 + 8*((r/2)%2), key (r/4)*8 + 2*quad + r%2
    float alpha[2];
    for (int h = 0; h < 2; ++h) {
      int row = warp * 16 + lane / 4 + 8 * h;
      int limit = seq - tokens + (r0 + row) / heads;
      float mx = m[h];
      for (int r = 0; r < 32; ++r) {
        if ((r / 2) % 2 != h) continue;
        int key = k0 + (r / 4) * 8 + 2 * quad + r % 2;
        if (key > limit) sc[r] = -INFINITY;
        mx = fmaxf(mx, sc[r]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFF, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFF, mx, 2));
      float ms = mx == -INFINITY ? 0.0f : __fmul_rn(mx, scale_log2);
      alpha[h] = m[h] == -INFINITY ? 0.0f : exp2f(__fsub_rn(m_scaled[h], ms));
      m[h] = mx;
      m_scaled[h] = ms;
      float half_sum[2];
      for (int half = 0; half < 2; ++half) {
        float acc = 0.0f;
        for (int c = 0; c < 2; ++c)
          for (int j = 0; j < 4; ++j) {
            int r = (half * 4 + j) * 4 + h * 2 + c;
            sc[r] = exp2f(__fmaf_rn(sc[r], scale_log2, -ms));
            acc = __fadd_rn(acc, sc[r]);
          }
        half_sum[half] = acc;
      }
      float x = __fadd_rn(half_sum[0], half_sum[1]);
      x = __fadd_rn(x, __shfl_xor_sync(0xFFFFFFFF, x, 2));
      x = __fadd_rn(x, __shfl_xor_sync(0xFFFFFFFF, x, 1));
      l[h] = __fmaf_rn(l[h], alpha[h], x);
    }
    if (wg == 0) {
      for (int r = 0; r < 32; ++r) {
        int row = warp * 16 + lane / 4 + 8 * ((r / 2) % 2), key = (r / 4) * 8 + 2 * quad + r % 2;
        *reinterpret_cast<__nv_bfloat16*>(s.p + swizzle128(row, key * 2)) = __float2bfloat16_rn(sc[r]);
      }
    }
    for (int nb = 0; nb < 4; ++nb)
      for (int r = 0; r < 32; ++r) o[nb][r] = __fmul_rn(o[nb][r], alpha[(r / 2) % 2]);
    __syncthreads();
    for (int nb = 0; nb < 4; ++nb) {
      fence_regs(o[nb]);
      wgmma_begin();
      for (int ki = 0; ki < 4; ++ki)
        wgmma_bf16_m64n64k16(o[nb], smem_desc(s.p + ki * 32), smem_desc(s.vt + (wg * 4 + nb) * 64 * 128 + ki * 32));
      wgmma_end();
      fence_regs(o[nb]);
    }
  }
  for (int nb = 0; nb < 4; ++nb)
    for (int r = 0; r < 32; ++r) {
      int h = (r / 2) % 2, row = warp * 16 + lane / 4 + 8 * h;
      int col = (wg * 4 + nb) * 64 + (r / 4) * 8 + 2 * quad + r % 2;
      if (r0 + row >= rows) continue;
      float v = l[h] == 0.0f ? 0.0f : __fdiv_rn(o[nb][r], l[h]);
      op[((static_cast<int64_t>(b) * splits + sp) * rows + r0 + row) * kDv + col] = bad ? __int_as_float(0x7FC00000) : v;
    }
  if (wg == 0 && quad == 0)
    for (int h = 0; h < 2; ++h) {
      int row = warp * 16 + lane / 4 + 8 * h;
      if (r0 + row >= rows) continue;
      float lse = l[h] == 0.0f ? -INFINITY : __fmul_rn(__fadd_rn(m_scaled[h], log2f(l[h])), kLn2);
      lp[(static_cast<int64_t>(b) * splits + sp) * rows + r0 + row] = bad ? __int_as_float(0x7FC00000) : lse;
    }
}

__global__ void combine_kernel(const int* sl, const float* op, const float* lp, __nv_bfloat16* o, float* lse,
                               int rows, int max_pages) {
  int r = blockIdx.x, b = blockIdx.y, tid = threadIdx.x;
  int splits = (max_pages + kSplitPages - 1) / kSplitPages;
  int seq = max(min(sl[b], max_pages * kPage), 0);
  int seq_pages = seq / kPage + (seq % kPage > 0 ? 1 : 0);
  int n = seq_pages / kSplitPages + (seq_pages % kSplitPages > 0 ? 1 : 0);
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
                TensorView lse, double scale_log2) {
  using namespace moe_baseline;
  const char* fn = "mla_decode baseline";
  int b = static_cast<int>(q.size(0)), tokens = static_cast<int>(q.size(1)), heads = static_cast<int>(q.size(2));
  int pages = static_cast<int>(kv.size(0)), max_pages = static_cast<int>(bt.size(1));
  bool fp8 = kv.dtype().bits == 8;
  require(q.size(3) == kDqk && kv.size(1) == kPage && kv.size(2) == kDqk, fn, "shapes");
  if (b == 0) return;
  int rows = tokens * heads, splits = (max_pages + kSplitPages - 1) / kSplitPages;
  float* op = nullptr;
  float* lp = nullptr;
  cudaStream_t stream = stream_of(q);
  size_t op_bytes = static_cast<size_t>(b) * splits * rows * kDv * sizeof(float);
  size_t lp_bytes = static_cast<size_t>(b) * splits * rows * sizeof(float);
  require(cudaMallocAsync(reinterpret_cast<void**>(&op), op_bytes, stream) == cudaSuccess &&
              cudaMallocAsync(reinterpret_cast<void**>(&lp), lp_bytes, stream) == cudaSuccess,
          fn, "workspace allocation");
  int smem = static_cast<int>(sizeof(Smem)) + 1024;
  cudaFuncSetAttribute(split_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  dim3 grid((rows + kRows - 1) / kRows, splits, b);
  split_kernel<<<grid, kThreads, smem, stream>>>(
      static_cast<const __nv_bfloat16*>(q.data_ptr()), kv.data_ptr(), static_cast<const float*>(kvs.data_ptr()),
      static_cast<const int*>(bt.data_ptr()), static_cast<const int*>(sl.data_ptr()), op, lp, tokens, heads, pages,
      max_pages, fp8, static_cast<float>(scale_log2));
  check_launch(fn);
  combine_kernel<<<dim3(rows, b), 128, 0, stream>>>(static_cast<const int*>(sl.data_ptr()), op, lp,
                                                    static_cast<__nv_bfloat16*>(o.data_ptr()),
                                                    static_cast<float*>(lse.data_ptr()), rows, max_pages);
  check_launch(fn);
  cudaFreeAsync(op, stream);
  cudaFreeAsync(lp, stream);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(mla_decode, mla_decode);
