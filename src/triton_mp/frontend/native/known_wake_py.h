// _native.known_wake_*: the Python binding of the process's KnownWake (known_wake.h): the
// forming allowance Python's own pushes count in on the native frontend (HeldWakes with a
// SharedAllowance, frontend/dispatch/wakes.py), and a replay of HeldWakes' rule for the tests that
// check the C++ rule against Python's (tests/unit/test_known_wake.py).
#ifndef TRITON_MP_FRONTEND_NATIVE_KNOWN_WAKE_PY_H_
#define TRITON_MP_FRONTEND_NATIVE_KNOWN_WAKE_PY_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace triton_mp {

// Adds the known_wake_* functions to the module (at its init). False: a Python error is set.
bool AddKnownWake(PyObject* module);

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_KNOWN_WAKE_PY_H_
