// triton_mp.backends.python._pb_requests: the pb_utils.InferenceRequest of each request of a
// batch, as the python backend hands them to the model's execute, in one call.
//
// Python twin: PythonBackend._pb_requests in src/triton_mp/backends/python/backend.py, its
// plain case (a model neither decoupled nor reshaping an input, no sequence batch), with
// pb_utils._input_tensor and pb_utils._backend_request: each input a pb_utils.Tensor (slots
// _name, _array: the inputs dict's key and array, in the dict's order), each request an
// InferenceRequest whose 15 slots hold what _backend_request stores, the objects made as
// Class.__new__(Class) makes them (the type's tp_alloc; neither class defines __new__ or
// needs __init__ here). tests/unit/test_pb_requests.py compares every slot with the twin's.
//
// It decides nothing: a request that is not a BackendRequest whose token is an untraced
// InferRequest (or None), inputs a dict and outputs a tuple, declines the batch (None) before anything
// is returned, and Python builds it as before (a traced request gets its InferenceTrace there).
//
// It also does what request_rules.own_step_inputs does after the twin's loop: the inputs of a
// request an ensemble's step sent (its token's reply_to.kind is Requester.ENSEMBLE) are the
// arrays' copies (array.copy()), so that a model writing its input in place changes nothing
// but its copy; every other request's tensors hold the arrays themselves.
//
// Why: at add_sub_py c=16 _pb_requests was ~5-6% of the worker's samples (py-spy, issue 34);
// own_step_inputs' loop over the batch in Python was ~1.4 us per batch of 15 hot, as much as
// this whole call.
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
using triton_mp::SlotSet;

// BackendRequest's fields read here (backends/base.py), in this order.
constexpr const char* kBackendFields[] = {"inputs",    "outputs",        "request_id",
                                          "timeout_us", "parameters_json", "sequence_id",
                                          "sequence_flags", "token"};
enum BackendField { kInputs, kOutputs, kRequestId, kTimeout, kParameters, kSequenceId,
                    kSequenceFlags, kToken, kNumBackendFields };
// pb_utils.InferenceRequest's slots, all of them (pb_utils._backend_request sets each).
constexpr const char* kPbFields[] = {
    "_trace",      "_model_name", "_requested_output_names", "_inputs",     "_request_id",
    "_correlation_id", "_model_version", "_flags",           "_timeout_us", "_parameters",
    "_sender",     "_key",        "_sender_factory",         "_cancelled",  "_release_flags",
};
enum PbField { kTrace, kModelName, kOutputNames, kPbInputs, kPbRequestId, kCorrelationId,
               kModelVersion, kFlags, kPbTimeout, kPbParameters, kSender, kKey, kSenderFactory,
               kCancelled, kReleaseFlags, kNumPbFields };
constexpr const char* kTensorFields[] = {"_name", "_array"};
// InferRequest's (ipc/protocol/messages.py), and its ReplyTo's.
constexpr const char* kTokenFields[] = {"trace", "reply_to"};
enum TokenField { kTokenTrace, kTokenReplyTo, kNumTokenFields };
constexpr const char* kReplyFields[] = {"kind"};

// The classes and constant, from configure(); owned references, kept for the process.
struct Config {
  PyTypeObject* tensor = nullptr;           // pb_utils.Tensor
  PyTypeObject* request = nullptr;          // pb_utils.InferenceRequest
  PyTypeObject* backend_request = nullptr;  // backends.base.BackendRequest
  PyTypeObject* infer_request = nullptr;    // ipc.protocol.messages.InferRequest
  PyTypeObject* reply_to = nullptr;         // ipc.protocol.messages.ReplyTo
  PyObject* release_all = nullptr;          // pb_utils.TRITONSERVER_REQUEST_RELEASE_ALL
  long ensemble = 0;                        // int(Requester.ENSEMBLE)
  PyObject* copy = nullptr;                 // "copy", interned
  Py_ssize_t backend[kNumBackendFields] = {};
  Py_ssize_t pb[kNumPbFields] = {};
  Py_ssize_t tensor_fields[2] = {};
  Py_ssize_t token[kNumTokenFields] = {};
  Py_ssize_t kind = 0;
};
Config g;

// A new instance of `cls` with every slot unset (Class.__new__(Class)), or nullptr.
PyObject* New(PyTypeObject* cls) { return cls->tp_alloc(cls, 0); }

// Whether `token` (an untraced InferRequest, or None) came from an ensemble's step: 1 yes,
// 0 no, -1 declined (a reply_to that is no ReplyTo, a kind that is no int; no error set).
// own_step_inputs' `kind == int(Requester.ENSEMBLE)`, for an int (IntEnum) kind: its value.
int FromStep(PyObject* token) {
  if (token == Py_None) return 0;
  PyObject* to = SlotGet(token, g.token[kTokenReplyTo]);
  if (to == nullptr || Py_TYPE(to) != g.reply_to) return -1;
  PyObject* kind = SlotGet(to, g.kind);
  if (kind == nullptr || !PyLong_Check(kind)) return -1;
  int overflow = 0;
  const long value = PyLong_AsLongAndOverflow(kind, &overflow);
  if (value == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return -1;
  }
  return overflow == 0 && value == g.ensemble ? 1 : 0;
}

// The arrays of `pb`'s input tensors (an InferenceRequest this module built, not yet seen by
// Python) replaced by their copies (array.copy()); false with an error set.
bool CopyInputs(PyObject* pb) {
  PyObject* tensors = SlotGet(pb, g.pb[kPbInputs]);  // NOTE: Tensors' list, this call's own
  for (Py_ssize_t k = 0; k < PyList_GET_SIZE(tensors); ++k) {
    PyObject* t = PyList_GET_ITEM(tensors, k);
    PyObject* copied = PyObject_CallMethodNoArgs(SlotGet(t, g.tensor_fields[1]), g.copy);
    if (copied == nullptr) return false;
    SlotSet(t, g.tensor_fields[1], copied);
  }
  return true;
}

// One request's input tensors, or nullptr: declined (no error set) or failed (error set).
// A request without inputs is declined: the twin refuses it for a batching model (2.51's
// python_be.cc reads the batch size from input 0; backends/python/request_rules.py).
PyObject* Tensors(PyObject* inputs) {
  if (!PyDict_CheckExact(inputs) || PyDict_GET_SIZE(inputs) == 0) return nullptr;
  Ref out(PyList_New(PyDict_GET_SIZE(inputs)));
  if (!out) return nullptr;
  PyObject *name, *array;
  Py_ssize_t i = 0;
  for (Py_ssize_t pos = 0; PyDict_Next(inputs, &pos, &name, &array); ++i) {
    PyObject* t = New(g.tensor);
    if (t == nullptr) return nullptr;
    SlotSet(t, g.tensor_fields[0], Py_NewRef(name));
    SlotSet(t, g.tensor_fields[1], Py_NewRef(array));
    PyList_SET_ITEM(out.get(), i, t);
  }
  return out.release();
}

// The InferenceRequest of one BackendRequest (values: model, version, sender_for,
// cancelled), or nullptr: declined (no error set) or failed (error set); *step: whether it
// came from an ensemble's step (its inputs to copy).
PyObject* Request(PyObject* r, PyObject* const* values, bool* step) {
  if (Py_TYPE(r) != g.backend_request) return nullptr;
  PyObject* fields[kNumBackendFields];
  for (int i = 0; i < kNumBackendFields; ++i) {
    fields[i] = SlotGet(r, g.backend[i]);
    if (fields[i] == nullptr) return nullptr;
  }
  PyObject* token = fields[kToken];
  const bool untraced =
      token == Py_None ||
      (Py_TYPE(token) == g.infer_request && SlotGet(token, g.token[kTokenTrace]) == Py_None);
  if (!untraced || !PyTuple_CheckExact(fields[kOutputs])) {
    return nullptr;  // NOTE: a traced request (or another token): the twin sets _trace
  }
  const int from_step = FromStep(token);
  if (from_step < 0) return nullptr;
  *step = from_step == 1;
  Ref inputs(Tensors(fields[kInputs]));
  if (!inputs) return nullptr;
  Ref outputs(PySequence_List(fields[kOutputs]));
  if (!outputs) return nullptr;
  PyObject* out = New(g.request);
  if (out == nullptr) return nullptr;
  const Py_ssize_t* at = g.pb;
  SlotSet(out, at[kTrace], Py_NewRef(Py_None));
  SlotSet(out, at[kModelName], Py_NewRef(values[0]));
  SlotSet(out, at[kOutputNames], outputs.release());
  SlotSet(out, at[kPbInputs], inputs.release());
  SlotSet(out, at[kPbRequestId], Py_NewRef(fields[kRequestId]));
  SlotSet(out, at[kCorrelationId], Py_NewRef(fields[kSequenceId]));
  SlotSet(out, at[kModelVersion], Py_NewRef(values[1]));
  SlotSet(out, at[kFlags], Py_NewRef(fields[kSequenceFlags]));
  SlotSet(out, at[kPbTimeout], Py_NewRef(fields[kTimeout]));
  SlotSet(out, at[kPbParameters], Py_NewRef(fields[kParameters]));
  SlotSet(out, at[kSender], Py_NewRef(Py_None));
  SlotSet(out, at[kKey], Py_NewRef(r));
  SlotSet(out, at[kSenderFactory], Py_NewRef(values[2]));
  SlotSet(out, at[kCancelled], Py_NewRef(values[3]));
  SlotSet(out, at[kReleaseFlags], Py_NewRef(g.release_all));
  return out;
}

// build(requests, model, version, sender_for, cancelled) -> list[InferenceRequest] | None
PyObject* Build(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5 || !PyList_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError,
                    "build(requests: list, model, version, sender_for, cancelled)");
    return nullptr;
  }
  if (g.request == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
    return nullptr;
  }
  PyObject* requests = args[0];
  const Py_ssize_t n = PyList_GET_SIZE(requests);
  Ref out(PyList_New(n));
  if (!out) return nullptr;
  bool steps = false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    // NOTE: no Python code runs in between: the list cannot change under the loop.
    bool step = false;
    PyObject* made = Request(PyList_GET_ITEM(requests, i), args + 1, &step);
    if (made == nullptr) {
      if (PyErr_Occurred()) return nullptr;  // NOTE: a failure (memory), not a decline
      Py_RETURN_NONE;
    }
    PyList_SET_ITEM(out.get(), i, made);
    steps = steps || step;
  }
  // NOTE: the copies last: copy() may run Python code, once no loop is open over an object
  // it can reach. A step request's tensors are told by their token again (no Python ran yet
  // where FromStep read it).
  for (Py_ssize_t i = 0; steps && i < n; ++i) {
    PyObject* pb = PyList_GET_ITEM(out.get(), i);
    PyObject* key = SlotGet(pb, g.pb[kKey]);  // NOTE: the BackendRequest, held by pb
    if (FromStep(SlotGet(key, g.backend[kToken])) == 1 && !CopyInputs(pb)) return nullptr;
  }
  return out.release();
}

// configure(Tensor, InferenceRequest, BackendRequest, InferRequest, RELEASE_ALL, ReplyTo,
//   ENSEMBLE)
PyObject* Configure(PyObject* /*module*/, PyObject* args) {
  PyObject *tensor, *request, *backend_request, *infer_request, *release_all, *reply_to;
  long ensemble = 0;
  if (!PyArg_ParseTuple(args, "OOOOOOl:configure", &tensor, &request, &backend_request,
                        &infer_request, &release_all, &reply_to, &ensemble)) {
    return nullptr;
  }
  Py_ssize_t backend[kNumBackendFields], pb[kNumPbFields], tensor_fields[2],
      token[kNumTokenFields], kind[1];
  if (!triton_mp::SlotOffsets(backend_request, kBackendFields, kNumBackendFields, backend) ||
      !triton_mp::SlotOffsets(request, kPbFields, kNumPbFields, pb) ||
      !triton_mp::SlotOffsets(tensor, kTensorFields, 2, tensor_fields) ||
      !triton_mp::SlotOffsets(infer_request, kTokenFields, kNumTokenFields, token) ||
      !triton_mp::SlotOffsets(reply_to, kReplyFields, 1, kind)) {
    return nullptr;
  }
  if (g.copy == nullptr) {
    g.copy = PyUnicode_InternFromString("copy");
    if (g.copy == nullptr) return nullptr;
  }
  for (PyObject* cls : {tensor, request}) {
    const PyTypeObject* type = reinterpret_cast<PyTypeObject*>(cls);
    if (type->tp_new != PyBaseObject_Type.tp_new) {
      return PyErr_Format(PyExc_TypeError, "configure: %s defines __new__", type->tp_name);
    }
  }
  Keep(&g.tensor, tensor);
  Keep(&g.request, request);
  Keep(&g.backend_request, backend_request);
  Keep(&g.infer_request, infer_request);
  Keep(&g.reply_to, reply_to);
  Py_XSETREF(g.release_all, Py_NewRef(release_all));
  g.ensemble = ensemble;
  std::copy(backend, backend + kNumBackendFields, g.backend);
  std::copy(pb, pb + kNumPbFields, g.pb);
  std::copy(tensor_fields, tensor_fields + 2, g.tensor_fields);
  std::copy(token, token + kNumTokenFields, g.token);
  g.kind = kind[0];
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"configure", Configure, METH_VARARGS,
     "configure(Tensor, InferenceRequest, BackendRequest, InferRequest, RELEASE_ALL, ReplyTo, "
     "ENSEMBLE): the classes to read and build, and the kind whose inputs are copied."},
    {"build", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(Build)), METH_FASTCALL,
     "build(requests, model, version, sender_for, cancelled) -> list[InferenceRequest] | None "
     "(None: declined; build them in Python)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_pb_requests",
    "The python backend's InferenceRequests built in C (backend.py's _pb_requests' twin).", -1,
    kMethods, nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__pb_requests() { return PyModule_Create(&kModule); }
