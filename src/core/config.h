// Settings of one communicator, resolved once at init from zpConfig_t, the
// environment and defaults (in that order of precedence).
#pragma once

#include <cstddef>
#include <string>

#include "include/zeppelin.h"
#include "src/core/params.h"
#include "src/util/strings.h"

namespace zp {

// Defaults of the router's chunk size and direct threshold, here so that the
// transports (UCX sends chunks eagerly) and the router agree.
constexpr uint64_t kRouteDefaultChunkBytes = 512u << 10;
// Below this size transfers go direct: relaying a transfer of up to one
// chunk gains nothing over sending it straight, and from a little above one
// chunk it pays, for one pair and for a ring hop alike. The measurement and
// its command: docs/routing.md, the paragraph on ZP_ROUTE_DIRECT_BELOW.
constexpr uint64_t kRouteDefaultDirectBelow = 512u << 10;

enum class ShmProto { kAuto, kCma, kCopy };
enum class CollAlgo { kAuto, kRing, kTree, kDirect };
// The standard collectives move at least this many bytes per rank by ring,
// fewer by recursive doubling, trees or direct exchange (ZP_COLL_RING_ABOVE):
// between the all-reduce's and the broadcast's crossovers on one node
// (docs/collectives.md, "ZP_COLL_RING_ABOVE: 256 KiB").
constexpr size_t kCollDefaultRingAbove = 256u << 10;

struct Config {
  int timeoutMs = 300 * 1000;    // ZP_TIMEOUT (seconds)
  int waitWarnMs = 5000;         // ZP_WAIT_WARN (seconds): a call waiting this long says so (0: never)
  int stragglerMs = 10;          // ZP_STRAGGLER_MS: how late a rank must be on average to be named (0: never)
  int routing = zpRoutingBalanced;  // ZP_ROUTING
  // ZP_CHECK_MODE=full: device calls compare their arguments with the
  // peers' before they enqueue (host calls always do).
  bool checkDeviceCalls = false;
  std::string nodeId;            // ZP_NODE_ID, else hostname + boot id
  std::string netDevices;        // ZP_NET_DEVICES
  std::string socketIfname;      // ZP_SOCKET_IFNAME: interface for bootstrap sockets
  ShmProto shmProto = ShmProto::kAuto;  // ZP_SHM_PROTO=auto|cma|copy
  size_t shmEagerBytes = 32 << 10;      // ZP_SHM_EAGER: below this, copy through the ring
  size_t shmReduceCopyFrom = 0;  // ZP_SHM_REDUCE_COPY: messages their receiver reduces go through the ring from this size
  size_t shmRingBytes = 2 << 20;        // ZP_SHM_RING_BYTES: data ring per peer pair
  int shmSpinUs = 1000;     // ZP_SHM_SPIN_US: poll this long before sleeping while a core is free
  int shmSpinBusyUs = 50;  // ZP_SHM_SPIN_BUSY_US: the same while a few other tasks wait for a core
  // The router's settings (src/route/router.h).
  size_t routeChunkBytes = kRouteDefaultChunkBytes;    // ZP_ROUTE_CHUNK: relays move chunks of this size
  size_t routeDirectBelow = kRouteDefaultDirectBelow;  // ZP_ROUTE_DIRECT_BELOW: smaller transfers are not relayed
  int railSlowPct = 30;  // ZP_RAIL_SLOW: a rail below this % of the fastest is slow (0: nominal rates only)
  CollAlgo collAlgo = CollAlgo::kAuto;           // ZP_COLL_ALGO=auto|ring|tree|direct
  size_t collRingAbove = kCollDefaultRingAbove;  // ZP_COLL_RING_ABOVE
  size_t collSliceBytes = 1 << 20;              // ZP_COLL_SLICE: the hierarchical all-reduce's pipeline slices (0: none)
};

zpResult_t resolveConfig(const zpConfig_t* user, Config* out);

// This host's identity: hostname plus boot id, as NCCL does.
std::string defaultNodeId();

}  // namespace zp
