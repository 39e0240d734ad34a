// The batch plan as plain data: where every token of a variable-length batch
// lives for attention and for the linear layers. The planner (planner.cc)
// makes it, the layout objects of the C API wrap its layouts, remap moves
// tokens between two layouts, and the attention driver runs rings over the
// ranks it assigns. Every rank computes the same plan from the same input.
#pragma once

#include <cstdint>
#include <vector>

namespace zp::plan {

// A run of consecutive tokens of one sequence: tokens [start, start + count).
struct Segment {
  int64_t seq = 0;
  int64_t start = 0;
  int64_t count = 0;  // > 0: empty segments are never stored
};

// For each rank, its segments in the order its buffers hold them (a rank's
// buffer is the concatenation of its segments' tokens).
struct Layout {
  std::vector<int64_t> seqLens;             // tokens of each sequence
  std::vector<std::vector<Segment>> ranks;  // ranks[r] = segments of rank r
};

// Where attention for one sequence runs.
enum class SeqClass { Local = 0, IntraNode = 1, InterNode = 2 };

struct SeqPlacement {
  int64_t seq = 0;
  int64_t len = 0;
  SeqClass cls = SeqClass::Local;
  // The ring over which the sequence is split, in ring order (one rank when
  // local). Split over G = ranks.size() ranks: non-causal sequences are cut
  // into G chunks, chunk i on ranks[i]; causal ones into 2G chunks (zigzag),
  // chunks i and 2G-1-i on ranks[i], in that order. Chunk c covers tokens
  // [c * len / C, (c + 1) * len / C) for C chunks (integer division), so any
  // length works; chunks that come out empty are left out of the layout.
  std::vector<int> ranks;
  // Heads split this many ways (Ulysses; 1: every rank of the ring holds
  // every head). With u > 1 each u consecutive ranks of the ring, one node's,
  // are a position: they exchange their chunks by all-to-all so that each
  // holds the position's tokens for 1/u of the heads, and the ring runs over
  // the G / u positions. The layout is the one above: the u ranks of
  // position p hold, together, exactly the chunks position p holds in a
  // ring of G / u. Only the simulator's plans split heads (PlanOptions::
  // headSplits); the attention driver does not run them (docs/simulator.md).
  int ulysses = 1;
};

// The chunks ring position j of G holds of a sequence of len tokens, as
// SeqPlacement says: chunk j, and chunk 2G-1-j when causal and G > 1, with
// their token ranges [begin, end) (end == begin for a chunk that comes out
// empty). The planner lays chunks out by it and the attention driver finds
// them by it.
struct ChunkSpan {
  int64_t index, begin, end;
};
// One or two chunks, iterable (no allocation: the planner asks for every
// rank of every ring of every candidate).
struct RingChunks {
  ChunkSpan span[2];
  int count = 0;
  const ChunkSpan* begin() const { return span; }
  const ChunkSpan* end() const { return span + count; }
};
inline RingChunks ringChunks(int64_t len, int G, bool causal, int j) {
  const int64_t C = causal && G > 1 ? 2 * int64_t(G) : G;
  RingChunks out;
  for (int64_t c : {int64_t(j), 2 * int64_t(G) - 1 - j}) {
    out.span[out.count++] = {c, c * len / C, (c + 1) * len / C};
    if (C == G) break;
  }
  return out;
}

struct BatchPlan {
  bool causal = false;
  std::vector<SeqPlacement> seqs;  // indexed by sequence id
  // The order attention runs in: every sequence id once. Each rank runs its
  // rings and its local sequences in this order, forward, and in the reverse
  // order backward; sequences that share a ring run as one group, at the
  // place of the first of them. The planner schedules by it (a ring starts
  // when the last of its ranks is free), the simulator and the attention
  // driver run it as given.
  std::vector<int64_t> order;
  // The planner's own modelled makespans of attention's forward and
  // backward passes in `order` (seconds; 0 for a plan planBatch did not
  // make): run as the executor runs it (attnMakespan), the plan takes
  // exactly these.
  double plannedForward = 0, plannedBackward = 0;
  Layout attention;                // from seqs, as described above
  // Token balanced: every rank within one token of the mean (planner.h,
  // balancedLinear). Not built (no ranks) in the candidates the planner
  // scores (PlanOptions::score): a plan with a million segments per layout
  // would build it only to be costed. Then it stands for balancedLinear's
  // layout; planBatch returns every plan with it built, or with
  // linearOnAttention. Read through linearLayout().
  Layout linear;
  // The linear layers run on the attention layout (no remap: a step model,
  // PlanOptions::score, found that faster). `linear` is then not built:
  // a copy of the attention layout (four million segments in a DP x CP
  // plan of 16,384 ranks) would only be read as the attention layout is.
  bool linearOnAttention = false;
};

// The layout a plan's linear layers run on.
inline const Layout& linearLayout(const BatchPlan& plan) {
  return plan.linearOnAttention ? plan.attention : plan.linear;
}

}  // namespace zp::plan
