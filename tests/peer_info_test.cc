// Init's second round (src/core/peer_info.h): a rank's PeerInfo and its
// transports' connect blobs come back as they went, and a blob that is cut
// short, too long, of another layout or library, or a peer's failure, is an
// error naming the rank, never a crash or a misread.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/core/peer_info.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace zp {
namespace {

PeerInfo sample() {
  PeerInfo p;
  snprintf(p.host, sizeof(p.host), "%s", "node-a");
  p.node = 3;
  p.rail = 7;
  p.nicBitsPerSec = 4e11;
  p.deviceUsable = 1;
  p.settings.collSlice = 1050378;
  p.settings.routeDirectBelow = 260000000000001ull;
  for (size_t i = 0; i < sizeof(p.joinKey); i++) p.joinKey[i] = (char)(i * 7 + 1);
  return p;
}

TEST(PeerInfo, RoundTripsWithItsConnectBlobs) {
  const PeerInfo in = sample();
  const std::vector<std::string> blobs = {std::string("\0\1\2\0", 4), "", std::string(70000, 'x')};
  const std::string wire = encodePeerBlob(in, blobs);
  PeerInfo out;
  std::vector<std::string> got;
  ASSERT_EQ(decodePeerBlob(5, wire, blobs.size(), &out, &got), zpSuccess) << zpGetLastError(nullptr);
  EXPECT_STREQ(out.host, "node-a");
  EXPECT_EQ(out.node, 3);
  EXPECT_EQ(out.rail, 7);
  EXPECT_EQ(out.nicBitsPerSec, 4e11);
  EXPECT_EQ(out.deviceUsable, 1);
  EXPECT_EQ(memcmp(out.joinKey, in.joinKey, sizeof(in.joinKey)), 0);
  EXPECT_EQ(out.settings.collSlice, 1050378u);
  EXPECT_EQ(out.settings.routeDirectBelow, 260000000000001ull);
  EXPECT_EQ(got, blobs);
}

TEST(PeerInfo, APeersFailureComesBackWithItsCodeAndMessage) {
  PeerInfo out;
  std::vector<std::string> got;
  EXPECT_EQ(decodePeerBlob(2, encodeFailedBlob(zpSystemError, "no room in /dev/shm"), 1, &out, &got), zpSystemError);
  const std::string msg = zpGetLastError(nullptr);
  EXPECT_NE(msg.find("rank 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no room in /dev/shm"), std::string::npos) << msg;
  // A code that is no zpResult_t is the peer's word, not trusted.
  EXPECT_EQ(decodePeerBlob(2, encodeFailedBlob((zpResult_t)999, "odd"), 1, &out, &got), zpRemoteError);
}

TEST(PeerInfo, EveryCutAndEveryBadLengthIsAnError) {
  const std::string wire = encodePeerBlob(sample(), {"abc", "defgh"});
  PeerInfo out;
  std::vector<std::string> got;
  for (size_t n = 0; n < wire.size(); n++)
    EXPECT_NE(decodePeerBlob(1, wire.substr(0, n), 2, &out, &got), zpSuccess) << "cut at " << n;
  // Bytes after the last blob: the ranks disagree on the transports.
  EXPECT_EQ(decodePeerBlob(1, wire + "z", 2, &out, &got), zpRemoteError);
  EXPECT_EQ(decodePeerBlob(1, wire, 1, &out, &got), zpRemoteError);
  // A length past the end.
  std::string bad = wire;
  const uint32_t huge = 0xFFFFFFF0u;
  memcpy(&bad[1 + sizeof(PeerInfo)], &huge, sizeof(huge));
  EXPECT_EQ(decodePeerBlob(1, bad, 2, &out, &got), zpRemoteError);
}

TEST(PeerInfo, AnotherLayoutOrLibraryIsRefusedNamingBoth) {
  PeerInfo other = sample();
  other.library = ZP_VERSION_CODE + 1;
  PeerInfo out;
  std::vector<std::string> got;
  EXPECT_EQ(decodePeerBlob(4, encodePeerBlob(other, {}), 0, &out, &got), zpInvalidUsage);
  const std::string msg = zpGetLastError(nullptr);
  EXPECT_NE(msg.find("rank 4"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(ZP_VERSION_CODE + 1)), std::string::npos) << msg;
  other = sample();
  other.layout = kPeerInfoLayout + 1;
  EXPECT_EQ(decodePeerBlob(4, encodePeerBlob(other, {}), 0, &out, &got), zpInvalidUsage);
}

// Every algorithm setting is compared exactly: one unit apart in any of
// them (values a hash could confuse) fails, naming the setting, the rank
// and both values.
TEST(PeerInfo, SettingsThatDifferInAnyFieldByOneAreRefusedNamingBothValues) {
  Config cfg;
  const AlgoSettings base = algoSettingsOf(cfg);
  EXPECT_EQ(sameSettings(2, 1, base, base), zpSuccess);
  struct Field {
    uint64_t AlgoSettings::*field;
    const char* name;
  };
  for (Field f : {Field{&AlgoSettings::collAlgo, "ZP_COLL_ALGO"}, Field{&AlgoSettings::collRingAbove, "ZP_COLL_RING_ABOVE"},
                  Field{&AlgoSettings::collSlice, "ZP_COLL_SLICE"}, Field{&AlgoSettings::routing, "ZP_ROUTING"},
                  Field{&AlgoSettings::routeDirectBelow, "ZP_ROUTE_DIRECT_BELOW"}}) {
    AlgoSettings other = base;
    other.*f.field += 1;
    EXPECT_EQ(sameSettings(2, 1, base, other), zpInvalidUsage) << f.name;
    const std::string msg = zpGetLastError(nullptr);
    EXPECT_NE(msg.find(f.name), std::string::npos) << msg;
    EXPECT_NE(msg.find("on rank 1 but"), std::string::npos) << msg;
  }
  AlgoSettings slice = base;
  slice.collSlice = 1050378;
  AlgoSettings zero = base;
  zero.collSlice = 1090457;
  EXPECT_EQ(sameSettings(0, 1, zero, slice), zpInvalidUsage);
  const std::string msg = zpGetLastError(nullptr);
  EXPECT_NE(msg.find("ZP_COLL_SLICE is 1050378 bytes on rank 1 but 1090457 bytes on rank 0"), std::string::npos) << msg;
  AlgoSettings ring = base;
  ring.collAlgo = (uint64_t)CollAlgo::kRing;
  EXPECT_EQ(sameSettings(0, 3, base, ring), zpInvalidUsage);
  EXPECT_NE(std::string(zpGetLastError(nullptr)).find("ZP_COLL_ALGO is ring on rank 3 but auto on rank 0"),
            std::string::npos)
      << zpGetLastError(nullptr);
}

}  // namespace
}  // namespace zp
