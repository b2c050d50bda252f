// A formed batch's wire form, the scheduler's send of it (part of the
// triton_mp.scheduler._queue_records extension; its module table is in queue_records.cc):
// - batch_forms(items) -> (requests, wire forms) | None: SchedulerCore._assign's two tuples of
//   a batch's Queued items, their payloads and each payload's wire form (a RequestRecord's
//   `raw` bytes, any other payload itself: records.wire_form). None when an item is not exactly
//   a Queued or a slot is unset: the twin, batch_forms_py, builds them then.
// - push_assign(ring_buf, assign) -> bool: a BatchAssign written as msgspec's msgpack bytes
//   straight into the worker's ring.
//
// Python twin: push_assign_py in src/triton_mp/scheduler/assign_push.py, which is
// Router.send's own path: `Ring.push(encode(assign))` (ipc/recordio/codec.py's msgspec encoder;
// tests/unit/test_assign_push.py compares every byte of the ring, and every answer, with it over
// random batches). The record written is msgspec's encoding of the array-like, tagged struct:
//   fixarray(7), fixstr tag ("batch"), int batch_id, array of bin (each request record
//   verbatim), int dispatch_ns, int rows, fixarray(0) slots, fixarray(0) released,
// each int in msgpack's smallest form (positive fixint, uint8..uint64, negative fixint,
// int8..int64), as msgspec writes it. The ring layout is ipc/native/ring_push.h's (its twin:
// Ring.push in src/triton_mp/ipc/memory/ring.py).
//
// It writes only what Python formed and decided to send: a batch whose requests are all record
// bytes (an InferRequest entry is encoded by msgspec), with no sequence slots and no released
// correlation IDs. Anything else, a full ring, a record too large for the ring, a buffer that
// holds no ring: nothing is written and it returns False; Python's path then sends (and waits
// on a full ring, or raises RecordTooLarge, in its own words).
//
// Why: per batch of ~10 add_sub requests, Python's encode (a 4 KiB bytes object) and Ring.push
// cost ~2.7 µs hot, the scheduler's dispatch phase (issue 34).
#include "assign_push.h"

#include <cstdint>
#include <cstring>
#include <vector>

#include "../../ipc/native/py_ref.h"
#include "../../ipc/native/ring_push.h"
#include "../../ipc/native/slots.h"

namespace {

using triton_mp::Keep;
using triton_mp::SlotGet;
using triton_mp::SlotOffsets;

// BatchAssign's fields, in its declared (and so its wire) order (ipc/protocol/messages.py).
enum AssignField : size_t {
  kBatchId, kRequests, kDispatchNs, kRows, kSlots, kReleased, kNumAssignFields,
};
constexpr const char* kAssignFields[] = {
    "batch_id", "requests", "dispatch_ns", "rows", "slots", "released",
};
static_assert(sizeof(kAssignFields) / sizeof(kAssignFields[0]) == kNumAssignFields);

struct Assign {
  PyTypeObject* cls = nullptr;
  PyTypeObject* queued = nullptr;
  PyTypeObject* record = nullptr;
  Py_ssize_t payload_at = 0;  // Queued.payload
  Py_ssize_t raw_at = 0;      // RequestRecord.raw
  Py_ssize_t at[kNumAssignFields] = {};
  std::vector<unsigned char> tag;  // the tag as msgpack str, e.g. a5 "batch"
};
Assign g;

// An int as msgspec writes it; false (nothing written) outside [-2**63, 2**64).
bool PutInt(std::vector<unsigned char>* out, PyObject* v) {
  int overflow = 0;
  const long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
  if (x == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    return false;
  }
  auto be = [out](uint64_t u, int bytes) {
    for (int i = bytes - 1; i >= 0; --i) out->push_back(static_cast<unsigned char>(u >> (8 * i)));
  };
  if (overflow < 0) return false;
  if (overflow > 0) {
    const unsigned long long u = PyLong_AsUnsignedLongLong(v);
    if (u == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
    out->push_back(0xcf);
    be(u, 8);
    return true;
  }
  if (x >= 0) {
    const auto u = static_cast<uint64_t>(x);
    if (u < 128) {
      out->push_back(static_cast<unsigned char>(u));
    } else if (u < 0x100) {
      out->push_back(0xcc);
      be(u, 1);
    } else if (u < 0x10000) {
      out->push_back(0xcd);
      be(u, 2);
    } else if (u < 0x100000000ULL) {
      out->push_back(0xce);
      be(u, 4);
    } else {
      out->push_back(0xcf);
      be(u, 8);
    }
    return true;
  }
  const auto u = static_cast<uint64_t>(x);
  if (x >= -32) {
    out->push_back(static_cast<unsigned char>(u));
  } else if (x >= -128) {
    out->push_back(0xd0);
    be(u, 1);
  } else if (x >= -32768) {
    out->push_back(0xd1);
    be(u, 2);
  } else if (x >= -2147483648LL) {
    out->push_back(0xd2);
    be(u, 4);
  } else {
    out->push_back(0xd3);
    be(u, 8);
  }
  return true;
}

// A msgpack array or bin header of n items or bytes; false past 2**32 - 1.
bool PutHeader(std::vector<unsigned char>* out, size_t n, bool bin) {
  auto be = [out](uint64_t u, int bytes) {
    for (int i = bytes - 1; i >= 0; --i) out->push_back(static_cast<unsigned char>(u >> (8 * i)));
  };
  if (n > 0xFFFFFFFFULL) return false;
  if (bin) {
    if (n < 0x100) {
      out->push_back(0xc4);
      be(n, 1);
    } else if (n < 0x10000) {
      out->push_back(0xc5);
      be(n, 2);
    } else {
      out->push_back(0xc6);
      be(n, 4);
    }
  } else if (n < 16) {
    out->push_back(static_cast<unsigned char>(0x90 | n));
  } else if (n < 0x10000) {
    out->push_back(0xdc);
    be(n, 2);
  } else {
    out->push_back(0xdd);
    be(n, 4);
  }
  return true;
}

// The record of `assign` into *out, or false when the twin's path must send it (see above).
bool Encode(PyObject* assign, std::vector<unsigned char>* out) {
  PyObject* f[kNumAssignFields];
  for (size_t i = 0; i < kNumAssignFields; ++i) {
    f[i] = SlotGet(assign, g.at[i]);
    if (f[i] == nullptr) return false;
  }
  PyObject* requests = f[kRequests];
  if (!PyLong_CheckExact(f[kBatchId]) || !PyLong_CheckExact(f[kDispatchNs]) ||
      !PyLong_CheckExact(f[kRows]) || !PyTuple_CheckExact(requests) ||
      !PyTuple_CheckExact(f[kSlots]) || PyTuple_GET_SIZE(f[kSlots]) != 0 ||
      !PyTuple_CheckExact(f[kReleased]) || PyTuple_GET_SIZE(f[kReleased]) != 0) {
    return false;
  }
  const Py_ssize_t n = PyTuple_GET_SIZE(requests);
  size_t payload = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* r = PyTuple_GET_ITEM(requests, i);
    if (!PyBytes_CheckExact(r)) return false;
    payload += static_cast<size_t>(PyBytes_GET_SIZE(r)) + 5;
  }
  out->clear();
  out->reserve(payload + g.tag.size() + 48);
  out->push_back(0x97);
  out->insert(out->end(), g.tag.begin(), g.tag.end());
  if (!PutInt(out, f[kBatchId]) || !PutHeader(out, static_cast<size_t>(n), false)) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* r = PyTuple_GET_ITEM(requests, i);
    const auto len = static_cast<size_t>(PyBytes_GET_SIZE(r));
    if (!PutHeader(out, len, true)) return false;
    const auto* data = reinterpret_cast<const unsigned char*>(PyBytes_AS_STRING(r));
    out->insert(out->end(), data, data + len);
  }
  if (!PutInt(out, f[kDispatchNs]) || !PutInt(out, f[kRows])) return false;
  out->push_back(0x90);  // slots: ()
  out->push_back(0x90);  // released: ()
  return true;
}

}  // namespace

PyObject* TritonMpPushAssign(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "push_assign(ring_buf, assign)");
    return nullptr;
  }
  if (g.cls == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "configure_assign() was not called");
    return nullptr;
  }
  if (!Py_IS_TYPE(args[1], g.cls)) Py_RETURN_FALSE;
  // NOTE: one buffer for the process (the scheduler's loop is its only caller), kept warm.
  static std::vector<unsigned char> record;
  if (!Encode(args[1], &record)) Py_RETURN_FALSE;
  Py_buffer view;
  if (PyObject_GetBuffer(args[0], &view, PyBUF_WRITABLE) != 0) return nullptr;
  auto* base = static_cast<unsigned char*>(view.buf);
  const triton_mp::RingPush got = triton_mp::PushRecord(
      base, static_cast<uint64_t>(view.len), record.data(), record.size());
  PyBuffer_Release(&view);
  return PyBool_FromLong(got == triton_mp::RingPush::kPushed);
}

PyObject* TritonMpBatchForms(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 1 || !PyTuple_CheckExact(args[0])) {
    PyErr_SetString(PyExc_TypeError, "batch_forms(items: tuple)");
    return nullptr;
  }
  if (g.queued == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "configure_assign() was not called");
    return nullptr;
  }
  PyObject* items = args[0];
  const Py_ssize_t n = PyTuple_GET_SIZE(items);
  triton_mp::Ref reqs(PyTuple_New(n));
  triton_mp::Ref wires(PyTuple_New(n));
  if (!reqs || !wires) return nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyTuple_GET_ITEM(items, i);
    if (!Py_IS_TYPE(item, g.queued)) Py_RETURN_NONE;
    PyObject* payload = SlotGet(item, g.payload_at);
    if (payload == nullptr) Py_RETURN_NONE;
    PyObject* wire = payload;
    if (Py_IS_TYPE(payload, g.record)) {
      wire = SlotGet(payload, g.raw_at);
      if (wire == nullptr) Py_RETURN_NONE;
    }
    PyTuple_SET_ITEM(reqs.get(), i, Py_NewRef(payload));
    PyTuple_SET_ITEM(wires.get(), i, Py_NewRef(wire));
  }
  return PyTuple_Pack(2, reqs.get(), wires.get());
}

PyObject* TritonMpConfigureAssign(PyObject* /*module*/, PyObject* const* args,
                                  Py_ssize_t nargs) {
  if (nargs != 4 || !PyUnicode_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "configure_assign(BatchAssign, tag: str, Queued, RequestRecord)");
    return nullptr;
  }
  Py_ssize_t at[kNumAssignFields];
  constexpr const char* kPayload[] = {"payload"};
  constexpr const char* kRaw[] = {"raw"};
  Py_ssize_t payload_at[1];
  Py_ssize_t raw_at[1];
  if (!SlotOffsets(args[0], kAssignFields, kNumAssignFields, at) ||
      !SlotOffsets(args[2], kPayload, 1, payload_at) || !SlotOffsets(args[3], kRaw, 1, raw_at)) {
    return nullptr;
  }
  Py_ssize_t len = 0;
  const char* tag = PyUnicode_AsUTF8AndSize(args[1], &len);
  if (tag == nullptr) return nullptr;
  if (len >= 32) {
    PyErr_SetString(PyExc_ValueError, "configure_assign: the tag must be a fixstr (< 32 bytes)");
    return nullptr;
  }
  g.tag.assign(1, static_cast<unsigned char>(0xa0 | len));
  g.tag.insert(g.tag.end(), tag, tag + len);
  Keep(&g.cls, args[0]);
  Keep(&g.queued, args[2]);
  Keep(&g.record, args[3]);
  g.payload_at = payload_at[0];
  g.raw_at = raw_at[0];
  for (size_t i = 0; i < kNumAssignFields; ++i) g.at[i] = at[i];
  Py_RETURN_NONE;
}
