// The message-id registry (src/core/msg_id.h): every family round-trips at
// its limits, and no family's id at a limit reads as another family's.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/core/msg_id.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace zp {
namespace {

using namespace msgid;

TEST(MsgId, ControlRoundTripsAndStaysInItsRange) {
  for (Control c : {Control::kLeaving, Control::kNicDown, Control::kAck, Control::kRailView}) {
    const uint64_t seq = controlSeq(c);
    EXPECT_TRUE(isControl(seq));
    EXPECT_EQ(controlOf(seq), c);
    EXPECT_LT(seq, kSeqLimit);  // fits the network's tag field
  }
  EXPECT_NE(controlSeq(Control::kLeaving), controlSeq(Control::kNicDown));
  EXPECT_NE(controlSeq(Control::kNicDown), controlSeq(Control::kAck));
  EXPECT_NE(controlSeq(Control::kAck), controlSeq(Control::kRailView));
  // The last ordinary sequence number is not a control message.
  EXPECT_FALSE(isControl(kFirstControl - 1));
  EXPECT_FALSE(isControl(0));
  EXPECT_TRUE(isControl(kFirstControl));
  EXPECT_TRUE(isControl(kSeqLimit - 1));
}

TEST(MsgId, ChunksRoundTripBelowControl) {
  for (uint64_t k : {uint64_t(0), uint64_t(1), uint64_t(12345), kMaxChunk}) {
    const ChunkSeqs s = chunkSeqs(k);
    EXPECT_EQ(s.data, s.header + 1);  // the header, then its bytes, in that order
    EXPECT_EQ(chunkOf(s.header), k);
    EXPECT_EQ(chunkOf(s.data), k);
    EXPECT_FALSE(isChunkData(s.header));
    EXPECT_TRUE(isChunkData(s.data));
    EXPECT_FALSE(isControl(s.header));
    EXPECT_FALSE(isControl(s.data));
  }
  // One chunk more and its bytes would read as a control message.
  EXPECT_TRUE(isControl(chunkSeqs(kMaxChunk + 1).data));
}

TEST(MsgId, TransferIdsRoundTripAtTheirLimits) {
  for (uint64_t n : {uint64_t(0), uint64_t(1), kPlainMask}) {
    Xfer p = decodeXfer(plainXfer(n));
    EXPECT_EQ(p.family, Family::kPlain);
    EXPECT_EQ(p.seq, n);
    Xfer c = decodeXfer(countsXfer(n));
    EXPECT_EQ(c.family, Family::kCounts);
    EXPECT_EQ(c.seq, n);
  }
  // Past its field a counter wraps inside its family, never into another.
  EXPECT_EQ(decodeXfer(plainXfer(kPlainMask + 1)).family, Family::kPlain);
  EXPECT_EQ(decodeXfer(plainXfer(~0ull)).family, Family::kPlain);
  EXPECT_EQ(decodeXfer(countsXfer(~0ull)).family, Family::kCounts);

  const std::vector<uint64_t> steps = {0,          kStepHier,    kStepHier + kHierLanes, kStepSplit,
                                       kStepSplit + kSplitRounds - 1, kStepHeaders, kStepResult, kStepGather,
                                       kStepNodes, kStepNodes + kLaneRoom - 1};
  for (uint64_t seq : {uint64_t(0), uint64_t(7), kCollSeqMask, kCollSeqMask + 5})
    for (uint64_t step : steps) {
      Xfer x = decodeXfer(collectiveXfer(seq, step));
      EXPECT_EQ(x.family, Family::kCollective);
      EXPECT_EQ(x.seq, seq & kCollSeqMask);
      EXPECT_EQ(x.step, step);
    }
  // A lane adds to the step tag: the last lane of each range is still its range's.
  Xfer last = decodeXfer(collectiveLane(collectiveXfer(kCollSeqMask, kStepNodes), kLaneRoom - 1));
  EXPECT_EQ(last.family, Family::kCollective);
  EXPECT_EQ(last.step, kStepLimit - 1);
  EXPECT_EQ(last.seq, kCollSeqMask);
  Xfer hier = decodeXfer(collectiveLane(collectiveXfer(3, kStepHier + 1), kHierLanes - 1));
  EXPECT_EQ(hier.step, kStepFixed - 1);  // below the fixed tags
}

TEST(MsgId, FamiliesAtTheirLimitsNeverMeet) {
  std::set<uint64_t> ids;
  std::vector<uint64_t> all;
  for (uint64_t n : {uint64_t(0), kCollSeqMask, kPlainMask}) {
    all.push_back(plainXfer(n));
    all.push_back(countsXfer(n));
  }
  for (uint64_t seq : {uint64_t(0), kCollSeqMask})
    for (uint64_t step : {uint64_t(0), kStepLimit - 1}) all.push_back(collectiveXfer(seq, step));
  for (uint64_t id : all) EXPECT_TRUE(ids.insert(id).second) << std::hex << id;
}

}  // namespace
}  // namespace zp
