// CUDA baseline of kernels/attention/indexer.py (head dim 128), written for clarity, not speed.
//
// One warpgroup scores a 64 x 64 tile: 64 keys against 64 query rows (token, head), contiguous
// in q. The dots are one chain of wgmma m64n64k32.f32.e4m3.e4m3 over the 128 dims with the keys
// as the M operand (the TileLang kernels issue n128 / n64..n256 tiles: per element the same k32
// steps), both operands K-major in 128-byte-swizzled shared memory, plain loads, no pipelining.
// Then per (token, key) the head sum in the order of indexer.py's docstring (p_h = max(dot, 0) *
// w[h] rounded; four partial sums over heads 8g + 2l, then 8g + 2l + 1; (part0 + part2) + (part1 +
// part3)), logit = sum * k_scale, masked keys -inf; in the paged form a block-table entry outside
// [0, P) gives NaN and is never read.
#include <cuda_fp8.h>
#include <math.h>

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/error.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

#include "../sm90.cuh"

using tvm::ffi::TensorView;

namespace {

constexpr int kDim = 128;     // bytes of one e4m3 row = one 128-byte swizzle row
constexpr int kTile = 64;     // rows and keys of one tile
constexpr int kPage = 64;     // tokens per KV page
constexpr int kThreads = 128;

// The tile's raw dots into s_out[64 keys][64 rows]: keys whose row i is key_row(i) (nullptr:
// zeros) as the M operand, the query rows q_rows (64 x 128 bytes, contiguous) as N.
template <typename KeyRow>
__device__ void dots(KeyRow key_row, const uint8_t* q_rows, uint8_t* a_s, uint8_t* b_s, float (*s_out)[kTile]) {
  int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  for (int i = tid; i < kTile * kDim / 16; i += kThreads) {
    int row = i / 8, byte = (i % 8) * 16;
    const uint8_t* kr = key_row(row);
    *reinterpret_cast<uint4*>(a_s + swizzle128(row, byte)) =
        kr ? *reinterpret_cast<const uint4*>(kr + byte) : make_uint4(0, 0, 0, 0);
    *reinterpret_cast<uint4*>(b_s + swizzle128(row, byte)) = *reinterpret_cast<const uint4*>(q_rows + row * kDim + byte);
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  float d[32];
  for (int r = 0; r < 32; ++r) d[r] = 0.0f;
  for (int r = 0; r < 32; ++r) asm volatile("" : "+f"(d[r])::"memory");
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  for (int ki = 0; ki < kDim / 32; ++ki) wgmma_m64n64k32(d, smem_desc(a_s + ki * 32), smem_desc(b_s + ki * 32));
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  for (int r = 0; r < 32; ++r) asm volatile("" : "+f"(d[r])::"memory");
  for (int r = 0; r < 32; ++r) {
    int key = warp * 16 + lane / 4 + 8 * ((r / 2) % 2);
    int col = (r / 4) * 8 + (lane % 4) * 2 + (r % 2);
    s_out[key][col] = d[r];
  }
  __syncthreads();
}

// The head sum of token `tok` of the tile for key j (steps 2-4 of indexer.py's docstring).
__device__ float head_sum(float (*s)[kTile], const float* w, int tok, int heads, int j) {
  float part[4];
  for (int l = 0; l < 4; ++l) {
    part[l] = 0.0f;
    for (int b = 0; b < 2; ++b) {
      for (int g = 0; g < heads / 8; ++g) {
        int h = 8 * g + 2 * l + b;
        part[l] = part[l] + __fmul_rn(fmaxf(s[j][tok * heads + h], 0.0f), w[h]);
      }
    }
  }
  return (part[0] + part[2]) + (part[1] + part[3]);
}

// Prefill: tile (blockIdx.x: 64 keys, blockIdx.y: 64 rows of q [S, H, 128]).
__global__ void __launch_bounds__(kThreads) prefill_kernel(const uint8_t* q, const uint8_t* k, const float* ks,
                                                           const float* w, const int* pos, float* logits, int s_len,
                                                           int n, int heads) {
  __shared__ __align__(1024) uint8_t a_s[kTile * kDim];
  __shared__ __align__(1024) uint8_t b_s[kTile * kDim];
  __shared__ float s_tile[kTile][kTile];
  int n0 = blockIdx.x * kTile;
  int64_t row0 = static_cast<int64_t>(blockIdx.y) * kTile;  // S * H is a multiple of 64 (checked)
  dots([&](int i) { return n0 + i < n ? k + static_cast<int64_t>(n0 + i) * kDim : nullptr; }, q + row0 * kDim,
       a_s, b_s, s_tile);
  int tokens = kTile / heads;
  for (int p = threadIdx.x; p < tokens * kTile; p += kThreads) {
    int tok = p / kTile, j = p % kTile;
    int64_t s = row0 / heads + tok;
    if (s >= s_len || n0 + j >= n) continue;
    float acc = head_sum(s_tile, w + s * heads, tok, heads, j);
    logits[s * n + n0 + j] = n0 + j <= pos[s] ? __fmul_rn(acc, ks[n0 + j]) : -INFINITY;
  }
}

// Decode: tile (blockIdx.x: page slot, blockIdx.y: one token's 64 heads of q [B, T, 64, 128]).
__global__ void __launch_bounds__(kThreads) paged_kernel(const uint8_t* q, const uint8_t* kc, const float* ksc,
                                                         const int* bt, const int* sl, const float* w, float* logits,
                                                         int tokens, int pages, int max_pages) {
  __shared__ __align__(1024) uint8_t a_s[kTile * kDim];
  __shared__ __align__(1024) uint8_t b_s[kTile * kDim];
  __shared__ float s_tile[kTile][kTile];
  int slot = blockIdx.x, g = blockIdx.y, b = g / tokens, t = g % tokens;
  int seq = min(sl[b], max_pages * kPage);
  int64_t out = static_cast<int64_t>(g) * max_pages * kPage + static_cast<int64_t>(slot) * kPage;
  if (slot * kPage >= seq) {  // past the sequence: the block-table entry is not read
    if (threadIdx.x < kPage) logits[out + threadIdx.x] = -INFINITY;
    return;
  }
  int page = bt[static_cast<int64_t>(b) * max_pages + slot];
  bool valid = 0 <= page && page < pages;
  int safe = valid ? page : 0;
  dots([&](int i) { return kc + (static_cast<int64_t>(safe) * kPage + i) * kDim; },
       q + static_cast<int64_t>(g) * kTile * kDim, a_s, b_s, s_tile);
  int j = threadIdx.x;
  if (j >= kPage) return;
  float acc = head_sum(s_tile, w + static_cast<int64_t>(g) * kTile, 0, kTile, j);
  float logit = slot * kPage + j <= seq - tokens + t ? __fmul_rn(acc, ksc[static_cast<int64_t>(safe) * kPage + j]) : -INFINITY;
  logits[out + j] = valid ? logit : __int_as_float(0x7FC00000);
}

void require(bool ok, const char* fn, const char* what) {
  if (!ok) TVM_FFI_THROW(ValueError) << fn << ": " << what;
}

cudaStream_t stream_of(const TensorView& t) {
  return static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, t.device().device_id));
}

void check_launch(const char* fn) {
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) TVM_FFI_THROW(RuntimeError) << fn << " launch: " << cudaGetErrorString(err);
}

// q [S, H, 128] e4m3, k [N, 128] e4m3, ks [N], w [S, H], pos [S] int32, logits [S, N].
void indexer_prefill(TensorView q, TensorView k, TensorView ks, TensorView w, TensorView pos, TensorView logits) {
  const char* fn = "indexer_prefill baseline";
  int s = static_cast<int>(q.size(0)), heads = static_cast<int>(q.size(1)), n = static_cast<int>(k.size(0));
  require(q.size(2) == kDim && k.size(1) == kDim, fn, "head dim 128");
  require(heads == 32 || heads == 64, fn, "32 or 64 heads");
  require((static_cast<int64_t>(s) * heads) % kTile == 0, fn, "S * H a multiple of 64");
  if (s == 0 || n == 0) return;
  dim3 grid((n + kTile - 1) / kTile, static_cast<unsigned>(static_cast<int64_t>(s) * heads / kTile));
  prefill_kernel<<<grid, kThreads, 0, stream_of(q)>>>(
      static_cast<const uint8_t*>(q.data_ptr()), static_cast<const uint8_t*>(k.data_ptr()),
      static_cast<const float*>(ks.data_ptr()), static_cast<const float*>(w.data_ptr()),
      static_cast<const int*>(pos.data_ptr()), static_cast<float*>(logits.data_ptr()), s, n, heads);
  check_launch(fn);
}

// q [B, T, 64, 128], kc [P, 64, 128], ksc [P, 64], bt [B, MP], sl [B], w [B, T, 64], logits [B, T, MP * 64].
void indexer_paged(TensorView q, TensorView kc, TensorView ksc, TensorView bt, TensorView sl, TensorView w,
                   TensorView logits) {
  const char* fn = "indexer_paged baseline";
  int b = static_cast<int>(q.size(0)), tokens = static_cast<int>(q.size(1));
  require(q.size(2) == kTile && q.size(3) == kDim && kc.size(1) == kPage && kc.size(2) == kDim, fn, "shapes");
  if (b == 0) return;
  dim3 grid(static_cast<unsigned>(bt.size(1)), static_cast<unsigned>(b * tokens));
  paged_kernel<<<grid, kThreads, 0, stream_of(q)>>>(
      static_cast<const uint8_t*>(q.data_ptr()), static_cast<const uint8_t*>(kc.data_ptr()),
      static_cast<const float*>(ksc.data_ptr()), static_cast<const int*>(bt.data_ptr()),
      static_cast<const int*>(sl.data_ptr()), static_cast<const float*>(w.data_ptr()),
      static_cast<float*>(logits.data_ptr()), tokens, static_cast<int>(kc.size(0)), static_cast<int>(bt.size(1)));
  check_launch(fn);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(indexer_prefill, indexer_prefill);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(indexer_paged, indexer_paged);
