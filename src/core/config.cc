#include "src/core/config.h"

#include <strings.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <fstream>

#include "src/core/log.h"

namespace zp {

std::string envString(const char* name, const std::string& dflt) {
  const char* v = getenv(name);
  return (v && *v) ? std::string(v) : dflt;
}

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

  std::string t = envString("ZP_TIMEOUT");
  if (!t.empty()) {
    char* end = nullptr;
    double s = strtod(t.c_str(), &end);
    // Kept in milliseconds in an int.
    if (*end || !(s > 0) || s > 2147483)
      return fail(zpInvalidArgument, "ZP_TIMEOUT='%s' is not a number of seconds in (0, 2147483]", t.c_str());
    c.timeoutMs = (int)std::ceil(s * 1000);
  }
  if (has(offsetof(zpConfig_t, timeoutMs), sizeof(int)) && user->timeoutMs != ZP_CONFIG_UNDEF_INT) {
    if (user->timeoutMs <= 0)
      return fail(zpInvalidArgument, "zpConfig_t.timeoutMs=%d must be positive", user->timeoutMs);
    c.timeoutMs = user->timeoutMs;
  }

  std::string r = envString("ZP_ROUTING");
  if (!r.empty()) {
    if (!strcasecmp(r.c_str(), "off")) c.routing = zpRoutingOff;
    else if (!strcasecmp(r.c_str(), "rail")) c.routing = zpRoutingRail;
    else if (!strcasecmp(r.c_str(), "balanced")) c.routing = zpRoutingBalanced;
    else return fail(zpInvalidArgument, "ZP_ROUTING='%s': expected off, rail or balanced", r.c_str());
  }
  if (has(offsetof(zpConfig_t, routing), sizeof(int)) && user->routing != ZP_CONFIG_UNDEF_INT &&
      user->routing != zpRoutingDefault) {
    if (user->routing < zpRoutingOff || user->routing > zpRoutingBalanced)
      return fail(zpInvalidArgument, "zpConfig_t.routing=%d is not a zpRouting_t", user->routing);
    c.routing = user->routing;
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

  std::string proto = envString("ZP_SHM_PROTO", "auto");
  if (!strcasecmp(proto.c_str(), "auto")) c.shmProto = ShmProto::kAuto;
  else if (!strcasecmp(proto.c_str(), "cma")) c.shmProto = ShmProto::kCma;
  else if (!strcasecmp(proto.c_str(), "copy")) c.shmProto = ShmProto::kCopy;
  else return fail(zpInvalidArgument, "ZP_SHM_PROTO='%s': expected auto, cma or copy", proto.c_str());

  std::string v = envString("ZP_SHM_EAGER");
  if (!v.empty() && !parseSize(v, &c.shmEagerBytes))
    return fail(zpInvalidArgument, "ZP_SHM_EAGER='%s' is not a size", v.c_str());
  v = envString("ZP_SHM_RING_BYTES");
  if (!v.empty()) {
    size_t bytes = 0;
    if (!parseSize(v, &bytes) || bytes < (64 << 10) || bytes > (1ull << 30) || (bytes & (bytes - 1)))
      return fail(zpInvalidArgument,
                  "ZP_SHM_RING_BYTES='%s': expected a power of two from 64K to 1G", v.c_str());
    c.shmRingBytes = bytes;
  }
  v = envString("ZP_SHM_SPIN_US");
  if (!v.empty()) c.shmSpinUs = atoi(v.c_str());
  v = envString("ZP_ROUTE_CHUNK");
  if (!v.empty() && (!parseSize(v, &c.routeChunkBytes) || c.routeChunkBytes < 4096 || c.routeChunkBytes > (256u << 20)))
    return fail(zpInvalidArgument, "ZP_ROUTE_CHUNK='%s': expected a size from 4K to 256M", v.c_str());
  v = envString("ZP_ROUTE_DIRECT_BELOW");
  if (!v.empty() && !parseSize(v, &c.routeDirectBelow))
    return fail(zpInvalidArgument, "ZP_ROUTE_DIRECT_BELOW='%s' is not a size", v.c_str());
  *out = c;
  return zpSuccess;
}

}  // namespace zp
