// One owned reference to a Python object (RAII), and Keep() for a module's configured classes,
// shared by the compiled helpers that build Python objects: the request decoder
// (ipc/native/request_decoder.cc), the workers' answer writer and batch gather
// (workers/native/) and the python backend's requests and results (backends/python/native/).
// No shared-memory layout here.
#ifndef TRITON_MP_IPC_NATIVE_PY_REF_H_
#define TRITON_MP_IPC_NATIVE_PY_REF_H_

#include <Python.h>

namespace triton_mp {

// Owns one reference; release() hands it over, reset() drops the old one first.
class Ref {
 public:
  explicit Ref(PyObject* obj = nullptr) : obj_(obj) {}
  Ref(const Ref&) = delete;
  Ref& operator=(const Ref&) = delete;
  ~Ref() { Py_XDECREF(obj_); }
  PyObject* get() const { return obj_; }
  void reset(PyObject* obj) {
    Py_XDECREF(obj_);
    obj_ = obj;
  }
  PyObject* release() {
    PyObject* out = obj_;
    obj_ = nullptr;
    return out;
  }
  explicit operator bool() const { return obj_ != nullptr; }

 private:
  PyObject* obj_;
};

// Holds a new reference to `value` in `*slot` (a class or constant a module's configure() was
// given), dropping the one held before; a second configure() replaces the first.
inline void Keep(PyObject** slot, PyObject* value) { Py_XSETREF(*slot, Py_NewRef(value)); }

// The same for a slot typed as a class.
inline void Keep(PyTypeObject** slot, PyObject* cls) {
  PyObject* old = reinterpret_cast<PyObject*>(*slot);
  *slot = reinterpret_cast<PyTypeObject*>(Py_NewRef(cls));
  Py_XDECREF(old);
}

}  // namespace triton_mp

#endif  // TRITON_MP_IPC_NATIVE_PY_REF_H_
