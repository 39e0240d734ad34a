// The routing setting (ZP_ROUTING, zpConfig_t.routing) as the layers
// outside src/route need it. src/route is the one place that interprets the
// setting (here, in the router's parameters and in enableRouting); the
// others ask these.
#pragma once

#include <cstddef>

#include "src/core/config.h"

namespace zp {

// Whether inter-node traffic is routed (ZP_ROUTING is not off): the relay
// may carry it, and messages below ZP_ROUTE_DIRECT_BELOW go direct.
bool routingOn(const Config& cfg);

// The size up to which the network sends a message eagerly
// (TransportSetup::eagerUpTo): with routing, the relay's chunks (see
// UcxTransport::create); without, 0 (the network's own threshold).
size_t routedEagerBytes(const Config& cfg);

}  // namespace zp
