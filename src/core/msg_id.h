// The one registry of message ids: every number that tells two ranks' messages
// apart, besides the peer and the OpKind, is made and read here, so that no
// two families can overlap without a static_assert saying so (as Gloo keeps
// its slot prefixes in one place, gloo/types.h).
//
// Two spaces:
//  - Sequence numbers (Op::seq, the status messages' collSeq): a message's
//    place among one pair's messages of one lane, kSeqBits wide because the
//    network's tags carry no more (transport/ucx). The top kControlCount of
//    them are control messages (a transport's own: a rank leaving, NIC news,
//    acknowledgements); counts of messages and calls stay below.
//  - Transfer ids (RoutedXfer::id, and what the relay's headers carry): which
//    transfer of (source, destination, OpKind) a routed chunk belongs to. Bits
//    61 and 62 name the family; below them a family's own fields:
//      plain       a counter: the n-th routed point-to-point transfer of a
//                  pair, an alltoallv call's sequence number, or a relayed
//                  status message's sequence number (by OpKind)
//      counts      bit 62: alltoallv's count exchange of call seq
//      collective  bit 61: a standard collective's step, seq's low 40 bits
//                  and a 21-bit step tag from bit 40 (0 the header check,
//                  then each algorithm's own, the same on both ends)
#pragma once

#include <cstdint>

namespace zp {
namespace msgid {

// ---- Sequence numbers ----
constexpr int kSeqBits = 36;
constexpr uint64_t kSeqLimit = 1ull << kSeqBits;
constexpr uint64_t kControlCount = 16;
constexpr uint64_t kFirstControl = kSeqLimit - kControlCount;

// The control messages (top of the sequence space, one number each).
enum class Control : uint64_t {
  kLeaving = 1,   // this rank reached zpCommDestroy
  kNicDown = 2,   // text: "node rail name"
  kAck = 3,       // text: acknowledgements (the relay's)
  kRailView = 4,  // text: "node " + a RailView's bytes (a verdict on a rail changed)
  kLeftDone = 5,  // to a rank that is leaving: nothing of the sender's is on a path through it any more
};
constexpr uint64_t controlSeq(Control c) { return kSeqLimit - (uint64_t)c; }
constexpr bool isControl(uint64_t seq) { return seq >= kFirstControl && seq < kSeqLimit; }
constexpr Control controlOf(uint64_t seq) { return (Control)(kSeqLimit - seq); }
static_assert(controlSeq(Control::kLeftDone) >= kFirstControl, "control messages must stay in the reserved range");

// Chunk k to one hop travels as two messages on kLaneStanding (the relay's
// chunks): its header, then its bytes, numbered in that order.
struct ChunkSeqs {
  uint64_t header, data;
};
constexpr ChunkSeqs chunkSeqs(uint64_t k) { return {2 * k, 2 * k + 1}; }
constexpr uint64_t chunkOf(uint64_t seq) { return seq / 2; }
constexpr bool isChunkData(uint64_t seq) { return (seq & 1) != 0; }
// The last chunk whose two messages stay below the control range.
constexpr uint64_t kMaxChunk = kFirstControl / 2 - 1;
static_assert(chunkSeqs(kMaxChunk).data < kFirstControl, "chunks must stay below control");

// ---- Transfer ids ----
enum class Family { kPlain, kCounts, kCollective };
constexpr int kCollectiveBit = 61, kCountsBit = 62;
constexpr int kStepShift = 40, kStepBits = 21;
constexpr uint64_t kPlainMask = (1ull << kCollectiveBit) - 1;
constexpr uint64_t kCollSeqMask = (1ull << kStepShift) - 1;
constexpr uint64_t kStepLimit = 1ull << kStepBits;
static_assert(kStepShift + kStepBits == kCollectiveBit, "the step field must end below the collective bit");
static_assert(kCountsBit > kCollectiveBit && kCountsBit < 63, "the family bits must not overlap");

// A point-to-point transfer (the n-th of its pair), an alltoallv call's data,
// a relayed status message: the number itself (below the family bits).
constexpr uint64_t plainXfer(uint64_t n) { return n & kPlainMask; }
constexpr uint64_t countsXfer(uint64_t seq) { return 1ull << kCountsBit | (seq & kPlainMask); }
constexpr uint64_t collectiveXfer(uint64_t seq, uint64_t step) {
  return 1ull << kCollectiveBit | (step & (kStepLimit - 1)) << kStepShift | (seq & kCollSeqMask);
}
// A collective step's id for one of its lanes (the step tag plus the lane:
// the caller keeps step + lane below its range's end).
constexpr uint64_t collectiveLane(uint64_t id, uint64_t lane) { return id + (lane << kStepShift); }

struct Xfer {
  Family family;
  uint64_t seq;   // the counter, the call's sequence number (collective: its low 40 bits)
  uint64_t step;  // collective only
};
constexpr Xfer decodeXfer(uint64_t id) {
  return (id >> kCountsBit & 1)       ? Xfer{Family::kCounts, id & kPlainMask, 0}
         : (id >> kCollectiveBit & 1) ? Xfer{Family::kCollective, id & kCollSeqMask, id >> kStepShift & (kStepLimit - 1)}
                                      : Xfer{Family::kPlain, id & kPlainMask, 0};
}

// ---- The standard collectives' step tags (the step field) ----
// 0: the header check's first round. The hierarchical all-gather's and
// reduce-scatter's rounds: the node's round at kStepHier, the rail ring's
// messages from kStepHier + 1 on, one lane each, kHierLanes of them. The
// fixed tags from kStepFixed (reduce's kStepGather follows its
// reduce-scatter in one call; zpCommSplit's rounds from kStepSplit). The
// hierarchical all-reduce's rounds from kStepNodes, kLaneRoom of them, to
// the field's end.
constexpr uint64_t kStepHier = 0x8000, kStepFixed = 0xFFF0;
constexpr uint64_t kHierLanes = kStepFixed - kStepHier - 1;
constexpr uint64_t kStepSplit = 0xFFF0, kSplitRounds = 2;
constexpr uint64_t kStepHeaders = 0xFFFC, kStepResult = 0xFFFD, kStepGather = 0xFFFE;
constexpr uint64_t kStepNodes = 0x10000, kLaneRoom = kStepLimit - kStepNodes;
static_assert(kStepHier + 1 + kHierLanes == kStepFixed, "the rail ring's lanes end where the fixed tags start");
static_assert(kStepSplit >= kStepFixed && kStepSplit + kSplitRounds <= kStepHeaders, "split's rounds overlap a tag");
static_assert(kStepHeaders < kStepResult && kStepResult < kStepGather && kStepGather < kStepNodes,
              "the fixed tags must be distinct and below the all-reduce's rounds");
static_assert(kStepNodes + kLaneRoom == kStepLimit, "the all-reduce's rounds must fit the step field");

}  // namespace msgid
}  // namespace zp
