// The in-process handoff of ModelInfer and ModelStreamInfer calls to the Python frontend,
// without grpc.aio: the completion-queue thread puts each unary call's request bytes and
// metadata in a queue (kCall), and for a stream its opening metadata (kStreamOpen), each
// message as it is read (kStreamMessage) and the client's half-close (kStreamEnd), and
// wakes Python through an eventfd; the Python event loop takes them (frontend/native/
// handoff.py, its twin), runs the Python ModelInfer / ModelStreamInfer handler on them and
// answers: a stream's messages one by one (Write), then every call's end, the serialized
// response (unary) or the status (Reply). Python queues the answers of one event-loop pass,
// then Kick delivers them all, in the order Python gave them, under the server's serial lock,
// which the completion-queue thread holds while it runs any step, so no two steps of a call
// ever run at once (a grpc::Alarm to wake the completion-queue thread cost more than building
// a response, and one more thread hop). Kick never waits for that lock: when it is free, the
// kicking thread (Python's, or the answer thread's) delivers; when a step holds it, the
// completion-queue thread delivers after its step (DeliverDue); and while a Kick delivers,
// a step that wants the lock (LockStep) takes the answers not yet delivered with it. So the
// completion-queue thread, woken by the first answer's completion while a batch's answers
// are being sent, no longer sleeps on the lock until the last is out (a futex sleep and
// wake per batch at c=16), and what it came for waits one answer at most.
// The completion-queue thread never takes the GIL: it only locks this queue's mutex, which
// the Python side holds for a few pointer moves.
#ifndef TRITON_MP_NATIVE_HANDOFF_H_
#define TRITON_MP_NATIVE_HANDOFF_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "answer_lender.h"
#include "answer_reader.h"
#include "cq_tag.h"
#include "deferred_post.h"
#include "known_submit.h"
#include "node_pool.h"

namespace triton_mp {

// What a call waiting for Python's reply offers the handoff (ProxyCall implements it).
class Awaiting {
 public:
  virtual ~Awaiting() = default;
  // Python's answer, on the completion-queue thread (no lock held): a stream's message
  // (final false: `response` only), or the call's end (final true: `status`, and for a
  // unary call its response). `response` is the call's to take (Swap: grpc::ByteBuffer has
  // no move in gRPC 1.51, a std::move of one copies it).
  virtual void Deliver(grpc::Status status, grpc::ByteBuffer* response, bool final) = 0;
};

// What an entry Python takes is. Python twin: handoff.py (CALL, OPEN, MESSAGE, END, GONE).
enum class ItemKind : int {
  kCall = 0,           // a unary call to serve: data, metadata
  kStreamOpen = 1,     // a stream begins: metadata
  kStreamMessage = 2,  // a stream's next request message: data
  kStreamEnd = 3,      // the client half-closed the stream (or stopped sending)
  kCancelled = 4,      // the call is gone before Python ended it: Python cancels its handler
  kKnown = 5,          // a unary call submitted here (known_submit.h): Python registers it
  kLost = 6,           // a unary call whose direct handoff took a lease, then found a ring
                       // full past its timeout (known_submit.h kLost): Python fails it
                       // UNAVAILABLE in the words of its own hand's ChannelTimeout
  kAccepted = 7,       // a unary call submitted here (kKnown's known), queued only while
                       // LogAccepted is on: Python words its per-request DEBUG line
};

// One entry Python takes.
struct HandoffItem {
  uint64_t id = 0;
  ItemKind kind = ItemKind::kCall;
  grpc::ByteBuffer data;
  std::vector<std::pair<std::string, std::string>> metadata;
  KnownSent known;  // kKnown, kAccepted: what was sent
};

// How long LockStep waits for a delivering Kick on the lock word before it sleeps on the lock.
inline constexpr int64_t kStepSpinNs = 30000;

class Handoff {
 public:
  Handoff();
  ~Handoff();
  Handoff(const Handoff&) = delete;
  Handoff& operator=(const Handoff&) = delete;

  bool ok() const { return fd_ >= 0; }
  // The server's serial lock, held by the completion-queue thread while it runs a step
  // (before the first Submit).
  void Attach(std::mutex* serial) { serial_ = serial; }
  // The eventfd Python watches: readable when items wait.
  int fd() const { return fd_; }

  // Completion-queue thread: queue a unary call; returns its id.
  uint64_t Submit(Awaiting* call, grpc::ByteBuffer data,
                  std::vector<std::pair<std::string, std::string>> metadata);
  // Completion-queue thread: submit a unary call whose request matches a lesson of
  // TheKnownSubmit() and queue it as kKnown (its id in *id), or as kLost when its direct
  // handoff was lost; false: nothing was done (the caller Submits it).
  // A call handed to a worker (direct_handoff.h) leaves the worker's wake-up pending until
  // PostAfterStep.
  bool SubmitKnown(Awaiting* call, const grpc::ByteBuffer& data, uint64_t* id);
  // Completion-queue thread, after each step, once the serial lock is released: post the
  // wake-up SubmitKnown left pending (deferred_post.h), if any.
  void PostAfterStep() { step_post_.Post(); }
  // Completion-queue thread: whether the step handed a call to a worker whose wake-up
  // PostAfterStep will post (a direct handoff).
  bool post_pending() const { return step_post_.pending(); }
  // The answer thread's place as the inbox's reader, lent to the completion-queue thread
  // (answer_lender.h); nullptr while none runs. answer_thread_py.cc sets it when the thread
  // starts and clears it before it stops; the completion-queue thread holds a copy while
  // it borrows.
  void SetLender(std::shared_ptr<AnswerLender> lender) {
    std::lock_guard<std::mutex> lock(lender_mu_);
    lender_ = std::move(lender);
  }
  std::shared_ptr<AnswerLender> lender() {
    std::lock_guard<std::mutex> lock(lender_mu_);
    return lender_;
  }
  // Completion-queue thread: a stream begins; returns its id.
  uint64_t Open(Awaiting* call, std::vector<std::pair<std::string, std::string>> metadata);
  // Completion-queue thread: a stream's next request message, and its half-close.
  void Push(uint64_t id, grpc::ByteBuffer data);
  void HalfClose(uint64_t id);
  // Completion-queue thread: the call is over (cancelled, deadline, shutdown). True when
  // Python had not ended it: nothing more is delivered (a stream's messages not delivered
  // yet are dropped), and Python is told to cancel.
  bool Withdraw(uint64_t id);

  // Python thread: everything queued since the last take.
  std::vector<HandoffItem> Take();
  // Python thread: the end of call `id` (the status; a unary call's response). False when
  // the call is gone or the queue closed (dropped). Delivered after the next Kick.
  bool Reply(uint64_t id, grpc::Status status, grpc::ByteBuffer response);
  // Python thread: one response message of stream `id`, sent before its end. False when the
  // call is gone or the queue closed (dropped). Delivered after the next Kick.
  bool Write(uint64_t id, grpc::ByteBuffer response);
  // Python thread (GIL held, so the server outlives it), the answer thread after the owned
  // calls' answers it served (answer_thread.h; stopped before the server is), or the
  // completion-queue thread (a borrower's pass, answer_borrow.h): deliver every answer queued
  // so far, under the serial lock, now when it is free, else by the completion-queue thread
  // once its step let go of it (DeliverDue). Never waits for the lock.
  void Kick();
  // Completion-queue thread, before a step: takes the serial lock (the caller unlocks it).
  // While it waits, a Kick delivering stops after its current answer and leaves the rest to
  // DeliverDue.
  void LockStep();
  // Completion-queue thread, after a step, the serial lock released: deliver what a Kick left
  // (a load when nothing did).
  void DeliverDue() {
    // NOTE: Dekker with Kick: a Kick that found the lock held had published due_ first
    std::atomic_thread_fence(std::memory_order_seq_cst);
    if (due_.load()) Kick();
  }
  // Before the completion queue shuts down: nothing is delivered any more (every call still
  // waiting has been cancelled by the server's shutdown and is withdrawn).
  void Close();

  // Owned known calls (the answer in C++, known_answer.h). FindOwned and AnswerOwned run on
  // the answer thread (answer_thread.h) or, where none runs, the Python thread. Python
  // thread: from now on (`on`) a call SubmitKnown sends is kept here, by request id, instead
  // of queued as kKnown; its answer is served by AnswerOwned, or the call is handed to
  // Python as the kKnown entry it would have been (ReleaseOwned; Withdraw queues it before
  // its kCancelled).
  void OwnKnown(bool on);
  // Python thread: from now on (`on`) every call SubmitKnown sends is also queued as a
  // kAccepted entry (owned or not), for Python's per-request DEBUG line (--log-verbose 1);
  // off, nothing is queued for it.
  void LogAccepted(bool on);
  // Python thread: queue every owned call as kKnown, oldest call first (Python registers
  // them: an answer it reads for one of them, the drain, an un-teaching); how many.
  size_t ReleaseOwned();
  // Python thread: the owned calls answered by `read`, one per response, in order, into
  // `calls` (their KnownSent), when every response is one; false: nothing (some response is
  // not an owned call's).
  bool FindOwned(const AnswerRead& read, std::vector<KnownSent>* calls);
  // Python thread: end the owned calls of `read` (FindOwned's, in order) with `responses`
  // (OK), delivered after the next Kick. False (nothing done): one of them is no longer
  // owned (withdrawn meanwhile: Python registers and cancels it).
  bool AnswerOwned(const AnswerRead& read, std::vector<grpc::ByteBuffer>* responses);
  // Owned known calls now (submitted, not answered nor handed to Python): answers the
  // Python thread awaits that its pending table does not count (polling_loop.py outstanding).
  size_t owned() {
    std::lock_guard<std::mutex> lock(mu_);
    return owned_.size();
  }
  // Owned calls handed to Python so far (ReleaseOwned and Withdraw).
  uint64_t released() {
    std::lock_guard<std::mutex> lock(mu_);
    return released_;
  }

 private:
  // NOTE: moved by Swap (grpc::ByteBuffer's own move is a copy: a new grpc_byte_buffer and
  // a ref per slice), so a queue of them grows without copying a response
  struct Answer {
    Answer(Awaiting* c, grpc::Status s, grpc::ByteBuffer* r, bool f)
        : call(c), status(std::move(s)), final(f) {
      response.Swap(r);
    }
    Answer(Answer&& o) noexcept : call(o.call), status(std::move(o.status)), final(o.final) {
      response.Swap(&o.response);
    }
    Answer& operator=(Answer&& o) noexcept {
      call = o.call;
      status = std::move(o.status);
      response.Swap(&o.response);
      final = o.final;
      return *this;
    }
    Answer(const Answer&) = delete;
    Answer& operator=(const Answer&) = delete;

    Awaiting* call;
    grpc::Status status;
    grpc::ByteBuffer response;
    bool final;
  };
  void PushLocked(HandoffItem item);
  // Serial lock held: deliver what is queued, in order. True: stopped early for a waiting
  // step (the rest queued again, ahead, and due_ set).
  bool DeliverLocked();
  // Queues owned call `rid` as kKnown and forgets it.
  void ReleaseLocked(uint64_t rid);

  struct Owned {
    uint64_t call_id;
    KnownSent sent;
  };

  std::mutex mu_;
  std::deque<HandoffItem> queue_;
  using Waiting = std::unordered_map<uint64_t, Awaiting*>;
  Waiting waiting_;
  std::vector<Answer> answers_;     // replied, not yet delivered
  std::vector<Answer> delivering_;  // DeliverLocked's (serial lock held), kept for its capacity
  bool closed_ = false;          // Close(): replies are dropped
  bool own_known_ = false;       // OwnKnown
  bool log_accepted_ = false;    // LogAccepted
  using OwnedMap = std::unordered_map<uint64_t, Owned>;
  using OwnedCalls = std::unordered_map<uint64_t, uint64_t>;
  OwnedMap owned_;          // by request id
  OwnedCalls owned_call_;   // call id -> request id
  NodePool<Waiting> waiting_nodes_;  // the three maps' spare nodes (mu_ held)
  NodePool<OwnedMap> owned_nodes_;
  NodePool<OwnedCalls> owned_call_nodes_;
  uint64_t released_ = 0;
  std::mutex* serial_ = nullptr;
  std::atomic<bool> due_{false};         // answers queued that no Kick delivered yet
  std::atomic<bool> step_waits_{false};  // the completion-queue thread waits in LockStep
  DeferredPost step_post_;  // the completion-queue thread's alone (SubmitKnown, PostAfterStep)
  std::mutex lender_mu_;
  std::shared_ptr<AnswerLender> lender_;
  uint64_t next_id_ = 1;
  int fd_ = -1;
};

}  // namespace triton_mp

#endif  // TRITON_MP_NATIVE_HANDOFF_H_
