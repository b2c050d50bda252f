// _native.known_* (known_submit_py.h). Every function runs with the GIL held; the arena's
// mapping is kept exported (so it stays put while the gRPC thread copies into it) from
// known_set_arena until the next known_set_arena or known_detach, which its owner calls
// before it closes the segment (mmap refuses to close while exported).
#include "known_submit_py.h"

#include <fcntl.h>
#include <semaphore.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "input_arena_type.h"
#include "known_regions.h"
#include "known_submit.h"
#include "ring_producer_type.h"

namespace triton_mp {

namespace {

Py_buffer g_view;          // the arena's mapping, while g_exported
bool g_exported = false;
sem_t* g_wake = nullptr;   // the scheduler's wake-up, while opened

void ReleaseArena() {
  if (!g_exported) return;
  g_exported = false;
  PyBuffer_Release(&g_view);
}

void CloseWake() {
  if (g_wake != nullptr) sem_close(g_wake);
  g_wake = nullptr;
}

// known_set_arena(arena: InputArena): calls are allocated in this arena from now on (every
// lesson is forgotten: its template names the arena it was made in).
PyObject* SetArena(PyObject*, PyObject* arena) {
  Py_buffer view;
  std::shared_ptr<ArenaBlocks> blocks = ArenaBlocksOf(arena, &view);
  if (!blocks) return nullptr;
  // NOTE: without the GIL: it waits for the gRPC thread's copies in flight
  Py_BEGIN_ALLOW_THREADS
  TheKnownSubmit().SetArena(std::move(blocks), static_cast<unsigned char*>(view.buf),
                            static_cast<uint64_t>(view.len));
  Py_END_ALLOW_THREADS
  ReleaseArena();  // NOTE: after SetArena: the gRPC thread no longer uses the old one
  g_view = view;
  g_exported = true;
  Py_RETURN_NONE;
}

// known_set_ring(producer: RingProducer, wake: str | None): the ring to the scheduler, and
// the POSIX semaphore that wakes it (None: never woken from here).
PyObject* SetRing(PyObject*, PyObject* args) {
  PyObject* producer;
  const char* wake_name = nullptr;
  if (!PyArg_ParseTuple(args, "Oz", &producer, &wake_name)) return nullptr;
  std::shared_ptr<RingProducer> ring = RingProducerOf(producer);
  if (!ring) return nullptr;
  sem_t* wake = nullptr;
  if (wake_name != nullptr) {
    wake = sem_open(wake_name, 0);
    if (wake == SEM_FAILED) return PyErr_SetFromErrnoWithFilename(PyExc_OSError, wake_name);
  }
  TheKnownSubmit().SetRing(std::move(ring), wake);
  CloseWake();  // NOTE: after SetRing: the gRPC thread no longer posts the old one
  g_wake = wake;
  Py_RETURN_NONE;
}

// known_add_ids(first, n): request ids first .. first + n - 1 are the native side's to use.
PyObject* AddIds(PyObject*, PyObject* args) {
  unsigned long long first, n;
  if (!PyArg_ParseTuple(args, "KK", &first, &n)) return nullptr;
  TheKnownSubmit().AddIds(first, n);
  Py_RETURN_NONE;
}

// known_ids_left() -> int
PyObject* IdsLeft(PyObject*, PyObject*) {
  return PyLong_FromUnsignedLongLong(TheKnownSubmit().ids_left());
}

// The u64 values of a sequence of ints. False: a Python error is set.
bool U64s(PyObject* obj, std::vector<uint64_t>* out) {
  PyObject* seq = PySequence_Fast(obj, "a sequence of ints is needed");
  if (seq == nullptr) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    unsigned long long v = PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i));
    if (PyErr_Occurred()) {
      Py_DECREF(seq);
      return false;
    }
    out->push_back(v);
  }
  Py_DECREF(seq);
  return true;
}

// A lesson's client regions (known_regions.h): `entries` (None or a sequence of int or None:
// kRawEntry) and `held` (None or a sequence of region ids). False: a Python error is set.
bool RegionsOf(PyObject* entries, PyObject* held, uint64_t generation, LessonRegions* out) {
  out->generation = generation;
  if (entries != nullptr && entries != Py_None) {
    PyObject* seq = PySequence_Fast(entries, "entries must be a sequence of int or None");
    if (seq == nullptr) return false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
      PyObject* e = PySequence_Fast_GET_ITEM(seq, i);
      const uint64_t v = e == Py_None ? kRawEntry : PyLong_AsUnsignedLongLong(e);
      if (PyErr_Occurred()) {
        Py_DECREF(seq);
        return false;
      }
      out->entries.push_back(v);
    }
    Py_DECREF(seq);
  }
  if (held != nullptr && held != Py_None) {
    std::vector<uint64_t> ids;
    if (!U64s(held, &ids)) return false;
    if (!ids.empty()) out->held = std::make_shared<const std::vector<uint64_t>>(std::move(ids));
  }
  return true;
}

// known_teach(key, client_id, lesson_id, sizes, at, block_bytes, record, bit[, entries,
// held, generation]) -> bool: a request whose split key is `key` and id `client_id` (bytes)
// is submitted natively from now on (known_submit.h KnownLesson; entries, held, generation:
// its client regions, known_regions.h LessonRegions, entries' None being kRawEntry). False:
// the lesson does not fit (nothing kept).
PyObject* Teach(PyObject*, PyObject* args) {
  Py_buffer key, client_id, record;
  unsigned long long lesson_id, block_bytes, bit, generation = 0;
  PyObject* sizes;
  PyObject* at;
  PyObject* entries = nullptr;
  PyObject* held = nullptr;
  if (!PyArg_ParseTuple(args, "y*y*KOOKy*K|OOK", &key, &client_id, &lesson_id, &sizes, &at,
                        &block_bytes, &record, &bit, &entries, &held, &generation)) {
    return nullptr;
  }
  KnownLesson lesson;
  lesson.id = lesson_id;
  lesson.client_id.assign(static_cast<const char*>(client_id.buf),
                          static_cast<size_t>(client_id.len));
  lesson.block_bytes = block_bytes;
  lesson.record.assign(static_cast<const char*>(record.buf), static_cast<size_t>(record.len));
  lesson.bit = bit;
  std::string k(static_cast<const char*>(key.buf), static_cast<size_t>(key.len));
  PyBuffer_Release(&key);
  PyBuffer_Release(&client_id);
  PyBuffer_Release(&record);
  if (!U64s(sizes, &lesson.sizes) || !U64s(at, &lesson.at)) return nullptr;
  if (!RegionsOf(entries, held, generation, &lesson.regions)) return nullptr;
  return PyBool_FromLong(TheKnownSubmit().Teach(k, std::move(lesson)));
}

// known_clear(): forget every lesson (un-teach).
PyObject* Clear(PyObject*, PyObject*) {
  TheKnownSubmit().Clear();
  Py_RETURN_NONE;
}

// known_detach(): forget the lessons, the arena (its export ends) and the ring.
PyObject* Detach(PyObject*, PyObject*) {
  // NOTE: without the GIL: it waits for the gRPC thread's copies in flight
  Py_BEGIN_ALLOW_THREADS
  TheKnownSubmit().Detach();
  Py_END_ALLOW_THREADS
  ReleaseArena();
  CloseWake();
  Py_RETURN_NONE;
}

// known_stats() -> dict of counters (known_submit.h KnownStats).
PyObject* Stats(PyObject*, PyObject*) {
  KnownStats s = TheKnownSubmit().stats();
  return Py_BuildValue("{sKsKsKsKsKsKsKsKsK}", "sent", (unsigned long long)s.sent, "unknown",
                       (unsigned long long)s.unknown, "declined", (unsigned long long)s.declined,
                       "no_ids", (unsigned long long)s.no_ids, "no_room",
                       (unsigned long long)s.no_room, "full", (unsigned long long)s.full,
                       "wakes", (unsigned long long)s.wakes, "cleared",
                       (unsigned long long)s.cleared, "stale", (unsigned long long)s.stale);
}

// Held submits (tests): known_submit(..., hold=True) stops between its copy's reservation
// and the copy until known_release_held().
std::mutex g_hold_mu;
std::condition_variable g_hold_cv;
uint64_t g_hold_releases = 0;

// known_submit(message, arrival_ns, hold=False) -> (request id, lesson id, offset,
// generation) or the KnownResult (int) that left it to Python: what the gRPC thread does
// with a call's request (tests; the GIL is released around it, as on the gRPC thread).
// hold: wait after the reservation (a copy in flight: known_reserved() counts it) until
// known_release_held().
PyObject* Submit(PyObject*, PyObject* args) {
  Py_buffer message;
  unsigned long long arrival_ns;
  int hold = 0;
  if (!PyArg_ParseTuple(args, "y*K|p", &message, &arrival_ns, &hold)) return nullptr;
  KnownSent sent;
  KnownResult result = KnownResult::kUnknown;
  Py_BEGIN_ALLOW_THREADS
  Chunks chunks;
  chunks.Add(static_cast<const unsigned char*>(message.buf), static_cast<size_t>(message.len));
  RequestSplit split;
  KnownSubmit& known = TheKnownSubmit();
  if (SplitInferRequest(chunks, &split)) {
    uint64_t seen;
    {
      std::lock_guard<std::mutex> lock(g_hold_mu);
      seen = g_hold_releases;  // NOTE: before the reservation known_reserved() shows
    }
    KnownReservation r;
    result = known.Reserve(chunks, split, &r);
    if (result == KnownResult::kSent && hold) {
      std::unique_lock<std::mutex> lock(g_hold_mu);
      g_hold_cv.wait(lock, [seen] { return g_hold_releases != seen; });
    }
    if (result == KnownResult::kSent) {
      result = known.CopyInputs(chunks, split, &r) ? known.Finish(&r, split, arrival_ns, &sent)
                                                   : KnownResult::kDeclined;
    }
  }
  Py_END_ALLOW_THREADS
  PyBuffer_Release(&message);
  if (result != KnownResult::kSent) return PyLong_FromLong(static_cast<long>(result));
  return Py_BuildValue("(KKKk)", (unsigned long long)sent.request_id,
                       (unsigned long long)sent.lesson_id, (unsigned long long)sent.offset,
                       (unsigned long)sent.generation);
}

// known_release_held(): every held known_submit goes on.
PyObject* ReleaseHeld(PyObject*, PyObject*) {
  {
    std::lock_guard<std::mutex> lock(g_hold_mu);
    ++g_hold_releases;
  }
  g_hold_cv.notify_all();
  Py_RETURN_NONE;
}

// known_reserved() -> int: submits between their reservation and its end (copies in flight).
PyObject* Reserved(PyObject*, PyObject*) {
  return PyLong_FromSize_t(TheKnownSubmit().reserved());
}

PyMethodDef kFunctions[] = {
    {"known_set_arena", SetArena, METH_O, "Allocate known calls in this InputArena."},
    {"known_set_ring", SetRing, METH_VARARGS, "(RingProducer, wake semaphore name or None)."},
    {"known_add_ids", AddIds, METH_VARARGS, "(first, n): request ids the native side uses."},
    {"known_ids_left", IdsLeft, METH_NOARGS, "Request ids the native side has left."},
    {"known_teach", Teach, METH_VARARGS, "Teach one key (known_submit.h KnownLesson)."},
    {"known_clear", Clear, METH_NOARGS, "Forget every lesson."},
    {"known_detach", Detach, METH_NOARGS, "Forget the lessons, the arena and the ring."},
    {"known_stats", Stats, METH_NOARGS, "The known submitter's counters."},
    {"known_submit", Submit, METH_VARARGS, "Submit one request as the gRPC thread does."},
    {"known_release_held", ReleaseHeld, METH_NOARGS, "Let every held known_submit go on."},
    {"known_reserved", Reserved, METH_NOARGS, "Submits with a copy in flight."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

bool AddKnownSubmit(PyObject* module) { return PyModule_AddFunctions(module, kFunctions) == 0; }

}  // namespace triton_mp
