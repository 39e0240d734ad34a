// A batch plan from given rings (planFromRings) and what can be read off a
// plan: its layouts, makespans and per-rank loads (planner.h). The planner
// builds a plan from every candidate it scores in full.
#include "src/plan/planner.h"
#include "src/plan/schedule.h"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <stdexcept>
#include <string>
#include <type_traits>

namespace zp::plan {

// Lengths and their sum are bounded so that no token count, offset or cost
// the planner computes can overflow (a sum of int64 lengths can).
constexpr int64_t kMaxSeqTokens = int64_t(1) << 40;
constexpr int64_t kMaxBatchTokens = int64_t(1) << 48;

void validateLengths(const std::vector<int64_t>& lens, const char* fn) {
  int64_t total = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    if (lens[i] < 1 || lens[i] > kMaxSeqTokens)
      throw std::invalid_argument(std::string(fn) + ": sequence " + std::to_string(i) + " has length " +
                                  std::to_string(lens[i]) + " (must be from 1 to 2^40)");
    total += lens[i];  // cannot overflow: each term is at most 2^40 and the sum stops at 2^48
    if (total > kMaxBatchTokens)
      throw std::invalid_argument(std::string(fn) + ": the batch has more than 2^48 tokens");
  }
}

namespace {

// Tokens per rank: every rank within one token of the mean (the first
// total % n ranks one more).
std::vector<int64_t> quotas(int64_t total, int n) {
  std::vector<int64_t> quota(n);
  for (int r = 0; r < n; ++r) quota[r] = total / n + (r < total % n ? 1 : 0);
  return quota;
}

// The token-balanced linear layout of an attention layout, walked without
// being built: each rank keeps the front of its attention tokens up to its
// quota, so those do not move (keep(r, segment)); the surplus fills the
// ranks that are short, from their own node first (a remap then crosses the
// network only for what a node cannot balance itself), in rank order
// (take(r, segment, from): rank r takes the piece from attention rank
// `from`). Each rank's calls come in the order of its linear segments, its
// keeps before its takes. With `tokens` (each rank's attention tokens,
// rankTokens) and no keeps wanted (keep == nullptr), a rank's segments are
// not read up to its quota: a rank at or under it gives nothing, one over
// it gives the segments past it (found from the back).
template <class Keep, class Take>
void walkBalanced(const Layout& attn, int ranksPerNode, Keep keep, Take take,
                  const std::vector<int64_t>* tokens = nullptr) {
  const int n = int(attn.ranks.size());
  if (ranksPerNode < 1) ranksPerNode = std::max(n, 1);  // one node
  const std::vector<int64_t> quota = quotas(std::accumulate(attn.seqLens.begin(), attn.seqLens.end(), int64_t{0}), n);
  const int nodes = (n + ranksPerNode - 1) / ranksPerNode;
  struct Piece {
    Segment s;
    int from;
  };
  std::vector<std::vector<Piece>> surplus(nodes);
  std::vector<int64_t> have(n, 0);
  for (int r = 0; r < n; ++r) {
    if constexpr (std::is_same_v<Keep, std::nullptr_t>) {
      if (tokens) {
        const std::vector<Segment>& segs = attn.ranks[r];
        have[r] = std::min((*tokens)[r], quota[r]);
        // The last segments, from the back, until they hold the excess: the
        // first of them is cut at the quota, the rest go whole.
        const int64_t excess = (*tokens)[r] - quota[r];
        size_t k = segs.size();
        int64_t tail = 0;
        while (tail < excess && k > 0) tail += segs[--k].count;
        for (int64_t prefix = (*tokens)[r] - tail; k < segs.size(); ++k) {
          const Segment& s = segs[k];
          const int64_t kept = std::max<int64_t>(0, quota[r] - prefix);
          surplus[r / ranksPerNode].push_back({{s.seq, s.start + kept, s.count - kept}, r});
          prefix += s.count;
        }
        continue;
      }
    }
    for (const Segment& s : attn.ranks[r]) {
      const int64_t kept = std::min(s.count, quota[r] - have[r]);
      if (kept > 0) {  // never below 0: have[r] stops at quota[r]
        if constexpr (!std::is_same_v<Keep, std::nullptr_t>) keep(r, Segment{s.seq, s.start, kept});
        have[r] += kept;
      }
      if (kept < s.count) surplus[r / ranksPerNode].push_back({{s.seq, s.start + kept, s.count - kept}, r});
    }
  }
  std::vector<size_t> next(nodes, 0);
  auto fill = [&](int r, int nd) {
    while (have[r] < quota[r] && next[nd] < surplus[nd].size()) {
      Piece& p = surplus[nd][next[nd]];
      const int64_t got = std::min(p.s.count, quota[r] - have[r]);
      take(r, Segment{p.s.seq, p.s.start, got}, p.from);
      have[r] += got;
      p.s.start += got;
      p.s.count -= got;
      if (p.s.count == 0) ++next[nd];
    }
  };
  for (int r = 0; r < n; ++r) fill(r, r / ranksPerNode);
  // The first node with surplus left (surplus only shrinks): the ranks
  // still short take from the nodes in order without rescanning the spent.
  int lo = 0;
  for (int r = 0; r < n; ++r)
    for (int nd = lo; nd < nodes && have[r] < quota[r]; ++nd) {
      fill(r, nd);
      if (nd == lo && next[nd] == surplus[nd].size()) ++lo;
    }
}

// Lays out a plan's attention segments from its rings (plan.h). The
// sequences on one ring (a packed group of a DP x CP placement: a group of
// 64 ranks cuts each of its sequences into 128 chunks) are laid out
// together, rank by rank, so that each rank's list grows in one place at a
// time: appended sequence by sequence, every rank of the group is touched
// for every sequence, and at a million segments those scattered appends
// were most of a plan's building. Each rank's segments stay in sequence
// order, as plan.h has them: a rank whose list came out of order (it is on
// several rings) is sorted by sequence.
void layAttention(BatchPlan* plan) {
  const std::vector<SeqPlacement>& seqs = plan->seqs;
  const size_t m = seqs.size();
  // Each sequence's ring by its first sequence (rings compared by ranks),
  // in an open-addressed table of the first sequences (no node per ring).
  // The hash reads a ring's size and three of its ranks, not all of them
  // (a group of 64 names 64 for every sequence): rings that differ only
  // elsewhere share a hash and are told apart by their ranks.
  auto hashOf = [&](size_t i) {
    const std::vector<int>& ranks = seqs[i].ranks;
    uint64_t h = (1469598103934665603ull ^ ranks.size()) * 1099511628211ull;
    for (int r : {ranks.front(), ranks[ranks.size() / 2], ranks.back()}) h = (h ^ uint64_t(uint32_t(r))) * 1099511628211ull;
    return h ^ (h >> 29);
  };
  size_t slots = 1;
  while (slots < m + m / 2 + 1) slots *= 2;  // at most two thirds full
  constexpr uint32_t kEmpty = UINT32_MAX;    // no sequence (planFromRings takes fewer)
  std::vector<uint32_t> firsts(slots, kEmpty);
  std::vector<size_t> groupOf(m), start;  // start: each group's first place in members
  for (size_t i = 0; i < m; ++i) {
    size_t h = size_t(hashOf(i)) & (slots - 1);
    while (firsts[h] != kEmpty && seqs[firsts[h]].ranks != seqs[i].ranks) h = (h + 1) & (slots - 1);
    if (firsts[h] == kEmpty) {
      firsts[h] = uint32_t(i);
      groupOf[i] = start.size();
      start.push_back(0);
    } else {
      groupOf[i] = groupOf[firsts[h]];
    }
  }
  // The sequences of each group, in sequence order; groups by their first.
  std::vector<size_t> members(m);
  start.push_back(0);
  for (size_t i = 0; i < m; ++i) ++start[groupOf[i] + 1];
  for (size_t g = 1; g < start.size(); ++g) start[g] += start[g - 1];
  std::vector<size_t> at(start.begin(), start.end() - 1);
  for (size_t i = 0; i < m; ++i) members[at[groupOf[i]]++] = i;
  std::vector<std::vector<Segment>>& out = plan->attention.ranks;
  std::vector<char> unsorted(out.size(), 0);
  // Chunk boundaries (plan.h: chunk c starts at c * len / C) by sequence of
  // a block of the group, made without a division per chunk: the divisions
  // of ringChunks were most of laying out a group of 64 ranks.
  std::vector<int64_t> bound, seqOf;
  // A rank's segments of one block, written here first and appended at
  // once: a push_back per segment checks the list's room every time.
  std::vector<Segment> run;
  constexpr size_t kBlockBounds = size_t(1) << 16;  // a block's table stays in cache
  for (size_t g = 0; g + 1 < start.size(); ++g) {
    const std::vector<int>& ring = seqs[members[start[g]]].ranks;
    const int G = int(ring.size());
    const int64_t C = plan->causal && G > 1 ? 2 * int64_t(G) : G;
    const size_t per = size_t(C) + 1, block = std::max<size_t>(1, kBlockBounds / per);
    for (size_t from = start[g]; from < start[g + 1]; from += block) {
      const size_t to = std::min(start[g + 1], from + block);
      bound.resize((to - from) * per);
      seqOf.resize(to - from);
      for (size_t k = from; k < to; ++k) {
        seqOf[k - from] = seqs[members[k]].seq;
        // c * len / C, exactly: quotient and remainder grow by len's.
        const int64_t len = seqs[members[k]].len, q = len / C, rem = len % C;
        int64_t* b = &bound[(k - from) * per];
        int64_t at = 0, left = 0;
        for (int64_t c = 0; c <= C; ++c) {
          b[c] = at;
          at += q, left += rem;
          if (left >= C) ++at, left -= C;
        }
      }
      run.resize(2 * (to - from));
      for (int j = 0; j < G; ++j) {
        std::vector<Segment>& segs = out[size_t(ring[j])];
        if (!segs.empty() && segs.back().seq > int64_t(members[from])) unsorted[size_t(ring[j])] = 1;
        const int64_t d = C - 1 - j;  // causal: the zigzag's second chunk
        Segment* at = run.data();
        for (size_t k = 0; k < to - from; ++k) {
          const int64_t* b = &bound[k * per];
          if (b[j + 1] > b[j]) *at++ = {seqOf[k], b[j], b[j + 1] - b[j]};
          if (C == G) continue;
          if (b[d + 1] > b[d]) *at++ = {seqOf[k], b[d], b[d + 1] - b[d]};
        }
        // Resized, then copied: insert would copy a Segment (not trivial:
        // its fields have initializers) one at a time.
        segs.insert(segs.end(), run.data(), at);
      }
    }
  }
  // Stable: a sequence's two chunks on a rank stay in their order.
  for (size_t r = 0; r < out.size(); ++r)
    if (unsorted[r])
      std::stable_sort(out[r].begin(), out[r].end(), [](const Segment& a, const Segment& b) { return a.seq < b.seq; });
}

// The message for a plan that splits heads, which the planner's model does
// not cost.
std::string headSplitCosted(const char* fn, int64_t seq) {
  return std::string(fn) + ": sequence " + std::to_string(seq) +
         " splits its heads (Ulysses), which only the simulator's step model costs";
}

}  // namespace

Layout balancedLinear(const Layout& attention, int ranksPerNode) {
  Layout lin;
  lin.seqLens = attention.seqLens;
  lin.ranks.resize(attention.ranks.size());
  for (size_t r = 0; r < lin.ranks.size(); ++r) lin.ranks[r].reserve(attention.ranks[r].size());
  walkBalanced(
      attention, ranksPerNode, [&](int r, const Segment& s) { lin.ranks[r].push_back(s); },
      [&](int r, const Segment& s, int) { lin.ranks[r].push_back(s); });
  return lin;
}

std::vector<BalancedMove> balancedMoves(const Layout& attention, int ranksPerNode,
                                        const std::vector<int64_t>* tokens) {
  std::vector<BalancedMove> moves;
  walkBalanced(
      attention, ranksPerNode, nullptr, [&](int r, const Segment& s, int from) { moves.push_back({r, from, s}); },
      tokens);
  // Each rank's pieces stay in the order of its linear segments. The walk
  // makes them in two runs, each by rank (the ranks filled from their own
  // node, then from the others), so one stable merge of the runs sorts
  // them as a stable sort would.
  auto byRank = [](const BalancedMove& a, const BalancedMove& b) { return a.to < b.to; };
  const auto second = std::is_sorted_until(moves.begin(), moves.end(), byRank);
  if (std::is_sorted(second, moves.end(), byRank)) std::inplace_merge(moves.begin(), second, moves.end(), byRank);
  else std::stable_sort(moves.begin(), moves.end(), byRank);
  return moves;
}

std::vector<int64_t> balancedTokens(const Layout& attention) {
  return quotas(std::accumulate(attention.seqLens.begin(), attention.seqLens.end(), int64_t{0}),
                int(attention.ranks.size()));
}

void buildLinear(BatchPlan* plan, int ranksPerNode) {
  if (plan->linear.ranks.empty() && !plan->linearOnAttention)
    plan->linear = balancedLinear(plan->attention, ranksPerNode);
}

BatchPlan planFromRings(const std::vector<int64_t>& lens, bool causal, std::vector<std::vector<int>> rings,
                        int n, int ranksPerNode, bool linear) {
  if (rings.size() != lens.size()) throw std::invalid_argument("planFromRings: one ring per sequence");
  if (lens.size() >= size_t(UINT32_MAX)) throw std::invalid_argument("planFromRings: 2^32 - 1 sequences or more");
  if (n < 1 || n > kMaxPlanRanks) throw std::invalid_argument("planFromRings: " + std::to_string(n) + " ranks (1 to 2^22)");
  validateLengths(lens, "planFromRings");
  if (ranksPerNode < 1) ranksPerNode = n;
  BatchPlan plan;
  plan.causal = causal;
  plan.attention.seqLens = lens;
  plan.attention.ranks.resize(n);
  plan.seqs.resize(lens.size());
  std::vector<int64_t> seenIn(n, -1);  // the last sequence whose ring named each rank
  // Each rank's segments are counted first (at most two a ring position), so
  // its list is allocated once: the planner builds a plan for every candidate
  // it scores, and a DP x CP candidate has a segment on every rank of its
  // group for every sequence.
  std::vector<size_t> segsOf(n, 0);
  for (size_t i = 0; i < lens.size(); ++i) {
    // The message is built only on failure, not for every sequence.
    auto where = [i] { return "sequence " + std::to_string(i) + ": "; };
    if (lens[i] < 1) throw std::invalid_argument(where() + "length " + std::to_string(lens[i]) + " is below 1");
    if (rings[i].empty()) throw std::invalid_argument(where() + "a ring of no ranks");
    const size_t chunks = causal && rings[i].size() > 1 ? 2 : 1;  // per rank of the ring
    for (int r : rings[i]) {
      if (uint32_t(r) >= uint32_t(n))  // r < 0 or r >= n (n >= 1)
        throw std::invalid_argument(where() + "rank " + std::to_string(r) + " is outside [0, " + std::to_string(n) + ")");
      if (seenIn[r] == int64_t(i)) throw std::invalid_argument(where() + "rank " + std::to_string(r) + " is twice in its ring");
      seenIn[r] = int64_t(i);
      segsOf[r] += chunks;
    }
  }
  for (size_t i = 0; i < lens.size(); ++i) {
    SeqPlacement& p = plan.seqs[i];
    p.seq = static_cast<int64_t>(i);
    p.len = lens[i];
    p.ranks = std::move(rings[i]);  // checked above; not read again
    p.cls = SeqClass::Local;
    if (p.ranks.size() > 1) {
      // The first rank's node as a range of ranks (checked: every rank is
      // in [0, n)), not a division for every rank: a DP x CP candidate
      // names every rank of its group for every sequence.
      const int64_t lo = int64_t(p.ranks.front()) / ranksPerNode * ranksPerNode, hi = lo + ranksPerNode;
      p.cls = std::all_of(p.ranks.begin(), p.ranks.end(), [&](int r) { return r >= lo && r < hi; })
                  ? SeqClass::IntraNode
                  : SeqClass::InterNode;
    }
  }
  for (int r = 0; r < n; ++r) plan.attention.ranks[r].reserve(segsOf[r]);
  layAttention(&plan);
  // Inter-node rings, then intra-node rings, then local sequences, each in
  // sequence order: the order the driver ran before plans carried one.
  plan.order.reserve(lens.size());
  for (SeqClass cls : {SeqClass::InterNode, SeqClass::IntraNode, SeqClass::Local})
    for (size_t i = 0; i < lens.size(); ++i)
      if (plan.seqs[i].cls == cls) plan.order.push_back(int64_t(i));
  if (linear) plan.linear = balancedLinear(plan.attention, ranksPerNode);
  return plan;
}

void setOrder(BatchPlan* plan, const std::vector<int64_t>& order) {
  const size_t n = plan->seqs.size();
  if (order.size() != n)
    throw std::invalid_argument("the order names " + std::to_string(order.size()) + " sequences, the plan has " +
                                std::to_string(n));
  std::vector<bool> seen(n, false);
  for (size_t i = 0; i < n; ++i) {
    if (order[i] < 0 || order[i] >= int64_t(n))
      throw std::invalid_argument("order[" + std::to_string(i) + "] = " + std::to_string(order[i]) +
                                  " is not a sequence of the plan");
    if (seen[order[i]])
      throw std::invalid_argument("order[" + std::to_string(i) + "]: sequence " + std::to_string(order[i]) +
                                  " is named twice");
    seen[order[i]] = true;
  }
  plan->order = order;
}

std::vector<double> rankAttnSeconds(const BatchPlan& plan, const AttnShape& shape,
                                    const ClusterModel& c) {
  std::vector<double> load(c.ranks(), 0.0);
  for (const SeqPlacement& p : plan.seqs) {
    if (p.ulysses > 1) throw std::invalid_argument(headSplitCosted("rankAttnSeconds", p.seq));
    int G = static_cast<int>(p.ranks.size());
    const Link link = linkOf(p.cls, c);
    double t = ringSeconds(p.len, plan.causal, G, link, shape, c);
    for (int r : p.ranks) load[r] += t;
  }
  return load;
}

void orderByClassAndSize(BatchPlan* plan) {
  const std::vector<SeqPlacement>& seqs = plan->seqs;
  std::stable_sort(plan->order.begin(), plan->order.end(), [&](int64_t a, int64_t b) {
    const SeqPlacement &x = seqs[a], &y = seqs[b];
    if (x.cls != y.cls) return x.cls > y.cls;
    if (x.ranks.size() != y.ranks.size()) return x.ranks.size() > y.ranks.size();
    return x.len > y.len;
  });
}

double attnMakespan(const BatchPlan& plan, const AttnShape& shape, const ClusterModel& c, bool backward) {
  std::vector<double> freeAt(plan.attention.ranks.size(), 0.0);
  for (size_t k = 0; k < plan.order.size(); ++k) {
    const SeqPlacement& p = plan.seqs[plan.order[backward ? plan.order.size() - 1 - k : k]];
    if (p.ulysses > 1) throw std::invalid_argument(headSplitCosted("attnMakespan", p.seq));
    const Link link = linkOf(p.cls, c);
    const int G = int(p.ranks.size());
    const double t = backward ? ringBackwardSeconds(p.len, plan.causal, G, link, shape, c)
                              : ringSeconds(p.len, plan.causal, G, link, shape, c);
    double at = 0;
    for (int r : p.ranks) at = std::max(at, freeAt[r]);
    for (int r : p.ranks) freeAt[r] = at + t;
  }
  return freeAt.empty() ? 0 : *std::max_element(freeAt.begin(), freeAt.end());
}

double imbalance(const std::vector<double>& v) {
  if (v.empty()) return 1.0;
  double mx = *std::max_element(v.begin(), v.end());
  double mean = std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  return mean > 0 ? mx / mean : 1.0;
}

std::vector<int64_t> rankTokens(const Layout& layout) {
  std::vector<int64_t> t;
  for (const auto& segs : layout.ranks) {
    int64_t n = 0;
    for (const Segment& s : segs) n += s.count;
    t.push_back(n);
  }
  return t;
}
}  // namespace zp::plan
