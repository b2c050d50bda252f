// Metadata relayed between the public port and the Python side: every user key, none of
// the keys gRPC itself writes (pseudo-headers, grpc-*, content-type, te, user-agent...).
#ifndef TRITON_MP_NATIVE_METADATA_H_
#define TRITON_MP_NATIVE_METADATA_H_

#include <grpcpp/grpcpp.h>

#include <map>
#include <string>

namespace triton_mp {

// True for a key gRPC sets itself (a copy would be refused or duplicated).
bool IsTransportKey(grpc::string_ref key);

// Calls add(key, value) for every relayed entry of `from`.
template <class Add>
void CopyMetadata(const std::multimap<grpc::string_ref, grpc::string_ref>& from, Add add) {
  for (const auto& kv : from) {
    if (IsTransportKey(kv.first)) continue;
    add(std::string(kv.first.data(), kv.first.size()),
        std::string(kv.second.data(), kv.second.size()));
  }
}

// The client's request metadata onto the Python side's call.
void CopyRequestMetadata(const grpc::ServerContextBase& from, grpc::ClientContext* to);

}  // namespace triton_mp

#endif  // TRITON_MP_NATIVE_METADATA_H_
