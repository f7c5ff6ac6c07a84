// The out-of-line half of tlx_launcher.h: every message, the CUDA driver, module loading, TMA
// encoding and the launch. Compiled once per machine (tlx/hostgen/runtime_support) and linked
// into every generated launcher, so no launcher compiles it again.
#include "tlx_launcher.h"

#include <dlfcn.h>

#include <cstdio>
#include <mutex>
#include <string>
#include <vector>

#pragma GCC visibility push(hidden)

namespace tlx {

namespace {

// A DLPack dtype as TileLang and torch name it: "float32", "bfloat16", "float8_e4m3fn",
// "float4_e2m1fnx2" (lanes appended as "x2").
std::string dtype_name(DLDataType t) {
  // integer and float families carry their width in the name; the narrow floats are named whole
  static const struct { uint8_t code; const char* name; bool sized; } kNames[] = {
      {kDLInt, "int", true}, {kDLUInt, "uint", true}, {kDLFloat, "float", true},
      {kDLBfloat, "bfloat", true}, {kDLComplex, "complex", true}, {kDLOpaqueHandle, "handle", false},
      {kDLBool, "bool", false}, {kDLFloat8_e3m4, "float8_e3m4", false},
      {kDLFloat8_e4m3, "float8_e4m3", false}, {kDLFloat8_e4m3b11fnuz, "float8_e4m3b11fnuz", false},
      {kDLFloat8_e4m3fn, "float8_e4m3fn", false}, {kDLFloat8_e4m3fnuz, "float8_e4m3fnuz", false},
      {kDLFloat8_e5m2, "float8_e5m2", false}, {kDLFloat8_e5m2fnuz, "float8_e5m2fnuz", false},
      {kDLFloat8_e8m0fnu, "float8_e8m0fnu", false}, {kDLFloat6_e2m3fn, "float6_e2m3fn", false},
      {kDLFloat6_e3m2fn, "float6_e3m2fn", false}, {kDLFloat4_e2m1fn, "float4_e2m1fn", false},
  };
  for (const auto& n : kNames) {
    if (n.code != t.code) continue;
    std::string s = n.name;
    if (n.sized) s += std::to_string(t.bits);
    if (t.lanes != 1) s += "x" + std::to_string(t.lanes);
    return s;
  }
  return "dtype(code=" + std::to_string(t.code) + ", bits=" + std::to_string(t.bits) + ", lanes=" + std::to_string(t.lanes) + ")";
}

const char* type_index_name(int32_t index) {
  switch (index) {
    case kTVMFFINone: return "None";
    case kTVMFFIInt: return "int";
    case kTVMFFIBool: return "bool";
    case kTVMFFIFloat: return "float";
    case kTVMFFIOpaquePtr: return "pointer";
    case kTVMFFIRawStr: case kTVMFFISmallStr: case kTVMFFIStr: return "str";
    case kTVMFFIShape: return "shape";
    case kTVMFFIArray: case kTVMFFIList: return "list";
    case kTVMFFIOpaquePyObject: return "Python object";
    default: return "object";
  }
}

std::string device_name(DLDevice d) {
  if (d.device_type == kDLCUDA) return "cuda:" + std::to_string(d.device_id);
  if (d.device_type == kDLCPU) return "cpu";
  return "device(type=" + std::to_string(d.device_type) + ", id=" + std::to_string(d.device_id) + ")";
}

[[noreturn]] void raise(const char* kind, const std::string& message) { tlx::raise(kind, message.c_str()); }

// "M = 4, N = 2.500000": the variables of a failed condition, as std::to_string prints them.
std::string values_text(int n, const Named* values) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    if (i) s += ", ";
    s += std::string(values[i].name) + " = " + (values[i].is_float ? std::to_string(values[i].f) : std::to_string(values[i].i));
  }
  return s;
}

}  // namespace

void raise(const char* kind, const char* message) {
  TVMFFIErrorSetRaisedFromCStr(kind, message);
  throw Raised{};
}

void fail_num_args(const char* kernel, int32_t got, int32_t expected, const char* signature) {
  raise("TypeError", std::string(kernel) + "(" + signature + "): expected " + std::to_string(expected) + " arguments, got " +
                         std::to_string(got));
}

void fail_arg_type(const char* kernel, const char* name, int i, const char* expected, int32_t got) {
  raise("TypeError", std::string(kernel) + ": argument " + name + " (#" + std::to_string(i) + ") expected " + expected + ", got " +
                         type_index_name(got));
}

void fail_dtype(const char* kernel, const char* name, const DLTensor* t, DLDataType expected) {
  raise("TypeError", std::string(kernel) + ": argument " + name + " expected dtype " + dtype_name(expected) + ", got " +
                         dtype_name(t->dtype));
}

void fail_packed_dtype(const char* kernel, const char* name, const DLTensor* t, const char* declared, int per_byte) {
  raise("TypeError", std::string(kernel) + ": argument " + name + " is " + declared + ", packed " + std::to_string(per_byte) +
                         " per byte: expected a dtype of 8 bits (torch.float4_e2m1fn_x2, int8, uint8), got " + dtype_name(t->dtype));
}

void fail_ndim(const char* kernel, const char* name, const DLTensor* t, int32_t ndim) {
  raise("ValueError", std::string(kernel) + ": argument " + name + " expected " + std::to_string(ndim) + " dimensions, got " +
                          std::to_string(t->ndim));
}

void fail_dim(const char* kernel, const char* name, const DLTensor* t, int d, int64_t expected, const char* what) {
  std::string want = std::to_string(expected);
  if (want != what) want = std::string(what) + " = " + want;
  raise("ValueError", std::string(kernel) + ": argument " + name + ".shape[" + std::to_string(d) + "] expected " + want + ", got " +
                          std::to_string(t->shape[d]));
}

void fail_bind_dim(const char* kernel, const char* name, int d, const char* var, int64_t v) {
  raise("ValueError", std::string(kernel) + ": " + var + " = " + name + ".shape[" + std::to_string(d) + "] = " + std::to_string(v) +
                          " exceeds the int32 range the kernel indexes with");
}

void fail_bind_stride(const char* kernel, const char* name, int d, const char* var, int64_t v) {
  raise("ValueError", std::string(kernel) + ": " + var + " = " + name + ".stride(" + std::to_string(d) + ") = " + std::to_string(v) +
                          (v < 0 ? " is negative; the kernel indexes with strides >= 0" : " exceeds the int32 range the kernel indexes with"));
}

void fail_stride(const char* kernel, const char* name, int d, int64_t expected, int64_t got) {
  raise("ValueError", std::string(kernel) + ": argument " + name + ".stride(" + std::to_string(d) + ") expected " +
                          std::to_string(expected) + " (the layout the kernel was compiled for), got " + std::to_string(got) +
                          "; pass a contiguous tensor (.contiguous())");
}

void fail_cuda_device(const char* kernel, const char* name, const DLTensor* t, int32_t device_id) {
  if (t->device.device_type != kDLCUDA) {
    raise("ValueError", std::string(kernel) + ": argument " + name + " expected a CUDA tensor, got one on " + device_name(t->device));
  }
  raise("ValueError", std::string(kernel) + ": argument " + name + " expected device cuda:" + std::to_string(device_id) +
                          " (that of the first tensor), got " + device_name(t->device));
}

void fail_align(const char* kernel, const char* name, const void* p, uintptr_t align, const char* why) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  raise("ValueError", std::string(kernel) + ": argument " + name + " data pointer expected " + std::to_string(align) +
                          "-byte alignment (" + why + "), got " + buf + " (offset " +
                          std::to_string(reinterpret_cast<uintptr_t>(p) % align) + ")");
}

void fail_int_range(const char* kernel, const char* name, int64_t lo, int64_t hi, const char* type, int64_t got) {
  raise("ValueError", std::string(kernel) + ": argument " + name + " expected a value in the " + type + " range [" + std::to_string(lo) +
                          ", " + std::to_string(hi) + "], got " + std::to_string(got));
}

void fail_float_range(const char* kernel, const char* name, const char* type, double max_finite, double v) {
  char got[40], max[40];
  std::snprintf(got, sizeof got, "%.9g", v);
  std::snprintf(max, sizeof max, "%.9g", max_finite);
  raise("ValueError", std::string(kernel) + ": argument " + name + " expected a finite " + type + " (|value| <= " + max +
                          ") or inf/nan, got " + got);
}

void fail_division_by_zero() { raise("ValueError", "launch configuration divides by zero"); }

void fail_device_id(const char* kernel) { raise("ValueError", std::string(kernel) + ": device id out of range"); }

void fail_precondition(const char* kernel, const char* text, int n, const Named* values) {
  raise("ValueError", std::string(kernel) + ": shape precondition " + text + " does not hold for " + values_text(n, values));
}

void grid_too_large(const char* kernel, const char* axis, int64_t value, int64_t limit, const char* expr, int n, const Named* values) {
  const std::string v = values_text(n, values);
  raise("ValueError", std::string(kernel) + ": grid." + axis + " = " + expr + " = " + std::to_string(value) +
                          " exceeds the CUDA limit of " + std::to_string(limit) + (v.empty() ? "" : " (" + v + ")"));
}

void fail_workspace_size(const char* kernel, const char* name, const char* expr, int64_t elements, int64_t most, int n,
                         const Named* values) {
  raise("ValueError", std::string(kernel) + ": workspace " + name + " needs " + expr + " = " + std::to_string(elements) +
                          " elements, expected 0 to " + std::to_string(most) + " (" + values_text(n, values) + ")");
}

void make_array(TVMFFIObjectHandle* handles, int n, TVMFFIAny* result) {
  static TVMFFIObjectHandle make = [] {
    TVMFFIObjectHandle f = nullptr;
    const TVMFFIByteArray name{"ffi.Array", 9};
    if (TVMFFIFunctionGetGlobal(&name, &f) != 0 || f == nullptr) raise("RuntimeError", "tlx launcher: TVM-FFI has no ffi.Array");
    return f;
  }();
  std::vector<TVMFFIAny> items(n);
  for (int i = 0; i < n; ++i) {
    items[i] = TVMFFIAny{};
    items[i].type_index = kTVMFFITensor;
    items[i].v_obj = static_cast<TVMFFIObject*>(handles[i]);
  }
  if (TVMFFIFunctionCall(make, items.data(), n, result) != 0) throw Raised{};
}

const OutputFactory* g_output_factory = nullptr;

// ---- CUDA driver, resolved at first use ------------------------------------------------------
namespace {

struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, CUfunction_attribute, int);
  CUresult (*cuLaunchKernelEx)(const CUlaunchConfig*, CUfunction, void**, void**);
  CUresult (*cuTensorMapEncodeTiled)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*, const cuuint64_t*,
                                     const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave, CUtensorMapSwizzle,
                                     CUtensorMapL2promotion, CUtensorMapFloatOOBfill);
  CUresult (*cuGetErrorString)(CUresult, const char**);

  static const Driver& get() {
    static Driver d = load();
    return d;
  }

 private:
  static Driver load() {
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    if (!lib) raise("RuntimeError", std::string("tlx launcher: cannot load the CUDA driver (libcuda.so.1): ") + dlerror());
    Driver d{};
    auto sym = [&](const char* name) {
      void* p = dlsym(lib, name);
      if (!p) raise("RuntimeError", std::string("tlx launcher: the CUDA driver lacks ") + name);
      return p;
    };
    d.cuInit = reinterpret_cast<decltype(d.cuInit)>(sym("cuInit"));
    d.cuDeviceGet = reinterpret_cast<decltype(d.cuDeviceGet)>(sym("cuDeviceGet"));
    d.cuDevicePrimaryCtxRetain = reinterpret_cast<decltype(d.cuDevicePrimaryCtxRetain)>(sym("cuDevicePrimaryCtxRetain"));
    d.cuCtxGetCurrent = reinterpret_cast<decltype(d.cuCtxGetCurrent)>(sym("cuCtxGetCurrent"));
    d.cuCtxSetCurrent = reinterpret_cast<decltype(d.cuCtxSetCurrent)>(sym("cuCtxSetCurrent"));
    d.cuModuleLoadData = reinterpret_cast<decltype(d.cuModuleLoadData)>(sym("cuModuleLoadData"));
    d.cuModuleGetFunction = reinterpret_cast<decltype(d.cuModuleGetFunction)>(sym("cuModuleGetFunction"));
    d.cuFuncSetAttribute = reinterpret_cast<decltype(d.cuFuncSetAttribute)>(sym("cuFuncSetAttribute"));
    d.cuLaunchKernelEx = reinterpret_cast<decltype(d.cuLaunchKernelEx)>(sym("cuLaunchKernelEx"));
    d.cuTensorMapEncodeTiled = reinterpret_cast<decltype(d.cuTensorMapEncodeTiled)>(sym("cuTensorMapEncodeTiled"));
    d.cuGetErrorString = reinterpret_cast<decltype(d.cuGetErrorString)>(sym("cuGetErrorString"));
    return d;
  }
};

void check_cu(CUresult r, const char* kernel, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* s = "unknown error";
  Driver::get().cuGetErrorString(r, &s);
  raise("RuntimeError", std::string(kernel) + ": " + what + " failed: " + s + " (CUresult " + std::to_string(static_cast<int>(r)) + ")");
}

std::mutex g_load_mutex;

}  // namespace

void load_kernels(const char* kernel, int device_id, const char* image, const char* const* names, const int64_t* static_smem, int n,
                  LoadedKernels& d) {
  std::lock_guard<std::mutex> lock(g_load_mutex);
  if (d.ready) return;
  const Driver& drv = Driver::get();
  check_cu(drv.cuInit(0), kernel, "cuInit");
  CUdevice dev;
  check_cu(drv.cuDeviceGet(&dev, device_id), kernel, "cuDeviceGet");
  check_cu(drv.cuDevicePrimaryCtxRetain(&d.ctx, dev), kernel, "cuDevicePrimaryCtxRetain");
  CUcontext prev = nullptr;
  drv.cuCtxGetCurrent(&prev);
  check_cu(drv.cuCtxSetCurrent(d.ctx), kernel, "cuCtxSetCurrent");
  CUmodule mod;
  check_cu(drv.cuModuleLoadData(&mod, image), kernel, "loading the kernel image (cuModuleLoadData)");
  for (int k = 0; k < n; ++k) {
    check_cu(drv.cuModuleGetFunction(&d.fn[k], mod, names[k]), kernel, "cuModuleGetFunction");
    // Without opting in, a launch may use 48 KB of shared memory in all, the kernel's static
    // shared memory (e.g. its mbarriers) included: so every dynamic size is set explicitly.
    d.smem_limit[k] = 0;
    if (static_smem[k] > 0) {
      check_cu(drv.cuFuncSetAttribute(d.fn[k], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(static_smem[k])),
               kernel, "raising the dynamic shared-memory limit");
      d.smem_limit[k] = static_smem[k];
    }
  }
  if (prev) drv.cuCtxSetCurrent(prev);
  d.ready = true;
}

void make_current(const char* kernel, CUcontext ctx) {
  const Driver& drv = Driver::get();
  CUcontext cur = nullptr;
  drv.cuCtxGetCurrent(&cur);
  if (__builtin_expect(cur != ctx, 0)) check_cu(drv.cuCtxSetCurrent(ctx), kernel, "cuCtxSetCurrent");
}

void set_smem_limit(const char* kernel, CUfunction fn, int64_t bytes) {
  check_cu(Driver::get().cuFuncSetAttribute(fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, static_cast<int>(bytes)), kernel,
           "raising the dynamic shared-memory limit");
}

void encode_tensor_map(const char* kernel, const char* tensor, CUtensorMap* map, int rank, CUtensorMapDataType type, void* addr,
                       const cuuint64_t* gdim, const cuuint64_t* gstride, const cuuint32_t* box, const cuuint32_t* estride,
                       CUtensorMapInterleave interleave, CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                       CUtensorMapFloatOOBfill oob) {
  for (int i = 1; i < rank; ++i) {
    if (gstride[i] % 16 != 0) {
      raise("ValueError", std::string(kernel) + ": argument " + tensor + " has a row stride of " + std::to_string(gstride[i]) +
                              " bytes in dimension " + std::to_string(rank - 1 - i) +
                              "; the kernel's TMA copies need every stride to be a multiple of 16 bytes");
    }
  }
  check_cu(Driver::get().cuTensorMapEncodeTiled(map, type, rank, addr, gdim, gstride + 1, box, estride, interleave, swizzle, l2, oob),
           kernel, (std::string("encoding the TMA descriptor of ") + tensor).c_str());
}

void launch(const char* kernel, CUfunction fn, int64_t gx, int64_t gy, int64_t gz, int64_t bx, int64_t by, int64_t bz, int64_t smem,
            CUstream stream, void** params, const unsigned (*cluster)[3], bool cooperative, bool pdl) {
  CUlaunchConfig cfg{};
  cfg.gridDimX = static_cast<unsigned>(gx);
  cfg.gridDimY = static_cast<unsigned>(gy);
  cfg.gridDimZ = static_cast<unsigned>(gz);
  cfg.blockDimX = static_cast<unsigned>(bx);
  cfg.blockDimY = static_cast<unsigned>(by);
  cfg.blockDimZ = static_cast<unsigned>(bz);
  cfg.sharedMemBytes = static_cast<unsigned>(smem);
  cfg.hStream = stream;
  CUlaunchAttribute attrs[3];
  unsigned n = 0;
  if (cluster) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attrs[n].value.clusterDim.x = (*cluster)[0];
    attrs[n].value.clusterDim.y = (*cluster)[1];
    attrs[n].value.clusterDim.z = (*cluster)[2];
    ++n;
  }
  if (cooperative) {
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attrs[n].value.cooperative = 1;
    ++n;
  }
  if (pdl) {  // T.pdl_sync(): may start while the stream's previous grid drains (griddepcontrol.wait orders it)
    attrs[n].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attrs[n].value.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = n ? attrs : nullptr;
  cfg.numAttrs = n;
  CUresult r = Driver::get().cuLaunchKernelEx(&cfg, fn, params, nullptr);
  if (__builtin_expect(r != CUDA_SUCCESS, 0)) check_cu(r, kernel, "cuLaunchKernelEx");
}

}  // namespace tlx

#pragma GCC visibility pop

// TVM-FFI entry of every launcher library: tvm_ffi.load_module(lib).tlx_bind_output_factory(address)
// binds the OutputFactory at `address` (a process-lifetime table) to this library's allocating
// calls; 0 unbinds it (outputs from TVM-FFI's environment allocator again).
extern "C" __attribute__((visibility("default"))) int __tvm_ffi_tlx_bind_output_factory(void*, const TVMFFIAny* args, int32_t num_args,
                                                                                       TVMFFIAny* result) {
  result->type_index = kTVMFFINone;
  result->v_int64 = 0;
  if (num_args != 1 || args[0].type_index != kTVMFFIInt) {
    TVMFFIErrorSetRaisedFromCStr("TypeError", "tlx_bind_output_factory(address: int): expected one integer");
    return -1;
  }
  __atomic_store_n(&tlx::g_output_factory, reinterpret_cast<const tlx::OutputFactory*>(args[0].v_int64), __ATOMIC_RELEASE);
  return 0;
}

