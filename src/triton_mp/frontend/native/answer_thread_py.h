// _native.answer_thread_*: the Python binding of the answer thread (answer_thread.h), which
// reads the frontend's inbox in C++ and serves the owned known calls' answers there.
// Python twin and user: frontend/native/answer_thread.py (AnswerQueue).
#ifndef TRITON_MP_FRONTEND_NATIVE_ANSWER_THREAD_PY_H_
#define TRITON_MP_FRONTEND_NATIVE_ANSWER_THREAD_PY_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace triton_mp {

// Stops the answer thread if it runs (joined; GIL held, released while it joins). module.cc
// calls it before the server stops: the thread delivers through the server's handoff.
void StopAnswerThread();

// Adds the answer_thread_* functions to the module (at its init). False: a Python error is set.
bool AddAnswerThread(PyObject* module);

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_ANSWER_THREAD_PY_H_
