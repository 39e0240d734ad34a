// The router's RailBalancer: balanced mode on rail-only networks (greedy
// water-filling, a local search over alternating paths, then per node pair
// the rails' chunks handed to transfers; see router.cc for the layout).
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "src/route/router_internal.h"

namespace zp {
namespace detail {
namespace {

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

}  // namespace

RailChunks balanceRails(const Net& net, const RouteParams& p, std::vector<RT>& rts, double bound) {
  RailBalancer rb(net, p, rts, bound);
  rb.run();
  return {std::move(rb.chunks), std::move(rb.chunkBegin), std::move(rb.chunkEnd), std::move(rb.tailRail)};
}

}  // namespace detail
}  // namespace zp
