#include "src/sim/simulator.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <numeric>
#include <sstream>
#include <stdexcept>

#include "src/plan/planner.h"
#include "src/sim/step_model.h"
#include "src/util/strings.h"

namespace zp::sim {

// The simulator runs the planner and its cost model.
using namespace zp::plan;

bool modelPreset(const std::string& name, ModelShape* out) {
  // hidden, ffn, layers, q heads, kv heads, vocab; head dimension 128 for all.
  struct P {
    const char* name;
    int hidden, ffn, layers, q, kv;
    int64_t vocab;
  };
  static const P presets[] = {
      {"llama-3b", 3072, 8192, 28, 24, 8, 128256},    // Llama 3.2 3B
      {"llama-7b", 4096, 11008, 32, 32, 32, 32000},   // Llama 2 7B
      {"llama-8b", 4096, 14336, 32, 32, 8, 128256},   // Llama 3 / 3.1 8B
      {"llama-13b", 5120, 13824, 40, 40, 40, 32000},  // Llama 2 13B
      {"llama-30b", 6656, 17920, 60, 52, 52, 32000},  // LLaMA 30B (32.5B)
  };
  for (const P& p : presets)
    if (name == p.name) {
      ModelShape m;
      m.name = p.name;
      m.hidden = p.hidden;
      m.ffn = p.ffn;
      m.layers = p.layers;
      m.attn.qHeads = p.q;
      m.attn.kvHeads = p.kv;
      m.attn.headDim = 128;
      m.attn.elemBytes = 2;
      m.vocab = p.vocab;
      *out = m;
      return true;
    }
  return false;
}

const char* modelPresetNames() { return "llama-3b, llama-7b, llama-8b, llama-13b, llama-30b"; }

double linearFlopsPerToken(const ModelShape& m) {
  const double h = m.hidden, q = double(m.attn.qHeads) * m.attn.headDim, kv = double(m.attn.kvHeads) * m.attn.headDim;
  // QKV projection, output projection, gate + up + down (2 FLOPs per multiply-add).
  return 2.0 * (h * (q + 2 * kv) + q * h + 3 * h * m.ffn);
}

double modelParams(const ModelShape& m) {
  const double h = m.hidden, q = double(m.attn.qHeads) * m.attn.headDim, kv = double(m.attn.kvHeads) * m.attn.headDim;
  return m.layers * (h * (q + 2 * kv) + q * h + 3 * h * m.ffn + 2 * h) + 2.0 * m.vocab * h;
}

const std::vector<std::string>& strategyNames() {
  static const std::vector<std::string> names = {"zeppelin", "zeppelin_noremap", "zeppelin_intranode",
                                                 "zeppelin_noroute", "dp_cp", "allgather_cp",
                                                 "dynamic_cp", "hybrid_dp", "hier_cp", "usp_cp", "ring_all", "ideal",
                                                 "bound"};
  return names;
}

double stateBytesPerRank(const StepConfig& cfg, int n) { return cfg.stateBytesPerParam * modelParams(cfg.model) / n; }

namespace {

// Bytes one layer keeps per token for its backward: the norms' inputs and
// outputs, q, k, v, the attention output, the MLP's input, gate, up and
// their product (bf16).
double layerWorkingBytesPerToken(const ModelShape& m) {
  const double h = m.hidden, q = double(m.attn.qHeads) * m.attn.headDim, kv = double(m.attn.kvHeads) * m.attn.headDim;
  return m.attn.elemBytes * (5 * h + q + 2 * kv + 3.0 * m.ffn);
}

}  // namespace

double activationBytesPerToken(const StepConfig& cfg) {
  const ModelShape& m = cfg.model;
  if (cfg.recompute) return m.layers * double(m.hidden) * m.attn.elemBytes + layerWorkingBytesPerToken(m);
  return m.layers * layerWorkingBytesPerToken(m);
}

int64_t tokenCapacity(const StepConfig& cfg, int n) {
  double free = cfg.memoryBytes * cfg.usableMemory - stateBytesPerRank(cfg, n);
  // Ring buffers: K and V in flight and their gradients, double buffered,
  // about four times the K and V of the rank's own tokens.
  double perToken = activationBytesPerToken(cfg) + 4 * kvBytes(1, cfg.model.attn);
  return free > 0 ? int64_t(free / perToken) : 0;
}

namespace {

int nodesOf(const std::vector<int>& ranks, int rpn) {
  int k = 1;
  for (size_t j = 1; j < ranks.size(); ++j)
    if (ranks[j] / rpn != ranks[j - 1] / rpn) ++k;
  return k;
}

// Seconds a rank of the ring spends on its sequences, forward and backward
// (one pass over them for both: the step model costs every ring of every
// plan it scores).
void ringCost(const Ring& ring, const StepConfig& cfg, const ClusterModel& c, Cost* fwd, Cost* bwd) {
  const AttnShape& sh = cfg.model.attn;
  const int G = int(ring.ranks.size());
  const double lat = linkLatency(ring.link, c);
  if (ring.allgather) {
    double flops = 0, kv = 0, comp = 0;
    for (int64_t l : ring.lens) {
      flops = attnFlops(l, cfg.causal, sh) / G;
      comp += attnComputeSeconds(flops, double(l) / G, c);
      kv += kvBytes(l, sh);
    }
    double comm = 0;
    if (G > 1) {
      // A ring all-gather: G - 1 messages; what crosses nodes goes at the
      // rank's share of the node's NICs (every rank gathers at once).
      const int k = nodesOf(ring.ranks, c.ranksPerNode);
      double recv = kv * (G - 1) / G;
      double cross = k > 1 ? kv * (k - 1) / k : 0;
      comm = (G - 1) * lat + cross / nicShareBytesPerSec(c) + (recv - cross) / linkBytesPerSec(Link::Intra, c);
    }
    // Backward: K and V gathered again, their gradients reduce-scattered.
    *fwd = {comp, comm};
    *bwd = {comp * kAttnBackwardFlops, comm * 2};
    return;
  }
  // With Ulysses inside the ring's positions (u ranks each, heads split u
  // ways), the ring has G / u positions and each rank computes and passes
  // 1/u of the heads.
  const int u = std::max(1, ring.ulysses), R = G / u;
  RingStep st;
  double bytes = 0;
  for (int64_t l : ring.lens) {
    st.compute += ringStepCompute(l, cfg.causal, R, sh, c) / u;  // (the step's transfer is the ring's, below)
    if (R > 1) bytes += kvBytes((l + R - 1) / R, sh) / u;
  }
  // One message per step carries every sequence's chunk.
  st.transfer = R > 1 ? lat + bytes / linkBytesPerSec(ring.link, c) : 0;
  double a2a = 0;
  if (u > 1) {
    // Ulysses' all-to-alls inside the node, not overlapped: q, k, v in and
    // the output back (backward: their gradients), (u - 1) / u of each
    // rank's tokens.
    double tokens = 0;
    for (int64_t l : ring.lens) tokens += double(l) / G;
    const double q = double(sh.qHeads) * sh.headDim * sh.elemBytes, kv = double(sh.kvHeads) * sh.headDim * sh.elemBytes;
    a2a = 2 * (u - 1) * c.intraLatency + tokens * (2 * q + 2 * kv) * (u - 1) / u / linkBytesPerSec(Link::Intra, c);
  }
  for (const auto& [pass, out] : {std::pair{st, fwd}, std::pair{backwardStep(st, lat), bwd}}) {
    out->compute = R * pass.compute;
    out->exposed = (R - 1) * std::max(0.0, pass.transfer - pass.compute);
    if (u > 1) out->exposed += a2a;
  }
}

// Bytes of one layer's forward on NICs and intra-node links.
void ringTraffic(const Ring& ring, const AttnShape& sh, int rpn, double* nic, double* intra) {
  const int G = int(ring.ranks.size()), u = std::max(1, ring.ulysses), R = G / u;
  if (G < 2) return;
  const int k = nodesOf(ring.ranks, rpn);
  for (int64_t l : ring.lens) {
    double all = (R - 1) * kvBytes(l, sh);  // every chunk passes every other ring position
    double cross = k > 1 ? all * k / R : 0;
    *nic += cross;
    *intra += all - cross;
  }
}

// Bytes each rank of a ring holds for its ring buffers (K and V in flight
// and their gradients; with Ulysses, also its all-to-alls' buffers); 0 for
// a ring of one rank.
double ringHeld(const Ring& ring, const ModelShape& m) {
  const int G = int(ring.ranks.size());
  if (G < 2) return 0;
  const double q = double(m.attn.qHeads) * m.attn.headDim, kv = double(m.attn.kvHeads) * m.attn.headDim;
  double b = 0;
  const int u = std::max(1, ring.ulysses), R = G / u;
  for (int64_t l : ring.lens)
    b += ring.allgather ? 2 * kvBytes(l, m.attn)
                        : 4 * kvBytes((l + R - 1) / R, m.attn) / u +
                              (u > 1 ? double(l) / G * 2 * m.attn.elemBytes * (2 * q + 2 * kv) : 0);
  return b;
}

// Per rank: the most any of its rings holds (held: ringHeld of each ring).
void ringExtra(const std::vector<Ring>& rings, const std::vector<double>& held, int n, std::vector<double>* extra) {
  extra->assign(size_t(n), 0.0);
  for (size_t i = 0; i < rings.size(); ++i)
    if (rings[i].ranks.size() > 1)
      for (int r : rings[i].ranks) (*extra)[r] = std::max((*extra)[r], held[i]);
}

}  // namespace

RingCosts ringCosts(const Placement& pl, const StepConfig& cfg, const ClusterModel& c, bool traffic) {
  RingCosts rc;
  rc.fwd.resize(pl.rings.size());
  rc.bwd.resize(pl.rings.size());
  rc.held.resize(pl.rings.size());
  rc.firstRank.assign(1, 0);
  for (size_t i = 0; i < pl.rings.size(); ++i) {
    ringCost(pl.rings[i], cfg, c, &rc.fwd[i], &rc.bwd[i]);
    rc.held[i] = ringHeld(pl.rings[i], cfg.model);
    rc.ranks.insert(rc.ranks.end(), pl.rings[i].ranks.begin(), pl.rings[i].ranks.end());
    rc.firstRank.push_back(rc.ranks.size());
  }
  ringExtra(pl.rings, rc.held, c.ranks(), &rc.extra);
  if (traffic)
    for (const Ring& ring : pl.rings)
      ringTraffic(ring, cfg.model.attn, c.ranksPerNode, &rc.nicBytes, &rc.intraBytes);
  return rc;
}

// evaluate() with the rings' costs made (ringCosts of the same rings).
StrategyResult evaluateCosted(const std::string& name, const Placement& pl, const StepConfig& cfg,
                              const ClusterModel& c, const RingCosts& costs, bool stepOnly) {
  const int n = c.ranks();
  const ModelShape& m = cfg.model;
  const double h = m.hidden, q = double(m.attn.qHeads) * m.attn.headDim, kv = double(m.attn.kvHeads) * m.attn.headDim;
  const double linRate = c.tflops * 1e12 * cfg.linearEfficiency;
  const double preFlops = 2.0 * h * (q + 2 * kv);  // norm is noise; the QKV projection
  const double postFlops = linearFlopsPerToken(m) - preFlops;
  const std::vector<Cost>& fwdCost = costs.fwd;
  const std::vector<Cost>& bwdCost = costs.bwd;
  // Each rank's parts (not kept with stepOnly) and when it is ready, made
  // once for every pass.
  const size_t parts = stepOnly ? 0 : size_t(n);
  std::vector<double> attn(parts, 0), comm(parts, 0), lin(parts, 0), ready(n);
  double remapPhase = 0;
  // One pass (forward or backward) of one layer; returns its time.
  auto pass = [&](bool backward) {
    const double mult = backward ? 2.0 : 1.0;
    std::fill(ready.begin(), ready.end(), 0.0);
    auto linear = [&](double flopsPerToken) {
      for (int r = 0; r < n; ++r) {
        double t = mult * pl.linTokens[r] * flopsPerToken / linRate;
        ready[r] += t;
        if (!stepOnly) lin[r] += t;
      }
    };
    auto barrier = [&](double t) {
      double mx = *std::max_element(ready.begin(), ready.end()) + t;
      std::fill(ready.begin(), ready.end(), mx);
      remapPhase += t;
    };
    linear(backward ? postFlops : preFlops);
    if (pl.remap) barrier(backward ? pl.remapOut : pl.remapIn);
    for (size_t k = 0; k < pl.rings.size(); ++k) {
      size_t i = backward ? pl.rings.size() - 1 - k : k;
      const Cost& cost = backward ? bwdCost[i] : fwdCost[i];
      const int* begin = costs.ranks.data() + costs.firstRank[i];
      const int* end = costs.ranks.data() + costs.firstRank[i + 1];
      double start = 0;
      for (const int* r = begin; r != end; ++r) start = std::max(start, ready[*r]);
      if (stepOnly) {
        for (const int* r = begin; r != end; ++r) ready[*r] = start + cost.total();
        continue;
      }
      for (const int* r = begin; r != end; ++r) {
        ready[*r] = start + cost.total();
        attn[*r] += cost.compute;
        comm[*r] += cost.exposed;
      }
    }
    if (pl.remap) barrier(backward ? pl.remapIn : pl.remapOut);
    linear(backward ? preFlops : postFlops);
    return *std::max_element(ready.begin(), ready.end());
  };
  // The recomputed forward pass takes what the first took (each pass starts
  // from ready ranks); run again only for the parts it adds to.
  const double forward = pass(false);
  double layer = forward;
  if (cfg.recompute) layer += stepOnly ? forward : pass(false);
  layer += pass(true);

  StrategyResult res;
  res.name = name;
  res.stepSeconds = layer * m.layers;
  if (!stepOnly) {
    res.remapSeconds = remapPhase * m.layers;
    std::vector<double> attnPlus(n);
    for (int r = 0; r < n; ++r) {
      res.parts.attn += attn[r] * m.layers / n;
      res.parts.comm += comm[r] * m.layers / n;
      res.parts.linear += lin[r] * m.layers / n;
      attnPlus[r] = attn[r] + comm[r];
    }
    res.parts.remap = res.remapSeconds;
    res.parts.idle = std::max(0.0, res.stepSeconds - res.parts.attn - res.parts.comm - res.parts.linear - res.parts.remap);
    res.attnImbalance = imbalance(attnPlus);
    res.linearImbalance = imbalance(pl.linTokens);
  }

  // Memory of every rank.
  const double states = stateBytesPerRank(cfg, n), act = activationBytesPerToken(cfg);
  const std::vector<double>& extra = costs.extra;
  double peak = 0;
  for (int r = 0; r < n; ++r) {
    double mem = states + pl.linTokens[r] * act + extra[r];
    // The activations count q, k, v and the output of the rank's linear
    // tokens; attention holds them (and, backward, their gradients) for its
    // own tokens, which after a remap may be more.
    if (pl.remap) mem += std::max(0.0, pl.attnTokens[r] - pl.linTokens[r]) * 2 * m.attn.elemBytes * (2 * q + 2 * kv);
    peak = std::max(peak, mem);
  }
  res.peakMemoryBytes = peak;
  res.feasible = peak <= cfg.memoryBytes * cfg.usableMemory && !pl.infeasibleAssignment;
  res.nicBytes = costs.nicBytes + pl.remapNic;
  res.intraBytes = costs.intraBytes + pl.remapIntra;
  return res;
}

StrategyResult evaluate(const std::string& name, const Placement& pl, const StepConfig& cfg, const ClusterModel& c) {
  return evaluateCosted(name, pl, cfg, c, ringCosts(pl, cfg, c));
}

std::vector<double> tokensPerRank(const Layout& l) {
  std::vector<int64_t> t = rankTokens(l);
  return std::vector<double>(t.begin(), t.end());
}

double linearSeconds(int64_t tokens, const StepConfig& cfg, const ClusterModel& c) {
  return tokens * linearFlopsPerToken(cfg.model) / (c.tflops * 1e12 * cfg.linearEfficiency);
}

namespace {

bool sameLayout(const Layout& a, const Layout& b) {
  if (a.ranks.size() != b.ranks.size()) return false;
  for (size_t r = 0; r < a.ranks.size(); ++r) {
    if (a.ranks[r].size() != b.ranks[r].size()) return false;
    for (size_t i = 0; i < a.ranks[r].size(); ++i) {
      const Segment &x = a.ranks[r][i], &y = b.ranks[r][i];
      if (x.seq != y.seq || x.start != y.start || x.count != y.count) return false;
    }
  }
  return true;
}

// A ring appended to pl->rings, empty but for its ranks, link and split:
// one from `spare` (the rings of a placement scored before, their vectors'
// room kept) if there is one. The step model scores a plan of tens of
// thousands of whole sequences several times (its head-split variants,
// with and without the remap), each a ring of three vectors.
Ring& appendRing(Placement* pl, std::vector<Ring>* spare, const std::vector<int>& ranks, Link link, int ulysses) {
  if (spare && !spare->empty()) {
    pl->rings.push_back(std::move(spare->back()));
    spare->pop_back();
  } else {
    pl->rings.emplace_back();
  }
  Ring& r = pl->rings.back();
  r.lens.clear();
  r.seqs.clear();
  r.ranks.assign(ranks.begin(), ranks.end());
  r.link = link;
  r.allgather = false;
  r.ulysses = ulysses;
  return r;
}

// A Zeppelin plan's rings as it runs them, in the plan's order (into
// pl->rings, which is empty; appendRing takes them from `spare`).
void addRings(const BatchPlan& p, const ClusterModel& c, Placement* out, std::vector<Ring>* spare = nullptr) {
  Placement& pl = *out;
  // Sequences on the same ring run as one group, one message per step, at
  // the place of the first of them (as the attention driver runs them).
  // A sequence usually shares the ring of the one before it (a DP x CP
  // plan runs its groups one after another), which is checked before the
  // map is searched.
  // Rings that split heads (SeqPlacement::ulysses) are grouped apart, by
  // their split as well.
  std::map<std::vector<int>, size_t> groupOf;
  std::map<std::pair<int, std::vector<int>>, size_t> splitGroupOf;
  const size_t none = std::numeric_limits<size_t>::max();
  size_t last = none;  // the ring of the previous sequence on a ring
  pl.rings.reserve(p.order.size());
  for (int64_t i : p.order) {
    const SeqPlacement& s = p.seqs[i];
    if (s.ranks.size() == 1) {  // a whole sequence is its own kernel call
      Ring& r = appendRing(&pl, spare, s.ranks, Link::Intra, 1);
      r.lens.push_back(s.len);
      r.seqs.push_back(i);
      continue;
    }
    if (last == none || pl.rings[last].ranks != s.ranks || pl.rings[last].ulysses != s.ulysses) {
      size_t group = pl.rings.size();
      bool fresh = false;
      if (s.ulysses > 1) {
        const auto r = splitGroupOf.try_emplace({s.ulysses, s.ranks}, group);
        group = r.first->second, fresh = r.second;
      } else {
        const auto r = groupOf.try_emplace(s.ranks, group);
        group = r.first->second, fresh = r.second;
      }
      // A ring that splits heads crosses nodes as hier_cp's does: every GPU
      // of a position sends its share at once, each through its own NIC.
      const Link link = s.ulysses > 1 && s.cls == SeqClass::InterNode ? Link::PerGpu : linkOf(s.cls, c);
      if (fresh) appendRing(&pl, spare, s.ranks, link, s.ulysses);
      last = group;
    }
    pl.rings[last].lens.push_back(s.len);
    pl.rings[last].seqs.push_back(i);
  }
}

// What a Zeppelin plan's layouts decide of its placement (all but its
// rings): its ranks' tokens and the remap, unless `remap` is false or the
// plan keeps the linear layers on the attention layout (then they run
// there). Its head splits do not change it.
void addLayouts(const BatchPlan& p, const StepConfig& cfg, const ClusterModel& c, bool remap, Placement* out) {
  const AttnShape& sh = cfg.model.attn;
  Placement& pl = *out;
  const std::vector<int64_t> attnTokens = rankTokens(p.attention);
  pl.attnTokens.assign(attnTokens.begin(), attnTokens.end());
  // A candidate's linear layout not built (BatchPlan::linear) is
  // balancedLinear's: every rank at its share, and equal to the attention
  // layout exactly when every rank's attention tokens are its share.
  std::vector<double> linTokens;
  if (p.linearOnAttention) {
    pl.remap = false;
  } else if (p.linear.ranks.empty()) {
    const std::vector<int64_t> share = balancedTokens(p.attention);
    linTokens.assign(share.begin(), share.end());
    pl.remap = remap && linTokens != pl.attnTokens;
  } else {
    pl.remap = remap && !sameLayout(p.linear, p.attention);
    if (pl.remap) linTokens = tokensPerRank(p.linear);
  }
  if (pl.remap) {
    pl.linTokens = std::move(linTokens);
    const double q = double(sh.qHeads) * sh.headDim * sh.elemBytes, kv = double(sh.kvHeads) * sh.headDim * sh.elemBytes;
    const RemapSeconds rs = remapSeconds(p, c, q + 2 * kv, q, &attnTokens);
    pl.remapIn = rs.in;
    pl.remapOut = rs.out;
    pl.remapNic = rs.nicBytes;
    pl.remapIntra = rs.intraBytes;
  } else {
    pl.linTokens = pl.attnTokens;
  }
}

// A Zeppelin plan as it runs: its rings (addRings) and layouts (addLayouts).
Placement placementOf(const BatchPlan& p, const StepConfig& cfg, const ClusterModel& c, bool remap) {
  Placement pl;
  addRings(p, c, &pl);
  addLayouts(p, cfg, c, remap, &pl);
  return pl;
}

}  // namespace

PlanOptions::Scores PlanScorer::operator()(const BatchPlan& p, bool sameLayouts) {
  if (sameLayouts && variantCosts(p)) return scores(variant_);
  // The last plan's rings give their vectors' room to this one's. A
  // head-split variant of the plan scored last has its layouts, and their
  // tokens and remap (addLayouts) are taken from it.
  // (Handed over whole when none are spare: a plan has a ring for each of
  // its tens of thousands of whole sequences.)
  if (spare_.empty()) std::swap(spare_, pl_.rings);
  else for (Ring& r : pl_.rings) spare_.push_back(std::move(r));
  pl_.rings.clear();
  if (!sameLayouts) {
    pl_ = Placement();
    addLayouts(p, cfg_, c_, remap_, &pl_);
  }
  addRings(p, c_, &pl_, &spare_);
  costs_ = ringCosts(pl_, cfg_, c_, false);
  variant_.ranks = costs_.ranks;  // a variant's rings have the same ranks
  variant_.firstRank = costs_.firstRank;
  unsplit_ = std::all_of(pl_.rings.begin(), pl_.rings.end(), [](const Ring& r) { return r.ulysses == 1; });
  seqs_ = p.seqs.size();
  return scores(costs_);
}

// The costs of variant p of pl_'s plan (into variant_), or false when it is
// not one (pl_ splits heads, or p splits a ring's sequences unlike).
// Grouped as addRings groups p, each ring is pl_'s ring with its split (and
// so, across nodes, its link) changed: a ring's sequences share its ranks,
// and whole sequences never split.
bool PlanScorer::variantCosts(const BatchPlan& p) {
  if (!unsplit_ || p.seqs.size() != seqs_) return false;  // (a plan of other sequences is scored afresh)
  variant_.fwd = costs_.fwd;
  variant_.bwd = costs_.bwd;
  variant_.held = costs_.held;
  for (size_t i = 0; i < pl_.rings.size(); ++i) {
    Ring& ring = pl_.rings[i];
    const SeqPlacement& first = p.seqs[size_t(ring.seqs.front())];
    for (int64_t s : ring.seqs)
      if (p.seqs[size_t(s)].ulysses != first.ulysses) return false;
    if (first.ulysses == 1) continue;
    // As addRings makes it: a ring that splits heads crosses nodes on
    // every GPU's own NIC.
    const Link was = ring.link;
    ring.link = first.cls == SeqClass::InterNode ? Link::PerGpu : linkOf(first.cls, c_);
    ring.ulysses = first.ulysses;
    ringCost(ring, cfg_, c_, &variant_.fwd[i], &variant_.bwd[i]);
    variant_.held[i] = ringHeld(ring, cfg_.model);
    ring.link = was;
    ring.ulysses = 1;
  }
  ringExtra(pl_.rings, variant_.held, c_.ranks(), &variant_.extra);
  return true;
}

// One grouping of the plan's rings for both: with the linear layers on the
// attention layout the placement differs only in its linear tokens and has
// no remap (placementOf with remap false). evaluateCosted reads of the
// rings only their ranks, which a variant keeps.
PlanOptions::Scores PlanScorer::scores(const RingCosts& costs) {
  const StrategyResult asIs = evaluateCosted("", pl_, cfg_, c_, costs, true);
  Placement flat;
  std::swap(flat.rings, pl_.rings);
  flat.linTokens = pl_.attnTokens;
  flat.attnTokens = pl_.attnTokens;
  flat.infeasibleAssignment = pl_.infeasibleAssignment;
  const StrategyResult f = evaluateCosted("", flat, cfg_, c_, costs, true);
  std::swap(flat.rings, pl_.rings);
  return PlanOptions::Scores{{asIs.stepSeconds, asIs.feasible}, {f.stepSeconds, f.feasible}};
}

namespace {

// The plan with its whole sequences placed again (wholeRebalanced), on the
// layout that scores better, where that is faster (fitting first): the
// planner's plans balance one load per rank, the step each pass's slowest.
void rebalanceWhole(BatchPlan* p, const StepConfig& cfg, const ClusterModel& c, bool remap) {
  const PlanOptions::Candidate cand = wholeRebalanced(*p, cfg, c);
  std::vector<int64_t> lens(p->seqs.size());
  for (size_t i = 0; i < lens.size(); ++i) lens[i] = p->seqs[i].len;
  BatchPlan q = planFromRings(lens, cfg.causal, cand.rings, c.ranks(), c.ranksPerNode);
  setOrder(&q, cand.order);
  if (!cand.ulysses.empty()) setHeadSplit(&q, cand.ulysses, c.ranksPerNode, cfg.model.attn);
  const StrategyResult was = evaluate("", placementOf(*p, cfg, c, remap), cfg, c);
  StrategyResult best = evaluate("", placementOf(q, cfg, c, remap), cfg, c);
  q.linearOnAttention = true;
  const StrategyResult flat = evaluate("", placementOf(q, cfg, c, false), cfg, c);
  q.linearOnAttention = fasterFeasible(flat, best);
  if (q.linearOnAttention) best = flat, q.linear = Layout();  // no copy of the attention layout
  if (!fasterFeasible(best, was)) return;
  if (cand.ulysses.empty()) {
    q.plannedForward = attnMakespan(q, cfg.model.attn, c);
    q.plannedBackward = attnMakespan(q, cfg.model.attn, c, true);
  }
  *p = std::move(q);
}

// Zeppelin: the planner's plan, ranked among its candidates by this step
// model (a plan whose linear layout is its attention layout runs without a
// remap); with `remap` false the linear layers always run on the attention
// layout.
// `baselines` makes the tuned baselines' placements given the best score
// so far (PlanOptions::lateCandidates).
BatchPlan planWithStepModel(const std::vector<int64_t>& lens, const StepConfig& cfg, const ClusterModel& c,
                            const PlanOptions& opt, bool remap,
                            const std::function<std::vector<Tuned>(const PlanOptions::Score&)>& baselines) {
  PlanOptions o = opt;
  // Every baseline placement a plan can express is a candidate scored in
  // full, after the planner's own: by this model the plan is never slower
  // than any of them.
  if (cfg.baselineCandidates && !cfg.legacyPlanner)
    o.lateCandidates = [&](const PlanOptions::Score& best) {
      std::vector<PlanOptions::Candidate> out;
      for (const Tuned& t : baselines(best)) {
        // A Ulysses baseline's placement (hier_cp, usp_cp) is built only
        // where its own step beats the best plan so far, the plan of it
        // taking that step (up to whole-token rounding), and not at u = 1:
        // that is dp_cp's placement, a candidate already.
        const bool ulysses = t.result.name == "hier_cp" || t.result.name == "usp_cp";
        if (ulysses && (t.result.ulysses <= 1 || (best.fits && t.result.feasible && t.result.stepSeconds >= best.seconds)))
          continue;
        PlanOptions::Candidate cand;
        if (candidateOf(t.placement, lens.size(), c.ranksPerNode, opt.maxRingNodes, &cand) &&
            (cfg.headSplit || cand.ulysses.empty()))
          out.push_back(std::move(cand));
      }
      // Placements that balance each pass (balanced.cc).
      if (cfg.balancedCandidates)
        for (PlanOptions::Candidate& cand :
             balancedCandidates(lens, cfg, c, opt.maxRingNodes, best.fits ? best.seconds : kNoBound))
          out.push_back(std::move(cand));
      return out;
    };
  o.forwardPasses = cfg.recompute ? 2 : 1;
  o.linearSecondsPerToken = linearFlopsPerToken(cfg.model) / (c.tflops * 1e12 * cfg.linearEfficiency);
  o.legacy = cfg.legacyPlanner;
  o.onlyCap = cfg.planCap;
  o.fitRings = cfg.fitRings;
  o.jointFits = cfg.jointFits;
  if (!o.legacy && cfg.headSplit && o.onlyCap == 0) o.headSplits = headSplitDegrees(c.ranksPerNode, cfg.model.attn);
  if (!o.legacy) o.score = [scorer = PlanScorer(cfg, c, remap)](const BatchPlan& p, bool sameLayouts) mutable {
    return scorer(p, sameLayouts);
  };
  // A pass of a layer takes at least any one rank's attention compute plus
  // its linear layers (waits, communication and remaps only add); the linear
  // layers hold at least the rank's attention tokens without a remap and,
  // with one, the batch's tokens over the ranks (rounded down). Slack for
  // rounding: the step sums the same terms in another order.
  if (!o.legacy) {
    const double perToken = linearFlopsPerToken(cfg.model) / (c.tflops * 1e12 * cfg.linearEfficiency);
    const double passes = cfg.recompute ? 2 : 1;
    const double balanced = double(std::accumulate(lens.begin(), lens.end(), int64_t{0}) / c.ranks());
    o.scoreBound = [=](const std::vector<double>& attn, const std::vector<double>& tokens) {
      auto step = [&](bool flat) {
        double fwd = 0, bwd = 0;
        for (size_t r = 0; r < attn.size(); ++r) {
          const double linear = (flat ? tokens[r] : balanced) * perToken;
          fwd = std::max(fwd, attn[r] + linear);
          bwd = std::max(bwd, kAttnBackwardFlops * attn[r] + 2 * linear);
        }
        return cfg.model.layers * (passes * fwd + bwd);
      };
      return (remap ? std::min(step(true), step(false)) : step(true)) * (1 - 1e-6);
    };
  }
  BatchPlan p = planBatch(lens, cfg.causal, cfg.model.attn, c, o);
  if (cfg.balancedCandidates && cfg.rebalanceWhole && !o.legacy && lens.size() <= kBalancedMaxSeqs)
    rebalanceWhole(&p, cfg, c, remap);
  return p;
}

StrategyResult zeppelin(const std::string& name, const std::vector<int64_t>& lens, const StepConfig& cfg,
                        const ClusterModel& c, const PlanOptions& opt, bool remap, const std::vector<Tuned>& baselines) {
  auto tuned = [&](const PlanOptions::Score&) { return baselines; };
  const BatchPlan p = planWithStepModel(lens, cfg, c, opt, remap, tuned);
  StrategyResult r = evaluate(name, placementOf(p, cfg, c, remap), cfg, c);
  for (const SeqPlacement& s : p.seqs) r.ulysses = std::max(r.ulysses, s.ulysses);
  return r;
}

// The lower bound: linear layers perfectly token-balanced, attention
// perfectly balanced at whole-sequence kernel efficiency, no communication,
// remap or idle. No placement reaches it; it says how much any could gain.
StrategyResult ideal(const std::vector<int64_t>& lens, const StepConfig& cfg, const ClusterModel& c) {
  const int n = c.ranks();
  const ModelShape& m = cfg.model;
  const double passes = cfg.recompute ? 2 : 1;
  double tokens = 0, attn = 0;
  for (int64_t l : lens) {
    tokens += double(l);
    attn += attnComputeSeconds(attnFlops(l, cfg.causal, m.attn), double(l), c);
  }
  StrategyResult r;
  r.name = "ideal";
  r.parts.attn = m.layers * attn / n * (passes + kAttnBackwardFlops);
  r.parts.linear = m.layers * tokens / n * linearFlopsPerToken(m) / (c.tflops * 1e12 * cfg.linearEfficiency) * (passes + 2);
  r.stepSeconds = r.parts.attn + r.parts.linear;
  r.peakMemoryBytes = stateBytesPerRank(cfg, n) + tokens / n * activationBytesPerToken(cfg);
  r.feasible = r.peakMemoryBytes <= cfg.memoryBytes * cfg.usableMemory;
  return r;
}

}  // namespace

StrategyResult simulatePlan(const BatchPlan& plan, const StepConfig& cfg, const ClusterModel& c, bool remap) {
  return evaluate("plan", placementOf(plan, cfg, c, remap), cfg, c);
}

BatchPlan planForStep(const std::vector<int64_t>& lens, const StepConfig& cfg, const ClusterModel& c) {
  PlanOptions opt;
  opt.nodeTokenBalance = cfg.nodeTokenBalance;
  // The baselines are tuned only once the planner's own best is known: a
  // setting that cannot beat it (by a lower bound of its step) is not made.
  auto tuned = [&](const PlanOptions::Score& best) {
    return tunedBaselines(lens, cfg, c, true, best.fits ? best.seconds : kNoBound);
  };
  return planWithStepModel(lens, cfg, c, opt, true, tuned);
}

std::vector<StrategyResult> simulateStep(const std::vector<int64_t>& lens, const StepConfig& cfg,
                                         const ClusterModel& c) {
  PlanOptions all, intra;
  all.nodeTokenBalance = intra.nodeTokenBalance = cfg.nodeTokenBalance;
  intra.maxRingNodes = 1;
  ClusterModel noRoute = c;
  noRoute.routeEfficiency = 0;
  const std::vector<Tuned> baselines = tunedBaselines(lens, cfg, c);
  std::vector<StrategyResult> r = {
      zeppelin("zeppelin", lens, cfg, c, all, true, baselines),
      zeppelin("zeppelin_noremap", lens, cfg, c, all, false, baselines),
      zeppelin("zeppelin_intranode", lens, cfg, c, intra, true, baselines),
      zeppelin("zeppelin_noroute", lens, cfg, noRoute, all, true, baselines),
  };
  for (const Tuned& t : baselines) r.push_back(t.result);
  r.push_back(ringAll(lens, cfg, c));
  r.push_back(ideal(lens, cfg, c));
  r.push_back(spreadBound(lens, cfg, c));
  for (auto& s : r) {
    s.reference = s.name == "ring_all" || s.name == "ideal" || s.name == "bound";
    s.baseline = s.name.rfind("zeppelin", 0) != 0 && !s.reference;
  }
  return r;
}

std::vector<int64_t> nextBatch(const std::vector<int64_t>& all, int64_t budget, size_t* next) {
  std::vector<int64_t> b;
  if (all.empty()) return b;
  int64_t total = 0;
  size_t& i = *next;
  i %= all.size();
  for (size_t k = 0; k < all.size(); ++k, i = (i + 1) % all.size()) {
    // A document longer than the budget is a batch of its own (split over
    // as many ranks as it needs); it is never skipped.
    if (b.empty() && all[i] > budget) {
      b.push_back(all[i]);
      i = (i + 1) % all.size();
      break;
    }
    if (total + all[i] > budget) break;
    b.push_back(all[i]);
    total += all[i];
  }
  return b;
}

std::vector<int64_t> readLengths(const std::string& file) {
  std::ifstream f(file);
  if (!f) throw std::invalid_argument("cannot read '" + file + "'");
  std::vector<int64_t> all;
  std::string line, word;
  for (long long lineNo = 1; std::getline(f, line); ++lineNo) {
    std::istringstream words(line);
    while (words >> word) {
      long long x = 0;
      if (!zp::parseInt(word, 1, (long long)1 << 40, &x))
        throw std::invalid_argument("'" + file + "' line " + std::to_string(lineNo) + ": '" + word +
                                    "' is not a sequence length (an integer from 1 to 2^40)");
      all.push_back(x);
    }
  }
  if (f.bad()) throw std::invalid_argument("cannot read '" + file + "'");
  if (all.empty()) throw std::invalid_argument("no lengths read from '" + file + "'");
  return all;
}

std::vector<int64_t> formBatch(const std::vector<int64_t>& all, int64_t budget, std::mt19937_64& rng) {
  if (all.empty()) return {};
  size_t start = rng() % all.size();
  return nextBatch(all, budget, &start);
}

}  // namespace zp::sim
