// What each rank tells the others at init, in the second bootstrap round (as
// NCCL gathers one ncclPeerInfo per rank): one fixed record, PeerInfo, then
// each host transport's own connect blob, in the transport table's order,
// which only that transport reads (shared memory's ring size, UCX's worker
// address). A rank that failed to set up sends its error instead, so that
// nobody waits for it and every rank can say why.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "include/zeppelin.h"
#include "src/core/config.h"

namespace zp {

// Bumped whenever PeerInfo or the blob's layout changes: ranks of different
// layouts refuse each other instead of misreading.
constexpr uint32_t kPeerInfoLayout = 2;

// The settings that choose the collectives' algorithms and their messages
// (ZP_COLL_ALGO, ZP_COLL_RING_ABOVE, ZP_COLL_SLICE, ZP_ROUTING,
// ZP_ROUTE_DIRECT_BELOW): ranks whose values differ would post messages
// that do not match, so every rank's exact values travel at init and are
// compared there (sameSettings), not hashed into every call's header.
struct AlgoSettings {
  uint64_t collAlgo = 0, collRingAbove = 0, collSlice = 0, routing = 0, routeDirectBelow = 0;
};
AlgoSettings algoSettingsOf(const Config& cfg);

struct PeerInfo {
  uint32_t layout = kPeerInfoLayout;
  uint32_t library = ZP_VERSION_CODE;  // the Zeppelin it runs
  char host[64] = {};                  // its hostname, for messages
  int32_t node = -1;                   // its node (the communicator's numbering)
  int32_t rail = 0;                    // its NIC's index among its node's (NIC k of each node: rail k)
  double nicBitsPerSec = 0;            // its NIC's rate (0: unknown)
  // The device data plane (streamTransportKind()): whether this rank can use
  // a device, and (rank 0) the key every rank joins with, which only the
  // data plane reads. Each rank picks its device after this round, once all
  // can use one.
  uint8_t deviceUsable = 0;
  char joinKey[128] = {};  // the size of NCCL's ncclUniqueId, the one data plane's key
  AlgoSettings settings;   // its algorithm settings, compared with rank 0's
};

// A ready rank's blob: its PeerInfo, then each connect blob after its length.
std::string encodePeerBlob(const PeerInfo& info, const std::vector<std::string>& connect);
// A rank that failed: its code and message.
std::string encodeFailedBlob(zpResult_t code, const std::string& why);
// Rank r's blob, with `kinds` connect blobs expected: its PeerInfo and
// connect blobs, or the error it sent (its code, when it is one; its
// message), or zpRemoteError for a blob that is cut short, of another
// layout or of another library version.
// zpInvalidUsage naming the first setting in which rank r's (theirs)
// differ from rank 0's (first), with both values: every rank compares
// every rank with rank 0, so every rank fails init with the same message.
// me names this rank in the message.
zpResult_t sameSettings(int me, int r, const AlgoSettings& first, const AlgoSettings& theirs);
zpResult_t decodePeerBlob(int r, const std::string& blob, size_t kinds, PeerInfo* info,
                          std::vector<std::string>* connect);

}  // namespace zp
