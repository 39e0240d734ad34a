// Measured rails: the rate each rail of this node achieves to the other
// nodes, so that the router spreads bytes by what the NICs move rather than
// by their nominal rates, and a slow NIC is named.
//
// Evidence. A routed chunk a rank sends is on its rail (the NIC of its
// source-side proxy) from the moment it is queued until its destination
// acknowledges it. The node's ranks count, per rail, the bytes on it and the
// bytes acknowledged so far in shared memory (as they count the NIC queues,
// nic_queues.h); every rank reads the sums every kTickUs (observe). A rail
// is busy while the node has bytes on it; its rate is the bytes
// acknowledged over the busy time, sampled (below) and smoothed, so every
// rank of a node measures the same rates. Transfers of less than a chunk
// are not counted: they take a latency, whatever the rate. This measures
// whole paths, both ends' NICs and the proxies' hops: with two nodes a slow
// path cannot be pinned on one end (both see the same rate); with more, a
// rail is judged over all its paths together.
//
// Verdict. A rail is slow after kConfirm samples in a row below
// slowFraction (ZP_RAIL_SLOW) of the median of the node's other rails
// (those sampled within kOwnFreshUs), judged on its smoothed rate, and
// healthy again after kConfirmRecovery samples in a row above
// kRecoverFactor x slowFraction of it and above kRecoverGain x its own rate
// when it was named, judged on the samples themselves; it changes state at
// most once per kDwellUs, so a flapping NIC is logged a bounded number of
// times.
//
// Sharing with other nodes. A source stamps its node's view (rates relative
// to the fastest rail, the fastest's rate, the verdicts) into every relay
// header it sends, and when a verdict changes every rank sends the view to
// its counterpart on every other node (takeNews). A node that has measured
// its rails lately (kOwnFreshUs) goes by its own verdicts, else by the last
// view it heard.
//
// Use. While a rail is slow the router scales its nominal rate by its
// measured share (quantised to 1/255): its rate over the fastest rail's,
// now or when it was named, whichever is faster (peers whose samples fall
// do not raise it); a healthy rail keeps its nominal rate, so healthy NICs
// plan exactly as without estimates.
//
// Everything runs under the communicator's lock (from the relay).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "src/core/routing.h"

namespace zp {

class RailRates {
 public:
  static constexpr int kRails = RailView::kRails;  // rails measured (the rest stay nominal)
  static constexpr uint64_t kTickUs = 10000;        // how often the node's counters are read
  // A sample takes kSampleBytes acknowledged and kSampleBusyUs of busy time
  // or the rail going idle, or kStuckUs of busy time whatever was
  // acknowledged (a rail that moves nothing is the slowest of all).
  static constexpr uint64_t kSampleBusyUs = 200000;
  static constexpr uint64_t kSampleBytes = 2u << 20;
  static constexpr uint64_t kStuckUs = 2000000;
  static constexpr uint64_t kIdleSampleUs = 50000;
  // Samples in a row that make a rail slow, and healthy again (a rail
  // routed around carries little, so its samples come slowly).
  static constexpr int kConfirm = 4;
  static constexpr int kConfirmRecovery = 2;
  static constexpr uint64_t kDwellUs = 1000000;     // least time between two state changes of a rail
  static constexpr double kRecoverFactor = 1.4;     // healthy again above this x slowFraction
  // ... and above this x its own rate when it was named: a rail still at
  // its slow rate is not named back because its peers' samples fell (a
  // skewed or CPU-bound call, a peer rail stuck behind a busy proxy).
  static constexpr double kRecoverGain = 2.0;
  static constexpr uint64_t kOwnFreshUs = 2000000;  // own samples this recent outrank what is heard

  // slowFraction in [0, 1): 0 turns the estimates off (every rail nominal,
  // nothing named).
  explicit RailRates(double slowFraction) : slowFraction_(slowFraction) {}

  bool on() const { return slowFraction_ > 0; }

  // The node's counters of rail at nowUs: bytes on it now, bytes
  // acknowledged so far.
  void observe(int rail, uint64_t outstanding, uint64_t ackedTotal, uint64_t nowUs);

  // This node's view of its rails (for relay headers and news; empty
  // without a measurement of two rails or more).
  RailView ownView() const;
  // A view from a rank of farNode (of the rails between the two nodes).
  void heard(int farNode, const RailView& view, uint64_t nowUs);

  // The factor on rail's nominal rate: 1 unless it is slow.
  double factor(int rail) const;
  bool anySlow() const;
  // This rank's verdicts for the count rows of a routed call: byte k is
  // 255 x rail k's factor (4..255, in steps of 4 below 255).
  uint64_t report() const;
  // The factor of rail k in a report.
  static double reportFactor(uint64_t report, int rail);

  // A state change, for the log.
  struct Change {
    int rail = -1;
    int farNode = -1;  // -1: judged here; else the node whose view was heard
    bool slow = false;
    double bitsPerSec = 0, othersBitsPerSec = 0;  // its rate, and the fastest rail's
  };
  std::vector<Change> takeChanges();
  // True once after this node's own verdict on a rail changed.
  bool takeNews();

  struct RailState {
    double bitsPerSec = 0;  // 0: not measured
    bool slow = false;
    int changes = 0;
  };
  RailState railState(int rail) const;

 private:
  struct Rail {
    // This node's measurement and verdict.
    bool seen = false, wasBusy = false;
    uint64_t lastUs = 0, lastAcked = 0;
    uint64_t ackedBytes = 0, busyUs = 0;  // since the last sample
    double bytesPerSec = 0;               // smoothed (0: none yet)
    uint64_t sampledUs = 0;
    int below = 0, above = 0;             // samples in a row below / above the thresholds
    bool ownSlow = false;
    // When this node named it: its smoothed rate and the fastest rail's.
    double namedBps = 0, namedTopBps = 0;
    // The last view heard of it (share 0: none).
    double heardShare = 0, heardTopBps = 0;
    bool heardSlow = false;
    // The verdict in force.
    bool slow = false;
    double share = 1;  // its rate over the fastest rail's, while slow
    uint64_t changedUs = 0;
    int changes = 0;
  };
  bool ready(const Rail& r) const;
  void sample(int rail, uint64_t nowUs);
  bool ownFresh(uint64_t nowUs) const;
  void settle(int rail, int farNode, bool slow, double share, double topBps, uint64_t nowUs);

  double slowFraction_;
  Rail rails_[kRails];
  std::vector<Change> changes_;
  bool news_ = false;
};

}  // namespace zp
