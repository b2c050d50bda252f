// A serialized inference.ModelInferRequest split as the Python frontend splits it
// (frontend/grpc/wire.py: _scan and split_infer_request, its twin): the
// raw_input_contents entries (field 7) found in place, the message without them (`head`),
// and without them and the id fields (field 3) either (`key`, what the frontend knows a
// request it checked before by), and the last id's value. Only top-level fields are read;
// a message this scanner does not understand (a group, a truncated field, a varint over 10
// bytes) is declined, and Python parses it whole, which answers as it always did.
//
// The message may lie in several pieces (`Chunks`: gRPC's receive slices, in order); every
// offset is the message's, as if the pieces were one run of bytes.
#ifndef TRITON_MP_NATIVE_REQUEST_SPLIT_H_
#define TRITON_MP_NATIVE_REQUEST_SPLIT_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace triton_mp {

// A message in pieces, not owned (the pieces outlive it). Empty pieces are dropped.
class Chunks {
 public:
  void Add(const unsigned char* data, size_t size);
  // Empty again, its buffers kept (a Chunks reused per message allocates nothing once grown).
  void Clear() {
    pieces_.clear();
    starts_.clear();
    size_ = 0;
  }
  size_t size() const { return size_; }

  // Copies the message's bytes [offset, offset + n) to `dst`. False (nothing copied): the
  // range runs past the end.
  bool Copy(size_t offset, size_t n, unsigned char* dst) const;
  // Appends the message's bytes [offset, offset + n) (within size()) to `out`.
  void Append(size_t offset, size_t n, std::string* out) const;

  // The piece holding the message's byte `offset` (< size()), and where that piece starts.
  size_t PieceAt(size_t offset) const;
  const unsigned char* piece_data(size_t i) const { return pieces_[i].first; }
  size_t piece_size(size_t i) const { return pieces_[i].second; }
  size_t piece_start(size_t i) const { return starts_[i]; }
  size_t pieces() const { return pieces_.size(); }

 private:
  std::vector<std::pair<const unsigned char*, size_t>> pieces_;
  std::vector<size_t> starts_;  // each piece's offset in the message
  size_t size_ = 0;
};

struct RequestSplit {
  std::string head;  // the message without its raw_input_contents fields, bytes as received
  std::string key;   // head without its id fields
  bool has_id = false;
  std::pair<size_t, size_t> id;                  // the last id's value: (offset, length)
  std::vector<std::pair<size_t, size_t>> raw;    // each raw_input_contents: (offset, length)
};

// Splits `message` into `out` (cleared first). False: declined (wire.py's _scan raises).
bool SplitInferRequest(const Chunks& message, RequestSplit* out);
// The same for a message in one piece.
bool SplitInferRequest(const unsigned char* data, size_t size, RequestSplit* out);

}  // namespace triton_mp

#endif  // TRITON_MP_NATIVE_REQUEST_SPLIT_H_
