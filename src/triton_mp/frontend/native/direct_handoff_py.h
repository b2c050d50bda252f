// _native.direct_* and known_teach_route: the Python binding of the process's DirectHandoff
// (direct_handoff.h). Python twin and caller: frontend/dispatch/direct.py (DirectRoutes opens
// and closes the routes), frontend/native/known_teach.py (a lesson's version routes).
#ifndef TRITON_MP_FRONTEND_NATIVE_DIRECT_HANDOFF_PY_H_
#define TRITON_MP_FRONTEND_NATIVE_DIRECT_HANDOFF_PY_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace triton_mp {

// Adds the functions to the module (at its init). False: a Python error is set.
bool AddDirectHandoff(PyObject* module);

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_DIRECT_HANDOFF_PY_H_
