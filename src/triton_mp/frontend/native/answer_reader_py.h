// _native.read_answer: the Python view of answer_reader.h's ReadAnswer (tests compare it with
// msgspec's decode of the same bytes, and fuzz it). Python twin: ipc/recordio/codec.py.
#ifndef TRITON_MP_FRONTEND_NATIVE_ANSWER_READER_PY_H_
#define TRITON_MP_FRONTEND_NATIVE_ANSWER_READER_PY_H_

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace triton_mp {

// Adds read_answer to the module (at its init). False: a Python error is set.
bool AddAnswerReader(PyObject* module);

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_ANSWER_READER_PY_H_
