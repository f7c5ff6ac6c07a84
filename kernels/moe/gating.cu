// CUDA C++ baseline of kernels/moe/gating.py: one thread per token, written serially, with
// the same float expressions and the order rules of gating.py's docstring (softmax
// denominator: 32 strided partial sums combined by an xor butterfly 16, 8, 4, 2, 1), so
// results match the warp-per-token TileLang kernel bitwise.
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/extra/c_env_api.h>
#include <tvm/ffi/function.h>

namespace {

constexpr float kSoftplusLinearFrom = 20.0f;  // same cut-over as the TileLang kernel

struct Params {
  int n_tok, n_exp, topk, code, n_groups, topk_groups, renormalize;
  float scaling;
};

__device__ __forceinline__ float score(const Params& p, float x, float row_max, float denom) {
  if (p.code == 0) return expf(x - row_max) / denom;
  if (p.code == 1) return 1.0f / (1.0f + expf(-x));
  return sqrtf(x > kSoftplusLinearFrom ? x : log1pf(expf(x)));
}

// (v, i) strictly after (pv, pi) in the order value descending, id ascending.
__device__ __forceinline__ bool after(float v, int i, float pv, int pi) {
  return v < pv || (v == pv && i > pi);
}

__global__ void gating_kernel(Params p, const float* __restrict__ logits, const float* __restrict__ bias,
                              int* __restrict__ ids, float* __restrict__ weights) {
  int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= p.n_tok) return;
  const float* row = logits + (int64_t)t * p.n_exp;
  float row_max = 0.0f, denom = 0.0f;
  if (p.code == 0) {
    row_max = row[0];
    for (int e = 1; e < p.n_exp; ++e) row_max = fmaxf(row_max, row[e]);
    float part[32];  // part[l]: "lane" l's sum over experts l, l + 32, ... in ascending order
    for (int l = 0; l < 32; ++l) {
      part[l] = 0.0f;
      for (int e = l; e < p.n_exp; e += 32) part[l] = part[l] + expf(row[e] - row_max);
    }
    for (int d = 16; d >= 1; d >>= 1)
      for (int l = 0; l < 32; ++l)
        if ((l & d) == 0) part[l] = part[l | d] = part[l] + part[l | d];
    denom = part[0];
  }
  int per_group = p.n_exp / p.n_groups;
  int kept = -1;
  if (p.n_groups > 1) {
    kept = 0;
    float pv = INFINITY;
    int pi = -1;
    for (int r = 0; r < p.topk_groups; ++r) {
      int bi = -1;
      float bv = -INFINITY;
      for (int g = 0; g < p.n_groups; ++g) {
        float gv = score(p, row[g * per_group], row_max, denom) + bias[g * per_group];
        for (int c = 1; c < per_group; ++c)
          gv = fmaxf(gv, score(p, row[g * per_group + c], row_max, denom) + bias[g * per_group + c]);
        if (after(gv, g, pv, pi) && (bi < 0 || gv > bv)) {
          bv = gv;
          bi = g;
        }
      }
      kept |= 1 << bi;
      pv = bv;
      pi = bi;
    }
  }
  int pick[32];
  float wt[32];
  float pv = INFINITY;
  int pi = -1;
  for (int j = 0; j < p.topk; ++j) {
    int bi = -1;
    float bv = -INFINITY;
    for (int e = 0; e < p.n_exp; ++e) {
      float v = score(p, row[e], row_max, denom) + bias[e];
      if (((kept >> (e / per_group)) & 1) == 1 && after(v, e, pv, pi) && (bi < 0 || v > bv)) {
        bv = v;
        bi = e;
      }
    }
    pick[j] = bi;
    pv = bv;
    pi = bi;
  }
  float total = 0.0f;
  for (int j = 0; j < p.topk; ++j) {
    wt[j] = pick[j] >= 0 ? score(p, row[pick[j]], row_max, denom) : 0.0f;  // no candidate left: weight 0
    total = total + wt[j];
  }
  for (int j = 0; j < p.topk; ++j) {
    ids[(int64_t)t * p.topk + j] = pick[j];
    weights[(int64_t)t * p.topk + j] = p.renormalize ? wt[j] / total * p.scaling : wt[j] * p.scaling;
  }
}

void check(bool ok, const char* what) {
  if (!ok) TVM_FFI_THROW(ValueError) << "gating baseline: " << what;
}

// score code: 0 softmax, 1 sigmoid, 2 sqrt(softplus) (kernels.moe.gating.SCORE_CODES).
void moe_gating(tvm::ffi::TensorView logits, tvm::ffi::TensorView bias, tvm::ffi::TensorView ids,
                tvm::ffi::TensorView weights, int64_t code, int64_t n_groups, int64_t topk_groups,
                bool renormalize, double routed_scaling) {
  check(logits.ndim() == 2 && logits.dtype().code == kDLFloat && logits.dtype().bits == 32, "logits must be [T, E] f32");
  check(ids.ndim() == 2 && ids.dtype().code == kDLInt && ids.dtype().bits == 32, "ids must be [T, k] i32");
  check(weights.ndim() == 2 && weights.dtype().code == kDLFloat && weights.dtype().bits == 32, "weights must be [T, k] f32");
  check(bias.ndim() == 1 && bias.size(0) == logits.size(1), "bias must be [E]");
  check(ids.size(0) == logits.size(0) && weights.size(0) == logits.size(0) && ids.size(1) == weights.size(1), "shapes");
  check(ids.size(1) >= 1 && ids.size(1) <= 32, "topk must be 1..32");
  check(n_groups >= 1 && n_groups <= 32 && logits.size(1) % n_groups == 0, "n_groups");
  Params p{(int)logits.size(0), (int)logits.size(1), (int)ids.size(1), (int)code, (int)n_groups, (int)topk_groups,
           renormalize ? 1 : 0, (float)routed_scaling};
  if (p.n_tok == 0) return;
  auto stream = static_cast<cudaStream_t>(TVMFFIEnvGetStream(kDLCUDA, logits.device().device_id));
  gating_kernel<<<(p.n_tok + 127) / 128, 128, 0, stream>>>(p, static_cast<const float*>(logits.data_ptr()),
                                                          static_cast<const float*>(bias.data_ptr()),
                                                          static_cast<int*>(ids.data_ptr()),
                                                          static_cast<float*>(weights.data_ptr()));
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) TVM_FFI_THROW(RuntimeError) << "gating baseline launch: " << cudaGetErrorString(err);
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(moe_gating, moe_gating);
