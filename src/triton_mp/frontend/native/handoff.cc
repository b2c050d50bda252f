// See handoff.h.
#include "handoff.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <time.h>

#include <algorithm>

#include "request_split.h"

namespace triton_mp {

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
  waiting_.emplace(id, call);
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
  std::vector<grpc::Slice> slices;
  if (!data.Valid() || !data.Dump(&slices).ok()) return false;
  Chunks message;
  for (const auto& slice : slices) message.Add(slice.begin(), slice.size());
  RequestSplit split;
  if (!SplitInferRequest(message, &split)) return false;
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);  // NOTE: Python's time.monotonic_ns
  const uint64_t arrival_ns =
      static_cast<uint64_t>(now.tv_sec) * 1000000000ULL + static_cast<uint64_t>(now.tv_nsec);
  HandoffItem item;
  item.kind = ItemKind::kKnown;
  // NOTE: the queue's lock is held from before the push until the call is queued: its answer
  // can be read as soon as the record is in the ring, and Python's take (PendingTable.
  // on_unknown pulls this queue on an answer it does not know) must then find the call,
  // even when this thread is preempted in between. A cancel of the call is queued behind it.
  std::lock_guard<std::mutex> lock(mu_);
  if (known.Submit(message, split, arrival_ns, &item.known) != KnownResult::kSent) return false;
  item.id = *id = next_id_++;
  waiting_.emplace(item.id, call);
  PushLocked(std::move(item));
  return true;
}

uint64_t Handoff::Open(Awaiting* call,
                       std::vector<std::pair<std::string, std::string>> metadata) {
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t id = next_id_++;
  waiting_.emplace(id, call);
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
  waiting_.erase(it);
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
  std::lock_guard<std::mutex> serial(*serial_);
  std::vector<Answer> answers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    answers.swap(answers_);
  }
  for (auto& a : answers) {
    a.call->Deliver(std::move(a.status), std::move(a.response), a.final);
  }
}

bool Handoff::Reply(uint64_t id, grpc::Status status, grpc::ByteBuffer response) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  auto it = waiting_.find(id);
  if (it == waiting_.end()) return false;
  answers_.push_back(Answer{it->second, std::move(status), std::move(response), true});
  waiting_.erase(it);
  return true;
}

bool Handoff::Write(uint64_t id, grpc::ByteBuffer response) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  auto it = waiting_.find(id);
  if (it == waiting_.end()) return false;
  answers_.push_back(Answer{it->second, grpc::Status::OK, std::move(response), false});
  return true;
}

void Handoff::Close() {
  std::lock_guard<std::mutex> serial(*serial_);
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
  answers_.clear();
}

}  // namespace triton_mp
