// triton_mp.backends.python._pb_results: the results of a batch's returned responses, in one
// call: for each request the dict of its requested outputs.
//
// Python twin: PythonBackend._returned_results in src/triton_mp/backends/python/backend.py, its
// plain case (a model with no reshaped output, not an iterative sequence, no response sent
// through a sender during execute), for a batch whose every entry takes both of its loops'
// hot paths: the request not released with RESCHEDULE and without a response sender, the
// response exactly a pb_utils.InferenceResponse without error, with parameters "{}", whose
// output tensors (a list) are all exactly pb_utils.Tensor. Each result is the dict the twin
// builds: {t._name: t._array} for each tensor whose name is in the request's outputs
// (`in`, the tuple's own comparison), in the list's order, a repeated name the last one.
// tests/unit/test_pb_results.py compares both on random batches.
//
// It decides nothing: a batch with any other entry is declined (None) before anything is
// returned, and Python reads it as before, with every check and message of pb_stub.cc.
//
// Why: the twin's two loops were ~6% of the worker's samples in process at add_sub_py 9 per
// batch (py-spy, session 12), the largest part of the python backend's own work left.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cstddef>

#include "../../../ipc/native/py_ref.h"
#include "../../../ipc/native/slots.h"

namespace {
using triton_mp::Keep;
using triton_mp::Ref;
using triton_mp::SlotGet;

constexpr const char* kRequestFields[] = {"_release_flags", "_sender"};  // InferenceRequest
constexpr const char* kResponseFields[] = {"_error", "_output_tensors", "_parameters"};
constexpr const char* kTensorFields[] = {"_name", "_array"};
constexpr const char* kBackendFields[] = {"outputs"};  // BackendRequest

// The classes and constants, from configure(); owned references, kept for the process.
struct Config {
  PyTypeObject* request = nullptr;   // pb_utils.InferenceRequest
  PyTypeObject* response = nullptr;  // pb_utils.InferenceResponse
  PyTypeObject* tensor = nullptr;    // pb_utils.Tensor
  PyTypeObject* backend = nullptr;   // backends.base.BackendRequest
  long reschedule = 0;               // pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
  Py_ssize_t req[2] = {}, resp[3] = {}, tensor_fields[2] = {}, outputs = 0;
};
Config g;

// The result of one entry, or nullptr: declined (no error set) or failed (error set).
PyObject* Result(PyObject* r, PyObject* pb, PyObject* resp) {
  if (Py_TYPE(r) != g.backend || Py_TYPE(pb) != g.request || Py_TYPE(resp) != g.response) {
    return nullptr;
  }
  PyObject* flags = SlotGet(pb, g.req[0]);
  if (flags == nullptr || !PyLong_CheckExact(flags) || SlotGet(pb, g.req[1]) != Py_None) {
    return nullptr;
  }
  int overflow = 0;
  const long value = PyLong_AsLongAndOverflow(flags, &overflow);
  if (overflow != 0 || value == g.reschedule) return nullptr;
  PyObject* params = SlotGet(resp, g.resp[2]);
  PyObject* tensors = SlotGet(resp, g.resp[1]);
  PyObject* wanted = SlotGet(r, g.outputs);
  if (SlotGet(resp, g.resp[0]) != Py_None || params == nullptr || !PyUnicode_CheckExact(params) ||
      PyUnicode_CompareWithASCIIString(params, "{}") != 0 || tensors == nullptr ||
      !PyList_CheckExact(tensors) || wanted == nullptr || !PyTuple_CheckExact(wanted)) {
    return nullptr;
  }
  Ref out(PyDict_New());
  if (!out) return nullptr;
  // NOTE: no Python code runs between the size and the items, but a name's __eq__ may:
  // the list is read by index, its size each time.
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(tensors); ++i) {
    PyObject* t = PyList_GET_ITEM(tensors, i);
    if (Py_TYPE(t) != g.tensor) return nullptr;
    Ref name(Py_XNewRef(SlotGet(t, g.tensor_fields[0])));
    Ref array(Py_XNewRef(SlotGet(t, g.tensor_fields[1])));
    if (!name || !array) return nullptr;
    const int in = PySequence_Contains(wanted, name.get());
    if (in < 0) return nullptr;
    if (in == 1 && PyDict_SetItem(out.get(), name.get(), array.get()) != 0) return nullptr;
  }
  return out.release();
}

// results(requests, pb_requests, responses) -> list[dict] | None
PyObject* Results(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "results(requests, pb_requests, responses)");
    return nullptr;
  }
  if (!PyList_Check(args[0]) || !PyList_Check(args[1]) || !PyList_Check(args[2])) {
    Py_RETURN_NONE;  // NOTE: another sequence: the twin reads it
  }
  if (g.request == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
    return nullptr;
  }
  const Py_ssize_t n = PyList_GET_SIZE(args[0]);
  if (PyList_GET_SIZE(args[1]) != n || PyList_GET_SIZE(args[2]) != n) Py_RETURN_NONE;
  Ref out(PyList_New(n));
  if (!out) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    // NOTE: a name's __eq__ may run Python code: the lists are re-checked by size each time.
    if (PyList_GET_SIZE(args[0]) != n || PyList_GET_SIZE(args[1]) != n ||
        PyList_GET_SIZE(args[2]) != n) {
      Py_RETURN_NONE;
    }
    Ref r(Py_NewRef(PyList_GET_ITEM(args[0], i)));
    Ref pb(Py_NewRef(PyList_GET_ITEM(args[1], i)));
    Ref resp(Py_NewRef(PyList_GET_ITEM(args[2], i)));
    PyObject* made = Result(r.get(), pb.get(), resp.get());
    if (made == nullptr) {
      if (PyErr_Occurred()) return nullptr;  // NOTE: a name's __eq__ raised, as in the twin
      Py_RETURN_NONE;
    }
    PyList_SET_ITEM(out.get(), i, made);
  }
  return out.release();
}

// configure(InferenceRequest, InferenceResponse, Tensor, BackendRequest, RELEASE_RESCHEDULE)
PyObject* Configure(PyObject* /*module*/, PyObject* args) {
  PyObject *request, *response, *tensor, *backend;
  long reschedule;
  if (!PyArg_ParseTuple(args, "OOOOl:configure", &request, &response, &tensor, &backend,
                        &reschedule)) {
    return nullptr;
  }
  Py_ssize_t req[2], resp[3], tensor_fields[2], outputs[1];
  if (!triton_mp::SlotOffsets(request, kRequestFields, 2, req) ||
      !triton_mp::SlotOffsets(response, kResponseFields, 3, resp) ||
      !triton_mp::SlotOffsets(tensor, kTensorFields, 2, tensor_fields) ||
      !triton_mp::SlotOffsets(backend, kBackendFields, 1, outputs)) {
    return nullptr;
  }
  Keep(&g.request, request);
  Keep(&g.response, response);
  Keep(&g.tensor, tensor);
  Keep(&g.backend, backend);
  g.reschedule = reschedule;
  std::copy(req, req + 2, g.req);
  std::copy(resp, resp + 3, g.resp);
  std::copy(tensor_fields, tensor_fields + 2, g.tensor_fields);
  g.outputs = outputs[0];
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"configure", Configure, METH_VARARGS,
     "configure(InferenceRequest, InferenceResponse, Tensor, BackendRequest, "
     "RELEASE_RESCHEDULE): the classes to read."},
    {"results", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(Results)),
     METH_FASTCALL,
     "results(requests, pb_requests, responses) -> list[dict] | None (None: declined; read "
     "them in Python)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_pb_results",
    "The python backend's plain results read in C (backend.py's _returned_results' twin).", -1,
    kMethods, nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__pb_results() { return PyModule_Create(&kModule); }
