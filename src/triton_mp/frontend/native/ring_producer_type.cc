// _native.RingProducer(segment) (ring_producer_type.h) over an ipc.memory.shm.Segment holding a
// ring (ipc/memory/ring.py). It keeps the segment's writable mapping exported (so the mapping
// stays put while C++ may push) until release(), which its owner calls before it closes the
// segment (mmap refuses to close while exported). The RingProducer is shared_ptr-owned, so a
// C++ user (the gRPC thread) can hold it past this object; after release() its pushes answer
// "detached" and never touch the mapping.
#include "ring_producer_type.h"

#include <time.h>

#include <chrono>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "ring_producer.h"

namespace triton_mp {

namespace {

struct RingProducerObject {
  PyObject_HEAD
  std::shared_ptr<RingProducer> producer;  // placement-built in tp_alloc's memory
  Py_buffer view;                          // the segment's mapping, while exported
  bool exported;
};

RingProducerObject* Self(PyObject* obj) { return reinterpret_cast<RingProducerObject*>(obj); }

void Release(RingProducerObject* self) {
  if (!self->exported) return;
  if (self->producer) self->producer->Detach();
  self->exported = false;
  PyBuffer_Release(&self->view);
}

PyObject* RingProducerNew(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  static const char* kKeywords[] = {"segment", nullptr};
  PyObject* segment;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", const_cast<char**>(kKeywords), &segment)) {
    return nullptr;
  }
  PyObject* buf = PyObject_GetAttrString(segment, "buf");
  if (buf == nullptr) return nullptr;
  Py_buffer view;
  int rc = PyObject_GetBuffer(buf, &view, PyBUF_WRITABLE);
  Py_DECREF(buf);
  if (rc != 0) return nullptr;
  uint64_t capacity = 0;
  if (!RingProducer::Check(static_cast<const unsigned char*>(view.buf),
                           static_cast<uint64_t>(view.len), &capacity)) {
    PyBuffer_Release(&view);
    PyErr_SetString(PyExc_ValueError, "the segment is not a triton-mp ring");
    return nullptr;
  }
  auto* self = Self(type->tp_alloc(type, 0));
  if (self == nullptr) {
    PyBuffer_Release(&view);
    return nullptr;
  }
  new (&self->producer) std::shared_ptr<RingProducer>();
  self->view = view;
  self->exported = true;
  try {
    self->producer =
        std::make_shared<RingProducer>(static_cast<unsigned char*>(view.buf), capacity);
  } catch (const std::bad_alloc&) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  return reinterpret_cast<PyObject*>(self);
}

void RingProducerDealloc(PyObject* obj) {
  RingProducerObject* self = Self(obj);
  Release(self);
  self->producer.~shared_ptr();
  PyTypeObject* type = Py_TYPE(obj);
  type->tp_free(obj);
  Py_DECREF(type);
}

// push(data) -> int: 0 pushed, 1 full now, 2 never fits (over half the capacity); ValueError
// after release().
PyObject* Push(PyObject* obj, PyObject* arg) {
  Py_buffer data;
  if (PyObject_GetBuffer(arg, &data, PyBUF_SIMPLE) != 0) return nullptr;
  PushResult result = Self(obj)->producer->Push(data.buf, static_cast<size_t>(data.len));
  PyBuffer_Release(&data);
  if (result == PushResult::kDetached) {
    PyErr_SetString(PyExc_ValueError, "the ring producer was released");
    return nullptr;
  }
  return PyLong_FromLong(static_cast<long>(result));
}

// push_all(records, timeout_s) -> int: push each record in order with the GIL released (as
// the gRPC thread does), retrying a full ring until timeout_s has passed; returns how many
// were pushed (fewer: the timeout, or a record that never fits, stopped it).
PyObject* PushAll(PyObject* obj, PyObject* args) {
  PyObject* records;
  double timeout_s;
  if (!PyArg_ParseTuple(args, "Od", &records, &timeout_s)) return nullptr;
  PyObject* seq = PySequence_Fast(records, "records must be a sequence of bytes");
  if (seq == nullptr) return nullptr;
  std::vector<std::string> copies;
  Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
  copies.reserve(static_cast<size_t>(count));
  for (Py_ssize_t i = 0; i < count; ++i) {
    char* bytes;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(seq, i), &bytes, &len) != 0) {
      Py_DECREF(seq);
      return nullptr;
    }
    copies.emplace_back(bytes, static_cast<size_t>(len));
  }
  Py_DECREF(seq);
  std::shared_ptr<RingProducer> producer = Self(obj)->producer;
  size_t pushed = 0;
  Py_BEGIN_ALLOW_THREADS;
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(timeout_s));
  const struct timespec pause = {0, 20000};
  while (pushed < copies.size()) {
    PushResult result = producer->Push(copies[pushed].data(), copies[pushed].size());
    if (result == PushResult::kPushed) {
      ++pushed;
    } else if (result != PushResult::kFull || std::chrono::steady_clock::now() > deadline) {
      break;
    } else {
      nanosleep(&pause, nullptr);
    }
  }
  Py_END_ALLOW_THREADS;
  return PyLong_FromSize_t(pushed);
}

PyObject* QuietWord(PyObject* obj, PyObject*) {
  return PyLong_FromUnsignedLongLong(Self(obj)->producer->QuietWord());
}

PyObject* ReleaseMethod(PyObject* obj, PyObject*) {
  Release(Self(obj));
  Py_RETURN_NONE;
}

PyObject* GetCapacity(PyObject* obj, void*) {
  return PyLong_FromUnsignedLongLong(Self(obj)->producer->capacity());
}

PyMethodDef kMethods[] = {
    {"push", Push, METH_O, "Append one record: 0 pushed, 1 full now, 2 never fits."},
    {"push_all", PushAll, METH_VARARGS, "Push records in order without the GIL; how many."},
    {"quiet_word", QuietWord, METH_NOARGS, "A full barrier, then the ring's quiet word."},
    {"release", ReleaseMethod, METH_NOARGS, "Stop pushing and let go of the mapping."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef kGetSet[] = {
    {"capacity", GetCapacity, nullptr, "The ring's data bytes.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot kSlots[] = {
    {Py_tp_new, reinterpret_cast<void*>(RingProducerNew)},
    {Py_tp_dealloc, reinterpret_cast<void*>(RingProducerDealloc)},
    {Py_tp_methods, kMethods},
    {Py_tp_getset, kGetSet},
    {Py_tp_doc, const_cast<char*>("A ring's producer end, shared by threads (Ring.push).")},
    {0, nullptr},
};

PyType_Spec kSpec = {
    "triton_mp.frontend.native._native.RingProducer",
    sizeof(RingProducerObject),
    0,
    Py_TPFLAGS_DEFAULT,
    kSlots,
};

PyObject* g_type = nullptr;  // borrowed: the module holds it (one module per process)

}  // namespace

bool AddRingProducerType(PyObject* module) {
  PyObject* type = PyType_FromSpec(&kSpec);
  if (type == nullptr) return false;
  g_type = type;
  if (PyModule_AddObjectRef(module, "RingProducer", type) != 0) {
    Py_DECREF(type);
    return false;
  }
  Py_DECREF(type);  // NOTE: the module holds it
  return true;
}

std::shared_ptr<RingProducer> RingProducerOf(PyObject* obj) {
  if (g_type == nullptr || !PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(g_type))) {
    PyErr_SetString(PyExc_TypeError, "an _native.RingProducer is needed");
    return nullptr;
  }
  return Self(obj)->producer;
}

}  // namespace triton_mp
