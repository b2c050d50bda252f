// See known_answer.h.
#include "known_answer.h"

#include <grpc/slice.h>

#include <cstring>
#include <utility>

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

}  // namespace

void KnownAnswers::Teach(uint64_t lesson_id, AnswerHead head) {
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
        return;
      }
    }
  }
  if (kept.size() >= kHeadsPerLesson) kept.erase(kept.begin());
  kept.push_back(std::move(head));
}

const AnswerHead* KnownAnswers::HeadOf(uint64_t lesson_id, const AnswerResponse& r) const {
  auto it = heads_.find(lesson_id);
  if (it == heads_.end()) return nullptr;
  for (const auto& h : it->second) {
    if (SameForm(h, r)) return &h;
  }
  return nullptr;
}

bool KnownAnswers::Build(const AnswerRead& read, const std::vector<uint64_t>& lessons,
                         OutputSegments* segments, std::vector<grpc::Slice>* out,
                         uint64_t* bytes_out) const {
  out->clear();
  *bytes_out = 0;
  if (read.kind == AnswerKind::kOther || lessons.size() != read.responses.size() ||
      !OwnBlocks(read)) {
    return false;
  }
  std::vector<const AnswerHead*> heads(read.responses.size());
  std::vector<const unsigned char*> views;
  for (size_t i = 0; i < read.responses.size(); ++i) {
    const AnswerResponse& r = read.responses[i];
    if (!Plain(r) || (heads[i] = HeadOf(lessons[i], r)) == nullptr) return false;
    for (const auto& o : r.outputs) {
      if (o.region_id != 0) {
        views.push_back(nullptr);  // NOTE: written in the client's region: no bytes here
        continue;
      }
      const unsigned char* v = segments->View(o.segment, o.offset, o.nbytes);
      if (v == nullptr) return false;
      views.push_back(v);
    }
  }
  size_t at = 0;
  for (size_t i = 0; i < read.responses.size(); ++i) {
    const AnswerResponse& r = read.responses[i];
    size_t total = heads[i]->head.size();
    for (const auto& o : r.outputs) {
      total += o.region_id != 0 ? 2 : 1 + VarintBytes(o.nbytes) + o.nbytes;
    }
    grpc_slice slice = grpc_slice_malloc(total);
    unsigned char* p = GRPC_SLICE_START_PTR(slice);
    std::memcpy(p, heads[i]->head.data(), heads[i]->head.size());
    p += heads[i]->head.size();
    for (const auto& o : r.outputs) {
      *p++ = kRawOutputTag;
      if (o.region_id != 0) {
        *p++ = 0;  // NOTE: an empty entry, as infer_response_parts writes for a region
        ++at;
        continue;
      }
      p = PutVarint(p, o.nbytes);
      if (o.nbytes != 0) std::memcpy(p, views[at], o.nbytes);
      p += o.nbytes;
      ++at;
      *bytes_out += o.nbytes;
    }
    out->emplace_back(slice, grpc::Slice::STEAL_REF);
  }
  return true;
}

size_t KnownAnswers::FreeOutputs(const AnswerRead& read, OutputSegments* segments) const {
  size_t refused = 0;
  for (const auto& r : read.responses) {
    if (r.has_block && !segments->Free(r.block.segment, r.block.offset, r.block.generation)) {
      ++refused;
    }
  }
  for (const auto& h : read.handoffs) {
    if (!segments->Free(h.block.segment, h.block.offset, h.block.generation)) ++refused;
  }
  return refused;
}

}  // namespace triton_mp
