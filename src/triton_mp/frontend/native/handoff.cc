// See handoff.h.
#include "handoff.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "monotonic_ns.h"
#include "request_split.h"

namespace triton_mp {

namespace {

// SubmitKnown's request views, kept per thread for their buffers (a call allocates none of
// them once they have grown); the slices are let go when SubmitKnown returns (Use), so the
// request's bytes are not held past it.
struct SubmitScratch {
  std::vector<grpc::Slice> slices;
  Chunks message;
  RequestSplit split;

  class Use {
   public:
    explicit Use(SubmitScratch* s) : s_(s) {}
    Use(const Use&) = delete;
    Use& operator=(const Use&) = delete;
    ~Use() {
      s_->message.Clear();
      s_->slices.clear();
    }

   private:
    SubmitScratch* s_;
  };
};

void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

Handoff::Handoff() : fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

Handoff::~Handoff() {
  if (fd_ >= 0) close(fd_);
}

void Handoff::PushLocked(HandoffItem item) {
  bool was_empty = queue_.empty();
  queue_.push_back(std::move(item));
  if (was_empty) {
    // NOTE: only the empty -> non-empty step wakes Python: it drains everything per wake.
    uint64_t one = 1;
    ssize_t n = write(fd_, &one, sizeof(one));
    (void)n;  // EAGAIN: the counter is already non-zero, Python is awake anyway
  }
}

uint64_t Handoff::Submit(Awaiting* call, grpc::ByteBuffer data,
                         std::vector<std::pair<std::string, std::string>> metadata) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = next_id_++;
  waiting_nodes_.Insert(&waiting_, id, call);
  HandoffItem item;
  item.id = id;
  item.data = std::move(data);
  item.metadata = std::move(metadata);
  PushLocked(std::move(item));
  return id;
}

bool Handoff::SubmitKnown(Awaiting* call, const grpc::ByteBuffer& data, uint64_t* id) {
  KnownSubmit& known = TheKnownSubmit();
  if (!known.taught()) return false;
  thread_local SubmitScratch scratch;
  SubmitScratch::Use use(&scratch);
  std::vector<grpc::Slice>& slices = scratch.slices;
  if (!data.Valid() || !data.Dump(&slices).ok()) return false;
  Chunks& message = scratch.message;
  for (const auto& slice : slices) message.Add(slice.begin(), slice.size());
  RequestSplit& split = scratch.split;
  if (!SplitInferRequest(message, &split)) return false;
  const uint64_t arrival_ns = MonotonicNs();
  // NOTE: two steps outside the queue's lock (known_submit.h): the lesson and a block
  // reserved, the raw bytes copied (1 MiB at id1m: the answer thread's FindOwned and
  // Python's take must not wait for it)
  KnownReservation reserved;
  if (known.Reserve(message, split, &reserved) != KnownResult::kSent) return false;
  if (!known.CopyInputs(message, split, &reserved)) return false;
  HandoffItem item;
  item.kind = ItemKind::kKnown;
  // NOTE: the queue's lock is held from before the push until the call is queued: its answer
  // can be read as soon as the record is in the ring, and Python's take (PendingTable.
  // on_unknown pulls this queue on an answer it does not know) must then find the call,
  // even when this thread is preempted in between. A cancel of the call is queued behind it.
  // NOTE: the worker's wake-up of a call handed to it waits for PostAfterStep, after this
  // lock and the serial lock are released: a worker woken under them could answer, and wake
  // the answer thread, before this thread lets go (deferred_post.h)
  std::lock_guard<std::mutex> lock(mu_);
  const KnownResult result =
      known.Finish(&reserved, split, arrival_ns, &item.known, &step_post_);
  if (result != KnownResult::kSent && result != KnownResult::kLost) return false;
  item.id = *id = next_id_++;
  waiting_nodes_.Insert(&waiting_, item.id, call);
  if (log_accepted_ && result == KnownResult::kSent) {
    HandoffItem accepted;
    accepted.id = item.id;
    accepted.kind = ItemKind::kAccepted;
    accepted.known = item.known;
    PushLocked(std::move(accepted));
  }
  if (result == KnownResult::kLost) {
    // NOTE: sent as a new call, Python's hand would wait for the full ring again and
    // succeed later; its own hand fails the call now (UNAVAILABLE): so does this one
    item.kind = ItemKind::kLost;
  } else if (own_known_) {
    // NOTE: kept, not queued: its answer is served here (AnswerOwned) unless Python takes it
    owned_call_nodes_.Insert(&owned_call_, item.id, item.known.request_id);
    owned_nodes_.Insert(&owned_, item.known.request_id, Owned{item.id, item.known});
    return true;
  }
  PushLocked(std::move(item));
  return true;
}

void Handoff::ReleaseLocked(uint64_t rid) {
  auto it = owned_.find(rid);
  if (it == owned_.end()) return;
  HandoffItem item;
  item.id = it->second.call_id;
  item.kind = ItemKind::kKnown;
  item.known = it->second.sent;
  auto call = owned_call_.find(item.id);
  if (call != owned_call_.end()) owned_call_nodes_.Erase(&owned_call_, call);
  owned_nodes_.Erase(&owned_, it);
  ++released_;
  PushLocked(std::move(item));
}

void Handoff::OwnKnown(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  own_known_ = on;
}

void Handoff::LogAccepted(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  log_accepted_ = on;
}

size_t Handoff::ReleaseOwned() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::pair<uint64_t, uint64_t>> calls(owned_call_.begin(), owned_call_.end());
  std::sort(calls.begin(), calls.end());  // NOTE: in the order they were submitted
  for (const auto& [call_id, rid] : calls) ReleaseLocked(rid);
  return calls.size();
}

bool Handoff::FindOwned(const AnswerRead& read, std::vector<KnownSent>* calls) {
  std::lock_guard<std::mutex> lock(mu_);
  calls->clear();
  for (const auto& r : read.responses) {
    auto it = owned_.find(r.request_id);
    if (it == owned_.end()) return false;
    calls->push_back(it->second.sent);
  }
  return !calls->empty();
}

bool Handoff::AnswerOwned(const AnswerRead& read, std::vector<grpc::ByteBuffer>* responses) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || responses->size() != read.responses.size()) return false;
  for (const auto& r : read.responses) {
    if (owned_.find(r.request_id) == owned_.end()) return false;
  }
  answers_.reserve(answers_.size() + read.responses.size());
  for (size_t i = 0; i < read.responses.size(); ++i) {
    auto it = owned_.find(read.responses[i].request_id);
    const uint64_t call_id = it->second.call_id;
    auto call = owned_call_.find(call_id);
    if (call != owned_call_.end()) owned_call_nodes_.Erase(&owned_call_, call);
    owned_nodes_.Erase(&owned_, it);
    auto w = waiting_.find(call_id);
    if (w == waiting_.end()) continue;  // NOTE: owned calls are withdrawn through ReleaseLocked
    answers_.emplace_back(w->second, grpc::Status::OK, &(*responses)[i], true);
    waiting_nodes_.Erase(&waiting_, w);
  }
  return true;
}

uint64_t Handoff::Open(Awaiting* call,
                       std::vector<std::pair<std::string, std::string>> metadata) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = next_id_++;
  waiting_nodes_.Insert(&waiting_, id, call);
  HandoffItem item;
  item.id = id;
  item.kind = ItemKind::kStreamOpen;
  item.metadata = std::move(metadata);
  PushLocked(std::move(item));
  return id;
}

void Handoff::Push(uint64_t id, grpc::ByteBuffer data) {
  std::lock_guard<std::mutex> lock(mu_);
  HandoffItem item;
  item.id = id;
  item.kind = ItemKind::kStreamMessage;
  item.data = std::move(data);
  PushLocked(std::move(item));
}

void Handoff::HalfClose(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  HandoffItem item;
  item.id = id;
  item.kind = ItemKind::kStreamEnd;
  PushLocked(std::move(item));
}

bool Handoff::Withdraw(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = waiting_.find(id);
  if (it == waiting_.end()) return false;
  Awaiting* call = it->second;
  waiting_nodes_.Erase(&waiting_, it);
  auto owned = owned_call_.find(id);
  if (owned != owned_call_.end()) ReleaseLocked(owned->second);  // NOTE: Python cancels it
  // NOTE: a stream's messages queued for the next flush would reach a call that is gone.
  answers_.erase(std::remove_if(answers_.begin(), answers_.end(),
                                [call](const Answer& a) { return a.call == call; }),
                 answers_.end());
  HandoffItem item;
  item.id = id;
  item.kind = ItemKind::kCancelled;
  PushLocked(std::move(item));
  return true;
}

std::vector<HandoffItem> Handoff::Take() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<HandoffItem> out(std::make_move_iterator(queue_.begin()),
                               std::make_move_iterator(queue_.end()));
  queue_.clear();
  return out;
}

void Handoff::Kick() {
  due_.store(true);
  // NOTE: whoever holds the serial lock reads due_ after letting go (this loop, DeliverDue),
  // and due_ is published before the try: a Kick that fails leaves its answers to the holder
  while (due_.load() && serial_->try_lock()) {
    due_.store(false);
    const bool handed = DeliverLocked();
    serial_->unlock();
    if (handed) return;  // NOTE: the waiting step delivers the rest (DeliverDue)
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
}

void Handoff::LockStep() {
  if (serial_->try_lock()) return;
  step_waits_.store(true);
  // NOTE: a Kick under way lets go after its current answer (one reply sent, a few µs):
  // wait that long on the lock word rather than in the kernel, whose sleep costs this
  // thread a wake-up and every later unlock of the lock a futex call
  const int64_t until = NowNs() + kStepSpinNs;
  bool locked = false;
  for (int i = 1; !(locked = serial_->try_lock()); ++i) {
    CpuRelax();
    if (i % 64 == 0 && NowNs() > until) break;
  }
  if (!locked) serial_->lock();
  step_waits_.store(false);
}

bool Handoff::DeliverLocked() {
  // NOTE: the serial lock is held: delivering_ is this call's alone, empty on entry; the
  // swap leaves answers_ its (empty) buffer, so neither vector allocates once grown
  std::vector<Answer>& answers = delivering_;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return false;
    answers.swap(answers_);
  }
  for (size_t i = 0; i < answers.size(); ++i) {
    if (i > 0 && step_waits_.load(std::memory_order_relaxed)) {
      // NOTE: the rest go back ahead of any queued since (order kept); closed_ cannot change
      // while the serial lock is held (Close takes it)
      std::lock_guard<std::mutex> lock(mu_);
      answers_.insert(answers_.begin(), std::make_move_iterator(answers.begin() + i),
                      std::make_move_iterator(answers.end()));
      answers.clear();
      due_.store(true);
      return true;
    }
    Answer& a = answers[i];
    a.call->Deliver(std::move(a.status), &a.response, a.final);
  }
  answers.clear();
  return false;
}

bool Handoff::Reply(uint64_t id, grpc::Status status, grpc::ByteBuffer response) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  auto it = waiting_.find(id);
  if (it == waiting_.end()) return false;
  answers_.emplace_back(it->second, std::move(status), &response, true);
  waiting_nodes_.Erase(&waiting_, it);
  return true;
}

bool Handoff::Write(uint64_t id, grpc::ByteBuffer response) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  auto it = waiting_.find(id);
  if (it == waiting_.end()) return false;
  answers_.emplace_back(it->second, grpc::Status::OK, &response, false);
  return true;
}

void Handoff::Close() {
  std::lock_guard<std::mutex> serial(*serial_);
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  answers_.clear();
}

}  // namespace triton_mp
