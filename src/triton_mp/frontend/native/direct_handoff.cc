// DirectHandoff (direct_handoff.h).
#include "direct_handoff.h"

#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "monotonic_ns.h"

namespace triton_mp {

namespace {

void PutBig(std::string* out, uint64_t v, int bytes) {
  for (int i = bytes - 1; i >= 0; --i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xFF));
}

// A msgpack int in its shortest form, as msgspec writes it.
void PutInt(std::string* out, int64_t v) {
  if (v >= 0) {
    const uint64_t u = static_cast<uint64_t>(v);
    if (u < 128) {
      out->push_back(static_cast<char>(u));
    } else if (u < 256) {
      out->push_back(static_cast<char>(0xcc));
      PutBig(out, u, 1);
    } else if (u < 65536) {
      out->push_back(static_cast<char>(0xcd));
      PutBig(out, u, 2);
    } else if (u < (1ULL << 32)) {
      out->push_back(static_cast<char>(0xce));
      PutBig(out, u, 4);
    } else {
      out->push_back(static_cast<char>(0xcf));
      PutBig(out, u, 8);
    }
    return;
  }
  const uint64_t bits = static_cast<uint64_t>(v);
  if (v >= -32) {
    out->push_back(static_cast<char>(bits & 0xFF));
  } else if (v >= -128) {
    out->push_back(static_cast<char>(0xd0));
    PutBig(out, bits, 1);
  } else if (v >= -32768) {
    out->push_back(static_cast<char>(0xd1));
    PutBig(out, bits, 2);
  } else if (v >= -2147483648LL) {
    out->push_back(static_cast<char>(0xd2));
    PutBig(out, bits, 4);
  } else {
    out->push_back(static_cast<char>(0xd3));
    PutBig(out, bits, 8);
  }
}

void PutStr(std::string* out, const char* s) {
  const size_t n = std::strlen(s);  // NOTE: the tags are short (fixstr)
  out->push_back(static_cast<char>(0xa0 | n));
  out->append(s, n);
}

void PutBin(std::string* out, const std::string& bytes) {
  const uint64_t n = bytes.size();
  if (n < 256) {
    out->push_back(static_cast<char>(0xc4));
    PutBig(out, n, 1);
  } else if (n < 65536) {
    out->push_back(static_cast<char>(0xc5));
    PutBig(out, n, 2);
  } else {
    out->push_back(static_cast<char>(0xc6));
    PutBig(out, n, 4);
  }
  out->append(bytes);
}

// channel.Sender._push: push, and while the ring is full post its consumer's wake-up and
// retry, pausing 20 µs doubling to 5 ms, for timeout_ns at most. False: still full.
// *waited: the first push found the ring full.
bool PushWaiting(RingProducer* ring, const std::string& data, sem_t* wake, uint64_t timeout_ns,
                 bool* waited) {
  *waited = false;
  PushResult r = ring->Push(data.data(), data.size());
  if (r == PushResult::kPushed) return true;
  if (r != PushResult::kFull) return false;
  *waited = true;
  const uint64_t deadline = MonotonicNs() + timeout_ns;
  uint64_t pause_ns = 20000;
  for (;;) {
    if (wake != nullptr) sem_post(wake);
    timespec pause{0, static_cast<long>(pause_ns)};
    nanosleep(&pause, nullptr);
    pause_ns = std::min<uint64_t>(pause_ns * 2, 5000000);
    r = ring->Push(data.data(), data.size());
    if (r == PushResult::kPushed) return true;
    if (r != PushResult::kFull || MonotonicNs() > deadline) return false;
  }
}

}  // namespace

std::string DirectRouteKey(const std::string& model, int64_t version) {
  std::string key = model;
  key.push_back('\0');
  key.append(std::to_string(version));
  return key;
}

DirectHandoff::~DirectHandoff() { Clear(); }

DirectHandoff& TheDirectHandoff() {
  static DirectHandoff direct;
  return direct;
}

void DirectHandoff::CloseRoute(Route* route) {
  if (route->lease != nullptr) sem_close(route->lease);
  route->lease = nullptr;
  route->wake.reset();
  route->ring.reset();
}

bool DirectHandoff::Add(uint64_t frontend_id, uint64_t instance_id, const std::string& key,
                        const char* lease, std::shared_ptr<RingProducer> ring, const char* wake) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Route& r : routes_) {
      if (r.instance_id == instance_id) return true;
    }
  }
  Route route;
  route.instance_id = instance_id;
  route.frontend_id = frontend_id;
  route.key = key;
  route.ring = std::move(ring);
  route.lease = sem_open(lease, 0);
  if (route.lease == SEM_FAILED) {
    route.lease = nullptr;
    return false;
  }
  route.wake = OpenSemRef(wake);
  if (!route.wake) {
    CloseRoute(&route);
    return false;
  }
  std::lock_guard<std::mutex> lock(mu_);
  routes_.push_back(std::move(route));
  return true;
}

void DirectHandoff::Remove(uint64_t instance_id) {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = routes_.begin(); it != routes_.end(); ++it) {
    if (it->instance_id == instance_id) {
      CloseRoute(&*it);
      routes_.erase(it);
      return;
    }
  }
}

void DirectHandoff::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Route& r : routes_) CloseRoute(&r);
  routes_.clear();
}

DirectStats DirectHandoff::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DirectStats s = stats_;
  s.routes = routes_.size();
  return s;
}

void DirectHandoff::SetFullTimeout(uint64_t ns) {
  std::lock_guard<std::mutex> lock(mu_);
  full_timeout_ns_ = ns;
}

HandResult DirectHandoff::Hand(const std::string& key, uint64_t request_id,
                               const std::string& record, RingProducer* scheduler,
                               sem_t* scheduler_wake, DeferredPost* post) {
  std::lock_guard<std::mutex> lock(mu_);
  bool any = false;
  for (Route& route : routes_) {
    if (route.key != key) continue;
    any = true;
    int up = 0;
    if (sem_getvalue(route.lease, &up) != 0 || up <= 0) continue;  // Lease.offered
    const int64_t batch_id =
        -static_cast<int64_t>(request_id * 1024 + route.frontend_id + 1);  // direct_batch_id
    const uint64_t now = MonotonicNs();
    assign_.clear();
    assign_.push_back(static_cast<char>(0x97));
    PutStr(&assign_, "batch");
    PutInt(&assign_, batch_id);
    assign_.push_back(static_cast<char>(0x91));
    PutBin(&assign_, record);
    PutInt(&assign_, static_cast<int64_t>(now));
    assign_.push_back(0);
    assign_.push_back(static_cast<char>(0x90));
    assign_.push_back(static_cast<char>(0x90));
    // NOTE: Sender.fits, then Lease.take (sem_trywait: one taker wins); either fails: the
    // scheduler gets the call, as Python's hand returns False then
    if (!route.ring->Fits(assign_.size()) || sem_trywait(route.lease) != 0) {
      ++stats_.lost;
      return HandResult::kNotHanded;
    }
    sent_.clear();
    sent_.push_back(static_cast<char>(0x95));
    PutStr(&sent_, "direct_sent");
    PutInt(&sent_, static_cast<int64_t>(route.instance_id));
    PutInt(&sent_, batch_id);
    PutInt(&sent_, static_cast<int64_t>(now));
    PutBin(&sent_, record);
    // NOTE: before the batch, without a wake-up (Sender.push_quiet; a full ring: send,
    // which posts after its push)
    bool waited = false;
    if (!PushWaiting(scheduler, sent_, scheduler_wake, full_timeout_ns_, &waited)) {
      ++stats_.lost;
      return HandResult::kLost;
    }
    if (waited && scheduler_wake != nullptr) sem_post(scheduler_wake);
    // NOTE: the scheduler now holds the instance busy with this batch, with no timeout for
    // one its worker never gets (the second kLost); this push does not fail, so it needs
    // none. The ring is this frontend's own into that worker's inbox, and only a lease
    // holder pushes into it (this hand, or dispatch/direct.py's under the same lease), so
    // from the trywait above to the worker's BatchDone no push but this one: Fits' room
    // holds (a batch pushed between Fits and the trywait was popped before its BatchDone
    // could re-offer the lease), Fits bounds the size, and a route's ring is detached only
    // after Python removed the route, under mu_, held here. The one way past it: a hand
    // whose DirectSent waited over scheduler/direct.py's CLAIM_TIMEOUT_NS (1 s) in a full
    // ring to the scheduler, its lease given back meanwhile, pushing its batch beside a
    // later holder's; a record is a few hundred bytes, so even then the ring is full only
    // while the worker reads nothing for the whole full_timeout_ns_ (10 s): a worker that
    // hung, which keeps its instance busy whatever the scheduler believes.
    if (!PushWaiting(route.ring.get(), assign_, route.wake.get(), full_timeout_ns_, &waited)) {
      ++stats_.lost;
      return HandResult::kLost;
    }
    // NOTE: Sender.send_bytes' wake (a semaphore: always posted), after the caller's locks
    if (post != nullptr) {
      post->Defer(route.wake);
    } else {
      sem_post(route.wake.get());
    }
    ++stats_.handed;
    return HandResult::kHanded;
  }
  if (any) ++stats_.not_offered;
  return HandResult::kNotHanded;
}

}  // namespace triton_mp
