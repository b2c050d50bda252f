#include "metadata.h"

namespace triton_mp {

namespace {
bool StartsWith(grpc::string_ref s, const char* prefix) {
  grpc::string_ref p(prefix);
  return s.size() >= p.size() && s.substr(0, p.size()) == p;
}
}  // namespace

bool IsTransportKey(grpc::string_ref key) {
  return StartsWith(key, ":") || StartsWith(key, "grpc-") || key == "content-type" ||
         key == "te" || key == "user-agent" || key == "host" || key == "content-length" ||
         key == "accept-encoding" || key == "content-encoding" || key == "lb-token";
}

void CopyRequestMetadata(const grpc::ServerContextBase& from, grpc::ClientContext* to) {
  CopyMetadata(from.client_metadata(), [to](const std::string& k, const std::string& v) {
    to->AddMetadata(k, v);
  });
}

}  // namespace triton_mp
