// The stop's last resort for connections grpc cannot close: a TCP connection whose client
// stopped reading (a stopped or wedged process) while the server wrote to it. Its socket's
// send buffer is full, so grpc's write on it never ends; at Shutdown's deadline grpc cancels
// every call (grpc_server_cancel_all_calls), but chttp2 finishes a cancelled call's ops and
// closes the transport only once its write in progress ends ("Delayed close due to
// in-progress write"; the ops wait in the transport's run-after-write list). Shutdown then
// waits forever for that connection's calls, the frontend never exits, and the supervisor
// kills it past the exit budget (r25's Bug B, session 19: 40 unread 1 MiB answers).
// ConnectionCut runs one thread for the duration of Shutdown: if Shutdown has not returned
// kAfterDeadlineS after its deadline, every TCP connection this process still has on the
// public port is shut down with shutdown(2). The blocked write then fails (EPIPE), grpc
// closes the transport, the calls' ops complete as cancelled, and Shutdown returns. A
// connection grpc could close itself is gone by then: only a stuck one is cut this way. Its
// unsent bytes are answers the client never got (a call grpc counts as done once its answer
// is queued on the transport, so StopCut may have seen none running): a cut connection makes
// the stop one that cut calls (NativeServer::Stop, ipc.handshake.CALLS_CUT_EXIT).
// Python twin: none (the Python gRPC server's stop, frontend/grpc/stop_grpc, is grpc.aio's).
#ifndef TRITON_MP_NATIVE_CONNECTION_CUT_H_
#define TRITON_MP_NATIVE_CONNECTION_CUT_H_

#include <condition_variable>
#include <mutex>
#include <thread>

namespace triton_mp {

class ConnectionCut {
 public:
  // How long after Shutdown's deadline the cut comes: grpc's own cancel at the deadline
  // closes every connection whose writes can go on in well under this.
  static constexpr double kAfterDeadlineS = 0.5;

  // Starts the thread: it cuts the connections on TCP `port` once `grace_s` (Shutdown's
  // grace, seconds from now) plus kAfterDeadlineS passed, unless destroyed before.
  ConnectionCut(int port, double grace_s);
  // Shutdown returned: stops the thread (cutting nothing if it had not cut yet), joins it,
  // and returns whether it cut a connection. Once; the destructor does it if not done.
  bool Done();
  ~ConnectionCut();
  ConnectionCut(const ConnectionCut&) = delete;
  ConnectionCut& operator=(const ConnectionCut&) = delete;

  // Shuts down (both directions) every connected TCP socket of this process whose local port
  // is `port`; returns how many. The listening socket has no peer and is left alone.
  static int CutConnections(int port);

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // under mu_: Shutdown returned
  int cut_ = 0;        // under mu_: connections the thread cut
  std::thread thread_;
};

}  // namespace triton_mp

#endif  // TRITON_MP_NATIVE_CONNECTION_CUT_H_
