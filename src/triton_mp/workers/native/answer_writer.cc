// triton_mp.workers._answer_writer: one frontend's answers to a batch, written in one call:
// every output copied into the batch's one arena block and the AnswerBatch message encoded.
//
// Python twin: write_answer_batch in src/triton_mp/workers/tensors/answer_batch.py (the
// loop after _place_all) followed by msgspec's msgpack encoding of the AnswerBatch it builds
// (src/triton_mp/ipc/protocol/messages.py: AnswerBatch, InferResponse, TensorRef, BlockRef,
// Handoff; array_like structs, a tagged one's array starts with its tag, every field is
// written in declaration order, defaults included). The bytes are msgspec's own, byte for
// byte (tests/unit/test_answer_writer.py compares them on random batches), so the readers
// (ipc/recordio/codec.py's Decoder, frontend/native/answer_reader.cc) see no difference.
//
// Only the layout is here: which outputs a request gets, their datatypes, shapes, sizes and
// every error are decided in Python (_place_all) before this runs; a member that is not the
// shape this takes (a tuple of the wrong length, a size that is not its buffer's) raises
// TypeError / ValueError and the caller frees the block.
//
// Why: at add_sub_py c=16 (about 9 requests a batch, 2 outputs each) the Python loop built a
// TensorRef per output, an InferResponse per request and the AnswerBatch, then msgspec
// walked them again: ~12% of the worker's samples (py-spy, issue 34).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <cstring>
#include <string>

namespace {

constexpr uint64_t kAlign = 64;  // ipc/tensor_pool.py ALIGN

// Owns one buffer view (RAII).
class View {
 public:
  View() = default;
  View(const View&) = delete;
  View& operator=(const View&) = delete;
  ~View() {
    if (held_) PyBuffer_Release(&view_);
  }
  bool Get(PyObject* obj, int flags) {
    if (PyObject_GetBuffer(obj, &view_, flags) != 0) return false;
    held_ = true;
    return true;
  }
  char* data() const { return static_cast<char*>(view_.buf); }
  Py_ssize_t size() const { return view_.len; }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

// msgpack as msgspec writes it: the smallest form of every int, str and array.
class Packer {
 public:
  std::string out;

  void Array(size_t n) {
    if (n < 16) {
      Byte(static_cast<uint8_t>(0x90 | n));
    } else if (n <= 0xffff) {
      Byte(0xdc);
      Be(n, 2);
    } else {
      Byte(0xdd);
      Be(n, 4);
    }
  }
  void Str(const char* s, size_t n) {
    if (n < 32) {
      Byte(static_cast<uint8_t>(0xa0 | n));
    } else if (n <= 0xff) {
      Byte(0xd9);
      Be(n, 1);
    } else if (n <= 0xffff) {
      Byte(0xda);
      Be(n, 2);
    } else {
      Byte(0xdb);
      Be(n, 4);
    }
    out.append(s, n);
  }
  void Uint(uint64_t v) {
    if (v < 128) {
      Byte(static_cast<uint8_t>(v));
    } else if (v <= 0xff) {
      Byte(0xcc);
      Be(v, 1);
    } else if (v <= 0xffff) {
      Byte(0xcd);
      Be(v, 2);
    } else if (v <= 0xffffffffULL) {
      Byte(0xce);
      Be(v, 4);
    } else {
      Byte(0xcf);
      Be(v, 8);
    }
  }
  void Int(int64_t v) {
    if (v >= 0) {
      Uint(static_cast<uint64_t>(v));
    } else if (v >= -32) {
      Byte(static_cast<uint8_t>(v));
    } else if (v >= -128) {
      Byte(0xd0);
      Be(static_cast<uint64_t>(v), 1);
    } else if (v >= -32768) {
      Byte(0xd1);
      Be(static_cast<uint64_t>(v), 2);
    } else if (v >= -2147483648LL) {
      Byte(0xd2);
      Be(static_cast<uint64_t>(v), 4);
    } else {
      Byte(0xd3);
      Be(static_cast<uint64_t>(v), 8);
    }
  }
  void Nil() { Byte(0xc0); }
  void Bool(bool b) { Byte(b ? 0xc3 : 0xc2); }

 private:
  void Byte(uint8_t b) { out.push_back(static_cast<char>(b)); }
  void Be(uint64_t v, int n) {
    for (int i = n - 1; i >= 0; --i) Byte(static_cast<uint8_t>(v >> (8 * i)));
  }
};

// A Python int as msgpack (msgspec: any int in [-2**63, 2**64)); false with an exception set.
bool PackInt(Packer& p, PyObject* obj) {
  if (!PyLong_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "expected an int");
    return false;
  }
  int overflow = 0;
  long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
  if (overflow == 0) {
    if (v == -1 && PyErr_Occurred()) return false;
    p.Int(v);
    return true;
  }
  if (overflow > 0) {
    unsigned long long u = PyLong_AsUnsignedLongLong(obj);
    if (u == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return false;
    p.Uint(u);
    return true;
  }
  PyErr_SetString(PyExc_OverflowError, "int out of range");
  return false;
}

bool PackStr(Packer& p, PyObject* obj) {
  if (!PyUnicode_Check(obj)) {
    PyErr_SetString(PyExc_TypeError, "expected a str");
    return false;
  }
  Py_ssize_t n = 0;
  const char* s = PyUnicode_AsUTF8AndSize(obj, &n);
  if (s == nullptr) return false;
  p.Str(s, static_cast<size_t>(n));
  return true;
}

// The batch's one block (BlockRef), when it has one.
struct Block {
  bool present = false;
  PyObject* segment = nullptr;  // borrowed str
  PyObject* offset = nullptr;   // borrowed int
  PyObject* generation = nullptr;

  bool Pack(Packer& p) const {  // BlockRef: [segment, offset, generation]
    p.Array(3);
    return PackStr(p, segment) && PackInt(p, offset) && PackInt(p, generation);
  }
};

// One output: (name, datatype, shape, data, nbytes) (tensor_io.WireTensor), copied to
// `*pos` in `dst` and packed as its TensorRef:
// [name, datatype, shape, segment, offset, nbytes, region_id].
bool PackTensor(Packer& p, PyObject* t, const Block& block, const View& dst, uint64_t* pos) {
  if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 5) {
    PyErr_SetString(PyExc_TypeError, "an output is a 5-tuple");
    return false;
  }
  PyObject* shape = PyTuple_GET_ITEM(t, 2);
  if (!PyTuple_Check(shape)) {
    PyErr_SetString(PyExc_TypeError, "an output's shape is a tuple");
    return false;
  }
  unsigned long long n = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(t, 4));
  if (n == static_cast<unsigned long long>(-1) && PyErr_Occurred()) return false;
  if (n != 0) {
    if (!block.present) {
      PyErr_SetString(PyExc_ValueError, "output bytes with no block");
      return false;
    }
    View src;
    if (!src.Get(PyTuple_GET_ITEM(t, 3), PyBUF_C_CONTIGUOUS)) return false;
    if (static_cast<unsigned long long>(src.size()) != n) {
      PyErr_SetString(PyExc_ValueError, "an output's nbytes is not its buffer's size");
      return false;
    }
    if (*pos > static_cast<uint64_t>(dst.size()) ||
        n > static_cast<uint64_t>(dst.size()) - *pos) {
      PyErr_SetString(PyExc_ValueError, "outputs past the end of the segment");
      return false;
    }
    std::memcpy(dst.data() + *pos, src.data(), n);
  }
  p.Array(7);
  if (!PackStr(p, PyTuple_GET_ITEM(t, 0)) || !PackStr(p, PyTuple_GET_ITEM(t, 1))) return false;
  Py_ssize_t rank = PyTuple_GET_SIZE(shape);
  p.Array(static_cast<size_t>(rank));
  for (Py_ssize_t d = 0; d < rank; ++d) {
    if (!PackInt(p, PyTuple_GET_ITEM(shape, d))) return false;
  }
  if (block.present) {
    if (!PackStr(p, block.segment)) return false;
    p.Uint(*pos);
  } else {
    p.Str("", 0);  // NOTE: no block: write_answer_batch's empty segment at offset 0
    p.Uint(0);
  }
  p.Uint(n);
  p.Uint(0);  // region_id: an arena
  *pos += (n + kAlign - 1) & ~(kAlign - 1);
  return true;
}

// One member: (request_id, version, parameters_json, outputs) as its InferResponse:
// [tag, request_id, version, outputs, block, error, final, empty, trace, extra_blocks,
//  parameters_json, shared_blocks, handoffs].
bool PackResponse(Packer& p, PyObject* m, const Block& block, const View& dst, uint64_t* pos,
                  uint64_t* uses) {
  if (!PyTuple_Check(m) || PyTuple_GET_SIZE(m) != 4 || !PyList_Check(PyTuple_GET_ITEM(m, 3))) {
    PyErr_SetString(PyExc_TypeError, "a member is (request_id, version, parameters, outputs)");
    return false;
  }
  PyObject* outputs = PyTuple_GET_ITEM(m, 3);
  p.Array(13);
  p.Str("response", 8);
  if (!PackInt(p, PyTuple_GET_ITEM(m, 0)) || !PackInt(p, PyTuple_GET_ITEM(m, 1))) return false;
  Py_ssize_t n = PyList_GET_SIZE(outputs);
  p.Array(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    if (!PackTensor(p, PyList_GET_ITEM(outputs, i), block, dst, pos)) return false;
  }
  p.Nil();        // block: the batch's is shared
  p.Nil();        // error
  p.Bool(true);   // final
  p.Bool(false);  // empty
  p.Nil();        // trace
  p.Array(0);     // extra_blocks
  if (!PackStr(p, PyTuple_GET_ITEM(m, 2))) return false;
  const bool names_block = n > 0;
  *uses += names_block;
  if (names_block && block.present) {
    p.Array(1);
    if (!block.Pack(p)) return false;
  } else {
    p.Array(0);
  }
  p.Array(0);  // handoffs: the batch's
  return true;
}

PyObject* WriteAnswerBatch(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError,
                    "write_answer_batch(buf, segment, block_offset, generation, pos, members)");
    return nullptr;
  }
  PyObject* members = args[5];
  if (!PyList_Check(members)) {
    PyErr_SetString(PyExc_TypeError, "members is a list");
    return nullptr;
  }
  Block block;
  View dst;
  uint64_t pos = 0;
  if (args[0] != Py_None) {
    if (!dst.Get(args[0], PyBUF_WRITABLE)) return nullptr;
    block.present = true;
    block.segment = args[1];
    block.offset = args[2];
    block.generation = args[3];
    pos = PyLong_AsUnsignedLongLong(args[4]);
    if (pos == static_cast<uint64_t>(-1) && PyErr_Occurred()) return nullptr;
  }
  Packer p;
  Py_ssize_t count = PyList_GET_SIZE(members);
  p.out.reserve(64 + 160 * static_cast<size_t>(count));
  p.Array(3);  // AnswerBatch: [tag, responses, handoffs]
  p.Str("answers", 7);
  p.Array(static_cast<size_t>(count));
  uint64_t uses = 0;
  for (Py_ssize_t i = 0; i < count; ++i) {
    if (!PackResponse(p, PyList_GET_ITEM(members, i), block, dst, &pos, &uses)) return nullptr;
  }
  if (block.present) {
    p.Array(1);  // Handoff: [block, uses]
    p.Array(2);
    if (!block.Pack(p)) return nullptr;
    p.Uint(uses);
  } else {
    p.Array(0);
  }
  return PyBytes_FromStringAndSize(p.out.data(), static_cast<Py_ssize_t>(p.out.size()));
}

PyMethodDef kMethods[] = {
    {"write_answer_batch", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(WriteAnswerBatch)),
     METH_FASTCALL,
     "write_answer_batch(buf, segment, block_offset, generation, pos, members) -> bytes: copy "
     "each member's outputs into buf from pos on (64-byte aligned) and return the msgpack "
     "AnswerBatch naming them (buf None: no block, every output empty)."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_answer_writer",
    "A batch's answers to one frontend written in one call (see answer_writer.cc).",
    -1, kMethods, nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__answer_writer() { return PyModule_Create(&kModule); }
