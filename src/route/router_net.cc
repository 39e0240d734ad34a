// The router's Net: the topology validated into rates and owners of NICs,
// the params checked, and the demand normalized (see router.cc for the layout).
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <cmath>
#include <cstdarg>
#include <cstdio>

#include "src/route/router_internal.h"

namespace zp {
namespace detail {

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

}  // namespace detail
}  // namespace zp
