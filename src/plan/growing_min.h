// GrowingMin: the least of a set of keys that only grow, among those that
// pass a test, without a scan of them all (the planner's schedules and the
// simulator's baselines ask it for every sequence they place).
#pragma once

#include <algorithm>
#include <functional>
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

}  // namespace zp::plan
