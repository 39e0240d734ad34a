// The network transport of a build without UCX (ZP_WITH_UCX=OFF, or AUTO
// where UCX was not found): there is none. One node needs none (shared
// memory carries every byte), so such a build is whole for single-node jobs;
// a communicator that spans nodes fails at init with available()'s reason
// (Comm::initTransports). No UcxTransport is ever made, so the other
// members are never called; they exist because the interface must link.
#include "transport/ucx/ucx_transport.h"

#include "src/core/log.h"

namespace zp {

namespace {
const char* kWhy =
    "this build of Zeppelin has no UCX, which carries the traffic between nodes (configure with -DZP_WITH_UCX=ON "
    "where UCX is installed; Debian: libucx-dev)";
}

bool UcxTransport::available(std::string* why) {
  *why = kWhy;
  return false;
}

zpResult_t UcxTransport::create(const TransportContext&, const std::string&, size_t, std::unique_ptr<UcxTransport>*,
                                std::string*) {
  return fail(zpInvalidUsage, "%s", kWhy);
}

UcxTransport::~UcxTransport() = default;
zpResult_t UcxTransport::connect(const std::vector<std::string>&) { return fail(zpInvalidUsage, "%s", kWhy); }
void UcxTransport::post(Op*) {}
void UcxTransport::sendStatus(int, uint64_t, zpResult_t, const std::string&) {}
bool UcxTransport::progress() { return false; }
bool UcxTransport::arrived(int, uint64_t, size_t*) { return false; }
bool UcxTransport::busy() const { return false; }
void UcxTransport::dropOps(zpResult_t, const std::string&) {}
void UcxTransport::abortPeers(zpResult_t, const std::string&) {}
void UcxTransport::leave() {}
std::vector<int> UcxTransport::busyPeers() const { return {}; }
std::string UcxTransport::describe(int) const { return "no UCX in this build"; }
void UcxTransport::wait(int) {}
bool UcxTransport::arm() { return false; }
void UcxTransport::sleep(int) const {}
bool UcxTransport::ready() const { return false; }
void UcxTransport::cutPeer(int, const std::string&) {}
long UcxTransport::liveRequests() { return 0; }

}  // namespace zp
