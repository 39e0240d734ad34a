// The communicator's executor: a call's ops posted to the transports that
// reach their peers (shared memory's shortcut first, Transport::moveNow),
// then every transport driven until all are done, a peer fails, the
// timeout passes or the interrupt check says stop; the transports' progress,
// waits and the progress thread. The rest of the communicator (its making,
// failures, shutdown) is in comm.cc.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "src/core/comm.h"
#include "src/core/log.h"
#include "src/util/clock.h"

namespace zp {

namespace {

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 16; i++) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) s += ", ...";
  return s;
}

std::atomic<uint64_t> gHostPeerWaits{0};
// A load and a store, not a locked add (every call that moves bytes on the
// host counts one): waits on several threads at once may count as one.
void countHostPeerWait() {
  gHostPeerWaits.store(gHostPeerWaits.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
}

// Set rarely and read only by calls that have waited a while: a mutex keeps
// the function and its argument a pair.
std::mutex gInterruptMu;
InterruptCheck gInterruptCheck = nullptr;
void* gInterruptArg = nullptr;

bool interruptRequested() {
  InterruptCheck check;
  void* arg;
  {
    std::lock_guard<std::mutex> lock(gInterruptMu);
    check = gInterruptCheck;
    arg = gInterruptArg;
  }
  return check && check(arg) != 0;
}

}  // namespace

uint64_t hostPeerWaits() { return gHostPeerWaits.load(std::memory_order_relaxed); }

void setInterruptCheck(InterruptCheck check, void* arg) {
  std::lock_guard<std::mutex> lock(gInterruptMu);
  gInterruptCheck = check;
  gInterruptArg = arg;
}

// Drives the comms' transports until done() holds, a comm breaks, or nothing
// moves for the timeout. `waitingOn` names the ranks still owed something.
zpResult_t Comm::progressUntil(const std::vector<Comm*>& comms, FunctionRef<bool()> done,
                               FunctionRef<std::vector<int>(Comm*)> waitingOn, const char* what) {
  countHostPeerWait();
  // The clock is first read when the first look finds the call not done:
  // a small message's whole call is a few clock reads' time.
  uint64_t lastMove = 0, lastAsked = 0, started = 0;
  bool warned = false;
  // The first look does not drive the transports: an op may have moved as
  // it was posted, and a call that is done then returns at once. But a
  // failure found while posting (a message out of order) breaks the
  // communicator there, and is passed on to the peers below like any other.
  for (bool first = true;; first = false) {
    uint32_t token = comms.size() == 1 ? comms[0]->waitToken() : 0;
    bool moved = false;
    if (!first)
      for (Comm* c : comms) moved |= c->progress();
    for (Comm* c : comms)
      if (c->abortRequested_.load())  // zpCommAbort's leave() tells the peers
        c->setAsyncError(zpRemoteError, "the communicator was aborted (zpCommAbort)", /*fromPeer=*/true);
    for (Comm* c : comms)
      if (c->asyncError_ != zpSuccess) {
        // The peers hear first: dropOps may then cut a peer that still holds a request.
        if (!c->asyncFromPeer_ && !c->faultSent_) c->passOnFault(c->asyncError_, c->asyncMsg_);
        c->dropOps(c->asyncError_, c->asyncMsg_);
        return fail(c->asyncError_, "rank %d: %s failed: %s", c->rank_, what, c->asyncMsg_.c_str());
      }
    if (done()) return zpSuccess;
    if (first) continue;  // the transports' progress before any wait
    const uint64_t stamp = stampUs();  // the cheap clock: read on every pass of a wait
    const uint64_t now = stamp / 1000;
    if (lastMove == 0) {
      lastMove = lastAsked = started = now;
      for (Comm* c : comms)
        if (c->waitEntry_) {
          c->waitEntry_->noteEntered(stamp);
          c->waitEntry_ = nullptr;
        }
    }
    if (moved) {
      lastMove = now;
      continue;
    }
    int timeoutMs = comms[0]->cfg_.timeoutMs;
    const int warnMs = comms[0]->cfg_.waitWarnMs;
    if (!warned && warnMs > 0 && now - started >= (uint64_t)warnMs) {
      // Long before the timeout, the ranks that hold this call up are named.
      warned = true;
      for (Comm* c : comms) {
        std::vector<int> peers = waitingOn(c);
        if (!peers.empty())
          ZP_WARN(kSubColl, "rank %d: %s (opCount %llx) has waited %.1f s for rank(s) %s (ZP_WAIT_WARN)",
                  c->rank_, c->callName(), (unsigned long long)c->opCount_.load(std::memory_order_relaxed) - 1,
                  (now - started) / 1000.0, rankList(peers).c_str());
      }
    }
    if (now - lastMove >= (uint64_t)timeoutMs) {
      for (Comm* c : comms) {
        std::vector<int> peers = waitingOn(c);
        if (peers.empty()) continue;
        std::string msg = std::string(c->callName()) + " (" + what + "): no progress for " +
                          std::to_string(timeoutMs / 1000.0).substr(0, 6) + " s waiting for rank(s) " +
                          rankList(peers) + " (ZP_TIMEOUT)";
        c->breakHere(zpRemoteError, msg);
        return fail(zpRemoteError, "rank %d: %s", c->rank_, msg.c_str());
      }
      lastMove = now;
    }
    if (now - lastAsked >= kInterruptCheckMs) {
      lastAsked = now;
      if (interruptRequested()) {
        // The call is half done on some peers: the communicator cannot go
        // on, so it breaks here and the peers are told at once.
        std::string msg = what + std::string(": interrupted (the interrupt check of zpSetInterruptCheck)");
        for (Comm* c : comms) c->breakHere(zpSystemError, msg);
        return fail(zpSystemError, "rank %d: %s", comms[0]->rank_, msg.c_str());
      }
    }
    if (comms.size() == 1) {
      int sliceMs = (int)std::min<uint64_t>(100, timeoutMs - (now - lastMove) + 1);
      comms[0]->wait(token, std::max(sliceMs, 1));
    } else {
      // Several communicators: no single doorbell to sleep on, so nap briefly.
      usleep(50);
      static thread_local uint64_t lastCheck = 0;
      if (now - lastCheck >= 100) {
        lastCheck = now;
        for (Comm* c : comms) c->checkAlive();
      }
    }
  }
}

zpResult_t Comm::checkUsable() const {
  if (left_)
    return fail(zpInvalidUsage, "rank %d: the communicator was destroyed while calls on it were queued in a group",
                rank_);
  if (asyncError_ != zpSuccess)
    return fail(asyncError_, "rank %d: the communicator is broken: %s", rank_, asyncMsg_.c_str());
  return zpSuccess;
}

zpResult_t Comm::enqueueOnStreams(const std::vector<Op*>& ops) {
  ZP_CHECK(checkUsable());
  if (!device_) return fail(zpInternalError, "rank %d: device ops on a communicator without a device data plane", rank_);
  return device_->enqueue(ops);
}

zpResult_t Comm::enqueueCollectiveOnStream(const CollArgs& args, void* stream) {
  ZP_CHECK(checkUsable());
  if (!device_) return fail(zpInternalError, "rank %d: a device collective on a communicator without a device data plane", rank_);
  return device_->enqueueCollective(args, stream);
}

zpResult_t Comm::runOps(std::vector<Work>& work, FunctionRef<bool()> until) {
  std::vector<Comm*> comms;
  for (Work& w : work) comms.push_back(w.comm);
  return runWork(work.data(), work.size(), comms, until);
}

zpResult_t Comm::runOps(std::vector<Op*>& ops, FunctionRef<bool()> until) {
  // On one node, shared memory first moves what it can at once (small
  // messages: Transport::moveNow); a call it finishes whole ends here. Its
  // receives stop at one from any source (no peer yet), so the ones held
  // behind that (holdBehindAnySource) are left to the general path.
  if (!until && transports_.size() == 1 && transports_[0] == doorbell_ && asyncError_ == zpSuccess &&
      !left_ && !abortRequested_.load(std::memory_order_relaxed)) {
    doorbell_->moveNow(ops, sendSeq_, recvSeq_);
    bool all = true;
    for (const Op* op : ops) all &= op->done;
    if (all) {  // it finishes ops with success only
      countHostPeerWait();
      return zpSuccess;
    }
  }
  // Without a list of one Work and one Comm made per call (a send/recv
  // group per step would allocate them every time).
  if (self_.empty()) self_.push_back(this);
  Work work{this, {}};
  work.ops.swap(ops);  // lent, not copied
  zpResult_t r = runWork(&work, 1, self_, until);
  ops.swap(work.ops);
  return r;
}

zpResult_t Comm::runWork(Work* work, size_t n, const std::vector<Comm*>& comms, FunctionRef<bool()> until) {
  for (Comm* c : comms) ZP_CHECK(c->checkUsable());
  bool anySource = false;  // receives from any source not matched yet (any_source.cc)
  for (size_t k = 0; k < n; k++) {
    Work& w = work[k];
    Comm* c = w.comm;
    bool self = false, wild = false;
    for (const Op* op : w.ops) {
      self |= op->peer == c->rank_;
      wild |= op->peer == kAnySource;
    }
    if (self) c->runSelfOps(w.ops);
    wild = wild && c->holdBehindAnySource(w.ops);
    if (!wild) c->anyHeld_.clear();  // nothing held: matchAnySource passes these ops over
    anySource |= wild;
    for (size_t i = 0; i < w.ops.size(); i++) {
      Op* op = w.ops[i];
      if (op->peer == c->rank_ || op->peer == kAnySource || op->done) continue;  // done: moved already (moveNow)
      if (wild && c->anyHeld_[i]) continue;
      c->postOp(op);
    }
  }
  // The wait statistics' entry of receives that wait here (Op::enteredUs)
  // is when the call first finds itself waiting, after a pass over the
  // transports (progressUntil), not when its ops are posted: a call whose
  // messages came by then never waited, is counted clean, and reads no clock
  // for it (most of a medium message's exchange between two ranks that
  // enter together).
  for (size_t k = 0; k < n; k++)
    for (Op* op : work[k].ops)
      if (op->stampsArrival) {
        work[k].comm->waitEntry_ = op;
        break;
      }
  auto allDone = [&] {
    if (anySource) {
      anySource = false;
      for (size_t k = 0; k < n; k++) anySource |= work[k].comm->matchAnySource(work[k].ops);
    }
    for (size_t k = 0; k < n; k++)
      for (Op* op : work[k].ops)
        if (!op->done) return false;
    return true;
  };
  // While a receive from any source waits, every other rank may be the one it waits for.
  auto busy = [&anySource](Comm* c) {
    std::vector<int> peers = c->busyPeers();
    if (anySource) {
      peers.clear();
      for (int p = 0; p < c->nranks_; p++)
        if (p != c->rank_) peers.push_back(p);
    }
    return peers;
  };
  const zpResult_t waited = progressUntil(comms, until ? until : allDone, busy, "send/recv");
  for (Comm* c : comms) c->waitEntry_ = nullptr;
  ZP_CHECK(waited);
  for (size_t k = 0; k < n; k++)
    for (Op* op : work[k].ops)
      if (op->done && op->status != zpSuccess) {
        if (anySource)
          for (size_t j = 0; j < n; j++) work[j].comm->failUnposted(work[j].ops, op->status);
        anySource = false;
        ZP_CHECK(progressUntil(comms, allDone, busy, "send/recv"));  // nothing may still point at an op
        return fail(op->status, "rank %d: %s", work[k].comm->rank_, op->error.c_str());
      }
  return zpSuccess;
}

// ---- Driving the transports ----

bool Comm::progress() {
  bool moved = false;
  for (Transport* t : transports_) moved |= t->progress();
  return moved;
}

uint32_t Comm::waitToken() const { return doorbell_ ? doorbell_->waitToken() : 0; }

void Comm::wait(uint32_t token, int ms) {
  // The network's events come through a file descriptor, shared memory's
  // through a doorbell. A transport built on both (the relay, with no
  // wake-up of its own) may hear from either side.
  bool stacked = false;
  for (Transport* t : transports_)
    if (t->wakeup() == Transport::Wakeup::kNone) stacked |= t->busy();
  bool bellBusy = doorbell_->busy() || stacked;
  bool eventsBusy = events_ && (events_->busy() || stacked);
  auto eventsReady = [this] { return events_->eventsReady(); };
  if (!events_) {
    doorbell_->waitDoorbell(token, ms, {}, -1, true);
  } else if (doorbell_->sleepsWithFd()) {
    // One sleep for both, woken by either at once: a relay's proxy hears of
    // a chunk from a local peer or from the network without a nap's delay,
    // which on a busy CPU is a time slice, not a millisecond. It polls
    // first only while shared memory has work, as below.
    if (events_->armEvents())
      doorbell_->waitDoorbell(token, eventsBusy ? std::min(ms, 1) : ms, eventsReady, events_->eventFd(), bellBusy);
  } else if (!bellBusy) {
    // Without that: sleep on the one with work, and nap briefly when both have.
    events_->waitEvents(ms);
  } else if (!eventsBusy) {
    events_->waitEvents(0);
    doorbell_->waitDoorbell(token, std::min(ms, 1), {}, -1, true);
  } else if (events_->armEvents()) {
    // Both: poll the doorbell and the network's fd together, then nap briefly.
    doorbell_->waitDoorbell(token, std::min(ms, 1), eventsReady, -1, true);
  }
}

void Comm::dropOps(zpResult_t status, const std::string& why) {
  for (Transport* t : transports_) t->dropOps(status, why);
}

std::vector<int> Comm::busyPeers() const {
  std::vector<int> out;
  for (Transport* t : transports_)
    for (int p : t->busyPeers()) out.push_back(p);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void Comm::checkAlive() {
  for (Transport* t : transports_) t->checkAlive();
}

// The progress thread: progress while no call holds the lock. It sleeps
// without the lock (on the shared-memory doorbell and the network's event
// fd together where it can, else on the doorbell, checking the network
// between naps), so a call can start at any time.
void Comm::progressLoop() {
  uint64_t lastMove = nowMs();
  while (!progressStop_.load()) {
    uint32_t token;
    bool armed = true;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (asyncError_ != zpSuccess) break;  // the next call reports it
      token = doorbell_->waitToken();
      if (progress()) {
        lastMove = nowMs();
        continue;
      }
      if (events_) armed = events_->armEvents();
    }
    if (!armed) continue;
    // Busy lately: short naps, so chunks from the network do not wait where
    // it cannot wake the thread; idle: longer ones (a doorbell wakes it at
    // once either way).
    int napMs = nowMs() - lastMove < 200 ? 1 : 20;
    doorbell_->sleepDoorbell(token, napMs, events_ ? events_->eventFd() : -1);
  }
}

void Comm::startProgressThread() {
  if (!progressThread_.joinable()) progressThread_ = std::thread(&Comm::progressLoop, this);
}

}  // namespace zp
