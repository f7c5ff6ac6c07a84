// What the two files of the torch bridge library (tlx_torch_outputs.cc, tlx_torch_call.cc) share:
// CPython's functions, declared here from its stable C ABI (the library then builds without
// Python development headers, which a machine with torch may lack; only for a CPython with the
// GIL, which tlx/torch_bridge.py checks: py_type reads PyObject's header as laid out there),
// and the flag by which torch's call path takes the outputs directly.
#pragma once

#include <cstddef>

extern "C" {
typedef struct _object PyObject;
typedef std::ptrdiff_t Py_ssize_t;
typedef PyObject* (*PyCFunctionFast)(PyObject* self, PyObject* const* args, Py_ssize_t nargs);
struct PyMethodDef {
  const char* ml_name;
  PyCFunctionFast ml_meth;
  int ml_flags;
  const char* ml_doc;
};
constexpr int METH_FASTCALL = 0x0080;

int PyGILState_Ensure(void);  // returns a PyGILState_STATE, an int-sized enum
void PyGILState_Release(int state);
void* PyEval_SaveThread(void);  // returns the PyThreadState*
void PyEval_RestoreThread(void* state);
void Py_IncRef(PyObject* object);
void Py_DecRef(PyObject* object);
PyObject* PyTuple_New(Py_ssize_t size);
int PyTuple_SetItem(PyObject* tuple, Py_ssize_t index, PyObject* item);  // steals `item`
PyObject* PyObject_Call(PyObject* callable, PyObject* args, PyObject* kwargs);
PyObject* PyObject_GetAttrString(PyObject* object, const char* name);
PyObject* PyImport_ImportModule(const char* name);
int PyObject_IsSubclass(PyObject* derived, PyObject* cls);
PyObject* PyCFunction_NewEx(PyMethodDef* method, PyObject* self, PyObject* module);
PyObject* PyCapsule_New(void* pointer, const char* name, void (*destructor)(PyObject*));
void* PyCapsule_GetPointer(PyObject* capsule, const char* name);
long long PyLong_AsLongLong(PyObject* object);
double PyFloat_AsDouble(PyObject* object);
PyObject* PyErr_Occurred(void);
void PyErr_Clear(void);
void PyErr_SetString(PyObject* type, const char* message);
extern PyObject* PyExc_RuntimeError;
extern PyObject* PyExc_Exception;
extern char PyLong_Type[], PyFloat_Type[], PyBool_Type[];  // type objects: only their addresses are used
extern char _Py_NoneStruct[], _Py_TrueStruct[];
}

namespace tlx_python {
// Py_TYPE: a PyObject starts with its reference count, then its type.
inline PyObject* py_type(PyObject* object) { return reinterpret_cast<PyObject* const*>(object)[1]; }
inline PyObject* none() { return reinterpret_cast<PyObject*>(_Py_NoneStruct); }
inline PyObject* true_object() { return reinterpret_cast<PyObject*>(_Py_TrueStruct); }
inline PyObject* type_object(char* type) { return reinterpret_cast<PyObject*>(type); }

// Set by torch's call path around a call that keeps the GIL: the output factory then hands the
// outputs over as a kTVMFFIOpaquePtr to a new reference (no TVM-FFI opaque object around it,
// no GIL to take), which the call path returns as it is.
extern thread_local bool g_takes_object;
}  // namespace tlx_python
