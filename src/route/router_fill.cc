// The router's water-filling (Fill, declared in router_internal.h): unit
// items over rails, for both balancers and pickPath.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <utility>

#include "src/route/router_internal.h"

namespace zp {
namespace detail {

void Fill::run(i64 n, std::vector<i64>* cnt) const {
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
i64 Fill::place(i64 n, std::vector<i64>* cnt, bool capped) const {
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

}  // namespace detail
}  // namespace zp
