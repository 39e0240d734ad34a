// The baselines the simulator compares Zeppelin with: what a practitioner
// runs instead, each tuned per batch (group size, split length) by the step
// model and kept within each rank's token capacity. docs/simulator.md says
// which deployed system each stands for and what network it is given.
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "src/plan/growing_min.h"
#include "src/plan/schedule.h"
#include "src/sim/step_model.h"

namespace zp::sim {

using namespace zp::plan;
using plan::GrowingMin;
using plan::RoomTree;

namespace {

// Sequence indexes by a key, largest first (ties in input order). guess:
// an order that is often the answer (checked first, plan::stableSortFromGuess).
template <class Key>
std::vector<size_t> largestFirst(size_t count, Key key, const std::vector<size_t>* guess = nullptr) {
  std::vector<double> keys(count);  // each key once, not once per comparison
  for (size_t i = 0; i < count; ++i) keys[i] = key(i);
  auto before = [&](size_t a, size_t b) { return keys[a] > keys[b]; };
  if (guess && guess->size() == count) {
    std::vector<size_t> order = *guess;
    plan::stableSortFromGuess(order, before);
    return order;
  }
  std::vector<size_t> order(count);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), before);
  return order;
}

// Each sequence's attention compute on one rank of a ring (splitRingCompute),
// kept per ring size over the ring's positions (G / u): the floors of every
// setting of every baseline ask for the same few sizes, dp_cp's groups of R
// ranks and usp_cp's of R positions alike. Each figure is made when first
// asked for, as splitRingCompute makes it (the same bits).
class RingComputes {
 public:
  RingComputes(const std::vector<int64_t>& lens, const StepConfig& cfg, const ClusterModel& c)
      : lens_(lens), cfg_(cfg), c_(c), byPositions_(size_t(c.ranks()) + 1) {}
  // The figures of rings over R positions (< 0: not made yet), for a
  // caller that asks for many sequences at one size.
  std::vector<double>& positions(int R) {
    std::vector<double>& made = byPositions_[size_t(R)];
    if (made.empty()) made.assign(lens_.size(), -1.0);
    return made;
  }
  // Sequence i's step compute on a ring over R positions (made: positions(R)).
  double compute(size_t i, int R, std::vector<double>& made) {
    if (made[i] < 0) made[i] = ringStepCompute(lens_[i], cfg_.causal, R, cfg_.model.attn, c_);
    return made[i];
  }
  // The sequences longest first (ties in index order), made once: the
  // guess of assignGroups' order (a group's cost grows with the length).
  const std::vector<size_t>& byLength() {
    if (byLength_.size() != lens_.size()) byLength_ = largestFirst(lens_.size(), [&](size_t i) { return double(lens_[i]); });
    return byLength_;
  }
  // Every sequence's figure at R positions, made: the most of them and
  // their sum (in sequence order), made once.
  struct Totals {
    double most = -1, sum = 0;
  };
  const Totals& totals(int R) {
    Totals& t = totals_[size_t(R)];
    if (t.most < 0) {
      std::vector<double>& made = positions(R);
      t.most = 0;
      for (size_t i = 0; i < lens_.size(); ++i) {
        t.most = std::max(t.most, compute(i, R, made));
        t.sum += made[i];
      }
    }
    return t;
  }
  // The batch's tokens, summed as stepFloor sums them (made once).
  double tokens() {
    if (tokens_ < 0) {
      tokens_ = 0;
      for (int64_t l : lens_) tokens_ += double(l);
    }
    return tokens_;
  }

 private:
  const std::vector<int64_t>& lens_;
  const StepConfig& cfg_;
  const ClusterModel& c_;
  std::vector<std::vector<double>> byPositions_;  // [R][i]; < 0: not made yet
  std::vector<size_t> byLength_;
  std::vector<Totals> totals_ = std::vector<Totals>(byPositions_.size());  // [R]
  double tokens_ = -1;
};

// The floor of a step whose every pass of a layer takes at least the
// ranks' mean attention compute and linear layers, and at least `most`
// (stepFloor, below). It grows with each of them.
double floorOf(double attn, double linear, double most, const StepConfig& cfg) {
  const double fwd = std::max(attn + linear, most), bwd = std::max(kAttnBackwardFlops * attn + 2 * linear,
                                                                   kAttnBackwardFlops * most);
  return cfg.model.layers * ((cfg.recompute ? 2 : 1) * fwd + bwd) * (1 - 1e-6);
}

// A lower bound of the step of any placement that runs every sequence i on
// a ring of size(i) ranks with its heads split u ways (1: no Ulysses), a
// baseline's or Zeppelin's plan of the same rings, with a remap or
// without: each pass of a layer takes at
// least the ranks' mean attention compute plus linear layers (every
// placement holds all of the batch's tokens for them), and at least one
// ring's compute on each of its ranks; exposed communication, remaps and
// waits only add. Slack for rounding: the step sums the same terms in
// another order.
template <class Size>
double stepFloor(const std::vector<int64_t>& lens, RingComputes& computes, Size size, const StepConfig& cfg,
                 const ClusterModel& c, int u = 1) {
  double sum = 0, most = 0, tokens = 0;
  // The ring size of the sequence before and its figures: most sequences
  // share their size with the one before (every one, for a group size).
  int lastG = 0, uG = 1, R = 1;
  std::vector<double>* made = nullptr;
  for (size_t i = 0; i < lens.size(); ++i) {
    const int G = size(i);
    if (G != lastG) {
      lastG = G, uG = G == 1 ? 1 : u, R = G / uG;
      made = &computes.positions(R);
    }
    // What each rank of the ring computes: G / u steps of u^2/G^2 of the
    // FLOPs, 1/u of the heads (splitRingCompute's figure, from the cache).
    const double perRank = R * computes.compute(i, R, *made) / uG;
    sum += G * perRank;
    most = std::max(most, perRank);
    tokens += double(lens[i]);
  }
  const int n = c.ranks();
  return floorOf(sum / n, linearSeconds(1, cfg, c) * tokens / n, most, cfg);
}

// Whether stepFloor of groups of g ranks, heads split u ways, reaches
// `beat` (never, with kNoBound). Asked first of a bound made from the
// figures' totals at the groups' positions, without a pass over the
// sequences: stepFloor's `most` exactly (R * x / uG grows with x), and its
// sum of g * perRank less far more than the rounding of summing it in
// another order; no more than the floor, and at or above `beat` for most
// of the settings ruled out.
bool groupFloorReaches(const std::vector<int64_t>& lens, RingComputes& computes, int g, int u, double beat,
                       const StepConfig& cfg, const ClusterModel& c) {
  if (!(beat < kNoBound)) return false;
  const int uG = g == 1 ? 1 : u, R = g / uG, n = c.ranks();
  const RingComputes::Totals& t = computes.totals(R);
  const double sum = g * (R * t.sum / uG) * (1 - 1e-6), most = R * t.most / uG;
  if (floorOf(sum / n, linearSeconds(1, cfg, c) * computes.tokens() / n, most, cfg) >= beat) return true;
  return stepFloor(lens, computes, [g](size_t) { return g; }, cfg, c, u) >= beat;
}

// Whether stepFloor reaches `beat` (never, with kNoBound). The longest
// sequence's ring alone (its compute on each of its ranks, one term of the
// floor's `most`) is asked first: floorOf of it, with no mean, is no more
// than the floor, and reaches `beat` for most of the settings ruled out
// without a pass over every sequence (and without their figures made).
template <class Size>
bool floorReaches(const std::vector<int64_t>& lens, RingComputes& computes, Size size, double beat,
                  const StepConfig& cfg, const ClusterModel& c, int u = 1) {
  if (!(beat < kNoBound)) return false;
  if (!lens.empty()) {
    const size_t i = computes.byLength().front();
    const int G = size(i), uG = G == 1 ? 1 : u, R = G / uG;
    const double perRank = R * computes.compute(i, R, computes.positions(R)) / uG;  // as stepFloor makes it
    if (floorOf(0, 0, perRank, cfg) >= beat) return true;
  }
  return stepFloor(lens, computes, size, cfg, c, u) >= beat;
}

// DP x CP(g): n / g groups of g consecutive ranks, each running one packed
// ring (Transformer Engine) or all-gather (Llama 3) over the sequences given
// to it. Sequences go to groups as WLB-LLM assigns them: by estimated cost
// (attention and linear), largest first, to the cheapest group that still
// has room for their tokens. The assignment depends on the group size
// alone, not on how a group runs attention: every Ulysses degree of a size
// (and dp_cp's and usp_cp's settings of it) shares one (bestGroup).
struct GroupAssignment {
  std::vector<std::vector<int64_t>> members, ids;  // per group: its sequences' lengths and ids
  std::vector<int64_t> tokens;                     // per group
  bool infeasible = false;                         // some sequence found no group with room
};

GroupAssignment assignGroups(const std::vector<int64_t>& lens, int g, int64_t cap, const StepConfig& cfg,
                             const ClusterModel& c, const std::vector<size_t>& byLength) {
  const int groups = c.ranks() / g;
  auto cost = [&](size_t i) {
    return attnComputeSeconds(attnFlops(lens[i], cfg.causal, cfg.model.attn), double(lens[i]) / g, c) +
           linearSeconds(lens[i], cfg, c);
  };
  std::vector<double> load(groups, 0);
  GroupAssignment a;
  a.tokens.assign(size_t(groups), 0);
  a.members.resize(size_t(groups));
  a.ids.resize(size_t(groups));
  std::vector<int64_t>& tokens = a.tokens;
  RoomTree<int64_t> byLoad(groups);  // the least loaded group with room for a sequence's tokens
  for (size_t i : largestFirst(lens.size(), cost, &byLength)) {
    int any = -1;
    int best = byLoad.least(lens[i], int64_t(g) * cap, &any);
    if (best < 0) {  // no room anywhere: the emptiest group, and the plan is infeasible
      best = 0;
      for (int k = 1; k < groups; ++k)
        if (tokens[k] < tokens[best] || (tokens[k] == tokens[best] && load[k] < load[best])) best = k;
      a.infeasible = true;
    }
    load[best] += cost(i);
    tokens[best] += lens[i];
    byLoad.set(best, load[best], tokens[best]);
    a.members[best].push_back(lens[i]);
    a.ids[best].push_back(int64_t(i));
  }
  return a;
}

// The placement of an assignment to groups of g ranks. ulysses > 1: each
// group is hierarchical (Ulysses over that many consecutive ranks, a ring
// over the group's positions), its inter-node hops over every GPU's own NIC.
Placement groupPlacement(const GroupAssignment& a, int g, bool allgather, const ClusterModel& c, int ulysses = 1) {
  const int n = c.ranks(), groups = n / g;
  Placement pl;
  pl.infeasibleAssignment = a.infeasible;
  const Link link = g <= c.ranksPerNode ? Link::Intra : ulysses > 1 ? Link::PerGpu : Link::Inter;
  pl.linTokens.assign(n, 0);
  for (int k = 0; k < groups; ++k) {
    Ring ring;
    ring.lens = a.members[k];
    ring.seqs = a.ids[k];
    for (int r = k * g; r < (k + 1) * g; ++r) {
      ring.ranks.push_back(r);
      pl.linTokens[r] = double(a.tokens[k]) / g;
    }
    ring.link = link;
    ring.allgather = allgather;
    ring.ulysses = ulysses;
    if (!ring.lens.empty()) pl.rings.push_back(ring);
  }
  pl.attnTokens = pl.linTokens;
  return pl;
}

// How a group runs attention: one packed ring (Transformer Engine's p2p),
// an all-gather (Llama 3), Ulysses over a node's ranks and a ring across
// nodes (Transformer Engine's a2a+p2p, Megatron's hierarchical context
// parallelism), or USP's 2-D layout (Ulysses over any power of two of a
// node's ranks, a ring over the rest; tuned per batch).
enum class GroupKind { Ring, AllGather, Hierarchical, Usp };

// Ulysses degrees a group of g ranks may use: powers of two that divide g,
// the node's ranks and both head counts (the heads are split among them).
std::vector<int> ulyssesDegrees(int g, const StepConfig& cfg, const ClusterModel& c) {
  std::vector<int> out;
  const AttnShape& sh = cfg.model.attn;
  for (int u = 2; u <= g && u <= c.ranksPerNode; u *= 2)
    if (g % u == 0 && c.ranksPerNode % u == 0 && sh.qHeads % u == 0 && sh.kvHeads % u == 0) out.push_back(u);
  return out;
}

// The best group size (and Ulysses degree) for this batch: the fastest
// feasible one (if none is feasible, the fastest, reported infeasible).
// With kind Ring or Usp, a setting whose stepFloor is at least `beat` is
// not made (none made: an empty result, name unset). `assigned`: the
// assignments to groups made so far, by group size (shared by the
// baselines tuned together).
Tuned bestGroup(const std::string& name, const std::vector<int64_t>& lens, GroupKind kind, int64_t cap,
                const StepConfig& cfg, const ClusterModel& c, std::map<int, GroupAssignment>& assigned,
                RingComputes& computes, double beat = kNoBound) {
  const int n = c.ranks();
  std::vector<int> sizes;
  for (int g = 1; g <= n; g *= 2)
    if (n % g == 0) sizes.push_back(g);
  if (sizes.back() != n) sizes.push_back(n);
  Tuned best;
  bool have = false;
  for (int g : sizes) {
    std::vector<int> degrees = {1};
    const std::vector<int> all = ulyssesDegrees(g, cfg, c);
    if (kind == GroupKind::Usp) degrees.insert(degrees.end(), all.begin(), all.end());
    if (kind == GroupKind::Hierarchical && !all.empty()) degrees = {all.back()};
    for (int u : degrees) {
      if ((kind == GroupKind::Ring || kind == GroupKind::Usp) && groupFloorReaches(lens, computes, g, u, beat, cfg, c))
        continue;
      auto at = assigned.find(g);
      if (at == assigned.end()) at = assigned.emplace(g, assignGroups(lens, g, cap, cfg, c, computes.byLength())).first;
      Placement pl = groupPlacement(at->second, g, kind == GroupKind::AllGather, c, u);
      StrategyResult r = evaluate(name, pl, cfg, c);
      r.group = g;
      r.ulysses = u;
      if (!have || fasterFeasible(r, best.result)) {
        best = {r, std::move(pl)};
        have = true;
      }
    }
  }
  return best;
}

// Megatron's dynamic context parallelism: each sequence on the smallest
// power-of-two group that leaves at most `split` of its tokens per rank,
// aligned groups;
// sequences largest-workload first onto the group whose busiest rank has the
// least seq^2 / cp workload (Megatron's balance) and room for the tokens;
// the sequences that share a group run as one packed ring.
// The group dynamic_cp gives a sequence: the smallest power of two of ranks
// that leaves at most `split` of its tokens per rank (at most all n).
int dynamicCpSize(int64_t len, int64_t split, int n) {
  int d = 1;
  while (d < n && (len + d - 1) / d > split) d *= 2;
  return std::min(d, n);
}

Tuned dynamicCpAt(const std::vector<int64_t>& lens, int64_t split, int64_t cap, const StepConfig& cfg,
                  const ClusterModel& c) {
  const int n = c.ranks();
  std::vector<int> cp(lens.size());
  for (size_t i = 0; i < lens.size(); ++i) cp[i] = dynamicCpSize(lens[i], split, n);
  auto work = [&](size_t i) { return double(lens[i]) * lens[i] / cp[i]; };
  std::vector<double> w(n, 0), tokens(n, 0);
  Placement pl;
  // Per power-of-two level d: the aligned blocks of d ranks, each with its
  // busiest rank's workload and tokens, the blocks by workload with their
  // tokens (the least loaded block with room for a sequence's share, a
  // tree search rather than a heap's pops and pushes). A placement on a
  // block raises every rank of it by the same amounts: the blocks inside
  // it rise by them, those around it to at least its new values.
  std::vector<int> levels;
  for (int d = 1; d <= n; d *= 2) levels.push_back(d);
  std::vector<std::vector<double>> blockW(levels.size()), blockT(levels.size());
  std::vector<RoomTree<double>> byW;
  // Each level's blocks changed since its tree was last asked (each once):
  // the tree is set from them when it is next asked, as its answers depend
  // only on its current values. Most placements change a block of every
  // level above theirs, which only the few longer sequences ask about.
  std::vector<std::vector<char>> changed(levels.size());
  std::vector<std::vector<int>> changes(levels.size());
  auto change = [&](size_t l, int b) {
    if (!changed[l][size_t(b)]) changed[l][size_t(b)] = 1, changes[l].push_back(b);
  };
  // Each block's sequences (a group: its ranks run them as one ring).
  std::vector<std::vector<std::vector<int64_t>>> groups(levels.size());
  for (size_t l = 0; l < levels.size(); ++l) {
    blockW[l].assign(size_t(n / levels[l]), 0.0);
    blockT[l].assign(size_t(n / levels[l]), 0.0);
    byW.emplace_back(size_t(n / levels[l]));
    changed[l].assign(size_t(n / levels[l]), 0);
    groups[l].resize(size_t(n / levels[l]));
  }
  // Only the levels some sequence still to place asks about are kept (the
  // others are never read again; the sequence placed counts until its
  // level's blocks are set, the levels above take theirs from them): the
  // sequences come largest first, so once the long ones are placed only
  // the smallest blocks are.
  std::vector<size_t> left(levels.size(), 0);
  for (size_t i = 0; i < lens.size(); ++i) ++left[size_t(std::log2(cp[i]) + 0.5)];
  for (size_t i : largestFirst(lens.size(), work)) {
    const int d = cp[i];
    const size_t level = size_t(std::log2(d) + 0.5);
    const double share = double(lens[i]) / d;
    for (int b : changes[level]) {
      byW[level].set(b, blockW[level][size_t(b)], blockT[level][size_t(b)]);
      changed[level][size_t(b)] = 0;
    }
    changes[level].clear();
    int anyBlock = -1;
    int block = byW[level].least(share, double(cap), &anyBlock);
    if (block < 0) block = anyBlock, pl.infeasibleAssignment = true;
    const int best = block * d;
    for (int r = best; r < best + d; ++r) w[r] += work(i), tokens[r] += share;
    for (size_t l = 0; l < levels.size(); ++l) {
      const int L = levels[l];
      if (left[l] == 0) continue;
      if (L <= d) {
        for (int b = best / L; b < (best + d) / L; ++b) {
          blockW[l][b] += work(i);
          blockT[l][b] += share;
          change(l, b);
        }
      } else if ((best / L + 1) * L <= n) {
        const int b = best / L;
        const double wasW = blockW[l][b], wasT = blockT[l][b];
        blockW[l][b] = std::max(blockW[l][b], blockW[level][block]);
        blockT[l][b] = std::max(blockT[l][b], blockT[level][block]);
        if (blockW[l][b] != wasW || blockT[l][b] != wasT) change(l, b);
      }
    }
    --left[level];
    groups[level][size_t(block)].push_back(int64_t(i));
  }
  // Larger groups first, each level's by their first rank.
  for (size_t l = levels.size(); l-- > 0;)
    for (size_t b = 0; b < groups[l].size(); ++b) {
      if (groups[l][b].empty()) continue;
      const int first = int(b) * levels[l];
      Ring ring;
      ring.seqs = std::move(groups[l][b]);
      ring.lens.reserve(ring.seqs.size());
      for (int64_t i : ring.seqs) ring.lens.push_back(lens[i]);
      ring.ranks.resize(size_t(levels[l]));
      std::iota(ring.ranks.begin(), ring.ranks.end(), first);
      ring.link = levels[l] > c.ranksPerNode ? Link::Inter : Link::Intra;
      pl.rings.push_back(std::move(ring));
    }
  pl.linTokens = tokens;
  pl.attnTokens = tokens;
  StrategyResult r = evaluate("dynamic_cp", pl, cfg, c);
  return {r, std::move(pl)};
}

// Hybrid DP: a sequence of at most `split` tokens stays whole on one rank
// (data parallel); a longer one gets a ring over the fewest ranks that leave
// at most `split` per rank (within a node, else whole nodes, one NIC per hop), on the least loaded
// ones. Largest first, loads in estimated seconds (attention and linear).
// The ring hybrid_dp gives a sequence: the fewest ranks that leave at most
// `split` of its tokens per rank, whole nodes once it leaves one.
int hybridRingSize(int64_t len, int64_t split, int n, int rpn) {
  const int G = int(std::min<int64_t>(n, (len + split - 1) / split));
  return G > rpn ? std::min(n, (G + rpn - 1) / rpn * rpn) : G;
}

Tuned hybridDpAt(const std::vector<int64_t>& lens, int64_t split, int64_t cap, const StepConfig& cfg,
                 const ClusterModel& c) {
  const int n = c.ranks(), rpn = c.ranksPerNode;
  const AttnShape& sh = cfg.model.attn;
  auto cost = [&](size_t i) {
    return attnComputeSeconds(attnFlops(lens[i], cfg.causal, sh), double(lens[i]), c) + linearSeconds(lens[i], cfg, c);
  };
  std::vector<double> load(n, 0), tokens(n, 0);
  GrowingMin byLoad{size_t(n)};
  // Per ring size G inside a node: the nodes by their G-th least load, and
  // each node's most tokens on a rank (a node where every rank has room
  // needs no scan of its ranks).
  std::vector<GrowingMin> kth(size_t(rpn), GrowingMin(size_t(c.nodes)));
  std::vector<double> nodeTokens(size_t(c.nodes), 0.0), sorted(size_t(rpn), 0.0);
  std::vector<std::pair<double, int>> rs;  // scratch
  std::set<std::pair<double, int>> byBusiest;  // (busiest rank's load, node), while rings across nodes are placed
  std::vector<int> chosenRanks;
  Placement pl;
  pl.linTokens.assign(n, 0);
  auto ringSize = [&](size_t i) { return hybridRingSize(lens[i], split, n, rpn); };
  // Rings inside a node still to place: once none is left, the nodes' G-th
  // loads (kth) are asked no more and not kept.
  size_t intraLeft = 0;
  for (size_t i = 0; i < lens.size(); ++i) intraLeft += ringSize(i) > 1 && ringSize(i) <= rpn;
  for (size_t i : largestFirst(lens.size(), cost)) {
    const int G = ringSize(i);
    intraLeft -= G > 1 && G <= rpn;
    Ring ring;
    ring.lens = {lens[i]};
    ring.seqs = {int64_t(i)};
    if (G <= rpn) byBusiest.clear();
    if (G > rpn) {
      // The G / rpn nodes whose busiest rank is least loaded (ties: lower
      // node). Kept in order while rings across nodes are placed one after
      // another (they are the largest, so they come first), as only their
      // nodes' loads change; made anew after anything else is placed.
      if (byBusiest.empty())
        for (int nd = 0; nd < c.nodes; ++nd)
          byBusiest.insert({*std::max_element(load.begin() + nd * rpn, load.begin() + (nd + 1) * rpn), nd});
      std::vector<int> chosen;
      for (int j = 0; j < G / rpn; ++j) {
        chosen.push_back(byBusiest.begin()->second);
        byBusiest.erase(byBusiest.begin());
      }
      std::sort(chosen.begin(), chosen.end());
      for (int nd : chosen)
        for (int r = nd * rpn; r < (nd + 1) * rpn; ++r) ring.ranks.push_back(r);
      ring.link = Link::Inter;
    } else if (G == 1) {
      // The least loaded rank with room for the sequence's tokens (if none
      // has room, rank 0, as the scan below would choose).
      int any = -1;
      const int r = byLoad.least([&](int q) { return tokens[q] + double(lens[i]) <= cap; }, &any);
      ring.ranks = {r < 0 ? 0 : r};
      ring.link = Link::Intra;
    } else {
      // The G least loaded ranks of the node where the G-th is least loaded;
      // a whole sequence prefers ranks with room for its tokens. The node
      // whose G-th load is least, when every rank of it has room, is that
      // node (room only adds to a node's value); else all are scanned.
      // (The G-th of a node by (load, rank) is selected, not sorted.)
      const double share = double(lens[i]) / G;
      int any = -1;
      const int first = kth[G - 1].least([&](int q) { return nodeTokens[q] + share <= cap; }, &any);
      if (first >= 0 && first == any) {
        rs.clear();
        for (int r = first * rpn; r < (first + 1) * rpn; ++r) rs.push_back({load[r], r});
        std::nth_element(rs.begin(), rs.begin() + (G - 1), rs.end());
        for (int j = 0; j < G; ++j) ring.ranks.push_back(rs[j].second);
      }
      double bestW = 0;
      for (int nd = 0; nd < c.nodes && ring.ranks.empty(); ++nd) {
        rs.clear();
        for (int r = nd * rpn; r < (nd + 1) * rpn; ++r) {
          bool room = tokens[r] + double(lens[i]) / G <= cap;
          rs.push_back({load[r] + (room ? 0 : 1e30), r});
        }
        std::nth_element(rs.begin(), rs.begin() + (G - 1), rs.end());
        if (nd == 0 || rs[G - 1].first < bestW) {
          bestW = rs[G - 1].first;
          chosenRanks.clear();
          for (int j = 0; j < G; ++j) chosenRanks.push_back(rs[j].second);
        }
        if (nd == c.nodes - 1) ring.ranks = chosenRanks;
      }
      std::sort(ring.ranks.begin(), ring.ranks.end());
      ring.link = Link::Intra;
    }
    const double per = cost(i) / G;
    for (int r : ring.ranks) {
      load[r] += per;
      byLoad.raise(r, load[r]);
      tokens[r] += double(lens[i]) / G;
      nodeTokens[r / rpn] = std::max(nodeTokens[r / rpn], tokens[r]);
      if (tokens[r] > cap) pl.infeasibleAssignment = true;
    }
    for (size_t j = 0; j < ring.ranks.size() && intraLeft > 0; ++j) {
      const int nd = ring.ranks[j] / rpn;
      if (j > 0 && ring.ranks[j - 1] / rpn == nd) continue;  // a ring's ranks are sorted: each node once
      std::copy(load.begin() + nd * rpn, load.begin() + (nd + 1) * rpn, sorted.begin());
      std::sort(sorted.begin(), sorted.end());
      for (int g = 0; g < rpn; ++g)
        if (kth[g].key(nd) != sorted[g]) kth[g].raise(nd, sorted[g]);
    }
    if (G > rpn)  // the ring's nodes, back in order with their new loads
      for (size_t j = 0; j < ring.ranks.size(); j += size_t(rpn)) {
        const int nd = ring.ranks[j] / rpn;
        byBusiest.insert({*std::max_element(load.begin() + nd * rpn, load.begin() + (nd + 1) * rpn), nd});
      }
    pl.rings.push_back(ring);
  }
  pl.linTokens = tokens;
  pl.attnTokens = tokens;
  StrategyResult r = evaluate("hybrid_dp", pl, cfg, c);
  return {r, std::move(pl)};
}

// The length above which dynamic_cp and hybrid_dp split a sequence is a
// setting a practitioner tunes (Megatron's max_seqlen_per_dp_cp_rank): memory
// allows up to the token capacity, a smaller one spreads long sequences over
// more ranks. Tuned per batch like dp_cp's group: the capacity, halved down
// to 1024 tokens, the fastest feasible kept. Every rank still holds at most
// the capacity.
// A split length whose floor reaches the best so far (ruledOut(split):
// floorReaches) is not run (none run: an empty result, name unset).
template <class Run, class RuledOut>
Tuned bestLimit(int64_t cap, Run run, RuledOut ruledOut) {
  Tuned best;
  bool have = false;
  for (int64_t limit = cap, first = 1; limit >= 1024 || first; limit /= 2, first = 0) {
    const int64_t split = std::max<int64_t>(limit, 1);
    if (ruledOut(split)) continue;
    Tuned t = run(split);
    t.result.limitTokens = limit;
    if (!have || fasterFeasible(t.result, best.result)) {
      best = std::move(t);
      have = true;
    }
    if (limit <= 1) break;
  }
  return best;
}

}  // namespace

// Transformer Engine's ring over all ranks (CP = the world): one packed ring,
// zigzag, one NIC per inter-node hop. A reference, not a competitor.
StrategyResult ringAll(const std::vector<int64_t>& lens, const StepConfig& cfg, const ClusterModel& c) {
  const int n = c.ranks();
  Placement pl;
  Ring ring;
  ring.lens = lens;
  for (int r = 0; r < n; ++r) ring.ranks.push_back(r);
  ring.link = c.nodes > 1 ? Link::Inter : Link::Intra;
  pl.rings.push_back(ring);
  double total = std::accumulate(lens.begin(), lens.end(), 0.0);
  pl.linTokens.assign(n, total / n);
  pl.attnTokens = pl.linTokens;
  return evaluate("ring_all", pl, cfg, c);
}

std::vector<Tuned> tunedBaselines(const std::vector<int64_t>& lens, const StepConfig& cfg, const ClusterModel& c,
                                  bool expressible, double beat) {
  const int64_t cap = std::max<int64_t>(1, tokenCapacity(cfg, c.ranks()));
  const int n = c.ranks(), rpn = c.ranksPerNode;
  RingComputes computes(lens, cfg, c);  // for the floors
  std::map<int, GroupAssignment> assigned;
  auto ruledOut = [&](auto size) { return floorReaches(lens, computes, size, beat, cfg, c); };
  std::vector<Tuned> out;
  out.push_back(bestGroup("dp_cp", lens, GroupKind::Ring, cap, cfg, c, assigned, computes, beat));
  if (!expressible)
    out.push_back(bestGroup("allgather_cp", lens, GroupKind::AllGather, cap, cfg, c, assigned, computes));
  out.push_back(bestLimit(
      cap, [&](int64_t split) { return dynamicCpAt(lens, split, cap, cfg, c); },
      [&](int64_t split) { return ruledOut([&](size_t i) { return dynamicCpSize(lens[i], split, n); }); }));
  out.push_back(bestLimit(
      cap, [&](int64_t split) { return hybridDpAt(lens, split, cap, cfg, c); },
      [&](int64_t split) { return ruledOut([&](size_t i) { return hybridRingSize(lens[i], split, n, rpn); }); }));
  // usp_cp's settings include hier_cp's (and dp_cp's, u = 1): a plan that
  // splits heads expresses both, usp_cp's tuned one is the faster.
  if (!expressible)
    out.push_back(bestGroup("hier_cp", lens, GroupKind::Hierarchical, cap, cfg, c, assigned, computes));
  if (!expressible || cfg.headSplit)
    out.push_back(bestGroup("usp_cp", lens, GroupKind::Usp, cap, cfg, c, assigned, computes, beat));
  // A baseline none of whose settings could beat `beat` was not made.
  out.erase(std::remove_if(out.begin(), out.end(), [](const Tuned& t) { return t.result.name.empty(); }), out.end());
  for (Tuned& t : out) t.result.baseline = true;
  return out;
}

bool candidateOf(const Placement& pl, size_t seqs, int ranksPerNode, int maxRingNodes,
                 PlanOptions::Candidate* out) {
  out->rings.assign(seqs, {});
  out->order.clear();
  out->ulysses.clear();
  // Each sequence's ring, its ranks copied once all are known, sequence by
  // sequence: the planner reads a candidate's rings by sequence (its bound,
  // the plan's checks and layout), and rings copied ring by ring lay them
  // out in memory by group instead.
  constexpr size_t kNone = std::numeric_limits<size_t>::max();
  std::vector<size_t> ringOf(seqs, kNone);
  for (size_t k = 0; k < pl.rings.size(); ++k) {
    const Ring& ring = pl.rings[k];
    if (ring.allgather || ring.seqs.size() != ring.lens.size()) return false;
    if (maxRingNodes == 1 && ring.ranks.front() / ranksPerNode != ring.ranks.back() / ranksPerNode) return false;
    // Head splits are named only by a placement that has them.
    if (ring.ulysses > 1 && out->ulysses.empty()) out->ulysses.assign(seqs, 1);
    for (int64_t i : ring.seqs) {
      // (A sequence is on a ring already once it has its ranks.)
      if (i < 0 || size_t(i) >= seqs || (ringOf[i] != kNone && !pl.rings[ringOf[i]].ranks.empty())) return false;
      ringOf[i] = k;
      out->order.push_back(i);
      if (ring.ulysses > 1) out->ulysses[i] = ring.ulysses;
    }
  }
  for (size_t i = 0; i < seqs; ++i)
    if (ringOf[i] != kNone) out->rings[i] = pl.rings[ringOf[i]].ranks;
  return out->order.size() == seqs;
}

}  // namespace zp::sim
