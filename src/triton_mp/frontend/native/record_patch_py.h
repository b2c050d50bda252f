// _native.patch_request (record_patch.cc), the binding of PatchRecord (record_patch.h).
#ifndef TRITON_MP_FRONTEND_NATIVE_RECORD_PATCH_PY_H_
#define TRITON_MP_FRONTEND_NATIVE_RECORD_PATCH_PY_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace triton_mp {

// Adds patch_request to the module (at its init). False: a Python error is set.
bool AddRecordPatch(PyObject* module);

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_RECORD_PATCH_PY_H_
