// _native.known_regions_*: the Python binding of the process's KnownRegions
// (known_regions.h). Python twin and caller: frontend/native/known_teach.py (NativeKnown:
// the registrations' changes and uses), known_calls.py (KnownCalls.register: the holds of a
// call handed to Python become Python's).
#ifndef TRITON_MP_FRONTEND_NATIVE_KNOWN_REGIONS_PY_H_
#define TRITON_MP_FRONTEND_NATIVE_KNOWN_REGIONS_PY_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace triton_mp {

// Adds the known_regions_* functions to the module (at its init). False: a Python error is
// set.
bool AddKnownRegions(PyObject* module);

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_KNOWN_REGIONS_PY_H_
