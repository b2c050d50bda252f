// triton_mp.ipc._request_decoder: a REQUEST record (ipc/records.h, version kRecordVersion)
// decoded into the Python InferRequest that ipc/recordio/request_records.py's RequestDecoder builds.
//
// Python twin: RequestDecoder.decode in src/triton_mp/ipc/recordio/request_records.py, which calls
// this first and decodes itself what this declines (returns None): a record with a trace
// level (and, before configure_tail, one with a tail). A tail (the rare fields, msgpack of
// RequestTail: parameters, client output regions, a string correlation id) is not parsed
// here: its bytes go to the Python tail_of given to configure_tail, which keeps one
// RequestTail per distinct tail, and its fields join the request (a client system-shm call
// names its output regions there on every request: id1m_shm's worker ran this Python
// decoder per request, 4 against 1 us). Only the parsing is here: the message types are
// the Python ones, handed over once by configure(), and every rule about what a request may
// hold stays in Python. A record that is not a well-formed REQUEST (wrong marker, kind or
// version, a count, a string or a rank out of the record's bounds, a datatype unknown, a
// string not UTF-8) raises ValueError, as the Python decoder does.
//
// Why: a worker decodes every request of its batch; in Python that was 19% of its CPU
// (bench/README.md, issue 34), in C it costs what building the objects costs. So decode_all
// takes a whole BatchAssign's entries in one call (BatchRequests.decoded's loop), and the
// objects that repeat from one request to the next are made once: the last ASCII string at
// each place of a record (model, client id, block segment, the first 8 inputs' names and
// segments and outputs' names: StringSite) and each input's last shape tuple (ShapeSite)
// are reused while the record's bytes match, and the ReplyTo is read_header's kept one.
//
// read_header() is the scheduler's half: the header fields batching reads, into a
// RequestRecord (Python twin: HeaderReader.read in request_records.py, which calls this
// first and reads itself what this declines). The record's slots are filled in place, at
// the offsets of the class's own member descriptors (configure_header), so the class stays
// the one Python definition. Why: it runs once per request on the scheduler's drain.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <unordered_map>

#include "../records.h"
#include "py_ref.h"
#include "request_header.h"
#include "ring_records.h"

namespace {

namespace rec = triton_mp::records;
using triton_mp::Keep;
using triton_mp::Ref;

// The Python types and tables, from configure(); owned references, kept for the process.
struct Types {
  PyObject* infer_request = nullptr;  // ipc.protocol.messages.InferRequest
  PyObject* tensor_ref = nullptr;     // ipc.protocol.messages.TensorRef
  PyObject* block_ref = nullptr;      // ipc.protocol.messages.BlockRef
  PyObject* reply_to = nullptr;       // callable (kind, id) -> ReplyTo (cached in Python)
  PyObject* wire = nullptr;           // tuple: dtype code -> protocol datatype string
  PyObject* kwnames = nullptr;        // InferRequest's keyword names, in kRequestArgs order
  PyObject* tail_of = nullptr;        // callable (tail bytes) -> RequestTail; None: declined
  PyObject* kwnames_tail = nullptr;   // kwnames, then kTailArgs
  PyObject* seq_text = nullptr;       // interned "sequence_id" (RequestTail's attribute)
};
Types g_types;

constexpr const char* kRequestArgs[] = {
    "request_id", "reply_to", "model",     "version",  "batch_size",  "inputs",         "outputs",
    "block",      "arrival_ns", "priority", "timeout_us", "client_id", "sequence_id", "sequence_flags",
};
constexpr Py_ssize_t kNumRequestArgs = sizeof(kRequestArgs) / sizeof(kRequestArgs[0]);
// The tail's fields InferRequest takes as they are (RequestTail's attributes of those names).
constexpr const char* kTailArgs[] = {"parameters_json", "output_regions"};
constexpr Py_ssize_t kNumTailArgs = sizeof(kTailArgs) / sizeof(kTailArgs[0]);

// Holds a buffer view for the call (RAII).
class View {
 public:
  explicit View(PyObject* obj) { ok_ = PyObject_GetBuffer(obj, &view_, PyBUF_SIMPLE) == 0; }
  View(const View&) = delete;
  View& operator=(const View&) = delete;
  ~View() {
    if (ok_) PyBuffer_Release(&view_);
  }
  bool ok() const { return ok_; }
  const uint8_t* data() const { return static_cast<const uint8_t*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
  bool ok_ = false;
};

PyObject* Malformed(const char* what) {
  PyErr_Format(PyExc_ValueError, "malformed request record: %s", what);
  return nullptr;
}

// A string of the record's string area, or nullptr with ValueError set.
PyObject* String(const uint8_t* data, size_t size, uint64_t off, uint64_t len) {
  if (off > size || len > size - off) return Malformed("a string lies outside the record");
  return PyUnicode_DecodeUTF8(reinterpret_cast<const char*>(data + off),
                              static_cast<Py_ssize_t>(len), "strict");
}

// The last ASCII string decoded at one place of a record (the model name, an input's name,
// ...): consecutive requests repeat them, so the str is made once and shared (str is
// immutable; the twin's _Form shares its names the same way).
class StringSite {
 public:
  // The string at [off, off + len) of the record (a new reference), or nullptr with
  // ValueError set.
  PyObject* Get(const uint8_t* data, size_t size, uint64_t off, uint64_t len) {
    if (off > size || len > size - off) return Malformed("a string lies outside the record");
    PyObject* last = last_;
    if (last != nullptr && static_cast<uint64_t>(PyUnicode_GET_LENGTH(last)) == len &&
        std::memcmp(PyUnicode_DATA(last), data + off, len) == 0) {
      return Py_NewRef(last);  // NOTE: ASCII only is kept: its characters are its bytes
    }
    PyObject* made = String(data, size, off, len);
    if (made != nullptr && PyUnicode_IS_COMPACT_ASCII(made)) Py_XSETREF(last_, Py_NewRef(made));
    return made;
  }

 private:
  PyObject* last_ = nullptr;  // NOTE: owned, kept for the process (no destructor at exit)
};

// The last shape tuple made for one input of a record (same reuse as StringSite).
class ShapeSite {
 public:
  // The tuple of the first `ndim` dims (a new reference), or nullptr with the error set.
  PyObject* Get(const int64_t* dims, uint8_t ndim) {
    if (last_ != nullptr && ndim == ndim_ && std::memcmp(dims, dims_, ndim * sizeof(int64_t)) == 0) {
      return Py_NewRef(last_);
    }
    Ref shape(PyTuple_New(ndim));
    if (!shape) return nullptr;
    for (uint8_t d = 0; d < ndim; ++d) {
      PyObject* dim = PyLong_FromLongLong(dims[d]);
      if (dim == nullptr) return nullptr;
      PyTuple_SET_ITEM(shape.get(), d, dim);
    }
    std::memcpy(dims_, dims, ndim * sizeof(int64_t));
    ndim_ = ndim;
    Py_XSETREF(last_, Py_NewRef(shape.get()));
    return shape.release();
  }

 private:
  PyObject* last_ = nullptr;  // NOTE: owned, kept for the process (as StringSite's)
  uint8_t ndim_ = 0;
  int64_t dims_[rec::kMaxDims] = {};
};

constexpr size_t kSitesKept = 8;  // the first 8 inputs and outputs of a record have sites

// Every place of a record with a site; kept for the process (a worker serves one model).
struct Sites {
  StringSite model, client_id, block_segment;
  StringSite input_name[kSitesKept], input_segment[kSitesKept], output[kSitesKept];
  ShapeSite shape[kSitesKept];
};
Sites g_sites;

PyObject* ReplyOf(uint8_t kind, uint32_t id);  // below, with read_header's caches

// A string at a site when there is one (i < kSitesKept), else decoded.
PyObject* StringAt(StringSite* sites, size_t i, const uint8_t* data, size_t size, uint64_t off,
                   uint64_t len) {
  return i < kSitesKept ? sites[i].Get(data, size, off, len) : String(data, size, off, len);
}

PyObject* Call(PyObject* fn, PyObject* const* args, size_t nargs, PyObject* kwnames = nullptr) {
  return PyObject_Vectorcall(fn, args, nargs, kwnames);
}

// Input i: TensorRef(name, datatype, shape, segment, offset, nbytes, region_id).
PyObject* Input(const uint8_t* data, size_t size, size_t at, uint16_t i) {
  rec::TensorEntry e;
  std::memcpy(&e, data + at, sizeof e);
  if (e.ndim > rec::kMaxDims) return Malformed("an input has more than 8 dims");
  if (e.dtype >= PyTuple_GET_SIZE(g_types.wire)) return Malformed("unknown datatype");
  Ref name(StringAt(g_sites.input_name, i, data, size, e.name_off, e.name_len));
  if (!name) return nullptr;
  Ref segment(StringAt(g_sites.input_segment, i, data, size, e.segment_off, e.segment_len));
  if (!segment) return nullptr;
  Ref shape(i < kSitesKept ? g_sites.shape[i].Get(e.shape, e.ndim) : nullptr);
  if (i >= kSitesKept) {
    shape.reset(PyTuple_New(e.ndim));
    if (!shape) return nullptr;
    for (uint8_t d = 0; d < e.ndim; ++d) {
      PyObject* dim = PyLong_FromLongLong(e.shape[d]);
      if (dim == nullptr) return nullptr;
      PyTuple_SET_ITEM(shape.get(), d, dim);
    }
  }
  if (!shape) return nullptr;
  Ref offset(PyLong_FromUnsignedLongLong(e.offset));
  Ref nbytes(PyLong_FromUnsignedLongLong(e.nbytes));
  Ref region(PyLong_FromUnsignedLongLong(e.region_id));
  if (!offset || !nbytes || !region) return nullptr;
  PyObject* args[] = {name.get(),   PyTuple_GET_ITEM(g_types.wire, e.dtype),
                      shape.get(),  segment.get(),
                      offset.get(), nbytes.get(),
                      region.get()};
  return Call(g_types.tensor_ref, args, 7);
}

PyObject* Inputs(const uint8_t* data, size_t size, uint16_t n) {
  Ref out(PyTuple_New(n));
  if (!out) return nullptr;
  for (uint16_t i = 0; i < n; ++i) {
    PyObject* t =
        Input(data, size, sizeof(rec::RequestHeader) + i * sizeof(rec::TensorEntry), i);
    if (t == nullptr) return nullptr;
    PyTuple_SET_ITEM(out.get(), i, t);
  }
  return out.release();
}

PyObject* Outputs(const uint8_t* data, size_t size, size_t at, uint16_t n) {
  Ref out(PyTuple_New(n));
  if (!out) return nullptr;
  for (uint16_t i = 0; i < n; ++i, at += sizeof(rec::OutputEntry)) {
    rec::OutputEntry e;
    std::memcpy(&e, data + at, sizeof e);
    PyObject* name = StringAt(g_sites.output, i, data, size, e.name_off, e.name_len);
    if (name == nullptr) return nullptr;
    PyTuple_SET_ITEM(out.get(), i, name);
  }
  return out.release();
}

// The record's RequestTail (tail_of's), or nullptr with the error set.
PyObject* Tail(const uint8_t* data, size_t size, const rec::RequestHeader& h) {
  if (h.tail_off > size || h.tail_len > size - h.tail_off) {
    return Malformed("its tail lies outside the record");
  }
  Ref raw(PyBytes_FromStringAndSize(reinterpret_cast<const char*>(data + h.tail_off),
                                    static_cast<Py_ssize_t>(h.tail_len)));
  if (!raw) return nullptr;
  PyObject* args[] = {raw.get()};
  return Call(g_types.tail_of, args, 1);
}

PyObject* Decode(const uint8_t* data, size_t size) {
  rec::RequestHeader h;
  if (size < sizeof h) return Malformed("shorter than its header");
  std::memcpy(&h, data, sizeof h);
  if (h.marker != rec::kRecordMarker || h.kind != rec::kKindRequest ||
      h.version != rec::kRecordVersion) {
    return Malformed("not a REQUEST record of this version");
  }
  const bool seq_text = (h.flags & rec::kReqSeqString) != 0;
  if ((h.flags & rec::kReqTraceMask) != 0 ||
      ((h.tail_len != 0 || seq_text) && g_types.tail_of == nullptr) ||
      (seq_text && h.tail_len == 0)) {
    Py_RETURN_NONE;  // NOTE: a trace level (and the forms above): the Python decoder reads them
  }
  Ref tail(h.tail_len != 0 ? Tail(data, size, h) : nullptr);
  if (h.tail_len != 0 && !tail) return nullptr;
  const size_t entries = sizeof h + size_t{h.n_inputs} * sizeof(rec::TensorEntry);
  if (entries + size_t{h.n_outputs} * sizeof(rec::OutputEntry) > size) {
    return Malformed("its entries pass its end");
  }
  Ref inputs(Inputs(data, size, h.n_inputs));
  if (!inputs) return nullptr;
  Ref outputs(Outputs(data, size, entries, h.n_outputs));
  if (!outputs) return nullptr;
  Ref model(g_sites.model.Get(data, size, h.model_off, h.model_len));
  if (!model) return nullptr;
  Ref client_id(g_sites.client_id.Get(data, size, h.client_id_off, h.client_id_len));
  if (!client_id) return nullptr;
  Ref segment(g_sites.block_segment.Get(data, size, h.block_seg_off, h.block_seg_len));
  if (!segment) return nullptr;
  Ref block_offset(PyLong_FromUnsignedLongLong(h.block_offset));
  Ref generation(PyLong_FromUnsignedLong(h.block_generation));
  if (!block_offset || !generation) return nullptr;
  PyObject* block_args[] = {segment.get(), block_offset.get(), generation.get()};
  Ref block(Call(g_types.block_ref, block_args, 3));
  if (!block) return nullptr;
  Ref reply(ReplyOf(h.reply_kind, h.reply_id));  // NOTE: reply_to's object, kept
  if (!reply) return nullptr;
  Ref request_id(PyLong_FromUnsignedLongLong(h.request_id));
  Ref version(PyLong_FromLongLong(h.model_version));
  Ref batch_size(PyLong_FromUnsignedLong(h.batch_size));
  Ref arrival(PyLong_FromUnsignedLongLong(h.arrival_ns));
  Ref priority(PyLong_FromUnsignedLong(h.priority));
  Ref timeout(PyLong_FromUnsignedLong(h.timeout_us));
  Ref sequence_id(seq_text ? PyObject_GetAttr(tail.get(), g_types.seq_text)
                           : PyLong_FromUnsignedLongLong(h.sequence_id));
  Ref flags(PyLong_FromLong(h.flags & (rec::kReqSeqStart | rec::kReqSeqEnd)));
  if (!request_id || !version || !batch_size || !arrival || !priority || !timeout ||
      !sequence_id || !flags) {
    return nullptr;
  }
  PyObject* args[kNumRequestArgs + kNumTailArgs] = {
      request_id.get(), reply.get(),    model.get(),   version.get(),     batch_size.get(),
      inputs.get(),     outputs.get(),  block.get(),   arrival.get(),     priority.get(),
      timeout.get(),    client_id.get(), sequence_id.get(), flags.get()};
  if (!tail) return Call(g_types.infer_request, args, 0, g_types.kwnames);
  Ref extra[kNumTailArgs];
  for (Py_ssize_t i = 0; i < kNumTailArgs; ++i) {
    PyObject* value = PyObject_GetAttr(
        tail.get(), PyTuple_GET_ITEM(g_types.kwnames_tail, kNumRequestArgs + i));
    if (value == nullptr) return nullptr;
    extra[i].reset(value);
    args[kNumRequestArgs + i] = value;
  }
  return Call(g_types.infer_request, args, 0, g_types.kwnames_tail);
}

// RequestRecord's slots, in the order read_header fills them (request_records.py names them).
constexpr const char* kHeadSlots[] = {
    "raw",        "request_id",  "reply_to",   "model",       "version",        "batch_size",
    "arrival_ns", "priority",    "timeout_us", "sequence_id", "sequence_flags", "_full",
};
constexpr size_t kNumHeadSlots = sizeof(kHeadSlots) / sizeof(kHeadSlots[0]);
constexpr size_t kModelsKept = 4096;  // as HeaderReader's cache of model names

// The RequestRecord class and what repeats from one request to the next; the cached objects
// are owned references, kept for the process.
struct Head {
  PyTypeObject* record = nullptr;
  Py_ssize_t offsets[kNumHeadSlots] = {};
  std::unordered_map<std::string, PyObject*> models;
  std::unordered_map<uint64_t, PyObject*> replies;  // (reply_kind << 32 | reply_id)
};
Head g_head;

// The model name as a str (decoded once per name), or nullptr with the error set.
PyObject* ModelName(const uint8_t* data, uint16_t len) {
  std::string key(reinterpret_cast<const char*>(data), len);
  auto it = g_head.models.find(key);
  if (it != g_head.models.end()) return Py_NewRef(it->second);
  PyObject* name = PyUnicode_DecodeUTF8(key.data(), static_cast<Py_ssize_t>(len), "strict");
  if (name != nullptr && g_head.models.size() < kModelsKept) {
    g_head.models.emplace(std::move(key), Py_NewRef(name));
  }
  return name;
}

// The ReplyTo of (kind, id), built once by the Python reply_to and kept.
PyObject* ReplyOf(uint8_t kind, uint32_t id) {
  const uint64_t key = (uint64_t{kind} << 32) | id;
  auto it = g_head.replies.find(key);
  if (it != g_head.replies.end()) return Py_NewRef(it->second);
  Ref kind_obj(PyLong_FromLong(kind));
  Ref id_obj(PyLong_FromUnsignedLong(id));
  if (!kind_obj || !id_obj) return nullptr;
  PyObject* args[] = {kind_obj.get(), id_obj.get()};
  PyObject* reply = Call(g_types.reply_to, args, 2);
  if (reply != nullptr) g_head.replies.emplace(key, Py_NewRef(reply));
  return reply;
}

PyObject* ReadHeaderCall(PyObject* /*module*/, PyObject* buf) {
  if (g_head.record == nullptr || g_types.reply_to == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "configure_header() was not called");
    return nullptr;
  }
  View view(buf);
  if (!view.ok()) return nullptr;
  return triton_mp::decoder::ReadRequestHeader(view.data(), view.size());
}

// configure_header(RequestRecord): the class read_header builds, whose slots (kHeadSlots)
// must be object slots of its own.
PyObject* ConfigureHeader(PyObject* /*module*/, PyObject* cls) {
  if (!PyType_Check(cls)) return PyErr_Format(PyExc_TypeError, "configure_header: a class");
  Py_ssize_t offsets[kNumHeadSlots];
  for (size_t i = 0; i < kNumHeadSlots; ++i) {
    Ref descr(PyObject_GetAttrString(cls, kHeadSlots[i]));
    if (!descr) return nullptr;
    if (!Py_IS_TYPE(descr.get(), &PyMemberDescr_Type)) {
      return PyErr_Format(PyExc_TypeError, "configure_header: %s is not a slot", kHeadSlots[i]);
    }
    const PyMemberDef* member = reinterpret_cast<PyMemberDescrObject*>(descr.get())->d_member;
    if (member->type != T_OBJECT_EX ||
        reinterpret_cast<PyDescrObject*>(descr.get())->d_type != reinterpret_cast<PyTypeObject*>(cls)) {
      return PyErr_Format(PyExc_TypeError, "configure_header: %s is not its object slot",
                          kHeadSlots[i]);
    }
    offsets[i] = member->offset;
  }
  PyObject* old = reinterpret_cast<PyObject*>(g_head.record);
  g_head.record = reinterpret_cast<PyTypeObject*>(Py_NewRef(cls));
  Py_XDECREF(old);
  std::memcpy(g_head.offsets, offsets, sizeof offsets);
  Py_RETURN_NONE;
}

PyObject* DecodeRequest(PyObject* /*module*/, PyObject* buf) {
  if (g_types.infer_request == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
    return nullptr;
  }
  View view(buf);
  if (!view.ok()) return nullptr;
  return Decode(view.data(), view.size());
}

// decode_all(entries, fallback) -> tuple: BatchRequests.decoded's loop (its Python twin,
// workers/tensors/batch_requests.py): each bytes entry decoded, one this declines by
// fallback(entry) (the Python decoder), any other entry as it is.
PyObject* DecodeAll(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2 || !PyTuple_Check(args[0])) {
    PyErr_SetString(PyExc_TypeError, "decode_all(entries: tuple, fallback)");
    return nullptr;
  }
  if (g_types.infer_request == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
    return nullptr;
  }
  PyObject* entries = args[0];
  const Py_ssize_t n = PyTuple_GET_SIZE(entries);
  Ref out(PyTuple_New(n));
  if (!out) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* e = PyTuple_GET_ITEM(entries, i);
    PyObject* req;
    if (!PyBytes_CheckExact(e)) {
      req = Py_NewRef(e);
    } else {
      req = Decode(reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(e)),
                   static_cast<size_t>(PyBytes_GET_SIZE(e)));
      if (req == Py_None) {
        Py_DECREF(req);
        PyObject* fallback_args[] = {e};
        req = PyObject_Vectorcall(args[1], fallback_args, 1, nullptr);
      }
    }
    if (req == nullptr) return nullptr;
    PyTuple_SET_ITEM(out.get(), i, req);
  }
  return out.release();
}

PyObject* Configure(PyObject* /*module*/, PyObject* args) {
  PyObject *infer_request, *tensor_ref, *block_ref, *reply_to, *wire;
  if (!PyArg_ParseTuple(args, "OOOOO!:configure", &infer_request, &tensor_ref, &block_ref,
                        &reply_to, &PyTuple_Type, &wire)) {
    return nullptr;
  }
  Ref kwnames(PyTuple_New(kNumRequestArgs));
  if (!kwnames) return nullptr;
  for (Py_ssize_t i = 0; i < kNumRequestArgs; ++i) {
    PyObject* name = PyUnicode_InternFromString(kRequestArgs[i]);
    if (name == nullptr) return nullptr;
    PyTuple_SET_ITEM(kwnames.get(), i, name);
  }
  Keep(&g_types.infer_request, infer_request);
  Keep(&g_types.tensor_ref, tensor_ref);
  Keep(&g_types.block_ref, block_ref);
  Keep(&g_types.reply_to, reply_to);
  Keep(&g_types.wire, wire);
  Py_XSETREF(g_types.kwnames, kwnames.release());
  Py_RETURN_NONE;
}

// configure_tail(tail_of): the callable (tail bytes) -> RequestTail that lets decode() read
// records with a tail (after configure()).
PyObject* ConfigureTail(PyObject* /*module*/, PyObject* tail_of) {
  if (g_types.kwnames == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
    return nullptr;
  }
  if (!PyCallable_Check(tail_of)) return PyErr_Format(PyExc_TypeError, "configure_tail: a callable");
  Ref kwnames(PyTuple_New(kNumRequestArgs + kNumTailArgs));
  if (!kwnames) return nullptr;
  for (Py_ssize_t i = 0; i < kNumRequestArgs + kNumTailArgs; ++i) {
    PyObject* name = i < kNumRequestArgs ? Py_NewRef(PyTuple_GET_ITEM(g_types.kwnames, i))
                                         : PyUnicode_InternFromString(kTailArgs[i - kNumRequestArgs]);
    if (name == nullptr) return nullptr;
    PyTuple_SET_ITEM(kwnames.get(), i, name);
  }
  PyObject* seq = PyUnicode_InternFromString("sequence_id");
  if (seq == nullptr) return nullptr;
  Py_XSETREF(g_types.seq_text, seq);
  Keep(&g_types.tail_of, tail_of);
  Py_XSETREF(g_types.kwnames_tail, kwnames.release());
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"configure", Configure, METH_VARARGS,
     "configure(InferRequest, TensorRef, BlockRef, reply_to, wire): the types to build."},
    {"configure_tail", ConfigureTail, METH_O,
     "configure_tail(tail_of): tail bytes -> RequestTail, so that decode() reads tails."},
    {"decode", DecodeRequest, METH_O,
     "decode(buffer) -> InferRequest | None (None: a trace level; decode in Python)."},
    {"decode_all", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(DecodeAll)),
     METH_FASTCALL,
     "decode_all(entries, fallback) -> tuple: each bytes entry decoded (fallback(entry) where "
     "decode declines), any other as it is."},
    {"configure_header", ConfigureHeader, METH_O,
     "configure_header(RequestRecord): the class read_header builds."},
    {"read_header", ReadHeaderCall, METH_O,
     "read_header(buffer) -> RequestRecord | None (None: a rare form; read in Python)."},
    {"pop_records", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(triton_mp::decoder::PopRecords)),
     METH_FASTCALL,
     "pop_records(ring, capacity, fallback) -> list: every record published in the ring "
     "(ring_records.cc)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_request_decoder", "REQUEST records decoded in C (records.h).", -1,
    kMethods, nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

namespace triton_mp::decoder {

bool HeaderConfigured() { return g_head.record != nullptr && g_types.reply_to != nullptr; }

PyObject* ReadRequestHeader(const uint8_t* data, size_t size) {
  rec::RequestHeader h;
  if (size < sizeof h) return Malformed("shorter than its header");
  std::memcpy(&h, data, sizeof h);
  // NOTE: a tail (parameters, client output regions) is no scheduling field: it stays in
  // the record's bytes, read on first use (RequestRecord.full) or by the worker. A string
  // sequence id (in the tail) and a trace level are, and go to HeaderReader's full decode,
  // as does a tail outside the record (which it refuses).
  if (h.marker != rec::kRecordMarker || h.kind != rec::kKindRequest ||
      h.version != rec::kRecordVersion ||
      (h.flags & (rec::kReqTraceMask | rec::kReqSeqString)) != 0 ||
      h.model_off > size || h.model_len > size - h.model_off ||
      (h.tail_len != 0 && (h.tail_off > size || h.tail_len > size - h.tail_off))) {
    Py_RETURN_NONE;  // NOTE: the rare forms (and a bad one): HeaderReader reads them
  }
  Ref model(ModelName(data + h.model_off, h.model_len));
  if (!model) return nullptr;
  Ref reply(ReplyOf(h.reply_kind, h.reply_id));
  if (!reply) return nullptr;
  PyObject* values[kNumHeadSlots] = {
      PyBytes_FromStringAndSize(reinterpret_cast<const char*>(data),
                                static_cast<Py_ssize_t>(size)),
      PyLong_FromUnsignedLongLong(h.request_id),
      reply.release(),
      model.release(),
      PyLong_FromLongLong(h.model_version),
      PyLong_FromUnsignedLong(h.batch_size),
      PyLong_FromUnsignedLongLong(h.arrival_ns),
      PyLong_FromUnsignedLong(h.priority),
      PyLong_FromUnsignedLong(h.timeout_us),
      PyLong_FromUnsignedLongLong(h.sequence_id),
      PyLong_FromLong(h.flags & (rec::kReqSeqStart | rec::kReqSeqEnd)),
      Py_NewRef(Py_None),
  };
  // NOTE: the record owns every value from here on (a NULL slot reads as unset).
  Ref out(g_head.record->tp_alloc(g_head.record, 0));
  bool ok = static_cast<bool>(out);
  for (size_t i = 0; i < kNumHeadSlots; ++i) {
    ok = ok && values[i] != nullptr;
    if (out) {
      *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(out.get()) + g_head.offsets[i]) =
          values[i];
    } else {
      Py_XDECREF(values[i]);
    }
  }
  return ok ? out.release() : nullptr;
}

}  // namespace triton_mp::decoder

PyMODINIT_FUNC PyInit__request_decoder() { return PyModule_Create(&kModule); }
