// The router's classify and bound: which transfers are direct, the direct
// path, and the lower bound of router.h (see router.cc for the layout).
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <limits>
#include <utility>

#include "src/route/router_internal.h"

namespace zp {
namespace detail {
namespace {

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

}  // namespace

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

}  // namespace detail
}  // namespace zp
