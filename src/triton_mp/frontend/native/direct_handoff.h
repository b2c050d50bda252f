// The direct handoff of a known call on the gRPC thread: the call's REQUEST record handed
// straight to an idle instance of its version, when the scheduler offers one (ipc/direct.py:
// the lease rules), instead of pushed into the scheduler's ring.
//
// Python twin: frontend/dispatch/direct.py (DirectRoutes.hand), whose every rule this
// follows: the routes of a version in the order Python opened them; the first whose lease
// is up (sem_getvalue) is tried and no other; nothing is taken when the batch could never
// fit that route's ring or the lease is lost to another taker (sem_trywait), and the call
// then goes to the scheduler as any; once the lease is taken, a DirectSent is left on the
// ring to the scheduler without waking it (posted and retried while that ring is full, as
// channel.Sender's send), then the BatchAssign is pushed onto this frontend's ring into the
// worker's inbox and the worker's semaphore posted. Python opens and closes the routes
// (DirectRoutes.update -> _native.direct_route_*); the worker rings' producers are shared
// with Python's pushes (shared_ring.py). tests/unit/test_native_direct.py checks that the two
// agree byte for byte and lease for lease.
//
// Both records are msgpack (ipc/recordio/codec.py encode of msgspec's array-like tagged
// structs, ints in their shortest form): DirectSent ["direct_sent", instance_id, batch_id,
// dispatch_ns, record] and BatchAssign ["batch", batch_id, [record], dispatch_ns, 0, [], []]
// (ipc/protocol/messages.py), the REQUEST record as bin; batch_id is direct_batch_id's
// -(request_id * 1024 + frontend_id + 1).
#ifndef TRITON_MP_FRONTEND_NATIVE_DIRECT_HANDOFF_H_
#define TRITON_MP_FRONTEND_NATIVE_DIRECT_HANDOFF_H_

#include <semaphore.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "deferred_post.h"
#include "ring_producer.h"

namespace triton_mp {

enum class HandResult : int {
  kNotHanded = 0,  // no route, no lease up, too large, or the lease lost: send to the scheduler
  kHanded = 1,     // the worker runs it; nothing goes to the scheduler but the DirectSent
  kLost = 2,       // the lease is taken but a ring stayed full (full_timeout): the call
                   // fails UNAVAILABLE, as Python's hand raises ChannelTimeout then (the
                   // scheduler frees the instance after its claim timeout)
};

struct DirectStats {
  uint64_t handed = 0;
  uint64_t not_offered = 0;  // routes, but no lease up
  uint64_t lost = 0;         // a take lost to another taker, or kLost
  uint64_t routes = 0;       // open now
};

// A version's routes key: the model's name, a NUL, the version in decimal (direct_route_key
// in frontend/dispatch/direct.py).
std::string DirectRouteKey(const std::string& model, int64_t version);

class DirectHandoff {
 public:
  DirectHandoff() = default;
  ~DirectHandoff();
  DirectHandoff(const DirectHandoff&) = delete;
  DirectHandoff& operator=(const DirectHandoff&) = delete;

  // Python thread: open instance `instance_id`'s route for the version `key`: its lease
  // semaphore, this frontend's ring into its inbox (shared producer) and its wake-up
  // semaphore. False (errno set): a semaphore could not be opened (nothing kept). An
  // instance already open is left as it is (true).
  bool Add(uint64_t frontend_id, uint64_t instance_id, const std::string& key,
           const char* lease, std::shared_ptr<RingProducer> ring, const char* wake);
  // Python thread: close an instance's route (stopped for good); unknown ids are ignored.
  void Remove(uint64_t instance_id);
  // Python thread: close every route.
  void Clear();
  DirectStats stats() const;
  // Python thread: how long a push waits for room in a full ring before the hand is lost
  // (the ring to the scheduler's Sender.full_timeout_s; 10 s until set).
  void SetFullTimeout(uint64_t ns);

  // gRPC thread: hand `record` (request `request_id`'s REQUEST record) to an idle instance of
  // version `key`; `scheduler` and `scheduler_wake`: the ring to the scheduler and its
  // wake-up (posted only while that ring is full). kHanded: the worker's semaphore is left
  // in `post` (deferred_post.h: posted once the caller's locks are released; nullptr: now).
  HandResult Hand(const std::string& key, uint64_t request_id, const std::string& record,
                  RingProducer* scheduler, sem_t* scheduler_wake, DeferredPost* post = nullptr);

 private:
  struct Route {
    uint64_t instance_id = 0;
    uint64_t frontend_id = 0;
    std::string key;
    sem_t* lease = nullptr;
    std::shared_ptr<RingProducer> ring;
    SemRef wake;  // NOTE: by reference: a deferred post may outlive the route
  };
  static void CloseRoute(Route* route);

  mutable std::mutex mu_;
  std::vector<Route> routes_;  // in the order opened (a version's: DirectRoutes._by_version)
  std::string sent_;           // the DirectSent being encoded (reused)
  std::string assign_;         // the BatchAssign being encoded (reused)
  DirectStats stats_;
  uint64_t full_timeout_ns_ = 10ULL * 1000000000ULL;  // channel.Sender's full_timeout_s
};

// The process's one DirectHandoff (KnownSubmit hands with it; Python opens its routes).
DirectHandoff& TheDirectHandoff();

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_DIRECT_HANDOFF_H_
