// One owned reference to a Python object (RAII), shared by the compiled helpers that build
// Python objects: the request decoder (ipc/native/request_decoder.cc) and the workers' answer
// writer (workers/native/answer_writer.cc). No shared-memory layout here.
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

}  // namespace triton_mp

#endif  // TRITON_MP_IPC_NATIVE_PY_REF_H_
