// torch's call path into a launcher entry (tlx/torch_bridge.py): a Python callable that takes
// the same arguments as the entry's tvm_ffi.Function and calls the entry's C symbol directly.
//
// TVM-FFI's Python binding turns each torch tensor argument into an owned DLPack tensor and
// then an ffi.Tensor (two heap objects made and freed per tensor and call), and each returned
// Python object into an opaque object and back. This path hands the launcher stack DLTensors
// that torch fills in place (the DLPack exchange API's dltensor_from_py_object_no_sync: the
// tensors stay alive in the caller's arguments for the call) and takes a returned Python object
// out of its opaque cell. Every other detail is TVM-FFI's: the current torch stream is set as
// the TVM-FFI environment stream of the first non-CPU tensor's device for the call, and torch's
// allocator as the environment's tensor allocator; the GIL is released or kept as the
// Function's release_gil says; an error is raised as the Python exception its kind names, with
// its message.
//
// Anything else (a tensor subclass, an int that is not exactly int, more than kMaxArgs
// arguments, a tensor torch cannot describe in place) takes the whole call through the
// Function itself, so the two paths never disagree on what they accept.
#include <dlpack/dlpack.h>
#include <tvm/ffi/c_api.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <cstdint>
#include <string>

#include "tlx_torch_bridge.h"

thread_local bool tlx_python::g_takes_object = false;

namespace {

using tlx_python::py_type;

constexpr int kMaxArgs = 64;
constexpr const char* kCapsuleName = "tlx.torch_call";

struct Entry {
  TVMFFISafeCallType symbol;       // the launcher's exported entry (__tvm_ffi_NAME)
  PyObject* function;              // its tvm_ffi.Function: the path for everything else
  PyObject* tensor_type;           // torch.Tensor
  const DLPackExchangeAPI* torch;  // torch's DLPack exchange API
  bool release_gil;
};

PyObject* through_function(const Entry& e, PyObject* const* args, Py_ssize_t nargs) {
  PyObject* tuple = PyTuple_New(nargs);
  if (tuple == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    Py_IncRef(args[i]);
    PyTuple_SetItem(tuple, i, args[i]);
  }
  PyObject* out = PyObject_Call(e.function, tuple, nullptr);
  Py_DecRef(tuple);
  return out;
}

// The builtin exception class named `kind` (ValueError, TypeError, ...), else RuntimeError:
// what TVM-FFI's Python binding raises for the kinds the launchers and allocators use.
PyObject* exception_type(const std::string& kind) {
  PyObject* builtins = PyImport_ImportModule("builtins");
  PyObject* type = builtins ? PyObject_GetAttrString(builtins, kind.c_str()) : nullptr;
  if (builtins) Py_DecRef(builtins);
  if (type != nullptr && PyObject_IsSubclass(type, PyExc_Exception) == 1) return type;
  PyErr_Clear();
  if (type) Py_DecRef(type);
  Py_IncRef(PyExc_RuntimeError);
  return PyExc_RuntimeError;
}

PyObject* raise_error(int rc) {
  if (rc == -2 && PyErr_Occurred()) return nullptr;  // a Python error is already set
  TVMFFIObjectHandle error = nullptr;
  TVMFFIErrorMoveFromRaised(&error);
  if (error == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "tlx launcher: a call failed without an error");
    return nullptr;
  }
  const TVMFFIErrorCell* cell = TVMFFIErrorGetCellPtr(error);
  const std::string kind(cell->kind.data, cell->kind.size), message(cell->message.data, cell->message.size);
  TVMFFIObjectDecRef(error);
  PyObject* type = exception_type(kind);
  PyErr_SetString(type, message.c_str());
  Py_DecRef(type);
  return nullptr;
}

// The entry's result as a Python object: None, or the Python object an output factory handed
// over (the only results of the entries this path is made for).
PyObject* to_python(TVMFFIAny& result) {
  if (result.type_index == kTVMFFINone) {
    Py_IncRef(tlx_python::none());
    return tlx_python::none();
  }
  if (result.type_index == kTVMFFIOpaquePtr) return static_cast<PyObject*>(result.v_ptr);  // g_takes_object: ours
  if (result.type_index == kTVMFFIOpaquePyObject) {
    PyObject* object = static_cast<PyObject*>(TVMFFIOpaqueObjectGetCellPtr(result.v_obj)->handle);
    Py_IncRef(object);
    TVMFFIObjectDecRef(result.v_obj);
    return object;
  }
  if (result.type_index >= kTVMFFIStaticObjectBegin) TVMFFIObjectDecRef(result.v_obj);
  PyErr_SetString(PyExc_RuntimeError, "tlx launcher: torch's call path got a result other than None or a Python object");
  return nullptr;
}

PyObject* call(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  const Entry& e = *static_cast<const Entry*>(PyCapsule_GetPointer(self, kCapsuleName));
  if (nargs > kMaxArgs) return through_function(e, args, nargs);
  TVMFFIAny packed[kMaxArgs];
  DLTensor tensors[kMaxArgs];
  DLDevice stream_device{kDLCPU, 0};
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    PyObject* a = args[i];
    PyObject* type = py_type(a);
    TVMFFIAny& p = packed[i];
    p.zero_padding = 0;
    if (type == e.tensor_type) {
      if (e.torch->dltensor_from_py_object_no_sync(a, &tensors[i]) != 0) {
        PyErr_Clear();
        return through_function(e, args, nargs);
      }
      p.type_index = kTVMFFIDLTensorPtr;
      p.v_ptr = &tensors[i];
      if (stream_device.device_type == kDLCPU) stream_device = tensors[i].device;
    } else if (type == tlx_python::type_object(PyBool_Type)) {
      p.type_index = kTVMFFIBool;
      p.v_int64 = a == tlx_python::true_object();
    } else if (type == tlx_python::type_object(PyLong_Type)) {
      p.type_index = kTVMFFIInt;
      p.v_int64 = PyLong_AsLongLong(a);
      if (p.v_int64 == -1 && PyErr_Occurred()) {  // past int64: TVM-FFI's binding says so
        PyErr_Clear();
        return through_function(e, args, nargs);
      }
    } else if (type == tlx_python::type_object(PyFloat_Type)) {
      p.type_index = kTVMFFIFloat;
      p.v_float64 = PyFloat_AsDouble(a);
    } else {
      return through_function(e, args, nargs);
    }
  }
  const bool on_stream = stream_device.device_type != kDLCPU;
  TVMFFIStreamHandle stream = nullptr, previous_stream = nullptr;
  if (on_stream) {
    if (e.torch->current_work_stream(stream_device.device_type, stream_device.device_id, &stream) != 0) {
      PyErr_Clear();
      return through_function(e, args, nargs);
    }
    TVMFFIEnvSetStream(stream_device.device_type, stream_device.device_id, stream, &previous_stream);
  }
  // torch's allocator for what the entry allocates through TVM-FFI's environment (workspaces,
  // outputs without the factory), as TVM-FFI's binding sets it for a call with torch tensors.
  DLPackManagedTensorAllocator previous_allocator = nullptr;
  TVMFFIEnvSetDLPackManagedTensorAllocator(e.torch->managed_tensor_allocator, 0, &previous_allocator);
  TVMFFIAny result;
  result.type_index = kTVMFFINone;
  result.zero_padding = 0;
  result.v_int64 = 0;
  void* thread = e.release_gil ? PyEval_SaveThread() : nullptr;
  tlx_python::g_takes_object = thread == nullptr;
  const int rc = e.symbol(nullptr, packed, static_cast<int32_t>(nargs), &result);
  tlx_python::g_takes_object = false;
  if (thread) PyEval_RestoreThread(thread);
  if (previous_allocator != e.torch->managed_tensor_allocator) TVMFFIEnvSetDLPackManagedTensorAllocator(previous_allocator, 0, nullptr);
  if (on_stream && previous_stream != stream) TVMFFIEnvSetStream(stream_device.device_type, stream_device.device_id, previous_stream, nullptr);
  return rc == 0 ? to_python(result) : raise_error(rc);
}

void destroy(PyObject* capsule) {
  auto* e = static_cast<Entry*>(PyCapsule_GetPointer(capsule, kCapsuleName));
  Py_DecRef(e->function);
  Py_DecRef(e->tensor_type);
  delete e;
}

PyMethodDef kCall{"tlx_torch_call", call, METH_FASTCALL, "a launcher entry called with torch tensors"};

}  // namespace

// The callable for the entry `symbol` (its tvm_ffi.Function `function`); None when torch's
// exchange API lacks what this path uses (DLPack 1.x with in-place DLTensors and the current
// stream), nullptr with a Python error set on failure. Called through ctypes.PyDLL (GIL held).
extern "C" __attribute__((visibility("default"))) PyObject* tlx_torch_call_new(void* symbol, PyObject* function, PyObject* tensor_type,
                                                                               const void* torch_api, int release_gil) {
  const auto* api = static_cast<const DLPackExchangeAPI*>(torch_api);
  if (api == nullptr || api->header.version.major != DLPACK_MAJOR_VERSION || api->dltensor_from_py_object_no_sync == nullptr ||
      api->current_work_stream == nullptr) {
    Py_IncRef(tlx_python::none());
    return tlx_python::none();
  }
  auto* e = new Entry{reinterpret_cast<TVMFFISafeCallType>(symbol), function, tensor_type, api, release_gil != 0};
  Py_IncRef(function);
  Py_IncRef(tensor_type);
  PyObject* capsule = PyCapsule_New(e, kCapsuleName, destroy);
  if (capsule == nullptr) {
    Py_DecRef(function);
    Py_DecRef(tensor_type);
    delete e;
    return nullptr;
  }
  PyObject* callable = PyCFunction_NewEx(&kCall, capsule, nullptr);
  Py_DecRef(capsule);  // the callable holds it
  return callable;
}
