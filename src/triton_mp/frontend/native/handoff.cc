// See handoff.h.
#include "handoff.h"

#include <sys/eventfd.h>
#include <unistd.h>

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

bool Handoff::Withdraw(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (waiting_.erase(id) == 0) return false;
  HandoffItem item;
  item.id = id;
  item.cancelled = true;
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

bool Handoff::Reply(uint64_t id, grpc::Status status, grpc::ByteBuffer response) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return false;
  auto it = waiting_.find(id);
  if (it == waiting_.end()) return false;
  answers_.push_back(Answer{it->second, std::move(status), std::move(response)});
  waiting_.erase(it);
  if (!armed_) {
    armed_ = true;
    alarm_.Set(cq_, gpr_now(GPR_CLOCK_MONOTONIC), &flush_tag_);
  }
  return true;
}

void Handoff::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  closed_ = true;
}

void Handoff::Flush() {
  std::vector<Answer> answers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    answers.swap(answers_);
    armed_ = false;
  }
  for (auto& a : answers) a.call->Deliver(std::move(a.status), std::move(a.response));
}

}  // namespace triton_mp
