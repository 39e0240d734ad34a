#include "src/plan/schedule.h"
#include "src/plan/growing_min.h"
#include "src/plan/node_pool.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <map>
#include <numeric>
#include <queue>
#include <set>
#include <utility>
#include <vector>

namespace zp::plan {

namespace {

using Entry = std::pair<double, int>;  // (load or free time, rank or group)

// A min-heap of entries whose top is replaced by one sift down (not a pop and
// a push): placements take the least loaded and put it back heavier,
// thousands of times per candidate.
struct LoadHeap {
  std::vector<Entry> v;  // a heap as std::push_heap with std::greater keeps it
  const Entry& top() const { return v.front(); }
  void push(Entry e) {
    v.push_back(e);
    std::push_heap(v.begin(), v.end(), std::greater<Entry>());
  }
  void replaceTop(Entry e) { replaceTopOf(v.data(), v.size(), e); }
  // The same on the heap of `size` entries at `heap`.
  static void replaceTopOf(Entry* heap, size_t size, Entry e) {
    size_t at = 0;
    for (size_t child = 1; child < size; child = 2 * at + 1) {
      if (child + 1 < size && heap[child + 1] < heap[child]) ++child;
      if (!(heap[child] < e)) break;
      heap[at] = heap[child];
      at = child;
    }
    heap[at] = e;
  }
};

// Each node's ranks as a LoadHeap, side by side in one array (node nd's at
// [nd * rpn, (nd + 1) * rpn)): a schedule makes one per node, and a vector
// each was four allocations each as it grew.
class NodeHeaps {
 public:
  bool empty() const { return v_.empty(); }
  // Node by node, each heap as pushing its ranks in order would make it.
  void build(const std::vector<double>& freeAt, int rpn) {
    rpn_ = size_t(rpn);
    v_.resize(freeAt.size());
    for (size_t r = 0; r < v_.size(); ++r) {
      const size_t first = r / rpn_ * rpn_;
      v_[r] = {freeAt[r], int(r)};
      std::push_heap(v_.begin() + std::ptrdiff_t(first), v_.begin() + std::ptrdiff_t(r + 1), std::greater<Entry>());
    }
  }
  const Entry& top(int nd) const { return v_[size_t(nd) * rpn_]; }
  void replaceTop(int nd, Entry e) { LoadHeap::replaceTopOf(&v_[size_t(nd) * rpn_], rpn_, e); }

 private:
  std::vector<Entry> v_;
  size_t rpn_ = 1;
};

}  // namespace

// An idle interval a rank spends waiting for the other ranks of a ring.
struct Gap {
  int rank;
  double begin, end;
};

namespace {

constexpr double kEps = 1e-12;

// Entries in order (the nodes by when all their ranks are free), their
// tree's nodes from a pool.
using EntrySet = std::set<Entry, std::less<Entry>, Pooled<Entry>>;

// The idle gaps rings leave, by length, so that a whole sequence takes the
// smallest one it fits (schedule() and scheduleToTarget() alike).
class IdleGaps {
 public:
  using Map = std::multimap<double, Gap, std::less<double>, Pooled<std::pair<const double, Gap>>>;
  using Iter = Map::iterator;
  // Rank r, free from `freeAt`, waits until a ring starts at `at`.
  void wait(int r, double freeAt, double at) {
    if (at > freeAt + kEps) gaps_.insert({at - freeAt, {r, freeAt, at}});
  }
  // Of the four smallest gaps of at least `seconds`, the first whose rank
  // `ok` takes; else end().
  template <class Ok>
  Iter find(double seconds, Ok ok) {
    int tries = 0;
    for (auto it = gaps_.lower_bound(seconds - kEps); it != gaps_.end() && tries < 4; ++it, ++tries)
      if (ok(it->second.rank)) return it;
    return gaps_.end();
  }
  Iter end() { return gaps_.end(); }
  // `seconds` of work go at the gap's start; what is left stays a gap.
  void fill(Iter it, double seconds) {
    const Gap g = it->second;
    gaps_.erase(it);
    if (g.end - g.begin - seconds > kEps) gaps_.insert({g.end - g.begin - seconds, {g.rank, g.begin + seconds, g.end}});
  }

 private:
  NodePool pool_;  // before gaps_, which gives its nodes back to it
  Map gaps_{Map::allocator_type(&pool_)};
};

// An intra-node ring of G ranks starting at `at` on `node`: of the node's
// ranks free by then, the G that are free latest, so the ring leaves the
// least idle and the ranks free earlier stay for shorter work. Writes the
// ranks in order; scratch is the caller's, kept from call to call.
void latestFree(const std::vector<double>& freeAt, int node, int rpn, double at, int G, std::vector<Entry>& scratch,
                int* ring) {
  scratch.clear();
  for (int r = node * rpn; r < (node + 1) * rpn; ++r)
    if (freeAt[r] <= at) scratch.push_back({-freeAt[r], r});
  std::stable_sort(scratch.begin(), scratch.end());
  for (int j = 0; j < G; ++j) ring[j] = scratch[j].second;
  std::sort(ring, ring + G);
}

// An inter-node ring of G ranks: the G / ranksPerNode nodes that are free
// soonest, whole, node by node so only that many hops of the ring cross the
// network. byAllFree: the nodes by when all their ranks are free (ties: the
// lower node); the chosen ones are taken out of it. Writes the ring's ranks;
// returns when they are all free.
double placeAcrossNodes(EntrySet& byAllFree, int rpn, int G, int* ring) {
  const int k = G / rpn;
  std::vector<int> chosen;
  double at = 0;
  for (int j = 0; j < k; ++j) {
    chosen.push_back(byAllFree.begin()->second);
    at = std::max(at, byAllFree.begin()->first);
    byAllFree.erase(byAllFree.begin());
  }
  std::sort(chosen.begin(), chosen.end());
  int* next = ring;
  for (int nd : chosen)
    for (int r = nd * rpn; r < (nd + 1) * rpn; ++r) *next++ = r;
  return at;
}

// A schedule's rings run in its order (reversed: the backward pass), each
// starting when the last of its ranks is free and taking seconds[i].
// Returns the makespan.
double orderMakespan(const Schedule& out, const std::vector<double>& seconds, int n, bool reversed) {
  std::vector<double> freeAt(n, 0.0);
  for (size_t k = 0; k < out.order.size(); ++k) {
    const size_t i = size_t(out.order[reversed ? out.order.size() - 1 - k : k]);
    double at = 0;
    for (const int* r = out.ringBegin(i); r != out.ringEnd(i); ++r) at = std::max(at, freeAt[*r]);
    for (const int* r = out.ringBegin(i); r != out.ringEnd(i); ++r) freeAt[*r] = at + seconds[i];
  }
  return *std::max_element(freeAt.begin(), freeAt.end());
}

}  // namespace

// List scheduling of one candidate (the splits a cap gives): rings go, largest
// first, where they can start soonest, and a ring starts when the last of its
// ranks is free, so all its ranks finish together at start + its time (the
// executor runs it that way). The ranks a ring leaves waiting keep that idle
// time as gaps, which whole sequences fill before they go to the least loaded
// rank. The order is every sequence by planned start, so running the plan in
// that order reproduces the schedule; the backward pass runs it reversed.
//
// byLength: the sequences longest first, ties in index order.
Schedule schedule(const std::vector<int64_t>& lens, const ClusterModel& c, const PlanOptions& opt,
                  const std::vector<Split>& splits, const std::vector<double>& piece, const std::vector<double>& back,
                  const std::vector<size_t>& byLength) {
  const int n = c.ranks();
  const int rpn = c.ranksPerNode;
  const size_t m = lens.size();
  Schedule out;
  out.first.assign(m + 1, 0);
  for (size_t i = 0; i < m; ++i) out.first[i + 1] = out.first[i] + size_t(splits[i].G);
  out.ranks.resize(out.first[m]);
  // Rings first, then whole sequences; larger pieces first. The guess: the
  // rings (few) sorted, then the whole sequences longest first, as a whole
  // sequence's time grows with its length.
  auto before = [&](size_t a, size_t b) {
    if (splits[a].cls != splits[b].cls) return splits[a].cls > splits[b].cls;
    return piece[a] > piece[b];
  };
  std::vector<size_t> order;
  order.reserve(m);
  for (size_t i = 0; i < m; ++i)
    if (splits[i].cls != SeqClass::Local) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), before);
  for (size_t i : byLength)
    if (splits[i].cls == SeqClass::Local) order.push_back(i);
  stableSortFromGuess(order, before);
  std::vector<double> freeAt(n, 0.0), start(m, 0.0);
  IdleGaps gaps;
  std::vector<char>* dirtyOf = nullptr;  // set once the per-node index exists
  std::vector<int>* dirtyList = nullptr;
  auto occupy = [&](size_t i, double s) {
    start[i] = s;
    for (const int* it = out.ringBegin(i); it != out.ringEnd(i); ++it) {
      const int r = *it;
      gaps.wait(r, freeAt[r], s);
      freeAt[r] = s + piece[i];
      if (dirtyOf && !(*dirtyOf)[size_t(r / rpn)]) (*dirtyOf)[size_t(r / rpn)] = 1, dirtyList->push_back(r / rpn);
    }
  };
  LoadHeap heap;
  NodeHeaps nodeHeaps;  // per node, with node-level token balance
  // The nodes by their least load (the top of their heap), with their
  // tokens: the least loaded node with room for a sequence.
  RoomTree<double> nodeOrder(size_t(c.nodes));
  std::vector<double> nodeTokens(c.nodes, 0.0);
  // While inter-node rings are placed (they come first): the nodes by when
  // all their ranks are free.
  NodePool allFreePool;
  EntrySet byAllFree{EntrySet::allocator_type(&allFreePool)};
  const bool balanceNodes = opt.nodeTokenBalance && c.nodes > 1;
  const double nodeQuota = std::accumulate(lens.begin(), lens.end(), 0.0) / c.nodes * (1 + 1e-9) + 1;
  auto hasRoom = [&](int nd, int64_t len) { return !balanceNodes || nodeTokens[nd] + len <= nodeQuota; };
  std::vector<Entry> rs;
  // Per ring size G inside a node: the nodes by their G-th free time, kept
  // up to date for the nodes whose ranks got work (free times only grow).
  std::vector<GrowingMin> kth;
  std::vector<double> nodeFree(rpn);
  std::vector<char> dirty(size_t(c.nodes), 0);
  std::vector<int> dirtyNodes;
  auto refresh = [&] {
    for (int nd : dirtyNodes) {
      std::copy(freeAt.begin() + nd * rpn, freeAt.begin() + (nd + 1) * rpn, nodeFree.begin());
      std::sort(nodeFree.begin(), nodeFree.end());
      for (int g = 0; g < rpn; ++g)
        if (kth[size_t(g)].key(nd) != nodeFree[size_t(g)]) kth[size_t(g)].raise(nd, nodeFree[size_t(g)]);
      dirty[size_t(nd)] = 0;
    }
    dirtyNodes.clear();
  };
  for (size_t i : order) {
    const Split& s = splits[i];
    int* const ring = out.ranks.data() + out.first[i];  // s.G ranks
    if (s.cls != SeqClass::InterNode) byAllFree.clear();
    if (s.cls == SeqClass::InterNode) {
      if (byAllFree.empty())
        for (int nd = 0; nd < c.nodes; ++nd)
          byAllFree.insert({*std::max_element(freeAt.begin() + nd * rpn, freeAt.begin() + (nd + 1) * rpn), nd});
      const double at = placeAcrossNodes(byAllFree, rpn, s.G, ring);
      occupy(i, at);
      for (int j = 0; j < s.G; j += rpn) byAllFree.insert({at + piece[i], ring[j] / rpn});
    } else if (s.cls == SeqClass::IntraNode) {
      // The node where G ranks are free soonest, the lower on ties
      // (latestFree says which ranks).
      if (kth.empty()) {
        kth.assign(size_t(rpn), GrowingMin(size_t(c.nodes)));
        for (int nd = 0; nd < c.nodes; ++nd) dirtyNodes.push_back(nd), dirty[size_t(nd)] = 1;
        dirtyOf = &dirty;
        dirtyList = &dirtyNodes;
      }
      refresh();
      int any = -1;
      const int bestNode = kth[size_t(s.G - 1)].least([](int) { return true; }, &any);
      const double at = kth[size_t(s.G - 1)].key(bestNode);
      latestFree(freeAt, bestNode, rpn, at, s.G, rs, ring);
      occupy(i, at);
    } else {
      // A whole sequence: the smallest idle gap it fits (on a node with room
      // for its tokens), else the least loaded rank. Rings are all placed by
      // now, so loads change only through these heaps.
      const IdleGaps::Iter gap = gaps.find(piece[i], [&](int r) { return hasRoom(r / rpn, lens[i]); });
      const bool placed = gap != gaps.end();
      if (placed) {
        ring[0] = gap->second.rank;
        start[i] = gap->second.begin;
        gaps.fill(gap, piece[i]);
      }
      if (!placed && !balanceNodes) {
        if (heap.v.empty())
          for (int r = 0; r < n; ++r) heap.push({freeAt[r], r});
        const int r = heap.top().second;
        heap.replaceTop({freeAt[r] + piece[i], r});
        ring[0] = r;
        occupy(i, freeAt[r]);
      } else if (!placed) {
        // Node-level token balance: the least loaded rank among nodes that
        // still have room for the sequence's tokens under the node's share of
        // the batch, so the remap to the token-balanced linear layout stays
        // inside nodes (NVLink) instead of crossing NICs.
        if (nodeHeaps.empty()) {
          nodeHeaps.build(freeAt, rpn);
          for (int nd = 0; nd < c.nodes; ++nd) nodeOrder.set(nd, nodeHeaps.top(nd).first, nodeTokens[nd]);
        }
        int any = -1;  // when no node has room: the least loaded
        const int found = nodeOrder.least(double(lens[i]), nodeQuota, &any);
        const int nd = found >= 0 ? found : any;
        const int r = nodeHeaps.top(nd).second;
        nodeHeaps.replaceTop(nd, {freeAt[r] + piece[i], r});
        ring[0] = r;
        occupy(i, freeAt[r]);
      }
    }
    for (int j = 0; j < s.G; ++j) nodeTokens[ring[j] / rpn] += double(lens[i]) / s.G;
    if (!nodeHeaps.empty()) {
      const int nd = ring[0] / rpn;  // a whole sequence's node: its tokens and least load changed
      nodeOrder.set(nd, nodeHeaps.top(nd).first, nodeTokens[nd]);
    }
  }
  out.forward = *std::max_element(freeAt.begin(), freeAt.end());
  out.order.assign(order.begin(), order.end());
  std::stable_sort(out.order.begin(), out.order.end(), [&](int64_t a, int64_t b) { return start[a] < start[b]; });
  out.backward = orderMakespan(out, back, n, /*reversed=*/true);
  return out;
}

namespace {

// The share of the target a ring may start later to land on nodes with fewer
// tokens (scheduleToTarget).
constexpr double kTokenSlack = 0.15;

// The ranks' state while scheduleToTarget places sequences: when each is
// free, the idle gaps rings leave, each node's tokens, and what finding a
// place asks often (each node's soonest free rank; per node, its ranks' free
// times sorted, and the nodes by when all their ranks are free), kept up to
// date node by node as ranks get work.
class Slots {
 public:
  Slots(const std::vector<int64_t>& lens, const ClusterModel& c, const PlanOptions& opt)
      : c_(c), rpn_(c.ranksPerNode), freeAt_(c.ranks(), 0.0), sorted_(c.ranks(), 0.0), nodeMin_(c.nodes, 0.0),
        nodeTokens_(c.nodes, 0.0), dirty_(c.nodes, 0), nodeOrder_(size_t(c.nodes)),
        tree_(c.nodes, c.ranksPerNode,
              std::accumulate(lens.begin(), lens.end(), 0.0) / c.nodes * (1 + 1e-9) + 1) {
    balanceNodes_ = opt.nodeTokenBalance && c.nodes > 1;
    nodeQuota_ = std::accumulate(lens.begin(), lens.end(), 0.0) / c.nodes * (1 + 1e-9) + 1;
    for (int nd = 0; nd < c.nodes; ++nd) byAllFree_.insert(byAllFree_.end(), {0.0, nd});
    front_.clear();
    frontNext_ = byAllFree_.begin();
  }

  // Where a whole sequence of len tokens and `seconds` can start soonest:
  // the smallest idle gap it fits (on a node with room for its tokens), else
  // the least loaded rank of the least loaded node with room (of any node if
// none has).
  struct Whole {
    int rank;
    double at;
    IdleGaps::Iter gap;
  };
  Whole whole(int64_t len, double seconds) {
    const IdleGaps::Iter gap = gaps_.find(seconds, [&](int r) { return hasRoom(r / rpn_, len); });
    if (gap != gaps_.end()) return {gap->second.rank, gap->second.begin, gap};
    int node = nodeOrder_.leastOfAll();
    if (balanceNodes_) {
      int any = -1;
      const int found = nodeOrder_.least(double(len), nodeQuota_, &any);
      if (found >= 0) node = found;
    }
    int r = node * rpn_;
    for (int q = r + 1; q < (node + 1) * rpn_; ++q)
      if (freeAt_[q] < freeAt_[r]) r = q;
    return {r, freeAt_[r], gaps_.end()};
  }

  // When G ranks of one node (intra-node) or G / ranksPerNode whole nodes
  // (inter-node) are free soonest, on nodes with room for the ring's tokens
  // where there are enough of them (as a whole sequence goes to a node with
  // room, so that the remap stays inside nodes).
  double ringStart(const Split& sp, int64_t len) {
    refresh();
    const double share = nodeShare(sp, len);
    if (sp.cls == SeqClass::InterNode) {
      // The k-th of the nodes by when all their ranks are free, among those
      // with room. A sequence probes k = 2, 3, ... in turn: the nodes that
      // may lack room for any of them (not for half its tokens) are listed
      // once, and each probe skips those that lack it for its own share.
      // Those nodes are listed as far as the probes read (each position
      // once per sequence, not every node for every sequence).
      if (!probing_ || probeLen_ != len) {
        probing_ = true;
        probeLen_ = len;
        blocked_.clear();
        scanned_ = 0;
      }
      const size_t nodes = size_t(c_.nodes);
      size_t at = size_t(sp.G / rpn_ - 1);
      for (size_t b = 0;; ++b) {
        // Every position up to `at` listed or not before the next is read.
        for (; scanned_ <= at && scanned_ < nodes; ++scanned_)
          if (!roomFor(front(scanned_).second, double(len) / 2)) blocked_.push_back(scanned_);
        if (b >= blocked_.size() || blocked_[b] > at) break;
        if (!roomFor(front(blocked_[b]).second, share)) ++at;
      }
      return at < nodes ? front(at).first : front(size_t(sp.G / rpn_ - 1)).first;
    }
    // The node whose G-th free time is soonest among those with room, else
    // among all.
    return tree_.soonest(sp.G - 1, balanceNodes_ ? share : -1e300);
  }

  void placeWhole(const Whole& w, double seconds, int64_t len) {
    const int nd = w.rank / rpn_;
    nodeTokens_[nd] += double(len);
    // The node's place among the nodes is set once, with its new tokens
    // (and, off a gap, its new least free time).
    if (w.gap != gaps_.end()) {
      gaps_.fill(w.gap, seconds);
      if (!dirty_[nd]) dirtyNodes_.push_back(nd), dirty_[nd] = 1;  // its tokens
      nodeOrder_.set(nd, nodeMin_[nd], nodeTokens_[nd]);
    } else {
      freeAt_[w.rank] = w.at + seconds;
      touched(nd);
    }
    probing_ = false;
  }

  // Places a ring that may start by `latest` (ringStart(sp) or later): of
  // the places free by then, those on the nodes holding the fewest tokens.
  // Appends its ranks to `ring`; returns its start.
  double placeRing(const Split& sp, double latest, double seconds, int64_t len, std::vector<int>* ring) {
    refresh();
    const size_t first = ring->size();
    double at = 0;
    const double share = nodeShare(sp, len);
    // Nodes with room first, by their tokens, then the others by node (a
    // key of tokens, plus 1e300 without room, which is 1e300 for any count:
    // ties go to the lower node). Room grows as tokens fall, so the node
    // with the fewest tokens has room if any has: that node, if it has,
    // else the lowest (NodeTree's searches, in place of a pass over every
    // node for every ring).
    if (sp.cls == SeqClass::InterNode) {
      // The G / ranksPerNode least of the nodes all free by then, one by
      // one, each taken out of the picks (the ring's nodes are set again by
      // the next refresh, as it gives them work).
      chosen_.clear();
      for (int j = 0; j < sp.G / rpn_; ++j) {
        int nd = tree_.fewestTokens(rpn_ - 1, latest);
        if (!roomFor(nd, share)) nd = tree_.lowest(rpn_ - 1, latest);
        chosen_.push_back(nd);
        at = std::max(at, sorted_[(nd + 1) * rpn_ - 1]);
        tree_.exclude(nd);
      }
      std::sort(chosen_.begin(), chosen_.end());
      for (int nd : chosen_)
        for (int r = nd * rpn_; r < (nd + 1) * rpn_; ++r) ring->push_back(r);
    } else {
      // The least of the nodes whose G-th rank is free by then.
      int best = tree_.fewestTokens(sp.G - 1, latest);
      if (!roomFor(best, share)) best = tree_.lowest(sp.G - 1, latest);
      at = sorted_[best * rpn_ + sp.G - 1];
      ring->resize(first + size_t(sp.G));
      latestFree(freeAt_, best, rpn_, at, sp.G, eligible_, ring->data() + first);
    }
    for (size_t j = first; j < ring->size(); ++j) {
      const int r = (*ring)[j];
      gaps_.wait(r, freeAt_[r], at);
      freeAt_[r] = at + seconds;
      nodeTokens_[r / rpn_] += double(len) / sp.G;
    }
    // Each of the ring's nodes once, once all its ranks have their work
    // (its ranks are consecutive in the ring): not once per rank.
    for (size_t j = first; j < ring->size(); ++j)
      if (j + 1 == ring->size() || (*ring)[j + 1] / rpn_ != (*ring)[j] / rpn_) touched((*ring)[j] / rpn_);
    return at;
  }

  // When k whole nodes are all free soonest, room or not: no ring over k
  // nodes starts sooner (ringStart takes the k-th of the nodes with room).
  double soonestNodes(int k) {
    refresh();
    return front(size_t(k - 1)).first;
  }

  double makespan() const { return *std::max_element(freeAt_.begin(), freeAt_.end()); }

 private:
  bool hasRoom(int nd, int64_t len) const { return roomFor(nd, double(len)); }
  bool roomFor(int nd, double tokens) const { return !balanceNodes_ || nodeTokens_[nd] + tokens <= nodeQuota_; }
  // Tokens a ring puts on each of its nodes.
  double nodeShare(const Split& sp, int64_t len) const {
    return sp.cls == SeqClass::InterNode ? double(len) * rpn_ / sp.G : double(len);
  }
  void touched(int nd) {
    probing_ = false;  // the nodes' order and tokens change
    nodeMin_[nd] = *std::min_element(freeAt_.begin() + nd * rpn_, freeAt_.begin() + (nd + 1) * rpn_);
    nodeOrder_.set(nd, nodeMin_[nd], nodeTokens_[nd]);
    if (!dirty_[nd]) dirtyNodes_.push_back(nd);
    dirty_[nd] = 1;
  }
  // Re-sorts the nodes whose ranks got work since the last call: their
  // ranks' free times, their places in the nodes by when all their ranks
  // are free and by each G-th.
  void refresh() {
    bool moved = false;
    for (int nd : dirtyNodes_) {
      double* const begin = sorted_.data() + nd * rpn_;
      const Entry was{begin[rpn_ - 1], nd};
      std::copy(freeAt_.begin() + nd * rpn_, freeAt_.begin() + (nd + 1) * rpn_, begin);
      std::sort(begin, begin + rpn_);
      if (begin[rpn_ - 1] != was.first) {
        byAllFree_.erase(was);
        byAllFree_.insert({begin[rpn_ - 1], nd});
        moved = true;
      }
      tree_.set(nd, begin, nodeTokens_[nd]);
      dirty_[nd] = 0;
    }
    dirtyNodes_.clear();
    if (moved) {
      front_.clear();
      frontNext_ = byAllFree_.begin();
    }
  }
  // The node at position pos of byAllFree_ (pos < nodes), read through
  // front_.
  const Entry& front(size_t pos) {
    while (front_.size() <= pos) front_.push_back(*frontNext_++);
    return front_[pos];
  }

  const ClusterModel& c_;
  const int rpn_;
  std::vector<double> freeAt_, sorted_, nodeMin_, nodeTokens_;
  std::vector<char> dirty_;
  std::vector<int> dirtyNodes_;
  // ringStart's inter-node probes of one sequence: the positions in
  // byAllFree_ of the nodes that may lack room for it, of the first
  // scanned_ positions.
  bool probing_ = false;
  int64_t probeLen_ = 0;
  std::vector<size_t> blocked_;
  size_t scanned_ = 0;
  // The nodes by when all their ranks are free (ties: the lower node): a
  // node's time only grows, so it leaves and comes back further on, in
  // O(log nodes) where a sorted list moved it past every node in between.
  // front_: its first entries as read since it last changed (the probes
  // and placeRing read only its front), frontNext_ the next to read.
  NodePool allFreePool_;  // before byAllFree_, which gives its nodes back to it
  EntrySet byAllFree_{EntrySet::allocator_type(&allFreePool_)};
  std::vector<Entry> front_;
  EntrySet::const_iterator frontNext_;
  std::vector<Entry> eligible_;
  RoomTree<double> nodeOrder_;  // the nodes by nodeMin_, with their tokens
  NodeTree tree_;                 // the nodes by each G-th free time, with their room
  std::vector<int> chosen_;
  IdleGaps gaps_;
  bool balanceNodes_ = false;
  double nodeQuota_ = 0;
};

}  // namespace

Schedule scheduleToTarget(const std::vector<int64_t>& lens, const ClusterModel& c, const PlanOptions& opt,
                          const std::vector<std::vector<SplitOption>>& options, double target,
                          const std::vector<size_t>& byWork, const OptionTail* tail) {
  const size_t m = lens.size();
  const int maxNodes = opt.maxRingNodes > 0 ? std::min(opt.maxRingNodes, c.nodes) : c.nodes;
  target *= 1 + 1e-9;
  Slots slots(lens, c, opt);
  std::vector<double> start(m, 0.0), back(m, 0.0);
  // The rings in placement order; sequence i's at placed[at[i]], size[i].
  std::vector<int> placed;
  std::vector<size_t> at(m, 0), size(m, 1);
  placed.reserve(m);
  SplitOption next{};  // the option probed
  // Each sequence's first option (whole), read in sequence order, as the
  // lists lie in memory: the loop below visits the sequences by work and
  // reads the rest of a list only for a sequence that a whole rank cannot
  // fit by the target (a read of every list in that order missed the cache
  // twice per sequence).
  std::vector<SplitOption> firsts(m);
  for (size_t i = 0; i < m; ++i) firsts[i] = options[i][0];
  for (size_t i : byWork) {
    const Slots::Whole whole = slots.whole(lens[i], firsts[i].seconds);
    // The cheapest option that ends by the target, else the one ending first.
    SplitOption o = firsts[i];
    double pickAt = whole.at, pickEnd = whole.at + o.seconds;
    for (size_t k = 1; pickEnd > target; ++k) {
      const std::vector<SplitOption>& opts = options[i];
      // Past the stored options, rings over one more node each.
      const int G = k < opts.size() ? opts[k].split.G
                                    : (k == opts.size() ? opts.back().split.G : next.split.G) + c.ranksPerNode;
      if (k >= opts.size() && (!tail || !tail->more[i])) break;
      if (G > c.ranksPerNode && G / c.ranksPerNode > maxNodes) break;
      if (G > c.ranksPerNode && tail) {
        // A ring over G / ranksPerNode nodes starts no sooner than that
        // many nodes are free, and runs at least the floor; both grow with
        // G, so once that cannot end first or by the target, no later
        // option can either.
        const double bound = slots.soonestNodes(G / c.ranksPerNode) + tail->floor(i, G);
        if (!(bound < pickEnd * (1 - 1e-9)) && !(bound <= target)) break;
      }
      if (k < opts.size()) next = opts[k];
      else if (!tail->option(i, G, &next)) break;
      const double t = slots.ringStart(next.split, lens[i]);
      if (t + next.seconds < pickEnd * (1 - 1e-9) || t + next.seconds <= target)
        o = next, pickAt = t, pickEnd = t + next.seconds;
    }
    const bool whole1 = o.split.G == 1;
    back[i] = o.backward;
    at[i] = placed.size();
    if (whole1) {
      slots.placeWhole(whole, o.seconds, lens[i]);
      placed.push_back(whole.rank);
      start[i] = whole.at;
    } else {
      // Where the ring may start a little later without passing the target,
      // it takes the nodes holding the fewest tokens, so that the nodes'
      // tokens stay even and the remap stays inside nodes.
      const double latest = pickAt + std::max(0.0, std::min(kTokenSlack * target, target - pickEnd));
      start[i] = slots.placeRing(o.split, latest, o.seconds, lens[i], &placed);
      size[i] = size_t(o.split.G);
    }
  }
  Schedule out;
  out.first.assign(1, 0);
  out.ranks.reserve(placed.size());
  for (size_t i = 0; i < m; ++i) {
    out.ranks.insert(out.ranks.end(), placed.begin() + at[i], placed.begin() + at[i] + size[i]);
    out.first.push_back(out.ranks.size());
  }
  out.forward = slots.makespan();
  out.order.assign(byWork.begin(), byWork.end());
  std::stable_sort(out.order.begin(), out.order.end(), [&](int64_t a, int64_t b) { return start[a] < start[b]; });
  out.backward = orderMakespan(out, back, c.ranks(), /*reversed=*/true);
  return out;
}

void retime(Schedule* s, const std::vector<double>& forward, const std::vector<double>& backward, int n) {
  s->forward = orderMakespan(*s, forward, n, /*reversed=*/false);
  s->backward = orderMakespan(*s, backward, n, /*reversed=*/true);
}

// Candidates for a plan that keeps the linear layers on its attention
// layout (no remap): rings sized to a target as scheduleToTarget does, with
// every option's time per rank including the linear layers of the tokens it
// leaves there (forward once, backward twice), so that each rank's attention
// and linear layers together fill the target. Targets from the mean of that
// sum; scored in full like the other fits (with and without the remap).
void jointFits(const std::vector<int64_t>& lens, const ClusterModel& c, const PlanOptions& opt,
               const std::vector<std::vector<SplitOption>>& options, const std::vector<size_t>& byWork,
               const OptionTail& tail, bool thorough, const std::function<double(const Schedule&)>& quick,
               std::vector<std::pair<double, Schedule>>* fits) {
  std::vector<std::vector<SplitOption>> joint(options);
  auto withLinear = [&](size_t i, SplitOption* o) {
    const double lin = opt.linearSecondsPerToken * double(lens[i]) / o->split.G;
    o->seconds += lin;
    o->backward += 2 * lin;
  };
  // The same tail, with the linear layers (the floor holds: they only add).
  OptionTail jointTail = tail;
  jointTail.option = [&](size_t i, int G, SplitOption* out) {
    if (!tail.option(i, G, out)) return false;
    withLinear(i, out);
    return true;
  };
  double total = 0;
  for (size_t i = 0; i < lens.size(); ++i) {
    for (SplitOption& o : joint[i]) withLinear(i, &o);
    total += joint[i][0].seconds;
  }
  const double mean = total / c.ranks();
  // Without a remap the nodes' tokens need not be even: node-level token
  // balance would only keep sequences off the ranks with time for them.
  PlanOptions o = opt;
  o.nodeTokenBalance = false;
  const double targets[] = {1.0, 1.025, 1.05, 1.075, 1.1, 1.15};
  std::vector<double> forward(lens.size()), backward(lens.size());
  // Past the best target, larger ones only leave more idle: the search
  // stops once two in a row are no better (when not thorough, one).
  double best = 0;
  for (size_t k = 0, worse = 0; k < std::size(targets) && worse < (thorough ? 2u : 1u); k += thorough ? 1 : 2) {
    Schedule s = scheduleToTarget(lens, c, o, joint, mean * targets[k], byWork, &jointTail);
    const double score = quick(s);
    worse = k == 0 || score < best ? 0 : worse + 1;
    best = k == 0 ? score : std::min(best, score);
    // The plan's makespans are attention's alone (plan.h): its rings' own
    // times, run in the order scheduled.
    for (size_t i = 0; i < lens.size(); ++i) {
      const int G = int(s.first[i + 1] - s.first[i]);
      auto stored = std::find_if(options[i].begin(), options[i].end(),
                                 [&](const SplitOption& so) { return so.split.G == G; });
      SplitOption so{};
      if (stored != options[i].end()) so = *stored;
      else tail.option(i, G, &so);  // a ring past the stored options, made by the tail
      forward[i] = so.seconds, backward[i] = so.backward;
    }
    retime(&s, forward, backward, c.ranks());
    fits->push_back({score, std::move(s)});
  }
}

int groupRing(int64_t len, bool causal, int g) {
  return int(std::min<int64_t>(g, std::max<int64_t>(1, causal ? len / 2 : len)));
}

void groupRanks(Schedule* s, const std::vector<int64_t>& lens, bool causal, int g, const std::vector<int>& groupOf) {
  Schedule& out = *s;
  const size_t m = lens.size();
  out.first.assign(m + 1, 0);
  for (size_t i = 0; i < m; ++i) out.first[i + 1] = out.first[i] + size_t(groupRing(lens[i], causal, g));
  out.ranks.resize(out.first[m]);
  for (size_t i = 0; i < m; ++i)
    std::iota(out.ranks.data() + out.first[i], out.ranks.data() + out.first[i + 1], groupOf[i] * g);
  // The sequences by group, in index order within one (a stable sort by
  // group, counted).
  int groups = 0;
  for (int k : groupOf) groups = std::max(groups, k + 1);
  std::vector<size_t> at(size_t(groups) + 1, 0);
  for (int k : groupOf) ++at[size_t(k) + 1];
  for (size_t k = 1; k < at.size(); ++k) at[k] += at[k - 1];
  out.order.resize(m);
  for (size_t i = 0; i < m; ++i) out.order[at[size_t(groupOf[i])]++] = int64_t(i);
}

// A baseline's placement as a candidate (DP x CP, as Transformer Engine's
// packed rings run it): n / g groups of g consecutive ranks, every sequence
// of a group on the group's ring (the driver runs them as one group).
// Sequences go largest first to the group with the least load: attention at
// the group's chunk length, plus the linear layers' time of their tokens when
// the caller gave its rate (WLB-LLM's assignment, as the simulator's dp_cp).
//
// byLength: the sequences longest first, ties in index order (planBatch sorts
// them once for every group size).
Schedule groupSchedule(const std::vector<int64_t>& lens, bool causal, const AttnShape& shape, const ClusterModel& c,
                       const PlanOptions& opt, int g, const std::vector<size_t>& byLength, std::vector<int>* groupOf) {
  const int groups = c.ranks() / g;
  std::vector<double> cost(lens.size());
  for (size_t i = 0; i < lens.size(); ++i)
    cost[i] = attnComputeSeconds(attnFlops(lens[i], causal, shape), double(lens[i]) / g, c) +
              opt.linearSecondsPerToken * double(lens[i]);
  // Largest cost first. The cost grows with the length for any efficiency
  // table that does not fall with the chunk length, so byLength is the guess.
  std::vector<size_t> order = byLength;
  stableSortFromGuess(order, [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  // (load, group): in index order to begin with (all zero, already a heap).
  LoadHeap heap;
  for (int k = 0; k < groups; ++k) heap.v.push_back({0.0, k});
  std::vector<int>& groupAt = *groupOf;
  groupAt.assign(lens.size(), 0);
  std::vector<double> attn(groups, 0.0), back(groups, 0.0), tokens(groups, 0.0);
  for (size_t i : order) {
    const auto [load, k] = heap.top();
    heap.replaceTop({load + cost[i], k});
    groupAt[i] = k;
    const int G = groupRing(lens[i], causal, g), first = k * g;
    const bool crosses = first / c.ranksPerNode != (first + G - 1) / c.ranksPerNode;
    const RingSeconds t =
        ringBothSeconds(lens[i], causal, G, linkOf(crosses ? SeqClass::InterNode : SeqClass::IntraNode, c), shape, c);
    attn[k] += t.forward;
    back[k] += t.backward;
    tokens[k] += double(lens[i]) / g;
  }
  Schedule out;
  out.forward = *std::max_element(attn.begin(), attn.end());
  out.backward = *std::max_element(back.begin(), back.end());
  const double meanTokens = std::accumulate(tokens.begin(), tokens.end(), 0.0) / groups;
  out.linearExcess = (opt.forwardPasses + 2) * opt.linearSecondsPerToken *
                     (*std::max_element(tokens.begin(), tokens.end()) - meanTokens);
  return out;
}

}  // namespace zp::plan
