// See answer_reader.h. The msgpack subset read: nil, bool, every int form, str8/16/32 and
// fixstr, array16/32 and fixarray; values that are only skipped (an error, a trace) may also
// hold maps, bin, floats and ext. Nesting is bounded (kMaxDepth) so no input recurses deep.
#include "answer_reader.h"

#include <cstring>

namespace triton_mp {

namespace {

constexpr int kMaxDepth = 32;
constexpr uint32_t kResponseFields = 13;  // InferResponse, tag included
constexpr uint32_t kBatchFields = 3;      // AnswerBatch, tag included
constexpr uint32_t kTensorFields = 7;     // TensorRef
constexpr uint32_t kBlockFields = 3;      // BlockRef
constexpr uint32_t kHandoffFields = 2;    // Handoff

class Cursor {
 public:
  Cursor(const unsigned char* data, size_t size) : p_(data), end_(data + size) {}
  bool done() const { return p_ == end_; }

  bool Nil() {
    if (p_ < end_ && *p_ == 0xc0) {
      ++p_;
      return true;
    }
    return false;
  }

  bool Bool(bool* out) {
    if (p_ >= end_ || (*p_ != 0xc2 && *p_ != 0xc3)) return false;
    *out = *p_++ == 0xc3;
    return true;
  }

  // Any msgpack int: (negative, magnitude bits). `neg` true: `*v` holds the int64 value.
  bool Int(bool* neg, uint64_t* v) {
    if (p_ >= end_) return false;
    const unsigned char b = *p_++;
    *neg = false;
    if (b <= 0x7f) return (*v = b), true;
    if (b >= 0xe0) return (*neg = true), (*v = static_cast<uint64_t>(int64_t{int8_t(b)})), true;
    switch (b) {
      case 0xcc: return Big(1, false, neg, v);
      case 0xcd: return Big(2, false, neg, v);
      case 0xce: return Big(4, false, neg, v);
      case 0xcf: return Big(8, false, neg, v);
      case 0xd0: return Big(1, true, neg, v);
      case 0xd1: return Big(2, true, neg, v);
      case 0xd2: return Big(4, true, neg, v);
      case 0xd3: return Big(8, true, neg, v);
      default: return false;
    }
  }

  bool Unsigned(uint64_t* v) {
    bool neg;
    return Int(&neg, v) && !neg;
  }

  bool Signed(int64_t* v) {
    bool neg;
    uint64_t u;
    if (!Int(&neg, &u) || (!neg && u > static_cast<uint64_t>(INT64_MAX))) return false;
    *v = static_cast<int64_t>(u);
    return true;
  }

  bool Str(std::string_view* out) {
    if (p_ >= end_) return false;
    const unsigned char b = *p_++;
    uint64_t n;
    if ((b & 0xe0) == 0xa0) {
      n = b & 0x1f;
    } else if (b == 0xd9 || b == 0xda || b == 0xdb) {
      if (!Length(b == 0xd9 ? 1 : b == 0xda ? 2 : 4, &n)) return false;
    } else {
      return false;
    }
    if (n > static_cast<uint64_t>(end_ - p_)) return false;
    *out = std::string_view(reinterpret_cast<const char*>(p_), n);
    p_ += n;
    return true;
  }

  bool Array(uint32_t* n) {
    if (p_ >= end_) return false;
    const unsigned char b = *p_++;
    uint64_t len;
    if ((b & 0xf0) == 0x90) {
      len = b & 0x0f;
    } else if (b == 0xdc || b == 0xdd) {
      if (!Length(b == 0xdc ? 2 : 4, &len)) return false;
    } else {
      return false;
    }
    // NOTE: every element takes at least one byte: a count past the end is a lie
    if (len > static_cast<uint64_t>(end_ - p_)) return false;
    *n = static_cast<uint32_t>(len);
    return true;
  }

  // Skips one value of any type.
  bool Skip(int depth = 0) {
    if (p_ >= end_ || depth > kMaxDepth) return false;
    const unsigned char b = *p_;
    if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) return ++p_, true;
    uint64_t n = 0;
    if ((b & 0xe0) == 0xa0 || b == 0xd9 || b == 0xda || b == 0xdb) {
      std::string_view s;
      return Str(&s);
    }
    if ((b & 0xf0) == 0x90 || b == 0xdc || b == 0xdd) {
      uint32_t items;
      if (!Array(&items)) return false;
      for (uint32_t i = 0; i < items; ++i) {
        if (!Skip(depth + 1)) return false;
      }
      return true;
    }
    ++p_;
    if ((b & 0xf0) == 0x80 || b == 0xde || b == 0xdf) {
      if ((b & 0xf0) == 0x80) {
        n = b & 0x0f;
      } else if (!Length(b == 0xde ? 2 : 4, &n)) {
        return false;
      }
      if (n > static_cast<uint64_t>(end_ - p_)) return false;
      for (uint64_t i = 0; i < 2 * n; ++i) {
        if (!Skip(depth + 1)) return false;
      }
      return true;
    }
    switch (b) {
      case 0xcc: case 0xd0: return Ahead(1);
      case 0xcd: case 0xd1: return Ahead(2);
      case 0xce: case 0xd2: case 0xca: return Ahead(4);
      case 0xcf: case 0xd3: case 0xcb: return Ahead(8);
      case 0xc4: case 0xc5: case 0xc6:
        return Length(b == 0xc4 ? 1 : b == 0xc5 ? 2 : 4, &n) && Ahead(n);
      case 0xd4: return Ahead(2);
      case 0xd5: return Ahead(3);
      case 0xd6: return Ahead(5);
      case 0xd7: return Ahead(9);
      case 0xd8: return Ahead(17);
      case 0xc7: case 0xc8: case 0xc9:
        return Length(b == 0xc7 ? 1 : b == 0xc8 ? 2 : 4, &n) && n < UINT64_MAX && Ahead(n + 1);
      default: return false;  // 0xc1: never used
    }
  }

 private:
  bool Ahead(uint64_t n) {
    if (n > static_cast<uint64_t>(end_ - p_)) return false;
    p_ += n;
    return true;
  }

  // A big-endian unsigned length of `bytes` bytes.
  bool Length(int bytes, uint64_t* n) {
    if (static_cast<ptrdiff_t>(bytes) > end_ - p_) return false;
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v = (v << 8) | *p_++;
    *n = v;
    return true;
  }

  bool Big(int bytes, bool is_signed, bool* neg, uint64_t* v) {
    uint64_t u;
    if (!Length(bytes, &u)) return false;
    if (is_signed) {
      const int shift = 64 - 8 * bytes;
      const int64_t s = static_cast<int64_t>(u << shift) >> shift;  // sign-extended
      *neg = s < 0;
      *v = static_cast<uint64_t>(s);
    } else {
      *v = u;
    }
    return true;
  }

  const unsigned char* p_;
  const unsigned char* end_;
};

bool Tag(Cursor* c, uint32_t fields, uint32_t want, std::string_view name) {
  std::string_view tag;
  return fields == want && c->Str(&tag) && tag == name;
}

bool ReadBlock(Cursor* c, AnswerBlock* out) {
  uint32_t n;
  return c->Array(&n) && n == kBlockFields && c->Str(&out->segment) &&
         c->Unsigned(&out->offset) && c->Unsigned(&out->generation);
}

bool ReadBlocks(Cursor* c, std::vector<AnswerBlock>* out) {
  uint32_t n;
  if (!c->Array(&n)) return false;
  out->resize(n);
  for (auto& b : *out) {
    if (!ReadBlock(c, &b)) return false;
  }
  return true;
}

bool ReadOutput(Cursor* c, AnswerOutput* out) {
  uint32_t n, dims;
  if (!c->Array(&n) || n != kTensorFields || !c->Str(&out->name) || !c->Str(&out->datatype) ||
      !c->Array(&dims)) {
    return false;
  }
  out->shape.resize(dims);
  for (auto& d : out->shape) {
    if (!c->Signed(&d)) return false;
  }
  return c->Str(&out->segment) && c->Unsigned(&out->offset) && c->Unsigned(&out->nbytes) &&
         c->Unsigned(&out->region_id);
}

// Skips a list, counting its items.
bool SkipList(Cursor* c, size_t* count) {
  uint32_t n;
  if (!c->Array(&n)) return false;
  for (uint32_t i = 0; i < n; ++i) {
    if (!c->Skip()) return false;
  }
  *count = n;
  return true;
}

// An InferResponse whose array header (`fields` elements) was read.
bool ReadResponseBody(Cursor* c, uint32_t fields, AnswerResponse* r) {
  uint32_t n;
  if (!Tag(c, fields, kResponseFields, "response") || !c->Unsigned(&r->request_id) ||
      !c->Signed(&r->version) || !c->Array(&n)) {
    return false;
  }
  r->outputs.resize(n);
  for (auto& o : r->outputs) {
    if (!ReadOutput(c, &o)) return false;
  }
  r->has_block = !c->Nil();
  if (!r->has_block) r->block = AnswerBlock{};
  if (r->has_block && !ReadBlock(c, &r->block)) return false;
  r->has_error = !c->Nil();
  if (r->has_error && !c->Skip()) return false;
  if (!c->Bool(&r->final) || !c->Bool(&r->empty)) return false;
  r->traced = !c->Nil();
  if (r->traced && !c->Skip()) return false;
  return SkipList(c, &r->extra_blocks) && c->Str(&r->parameters_json) &&
         ReadBlocks(c, &r->shared_blocks) && SkipList(c, &r->handoffs);
}

bool ReadBatchBody(Cursor* c, uint32_t fields, AnswerRead* out) {
  uint32_t n;
  if (!Tag(c, fields, kBatchFields, "answers") || !c->Array(&n)) return false;
  out->responses.resize(n);
  for (auto& r : out->responses) {
    uint32_t inner;
    if (!c->Array(&inner) || !ReadResponseBody(c, inner, &r)) return false;
  }
  if (!c->Array(&n)) return false;
  out->handoffs.resize(n);
  for (auto& h : out->handoffs) {
    uint32_t inner;
    if (!c->Array(&inner) || inner != kHandoffFields || !ReadBlock(c, &h.block) ||
        !c->Unsigned(&h.uses)) {
      return false;
    }
  }
  return true;
}

}  // namespace

AnswerKind ReadAnswer(const unsigned char* data, size_t size, AnswerRead* out) {
  // NOTE: `out`'s responses are resized, not cleared, first: every field is read anew (a
  // block only when present), and an AnswerRead read into again keeps its vectors' buffers
  // (the answer thread's: no allocation per response once grown)
  out->kind = AnswerKind::kOther;
  Cursor c(data, size);
  uint32_t fields = 0;  // NOTE: stays 0 (no kind) when the record is not an array
  bool ok = false;
  AnswerKind kind = AnswerKind::kOther;
  (void)c.Array(&fields);
  if (fields == kResponseFields) {
    out->handoffs.clear();
    out->responses.resize(1);
    ok = ReadResponseBody(&c, fields, &out->responses[0]);
    kind = AnswerKind::kResponse;
  } else if (fields == kBatchFields) {
    ok = ReadBatchBody(&c, fields, out);
    kind = AnswerKind::kBatch;
  }
  if (!ok || !c.done()) {
    out->responses.clear();
    out->handoffs.clear();
    return AnswerKind::kOther;
  }
  out->kind = kind;
  return kind;
}

}  // namespace triton_mp
