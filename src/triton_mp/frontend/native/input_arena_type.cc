// _native.InputArena (input_arena_type.h): InputArena(segment) over an ipc.memory.shm.Segment
// the caller created and owns (its writable mapping, segment.buf, is borrowed per call, never
// kept: the owner may close it). Python twin: ipc/tensor_pool.py _Arena.
#include "input_arena_type.h"

#include <cstdint>
#include <memory>
#include <new>

#include "input_arena.h"

namespace triton_mp {

namespace {

struct InputArenaObject {
  PyObject_HEAD
  PyObject* segment;    // owned reference
  std::shared_ptr<ArenaBlocks> blocks;  // placement-built in tp_alloc's memory; shared, so
                                        // the gRPC thread can allocate with it too
};

// The arena's writable mapping, at least header + capacity bytes. False: a Python error set.
bool MapOf(InputArenaObject* self, Py_buffer* view) {
  PyObject* buf = PyObject_GetAttrString(self->segment, "buf");
  if (buf == nullptr) return false;
  int rc = PyObject_GetBuffer(buf, view, PyBUF_WRITABLE);
  Py_DECREF(buf);
  if (rc != 0) return false;
  if (static_cast<uint64_t>(view->len) < kArenaHeaderBytes + self->blocks->capacity()) {
    PyBuffer_Release(view);
    PyErr_SetString(PyExc_ValueError, "the arena's mapping is smaller than its capacity");
    return false;
  }
  return true;
}

PyObject* InputArenaNew(PyTypeObject* type, PyObject* args, PyObject* kwds) {
  static const char* kKeywords[] = {"segment", nullptr};
  PyObject* segment;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", const_cast<char**>(kKeywords), &segment)) {
    return nullptr;
  }
  PyObject* size = PyObject_GetAttrString(segment, "size_bytes");
  if (size == nullptr) return nullptr;
  unsigned long long bytes = PyLong_AsUnsignedLongLong(size);
  Py_DECREF(size);
  if (PyErr_Occurred()) return nullptr;
  if (bytes < kArenaHeaderBytes) {
    PyErr_SetString(PyExc_ValueError, "an arena segment holds at least its 64-byte header");
    return nullptr;
  }
  auto* self = reinterpret_cast<InputArenaObject*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  new (&self->blocks) std::shared_ptr<ArenaBlocks>();
  try {
    self->blocks = std::make_shared<ArenaBlocks>(bytes - kArenaHeaderBytes);
  } catch (const std::bad_alloc&) {
    Py_DECREF(self);
    return PyErr_NoMemory();
  }
  Py_INCREF(segment);
  self->segment = segment;
  return reinterpret_cast<PyObject*>(self);
}

void InputArenaDealloc(PyObject* obj) {
  auto* self = reinterpret_cast<InputArenaObject*>(obj);
  self->blocks.~shared_ptr();
  Py_XDECREF(self->segment);
  PyTypeObject* type = Py_TYPE(obj);
  type->tp_free(obj);
  Py_DECREF(type);
}

// try_alloc(block_bytes) -> offset or None (tensor_pool._Arena.try_alloc).
PyObject* TryAlloc(PyObject* obj, PyObject* arg) {
  auto* self = reinterpret_cast<InputArenaObject*>(obj);
  unsigned long long block_bytes = PyLong_AsUnsignedLongLong(arg);
  if (PyErr_Occurred()) return nullptr;
  if (block_bytes < kArenaHeaderBytes || block_bytes % kArenaHeaderBytes != 0) {
    // NOTE: every block starts 64-byte aligned (its state word is stored as one u32)
    PyErr_SetString(PyExc_ValueError, "a block's bytes are a positive multiple of 64");
    return nullptr;
  }
  Py_buffer view;
  if (!MapOf(self, &view)) return nullptr;
  int64_t offset = self->blocks->TryAlloc(static_cast<unsigned char*>(view.buf), block_bytes);
  PyBuffer_Release(&view);
  if (offset < 0) Py_RETURN_NONE;
  return PyLong_FromLongLong(offset);
}

PyObject* LiveBlocks(PyObject* obj, PyObject*) {
  auto* self = reinterpret_cast<InputArenaObject*>(obj);
  Py_buffer view;
  if (!MapOf(self, &view)) return nullptr;
  size_t n = self->blocks->LiveBlocks(static_cast<unsigned char*>(view.buf));
  PyBuffer_Release(&view);
  return PyLong_FromSize_t(n);
}

PyObject* UnfreedBlocks(PyObject* obj, PyObject*) {
  auto* self = reinterpret_cast<InputArenaObject*>(obj);
  Py_buffer view;
  if (!MapOf(self, &view)) return nullptr;
  size_t n = self->blocks->UnfreedBlocks(static_cast<unsigned char*>(view.buf));
  PyBuffer_Release(&view);
  return PyLong_FromSize_t(n);
}

PyObject* GetSegment(PyObject* obj, void*) {
  auto* self = reinterpret_cast<InputArenaObject*>(obj);
  Py_INCREF(self->segment);
  return self->segment;
}

PyObject* GetCapacity(PyObject* obj, void*) {
  return PyLong_FromUnsignedLongLong(reinterpret_cast<InputArenaObject*>(obj)->blocks->capacity());
}

PyObject* GetGeneration(PyObject* obj, void*) {
  return PyLong_FromUnsignedLong(reinterpret_cast<InputArenaObject*>(obj)->blocks->generation());
}

int SetGeneration(PyObject* obj, PyObject* value, void*) {
  if (value == nullptr) {
    PyErr_SetString(PyExc_TypeError, "generation cannot be deleted");
    return -1;
  }
  unsigned long generation = PyLong_AsUnsignedLong(value);
  if (PyErr_Occurred()) return -1;
  if (generation > UINT32_MAX) {
    PyErr_SetString(PyExc_OverflowError, "a generation is a u32");
    return -1;
  }
  reinterpret_cast<InputArenaObject*>(obj)->blocks->set_generation(
      static_cast<uint32_t>(generation));
  return 0;
}

PyMethodDef kMethods[] = {
    {"try_alloc", TryAlloc, METH_O, "Offset of a new LIVE block of block_bytes, or None."},
    {"live_blocks", LiveBlocks, METH_NOARGS, "Blocks from the oldest unfreed to the newest."},
    {"unfreed_blocks", UnfreedBlocks, METH_NOARGS, "Blocks whose reader has not freed them."},
    {nullptr, nullptr, 0, nullptr},
};

PyGetSetDef kGetSet[] = {
    {"segment", GetSegment, nullptr, "The arena's Segment.", nullptr},
    {"capacity", GetCapacity, nullptr, "Bytes after the 64-byte arena header.", nullptr},
    {"generation", GetGeneration, SetGeneration, "The newest block's generation.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot kSlots[] = {
    {Py_tp_new, reinterpret_cast<void*>(InputArenaNew)},
    {Py_tp_dealloc, reinterpret_cast<void*>(InputArenaDealloc)},
    {Py_tp_methods, kMethods},
    {Py_tp_getset, kGetSet},
    {Py_tp_doc, const_cast<char*>("One input arena's block allocator (tensor_pool._Arena).")},
    {0, nullptr},
};

PyType_Spec kSpec = {
    "triton_mp.frontend.native._native.InputArena",
    sizeof(InputArenaObject),
    0,
    Py_TPFLAGS_DEFAULT,
    kSlots,
};

PyObject* g_type = nullptr;  // borrowed: the module holds it (one module per process)

}  // namespace

bool AddInputArenaType(PyObject* module) {
  PyObject* type = PyType_FromSpec(&kSpec);
  if (type == nullptr) return false;
  g_type = type;
  if (PyModule_AddObjectRef(module, "InputArena", type) != 0) {
    Py_DECREF(type);
    return false;
  }
  Py_DECREF(type);  // NOTE: the module holds it
  return true;
}

std::shared_ptr<ArenaBlocks> ArenaBlocksOf(PyObject* obj, Py_buffer* view) {
  if (g_type == nullptr || !PyObject_TypeCheck(obj, reinterpret_cast<PyTypeObject*>(g_type))) {
    PyErr_SetString(PyExc_TypeError, "an _native.InputArena is needed");
    return nullptr;
  }
  auto* self = reinterpret_cast<InputArenaObject*>(obj);
  if (!MapOf(self, view)) return nullptr;
  return self->blocks;
}

}  // namespace triton_mp
