// _native.known_*: the Python binding of the process's KnownSubmit (known_submit.h), which the
// native server's completion-queue thread submits known unary calls with. Python twin and
// teacher: frontend/native/known_teach.py (NativeKnown).
#ifndef TRITON_MP_FRONTEND_NATIVE_KNOWN_SUBMIT_PY_H_
#define TRITON_MP_FRONTEND_NATIVE_KNOWN_SUBMIT_PY_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace triton_mp {

// Adds the known_* functions to the module (at its init). False: a Python error is set.
bool AddKnownSubmit(PyObject* module);

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_KNOWN_SUBMIT_PY_H_
