// Completion-queue tags: what the native server's thread gets back from grpc::CompletionQueue.
// One call object owns several ops (one per kind of pending operation); each op, when its
// operation completes, calls one member function of its call with gRPC's `ok`.
#ifndef TRITON_MP_NATIVE_CQ_TAG_H_
#define TRITON_MP_NATIVE_CQ_TAG_H_

namespace triton_mp {

// What every pointer handed to the completion queue is.
class Tag {
 public:
  virtual ~Tag() = default;
  virtual void Proceed(bool ok) = 0;
};

// An op of call type C: on completion, C::Complete(step, ok) runs the step's handler.
template <class C>
class Op final : public Tag {
 public:
  using Step = void (C::*)(bool ok);
  Op(C* call, Step step) : call_(call), step_(step) {}
  void Proceed(bool ok) override { call_->Complete(step_, ok); }

 private:
  C* call_;
  Step step_;
};

}  // namespace triton_mp

#endif  // TRITON_MP_NATIVE_CQ_TAG_H_
