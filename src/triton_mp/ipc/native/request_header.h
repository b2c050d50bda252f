// The scheduler's half of the REQUEST record reader (request_decoder.cc), for the ring drain
// (ring_records.cc) in the same extension, triton_mp.ipc._request_decoder.
//
// Python twin: HeaderReader.read in src/triton_mp/ipc/recordio/request_records.py.
#ifndef TRITON_MP_IPC_NATIVE_REQUEST_HEADER_H_
#define TRITON_MP_IPC_NATIVE_REQUEST_HEADER_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstddef>
#include <cstdint>

namespace triton_mp::decoder {

// Whether configure() and configure_header() ran (the classes ReadRequestHeader builds).
bool HeaderConfigured();

// The RequestRecord of a REQUEST record of `size` bytes at `data`: a new reference; None (a
// new reference) for a form Python reads (a string sequence id, a trace level, a tail outside
// the record, another version or kind; a tail inside it stays in the record's bytes);
// nullptr with a Python error set for a malformed record or a failed allocation.
PyObject* ReadRequestHeader(const uint8_t* data, size_t size);

}  // namespace triton_mp::decoder

#endif  // TRITON_MP_IPC_NATIVE_REQUEST_HEADER_H_
