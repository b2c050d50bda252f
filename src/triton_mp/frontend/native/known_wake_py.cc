// _native.known_wake_* (known_wake_py.h). Every function runs with the GIL held.
#include "known_wake_py.h"

#include <cstdint>

#include "known_wake.h"

namespace triton_mp {

namespace {

// known_wake_join(bits, rows, first_ns, mask, allowance, floor_ns) -> bool: Allowance.join
// in the process's one allowance (the gRPC thread's pushes count in it too).
PyObject* Join(PyObject*, PyObject* args) {
  unsigned long long bits, rows, first_ns;
  FormingWords words;
  unsigned long long mask, allowance, floor_ns;
  if (!PyArg_ParseTuple(args, "KKKKKK", &bits, &rows, &first_ns, &mask, &allowance, &floor_ns)) {
    return nullptr;
  }
  words.mask = mask;
  words.allowance = allowance;
  words.floor_ns = floor_ns;
  return PyBool_FromLong(TheKnownWake().Join(bits, rows, first_ns, words));
}

// known_wake_posts() -> int: the scheduler's wake-ups posted by the process's KnownWake.
PyObject* Posts(PyObject*, PyObject*) {
  return PyLong_FromUnsignedLongLong(TheKnownWake().posts());
}

bool U64s(PyObject* item, Py_ssize_t n, uint64_t* out) {
  if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != n) {
    PyErr_SetString(PyExc_ValueError, "a step is a tuple of its kind's ints");
    return false;
  }
  for (Py_ssize_t i = 0; i < n; ++i) {
    out[i] = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(item, i));
    if (PyErr_Occurred()) return false;
  }
  return true;
}

// known_wake_replay(steps) -> list[bool]: HeldWakes' rule on a fresh allowance, step by step:
// (0, bit, rows, arrival_ns) a push held; (1, quiet, mask, allowance, floor_ns) the held batch
// ends with these words read: whether it wakes; (2, bits, rows, first_ns, mask, allowance,
// floor_ns) Allowance.join alone: whether it joins. One bool per step of kind 1 or 2.
PyObject* Replay(PyObject*, PyObject* steps) {
  PyObject* seq = PySequence_Fast(steps, "steps must be a sequence of tuples");
  if (seq == nullptr) return nullptr;
  PyObject* out = PyList_New(0);
  FormingAllowance allowance;
  HeldPushes held;
  bool ok = out != nullptr;
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(seq); ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
    uint64_t v[7];
    ok = PyTuple_Check(item) && PyTuple_GET_SIZE(item) > 0 && PyTuple_GET_SIZE(item) <= 7 &&
         U64s(item, PyTuple_GET_SIZE(item), v);
    if (!ok) {
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "an empty step");
      break;
    }
    const Py_ssize_t n = PyTuple_GET_SIZE(item);
    bool answer;
    if (v[0] == 0 && n == 4) {
      held.Add(v[1], v[2], v[3]);
      continue;
    } else if (v[0] == 1 && n == 5) {
      answer = HeldNeedsWake(held, v[1], FormingWords{v[2], v[3], v[4]}, &allowance);
      held = HeldPushes();
    } else if (v[0] == 2 && n == 7) {
      answer = allowance.Join(v[1], v[2], v[3], FormingWords{v[4], v[5], v[6]});
    } else {
      PyErr_SetString(PyExc_ValueError, "an unknown step");
      ok = false;
      break;
    }
    PyObject* b = PyBool_FromLong(answer);
    ok = PyList_Append(out, b) == 0;
    Py_DECREF(b);
  }
  Py_DECREF(seq);
  if (!ok) {
    Py_XDECREF(out);
    return nullptr;
  }
  return out;
}

PyMethodDef kFunctions[] = {
    {"known_wake_join", Join, METH_VARARGS, "Allowance.join in the process's allowance."},
    {"known_wake_posts", Posts, METH_NOARGS, "The wake-ups posted so far."},
    {"known_wake_replay", Replay, METH_O, "HeldWakes' rule on a fresh allowance (tests)."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

bool AddKnownWake(PyObject* module) { return PyModule_AddFunctions(module, kFunctions) == 0; }

}  // namespace triton_mp
