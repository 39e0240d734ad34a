// The router's planning part: see router.h for the model, the modes, the
// cost and the bound. Layout of this file:
//   Net            a validated view of the topology (rates, owners of NICs)
//   classify       which transfers are direct, and the direct path
//   RailBalancer   balanced mode on rail-only networks: a node-pair level
//                  assignment of chunks to rails (greedy water-filling, then a
//                  local search with alternating-path moves), then, per pair,
//                  the rails' chunks handed to transfers with the fewest relays
//   FabricBalancer balanced mode on a full fabric: send and receive sides of
//                  every node balanced independently, then paired per transfer
//   assembly       proxies, pieces, loads, cost
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/route/router.h"

#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <deque>
#include <limits>
#include <utility>

namespace zp {

const char* routeModeName(RouteMode mode) {
  switch (mode) {
    case RouteMode::kOff: return "off";
    case RouteMode::kRail: return "rail";
    case RouteMode::kBalanced: return "balanced";
  }
  return "?";
}

bool Plan::operator==(const Plan& o) const {
  return params.mode == o.params.mode && params.chunkBytes == o.params.chunkBytes &&
         params.shmCost == o.params.shmCost && params.directBelow == o.params.directBelow &&
         params.railOnly == o.params.railOnly && transfers == o.transfers && nicBase == o.nicBase &&
         loads == o.loads && rankRelayBytes == o.rankRelayBytes && rankShmBytes == o.rankShmBytes &&
         interNodeBytes == o.interNodeBytes && intraNodeBytes == o.intraNodeBytes &&
         relayedBytes == o.relayedBytes && maxNicTime == o.maxNicTime && shmTime == o.shmTime &&
         cost == o.cost && lowerBound == o.lowerBound;
}

namespace {

using u64 = uint64_t;
using i64 = int64_t;

constexpr u64 kMaxTotalBytes = u64(1) << 62;

std::string strf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string strf(const char* fmt, ...) {
  va_list ap, copy;
  va_start(ap, fmt);
  va_copy(copy, ap);
  int n = vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string s;
  if (n > 0) {
    s.resize((size_t)n);
    vsnprintf(&s[0], (size_t)n + 1, fmt, ap);
  }
  va_end(ap);
  return s;
}

zpResult_t bad(std::string* why, const std::string& msg) {
  if (why) *why = msg;
  return zpInvalidArgument;
}

// ---------------------------------------------------------------------------
// The topology, validated, with rates and owners.

struct Net {
  const ClusterTopology* topo = nullptr;
  int N = 0, nranks = 0, totalNics = 0;
  std::vector<int> K;                    // by node
  std::vector<int> nicBase;              // by node
  std::vector<int> nicNode;              // by global NIC
  std::vector<double> bw;                // by global NIC: bytes/s used for times
  std::vector<char> known;               // by global NIC
  std::vector<std::vector<int>> owners;  // by global NIC: owning ranks, local order
  std::vector<double> nodeMeanBw;        // by node (0 if no NICs)
  double clusterMeanBw = 1;

  int g(int node, int k) const { return nicBase[node] + k; }
  bool owned(int node, int k) const {
    return k >= 0 && k < K[node] && !owners[(size_t)g(node, k)].empty();
  }
  int node(int r) const { return topo->rankNode[r]; }
  int nic(int r) const { return topo->rankNic[r]; }
  // railOnly: rail k can carry routed traffic from node a to node b.
  bool usable(int a, int b, int k) const { return owned(a, k) && owned(b, k); }
  // The rate of rank r's NIC, for its shared-memory time.
  double rankBw(int r) const {
    int n = node(r), k = nic(r);
    return (k >= 0 && k < K[n]) ? bw[(size_t)g(n, k)] : clusterMeanBw;
  }
};

zpResult_t buildNet(const ClusterTopology& t, Net* net, std::string* why) {
  net->topo = &t;
  net->N = t.nodes();
  net->nranks = t.nranks();
  if (net->N < 1) return bad(why, "router: the topology has no nodes");
  if (t.rankLocal.size() != (size_t)net->nranks || t.rankNic.size() != (size_t)net->nranks)
    return bad(why, strf("router: topology has %zu rankNode, %zu rankLocal and %zu rankNic entries",
                         t.rankNode.size(), t.rankLocal.size(), t.rankNic.size()));
  if (t.nodeRanks.size() != (size_t)net->N)
    return bad(why, strf("router: topology has %d nodes but %zu nodeRanks lists", net->N,
                         t.nodeRanks.size()));
  net->K.resize((size_t)net->N);
  net->nicBase.resize((size_t)net->N);
  int total = 0;
  for (int n = 0; n < net->N; n++) {
    net->K[(size_t)n] = (int)t.node[(size_t)n].nics.size();
    net->nicBase[(size_t)n] = total;
    total += net->K[(size_t)n];
  }
  net->totalNics = total;
  std::vector<int> seen((size_t)net->nranks, 0);
  for (int n = 0; n < net->N; n++) {
    const auto& list = t.nodeRanks[(size_t)n];
    for (size_t i = 0; i < list.size(); i++) {
      int r = list[i];
      if (r < 0 || r >= net->nranks)
        return bad(why, strf("router: node %d lists rank %d of %d", n, r, net->nranks));
      if (seen[(size_t)r]++)
        return bad(why, strf("router: rank %d appears twice in nodeRanks", r));
      if (t.rankNode[(size_t)r] != n || t.rankLocal[(size_t)r] != (int)i)
        return bad(why, strf("router: rank %d: rankNode %d / rankLocal %d disagree with nodeRanks "
                             "(node %d, local %zu)", r, t.rankNode[(size_t)r],
                             t.rankLocal[(size_t)r], n, i));
      int k = t.rankNic[(size_t)r];
      if (k < -1 || k >= net->K[(size_t)n])
        return bad(why, strf("router: rank %d's NIC %d is not one of node %d's %d NICs", r, k, n,
                             net->K[(size_t)n]));
    }
  }
  for (int r = 0; r < net->nranks; r++)
    if (!seen[(size_t)r]) return bad(why, strf("router: rank %d is in no node's nodeRanks", r));

  double knownSum = 0;
  int knownCount = 0;
  for (int n = 0; n < net->N; n++)
    for (const Nic& nic : t.node[(size_t)n].nics)
      if (nic.bitsPerSec > 0 && std::isfinite(nic.bitsPerSec)) {
        knownSum += nic.bitsPerSec / 8;
        knownCount++;
      }
  double fallback = knownCount ? knownSum / knownCount : 1.0;
  net->clusterMeanBw = fallback;
  net->bw.resize((size_t)total);
  net->known.resize((size_t)total);
  net->nicNode.resize((size_t)total);
  net->owners.assign((size_t)total, {});
  net->nodeMeanBw.assign((size_t)net->N, 0);
  for (int n = 0; n < net->N; n++) {
    double sum = 0;
    for (int k = 0; k < net->K[(size_t)n]; k++) {
      double bps = t.node[(size_t)n].nics[(size_t)k].bitsPerSec;
      bool ok = bps > 0 && std::isfinite(bps);
      size_t gi = (size_t)net->g(n, k);
      net->bw[gi] = ok ? bps / 8 : fallback;
      net->known[gi] = ok;
      net->nicNode[gi] = n;
      sum += net->bw[gi];
    }
    if (net->K[(size_t)n]) net->nodeMeanBw[(size_t)n] = sum / net->K[(size_t)n];
    for (int r : t.nodeRanks[(size_t)n]) {
      int k = t.rankNic[(size_t)r];
      if (k >= 0) net->owners[(size_t)net->g(n, k)].push_back(r);
    }
  }
  return zpSuccess;
}

zpResult_t checkParams(const RouteParams& p, std::string* why) {
  if (p.mode != RouteMode::kOff && p.mode != RouteMode::kRail && p.mode != RouteMode::kBalanced)
    return bad(why, strf("router: mode %d is not off (0), rail (1) or balanced (2)", (int)p.mode));
  if (p.chunkBytes < 1) return bad(why, "router: chunkBytes must be at least 1");
  if (!(p.shmCost >= 0) || !std::isfinite(p.shmCost))
    return bad(why, strf("router: shmCost %g must be finite and >= 0", p.shmCost));
  return zpSuccess;
}

// ---------------------------------------------------------------------------
// Demand

struct Item {
  int src, dst;
  u64 bytes;
};

// Inter-node items by (src, dst); intra-node bytes by rank.
zpResult_t normalize(const Net& net, std::vector<TransferDemand> d, std::vector<Item>* inter,
                     std::vector<u64>* rankShm, u64* intraTotal, std::string* why) {
  for (const TransferDemand& t : d) {
    if (t.src < 0 || t.src >= net.nranks || t.dst < 0 || t.dst >= net.nranks)
      return bad(why, strf("router: demand %d -> %d: ranks must be in [0, %d)", t.src, t.dst,
                           net.nranks));
  }
  std::sort(d.begin(), d.end(), [](const TransferDemand& x, const TransferDemand& y) {
    return x.src != y.src ? x.src < y.src : x.dst < y.dst;
  });
  rankShm->assign((size_t)net.nranks, 0);
  *intraTotal = 0;
  u64 total = 0;
  for (size_t i = 0; i < d.size(); i++) {
    if (i && d[i].src == d[i - 1].src && d[i].dst == d[i - 1].dst)
      return bad(why, strf("router: demand %d -> %d appears twice", d[i].src, d[i].dst));
    const TransferDemand& t = d[i];
    if (t.bytes == 0 || t.src == t.dst) continue;  // nothing, or a local copy
    if (t.bytes > kMaxTotalBytes || total + t.bytes > kMaxTotalBytes)
      return bad(why, "router: the demand's bytes add up to more than 2^62");
    total += t.bytes;
    if (net.node(t.src) == net.node(t.dst)) {
      (*rankShm)[(size_t)t.src] += t.bytes;
      (*rankShm)[(size_t)t.dst] += t.bytes;
      *intraTotal += t.bytes;
    } else {
      inter->push_back({t.src, t.dst, t.bytes});
    }
  }
  return zpSuccess;
}

zpResult_t denseToSparse(const Net& net, const std::vector<std::vector<uint64_t>>& bytes,
                         std::vector<TransferDemand>* out, std::string* why) {
  if (bytes.size() != (size_t)net.nranks)
    return bad(why, strf("router: demand matrix has %zu rows for %d ranks", bytes.size(), net.nranks));
  for (size_t s = 0; s < bytes.size(); s++) {
    if (bytes[s].size() != (size_t)net.nranks)
      return bad(why, strf("router: demand matrix row %zu has %zu entries for %d ranks", s,
                           bytes[s].size(), net.nranks));
    for (size_t d = 0; d < bytes[s].size(); d++)
      if (bytes[s][d]) out->push_back({(int)s, (int)d, bytes[s][d]});
  }
  return zpSuccess;
}

// The direct path of s -> d (see router.h); false if there is none.
bool directPath(const Net& net, bool railOnly, int s, int d, int* sendNic, int* recvNic) {
  int a = net.node(s), rd = net.nic(d);
  if (rd < 0) return false;
  if (railOnly) {
    if (rd >= net.K[(size_t)a]) return false;
    *sendNic = *recvNic = rd;
    return true;
  }
  int rs = net.nic(s);
  if (rs < 0) return false;
  *sendNic = rs;
  *recvNic = rd;
  return true;
}

bool anyUsableRail(const Net& net, int a, int b) {
  int kab = std::min(net.K[(size_t)a], net.K[(size_t)b]);
  for (int k = 0; k < kab; k++)
    if (net.usable(a, b, k)) return true;
  return false;
}
bool anyOwned(const Net& net, int n) {
  for (int k = 0; k < net.K[(size_t)n]; k++)
    if (net.owned(n, k)) return true;
  return false;
}

// An inter-node transfer while planning.
struct RT {
  int src, dst, a, b, rs, rd;
  u64 bytes, nFull, tail;
  bool direct = false;
  int dSend = -1, dRecv = -1;  // the direct path, if any
  bool hasDirect = false;
};

// Marks each transfer direct or routed as mode `mode` does (see router.h).
zpResult_t classify(const Net& net, const RouteParams& p, RouteMode mode, std::vector<RT>* rts,
                    std::string* why) {
  for (RT& t : *rts) {
    t.hasDirect = directPath(net, p.railOnly, t.src, t.dst, &t.dSend, &t.dRecv);
    bool routable;
    if (p.railOnly) routable = anyUsableRail(net, t.a, t.b);
    else routable = anyOwned(net, t.a) && anyOwned(net, t.b);
    bool wantDirect = mode == RouteMode::kOff || t.bytes < p.directBelow || !routable;
    if (mode == RouteMode::kOff && !t.hasDirect)
      return bad(why, strf("router: %d (node %d) -> %d (node %d): no direct path (node %d has no "
                           "NIC %d, the NIC of rank %d) and routing is off",
                           t.src, t.a, t.dst, t.b, t.a, t.rd, t.dst));
    if (wantDirect && t.hasDirect) {
      t.direct = true;
    } else if (!routable) {
      return bad(why, strf("router: %d (node %d) -> %d (node %d): no path (no direct path and no "
                           "rail with an owner on both nodes)", t.src, t.a, t.dst, t.b));
    }
  }
  return zpSuccess;
}

zpResult_t makeRTs(const Net& net, const RouteParams& p, const std::vector<Item>& items,
                   RouteMode mode, std::vector<RT>* out, std::string* why) {
  out->clear();
  out->reserve(items.size());
  for (const Item& it : items) {
    RT t;
    t.src = it.src;
    t.dst = it.dst;
    t.a = net.node(it.src);
    t.b = net.node(it.dst);
    t.rs = net.nic(it.src);
    t.rd = net.nic(it.dst);
    t.bytes = it.bytes;
    t.nFull = it.bytes / p.chunkBytes;
    t.tail = it.bytes % p.chunkBytes;
    out->push_back(t);
  }
  return classify(net, p, mode, out, why);
}

// ---------------------------------------------------------------------------
// Lower bound

// The smallest T with sum_k max(0, T bw_k - f_k) >= F over the candidates.
double waterLevel(std::vector<std::pair<double, double>> fb /* (fixed bytes, bw) */, double F) {
  if (fb.empty()) return F > 0 ? std::numeric_limits<double>::infinity() : 0;
  std::sort(fb.begin(), fb.end(), [](const std::pair<double, double>& x, const std::pair<double, double>& y) {
    double tx = x.first / x.second, ty = y.first / y.second;
    if (tx != ty) return tx < ty;
    return x.second < y.second;
  });
  // Fill NICs in order of their fixed time; after the first m are in, the
  // level rises at 1 / (sum of their bw).
  double fsum = 0, bsum = 0;
  for (size_t m = 0; m < fb.size(); m++) {
    fsum += fb[m].first;
    bsum += fb[m].second;
    double T = (F + fsum) / bsum;
    double next = m + 1 < fb.size() ? fb[m + 1].first / fb[m + 1].second
                                    : std::numeric_limits<double>::infinity();
    if (T <= next) return T;
  }
  return (F + fsum) / bsum;
}

double boundOf(const Net& net, const RouteParams& p, const std::vector<RT>& rts) {
  size_t T = (size_t)net.totalNics;
  std::vector<double> fixedS(T, 0), fixedR(T, 0), flexS((size_t)net.N, 0), flexR((size_t)net.N, 0);
  double bound = 0;
  double C = (double)p.chunkBytes;
  for (const RT& t : rts) {
    if (t.direct) {
      fixedS[(size_t)net.g(t.a, t.dSend)] += (double)t.bytes;
      fixedR[(size_t)net.g(t.b, t.dRecv)] += (double)t.bytes;
      continue;
    }
    flexS[(size_t)t.a] += (double)t.bytes;
    flexR[(size_t)t.b] += (double)t.bytes;
    if ((double)t.bytes <= C) {  // cannot be split: its best single path
      double B = (double)t.bytes, best = std::numeric_limits<double>::infinity();
      if (p.railOnly) {
        int kab = std::min(net.K[(size_t)t.a], net.K[(size_t)t.b]);
        for (int k = 0; k < kab; k++)
          if (net.usable(t.a, t.b, k))
            best = std::min(best, std::max(B / net.bw[(size_t)net.g(t.a, k)],
                                           B / net.bw[(size_t)net.g(t.b, k)]));
      } else {
        double bs = 0, br = 0;
        for (int k = 0; k < net.K[(size_t)t.a]; k++)
          if (net.owned(t.a, k)) bs = std::max(bs, net.bw[(size_t)net.g(t.a, k)]);
        for (int k = 0; k < net.K[(size_t)t.b]; k++)
          if (net.owned(t.b, k)) br = std::max(br, net.bw[(size_t)net.g(t.b, k)]);
        best = std::max(B / bs, B / br);
      }
      bound = std::max(bound, best);
    }
  }
  for (int n = 0; n < net.N; n++) {
    for (int side = 0; side < 2; side++) {
      const std::vector<double>& fixed = side ? fixedR : fixedS;
      double F = side ? flexR[(size_t)n] : flexS[(size_t)n];
      std::vector<std::pair<double, double>> fb;
      for (int k = 0; k < net.K[(size_t)n]; k++) {
        size_t gi = (size_t)net.g(n, k);
        bound = std::max(bound, fixed[gi] / net.bw[gi]);
        if (net.owned(n, k)) fb.push_back({fixed[gi], net.bw[gi]});
      }
      if (F > 0) bound = std::max(bound, waterLevel(fb, F));
    }
  }
  return bound;
}

// ---------------------------------------------------------------------------
// Water-filling of n unit items over rails. Rail i's level after x items is
// max(A_i + x u_i, B_i + x v_i) + pen_i; each item goes where the level after
// it is lowest (lowest index on ties). Bulk: a binary search on the level,
// then the last few items one by one.

struct Fill {
  std::vector<double> A, B, u, v, pen;
  double level(size_t i, double x) const { return std::max(A[i] + x * u[i], B[i] + x * v[i]) + pen[i]; }
  // How many items rail i takes below or at level L.
  i64 take(size_t i, double L, i64 cap) const {
    double xa = (L - pen[i] - A[i]) / u[i], xb = (L - pen[i] - B[i]) / v[i];
    double x = std::floor(std::min(xa, xb));
    if (!(x > 0)) return 0;
    if (x >= (double)cap) return cap;
    return (i64)x;
  }
  void run(i64 n, std::vector<i64>* cnt) const {
    size_t m = A.size();
    cnt->assign(m, 0);
    if (n <= 0 || m == 0) return;
    i64 left = n;
    if (n > (i64)(64 * m)) {
      double lo = std::numeric_limits<double>::infinity(), hi = 0;
      for (size_t i = 0; i < m; i++) {
        lo = std::min(lo, level(i, 1) - 1e-300);
        hi = std::max(hi, level(i, (double)n));
      }
      lo = std::min(lo, hi);
      for (int it = 0; it < 200 && lo < hi; it++) {
        double mid = lo + (hi - lo) / 2;
        if (mid <= lo || mid >= hi) break;
        i64 s = 0;
        for (size_t i = 0; i < m && s < n; i++) s += take(i, mid, n);
        if (s >= n) hi = mid;
        else lo = mid;
      }
      i64 s = 0;
      for (size_t i = 0; i < m; i++) {
        (*cnt)[i] = take(i, lo, n);
        s += (*cnt)[i];
      }
      if (s > n) {  // cannot happen with an exact search; be safe
        for (size_t i = 0; i < m; i++) (*cnt)[i] = 0;
        s = 0;
      }
      left = n - s;
    }
    for (; left > 0; left--) {
      size_t best = 0;
      double bl = level(0, (double)((*cnt)[0] + 1));
      for (size_t i = 1; i < m; i++) {
        double l = level(i, (double)((*cnt)[i] + 1));
        if (l < bl) {
          bl = l;
          best = i;
        }
      }
      (*cnt)[best]++;
    }
  }
};

// ---------------------------------------------------------------------------
// Balanced, rail-only.

class RailBalancer {
 public:
  RailBalancer(const Net& net, const RouteParams& p, std::vector<RT>& rts)
      : net_(net), p_(p), rts_(rts), C_((i64)p.chunkBytes), N_(net.N), T_(net.totalNics) {}

  // Per routed transfer: its full chunks by rail, and the rail of its tail.
  std::vector<std::vector<std::pair<int, u64>>> railChunks;
  std::vector<int> tailRail;

  void run() {
    build();
    greedy();
    descend();
    distribute();
  }

 private:
  struct Group {
    int pair, rs, rd;
    i64 nFull = 0;
    std::vector<i64> y;    // by rail < kab
    std::vector<int> rts;  // transfer indices, by (src, dst)
  };
  struct PairS {
    int a, b, kab;
    std::vector<char> usable;
    std::vector<int> rails;  // usable rails, ascending
    std::vector<i64> Y;      // full chunks by rail
    std::vector<int> groups;
    std::vector<int> tails;  // transfers with a tail
    u64 bytes = 0;
  };

  const Net& net_;
  const RouteParams& p_;
  std::vector<RT>& rts_;
  const i64 C_;
  const int N_, T_;
  std::vector<PairS> pairs_;
  std::vector<Group> groups_;
  std::vector<std::vector<int>> adj_;  // by vertex (send a: a, recv b: N + b): pairs
  std::vector<i64> L_;                 // by load index: send (a,k) = g(a,k), recv = T + g(b,k)
  std::vector<i64> F_;                 // full chunks, same index
  std::vector<double> w_;              // potential weight, same index
  std::vector<double> bwL_;            // bandwidth, same index
  std::vector<int> stamp_, parentV_, parentP_;
  int stampNow_ = 0;
  double lambda_ = 0, eps_ = 0;

  int h(const Group& g, int k) const { return (k != g.rs) + (k != g.rd); }
  int vnode(int v) const { return v < N_ ? v : v - N_; }
  int li(int v, int k) const { return v < N_ ? net_.g(v, k) : T_ + net_.g(v - N_, k); }
  double time(int idx) const { return (double)L_[(size_t)idx] / bwL_[(size_t)idx]; }
  // Change of the potential when idx gain receives x bytes that idx lose gives.
  double dPhi(int gain, int lose, double x) const {
    double lg = (double)L_[(size_t)gain], ll = (double)L_[(size_t)lose];
    return w_[(size_t)gain] * (2 * lg * x + x * x) + w_[(size_t)lose] * (x * x - 2 * ll * x);
  }

  void build() {
    size_t nl = (size_t)T_ * 2;
    L_.assign(nl, 0);
    F_.assign(nl, 0);
    w_.resize(nl);
    bwL_.resize(nl);
    for (int side = 0; side < 2; side++)
      for (int gi = 0; gi < T_; gi++) {
        size_t idx = (size_t)(side * T_ + gi);
        int n = net_.nicNode[(size_t)gi];
        bwL_[idx] = net_.bw[(size_t)gi];
        w_[idx] = net_.nodeMeanBw[(size_t)n] / net_.bw[(size_t)gi];
      }
    adj_.assign((size_t)N_ * 2, {});
    railChunks.assign(rts_.size(), {});
    tailRail.assign(rts_.size(), -1);
    // Direct transfers are fixed loads.
    std::vector<int> order;
    for (size_t i = 0; i < rts_.size(); i++) {
      const RT& t = rts_[i];
      if (t.direct) {
        L_[(size_t)li(t.a, t.dSend)] += (i64)t.bytes;
        L_[(size_t)li(N_ + t.b, t.dRecv)] += (i64)t.bytes;
      } else {
        order.push_back((int)i);
      }
    }
    std::sort(order.begin(), order.end(), [&](int x, int y) {
      const RT& s = rts_[(size_t)x];
      const RT& t = rts_[(size_t)y];
      if (s.a != t.a) return s.a < t.a;
      if (s.b != t.b) return s.b < t.b;
      if (s.rs != t.rs) return s.rs < t.rs;
      if (s.rd != t.rd) return s.rd < t.rd;
      return x < y;  // rts are by (src, dst)
    });
    for (size_t oi = 0; oi < order.size(); oi++) {
      int i = order[oi];
      const RT& t = rts_[(size_t)i];
      if (pairs_.empty() || pairs_.back().a != t.a || pairs_.back().b != t.b) {
        PairS P;
        P.a = t.a;
        P.b = t.b;
        P.kab = std::min(net_.K[(size_t)t.a], net_.K[(size_t)t.b]);
        P.usable.assign((size_t)P.kab, 0);
        P.Y.assign((size_t)P.kab, 0);
        for (int k = 0; k < P.kab; k++)
          if (net_.usable(t.a, t.b, k)) {
            P.usable[(size_t)k] = 1;
            P.rails.push_back(k);
          }
        pairs_.push_back(std::move(P));
        adj_[(size_t)t.a].push_back((int)pairs_.size() - 1);
        adj_[(size_t)(N_ + t.b)].push_back((int)pairs_.size() - 1);
      }
      int pi = (int)pairs_.size() - 1;
      PairS& P = pairs_.back();
      P.bytes += t.bytes;
      if (t.tail) P.tails.push_back(i);
      if (P.groups.empty() || groups_[(size_t)P.groups.back()].rs != t.rs ||
          groups_[(size_t)P.groups.back()].rd != t.rd) {
        Group G;
        G.pair = pi;
        G.rs = t.rs;
        G.rd = t.rd;
        G.y.assign((size_t)P.kab, 0);
        groups_.push_back(std::move(G));
        P.groups.push_back((int)groups_.size() - 1);
      }
      Group& G = groups_.back();
      G.nFull += (i64)t.nFull;
      G.rts.push_back(i);
    }
    stamp_.assign((size_t)N_ * 2, 0);
    parentV_.assign((size_t)N_ * 2, -1);
    parentP_.assign((size_t)N_ * 2, -1);
    double C = (double)C_;
    lambda_ = 2 * p_.shmCost * C;
    eps_ = 1e-9 * C * C;
  }

  void addChunks(int pi, int gi, int k, i64 x) {
    PairS& P = pairs_[(size_t)pi];
    groups_[(size_t)gi].y[(size_t)k] += x;
    P.Y[(size_t)k] += x;
    int s = li(P.a, k), r = li(N_ + P.b, k);
    L_[(size_t)s] += x * C_;
    L_[(size_t)r] += x * C_;
    F_[(size_t)s] += x;
    F_[(size_t)r] += x;
  }

  void greedy() {
    std::vector<int> order((size_t)pairs_.size());
    for (size_t i = 0; i < order.size(); i++) order[i] = (int)i;
    std::sort(order.begin(), order.end(), [&](int x, int y) {
      u64 bx = pairs_[(size_t)x].bytes, by = pairs_[(size_t)y].bytes;
      if (bx != by) return bx > by;
      return x < y;
    });
    double C = (double)C_;
    Fill f;
    std::vector<i64> cnt;
    for (int pi : order) {
      PairS& P = pairs_[(size_t)pi];
      for (int gi : P.groups) {
        const Group& G = groups_[(size_t)gi];
        if (!G.nFull) continue;
        size_t m = P.rails.size();
        f.A.resize(m);
        f.B.resize(m);
        f.u.resize(m);
        f.v.resize(m);
        f.pen.resize(m);
        for (size_t i = 0; i < m; i++) {
          int k = P.rails[i];
          int s = li(P.a, k), r = li(N_ + P.b, k);
          f.A[i] = time(s);
          f.B[i] = time(r);
          f.u[i] = C / bwL_[(size_t)s];
          f.v[i] = C / bwL_[(size_t)r];
          f.pen[i] = p_.shmCost * h(G, k) * 0.5 * (f.u[i] + f.v[i]);
        }
        f.run(G.nFull, &cnt);
        for (size_t i = 0; i < m; i++)
          if (cnt[i]) addChunks(pi, gi, P.rails[i], cnt[i]);
      }
    }
    // Tails, largest first.
    std::vector<int> tails;
    for (const PairS& P : pairs_)
      for (int i : P.tails) tails.push_back(i);
    std::sort(tails.begin(), tails.end(), [&](int x, int y) {
      u64 tx = rts_[(size_t)x].tail, ty = rts_[(size_t)y].tail;
      if (tx != ty) return tx > ty;
      return x < y;
    });
    for (int i : tails) {
      const RT& t = rts_[(size_t)i];
      const PairS& P = pairs_[(size_t)pairOf(i)];
      double x = (double)t.tail;
      int best = -1;
      double bl = 0;
      for (int k : P.rails) {
        int s = li(P.a, k), r = li(N_ + P.b, k);
        double us = x / bwL_[(size_t)s], ur = x / bwL_[(size_t)r];
        int hops = (k != t.rs) + (k != t.rd);
        double l = std::max(time(s) + us, time(r) + ur) + p_.shmCost * hops * 0.5 * (us + ur);
        if (best < 0 || l < bl) {
          bl = l;
          best = k;
        }
      }
      tailRail[(size_t)i] = best;
      L_[(size_t)li(P.a, best)] += (i64)t.tail;
      L_[(size_t)li(N_ + P.b, best)] += (i64)t.tail;
    }
  }

  std::vector<int> pairOfRt_;
  int pairOf(int rt) {
    if (pairOfRt_.empty()) {
      pairOfRt_.assign(rts_.size(), -1);
      for (const Group& G : groups_)
        for (int i : G.rts) pairOfRt_[(size_t)i] = G.pair;
    }
    return pairOfRt_[(size_t)rt];
  }

  // Moves of x chunks of pair pi from rail p to rail q, through the groups
  // that gain the fewest relay hops; returns the change in hops x chunks.
  i64 planFlip(int pi, int p, int q, i64 x, std::vector<std::pair<int, i64>>* takes) const {
    const PairS& P = pairs_[(size_t)pi];
    std::vector<std::pair<int, int>> cand;  // (delta hops, group)
    for (int gi : P.groups) {
      const Group& G = groups_[(size_t)gi];
      if (G.y[(size_t)p] > 0) cand.push_back({h(G, q) - h(G, p), gi});
    }
    std::sort(cand.begin(), cand.end());
    i64 dh = 0;
    for (const auto& c : cand) {
      if (!x) break;
      i64 y = std::min(x, groups_[(size_t)c.second].y[(size_t)p]);
      if (takes) takes->push_back({c.second, y});
      dh += y * c.first;
      x -= y;
    }
    return dh;
  }

  // One alternating-path move that takes full chunks off rail k of vertex v
  // onto rail j; true if it improved the potential.
  bool tryChain(int v, int k, int j) {
    int vk = li(v, k), vj = li(v, j);
    double C = (double)C_;
    double Tcap = time(vk) * (1 + 1e-12);
    if ((double)(L_[(size_t)vj] + C_) / bwL_[(size_t)vj] > Tcap) return false;
    double dv = dPhi(vj, vk, C);
    if (!(dv < 0)) return false;
    int vside = v < N_ ? 0 : 1;
    stampNow_++;
    std::deque<int> queue;
    queue.push_back(v);
    stamp_[(size_t)v] = stampNow_;
    parentV_[(size_t)v] = -1;
    while (!queue.empty()) {
      int u = queue.front();
      queue.pop_front();
      int shed = ((u < N_ ? 0 : 1) == vside) ? k : j;
      int gain = shed == k ? j : k;
      for (int pi : adj_[(size_t)u]) {
        const PairS& P = pairs_[(size_t)pi];
        if (std::max(k, j) >= P.kab || !P.usable[(size_t)gain] || P.Y[(size_t)shed] == 0) continue;
        int w = u < N_ ? N_ + P.b : P.a;
        if (stamp_[(size_t)w] == stampNow_) continue;
        stamp_[(size_t)w] = stampNow_;
        parentV_[(size_t)w] = u;
        parentP_[(size_t)w] = pi;
        int wq = li(w, gain), wp = li(w, shed);
        if ((double)(L_[(size_t)wq] + C_) / bwL_[(size_t)wq] <= Tcap) {
          double dw = dPhi(wq, wp, C);
          if (dv + dw < -eps_ && applyPath(v, k, j, w, gain, shed, Tcap)) return true;
        }
        queue.push_back(w);
      }
    }
    return false;
  }

  bool applyPath(int v, int k, int j, int w, int wq, int wp, double Tcap) {
    // The edges, from w back to v: (pair, shed rail, gained rail).
    struct Edge {
      int pi, p, q;
    };
    std::vector<Edge> path;
    int vside = v < N_ ? 0 : 1;
    for (int x = w; x != v; x = parentV_[(size_t)x]) {
      int u = parentV_[(size_t)x];
      int shed = ((u < N_ ? 0 : 1) == vside) ? k : j;
      path.push_back({parentP_[(size_t)x], shed, shed == k ? j : k});
    }
    i64 qmax = std::numeric_limits<i64>::max();
    for (const Edge& e : path) qmax = std::min(qmax, pairs_[(size_t)e.pi].Y[(size_t)e.p]);
    int ivk = li(v, k), ivj = li(v, j), iwq = li(w, wq), iwp = li(w, wp);
    double C = (double)C_;
    // Potential change for x bytes: alpha x + beta x^2.
    double alpha = 2 * (w_[(size_t)ivj] * (double)L_[(size_t)ivj] - w_[(size_t)ivk] * (double)L_[(size_t)ivk]) +
                   2 * (w_[(size_t)iwq] * (double)L_[(size_t)iwq] - w_[(size_t)iwp] * (double)L_[(size_t)iwp]);
    double beta = w_[(size_t)ivj] + w_[(size_t)ivk] + w_[(size_t)iwq] + w_[(size_t)iwp];
    double xs = -alpha / (2 * beta) / C;
    i64 q = xs >= (double)qmax ? qmax : (i64)std::llround(std::max(1.0, xs));
    q = std::max<i64>(1, std::min(q, qmax));
    for (int idx : {ivj, iwq}) {
      double room = std::floor((Tcap * bwL_[(size_t)idx] - (double)L_[(size_t)idx]) / C);
      if (room < (double)q) q = std::max<i64>(1, (i64)std::max(1.0, room));
    }
    for (;;) {
      double x = (double)q * C;
      double dphi = alpha * x + beta * x * x;
      i64 dh = 0;
      for (const Edge& e : path) dh += planFlip(e.pi, e.p, e.q, q, nullptr);
      if (dphi + lambda_ * C * (double)dh < -eps_) break;
      if (q == 1) return false;
      q = 1;
    }
    for (const Edge& e : path) {
      std::vector<std::pair<int, i64>> takes;
      planFlip(e.pi, e.p, e.q, q, &takes);
      for (const auto& t : takes) {
        addChunks(e.pi, t.first, e.p, -t.second);
        addChunks(e.pi, t.first, e.q, t.second);
      }
    }
    return true;
  }

  // Moves one tail to a better rail; true if it did.
  bool tryTail(int i) {
    const RT& t = rts_[(size_t)i];
    const PairS& P = pairs_[(size_t)pairOf(i)];
    int k = tailRail[(size_t)i];
    double x = (double)t.tail;
    int ak = li(P.a, k), bk = li(N_ + P.b, k);
    double cap = std::max(time(ak), time(bk)) * (1 + 1e-12);
    int hk = (k != t.rs) + (k != t.rd);
    int best = -1;
    double bd = -eps_;
    for (int j : P.rails) {
      if (j == k) continue;
      int aj = li(P.a, j), bj = li(N_ + P.b, j);
      if ((double)(L_[(size_t)aj] + (i64)t.tail) / bwL_[(size_t)aj] > cap ||
          (double)(L_[(size_t)bj] + (i64)t.tail) / bwL_[(size_t)bj] > cap)
        continue;
      int hj = (j != t.rs) + (j != t.rd);
      double d = dPhi(aj, ak, x) + dPhi(bj, bk, x) + lambda_ * x * (hj - hk);
      if (d < bd) {
        bd = d;
        best = j;
      }
    }
    if (best < 0) return false;
    L_[(size_t)ak] -= (i64)t.tail;
    L_[(size_t)bk] -= (i64)t.tail;
    L_[(size_t)li(P.a, best)] += (i64)t.tail;
    L_[(size_t)li(N_ + P.b, best)] += (i64)t.tail;
    tailRail[(size_t)i] = best;
    return true;
  }

  void descend() {
    // Bounded work: planning must stay fast on big clusters.
    i64 budget = 64 * (i64)(pairs_.size() + rts_.size()) + 100000;
    std::vector<std::pair<double, int>> js;
    for (int sweep = 0; sweep < 1000 && budget > 0; sweep++) {
      i64 moves = 0;
      for (int v = 0; v < 2 * N_ && budget > 0; v++) {
        int n = vnode(v), K = net_.K[(size_t)n];
        if (adj_[(size_t)v].empty()) continue;
        for (; budget > 0; budget--) {
          int k = -1;
          for (int r = 0; r < K; r++) {
            int idx = li(v, r);
            if (F_[(size_t)idx] > 0 && (k < 0 || time(idx) > time(li(v, k)))) k = r;
          }
          if (k < 0) break;
          js.clear();
          double tk = time(li(v, k));
          for (int r = 0; r < K; r++)
            if (r != k && net_.owned(n, r) && time(li(v, r)) < tk) js.push_back({time(li(v, r)), r});
          std::sort(js.begin(), js.end());
          bool ok = false;
          for (const auto& jj : js)
            if ((ok = tryChain(v, k, jj.second))) break;
          if (!ok) break;
          moves++;
        }
      }
      for (const PairS& P : pairs_)
        for (int i : P.tails)
          if (budget > 0 && tryTail(i)) {
            moves++;
            budget--;
          }
      if (!moves) break;
    }
  }

  // Per pair: the rails' chunks to groups with the fewest relay hops (hops
  // 0 first, then a max flow for hops 1, then the rest), then to transfers.
  void distribute() {
    for (size_t pi = 0; pi < pairs_.size(); pi++) {
      PairS& P = pairs_[pi];
      std::vector<i64> dem = P.Y;
      std::vector<i64> sup;
      for (int gi : P.groups) {
        Group& G = groups_[(size_t)gi];
        std::fill(G.y.begin(), G.y.end(), 0);
        sup.push_back(G.nFull);
      }
      size_t ng = P.groups.size();
      auto give = [&](size_t gl, int k, i64 x) {
        groups_[(size_t)P.groups[gl]].y[(size_t)k] += x;
        sup[gl] -= x;
        dem[(size_t)k] -= x;
      };
      for (size_t gl = 0; gl < ng; gl++) {
        const Group& G = groups_[(size_t)P.groups[gl]];
        if (G.rs == G.rd && G.rs >= 0 && G.rs < P.kab && P.usable[(size_t)G.rs])
          give(gl, G.rs, std::min(sup[gl], dem[(size_t)G.rs]));
      }
      hopOneFlow(P, &sup, &dem, give);
      for (size_t gl = 0; gl < ng; gl++)
        for (int k : P.rails) {
          if (!sup[gl]) break;
          i64 x = std::min(sup[gl], dem[(size_t)k]);
          if (x) give(gl, k, x);
        }
      // Hand each group's chunks to its transfers in order.
      for (int gi : P.groups) {
        Group& G = groups_[(size_t)gi];
        std::vector<i64> left = G.y;
        size_t ri = 0;
        for (int i : G.rts) {
          i64 need = (i64)rts_[(size_t)i].nFull;
          for (; need > 0 && ri < P.rails.size();) {
            int k = P.rails[ri];
            i64 x = std::min(need, left[(size_t)k]);
            if (x) {
              railChunks[(size_t)i].push_back({k, (u64)x});
              left[(size_t)k] -= x;
              need -= x;
            }
            if (!left[(size_t)k]) ri++;
          }
        }
      }
    }
  }

  // Max flow from groups with one relay hop on a rail (rs or rd) to the
  // rails' remaining chunks (Edmonds-Karp on a small graph).
  template <class Give>
  void hopOneFlow(const PairS& P, std::vector<i64>* sup, std::vector<i64>* dem, Give give) {
    size_t ng = P.groups.size();
    // Nodes: 0 source, 1..ng groups, ng+1..ng+kab rails, ng+kab+1 sink.
    int S = 0, nR = P.kab, Tn = (int)ng + nR + 1, nn = Tn + 1;
    struct E {
      int to;
      i64 cap;
    };
    std::vector<E> es;
    std::vector<std::vector<int>> g((size_t)nn);
    auto add = [&](int u, int v, i64 c) {
      g[(size_t)u].push_back((int)es.size());
      es.push_back({v, c});
      g[(size_t)v].push_back((int)es.size());
      es.push_back({u, 0});
    };
    std::vector<std::pair<int, int>> gEdges;  // (edge id, rail) per group edge
    std::vector<int> gEdgeGroup;
    bool any = false;
    for (size_t gl = 0; gl < ng; gl++) {
      const Group& G = groups_[(size_t)P.groups[gl]];
      if (!(*sup)[gl] || G.rs == G.rd) continue;
      bool has = false;
      for (int k : {G.rs, G.rd}) {
        if (k < 0 || k >= P.kab || !P.usable[(size_t)k] || !(*dem)[(size_t)k]) continue;
        if (!has) add(S, 1 + (int)gl, (*sup)[gl]);
        has = true;
        gEdges.push_back({(int)es.size(), k});
        gEdgeGroup.push_back((int)gl);
        add(1 + (int)gl, 1 + (int)ng + k, (*sup)[gl]);
      }
      any |= has;
    }
    if (!any) return;
    for (int k = 0; k < nR; k++)
      if ((*dem)[(size_t)k]) add(1 + (int)ng + k, Tn, (*dem)[(size_t)k]);
    std::vector<int> prevE((size_t)nn);
    for (;;) {
      std::fill(prevE.begin(), prevE.end(), -1);
      std::deque<int> q;
      q.push_back(S);
      prevE[(size_t)S] = -2;
      while (!q.empty() && prevE[(size_t)Tn] == -1) {
        int u = q.front();
        q.pop_front();
        for (int ei : g[(size_t)u]) {
          const E& e = es[(size_t)ei];
          if (e.cap > 0 && prevE[(size_t)e.to] == -1) {
            prevE[(size_t)e.to] = ei;
            q.push_back(e.to);
          }
        }
      }
      if (prevE[(size_t)Tn] == -1) break;
      i64 f = std::numeric_limits<i64>::max();
      for (int x = Tn; x != S; x = es[(size_t)(prevE[(size_t)x] ^ 1)].to)
        f = std::min(f, es[(size_t)prevE[(size_t)x]].cap);
      for (int x = Tn; x != S; x = es[(size_t)(prevE[(size_t)x] ^ 1)].to) {
        es[(size_t)prevE[(size_t)x]].cap -= f;
        es[(size_t)(prevE[(size_t)x] ^ 1)].cap += f;
      }
    }
    for (size_t i = 0; i < gEdges.size(); i++) {
      i64 flow = es[(size_t)(gEdges[i].first ^ 1)].cap;
      if (flow > 0) give((size_t)gEdgeGroup[i], gEdges[i].second, flow);
    }
  }
};

// ---------------------------------------------------------------------------
// Balanced, full fabric: each node's send side and receive side on their own.

class FabricBalancer {
 public:
  FabricBalancer(const Net& net, const RouteParams& p, std::vector<RT>& rts)
      : net_(net), p_(p), rts_(rts) {}

  // Per routed transfer and side (0 send, 1 receive): full chunks by NIC,
  // and the NIC of the tail.
  std::vector<std::vector<std::pair<int, u64>>> chunks[2];
  std::vector<int> tailNic[2];

  void run() {
    size_t T = (size_t)net_.totalNics;
    std::vector<i64> fixed[2] = {std::vector<i64>(T, 0), std::vector<i64>(T, 0)};
    std::vector<std::vector<int>> byNode[2];
    byNode[0].assign((size_t)net_.N, {});
    byNode[1].assign((size_t)net_.N, {});
    for (size_t i = 0; i < rts_.size(); i++) {
      const RT& t = rts_[i];
      if (t.direct) {
        fixed[0][(size_t)net_.g(t.a, t.dSend)] += (i64)t.bytes;
        fixed[1][(size_t)net_.g(t.b, t.dRecv)] += (i64)t.bytes;
      } else {
        byNode[0][(size_t)t.a].push_back((int)i);
        byNode[1][(size_t)t.b].push_back((int)i);
      }
    }
    for (int side = 0; side < 2; side++) {
      chunks[side].assign(rts_.size(), {});
      tailNic[side].assign(rts_.size(), -1);
      for (int n = 0; n < net_.N; n++)
        if (!byNode[side][(size_t)n].empty()) balanceSide(side, n, byNode[side][(size_t)n], fixed[side]);
    }
  }

 private:
  const Net& net_;
  const RouteParams& p_;
  std::vector<RT>& rts_;

  void balanceSide(int side, int n, const std::vector<int>& items, const std::vector<i64>& fixed) {
    int K = net_.K[(size_t)n];
    i64 C = (i64)p_.chunkBytes;
    std::vector<int> nics;
    for (int k = 0; k < K; k++)
      if (net_.owned(n, k)) nics.push_back(k);
    size_t m = nics.size();
    std::vector<i64> L((size_t)K);
    std::vector<double> bw((size_t)K);
    for (int k = 0; k < K; k++) {
      L[(size_t)k] = fixed[(size_t)net_.g(n, k)];
      bw[(size_t)k] = net_.bw[(size_t)net_.g(n, k)];
    }
    auto own = [&](int i) { return side ? rts_[(size_t)i].rd : rts_[(size_t)i].rs; };
    // Items by own NIC (unowned or -1: no preference), then by transfer.
    std::vector<int> order = items;
    std::sort(order.begin(), order.end(), [&](int x, int y) {
      int ox = own(x), oy = own(y);
      if (ox != oy) return ox < oy;
      return x < y;
    });
    i64 total = 0;
    std::vector<i64> ownChunks((size_t)K, 0);
    for (int i : order) {
      total += (i64)rts_[(size_t)i].nFull;
      int o = own(i);
      if (o >= 0 && net_.owned(n, o)) ownChunks[(size_t)o] += (i64)rts_[(size_t)i].nFull;
    }
    // Quotas: the counts the greedy water-filling reaches (no preference).
    Fill f;
    f.A.resize(m);
    f.u.resize(m);
    f.pen.assign(m, 0);
    for (size_t i = 0; i < m; i++) {
      int k = nics[i];
      f.A[i] = (double)L[(size_t)k] / bw[(size_t)k];
      f.u[i] = (double)C / bw[(size_t)k];
    }
    f.B = f.A;
    f.v = f.u;
    std::vector<i64> quota;
    f.run(total, &quota);
    // The level those quotas reach; every NIC may fill up to it, own chunks first.
    double level = 0;
    for (size_t i = 0; i < m; i++)
      if (quota[i]) level = std::max(level, f.level(i, (double)quota[i]));
    std::vector<i64> cap((size_t)K, 0), keep((size_t)K, 0);
    for (size_t i = 0; i < m; i++) {
      int k = nics[i];
      cap[(size_t)k] = std::max(quota[i], f.take(i, level * (1 + 1e-12), total));
      keep[(size_t)k] = std::min(ownChunks[(size_t)k], cap[(size_t)k]);
    }
    // The excess of over-full own NICs (and items without an owned NIC) fills
    // the others' spare room, lowest resulting time first.
    i64 excess = total;
    for (int k : nics) excess -= keep[(size_t)k];
    std::vector<i64> extra((size_t)K, 0);
    {
      Fill e;
      std::vector<size_t> idx;
      for (size_t i = 0; i < m; i++) {
        int k = nics[i];
        if (cap[(size_t)k] > keep[(size_t)k]) idx.push_back(i);
      }
      e.A.resize(idx.size());
      e.u.resize(idx.size());
      e.pen.assign(idx.size(), 0);
      for (size_t x = 0; x < idx.size(); x++) {
        int k = nics[idx[x]];
        e.A[x] = (double)(L[(size_t)k] + keep[(size_t)k] * C) / bw[(size_t)k];
        e.u[x] = (double)C / bw[(size_t)k];
      }
      e.B = e.A;
      e.v = e.u;
      std::vector<i64> cnt;
      e.run(excess, &cnt);
      for (size_t x = 0; x < idx.size(); x++) extra[(size_t)nics[idx[x]]] = cnt[x];
    }
    // Hand out: each item takes its own NIC's kept chunks first, then extras.
    std::vector<i64> keepLeft = keep, extraLeft = extra;
    size_t ei = 0;
    for (int i : order) {
      i64 need = (i64)rts_[(size_t)i].nFull;
      int o = own(i);
      auto& out = chunks[side][(size_t)i];
      if (o >= 0 && o < K && keepLeft[(size_t)o] > 0) {
        i64 x = std::min(need, keepLeft[(size_t)o]);
        out.push_back({o, (u64)x});
        keepLeft[(size_t)o] -= x;
        need -= x;
      }
      while (need > 0 && ei < m) {
        int k = nics[ei];
        i64 x = std::min(need, extraLeft[(size_t)k]);
        if (x) {
          bool merged = false;
          for (auto& c : out)
            if (c.first == k) {
              c.second += (u64)x;
              merged = true;
            }
          if (!merged) out.push_back({k, (u64)x});
          extraLeft[(size_t)k] -= x;
          need -= x;
        }
        if (!extraLeft[(size_t)k]) ei++;
      }
      std::sort(out.begin(), out.end());
    }
    for (int k = 0; k < K; k++) L[(size_t)k] += (keep[(size_t)k] + extra[(size_t)k]) * C;
    // Tails, largest first, where they finish first (relay hops charged).
    std::vector<int> tails;
    for (int i : items)
      if (rts_[(size_t)i].tail) tails.push_back(i);
    std::sort(tails.begin(), tails.end(), [&](int x, int y) {
      u64 tx = rts_[(size_t)x].tail, ty = rts_[(size_t)y].tail;
      if (tx != ty) return tx > ty;
      return x < y;
    });
    for (int i : tails) {
      u64 t = rts_[(size_t)i].tail;
      int best = -1;
      double bl = 0;
      for (int k : nics) {
        double l = (double)(L[(size_t)k] + (i64)t) / bw[(size_t)k] +
                   p_.shmCost * (k != own(i)) * (double)t / bw[(size_t)k];
        if (best < 0 || l < bl) {
          bl = l;
          best = k;
        }
      }
      tailNic[side][(size_t)i] = best;
      L[(size_t)best] += (i64)t;
    }
  }
};

// ---------------------------------------------------------------------------
// Assembly

struct Seg {
  int sendNic, recvNic, srcProxy, dstProxy;
  u64 chunks;
  bool tail;
};

// The proxy of rank self's traffic on NIC nic of node: self if it owns it,
// else the owner with the least shared-memory load (lowest local rank on ties).
int pickProxy(const Net& net, int node, int nic, int self, const std::vector<u64>& load) {
  if (net.node(self) == node && net.nic(self) == nic) return self;
  const std::vector<int>& o = net.owners[(size_t)net.g(node, nic)];
  int best = -1;
  for (int r : o)
    if (best < 0 || load[(size_t)r] < load[(size_t)best]) best = r;
  return best;
}

void addPieces(Transfer* t, std::vector<Seg> segs, u64 C) {
  // The segment with the tail goes last, so that only the final piece is short.
  std::stable_sort(segs.begin(), segs.end(), [](const Seg& x, const Seg& y) { return !x.tail && y.tail; });
  u64 off = 0;
  for (const Seg& s : segs) {
    u64 bytes = s.chunks * C + (s.tail ? t->bytes % C : 0);
    if (!bytes) continue;
    Piece p;
    p.offset = off;
    p.bytes = bytes;
    p.srcProxy = s.srcProxy;
    p.sendNic = s.sendNic;
    p.dstProxy = s.dstProxy;
    p.recvNic = s.recvNic;
    if (!t->pieces.empty()) {
      Piece& q = t->pieces.back();
      if (q.srcProxy == p.srcProxy && q.sendNic == p.sendNic && q.dstProxy == p.dstProxy &&
          q.recvNic == p.recvNic) {
        q.bytes += p.bytes;
        off += bytes;
        continue;
      }
    }
    t->pieces.push_back(p);
    off += bytes;
  }
}

zpResult_t plan(const ClusterTopology& topo, const std::vector<TransferDemand>& demand,
                const RouteParams& params, Plan* out, std::string* why) {
  if (!out) return bad(why, "router: out is NULL");
  zpResult_t res = checkParams(params, why);
  if (res != zpSuccess) return res;
  Net net;
  if ((res = buildNet(topo, &net, why)) != zpSuccess) return res;
  std::vector<Item> items;
  std::vector<u64> rankShm;
  u64 intra = 0;
  if ((res = normalize(net, demand, &items, &rankShm, &intra, why)) != zpSuccess) return res;
  std::vector<RT> rts;
  if ((res = makeRTs(net, params, items, params.mode, &rts, why)) != zpSuccess) return res;
  // The bound is the balanced mode's, whatever the mode.
  double bound;
  if (params.mode == RouteMode::kBalanced) {
    bound = boundOf(net, params, rts);
  } else {
    std::vector<RT> b;
    if ((res = makeRTs(net, params, items, RouteMode::kBalanced, &b, why)) != zpSuccess) return res;
    bound = boundOf(net, params, b);
  }

  Plan plan;
  plan.params = params;
  plan.nicBase = net.nicBase;
  plan.rankShmBytes = rankShm;
  plan.intraNodeBytes = intra;
  plan.rankRelayBytes.assign((size_t)net.nranks, 0);
  plan.lowerBound = bound;
  std::vector<u64> shmLoad = rankShm;  // for picking proxies
  const u64 C = params.chunkBytes;
  plan.transfers.resize(rts.size());
  for (size_t i = 0; i < rts.size(); i++) {
    Transfer& t = plan.transfers[i];
    t.src = rts[i].src;
    t.dst = rts[i].dst;
    t.srcNode = rts[i].a;
    t.dstNode = rts[i].b;
    t.bytes = rts[i].bytes;
    t.direct = rts[i].direct;
    plan.interNodeBytes += t.bytes;
  }
  auto relay = [&](int proxy, int self, u64 bytes) {
    if (proxy != self) shmLoad[(size_t)proxy] += bytes;
  };
  auto directSeg = [&](const RT& r) {
    return Seg{r.dSend, r.dRecv, r.src, r.dst, r.nFull, r.tail != 0};
  };

  if (params.mode == RouteMode::kBalanced && params.railOnly) {
    RailBalancer rb(net, params, rts);
    rb.run();
    for (size_t i = 0; i < rts.size(); i++) {
      const RT& r = rts[i];
      std::vector<Seg> segs;
      if (r.direct) {
        segs.push_back(directSeg(r));
      } else {
        std::vector<std::pair<int, u64>> rc = rb.railChunks[i];
        int tr = r.tail ? rb.tailRail[i] : -1;
        if (tr >= 0 && std::none_of(rc.begin(), rc.end(), [&](const std::pair<int, u64>& x) { return x.first == tr; }))
          rc.push_back({tr, 0});
        for (const auto& x : rc) {
          u64 bytes = x.second * C + (x.first == tr ? r.tail : 0);
          int sp = pickProxy(net, r.a, x.first, r.src, shmLoad);
          relay(sp, r.src, bytes);
          int dp = pickProxy(net, r.b, x.first, r.dst, shmLoad);
          relay(dp, r.dst, bytes);
          segs.push_back({x.first, x.first, sp, dp, x.second, x.first == tr});
        }
      }
      addPieces(&plan.transfers[i], segs, C);
    }
  } else if (params.mode == RouteMode::kBalanced) {
    FabricBalancer fb(net, params, rts);
    fb.run();
    for (size_t i = 0; i < rts.size(); i++) {
      const RT& r = rts[i];
      std::vector<Seg> segs;
      if (r.direct) {
        segs.push_back(directSeg(r));
        addPieces(&plan.transfers[i], segs, C);
        continue;
      }
      // Each side's runs of full chunks (NIC, proxy, chunks), and its tail's
      // NIC and proxy; the two sides are zipped chunk by chunk.
      struct Run {
        int nic, proxy;
        u64 chunks;
      };
      std::vector<Run> runs[2];
      int tailNic[2] = {-1, -1}, tailProxy[2] = {-1, -1};
      for (int side = 0; side < 2; side++) {
        auto c = fb.chunks[side][i];
        int tn = r.tail ? fb.tailNic[side][i] : -1;
        if (tn >= 0 && std::none_of(c.begin(), c.end(), [&](const std::pair<int, u64>& x) { return x.first == tn; }))
          c.push_back({tn, 0});
        std::stable_sort(c.begin(), c.end(), [&](const std::pair<int, u64>& x, const std::pair<int, u64>& y) {
          return x.first != tn && y.first == tn;
        });
        int node = side ? r.b : r.a, self = side ? r.dst : r.src;
        for (const auto& x : c) {
          u64 bytes = x.second * C + (x.first == tn ? r.tail : 0);
          int px = pickProxy(net, node, x.first, self, shmLoad);
          relay(px, self, bytes);
          if (x.second) runs[side].push_back({x.first, px, x.second});
          if (x.first == tn) {
            tailNic[side] = tn;
            tailProxy[side] = px;
          }
        }
      }
      size_t si = 0, ri = 0;
      u64 sl = runs[0].empty() ? 0 : runs[0][0].chunks, rl = runs[1].empty() ? 0 : runs[1][0].chunks;
      while (si < runs[0].size() && ri < runs[1].size()) {
        u64 x = std::min(sl, rl);
        segs.push_back({runs[0][si].nic, runs[1][ri].nic, runs[0][si].proxy, runs[1][ri].proxy, x, false});
        sl -= x;
        rl -= x;
        if (!sl && ++si < runs[0].size()) sl = runs[0][si].chunks;
        if (!rl && ++ri < runs[1].size()) rl = runs[1][ri].chunks;
      }
      if (r.tail) segs.push_back({tailNic[0], tailNic[1], tailProxy[0], tailProxy[1], 0, true});
      addPieces(&plan.transfers[i], segs, C);
    }
  } else {
    for (size_t i = 0; i < rts.size(); i++) {
      const RT& r = rts[i];
      std::vector<Seg> segs;
      if (r.direct) {
        segs.push_back(directSeg(r));
      } else if (params.railOnly) {  // rail mode
        int k;
        if (r.rd >= 0 && r.rd < net.K[(size_t)r.a] && net.owned(r.a, r.rd) && net.owned(r.b, r.rd)) {
          k = r.rd;
        } else if (r.rd >= 0 && r.rd < net.K[(size_t)r.a] && r.hasDirect) {
          k = -1;  // no owner of d's rail on node a: the direct path
        } else if (r.rs >= 0 && net.usable(r.a, r.b, r.rs)) {
          k = r.rs;
        } else {
          k = 0;
          while (!net.usable(r.a, r.b, k)) k++;  // classify saw one
        }
        if (k < 0) {
          segs.push_back(directSeg(r));
          plan.transfers[i].direct = true;
        } else {
          int sp = pickProxy(net, r.a, k, r.src, shmLoad);
          relay(sp, r.src, r.bytes);
          int dp = pickProxy(net, r.b, k, r.dst, shmLoad);
          relay(dp, r.dst, r.bytes);
          segs.push_back({k, k, sp, dp, r.nFull, r.tail != 0});
        }
      } else {  // rail mode, full fabric
        int sk = r.rd, rk = r.rd;
        if (!(sk >= 0 && net.owned(r.a, sk))) {
          sk = r.rs >= 0 ? r.rs : -1;
          for (int k = 0; sk < 0 && k < net.K[(size_t)r.a]; k++)
            if (net.owned(r.a, k)) sk = k;
        }
        if (rk < 0)
          for (int k = 0; rk < 0 && k < net.K[(size_t)r.b]; k++)
            if (net.owned(r.b, k)) rk = k;
        int sp = net.nic(r.src) == sk ? r.src : pickProxy(net, r.a, sk, r.src, shmLoad);
        relay(sp, r.src, r.bytes);
        int dp = net.nic(r.dst) == rk ? r.dst : pickProxy(net, r.b, rk, r.dst, shmLoad);
        relay(dp, r.dst, r.bytes);
        segs.push_back({sk, rk, sp, dp, r.nFull, r.tail != 0});
      }
      addPieces(&plan.transfers[i], segs, C);
    }
  }

  // Loads and cost.
  plan.loads.resize((size_t)net.totalNics);
  for (int n = 0; n < net.N; n++)
    for (int k = 0; k < net.K[(size_t)n]; k++) {
      size_t gi = (size_t)net.g(n, k);
      NicLoad& l = plan.loads[gi];
      l.node = n;
      l.nic = k;
      l.bytesPerSec = net.bw[gi];
      l.rateKnown = net.known[gi];
      l.owners = (int)net.owners[gi].size();
    }
  for (const Transfer& t : plan.transfers)
    for (const Piece& p : t.pieces) {
      NicLoad& s = plan.loads[(size_t)net.g(t.srcNode, p.sendNic)];
      NicLoad& d = plan.loads[(size_t)net.g(t.dstNode, p.recvNic)];
      s.sendBytes += p.bytes;
      d.recvBytes += p.bytes;
      if (p.srcProxy != t.src) {
        s.relaySendBytes += p.bytes;
        plan.rankRelayBytes[(size_t)p.srcProxy] += p.bytes;
        plan.relayedBytes += p.bytes;
      }
      if (p.dstProxy != t.dst) {
        d.relayRecvBytes += p.bytes;
        plan.rankRelayBytes[(size_t)p.dstProxy] += p.bytes;
        plan.relayedBytes += p.bytes;
      }
    }
  for (NicLoad& l : plan.loads) {
    l.sendTime = (double)l.sendBytes / l.bytesPerSec;
    l.recvTime = (double)l.recvBytes / l.bytesPerSec;
    plan.maxNicTime = std::max(plan.maxNicTime, l.time());
  }
  double shm = 0;
  for (int r = 0; r < net.nranks; r++)
    shm = std::max(shm, (double)(plan.rankRelayBytes[(size_t)r] + plan.rankShmBytes[(size_t)r]) / net.rankBw(r));
  plan.shmTime = params.shmCost * shm;
  plan.cost = plan.maxNicTime + plan.shmTime;
  *out = std::move(plan);
  return zpSuccess;
}

}  // namespace

zpResult_t planRoutes(const ClusterTopology& topo, const std::vector<TransferDemand>& demand,
                      const RouteParams& params, Plan* out, std::string* why) {
  return plan(topo, demand, params, out, why);
}

zpResult_t planRoutes(const ClusterTopology& topo, const std::vector<std::vector<uint64_t>>& bytes,
                      const RouteParams& params, Plan* out, std::string* why) {
  Net net;
  zpResult_t res = buildNet(topo, &net, why);
  if (res != zpSuccess) return res;
  std::vector<TransferDemand> d;
  if ((res = denseToSparse(net, bytes, &d, why)) != zpSuccess) return res;
  return plan(topo, d, params, out, why);
}

double lowerBound(const ClusterTopology& topo, const std::vector<TransferDemand>& demand,
                  const RouteParams& params) {
  Net net;
  std::vector<Item> items;
  std::vector<u64> rankShm;
  u64 intra = 0;
  std::vector<RT> rts;
  if (checkParams(params, nullptr) != zpSuccess || buildNet(topo, &net, nullptr) != zpSuccess ||
      normalize(net, demand, &items, &rankShm, &intra, nullptr) != zpSuccess ||
      makeRTs(net, params, items, RouteMode::kBalanced, &rts, nullptr) != zpSuccess)
    return -1;
  return boundOf(net, params, rts);
}

double lowerBound(const ClusterTopology& topo, const std::vector<std::vector<uint64_t>>& bytes,
                  const RouteParams& params) {
  Net net;
  std::vector<TransferDemand> d;
  if (buildNet(topo, &net, nullptr) != zpSuccess || denseToSparse(net, bytes, &d, nullptr) != zpSuccess)
    return -1;
  return lowerBound(topo, d, params);
}

// ---------------------------------------------------------------------------
// Point to point

zpResult_t pickPath(const ClusterTopology& topo, int src, int dst, uint64_t bytes,
                    const std::vector<uint64_t>& queuedBytes, const RouteParams& params,
                    std::vector<Piece>* out, std::string* why) {
  if (!out) return bad(why, "pickPath: out is NULL");
  zpResult_t res = checkParams(params, why);
  if (res != zpSuccess) return res;
  Net net;
  if ((res = buildNet(topo, &net, why)) != zpSuccess) return res;
  if (src < 0 || src >= net.nranks || dst < 0 || dst >= net.nranks)
    return bad(why, strf("pickPath: %d -> %d: ranks must be in [0, %d)", src, dst, net.nranks));
  if (net.node(src) == net.node(dst))
    return bad(why, strf("pickPath: %d and %d are on one node (%d): not routed", src, dst, net.node(src)));
  if (!bytes) return bad(why, "pickPath: bytes is 0");
  if (bytes > kMaxTotalBytes) return bad(why, "pickPath: bytes beyond 2^62");
  std::vector<RT> rts;
  if ((res = makeRTs(net, params, {{src, dst, bytes}}, params.mode, &rts, why)) != zpSuccess) return res;
  const RT& r = rts[0];
  const u64 C = params.chunkBytes;
  int a = r.a, b = r.b;
  auto queued = [&](int k) { return (size_t)k < queuedBytes.size() ? (double)queuedBytes[(size_t)k] : 0.0; };
  // Proxies from local indices: spread without load information.
  auto proxy = [&](int node, int nic, int self, int salt) {
    if (net.node(self) == node && net.nic(self) == nic) return self;
    const std::vector<int>& o = net.owners[(size_t)net.g(node, nic)];
    return o[(size_t)salt % o.size()];
  };
  int salt = topo.rankLocal[(size_t)src] + topo.rankLocal[(size_t)dst];
  std::vector<Seg> segs;
  if (r.direct) {
    segs.push_back({r.dSend, r.dRecv, src, dst, r.nFull, r.tail != 0});
  } else if (params.mode == RouteMode::kRail) {
    // The same choices as planRoutes' rail mode, proxies by index.
    Plan p;
    if ((res = plan(topo, {{src, dst, bytes}}, params, &p, why)) != zpSuccess) return res;
    Piece x = p.transfers[0].pieces[0];
    if (x.srcProxy != src) x.srcProxy = proxy(a, x.sendNic, src, salt);
    if (x.dstProxy != dst) x.dstProxy = proxy(b, x.recvNic, dst, salt);
    out->assign(1, x);
    return zpSuccess;
  } else {
    // Balanced: water-fill the chunks over the paths, from the queued bytes.
    std::vector<int> sendK, recvK;
    if (params.railOnly) {
      int kab = std::min(net.K[(size_t)a], net.K[(size_t)b]);
      for (int k = 0; k < kab; k++)
        if (net.usable(a, b, k)) {
          sendK.push_back(k);
          recvK.push_back(k);
        }
    } else {
      for (int k = 0; k < net.K[(size_t)a]; k++)
        if (net.owned(a, k)) {
          sendK.push_back(k);
          recvK.push_back(net.owned(b, k) ? k : (r.rd >= 0 ? r.rd : -1));
        }
      for (size_t i = 0; i < recvK.size(); i++)
        if (recvK[i] < 0)
          for (int k = 0; recvK[i] < 0 && k < net.K[(size_t)b]; k++)
            if (net.owned(b, k)) recvK[i] = k;
    }
    size_t m = sendK.size();
    Fill f;
    f.A.resize(m);
    f.B.assign(m, 0);
    f.u.resize(m);
    f.v.resize(m);
    f.pen.resize(m);
    for (size_t i = 0; i < m; i++) {
      double bs = net.bw[(size_t)net.g(a, sendK[i])], br = net.bw[(size_t)net.g(b, recvK[i])];
      f.A[i] = queued(sendK[i]) / bs;
      f.u[i] = (double)C / bs;
      f.v[i] = (double)C / br;
      int hops = (sendK[i] != r.rs) + (recvK[i] != r.rd);
      f.pen[i] = params.shmCost * hops * 0.5 * (f.u[i] + f.v[i]);
    }
    std::vector<i64> cnt;
    f.run((i64)r.nFull, &cnt);
    int tailAt = -1;
    if (r.tail) {
      double bl = 0, x = (double)r.tail / (double)C;
      for (size_t i = 0; i < m; i++) {
        double l = f.level(i, (double)cnt[i] + x);
        if (tailAt < 0 || l < bl) {
          bl = l;
          tailAt = (int)i;
        }
      }
    }
    for (size_t i = 0; i < m; i++) {
      if (!cnt[i] && (int)i != tailAt) continue;
      segs.push_back({sendK[i], recvK[i], proxy(a, sendK[i], src, salt), proxy(b, recvK[i], dst, salt),
                      (u64)cnt[i], (int)i == tailAt});
    }
  }
  Transfer t;
  t.bytes = bytes;
  addPieces(&t, segs, C);
  *out = std::move(t.pieces);
  return zpSuccess;
}

// ---------------------------------------------------------------------------
// describe

std::string describe(const Plan& plan, size_t maxTransfers) {
  std::string s;
  size_t direct = 0, pieces = 0;
  for (const Transfer& t : plan.transfers) {
    direct += t.direct;
    pieces += t.pieces.size();
  }
  s += strf("route plan: mode %s%s, chunk %llu B, shmCost %g, directBelow %llu B\n",
            routeModeName(plan.params.mode), plan.params.railOnly ? " (rail-only)" : " (full fabric)",
            (unsigned long long)plan.params.chunkBytes, plan.params.shmCost,
            (unsigned long long)plan.params.directBelow);
  s += strf("  %zu inter-node transfers (%zu direct), %zu pieces, %llu B; %llu B intra-node\n",
            plan.transfers.size(), direct, pieces, (unsigned long long)plan.interNodeBytes,
            (unsigned long long)plan.intraNodeBytes);
  s += strf("  max NIC time %.6g s, lower bound %.6g s (x%.4f), relayed %llu B, shm time %.6g s, "
            "cost %.6g s\n",
            plan.maxNicTime, plan.lowerBound,
            plan.lowerBound > 0 ? plan.maxNicTime / plan.lowerBound : 1.0,
            (unsigned long long)plan.relayedBytes, plan.shmTime, plan.cost);
  s += "  node nic  rate(B/s)   owners      send B (relayed)      recv B (relayed)   time s\n";
  for (const NicLoad& l : plan.loads)
    s += strf("  %4d %3d  %-10.4g%s %6d  %12llu (%llu)  %12llu (%llu)  %.6g\n", l.node, l.nic,
              l.bytesPerSec, l.rateKnown ? " " : "?", l.owners, (unsigned long long)l.sendBytes,
              (unsigned long long)l.relaySendBytes, (unsigned long long)l.recvBytes,
              (unsigned long long)l.relayRecvBytes, l.time());
  for (size_t i = 0; i < plan.transfers.size() && i < maxTransfers; i++) {
    const Transfer& t = plan.transfers[i];
    s += strf("  %d (node %d) -> %d (node %d): %llu B%s\n", t.src, t.srcNode, t.dst, t.dstNode,
              (unsigned long long)t.bytes, t.direct ? ", direct" : "");
    for (const Piece& p : t.pieces)
      s += strf("    [%llu, +%llu) %d -> nic %d -> nic %d -> %d\n", (unsigned long long)p.offset,
                (unsigned long long)p.bytes, p.srcProxy, p.sendNic, p.recvNic, p.dstProxy);
  }
  if (plan.transfers.size() > maxTransfers)
    s += strf("  ... %zu more transfers\n", plan.transfers.size() - maxTransfers);
  return s;
}

}  // namespace zp
