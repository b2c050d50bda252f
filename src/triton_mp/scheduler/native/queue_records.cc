// queue_records(msgs, start, active, now_ns) -> int: a run of plain request records queued in
// one call, the scheduler core's fast lane (triton_mp.scheduler._queue_records).
//
// Python twin: queue_records_py in src/triton_mp/scheduler/plain_requests.py (the semantics;
// tests/unit/test_queue_records.py fuzzes one against the other). From msgs[start] on, each
// message that is exactly a RequestRecord, whose (model, version) names a generation in
// `active` (exactly a Generation) whose `plain` slot holds a PlainQueue, becomes a Queued
// built as SchedulerCore._offer builds it and is appended to the PlainQueue's `waiting`
// deque; the queue's count and version grow by one per request (PriorityQueue.pushed, called
// once per run). The first message it does not take stops it: its index is returned (or
// len(msgs)), and Python's handlers take that one. Python decides which generations are plain
// (plain_queue); this only moves records, and never words an error: a field it cannot read
// as the twin would (an unset slot, an int out of range) stops it too.
//
// No shared-memory layout here: every object is Python's, read and written through the
// offsets of the classes' own member descriptors (ipc/native/slots.h).
//
// Why: per request the Python path (_on_request, _offer, Queued's __init__, offer, push) was
// ~1.5 µs hot and 4-6 µs live at c=16, the scheduler's handle phase (issue 34).
#include "assign_push.h"

#include <cstddef>
#include <cstdint>

#include "../../ipc/native/py_ref.h"
#include "../../ipc/native/slots.h"

namespace {

using triton_mp::Keep;
using triton_mp::Ref;
using triton_mp::SlotGet;
using triton_mp::SlotOffsets;

// RequestRecord's slots read here (ipc/recordio/request_records.py).
enum RecordSlot : size_t {
  kModel, kVersion, kReplyTo, kRequestId, kBatchSize, kArrival, kPriority, kTimeout,
  kSequenceId, kFlags, kNumRecordSlots,
};
constexpr const char* kRecordSlots[] = {
    "model",      "version",  "reply_to",   "request_id",  "batch_size",
    "arrival_ns", "priority", "timeout_us", "sequence_id", "sequence_flags",
};
static_assert(sizeof(kRecordSlots) / sizeof(kRecordSlots[0]) == kNumRecordSlots);

// Queued's slots, all written (scheduler/policies/policy.py).
enum QueuedSlot : size_t {
  kKey, kQBatchSize, kShapeKey, kEnqueue, kPayload, kQPriority, kQTimeout, kLevel,
  kDeadline, kDelayed, kCorrid, kStarts, kEnds, kNumQueuedSlots,
};
constexpr const char* kQueuedSlots[] = {
    "key",        "batch_size", "shape_key", "enqueue_ns", "payload", "priority", "timeout_us",
    "level",      "deadline_ns", "delayed",  "corrid",     "starts",  "ends",
};
static_assert(sizeof(kQueuedSlots) / sizeof(kQueuedSlots[0]) == kNumQueuedSlots);

constexpr const char* kGenerationSlots[] = {"plain"};
constexpr const char* kPlainSlots[] = {"waiting", "queue"};

// The classes configure() was given and their slots' offsets; owned references, kept for
// the process.
struct Classes {
  PyTypeObject* record = nullptr;
  PyTypeObject* queued = nullptr;
  PyTypeObject* generation = nullptr;
  PyTypeObject* plain = nullptr;
  Py_ssize_t record_at[kNumRecordSlots] = {};
  Py_ssize_t queued_at[kNumQueuedSlots] = {};
  Py_ssize_t plain_at = 0;  // Generation.plain
  Py_ssize_t waiting_at = 0;  // PlainQueue.waiting
  Py_ssize_t queue_at = 0;  // PlainQueue.queue
  long start_bit = 0;
  long end_bit = 0;
};
Classes g;

PyObject* g_zero = nullptr;    // 0
PyObject* g_one = nullptr;     // 1
PyObject* g_empty = nullptr;   // ()
PyObject* g_append = nullptr;  // "append"
PyObject* g_pushed = nullptr;  // "pushed"

// `bool(flags & bit)` for any int `flags` (1 or 0), -1 with an error set.
int FlagSet(PyObject* flags, long bit) {
  int overflow = 0;
  const long long v = PyLong_AsLongLongAndOverflow(flags, &overflow);
  if (v == -1 && PyErr_Occurred()) return -1;
  if (overflow == 0) return (v & bit) != 0;
  Ref mask(PyLong_FromLong(bit));
  if (!mask) return -1;
  Ref both(PyNumber_And(flags, mask.get()));
  return both ? PyObject_IsTrue(both.get()) : -1;
}

// The Queued of `rec` at `now` (a new reference), or nullptr: with an error set when an
// allocation failed, without one when a field is not what the twin reads (the caller stops).
PyObject* QueuedOf(PyObject* rec, PyObject* now) {
  PyObject* f[kNumRecordSlots];
  for (size_t i = 0; i < kNumRecordSlots; ++i) {
    f[i] = SlotGet(rec, g.record_at[i]);
    if (f[i] == nullptr) return nullptr;  // NOTE: an unset slot: Python raises its own error
  }
  if (!PyLong_CheckExact(f[kBatchSize]) || !PyLong_CheckExact(f[kArrival]) ||
      !PyLong_CheckExact(f[kFlags])) {
    return nullptr;
  }
  // NOTE: `size if size > 1 else 1`, for any int (an overflow's sign says which).
  int overflow = 0;
  const long long size = PyLong_AsLongLongAndOverflow(f[kBatchSize], &overflow);
  if (size == -1 && PyErr_Occurred()) return nullptr;
  const bool big = overflow > 0 || (overflow == 0 && size > 1);
  // NOTE: `arrival if 0 < arrival <= now_ns else now_ns` (rules.admission.queue_start_ns).
  const int positive = PyObject_RichCompareBool(f[kArrival], g_zero, Py_GT);
  if (positive < 0) return nullptr;
  int past = 0;
  if (positive) {
    past = PyObject_RichCompareBool(f[kArrival], now, Py_LE);
    if (past < 0) return nullptr;
  }
  const int starts = FlagSet(f[kFlags], g.start_bit);
  const int ends = FlagSet(f[kFlags], g.end_bit);
  if (starts < 0 || ends < 0) return nullptr;
  PyObject* key = PyTuple_Pack(2, f[kReplyTo], f[kRequestId]);
  if (key == nullptr) return nullptr;
  PyObject* values[kNumQueuedSlots] = {
      key,
      Py_NewRef(big ? f[kBatchSize] : g_one),
      Py_NewRef(g_empty),
      Py_NewRef(positive && past ? f[kArrival] : now),
      Py_NewRef(rec),
      Py_NewRef(f[kPriority]),
      Py_NewRef(f[kTimeout]),
      Py_NewRef(g_zero),
      Py_NewRef(g_zero),
      Py_NewRef(Py_False),
      Py_NewRef(f[kSequenceId]),
      PyBool_FromLong(starts),
      PyBool_FromLong(ends),
  };
  // NOTE: the item owns every value from here on (dropped with it when the alloc failed).
  PyObject* item = g.queued->tp_alloc(g.queued, 0);
  for (size_t i = 0; i < kNumQueuedSlots; ++i) {
    if (item == nullptr) {
      Py_DECREF(values[i]);
      continue;
    }
    *reinterpret_cast<PyObject**>(reinterpret_cast<char*>(item) + g.queued_at[i]) = values[i];
  }
  return item;
}

// The PlainQueue `msg` goes to (borrowed), or nullptr (with an error set only when the
// lookup itself failed): not a RequestRecord, no active generation, not plain.
PyObject* PlainOf(PyObject* msg, PyObject* active) {
  if (!Py_IS_TYPE(msg, g.record)) return nullptr;
  PyObject* model = SlotGet(msg, g.record_at[kModel]);
  PyObject* version = SlotGet(msg, g.record_at[kVersion]);
  if (model == nullptr || version == nullptr) return nullptr;
  Ref key(PyTuple_Pack(2, model, version));
  if (!key) return nullptr;
  PyObject* gen = PyDict_GetItemWithError(active, key.get());
  if (gen == nullptr || !Py_IS_TYPE(gen, g.generation)) return nullptr;
  PyObject* plain = SlotGet(gen, g.plain_at);
  if (plain == nullptr || !Py_IS_TYPE(plain, g.plain)) return nullptr;
  return plain;
}

// PriorityQueue.pushed(n) on the PlainQueue's queue.
bool Pushed(PyObject* plain, Py_ssize_t n) {
  PyObject* queue = SlotGet(plain, g.queue_at);
  if (queue == nullptr) {
    PyErr_SetString(PyExc_AttributeError, "PlainQueue.queue is unset");
    return false;
  }
  Ref count(PyLong_FromSsize_t(n));
  if (!count) return false;
  Ref done(PyObject_CallMethodOneArg(queue, g_pushed, count.get()));
  return static_cast<bool>(done);
}

PyObject* QueueRecords(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4 || !PyList_Check(args[0]) || !PyLong_Check(args[1]) || !PyDict_Check(args[2]) ||
      !PyLong_Check(args[3])) {
    PyErr_SetString(PyExc_TypeError, "queue_records(msgs: list, start: int, active: dict, now_ns: int)");
    return nullptr;
  }
  if (g.record == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "configure() was not called");
    return nullptr;
  }
  PyObject* msgs = args[0];
  PyObject* active = args[2];
  PyObject* now = args[3];
  Py_ssize_t i = PyLong_AsSsize_t(args[1]);
  if (i == -1 && PyErr_Occurred()) return nullptr;
  if (i < 0) {
    PyErr_SetString(PyExc_ValueError, "queue_records: start must be >= 0");
    return nullptr;
  }
  PyObject* run = nullptr;  // NOTE: the PlainQueue of the run so far (borrowed from its gen)
  Ref run_ref;              // ...kept alive while its count is pending
  Py_ssize_t pending = 0;
  bool failed = false;
  // NOTE: the list may not change under us (no Python code runs in the loop but a deque's
  // append of a Queued, and the comparisons of ints), but its size is read each step.
  while (i < PyList_GET_SIZE(msgs)) {
    PyObject* msg = PyList_GET_ITEM(msgs, i);
    PyObject* plain = PlainOf(msg, active);
    if (plain == nullptr) {
      failed = PyErr_Occurred() != nullptr;
      break;
    }
    Ref hold(Py_NewRef(plain));  // NOTE: past any Python code the steps below may run
    PyObject* waiting = SlotGet(plain, g.waiting_at);
    if (waiting == nullptr) break;
    Ref item(QueuedOf(msg, now));
    if (!item) {
      failed = PyErr_Occurred() != nullptr;
      break;
    }
    if (plain != run) {
      if (run != nullptr && !Pushed(run, pending)) {
        failed = true;
        run = nullptr;
        break;
      }
      run = plain;
      run_ref.reset(Py_NewRef(plain));
      pending = 0;
    }
    Ref appended(PyObject_CallMethodOneArg(waiting, g_append, item.get()));
    if (!appended) {
      failed = true;
      break;
    }
    ++pending;
    ++i;
  }
  if (run != nullptr && pending > 0) {
    // NOTE: counted even when a later step failed: what was appended stays queued.
    PyObject *type, *value, *traceback;
    PyErr_Fetch(&type, &value, &traceback);
    const bool ok = Pushed(run, pending);
    if (failed) {
      if (!ok) PyErr_Clear();
      PyErr_Restore(type, value, traceback);
    } else {
      failed = !ok;
    }
  }
  if (failed) return nullptr;
  return PyLong_FromSsize_t(i);
}

// configure(RequestRecord, Queued, Generation, PlainQueue, start_bit, end_bit).
PyObject* Configure(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6 || !PyLong_Check(args[4]) || !PyLong_Check(args[5])) {
    PyErr_SetString(PyExc_TypeError,
                    "configure(RequestRecord, Queued, Generation, PlainQueue, start, end)");
    return nullptr;
  }
  Classes c;
  Py_ssize_t gen_at[1];
  Py_ssize_t plain_at[2];
  if (!SlotOffsets(args[0], kRecordSlots, kNumRecordSlots, c.record_at) ||
      !SlotOffsets(args[1], kQueuedSlots, kNumQueuedSlots, c.queued_at) ||
      !SlotOffsets(args[2], kGenerationSlots, 1, gen_at) ||
      !SlotOffsets(args[3], kPlainSlots, 2, plain_at)) {
    return nullptr;
  }
  c.start_bit = PyLong_AsLong(args[4]);
  c.end_bit = PyLong_AsLong(args[5]);
  if (PyErr_Occurred()) return nullptr;
  if (g_zero == nullptr) {
    g_zero = PyLong_FromLong(0);
    g_one = PyLong_FromLong(1);
    g_empty = PyTuple_New(0);
    g_append = PyUnicode_InternFromString("append");
    g_pushed = PyUnicode_InternFromString("pushed");
    if (g_zero == nullptr || g_one == nullptr || g_empty == nullptr || g_append == nullptr ||
        g_pushed == nullptr) {
      return nullptr;
    }
  }
  Keep(&g.record, args[0]);
  Keep(&g.queued, args[1]);
  Keep(&g.generation, args[2]);
  Keep(&g.plain, args[3]);
  for (size_t i = 0; i < kNumRecordSlots; ++i) g.record_at[i] = c.record_at[i];
  for (size_t i = 0; i < kNumQueuedSlots; ++i) g.queued_at[i] = c.queued_at[i];
  g.plain_at = gen_at[0];
  g.waiting_at = plain_at[0];
  g.queue_at = plain_at[1];
  g.start_bit = c.start_bit;
  g.end_bit = c.end_bit;
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"configure", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(Configure)),
     METH_FASTCALL,
     "configure(RequestRecord, Queued, Generation, PlainQueue, start_bit, end_bit): the classes "
     "queue_records reads and builds, and SequenceFlags' START and END bits."},
    {"queue_records", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(QueueRecords)),
     METH_FASTCALL,
     "queue_records(msgs, start, active, now_ns) -> int: plain request records queued from "
     "msgs[start] on; the index of the first message not taken (plain_requests.py)."},
    {"configure_assign",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(TritonMpConfigureAssign)),
     METH_FASTCALL,
     "configure_assign(BatchAssign, tag, Queued, RequestRecord): the classes batch_forms reads "
     "and push_assign writes."},
    {"batch_forms", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(TritonMpBatchForms)),
     METH_FASTCALL,
     "batch_forms(items) -> (requests, wire forms) | None: a batch's payloads and their wire "
     "forms (assign_push.py)."},
    {"push_assign", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(TritonMpPushAssign)),
     METH_FASTCALL,
     "push_assign(ring_buf, assign) -> bool: a plain BatchAssign written into the ring as "
     "msgspec encodes it; False: nothing written (assign_push.py)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_queue_records",
    "Plain request records queued, and plain batches written, in C (scheduler/plain_requests.py, "
    "scheduler/assign_push.py).", -1, kMethods,
    nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__queue_records() { return PyModule_Create(&kModule); }
