// See received.h.
#include "received.h"

#include <memory>
#include <utility>
#include <vector>

namespace triton_mp {
namespace {

// A message's slices (references: no copy) and its view of them. NOTE: the chunks point
// into the slices (an inlined slice's bytes lie in its grpc_slice): built once the slices
// are in place, and moved only as a whole (a unique_ptr).
struct Held {
  std::vector<grpc::Slice> slices;
  Chunks chunks;
};

struct ReceivedObject {
  PyObject_HEAD
  std::unique_ptr<Held> held;
};

PyTypeObject* g_received_type = nullptr;

void ReceivedDealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  reinterpret_cast<ReceivedObject*>(self)->held.~unique_ptr<Held>();
  type->tp_free(self);
  Py_DECREF(type);  // NOTE: a heap type's instances hold a reference to it
}

const Chunks& ChunksOf(PyObject* self) {
  return reinterpret_cast<ReceivedObject*>(self)->held->chunks;
}

PyObject* BytesOf(const Chunks& message) {
  PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(message.size()));
  if (out == nullptr) return nullptr;
  message.Copy(0, message.size(), reinterpret_cast<unsigned char*>(PyBytes_AS_STRING(out)));
  return out;
}

// tobytes() -> bytes: the whole message, copied.
PyObject* ReceivedToBytes(PyObject* self, PyObject*) { return BytesOf(ChunksOf(self)); }

// copy_into(dst, places): for each (at, offset, length) in places, the message's bytes
// [offset, offset + length) copied to dst[at : at + length]. Every place is checked before
// anything is copied (ValueError: one lies outside dst or the message).
PyObject* ReceivedCopyInto(PyObject* self, PyObject* args) {
  Py_buffer dst;
  PyObject* places;
  if (!PyArg_ParseTuple(args, "w*O", &dst, &places)) return nullptr;
  std::unique_ptr<Py_buffer, void (*)(Py_buffer*)> release(&dst, PyBuffer_Release);
  PyObject* seq = PySequence_Fast(places, "places must be a sequence of (at, offset, length)");
  if (seq == nullptr) return nullptr;
  const Chunks& message = ChunksOf(self);
  Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
  std::vector<std::pair<size_t, std::pair<size_t, size_t>>> plan;
  plan.reserve(static_cast<size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    Py_ssize_t at, offset, length;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "nnn", &at, &offset, &length)) {
      Py_DECREF(seq);
      return nullptr;
    }
    bool fits = at >= 0 && offset >= 0 && length >= 0 && at <= dst.len &&
                length <= dst.len - at && static_cast<size_t>(offset) <= message.size() &&
                static_cast<size_t>(length) <= message.size() - static_cast<size_t>(offset);
    if (!fits) {
      Py_DECREF(seq);
      PyErr_SetString(PyExc_ValueError, "copy_into: a place lies outside dst or the message");
      return nullptr;
    }
    plan.push_back({static_cast<size_t>(at), {static_cast<size_t>(offset),
                                              static_cast<size_t>(length)}});
  }
  Py_DECREF(seq);
  auto* base = static_cast<unsigned char*>(dst.buf);
  for (const auto& place : plan) {
    message.Copy(place.second.first, place.second.second, base + place.first);
  }
  Py_RETURN_NONE;
}

// len(received): the message's size in bytes.
Py_ssize_t ReceivedLength(PyObject* self) {
  return static_cast<Py_ssize_t>(ChunksOf(self).size());
}

PyMethodDef kReceivedMethods[] = {
    {"tobytes", ReceivedToBytes, METH_NOARGS, "The whole message, copied into bytes."},
    {"copy_into", ReceivedCopyInto, METH_VARARGS,
     "Copy (at, offset, length) places of the message into a writable buffer."},
    {nullptr, nullptr, 0, nullptr},
};

PyType_Slot kReceivedSlots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(ReceivedDealloc)},
    {Py_tp_methods, kReceivedMethods},
    {Py_sq_length, reinterpret_cast<void*>(ReceivedLength)},
    {Py_tp_doc, const_cast<char*>("A ModelInferRequest left in gRPC's receive slices.")},
    {0, nullptr},
};

PyType_Spec kReceivedSpec = {
    "triton_mp.frontend.native._native.Received",
    sizeof(ReceivedObject),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    kReceivedSlots,
};

PyObject* NewReceived(std::unique_ptr<Held> held) {
  PyObject* self = g_received_type->tp_alloc(g_received_type, 0);
  if (self == nullptr) return nullptr;
  new (&reinterpret_cast<ReceivedObject*>(self)->held) std::unique_ptr<Held>(std::move(held));
  return self;
}

}  // namespace

bool AddReceivedType(PyObject* module) {
  PyObject* type = PyType_FromSpec(&kReceivedSpec);
  if (type == nullptr) return false;
  if (PyModule_AddObjectRef(module, "Received", type) != 0) {
    Py_DECREF(type);
    return false;
  }
  g_received_type = reinterpret_cast<PyTypeObject*>(type);  // NOTE: kept for the process
  return true;
}

PyObject* SplitTupleOf(const Chunks& message, bool ok, const RequestSplit& split) {
  if (!ok) Py_RETURN_NONE;
  PyObject* raw = PyTuple_New(static_cast<Py_ssize_t>(split.raw.size()));
  if (raw == nullptr) return nullptr;
  for (size_t i = 0; i < split.raw.size(); ++i) {
    PyObject* span = Py_BuildValue("(nn)", static_cast<Py_ssize_t>(split.raw[i].first),
                                   static_cast<Py_ssize_t>(split.raw[i].second));
    if (span == nullptr) {
      Py_DECREF(raw);
      return nullptr;
    }
    PyTuple_SET_ITEM(raw, static_cast<Py_ssize_t>(i), span);
  }
  PyObject* id;
  if (split.has_id) {
    id = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(split.id.second));
    if (id != nullptr) {
      message.Copy(split.id.first, split.id.second,
                   reinterpret_cast<unsigned char*>(PyBytes_AS_STRING(id)));
    }
  } else {
    id = Py_None;
    Py_INCREF(id);
  }
  if (id == nullptr) {
    Py_DECREF(raw);
    return nullptr;
  }
  return Py_BuildValue("(y#y#NN)", split.head.data(), static_cast<Py_ssize_t>(split.head.size()),
                       split.key.data(), static_cast<Py_ssize_t>(split.key.size()), id, raw);
}

bool CallRequestOf(const grpc::ByteBuffer& buffer, PyObject** data, PyObject** split) {
  auto held = std::make_unique<Held>();
  if (buffer.Valid() && !buffer.Dump(&held->slices).ok()) held->slices.clear();
  for (const auto& slice : held->slices) held->chunks.Add(slice.begin(), slice.size());
  RequestSplit parts;
  bool ok = SplitInferRequest(held->chunks, &parts);
  size_t raw_bytes = 0;
  if (ok) {
    for (const auto& entry : parts.raw) raw_bytes += entry.second;
  }
  *split = SplitTupleOf(held->chunks, ok, parts);
  if (*split == nullptr) return false;
  *data = ok && raw_bytes >= kReceivedMinRawBytes ? NewReceived(std::move(held))
                                                  : BytesOf(held->chunks);
  if (*data == nullptr) {
    Py_CLEAR(*split);
    return false;
  }
  return true;
}

}  // namespace triton_mp
