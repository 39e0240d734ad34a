#include "src/route/relay.h"

#include <algorithm>
#include <cstring>

#include "src/core/log.h"
#include "transport/shm/shm_transport.h"
#include "transport/ucx/ucx_transport.h"

namespace zp {

namespace {
constexpr uint64_t kRelayMagic = 0x5a5052454c415931ull;
// Staging slots per pool; with 512 KiB chunks, 8 MiB per pool.
constexpr int kSlotsPerPool = 16;
// Chunks of this rank's own sends in flight per first hop.
constexpr int kWindow = 128;
enum Pool { kOutbound = 0, kInbound = 1 };
}  // namespace

struct Relay::Chunk {
  RelayHeader hdr{};
  Op hdrOp, dataOp;
  char* data = nullptr;           // where its bytes are
  std::unique_ptr<char[]> own;    // an early chunk's bytes at its destination
  int from = -1;                  // the hop it comes from (receiving)
  InRecv* standing = nullptr;     // the shared-memory header receive it came through
  int pool = -1;                  // the pool of its slot, if data is one
  Op* user = nullptr;             // the routed send it belongs to (at the source)
  int firstHop = -1;              // at the source: where it goes first
  // Waiting for a staging slot, receiving its bytes, sending them on, or
  // dead (its previous hop failed: the communicator is broken).
  enum class State { kWaitingSlot, kReceiving, kSending, kFailed } state = State::kWaitingSlot;
};

// A standing receive of relay headers: from one local peer, or from any
// rank of another node.
struct Relay::InRecv {
  int peer = kAnyRemotePeer;
  RelayHeader hdr{};
  Op op;
  bool posted = false;
  bool blocked = false;  // a chunk from this peer waits for a slot: the lane is held
};


Relay::Relay(Comm* comm) : c_(comm), chunkBytes_(comm->routeParams.chunkBytes) {
  relaySendSeq_.assign(c_->nranks, 0);
  relayRecvSeq_.assign(c_->nranks, 0);
  p2pSends_.assign(c_->nranks, 0);
  p2pRecvs_.assign(c_->nranks, 0);
}

void Relay::post(Op* op) {
  if (op->kind != OpKind::kP2P) {
    if (op->isSend) send(op, op->xfer, *op->pieces);
    else recv(op, op->xfer);
    return;
  }
  if (!op->isSend) {
    recv(op, p2pRecvs_[op->peer]++);
    return;
  }
  std::vector<Piece> pieces;
  if (op->bytes) {
    // The node's NIC queues: what each NIC's owners have posted and not yet sent.
    std::vector<uint64_t> queued;
    for (int r = 0; r < c_->nranks; r++)
      if (c_->isLocal(r)) {
        if ((int)queued.size() <= c_->rail[r]) queued.resize(c_->rail[r] + 1, 0);
        queued[c_->rail[r]] += c_->shm->netQueued(r);
      }
    std::string why;
    if (pickPath(c_->topo, c_->rank, op->peer, op->bytes, queued, c_->routeParams, &pieces, &why) != zpSuccess) {
      op->finish(zpInternalError, "no route to rank " + std::to_string(op->peer) + ": " + why);
      return;
    }
  }
  send(op, p2pSends_[op->peer]++, pieces);
}

Relay::~Relay() = default;

Transport* Relay::via(int peer) const { return c_->route[peer]; }

char* Relay::takeSlot(bool inbound) {
  std::vector<char*>& pool = freeSlots_[inbound ? kInbound : kOutbound];
  if (slotMemory_.empty()) {
    for (int p = 0; p < 2; p++)
      for (int i = 0; i < kSlotsPerPool; i++) {
        slotMemory_.emplace_back(new char[chunkBytes_]);
        freeSlots_[p].push_back(slotMemory_.back().get());
      }
  }
  if (pool.empty()) return nullptr;
  char* s = pool.back();
  pool.pop_back();
  return s;
}

void Relay::freeSlot(char* slot, bool inbound) { freeSlots_[inbound ? kInbound : kOutbound].push_back(slot); }

void Relay::postHeaderRecvs() {
  for (auto& s : standing_) {
    if (s->posted || s->blocked) continue;
    s->op = makeOp(OpKind::kRelayHeader, false, s->peer, &s->hdr, sizeof(RelayHeader), 1);
    if (s->peer != kAnyRemotePeer) s->op.seq = relayRecvSeq_[s->peer]++;
    s->posted = true;
    if (s->peer == kAnyRemotePeer) c_->net->post(&s->op);
    else c_->shm->post(&s->op);
  }
}

void Relay::send(Op* op, uint64_t xfer, const std::vector<Piece>& pieces) {
  start();
  const int me = c_->rank;
  int count = 0;
  auto add = [&](uint64_t offset, uint64_t bytes, const Piece& pc) {
    auto ch = std::make_unique<Chunk>();
    RelayHeader& h = ch->hdr;
    h.magic = kRelayMagic;
    h.kind = (uint32_t)op->kind;
    h.src = me;
    h.dst = op->peer;
    h.dstProxy = pc.dstProxy;
    h.xfer = xfer;
    h.total = op->bytes;
    h.offset = offset;
    h.bytes = bytes;
    ch->data = (char*)op->buf + offset;
    ch->user = op;
    ch->firstHop = pc.srcProxy == me ? pc.dstProxy : pc.srcProxy;
    pending_[ch->firstHop].push_back(std::move(ch));
    count++;
  };
  if (op->bytes == 0) {
    Piece direct;
    direct.srcProxy = me;
    direct.dstProxy = op->peer;
    add(0, 0, direct);
  }
  for (const Piece& pc : pieces)
    for (uint64_t o = 0; o < pc.bytes; o += chunkBytes_)
      add(pc.offset + o, std::min<uint64_t>(chunkBytes_, pc.bytes - o), pc);
  ZP_TRACE(kSubNet, "rank %d: routed send of %zu bytes to rank %d: %zu pieces, %d chunks", me, op->bytes, op->peer,
           pieces.size(), count);
  if (count == 0) {
    op->finish(zpInternalError, "the route to rank " + std::to_string(op->peer) + " has no pieces");
    return;
  }
  sendsLeft_[op] = count;  // the chunks start in pump(), so none can finish before this
  pump();
}

// Starts this rank's pending chunks, at most kWindow per first hop: chunks
// travel eagerly (see the UCX transport), so the window is what bounds the
// bytes a receiver may have to hold before it has asked for them.
bool Relay::pump() {
  bool moved = false;
  for (auto& [hop, queue] : pending_)
    while (!queue.empty() && inFlight_[hop] < kWindow) {
      Chunk* ch = queue.front().get();
      chunks_.push_back(std::move(queue.front()));
      queue.pop_front();
      inFlight_[hop]++;
      sendChunk(ch, hop);
      moved = true;
    }
  return moved;
}

void Relay::recv(Op* op, uint64_t xfer) {
  start();
  Key key(op->peer, (uint32_t)op->kind, xfer);
  Delivery& d = deliveries_[key];
  d.op = op;
  for (auto& ch : d.early)
    if (accept(d, ch->hdr)) memcpy((char*)op->buf + ch->hdr.offset, ch->data, ch->hdr.bytes);
  d.early.clear();
  finishDelivery(key);
}

// Checks a chunk against the posted receive; a mismatch fails it.
bool Relay::accept(Delivery& d, const RelayHeader& h) {
  Op* op = d.op;
  if (d.failed) return false;
  if (h.total == op->bytes && h.offset + h.bytes <= op->bytes) return true;
  d.failed = true;
  op->finish(zpInvalidUsage, std::string(opKindName(op->kind)) + ": rank " + std::to_string(h.src) + " sends " +
                                 std::to_string(h.total / op->typeSize) + " elements to rank " +
                                 std::to_string(c_->rank) + " but rank " + std::to_string(c_->rank) + " expects " +
                                 std::to_string(op->bytes / op->typeSize));
  return false;
}

// Finishes a receive whose bytes are all in, and forgets a delivery that
// has nothing more to come.
void Relay::finishDelivery(const Key& key) {
  auto it = deliveries_.find(key);
  Delivery& d = it->second;
  if (!d.op) return;
  if (!d.failed && d.seen && d.got == d.op->bytes && !d.op->done) {
    d.op->progressed = d.op->bytes;
    d.op->finish(zpSuccess);
  }
  if (d.op->done && (!d.failed || (d.seen && d.got == d.total))) deliveries_.erase(it);
}

void Relay::sendChunk(Chunk* ch, int to) {
  RelayHeader& h = ch->hdr;
  h.hop = c_->rank;
  uint64_t hdrSeq = nextSeq(to);
  h.dataSeq = nextSeq(to);
  ch->hdrOp = makeOp(OpKind::kRelayHeader, true, to, &h, sizeof(h), 1);
  ch->hdrOp.seq = hdrSeq;
  ch->dataOp = makeOp(OpKind::kRelayData, true, to, ch->data, h.bytes, 1);
  ch->dataOp.seq = h.dataSeq;
  ch->state = Chunk::State::kSending;
  if (!c_->isLocal(to)) c_->shm->addNetQueued((int64_t)h.bytes);
  via(to)->post(&ch->hdrOp);
  via(to)->post(&ch->dataOp);
}

// Finds where a chunk's bytes go and posts their receive; false when it
// must wait for a staging slot.
bool Relay::placeChunk(Chunk* ch) {
  const RelayHeader& h = ch->hdr;
  if (h.dst == c_->rank) {
    Delivery& d = deliveries_[Key(h.src, h.kind, h.xfer)];
    d.seen = true;
    d.total = h.total;
    if (d.op && accept(d, h)) {
      ch->data = (char*)d.op->buf + h.offset;
    } else {
      ch->own.reset(new char[std::max<uint64_t>(h.bytes, 1)]);
      ch->data = ch->own.get();
    }
  } else {
    bool inbound = c_->isLocal(h.dst);
    char* slot = takeSlot(inbound);
    if (!slot) return false;
    ch->data = slot;
    ch->pool = inbound ? kInbound : kOutbound;
  }
  ch->dataOp = makeOp(OpKind::kRelayData, false, ch->from, ch->data, h.bytes, 1);
  ch->dataOp.seq = h.dataSeq;
  ch->state = Chunk::State::kReceiving;
  if (ch->standing) relayRecvSeq_[ch->from]++;  // the lane's next message is the data
  via(ch->from)->post(&ch->dataOp);
  if (ch->standing) ch->standing->blocked = false;
  return true;
}

void Relay::onHeader(const RelayHeader& h, int from, InRecv* standing) {
  if (h.magic != kRelayMagic || h.src < 0 || h.src >= c_->nranks || h.dst < 0 || h.dst >= c_->nranks ||
      h.hop != (from == kAnyRemotePeer ? h.hop : from) || h.bytes > chunkBytes_ || h.offset + h.bytes > h.total) {
    c_->setAsyncError(zpInternalError, "rank " + std::to_string(c_->rank) + ": a corrupt relay header came from rank " +
                                           std::to_string(h.hop));
    return;
  }
  auto ch = std::make_unique<Chunk>();
  ch->hdr = h;
  ch->from = h.hop;
  ch->standing = from == kAnyRemotePeer ? nullptr : standing;
  Chunk* raw = ch.get();
  chunks_.push_back(std::move(ch));
  if (!placeChunk(raw)) {
    if (raw->standing) raw->standing->blocked = true;
    waitingSlot_[c_->isLocal(h.dst) ? kInbound : kOutbound].push_back(raw);
  }
}

void Relay::chunkArrived(std::list<std::unique_ptr<Chunk>>::iterator it) {
  Chunk* ch = it->get();
  const RelayHeader& h = ch->hdr;
  if (h.dst != c_->rank) {
    // A proxy: on to the destination if it is on this node, else over the
    // network to the destination's proxy.
    sendChunk(ch, c_->isLocal(h.dst) ? h.dst : h.dstProxy);
    return;
  }
  Key key(h.src, h.kind, h.xfer);
  Delivery& d = deliveries_.at(key);
  d.got += h.bytes;
  std::unique_ptr<Chunk> mine = std::move(*it);
  chunks_.erase(it);
  if (!d.op) {
    d.early.push_back(std::move(mine));  // kept until the receive is posted
    return;
  }
  // Placed before the receive was posted: copy it in now.
  if (ch->own && accept(d, h)) memcpy((char*)d.op->buf + h.offset, ch->data, h.bytes);
  finishDelivery(key);
}

void Relay::chunkSent(Chunk* ch) {
  const RelayHeader& h = ch->hdr;
  if (!c_->isLocal(ch->hdrOp.peer)) c_->shm->addNetQueued(-(int64_t)h.bytes);
  if (ch->pool >= 0) freeSlot(ch->data, ch->pool == kInbound);
  if (Op* op = ch->user) {
    inFlight_[ch->firstHop]--;
    zpResult_t st = ch->hdrOp.status != zpSuccess ? ch->hdrOp.status : ch->dataOp.status;
    if (st != zpSuccess && op->status == zpSuccess) {
      op->status = st;
      op->error = ch->hdrOp.status != zpSuccess ? ch->hdrOp.error : ch->dataOp.error;
    }
    auto it = sendsLeft_.find(op);
    if (--it->second == 0) {
      sendsLeft_.erase(it);
      if (op->status == zpSuccess) op->progressed = op->bytes;
      op->finish(op->status, op->error);
    }
  }
}

// Posts the standing header receives, once: from then on this rank relays.
void Relay::start() {
  if (started_) return;
  started_ = true;
  for (int r = 0; r < c_->nranks; r++)
    if (r != c_->rank && c_->isLocal(r)) {
      standing_.push_back(std::make_unique<InRecv>());
      standing_.back()->peer = r;
    }
  if (c_->net) standing_.push_back(std::make_unique<InRecv>());
  postHeaderRecvs();
}

bool Relay::progress() {
  bool moved = false;
  start();
  for (auto& s : standing_) {
    if (!s->posted || !s->op.done) continue;
    s->posted = false;
    moved = true;
    if (s->op.status != zpSuccess) {
      s->blocked = true;  // the peer left or the communicator broke: nothing more comes
      continue;
    }
    onHeader(s->hdr, s->peer, s.get());
  }
  // Chunks waiting for a slot, in arrival order per pool.
  for (int p = 0; p < 2; p++)
    while (!waitingSlot_[p].empty() && !freeSlots_[p].empty()) {
      placeChunk(waitingSlot_[p].front());
      waitingSlot_[p].pop_front();
      moved = true;
    }
  for (auto it = chunks_.begin(); it != chunks_.end();) {
    auto cur = it++;  // the chunk may leave the list
    Chunk* ch = cur->get();
    if (ch->state == Chunk::State::kSending && ch->hdrOp.done && ch->dataOp.done) {
      moved = true;
      chunkSent(ch);
      chunks_.erase(cur);
    } else if (ch->state == Chunk::State::kReceiving && ch->dataOp.done) {
      moved = true;
      if (ch->dataOp.status == zpSuccess) {
        chunkArrived(cur);
        continue;
      }
      // The communicator is broken; dropOps cleans up.
      if (ch->pool >= 0) freeSlot(ch->data, ch->pool == kInbound);
      ch->pool = -1;
      ch->state = Chunk::State::kFailed;
    }
  }
  moved |= pump();
  postHeaderRecvs();
  return moved;
}

bool Relay::busy() const {
  if (!chunks_.empty() || !sendsLeft_.empty()) return true;
  for (auto& kv : deliveries_)
    if (kv.second.op && !kv.second.op->done) return true;
  return false;
}

std::vector<int> Relay::waitingOn() const {
  std::vector<int> out;
  for (auto& kv : deliveries_)
    if (kv.second.op && !kv.second.op->done) out.push_back(std::get<0>(kv.first));
  return out;
}

void Relay::dropOps(zpResult_t status, const std::string& why) {
  for (auto& kv : sendsLeft_) kv.first->finish(status, why);
  for (auto& kv : deliveries_)
    if (kv.second.op) kv.second.op->finish(status, why);
  sendsLeft_.clear();
  deliveries_.clear();
  chunks_.clear();
  pending_.clear();
  inFlight_.clear();
  for (auto& q : waitingSlot_) q.clear();
  for (int p = 0; p < 2; p++) {
    freeSlots_[p].clear();
    for (size_t i = 0; i < slotMemory_.size(); i++)
      if ((int)(i / kSlotsPerPool) == p) freeSlots_[p].push_back(slotMemory_[i].get());
  }
  for (auto& s : standing_) {
    s->posted = false;
    s->blocked = true;
  }
}

}  // namespace zp
