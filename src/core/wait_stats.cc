// Per-peer wait statistics: see wait_stats.h.
#include "src/core/wait_stats.h"

#include <algorithm>

#include "src/core/log.h"

namespace zp {

WaitStats::WaitStats(int nranks, int self, uint64_t thresholdUs)
    : nranks_(nranks),
      self_(self),
      thresholdUs_(thresholdUs),
      window_(kWindow),
      peers_(nranks) {}

namespace {
// Every rank but this one, as recordOver walks a call's peers.
struct AllBut {
  int n, self;
  template <class F>
  void each(F f) const {
    for (int p = 0; p < n; p++)
      if (p != self) f(p);
  }
};
struct Listed {
  const std::vector<int>& peers;
  template <class F>
  void each(F f) const {
    for (int p : peers) f(p);  // checked by the caller (recordWaited lists receive peers)
  }
};
}  // namespace

int WaitStats::record(const std::vector<uint64_t>& arrivedUs, const std::vector<uint64_t>* outsideUs) {
  return recordOver(arrivedUs, AllBut{nranks_, self_}, outsideUs);
}

int WaitStats::record(const std::vector<uint64_t>& arrivedUs, const std::vector<int>& peers,
                      const std::vector<uint64_t>* outsideUs) {
  return recordOver(arrivedUs, Listed{peers}, outsideUs);
}

template <class Peers>
int WaitStats::recordOver(const std::vector<uint64_t>& arrivedUs, const Peers& peers,
                          const std::vector<uint64_t>* outsideUs) {
  if (nranks_ < 2 || (int)arrivedUs.size() != nranks_) return -1;
  // The last and second-last arrivals: a pass, not a sort (thousands of
  // ranks). A peer listed twice is one arrival.
  int last = -1, second = -1;
  uint64_t lastAt = 0, secondAt = 0;
  peers.each([&](int p) {
    if (p == self_ || p == last || p == second) return;
    uint64_t t = arrivedUs[p];
    if (last < 0 || t > lastAt) {
      second = last;
      secondAt = lastAt;
      last = p;
      lastAt = t;
    } else if (second < 0 || t > secondAt) {
      second = p;
      secondAt = t;
    }
  });
  // This rank's own entry (arrivedUs[self]) counts as an arrival too: a
  // peer is charged only for what it came after everyone else, this rank
  // included (with one peer, after this rank entered).
  if (second >= 0 && secondAt > arrivedUs[self_]) return charge(last, lastAt, second, secondAt, outsideUs);
  return charge(last, lastAt, self_, arrivedUs[self_], outsideUs);
}

int WaitStats::recordOne(int peer, uint64_t arrivedUs, uint64_t entryUs, const std::vector<uint64_t>* outsideUs) {
  if (nranks_ < 2) return -1;
  if (peer < 0 || peer >= nranks_ || peer == self_) return charge(-1, 0, self_, entryUs, outsideUs);  // heard from nobody
  return charge(peer, arrivedUs, self_, entryUs, outsideUs);
}

int WaitStats::charge(int last, uint64_t lastAt, int ref, uint64_t refAt, const std::vector<uint64_t>* outsideUs) {
  uint64_t charged = lastAt > refAt ? lastAt - refAt : 0;
  // Not more than it spent outside the library beyond what the one it is
  // compared with did: the rest it was busy in its previous call (wait_stats.h).
  if (outsideUs && last >= 0 && (int)outsideUs->size() == nranks_ && (*outsideUs)[last] != kUnknown) {
    const uint64_t mine = (*outsideUs)[last], theirs = (*outsideUs)[ref];
    const uint64_t beyond = theirs == kUnknown ? mine : mine > theirs ? mine - theirs : 0;
    charged = std::min(charged, beyond);
  }

  // Late by half the threshold or more: a call in which it came last by
  // microseconds is no evidence of lag, whatever one long wait adds to its
  // average.
  const int chargedTo = charged > 0 ? last : -1;
  const bool late = chargedTo >= 0 && thresholdUs_ > 0 && 2 * charged >= thresholdUs_;
  catchUp();
  push(chargedTo, charged, late);
  int named = -1;
  if (chargedTo >= 0 && thresholdUs_ > 0 && !peers_[last].named && filled_ >= kWindow / 5 &&
      2 * peers_[last].lateCalls > filled_ && peers_[last].totalUs > thresholdUs_ * (uint64_t)peers_[last].callsLast) {
    peers_[last].named = true;
    named = last;
  }
  if (chargedTo >= 0 && chargedTo != named) checkRecovered(chargedTo);
  return named;
}

void WaitStats::push(int last, uint64_t chargedUs, bool late) {
  Call& slot = window_[next_];
  const int left = filled_ == kWindow ? slot.last : -1;
  if (left >= 0) {  // the oldest call leaves the window
    peers_[left].callsLast--;
    peers_[left].totalUs -= slot.chargedUs;
    peers_[left].lateCalls -= slot.late;
  }
  slot.last = last;
  slot.chargedUs = chargedUs;
  slot.late = late;
  if (last >= 0) {
    peers_[last].callsLast++;
    peers_[last].totalUs += chargedUs;
    peers_[last].lateCalls += late;
  }
  advance();
  if (left >= 0 && left != last) checkRecovered(left);
}

void WaitStats::checkRecovered(int p) {
  // Recovered (named again if it lags again): it comes last in under a
  // quarter of the window, or by under half the threshold on average.
  if (peers_[p].named && (4 * peers_[p].callsLast < filled_ || 2 * peers_[p].totalUs < thresholdUs_ * (uint64_t)peers_[p].callsLast))
    peers_[p].named = false;
}

void WaitStats::catchUp() {
  // The batch first: noteClean entered it before counting the clean calls after it.
  recordPending();
  flushClean();
}

void WaitStats::flushClean() {
  // More than a window's worth leaves nothing but clean calls. A clean call
  // takes the place of a clean one with nothing to count (most of them,
  // between two ranks that keep pace): only a charged call's leaving goes
  // through push.
  for (uint64_t i = std::min<uint64_t>(pendingClean_, kWindow); i > 0; i--) {
    Call& slot = window_[next_];
    if (slot.last >= 0 && filled_ == kWindow) {
      push(-1, 0, false);
      continue;
    }
    slot = Call{};
    advance();
  }
  pendingClean_ = 0;
}

std::vector<WaitStats::Entry> WaitStats::report(int* calls) {
  catchUp();
  std::vector<Entry> out;
  for (int p = 0; p < nranks_; p++) {
    if (peers_[p].totalUs == 0) continue;
    uint64_t most = 0;
    for (int i = 0; i < filled_; i++)
      if (window_[i].last == p) most = std::max(most, window_[i].chargedUs);
    out.push_back({p, peers_[p].callsLast, peers_[p].totalUs, most});
  }
  std::sort(out.begin(), out.end(), [](const Entry& a, const Entry& b) {
    return a.totalUs != b.totalUs ? a.totalUs > b.totalUs : a.rank < b.rank;
  });
  *calls = filled_;
  return out;
}

namespace {
void warnIfNamed(WaitStats& stats, int rank, int lagging) {
  if (lagging < 0) return;
  int calls = 0;
  for (const WaitStats::Entry& e : stats.report(&calls))
    if (e.rank == lagging)
      ZP_WARN(kSubColl,
              "rank %d: rank %d came last in %d of the last %d calls, %.1f ms after the others on average: it lags "
              "(zpCommGetWaitReport; ZP_STRAGGLER_MS)",
              rank, lagging, e.callsLast, calls, e.totalUs / 1000.0 / e.callsLast);
}

}  // namespace

void WaitStats::recordPendingNow() {
  const int n = pendingCount_;
  pendingCount_ = 0;  // emptied first: each recordOne catches the window up
  for (int i = 0; i < n; i++)
    warnIfNamed(*this, self_, recordOne(pending_[i].peer, pending_[i].arrivedUs, pending_[i].entryUs));
}

void recordWaits(WaitStats& stats, int rank, const std::vector<uint64_t>& arrivedUs,
                 const std::vector<uint64_t>* outsideUs) {
  warnIfNamed(stats, rank, stats.record(arrivedUs, outsideUs));
}

void recordWait(WaitStats& stats, int rank, int peer, uint64_t arrivedUs, uint64_t entryUs,
                const std::vector<uint64_t>* outsideUs) {
  warnIfNamed(stats, rank, stats.recordOne(peer, arrivedUs, entryUs, outsideUs));
}

void recordWaits(WaitStats& stats, int rank, const std::vector<uint64_t>& arrivedUs, const std::vector<int>& peers,
                 const std::vector<uint64_t>* outsideUs) {
  warnIfNamed(stats, rank, stats.record(arrivedUs, peers, outsideUs));
}

}  // namespace zp
