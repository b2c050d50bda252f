// _native.known_regions_* (known_regions_py.h). Every function runs with the GIL held.
#include "known_regions_py.h"

#include <cstdint>
#include <vector>

#include "known_regions.h"
#include "known_submit.h"

namespace triton_mp {

namespace {

// known_regions_changed(): a registration is about to change: the generation moves and every
// lesson is forgotten; once this returns, no call is submitted by a lesson taught before.
PyObject* Changed(PyObject*, PyObject*) {
  TheKnownRegions().Changed();
  TheKnownSubmit().Clear();  // NOTE: waits for a Submit in progress (its Hold counted)
  Py_RETURN_NONE;
}

// known_regions_generation() -> int: what a lesson taught now is taught at.
PyObject* Generation(PyObject*, PyObject*) {
  return PyLong_FromUnsignedLongLong(TheKnownRegions().generation());
}

// known_regions_uses(region_id) -> int: calls sent natively, not yet answered or handed to
// Python, that name the region.
PyObject* Uses(PyObject*, PyObject* arg) {
  const unsigned long long id = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  return PyLong_FromUnsignedLongLong(TheKnownRegions().Uses(id));
}

// known_regions_release(held): a call's holds (region ids, as taught) end here (Python holds
// them from now on, or the call is over).
PyObject* Release(PyObject*, PyObject* held) {
  PyObject* seq = PySequence_Fast(held, "held must be a sequence of ints");
  if (seq == nullptr) return nullptr;
  std::vector<uint64_t> ids;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    ids.push_back(PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i)));
  }
  Py_DECREF(seq);
  if (PyErr_Occurred()) return nullptr;
  TheKnownRegions().Release(ids);
  Py_RETURN_NONE;
}

// known_regions_held() -> int: every use counted (the sum over regions).
PyObject* Held(PyObject*, PyObject*) {
  return PyLong_FromUnsignedLongLong(TheKnownRegions().held());
}

PyMethodDef kFunctions[] = {
    {"known_regions_changed", Changed, METH_NOARGS, "A registration changes: forget lessons."},
    {"known_regions_generation", Generation, METH_NOARGS, "The generation lessons are taught at."},
    {"known_regions_uses", Uses, METH_O, "Native calls in flight naming this region id."},
    {"known_regions_release", Release, METH_O, "End these holds (region ids) here."},
    {"known_regions_held", Held, METH_NOARGS, "Every hold counted here."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

bool AddKnownRegions(PyObject* module) {
  return PyModule_AddFunctions(module, kFunctions) == 0;
}

}  // namespace triton_mp
