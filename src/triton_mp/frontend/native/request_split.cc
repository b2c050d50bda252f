// See request_split.h. Each step mirrors wire.py's _scan, which is the rule: where the two
// could differ (a varint past 64 bits, a size past the end), this one declines.
#include "request_split.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace triton_mp {

void Chunks::Add(const unsigned char* data, size_t size) {
  if (size == 0) return;
  pieces_.emplace_back(data, size);
  starts_.push_back(size_);
  size_ += size;
}

size_t Chunks::PieceAt(size_t offset) const {
  auto after = std::upper_bound(starts_.begin(), starts_.end(), offset);
  return static_cast<size_t>(after - starts_.begin()) - 1;
}

bool Chunks::Copy(size_t offset, size_t n, unsigned char* dst) const {
  if (offset > size_ || n > size_ - offset) return false;
  if (n == 0) return true;
  size_t i = PieceAt(offset);
  size_t in = offset - starts_[i];
  while (n > 0) {
    size_t take = std::min(n, pieces_[i].second - in);
    std::memcpy(dst, pieces_[i].first + in, take);
    dst += take;
    n -= take;
    ++i;
    in = 0;
  }
  return true;
}

void Chunks::Append(size_t offset, size_t n, std::string* out) const {
  if (n == 0) return;
  size_t i = PieceAt(offset);
  size_t in = offset - starts_[i];
  while (n > 0) {
    size_t take = std::min(n, pieces_[i].second - in);
    out->append(reinterpret_cast<const char*>(pieces_[i].first + in), take);
    n -= take;
    ++i;
    in = 0;
  }
}

namespace {

constexpr uint64_t kRawInputField = 7;  // ModelInferRequest.raw_input_contents
constexpr uint64_t kIdField = 3;        // ModelInferRequest.id

// Reads a message in pieces byte by byte, and skips over field values.
class Reader {
 public:
  explicit Reader(const Chunks& message) : message_(message) {}

  size_t pos() const { return pos_; }

  // The next byte, in *byte. False at the end.
  bool Next(uint64_t* byte) {
    if (pos_ >= message_.size()) return false;
    while (in_ >= message_.piece_size(piece_)) {
      ++piece_;
      in_ = 0;
    }
    *byte = message_.piece_data(piece_)[in_++];
    ++pos_;
    return true;
  }

  // Moves `n` bytes on (n <= the bytes left).
  void Skip(size_t n) {
    pos_ += n;
    if (n == 0 || pos_ >= message_.size()) return;  // NOTE: Next checks pos_ first
    piece_ = message_.PieceAt(pos_);
    in_ = pos_ - message_.piece_start(piece_);
  }

 private:
  const Chunks& message_;
  size_t pos_ = 0;
  size_t piece_ = 0;  // the piece Next reads from, at its byte in_
  size_t in_ = 0;
};

// A base-128 varint (the reader advanced past it). False when it runs past the end or over
// 10 bytes (_varint raises). *wide: the value does not fit 64 bits (Python keeps it whole:
// it then names no field this scanner looks for, and no size that fits).
bool Varint(Reader* reader, uint64_t* value, bool* wide) {
  *value = 0;
  *wide = false;
  for (int shift = 0;; shift += 7) {
    uint64_t byte;
    if (shift > 63 || !reader->Next(&byte)) return false;
    uint64_t bits = byte & 0x7F;
    if (shift == 63 && bits > 1) *wide = true;
    *value |= bits << shift;
    if (byte < 0x80) return true;
  }
}

// One top-level field at the reader (advanced past it). False: declined. A raw entry or an
// id is noted in `out` and, with its (offset, length) from its key on, in *kept (an id
// marked true), after the bytes kept since *kept_from.
bool Field(Reader* reader, size_t size, RequestSplit* out,
           std::vector<std::pair<std::pair<size_t, size_t>, bool>>* kept, size_t* kept_from) {
  size_t start = reader->pos();
  uint64_t key;
  bool wide_key;
  if (!Varint(reader, &key, &wide_key)) return false;
  uint64_t wire_type = key & 7;
  if (wire_type == 2) {
    uint64_t length;
    bool wide_length;
    if (!Varint(reader, &length, &wide_length)) return false;
    size_t pos = reader->pos();
    if (wide_length || length > size - pos) return false;  // runs past the end
    uint64_t field = key >> 3;
    if (!wide_key && (field == kRawInputField || field == kIdField)) {
      if (start > *kept_from) kept->push_back({{*kept_from, start - *kept_from}, false});
      if (field == kRawInputField) {
        out->raw.emplace_back(pos, length);
      } else {
        kept->push_back({{start, pos + length - start}, true});
        out->has_id = true;
        out->id = {pos, length};
      }
      *kept_from = pos + length;
    }
    reader->Skip(length);
  } else if (wire_type == 0) {
    uint64_t ignored;
    bool wide;
    if (!Varint(reader, &ignored, &wide)) return false;
  } else if (wire_type == 1 || wire_type == 5) {
    size_t n = wire_type == 1 ? 8 : 4;
    if (n > size - reader->pos()) return false;
    reader->Skip(n);
  } else {
    return false;  // a group or an unknown wire type
  }
  return true;
}

}  // namespace

bool SplitInferRequest(const Chunks& message, RequestSplit* out) {
  out->head.clear();
  out->key.clear();
  out->raw.clear();
  out->has_id = false;
  // NOTE: the pieces kept, as (offset, length, is an id field), in order; this thread's
  // vector, whose buffer outlives the call (no allocation per request once grown)
  thread_local std::vector<std::pair<std::pair<size_t, size_t>, bool>> kept;
  kept.clear();
  size_t kept_from = 0;
  size_t size = message.size();
  Reader reader(message);
  while (reader.pos() < size) {
    if (!Field(&reader, size, out, &kept, &kept_from)) return false;
  }
  if (kept_from < size) kept.push_back({{kept_from, size - kept_from}, false});
  for (const auto& piece : kept) {
    message.Append(piece.first.first, piece.first.second, &out->head);
    if (!piece.second) message.Append(piece.first.first, piece.first.second, &out->key);
  }
  return true;
}

bool SplitInferRequest(const unsigned char* data, size_t size, RequestSplit* out) {
  Chunks message;
  message.Add(data, size);
  return SplitInferRequest(message, out);
}

}  // namespace triton_mp
