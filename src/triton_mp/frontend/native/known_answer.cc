// See known_answer.h.
#include "known_answer.h"

#include <grpc/slice.h>

#include <cstring>
#include <memory>
#include <utility>

#include "input_arena.h"

namespace triton_mp {

namespace {

constexpr unsigned char kRawOutputTag = (6 << 3) | 2;  // raw_output_contents, length-delimited

size_t VarintBytes(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

unsigned char* PutVarint(unsigned char* p, uint64_t v) {
  while (v >= 0x80) {
    *p++ = static_cast<unsigned char>(v | 0x80);
    v >>= 7;
  }
  *p++ = static_cast<unsigned char>(v);
  return p;
}

bool SameForm(const AnswerHead& h, const AnswerResponse& r) {
  if (h.version != r.version || h.parameters_json != r.parameters_json ||
      h.outputs.size() != r.outputs.size()) {
    return false;
  }
  for (size_t i = 0; i < h.outputs.size(); ++i) {
    const OutputForm& f = h.outputs[i];
    const AnswerOutput& o = r.outputs[i];
    if (f.name != o.name || f.datatype != o.datatype || f.shape != o.shape) return false;
  }
  return true;
}

bool SameBlock(const AnswerBlock& a, const AnswerBlock& b) {
  return a.segment == b.segment && a.offset == b.offset && a.generation == b.generation;
}

bool Plain(const AnswerResponse& r) {
  return !(r.has_error || !r.final || r.empty || r.traced || r.extra_blocks != 0 ||
           r.handoffs != 0);
}

// Whether the blocks of `read` are ones this side frees alone (header comment).
bool OwnBlocks(const AnswerRead& read) {
  if (read.kind == AnswerKind::kResponse) return read.responses[0].shared_blocks.empty();
  if (read.kind != AnswerKind::kBatch || read.handoffs.size() > 1) return false;
  uint64_t naming = 0;
  for (const auto& r : read.responses) {
    if (r.has_block || r.shared_blocks.size() > 1) return false;
    if (r.shared_blocks.empty()) continue;
    if (read.handoffs.empty() || !SameBlock(r.shared_blocks[0], read.handoffs[0].block)) {
      return false;
    }
    ++naming;
  }
  return read.handoffs.empty() || read.handoffs[0].uses == naming;
}

// A varint at head[*at] (moved past it). False: it runs past the end or over 10 bytes.
bool ReadVarint(const std::string& head, size_t* at, uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (*at >= head.size()) return false;
    const auto byte = static_cast<unsigned char>(head[(*at)++]);
    if (shift < 64) *value |= static_cast<uint64_t>(byte & 0x7F) << shift;
    if (byte < 0x80) return true;
  }
  return false;
}

constexpr uint64_t kResponseIdField = 3;  // ModelInferResponse.id
constexpr unsigned char kResponseIdTag = (kResponseIdField << 3) | 2;

}  // namespace

bool HeadWithoutId(const std::string& head, std::string* out, size_t* id_at) {
  out->clear();
  bool placed = false;
  size_t at = 0;
  while (at < head.size()) {
    const size_t start = at;
    uint64_t key;
    uint64_t value;
    if (!ReadVarint(head, &at, &key)) return false;
    const uint64_t wire = key & 7;
    if (wire == 0) {
      if (!ReadVarint(head, &at, &value)) return false;
    } else if (wire == 2) {
      if (!ReadVarint(head, &at, &value) || value > head.size() - at) return false;
      at += value;
    } else if (wire == 1 || wire == 5) {
      const size_t n = wire == 1 ? 8 : 4;
      if (n > head.size() - at) return false;
      at += n;
    } else {
      return false;
    }
    const uint64_t field = key >> 3;
    if (!placed && field >= kResponseIdField) {
      *id_at = out->size();
      placed = true;
    }
    if (field != kResponseIdField) out->append(head, start, at - start);
  }
  if (!placed) *id_at = out->size();
  return true;
}

bool KnownAnswers::Teach(uint64_t lesson_id, AnswerHead head) {
  std::string bare;
  if (!HeadWithoutId(head.head, &bare, &head.id_at)) return false;
  head.head = std::move(bare);
  if (heads_.size() >= kAnswerLessonsKept && heads_.find(lesson_id) == heads_.end()) {
    heads_.clear();
  }
  std::vector<AnswerHead>& kept = heads_[lesson_id];
  for (auto& h : kept) {
    if (h.version == head.version && h.parameters_json == head.parameters_json &&
        h.outputs.size() == head.outputs.size()) {
      bool same = true;
      for (size_t i = 0; same && i < h.outputs.size(); ++i) {
        same = h.outputs[i].name == head.outputs[i].name &&
               h.outputs[i].datatype == head.outputs[i].datatype &&
               h.outputs[i].shape == head.outputs[i].shape;
      }
      if (same) {
        h = std::move(head);
        return true;
      }
    }
  }
  if (kept.size() >= kHeadsPerLesson) kept.erase(kept.begin());
  kept.push_back(std::move(head));
  return true;
}

const AnswerHead* KnownAnswers::HeadOf(uint64_t lesson_id, const AnswerResponse& r) const {
  auto it = heads_.find(lesson_id);
  if (it == heads_.end()) return nullptr;
  for (const auto& h : it->second) {
    if (SameForm(h, r)) return &h;
  }
  return nullptr;
}

namespace {

// The hold of `block` (its header at `offset` of `mapping`), made (unarmed) into `holds` on
// first use, when `o`'s bytes lie wholly in its payload; nullptr: they do not.
// An input block's hold (HeldBlock input_bytes) when `limit` is not 0, which the input
// blocks held with it must stay under (known_answer.h InputBlock hold_limit).
std::shared_ptr<HeldBlock> HoldIn(const std::shared_ptr<const SegmentMapping>& mapping,
                                  uint64_t offset, uint64_t generation, uint64_t limit,
                                  const AnswerOutput& o,
                                  std::vector<std::shared_ptr<HeldBlock>>* holds) {
  const uint64_t payload = mapping->BlockPayload(offset);
  const uint64_t start = offset + kArenaHeaderBytes;
  if (payload == 0 || o.offset < start || o.offset - start > payload ||
      o.nbytes > payload - (o.offset - start)) {
    return nullptr;
  }
  for (const auto& h : *holds) {
    if (&h->mapping() == mapping.get() && h->offset() == offset) return h;
  }
  const uint64_t input_bytes = limit == 0 ? 0 : payload + kArenaHeaderBytes;
  if (limit != 0) {
    uint64_t held = HeldBlock::input_bytes_held() + input_bytes;
    for (const auto& h : *holds) {
      if (h->input()) held += h->mapping().BlockPayload(h->offset()) + kArenaHeaderBytes;
    }
    if (held > limit) return nullptr;  // NOTE: unread replies hold enough: copied
  }
  holds->push_back(std::make_shared<HeldBlock>(mapping, offset, generation, input_bytes));
  return holds->back();
}

// The hold of the block of `read` that holds `o`'s bytes whole (a response's own block, or a
// block the batch hands over; or `input`, the call's input block, when not null), made
// (unarmed) into `holds` on first use; nullptr: none does.
std::shared_ptr<HeldBlock> HoldOf(const AnswerRead& read, const AnswerResponse& r,
                                  const AnswerOutput& o, OutputSegments* segments,
                                  std::vector<std::shared_ptr<HeldBlock>>* holds,
                                  const InputBlock* input) {
  if (input != nullptr && !input->segment.empty() && o.segment == input->segment) {
    // NOTE: answered from the call's input block (answer_writer.cc PlanAlias); no output
    // block of a worker lies in this process's input arena
    const auto& mapping = segments->Get(o.segment);
    if (!mapping || input->hold_limit == 0) return nullptr;
    return HoldIn(mapping, input->offset, input->generation, input->hold_limit, o, holds);
  }
  std::vector<const AnswerBlock*> blocks;
  if (r.has_block) blocks.push_back(&r.block);
  for (const auto& h : read.handoffs) blocks.push_back(&h.block);
  for (const AnswerBlock* b : blocks) {
    if (b->segment != o.segment) continue;
    const auto& mapping = segments->Get(b->segment);
    if (!mapping) return nullptr;
    const uint64_t payload = mapping->BlockPayload(b->offset);
    const uint64_t start = b->offset + kArenaHeaderBytes;
    if (payload == 0 || o.offset < start || o.offset - start > payload ||
        o.nbytes > payload - (o.offset - start)) {
      continue;
    }
    if (!mapping->MayHold(b->offset)) return nullptr;  // NOTE: its worker's arenas are full
    return HoldIn(mapping, b->offset, b->generation, 0, o, holds);
  }
  return nullptr;
}

// Writes one response's slices: runs of copied bytes, each in one slice, between the
// outputs sent in place.
class ResponseWriter {
 public:
  explicit ResponseWriter(std::vector<grpc::Slice>* slices) : slices_(slices) {}
  ResponseWriter(const ResponseWriter&) = delete;
  ResponseWriter& operator=(const ResponseWriter&) = delete;
  ~ResponseWriter() { grpc_slice_unref(run_); }

  // Starts a run of `n` bytes (the previous one must be full).
  void Begin(size_t n) {
    grpc_slice_unref(run_);
    run_ = grpc_slice_malloc(n);
    p_ = GRPC_SLICE_START_PTR(run_);
  }
  void Put(const void* data, size_t n) {
    if (n != 0) std::memcpy(p_, data, n);
    p_ += n;
  }
  void Id(const std::string& id) {
    *p_++ = kResponseIdTag;
    p_ = PutVarint(p_, id.size());
    Put(id.data(), id.size());
  }
  void Tag(uint64_t nbytes) {
    *p_++ = kRawOutputTag;
    p_ = PutVarint(p_, nbytes);
  }
  // Ends the run (kept when not empty).
  void End() {
    if (GRPC_SLICE_LENGTH(run_) != 0) {
      slices_->emplace_back(run_, grpc::Slice::STEAL_REF);
      run_ = grpc_empty_slice();
    }
  }
  void Add(grpc::Slice slice) { slices_->push_back(std::move(slice)); }

 private:
  std::vector<grpc::Slice>* slices_;
  grpc_slice run_ = grpc_empty_slice();
  unsigned char* p_ = nullptr;
};

}  // namespace

bool KnownAnswers::Build(const AnswerRead& read, const std::vector<uint64_t>& lessons,
                         const std::vector<std::string>* ids,
                         OutputSegments* segments, std::vector<grpc::ByteBuffer>* out,
                         BuiltBytes* bytes, std::vector<std::shared_ptr<HeldBlock>>* holds,
                         const std::vector<InputBlock>* inputs) const {
  out->clear();
  *bytes = BuiltBytes{};
  if (holds != nullptr) holds->clear();
  if (read.kind == AnswerKind::kOther || lessons.size() != read.responses.size() ||
      (ids != nullptr && ids->size() != lessons.size()) ||
      (inputs != nullptr && inputs->size() != lessons.size()) || !OwnBlocks(read)) {
    return false;
  }
  // NOTE: sized up front: a grpc::ByteBuffer is copied, not moved, when a vector grows
  out->reserve(read.responses.size());
  size_t outputs = 0;
  for (const auto& r : read.responses) outputs += r.outputs.size();
  std::vector<const AnswerHead*> heads(read.responses.size());
  std::vector<const unsigned char*> views;
  std::vector<std::shared_ptr<HeldBlock>> held;  // per output: its hold when sent in place
  views.reserve(outputs);
  held.reserve(outputs);
  for (size_t i = 0; i < read.responses.size(); ++i) {
    const AnswerResponse& r = read.responses[i];
    if (!Plain(r) || (heads[i] = HeadOf(lessons[i], r)) == nullptr) return false;
    for (const auto& o : r.outputs) {
      if (o.region_id != 0) {
        views.push_back(nullptr);  // NOTE: written in the client's region: no bytes here
        held.push_back(nullptr);
        continue;
      }
      const unsigned char* v = segments->View(o.segment, o.offset, o.nbytes);
      if (v == nullptr) return false;
      views.push_back(v);
      held.push_back(holds != nullptr && o.nbytes >= kInPlaceMinBytes
                         ? HoldOf(read, r, o, segments, holds,
                                  inputs != nullptr ? &(*inputs)[i] : nullptr)
                         : nullptr);
    }
  }
  size_t at = 0;
  std::vector<grpc::Slice> slices;
  std::vector<size_t> runs;
  for (size_t i = 0; i < read.responses.size(); ++i) {
    const AnswerResponse& r = read.responses[i];
    // NOTE: the runs' sizes first: the head, then each output's tag and length, and its
    // bytes unless sent in place (which ends a run); an output in a client's region is an
    // empty entry
    const AnswerHead& head = *heads[i];
    static const std::string kNoId;
    const std::string& id = ids != nullptr ? (*ids)[i] : kNoId;
    const size_t id_field = id.empty() ? 0 : 1 + VarintBytes(id.size()) + id.size();
    runs.assign(1, head.head.size() + id_field);
    for (size_t k = 0; k < r.outputs.size(); ++k) {
      const uint64_t n = r.outputs[k].region_id != 0 ? 0 : r.outputs[k].nbytes;
      runs.back() += 1 + VarintBytes(n);
      if (held[at + k]) {
        runs.push_back(0);
      } else {
        runs.back() += n;
      }
    }
    slices.clear();
    ResponseWriter w(&slices);
    size_t run = 0;
    w.Begin(runs[run]);
    w.Put(head.head.data(), head.id_at);
    if (!id.empty()) w.Id(id);  // NOTE: where Python's serializer writes it (field order)
    w.Put(head.head.data() + head.id_at, head.head.size() - head.id_at);
    for (const auto& o : r.outputs) {
      if (o.region_id != 0) {
        w.Tag(0);  // NOTE: an empty entry, as infer_response_parts writes for a region
        ++at;
        continue;
      }
      w.Tag(o.nbytes);
      if (held[at]) {
        w.End();
        w.Add(HeldBlock::SliceOf(held[at], views[at], o.nbytes));
        w.Begin(runs[++run]);
        bytes->in_place += o.nbytes;
      } else {
        w.Put(views[at], o.nbytes);
        bytes->copied += o.nbytes;
      }
      ++at;
    }
    w.End();
    out->emplace_back(slices.data(), slices.size());
  }
  return true;
}

size_t KnownAnswers::FreeOutputs(const AnswerRead& read, OutputSegments* segments,
                                 const std::vector<std::shared_ptr<HeldBlock>>& holds) const {
  auto free = [&](const AnswerBlock& b) {
    const auto& mapping = segments->Get(b.segment);
    for (const auto& h : holds) {
      if (mapping && &h->mapping() == mapping.get() && h->offset() == b.offset) return true;
    }
    return mapping && mapping->Free(b.offset, b.generation);
  };
  size_t refused = 0;
  for (const auto& r : read.responses) {
    if (r.has_block && !free(r.block)) ++refused;
  }
  for (const auto& h : read.handoffs) {
    if (!free(h.block)) ++refused;
  }
  return refused;
}

}  // namespace triton_mp
