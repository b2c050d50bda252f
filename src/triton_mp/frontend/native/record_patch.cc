// PatchRecord (record_patch.h), and its binding _native.patch_request.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "record_patch.h"

#include <cstring>
#include <vector>

#include "../../ipc/records.h"
#include "record_patch_py.h"

namespace triton_mp {

namespace rec = triton_mp::records;

size_t PatchedRecordMinBytes(size_t n_entries) {
  // NOTE: the last field written (as Python's patch checks it: a template is always longer)
  if (n_entries == 0) return offsetof(rec::RequestHeader, block_generation) + 4;
  return sizeof(rec::RequestHeader) + (n_entries - 1) * sizeof(rec::TensorEntry) +
         offsetof(rec::TensorEntry, offset) + 8;
}

bool PatchRecord(unsigned char* record, size_t len, const RecordPatch& patch) {
  if (len < PatchedRecordMinBytes(patch.n_entries)) return false;
  std::memcpy(record + offsetof(rec::RequestHeader, request_id), &patch.request_id, 8);
  std::memcpy(record + offsetof(rec::RequestHeader, arrival_ns), &patch.arrival_ns, 8);
  std::memcpy(record + offsetof(rec::RequestHeader, block_offset), &patch.block_offset, 8);
  std::memcpy(record + offsetof(rec::RequestHeader, block_generation), &patch.block_generation,
              4);
  unsigned char* entry = record + sizeof(rec::RequestHeader) + offsetof(rec::TensorEntry, offset);
  for (size_t i = 0; i < patch.n_entries; ++i, entry += sizeof(rec::TensorEntry)) {
    std::memcpy(entry, &patch.entry_offsets[i], 8);
  }
  return true;
}

namespace {

// An attribute of a BlockRef or TensorRef as a u64. False: a Python error is set.
bool U64Attr(PyObject* obj, PyObject* name, uint64_t* out) {
  PyObject* value = PyObject_GetAttr(obj, name);
  if (value == nullptr) return false;
  *out = PyLong_AsUnsignedLongLong(value);
  Py_DECREF(value);
  return !PyErr_Occurred();
}

// patch_request(template, request_id, arrival_ns, block, refs) -> bytes
PyObject* PatchRequest(PyObject*, PyObject* args) {
  static PyObject* offset_name = PyUnicode_InternFromString("offset");
  static PyObject* generation_name = PyUnicode_InternFromString("generation");
  if (offset_name == nullptr || generation_name == nullptr) return nullptr;
  PyObject* tmpl;
  unsigned long long request_id;
  unsigned long long arrival_ns;
  PyObject* block;
  PyObject* refs;
  if (!PyArg_ParseTuple(args, "SKKOO", &tmpl, &request_id, &arrival_ns, &block, &refs)) {
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(refs, "refs must be a sequence of TensorRef");
  if (seq == nullptr) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  std::vector<uint64_t> offsets(static_cast<size_t>(n));
  RecordPatch patch{request_id, arrival_ns, 0, 0, offsets.data(), offsets.size()};
  uint64_t generation = 0;
  bool ok = U64Attr(block, offset_name, &patch.block_offset) &&
            U64Attr(block, generation_name, &generation);
  for (Py_ssize_t i = 0; ok && i < n; ++i) {
    ok = U64Attr(PySequence_Fast_GET_ITEM(seq, i), offset_name, &offsets[static_cast<size_t>(i)]);
  }
  Py_DECREF(seq);
  if (!ok) return nullptr;
  if (generation > UINT32_MAX) {
    PyErr_SetString(PyExc_OverflowError, "a block generation is a u32");
    return nullptr;
  }
  patch.block_generation = static_cast<uint32_t>(generation);
  Py_ssize_t len = PyBytes_GET_SIZE(tmpl);
  PyObject* out = PyBytes_FromStringAndSize(PyBytes_AS_STRING(tmpl), len);
  if (out == nullptr) return nullptr;
  if (!PatchRecord(reinterpret_cast<unsigned char*>(PyBytes_AS_STRING(out)),
                   static_cast<size_t>(len), patch)) {
    Py_DECREF(out);
    PyErr_SetString(PyExc_ValueError, "the template is shorter than its header and entries");
    return nullptr;
  }
  return out;
}

PyMethodDef kMethods[] = {
    {"patch_request", PatchRequest, METH_VARARGS,
     "A known request's record from its template (known_records.patched)."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

bool AddRecordPatch(PyObject* module) { return PyModule_AddFunctions(module, kMethods) == 0; }

}  // namespace triton_mp
