// pop_records: a ring's records read in one C call (ring_records.cc).
#ifndef TRITON_MP_IPC_NATIVE_RING_RECORDS_H_
#define TRITON_MP_IPC_NATIVE_RING_RECORDS_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace triton_mp::decoder {

// pop_records(ring, capacity, fallback) -> list (METH_FASTCALL; ring_records.cc).
PyObject* PopRecords(PyObject* module, PyObject* const* args, Py_ssize_t nargs);

}  // namespace triton_mp::decoder

#endif  // TRITON_MP_IPC_NATIVE_RING_RECORDS_H_
