#include "src/core/peer_info.h"

#include <cstring>

#include "src/core/log.h"

namespace zp {

namespace {
constexpr char kReady = 'R', kFailed = 'F';

// A setting's value as the user writes it: the enums by name, sizes in bytes.
std::string settingText(int which, uint64_t v) {
  static const char* algos[] = {"auto", "ring", "tree", "direct"};
  static const char* routings[] = {"off", "rail", "balanced"};
  if (which == 0 && v < 4) return algos[v];
  if (which == 3 && v < 3) return routings[v];
  return std::to_string(v) + (which == 0 || which == 3 ? "" : " bytes");
}
}  // namespace

AlgoSettings algoSettingsOf(const Config& cfg) {
  AlgoSettings s;
  s.collAlgo = (uint64_t)cfg.collAlgo;
  s.collRingAbove = cfg.collRingAbove;
  s.collSlice = cfg.collSliceBytes;
  s.routing = (uint64_t)(int64_t)cfg.routing;
  s.routeDirectBelow = cfg.routeDirectBelow;
  return s;
}

zpResult_t sameSettings(int me, int r, const AlgoSettings& first, const AlgoSettings& theirs) {
  static const char* names[] = {"ZP_COLL_ALGO", "ZP_COLL_RING_ABOVE", "ZP_COLL_SLICE", "ZP_ROUTING",
                                "ZP_ROUTE_DIRECT_BELOW"};
  const uint64_t a[] = {first.collAlgo, first.collRingAbove, first.collSlice, first.routing, first.routeDirectBelow};
  const uint64_t b[] = {theirs.collAlgo, theirs.collRingAbove, theirs.collSlice, theirs.routing,
                        theirs.routeDirectBelow};
  for (int i = 0; i < 5; i++)
    if (a[i] != b[i])
      return fail(zpInvalidUsage,
                  "rank %d: %s is %s on rank %d but %s on rank 0: the settings that choose collective algorithms "
                  "(ZP_COLL_ALGO, ZP_COLL_RING_ABOVE, ZP_COLL_SLICE, ZP_ROUTING, ZP_ROUTE_DIRECT_BELOW, or the "
                  "zpConfig_t fields that set them) must be the same on every rank",
                  me, names[i], settingText(i, b[i]).c_str(), r, settingText(i, a[i]).c_str());
  return zpSuccess;
}

std::string encodePeerBlob(const PeerInfo& info, const std::vector<std::string>& connect) {
  std::string blob(1, kReady);
  blob.append((const char*)&info, sizeof(info));
  for (const std::string& c : connect) {
    const uint32_t len = (uint32_t)c.size();
    blob.append((const char*)&len, sizeof(len));
    blob += c;
  }
  return blob;
}

std::string encodeFailedBlob(zpResult_t code, const std::string& why) {
  const int32_t c = code;
  return std::string(1, kFailed) + std::string((const char*)&c, sizeof(c)) + why;
}

zpResult_t decodePeerBlob(int r, const std::string& b, size_t kinds, PeerInfo* info,
                          std::vector<std::string>* connect) {
  if (b.size() > sizeof(int32_t) && b[0] == kFailed) {
    int32_t code;
    memcpy(&code, b.data() + 1, sizeof(code));
    const bool known = code >= zpUnhandledCudaError && code <= zpInProgress;  // a peer's word, checked
    return fail(known ? (zpResult_t)code : zpRemoteError, "rank %d failed to set up its transports: %s", r,
                b.substr(1 + sizeof(code)).c_str());
  }
  if (b.size() < 1 + sizeof(PeerInfo) || b[0] != kReady)
    return fail(zpRemoteError, "rank %d failed to set up its transports", r);
  memcpy(info, b.data() + 1, sizeof(PeerInfo));
  info->host[sizeof(info->host) - 1] = 0;
  if (info->layout != kPeerInfoLayout || info->library != ZP_VERSION_CODE)
    return fail(zpInvalidUsage, "rank %d runs Zeppelin %u (init record layout %u), this rank %u (layout %u): every "
                "rank must run the same library", r, info->library, info->layout, (unsigned)ZP_VERSION_CODE,
                kPeerInfoLayout);
  connect->assign(kinds, std::string());
  size_t pos = 1 + sizeof(PeerInfo);
  for (size_t i = 0; i < kinds; i++) {
    uint32_t len = 0;
    if (b.size() - pos < sizeof(len)) return fail(zpRemoteError, "rank %d failed to set up its transports", r);
    memcpy(&len, b.data() + pos, sizeof(len));
    pos += sizeof(len);
    if (b.size() - pos < len) return fail(zpRemoteError, "rank %d failed to set up its transports", r);
    (*connect)[i] = b.substr(pos, len);
    pos += len;
  }
  if (pos != b.size())
    return fail(zpRemoteError, "rank %d sent connect blobs for more transports than the %zu this rank uses", r, kinds);
  return zpSuccess;
}

}  // namespace zp
