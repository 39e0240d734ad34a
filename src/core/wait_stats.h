// Per-peer wait statistics of one communicator: which ranks this rank waits
// for, so that a rank that lags (a slow host, a throttled GPU, a data loader
// that stalls) can be named from the ranks that wait for it.
//
// The evidence is the first message of each peer in a call: the header
// round every host collective starts with (each rank sends its call's
// header to every other), the count rows a routed zpAlltoallv gathers, the
// first bytes (or meta) of an unrouted zpAlltoallv's and of a receive's
// messages; the moment it arrives is the moment that peer entered the
// call, or later if this rank came later (Op::arrivedUs). Peers a call
// does not hear from (a send, a receive's other ranks) count as arrived
// first: they are never charged. In one call, the
// time charged to a peer is how much later its header came than the one
// before it in arrival order, this rank's own entry counted as an arrival;
// all of it goes to the last one to arrive (the others arrived while this
// rank was still waiting anyway). A rank that
// enters 50 ms after the others is charged about 50 ms in every call; in a
// balanced job the charges are a few microseconds of noise spread over all
// peers.
//
// Where the call says how long each rank spent outside the library before
// it (zpAlltoallv's count rows carry it), a peer is charged at most what
// it spent outside beyond the rank it is compared with (the one that
// arrived before it, or this rank): a rank that came late because its
// previous call ran longer (it had more bytes to move in a skewed
// alltoallv, so it finished last and entered the next call last) was busy
// in the library, not lagging, whether the ranks compute between the calls
// or not. A rank that sleeps, computes longer or waits for data before the
// call spends that time outside and is charged it.
//
// The window holds the last kWindow calls; a peer charged the most in more
// than half of them by at least half the threshold (ZP_STRAGGLER_MS), on
// average more than the threshold,
// is named in one WARN line, and named again only after it has recovered
// (charged the most in under a quarter of the window, or on average under
// half the threshold).
#pragma once

#include <cstdint>
#include <vector>

namespace zp {

class WaitStats {
 public:
  static constexpr int kWindow = 100;

  // nranks: the communicator's size; self: this rank; thresholdUs: 0 turns
  // the WARN line off (the report still counts).
  WaitStats(int nranks, int self, uint64_t thresholdUs);

  // One call's arrivals: arrivedUs[p] is when peer p's header came, and
  // arrivedUs[self] when this rank entered the call (the same clock for
  // all); outsideUs (optional): how long each peer had been outside the
  // library before it entered, kUnknown where not known. Returns the peer
  // named by this call, if one crossed the threshold now (for the caller
  // to log), else -1.
  static constexpr uint64_t kUnknown = ~uint64_t(0);
  int record(const std::vector<uint64_t>& arrivedUs, const std::vector<uint64_t>* outsideUs = nullptr);
  // The same for a call that heard only from `peers` (a receive's
  // sources; a peer may be listed more than once): the others count as
  // arrived first, and only these are read, so a receive on a communicator
  // of thousands of ranks costs as much as on two.
  int record(const std::vector<uint64_t>& arrivedUs, const std::vector<int>& peers,
             const std::vector<uint64_t>* outsideUs = nullptr);
  // The same for a call that heard from one peer only (most receives):
  // `peer` arrived at arrivedUs, this rank entered at entryUs. No vector
  // of every rank is filled or cleared for it.
  int recordOne(int peer, uint64_t arrivedUs, uint64_t entryUs, const std::vector<uint64_t>* outsideUs = nullptr);
  // recordOne later: receives' records wait in a batch of up to kBatch
  // calls, entered into the window together when the batch is full, at
  // once for a late call (by half the threshold or more: it may name its
  // peer), and before any other record, clean call or report, so the
  // window sees the calls in their order. A batch touches the window and
  // the tallies once rather than each call (whatever a call's record
  // touches is on the way to the next call). A peer is named (the WARN
  // line) when its late call comes, as with recordOne; recovery is seen up
  // to a batch later.
  static constexpr int kBatch = 16;
  void recordLater(int peer, uint64_t arrivedUs, uint64_t entryUs) {
    if (pendingCount_ == kBatch) recordPendingNow();
    pending_[pendingCount_++] = {peer, arrivedUs, entryUs};
    if (thresholdUs_ > 0 && arrivedUs > entryUs && 2 * (arrivedUs - entryUs) >= thresholdUs_) recordPendingNow();
  }
  void recordPending() {
    if (pendingCount_) recordPendingNow();
  }
  // Where a call that waited gathers its ops' stamps (Op::arrivedUs,
  // Op::enteredUs) by peer: one slot per rank, 0 outside a call; and the
  // peers it heard from. Kept here, so that a call neither allocates nor
  // clears a vector of every rank; whoever fills them zeroes the slots it
  // used (recordWaited, collectives.h). Under the communicator's lock, one
  // call at a time.
  std::vector<uint64_t>& callArrivals() {
    if (callArrivals_.empty()) callArrivals_.assign(nranks_, 0);
    return callArrivals_;
  }
  std::vector<int>& callPeers() { return callPeers_; }
  // One call in which this rank never waited (every message was there when
  // it looked): nobody is charged. Counted here and entered into the window
  // at the next record or report, so that such a call (most small
  // send/recvs) costs an increment (a batch of receives' records before it
  // enters first: the window keeps the calls' order).
  void noteClean() {
    recordPending();
    pendingClean_++;
  }

  // This rank's time outside the library before a call it enters at
  // entryUs: since the end of its last recorded call (kUnknown before the
  // first). What it did in between in calls that record nothing (a send)
  // counts as outside: that can only charge it more.
  uint64_t outsideBefore(uint64_t entryUs) const {
    return lastEndUs_ && entryUs >= lastEndUs_ ? entryUs - lastEndUs_ : kUnknown;
  }
  void callEnded(uint64_t nowUs) { lastEndUs_ = nowUs; }

  struct Entry {
    int rank;
    int callsLast;     // calls of the window in which it was charged the most
    uint64_t totalUs;  // charged over the window
    uint64_t maxUs;    // the most charged in one call of the window
  };
  // The peers charged anything in the window, the most charged first;
  // *calls: how many calls the window holds.
  std::vector<Entry> report(int* calls);

 private:
  struct Call {
    int32_t last = -1;  // the peer charged the most in this call, or -1
    bool late = false;  // by half the threshold or more
    uint64_t chargedUs = 0;
  };
  // A peer's tallies over the window, side by side: a call charged to it
  // touches one line of them, not four vectors.
  struct PeerTally {
    int callsLast = 0;       // calls it came last in
    int lateCalls = 0;       // calls it came last in by half the threshold or more
    uint64_t totalUs = 0;    // charged
    bool named = false;      // named and not recovered since
  };
  template <class Peers>
  int recordOver(const std::vector<uint64_t>& arrivedUs, const Peers& peers, const std::vector<uint64_t>* outsideUs);
  // What every record ends with: `last` arrived at lastAt, after `ref` (the
  // arrival before it, or this rank's entry) at refAt.
  int charge(int last, uint64_t lastAt, int ref, uint64_t refAt, const std::vector<uint64_t>* outsideUs);
  void push(int last, uint64_t chargedUs, bool late);  // one call into the window
  void checkRecovered(int p);
  // Enters what waits before a call into the window, in the calls' order:
  // recordLater's batch, then the clean calls counted after it.
  void catchUp();
  void flushClean();
  void recordPendingNow();
  void advance() {  // the ring's next slot
    next_ = next_ + 1 == kWindow ? 0 : next_ + 1;
    filled_ += filled_ < kWindow;
  }
  int nranks_, self_;
  uint64_t thresholdUs_;
  std::vector<Call> window_;  // a ring of kWindow calls
  int next_ = 0, filled_ = 0;
  std::vector<PeerTally> peers_;
  uint64_t lastEndUs_ = 0;          // when this rank's last recorded call ended (0: none yet)
  uint64_t pendingClean_ = 0;       // clean calls not yet in the window (noteClean)
  struct Pending {
    int peer;
    uint64_t arrivedUs, entryUs;
  };
  int pendingCount_ = 0;
  Pending pending_[kBatch];  // recordLater's calls, oldest first
  std::vector<uint64_t> callArrivals_;  // callArrivals()
  std::vector<int> callPeers_;          // callPeers()
};

// The latest of a call's times (its entry and its peers' arrivals): where
// the call ended with its last arrival, its end without a clock read.
inline uint64_t lastOf(const std::vector<uint64_t>& us) {
  uint64_t last = 0;
  for (uint64_t t : us) last = t > last ? t : last;
  return last;
}

// Records one call's arrivals (WaitStats::record) and, if that names a
// peer, says so in one WARN line from `rank`. Every call that learns when
// its peers entered calls this: the standard collectives' header round,
// zpAlltoallv (its count rows, or its messages' first bytes), receives.
void recordWaits(WaitStats& stats, int rank, const std::vector<uint64_t>& arrivedUs,
                 const std::vector<uint64_t>* outsideUs = nullptr);
// The same for a call that heard from one peer (WaitStats::recordOne).
void recordWait(WaitStats& stats, int rank, int peer, uint64_t arrivedUs, uint64_t entryUs,
                const std::vector<uint64_t>* outsideUs);
// The same for a call that heard only from `peers` (WaitStats::record).
void recordWaits(WaitStats& stats, int rank, const std::vector<uint64_t>& arrivedUs, const std::vector<int>& peers,
                 const std::vector<uint64_t>* outsideUs = nullptr);

}  // namespace zp
