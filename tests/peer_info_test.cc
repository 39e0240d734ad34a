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

}  // namespace
}  // namespace zp
