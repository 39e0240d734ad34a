// The table of host transports (src/core/transport.h, TransportKind) and
// the device data plane's entry (StreamTransportKind): the only place that
// names them. The communicator makes, in this order, every host kind that
// reaches some rank; a peer is reached by the first kind that can.
// The relay (transport/relay) is not here: it is built on these by the
// routing layer for routed communicators (src/route/routing_state.h).
#include "src/core/log.h"
#include "src/core/transport.h"
#include "transport/nccl/nccl_transport.h"
#include "transport/shm/shm_transport.h"
#include "transport/ucx/ucx_transport.h"

namespace zp {

namespace {

// Shared memory: the ranks of this node, this one included (its own sends
// and receives pair up in the executor, but the communicator always has it).
bool shmReaches(const TransportContext& ctx, int peer) { return ctx.sameNode(ctx.rank, peer); }
bool shmAvailable(std::string*) { return true; }
zpResult_t createShm(const TransportContext& ctx, const TransportSetup&, std::unique_ptr<CarrierTransport>* out,
                     std::string* address) {
  std::unique_ptr<ShmTransport> t;
  ZP_CHECK(ShmTransport::create(ctx, &t));
  *address = t->address();
  *out = std::move(t);
  return zpSuccess;
}

// UCX: the ranks of other nodes.
bool ucxReaches(const TransportContext& ctx, int peer) { return !ctx.sameNode(ctx.rank, peer); }
zpResult_t createUcx(const TransportContext& ctx, const TransportSetup& setup, std::unique_ptr<CarrierTransport>* out,
                     std::string* address) {
  std::unique_ptr<UcxTransport> t;
  ZP_CHECK(UcxTransport::create(ctx, setup.nic, setup.eagerUpTo, &t, address));
  *out = std::move(t);
  return zpSuccess;
}

// NCCL: device buffers on the callers' streams (nccl_none.cc in a build
// without CUDA, whose functions say why there is none).
zpResult_t createNccl(const TransportContext& ctx, const std::string& joinKey, int device,
                      std::unique_ptr<StreamTransport>* out) {
  return createNcclTransport(joinKey, ctx.nranks, ctx.rank, device, ctx.cfg->timeoutMs, out);
}

}  // namespace

const StreamTransportKind& streamTransportKind() {
  static const StreamTransportKind nccl = {"nccl", deviceUsable, makeNcclId, chooseDevice, createNccl,
                                                addDeviceInitHook};
  return nccl;
}

const std::vector<TransportKind>& hostTransports() {
  static const std::vector<TransportKind> table = {
      {"shm", shmReaches, shmAvailable, createShm},
      {"ucx", ucxReaches, UcxTransport::available, createUcx},
  };
  return table;
}

}  // namespace zp
