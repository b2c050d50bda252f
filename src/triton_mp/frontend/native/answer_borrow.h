// When the completion-queue thread waits for an answer itself (answer_lender.h says why):
// after a step that handed a call to an idle worker (a direct handoff, its wake-up not yet
// posted), while that call is the only one awaited. The thread then polls the completion
// queue without blocking and the inbox between polls, yielding its vCPU each round, until
// the answer is served (the reply is sent from this thread), a second call is awaited, the
// wait passes kBorrowNs, or a yield took longer than kBorrowYieldNs (another task wanted the
// vCPU: the answer thread serves it as before). A wait that ran out skips the next
// kBorrowSkips hands, so a model slower than the budget costs one wait in kBorrowSkips + 1.
// This is work while a call is in flight, never idle polling: an idle frontend borrows
// nothing.
// Python twin: none (the Python path has no completion-queue thread; its early poll after a
// worker's early wake, polling_loop.py, is the nearest).
#ifndef TRITON_MP_FRONTEND_NATIVE_ANSWER_BORROW_H_
#define TRITON_MP_FRONTEND_NATIVE_ANSWER_BORROW_H_

#include <cstdint>
#include <memory>

#include "answer_lender.h"
#include "handoff.h"

namespace triton_mp {

inline constexpr int64_t kBorrowNs = 300000;       // answer_thread.h kEarlyPollNs
inline constexpr int64_t kBorrowYieldNs = 15000;   // answer_thread.h kBusyYieldNs
inline constexpr int kBorrowSkips = 15;

class AnswerBorrow {
 public:
  AnswerBorrow() = default;
  ~AnswerBorrow() { End(); }
  AnswerBorrow(const AnswerBorrow&) = delete;
  AnswerBorrow& operator=(const AnswerBorrow&) = delete;

  // After a step, before PostAfterStep: borrows when the step handed a call to a worker and
  // that call is the only one awaited.
  void AfterStep(Handoff* handoff);
  // Borrowing: the completion queue is to be polled without blocking, then Poll called.
  bool active() const { return lender_ != nullptr; }
  // One pass over the inbox, then a yield; ends the borrow when it is over (class comment).
  void Poll();
  // Gives the inbox back (its last pass included); nothing when not borrowing.
  void End();

 private:
  std::shared_ptr<AnswerLender> lender_;
  int64_t until_ns_ = 0;
  int skip_ = 0;  // hands left to skip after a wait that ran out
};

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_ANSWER_BORROW_H_
