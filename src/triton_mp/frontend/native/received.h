// A unary call's ModelInferRequest as Python takes it (module.cc's take() and its tests):
// its split (request_split.h) and its bytes, and when its raw_input_contents are large, a
// _native.Received in place of the bytes: the message left in gRPC's receive slices (no
// copy) while Python decides what the request is. Python twin: frontend/dispatch/
// known_requests.py (InBuffers, write_known), which copies a known request's raw entries
// from the slices straight into its input block (Received.copy_into: one copy, where bytes
// and then the block were two); any other request is made bytes (Received.tobytes) and
// served as before, so every answer and error stays Python's.
#ifndef TRITON_MP_NATIVE_RECEIVED_H_
#define TRITON_MP_NATIVE_RECEIVED_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <grpcpp/grpcpp.h>

#include <cstddef>

#include "request_split.h"

namespace triton_mp {

// A message whose raw entries hold at least this many bytes is taken as a Received.
constexpr size_t kReceivedMinRawBytes = 64 * 1024;

// Adds the Received type to the module (at its init). False: a Python error is set.
bool AddReceivedType(PyObject* module);

// A unary call's request for Python: *data the message (bytes, or a Received: above) and
// *split its split, (head, key, id or None, ((offset, length), ...) of each
// raw_input_contents), or None when declined. False: a Python error is set (nothing made).
bool CallRequestOf(const grpc::ByteBuffer& buffer, PyObject** data, PyObject** split);

// The split of `message` as Python takes it (CallRequestOf's *split); `ok`: SplitInferRequest
// accepted it into `split`.
PyObject* SplitTupleOf(const Chunks& message, bool ok, const RequestSplit& split);

}  // namespace triton_mp

#endif  // TRITON_MP_NATIVE_RECEIVED_H_
