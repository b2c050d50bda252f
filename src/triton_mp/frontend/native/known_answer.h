// The answer of a known unary call the native side submitted (known_submit.h) and kept
// (Handoff's owned calls), built without Python: the worker's answer (answer_reader.h) is
// served here only when nothing in it asks for a Triton rule (below); the response is the
// head Python taught for the call's lesson and the answer's form (version, parameters, each
// output's name, datatype and shape: frontend/grpc/messages.py ResponseHeads.head, the
// serialized ModelInferResponse without its raw_output_contents) followed by each output's
// raw_output_contents field (frontend/grpc/wire.py infer_response_parts: tag 0x32, the
// length as a varint, the bytes copied once out of the worker's arena). An output of
// kInPlaceMinBytes or more that lies inside a block the answer hands over is not copied:
// the response references it in the arena (held_block.h: a slice that holds the block,
// freed when gRPC has sent it), so the bytes on the wire are the same.
//
// An output the worker answered from the call's own input block (workers/native/
// answer_writer.cc PlanAlias: its TensorRef names the input arena's segment, inside the
// call's block) is read there: given the call's InputBlock, such an output of
// kInPlaceMinBytes or more is sent in place holding the input block (held_block.h, input:
// freed when sent, instead of the caller's FreeInput) while the input blocks held so far
// stay under the InputBlock's hold_limit; otherwise, or when smaller, it is copied (before
// the caller frees the block). Without its InputBlock it is copied out of the segment as any.
//
// Served here: a plain InferResponse, or an AnswerBatch whose responses are all plain and
// whose one block (if any) every response names and the batch hands over with exactly that
// many uses. Plain: no error, final and not empty, no trace, no extra blocks, no handoffs of
// its own, and a head taught for its form. An output in a client's region (the worker wrote
// it there) gets an empty raw_output_contents entry, as Python's (infer_response_parts).
// Anything else is left to Python whole (nothing read is changed or freed).
//
// Python twins: frontend/native/known_calls.py (KnownCalls.answer / _response_parts: the
// same bytes), dispatch/pending.py (deliver: the block handed over by the batch, freed after
// its uses). Not thread-safe: used under known_answer_py.cc's lock, by the answer thread
// (answer_thread.h) or, where none runs, the Python thread's inbox pass.
#ifndef TRITON_MP_FRONTEND_NATIVE_KNOWN_ANSWER_H_
#define TRITON_MP_FRONTEND_NATIVE_KNOWN_ANSWER_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "answer_reader.h"
#include "held_block.h"
#include "output_segments.h"

namespace triton_mp {

// One output's form, as the head holds it.
struct OutputForm {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;
};

// A response head Python taught for one lesson and one answer form.
struct AnswerHead {
  int64_t version = 0;
  std::string parameters_json;
  std::vector<OutputForm> outputs;
  std::string head;  // the serialized ModelInferResponse without raw_output_contents and
                    // without its id (field 3): each call's own id is written in at id_at
  size_t id_at = 0;  // where Python's serializer writes the id: after fields 1-2
};

// `head` (a serialized ModelInferResponse head, as taught) without its id fields, and where
// the id goes (before the first field numbered over 3, or at the end). False: not a message
// this reads (nothing is kept).
bool HeadWithoutId(const std::string& head, std::string* out, size_t* id_at);

inline constexpr size_t kHeadsPerLesson = 4;     // the oldest goes first
inline constexpr size_t kAnswerLessonsKept = 4096;  // cleared whole when full
// An output this large is sent in place (header comment) when Build is given holds.
inline constexpr uint64_t kInPlaceMinBytes = 64 * 1024;

// A call's input block, from which the worker may have answered an output (header comment):
// its arena's segment (POSIX name, viewed: it outlives the Build; "": none known), the
// block's header offset and generation, and the most bytes of input blocks replies may hold
// at once (with this one: HeldBlock::input_bytes_held; 0: none is held, its outputs are
// copied).
struct InputBlock {
  std::string_view segment;
  uint64_t offset = 0;
  uint64_t generation = 0;
  uint64_t hold_limit = 0;
};

// The output bytes of what Build built.
struct BuiltBytes {
  uint64_t copied = 0;    // copied into the responses
  uint64_t in_place = 0;  // referenced in the workers' arenas
};

class KnownAnswers {
 public:
  // Keeps `head` for answers of calls submitted by lesson `lesson_id` (a form already kept
  // is replaced); its id is taken out (HeadWithoutId). False: the head does not parse.
  bool Teach(uint64_t lesson_id, AnswerHead head);
  void Clear() { heads_.clear(); }
  size_t lessons() const { return heads_.size(); }

  // Whether `read` can be served here (header comment), response i being a call of lesson
  // `lessons[i]` with the request id `(*ids)[i]` (UTF-8; ids null: every id empty): then
  // `out` holds each response's serialized ModelInferResponse and
  // `bytes` its output bytes. With `holds`, large outputs are sent in place and `holds` gets
  // the blocks they hold (unarmed: the caller arms them once the answer is committed;
  // dropped unarmed, they free nothing); without, every byte is copied. With `inputs`
  // (response i's call's input block: (*inputs)[i]), an output answered from it is read
  // there, and with `holds` a large one is sent in place holding it (an input hold: the
  // caller then does not free that call's input block). False: nothing built.
  bool Build(const AnswerRead& read, const std::vector<uint64_t>& lessons,
             const std::vector<std::string>* ids, OutputSegments* segments,
             std::vector<grpc::ByteBuffer>* out, BuiltBytes* bytes,
             std::vector<std::shared_ptr<HeldBlock>>* holds = nullptr,
             const std::vector<InputBlock>* inputs = nullptr) const;
  // Frees the output blocks of `read` (served whole) but those in `holds` (freed when sent);
  // returns how many frees were refused (tensor_pool's stray frees).
  size_t FreeOutputs(const AnswerRead& read, OutputSegments* segments,
                     const std::vector<std::shared_ptr<HeldBlock>>& holds = {}) const;

 private:
  const AnswerHead* HeadOf(uint64_t lesson_id, const AnswerResponse& r) const;

  std::unordered_map<uint64_t, std::vector<AnswerHead>> heads_;
};

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_KNOWN_ANSWER_H_
