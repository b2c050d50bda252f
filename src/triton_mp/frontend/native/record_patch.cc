// PatchRecord (record_patch.h), and its binding _native.patch_request.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "record_patch.h"

#include <cstring>
#include <string>
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

uint32_t U32At(const std::string& r, size_t at) {
  uint32_t v;
  std::memcpy(&v, r.data() + at, 4);
  return v;
}

uint16_t U16At(const std::string& r, size_t at) {
  uint16_t v;
  std::memcpy(&v, r.data() + at, 2);
  return v;
}

}  // namespace

bool WithClientId(const std::string& record, const char* id, size_t id_len, std::string* out) {
  using H = rec::RequestHeader;
  if (record.size() < sizeof(H) || id_len > 0xFFFF) return false;
  const size_t size = U32At(record, offsetof(H, size));
  const size_t cid_len = U16At(record, offsetof(H, client_id_len));
  const size_t cid_off = U32At(record, offsetof(H, client_id_off));
  const size_t tail_off = U32At(record, offsetof(H, tail_off));
  const size_t tail_len = U32At(record, offsetof(H, tail_len));
  if (size != record.size()) return false;
  // NOTE: encode_request: the id is the last string; the tail (if any) ends the record
  if (tail_len != 0 && (tail_off < sizeof(H) || tail_off > size || tail_len != size - tail_off)) {
    return false;
  }
  const size_t strings_end = tail_len != 0 ? tail_off : size;
  const size_t at = cid_len != 0 ? cid_off : strings_end;
  if (at < sizeof(H) || at > strings_end || cid_len != strings_end - at) return false;
  const size_t new_size = size - cid_len + id_len;
  if (new_size > 0xFFFFFFFFu) return false;
  out->assign(record, 0, at);
  out->append(id, id_len);
  out->append(record, strings_end, std::string::npos);
  const uint32_t size32 = static_cast<uint32_t>(new_size);
  const uint16_t len16 = static_cast<uint16_t>(id_len);
  const uint32_t off32 = id_len != 0 ? static_cast<uint32_t>(at) : 0;
  const uint32_t tail32 = tail_len != 0 ? static_cast<uint32_t>(at + id_len) : 0;
  std::memcpy(&(*out)[offsetof(H, size)], &size32, 4);
  std::memcpy(&(*out)[offsetof(H, client_id_len)], &len16, 2);
  std::memcpy(&(*out)[offsetof(H, client_id_off)], &off32, 4);
  std::memcpy(&(*out)[offsetof(H, tail_off)], &tail32, 4);
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

// record_with_client_id(record, id) -> bytes or None (WithClientId declined)
PyObject* RecordWithClientId(PyObject*, PyObject* args) {
  const char* record;
  Py_ssize_t record_len;
  const char* id;
  Py_ssize_t id_len;
  if (!PyArg_ParseTuple(args, "y#y#", &record, &record_len, &id, &id_len)) return nullptr;
  std::string out;
  if (!WithClientId(std::string(record, static_cast<size_t>(record_len)), id,
                    static_cast<size_t>(id_len), &out)) {
    Py_RETURN_NONE;
  }
  return PyBytes_FromStringAndSize(out.data(), static_cast<Py_ssize_t>(out.size()));
}

PyMethodDef kMethods[] = {
    {"record_with_client_id", RecordWithClientId, METH_VARARGS,
     "A REQUEST record with another client id (record_patch.h WithClientId)."},
    {"patch_request", PatchRequest, METH_VARARGS,
     "A known request's record from its template (known_records.patched)."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

bool AddRecordPatch(PyObject* module) { return PyModule_AddFunctions(module, kMethods) == 0; }

}  // namespace triton_mp
