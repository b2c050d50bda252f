// The frontend's inbox read by a C++ thread: the workers' answers to the known calls the gRPC
// thread keeps (Handoff's owned calls) are served and handed to gRPC here, without the
// Python event loop on their path, and every other record reaches Python unchanged.
//
// This thread is the inbox rings' only consumer while it runs (inbox_ring.h; Python's
// ipc.channel.Inbox keeps its mappings but pops nothing: frontend/native/answer_thread.py).
// It waits on the inbox's wake-up as the Python loop did (ipc/memory/notify.py, a FIFO plus
// its arm semaphore: it arms before it blocks, rechecks the rings, and disarms after), drains
// every ring per pass, oldest record first, and gives each record to `serve`
// (known_answer_py.cc ServeKnownAnswer: an owned call's plain answer, the set the Python
// thread's inbox pass served before). A record `serve` declines is copied, byte for byte, to
// the queue Python takes (Take), in ring order; Python decodes and applies it exactly as it
// applied the ring's records (frontend/dispatch/inbox.py), so errors, unknown requests,
// traces, decoupled and stream answers, stats and queue replies, the scheduler's news and
// every un-teaching stay Python's. After a pass that served some, `served` hands the answers
// to gRPC (Handoff::Kick) from this thread.
//
// Python is woken through an eventfd, and only when it asked (Arm, before its loop blocks;
// Disarm after, as the FIFO's arm: a busy loop polls `pending` between events): for a record
// queued, for a settle due (`settle_due`: the request ids C++ takes are running low, and the
// byte counts of what was served wait to be taken), and for an early wake of a worker
// (workers/prewake.py: a FIFO byte with no record yet) when Python awaits answers of its own.
// After such an early wake this thread polls the rings, yielding the CPU between polls, for
// up to kEarlyPollNs while `awaited` calls are owned (polling_loop.py's early poll, its twin):
// an idle frontend never polls.
//
// It also lends its place to the gRPC thread (AnswerLender, answer_lender.h): while the gRPC
// thread holds the inbox's arm, it runs the passes (PassBorrowed) and this thread sleeps on.
#ifndef TRITON_MP_FRONTEND_NATIVE_ANSWER_THREAD_H_
#define TRITON_MP_FRONTEND_NATIVE_ANSWER_THREAD_H_

#include <semaphore.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "answer_lender.h"
#include "inbox_ring.h"

namespace triton_mp {

// What the thread does with what it reads (answer_thread_py.cc wires them).
struct AnswerThreadHooks {
  // A record (valid during the call): true when it was served (its calls end at `served`).
  std::function<bool(const unsigned char*, size_t)> serve;
  // After a pass that served some: hand the answers to gRPC.
  std::function<void()> served;
  // Owned calls now (their answers are this thread's to wait for).
  std::function<size_t()> awaited;
  // After a pass that served some: whether Python should settle now.
  std::function<bool()> settle_due;
};

struct AnswerThreadStats {
  uint64_t passes = 0;       // drains that found records
  uint64_t served = 0;       // records served here
  uint64_t to_python = 0;    // records queued for Python
  uint64_t sleeps = 0;       // blocking waits on the FIFO
  uint64_t early_polls = 0;  // polls after an early wake
  uint64_t python_wakes = 0; // eventfd writes
  uint64_t borrows = 0;      // BeginBorrow that took the arm
  uint64_t lent_served = 0;  // records served by a borrower's passes (answer_lender.h)
};

inline constexpr int64_t kEarlyPollNs = 300000;  // polling_loop.py PREWAKE_POLL_S
inline constexpr int64_t kBusyYieldNs = 15000;   // polling_loop.py BUSY_YIELD_S

class AnswerThread final : public AnswerLender {
 public:
  // Opens the inbox's wake-up `wakeup_name` (its FIFO in /dev/shm and its arm semaphore) and
  // `rings`, and starts reading. nullptr (with `error`): one could not be opened.
  static std::unique_ptr<AnswerThread> Start(const std::string& wakeup_name,
                                             const std::vector<std::string>& rings,
                                             AnswerThreadHooks hooks, std::string* error);
  ~AnswerThread() override;
  AnswerThread(const AnswerThread&) = delete;
  AnswerThread& operator=(const AnswerThread&) = delete;

  // Ends the thread after its pass (joined), and a borrower's pass under way; idempotent.
  // Records not read stay in the rings (a borrower reads none after it); what it queued
  // stays for Take.
  void Stop();
  bool stopped() const { return !thread_.joinable(); }
  // Another producer's ring (a model instance started at run time); false: not a ring.
  bool AddRing(const std::string& name);
  // A ring whose producer is gone: what it still holds is read as a pass reads it (served,
  // or queued for Python), then it is unmapped. False: not one of this thread's rings.
  bool RemoveRing(const std::string& name);
  // Runs a pass now (a record may wait in a ring added since the producer posted).
  void Wake();

  // Python's side. The eventfd Python watches.
  int fd() const { return efd_; }
  // The records queued since the last take, oldest first; *settle: a settle was due.
  std::vector<std::string> Take(bool* settle);
  // Whether a take would give something (records, or a settle due): one load each.
  bool pending() const { return queued_.load() != 0 || settle_.load(); }
  // Python is about to block: write the eventfd for the next record or settle (and, with
  // `awaiting`, for an early wake). The caller rechecks `pending` afterwards.
  void Arm(bool awaiting);
  // Python polls again. False: a write took the arm first (the eventfd is readable).
  bool Disarm() { return py_armed_.exchange(0) != 0; }
  // Reads the eventfd's count (before Take).
  void Clear();
  AnswerThreadStats stats() const;

  // AnswerLender (answer_lender.h), on the gRPC thread.
  bool BeginBorrow() override;
  size_t PassBorrowed() override;
  void EndBorrow() override;

 private:
  AnswerThread() = default;
  void Run();
  // True: records were read. A borrower's pass (`lent`) reads nothing once Stop began.
  bool Pass(bool lent = false);
  bool AnyRecords();
  // Arms the FIFO, rechecks, blocks, disarms, clears. True: a byte came (false: a record
  // was found on the recheck).
  bool Sleep();
  void PollEarly();
  void Read(const unsigned char* data, size_t size, bool* served);
  void WakePython(bool early);

  AnswerThreadHooks hooks_;
  int fifo_ = -1;
  sem_t* arm_ = SEM_FAILED;
  int efd_ = -1;
  std::mutex rings_mu_;  // the rings and every pop
  std::vector<std::unique_ptr<InboxRing>> rings_;
  std::mutex q_mu_;
  std::deque<std::string> queue_;
  std::atomic<uint64_t> queued_{0};
  std::atomic<bool> settle_{false};
  std::atomic<int> py_armed_{0};  // 0: polling; 1: armed; 2: armed, awaiting answers
  std::atomic<bool> stop_{false};
  mutable std::mutex stats_mu_;
  AnswerThreadStats stats_;
  std::thread thread_;
};

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_ANSWER_THREAD_H_
