// The pieces of a generated launcher's allocating call, for bench/host_overhead.py: each entry
// takes the GEMM's inputs (A: [M, K], B: [K, N], both fp16) like the allocating call does and
// goes only part of the way. Linked with the launchers' runtime, so tlx::Outputs here is the
// code the launchers run, and tlx_bind_output_factory chooses its allocator as in a launcher.
#include "tlx_launcher.h"

namespace {

const DLTensor* input(const TVMFFIAny* args, int i) { return tlx::tensor_arg("alloc_probe", args, i, i == 0 ? "A" : "B"); }

// The output of A @ B: an [M, N] fp16 tensor on A's device.
template <class Body>
int with_output(const TVMFFIAny* args, int32_t num_args, TVMFFIAny* result, Body body) {
  result->type_index = kTVMFFINone;
  result->v_int64 = 0;
  try {
    tlx::check_num_args("alloc_probe", num_args, 2, "A, B");
    const DLTensor* a = input(args, 0);
    const DLTensor* b = input(args, 1);
    int64_t shape[2] = {a->shape[0], b->shape[1]};
    body(a->device, shape, result);
    return 0;
  } catch (const tlx::Raised&) {
    return -1;
  }
}

}  // namespace

#define PROBE(name) extern "C" __attribute__((visibility("default"))) int __tvm_ffi_##name(void*, const TVMFFIAny* args, int32_t n, TVMFFIAny* result)

// The call alone: TVM-FFI's argument conversion and the inputs' checks, nothing allocated.
PROBE(call_only) {
  return with_output(args, n, result, [](DLDevice, int64_t*, TVMFFIAny*) {});
}

// Allocate the output and free it again before returning.
PROBE(allocate_drop) {
  return with_output(args, n, result, [](DLDevice device, int64_t* shape, TVMFFIAny*) {
    tlx::Outputs<1> outputs;
    outputs.allocate(0, DLDataType{kDLFloat, 16, 1}, device, 2, shape);
  });
}

// Allocate the output and return it, as the allocating call does after its launch.
PROBE(allocate_return) {
  return with_output(args, n, result, [](DLDevice device, int64_t* shape, TVMFFIAny* out) {
    tlx::Outputs<1> outputs;
    outputs.allocate(0, DLDataType{kDLFloat, 16, 1}, device, 2, shape);
    outputs.release(out);
  });
}

// ---- for tests/hostgen/test_outputs.py: ownership of the outputs, counted -----------------------
namespace {

// Forwards to the factory bound through count_through, counting the tensors it holds.
const tlx::OutputFactory* g_counted = nullptr;
int64_t g_held = 0;

void* counted_allocate(const DLTensor* prototype, const DLTensor** view) {
  void* h = g_counted->allocate(prototype, view);
  if (h) ++g_held;
  return h;
}
int counted_hand_over(void* const* handles, int n, TVMFFIAny* result) {
  g_held -= n;
  return g_counted->hand_over(handles, n, result);
}
void counted_release(void* handle) {
  --g_held;
  g_counted->release(handle);
}
const tlx::OutputFactory kCounting{counted_allocate, counted_hand_over, counted_release};

}  // namespace

// count_through(address): bind a counting factory in front of the factory at `address`.
PROBE(count_through) {
  g_counted = reinterpret_cast<const tlx::OutputFactory*>(args[0].v_int64);
  g_held = 0;
  __atomic_store_n(&tlx::g_output_factory, &kCounting, __ATOMIC_RELEASE);
  result->type_index = kTVMFFINone;
  return 0;
}

// The tensors the counting factory holds: allocated, neither handed over nor released.
PROBE(held) {
  result->type_index = kTVMFFIInt;
  result->v_int64 = g_held;
  return 0;
}

// Two outputs ([M, N] and [N], fp16), then a failure (as a launch that fails after allocating)
// when `fail` is true, else both handed back.
PROBE(allocate_two) {
  result->type_index = kTVMFFINone;
  result->v_int64 = 0;
  try {
    tlx::check_num_args("alloc_probe", n, 3, "A, B, fail");
    const DLTensor* a = input(args, 0);
    const DLTensor* b = input(args, 1);
    const bool fail = tlx::int_arg("alloc_probe", args, 2, "fail", 0, 1, "bool") != 0;
    int64_t shape[2] = {a->shape[0], b->shape[1]};
    tlx::Outputs<2> outputs;
    outputs.allocate(0, DLDataType{kDLFloat, 16, 1}, a->device, 2, shape);
    outputs.allocate(1, DLDataType{kDLFloat, 16, 1}, a->device, 1, shape + 1);
    if (fail) tlx::raise("RuntimeError", "alloc_probe: a failure after allocating");
    outputs.release(result);
    return 0;
  } catch (const tlx::Raised&) {
    return -1;
  }
}
