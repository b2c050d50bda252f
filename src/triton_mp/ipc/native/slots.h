// The object slots of a Python class (names in its __slots__, or a msgspec Struct's fields),
// read and written at the offsets of the class's own member descriptors, found once. Shared
// by the compiled helpers that read the worker's request objects and build the python
// backend's (workers/native/batch_gather.cc, backends/python/native/pb_requests.cc), so that
// each class stays its one Python definition. No shared-memory layout here.
#ifndef TRITON_MP_IPC_NATIVE_SLOTS_H_
#define TRITON_MP_IPC_NATIVE_SLOTS_H_

#include <Python.h>
#include <structmember.h>

#include <cstddef>

namespace triton_mp {

// The offsets of `cls`'s object slots `names` (n of them) into `out`, in that order. False
// with TypeError set when `cls` is no class or a name is not an object slot (T_OBJECT_EX)
// that `cls` itself defines (an inherited or a computed attribute is refused).
inline bool SlotOffsets(PyObject* cls, const char* const* names, size_t n, Py_ssize_t* out) {
  if (!PyType_Check(cls)) {
    PyErr_SetString(PyExc_TypeError, "a class was expected");
    return false;
  }
  for (size_t i = 0; i < n; ++i) {
    PyObject* descr = PyObject_GetAttrString(cls, names[i]);
    if (descr == nullptr) return false;
    const bool member = Py_IS_TYPE(descr, &PyMemberDescr_Type);
    const PyMemberDef* def =
        member ? reinterpret_cast<PyMemberDescrObject*>(descr)->d_member : nullptr;
    const bool own =
        member && reinterpret_cast<PyDescrObject*>(descr)->d_type ==
                      reinterpret_cast<PyTypeObject*>(cls);
    Py_DECREF(descr);  // NOTE: the class keeps its descriptor (and its PyMemberDef)
    if (!own || def->type != T_OBJECT_EX) {
      PyErr_Format(PyExc_TypeError, "%s.%s is not an object slot of its own",
                   reinterpret_cast<PyTypeObject*>(cls)->tp_name, names[i]);
      return false;
    }
    out[i] = def->offset;
  }
  return true;
}

// The slot at `offset` of `obj` (borrowed; nullptr when unset, with no error set).
inline PyObject* SlotGet(PyObject* obj, Py_ssize_t offset) {
  return *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + offset);
}

// Stores `value` (a reference handed over) in the slot at `offset` of `obj`, dropping the
// one it held.
inline void SlotSet(PyObject* obj, Py_ssize_t offset, PyObject* value) {
  PyObject** slot = reinterpret_cast<PyObject**>(reinterpret_cast<char*>(obj) + offset);
  PyObject* old = *slot;
  *slot = value;
  Py_XDECREF(old);
}

}  // namespace triton_mp

#endif  // TRITON_MP_IPC_NATIVE_SLOTS_H_
