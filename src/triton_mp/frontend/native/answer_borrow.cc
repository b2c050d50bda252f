// See answer_borrow.h.
#include "answer_borrow.h"

#include <sched.h>

#include "monotonic_ns.h"

namespace triton_mp {

void AnswerBorrow::AfterStep(Handoff* handoff) {
  if (active() || !handoff->post_pending()) return;
  if (skip_ > 0) {
    --skip_;
    return;
  }
  // NOTE: only the call just handed: with others in flight the answers come as they come
  // and this thread has their requests to read
  if (handoff->owned() != 1) return;
  std::shared_ptr<AnswerLender> lender = handoff->lender();
  // NOTE: before the worker's post: its early wake (workers/prewake.py) then finds no arm
  if (!lender || !lender->BeginBorrow()) return;
  lender_ = std::move(lender);
  until_ns_ = NowNs() + kBorrowNs;
}

void AnswerBorrow::Poll() {
  if (!active()) return;
  if (lender_->PassBorrowed() != 1) {  // NOTE: 0: answered here; 2 or more: not c=1
    End();
    return;
  }
  const int64_t t = NowNs();
  if (t >= until_ns_) {
    skip_ = kBorrowSkips;
    End();
    return;
  }
  sched_yield();
  if (NowNs() - t > kBorrowYieldNs) End();
}

void AnswerBorrow::End() {
  if (!active()) return;
  lender_->EndBorrow();
  lender_.reset();
}

}  // namespace triton_mp
