// triton_mp.workers._batch_gather: a batch's requests as the backend takes them, in one call:
// each InferRequest's inputs as numpy views over the frontends' arenas, and its BackendRequest.
//
// Python twin: BatchRequests.backend_requests in src/triton_mp/workers/tensors/batch_requests.py
// (its loop for a model without implicit state), which calls this first and does the whole
// batch itself when this declines (returns None). Each input is the array that
// np.ndarray(ref.shape, FIXED_DTYPES[ref.datatype], buffer=buf_of(ref.segment), offset=ref.offset)
// makes (numpy's array_new and PyArray_BufferConverter: the same dtype object, data pointer,
// flags and base, the buffer object itself); the request's inputs dict holds them in its
// inputs' order (a repeated name: the last one), and its BackendRequest is built from the
// same fields in the same order (tests/unit/test_batch_gather.py compares both on random
// batches). No shared-memory layout is read here: the views' places come from the TensorRefs.
//
// It decides nothing: a batch with any request off that path (client output regions, an
// input in a client region or of a datatype not in FIXED_DTYPES, a segment buf_of cannot
// give, a shape or window numpy would refuse or that does not fit the buffer, an object not
// of the exact configured types) is declined before anything is returned, and Python builds
// the whole batch as before, with its errors and words.
//
// Why: at add_sub_py c=16 the Python loop's views and BackendRequests were ~8-13% of the
// worker's samples (py-spy, issue 34): ~0.3 us per numpy view from Python, mostly argument
// parsing, against ~0.05 here.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_23_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL triton_mp_batch_gather_ARRAY_API
#include <numpy/arrayobject.h>

#include <algorithm>
#include <cstddef>
#include <deque>

#include "../../ipc/native/py_ref.h"
#include "../../ipc/native/slots.h"

namespace {
using triton_mp::Keep;
using triton_mp::Ref;
using triton_mp::SlotGet;

// InferRequest's fields read here (ipc/protocol/messages.py), in this order.
constexpr const char* kRequestFields[] = {
    "inputs",          "outputs",     "batch_size",     "client_id",   "timeout_us",
    "parameters_json", "sequence_id", "sequence_flags", "output_regions",
};
enum RequestField { kInputs, kOutputs, kBatchSize, kClientId, kTimeout, kParameters,
                    kSequenceId, kSequenceFlags, kOutputRegions, kNumRequestFields };
// TensorRef's fields read here.
constexpr const char* kRefFields[] = {"name", "datatype", "shape", "segment", "offset",
                                      "region_id"};
enum RefField { kName, kDatatype, kShape, kSegment, kOffset, kRegionId, kNumRefFields };

// The Python types and table, from configure(); owned references, kept for the process.
struct Config {
  PyObject* infer_request = nullptr;    // ipc.protocol.messages.InferRequest
  PyObject* tensor_ref = nullptr;       // ipc.protocol.messages.TensorRef
  PyObject* backend_request = nullptr;  // backends.base.BackendRequest
  PyObject* fixed = nullptr;            // tensor_io.FIXED_DTYPES: datatype -> np.dtype
  Py_ssize_t request[kNumRequestFields] = {};
  Py_ssize_t ref[kNumRefFields] = {};
};
Config g;

// One segment's buffer as numpy's PyArray_BufferConverter takes it: the object numpy keeps
// as the view's base (a memoryview's own base), its memory and whether numpy may write it.
struct Segment {
  Ref name;
  Ref base;
  char* data = nullptr;
  Py_ssize_t size = 0;
  bool writable = false;
};

// The batch's segments, each asked of buf_of once (a batch's inputs lie in a few arenas).
class Segments {
 public:
  explicit Segments(PyObject* buf_of) : buf_of_(buf_of) {}

  // The segment named `name`, or nullptr (no error set) when buf_of raised or its buffer
  // is not one numpy takes: the batch is declined.
  const Segment* Of(PyObject* name) {
    for (const Segment& s : segments_) {
      if (s.name.get() == name) return &s;
    }
    for (const Segment& s : segments_) {
      if (PyUnicode_Check(name) && PyUnicode_Check(s.name.get()) &&
          PyUnicode_Compare(name, s.name.get()) == 0) {
        return &s;
      }
    }
    PyObject* args[] = {name};
    Ref buf(PyObject_Vectorcall(buf_of_, args, 1, nullptr));
    if (!buf) {
      PyErr_Clear();  // NOTE: the Python twin asks again and raises it for its request
      return nullptr;
    }
    Py_buffer view;
    bool writable = true;
    if (PyObject_GetBuffer(buf.get(), &view, PyBUF_ANY_CONTIGUOUS | PyBUF_WRITABLE) != 0) {
      PyErr_Clear();
      writable = false;
      if (PyObject_GetBuffer(buf.get(), &view, PyBUF_ANY_CONTIGUOUS) != 0) {
        PyErr_Clear();
        return nullptr;
      }
    }
    char* data = static_cast<char*>(view.buf);
    const Py_ssize_t size = view.len;
    PyBuffer_Release(&view);  // NOTE: as numpy: the view keeps the object, not an export
    PyObject* base = PyMemoryView_Check(buf.get()) ? PyMemoryView_GET_BASE(buf.get()) : nullptr;
    Segment& s = segments_.emplace_back();  // NOTE: a deque: earlier segments stay put
    s.base.reset(Py_NewRef(base != nullptr ? base : buf.get()));
    s.name.reset(Py_NewRef(name));
    s.data = data;
    s.size = size;
    s.writable = writable;
    return &segments_.back();
  }

 private:
  PyObject* buf_of_;
  std::deque<Segment> segments_;
};

// A non-negative Py_ssize_t from an exact int, or -1 (no error set) for anything else.
Py_ssize_t NonNegative(PyObject* value) {
  if (value == nullptr || !PyLong_CheckExact(value)) return -1;
  const Py_ssize_t v = PyLong_AsSsize_t(value);
  if (v == -1 && PyErr_Occurred()) PyErr_Clear();
  return v < 0 ? -1 : v;
}

// One input's view, or nullptr (no error set): declined.
PyObject* View(PyObject* ref, Segments& segments) {
  if (Py_TYPE(ref) != reinterpret_cast<PyTypeObject*>(g.tensor_ref)) return nullptr;
  PyObject* datatype = SlotGet(ref, g.ref[kDatatype]);
  PyObject* region = SlotGet(ref, g.ref[kRegionId]);
  PyObject* shape = SlotGet(ref, g.ref[kShape]);
  PyObject* segment = SlotGet(ref, g.ref[kSegment]);
  if (SlotGet(ref, g.ref[kName]) == nullptr || datatype == nullptr || !PyUnicode_CheckExact(datatype) || NonNegative(region) != 0 ||
      shape == nullptr || !PyTuple_CheckExact(shape) || segment == nullptr) {
    return nullptr;
  }
  PyObject* descr = PyDict_GetItemWithError(g.fixed, datatype);  // borrowed
  if (descr == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  const Py_ssize_t nd = PyTuple_GET_SIZE(shape);
  if (nd > NPY_MAXDIMS) return nullptr;
  npy_intp dims[NPY_MAXDIMS];
  Py_ssize_t nbytes = PyDataType_ELSIZE(reinterpret_cast<PyArray_Descr*>(descr));
  for (Py_ssize_t d = 0; d < nd; ++d) {
    const Py_ssize_t dim = NonNegative(PyTuple_GET_ITEM(shape, d));
    if (dim < 0 || __builtin_mul_overflow(nbytes, dim, &nbytes)) return nullptr;
    dims[d] = dim;
  }
  const Py_ssize_t offset = NonNegative(SlotGet(ref, g.ref[kOffset]));
  const Segment* seg = segments.Of(segment);
  if (offset < 0 || seg == nullptr || offset > seg->size || nbytes > seg->size - offset) {
    return nullptr;
  }
  Py_INCREF(descr);  // NOTE: PyArray_NewFromDescr takes this reference
  PyObject* arr = PyArray_NewFromDescr(
      &PyArray_Type, reinterpret_cast<PyArray_Descr*>(descr), static_cast<int>(nd), dims,
      nullptr, seg->data + offset, seg->writable ? NPY_ARRAY_BEHAVED : NPY_ARRAY_ALIGNED,
      nullptr);
  if (arr == nullptr) {
    PyErr_Clear();
    return nullptr;
  }
  // NOTE: SetBaseObject takes the reference, also when it fails.
  if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(arr), Py_NewRef(seg->base.get())) <
      0) {
    PyErr_Clear();
    Py_DECREF(arr);
    return nullptr;
  }
  return arr;
}

// One request's BackendRequest, or nullptr: declined (no error set) or failed (error set).
PyObject* Request(PyObject* req, Segments& segments) {
  if (Py_TYPE(req) != reinterpret_cast<PyTypeObject*>(g.infer_request)) return nullptr;
  PyObject* fields[kNumRequestFields];
  for (int i = 0; i < kNumRequestFields; ++i) {
    fields[i] = SlotGet(req, g.request[i]);
    if (fields[i] == nullptr) return nullptr;
  }
  PyObject* refs = fields[kInputs];
  PyObject* regions = fields[kOutputRegions];
  if (!PyTuple_CheckExact(refs) || !PyTuple_CheckExact(regions) || PyTuple_GET_SIZE(regions)) {
    return nullptr;
  }
  Ref inputs(PyDict_New());
  if (!inputs) return nullptr;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(refs); ++i) {
    PyObject* ref = PyTuple_GET_ITEM(refs, i);
    Ref view(View(ref, segments));
    if (!view) return nullptr;
    if (PyDict_SetItem(inputs.get(), SlotGet(ref, g.ref[kName]), view.get()) != 0) {
      return nullptr;
    }
  }
  PyObject* args[] = {
      inputs.get(),         fields[kOutputs],    fields[kBatchSize],
      fields[kClientId],    fields[kTimeout],    fields[kParameters],
      fields[kSequenceId],  fields[kSequenceFlags], req,
  };
  return PyObject_Vectorcall(g.backend_request, args, 9, nullptr);
}

// backend_requests(reqs, buf_of) -> list[BackendRequest] | None
PyObject* BackendRequests(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[0]) || !PyCallable_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "backend_requests(reqs: tuple, buf_of: callable)");
    return nullptr;
  }
  if (g.backend_request == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
    return nullptr;
  }
  PyObject* reqs = args[0];
  const Py_ssize_t n = PyTuple_GET_SIZE(reqs);
  Ref out(PyList_New(n));
  if (!out) return nullptr;
  Segments segments(args[1]);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* made = Request(PyTuple_GET_ITEM(reqs, i), segments);
    if (made == nullptr) {
      if (PyErr_Occurred()) return nullptr;  // NOTE: a failure (memory), not a decline
      Py_RETURN_NONE;
    }
    PyList_SET_ITEM(out.get(), i, made);
  }
  return out.release();
}

// configure(InferRequest, TensorRef, BackendRequest, FIXED_DTYPES)
PyObject* Configure(PyObject* /*module*/, PyObject* args) {
  PyObject *infer_request, *tensor_ref, *backend_request, *fixed;
  if (!PyArg_ParseTuple(args, "OOOO!:configure", &infer_request, &tensor_ref, &backend_request,
                        &PyDict_Type, &fixed)) {
    return nullptr;
  }
  Py_ssize_t request[kNumRequestFields], ref[kNumRefFields];
  if (!triton_mp::SlotOffsets(infer_request, kRequestFields, kNumRequestFields, request) ||
      !triton_mp::SlotOffsets(tensor_ref, kRefFields, kNumRefFields, ref)) {
    return nullptr;
  }
  PyObject *key, *value;
  for (Py_ssize_t pos = 0; PyDict_Next(fixed, &pos, &key, &value);) {
    if (!PyArray_DescrCheck(value)) {
      return PyErr_Format(PyExc_TypeError, "configure: FIXED_DTYPES holds a non-dtype");
    }
  }
  if (!PyCallable_Check(backend_request)) {
    return PyErr_Format(PyExc_TypeError, "configure: BackendRequest must be callable");
  }
  Keep(&g.infer_request, infer_request);
  Keep(&g.tensor_ref, tensor_ref);
  Keep(&g.backend_request, backend_request);
  Keep(&g.fixed, fixed);
  std::copy(request, request + kNumRequestFields, g.request);
  std::copy(ref, ref + kNumRefFields, g.ref);
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"configure", Configure, METH_VARARGS,
     "configure(InferRequest, TensorRef, BackendRequest, FIXED_DTYPES): the types to read "
     "and build."},
    {"backend_requests",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(BackendRequests)),
     METH_FASTCALL,
     "backend_requests(reqs, buf_of) -> list[BackendRequest] | None (None: declined; "
     "build the batch in Python)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_batch_gather",
    "A batch's input views and BackendRequests built in C (batch_requests.py's twin).", -1,
    kMethods, nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__batch_gather() {
  import_array();  // NOTE: returns nullptr with the error set when numpy cannot be imported
  return PyModule_Create(&kModule);
}
