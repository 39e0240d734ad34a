#include "src/route/rail_rates.h"

#include <algorithm>
#include <cmath>

#include "src/core/log.h"

namespace zp {

void RailRates::observe(int rail, uint64_t outstanding, uint64_t ackedTotal, uint64_t nowUs) {
  if (!on() || rail < 0 || rail >= kRails) return;
  Rail& r = rails_[rail];
  // A count that went down (a rank's segment is gone) starts afresh.
  if (!r.seen || ackedTotal < r.lastAcked || nowUs < r.lastUs) {
    r.seen = true;
    r.lastAcked = ackedTotal;
    r.lastUs = nowUs;
    r.wasBusy = outstanding > 0;
    return;
  }
  // Bytes acknowledged in an interval that began idle belong to a busy
  // spell this rank did not see start (its reads came late): not counted,
  // or they would show a rate the rail never had.
  if (r.wasBusy) {
    r.busyUs += nowUs - r.lastUs;
    r.ackedBytes += ackedTotal - r.lastAcked;
  }
  r.lastAcked = ackedTotal;
  r.lastUs = nowUs;
  r.wasBusy = outstanding > 0;
  if (ready(r)) sample(rail, nowUs);
}

// A slow rail carries a small share, so it is also sampled when it goes
// idle after kIdleSampleUs of busy time (a call's whole share in one
// sample, from queueing to the last acknowledgement): otherwise its
// recovery would take many calls to show. Shorter windows would be fooled
// by acknowledgements that come in batches, and a few chunks' worth by the
// latency of their hops (which would make a slow rail look slower still,
// and its share shrink further).
bool RailRates::ready(const Rail& r) const {
  if (r.busyUs >= kStuckUs) return true;
  if (r.ackedBytes < kSampleBytes) return false;
  return r.busyUs >= kSampleBusyUs || (!r.wasBusy && r.busyUs >= kIdleSampleUs);
}

void RailRates::sample(int rail, uint64_t nowUs) {
  Rail& r = rails_[rail];
  double rate = (double)r.ackedBytes * 1e6 / (double)r.busyUs;
  const double busyMs = r.busyUs / 1000.0;
  // Half weight to the new sample: a rate that changes is followed within
  // a few samples, one odd sample moves the estimate only halfway.
  r.bytesPerSec = r.bytesPerSec > 0 ? 0.5 * r.bytesPerSec + 0.5 * rate : rate;
  r.ackedBytes = 0;
  r.busyUs = 0;
  r.sampledUs = nowUs;
  // Judged against the median of the other rails: one fast outlier does not
  // make the rest look slow.
  std::vector<double> others;
  double top = r.bytesPerSec;
  for (int k = 0; k < kRails; k++) {
    const Rail& o = rails_[k];
    if (k == rail || o.bytesPerSec <= 0 || nowUs >= o.sampledUs + kOwnFreshUs) continue;  // recent rates only
    others.push_back(o.bytesPerSec);
    top = std::max(top, o.bytesPerSec);
  }
  if (others.empty()) return;  // nothing to compare with
  std::sort(others.begin(), others.end());
  size_t m = others.size();
  double median = m % 2 ? others[m / 2] : (others[m / 2 - 1] + others[m / 2]) / 2;
  // Named on the smoothed rate (one odd sample does not name a rail), named
  // back on the samples themselves: a rail routed around carries little and
  // samples slowly, and the smoothing's halfway steps from its slow rate
  // would cost a recovered NIC a sample or two more (kConfirmRecovery asks
  // for fast samples in a row already).
  double rel = (r.ownSlow ? rate : r.bytesPerSec) / median;
  // A slow rail's peers can look slower for a while (their samples fall in
  // a skewed or CPU-bound call, or when one is stuck behind a busy proxy):
  // compared with them alone, a NIC still at its slow rate would be named
  // back and given its full share again. It must also move clearly more
  // than when it was named.
  const bool faster = !r.ownSlow || rate >= kRecoverGain * r.namedBps;
  if (rel < slowFraction_) {
    r.below++;
    r.above = 0;
  } else if (rel >= std::min(1.0, kRecoverFactor * slowFraction_) && faster) {
    r.above++;
    r.below = 0;
  } else {
    r.below = r.above = 0;
  }
  ZP_TRACE(kSubNet, "rail %d: sampled %.0f Mbit/s (smoothed %.0f) over %.0f ms busy, %.2f of the others' median: %d "
           "below, %d above", rail, rate * 8e-6, r.bytesPerSec * 8e-6, busyMs, rel, r.below, r.above);
  bool was = r.ownSlow;
  if (!r.ownSlow && r.below >= kConfirm) {
    r.ownSlow = true;
    r.namedBps = r.bytesPerSec;
    r.namedTopBps = top;
  }
  if (r.ownSlow && r.above >= kConfirmRecovery) r.ownSlow = false;
  news_ |= r.ownSlow != was;
  // While slow, its share is over the fastest rate now or when it was
  // named: peers whose samples fell would otherwise raise it (a share of
  // 0.45 for a NIC at 100 Mbit/s was seen, judged against one peer whose
  // samples had fallen to 217 Mbit/s), and the router would give it that.
  const double ref = r.ownSlow ? std::max(top, r.namedTopBps) : top;
  settle(rail, -1, r.ownSlow, r.bytesPerSec / ref, ref, nowUs);
}

bool RailRates::ownFresh(uint64_t nowUs) const {
  int fresh = 0;
  for (const Rail& r : rails_) fresh += r.bytesPerSec > 0 && nowUs < r.sampledUs + kOwnFreshUs;
  return fresh >= 2;
}

void RailRates::settle(int rail, int farNode, bool slow, double share, double topBps, uint64_t nowUs) {
  Rail& r = rails_[rail];
  if (r.slow) r.share = share;  // the router follows the rate while the rail is slow
  if (slow == r.slow || (r.changes > 0 && nowUs < r.changedUs + kDwellUs)) return;
  r.slow = slow;
  r.share = slow ? share : 1;
  r.changedUs = nowUs;
  r.changes++;
  changes_.push_back({rail, farNode, slow, 8 * share * topBps, 8 * topBps});
}

RailView RailRates::ownView() const {
  RailView v;
  double top = 0;
  int measured = 0;
  for (const Rail& r : rails_) {
    measured += r.bytesPerSec > 0;
    top = std::max(top, r.bytesPerSec);
  }
  if (!on() || measured < 2) return v;  // one rail alone says nothing about the others
  for (int k = 0; k < kRails; k++) {
    const Rail& r = rails_[k];
    if (r.bytesPerSec > 0) v.scale[k] = (uint8_t)std::max(1.0, std::round(255 * r.bytesPerSec / top));
    if (r.ownSlow) v.slowMask |= (uint8_t)(1u << k);
  }
  v.topKbps = (uint32_t)std::min(4.0e9, std::max(1.0, top * 8 / 1000));
  return v;
}

void RailRates::heard(int farNode, const RailView& view, uint64_t nowUs) {
  if (!on() || view.empty()) return;
  bool own = ownFresh(nowUs);
  for (int k = 0; k < kRails; k++) {
    if (!view.scale[k]) continue;
    Rail& r = rails_[k];
    r.heardShare = view.scale[k] / 255.0;
    r.heardTopBps = view.topKbps * 1000.0 / 8;
    r.heardSlow = (view.slowMask >> k) & 1;
    if (!own) settle(k, farNode, r.heardSlow, r.heardShare, r.heardTopBps, nowUs);
  }
}

double RailRates::factor(int rail) const {
  if (!on() || rail < 0 || rail >= kRails || !rails_[rail].slow) return 1;
  return std::max(1.0, std::round(255 * rails_[rail].share)) / 255;
}

bool RailRates::anySlow() const {
  for (int k = 0; k < kRails; k++)
    if (factor(k) < 1) return true;
  return false;
}

uint64_t RailRates::report() const {
  // In steps of 4/255: a plan is made again only when a factor moves by
  // more than its noise.
  uint64_t out = 0;
  for (int k = 0; k < kRails; k++) {
    uint64_t q = (uint64_t)std::lround(255 * factor(k));
    q = q >= 255 ? 255 : std::max<uint64_t>(4, q & ~(uint64_t)3);
    out |= q << (8 * k);
  }
  return out;
}

double RailRates::reportFactor(uint64_t report, int rail) {
  if (rail < 0 || rail >= kRails) return 1;
  uint64_t q = (report >> (8 * rail)) & 0xff;
  return q == 0 ? 1 : q / 255.0;
}

std::vector<RailRates::Change> RailRates::takeChanges() {
  std::vector<Change> out;
  out.swap(changes_);
  return out;
}

bool RailRates::takeNews() {
  bool n = news_;
  news_ = false;
  return n;
}

RailRates::RailState RailRates::railState(int rail) const {
  RailState s;
  if (rail < 0 || rail >= kRails) return s;
  const Rail& r = rails_[rail];
  if (r.bytesPerSec > 0) s.bitsPerSec = 8 * r.bytesPerSec;
  else s.bitsPerSec = 8 * r.heardShare * r.heardTopBps;
  s.slow = r.slow;
  s.changes = r.changes;
  return s;
}

}  // namespace zp
