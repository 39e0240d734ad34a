// GrowingMin, RoomTree and NodeTree: the least of a set of keys among those
// that pass a test, without a scan of them all (the planner's schedules and
// the simulator's baselines ask for it for every sequence they place).
#pragma once

#include <algorithm>
#include <climits>
#include <functional>
#include <limits>
#include <queue>
#include <utility>
#include <vector>

namespace zp::plan {

// The least of a set of keys that only grow (ties: the lower id) among
// those that pass a test, in O(log) per change instead of a scan of them
// all: a key's older entries are dropped as they surface; entries that fail
// the test are put back for the next query.
class GrowingMin {
 public:
  explicit GrowingMin(size_t ids) : key_(ids, 0.0) {
    for (size_t i = 0; i < ids; ++i) heap_.push_back({0.0, int(i)});  // all zero, in id order: a heap
  }
  double key(int id) const { return key_[id]; }
  void raise(int id, double key) {
    key_[id] = key;
    heap_.push_back({key, id});
    std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
    // Stale entries leave only as they surface: past twice the ids, they
    // go all at once (a key raised on every placement would otherwise grow
    // the heap with every sequence). Answers do not depend on the heap's
    // layout, only on its current entries.
    if (heap_.size() > 2 * key_.size() + 16) {
      heap_.erase(std::remove_if(heap_.begin(), heap_.end(),
                                 [&](const std::pair<double, int>& e) { return e.first != key_[e.second]; }),
                  heap_.end());
      std::make_heap(heap_.begin(), heap_.end(), std::greater<>());
    }
  }
  // The least id passing ok, or -1; *any: the least of all (-1 if none).
  template <class Ok>
  int least(Ok ok, int* any) {
    *any = -1;
    int found = -1;
    // Stale entries on top go; a current top that passes is the answer and
    // stays.
    while (!heap_.empty() && heap_.front().first != key_[heap_.front().second]) {
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
      heap_.pop_back();
    }
    if (!heap_.empty() && ok(heap_.front().second)) return *any = heap_.front().second;
    held_.clear();
    while (!heap_.empty()) {
      const auto top = heap_.front();
      std::pop_heap(heap_.begin(), heap_.end(), std::greater<>());
      heap_.pop_back();
      if (top.first != key_[top.second]) continue;  // stale
      held_.push_back(top);
      if (*any < 0) *any = top.second;
      if (ok(top.second)) {
        found = top.second;
        break;
      }
    }
    for (const auto& e : held_) {
      heap_.push_back(e);
      std::push_heap(heap_.begin(), heap_.end(), std::greater<>());
    }
    return found;
  }

 private:
  std::vector<double> key_;
  std::vector<std::pair<double, int>> heap_, held_;
};

// The least (key, id) among the ids whose used amount leaves room for a
// need (used + need <= limit, the callers' own test of room), and the least
// of all: a tournament tree searched best first (a subtree whose least key
// is no better than the best found, or whose least used amount has no room,
// is not entered; used + need grows with used, so no id in it has room).
// Unlike GrowingMin, whose entries that fail the test are popped and put
// back on every query, the ids without room cost nothing once their whole
// subtree has none. Keys and used amounts may change either way.
//
// The ids of a subtree the search finds without room (its least used
// amount has none) while its least key is below the best so far are
// parked, every one of them: left out of the tree's keys (so a subtree's
// least key is that of ids that may have room) until a query's need leaves
// the id room, or its key or used amount changes. The planner's schedules
// ask for the least loaded node with room for sequences in falling
// lengths, and the nodes full of short ones are the least loaded for ever
// after: without parking, each query passed over all of them (parking only
// the single ids reached, each query still entered every subtree of full
// nodes below the answer: 64-1,000 visits a query at 2,048 nodes, against
// about 20 with whole subtrees parked). Answers are those of a scan: a
// parked id has no room for any query it is parked through.
template <class Used>
class RoomTree {
 public:
  using Key = std::pair<double, int>;
  explicit RoomTree(size_t ids) : ids_(ids), parked_(ids, 0) {
    while (size_ < ids) size_ *= 2;
    t_.assign(2 * size_, Node{kNone, kNone, std::numeric_limits<Used>::max()});
    for (size_t i = 0; i < ids; ++i) t_[size_ + i] = Node{{0.0, int(i)}, {0.0, int(i)}, 0};
    for (size_t v = size_ - 1; v >= 1; --v) pull(v);
  }
  double key(int id) const { return t_[size_ + size_t(id)].all.first; }
  int leastOfAll() const { return ids_ > 0 ? t_[1].all.second : -1; }
  // Tree nodes the searches have entered so far (what parking saves).
  size_t visits() const { return visits_; }
  void set(int id, double key, Used used) {
    size_t v = size_ + size_t(id);
    t_[v].all.first = key;
    t_[v].used = used;
    t_[v].key = t_[v].all;  // a parked id comes back: its room may have changed
    parked_[size_t(id)] = 0;
    // Above a subtree whose summary did not change, none does: most sets
    // raise an id that is not its subtree's least, and stop low.
    for (v /= 2; v >= 1 && pull(v); v /= 2) {
    }
  }
  // The least id with room for `need` under `limit`, or -1; *any: the least
  // of all.
  int least(Used need, Used limit, int* any) {
    *any = leastOfAll();
    // The parked ids this need leaves room are back first (stale entries of
    // ids already back are dropped).
    while (!byUsed_.empty() && byUsed_.top().first + need <= limit) {
      const int id = byUsed_.top().second;
      byUsed_.pop();
      if (parked_[size_t(id)]) unpark(id);
    }
    // Most often the least of the ids not parked has room (those parked
    // have none): no search.
    const int top = t_[1].key.second;
    if (top != INT_MAX && t_[size_ + size_t(top)].used + need <= limit) return top;
    Key best = kNone;
    int found = -1;
    find(1, need, limit, &best, &found);
    for (int id : lacking_) park(id);
    lacking_.clear();
    return found;
  }

 private:
  static constexpr Key kNone{std::numeric_limits<double>::infinity(), INT_MAX};
  // b < a as std::pair compares them, as a number (0 or 1) that picks a
  // child by its index rather than by a branch: which child is the lesser
  // is a coin toss as loads grow, and every placement pulls a key up the
  // tree through a dozen such choices (std::min(a, b) is b only if b < a).
  static int below(const Key& b, const Key& a) {
    return int(b.first < a.first) | (int(!(a.first < b.first)) & int(b.second < a.second));
  }
  // Node v's summary from its children's; whether it changed.
  bool pull(size_t v) {
    const Node &l = t_[2 * v], &r = t_[2 * v + 1];
    const Node s{t_[2 * v + size_t(below(r.key, l.key))].key, t_[2 * v + size_t(below(r.all, l.all))].all,
                 std::min(l.used, r.used)};
    Node& p = t_[v];
    if (s.key == p.key && s.all == p.all && s.used == p.used) return false;
    p = s;
    return true;
  }
  void find(size_t v, Used need, Used limit, Key* best, int* found) {
    ++visits_;
    if (t_[v].key.second == INT_MAX || !(t_[v].key < *best)) return;
    if (!(t_[v].used + need <= limit)) {
      lackingIn(v);  // no room in the subtree, below the best so far: parked
      return;
    }
    if (v >= size_) {
      *best = t_[v].key;
      *found = t_[v].key.second;
      return;
    }
    const size_t a = 2 * v, b = 2 * v + 1;
    const bool aFirst = t_[a].key < t_[b].key;
    find(aFirst ? a : b, need, limit, best, found);
    find(aFirst ? b : a, need, limit, best, found);
  }
  // Every id of subtree v still in the tree's keys (none has room for the
  // need), into lacking_.
  void lackingIn(size_t v) {
    if (t_[v].key.second == INT_MAX) return;
    if (v >= size_) {
      lacking_.push_back(int(v - size_));
      return;
    }
    lackingIn(2 * v);
    lackingIn(2 * v + 1);
  }
  void park(int id) {
    const size_t v = size_ + size_t(id);
    parked_[size_t(id)] = 1;
    byUsed_.push({t_[v].used, id});
    setKey(v, kNone);
  }
  void unpark(int id) {
    const size_t v = size_ + size_t(id);
    parked_[size_t(id)] = 0;
    setKey(v, t_[v].all);
  }
  // Leaf v's key in the searched keys, and its subtrees' least keys above it.
  void setKey(size_t v, Key key) {
    t_[v].key = key;
    for (v /= 2; v >= 1; v /= 2) t_[v].key = std::min(t_[2 * v].key, t_[2 * v + 1].key);
  }

  size_t ids_, size_ = 1, visits_ = 0;
  // Each tree node's summary in one place: a change walks up the tree
  // reading a node and its children, once for every sequence a schedule
  // places (in three arrays, three places).
  struct Node {
    Key key;    // (least key, its id) of the subtree, parked ids left out
    Key all;    // the same with every id
    Used used;  // least used amount of the subtree
  };
  std::vector<Node> t_;
  std::vector<char> parked_;
  // Parked ids by their used amount, least first (an id back in the tree
  // may leave a stale entry).
  std::priority_queue<std::pair<Used, int>, std::vector<std::pair<Used, int>>, std::greater<>> byUsed_;
  std::vector<int> lacking_;  // found by the last search
};

// The nodes by the G-th free time of their ranks (each G) and by the tokens
// they still have room for, in a tree: the soonest G-th among the nodes with
// room for a share, searched best first (a subtree whose soonest is no better
// than the best found, or without a node with room, is not entered), in
// place of a pass over every node for every ring size a sequence probes.
class NodeTree {
 public:
  NodeTree(int nodes, int rpn, double quota)
      : rpn_(rpn),
        quota_(quota),
        parked_(size_t(nodes), 0),
        never_(size_t(rpn), std::numeric_limits<double>::infinity()) {
    while (size_ < nodes) size_ *= 2;
    tokens_.assign(2 * size_, 1e300);
    key_.assign(size_t(rpn) * 2 * size_, 1e300);
    all_ = key_;
    const std::vector<double> zero(size_t(rpn), 0.0);
    for (int nd = 0; nd < nodes; ++nd) set(nd, zero.data(), 0.0);
  }
  // Node nd's ranks' free times, sorted, and its tokens.
  void set(int nd, const double* sorted, double tokens) {
    size_t v = size_t(size_ + nd);
    tokens_[v] = tokens;
    parked_[size_t(nd)] = 0;  // a parked node comes back: its room changed
    for (int g = 0; g < rpn_; ++g) key(g, v) = all(g, v) = sorted[g];
    // Above a subtree whose summary did not change, none does. A tree
    // node's times of every ring size lie together, so each level is one
    // pass over a few contiguous values (no branch per ring size).
    for (bool changed = true; changed && (v /= 2) >= 1;) {
      const double t = std::min(tokens_[2 * v], tokens_[2 * v + 1]);
      changed = t != tokens_[v];
      tokens_[v] = t;
      changed |= pullTimes(&key(0, v), &key(0, 2 * v), &key(0, 2 * v + 1));
      changed |= pullTimes(&all(0, v), &all(0, 2 * v), &all(0, 2 * v + 1));
    }
  }
  // The soonest g-th (0-based) free time of a node with room for `share`
  // (its tokens plus the share within the quota), else of any node.
  //
  // The nodes of a subtree the search finds without room while its time
  // is below the best so far are parked (as RoomTree parks ids): left out
  // of the times searched until a share leaves them room or they change.
  // The nodes full of short sequences are free soonest for ever after;
  // without parking every probe of every ring size passed over them.
  double soonest(int g, double share) {
    while (!byTokens_.empty() && byTokens_.top().first + share <= quota_) {
      const int nd = byTokens_.top().second;
      byTokens_.pop();
      if (parked_[size_t(nd)]) unpark(nd);
    }
    double best = 1e300;
    find(g, share, 1, &best);
    for (int nd : lacking_) park(nd);
    lacking_.clear();
    return best < 1e300 ? best : all(g, 1);
  }

  // Of the nodes whose g-th (0-based) free time is at most `latest`, the
  // one holding the fewest tokens (ties: the lower node), or -1 if there is
  // none: a search that enters only subtrees with such a node and with
  // fewer tokens somewhere than the best found (placeRing's pick, in place
  // of a pass over every node for every ring).
  int fewestTokens(int g, double latest) {
    double best = 0;
    int found = -1;
    fewest(g, latest, 1, &best, &found);
    return found;
  }
  // The lowest node whose g-th free time is at most `latest`, or -1.
  int lowest(int g, double latest) { return lowestIn(g, latest, 1); }
  // Node nd never free, until it is set again (a node taken by a ring is
  // out of the picks for the ring's other nodes).
  void exclude(int nd) { set(nd, never_.data(), tokens_[size_t(size_ + nd)]); }

 private:
  // Tree node v's time for ring size g + 1: a node's times side by side.
  double& key(int g, size_t v) { return key_[v * size_t(rpn_) + size_t(g)]; }
  double& all(int g, size_t v) { return all_[v * size_t(rpn_) + size_t(g)]; }
  // A tree node's times (every ring size) from its children's: whether any
  // changed.
  bool pullTimes(double* parent, const double* left, const double* right) const {
    bool changed = false;
    for (int g = 0; g < rpn_; ++g) {
      const double t = std::min(left[g], right[g]);
      changed |= t != parent[g];
      parent[g] = t;
    }
    return changed;
  }
  int lowestIn(int g, double latest, size_t v) {
    if (!(all(g, v) <= latest)) return -1;
    if (v >= size_t(size_)) return int(v - size_t(size_));
    const int a = lowestIn(g, latest, 2 * v);
    return a >= 0 ? a : lowestIn(g, latest, 2 * v + 1);
  }
  void fewest(int g, double latest, size_t v, double* best, int* found) {
    if (!(all(g, v) <= latest)) return;
    if (*found >= 0) {
      if (tokens_[v] > *best) return;
      // Ties go to the lower node: a subtree of higher nodes cannot win one.
      size_t low = v;
      while (low < size_t(size_)) low *= 2;
      if (tokens_[v] == *best && int(low - size_t(size_)) > *found) return;
    }
    if (v >= size_t(size_)) {
      *best = tokens_[v];
      *found = int(v - size_t(size_));
      return;
    }
    const size_t a = 2 * v, b = 2 * v + 1;
    const bool aFirst = tokens_[a] <= tokens_[b];
    fewest(g, latest, aFirst ? a : b, best, found);
    fewest(g, latest, aFirst ? b : a, best, found);
  }
  void find(int g, double share, size_t v, double* best) {
    if (key(g, v) >= *best) return;
    if (!(tokens_[v] + share <= quota_)) {
      lackingIn(g, v);
      return;
    }
    if (v >= size_t(size_)) {
      *best = key(g, v);
      return;
    }
    const size_t a = 2 * v, b = 2 * v + 1;
    const bool aFirst = key(g, a) <= key(g, b);
    find(g, share, aFirst ? a : b, best);
    find(g, share, aFirst ? b : a, best);
  }
  // Every node of subtree v still searched (none has room for the share),
  // into lacking_.
  void lackingIn(int g, size_t v) {
    if (key(g, v) >= 1e300) return;
    if (v >= size_t(size_)) {
      lacking_.push_back(int(v - size_t(size_)));
      return;
    }
    lackingIn(g, 2 * v);
    lackingIn(g, 2 * v + 1);
  }
  // Out of (or back into) the times searched, every ring size's.
  void park(int nd) {
    parked_[size_t(nd)] = 1;
    byTokens_.push({tokens_[size_t(size_ + nd)], nd});
    refreshKeys(nd, true);
  }
  void unpark(int nd) {
    parked_[size_t(nd)] = 0;
    refreshKeys(nd, false);
  }
  void refreshKeys(int nd, bool out) {
    size_t v = size_t(size_ + nd);
    for (int g = 0; g < rpn_; ++g) key(g, v) = out ? 1e300 : all(g, v);
    for (v /= 2; v >= 1; v /= 2) pullTimes(&key(0, v), &key(0, 2 * v), &key(0, 2 * v + 1));
  }

  int rpn_, size_ = 1;
  double quota_;
  std::vector<double> tokens_;
  std::vector<double> key_;  // per tree node and ring size, the subtree's soonest, parked nodes left out
  std::vector<double> all_;  // the same with every node
  std::vector<char> parked_;
  // Parked nodes by their tokens, fewest first (a node back in the tree may
  // leave a stale entry).
  std::priority_queue<std::pair<double, int>, std::vector<std::pair<double, int>>, std::greater<>> byTokens_;
  std::vector<int> lacking_;  // found by the last search
  const std::vector<double> never_;  // free times of a node excluded (exclude)
};

}  // namespace zp::plan
