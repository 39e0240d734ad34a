#include "transport/shm/shm_transport.h"
#include "transport/shm/shm_layout.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "src/core/log.h"
#include "src/util/clock.h"

namespace zp {

// A reducing single-copy receive reads this much at a time (fits in L2);
// a group, this much of all its members together.
constexpr size_t kReduceSlice = 256 << 10;
// A single-copy receive reads at most this much per progress pass, then
// lets the rank's other work run (its other peers' rings, the network,
// the chunks it relays for others as a proxy) before the next piece: a
// zipf alltoallv's largest block is over 100 MiB, and a proxy reading it
// in one go left its rail idle and its senders waiting meanwhile
// (docs/routing.md, "Slow NICs").
constexpr size_t kReadPiece = 2 << 20;
std::atomic<long> gGroupsReduced{0};    // ShmTransport::groupsReduced()
std::atomic<long> gSingleCopySends{0};  // ShmTransport::singleCopySends()
std::atomic<long> gOpsMovedNow{0};      // ShmTransport::opsMovedNow()
std::atomic<long> gTakenYielding{0};    // ShmTransport::receivesTakenYielding()
std::atomic<long> gYieldingDeclined{0};  // ShmTransport::yieldingPollsDeclined()
static void countMovedNow() { gOpsMovedNow.store(gOpsMovedNow.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed); }


ShmTransport::Peer* ShmTransport::peer(int rank) {
  int i = (rank >= 0 && rank < (int)peerIndex_.size()) ? peerIndex_[rank] : -1;
  return i < 0 ? nullptr : &peers_[i];
}

std::string ShmTransport::describe(int rank) const {
  int i = (rank >= 0 && rank < (int)peerIndex_.size()) ? peerIndex_[rank] : -1;
  if (i < 0) return "none";
  return peers_[i].cma ? "SHM/CMA" : "SHM/copy";
}

bool ShmTransport::hasWork(const Peer& p) {
  // kLaneStanding's receives stand ready at all times: they are no work.
  for (const Lane& l : p.lane)
    if (!l.sendq.empty() || !l.finWait.empty()) return true;
  return !p.lane[0].recvq.empty();
}

void ShmTransport::addSharedWord(int index, int64_t delta) {
  if (mine_ && index >= 0 && index < kSharedWords)
    mine_->sharedWords[index].fetch_add((uint64_t)delta, std::memory_order_relaxed);
}

uint64_t ShmTransport::sharedWord(int rank, int index) const {
  if (index < 0 || index >= kSharedWords) return 0;
  if (rank == ctx_.rank) return mine_ ? mine_->sharedWords[index].load(std::memory_order_relaxed) : 0;
  int i = (rank >= 0 && rank < (int)peerIndex_.size()) ? peerIndex_[rank] : -1;
  return i < 0 ? 0 : peers_[i].seg->sharedWords[index].load(std::memory_order_relaxed);
}

bool ShmTransport::busy() const {
  for (const Peer& p : peers_)
    if (hasWork(p)) return true;
  return !groups_.empty();
}

bool ShmTransport::canReduceGroup(int rank, size_t bytes) const {
  const int i = (rank >= 0 && rank < (int)peerIndex_.size()) ? peerIndex_[rank] : -1;
  if (i < 0 || peers_[i].gone) return false;
  const SegHeader* s = peers_[i].seg;  // what the sender decided at its init
  return s->cmaTo[myLocalIdx_].load(std::memory_order_acquire) && bytes >= s->eagerBytes && bytes < s->reduceCopyFrom;
}

long ShmTransport::groupsReduced() { return gGroupsReduced.load(); }
long ShmTransport::singleCopySends() { return gSingleCopySends.load(); }
long ShmTransport::opsMovedNow() { return gOpsMovedNow.load(); }
long ShmTransport::receivesTakenYielding() { return gTakenYielding.load(); }
long ShmTransport::yieldingPollsDeclined() { return gYieldingDeclined.load(); }

bool ShmTransport::runGroups() {
  bool did = false;
  for (auto it = groups_.begin(); it != groups_.end();) {
    const OpReduceGroup& g = *it->first;
    GroupWait& w = it->second;
    zpResult_t status = zpSuccess;
    std::string why;
    for (Op* op : w.ops)
      if (op->done && op->status != zpSuccess && status == zpSuccess) {
        status = op->status;
        why = op->error;
      }
    if (status == zpSuccess && (int)w.in.size() < g.members) {
      ++it;
      continue;
    }
    did = true;
    if (status == zpSuccess) status = reduceGroup(g, w, &why);
    // Every member ends now, and every sender whose buffer was offered hears
    // how (an arrived member's sender waits for its FIN).
    for (const GroupMember& m : w.in) {
      Peer* p = peer(m.rank);
      if (!p->gone) sendCtrl(*p, kFin, m.seq, status, 0, why, m.lane);
    }
    for (Op* op : w.ops) {
      if (op->done) continue;
      if (Peer* p = peer(op->peer)) {  // not arrived yet: it must not be matched any more
        std::deque<Op*>& q = p->lane[op->lane].recvq;
        q.erase(std::remove(q.begin(), q.end(), op), q.end());
      }
      if (status == zpSuccess) op->progressed = op->bytes;
      op->finish(status, why);
    }
    it = groups_.erase(it);
  }
  for (Peer& p : peers_)
    if (p.dirty || p.wake) notify(p);
  return did;
}

zpResult_t ShmTransport::reduceGroup(const OpReduceGroup& g, GroupWait& w, std::string* why) {
  std::sort(w.in.begin(), w.in.end(),
            [](const GroupMember& a, const GroupMember& b) { return a.op->groupSlot < b.op->groupSlot; });
  const size_t k = w.in.size(), es = g.reduce->elemSize;
  // A piece of every member at once in cache: 4 KiB at least, whole elements.
  const size_t piece = std::max<size_t>(4096, (kReduceSlice / k) & ~size_t(4095)) / es * es;
  thread_local std::vector<char> bufs;
  if (bufs.size() < piece * k) bufs.resize(piece * k);
  for (size_t at = 0; at < g.bytes; at += piece) {
    const size_t len = std::min(piece, g.bytes - at);
    for (size_t m = 0; m < k; m++) {
      const Peer& p = *peer(w.in[m].rank);
      if (const int err = readPeer(p.pid, bufs.data() + m * piece, w.in[m].addr + at, len))
        return readFailed(p, g.bytes, err, why);
    }
    char* out = (char*)g.out + at;
    g.reduce->fn(out, (const char*)g.src + at, bufs.data(), len);
    for (size_t m = 1; m < k; m++) g.reduce->fn(out, out, bufs.data() + m * piece, len);
  }
  gGroupsReduced++;
  return zpSuccess;
}

void ShmTransport::post(Op* op) {
  Peer* p = peer(op->peer);
  if (op->group) groups_[op->group].ops.push_back(op);  // even if it fails here: the group fails with it
  if (!p) {
    op->finish(zpInternalError, "no shared-memory path to rank " + std::to_string(op->peer));
    return;
  }
  if (p->gone || (p->bye && op->isSend)) {
    op->finish(p->gone ? p->goneCode : zpRemoteError, p->goneWhy);
    return;
  }
  const int lane = op->lane < kLanes ? op->lane : kLaneCalls;
  Lane& l = p->lane[lane];
  (op->isSend ? l.sendq : l.recvq).push_back(op);
  // Moved at once where it can be (a send with room in the ring, a receive
  // whose message is there): a small message's call then ends without a
  // pass over every peer's rings. What it cannot do yet, progress() does.
  // The peer's control records first, as progress() reads them: a send to a
  // rank that has said goodbye fails instead of going into its ring.
  drainCtrl(*p);
  if (!op->done && !p->gone) {
    if (op->isSend)
      progressSend(*p, lane);
    else
      progressRecv(*p, lane);
  }
  if (p->dirty || p->wake) notify(*p);
}

bool ShmTransport::arrived(int rank, uint64_t seq, size_t* bytes) {
  Peer* p = peer(rank);
  if (!p || p->gone) return false;
  Lane& l = p->lane[kLaneCalls];
  if (!l.recvq.empty() || l.discarding) return false;
  const MsgHdr* h = ringPeek(l.in);
  if (!h || h->seq != seq || h->kind != (uint32_t)OpKind::kP2P) return false;
  *bytes = recordTotal(h);
  return true;
}

std::vector<int> ShmTransport::waitingOn(int lane) {
  std::vector<int> out;
  if (lane < 0 || lane >= kLanes) return out;
  for (Peer& p : peers_)
    if (p.rank != ctx_.rank && !p.gone && ringPeek(p.lane[lane].in)) out.push_back(p.rank);
  return out;
}

void ShmTransport::sendStatus(int rank, uint64_t collSeq, zpResult_t status, const std::string& text) {
  if (Peer* p = peer(rank))
    if (!p->gone) sendCtrl(*p, kStatus, 0, status, collSeq, text);
}

bool ShmTransport::sendCtrl(Peer& p, uint32_t type, uint64_t seq, int32_t status, uint64_t collSeq,
                            const std::string& text, uint32_t lane) {
  // Straight into the ring when nothing waits before it (every single-copy
  // receive sends a fin: no allocation for it); else behind the backlog.
  if (p.ctrlBacklog.empty()) {
    if (MsgHdr* h = ringClaim(p.outCtrl, recordBytes(ctrlTextLen(text)))) {
      fillCtrlRecord(h, type, seq, status, collSeq, text, lane);
      ringPublish(p.outCtrl);
      p.dirty = true;
      return true;
    }
  }
  p.ctrlBacklog.push_back(makeRecord(type, seq, status, collSeq, text, lane));
  flushCtrl(p);
  return p.ctrlBacklog.empty();
}

bool ShmTransport::flushCtrl(Peer& p) {
  bool did = false, asked = false;
  while (!p.ctrlBacklog.empty()) {
    if (!ringPush(p.outCtrl, p.ctrlBacklog.front())) {
      if (asked) break;
      // Full: ask the peer to ring when it frees room, then look once more
      // in case it did so before it could see the flag.
      p.outCtrl.ctl->producerWaiting.store(1, std::memory_order_relaxed);
      std::atomic_thread_fence(std::memory_order_seq_cst);  // see ringPop
      asked = true;
      continue;
    }
    p.ctrlBacklog.pop_front();
    p.dirty = did = true;
  }
  return did;
}

void ShmTransport::checkAlive() {
  for (Peer& p : peers_) {
    if (p.gone || p.bye || !processExited(p.pid, p.pidfd)) continue;
    // A peer that said goodbye before exiting left cleanly.
    drainCtrl(p);
    if (!p.bye)
      peerGone(p, zpRemoteError, "rank " + std::to_string(p.rank) + " (pid " + std::to_string(p.pid) + ") died",
               true);
  }
}

zpResult_t ShmTransport::readFailed(const Peer& p, size_t bytes, int err, std::string* why) {
  *why = "reading " + std::to_string(bytes) + " bytes from rank " + std::to_string(p.rank) +
         " failed: " + strerror(err);
  if (err != ESRCH) return zpSystemError;
  // The peer's process is gone, found before checkAlive did: the
  // communicator is broken now, as checkAlive would make it (the call that
  // read fails with zpRemoteError, and so must zpCommGetAsyncError, even
  // while another thread holds the progress lock).
  ctx_.sink->setAsyncError(zpRemoteError, *why);
  return zpRemoteError;
}

void ShmTransport::peerGone(Peer& p, zpResult_t code, const std::string& why, bool breaksComm, bool fromPeer) {
  if (p.gone) return;
  p.gone = true;
  p.goneCode = code;
  p.goneWhy = why;
  ZP_INFO(kSubShm, "rank %d: %s", ctx_.rank, why.c_str());
  failOps(p, code, why);
  if (breaksComm) ctx_.sink->setAsyncError(code, why, fromPeer);
}

void ShmTransport::failOps(Peer& p, zpResult_t code, const std::string& why) {
  for (auto& kv : groups_)  // its members that arrived (the others are in recvq); runGroups ends the rest
    for (const GroupMember& m : kv.second.in)
      if (m.rank == p.rank) m.op->finish(code, why);
  for (Lane& l : p.lane) {
    for (Op* op : l.sendq) op->finish(code, why);
    for (Op* op : l.recvq) op->finish(code, why);
    for (Op* op : l.finWait) op->finish(code, why);
    l.sendq.clear();
    l.recvq.clear();
    l.finWait.clear();
  }
}

void ShmTransport::dropOps(zpResult_t status, const std::string& why) {
  for (Peer& p : peers_) failOps(p, status, why);
  for (auto& kv : groups_)
    for (Op* op : kv.second.ops)
      if (!op->done) op->finish(status, why);
  groups_.clear();
}

void ShmTransport::sendToAll(uint32_t type, zpResult_t code, const std::string& why) {
  // Every peer, also those this rank gave up on (they may still be alive and
  // waiting): the rings stay mapped, so a write to a dead peer's is harmless.
  for (Peer& p : peers_) {
    // Straight into the ring, or not at all: a rank on its way out cannot wait for room.
    ringPush(p.outCtrl, makeRecord(type, 0, code, 0, why));
    p.wake = true;
    notify(p);
  }
}

void ShmTransport::abortPeers(zpResult_t code, const std::string& why) { sendToAll(kAbort, code, why); }

void ShmTransport::leave() {
  sendToAll(kBye, zpRemoteError, "rank " + std::to_string(ctx_.rank) + " destroyed the communicator");
}

std::vector<int> ShmTransport::busyPeers() const {
  std::vector<int> out;
  for (const Peer& p : peers_)
    if (hasWork(p)) out.push_back(p.rank);
  return out;
}

bool ShmTransport::progress() {
  bool did = false;
  // Sends first, to every peer, and their doorbells rung at once: a receive
  // may be a long single-copy read, and peers should not wait for it to learn
  // what this rank offers them.
  for (Peer& p : peers_) {
    if (p.gone) {
      // Nothing from it is read any more: what it still writes is no news.
      if (ringPeek(p.inCtrl)) ringPark(p.inCtrl);
      for (Lane& l : p.lane)
        if (ringPeek(l.in)) ringPark(l.in);
      continue;
    }
    did |= drainCtrl(p);
    for (int l = 0; l < kLanes && !p.gone; l++) did |= progressSend(p, l);
    if (p.dirty || p.wake) notify(p);
  }
  // Arrivals (Op::arrivedUs) as of this pass's start: a message that was
  // here then is not made later by the copies of other peers' messages
  // that this pass makes first (the wait statistics would charge them).
  uint64_t passUs = 0;
  for (Peer& p : peers_)
    for (Lane& l : p.lane)
      if (!p.gone && !l.recvq.empty() && l.recvq.front()->stampsArrival && !l.recvq.front()->arrivedUs &&
          ringPeek(l.in)) {
        if (!passUs) passUs = stampUs();
        l.recvq.front()->arrivedUs = passUs;
      }
  for (Peer& p : peers_) {
    for (int l = 0; l < kLanes && !p.gone; l++) {
      did |= progressRecv(p, l);
      Lane& lane = p.lane[l];
      if (!p.gone && p.bye && !lane.recvq.empty() && !ringPeek(lane.in)) {
        for (Op* op : lane.recvq) op->finish(zpRemoteError, p.goneWhy);
        lane.recvq.clear();
      }
    }
    if (p.dirty || p.wake) notify(p);
  }
  if (!groups_.empty()) did |= runGroups();
  return did;
}

bool ShmTransport::drainCtrl(Peer& p) {
  bool did = flushCtrl(p);
  while (MsgHdr* h = ringPeek(p.inCtrl)) {
    did = true;
    std::string text(payloadOf(h), std::min<uint32_t>(h->len, 512));
    switch (h->type) {
      case kFin: {
        std::deque<Op*>& finWait = p.lane[h->lane < kLanes ? h->lane : 0].finWait;
        Op* op = nullptr;
        if (!finWait.empty() && finWait.front()->seq == h->seq) {
          op = finWait.front();
          finWait.pop_front();
        } else {
          auto it = std::find_if(finWait.begin(), finWait.end(), [&](const Op* o) { return o->seq == h->seq; });
          if (it != finWait.end()) {
            op = *it;
            finWait.erase(it);
          }
        }
        if (op) {
          op->progressed = op->bytes;
          op->finish((zpResult_t)h->status, text);
        }
        break;
      }
      case kStatus:
        ctx_.sink->onStatus(p.rank, h->collSeq, (zpResult_t)h->status, text);
        break;
      case kBye: {
        // Only operations with this peer fail, and receives only once the
        // messages it sent before leaving are used up.
        p.bye = true;
        p.goneWhy = text;
        for (Lane& l : p.lane) {
          for (Op* op : l.sendq) op->finish(zpRemoteError, text);
          for (Op* op : l.finWait) op->finish(zpRemoteError, text);
          l.sendq.clear();
          l.finWait.clear();
        }
        break;
      }
      case kAbort: {
        zpResult_t code = (zpResult_t)h->status;
        ringPop(p.inCtrl, h);
        peerGone(p, code, text, true, true);
        return true;
      }
      default:
        break;
    }
    if (ringPop(p.inCtrl, h)) p.wake = true;
  }
  return did;
}

bool ShmTransport::progressRecv(Peer& p, int lane) {
  Lane& l = p.lane[lane];
  bool did = false;
  while (MsgHdr* h = ringPeek(l.in)) {
    if (l.discarding) {
      // Fragments of a message whose receive was refused: skip them.
      l.discardLeft -= std::min<uint64_t>(l.discardLeft, h->len);
      if (l.discardLeft == 0) l.discarding = false;
      if (ringPop(l.in, h)) p.wake = true;
      did = true;
      continue;
    }
    if (l.recvq.empty()) {  // not asked for yet: it waits in the ring
      ringPark(l.in);
      break;
    }
    Op* op = l.recvq.front();
    did = true;
    if (h->seq != op->seq || h->kind != (uint32_t)op->kind) {
      std::string why = "rank " + std::to_string(p.rank) + " sent its message #" + std::to_string(h->seq) + " (" +
                        opKindName((OpKind)h->kind) + ") while rank " + std::to_string(ctx_.rank) +
                        " expected message #" + std::to_string(op->seq) + " (" + opKindName(op->kind) +
                        "): the ranks called operations in different orders";
      // The pair's message streams no longer line up: nothing later can be matched.
      peerGone(p, zpInvalidUsage, why, true);
      return true;
    }
    op->noteArrival();  // its first record: meta, offer or fragment
    if (h->type == kMeta) {
      memcpy(op->meta, payloadOf(h), std::min<uint32_t>(h->len, op->metaBytes));
      if (ringPop(l.in, h)) p.wake = true;
      continue;
    }
    // A message's first fragment carries its meta ahead of its data.
    const uint32_t metaLen = recordMetaLen(h);
    if (metaLen && op->metaBytes) memcpy(op->meta, payloadOf(h), std::min<uint32_t>(metaLen, op->metaBytes));
    const uint32_t dataLen = h->len - metaLen;
    if (op->progressed == 0 && recordTotal(h) != op->bytes) {
      std::string why = std::string(opKindName(op->kind)) + ": rank " + std::to_string(p.rank) + " sends " +
                        std::to_string(recordTotal(h) / op->typeSize) + " elements to rank " +
                        std::to_string(ctx_.rank) + " but rank " + std::to_string(ctx_.rank) +
                        " expects " + std::to_string(op->bytes / op->typeSize);
      if (h->type == kRts) {
        sendCtrl(p, kFin, h->seq, zpInvalidUsage, 0, why, lane);
      } else {
        uint64_t left = recordTotal(h) - dataLen;
        if (left) {
          l.discarding = true;
          l.discardLeft = left;
        }
      }
      if (ringPop(l.in, h)) p.wake = true;
      l.recvq.pop_front();
      op->finish(zpInvalidUsage, why);
      continue;
    }
    if (h->type == kRts && op->group) {
      // A group's member: read with the others once all can be (runGroups).
      groups_[op->group].in.push_back({p.rank, lane, h->seq, h->addr, op});
      if (ringPop(l.in, h)) p.wake = true;
      l.recvq.pop_front();
      continue;
    }
    if (op->group) {  // the sender chose the copy protocol after all (canReduceGroup said it would not)
      peerGone(p, zpInternalError,
               "rank " + std::to_string(p.rank) + " sent fragments where a single-copy transfer was expected", true);
      return true;
    }
    if (h->type == kRts) {
      // Single copy: pull the sender's bytes straight into the receive
      // buffer; or, for a reducing receive, a slice at a time into a buffer
      // that stays in cache, reduced into the receive buffer at once. At
      // most kReadPiece per pass: the offer stays at the ring's head and
      // op->progressed says where the next pass goes on.
      size_t done = op->progressed;
      const size_t until = std::min(op->bytes, done + kReadPiece);
      int err = 0;
      const size_t slice = op->reduce ? kReduceSlice - kReduceSlice % op->reduce->elemSize : kReadPiece;
      thread_local std::vector<char> sliceBuf;
      if (op->reduce && sliceBuf.size() < slice) sliceBuf.resize(slice);
      while (done < until && !err) {
        const size_t want = std::min(slice, op->bytes - done);
        char* to = op->reduce ? sliceBuf.data() : (char*)op->buf + done;
        err = readPeer(p.pid, to, h->addr + done, want);
        if (err) break;
        if (op->reduce) op->reduce->fn((char*)op->buf + done, (const char*)op->reduceSrc + done, to, want);
        done += want;
      }
      if (!err && done < op->bytes) {
        op->progressed = done;
        break;  // this lane's next records wait behind this message anyway
      }
      uint64_t seq = h->seq;
      if (ringPop(l.in, h)) p.wake = true;
      l.recvq.pop_front();
      if (err) {
        std::string why;
        const zpResult_t status = readFailed(p, op->bytes, err, &why);
        sendCtrl(p, kFin, seq, zpSystemError, 0, why, lane);
        op->finish(status, why);
      } else {
        sendCtrl(p, kFin, seq, zpSuccess, 0, {}, lane);
        op->progressed = op->bytes;
        op->finish(zpSuccess);
      }
      continue;
    }
    // A data fragment: bounds were fixed by the matching receive.
    if (recordOffset(h) != op->progressed || recordOffset(h) + dataLen > op->bytes) {
      peerGone(p, zpInternalError, "corrupt fragment from rank " + std::to_string(p.rank), true);
      return true;
    }
    takeFragment(p, l, op, h, payloadOf(h) + metaLen, dataLen, recordOffset(h));
    if (op->progressed == op->bytes) {
      l.recvq.pop_front();
      op->finish(zpSuccess);
    }
  }
  return did;
}

bool ShmTransport::progressSend(Peer& p, int lane) {
  Lane& l = p.lane[lane];
  bool did = false;
  uint64_t need = 0;
  while (!l.sendq.empty()) {
    Op* op = l.sendq.front();
    if (rendezvous(p, op)) {
      if (op->metaBytes) {  // the meta goes ahead of the offer, on its own
        need = recordBytes(op->metaBytes);
        MsgHdr* h = claimOpRecord(l.out, need, kMeta, op);
        if (!h) goto full;
        h->len = op->metaBytes;
        memcpy(payloadOf(h), op->meta, op->metaBytes);
        ringPublish(l.out);
        op->metaBytes = 0;  // sent
        p.dirty = did = true;
      }
      need = recordBytes(0);
      MsgHdr* h = claimOpRecord(l.out, need, kRts, op);
      if (!h) goto full;
      h->addr = (uint64_t)(uintptr_t)op->buf;
      ringPublish(l.out);
      gSingleCopySends++;
      l.finWait.push_back(op);
      l.sendq.pop_front();
      p.dirty = did = true;
      continue;
    }
    // Fragments through the ring; a zero-byte message is one empty fragment.
    do {
      if (!writeFragment(l, op, &need)) goto full;
      p.dirty = did = true;
    } while (op->progressed < op->bytes);
    l.sendq.pop_front();
    op->finish(zpSuccess);
  }
  return did;
full:
  // Ask the receiver to ring when it frees room, then look once more in case
  // it did so before seeing the flag.
  l.out.ctl->producerWaiting.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);  // see ringPop
  if (ringClaim(l.out, need)) did = true;
  return did;
}

bool ShmTransport::rendezvous(const Peer& p, const Op* op) const {
  // A block its receiver reduces goes through the ring from
  // ZP_SHM_REDUCE_COPY on: the copies pipeline (this rank copies while the
  // receiver reduces), which beats the receiver reading and reducing alone
  // (docs/collectives.md, "Shared memory").
  return p.cma && op->bytes >= ctx_.cfg->shmEagerBytes &&
         !(op->reducedByPeer && op->bytes >= ctx_.cfg->shmReduceCopyFrom);
}

void ShmTransport::notify(Peer& p) {
  const bool force = p.wake;
  p.dirty = p.wake = false;
  // The records written are published before `sleeping` is read, and a
  // sleeper counts itself before it looks at its rings once more (sleep):
  // either it sees the records or this rank sees it sleeping.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (force || p.seg->sleeping.load(std::memory_order_relaxed) || p.seg->pollers.load(std::memory_order_relaxed))
    wakePeer(p);
}

bool ShmTransport::writeFragment(Lane& l, Op* op, uint64_t* need) {
  // The first fragment carries the send's meta ahead of its data.
  const uint32_t metaLen = metaLenOf(op);  // 0 once sent
  const size_t len = std::min(op->bytes - op->progressed, fragMax_ - std::min<size_t>(metaLen, fragMax_));
  // A message that fits one record goes whole (kWhole: 16 bytes more in its first line).
  const bool whole = op->progressed == 0 && len == op->bytes;
  *need = whole ? wholeRecordBytes(metaLen + len) : recordBytes(metaLen + len);
  MsgHdr* h = claimOpRecord(l.out, *need, whole ? kWhole : kData, op);
  if (!h) return false;
  h->len = (uint32_t)(metaLen + len);
  h->metaLen = metaLen;
  if (!whole) h->offset = op->progressed;
  char* payload = (char*)h + (whole ? kWholePayload : kPayload);
  if (metaLen) memcpy(payload, op->meta, op->metaBytes);
  if (len) ringCopy(payload + metaLen, (const char*)op->buf + op->progressed, len);
  ringPublish(l.out);
  op->metaBytes = 0;
  op->progressed += len;
  return true;
}

void ShmTransport::takeFragment(Peer& p, Lane& l, Op* op, MsgHdr* h, const char* data, uint32_t dataLen, uint64_t at) {
  if (dataLen && op->reduce)  // fragments hold whole elements (fragMax_ and metaLen are multiples of 8)
    op->reduce->fn((char*)op->buf + at, (const char*)op->reduceSrc + at, data, dataLen);
  else if (dataLen)
    ringCopy((char*)op->buf + at, data, dataLen);  // buf may be NULL when empty
  op->progressed += dataLen;
  if (ringPop(l.in, h)) p.wake = true;
}

bool ShmTransport::takeWhole(Peer& p, Op* op, MsgHdr* h, uint64_t& seq, uint64_t arrivedUs) {
  // A kWhole record, or a data record that holds all of it.
  const bool whole = h->type == kWhole;
  if (!whole && h->type != kData) return false;
  const uint32_t metaLen = h->metaLen;
  if (h->seq != seq || h->kind != (uint32_t)op->kind || h->len - metaLen != op->bytes ||
      (!whole && (h->offset != 0 || h->total != op->bytes)))
    return false;  // out of order, of another size, or in several records: progressRecv says what
  const char* payload = (const char*)h + (whole ? kWholePayload : kPayload);
  if (metaLen && op->metaBytes) memcpy(op->meta, payload, std::min<uint32_t>(metaLen, op->metaBytes));
  op->seq = seq++;
  op->noteArrival(arrivedUs);
  takeFragment(p, p.lane[0], op, h, payload + metaLen, (uint32_t)op->bytes, 0);
  op->finish(zpSuccess);
  countMovedNow();
  return true;
}

void ShmTransport::moveNow(const std::vector<Op*>& ops, std::vector<uint64_t>& sendSeq, std::vector<uint64_t>& recvSeq) {
  // Only with nothing queued with any peer: a queued op goes first (each
  // pair's messages stay in order) and must keep moving, which the general
  // progress does.
  if (!connected_ || busy()) return;
  // A peer this call can use now: not gone, its control records read (a
  // goodbye among them fails a send instead of filling its ring).
  auto usable = [&](Peer* p, const Op* op) {
    return p && !p->gone && !p->bye && p->ctrlBacklog.empty() && !ringPeek(p->inCtrl) && !p->lane[0].discarding &&
           op->lane == kLaneCalls && !op->group && !op->routed && !op->stream;
  };
  bool sendsLeft = false;
  for (Op* op : ops) {
    if (!op->isSend || op->peer == ctx_.rank) continue;
    Peer* p = peer(op->peer);
    uint64_t need;
    op->seq = p ? sendSeq[op->peer] : 0;
    if (!usable(p, op) || rendezvous(*p, op) || metaLenOf(op) + op->bytes > fragMax_ ||
        !writeFragment(p->lane[0], op, &need)) {  // no room: post() waits for it
      sendsLeft = true;
      break;
    }
    sendSeq[op->peer]++;
    p->dirty = true;
    op->finish(zpSuccess);
    countMovedNow();
  }
  for (Peer& p : peers_)
    if (p.dirty || p.wake) notify(p);
  // Receives in order; the first whose record has not come is polled for.
  // A record found before the poll's first look at the clock (16 polls, a
  // few hundred nanoseconds; a yielding poll looks at every poll) came
  // before this rank waited measurably: it
  // is noted as arrived at once (Op::kArrivedAtOnce); one found later, at
  // the poll's last look at the clock. Either way no clock is read between
  // the record and the reply a peer may be waiting for.
  uint64_t until = 0, lastLook = Op::kArrivedAtOnce;
  bool yielding = false;
  for (size_t i = 0, polls = 0; i < ops.size();) {
    Op* op = ops[i];
    if (op->isSend || op->peer == ctx_.rank) {
      i++;
      continue;
    }
    Peer* p = peer(op->peer);  // null for a receive from any source: the receives stop there
    if (!usable(p, op)) break;
    if (MsgHdr* h = ringPeek(p->lane[0].in)) {
      if (!takeWhole(*p, op, h, recvSeq[op->peer], lastLook)) break;
      if (polls > 0 && yielding) gTakenYielding.fetch_add(1, std::memory_order_relaxed);
      if (p->wake) notify(*p);
      i++;
      continue;
    }
    // No waiting while sends of this call are still to be posted (their
    // receivers may be the very ranks this one waits for).
    if (sendsLeft) break;
    // Where ranks outnumber cores, only where the general wait would poll
    // yielding (its plan, spinPlan: the tasks waiting for a core are the
    // node's own ranks), and then each poll yields the core and looks at
    // the clock (a yield takes longer than the look): the peer that must
    // answer may be waiting for this core.
    if (oversubscribed_ && !yielding) {
      const SpinPlan plan = spinPlan();
      if (plan.us <= 0 || !plan.yield) {
        gYieldingDeclined.fetch_add(1, std::memory_order_relaxed);
        break;
      }
      yielding = true;
      until = stampUs() + std::min(plan.us, kMoveNowPollUs);
    }
    if ((++polls & 15) == 0 || yielding) {
      const uint64_t stamp = stampUs();
      if (until == 0) {
        // Nor, after a first few polls, where other tasks fill the cores
        // and polling cannot pay: the job's ranks outnumber the cores, or a
        // peer is on this rank's CPU (planSpin says why).
        const SpinInputs in = loadInputs();
        if (othersFillTheCores(in) && (!mayPollAmongOthers(in) || peerOnMyCore())) break;
        until = stamp + kMoveNowPollUs;
      }
      if (stamp > until) break;
      op->noteEntered(stamp);
      lastLook = stamp;
    }
    if (yielding)
      sched_yield();
    else
      cpuRelax();
  }
}

}  // namespace zp
