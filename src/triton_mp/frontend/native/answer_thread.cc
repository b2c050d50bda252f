// See answer_thread.h.
#include "answer_thread.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <utility>

#include "monotonic_ns.h"

namespace triton_mp {

namespace {

std::string Bare(const std::string& name) {
  return !name.empty() && name[0] == '/' ? name.substr(1) : name;
}

}  // namespace

std::unique_ptr<AnswerThread> AnswerThread::Start(const std::string& wakeup_name,
                                                  const std::vector<std::string>& rings,
                                                  AnswerThreadHooks hooks, std::string* error) {
  std::unique_ptr<AnswerThread> t(new AnswerThread());
  t->hooks_ = std::move(hooks);
  const std::string bare = Bare(wakeup_name);
  // NOTE: notify.py Waker: the FIFO read-write (never blocks, needs no writer); the arm
  // semaphore of the same name
  t->fifo_ = open(("/dev/shm/" + bare).c_str(), O_RDWR | O_NONBLOCK | O_CLOEXEC);
  t->arm_ = sem_open(("/" + bare).c_str(), 0);
  t->efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (t->fifo_ < 0 || t->arm_ == SEM_FAILED || t->efd_ < 0) {
    *error = "cannot open the inbox wake-up " + wakeup_name;
    return nullptr;
  }
  for (const auto& name : rings) {
    auto ring = InboxRing::Attach(name);
    if (!ring) {
      *error = "cannot map the inbox ring " + name;
      return nullptr;
    }
    t->rings_.push_back(std::move(ring));
  }
  t->thread_ = std::thread([raw = t.get()] { raw->Run(); });
  return t;
}

AnswerThread::~AnswerThread() {
  Stop();
  if (fifo_ >= 0) close(fifo_);
  if (arm_ != SEM_FAILED) sem_close(arm_);
  if (efd_ >= 0) close(efd_);
}

void AnswerThread::Stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  {
    // NOTE: a borrower's pass under way ends first; the next sees stop_ under this lock
    std::lock_guard<std::mutex> lock(rings_mu_);
  }
  Wake();
  thread_.join();
}

void AnswerThread::Wake() {
  const char byte = 0;
  ssize_t n = write(fifo_, &byte, 1);
  (void)n;  // NOTE: EAGAIN: a full FIFO holds wake-ups already
}

bool AnswerThread::AddRing(const std::string& name) {
  std::lock_guard<std::mutex> lock(rings_mu_);
  for (const auto& r : rings_) {
    if (r->name() == Bare(name)) return true;
  }
  auto ring = InboxRing::Attach(name);
  if (!ring) return false;
  rings_.push_back(std::move(ring));
  return true;
}

bool AnswerThread::RemoveRing(const std::string& name) {
  bool served = false;
  {
    std::lock_guard<std::mutex> lock(rings_mu_);
    size_t i = 0;
    while (i < rings_.size() && rings_[i]->name() != Bare(name)) ++i;
    if (i == rings_.size()) return false;
    rings_[i]->PopEach([&](const unsigned char* d, size_t n) { Read(d, n, &served); });
    rings_.erase(rings_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  if (served) hooks_.served();
  return true;
}

void AnswerThread::Read(const unsigned char* data, size_t size, bool* served) {
  if (hooks_.serve(data, size)) {
    *served = true;
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.served;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    queue_.emplace_back(reinterpret_cast<const char*>(data), size);
    queued_.fetch_add(1);
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.to_python;
  }
  WakePython(false);
}

void AnswerThread::WakePython(bool early) {
  // NOTE: Dekker with Arm: the record (or flag) is published (seq_cst) before the arm is
  // read here, and Arm stores before Python rechecks `pending`
  if (early) {
    int expected = 2;
    if (!py_armed_.compare_exchange_strong(expected, 0)) return;
  } else if (py_armed_.exchange(0) == 0) {
    return;
  }
  const uint64_t one = 1;
  ssize_t n = write(efd_, &one, sizeof(one));
  (void)n;
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++stats_.python_wakes;
}

void AnswerThread::Arm(bool awaiting) { py_armed_.store(awaiting ? 2 : 1); }

void AnswerThread::Clear() {
  uint64_t count;
  ssize_t n = read(efd_, &count, sizeof(count));
  (void)n;  // NOTE: EAGAIN: nothing was written
}

std::vector<std::string> AnswerThread::Take(bool* settle) {
  std::deque<std::string> taken;
  {
    std::lock_guard<std::mutex> lock(q_mu_);
    taken.swap(queue_);
    queued_.store(0);
  }
  *settle = settle_.exchange(false);
  return std::vector<std::string>(std::make_move_iterator(taken.begin()),
                                  std::make_move_iterator(taken.end()));
}

bool AnswerThread::AnyRecords() {
  std::lock_guard<std::mutex> lock(rings_mu_);
  for (const auto& r : rings_) {
    if (r->has_records()) return true;
  }
  return false;
}

bool AnswerThread::Pass(bool lent) {
  bool served = false;
  size_t n = 0;
  uint64_t lent_served = 0;
  {
    std::lock_guard<std::mutex> lock(rings_mu_);
    // NOTE: after Stop, Python reads the rings (answer_thread.py): one consumer at a time
    if (lent && stop_.load()) return false;
    for (const auto& r : rings_) {
      if (!r->has_records()) continue;
      n += r->PopEach([&](const unsigned char* d, size_t size) {
        bool one = false;
        Read(d, size, &one);
        served = served || one;
        lent_served += lent && one ? 1 : 0;
      });
    }
  }
  if (served) {
    hooks_.served();
    if (hooks_.settle_due()) {
      settle_.store(true);
      WakePython(false);
    }
  }
  if (n != 0) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.passes;
    stats_.lent_served += lent_served;
  }
  return n != 0;
}

bool AnswerThread::BeginBorrow() {
  if (stop_.load() || sem_trywait(arm_) != 0) return false;
  std::lock_guard<std::mutex> lock(stats_mu_);
  ++stats_.borrows;
  return true;
}

size_t AnswerThread::PassBorrowed() {
  Pass(true);
  return hooks_.awaited();
}

void AnswerThread::EndBorrow() {
  // NOTE: as Sleep arms: only a consumer posts, and only from 0. After Stop the arm is
  // Python's loop's (notify.Waiter arms it before it blocks)
  int value = 0;
  if (!stop_.load() && sem_getvalue(arm_, &value) == 0 && value == 0) sem_post(arm_);
  // NOTE: a record published before the post took no arm: no byte announces it
  Pass(true);
}

bool AnswerThread::Sleep() {
  // NOTE: notify.py Waiter.arm: only the consumer posts, and only from 0
  int value = 0;
  if (sem_getvalue(arm_, &value) == 0 && value == 0) sem_post(arm_);
  if (AnyRecords() || stop_.load()) {  // NOTE: published before the arm: nobody announces it
    sem_trywait(arm_);
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.sleeps;
  }
  pollfd p{fifo_, POLLIN, 0};
  while (poll(&p, 1, -1) < 0 && errno == EINTR) {
  }
  sem_trywait(arm_);  // NOTE: EAGAIN: a producer took the arm; its byte is read below
  char buf[256];
  while (read(fifo_, buf, sizeof(buf)) == static_cast<ssize_t>(sizeof(buf))) {
  }
  return true;
}

void AnswerThread::PollEarly() {
  {
    std::lock_guard<std::mutex> lock(stats_mu_);
    ++stats_.early_polls;
  }
  const int64_t end = NowNs() + kEarlyPollNs;
  while (!stop_.load() && !AnyRecords()) {
    const int64_t t = NowNs();
    if (t >= end) return;
    sched_yield();
    if (NowNs() - t > kBusyYieldNs) return;  // NOTE: another task ran: the vCPU is wanted
  }
}

void AnswerThread::Run() {
  pthread_setname_np(pthread_self(), "tmp-answers");  // NOTE: as native_server.cc's
  while (!stop_.load()) {
    if (Pass()) continue;
    if (!Sleep() || stop_.load()) continue;
    if (AnyRecords()) continue;
    // NOTE: a byte with no record: a worker's early wake (or a Wake with nothing new)
    WakePython(true);
    if (hooks_.awaited() > 0) PollEarly();
  }
}

AnswerThreadStats AnswerThread::stats() const {
  std::lock_guard<std::mutex> lock(stats_mu_);
  return stats_;
}

}  // namespace triton_mp
