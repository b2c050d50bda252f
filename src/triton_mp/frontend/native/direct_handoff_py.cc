// _native.direct_* (direct_handoff_py.h). Every function runs with the GIL held.
#include "direct_handoff_py.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "direct_handoff.h"
#include "known_submit.h"
#include "ring_producer_type.h"

namespace triton_mp {

namespace {

// direct_route_add(frontend_id, instance_id, model, version, lease, producer, wake): open an
// instance's route (DirectHandoff::Add): its lease's and wake-up's POSIX semaphore names,
// this frontend's ring into its inbox as an _native.RingProducer. OSError: a semaphore is gone.
PyObject* RouteAdd(PyObject*, PyObject* args) {
  unsigned long long frontend_id, instance_id;
  const char* model;
  long long version;
  const char* lease;
  PyObject* producer;
  const char* wake;
  if (!PyArg_ParseTuple(args, "KKsLsOs", &frontend_id, &instance_id, &model, &version, &lease,
                        &producer, &wake)) {
    return nullptr;
  }
  std::shared_ptr<RingProducer> ring = RingProducerOf(producer);
  if (!ring) return nullptr;
  if (!TheDirectHandoff().Add(frontend_id, instance_id, DirectRouteKey(model, version), lease,
                              std::move(ring), wake)) {
    return PyErr_SetFromErrnoWithFilename(PyExc_OSError, lease);
  }
  Py_RETURN_NONE;
}

// direct_route_remove(instance_id): close an instance's route.
PyObject* RouteRemove(PyObject*, PyObject* arg) {
  unsigned long long instance_id = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  TheDirectHandoff().Remove(instance_id);
  Py_RETURN_NONE;
}

// direct_route_clear(): close every route.
PyObject* RouteClear(PyObject*, PyObject*) {
  TheDirectHandoff().Clear();
  Py_RETURN_NONE;
}

// direct_stats() -> dict (direct_handoff.h DirectStats).
PyObject* Stats(PyObject*, PyObject*) {
  DirectStats s = TheDirectHandoff().stats();
  return Py_BuildValue("{sKsKsKsK}", "handed", (unsigned long long)s.handed, "not_offered",
                       (unsigned long long)s.not_offered, "lost", (unsigned long long)s.lost,
                       "routes", (unsigned long long)s.routes);
}

// direct_full_timeout(seconds): how long a hand waits for room in a full ring before the
// call fails (DirectHandoff::SetFullTimeout; the ring to the scheduler's Sender.full_timeout_s).
PyObject* FullTimeout(PyObject*, PyObject* arg) {
  const double seconds = PyFloat_AsDouble(arg);
  if (PyErr_Occurred()) return nullptr;
  if (!(seconds >= 0)) {
    PyErr_SetString(PyExc_ValueError, "direct_full_timeout: seconds must be >= 0");
    return nullptr;
  }
  TheDirectHandoff().SetFullTimeout(static_cast<uint64_t>(seconds * 1e9));
  Py_RETURN_NONE;
}

// known_teach_route(key, client_id, model, version) -> bool: the lesson of key and client_id
// (bytes) hands its calls to an idle instance of that version when one is offered
// (KnownSubmit::SetRoute). False: no such lesson.
PyObject* TeachRoute(PyObject*, PyObject* args) {
  Py_buffer key, client_id;
  const char* model;
  long long version;
  if (!PyArg_ParseTuple(args, "y*y*sL", &key, &client_id, &model, &version)) return nullptr;
  std::string k(static_cast<const char*>(key.buf), static_cast<size_t>(key.len));
  std::string id(static_cast<const char*>(client_id.buf), static_cast<size_t>(client_id.len));
  PyBuffer_Release(&key);
  PyBuffer_Release(&client_id);
  return PyBool_FromLong(TheKnownSubmit().SetRoute(k, id, DirectRouteKey(model, version)));
}

PyMethodDef kFunctions[] = {
    {"direct_route_add", RouteAdd, METH_VARARGS, "Open an instance's direct route."},
    {"direct_route_remove", RouteRemove, METH_O, "Close an instance's direct route."},
    {"direct_route_clear", RouteClear, METH_NOARGS, "Close every direct route."},
    {"direct_full_timeout", FullTimeout, METH_O, "A full ring's wait before a hand is lost."},
    {"direct_stats", Stats, METH_NOARGS, "The direct handoff's counters."},
    {"known_teach_route", TeachRoute, METH_VARARGS, "A lesson's version routes."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

bool AddDirectHandoff(PyObject* module) {
  return PyModule_AddFunctions(module, kFunctions) == 0;
}

}  // namespace triton_mp
