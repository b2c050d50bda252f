// _native.known_answer* (known_answer_py.h). The functions are called on the Python thread
// that runs the event loop, GIL held; ServeKnownAnswer on the answer thread
// (answer_thread.h), which holds no GIL. The heads, the workers' arenas' mappings and the
// counters are shared by both under one lock (g_serve_mu), taken after the GIL and never
// before it (the answer thread never takes the GIL).
#include "known_answer_py.h"

#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "answer_reader.h"
#include "handoff.h"
#include "held_block.h"
#include "known_answer.h"
#include "known_regions.h"
#include "known_submit.h"
#include "output_segments.h"

namespace triton_mp {

namespace {

// NOTE: guards g_answers, g_segments and g_counters (file comment)
std::mutex g_serve_mu;
KnownAnswers g_answers;
OutputSegments g_segments;

struct Counters {
  uint64_t answered = 0;         // calls ended here
  uint64_t answer_records = 0;   // records served whole
  uint64_t answer_declined = 0;  // answer records of owned calls left to Python
  uint64_t stray_frees = 0;      // frees refused (tensor_pool's stray frees)
  uint64_t bytes_in = 0;         // raw input bytes of the calls ended here, not yet taken
  uint64_t bytes_out = 0;        // output bytes copied here, not yet taken
  uint64_t bytes_in_place = 0;   // output bytes sent in place (held_block.h), not yet taken
};
Counters g_counters;
// The input arena the known calls are allocated in (known_answer_input_arena): its segment's
// name, for the arena epoch it was named in (KnownSubmit::epoch; a call of another epoch
// gets no InputBlock: an output of its input block is copied, never held).
uint64_t g_input_epoch = 0;
std::string g_input_segment;
uint64_t g_input_hold_limit = 0;  // InputBlock hold_limit

// Whether `holds` holds the input block at `offset` (then it frees it when sent).
bool InputHeld(const std::vector<std::shared_ptr<HeldBlock>>& holds, uint64_t offset) {
  for (const auto& h : holds) {
    if (h->input() && h->offset() == offset) return true;
  }
  return false;
}

// The lesson and the request id of each call, for Build.
void LessonsOf(const std::vector<KnownSent>& calls, std::vector<uint64_t>* lessons,
               std::vector<std::string>* ids) {
  lessons->reserve(calls.size());
  ids->reserve(calls.size());
  for (const auto& c : calls) {
    lessons->push_back(c.lesson_id);
    ids->push_back(c.client_id);
  }
}

// ServeLocked's vectors (g_serve_mu held), kept from one answer to the next for their
// buffers: a batch's answer allocates none of them once they have grown. Emptied when
// ServeLocked returns (Use), so that nothing they hold (a hold, a client region, a built
// response) outlives the answer it was for.
struct ServeScratch {
  AnswerRead read;  // NOTE: views into the last record only; read anew each time
  std::vector<grpc::ByteBuffer> responses;
  std::vector<std::shared_ptr<HeldBlock>> holds;  // NOTE: armed once the calls are answered
  std::vector<KnownSent> calls;
  std::vector<uint64_t> lessons;
  std::vector<std::string> ids;
  std::vector<InputBlock> inputs;

  class Use {
   public:
    explicit Use(ServeScratch* s) : s_(s) {}
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    ~Use() {
      s_->responses.clear();
      s_->holds.clear();
      s_->calls.clear();
      s_->lessons.clear();
      s_->ids.clear();
      s_->inputs.clear();
    }

   private:
    ServeScratch* s_;
  };
};
ServeScratch g_scratch;

// Serves `data` if it answers owned calls only and can be served here; true when it was
// (g_serve_mu held; `h` alive).
bool ServeLocked(Handoff* h, const unsigned char* data, size_t size) {
  ServeScratch::Use use(&g_scratch);
  AnswerRead& read = g_scratch.read;
  std::vector<grpc::ByteBuffer>& responses = g_scratch.responses;
  BuiltBytes bytes;
  std::vector<std::shared_ptr<HeldBlock>>& holds = g_scratch.holds;
  std::vector<KnownSent>& calls = g_scratch.calls;
  ReadAnswer(data, size, &read);
  if (read.kind == AnswerKind::kOther || !h->FindOwned(read, &calls)) return false;
  std::vector<uint64_t>& lessons = g_scratch.lessons;
  std::vector<std::string>& ids = g_scratch.ids;
  LessonsOf(calls, &lessons, &ids);
  KnownSubmit& known = TheKnownSubmit();
  std::vector<InputBlock>& inputs = g_scratch.inputs;
  inputs.reserve(calls.size());
  for (const auto& c : calls) {
    if (c.epoch != known.epoch()) {
      ++g_counters.answer_declined;
      return false;  // NOTE: its block is in an arena C++ no longer holds: Python frees it
    }
    inputs.push_back(c.epoch == g_input_epoch
                         ? InputBlock{g_input_segment, c.offset, c.generation,
                                      g_input_hold_limit}
                         : InputBlock{});
  }
  if (!g_answers.Build(read, lessons, &ids, &g_segments, &responses, &bytes, &holds,
                       &inputs) ||
      !h->AnswerOwned(read, &responses)) {
    ++g_counters.answer_declined;
    return false;  // NOTE: the holds go unarmed: Python reads and frees the blocks
  }
  for (const auto& hold : holds) hold->Arm();
  for (const auto& c : calls) {
    if (c.held) TheKnownRegions().Release(*c.held);  // NOTE: its final answer (holding_sink)
    // NOTE: an input block the response sends from is freed by its hold, once sent
    if (!InputHeld(holds, c.offset) && !known.FreeInput(c.epoch, c.offset, c.generation)) {
      ++g_counters.stray_frees;
    }
    g_counters.bytes_in += c.copied;
  }
  g_counters.stray_frees += g_answers.FreeOutputs(read, &g_segments, holds);
  g_counters.answered += calls.size();
  ++g_counters.answer_records;
  g_counters.bytes_out += bytes.copied;
  g_counters.bytes_in_place += bytes.in_place;
  return true;
}

// known_answer(decode, record) -> None (served here: the calls end at the next kick()) or
// decode(record) (anything else: Python's decoder). record: a ring record's view.
PyObject* Answer(PyObject*, PyObject* args) {
  PyObject* decode;
  PyObject* record;
  if (!PyArg_ParseTuple(args, "OO", &decode, &record)) return nullptr;
  Handoff* h = ServerHandoff();
  if (h != nullptr) {
    Py_buffer view;
    if (PyObject_GetBuffer(record, &view, PyBUF_SIMPLE) != 0) return nullptr;
    // NOTE: the GIL stays held (the server is destroyed with it held): the Python thread
    // serves only where no answer thread runs (known_answers.py)
    const bool served = ServeKnownAnswer(
        h, static_cast<const unsigned char*>(view.buf), static_cast<size_t>(view.len));
    PyBuffer_Release(&view);
    if (served) Py_RETURN_NONE;
  }
  return PyObject_CallOneArg(decode, record);
}

// Reads (name, datatype, shape) triples.
bool FormsOf(PyObject* outputs, std::vector<OutputForm>* out) {
  PyObject* seq = PySequence_Fast(outputs, "outputs must be a sequence");
  if (seq == nullptr) return false;
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(seq); ++i) {
    const char* name;
    const char* datatype;
    Py_ssize_t name_len, datatype_len;
    PyObject* shape;
    ok = PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "s#s#O", &name, &name_len,
                          &datatype, &datatype_len, &shape);
    if (!ok) break;
    OutputForm form{std::string(name, static_cast<size_t>(name_len)),
                    std::string(datatype, static_cast<size_t>(datatype_len)), {}};
    PyObject* dims = PySequence_Fast(shape, "shape must be a sequence of ints");
    ok = dims != nullptr;
    for (Py_ssize_t d = 0; ok && d < PySequence_Fast_GET_SIZE(dims); ++d) {
      long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(dims, d));
      ok = !(v == -1 && PyErr_Occurred());
      form.shape.push_back(v);
    }
    Py_XDECREF(dims);
    out->push_back(std::move(form));
  }
  Py_DECREF(seq);
  return ok;
}

// known_answer_teach(lesson_id, version, parameters_json, outputs, head) -> bool: answers of
// the lesson's calls with this form (outputs: (name, datatype, shape) each) get `head`, its
// id replaced by each call's own (False: the head does not parse; nothing kept).
PyObject* Teach(PyObject*, PyObject* args) {
  unsigned long long lesson_id;
  long long version;
  const char* params;
  Py_ssize_t params_len;
  PyObject* outputs;
  Py_buffer head;
  if (!PyArg_ParseTuple(args, "KLs#Oy*", &lesson_id, &version, &params, &params_len, &outputs,
                        &head)) {
    return nullptr;
  }
  AnswerHead taught;
  taught.version = version;
  taught.parameters_json.assign(params, static_cast<size_t>(params_len));
  taught.head.assign(static_cast<const char*>(head.buf), static_cast<size_t>(head.len));
  PyBuffer_Release(&head);
  if (!FormsOf(outputs, &taught.outputs)) return nullptr;
  std::lock_guard<std::mutex> lock(g_serve_mu);
  return PyBool_FromLong(g_answers.Teach(lesson_id, std::move(taught)) ? 1 : 0);
}

// known_answer_own(on) -> bool: the server's handoff keeps the calls it submits (False: no
// server).
PyObject* Own(PyObject*, PyObject* on) {
  Handoff* h = ServerHandoff();
  if (h != nullptr) h->OwnKnown(PyObject_IsTrue(on) == 1);
  return PyBool_FromLong(h != nullptr);
}

// known_log(on) -> bool: the server's handoff queues a kAccepted entry for each call it
// submits (Python's per-request DEBUG line) while on (False: no server).
PyObject* Log(PyObject*, PyObject* on) {
  Handoff* h = ServerHandoff();
  if (h != nullptr) h->LogAccepted(PyObject_IsTrue(on) == 1);
  return PyBool_FromLong(h != nullptr);
}

// known_release() -> int: every owned call queued for Python as kKnown.
PyObject* Release(PyObject*, PyObject*) {
  Handoff* h = ServerHandoff();
  return PyLong_FromSize_t(h != nullptr ? h->ReleaseOwned() : 0);
}

// known_answer_input_arena(name, hold_limit): the known calls' input arena
// (known_set_arena's, called just before) is the segment `name`: an output a worker answered
// from a call's input block there is sent from it while replies hold at most `hold_limit`
// bytes of input blocks (known_answer.h InputBlock).
PyObject* InputArena(PyObject*, PyObject* args) {
  const char* s;
  Py_ssize_t n = 0;
  unsigned long long limit = 0;
  if (!PyArg_ParseTuple(args, "s#K", &s, &n, &limit)) return nullptr;
  const uint64_t epoch = TheKnownSubmit().epoch();
  std::lock_guard<std::mutex> lock(g_serve_mu);
  g_input_epoch = epoch;
  g_input_segment.assign(s, static_cast<size_t>(n));
  g_input_hold_limit = limit;
  Py_RETURN_NONE;
}

// known_answer_forget(): forget the heads and unmap the workers' arenas (an un-teaching).
PyObject* Forget(PyObject*, PyObject*) {
  std::lock_guard<std::mutex> lock(g_serve_mu);
  g_answers.Clear();
  g_segments.Drop();
  Py_RETURN_NONE;
}

// known_answer_take_bytes() -> (in, out, out_in_place): the tensor bytes of calls ended
// here since the last call (PendingTable.copied_bytes).
PyObject* TakeBytes(PyObject*, PyObject*) {
  std::lock_guard<std::mutex> lock(g_serve_mu);
  PyObject* out = Py_BuildValue("(KKK)", (unsigned long long)g_counters.bytes_in,
                                (unsigned long long)g_counters.bytes_out,
                                (unsigned long long)g_counters.bytes_in_place);
  g_counters.bytes_in = g_counters.bytes_out = g_counters.bytes_in_place = 0;
  return out;
}

// known_answer_stats() -> dict: the counters (Counters; stray_frees with the refused frees
// of blocks sent in place), and the owned calls the handoff handed to Python (released).
PyObject* Stats(PyObject*, PyObject*) {
  Handoff* h = ServerHandoff();
  const uint64_t released = h != nullptr ? h->released() : 0;
  std::lock_guard<std::mutex> lock(g_serve_mu);
  return Py_BuildValue("{sKsKsKsKsK}", "answered", (unsigned long long)g_counters.answered,
                       "answer_records", (unsigned long long)g_counters.answer_records,
                       "answer_declined", (unsigned long long)g_counters.answer_declined,
                       "released", (unsigned long long)released, "stray_frees",
                       (unsigned long long)(g_counters.stray_frees + HeldBlock::refused()));
}

// The bytes of a built response (its slices joined).
PyObject* BytesOf(const grpc::ByteBuffer& response) {
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) slices.clear();
  size_t n = 0;
  for (const auto& slice : slices) n += slice.size();
  PyObject* b = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(n));
  if (b == nullptr) return nullptr;
  char* p = PyBytes_AS_STRING(b);
  for (const auto& slice : slices) {
    if (slice.size() != 0) std::memcpy(p, slice.begin(), slice.size());
    p += slice.size();
  }
  return b;
}

// The request ids of `obj` (None: none; else a sequence of bytes). False: a Python error.
bool IdsOf(PyObject* obj, std::vector<std::string>* out) {
  if (obj == Py_None) return true;
  PyObject* seq = PySequence_Fast(obj, "ids must be a sequence of bytes");
  if (seq == nullptr) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    char* data;
    Py_ssize_t len;
    if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(seq, i), &data, &len) != 0) {
      Py_DECREF(seq);
      return false;
    }
    out->emplace_back(data, static_cast<size_t>(len));
  }
  Py_DECREF(seq);
  return true;
}

// The InputBlocks of `obj` (None: none, *out untouched and `given` false; else a sequence of
// (segment, offset, generation[, hold_limit: no limit when left out]) or None per response),
// their segments' names kept in `names`. False: a Python error is set.
bool InputsOf(PyObject* obj, std::vector<InputBlock>* out, std::deque<std::string>* names,
              bool* given) {
  *given = obj != Py_None;
  if (!*given) return true;
  PyObject* seq = PySequence_Fast(obj, "inputs must be a sequence");
  if (seq == nullptr) return false;
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(seq); ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(seq, i);
    InputBlock& in = out->emplace_back();
    if (item == Py_None) continue;
    const char* segment;
    Py_ssize_t n;
    unsigned long long offset, generation, limit = ~0ULL;
    ok = PyArg_ParseTuple(item, "s#KK|K", &segment, &n, &offset, &generation, &limit);
    if (ok) {
      const std::string& name = names->emplace_back(segment, static_cast<size_t>(n));
      in = InputBlock{name, offset, generation, limit};
    }
  }
  Py_DECREF(seq);
  return ok;
}

// known_answer_build(record, lessons[, free[, in_place[, ids[, inputs]]]]) -> tuple of bytes,
// or None (inputs: each response's call's input block, (segment, offset, generation) or
// None, known_answer.h InputBlock; with free, an input block held is freed when sent):
// the responses this side builds for `record` whose response i is a call of lessons[i] (with
// the request id ids[i], bytes; no ids: every id empty), without
// a server (tests); with free=True its output blocks are then freed (returns (responses,
// refused frees)); with in_place=True large outputs are sent in place as Serve sends them
// (returns (responses, refused frees, bytes in place); with free, their holds are armed and
// free their blocks when the responses are let go, before this returns).
PyObject* Build(PyObject*, PyObject* args) {
  Py_buffer record;
  PyObject* lessons_obj;
  int free_blocks = 0;
  int in_place = 0;
  PyObject* ids_obj = Py_None;
  PyObject* inputs_obj = Py_None;
  if (!PyArg_ParseTuple(args, "y*O|ppOO", &record, &lessons_obj, &free_blocks, &in_place,
                        &ids_obj, &inputs_obj)) {
    return nullptr;
  }
  std::vector<InputBlock> inputs;
  std::deque<std::string> input_names;  // NOTE: deque: the views into it stay valid
  bool inputs_given = false;
  if (!InputsOf(inputs_obj, &inputs, &input_names, &inputs_given)) {
    PyBuffer_Release(&record);
    return nullptr;
  }
  std::vector<std::string> ids;
  if (!IdsOf(ids_obj, &ids)) {
    PyBuffer_Release(&record);
    return nullptr;
  }
  std::vector<uint64_t> lessons;
  PyObject* seq = PySequence_Fast(lessons_obj, "lessons must be a sequence of ints");
  if (seq == nullptr) {
    PyBuffer_Release(&record);
    return nullptr;
  }
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    lessons.push_back(PyLong_AsUnsignedLongLong(PySequence_Fast_GET_ITEM(seq, i)));
  }
  Py_DECREF(seq);
  if (PyErr_Occurred()) {
    PyBuffer_Release(&record);
    return nullptr;
  }
  AnswerRead read;
  ReadAnswer(static_cast<const unsigned char*>(record.buf), static_cast<size_t>(record.len),
             &read);
  std::lock_guard<std::mutex> lock(g_serve_mu);
  const uint64_t refused_before = HeldBlock::refused();
  size_t refused = 0;
  BuiltBytes bytes;
  PyObject* out = nullptr;
  bool built;
  {
    std::vector<grpc::ByteBuffer> responses;
    std::vector<std::shared_ptr<HeldBlock>> holds;
    built = g_answers.Build(read, lessons, ids_obj == Py_None ? nullptr : &ids, &g_segments,
                            &responses, &bytes, in_place ? &holds : nullptr,
                            inputs_given ? &inputs : nullptr);
    if (built && free_blocks) {
      for (const auto& hold : holds) hold->Arm();
      refused = g_answers.FreeOutputs(read, &g_segments, holds);
    }
    if (built) out = PyTuple_New(static_cast<Py_ssize_t>(responses.size()));
    for (size_t i = 0; out != nullptr && i < responses.size(); ++i) {
      PyObject* b = BytesOf(responses[i]);
      if (b == nullptr) Py_CLEAR(out);
      if (out != nullptr) PyTuple_SET_ITEM(out, static_cast<Py_ssize_t>(i), b);
    }
  }  // NOTE: the responses let go of their holds here (armed ones free their blocks)
  PyBuffer_Release(&record);
  if (!built) Py_RETURN_NONE;
  if (out == nullptr) return nullptr;
  refused += static_cast<size_t>(HeldBlock::refused() - refused_before);
  if (in_place) {
    return Py_BuildValue("(NnK)", out, static_cast<Py_ssize_t>(refused),
                         (unsigned long long)bytes.in_place);
  }
  if (!free_blocks) return out;
  return Py_BuildValue("(Nn)", out, static_cast<Py_ssize_t>(refused));
}

PyMethodDef kFunctions[] = {
    {"known_answer", Answer, METH_VARARGS, "(decode, record): serve an owned call's answer."},
    {"known_answer_teach", Teach, METH_VARARGS, "Teach a response head for a lesson's form."},
    {"known_answer_own", Own, METH_O, "Keep the calls submitted natively (answered here)."},
    {"known_release", Release, METH_NOARGS, "Queue every owned call for Python (kKnown)."},
    {"known_log", Log, METH_O, "Queue kAccepted for each call submitted natively (DEBUG)."},
    {"known_answer_forget", Forget, METH_NOARGS, "Forget the heads; unmap workers' arenas."},
    {"known_answer_input_arena", InputArena, METH_VARARGS,
     "(name, hold_limit): the known calls' input arena, and the input bytes replies may hold."},
    {"known_answer_take_bytes", TakeBytes, METH_NOARGS, "(in, out, out_in_place) bytes since last taken."},
    {"known_answer_stats", Stats, METH_NOARGS, "The answer side's counters."},
    {"known_answer_build", Build, METH_VARARGS, "(record, lessons[, free]): responses built."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

bool ServeKnownAnswer(Handoff* h, const unsigned char* data, size_t size) {
  std::lock_guard<std::mutex> lock(g_serve_mu);
  return ServeLocked(h, data, size);
}

bool AddKnownAnswer(PyObject* module) { return PyModule_AddFunctions(module, kFunctions) == 0; }

}  // namespace triton_mp
