// What the inbox's reader lends the gRPC thread: its place as the inbox's consumer, for as
// long as the gRPC thread waits for the answer of a call it just handed to an idle worker
// (answer_borrow.h decides when). The answer thread (answer_thread.h) implements it.
//
// Why: at c=1 the answer thread slept until the worker's early wake (workers/prewake.py), then
// polled for the answer and sent the reply from its own thread; gRPC then kicked the
// completion-queue thread, asleep in epoll, to reap the reply's completion (an eventfd write
// and a wake-up per call, at the moment the client needs the vCPU). A borrower that serves
// the answer on the completion-queue thread itself sends the reply while nobody polls the
// queue: gRPC kicks no one, and the answer thread is not woken at all.
//
// The protocol is the inbox's arm (ipc/memory/notify.py, Waiter.arm): a borrower takes the
// arm, so producers write no byte (the sleeping answer thread stays asleep), and reads the
// rings itself; when it stops it gives the arm back, then reads the rings once more: a record
// published before the arm was back was announced to nobody, one published after it wakes
// the answer thread as before. No wake-up is lost either way.
#ifndef TRITON_MP_FRONTEND_NATIVE_ANSWER_LENDER_H_
#define TRITON_MP_FRONTEND_NATIVE_ANSWER_LENDER_H_

#include <cstddef>

namespace triton_mp {

class AnswerLender {
 public:
  virtual ~AnswerLender() = default;
  // Takes the inbox's arm. False: not lent (the reader is awake, a producer's byte is on its
  // way, or the reader stopped): the reader serves as before.
  virtual bool BeginBorrow() = 0;
  // Borrowed: one pass over the rings on the caller's thread (answers served and sent from
  // it). Returns the answers still awaited (owned calls not answered).
  virtual size_t PassBorrowed() = 0;
  // Gives the arm back, then reads the rings once more (BeginBorrow's caller, once).
  virtual void EndBorrow() = 0;
};

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_ANSWER_LENDER_H_
