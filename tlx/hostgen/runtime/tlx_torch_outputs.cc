// torch's OutputFactory (tlx_launcher.h) for the launchers' allocating calls: each output is one
// empty tensor from torch's caching allocator (current stream), handed to Python as that same
// tensor (THPVariable_Wrap). Through TVM-FFI's environment allocator the same output costs a
// second torch tensor (a from_blob view built when the returned ffi.Tensor is converted back)
// and a TVM-FFI tensor between the two, each made and destroyed on every call.
//
// The tensor is made by at::detail::empty_cuda (empty_cpu for CPU tensors), what at::empty
// runs once torch's dispatcher has chosen the backend: the dispatcher's round trip costs more
// than the allocation itself (0.61 against 0.18 us per empty-and-free on a CPU tensor, measured
// on the development machine). What at::empty adds there, the NaN fill of new memory under
// torch.use_deterministic_algorithms with fill_uninitialized_memory, is kept: at::empty runs then.
//
// Built once per machine and torch build against torch's headers (tlx/torch_outputs.py),
// loaded into the process that imported torch; the launchers themselves stay torch-free and get
// this table's address through their tlx_bind_output_factory entry.
// TVM-FFI's DLPack header first: ATen's (same include guard) is then skipped, and TVM-FFI's is
// the newer one that tlx_launcher.h needs.
#include "tlx_launcher.h"

#include <ATen/Context.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty_ops.h>
#if TLX_TORCH_CUDA
#include <ATen/cuda/EmptyTensor.h>
#endif

#include <exception>
#include <memory>
#include <stdexcept>

#include "tlx_torch_bridge.h"

// torch's DLPack dtype conversion (ATen/DLConvertor.h, whose includes take seconds to compile).
namespace at {
ScalarType toScalarType(const DLDataType& dtype);
}
PyObject* THPVariable_Wrap(const at::TensorBase& var);  // torch/csrc/autograd/python_variable.h

namespace {

// An output until it is handed over: the tensor, and the DLTensor the launch reads it through.
struct Held {
  at::Tensor tensor;
  DLTensor view;
};

// at::empty (ATen/ops/empty.h, seconds to compile): the operator through torch's dispatcher.
at::Tensor empty_through_dispatcher(at::IntArrayRef shape, at::ScalarType dtype, at::Device device) {
  return at::_ops::empty_memory_format::call(c10::fromIntArrayRefSlow(shape), dtype, std::nullopt, device, std::nullopt, std::nullopt);
}

// A contiguous tensor like `prototype`, on its device (a CUDA device, or the CPU).
at::Tensor empty(const DLTensor* prototype) {
  const at::IntArrayRef shape(prototype->shape, prototype->ndim);
  const at::ScalarType dtype = at::toScalarType(prototype->dtype);
  const DLDevice d = prototype->device;
  const at::Device device = d.device_type == kDLCUDA ? at::Device(at::kCUDA, static_cast<c10::DeviceIndex>(d.device_id))
                                                     : at::Device(at::kCPU);
  at::Context& context = at::globalContext();
  if (__builtin_expect(context.deterministicAlgorithms() && context.deterministicFillUninitializedMemory(), 0)) {
    return empty_through_dispatcher(shape, dtype, device);
  }
#if TLX_TORCH_CUDA
  if (device.is_cuda()) return at::detail::empty_cuda(shape, dtype, device, std::nullopt);
#endif
  if (device.is_cpu()) return at::detail::empty_cpu(shape, dtype, /*pin_memory=*/false, std::nullopt);
  return empty_through_dispatcher(shape, dtype, device);  // raises: this torch has no CUDA
}

void* allocate(const DLTensor* prototype, const DLTensor** view) {
  try {
    const DLDevice d = prototype->device;
    auto* held = new Held{empty(prototype), DLTensor{}};
    DLTensor& v = held->view;
    v.data = held->tensor.data_ptr();
    v.device = d;
    v.ndim = prototype->ndim;
    v.dtype = prototype->dtype;
    v.shape = const_cast<int64_t*>(held->tensor.sizes().data());
    v.strides = const_cast<int64_t*>(held->tensor.strides().data());
    v.byte_offset = 0;
    *view = &held->view;
    return held;
  } catch (const std::exception& e) {
    TVMFFIErrorSetRaisedFromCStr("MemoryError", e.what());  // what TVM-FFI's environment allocator raises
    return nullptr;
  }
}

void release(void* handle) { delete static_cast<Held*>(handle); }

// The opaque object's deleter: TVM-FFI frees it from Python, but take the GIL in any case.
void decref(void* object) {
  const int gil = PyGILState_Ensure();
  Py_DecRef(static_cast<PyObject*>(object));
  PyGILState_Release(gil);
}

// The torch tensor of an output as a new Python reference (nullptr with a Python error set);
// consumes the handle, also when it throws.
PyObject* wrap(void* handle) {
  std::unique_ptr<Held> held(static_cast<Held*>(handle));
  return THPVariable_Wrap(held->tensor);
}

int hand_over(void* const* handles, int n, TVMFFIAny* result) {
  const bool direct = tlx_python::g_takes_object;
  const int gil = direct ? 0 : PyGILState_Ensure();
  PyObject* out = n == 1 ? nullptr : PyTuple_New(n);
  int next = 0;  // handles[next:] are not consumed yet
  if (n == 1 || out != nullptr) {
    try {
      for (; next < n; ++next) {
        PyObject* item = wrap(handles[next]);
        if (item == nullptr) throw std::runtime_error("THPVariable_Wrap failed");
        if (n == 1) {
          out = item;
        } else {
          PyTuple_SetItem(out, next, item);
        }
      }
    } catch (const std::exception&) {
      ++next;  // wrap consumed handles[next]
      if (out != nullptr) Py_DecRef(out);
      out = nullptr;
    }
  }
  for (; next < n; ++next) release(handles[next]);
  TVMFFIObjectHandle opaque = nullptr;
  int rc = 0;
  if (out == nullptr) {
    PyErr_Clear();
    TVMFFIErrorSetRaisedFromCStr("RuntimeError", "tlx launcher: wrapping the outputs as torch tensors failed");
    rc = -1;
  } else if (direct) {
    result->type_index = kTVMFFIOpaquePtr;
    result->v_ptr = out;
  } else if (TVMFFIObjectCreateOpaque(out, kTVMFFIOpaquePyObject, decref, &opaque) != 0) {
    Py_DecRef(out);
    rc = -1;  // TVM-FFI has set the error
  } else {
    result->type_index = kTVMFFIOpaquePyObject;
    result->v_obj = static_cast<TVMFFIObject*>(opaque);
  }
  if (!direct) PyGILState_Release(gil);
  return rc;
}

const tlx::OutputFactory kTorchOutputs{allocate, hand_over, release};

}  // namespace

// The table's address, for tlx_bind_output_factory.
extern "C" __attribute__((visibility("default"))) const tlx::OutputFactory* tlx_torch_output_factory() { return &kTorchOutputs; }
