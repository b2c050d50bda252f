// See request_split.h. Each step mirrors wire.py's _scan, which is the rule: where the two
// could differ (a varint past 64 bits, a size past the end), this one declines.
#include "request_split.h"

#include <cstdint>

namespace triton_mp {
namespace {

constexpr uint64_t kRawInputField = 7;  // ModelInferRequest.raw_input_contents
constexpr uint64_t kIdField = 3;        // ModelInferRequest.id

// A base-128 varint at *pos (advanced past it). False when it runs past `end` or over 10
// bytes (_varint raises). *wide: the value does not fit 64 bits (Python keeps it whole: it
// then names no field this scanner looks for, and no size that fits).
bool Varint(const unsigned char* data, size_t end, size_t* pos, uint64_t* value, bool* wide) {
  *value = 0;
  *wide = false;
  for (int shift = 0;; shift += 7) {
    if (*pos >= end || shift > 63) return false;
    uint64_t byte = data[(*pos)++];
    uint64_t bits = byte & 0x7F;
    if (shift == 63 && bits > 1) *wide = true;
    *value |= bits << shift;
    if (byte < 0x80) return true;
  }
}

}  // namespace

bool SplitInferRequest(const unsigned char* data, size_t size, RequestSplit* out) {
  out->head.clear();
  out->key.clear();
  out->raw.clear();
  out->has_id = false;
  // NOTE: the pieces kept, as (offset, length, is an id field), in order.
  std::vector<std::pair<std::pair<size_t, size_t>, bool>> rest;
  size_t kept_from = 0;
  size_t pos = 0;
  while (pos < size) {
    size_t start = pos;
    uint64_t key;
    bool wide_key;
    if (!Varint(data, size, &pos, &key, &wide_key)) return false;
    uint64_t wire_type = key & 7;
    if (wire_type == 2) {
      uint64_t length;
      bool wide_length;
      if (!Varint(data, size, &pos, &length, &wide_length)) return false;
      if (wide_length || length > size - pos) return false;  // runs past the end
      uint64_t field = key >> 3;
      if (!wide_key && (field == kRawInputField || field == kIdField)) {
        if (start > kept_from) rest.push_back({{kept_from, start - kept_from}, false});
        if (field == kRawInputField) {
          out->raw.emplace_back(pos, length);
        } else {
          rest.push_back({{start, pos + length - start}, true});
          out->has_id = true;
          out->id = {pos, length};
        }
        kept_from = pos + length;
      }
      pos += length;
    } else if (wire_type == 0) {
      uint64_t ignored;
      bool wide;
      if (!Varint(data, size, &pos, &ignored, &wide)) return false;
    } else if (wire_type == 1 || wire_type == 5) {
      size_t n = wire_type == 1 ? 8 : 4;
      if (n > size - pos) return false;
      pos += n;
    } else {
      return false;  // a group or an unknown wire type
    }
  }
  if (kept_from < size) rest.push_back({{kept_from, size - kept_from}, false});
  const char* chars = reinterpret_cast<const char*>(data);
  for (const auto& piece : rest) {
    out->head.append(chars + piece.first.first, piece.first.second);
    if (!piece.second) out->key.append(chars + piece.first.first, piece.first.second);
  }
  return true;
}

}  // namespace triton_mp
