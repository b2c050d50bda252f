// pop_records(ring, capacity, fallback): every record published in one ring, oldest first,
// read in one C call: the scheduler's drain (ipc.channel.Inbox.drain).
//
// Python twin: Ring.pop_each in src/triton_mp/ipc/memory/ring.py (its module docstring is
// the layout: u64 tail at 64, u64 head at 128, the data area at 192, each record a u32
// length and its payload padded to 8 bytes, WRAP (0xFFFFFFFF) or fewer than 4 bytes left
// before the end meaning "continue at the start"), with ipc.recordio.records.record_decoder
// as its function. A REQUEST record the header reader takes (request_header.h) becomes its
// RequestRecord here; every other record, and one the reader declines or finds malformed, is
// handed to `fallback` (the inbox's Python decoder) as a memoryview valid during the call,
// so every rule and every error stays the Python one. As in pop_each, a record whose fallback
// raises is consumed with those before it, and the error propagates.
//
// Why: the scheduler reads every request of every batch; in Python each record cost a
// loop step, a slice, the decoder's dispatch and the reader's call before the C reader ran
// (issue 34: the scheduler's drain was 38 µs of CPU per batch of 9 at c=16).
#include "ring_records.h"

#include <cstdint>
#include <cstring>

#include "../records.h"
#include "request_header.h"

namespace triton_mp::decoder {
namespace {

namespace rec = triton_mp::records;

// ipc/memory/ring.py's layout (its module docstring; frontend/native/ring_producer.h's twin).
constexpr uint64_t kTailAt = 64;
constexpr uint64_t kHeadAt = 128;
constexpr uint64_t kDataAt = 192;
constexpr uint32_t kWrap = 0xFFFFFFFF;

// Holds a writable buffer view for the call (RAII).
class WritableView {
 public:
  explicit WritableView(PyObject* obj) {
    ok_ = PyObject_GetBuffer(obj, &view_, PyBUF_WRITABLE) == 0;
  }
  WritableView(const WritableView&) = delete;
  WritableView& operator=(const WritableView&) = delete;
  ~WritableView() {
    if (ok_) PyBuffer_Release(&view_);
  }
  bool ok() const { return ok_; }
  uint8_t* data() const { return static_cast<uint8_t*>(view_.buf); }
  size_t size() const { return static_cast<size_t>(view_.len); }

 private:
  Py_buffer view_{};
  bool ok_ = false;
};

// Whether the record of `size` bytes at `data` is one the header reader may take.
bool IsRequest(const uint8_t* data, size_t size) {
  return size >= 2 && data[0] == rec::kRecordMarker && data[1] == rec::kKindRequest;
}

// The decoded record: the header reader's RequestRecord, or fallback(view); nullptr with the
// error set when the fallback raised (or an allocation failed).
PyObject* Decode(uint8_t* data, size_t size, PyObject* fallback) {
  if (IsRequest(data, size)) {
    PyObject* got = ReadRequestHeader(data, size);
    if (got != nullptr && got != Py_None) return got;
    if (got == nullptr) {
      // NOTE: malformed: the Python reader raises its own error for it (msgspec.DecodeError).
      PyErr_Clear();
    } else {
      Py_DECREF(got);
    }
  }
  PyObject* view = PyMemoryView_FromMemory(reinterpret_cast<char*>(data),
                                           static_cast<Py_ssize_t>(size), PyBUF_READ);
  if (view == nullptr) return nullptr;
  PyObject* out = PyObject_CallOneArg(fallback, view);
  // NOTE: the view must not outlive the call's contract (pop_each's): release it now so a
  // fallback that kept it holds a released view, not the ring's memory. The fallback's
  // error, if any, waits while release runs.
  PyObject *type, *value, *traceback;
  PyErr_Fetch(&type, &value, &traceback);
  PyObject* released = PyObject_CallMethod(view, "release", nullptr);
  Py_XDECREF(released);
  if (released == nullptr) PyErr_Clear();
  PyErr_Restore(type, value, traceback);
  Py_DECREF(view);
  return out;
}

}  // namespace

PyObject* PopRecords(PyObject* /*module*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3) {
    PyErr_SetString(PyExc_TypeError, "pop_records(ring, capacity, fallback)");
    return nullptr;
  }
  if (!HeaderConfigured()) {
    PyErr_SetString(PyExc_RuntimeError, "configure_header() was not called");
    return nullptr;
  }
  const unsigned long long cap_arg = PyLong_AsUnsignedLongLong(args[1]);
  if (cap_arg == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return nullptr;
  const uint64_t cap = cap_arg;
  PyObject* fallback = args[2];
  WritableView ring(args[0]);
  if (!ring.ok()) return nullptr;
  const size_t len = ring.size();
  if (cap == 0 || len < kDataAt || cap > len - kDataAt) {
    PyErr_SetString(PyExc_ValueError, "pop_records: the buffer is not a ring of that capacity");
    return nullptr;
  }
  uint8_t* base = ring.data();
  auto* tail_word = reinterpret_cast<uint64_t*>(base + kTailAt);
  auto* head_word = reinterpret_cast<uint64_t*>(base + kHeadAt);
  // NOTE: the producer writes a record before it publishes tail (acquire pairs with it);
  // this reads each record before it publishes head (release), as Ring.pop_each does.
  const uint64_t tail = __atomic_load_n(tail_word, __ATOMIC_ACQUIRE);
  uint64_t head = __atomic_load_n(head_word, __ATOMIC_RELAXED);
  PyObject* out = PyList_New(0);
  if (out == nullptr) return nullptr;
  bool failed = false;
  while (head < tail) {
    const uint64_t pos = head % cap;
    const uint64_t room_to_end = cap - pos;
    if (room_to_end < 4) {
      head += room_to_end;
      continue;
    }
    uint32_t n = 0;
    std::memcpy(&n, base + kDataAt + pos, sizeof n);
    if (n == kWrap) {
      head += room_to_end;
      continue;
    }
    const size_t at = kDataAt + pos + 4;
    head += (4 + uint64_t{n} + 7) & ~uint64_t{7};
    // NOTE: clamped to the mapping, as pop_each's slice of its memoryview is.
    const size_t size = at >= len ? 0 : (n < len - at ? n : len - at);
    PyObject* item = Decode(base + at, size, fallback);
    if (item == nullptr || PyList_Append(out, item) != 0) {
      Py_XDECREF(item);
      failed = true;
      break;
    }
    Py_DECREF(item);
  }
  __atomic_store_n(head_word, head, __ATOMIC_RELEASE);
  if (failed) {
    Py_DECREF(out);
    return nullptr;
  }
  return out;
}

}  // namespace triton_mp::decoder
