// CUDA C++ baseline of kernels/moe/grouped_gemm.py, written for clarity, not speed.
//
// It issues wgmma m64n64k32.f32.e4m3.e4m3 (the TileLang kernels issue m64n128k32: per output
// element the same k32 steps, bitwise equal on the H200) with both operands K-major in
// 128-byte-swizzled shared memory, in the same K order: per 128-wide K block, four k32 steps
// into a zeroed fp32 accumulator, then total = fma(block, sa[row, kb] * sb[e, n / 128, kb],
// total), K blocks ascending, one rounding to bf16. One warpgroup computes one 64 x 64 output
// tile; the tiles are filled with plain loads (no TMA, no pipelining).
#include <cuda_bf16.h>

#include "../sm90.cuh"
#include "common.cuh"

namespace {

constexpr int kTile = 64;      // rows (M) and columns (N) of one CTA's output tile
constexpr int kBlockK = 128;   // K block = scale group, one 128-byte row of e4m3
constexpr int kBlockM = 128;   // row block of the contiguous layout (block_expert granularity)
constexpr int kThreads = 128;  // one warpgroup

// One 64 x 64 tile: rows a_row0.. of A (row stride k bytes), columns n0.. of expert e.
// out_row0 indexes C (row stride n). Rows/scales are in the caller's layout.
__device__ void tile(const uint8_t* __restrict__ a, const float* __restrict__ sa, const uint8_t* __restrict__ b,
                     const float* __restrict__ sb, int64_t a_row0, int e, int n0, int n, int k,
                     __nv_bfloat16* __restrict__ c) {
  __shared__ __align__(1024) uint8_t a_s[kTile * kBlockK];
  __shared__ __align__(1024) uint8_t b_s[kTile * kBlockK];
  __shared__ float scale_s[kTile];
  int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  int kblocks = k / kBlockK;
  float total[32], part[32];
  for (int r = 0; r < 32; ++r) total[r] = 0.0f;
  const uint8_t* b_e = b + (int64_t)e * n * k;
  const float* sb_e = sb + (int64_t)e * (n / 128) * kblocks;
  for (int kb = 0; kb < kblocks; ++kb) {
    for (int i = tid; i < kTile * kBlockK / 16; i += kThreads) {
      int row = i / 8, byte = (i % 8) * 16;
      *reinterpret_cast<uint4*>(a_s + swizzle128(row, byte)) =
          *reinterpret_cast<const uint4*>(a + (a_row0 + row) * k + (int64_t)kb * kBlockK + byte);
      *reinterpret_cast<uint4*>(b_s + swizzle128(row, byte)) =
          *reinterpret_cast<const uint4*>(b_e + (int64_t)(n0 + row) * k + (int64_t)kb * kBlockK + byte);
    }
    if (tid < kTile) scale_s[tid] = sa[(a_row0 + tid) * kblocks + kb] * sb_e[(n0 / 128) * kblocks + kb];
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    for (int r = 0; r < 32; ++r) part[r] = 0.0f;
    for (int r = 0; r < 32; ++r) asm volatile("" : "+f"(part[r])::"memory");
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    for (int ki = 0; ki < kBlockK / 32; ++ki) wgmma_m64n64k32(part, smem_desc(a_s + ki * 32), smem_desc(b_s + ki * 32));
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    for (int r = 0; r < 32; ++r) asm volatile("" : "+f"(part[r])::"memory");  // no reads before the wait
    // Accumulator register r of thread (warp, lane): row warp*16 + lane/4 + 8*((r/2)%2).
    for (int r = 0; r < 32; ++r) total[r] = __fmaf_rn(part[r], scale_s[warp * 16 + lane / 4 + 8 * ((r / 2) % 2)], total[r]);
    __syncthreads();
  }
  for (int r = 0; r < 32; ++r) {
    int row = warp * 16 + lane / 4 + 8 * ((r / 2) % 2);
    int col = (r / 4) * 8 + (lane % 4) * 2 + (r % 2);
    c[(a_row0 + row) * n + n0 + col] = __float2bfloat16_rn(total[r]);
  }
}

__global__ void __launch_bounds__(kThreads) contiguous_kernel(const uint8_t* a, const float* sa, const uint8_t* b,
                                                              const float* sb, const int* block_expert, int n, int k,
                                                              __nv_bfloat16* c) {
  int64_t row0 = (int64_t)blockIdx.y * kTile;
  int e = block_expert[row0 / kBlockM];
  if (e < 0) return;
  tile(a, sa, b, sb, row0, e, blockIdx.x * kTile, n, k, c);
}

__global__ void __launch_bounds__(kThreads) masked_kernel(const uint8_t* a, const float* sa, const uint8_t* b,
                                                          const float* sb, const int* counts, int m, int n, int k,
                                                          __nv_bfloat16* c) {
  int e = blockIdx.z;
  int row0 = blockIdx.y * kTile;
  if (row0 / kBlockM * kBlockM >= counts[e]) return;  // the TileLang kernel skips whole 128-row blocks
  tile(a, sa, b, sb, (int64_t)e * m + row0, e, blockIdx.x * kTile, n, k, c);
}

void check_common(const char* fn, tvm::ffi::TensorView a, tvm::ffi::TensorView sa, tvm::ffi::TensorView b,
                  tvm::ffi::TensorView sb, tvm::ffi::TensorView c, int a_dims) {
  using namespace moe_baseline;
  require(is(a, kDLFloat8_e4m3fn, 8, a_dims) && is(b, kDLFloat8_e4m3fn, 8, 3), fn, "a, b must be contiguous e4m3");
  require(is(sa, kDLFloat, 32, a_dims) && is(sb, kDLFloat, 32, 3), fn, "sa, sb must be contiguous f32");
  require(is(c, kDLBfloat, 16, a_dims), fn, "c must be contiguous bf16");
  int64_t k = a.size(a_dims - 1), n = b.size(1);
  require(k % kBlockK == 0 && b.size(2) == k && n % 128 == 0, fn, "k % 128 == 0, n % 128 == 0, b [E, N, K]");
  require(sa.size(a_dims - 1) == k / kBlockK && sb.size(1) == n / 128 && sb.size(2) == k / kBlockK, fn, "scale shapes");
  require(c.size(a_dims - 1) == n, fn, "c width");
}

void moe_grouped_gemm_contiguous(tvm::ffi::TensorView a, tvm::ffi::TensorView sa, tvm::ffi::TensorView b,
                                 tvm::ffi::TensorView sb, tvm::ffi::TensorView block_expert, tvm::ffi::TensorView c) {
  using namespace moe_baseline;
  const char* fn = "moe_grouped_gemm_contiguous";
  check_common(fn, a, sa, b, sb, c, 2);
  int64_t rows = a.size(0);
  require(rows % kBlockM == 0 && sa.size(0) == rows && c.size(0) == rows, fn, "rows a multiple of 128");
  require(is(block_expert, kDLInt, 32, 1) && block_expert.size(0) == rows / kBlockM, fn, "block_expert [R / 128]");
  if (rows == 0) return;
  dim3 grid((unsigned)(b.size(1) / kTile), (unsigned)(rows / kTile));
  contiguous_kernel<<<grid, kThreads, 0, stream_of(a)>>>(
      static_cast<const uint8_t*>(a.data_ptr()), static_cast<const float*>(sa.data_ptr()),
      static_cast<const uint8_t*>(b.data_ptr()), static_cast<const float*>(sb.data_ptr()),
      static_cast<const int*>(block_expert.data_ptr()), (int)b.size(1), (int)a.size(1),
      static_cast<__nv_bfloat16*>(c.data_ptr()));
  check_launch(fn);
}

void moe_grouped_gemm_masked(tvm::ffi::TensorView a, tvm::ffi::TensorView sa, tvm::ffi::TensorView b,
                             tvm::ffi::TensorView sb, tvm::ffi::TensorView counts, tvm::ffi::TensorView c) {
  using namespace moe_baseline;
  const char* fn = "moe_grouped_gemm_masked";
  check_common(fn, a, sa, b, sb, c, 3);
  int64_t e = a.size(0), m = a.size(1);
  require(b.size(0) == e && sb.size(0) == e && sa.size(0) == e && c.size(0) == e, fn, "expert counts agree");
  require(m % kBlockM == 0 && sa.size(1) == m && c.size(1) == m, fn, "rows per expert a multiple of 128");
  require(is(counts, kDLInt, 32, 1) && counts.size(0) == e, fn, "counts [E] int32");
  if (e == 0 || m == 0) return;
  dim3 grid((unsigned)(b.size(1) / kTile), (unsigned)(m / kTile), (unsigned)e);
  masked_kernel<<<grid, kThreads, 0, stream_of(a)>>>(
      static_cast<const uint8_t*>(a.data_ptr()), static_cast<const float*>(sa.data_ptr()),
      static_cast<const uint8_t*>(b.data_ptr()), static_cast<const float*>(sb.data_ptr()),
      static_cast<const int*>(counts.data_ptr()), (int)m, (int)b.size(1), (int)a.size(2),
      static_cast<__nv_bfloat16*>(c.data_ptr()));
  check_launch(fn);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_grouped_gemm_contiguous, moe_grouped_gemm_contiguous);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_grouped_gemm_masked, moe_grouped_gemm_masked);
