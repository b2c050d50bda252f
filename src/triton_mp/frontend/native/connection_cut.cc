// See connection_cut.h.
#include "connection_cut.h"

#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>

namespace triton_mp {

namespace {

// The local TCP port of socket `fd` when it is a connected AF_INET/AF_INET6 socket, else -1
// (not a socket, another family, or not connected: the listener).
int ConnectedTcpPort(int fd) {
  sockaddr_storage local{};
  socklen_t len = sizeof(local);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) != 0) return -1;
  int port = -1;
  if (local.ss_family == AF_INET) {
    port = ntohs(reinterpret_cast<const sockaddr_in*>(&local)->sin_port);
  } else if (local.ss_family == AF_INET6) {
    port = ntohs(reinterpret_cast<const sockaddr_in6*>(&local)->sin6_port);
  } else {
    return -1;
  }
  sockaddr_storage peer{};
  len = sizeof(peer);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) return -1;
  return port;
}

}  // namespace

ConnectionCut::ConnectionCut(int port, double grace_s) {
  const auto at = std::chrono::steady_clock::now() +
                  std::chrono::microseconds(
                      static_cast<int64_t>((grace_s + kAfterDeadlineS) * 1e6));
  thread_ = std::thread([this, port, at] {
    std::unique_lock<std::mutex> lock(mu_);
    if (cv_.wait_until(lock, at, [this] { return done_; })) return;
    cut_ = CutConnections(port);
  });
}

bool ConnectionCut::Done() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  return cut_ > 0;
}

ConnectionCut::~ConnectionCut() { Done(); }

int ConnectionCut::CutConnections(int port) {
  // NOTE: /proc/self/fd lists this process's descriptors; the port is read again right
  // before the shutdown, so a descriptor grpc closed meanwhile and the process reused is
  // cut only if it is a connection on the public port too (none is accepted any more)
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return 0;
  const int own = dirfd(dir);
  int cut = 0;
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == own) continue;
    if (ConnectedTcpPort(static_cast<int>(fd)) != port) continue;
    if (shutdown(static_cast<int>(fd), SHUT_RDWR) == 0) ++cut;
  }
  closedir(dir);
  return cut;
}

}  // namespace triton_mp
