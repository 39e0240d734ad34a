#include "src/plan/simulator.h"

#include <algorithm>
#include <map>
#include <numeric>

#include "src/plan/planner.h"

namespace zp::plan {
namespace {

struct Tally {
  std::vector<double> seconds;  // per rank
  double nic = 0, intra = 0;
};

// K and V of a ring of G ranks over k nodes: each of G - 1 steps moves every
// chunk one hop; k of the G hops cross nodes when k > 1.
void ringBytes(int64_t len, int G, int k, const AttnShape& sh, Tally& t) {
  if (G < 2) return;
  double all = (G - 1) * kvBytes(len, sh);
  double cross = k > 1 ? all * k / G : 0;
  t.nic += cross;
  t.intra += all - cross;
}

StrategyResult finish(const std::string& name, const Tally& t) {
  StrategyResult r;
  r.name = name;
  r.stepSeconds = *std::max_element(t.seconds.begin(), t.seconds.end());
  r.attnImbalance = imbalance(t.seconds);
  r.nicBytes = t.nic;
  r.intraBytes = t.intra;
  return r;
}

// Bytes per token a remap moves: q, k and v in, the output back.
double remapBytesPerToken(const AttnShape& sh) {
  return double(2 * sh.qHeads + 2 * sh.kvHeads) * sh.headDim * sh.elemBytes;
}

StrategyResult zeppelin(const std::vector<int64_t>& lens, bool causal, const AttnShape& sh,
                        const ClusterModel& c) {
  BatchPlan p = planBatch(lens, causal, sh, c);
  Tally t;
  t.seconds = rankAttnSeconds(p, sh, c);
  for (const SeqPlacement& s : p.seqs) {
    int k = 1;
    for (size_t j = 1; j < s.ranks.size(); ++j)
      if (s.ranks[j] / c.ranksPerNode != s.ranks[j - 1] / c.ranksPerNode) ++k;
    ringBytes(s.len, int(s.ranks.size()), k, sh, t);
  }
  // Remap: which attention rank holds each token a linear rank holds.
  std::vector<std::vector<std::pair<Segment, int>>> owner(lens.size());
  for (size_t r = 0; r < p.attention.ranks.size(); ++r)
    for (const Segment& s : p.attention.ranks[r]) owner[s.seq].push_back({s, int(r)});
  for (auto& o : owner)
    std::sort(o.begin(), o.end(), [](auto& a, auto& b) { return a.first.start < b.first.start; });
  const double bpt = remapBytesPerToken(sh);
  const int n = c.ranks();
  std::vector<double> inB(n, 0), outB(n, 0);
  for (int r = 0; r < n; ++r)
    for (const Segment& s : p.linear.ranks[r])
      for (const auto& [a, ar] : owner[s.seq]) {
        int64_t b = std::max(a.start, s.start), e = std::min(a.start + a.count, s.start + s.count);
        if (e <= b || ar == r) continue;
        double bytes = (e - b) * bpt;
        bool cross = ar / c.ranksPerNode != r / c.ranksPerNode;
        (cross ? t.nic : t.intra) += bytes;
        // Each side's time on its link: the busier of sender and receiver decides.
        double secs = bytes / (cross ? nicShareBytesPerSec(c) : linkBytesPerSec(Link::Intra, c));
        inB[ar] += secs;
        outB[r] += secs;
      }
  double remap = 0;
  for (int r = 0; r < n; ++r) remap = std::max(remap, std::max(inB[r], outB[r]));
  StrategyResult res = finish("zeppelin", t);
  res.stepSeconds += remap;
  res.remapSeconds = remap;
  return res;
}

// Transformer Engine's ring over all ranks, zigzag: one packed ring whose
// steps compute 1/N^2 of every sequence and pass every sequence's chunk.
StrategyResult ring(const std::vector<int64_t>& lens, bool causal, const AttnShape& sh,
                    const ClusterModel& c) {
  const int n = c.ranks();
  Tally t;
  double comp = 0, xfer = 0;
  for (int64_t l : lens) {
    RingStep st = ringStep(l, causal, n, c.nodes > 1 ? Link::Inter : Link::Intra, sh, c);
    comp += st.compute;
    xfer += st.transfer;
    ringBytes(l, n, c.nodes, sh, t);
  }
  t.seconds.assign(n, comp + (n - 1) * std::max(comp, xfer));
  return finish("ring", t);
}

// Llama 3: all-gather K and V of the whole packed batch, then each rank
// computes its zigzag share of the queries; the gather is not overlapped.
StrategyResult allgather(const std::vector<int64_t>& lens, bool causal, const AttnShape& sh,
                         const ClusterModel& c) {
  const int n = c.ranks();
  double total = std::accumulate(lens.begin(), lens.end(), 0.0);
  double flops = 0;
  for (int64_t l : lens) flops += attnFlops(l, causal, sh);
  double kv = kvBytes(1, sh) * total;
  Tally t;
  // Each node receives the other nodes' part once over its NICs (split over
  // its ranks' shares), then every rank gathers the rest within the node.
  double crossPerNode = c.nodes > 1 ? kv * (c.nodes - 1) / c.nodes : 0;
  double inter = crossPerNode / c.ranksPerNode / nicShareBytesPerSec(c);
  double intraPerRank = kv * (n - 1) / n - crossPerNode / c.ranksPerNode;
  double intra = intraPerRank / linkBytesPerSec(Link::Intra, c);
  t.nic = crossPerNode * c.nodes;
  t.intra = intraPerRank * n;
  t.seconds.assign(n, inter + intra + computeSeconds(flops, c) / n);
  return finish("allgather", t);
}

// Sequence indexes, longest first (ties in input order).
std::vector<size_t> longestFirst(const std::vector<int64_t>& lens) {
  std::vector<size_t> order(lens.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lens[a] > lens[b]; });
  return order;
}

// Megatron's dynamic CP: each sequence on the smallest power-of-two group of
// aligned ranks that holds it within the per-rank token budget, groups filled
// by tokens (the balance Megatron aims at), largest first.
StrategyResult dynamicCp(const std::vector<int64_t>& lens, bool causal, const AttnShape& sh,
                         const ClusterModel& c) {
  const int n = c.ranks();
  const int64_t total = std::accumulate(lens.begin(), lens.end(), int64_t{0});
  const int64_t cap = std::max<int64_t>(1, (total + n - 1) / n);
  const std::vector<size_t> order = longestFirst(lens);
  std::vector<int64_t> tokens(n, 0);
  Tally t;
  t.seconds.assign(n, 0);
  for (size_t i : order) {
    int d = 1;
    while (d < n && (lens[i] + d - 1) / d > cap) d *= 2;
    d = std::min(d, n);
    int bestStart = 0;
    int64_t bestLoad = -1;
    for (int s = 0; s + d <= n; s += d) {
      int64_t m = *std::max_element(tokens.begin() + s, tokens.begin() + s + d);
      if (bestLoad < 0 || m < bestLoad) {
        bestLoad = m;
        bestStart = s;
      }
    }
    int k = d <= c.ranksPerNode ? 1 : d / c.ranksPerNode;
    double secs = ringSeconds(lens[i], causal, d, k > 1 ? Link::Inter : Link::Intra, sh, c);
    for (int r = bestStart; r < bestStart + d; ++r) {
      tokens[r] += lens[i] / d;
      t.seconds[r] += secs;
    }
    ringBytes(lens[i], d, k, sh, t);
  }
  return finish("dynamic_cp", t);
}

// Token-balanced packing, attention local only: each sequence whole on the
// rank with the fewest tokens so far, longest first.
StrategyResult packing(const std::vector<int64_t>& lens, bool causal, const AttnShape& sh,
                       const ClusterModel& c) {
  const int n = c.ranks();
  const std::vector<size_t> order = longestFirst(lens);
  std::vector<int64_t> tokens(n, 0);
  Tally t;
  t.seconds.assign(n, 0);
  for (size_t i : order) {
    int r = int(std::min_element(tokens.begin(), tokens.end()) - tokens.begin());
    tokens[r] += lens[i];
    t.seconds[r] += computeSeconds(attnFlops(lens[i], causal, sh), c);
  }
  return finish("packing", t);
}

}  // namespace

std::vector<StrategyResult> simulateStep(const std::vector<int64_t>& lens, bool causal,
                                         const AttnShape& sh, const ClusterModel& c) {
  return {zeppelin(lens, causal, sh, c), ring(lens, causal, sh, c), allgather(lens, causal, sh, c),
          dynamicCp(lens, causal, sh, c), packing(lens, causal, sh, c)};
}

std::vector<int64_t> formBatch(const std::vector<int64_t>& all, int64_t budget, std::mt19937_64& rng) {
  std::vector<int64_t> b;
  if (all.empty()) return b;
  int64_t total = 0;
  size_t i = rng() % all.size();
  for (size_t k = 0; k < all.size(); ++k, i = (i + 1) % all.size()) {
    if (all[i] > budget) continue;
    if (total + all[i] > budget) break;
    b.push_back(all[i]);
    total += all[i];
  }
  return b;
}

}  // namespace zp::plan
