// _native.known_answer*: the Python binding of the answer side of known calls
// (known_answer.h, Handoff's owned calls): the inbox's reader for worker answers, the
// teaching of response heads, the release of owned calls to Python, and the counters.
// Python twin and teacher: frontend/native/known_answers.py (NativeAnswers).
#ifndef TRITON_MP_FRONTEND_NATIVE_KNOWN_ANSWER_PY_H_
#define TRITON_MP_FRONTEND_NATIVE_KNOWN_ANSWER_PY_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstddef>

namespace triton_mp {

class Handoff;

// The running native server's handoff (nullptr: none); module.cc. GIL held.
Handoff* ServerHandoff();

// Serves the ring record `data` if it answers owned calls of `h` only and can be served here
// (known_answer.h): the calls are answered (delivered at h's next Kick), their blocks freed,
// the counters moved; true. False: nothing done (Python reads the record). Any thread, no
// GIL needed; `h` must outlive the call.
bool ServeKnownAnswer(Handoff* h, const unsigned char* data, size_t size);

// Adds the known_answer* functions to the module (at its init). False: a Python error is set.
bool AddKnownAnswer(PyObject* module);

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_KNOWN_ANSWER_PY_H_
