// triton_mp.workers._answer_writer: one frontend's answers to a batch, written in one call:
// the outputs placed, copied into the batch's one arena block, and the AnswerBatch encoded.
//
// Python twin: write_answer_batch in src/triton_mp/workers/tensors/answer_batch.py, for a
// group whose every member takes _place_all's hot path (a dict of outputs, no client region,
// each requested output an array of a tensor_io.WIRE_OF dtype, C-contiguous): the outputs
// are those _place_all places, in its order; their bytes go where _answer copies them
// (64-byte aligned from the block's payload on); the bytes returned are msgspec's msgpack of
// the AnswerBatch _answer builds (src/triton_mp/ipc/protocol/messages.py: AnswerBatch,
// InferResponse, TensorRef, BlockRef, Handoff; array_like structs, a tagged one's array
// starts with its tag, every field in declaration order, defaults included), byte for byte
// (tests/unit/test_answer_writer.py compares them on random groups), so the readers
// (ipc/recordio/codec.py's Decoder, frontend/native/answer_reader.cc) see no difference.
//
// It decides nothing: any member that is not that plain (an error, a client region, a BYTES
// or strided or odd-typed output, a missing attribute) makes it return None before anything
// is allocated, and Python places, words and writes the whole group as before. The
// parameters of a dict subclass come from Python (params_of), the block from Python's
// allocator (alloc), whose errors (an exhausted arena) propagate.
//
// Why: at add_sub_py c=16 (about 9 requests a batch, 2 outputs each) the Python placement
// loop, the TensorRef / InferResponse / AnswerBatch objects and msgspec's walk over them
// were ~20% of the worker's samples (py-spy, issue 34).
//
// answer_plain does the same for a whole batch of one frontend, and also what Python did
// around it: the test of workers/answering.py _one_frontend (every request answers the same
// ReplyTo object of kind FRONTEND, untraced, with a plain dict of outputs; anything else
// declines before anything is allocated), and the push of the encoded AnswerBatch into that
// frontend's ring (ipc/native/ring_push.h, Ring.push's twin), so Python only posts the
// wake-up. A ring that is full, or a record too large for it, is left to Python's send (its
// wait, its RecordTooLarge), with the bytes.
//
// Given ClientRegions.window, answer_plain also takes requests that asked outputs into a
// client's registered region (Triton's output shared_memory_region): each such output is
// checked (its room, the object's size now, by window itself) and copied there as
// tensor_io.write_region copies it; a check that fails declines the batch, and Python's path
// fails that request in its words. Why: at identity_py 1 MiB c=4 with client shared memory
// every request is answered alone into a client region, and the Python around that copy
// (write_outputs, output_parts, the InferResponse, its encoding and the send) was most of
// the worker's time besides the copy (issue 34, s13wrk's profile).
//
// Given input_buf (segment name -> this worker's mapping of a frontend's input arena,
// SegmentCache.get(name).buf), answer_plain also answers an output from its request's own
// input block: an arena-bound output of kAliasMinBytes or more whose bytes lie wholly inside
// one of the request's arena inputs (the model returned a view of its input, as identity
// models do) is not copied; its TensorRef names the input's segment and the output's offset
// in it (the same bytes, the same segment offsets in every mapping), and takes no room in
// the block. The frontend reads it there before it frees the input block, or frees the
// block only when the output is sent (ipc/protocol/messages.py TensorRef, the Python twin of
// the rule: frontend/dispatch/pending.py, frontend/native/known_answer.h). An output that is
// a modified copy lies outside every input and is copied as before. Why: at identity_py
// 1 MiB c=4 without client shared memory that copy was a quarter of the worker's CPU
// (perf: __memmove 25% of ~207 us per inference, s16id).
//
// What it reads, it reads directly where it can: an output that is exactly a numpy.ndarray
// (as a model's outputs nearly always are) through numpy's C API (its dtype object, its data,
// size, dims and C-contiguous flag: what arr.dtype, arr.shape and the C-contiguous buffer
// export give, without the shape tuple and the buffer's format and shape info that numpy
// builds for each new array), anything else through Python (getattr, the buffer protocol);
// the fields of an InferRequest and its ReplyTo at their slots (ipc/native/slots.h, the
// classes from configure()), anything else through getattr. Why: at add_sub_py c=16 the
// answer was the largest step of the live batch after the model's execute (~1.6 us per
// request, bench/worker_phases.py), and these reads were most of its hot cost.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_23_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL triton_mp_answer_writer_ARRAY_API
#include <numpy/arrayobject.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <utility>

#include "../../ipc/native/py_ref.h"
#include "../../ipc/native/ring_push.h"
#include "../../ipc/native/slots.h"

namespace {
using triton_mp::Keep;
using triton_mp::PushRecord;
using triton_mp::Ref;
using triton_mp::RingPush;
using triton_mp::SlotGet;

constexpr uint64_t kAlign = 64;  // ipc/tensor_pool.py ALIGN
// An output at least this large may be answered from its request's input block (header
// comment): below it the copy costs less than looking for the input (frontend/native/
// known_answer.h kInPlaceMinBytes: the native frontend sends such outputs in place).
constexpr uint64_t kAliasMinBytes = 64 * 1024;

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

// Interned attribute names, made once.
struct Names {
  PyObject* request_id = nullptr;
  PyObject* version = nullptr;
  PyObject* outputs = nullptr;
  PyObject* output_regions = nullptr;
  PyObject* dtype = nullptr;
  PyObject* shape = nullptr;
  PyObject* segment = nullptr;
  PyObject* offset = nullptr;
  PyObject* generation = nullptr;
  PyObject* reply_to = nullptr;
  PyObject* kind = nullptr;
  PyObject* trace = nullptr;
  PyObject* id = nullptr;
  PyObject* key = nullptr;
  PyObject* region_id = nullptr;
  PyObject* byte_size = nullptr;
  PyObject* inputs = nullptr;
  PyObject* nbytes = nullptr;
};
Names g_names;

// InferRequest's fields read here (ipc/protocol/messages.py), and its ReplyTo's.
constexpr const char* kRequestFields[] = {"request_id", "version",  "outputs", "output_regions",
                                          "reply_to",   "trace",    "inputs"};
enum RequestField { kRequestId, kVersion, kOutputs, kOutputRegions, kReplyTo, kTrace, kInputs,
                    kNumRequestFields };
constexpr const char* kReplyFields[] = {"kind", "id"};
enum ReplyField { kKind, kId, kNumReplyFields };

// The classes from configure() (owned references, kept for the process) and their slots;
// nullptr before it: every field is read with getattr.
struct Config {
  PyTypeObject* infer_request = nullptr;  // ipc.protocol.messages.InferRequest
  PyTypeObject* reply_to = nullptr;       // ipc.protocol.messages.ReplyTo
  Py_ssize_t request[kNumRequestFields] = {};
  Py_ssize_t reply[kNumReplyFields] = {};
};
Config g;

// Field `field` of request `req` (a new reference): read at its slot when `req` is exactly
// the configured InferRequest, else getattr(req, name). nullptr when missing (with getattr's
// exception set; none for an unset slot): the caller declines.
PyObject* OfRequest(PyObject* req, RequestField field, PyObject* name) {
  if (Py_TYPE(req) == g.infer_request) return Py_XNewRef(SlotGet(req, g.request[field]));
  return PyObject_GetAttr(req, name);
}

// The same for a ReplyTo.
PyObject* OfReply(PyObject* to, ReplyField field, PyObject* name) {
  if (Py_TYPE(to) == g.reply_to) return Py_XNewRef(SlotGet(to, g.reply[field]));
  return PyObject_GetAttr(to, name);
}

// One output planned: its name and datatype (borrowed: the result dict and the wire table
// hold them), its shape, and its bytes (bytes(), nbytes(): a C-contiguous array's data),
// read from an exact ndarray through numpy's C API (`array` holds it: its dims and data) or
// from any other object through Python (`shape` its shape tuple, `data` its buffer). 256
// bytes: libstdc++'s deque keeps two in one 512-byte node. An output the
// request asked into a client's region (OutputRegion) also holds that region's key, offset
// and region_id (borrowed: the request holds them) and the writable mapping the window
// callable gave for it (`dest`, checked to hold [offset, offset + nbytes)).
struct Planned {
  PyObject* name = nullptr;
  PyObject* datatype = nullptr;
  Ref shape;  // nullptr: read through numpy's C API (`array`)
  View data;
  Ref array;
  Ref key;  // nullptr: to the batch's arena block
  Ref region_offset;
  Ref region_id;
  uint64_t offset = 0;
  View dest;
  Ref alias;  // not nullptr: answered from the request's input block, in this segment
  uint64_t alias_offset = 0;  // at this offset of it

  PyArrayObject* Array() const { return reinterpret_cast<PyArrayObject*>(array.get()); }
  const char* bytes() const { return array ? PyArray_BYTES(Array()) : data.data(); }
  uint64_t nbytes() const {
    return static_cast<uint64_t>(array ? PyArray_NBYTES(Array()) : data.size());
  }
};
static_assert(sizeof(Planned) <= 256, "two Planned in one of libstdc++'s 512-byte deque nodes");

// One member planned: (request_id, version, parameters_json) and its outputs
// [first, first + count) of the plan's outputs, `to_arena` of them bound for the block.
struct Member {
  Ref request_id;
  Ref version;
  Ref parameters;
  size_t first = 0;
  size_t count = 0;
  size_t to_arena = 0;
};

// Whether an exception is one a declined plan clears (the Python path then meets it again,
// as the Python hot loop would, and fails that request with its own words).
enum class Step { kOk, kDecline, kError };

// Output `t` (its bytes planned) placed in `region` (an OutputRegion) as
// tensor_io.output_parts and write_region place it: no larger than the room the client gave
// (byte_size), and inside the mapping `window` gives for it (ClientRegions.window(key,
// region_id, True, offset, nbytes, what), which checks the object's size now and raises
// otherwise). kDecline for anything else: Python's path then fails that request in its own
// words (the `what` passed here is the output's name; its message is never shown).
Step PlanRegion(PyObject* region, PyObject* window, Planned& t) {
  Ref byte_size(PyObject_GetAttr(region, g_names.byte_size));
  t.key.reset(PyObject_GetAttr(region, g_names.key));
  t.region_id.reset(PyObject_GetAttr(region, g_names.region_id));
  t.region_offset.reset(PyObject_GetAttr(region, g_names.offset));
  if (byte_size.get() == nullptr || t.key.get() == nullptr || t.region_id.get() == nullptr ||
      t.region_offset.get() == nullptr || !PyLong_Check(byte_size.get()) ||
      !PyLong_Check(t.region_offset.get())) {
    return Step::kDecline;
  }
  const unsigned long long room = PyLong_AsUnsignedLongLong(byte_size.get());
  const unsigned long long offset = PyLong_AsUnsignedLongLong(t.region_offset.get());
  if (PyErr_Occurred()) return Step::kDecline;
  const uint64_t n = t.nbytes();
  if (n > room) return Step::kDecline;
  Ref nbytes(PyLong_FromUnsignedLongLong(n));
  if (nbytes.get() == nullptr) return Step::kError;
  PyObject* call[6] = {t.key.get(), t.region_id.get(), Py_True, t.region_offset.get(),
                       nbytes.get(), t.name};
  Ref mapped(PyObject_Vectorcall(window, call, 6, nullptr));
  if (mapped.get() == nullptr || !t.dest.Get(mapped.get(), PyBUF_WRITABLE)) {
    return Step::kDecline;
  }
  const uint64_t size = static_cast<uint64_t>(t.dest.size());
  if (offset > size || n > size - offset) return Step::kDecline;
  t.offset = offset;
  return Step::kOk;
}

// Whether output `t` (arena-bound, its bytes planned) lies wholly inside one of the arena
// inputs of `req` (req.inputs: TensorRefs, region_id 0) as this worker maps them
// (input_buf(segment): SegmentCache.get(segment).buf): then t.alias and t.alias_offset name
// its bytes there (header comment). Anything that does not read as expected (an attribute
// missing, a segment gone, a range past the mapping) is no alias: the output is copied.
bool PlanAlias(PyObject* req, PyObject* input_buf, Planned& t) {
  Ref inputs(OfRequest(req, kInputs, g_names.inputs));
  if (inputs.get() == nullptr || !PyTuple_Check(inputs.get())) {
    PyErr_Clear();
    return false;
  }
  const auto p = reinterpret_cast<uintptr_t>(t.bytes());
  const auto n = t.nbytes();
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(inputs.get()); ++i) {
    PyObject* ref = PyTuple_GET_ITEM(inputs.get(), i);
    Ref region_id(PyObject_GetAttr(ref, g_names.region_id));
    Ref segment(PyObject_GetAttr(ref, g_names.segment));
    Ref offset_obj(PyObject_GetAttr(ref, g_names.offset));
    Ref nbytes_obj(PyObject_GetAttr(ref, g_names.nbytes));
    if (region_id.get() == nullptr || segment.get() == nullptr || offset_obj.get() == nullptr ||
        nbytes_obj.get() == nullptr || !PyUnicode_Check(segment.get())) {
      PyErr_Clear();
      continue;
    }
    const int in_region = PyObject_IsTrue(region_id.get());
    const unsigned long long offset = PyLong_AsUnsignedLongLong(offset_obj.get());
    const unsigned long long nbytes = PyLong_AsUnsignedLongLong(nbytes_obj.get());
    if (in_region != 0 || PyErr_Occurred() || nbytes < n) {
      PyErr_Clear();
      continue;
    }
    Ref buf(PyObject_CallOneArg(input_buf, segment.get()));
    View mapped;
    if (buf.get() == nullptr || !mapped.Get(buf.get(), PyBUF_SIMPLE)) {
      PyErr_Clear();
      continue;
    }
    const auto size = static_cast<uint64_t>(mapped.size());
    if (offset > size || nbytes > size - offset) continue;
    const uintptr_t start = reinterpret_cast<uintptr_t>(mapped.data()) + offset;
    if (p < start || p - start > nbytes || n > nbytes - (p - start)) continue;
    t.alias.reset(segment.release());
    t.alias_offset = offset + (p - start);
    return true;
  }
  return false;
}

// Output `t` read from `arr`, an exact ndarray, through numpy's C API: its datatype
// (wire_of[arr.dtype]), dims and bytes, as ReadObject reads them (arr.dtype
// is the array's descr object; numpy exports a C-contiguous buffer of its data and nbytes
// exactly when NPY_ARRAY_C_CONTIGUOUS is set, for every dtype of wire_of). False (declined)
// for a dtype not in wire_of or a strided array.
bool ReadArray(PyObject* arr, PyObject* wire_of, Planned& t) {
  auto* a = reinterpret_cast<PyArrayObject*>(arr);
  t.datatype = PyDict_GetItemWithError(wire_of, reinterpret_cast<PyObject*>(PyArray_DESCR(a)));
  if (t.datatype == nullptr || !PyArray_IS_C_CONTIGUOUS(a)) return false;
  // NOTE: held: Python runs later (window, alloc), and the array we hold can be neither
  // resized nor given other data (its shape may be reset in place: the same nbytes).
  t.array.reset(Py_NewRef(arr));
  return true;
}

// Output `t` read from any other object through Python: wire_of[arr.dtype], arr.shape (a
// tuple) and its C-contiguous buffer. False (declined) when one is missing or refused.
bool ReadObject(PyObject* arr, PyObject* wire_of, Planned& t) {
  Ref dtype(PyObject_GetAttr(arr, g_names.dtype));
  if (dtype.get() == nullptr) return false;
  t.datatype = PyDict_GetItemWithError(wire_of, dtype.get());
  if (t.datatype == nullptr) return false;
  t.shape.reset(PyObject_GetAttr(arr, g_names.shape));
  if (t.shape.get() == nullptr || !PyTuple_Check(t.shape.get())) return false;
  return t.data.Get(arr, PyBUF_C_CONTIGUOUS);
}

// A member (req, res) planned as _place_all's hot loop places it: every output of `res`
// whose name is in req.outputs, in the dict's order, of a datatype of `wire_of`
// (tensor_io.WIRE_OF: a native-order numpy dtype -> protocol datatype) and C-contiguous.
// With `window` (not nullptr) a request that names client regions (req.output_regions, one
// per name of req.outputs, None: the arena) is planned as answer_batch._place places it:
// each output whose name's region is set goes there (PlanRegion). kDecline for anything else
// (a result that is no dict, a client region without `window`, another dtype, a strided
// array, an attribute missing): the Python path then places the whole group. With
// `input_buf` (not nullptr) an arena-bound output of kAliasMinBytes or more that lies in an
// input of `req` is answered from there (PlanAlias) and takes no room in the block.
Step PlanMember(PyObject* req, PyObject* res, PyObject* wire_of, PyObject* params_of,
                PyObject* window, PyObject* input_buf, std::deque<Planned>& outs,
                Member& member, uint64_t* total) {
  if (!PyDict_Check(res)) return Step::kDecline;
  Ref regions(OfRequest(req, kOutputRegions, g_names.output_regions));
  if (regions.get() == nullptr) return Step::kDecline;
  int has_regions = PyObject_IsTrue(regions.get());
  if (has_regions < 0 || (has_regions != 0 && window == nullptr)) return Step::kDecline;
  Ref wanted(OfRequest(req, kOutputs, g_names.outputs));
  member.request_id.reset(OfRequest(req, kRequestId, g_names.request_id));
  member.version.reset(OfRequest(req, kVersion, g_names.version));
  if (wanted.get() == nullptr || member.request_id.get() == nullptr ||
      member.version.get() == nullptr) {
    return Step::kDecline;
  }
  if (has_regions != 0 &&
      (!PyTuple_Check(regions.get()) || !PyTuple_Check(wanted.get()) ||
       PyTuple_GET_SIZE(regions.get()) != PyTuple_GET_SIZE(wanted.get()))) {
    return Step::kDecline;  // NOTE: output_parts' ValueError
  }
  if (PyDict_CheckExact(res)) {
    member.parameters.reset(PyUnicode_FromStringAndSize("", 0));
  } else {
    // NOTE: a dict subclass (backends.base.Outputs) carries parameters: Python's words.
    member.parameters.reset(PyObject_CallOneArg(params_of, res));
    if (member.parameters.get() == nullptr) return Step::kError;
  }
  member.first = outs.size();
  Py_ssize_t it = 0;
  PyObject* name = nullptr;
  PyObject* arr = nullptr;
  while (PyDict_Next(res, &it, &name, &arr)) {
    int in = PySequence_Contains(wanted.get(), name);
    if (in < 0) return Step::kDecline;
    if (in == 0) continue;
    Planned& t = outs.emplace_back();
    t.name = name;
    if (!(PyArray_CheckExact(arr) ? ReadArray(arr, wire_of, t) : ReadObject(arr, wire_of, t))) {
      return Step::kDecline;
    }
    if (has_regions != 0) {
      // NOTE: the name's region by its first index in req.outputs (output_parts' names.index).
      const Py_ssize_t at = PySequence_Index(wanted.get(), name);
      if (at < 0) return Step::kDecline;
      PyObject* region = PyTuple_GET_ITEM(regions.get(), at);
      if (region != Py_None) {
        const Step placed = PlanRegion(region, window, t);
        if (placed != Step::kOk) return placed;
        continue;
      }
    }
    if (input_buf != nullptr && t.nbytes() >= kAliasMinBytes &&
        PlanAlias(req, input_buf, t)) {
      continue;
    }
    ++member.to_arena;
    *total += (t.nbytes() + kAlign - 1) & ~(kAlign - 1);
  }
  member.count = outs.size() - member.first;
  return Step::kOk;
}

// An output's shape as msgpack: an array of its ints (its array's dims, or its shape tuple's).
bool PackShape(Packer& p, const Planned& t) {
  if (t.shape.get() == nullptr) {
    const int rank = PyArray_NDIM(t.Array());
    const npy_intp* dims = PyArray_DIMS(t.Array());
    p.Array(static_cast<size_t>(rank));
    for (int d = 0; d < rank; ++d) p.Int(static_cast<int64_t>(dims[d]));
    return true;
  }
  PyObject* shape = t.shape.get();
  const Py_ssize_t rank = PyTuple_GET_SIZE(shape);
  p.Array(static_cast<size_t>(rank));
  for (Py_ssize_t d = 0; d < rank; ++d) {
    if (!PackInt(p, PyTuple_GET_ITEM(shape, d))) return false;
  }
  return true;
}

// The block's BlockRef: [segment, offset, generation].
bool PackBlock(Packer& p, PyObject* block, const Ref& segment) {
  Ref offset(PyObject_GetAttr(block, g_names.offset));
  Ref generation(PyObject_GetAttr(block, g_names.generation));
  if (offset.get() == nullptr || generation.get() == nullptr) return false;
  p.Array(3);
  return PackStr(p, segment.get()) && PackInt(p, offset.get()) && PackInt(p, generation.get());
}

// The AnswerBatch of the planned members, their outputs copied into `dst` from `pos` on
// (`block` None: no block, every output empty) or into their client regions (a TensorRef
// [name, datatype, shape, region key, region offset, nbytes, region_id], as write_region
// names it). InferResponse:
// [tag, request_id, version, outputs, block, error, final, empty, trace, extra_blocks,
//  parameters_json, shared_blocks, handoffs]; TensorRef:
// [name, datatype, shape, segment, offset, nbytes, region_id].
bool Pack(Packer& p, const std::deque<Member>& members, std::deque<Planned>& outs,
          PyObject* block, const View& dst, uint64_t pos) {
  const bool has_block = block != Py_None;
  Ref segment(has_block ? PyObject_GetAttr(block, g_names.segment)
                        : PyUnicode_FromStringAndSize("", 0));
  if (segment.get() == nullptr) return false;
  std::string block_ref;  // the BlockRef's bytes, written once, copied per response
  if (has_block) {
    Packer b;
    if (!PackBlock(b, block, segment)) return false;
    block_ref = std::move(b.out);
  }
  p.out.reserve(64 + 200 * members.size());
  p.Array(3);  // AnswerBatch: [tag, responses, handoffs]
  p.Str("answers", 7);
  p.Array(members.size());
  uint64_t uses = 0;
  for (const Member& m : members) {
    p.Array(13);
    p.Str("response", 8);
    if (!PackInt(p, m.request_id.get()) || !PackInt(p, m.version.get())) return false;
    p.Array(m.count);
    for (size_t i = m.first; i < m.first + m.count; ++i) {
      Planned& t = outs[i];
      const uint64_t n = t.nbytes();
      const char* bytes = t.bytes();
      if (t.key.get() != nullptr) {
        // NOTE: PlanRegion checked [offset, offset + n) lies in the mapping; memmove: a
        // model's output may be a view of the same pages through another mapping.
        if (n != 0) std::memmove(t.dest.data() + t.offset, bytes, n);
        p.Array(7);
        if (!PackStr(p, t.name) || !PackStr(p, t.datatype) || !PackShape(p, t) ||
            !PackStr(p, t.key.get()) || !PackInt(p, t.region_offset.get())) {
          return false;
        }
        p.Uint(n);
        if (!PackInt(p, t.region_id.get())) return false;
        continue;
      }
      if (t.alias.get() != nullptr) {
        // NOTE: the bytes stay in the request's input block (PlanAlias): no copy
        p.Array(7);
        if (!PackStr(p, t.name) || !PackStr(p, t.datatype) || !PackShape(p, t) ||
            !PackStr(p, t.alias.get())) {
          return false;
        }
        p.Uint(t.alias_offset);
        p.Uint(n);
        p.Uint(0);  // region_id: an arena (the frontend's own)
        continue;
      }
      if (n != 0) {
        if (!has_block || pos > static_cast<uint64_t>(dst.size()) ||
            n > static_cast<uint64_t>(dst.size()) - pos) {
          PyErr_SetString(PyExc_ValueError, "outputs past the end of the block's segment");
          return false;
        }
        std::memcpy(dst.data() + pos, bytes, n);
      }
      p.Array(7);
      if (!PackStr(p, t.name) || !PackStr(p, t.datatype) || !PackShape(p, t) ||
          !PackStr(p, segment.get())) {
        return false;
      }
      p.Uint(has_block ? pos : 0);  // NOTE: no block: the empty segment at offset 0
      p.Uint(n);
      p.Uint(0);  // region_id: an arena
      pos += (n + kAlign - 1) & ~(kAlign - 1);
    }
    p.Nil();        // block: the batch's is shared
    p.Nil();        // error
    p.Bool(true);   // final
    p.Bool(false);  // empty
    p.Nil();        // trace
    p.Array(0);     // extra_blocks
    if (!PackStr(p, m.parameters.get())) return false;
    uses += m.to_arena > 0;
    if (m.to_arena > 0 && has_block) {
      p.Array(1);
      p.out += block_ref;
    } else {
      p.Array(0);
    }
    p.Array(0);  // handoffs: the batch's
  }
  if (has_block) {
    p.Array(1);  // Handoff: [block, uses]
    p.Array(2);
    p.out += block_ref;
    p.Uint(uses);
  } else {
    p.Array(0);
  }
  return true;
}

// The planned members' block allocated (alloc(arena, total) when any output has bytes),
// their outputs copied into it and their AnswerBatch encoded into p; the block (None: none)
// in *block. False with an exception set (the allocator's own, e.g. an exhausted arena).
bool AllocAndPack(Packer& p, const std::deque<Member>& members, std::deque<Planned>& outs,
                  uint64_t total, PyObject* alloc, PyObject* arena, Ref* block) {
  block->reset(Py_NewRef(Py_None));
  View dst;
  uint64_t pos = 0;
  if (total != 0) {
    Ref total_obj(PyLong_FromUnsignedLongLong(total));
    if (total_obj.get() == nullptr) return false;
    PyObject* call[2] = {arena, total_obj.get()};
    Ref got(PyObject_Vectorcall(alloc, call, 2, nullptr));  // (buf, pos, block) or raises
    if (got.get() == nullptr) return false;
    if (!PyTuple_Check(got.get()) || PyTuple_GET_SIZE(got.get()) != 3) {
      PyErr_SetString(PyExc_TypeError, "alloc returns (buf, pos, block)");
      return false;
    }
    if (!dst.Get(PyTuple_GET_ITEM(got.get(), 0), PyBUF_WRITABLE)) return false;
    pos = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(got.get(), 1));
    if (pos == static_cast<uint64_t>(-1) && PyErr_Occurred()) return false;
    block->reset(Py_NewRef(PyTuple_GET_ITEM(got.get(), 2)));
  }
  return Pack(p, members, outs, block->get(), dst, pos);
}

// write_plain(members, wire_of, params_of, alloc, arena) -> (bytes, block) | None.
PyObject* WritePlain(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 5 || !PyList_Check(args[0]) || !PyDict_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError,
                    "write_plain(members: list, wire_of: dict, params_of, alloc, arena)");
    return nullptr;
  }
  PyObject* list = args[0];
  std::deque<Planned> outs;
  std::deque<Member> members;
  uint64_t total = 0;
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); ++i) {
    PyObject* m = PyList_GET_ITEM(list, i);
    Step step = Step::kDecline;
    if (PyTuple_Check(m) && PyTuple_GET_SIZE(m) == 2) {
      step = PlanMember(PyTuple_GET_ITEM(m, 0), PyTuple_GET_ITEM(m, 1), args[1], args[2],
                        nullptr, nullptr, outs, members.emplace_back(), &total);
    }
    if (step == Step::kError) return nullptr;
    if (step == Step::kDecline) {
      PyErr_Clear();
      Py_RETURN_NONE;
    }
  }
  Ref block;
  Packer p;
  if (!AllocAndPack(p, members, outs, total, args[3], args[4], &block)) return nullptr;
  Ref data(PyBytes_FromStringAndSize(p.out.data(), static_cast<Py_ssize_t>(p.out.size())));
  if (data.get() == nullptr) return nullptr;
  return PyTuple_Pack(2, data.get(), block.get());
}

// The ReplyTo every request of `reqs` answers (borrowed from the first request), when the
// batch is one frontend's plain batch as answering._one_frontend tells it: every request's
// reply_to the same object, of kind `frontend_kind`, trace None, and its result exactly a
// dict. nullptr (no exception) for any other batch, or a missing attribute.
PyObject* OneFrontend(PyObject* reqs, PyObject* results, PyObject* frontend_kind) {
  const Py_ssize_t n = PyTuple_GET_SIZE(reqs);
  PyObject* to = nullptr;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* req = PyTuple_GET_ITEM(reqs, i);
    if (!PyDict_CheckExact(PyList_GET_ITEM(results, i))) return nullptr;
    Ref reply_to(OfRequest(req, kReplyTo, g_names.reply_to));
    Ref trace(OfRequest(req, kTrace, g_names.trace));
    if (reply_to.get() == nullptr || trace.get() == nullptr || trace.get() != Py_None) {
      return nullptr;
    }
    if (to == nullptr) {
      Ref kind(OfReply(reply_to.get(), kKind, g_names.kind));
      if (kind.get() != frontend_kind) return nullptr;
      to = reply_to.get();  // NOTE: borrowed: the first request keeps it
    } else if (reply_to.get() != to) {
      return nullptr;
    }
  }
  return to;
}

// answer_plain(reqs, results, frontend_kind, rings, wire_of, params_of, alloc, arena, window
//   [, input_buf]) -> (frontend_id, bytes | None, block) | None.
PyObject* AnswerPlain(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if ((nargs != 9 && nargs != 10) || !PyTuple_Check(args[0]) || !PyList_Check(args[1]) ||
      !PyDict_Check(args[3]) || !PyDict_Check(args[4])) {
    PyErr_SetString(PyExc_TypeError,
                    "answer_plain(reqs: tuple, results: list, frontend_kind, rings: dict, "
                    "wire_of: dict, params_of, alloc, arena, window[, input_buf])");
    return nullptr;
  }
  PyObject* window = args[8] == Py_None ? nullptr : args[8];
  PyObject* input_buf = nargs < 10 || args[9] == Py_None ? nullptr : args[9];
  PyObject* reqs = args[0];
  PyObject* results = args[1];
  const Py_ssize_t n = PyTuple_GET_SIZE(reqs);
  if (n == 0 || PyList_GET_SIZE(results) != n) Py_RETURN_NONE;
  PyObject* to = OneFrontend(reqs, results, args[2]);
  if (to == nullptr) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  Ref frontend_id(OfReply(to, kId, g_names.id));
  if (frontend_id.get() == nullptr) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  std::deque<Planned> outs;
  std::deque<Member> members;
  uint64_t total = 0;
  for (Py_ssize_t i = 0; i < n; ++i) {
    Step step = PlanMember(PyTuple_GET_ITEM(reqs, i), PyList_GET_ITEM(results, i), args[4],
                           args[5], window, input_buf, outs, members.emplace_back(), &total);
    if (step == Step::kError) return nullptr;
    if (step == Step::kDecline) {
      PyErr_Clear();
      Py_RETURN_NONE;
    }
  }
  Ref block;
  Packer p;
  if (!AllocAndPack(p, members, outs, total, args[6], args[7], &block)) return nullptr;
  PyObject* ring = PyDict_GetItemWithError(args[3], frontend_id.get());  // borrowed
  if (ring == nullptr && PyErr_Occurred()) return nullptr;
  if (ring != nullptr) {
    View mapped;
    if (!mapped.Get(ring, PyBUF_WRITABLE)) return nullptr;
    RingPush pushed =
        PushRecord(reinterpret_cast<unsigned char*>(mapped.data()),
                   static_cast<uint64_t>(mapped.size()), p.out.data(), p.out.size());
    if (pushed == RingPush::kPushed) {
      return PyTuple_Pack(3, frontend_id.get(), Py_None, block.get());
    }
  }
  // NOTE: no ring given for it, or a full ring, or a record too large: Python's send.
  Ref data(PyBytes_FromStringAndSize(p.out.data(), static_cast<Py_ssize_t>(p.out.size())));
  if (data.get() == nullptr) return nullptr;
  return PyTuple_Pack(3, frontend_id.get(), data.get(), block.get());
}

// push_record(ring, data) -> int: RingPush's code (0 pushed, 1 full, 2 too large, 3 no ring).
PyObject* PushRecordPy(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 2) {
    PyErr_SetString(PyExc_TypeError, "push_record(ring, data)");
    return nullptr;
  }
  View mapped;
  View data;
  if (!mapped.Get(args[0], PyBUF_WRITABLE) || !data.Get(args[1], PyBUF_SIMPLE)) return nullptr;
  RingPush got = PushRecord(reinterpret_cast<unsigned char*>(mapped.data()),
                            static_cast<uint64_t>(mapped.size()), data.data(),
                            static_cast<size_t>(data.size()));
  return PyLong_FromLong(static_cast<long>(got));
}

// configure(InferRequest, ReplyTo): the classes whose fields are read at their slots.
PyObject* Configure(PyObject*, PyObject* args) {
  PyObject *infer_request, *reply_to;
  if (!PyArg_ParseTuple(args, "OO:configure", &infer_request, &reply_to)) return nullptr;
  Py_ssize_t request[kNumRequestFields], reply[kNumReplyFields];
  if (!triton_mp::SlotOffsets(infer_request, kRequestFields, kNumRequestFields, request) ||
      !triton_mp::SlotOffsets(reply_to, kReplyFields, kNumReplyFields, reply)) {
    return nullptr;
  }
  Keep(&g.infer_request, infer_request);
  Keep(&g.reply_to, reply_to);
  std::copy(request, request + kNumRequestFields, g.request);
  std::copy(reply, reply + kNumReplyFields, g.reply);
  Py_RETURN_NONE;
}

PyMethodDef kMethods[] = {
    {"configure", Configure, METH_VARARGS,
     "configure(InferRequest, ReplyTo): read these classes' fields at their slots (before: "
     "with getattr, as for any other object)."},
    {"push_record", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(PushRecordPy)),
     METH_FASTCALL,
     "push_record(ring, data) -> int: append one record to the ring mapped by `ring` (a "
     "writable buffer) as Ring.push does: 0 pushed, 1 full, 2 too large (RecordTooLarge), "
     "3 not a ring; nothing is written unless 0 (ring_push.h)."},
    {"write_plain", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(WritePlain)),
     METH_FASTCALL,
     "write_plain(members, wire_of, params_of, alloc, arena) -> (bytes, block) | None: "
     "members [(InferRequest, outputs dict)] placed as answer_batch._place_all's hot loop "
     "places them; None (nothing allocated) when one is not that plain. Otherwise "
     "alloc(arena, total) -> (buf, pos, BlockRef) is called when any output has bytes, "
     "they are copied into buf from pos on (64-byte aligned) and the msgpack AnswerBatch "
     "naming them is returned with the block (None: no block)."},
    {"answer_plain", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(AnswerPlain)),
     METH_FASTCALL,
     "answer_plain(reqs, results, frontend_kind, rings, wire_of, params_of, alloc, arena, "
     "window) -> (frontend_id, bytes | None, block) | None: a batch whose every request "
     "answers one ReplyTo of kind frontend_kind, untraced, with a plain dict of outputs (else "
     "None, nothing allocated), written as write_plain writes its members (outputs a request "
     "asked into a client region, too, where window is ClientRegions.window, not None: "
     "copied there as write_region copies them), and its AnswerBatch "
     "pushed into rings[frontend_id] (a writable ring mapping): bytes None. The bytes come "
     "back unpushed when no ring is given for it, the ring is full or the record too large. "
     "With input_buf (segment name -> this process's mapping of a frontend's input arena), "
     "an output of 64 KiB or more lying inside one of its request's arena inputs is named "
     "there (TensorRef segment and offset of the input arena) instead of copied."},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef kModule = {
    PyModuleDef_HEAD_INIT, "_answer_writer",
    "A batch's answers to one frontend written in one call (see answer_writer.cc).",
    -1, kMethods, nullptr, nullptr, nullptr, nullptr,
};

}  // namespace

PyMODINIT_FUNC PyInit__answer_writer() {
  import_array();  // NOTE: returns nullptr with the error set when numpy cannot be imported
  const char* names[] = {"request_id", "version",  "outputs",   "output_regions", "dtype",
                         "shape",      "segment",  "offset",    "generation",     "reply_to",
                         "kind",       "trace",    "id",        "key",            "region_id",
                         "byte_size",  "inputs",   "nbytes"};
  PyObject** slots[] = {&g_names.request_id, &g_names.version,   &g_names.outputs,
                        &g_names.output_regions, &g_names.dtype, &g_names.shape,
                        &g_names.segment,    &g_names.offset,    &g_names.generation,
                        &g_names.reply_to,   &g_names.kind,      &g_names.trace,
                        &g_names.id,         &g_names.key,       &g_names.region_id,
                        &g_names.byte_size,  &g_names.inputs,    &g_names.nbytes};
  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); ++i) {
    *slots[i] = PyUnicode_InternFromString(names[i]);
    if (*slots[i] == nullptr) return nullptr;
  }
  return PyModule_Create(&kModule);
}
