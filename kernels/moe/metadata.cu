// CUDA C++ baseline of kernels/moe/metadata.py: the same steps (chunk histograms, then every
// block sums them, lays out the offsets and places its chunk) as two launches instead of one
// launch with a grid barrier, 128-token chunks, the same assignment order: outputs match bitwise.
#include "common.cuh"

namespace {

constexpr int kChunk = 128;
constexpr int kThreads = 128;

__global__ void count_kernel(const int* __restrict__ ids, int n_tok, int topk, int first, int n_local,
                             int* __restrict__ chunk_counts) {
  extern __shared__ int s_ids[];
  int c = blockIdx.x;
  int n = min(n_tok - c * kChunk, kChunk) * topk;
  for (int i = threadIdx.x; i < n; i += kThreads) s_ids[i] = ids[(int64_t)c * kChunk * topk + i] - first;
  __syncthreads();
  for (int e = threadIdx.x; e < n_local; e += kThreads) {
    int cnt = 0;
    for (int i = 0; i < n; ++i) cnt += s_ids[i] == e;
    chunk_counts[(int64_t)c * n_local + e] = cnt;
  }
}

// One block per chunk: every block sums the chunk counts (its expert totals and earlier-chunk
// counts) and lays out the offsets itself; blocks share out the padding rows and row-block
// experts; block 0 writes counts and offsets; a thread per expert assigns the chunk's rows.
__global__ void place_kernel(const int* __restrict__ ids, int n_tok, int topk, int first, int n_local, int align,
                             const int* __restrict__ chunk_counts, int n_chunk, int* __restrict__ counts,
                             int* __restrict__ offsets, int* __restrict__ row_of, int* __restrict__ entry_of_row,
                             int* __restrict__ block_expert, int n_blocks) {
  extern __shared__ int s[];
  int* s_tot = s;
  int* s_row = s + n_local;  // next row of each expert in this chunk
  int* s_off = s + 2 * n_local;
  int* s_ids = s + 3 * n_local + 1;
  int c = blockIdx.x;
  int n = max(min(n_tok - c * kChunk, kChunk), 0) * topk;
  int64_t base = (int64_t)c * kChunk * topk;
  for (int i = threadIdx.x; i < n; i += kThreads) s_ids[i] = ids[base + i] - first;
  for (int e = threadIdx.x; e < n_local; e += kThreads) {
    int tot = 0, before = 0;
    for (int k = 0; k < n_chunk; ++k) {
      int v = chunk_counts[(int64_t)k * n_local + e];
      tot += v;
      if (k < c) before += v;
    }
    s_tot[e] = tot;
    s_row[e] = before;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    s_off[0] = 0;
    for (int e = 0; e < n_local; ++e) s_off[e + 1] = s_off[e] + (s_tot[e] + align - 1) / align * align;
  }
  __syncthreads();
  if (c == 0) {
    for (int e = threadIdx.x; e < n_local; e += kThreads) counts[e] = s_tot[e];
    for (int e = threadIdx.x; e <= n_local; e += kThreads) offsets[e] = s_off[e];
  }
  for (int e = c; e < n_local; e += gridDim.x)
    for (int r = s_off[e] + s_tot[e] + threadIdx.x; r < s_off[e + 1]; r += kThreads) entry_of_row[r] = -1;
  for (int q = c * kThreads + threadIdx.x; q < n_blocks; q += gridDim.x * kThreads) {
    int64_t row = (int64_t)q * align;
    int e = -1;
    if (row < s_off[n_local]) {
      e = 0;
      while (s_off[e + 1] <= row) ++e;
    }
    block_expert[q] = e;
  }
  for (int i = threadIdx.x; i < n; i += kThreads)
    if (s_ids[i] < 0 || s_ids[i] >= n_local) row_of[base + i] = -1;
  for (int e = threadIdx.x; e < n_local; e += kThreads) {
    int row = s_off[e] + s_row[e];
    for (int i = 0; i < n; ++i)
      if (s_ids[i] == e) {
        row_of[base + i] = row;
        entry_of_row[row] = (int)(base + i);
        ++row;
      }
  }
}

void moe_metadata(tvm::ffi::TensorView ids, int64_t first_expert, int64_t align, tvm::ffi::TensorView chunk_counts,
                  tvm::ffi::TensorView counts, tvm::ffi::TensorView offsets, tvm::ffi::TensorView row_of,
                  tvm::ffi::TensorView entry_of_row, tvm::ffi::TensorView block_expert) {
  using namespace moe_baseline;
  const char* fn = "moe_metadata";
  require(is(ids, kDLInt, 32, 2) && is(row_of, kDLInt, 32, 2), fn, "ids and row_of must be contiguous [T, k] int32");
  require(row_of.size(0) == ids.size(0) && row_of.size(1) == ids.size(1), fn, "row_of must match ids");
  require(is(chunk_counts, kDLInt, 32, 2), fn, "chunk_counts must be [C, El] int32");
  require(is(counts, kDLInt, 32, 1) && is(offsets, kDLInt, 32, 1) && offsets.size(0) == counts.size(0) + 1, fn,
          "counts [El] and offsets [El + 1] int32");
  require(is(entry_of_row, kDLInt, 32, 1) && is(block_expert, kDLInt, 32, 1), fn, "entry_of_row/block_expert int32");
  int n_tok = (int)ids.size(0), topk = (int)ids.size(1), n_local = (int)counts.size(0);
  int n_chunk = (int)chunk_counts.size(0);
  require(n_chunk == (n_tok + kChunk - 1) / kChunk || (n_tok == 0 && n_chunk == 1), fn, "chunk_counts rows");
  require(chunk_counts.size(1) == n_local, fn, "chunk_counts' shape");
  cudaStream_t st = stream_of(ids);
  int smem_ids = kChunk * topk * (int)sizeof(int);
  if (n_tok) {
    count_kernel<<<n_chunk, kThreads, smem_ids, st>>>(static_cast<const int*>(ids.data_ptr()), n_tok, topk,
                                                      (int)first_expert, n_local,
                                                      static_cast<int*>(chunk_counts.data_ptr()));
    check_launch(fn);
  } else {
    cudaMemsetAsync(chunk_counts.data_ptr(), 0, sizeof(int) * n_local, st);
  }
  place_kernel<<<n_chunk, kThreads, smem_ids + (3 * n_local + 1) * (int)sizeof(int), st>>>(
      static_cast<const int*>(ids.data_ptr()), n_tok, topk, (int)first_expert, n_local, (int)align,
      static_cast<const int*>(chunk_counts.data_ptr()), n_chunk, static_cast<int*>(counts.data_ptr()),
      static_cast<int*>(offsets.data_ptr()), static_cast<int*>(row_of.data_ptr()),
      static_cast<int*>(entry_of_row.data_ptr()), static_cast<int*>(block_expert.data_ptr()),
      (int)block_expert.size(0));
  check_launch(fn);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_metadata, moe_metadata);
