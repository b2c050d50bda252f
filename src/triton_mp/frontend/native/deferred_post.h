// A POSIX semaphore held by reference (SemRef: closed when its last holder lets go), and a
// post deferred to the end of a scope (DeferredPost: posted when it is destroyed).
//
// Why: the gRPC thread hands a known call to a worker (direct_handoff.h) while it holds the
// handoff's and the submit's locks (handoff.cc SubmitKnown: the call must be registered
// before its answer can be read). Posting the worker's semaphore there woke the worker
// while those locks were still held; on 2 vCPUs the worker then often ran first, and the
// answer thread, woken early by the same worker (workers/prewake.py), blocked on the
// handoff's lock until the gRPC thread ran again: a futex sleep and wake per call at c=1.
// The post is the last thing a push needs (the record is in the ring before it), so it may
// wait until the locks are released; a DeferredPost declared before the lock guards is
// destroyed after them. It holds the semaphore by reference, so a route closed meanwhile
// (DirectHandoff::Remove, the Python thread) does not close it under the post.
#ifndef TRITON_MP_FRONTEND_NATIVE_DEFERRED_POST_H_
#define TRITON_MP_FRONTEND_NATIVE_DEFERRED_POST_H_

#include <semaphore.h>

#include <memory>
#include <utility>

namespace triton_mp {

using SemRef = std::shared_ptr<sem_t>;

// sem_open(name, 0) held by reference; nullptr when it cannot be opened (errno set).
inline SemRef OpenSemRef(const char* name) {
  sem_t* s = sem_open(name, 0);
  if (s == SEM_FAILED) return nullptr;
  return SemRef(s, [](sem_t* p) { sem_close(p); });
}

class DeferredPost {
 public:
  DeferredPost() = default;
  ~DeferredPost() { Post(); }
  DeferredPost(const DeferredPost&) = delete;
  DeferredPost& operator=(const DeferredPost&) = delete;

  // Posts `sem` at the end of this object's scope (one pending post: a previous one is
  // posted now).
  void Defer(SemRef sem) {
    Post();
    sem_ = std::move(sem);
  }
  // Posts now, if a post is pending.
  void Post() {
    if (sem_) sem_post(sem_.get());
    sem_.reset();
  }
  bool pending() const { return sem_ != nullptr; }

 private:
  SemRef sem_;
};

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_DEFERRED_POST_H_
