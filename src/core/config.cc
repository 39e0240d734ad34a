#include "src/core/config.h"

#include <strings.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>

#include "src/core/log.h"

namespace zp {

std::string defaultNodeId() {
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  std::string id = host;
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string bootId;
  if (boot >> bootId) id += ":" + bootId;
  return id;
}

zpResult_t resolveConfig(const zpConfig_t* user, Config* out) {
  Config c;
  // Every ZP_* setting, those read elsewhere (logging, discovery) too: a bad
  // value fails the init that could have used it, naming what is expected.
  ZP_CHECK(checkEnvironment());
  if (user) {
    if (user->magic != ZP_CONFIG_MAGIC)
      return fail(zpInvalidArgument,
                  "zpConfig_t has bad magic 0x%x: initialize it with ZP_CONFIG_INITIALIZER",
                  user->magic);
    if (user->size < offsetof(zpConfig_t, timeoutMs) || user->size > (1 << 16))
      return fail(zpInvalidArgument, "zpConfig_t has bad size %zu", user->size);
  }
  // Fields a caller compiled against an older, smaller zpConfig_t cannot see.
  auto has = [&](size_t offset, size_t len) { return user && user->size >= offset + len; };

  double seconds = 0;
  ZP_CHECK(paramSeconds("ZP_TIMEOUT", &seconds));
  if (seconds > 0) c.timeoutMs = (int)std::ceil(seconds * 1000);  // kept in milliseconds in an int
  if (has(offsetof(zpConfig_t, timeoutMs), sizeof(int)) && user->timeoutMs != ZP_CONFIG_UNDEF_INT) {
    if (user->timeoutMs <= 0)
      return fail(zpInvalidArgument, "zpConfig_t.timeoutMs=%d must be positive", user->timeoutMs);
    c.timeoutMs = user->timeoutMs;
  }

  seconds = -1;
  ZP_CHECK(paramSeconds("ZP_WAIT_WARN", &seconds));
  if (seconds >= 0) c.waitWarnMs = (int)std::ceil(seconds * 1000);
  long long straggler = c.stragglerMs;
  ZP_CHECK(paramInt("ZP_STRAGGLER_MS", &straggler));
  c.stragglerMs = (int)straggler;
  long long railSlow = c.railSlowPct;
  ZP_CHECK(paramInt("ZP_RAIL_SLOW", &railSlow));
  c.railSlowPct = (int)railSlow;

  // The table lists off, rail, balanced in zpRouting_t's order.
  int routing = -1;
  ZP_CHECK(paramEnum("ZP_ROUTING", &routing));
  if (routing >= 0) c.routing = zpRoutingOff + routing;
  if (has(offsetof(zpConfig_t, routing), sizeof(int)) && user->routing != ZP_CONFIG_UNDEF_INT &&
      user->routing != zpRoutingDefault) {
    if (user->routing < zpRoutingOff || user->routing > zpRoutingBalanced)
      return fail(zpInvalidArgument, "zpConfig_t.routing=%d is not a zpRouting_t", user->routing);
    c.routing = user->routing;
  }

  int check = -1;  // local, full: zpCheckMode_t's order
  ZP_CHECK(paramEnum("ZP_CHECK_MODE", &check));
  if (check >= 0) c.checkDeviceCalls = check == zpCheckFull;
  if (has(offsetof(zpConfig_t, checkMode), sizeof(int)) && user->checkMode != ZP_CONFIG_UNDEF_INT &&
      user->checkMode != zpCheckDefault) {
    if (user->checkMode != zpCheckLocal && user->checkMode != zpCheckFull)
      return fail(zpInvalidArgument, "zpConfig_t.checkMode=%d is not a zpCheckMode_t", user->checkMode);
    c.checkDeviceCalls = user->checkMode == zpCheckFull;
  }

  c.nodeId = envString("ZP_NODE_ID");
  if (has(offsetof(zpConfig_t, nodeId), sizeof(char*)) && user->nodeId) c.nodeId = user->nodeId;
  if (c.nodeId.empty()) c.nodeId = defaultNodeId();
  if (c.nodeId.size() >= 128)
    return fail(zpInvalidArgument, "node id '%s' is longer than 127 bytes", c.nodeId.c_str());

  c.netDevices = envString("ZP_NET_DEVICES");
  if (has(offsetof(zpConfig_t, netDevices), sizeof(char*)) && user->netDevices)
    c.netDevices = user->netDevices;
  c.socketIfname = envString("ZP_SOCKET_IFNAME");

  int proto = -1;  // auto, cma, copy: ShmProto's order
  ZP_CHECK(paramEnum("ZP_SHM_PROTO", &proto));
  if (proto >= 0) c.shmProto = (ShmProto)proto;
  ZP_CHECK(paramSize("ZP_SHM_REDUCE_COPY", &c.shmReduceCopyFrom));
  ZP_CHECK(paramSize("ZP_SHM_EAGER", &c.shmEagerBytes));
  ZP_CHECK(paramSize("ZP_SHM_RING_BYTES", &c.shmRingBytes));
  long long spin = c.shmSpinUs;
  ZP_CHECK(paramInt("ZP_SHM_SPIN_US", &spin));
  c.shmSpinUs = (int)spin;
  spin = c.shmSpinBusyUs;
  ZP_CHECK(paramInt("ZP_SHM_SPIN_BUSY_US", &spin));
  c.shmSpinBusyUs = (int)spin;
  ZP_CHECK(paramSize("ZP_ROUTE_CHUNK", &c.routeChunkBytes));
  ZP_CHECK(paramSize("ZP_ROUTE_DIRECT_BELOW", &c.routeDirectBelow));
  int algo = -1;  // auto, ring, tree, direct: CollAlgo's order
  ZP_CHECK(paramEnum("ZP_COLL_ALGO", &algo));
  if (algo >= 0) c.collAlgo = (CollAlgo)algo;
  ZP_CHECK(paramSize("ZP_COLL_RING_ABOVE", &c.collRingAbove));
  ZP_CHECK(paramSize("ZP_COLL_SLICE", &c.collSliceBytes));
  *out = c;
  return zpSuccess;
}

}  // namespace zp
