#include "src/route/routing_state.h"

#include "src/core/log.h"
#include "src/route/routing_setting.h"
#include "transport/relay/relay.h"

namespace zp {

namespace {
RouteParams paramsOf(const Config& cfg) {
  RouteParams p;
  p.mode = (RouteMode)cfg.routing;
  p.chunkBytes = cfg.routeChunkBytes;
  p.directBelow = cfg.routeDirectBelow;
  return p;
}
}  // namespace

bool routingOn(const Config& cfg) { return cfg.routing != zpRoutingOff; }

size_t routedEagerBytes(const Config& cfg) { return routingOn(cfg) ? cfg.routeChunkBytes : 0; }

RoutingState::RoutingState(const Comm& comm)
    : comm_(comm),
      params_(paramsOf(comm.cfg())),
      health_(comm),
      queues_(comm.carrierFor(comm.rank()), comm.rail(), comm.nodeOf(), comm.nodeOf()[comm.rank()]) {}

std::vector<NicDown> RoutingState::applyNicNews() {
  std::vector<NicDown> fresh = health_.apply();
  if (!fresh.empty()) planKey_.clear();  // plans made with the NIC are void
  return fresh;
}

bool RoutingState::pickPath(int src, int dst, uint64_t bytes, const std::vector<uint64_t>& extraByRail,
                            std::vector<Piece>* pieces, std::string* why) {
  std::vector<uint64_t> queued = extraByRail;
  queues_.addTo(&queued);
  return zp::pickPath(health_.topology(), src, dst, bytes, queued, params_, pieces, why) == zpSuccess;
}

zpResult_t RoutingState::plan(const std::vector<uint64_t>& key, const std::vector<std::vector<uint64_t>>& bytes,
                              const std::vector<Transfer>** out, std::string* why) {
  if (key != planKey_) {
    planKey_.clear();
    ZP_CHECK(planRoutes(health_.topology(), bytes, params_, &plan_, why));
    planKey_ = key;
    ZP_TRACE(kSubColl, "rank %d: %s", comm_.rank(), zp::describe(plan_, 4).c_str());
  }
  *out = &plan_.transfers;
  return zpSuccess;
}

void enableRouting(Comm* c) {
  if (!routingOn(c->cfg()) || c->nnodes() < 2) return;
  bool severalRails = false;
  for (int r = 1; r < c->nranks(); r++) severalRails |= c->rail()[r] != c->rail()[0];
  if (!severalRails) return;
  std::vector<int> remote;
  for (int r = 0; r < c->nranks(); r++)
    if (!c->isLocal(r)) remote.push_back(r);
  c->setRouting(std::make_unique<RoutingState>(*c));
  c->installTransport(
      std::make_unique<Relay>(c->transportContext(), c->carrierFor(c->rank()), c->carrierFor(remote[0]), c->routing()),
      remote);
  c->startProgressThread();
}

}  // namespace zp
