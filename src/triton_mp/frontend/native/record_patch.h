// A known request's REQUEST record patched from its form's template: the fields that differ
// between two requests of one form written in (request id, arrival, the input block's offset
// and generation, each tensor entry's offset). Plain C++, so the gRPC thread can patch records
// too (the cpp-known-path design note); Python reaches it through _native.patch_request.
//
// Python twin: patched() in src/triton_mp/frontend/dispatch/known_records.py (which calls
// this where the extension is built). Layout: RequestHeader and TensorEntry of
// src/triton_mp/ipc/records.h (read, never changed here): the entries follow the header.
#ifndef TRITON_MP_FRONTEND_NATIVE_RECORD_PATCH_H_
#define TRITON_MP_FRONTEND_NATIVE_RECORD_PATCH_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace triton_mp {

struct RecordPatch {
  uint64_t request_id;
  uint64_t arrival_ns;
  uint64_t block_offset;
  uint32_t block_generation;
  const uint64_t* entry_offsets;  // one per tensor entry to patch, in the record's order
  size_t n_entries;
};

// Bytes a record needs for every field PatchRecord writes (the last entry's offset).
size_t PatchedRecordMinBytes(size_t n_entries);

// Writes `patch` into `record` (a template's copy of `len` bytes). False, writing nothing,
// when the record is shorter than PatchedRecordMinBytes(patch.n_entries).
bool PatchRecord(unsigned char* record, size_t len, const RecordPatch& patch);

// `record` (a REQUEST record as encode_request writes it: the client id the last string,
// right before the tail, or at the end) with the client id `id` (`id_len` bytes; 0: none)
// in its place, into `out`: the bytes encode_request writes for the same request with that
// id (client_id_len/off, tail_off and size moved with it). False (out unspecified): the
// record is not laid out so, or the id does not fit its u16 length.
bool WithClientId(const std::string& record, const char* id, size_t id_len, std::string* out);

}  // namespace triton_mp

#endif  // TRITON_MP_FRONTEND_NATIVE_RECORD_PATCH_H_
