// One step of the 64-query-row x 64-key attention tile that the MLA-shaped TileLang kernels
// (decode_mla.py's split kernel, sparse_fwd.py) run per key block, written out for their CUDA
// baselines (decode_mla.cu, sparse_fwd.cu): the same bits by the same arithmetic in the same order.
//
// A CTA of two warpgroups owns 64 query rows. Both warpgroups compute the whole 64 x 64 score tile
// (wgmma m64n64k16, bf16, the head dims ascending in steps of 16 from zero: the TileLang kernels'
// m64n32 tiles take the same steps), and each owns 256 of the 512 output columns. Per key block,
// in common.py's order: mask (-inf), row max, m_scaled, alpha, p = exp2(fma(s, scale_log2,
// -m_scaled)), the row sum in TileLang's order (per row and lane quad q: the keys 8j + 2q + c of
// each 32-key half in the order (j, c) = (0,0) (1,0) (2,0) (3,0) (0,1) (1,1) (2,1) (3,1), the
// halves added, then the quad's xor-2 and xor-1 shuffles; with kOneChain, TileLang's order for
// one warpgroup's whole 64-key tile: one chain (j, c) = (0,0) (1,0) ... (7,0) (0,1) ... (7,1),
// then the same shuffles), l = fma(l, alpha, sum), P rounded to bf16, O *= alpha, O += P V
// (wgmma m64n64k16, keys ascending).
// Shared tiles are K-major with the 128-byte swizzle (V is stored transposed, keys contiguous, so
// both products use one descriptor form); the kernels fill them with plain loads.
// Included by relative path ("mla_tile.cuh"); build_baseline hashes it with the source.
#pragma once

#include <cuda_bf16.h>
#include <math.h>

#include "../sm90.cuh"

namespace mla_tile {

constexpr int kRows = 64, kKeys = 64, kDv = 512, kThreads = 256;
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

// The tiles of a CTA whose keys have kPanels x 64 dims (the first 512 are also V).
template <int kPanels>
struct Smem {
  uint8_t q[kPanels][kRows * 128];  // Q: 64 rows x 64 dims a panel
  uint8_t k[kPanels][kKeys * 128];  // K: 64 keys x 64 dims a panel
  uint8_t vt[kDv * 128];            // V^T: 512 dims x 64 keys
  uint8_t p[kRows * 128];           // P: 64 rows x 64 keys
};

// The Smem at the first 1024-aligned byte of dynamic shared memory (the 128-byte swizzle needs
// 1024-aligned tiles; launch with sizeof(Smem) + 1024 bytes).
template <int kPanels>
__device__ __forceinline__ Smem<kPanels>& aligned_smem(uint8_t* raw) {
  uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(raw));
  return *reinterpret_cast<Smem<kPanels>*>(raw + ((1024 - (base & 1023)) & 1023));
}

// Where a thread's registers sit in an m64n64 accumulator tile: register r holds row
// row_of(h = (r / 2) % 2) and key key_of(r) of the tile.
struct Lane {
  int tid, wg, warp, lane, quad;
  __device__ explicit Lane(int t) : tid(t), wg(t / 128), warp((t % 128) / 32), lane(t % 32), quad(t % 4) {}
  __device__ int row_of(int h) const { return warp * 16 + lane / 4 + 8 * h; }
  __device__ int key_of(int r) const { return (r / 4) * 8 + 2 * quad + r % 2; }
};

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

// 16 bytes (8 dims from c, a multiple of 8) of query row `row` into the Q tile.
template <int kPanels>
__device__ __forceinline__ void put_q(Smem<kPanels>& s, int row, int c, uint4 v) {
  *reinterpret_cast<uint4*>(s.q[c / 64] + swizzle128(row, (c % 64) * 2)) = v;
}

// Key j, dim c of the block into the K tile (and, for c < 512, `v` into V^T).
template <int kPanels>
__device__ __forceinline__ void put_key(Smem<kPanels>& s, int j, int c, __nv_bfloat16 k, __nv_bfloat16 v) {
  *reinterpret_cast<__nv_bfloat16*>(s.k[c / 64] + swizzle128(j, (c % 64) * 2)) = k;
  if (c < kDv) *reinterpret_cast<__nv_bfloat16*>(s.vt + swizzle128(c, j * 2)) = v;
}

// Running state of the thread's two rows and its output columns.
struct Softmax {
  float m[2], m_scaled[2], l[2], o[4][32];
  __device__ void init() {
    for (int h = 0; h < 2; ++h) m[h] = -INFINITY, m_scaled[h] = 0.0f, l[h] = 0.0f;
    for (int nb = 0; nb < 4; ++nb)
      for (int r = 0; r < 32; ++r) o[nb][r] = 0.0f;
  }
  // O / l of output register r of column block nb (0 where l == 0).
  __device__ float output(int nb, int r) const {
    float d = l[(r / 2) % 2];
    return d == 0.0f ? 0.0f : __fdiv_rn(o[nb][r], d);
  }
  // O * (1 / l) instead: one division per row, a rounded multiply per value (0 where l == 0).
  __device__ float output_by_reciprocal(int nb, int r) const {
    float d = l[(r / 2) % 2];
    return d == 0.0f ? 0.0f : __fmul_rn(o[nb][r], __fdiv_rn(1.0f, d));
  }
  // (m_scaled + log2 l) * ln 2 of row half h (-inf where l == 0).
  __device__ float lse(int h) const { return l[h] == 0.0f ? -INFINITY : __fmul_rn(__fadd_rn(m_scaled[h], log2f(l[h])), kLn2); }
};

// One key block, its K and V^T tiles filled (and a __syncthreads since): scores, softmax with
// `masked(h, r)` (score register r of row half h is -inf), P, O. Leaves the tiles free to refill
// after a __syncthreads.
template <int kPanels, bool kOneChain = false, class Masked>
__device__ void step(Smem<kPanels>& s, const Lane& t, Softmax& st, float scale_log2, Masked masked) {
  float sc[32];
  for (int r = 0; r < 32; ++r) sc[r] = 0.0f;
  fence_regs(sc);
  wgmma_begin();
  for (int p = 0; p < kPanels; ++p)
    for (int ki = 0; ki < 4; ++ki) wgmma_bf16_m64n64k16(sc, smem_desc(s.q[p] + ki * 32), smem_desc(s.k[p] + ki * 32));
  wgmma_end();
  fence_regs(sc);
  float alpha[2];
  for (int h = 0; h < 2; ++h) {
    float mx = st.m[h];
    for (int r = 0; r < 32; ++r) {
      if ((r / 2) % 2 != h) continue;
      if (masked(h, r)) sc[r] = -INFINITY;
      mx = fmaxf(mx, sc[r]);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFF, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xFFFFFFFF, mx, 2));
    float ms = mx == -INFINITY ? 0.0f : __fmul_rn(mx, scale_log2);
    alpha[h] = st.m[h] == -INFINITY ? 0.0f : exp2f(__fsub_rn(st.m_scaled[h], ms));
    st.m[h] = mx;
    st.m_scaled[h] = ms;
    float x;
    if (kOneChain) {
      x = 0.0f;
      for (int c = 0; c < 2; ++c)
        for (int j = 0; j < 8; ++j) {
          int r = j * 4 + h * 2 + c;
          sc[r] = exp2f(__fmaf_rn(sc[r], scale_log2, -ms));
          x = __fadd_rn(x, sc[r]);
        }
    } else {
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
      x = __fadd_rn(half_sum[0], half_sum[1]);
    }
    x = __fadd_rn(x, __shfl_xor_sync(0xFFFFFFFF, x, 2));
    x = __fadd_rn(x, __shfl_xor_sync(0xFFFFFFFF, x, 1));
    st.l[h] = __fmaf_rn(st.l[h], alpha[h], x);
  }
  if (t.wg == 0) {
    for (int r = 0; r < 32; ++r)
      *reinterpret_cast<__nv_bfloat16*>(s.p + swizzle128(t.row_of((r / 2) % 2), t.key_of(r) * 2)) = __float2bfloat16_rn(sc[r]);
  }
  for (int nb = 0; nb < 4; ++nb)
    for (int r = 0; r < 32; ++r) st.o[nb][r] = __fmul_rn(st.o[nb][r], alpha[(r / 2) % 2]);
  __syncthreads();
  for (int nb = 0; nb < 4; ++nb) {
    fence_regs(st.o[nb]);
    wgmma_begin();
    for (int ki = 0; ki < 4; ++ki)
      wgmma_bf16_m64n64k16(st.o[nb], smem_desc(s.p + ki * 32), smem_desc(s.vt + (t.wg * 4 + nb) * 64 * 128 + ki * 32));
    wgmma_end();
    fence_regs(st.o[nb]);
  }
}

}  // namespace mla_tile
