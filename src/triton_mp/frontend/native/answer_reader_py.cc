// _native.read_answer (answer_reader_py.h).
#include "answer_reader_py.h"

#include "answer_reader.h"

namespace triton_mp {

namespace {

PyObject* Text(std::string_view s) {
  return PyUnicode_DecodeUTF8(s.data(), static_cast<Py_ssize_t>(s.size()), "strict");
}

PyObject* Block(const AnswerBlock& b) {
  PyObject* seg = Text(b.segment);
  if (seg == nullptr) return nullptr;
  return Py_BuildValue("(NKK)", seg, (unsigned long long)b.offset,
                       (unsigned long long)b.generation);
}

// A tuple of `items`, each made by `make` (nullptr: an error is set).
template <typename T, typename F>
PyObject* TupleOf(const std::vector<T>& items, F make) {
  PyObject* out = PyTuple_New(static_cast<Py_ssize_t>(items.size()));
  if (out == nullptr) return nullptr;
  for (size_t i = 0; i < items.size(); ++i) {
    PyObject* item = make(items[i]);
    if (item == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(i), item);
  }
  return out;
}

PyObject* Output(const AnswerOutput& o) {
  PyObject* shape = TupleOf(o.shape, [](int64_t d) { return PyLong_FromLongLong(d); });
  if (shape == nullptr) return nullptr;
  // NOTE: each made only once the one before it was: no Python call with an error set
  PyObject* name = Text(o.name);
  PyObject* datatype = name == nullptr ? nullptr : Text(o.datatype);
  PyObject* segment = datatype == nullptr ? nullptr : Text(o.segment);
  if (segment == nullptr) {
    Py_DECREF(shape);
    Py_XDECREF(name);
    Py_XDECREF(datatype);
    return nullptr;
  }
  return Py_BuildValue("(NNNNKKK)", name, datatype, shape, segment,
                       (unsigned long long)o.offset, (unsigned long long)o.nbytes,
                       (unsigned long long)o.region_id);
}

PyObject* Response(const AnswerResponse& r) {
  // NOTE: each made only once the one before it was: no Python call with an error set
  PyObject* outputs = TupleOf(r.outputs, Output);
  PyObject* block = nullptr;
  if (outputs != nullptr && r.has_block) {
    block = Block(r.block);
  } else if (outputs != nullptr) {
    block = Py_None;
    Py_INCREF(block);
  }
  PyObject* params = block == nullptr ? nullptr : Text(r.parameters_json);
  PyObject* shared = params == nullptr ? nullptr : TupleOf(r.shared_blocks, Block);
  if (shared == nullptr) {
    Py_XDECREF(outputs);
    Py_XDECREF(block);
    Py_XDECREF(params);
    return nullptr;
  }
  return Py_BuildValue("(KLNNOOOOnNNn)", (unsigned long long)r.request_id, (long long)r.version,
                       outputs, block, r.has_error ? Py_True : Py_False,
                       r.final ? Py_True : Py_False, r.empty ? Py_True : Py_False,
                       r.traced ? Py_True : Py_False, static_cast<Py_ssize_t>(r.extra_blocks),
                       params, shared, static_cast<Py_ssize_t>(r.handoffs));
}

PyObject* HandoffOf(const AnswerHandoff& h) {
  PyObject* block = Block(h.block);
  if (block == nullptr) return nullptr;
  return Py_BuildValue("(NK)", block, (unsigned long long)h.uses);
}

// read_answer(buf) -> None (kOther: Python decodes it) or (kind, responses, handoffs):
// kind 1 an InferResponse, 2 an AnswerBatch; each response (request_id, version, outputs,
// block or None, has_error, final, empty, traced, extra_blocks, parameters_json,
// shared_blocks, handoffs); each output (name, datatype, shape, segment, offset, nbytes,
// region_id); each block (segment, offset, generation); each batch handoff (block, uses).
PyObject* ReadAnswerPy(PyObject*, PyObject* arg) {
  Py_buffer buf;
  if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) != 0) return nullptr;
  AnswerRead read;
  ReadAnswer(static_cast<const unsigned char*>(buf.buf), static_cast<size_t>(buf.len), &read);
  PyObject* out = nullptr;
  if (read.kind == AnswerKind::kOther) {
    out = Py_None;
    Py_INCREF(out);
  } else {
    PyObject* responses = TupleOf(read.responses, Response);
    PyObject* handoffs = responses == nullptr ? nullptr : TupleOf(read.handoffs, HandoffOf);
    if (handoffs != nullptr) {
      out = Py_BuildValue("(iNN)", static_cast<int>(read.kind), responses, handoffs);
    } else {
      Py_XDECREF(responses);
    }
  }
  PyBuffer_Release(&buf);  // NOTE: after the strings were copied out of it
  return out;
}

PyMethodDef kFunctions[] = {
    {"read_answer", ReadAnswerPy, METH_O, "A worker's msgpack answer as the native reader reads it."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

bool AddAnswerReader(PyObject* module) { return PyModule_AddFunctions(module, kFunctions) == 0; }

}  // namespace triton_mp
