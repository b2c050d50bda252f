// A serialized inference.ModelInferRequest split as the Python frontend splits it
// (frontend/grpc/wire.py: _scan and split_infer_request, its twin): the
// raw_input_contents entries (field 7) found in place, the message without them (`head`),
// and without them and the id fields (field 3) either (`key`, what the frontend knows a
// request it checked before by), and the last id's value. Only top-level fields are read;
// a message this scanner does not understand (a group, a truncated field, a varint over 10
// bytes) is declined, and Python parses it whole, which answers as it always did.
#ifndef TRITON_MP_NATIVE_REQUEST_SPLIT_H_
#define TRITON_MP_NATIVE_REQUEST_SPLIT_H_

#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace triton_mp {

struct RequestSplit {
  std::string head;  // the message without its raw_input_contents fields, bytes as received
  std::string key;   // head without its id fields
  bool has_id = false;
  std::pair<size_t, size_t> id;                  // the last id's value: (offset, length)
  std::vector<std::pair<size_t, size_t>> raw;    // each raw_input_contents: (offset, length)
};

// Splits `data` into `out` (cleared first). False: declined (wire.py's _scan raises).
bool SplitInferRequest(const unsigned char* data, size_t size, RequestSplit* out);

}  // namespace triton_mp

#endif  // TRITON_MP_NATIVE_REQUEST_SPLIT_H_
