// The steps of a ModelStreamInfer call that the native server hands to the Python frontend
// in process (proxy_call.h, "ModelStreamInfer with a handoff"): every request message goes
// to Python as it is read, in order; Python's response messages are written to the client
// in the order Python gave them, one write at a time; Python's end (its status: OK, or the
// one its handler ended the stream with) finishes the call once every message before it
// was written. Python alone writes Triton's words: this file only moves bytes.
// Steps run under the server's serial lock, as the rest of ProxyCall.
#include <string>
#include <utility>
#include <vector>

#include "metadata.h"
#include "proxy_call.h"

namespace triton_mp {

void ProxyCall::OpenStream() {
  std::vector<std::pair<std::string, std::string>> metadata;
  CopyMetadata(server_ctx_.client_metadata(),
               [&metadata](const std::string& k, const std::string& v) {
                 metadata.emplace_back(k, v);
               });
  ++pending_;  // Python's end, reserved: Deliver(final) completes it, or Withdraw releases it
  handoff_id_ = target_.handoff->Open(this, std::move(metadata));
  ReadStream();
}

void ProxyCall::ReadStream() {
  Start(&stream_read_op_);
  server_stream_.Read(&up_, &stream_read_op_);
}

void ProxyCall::OnStreamRead(bool ok) {
  if (handoff_id_ == 0) return;  // Python ended the stream, or it was withdrawn
  if (!ok) {  // the client half-closed (or went away: OnDone withdraws the call)
    target_.handoff->HalfClose(handoff_id_);
    return;
  }
  target_.handoff->Push(handoff_id_, std::move(up_));
  up_ = grpc::ByteBuffer();
  ReadStream();
}

void ProxyCall::QueueStreamMessage(grpc::ByteBuffer* message) {
  if (finishing_) return;  // the client is gone
  outbox_.emplace_back();
  outbox_.back().Swap(message);  // NOTE: a std::move would copy a grpc::ByteBuffer
  WriteStreamMessage();
}

void ProxyCall::WriteStreamMessage() {
  if (stream_writing_ || outbox_.empty()) return;
  if (finishing_) {
    outbox_.clear();
    return;
  }
  stream_writing_ = true;
  Start(&stream_written_op_);
  // NOTE: with more messages queued behind this one, it is corked (buffer hint): they leave
  // in one socket write with the last, not one write and one completion round trip each.
  grpc::WriteOptions options;
  if (outbox_.size() > 1) options.set_buffer_hint();
  server_stream_.Write(outbox_.front(), options, &stream_written_op_);
}

void ProxyCall::OnStreamWritten(bool ok) {
  stream_writing_ = false;
  outbox_.pop_front();
  // NOTE: a failed write means the client is gone: OnDone withdraws the call; what is
  // still queued is dropped.
  if (!ok) outbox_.clear();
  if (stream_ended_) {
    FinishStreamIfIdle();
    return;
  }
  WriteStreamMessage();
}

void ProxyCall::OnStreamEnded(bool) {
  handoff_id_ = 0;
  stream_ended_ = true;
  FinishStreamIfIdle();
}

void ProxyCall::FinishStreamIfIdle() {
  if (finishing_ || stream_writing_) return;
  if (!outbox_.empty()) {
    WriteStreamMessage();
    return;
  }
  finishing_ = true;
  Start(&client_finished_op_);
  server_stream_.Finish(reply_status_, &client_finished_op_);
}

}  // namespace triton_mp
