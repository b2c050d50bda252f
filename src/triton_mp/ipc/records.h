// Fixed-layout binary records that cross the shared-memory rings (ipc/memory/ring.py).
//
// Python twin: src/triton_mp/ipc/recordio/records.py (the layout table) and record_layout.py (the same
// constants and struct formats; request_records.py and answer_records.py write and read
// them); tests/unit/test_records.py pins every offset below and compiles this header. Change
// both together and bump kRecordVersion.
//
// All integers little-endian, every struct packed to the offsets written beside its fields
// (static_asserts below), every offset relative to the start of the record (the ring's
// payload, after its u32 length). Strings are UTF-8, not terminated, named by (offset, length)
// into the record's string area, which follows the fixed entries in any order the writer
// likes. A record's first byte is kRecordMarker (0xC1, a byte msgpack never uses), so a ring
// consumer tells these records from the msgpack messages (ipc/protocol/messages.py) that share the
// same rings by that byte alone.
//
//   REQUEST  (kind 1): a frontend (Python or native) -> the scheduler, one per request.
//            Header + n_inputs TensorEntry + n_outputs OutputEntry + strings [+ tail].
//            The tail (rare fields) is msgpack of records.RequestTail, written by Python only;
//            a native writer writes none (tail_len 0) and hands requests that need one to
//            the Python frontend.
//   ANSWERS  (kind 2): a worker -> one frontend, one per batch (that frontend's requests of
//            it), and one per response of a decoupled model. Header + n_responses
//            ResponseEntry + n_tensors TensorEntry (each response's outputs follow the
//            previous response's, in order) + strings. A frontend reads it; the outputs with
//            region_id 0 lie in the record's one block (block_seg/block_offset), which the
//            frontend frees after it released the block_uses responses that name it
//            (kRespNamesBlock).
// The scheduler reads a REQUEST's header only and hands the record on to the worker verbatim
// inside its (msgpack) batch message; nothing else is declared here.
//
// Version 2 added block_generation to both headers: the arena block's allocation number
// (BlockRef.generation in ipc/protocol/messages.py, the block header's second u32 in
// ipc/tensor_pool.py), without which a block's reader may not free it.
#ifndef TRITON_MP_IPC_RECORDS_H_
#define TRITON_MP_IPC_RECORDS_H_

#include <cstddef>
#include <cstdint>

namespace triton_mp::records {

constexpr uint8_t kRecordMarker = 0xC1;
constexpr uint16_t kRecordVersion = 2;
constexpr uint8_t kKindRequest = 1;
constexpr uint8_t kKindAnswers = 2;
constexpr uint32_t kMaxDims = 8;  // more dims: the Python frontend sends the msgpack form

// RequestHeader.flags
constexpr uint8_t kReqSeqStart = 1;   // TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
constexpr uint8_t kReqSeqEnd = 2;     // TRITONSERVER_REQUEST_FLAG_SEQUENCE_END
constexpr uint8_t kReqTraceMask = 0x0C;  // TRITONSERVER_InferenceTraceLevel bits of a
                                         // sampled request: 0x4 TIMESTAMPS, 0x8 TENSORS
constexpr uint8_t kReqSeqString = 0x10;  // the correlation id is a string, in the tail

// RequestHeader.reply_kind (ipc.protocol.messages.Requester)
constexpr uint8_t kReplyFrontend = 0;
constexpr uint8_t kReplyBls = 1;

// ResponseEntry.flags
constexpr uint8_t kRespFinal = 1;       // TRITONSERVER_RESPONSE_COMPLETE_FINAL
constexpr uint8_t kRespError = 2;       // error_code + error text; no outputs
constexpr uint8_t kRespNamesBlock = 4;  // counts one use of the record's block
constexpr uint8_t kRespEmpty = 8;       // a flags-only final response (decoupled)

// TensorEntry.dtype: TRITONSERVER_DataType (= ModelConfig DataType numbers):
// 1 BOOL 2 UINT8 3 UINT16 4 UINT32 5 UINT64 6 INT8 7 INT16 8 INT32 9 INT64 10 FP16 11 FP32
// 12 FP64 13 BYTES 14 BF16. ResponseEntry.error_code: TRITONSERVER_Error_Code.

#pragma pack(push, 1)

struct RequestHeader {     // 104 bytes
  uint8_t marker;          // 0   kRecordMarker
  uint8_t kind;            // 1   kKindRequest
  uint16_t version;        // 2   kRecordVersion
  uint32_t size;           // 4   bytes of the whole record (= the ring record's length)
  uint64_t request_id;     // 8   unique per requester (frontend id space)
  uint64_t arrival_ns;     // 16  CLOCK_MONOTONIC ns when the frontend accepted it
  uint64_t sequence_id;    // 24  uint64 correlation id; 0 = none (or kReqSeqString)
  int64_t model_version;   // 32  the resolved version (>= 1)
  uint64_t block_offset;   // 40  the input block's header offset in block_seg (BlockRef)
  uint32_t reply_id;       // 48  frontend id (kReplyFrontend) / python instance id (kReplyBls)
  uint32_t batch_size;     // 52  first dim when the model batches, else 1
  uint32_t timeout_us;     // 56  the request's timeout parameter; 0 = none
  uint32_t priority;       // 60  the request's priority parameter; 0 = the model's default
  uint8_t reply_kind;      // 64  kReply*
  uint8_t flags;           // 65  kReq*
  uint16_t n_inputs;       // 66  TensorEntry count, right after this header
  uint16_t n_outputs;      // 68  OutputEntry count (requested outputs, in response order)
  uint16_t model_len;      // 70  model name
  uint32_t model_off;      // 72
  uint16_t block_seg_len;  // 76  POSIX name of the input arena segment holding the block
  uint16_t client_id_len;  // 78  the request's "id" (echoed in responses, errors); 0 = none
  uint32_t block_seg_off;  // 80
  uint32_t client_id_off;  // 84
  uint32_t tail_off;       // 88  msgpack RequestTail (Python only); 0 = none
  uint32_t tail_len;       // 92
  uint32_t block_generation;  // 96  the input block's generation (BlockRef.generation)
  uint32_t pad;            // 100 0
};

struct TensorEntry {       // 104 bytes: a request's input, or an answer's output
  uint64_t offset;         // 0   byte offset of the first element within the segment
  uint64_t nbytes;         // 8
  uint64_t region_id;      // 16  0: segment is a triton-mp arena; else the client's
                           //     system shm registration id (segment = its key)
  uint32_t name_off;       // 24
  uint16_t name_len;       // 28
  uint8_t dtype;           // 30  TRITONSERVER_DataType
  uint8_t ndim;            // 31  <= kMaxDims
  uint32_t segment_off;    // 32  segment name (answers: empty = the record's block segment)
  uint16_t segment_len;    // 36
  uint16_t pad;            // 38  0
  int64_t shape[kMaxDims]; // 40  the first ndim are used, batch dim included
};

struct OutputEntry {       // 8 bytes: one requested output name
  uint32_t name_off;       // 0
  uint16_t name_len;       // 4
  uint16_t pad;            // 6   0
};

struct AnswersHeader {     // 48 bytes
  uint8_t marker;          // 0   kRecordMarker
  uint8_t kind;            // 1   kKindAnswers
  uint16_t version;        // 2   kRecordVersion
  uint32_t size;           // 4   bytes of the whole record
  uint64_t block_offset;   // 8   the one output block's header offset (block_seg_len > 0)
  uint32_t block_uses;     // 16  responses naming the block (kRespNamesBlock)
  uint16_t n_responses;    // 20  ResponseEntry count, right after this header
  uint16_t block_seg_len;  // 22  0 = no block
  uint32_t block_seg_off;  // 24
  uint32_t n_tensors;      // 28  TensorEntry count, after the responses
  uint32_t tail_off;       // 32  reserved for rare fields (msgpack); 0 in version 1
  uint32_t tail_len;       // 36
  uint32_t block_generation;  // 40  the output block's generation (block_seg_len > 0)
  uint32_t pad;            // 44  0
};

struct ResponseEntry {     // 48 bytes
  uint64_t request_id;     // 0   the frontend's request id
  int64_t model_version;   // 8
  uint16_t n_outputs;      // 16  its TensorEntry count
  uint8_t flags;           // 18  kResp*
  uint8_t error_code;      // 19  TRITONSERVER_Error_Code when kRespError
  uint16_t origin_len;     // 20  who raised the error ("worker add_sub_0"), for logs
  uint16_t pad;            // 22  0
  uint32_t error_off;      // 24  the error message (kRespError)
  uint32_t error_len;      // 28
  uint32_t params_off;     // 32  response parameters as JSON {str: bool|int|str}; len 0 = none
  uint32_t params_len;     // 36
  uint32_t origin_off;     // 40
  uint32_t pad2;           // 44  0
};

#pragma pack(pop)

static_assert(sizeof(RequestHeader) == 104);
static_assert(offsetof(RequestHeader, block_generation) == 96);
static_assert(offsetof(RequestHeader, reply_kind) == 64);
static_assert(offsetof(RequestHeader, tail_len) == 92);
static_assert(sizeof(TensorEntry) == 104);
static_assert(offsetof(TensorEntry, shape) == 40);
static_assert(sizeof(OutputEntry) == 8);
static_assert(sizeof(AnswersHeader) == 48);
static_assert(offsetof(AnswersHeader, block_generation) == 40);
static_assert(sizeof(ResponseEntry) == 48);
static_assert(offsetof(ResponseEntry, error_off) == 24);

}  // namespace triton_mp::records

#endif  // TRITON_MP_IPC_RECORDS_H_
