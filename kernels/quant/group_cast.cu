// CUDA baseline of group_cast.py: one thread per (row, group), scalar loads, written for
// clarity, not speed. Same arithmetic as the TileLang kernel (reference.py rules), spelled
// with explicit IEEE intrinsics and CUDA's own fp8/fp4/e8m0 conversions.
#include "quant_common.cuh"

using tvm::ffi::TensorView;

namespace {

enum InMode { kPlain = 0, kSwiglu = 1, kE2m1In = 2 };
enum ScaleFmt { kFp32 = 0, kUe8m0 = 1, kUe8m0Packed = 2 };

struct Params {
  const void* x;
  const uint8_t* codes_in;  // e2m1 input scales
  const float* w;           // swiglu row weights or nullptr
  void* q;
  void* s;
  int rows, cols, group, tp;
  int scale_fmt, col_major, e2m1_out;
  float clamp;
};

template <typename In, int Mode>
__device__ float load(const Params& p, int row, int col) {
  if constexpr (Mode == kPlain) {
    return static_cast<float>(static_cast<const In*>(p.x)[static_cast<int64_t>(row) * p.cols + col]);
  } else if constexpr (Mode == kSwiglu) {
    const __nv_bfloat16* x = static_cast<const __nv_bfloat16*>(p.x) + static_cast<int64_t>(row) * 2 * p.cols;
    float g = fminf(__bfloat162float(x[col]), p.clamp);
    float u = fmaxf(fminf(__bfloat162float(x[p.cols + col]), p.clamp), -p.clamp);
    float y = __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
    return p.w ? __fmul_rn(y, p.w[row]) : y;
  } else {
    const uint8_t* x = static_cast<const uint8_t*>(p.x) + static_cast<int64_t>(row) * (p.cols / 2);
    uint32_t byte = x[col / 2];
    float v = quant::e2m1_value(col % 2 ? byte >> 4 : byte & 0xF);
    return __fmul_rn(v, quant::ue8m0_value(p.codes_in[static_cast<int64_t>(row) * (p.cols / 32) + col / 32]));
  }
}

template <typename In, int Mode>
__global__ void group_cast_kernel(Params p) {
  int ng = p.cols / p.group;
  int64_t id = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (id >= static_cast<int64_t>(p.rows) * ng) return;
  int row = static_cast<int>(id / ng), g = static_cast<int>(id % ng);
  float amax = 0.0f;
  for (int j = 0; j < p.group; ++j) amax = fmaxf(amax, fabsf(load<In, Mode>(p, row, g * p.group + j)));
  uint32_t code = 0;
  float scale = quant::group_scale(amax, p.e2m1_out, p.e2m1_out || p.scale_fmt != kFp32, &code);
  float inv = __frcp_rn(scale);
  for (int j = 0; j < p.group; ++j) {
    int col = g * p.group + j;
    float v = __fmul_rn(load<In, Mode>(p, row, col), inv);
    if (p.e2m1_out) {
      uint8_t* q = static_cast<uint8_t*>(p.q) + static_cast<int64_t>(row) * (p.cols / 2) + col / 2;
      uint8_t c = quant::to_e2m1(v);
      *q = (col % 2) ? static_cast<uint8_t>((*q & 0x0F) | (c << 4)) : c;
    } else {
      static_cast<uint8_t*>(p.q)[static_cast<int64_t>(row) * p.cols + col] = quant::to_e4m3(v);
    }
  }
  if (p.e2m1_out) {
    static_cast<uint8_t*>(p.s)[static_cast<int64_t>(row) * ng + g] = static_cast<uint8_t>(code);
  } else if (p.scale_fmt == kUe8m0Packed) {
    int ng4 = (ng + 3) / 4;
    int64_t word = p.col_major ? static_cast<int64_t>(g / 4) * p.tp + row : static_cast<int64_t>(row) * ng4 + g / 4;
    static_cast<uint8_t*>(p.s)[word * 4 + g % 4] = static_cast<uint8_t>(code);
    if (g == ng - 1)  // unused bytes of the last word are zero
      for (int b = g % 4 + 1; b < 4; ++b) static_cast<uint8_t*>(p.s)[word * 4 + b] = 0;
  } else {
    int64_t at = p.col_major ? static_cast<int64_t>(g) * p.tp + row : static_cast<int64_t>(row) * ng + g;
    static_cast<float*>(p.s)[at] = scale;
  }
}

template <int Mode>
void launch(const TensorView& x, const Params& p) {
  int64_t n = static_cast<int64_t>(p.rows) * (p.cols / p.group);
  if (n == 0) return;
  cudaStream_t stream = quant::stream_of(x);
  if (Mode != kPlain || quant::is_dtype(x, kDLBfloat, 16)) {
    group_cast_kernel<__nv_bfloat16, Mode><<<quant::blocks_for(n, 128), 128, 0, stream>>>(p);
  } else {
    group_cast_kernel<float, Mode><<<quant::blocks_for(n, 128), 128, 0, stream>>>(p);
  }
  quant::check_launch("group_cast baseline");
}

// x: input ([T, H] bf16/fp32, [T, 2H] bf16 for swiglu, [T, H/2] uint8 for e2m1 input);
// aux: row weights (swiglu, fp32 [T]) or UE8M0 input codes (e2m1, uint8 [T, H/32]), empty otherwise;
// q: [T, H] e4m3 or [T, H/2] uint8; s: the scale storage exactly as the TileLang kernel gets it
// (group_cast.py: _alloc_scales).
void group_cast(TensorView x, TensorView aux, TensorView q, TensorView s, int64_t in_mode, int64_t group,
                int64_t e2m1_out, int64_t scale_fmt, int64_t col_major, double clamp) {
  Params p{};
  p.x = x.data_ptr();
  p.q = q.data_ptr();
  p.s = s.data_ptr();
  p.rows = static_cast<int>(q.size(0));
  p.cols = static_cast<int>(e2m1_out ? q.size(1) * 2 : q.size(1));
  p.group = static_cast<int>(group);
  p.scale_fmt = static_cast<int>(scale_fmt);
  p.col_major = static_cast<int>(col_major);
  p.e2m1_out = static_cast<int>(e2m1_out);
  p.clamp = static_cast<float>(clamp);
  p.tp = col_major ? static_cast<int>(s.size(1)) : 0;  // [NG, TP] fp32 or [words, TP, 4] bytes
  if (p.group <= 0 || p.cols % p.group) TVM_FFI_THROW(ValueError) << "group " << group << " does not divide " << p.cols;
  if (in_mode == kSwiglu) {
    p.w = aux.numel() ? static_cast<const float*>(aux.data_ptr()) : nullptr;
    launch<kSwiglu>(x, p);
  } else if (in_mode == kE2m1In) {
    p.codes_in = static_cast<const uint8_t*>(aux.data_ptr());
    launch<kE2m1In>(x, p);
  } else {
    launch<kPlain>(x, p);
  }
}

}  // namespace

TVM_FFI_DLL_EXPORT_TYPED_FUNC(group_cast, group_cast);
