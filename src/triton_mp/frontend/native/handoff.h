// The in-process handoff of unary ModelInfer calls to the Python frontend, without grpc.aio:
// the completion-queue thread puts each call's request bytes and metadata in a queue and
// wakes Python through an eventfd; the Python event loop takes them (frontend/native/
// handoff.py, its twin), runs the Python ModelInfer handler on them and replies with the
// serialized response or a status; replies reach the completion queue through one
// grpc::Alarm per batch: the first reply after a flush arms it, the completion-queue thread
// delivers every reply queued by then (one wake-up for all the answers of one Python pass). The completion-queue thread never takes the GIL: it only locks
// this queue's mutex, which the Python side holds for a few pointer moves.
#ifndef TRITON_MP_NATIVE_HANDOFF_H_
#define TRITON_MP_NATIVE_HANDOFF_H_

#include <grpcpp/alarm.h>
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cq_tag.h"

namespace triton_mp {

// What a call waiting for Python's reply offers the handoff (ProxyCall implements it).
class Awaiting {
 public:
  virtual ~Awaiting() = default;
  // Python's reply, on the completion-queue thread (no lock held): answer the client.
  virtual void Deliver(grpc::Status status, grpc::ByteBuffer response) = 0;
};

// One entry Python takes: a call to serve (data set), or a call gone before Python replied
// (cancelled: Python cancels its handler).
struct HandoffItem {
  uint64_t id = 0;
  bool cancelled = false;
  grpc::ByteBuffer data;
  std::vector<std::pair<std::string, std::string>> metadata;
};

class Handoff {
 public:
  Handoff();
  ~Handoff();
  Handoff(const Handoff&) = delete;
  Handoff& operator=(const Handoff&) = delete;

  bool ok() const { return fd_ >= 0; }
  // The completion queue the replies are delivered on (before the first Submit).
  void Attach(grpc::CompletionQueue* cq) { cq_ = cq; }
  // The eventfd Python watches: readable when items wait.
  int fd() const { return fd_; }

  // Completion-queue thread: queue a call; returns its id.
  uint64_t Submit(Awaiting* call, grpc::ByteBuffer data,
                  std::vector<std::pair<std::string, std::string>> metadata);
  // Completion-queue thread: the call is over (cancelled, deadline, shutdown). True when
  // Python had not replied: no reply will be delivered, and Python is told to cancel.
  bool Withdraw(uint64_t id);

  // Python thread: everything queued since the last take.
  std::vector<HandoffItem> Take();
  // Python thread: the reply to call `id`. False when the call is gone or the queue closed
  // (dropped).
  bool Reply(uint64_t id, grpc::Status status, grpc::ByteBuffer response);
  // Before the completion queue shuts down: no reply arms the alarm any more (every call
  // still waiting has been cancelled by the server's shutdown and is withdrawn).
  void Close();

 private:
  struct Answer {
    Awaiting* call;
    grpc::Status status;
    grpc::ByteBuffer response;
  };
  class FlushTag final : public Tag {
   public:
    explicit FlushTag(Handoff* h) : h_(h) {}
    void Proceed(bool) override { h_->Flush(); }

   private:
    Handoff* h_;
  };

  void PushLocked(HandoffItem item);
  // Completion-queue thread (the alarm): deliver every reply queued so far.
  void Flush();

  std::mutex mu_;
  std::deque<HandoffItem> queue_;
  std::unordered_map<uint64_t, Awaiting*> waiting_;
  std::vector<Answer> answers_;  // replied, not yet delivered
  bool armed_ = false;           // the alarm is set for answers_
  bool closed_ = false;          // Close(): replies are dropped
  grpc::CompletionQueue* cq_ = nullptr;
  grpc::Alarm alarm_;
  FlushTag flush_tag_{this};
  uint64_t next_id_ = 1;
  int fd_ = -1;
};

}  // namespace triton_mp

#endif  // TRITON_MP_NATIVE_HANDOFF_H_
