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
#include <functional>
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

bool RoutePlan::operator==(const RoutePlan& o) const {
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
  bool nicDown(int node, int k) const {
    return k >= 0 && k < K[node] && topo->node[(size_t)node].nics[(size_t)k].down;
  }
  // A rank whose NIC is down counts as having none.
  int nic(int r) const {
    int k = topo->rankNic[r];
    return nicDown(node(r), k) ? -1 : k;
  }
  bool lostNic(int r) const { return topo->rankNic[r] >= 0 && nic(r) < 0; }
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
      int k = net->nic(r);
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
  int a = net.node(s), b = net.node(d), rd = net.nic(d);
  if (rd < 0 || net.lostNic(s)) return false;
  if (railOnly) {
    // s's packets leave on NIC rd of node a, d's answers on NIC rankNic[s]
    // of node b: both must work.
    if (rd >= net.K[(size_t)a] || net.nicDown(a, rd) || net.nicDown(b, net.topo->rankNic[s])) return false;
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
    auto noDirect = [&] {
      if (t.rd < 0) return strf("rank %d has no NIC", t.dst);
      if (!p.railOnly && t.rs < 0) return strf("rank %d has no NIC", t.src);
      return strf("node %d has no NIC %d, the NIC of rank %d", t.a, t.rd, t.dst);
    };
    if (mode == RouteMode::kOff && !t.hasDirect)
      return bad(why, strf("router: %d (node %d) -> %d (node %d): no direct path (%s) and routing "
                           "is off", t.src, t.a, t.dst, t.b, noDirect().c_str()));
    if (wantDirect && t.hasDirect) {
      t.direct = true;
    } else if (!routable) {
      return bad(why, strf("router: %d (node %d) -> %d (node %d): no path: no direct path (%s), and "
                           "%s", t.src, t.a, t.dst, t.b, noDirect().c_str(),
                           p.railOnly ? "no rail has an owner on both nodes"
                                      : "one of the nodes has no NIC with an owner"));
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
// max(A_i + x u_i, B_i + x v_i) + pen_i. Each item goes where the level after
// it is lowest (lowest index on ties): first among the rails below their cap
// (cap_i items; no caps if cap is empty), then, for what is left, among all.
// Bulk: a binary search on the level, then the last few items one by one.

struct Fill {
  std::vector<double> A, B, u, v, pen;
  std::vector<i64> cap;
  double level(size_t i, double x) const { return std::max(A[i] + x * u[i], B[i] + x * v[i]) + pen[i]; }
  // Items rail i holds at or below level L, at most lim.
  i64 take(size_t i, double L, i64 lim) const {
    double xa = (L - pen[i] - A[i]) / u[i], xb = (L - pen[i] - B[i]) / v[i];
    double x = std::floor(std::min(xa, xb));
    if (!(x > 0)) return 0;
    if (x >= (double)lim) return lim;
    return (i64)x;
  }
  void run(i64 n, std::vector<i64>* cnt) const {
    cnt->assign(A.size(), 0);
    if (n <= 0 || A.empty()) return;
    i64 left = n;
    if (!cap.empty()) {
      i64 room = 0;
      for (i64 c : cap) room += std::min(std::max<i64>(c, 0), n);
      left -= place(std::min(n, room), cnt, true);
    }
    place(left, cnt, false);
  }
  // Places up to n more items on top of cnt; returns how many it placed.
  i64 place(i64 n, std::vector<i64>* cnt, bool capped) const {
    size_t m = A.size();
    if (n <= 0) return 0;
    auto lim = [&](size_t i) { return capped ? std::max<i64>(cap[i], 0) : (*cnt)[i] + n; };
    auto added = [&](size_t i, double L) { return std::max<i64>(0, take(i, L, lim(i)) - (*cnt)[i]); };
    i64 left = n;
    if (n > 64) {
      double lo = std::numeric_limits<double>::infinity(), hi = 0;
      for (size_t i = 0; i < m; i++) {
        if ((*cnt)[i] < lim(i)) lo = std::min(lo, level(i, (double)((*cnt)[i] + 1)));
        hi = std::max(hi, level(i, (double)std::max<i64>(lim(i), 1)));
      }
      lo = std::nextafter(std::min(lo, hi), -std::numeric_limits<double>::infinity());
      for (int it = 0; it < 128 && lo < hi; it++) {
        double mid = lo + (hi - lo) / 2;
        if (mid <= lo || mid >= hi) break;
        i64 s = 0;
        for (size_t i = 0; i < m && s < n; i++) s += added(i, mid);
        if (s >= n) hi = mid;
        else lo = mid;
      }
      std::vector<i64> add(m);
      i64 s = 0;
      for (size_t i = 0; i < m; i++) s += (add[i] = added(i, lo));
      if (s < n) {  // below n by construction
        for (size_t i = 0; i < m; i++) (*cnt)[i] += add[i];
        left = n - s;
      }
    }
    if (m <= 8) {
      for (; left > 0; left--) {
        size_t best = m;
        double bl = 0;
        for (size_t i = 0; i < m; i++) {
          if (capped && (*cnt)[i] >= lim(i)) continue;
          double l = level(i, (double)((*cnt)[i] + 1));
          if (best == m || l < bl) {
            bl = l;
            best = i;
          }
        }
        if (best == m) break;
        (*cnt)[best]++;
      }
      return n - left;
    }
    // Many rails: a heap of (level after the next item, rail).
    std::vector<std::pair<double, size_t>> heap;
    for (size_t i = 0; i < m; i++)
      if (!capped || (*cnt)[i] < lim(i)) heap.push_back({level(i, (double)((*cnt)[i] + 1)), i});
    auto cmp = std::greater<std::pair<double, size_t>>();
    std::make_heap(heap.begin(), heap.end(), cmp);
    for (; left > 0 && !heap.empty(); left--) {
      std::pop_heap(heap.begin(), heap.end(), cmp);
      size_t i = heap.back().second;
      heap.pop_back();
      (*cnt)[i]++;
      if (!capped || (*cnt)[i] < lim(i)) {
        heap.push_back({level(i, (double)((*cnt)[i] + 1)), i});
        std::push_heap(heap.begin(), heap.end(), cmp);
      }
    }
    return n - left;
  }
};

// ---------------------------------------------------------------------------
// Balanced, rail-only.

class RailBalancer {
 public:
  // bound: the lower bound (seconds); every NIC is kept within one chunk of
  // it where that is possible.
  RailBalancer(const Net& net, const RouteParams& p, std::vector<RT>& rts, double bound)
      : net_(net), p_(p), rts_(rts), C_((i64)p.chunkBytes), N_(net.N), T_(net.totalNics), bound_(bound) {}

  // Routed transfer i: its full chunks by rail are chunks[chunkBegin[i] ..
  // chunkEnd[i]) as (rail, count), its tail goes on rail tailRail[i].
  std::vector<std::pair<int, u64>> chunks;
  std::vector<int> chunkBegin, chunkEnd, tailRail;

  void run() {
    build();
    greedy();
    descend();
    distribute();
  }

 private:
  // Routed transfers of one node pair (a, b) with the same own rails (rs, rd).
  struct Group {
    int pair, rs, rd;
    i64 nFull;
    int yOff;            // its full chunks by rail: gy_[yOff + rail]
    int rtBegin, rtEnd;  // its transfers: order_[rtBegin .. rtEnd)
  };
  struct PairS {
    int a, b, kab;
    int off;                 // usable_[off + rail], Y_[off + rail]
    int railBegin, railEnd;  // rails_[railBegin .. railEnd): usable rails, ascending
    int gBegin, gEnd;        // groups_
    int rtBegin, rtEnd;      // order_
    u64 bytes;
  };

  const Net& net_;
  const RouteParams& p_;
  std::vector<RT>& rts_;
  const i64 C_;
  const int N_, T_;
  const double bound_;
  std::vector<int> order_;     // routed transfers by (a, b, rs, rd, index)
  std::vector<PairS> pairs_;
  std::vector<Group> groups_;
  std::vector<char> usable_;
  std::vector<i64> Y_;         // full chunks of a pair on a rail
  std::vector<int> rails_;
  std::vector<i64> gy_;        // full chunks of a group on a rail
  std::vector<int> pairOfRt_;  // by transfer
  std::vector<std::vector<int>> adj_;  // by vertex (send a: a, receive b: N + b): its pairs
  std::vector<i64> L_;         // bytes by load index: send (a,k) = g(a,k), receive T + g(b,k)
  std::vector<i64> F_;         // full chunks, same index
  std::vector<double> w_;      // potential weight, same index
  std::vector<double> bwL_;    // bandwidth, same index
  std::vector<double> inv_;    // 1 / bandwidth, same index
  std::vector<double> capB_;   // bound x bandwidth + one chunk, bytes, same index
  std::vector<int> stamp_, parentV_, parentP_, queue_;
  std::vector<std::pair<int, int>> cand_;
  int stampNow_ = 0;
  double lambda_ = 0, eps_ = 0;

  i64& Y(const PairS& P, int k) { return Y_[(size_t)(P.off + k)]; }
  bool usable(const PairS& P, int k) const { return k < P.kab && usable_[(size_t)(P.off + k)]; }
  i64& gy(const Group& G, int k) { return gy_[(size_t)(G.yOff + k)]; }
  int h(int rs, int rd, int k) const { return (k != rs) + (k != rd); }
  int vnode(int v) const { return v < N_ ? v : v - N_; }
  int li(int v, int k) const { return v < N_ ? net_.g(v, k) : T_ + net_.g(v - N_, k); }
  double time(int idx) const { return (double)L_[(size_t)idx] * inv_[(size_t)idx]; }
  // Past the bound: worth relieving.
  bool hot(int idx) const { return (double)L_[(size_t)idx] + (double)C_ > capB_[(size_t)idx]; }
  bool overCap(int idx) const { return (double)L_[(size_t)idx] > capB_[(size_t)idx]; }
  // Whether NIC idx may take x more bytes: at most its cap, unless the move
  // relieves a NIC over its cap (then the caller's time limit rules alone).
  bool fits(int idx, double x, bool relief) const {
    return relief || (double)L_[(size_t)idx] + x <= capB_[(size_t)idx];
  }
  // Change of the potential sum(w L^2) when idx gain takes x bytes from idx lose.
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
    inv_.resize(nl);
    capB_.resize(nl);
    for (int side = 0; side < 2; side++)
      for (int gi = 0; gi < T_; gi++) {
        size_t idx = (size_t)(side * T_ + gi);
        bwL_[idx] = net_.bw[(size_t)gi];
        inv_[idx] = 1 / net_.bw[(size_t)gi];
        capB_[idx] = (bound_ * net_.bw[(size_t)gi] + (double)C_) * (1 + 1e-12);
        w_[idx] = net_.nodeMeanBw[(size_t)net_.nicNode[(size_t)gi]] / net_.bw[(size_t)gi];
      }
    adj_.assign((size_t)N_ * 2, {});
    chunkBegin.assign(rts_.size(), 0);
    chunkEnd.assign(rts_.size(), 0);
    tailRail.assign(rts_.size(), -1);
    pairOfRt_.assign(rts_.size(), -1);
    for (size_t i = 0; i < rts_.size(); i++) {
      const RT& t = rts_[i];
      if (t.direct) {  // fixed loads
        L_[(size_t)li(t.a, t.dSend)] += (i64)t.bytes;
        L_[(size_t)li(N_ + t.b, t.dRecv)] += (i64)t.bytes;
      } else {
        order_.push_back((int)i);
      }
    }
    {
      struct Key {
        int a, b, rs, rd, i;
        bool operator<(const Key& o) const {
          if (a != o.a) return a < o.a;
          if (b != o.b) return b < o.b;
          if (rs != o.rs) return rs < o.rs;
          if (rd != o.rd) return rd < o.rd;
          return i < o.i;
        }
      };
      std::vector<Key> keys;
      keys.reserve(order_.size());
      for (int i : order_) {
        const RT& t = rts_[(size_t)i];
        keys.push_back({t.a, t.b, t.rs, t.rd, i});
      }
      std::sort(keys.begin(), keys.end());
      for (size_t x = 0; x < keys.size(); x++) order_[x] = keys[x].i;
    }
    for (int pos = 0; pos < (int)order_.size(); pos++) {
      int i = order_[(size_t)pos];
      const RT& t = rts_[(size_t)i];
      if (pairs_.empty() || pairs_.back().a != t.a || pairs_.back().b != t.b) {
        PairS P;
        P.a = t.a;
        P.b = t.b;
        P.kab = std::min(net_.K[(size_t)t.a], net_.K[(size_t)t.b]);
        P.off = (int)usable_.size();
        P.railBegin = (int)rails_.size();
        for (int k = 0; k < P.kab; k++) {
          bool u = net_.usable(t.a, t.b, k);
          usable_.push_back(u);
          Y_.push_back(0);
          if (u) rails_.push_back(k);
        }
        P.railEnd = (int)rails_.size();
        P.gBegin = P.gEnd = (int)groups_.size();
        P.rtBegin = pos;
        P.bytes = 0;
        pairs_.push_back(P);
        adj_[(size_t)t.a].push_back((int)pairs_.size() - 1);
        adj_[(size_t)(N_ + t.b)].push_back((int)pairs_.size() - 1);
      }
      PairS& P = pairs_.back();
      int pi = (int)pairs_.size() - 1;
      if (P.gEnd == P.gBegin || groups_.back().rs != t.rs || groups_.back().rd != t.rd) {
        groups_.push_back({pi, t.rs, t.rd, 0, (int)gy_.size(), pos, pos});
        gy_.resize(gy_.size() + (size_t)P.kab, 0);
        P.gEnd = (int)groups_.size();
      }
      Group& G = groups_.back();
      G.nFull += (i64)t.nFull;
      G.rtEnd = pos + 1;
      P.rtEnd = pos + 1;
      P.bytes += t.bytes;
      pairOfRt_[(size_t)i] = pi;
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
    gy(groups_[(size_t)gi], k) += x;
    Y(P, k) += x;
    int s = li(P.a, k), r = li(N_ + P.b, k);
    L_[(size_t)s] += x * C_;
    L_[(size_t)r] += x * C_;
    F_[(size_t)s] += x;
    F_[(size_t)r] += x;
  }

  // Pairs largest first; in each, each group's chunks water-filled over the
  // pair's rails (relay hops charged); then the tails, largest first.
  void greedy() {
    std::vector<int> order(pairs_.size());
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
      const PairS& P = pairs_[(size_t)pi];
      size_t m = (size_t)(P.railEnd - P.railBegin);
      f.A.resize(m);
      f.B.resize(m);
      f.u.resize(m);
      f.v.resize(m);
      f.pen.resize(m);
      f.cap.resize(m);
      for (int gi = P.gBegin; gi < P.gEnd; gi++) {
        const Group& G = groups_[(size_t)gi];
        if (!G.nFull) continue;
        for (size_t i = 0; i < m; i++) {
          int k = rails_[(size_t)P.railBegin + i];
          int s = li(P.a, k), r = li(N_ + P.b, k);
          double room = std::min(capB_[(size_t)s] - (double)L_[(size_t)s], capB_[(size_t)r] - (double)L_[(size_t)r]);
          f.cap[i] = room <= 0 ? 0 : room >= 4e18 ? (i64)4e18 : (i64)(room / C);
          f.A[i] = time(s);
          f.B[i] = time(r);
          f.u[i] = C * inv_[(size_t)s];
          f.v[i] = C * inv_[(size_t)r];
          f.pen[i] = p_.shmCost * h(G.rs, G.rd, k) * 0.5 * (f.u[i] + f.v[i]);
        }
        f.run(G.nFull, &cnt);
        for (size_t i = 0; i < m; i++)
          if (cnt[i]) addChunks(pi, gi, rails_[(size_t)P.railBegin + i], cnt[i]);
      }
    }
    struct Tail {  // all the loop needs, so that it reads no transfer
      u64 bytes;
      int i, pair, rs, rd;
      bool operator<(const Tail& o) const { return bytes != o.bytes ? bytes > o.bytes : i < o.i; }
    };
    std::vector<Tail> tails;
    for (int i : order_) {
      const RT& t = rts_[(size_t)i];
      if (t.tail) tails.push_back({t.tail, i, pairOfRt_[(size_t)i], t.rs, t.rd});
    }
    std::sort(tails.begin(), tails.end());
    for (const Tail& t : tails) {
      int i = t.i;
      const PairS& P = pairs_[(size_t)t.pair];
      double x = (double)t.bytes;
      int best = -1;
      bool bestFits = false;
      double bl = 0;
      for (int ri = P.railBegin; ri < P.railEnd; ri++) {
        int k = rails_[(size_t)ri];
        int s = li(P.a, k), r = li(N_ + P.b, k);
        double us = x * inv_[(size_t)s], ur = x * inv_[(size_t)r];
        double l = std::max(time(s) + us, time(r) + ur) + p_.shmCost * h(t.rs, t.rd, k) * 0.5 * (us + ur);
        bool ok = fits(s, x, false) && fits(r, x, false);  // within the caps first
        if (best < 0 || (ok && !bestFits) || (ok == bestFits && l < bl)) {
          bl = l;
          best = k;
          bestFits = ok;
        }
      }
      tailRail[(size_t)i] = best;
      L_[(size_t)li(P.a, best)] += (i64)t.bytes;
      L_[(size_t)li(N_ + P.b, best)] += (i64)t.bytes;
    }
  }

  // Plans moving x full chunks of pair pi from rail p to rail q through the
  // groups that gain the fewest relay hops; returns the change in chunk-hops.
  i64 planFlip(int pi, int p, int q, i64 x, std::vector<std::pair<int, i64>>* takes) {
    const PairS& P = pairs_[(size_t)pi];
    cand_.clear();
    for (int gi = P.gBegin; gi < P.gEnd; gi++) {
      const Group& G = groups_[(size_t)gi];
      if (gy(G, p) > 0) cand_.push_back({h(G.rs, G.rd, q) - h(G.rs, G.rd, p), gi});
    }
    std::sort(cand_.begin(), cand_.end());
    i64 dh = 0;
    for (const auto& c : cand_) {
      if (!x) break;
      i64 y = std::min(x, gy(groups_[(size_t)c.second], p));
      if (takes) takes->push_back({c.second, y});
      dh += y * c.first;
      x -= y;
    }
    return dh;
  }

  // An alternating path from vertex v: v gives full chunks of rail k to rail
  // j, each vertex on the way gives back what it got on the other rail, the
  // last one keeps the change. Breadth first; the first end vertex that makes
  // the potential (plus relay charges) drop, without any NIC passing v's
  // time on rail k, is taken. True if a move was made.
  bool tryChain(int v, int k, int j) {
    int vk = li(v, k), vj = li(v, j);
    double C = (double)C_;
    double Tcap = time(vk) * (1 + 1e-12);
    bool relief = overCap(vk);
    if ((double)(L_[(size_t)vj] + C_) / bwL_[(size_t)vj] > Tcap || !fits(vj, C, relief)) return false;
    double dv = dPhi(vj, vk, C);
    if (!(dv < 0)) return false;
    int vside = v < N_ ? 0 : 1;
    stampNow_++;
    queue_.clear();
    queue_.push_back(v);
    stamp_[(size_t)v] = stampNow_;
    parentV_[(size_t)v] = -1;
    for (size_t qi = 0; qi < queue_.size(); qi++) {
      int u = queue_[qi];
      int shed = ((u < N_ ? 0 : 1) == vside) ? k : j;
      int gain = shed == k ? j : k;
      for (int pi : adj_[(size_t)u]) {
        PairS& P = pairs_[(size_t)pi];
        if (!usable(P, gain) || !usable(P, shed) || Y(P, shed) == 0) continue;
        int w = u < N_ ? N_ + P.b : P.a;
        if (stamp_[(size_t)w] == stampNow_) continue;
        stamp_[(size_t)w] = stampNow_;
        parentV_[(size_t)w] = u;
        parentP_[(size_t)w] = pi;
        int wq = li(w, gain), wp = li(w, shed);
        if ((double)(L_[(size_t)wq] + C_) / bwL_[(size_t)wq] <= Tcap && fits(wq, C, relief)) {
          double dw = dPhi(wq, wp, C);
          if (dv + dw < -eps_ && applyPath(v, k, j, w, gain, shed, Tcap, relief)) return true;
        }
        queue_.push_back(w);
      }
    }
    return false;
  }

  bool applyPath(int v, int k, int j, int w, int wq, int wp, double Tcap, bool relief) {
    struct Edge {
      int pi, p, q;  // pair, rail it gives up, rail it gains
    };
    std::vector<Edge> path;
    int vside = v < N_ ? 0 : 1;
    for (int x = w; x != v; x = parentV_[(size_t)x]) {
      int u = parentV_[(size_t)x];
      int shed = ((u < N_ ? 0 : 1) == vside) ? k : j;
      path.push_back({parentP_[(size_t)x], shed, shed == k ? j : k});
    }
    i64 qmax = std::numeric_limits<i64>::max();
    for (const Edge& e : path) qmax = std::min(qmax, Y(pairs_[(size_t)e.pi], e.p));
    int ivk = li(v, k), ivj = li(v, j), iwq = li(w, wq), iwp = li(w, wp);
    double C = (double)C_;
    // Potential change for x bytes moved: alpha x + beta x^2; its best x.
    double alpha = 2 * (w_[(size_t)ivj] * (double)L_[(size_t)ivj] - w_[(size_t)ivk] * (double)L_[(size_t)ivk]) +
                   2 * (w_[(size_t)iwq] * (double)L_[(size_t)iwq] - w_[(size_t)iwp] * (double)L_[(size_t)iwp]);
    double beta = w_[(size_t)ivj] + w_[(size_t)ivk] + w_[(size_t)iwq] + w_[(size_t)iwp];
    double xs = -alpha / (2 * beta) / C;
    i64 q = xs >= (double)qmax ? qmax : (i64)std::llround(std::max(1.0, xs));
    q = std::max<i64>(1, std::min(q, qmax));
    for (int idx : {ivj, iwq}) {  // nothing past v's time on rail k, nor a cap
      double lim = Tcap * bwL_[(size_t)idx];
      if (!relief) lim = std::min(lim, capB_[(size_t)idx]);
      double room = std::floor((lim - (double)L_[(size_t)idx]) / C);
      if (room < (double)q) q = (i64)std::max(1.0, room);
    }
    for (;;) {
      double x = (double)q * C;
      i64 dh = 0;
      for (const Edge& e : path) dh += planFlip(e.pi, e.p, e.q, q, nullptr);
      if (alpha * x + beta * x * x + lambda_ * C * (double)dh < -eps_) break;
      if (q == 1) return false;
      q = 1;
    }
    std::vector<std::pair<int, i64>> takes;
    for (const Edge& e : path) {
      takes.clear();
      planFlip(e.pi, e.p, e.q, q, &takes);
      for (const auto& t : takes) {
        addChunks(e.pi, t.first, e.p, -t.second);
        addChunks(e.pi, t.first, e.q, t.second);
      }
    }
    return true;
  }

  // Moves one tail to the rail that lowers the potential most (no NIC
  // passing the larger of its current two times); true if it did.
  bool tryTail(int i) {
    const RT& t = rts_[(size_t)i];
    const PairS& P = pairs_[(size_t)pairOfRt_[(size_t)i]];
    int k = tailRail[(size_t)i];
    double x = (double)t.tail;
    int ak = li(P.a, k), bk = li(N_ + P.b, k);
    if (!hot(ak) && !hot(bk)) return false;  // leave NICs below the bound alone
    double cap = std::max(time(ak), time(bk)) * (1 + 1e-12);
    bool relief = overCap(ak) || overCap(bk);
    int hk = h(t.rs, t.rd, k);
    int best = -1;
    double bd = -eps_;
    for (int ri = P.railBegin; ri < P.railEnd; ri++) {
      int j = rails_[(size_t)ri];
      if (j == k) continue;
      int aj = li(P.a, j), bj = li(N_ + P.b, j);
      if ((double)(L_[(size_t)aj] + (i64)t.tail) / bwL_[(size_t)aj] > cap ||
          (double)(L_[(size_t)bj] + (i64)t.tail) / bwL_[(size_t)bj] > cap || !fits(aj, x, relief) ||
          !fits(bj, x, relief))
        continue;
      double d = dPhi(aj, ak, x) + dPhi(bj, bk, x) + lambda_ * x * (h(t.rs, t.rd, j) - hk);
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

  // Local search: at every vertex, chunks off its most loaded rail (that has
  // full chunks) by alternating paths, then tail moves, until nothing moves.
  void descend() {
    i64 budget = 64 * (i64)(pairs_.size() + order_.size()) + 100000;  // bounded work
    std::vector<std::pair<double, int>> js;
    for (int sweep = 0; sweep < 1000 && budget > 0; sweep++) {
      // Done when every NIC is within one chunk of the bound.
      bool over = false;
      for (size_t idx = 0; idx < L_.size() && !over; idx++) over = overCap((int)idx);
      if (!over) break;
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
          if (js.size() > 8) js.resize(8);  // the lightest rails are the likely ones
          bool ok = false;
          for (const auto& jj : js)
            if ((ok = tryChain(v, k, jj.second))) break;
          if (!ok) break;
          moves++;
        }
      }
      for (int i : order_)
        if (rts_[(size_t)i].tail && budget > 0 && tryTail(i)) {
          moves++;
          budget--;
        }
      if (!moves) break;
    }
  }

  // Per pair: the rails' chunks go to groups with the fewest relay hops
  // (no hop first, then a max flow for one hop, then the rest), and each
  // group's chunks to its transfers in order.
  void distribute() {
    std::vector<i64> dem, sup;
    chunks.reserve(order_.size());
    for (size_t pi = 0; pi < pairs_.size(); pi++) {
      PairS& P = pairs_[pi];
      dem.assign(Y_.begin() + P.off, Y_.begin() + P.off + P.kab);
      sup.clear();
      for (int gi = P.gBegin; gi < P.gEnd; gi++) {
        Group& G = groups_[(size_t)gi];
        std::fill(gy_.begin() + G.yOff, gy_.begin() + G.yOff + P.kab, 0);
        sup.push_back(G.nFull);
      }
      auto give = [&](int gl, int k, i64 x) {
        gy(groups_[(size_t)(P.gBegin + gl)], k) += x;
        sup[(size_t)gl] -= x;
        dem[(size_t)k] -= x;
      };
      int ng = P.gEnd - P.gBegin;
      for (int gl = 0; gl < ng; gl++) {
        const Group& G = groups_[(size_t)(P.gBegin + gl)];
        if (G.rs == G.rd && G.rs >= 0 && usable(P, G.rs))
          give(gl, G.rs, std::min(sup[(size_t)gl], dem[(size_t)G.rs]));
      }
      hopOneFlow(P, &sup, &dem, give);
      for (int gl = 0; gl < ng; gl++)
        for (int ri = P.railBegin; ri < P.railEnd && sup[(size_t)gl]; ri++) {
          int k = rails_[(size_t)ri];
          i64 x = std::min(sup[(size_t)gl], dem[(size_t)k]);
          if (x) give(gl, k, x);
        }
      for (int gi = P.gBegin; gi < P.gEnd; gi++) {
        Group& G = groups_[(size_t)gi];
        int ri = P.railBegin;
        for (int pos = G.rtBegin; pos < G.rtEnd; pos++) {
          int i = order_[(size_t)pos];
          chunkBegin[(size_t)i] = (int)chunks.size();
          i64 need = (i64)rts_[(size_t)i].nFull;
          while (need > 0 && ri < P.railEnd) {
            int k = rails_[(size_t)ri];
            i64 x = std::min(need, gy(G, k));
            if (x) {
              chunks.push_back({k, (u64)x});
              gy(G, k) -= x;
              need -= x;
            }
            if (!gy(G, k)) ri++;
          }
          chunkEnd[(size_t)i] = (int)chunks.size();
        }
      }
    }
  }

  // Max flow from the groups whose own rails differ (one relay hop on either
  // of them) to the rails' remaining chunks: greedy pushes, then augmenting
  // paths (Edmonds-Karp) on the small residual graph.
  struct FlowEdge {
    int to;
    i64 cap;
  };
  std::vector<FlowEdge> fe_;
  std::vector<std::vector<int>> fg_;
  std::vector<int> prevE_, fq_;
  template <class Give>
  void hopOneFlow(const PairS& P, std::vector<i64>* sup, std::vector<i64>* dem, Give give) {
    int ng = P.gEnd - P.gBegin;
    int S = 0, Tn = ng + P.kab + 1, nn = Tn + 1;  // source, groups, rails, sink
    fe_.clear();
    if ((int)fg_.size() < nn) fg_.resize((size_t)nn);
    for (int x = 0; x < nn; x++) fg_[(size_t)x].clear();
    auto add = [&](int u, int v, i64 c) {
      fg_[(size_t)u].push_back((int)fe_.size());
      fe_.push_back({v, c});
      fg_[(size_t)v].push_back((int)fe_.size());
      fe_.push_back({u, 0});
      return (int)fe_.size() - 2;
    };
    auto push = [&](int e, i64 f) {
      fe_[(size_t)e].cap -= f;
      fe_[(size_t)(e ^ 1)].cap += f;
    };
    std::vector<int> railEdge((size_t)P.kab, -1);
    struct GE {
      int gl, k, edge, srcEdge;
    };
    std::vector<GE> ges;
    for (int gl = 0; gl < ng; gl++) {
      const Group& G = groups_[(size_t)(P.gBegin + gl)];
      if (!(*sup)[(size_t)gl] || G.rs == G.rd) continue;
      int se = -1;
      for (int k : {G.rs, G.rd}) {
        if (k < 0 || !usable(P, k) || !(*dem)[(size_t)k]) continue;
        if (se < 0) se = add(S, 1 + gl, (*sup)[(size_t)gl]);
        if (railEdge[(size_t)k] < 0) railEdge[(size_t)k] = add(1 + ng + k, Tn, (*dem)[(size_t)k]);
        ges.push_back({gl, k, add(1 + gl, 1 + ng + k, (*sup)[(size_t)gl]), se});
      }
    }
    if (ges.empty()) return;
    for (const GE& e : ges) {
      i64 f = std::min(fe_[(size_t)e.srcEdge].cap, fe_[(size_t)railEdge[(size_t)e.k]].cap);
      if (f > 0) {
        push(e.srcEdge, f);
        push(e.edge, f);
        push(railEdge[(size_t)e.k], f);
      }
    }
    prevE_.assign((size_t)nn, -1);
    for (;;) {
      std::fill(prevE_.begin(), prevE_.end(), -1);
      fq_.clear();
      fq_.push_back(S);
      prevE_[(size_t)S] = -2;
      for (size_t qi = 0; qi < fq_.size() && prevE_[(size_t)Tn] == -1; qi++) {
        int u = fq_[qi];
        for (int ei : fg_[(size_t)u]) {
          const FlowEdge& e = fe_[(size_t)ei];
          if (e.cap > 0 && prevE_[(size_t)e.to] == -1) {
            prevE_[(size_t)e.to] = ei;
            fq_.push_back(e.to);
          }
        }
      }
      if (prevE_[(size_t)Tn] == -1) break;
      i64 f = std::numeric_limits<i64>::max();
      for (int x = Tn; x != S; x = fe_[(size_t)(prevE_[(size_t)x] ^ 1)].to)
        f = std::min(f, fe_[(size_t)prevE_[(size_t)x]].cap);
      for (int x = Tn; x != S; x = fe_[(size_t)(prevE_[(size_t)x] ^ 1)].to) push(prevE_[(size_t)x], f);
    }
    for (const GE& e : ges) {
      i64 flow = fe_[(size_t)(e.edge ^ 1)].cap;
      if (flow > 0) give(e.gl, e.k, flow);
    }
  }
};

// ---------------------------------------------------------------------------
// Balanced, full fabric: each node's send side and receive side on their own.

class FabricBalancer {
 public:
  FabricBalancer(const Net& net, const RouteParams& p, std::vector<RT>& rts, double bound)
      : net_(net), p_(p), rts_(rts), bound_(bound) {}

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
  const double bound_;

  // One node's send (side 0) or receive (side 1) side: the chunks of its
  // routed transfers over its owned NICs. Counts per NIC by water-filling
  // (each NIC at most one chunk past the bound where possible); every NIC may
  // then keep its owners' chunks up to the level reached, and the rest fills
  // the others; tails last, largest first.
  void balanceSide(int side, int n, const std::vector<int>& items, const std::vector<i64>& fixed) {
    int K = net_.K[(size_t)n];
    i64 C = (i64)p_.chunkBytes;
    std::vector<int> nics;
    for (int k = 0; k < K; k++)
      if (net_.owned(n, k)) nics.push_back(k);
    size_t m = nics.size();
    std::vector<i64> L((size_t)K);
    std::vector<double> bw((size_t)K), capB((size_t)K);
    for (int k = 0; k < K; k++) {
      L[(size_t)k] = fixed[(size_t)net_.g(n, k)];
      bw[(size_t)k] = net_.bw[(size_t)net_.g(n, k)];
      capB[(size_t)k] = (bound_ * bw[(size_t)k] + (double)C) * (1 + 1e-12);
    }
    auto capCount = [&](int k, i64 base) {
      double room = capB[(size_t)k] - (double)base;
      return room <= 0 ? i64(0) : room >= 4e18 ? (i64)4e18 : (i64)(room / (double)C);
    };
    auto own = [&](int i) { return side ? rts_[(size_t)i].rd : rts_[(size_t)i].rs; };
    std::vector<int> order = items;  // by own NIC, then transfer
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
    auto fill = [&](const std::vector<i64>& base, const std::vector<i64>& caps, i64 count, std::vector<i64>* cnt) {
      Fill f;
      f.A.resize(m);
      f.u.resize(m);
      f.pen.assign(m, 0);
      f.cap = caps;
      for (size_t i = 0; i < m; i++) {
        int k = nics[i];
        f.A[i] = (double)base[i] / bw[(size_t)k];
        f.u[i] = (double)C / bw[(size_t)k];
      }
      f.B = f.A;
      f.v = f.u;
      f.run(count, cnt);
      return f;
    };
    std::vector<i64> base(m), caps(m), quota;
    for (size_t i = 0; i < m; i++) {
      base[i] = L[(size_t)nics[i]];
      caps[i] = capCount(nics[i], base[i]);
    }
    Fill f = fill(base, caps, total, &quota);
    double level = 0;
    for (size_t i = 0; i < m; i++)
      if (quota[i]) level = std::max(level, f.level(i, (double)quota[i]));
    std::vector<i64> allow(m), keep((size_t)K, 0), extra((size_t)K, 0);
    i64 excess = total;
    for (size_t i = 0; i < m; i++) {
      int k = nics[i];
      allow[i] = std::max(quota[i], std::min(f.take(i, level * (1 + 1e-12), total), caps[i]));
      keep[(size_t)k] = std::min(ownChunks[(size_t)k], allow[i]);
      excess -= keep[(size_t)k];
      base[i] += keep[(size_t)k] * C;
      caps[i] = allow[i] - keep[(size_t)k];
    }
    std::vector<i64> cnt;
    fill(base, caps, excess, &cnt);
    for (size_t i = 0; i < m; i++) extra[(size_t)nics[i]] = cnt[i];
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
    // Tails, largest first, where they finish first (relay hops charged),
    // within the caps first.
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
      bool bestFits = false;
      double bl = 0;
      for (int k : nics) {
        double l = (double)(L[(size_t)k] + (i64)t) / bw[(size_t)k] +
                   p_.shmCost * (k != own(i)) * (double)t / bw[(size_t)k];
        bool ok = (double)(L[(size_t)k] + (i64)t) <= capB[(size_t)k];
        if (best < 0 || (ok && !bestFits) || (ok == bestFits && l < bl)) {
          bl = l;
          best = k;
          bestFits = ok;
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
                const RouteParams& params, RoutePlan* out, std::string* why) {
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

  RoutePlan plan;
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
    RailBalancer rb(net, params, rts, bound);
    rb.run();
    for (size_t i = 0; i < rts.size(); i++) {
      const RT& r = rts[i];
      std::vector<Seg> segs;
      if (r.direct) {
        segs.push_back(directSeg(r));
      } else {
        std::vector<std::pair<int, u64>> rc(rb.chunks.begin() + rb.chunkBegin[i], rb.chunks.begin() + rb.chunkEnd[i]);
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
    FabricBalancer fb(net, params, rts, bound);
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
        int sp = pickProxy(net, r.a, sk, r.src, shmLoad);
        relay(sp, r.src, r.bytes);
        int dp = pickProxy(net, r.b, rk, r.dst, shmLoad);
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
                      const RouteParams& params, RoutePlan* out, std::string* why) {
  return plan(topo, demand, params, out, why);
}

zpResult_t planRoutes(const ClusterTopology& topo, const std::vector<std::vector<uint64_t>>& bytes,
                      const RouteParams& params, RoutePlan* out, std::string* why) {
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
    RoutePlan p;
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

std::string describe(const RoutePlan& plan, size_t maxTransfers) {
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
