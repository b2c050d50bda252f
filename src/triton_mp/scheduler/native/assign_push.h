// The batch writer's entry points (assign_push.cc), registered in the module table
// of the triton_mp.scheduler._queue_records extension (queue_records.cc). No shared-memory
// layout here (assign_push.cc names the ring's and the record's).
#ifndef TRITON_MP_SCHEDULER_NATIVE_ASSIGN_PUSH_H_
#define TRITON_MP_SCHEDULER_NATIVE_ASSIGN_PUSH_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

// push_assign(ring_buf, assign) -> bool.
PyObject* TritonMpPushAssign(PyObject* module, PyObject* const* args, Py_ssize_t nargs);

// batch_forms(items) -> (requests, wire forms) | None.
PyObject* TritonMpBatchForms(PyObject* module, PyObject* const* args, Py_ssize_t nargs);

// configure_assign(BatchAssign, tag, Queued, RequestRecord).
PyObject* TritonMpConfigureAssign(PyObject* module, PyObject* const* args, Py_ssize_t nargs);

#endif  // TRITON_MP_SCHEDULER_NATIVE_ASSIGN_PUSH_H_
