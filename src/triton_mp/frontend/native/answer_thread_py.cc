// _native.answer_thread_* (answer_thread_py.h). Every function is called with the GIL held;
// the thread itself never takes it. The thread is started with the running server's handoff
// and is stopped before that server is (StopAnswerThread; module.cc Stop), so the handoff
// outlives it.
#include "answer_thread_py.h"

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "answer_thread.h"
#include "handoff.h"
#include "known_answer_py.h"
#include "known_submit.h"

namespace triton_mp {

namespace {

// NOTE: shared with the server's handoff while it runs (its lender, answer_lender.h)
std::shared_ptr<AnswerThread> g_thread;

// The hooks of a thread serving `h`'s owned calls (answer_thread.h AnswerThreadHooks);
// `ids_low`: a settle is due when C++ holds fewer request ids (known_teach.py IDS_LOW).
// Without a handoff (tests), nothing is served: every record goes to Python.
AnswerThreadHooks HooksFor(Handoff* h, uint64_t ids_low) {
  AnswerThreadHooks hooks;
  if (h == nullptr) {
    hooks.serve = [](const unsigned char*, size_t) { return false; };
    hooks.served = [] {};
    hooks.awaited = [] { return size_t{0}; };
    hooks.settle_due = [] { return false; };
    return hooks;
  }
  hooks.serve = [h](const unsigned char* d, size_t n) { return ServeKnownAnswer(h, d, n); };
  hooks.served = [h] { h->Kick(); };
  hooks.awaited = [h] { return h->owned(); };
  hooks.settle_due = [ids_low] { return TheKnownSubmit().ids_left() < ids_low; };
  return hooks;
}

// answer_thread_start(wakeup_name, rings, ids_low, serve=True) -> bool: start reading the
// inbox (serve=False, or no server: every record goes to Python). False: one is running. A
// stopped one is let go (its queue, taken or not, with it).
// Raises OSError when the wake-up or a ring cannot be opened.
PyObject* StartThread(PyObject*, PyObject* args) {
  const char* wakeup;
  PyObject* rings_obj;
  unsigned long long ids_low;
  int serve = 1;
  if (!PyArg_ParseTuple(args, "sOK|p", &wakeup, &rings_obj, &ids_low, &serve)) return nullptr;
  if (g_thread && !g_thread->stopped()) Py_RETURN_FALSE;
  std::vector<std::string> rings;
  PyObject* seq = PySequence_Fast(rings_obj, "rings must be a sequence of str");
  if (seq == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); ++i) {
    const char* name = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(seq, i));
    if (name == nullptr) {
      Py_DECREF(seq);
      return nullptr;
    }
    rings.emplace_back(name);
  }
  Py_DECREF(seq);
  g_thread.reset();  // NOTE: a stopped one, its queue taken
  std::string error;
  Handoff* handoff = serve ? ServerHandoff() : nullptr;
  g_thread = AnswerThread::Start(wakeup, rings, HooksFor(handoff, ids_low), &error);
  if (!g_thread) {
    PyErr_SetString(PyExc_OSError, error.c_str());
    return nullptr;
  }
  if (handoff != nullptr) handoff->SetLender(g_thread);
  Py_RETURN_TRUE;
}

PyObject* StopThread(PyObject*, PyObject*) {
  StopAnswerThread();
  Py_RETURN_NONE;
}

// answer_thread_add_ring(name) -> bool (False: no thread, or not a ring).
PyObject* AddRing(PyObject*, PyObject* name) {
  const char* s = PyUnicode_AsUTF8(name);
  if (s == nullptr) return nullptr;
  return PyBool_FromLong(g_thread && !g_thread->stopped() && g_thread->AddRing(s));
}

// answer_thread_remove_ring(name) -> bool: what it holds is read (served, or queued for
// Python), then it is unmapped. GIL released meanwhile (a pass may hold the rings).
PyObject* RemoveRing(PyObject*, PyObject* name) {
  const char* s = PyUnicode_AsUTF8(name);
  if (s == nullptr) return nullptr;
  if (!g_thread || g_thread->stopped()) Py_RETURN_FALSE;
  const std::string ring(s);
  bool removed;
  Py_BEGIN_ALLOW_THREADS
  removed = g_thread->RemoveRing(ring);
  Py_END_ALLOW_THREADS
  return PyBool_FromLong(removed);
}

PyObject* Wake(PyObject*, PyObject*) {
  if (g_thread) g_thread->Wake();
  Py_RETURN_NONE;
}

PyObject* Fd(PyObject*, PyObject*) { return PyLong_FromLong(g_thread ? g_thread->fd() : -1); }

// answer_thread_take() -> (list of bytes, settle): the records queued for Python, oldest
// first, and whether a settle is due.
PyObject* Take(PyObject*, PyObject*) {
  bool settle = false;
  std::vector<std::string> records;
  if (g_thread) records = g_thread->Take(&settle);
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(records.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < records.size(); ++i) {
    PyObject* b = PyBytes_FromStringAndSize(records[i].data(),
                                            static_cast<Py_ssize_t>(records[i].size()));
    if (b == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), b);
  }
  return Py_BuildValue("(NO)", list, settle ? Py_True : Py_False);
}

PyObject* Pending(PyObject*, PyObject*) { return PyBool_FromLong(g_thread && g_thread->pending()); }

PyObject* Arm(PyObject*, PyObject* awaiting) {
  if (g_thread) g_thread->Arm(PyObject_IsTrue(awaiting) == 1);
  Py_RETURN_NONE;
}

PyObject* Disarm(PyObject*, PyObject*) { return PyBool_FromLong(g_thread && g_thread->Disarm()); }

PyObject* Clear(PyObject*, PyObject*) {
  if (g_thread) g_thread->Clear();
  Py_RETURN_NONE;
}

// answer_thread_stats() -> dict (answer_thread.h AnswerThreadStats), or None: none runs.
PyObject* Stats(PyObject*, PyObject*) {
  if (!g_thread || g_thread->stopped()) Py_RETURN_NONE;
  const AnswerThreadStats s = g_thread->stats();
  return Py_BuildValue("{sKsKsKsKsKsKsKsK}", "passes", (unsigned long long)s.passes, "served",
                       (unsigned long long)s.served, "to_python", (unsigned long long)s.to_python,
                       "sleeps", (unsigned long long)s.sleeps, "early_polls",
                       (unsigned long long)s.early_polls, "python_wakes",
                       (unsigned long long)s.python_wakes, "borrows",
                       (unsigned long long)s.borrows, "lent_served",
                       (unsigned long long)s.lent_served);
}

PyMethodDef kFunctions[] = {
    {"answer_thread_start", StartThread, METH_VARARGS, "(wakeup, rings, ids_low[, serve])."},
    {"answer_thread_stop", StopThread, METH_NOARGS, "Stop the thread (joined; its queue kept)."},
    {"answer_thread_add_ring", AddRing, METH_O, "Read one more inbox ring."},
    {"answer_thread_remove_ring", RemoveRing, METH_O, "Read what a ring holds, then unmap it."},
    {"answer_thread_wake", Wake, METH_NOARGS, "Make the thread run a pass."},
    {"answer_thread_fd", Fd, METH_NOARGS, "The eventfd Python watches (-1: no thread)."},
    {"answer_thread_take", Take, METH_NOARGS, "(records for Python, settle due)."},
    {"answer_thread_pending", Pending, METH_NOARGS, "Whether a take would give something."},
    {"answer_thread_arm", Arm, METH_O, "(awaiting): Python is about to block."},
    {"answer_thread_disarm", Disarm, METH_NOARGS, "Python polls again; False: woken."},
    {"answer_thread_clear", Clear, METH_NOARGS, "Read the eventfd's count."},
    {"answer_thread_stats", Stats, METH_NOARGS, "The thread's counters (None: none runs)."},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

void StopAnswerThread() {
  if (!g_thread) return;
  // NOTE: the gRPC thread borrows no more; one borrowing now ends with Stop's pass lock
  if (Handoff* h = ServerHandoff()) h->SetLender(nullptr);
  // NOTE: kept (not reset): what it queued is Python's last take (answer_thread_take)
  Py_BEGIN_ALLOW_THREADS
  g_thread->Stop();
  Py_END_ALLOW_THREADS
}

bool AddAnswerThread(PyObject* module) { return PyModule_AddFunctions(module, kFunctions) == 0; }

}  // namespace triton_mp
