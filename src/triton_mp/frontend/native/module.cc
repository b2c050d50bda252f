// triton_mp.frontend.native._native: the CPython binding of the native gRPC server.
// Python twin: frontend/native/__init__.py (NativeServer). One server per process. Every
// blocking call releases the GIL; the server's own thread never takes it.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <grpc/slice.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "answer_reader_py.h"
#include "answer_thread_py.h"
#include "direct_handoff_py.h"
#include "input_arena_type.h"
#include "known_answer_py.h"
#include "known_regions_py.h"
#include "known_submit_py.h"
#include "known_wake_py.h"
#include "native_server.h"
#include "record_patch_py.h"
#include "received.h"
#include "ring_producer_type.h"
#include "request_split.h"

namespace {

std::unique_ptr<triton_mp::NativeServer> g_server;

// start(address, backend, channel_args, handoff) -> port
// channel_args: a sequence of (str, int). Returns 0 when the port cannot be bound.
PyObject* Start(PyObject*, PyObject* args) {
  const char* address;
  const char* backend;
  PyObject* channel_args;
  int handoff;
  if (!PyArg_ParseTuple(args, "ssOp", &address, &backend, &channel_args, &handoff)) {
    return nullptr;
  }
  if (g_server) {
    PyErr_SetString(PyExc_RuntimeError, "the native gRPC server is already running");
    return nullptr;
  }
  triton_mp::NativeServerOptions options;
  options.address = address;
  options.backend = backend;
  options.handoff = handoff != 0;
  PyObject* seq = PySequence_Fast(channel_args, "channel_args must be a sequence");
  if (seq == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    const char* key;
    int value;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "si", &key, &value)) {
      Py_DECREF(seq);
      return nullptr;
    }
    options.channel_args.emplace_back(key, value);
  }
  Py_DECREF(seq);
  std::unique_ptr<triton_mp::NativeServer> server;
  Py_BEGIN_ALLOW_THREADS
  server = triton_mp::NativeServer::Start(options);
  Py_END_ALLOW_THREADS
  if (!server) return PyLong_FromLong(0);
  int port = server->port();
  g_server = std::move(server);
  return PyLong_FromLong(port);
}

// stop(grace_s) -> bool: stops accepting, cancels what still runs after grace_s, joins the
// thread. True: it cancelled a call still running then (stop_cut.h).
// NOTE: the event loop keeps calling take/reply meanwhile (this runs in an executor): the
// server is destroyed only after Stop, with the GIL held, which those calls hold too.
PyObject* Stop(PyObject*, PyObject* args) {
  double grace_s;
  if (!PyArg_ParseTuple(args, "d", &grace_s)) return nullptr;
  triton_mp::NativeServer* server = g_server.get();
  bool cut = false;
  if (server) {
    triton_mp::StopAnswerThread();  // NOTE: it delivers through this server's handoff
    Py_BEGIN_ALLOW_THREADS
    cut = server->Stop(grace_s);
    Py_END_ALLOW_THREADS
    g_server.reset();
  }
  return PyBool_FromLong(cut);
}

triton_mp::Handoff* CurrentHandoff() { return g_server ? g_server->handoff() : nullptr; }

// handoff_fd() -> int: the eventfd that is readable when take() has items (-1: no handoff).
PyObject* HandoffFd(PyObject*, PyObject*) {
  triton_mp::Handoff* h = CurrentHandoff();
  return PyLong_FromLong(h ? h->fd() : -1);
}

PyObject* BytesOf(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  if (!buffer.Valid() || !buffer.Dump(&slices).ok()) return PyBytes_FromStringAndSize("", 0);
  PyObject* out = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(buffer.Length()));
  if (out == nullptr) return nullptr;
  char* dst = PyBytes_AS_STRING(out);
  for (const auto& s : slices) {
    std::memcpy(dst, s.begin(), s.size());
    dst += s.size();
  }
  return out;
}

PyObject* MetadataOf(const std::vector<std::pair<std::string, std::string>>& metadata) {
  PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(metadata.size()));
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < metadata.size(); ++i) {
    const auto& kv = metadata[i];
    bool binary = kv.first.size() > 4 && kv.first.compare(kv.first.size() - 4, 4, "-bin") == 0;
    PyObject* pair = binary ? Py_BuildValue("(s#y#)", kv.first.data(), kv.first.size(),
                                            kv.second.data(), kv.second.size())
                            : Py_BuildValue("(s#s#)", kv.first.data(), kv.first.size(),
                                            kv.second.data(), kv.second.size());
    if (pair == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(i), pair);
  }
  return out;
}

// split_infer(data: bytes) -> the split of data (received.h SplitTupleOf) or None (the
// splitter alone, for tests).
PyObject* SplitInfer(PyObject*, PyObject* args) {
  Py_buffer data;
  if (!PyArg_ParseTuple(args, "y*", &data)) return nullptr;
  triton_mp::Chunks message;
  message.Add(static_cast<const unsigned char*>(data.buf), static_cast<size_t>(data.len));
  triton_mp::RequestSplit split;
  bool ok = triton_mp::SplitInferRequest(message, &split);
  PyObject* out = triton_mp::SplitTupleOf(message, ok, split);
  PyBuffer_Release(&data);
  return out;
}

// call_request(parts: sequence of bytes) -> (data, split): what take() gives for a unary
// call whose request gRPC received in these slices, one per part (received.h, for tests).
PyObject* CallRequest(PyObject*, PyObject* args) {
  PyObject* parts;
  if (!PyArg_ParseTuple(args, "O", &parts)) return nullptr;
  PyObject* seq = PySequence_Fast(parts, "parts must be a sequence of bytes");
  if (seq == nullptr) return nullptr;
  std::vector<grpc::Slice> slices;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    PyObject* part = PySequence_Fast_GET_ITEM(seq, i);
    if (!PyBytes_Check(part)) {
      Py_DECREF(seq);
      PyErr_SetString(PyExc_TypeError, "parts must be a sequence of bytes");
      return nullptr;
    }
    slices.emplace_back(PyBytes_AS_STRING(part), static_cast<size_t>(PyBytes_GET_SIZE(part)));
  }
  Py_DECREF(seq);
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  PyObject* data;
  PyObject* split;
  if (!triton_mp::CallRequestOf(buffer, &data, &split)) return nullptr;
  return Py_BuildValue("(NN)", data, split);
}

// take() -> list of (id, kind, request bytes or None, metadata ((key, value), ...) or None,
// split or None): kind is handoff.h's ItemKind (data for kCall and kStreamMessage, metadata
// for kCall and kStreamOpen); a unary call's request comes as received.h CallRequestOf
// makes it (its bytes or a Received, and its split); a kKnown's data is what was sent,
// (request id, lesson id, block offset, block generation), its split the call's request id
// (str; None: none), and so are a kAccepted's; a kLost has neither.
PyObject* Take(PyObject*, PyObject*) {
  triton_mp::Handoff* h = CurrentHandoff();
  std::vector<triton_mp::HandoffItem> items;
  if (h) items = h->Take();
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(items.size()));
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& item = items[i];
    bool has_data = item.kind == triton_mp::ItemKind::kCall ||
                    item.kind == triton_mp::ItemKind::kStreamMessage;
    bool has_metadata = item.kind == triton_mp::ItemKind::kCall ||
                        item.kind == triton_mp::ItemKind::kStreamOpen;
    PyObject* data = nullptr;
    PyObject* md = nullptr;
    PyObject* split = nullptr;
    if (item.kind == triton_mp::ItemKind::kCall) {
      if (!triton_mp::CallRequestOf(item.data, &data, &split)) data = nullptr;
    } else if (item.kind == triton_mp::ItemKind::kKnown ||
               item.kind == triton_mp::ItemKind::kAccepted) {
      const triton_mp::KnownSent& k = item.known;
      data = Py_BuildValue("(KKKk)", static_cast<unsigned long long>(k.request_id),
                           static_cast<unsigned long long>(k.lesson_id),
                           static_cast<unsigned long long>(k.offset),
                           static_cast<unsigned long>(k.generation));
      if (data != nullptr && !k.client_id.empty()) {  // NOTE: UTF-8 (KnownSubmit checked)
        split = PyUnicode_DecodeUTF8(k.client_id.data(),
                                     static_cast<Py_ssize_t>(k.client_id.size()), "strict");
        if (split == nullptr) Py_CLEAR(data);
      }
    } else if (has_data) {
      data = BytesOf(item.data);
    } else {
      data = Py_None;
      Py_INCREF(data);
    }
    if (data != nullptr) {
      if (has_metadata) {
        md = MetadataOf(item.metadata);
      } else {
        md = Py_None;
        Py_INCREF(md);
      }
    }
    if (data != nullptr && md != nullptr && split == nullptr) {
      split = Py_None;
      Py_INCREF(split);
    }
    PyObject* entry = nullptr;
    if (data != nullptr && md != nullptr) {
      entry = Py_BuildValue("(KiNNN)", static_cast<unsigned long long>(item.id),
                            static_cast<int>(item.kind), data, md, split);
    } else {
      Py_XDECREF(data);
      Py_XDECREF(md);
      Py_XDECREF(split);
    }
    if (entry == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(i), entry);
  }
  return out;
}

grpc::ByteBuffer BufferOf(const Py_buffer& bytes) {
  grpc::Slice slice(bytes.buf, static_cast<size_t>(bytes.len));
  return grpc::ByteBuffer(&slice, 1);
}

// The Py_buffers of a sequence of bytes-like parts, released when it goes.
class Parts {
 public:
  Parts() = default;
  Parts(const Parts&) = delete;
  Parts& operator=(const Parts&) = delete;
  ~Parts() {
    for (auto& view : views_) PyBuffer_Release(&view);
  }

  // False (a Python error set): `parts` is not a sequence of contiguous bytes-like objects.
  bool Open(PyObject* parts) {
    PyObject* seq = PySequence_Fast(parts, "response must be bytes or a sequence of them");
    if (seq == nullptr) return false;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    views_.reserve(static_cast<size_t>(n));
    bool ok = true;
    for (Py_ssize_t i = 0; ok && i < n; ++i) {
      Py_buffer view;
      ok = PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, i), &view, PyBUF_CONTIG_RO) == 0;
      if (ok) {
        views_.push_back(view);
        total_ += static_cast<size_t>(view.len);
      }
    }
    Py_DECREF(seq);
    return ok;
  }

  // One slice holding the parts one after the other: each copied once.
  grpc::ByteBuffer Joined() const {
    grpc_slice joined = grpc_slice_malloc(total_);
    uint8_t* dst = GRPC_SLICE_START_PTR(joined);
    for (const auto& view : views_) {
      if (view.len > 0) std::memcpy(dst, view.buf, static_cast<size_t>(view.len));
      dst += view.len;
    }
    grpc::Slice slice(joined, grpc::Slice::STEAL_REF);
    return grpc::ByteBuffer(&slice, 1);
  }

 private:
  std::vector<Py_buffer> views_;
  size_t total_ = 0;
};

// reply(id, code, details, response) -> bool: the end of a taken call (code 0: OK, with a
// unary call's response bytes; else the status and details), sent after the next kick().
// response: bytes-like, or a sequence of bytes-like parts sent as their concatenation (each
// copied once, here: a part may be a view of a shared-memory block freed after this call).
// False: the call is gone.
PyObject* Reply(PyObject*, PyObject* args) {
  unsigned long long id;
  int code;
  const char* details;
  Py_ssize_t details_len;
  PyObject* response;
  if (!PyArg_ParseTuple(args, "Kis#O", &id, &code, &details, &details_len, &response)) {
    return nullptr;
  }
  Parts parts;
  if (PyObject_CheckBuffer(response)) {
    PyObject* one = PyTuple_Pack(1, response);
    if (one == nullptr) return nullptr;
    bool ok = parts.Open(one);
    Py_DECREF(one);
    if (!ok) return nullptr;
  } else if (!parts.Open(response)) {
    return nullptr;
  }
  triton_mp::Handoff* h = CurrentHandoff();
  bool delivered = false;
  if (h) {
    grpc::Status status(static_cast<grpc::StatusCode>(code),
                        std::string(details, static_cast<size_t>(details_len)));
    delivered = h->Reply(id, std::move(status), parts.Joined());
  }
  return PyBool_FromLong(delivered);
}

// write(id, response) -> bool: one response message of a taken stream, before its end, sent
// after the next kick(). False: the call is gone.
PyObject* Write(PyObject*, PyObject* args) {
  unsigned long long id;
  Py_buffer response;
  if (!PyArg_ParseTuple(args, "Ky*", &id, &response)) return nullptr;
  triton_mp::Handoff* h = CurrentHandoff();
  bool delivered = h != nullptr && h->Write(id, BufferOf(response));
  PyBuffer_Release(&response);
  return PyBool_FromLong(delivered);
}

// kick(): deliver the answers reply() and write() queued so far (handoff.h Kick).
PyObject* Kick(PyObject*, PyObject*) {
  triton_mp::Handoff* h = CurrentHandoff();
  if (h) h->Kick();
  Py_RETURN_NONE;
}

// owned() -> int: the known calls the gRPC thread submitted and keeps now (handoff.h owned),
// whose answers C++ serves: 0 without a server.
PyObject* Owned(PyObject*, PyObject*) {
  triton_mp::Handoff* h = CurrentHandoff();
  return PyLong_FromSize_t(h != nullptr ? h->owned() : 0);
}

PyMethodDef kMethods[] = {
    {"start", Start, METH_VARARGS, "Bind the public port and serve; returns the port or 0."},
    {"stop", Stop, METH_VARARGS,
     "Stop serving (grace in seconds) and join the thread; True if it cut calls."},
    {"handoff_fd", HandoffFd, METH_NOARGS, "The eventfd readable when take() has items."},
    {"take", Take, METH_NOARGS, "The handed-off calls and cancellations queued so far."},
    {"reply", Reply, METH_VARARGS, "End a handed-off call: (id, code, details, bytes)."},
    {"write", Write, METH_VARARGS, "A handed-off stream's next message: (id, bytes)."},
    {"kick", Kick, METH_NOARGS, "Deliver the answers queued by reply() and write() so far."},
    {"owned", Owned, METH_NOARGS, "The known calls kept now, their answers served in C++."},
    {"split_infer", SplitInfer, METH_VARARGS, "Split a ModelInferRequest (request_split.h)."},
    {"call_request", CallRequest, METH_VARARGS, "take()'s (data, split) of a call in slices."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_native", "The native gRPC server.", -1, kMethods,
                       nullptr, nullptr, nullptr, nullptr};

}  // namespace

namespace triton_mp {
Handoff* ServerHandoff() { return CurrentHandoff(); }
}  // namespace triton_mp

// ABI: what this build's functions take, checked by native/__init__.py (_ABI, its twin): 9,
// reply() takes a response's parts, take() gives kKnown (with the call's request id), kLost
// and kAccepted entries (known_log), a known lesson serves calls with any request id, known_* teach the
// gRPC thread, direct_* open the direct handoff's routes and set its full ring's wait,
// answer_thread_* read the inbox in C++, known_submit can hold a copy in flight
// (known_release_held, known_reserved).
PyMODINIT_FUNC PyInit__native() {
  PyObject* module = PyModule_Create(&kModule);
  if (module != nullptr && (PyModule_AddIntConstant(module, "ABI", 9) != 0 ||
                            !triton_mp::AddReceivedType(module) ||
                            !triton_mp::AddInputArenaType(module) ||
                            !triton_mp::AddRecordPatch(module) ||
                            !triton_mp::AddRingProducerType(module) ||
                            !triton_mp::AddKnownSubmit(module) ||
                            !triton_mp::AddKnownRegions(module) ||
                            !triton_mp::AddDirectHandoff(module) ||
                            !triton_mp::AddKnownWake(module) ||
                            !triton_mp::AddAnswerReader(module) ||
                            !triton_mp::AddKnownAnswer(module) ||
                            !triton_mp::AddAnswerThread(module) ||
                            PyModule_AddIntConstant(
                                module, "RECEIVED_MIN_RAW_BYTES",
                                static_cast<long>(triton_mp::kReceivedMinRawBytes)) != 0)) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
