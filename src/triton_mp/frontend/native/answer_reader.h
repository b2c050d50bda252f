// A worker's answer as it lies in a frontend's inbox ring, read in place without Python: the
// msgpack of an InferResponse or an AnswerBatch (ipc/protocol/messages.py, encoded by
// ipc/recordio/codec.py `encode`: msgspec array_like structs, each a msgpack array whose
// first element is the struct's tag and whose other elements are every field in declaration
// order). The reader is strict: it says `kOther` for anything that is not one of these two
// in exactly that shape (another message, a binary record (first byte 0xC1), a field count
// that differs, a type it does not expect, bytes past the end), so a caller hands such a
// record to Python, which decodes it as it always did. It decides nothing else: whether an
// answer can be served without Python is the caller's question (error, trace, extra blocks
// and handoffs are reported, not judged).
//
// Python twins: ipc/protocol/messages.py (InferResponse, AnswerBatch, TensorRef, BlockRef,
// Handoff, ErrorInfo, RequestFailed), ipc/recordio/codec.py (the encoder). The answer record
// format is frozen: a field added to one of those structs makes this reader say kOther for
// every answer (safe: Python serves them) until it is taught the new count.
#ifndef TRITON_MP_FRONTEND_NATIVE_ANSWER_READER_H_
#define TRITON_MP_FRONTEND_NATIVE_ANSWER_READER_H_

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace triton_mp {

// A BlockRef: (segment, offset of the block header, generation).
struct AnswerBlock {
  std::string_view segment;
  uint64_t offset = 0;
  uint64_t generation = 0;
};

// A TensorRef: an output's bytes in shared memory (an arena, or a client's region when
// region_id != 0).
struct AnswerOutput {
  std::string_view name;
  std::string_view datatype;
  std::vector<int64_t> shape;
  std::string_view segment;
  uint64_t offset = 0;
  uint64_t nbytes = 0;
  uint64_t region_id = 0;
};

// One InferResponse.
struct AnswerResponse {
  uint64_t request_id = 0;
  int64_t version = 0;
  std::vector<AnswerOutput> outputs;
  bool has_block = false;
  AnswerBlock block;              // when has_block
  bool has_error = false;         // ErrorInfo present (its fields are not read)
  bool final = true;
  bool empty = false;
  bool traced = false;            // a TraceRecord present (not read)
  size_t extra_blocks = 0;        // how many (not read)
  std::string_view parameters_json;
  std::vector<AnswerBlock> shared_blocks;
  size_t handoffs = 0;            // a response's own handoffs (not read)
};

// A Handoff of an AnswerBatch: its block, freed after `uses` responses naming it.
struct AnswerHandoff {
  AnswerBlock block;
  uint64_t uses = 0;
};

enum class AnswerKind : int {
  kOther = 0,     // not read: Python decodes it
  kResponse = 1,  // one InferResponse (responses has one)
  kBatch = 2,     // an AnswerBatch
};

struct AnswerRead {
  AnswerKind kind = AnswerKind::kOther;
  std::vector<AnswerResponse> responses;
  std::vector<AnswerHandoff> handoffs;  // kBatch's
};

// Reads `data` (`size` bytes) into `out` (cleared first); out->kind says what it was. Every
// string_view points into `data`.
AnswerKind ReadAnswer(const unsigned char* data, size_t size, AnswerRead* out);

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_ANSWER_READER_H_
