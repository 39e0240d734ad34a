#include "transport/relay/relay.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "src/core/log.h"
#include "transport/relay/relay_chunk.h"

namespace zp {

Relay::Relay(const TransportContext& ctx, CarrierTransport* shm, CarrierTransport* net, Routing* routing)
    : ctx_(ctx), shm_(shm), net_(net), routing_(routing), chunkBytes_(routing->chunkBytes()) {
  relaySendSeq_.assign(ctx_.nranks, 0);
  relayRecvSeq_.assign(ctx_.nranks, 0);
  p2pSends_.assign(ctx_.nranks, 0);
  p2pRecvs_.assign(ctx_.nranks, 0);
  for (int r = 0; r < ctx_.nranks; r++) local_.push_back(ctx_.sameNode(r, ctx_.rank));
  cameVia_.assign(ctx_.nranks, Way{});
}

void Relay::post(Op* op) {
  const RoutedXfer* rx = op->routed;
  if (rx && (!op->isSend || rx->chunks)) {
    if (op->isSend) send(op, rx->id, *rx->chunks);
    else recv(op, rx->id);
    return;
  }
  if (!rx && op->kind != OpKind::kP2P) {
    op->finish(zpInternalError, std::string("the relay got a ") + opKindName(op->kind) + " op with no transfer id");
    return;
  }
  // A point-to-point op, or a collective's op with no plan (alltoallv's count exchange).
  uint64_t xfer = rx ? rx->id : 0;
  if (!op->isSend) {
    recv(op, rx ? xfer : msgid::plainXfer(p2pRecvs_[op->peer]++));
    return;
  }
  std::vector<RouteChunk> chunks;
  std::string why;
  if (op->bytes && !pickChunks(op->peer, op->bytes, &chunks, &why)) {
    op->finish(zpRemoteError, "no route to rank " + std::to_string(op->peer) + ": " + why);
    return;
  }
  send(op, rx ? xfer : msgid::plainXfer(p2pSends_[op->peer]++), chunks);
}

bool Relay::arrived(int peer, uint64_t, size_t* bytes) {
  auto it = deliveries_.find(Key(peer, (uint32_t)OpKind::kP2P, msgid::plainXfer(p2pRecvs_[peer])));
  if (it == deliveries_.end() || !it->second.seen || it->second.op) return false;
  *bytes = it->second.total;
  return true;
}

void Relay::sendStatus(int peer, uint64_t seq, zpResult_t status, const std::string& text) {
  if (routing_->directAlive(peer)) via(peer)->sendStatus(peer, seq, status, text);
  else sendControl(peer, seq, status, text);
}

bool Relay::onControl(int peer, uint64_t seq, const std::string& text) {
  switch (seq) {
    case kSeqNicDown: routing_->heardNicDown(text); return true;
    case kSeqRelayAck: onAck(peer, text); return true;
    case kSeqLeaving: onLeaving(peer, text); return true;
    case kSeqRailView: routing_->heardRailNews(peer, text); return true;
    case kSeqLeftDone: doneFrom_.insert(peer); return true;
    default: return false;
  }
}

void Relay::sayLeaving() {
  if (leaving_) return;
  leaving_ = true;
  // Each peer hears how many point-to-point transfers this rank sent it:
  // receives of later ones fail there at once (onLeaving).
  const int me = ctx_.rank;
  for (int p = 0; p < ctx_.nranks; p++)
    if (p != me && routing_->directAlive(p)) via(p)->sendStatus(p, kSeqLeaving, zpSuccess, std::to_string(p2pSends_[p]));
}

void Relay::onLeaving(int peer, const std::string& text) {
  left_.insert(peer);
  routing_->proxyLeft(peer);
  owedDone_.insert(peer);
  answerLeavers();
  char* end = nullptr;
  const unsigned long long sent = strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end) return;  // a count is all it may say
  leftSent_[peer] = sent;
  // Its sends were all acknowledged before it came to destroy, so every
  // chunk of them is here: a receive of a later one waits for a message
  // that will never come.
  for (auto it = deliveries_.begin(); it != deliveries_.end();) {
    Delivery& d = it->second;
    const Key& k = it->first;
    if (std::get<0>(k) == peer && std::get<1>(k) == (uint32_t)OpKind::kP2P && std::get<2>(k) >= sent && d.op &&
        !d.op->done && !d.seen && d.claimed.empty() && d.early.empty()) {
      d.op->finish(zpRemoteError, neverSent(peer));
      it = deliveries_.erase(it);
    } else {
      ++it;
    }
  }
}

void Relay::leave() {
  sayLeaving();
  for (int p = 0; p < ctx_.nranks; p++)
    if (p != ctx_.rank && routing_->directAlive(p)) via(p)->sendStatus(p, kSeqLeftDone, zpSuccess, "");
}

bool Relay::onPathThrough(int rank) const {
  for (const auto& kv : sends_) {
    if (std::get<0>(kv.first) == rank && kv.second.unacked > 0) return true;
    for (const auto& c : kv.second.chunks)
      if (!c.second.acked && (c.second.srcProxy == rank || c.second.dstProxy == rank)) return true;
  }
  return false;
}

void Relay::answerLeavers() {
  for (auto it = owedDone_.begin(); it != owedDone_.end();) {
    const int peer = *it;
    if (onPathThrough(peer)) {
      ++it;
      continue;
    }
    if (routing_->directAlive(peer)) via(peer)->sendStatus(peer, kSeqLeftDone, zpSuccess, "");
    it = owedDone_.erase(it);
  }
}

std::string Relay::neverSent(int peer) const {
  return "rank " + std::to_string(peer) + " destroyed the communicator without sending this message";
}

std::vector<int> Relay::stayFor() {
  const int me = ctx_.rank;
  sayLeaving();
  // Ranks that may still send a chunk through this one, else those it
  // still relays for. A rank of this node that relies on proxies (a NIC it
  // needs is down) may have no path but through this one and needs it until
  // it comes to destroy too, whatever it has on a path now: NCCL makes
  // ncclCommDestroy an intra-node collective for the same reason; here only
  // the ranks that need it are waited for, so with every NIC up ranks that
  // finish early still leave at once.
  std::vector<int> out;
  for (int p = 0; p < ctx_.nranks; p++)
    if (p != me && routing_->directAlive(p) &&
        (!doneFrom_.count(p) || (local_[p] && !left_.count(p) && routing_->reliesOnProxies(p))))
      out.push_back(p);
  if (out.empty()) out = holdingFor();
  if (out.empty()) out = shm_->waitingOn(kLaneStanding);
  return out;
}

std::string Relay::describe(int peer) const {
  return "relay over the node's NICs (" + via(peer)->describe(peer) + " when direct)";
}

// A path for bytes from this rank to dst from the node's NIC queues (what
// each NIC's owners have posted and not yet sent, which the routing layer
// keeps) and `queued` on top.
bool Relay::pickChunks(int dst, uint64_t bytes, std::vector<RouteChunk>* chunks, std::string* why,
                       std::vector<uint64_t> queued) {
  return routing_->pickPath(ctx_.rank, dst, bytes, queued, chunks, why);
}

void Relay::queueChunk(std::unique_ptr<Chunk> ch, int srcProxy, int dstProxy) {
  const int me = ctx_.rank;
  ch->hdr.dstProxy = dstProxy;
  ch->hdr.srcProxy = srcProxy;
  ch->srcProxy = srcProxy;
  ch->firstHop = srcProxy == me ? dstProxy : srcProxy;
  if (ch->sx) ch->sx->inBuffer++;
  pending_[ch->firstHop].push_back(std::move(ch));
}

void Relay::sendControl(int peer, uint64_t seq, zpResult_t status, const std::string& text) {
  start();
  std::string payload = kControlMark + text;
  std::vector<RouteChunk> chunks;
  std::string why;
  if (!pathBack(peer, &chunks) && (!pickChunks(peer, payload.size(), &chunks, &why) || chunks.size() != 1)) {
    ZP_INFO(kSubNet, "rank %d: no path for a control message to rank %d: %s", ctx_.rank, peer, why.c_str());
    return;
  }
  auto ch = std::make_unique<Chunk>();
  RelayHeader& h = ch->hdr;
  h.magic = kRelayMagic;
  h.kind = (uint32_t)OpKind::kControl;
  h.src = ctx_.rank;
  h.dst = peer;
  h.status = status;
  h.xfer = msgid::plainXfer(seq);
  h.total = h.bytes = payload.size();
  ch->own.reset(new char[payload.size()]);
  memcpy(ch->own.get(), payload.data(), payload.size());
  ch->data = ch->own.get();
  queueChunk(std::move(ch), chunks[0].srcProxy, chunks[0].dstProxy);
  pump();
}

// To a rank with no direct path, back the way its latest chunk came
// (cameVia_): to the proxy that took it onto the network on the peer's
// node (or the peer itself), from this rank where its own NIC reaches that
// proxy, else (this rank's NIC is down) from the local proxy that brought
// the chunk here, which the peer then reaches directly. The peer answers
// neither proxy's leaving message while the chunk is unacknowledged
// (onPathThrough), so both wait for it in zpCommDestroy, and the
// acknowledgement finds them even when every other rank of both nodes has
// come to destroy. New paths avoid every proxy that said it is leaving
// (but for a rank that relies on proxies, for which its node's stay): with
// all of a node's leaving there was no path, or one through a rank already
// gone, and the message was lost (nothing acknowledges a control message).
bool Relay::pathBack(int peer, std::vector<RouteChunk>* chunks) const {
  const Way& came = cameVia_[peer];
  if (came.srcProxy < 0) return false;
  RouteChunk c;
  c.dstProxy = came.srcProxy;
  if (routing_->pathUp(ctx_.rank, came.srcProxy)) c.srcProxy = ctx_.rank;
  else if (came.dstProxy != ctx_.rank && routing_->pathUp(came.dstProxy, came.srcProxy)) c.srcProxy = came.dstProxy;
  else return false;
  chunks->assign(1, c);
  return true;
}

Relay::~Relay() = default;

Transport* Relay::via(int peer) const {
  return isLocal(peer) ? shm_ : net_;
}

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
    s->op = Op(OpKind::kChunkHeader, false, s->peer, &s->hdr, sizeof(RelayHeader), 1);
    s->op.lane = kLaneStanding;
    if (s->peer != kAnyRemotePeer) s->op.seq = relayRecvSeq_[s->peer]++;
    s->posted = true;
    if (s->peer == kAnyRemotePeer) net_->post(&s->op);
    else shm_->post(&s->op);
  }
}

void Relay::send(Op* op, uint64_t xfer, const std::vector<RouteChunk>& chunks) {
  start();
  const int me = ctx_.rank;
  Key key(op->peer, (uint32_t)op->kind, xfer);
  if (sends_.count(key)) {
    op->finish(zpInternalError, "a routed send to rank " + std::to_string(op->peer) + " reuses transfer id " +
                                    std::to_string(xfer));
    return;
  }
  SendXfer* sx = &sends_[key];
  sx->op = op;
  sx->key = key;
  const RailView view = routing_->railView();
  // Transfers of less than a chunk take about a latency whatever the rail's
  // rate: they would only blur the estimates.
  const bool timed = op->bytes >= chunkBytes_;
  int count = 0;
  auto add = [&](uint64_t offset, uint64_t bytes, int srcProxy, int dstProxy) {
    auto ch = std::make_unique<Chunk>();
    RelayHeader& h = ch->hdr;
    h.magic = kRelayMagic;
    h.kind = (uint32_t)op->kind;
    h.src = me;
    h.dst = op->peer;
    h.xfer = xfer;
    h.total = op->bytes;
    h.offset = offset;
    h.bytes = bytes;
    h.rails = view;
    ch->data = (char*)op->buf + offset;
    ch->sx = sx;
    Sent& rec = sx->chunks[offset];
    rec.bytes = bytes;
    rec.srcProxy = srcProxy;
    rec.dstProxy = dstProxy;
    rec.timed = timed;
    if (timed) routing_->chunkQueued(srcProxy, bytes);
    sx->unacked++;
    queueChunk(std::move(ch), srcProxy, dstProxy);
    count++;
  };
  if (op->bytes == 0) add(0, 0, me, op->peer);
  for (const RouteChunk& c : chunks) add(c.offset, c.bytes, c.srcProxy, c.dstProxy);
  ZP_TRACE(kSubNet, "rank %d: routed send of %zu bytes to rank %d: %d chunks", me, op->bytes, op->peer, count);
  if (count == 0) {
    sends_.erase(key);
    op->finish(zpInternalError, "the route to rank " + std::to_string(op->peer) + " has no chunks");
    return;
  }
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
  auto left = leftSent_.find(op->peer);
  if (left != leftSent_.end() && op->kind == OpKind::kP2P && xfer >= left->second) {
    op->finish(zpRemoteError, neverSent(op->peer));
    return;
  }
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
  if (h.total == op->bytes && h.offset + h.bytes <= op->bytes) {
    op->noteArrival();  // its first chunk: the source has entered its call
    return true;
  }
  d.failed = true;
  op->finish(zpInvalidUsage, std::string(opKindName(op->kind)) + ": rank " + std::to_string(h.src) + " sends " +
                                 std::to_string(h.total / op->typeSize) + " elements to rank " +
                                 std::to_string(ctx_.rank) + " but rank " + std::to_string(ctx_.rank) + " expects " +
                                 std::to_string(op->bytes / op->typeSize));
  return false;
}

// Finishes a receive whose bytes are all in, and forgets a delivery that
// has nothing more to come.
void Relay::finishDelivery(const Key& key) {
  auto it = deliveries_.find(key);
  Delivery& d = it->second;
  if (!d.op) return;
  // Done when every byte is in and no copy is still being written into the buffer.
  if (!d.failed && d.seen && d.got == d.op->bytes && d.claimed.empty() && !d.op->done) {
    d.op->progressed = d.op->bytes;
    d.op->finish(zpSuccess);
  }
  if (d.op->done && d.claimed.empty() && (!d.failed || (d.seen && d.got == d.total))) {
    remember(key, d.total);
    deliveries_.erase(it);
  }
}

void Relay::remember(const Key& key, uint64_t total) {
  finished_[key] = total;
  finishedOrder_.push_back(key);
  if (finishedOrder_.size() > kFinishedKept * (size_t)ctx_.nranks) {
    finished_.erase(finishedOrder_.front());
    finishedOrder_.pop_front();
  }
}

void Relay::sendChunk(Chunk* ch, int to) {
  RelayHeader& h = ch->hdr;
  h.hop = ctx_.rank;
  const msgid::ChunkSeqs seqs = msgid::chunkSeqs(relaySendSeq_[to]++);
  const uint64_t hdrSeq = seqs.header;
  h.dataSeq = seqs.data;
  ch->hdrOp = Op(OpKind::kChunkHeader, true, to, &h, sizeof(h), 1);
  ch->hdrOp.lane = kLaneStanding;
  ch->hdrOp.seq = hdrSeq;
  ch->dataOp = Op(OpKind::kChunkData, true, to, ch->data, h.bytes, 1);
  ch->dataOp.lane = kLaneStanding;
  ch->dataOp.seq = h.dataSeq;
  ch->state = Chunk::State::kSending;
  if (!isLocal(to)) routing_->addQueued((int64_t)h.bytes);
  via(to)->post(&ch->hdrOp);
  via(to)->post(&ch->dataOp);
}

// Finds where a chunk's bytes go and posts their receive; false when it
// must wait for a staging slot.
bool Relay::placeChunk(Chunk* ch) {
  const RelayHeader& h = ch->hdr;
  if (h.dst == ctx_.rank) {
    Key key(h.src, h.kind, h.xfer);
    Delivery* d = nullptr;
    if (h.kind == (uint32_t)OpKind::kControl || finished_.count(key)) {
      ch->dup = h.kind != (uint32_t)OpKind::kControl;
    } else {
      d = &deliveries_[key];
      d->seen = true;
      d->total = h.total;
      ch->dup = d->have.count(h.offset) > 0;
    }
    // Only the first copy of a chunk goes straight into the receive buffer:
    // a copy sent again lands aside and is copied in if it wins.
    if (d && !ch->dup && d->op && !d->claimed.count(h.offset) && accept(*d, h)) {
      ch->data = (char*)d->op->buf + h.offset;
      ch->claimed = true;
      d->claimed.insert(h.offset);
    } else {
      ch->own.reset(new char[std::max<uint64_t>(h.bytes, 1)]);
      ch->data = ch->own.get();
    }
  } else {
    bool inbound = isLocal(h.dst);
    char* slot = takeSlot(inbound);
    if (!slot) return false;
    ch->data = slot;
    ch->pool = inbound ? kInbound : kOutbound;
  }
  ch->dataOp = Op(OpKind::kChunkData, false, ch->from, ch->data, h.bytes, 1);
  ch->dataOp.lane = kLaneStanding;
  ch->dataOp.seq = h.dataSeq;
  ch->state = Chunk::State::kReceiving;
  if (ch->standing) relayRecvSeq_[ch->from]++;  // the lane's next message is the data
  via(ch->from)->post(&ch->dataOp);
  if (ch->standing) ch->standing->blocked = false;
  return true;
}

void Relay::onHeader(const RelayHeader& h, int from, InRecv* standing) {
  if (h.magic != kRelayMagic || h.src < 0 || h.src >= ctx_.nranks || h.dst < 0 || h.dst >= ctx_.nranks ||
      h.srcProxy < 0 || h.srcProxy >= ctx_.nranks ||
      h.hop != (from == kAnyRemotePeer ? h.hop : from) || h.bytes > chunkBytes_ || h.offset + h.bytes > h.total) {
    ctx_.sink->setAsyncError(zpInternalError, "rank " + std::to_string(ctx_.rank) + ": a corrupt relay header came from rank " +
                                           std::to_string(h.hop));
    return;
  }
  routing_->heardRailView(h.src, h.dst, h.rails);
  auto ch = std::make_unique<Chunk>();
  ch->hdr = h;
  ch->from = h.hop;
  ch->standing = from == kAnyRemotePeer ? nullptr : standing;
  Chunk* raw = ch.get();
  chunks_.push_back(std::move(ch));
  if (!placeChunk(raw)) {
    if (raw->standing) raw->standing->blocked = true;
    waitingSlot_[isLocal(h.dst) ? kInbound : kOutbound].push_back(raw);
  }
}

void Relay::chunkArrived(std::list<std::unique_ptr<Chunk>>::iterator it) {
  Chunk* ch = it->get();
  const RelayHeader& h = ch->hdr;
  if (h.dst != ctx_.rank) {
    // A proxy: on to the destination if it is on this node, else over the
    // network to the destination's proxy.
    sendChunk(ch, isLocal(h.dst) ? h.dst : h.dstProxy);
    return;
  }
  std::unique_ptr<Chunk> mine = std::move(*it);
  chunks_.erase(it);
  cameVia_[h.src] = Way{h.srcProxy, h.dstProxy};
  if (h.kind == (uint32_t)OpKind::kControl) {
    if (h.bytes >= 1 && ch->data[0] == kControlMark)
      ctx_.sink->onStatus(h.src, h.xfer, (zpResult_t)h.status, std::string(ch->data + 1, h.bytes - 1));
    return;
  }
  ack(h.src, h.kind, h.xfer, h.offset, h.offset + h.bytes);  // copies too: the first one's acknowledgement may be lost
  Key key(h.src, h.kind, h.xfer);
  auto dit = deliveries_.find(key);
  if (dit == deliveries_.end()) return;  // finished (or failed) meanwhile
  Delivery& d = dit->second;
  if (ch->claimed) d.claimed.erase(h.offset);
  if (ch->dup || !d.have.insert(h.offset).second) {
    finishDelivery(key);
    return;
  }
  d.got += h.bytes;
  if (!d.op) {
    d.early.push_back(std::move(mine));  // kept until the receive is posted
    return;
  }
  // Placed aside (before the receive was posted, or a copy): copy it in now.
  if (ch->own && accept(d, h)) memcpy((char*)d.op->buf + h.offset, ch->data, h.bytes);
  finishDelivery(key);
}

// A chunk whose bytes were coming over a path that went down, in the middle
// of a message: UCX cannot cancel a receive it has begun to fill, so the
// chunk (and its memory) is put aside for good and its slot replaced.
void Relay::abandon(std::list<std::unique_ptr<Chunk>>::iterator it) {
  Chunk* ch = it->get();
  if (ch->pool >= 0) {
    spareSlots_.emplace_back(new char[chunkBytes_]);
    freeSlots_[ch->pool].push_back(spareSlots_.back().get());
    ch->pool = -1;  // its slot stays with it
  }
  if (ch->claimed) {  // the source sends it again; that copy lands aside
    const RelayHeader& h = ch->hdr;
    auto dit = deliveries_.find(Key(h.src, h.kind, h.xfer));
    if (dit != deliveries_.end()) dit->second.claimed.erase(h.offset);
  }
  abandoned_.push_back(std::move(*it));
  chunks_.erase(it);
}

// A chunk that cannot go on: its path has a NIC that is down (the source
// sends it again), or it is a copy nobody needs.
void Relay::chunkLost(std::list<std::unique_ptr<Chunk>>::iterator it) {
  Chunk* ch = it->get();
  const RelayHeader& h = ch->hdr;
  if (ch->pool >= 0) freeSlot(ch->data, ch->pool == kInbound);
  if (ch->standing) ch->standing->blocked = false;
  if (ch->claimed) {
    Key key(h.src, h.kind, h.xfer);
    auto dit = deliveries_.find(key);
    if (dit != deliveries_.end()) {
      dit->second.claimed.erase(h.offset);
      finishDelivery(key);
    }
  }
  ZP_TRACE(kSubNet, "rank %d: dropped chunk %d -> %d offset %llu (its path is down)", ctx_.rank, h.src, h.dst,
           (unsigned long long)h.offset);
  chunks_.erase(it);
}

void Relay::chunkSent(Chunk* ch) {
  const RelayHeader& h = ch->hdr;
  if (!isLocal(ch->hdrOp.peer)) routing_->addQueued(-(int64_t)h.bytes);
  if (ch->pool >= 0) freeSlot(ch->data, ch->pool == kInbound);
  if (ch->firstHop >= 0) inFlight_[ch->firstHop]--;
  zpResult_t st = ch->hdrOp.status != zpSuccess ? ch->hdrOp.status : ch->dataOp.status;
  // A send cut off with its path is sent again (onPathsChanged); other
  // failures break the communicator.
  bool cut = st != zpSuccess && !routing_->directAlive(ch->hdrOp.peer);
  if (SendXfer* sx = ch->sx) {
    Op* op = sx->op;
    sx->inBuffer--;
    if (st != zpSuccess && !cut && op->status == zpSuccess) {
      op->status = st;
      op->error = ch->hdrOp.status != zpSuccess ? ch->hdrOp.error : ch->dataOp.error;
    }
    maybeFinish(sx);
  }
}

// A routed send is done when every chunk is acknowledged and none is still
// reading its buffer; or, failed, when none is.
void Relay::maybeFinish(SendXfer* sx) {
  Op* op = sx->op;
  if (sx->unacked == 0 || op->status != zpSuccess) {
    // Copies not yet started are not needed any more.
    for (auto& [hop, queue] : pending_)
      for (auto q = queue.begin(); q != queue.end();)
        if ((*q)->sx == sx) {
          q = queue.erase(q);
          sx->inBuffer--;
        } else {
          ++q;
        }
  }
  if (sx->inBuffer > 0 || (sx->unacked > 0 && op->status == zpSuccess)) return;
  if (op->status == zpSuccess) op->progressed = op->bytes;
  op->finish(op->status, op->error);
  for (auto& [offset, rec] : sx->chunks)
    if (!rec.acked && rec.timed) routing_->chunkDropped(rec.srcProxy, rec.bytes);
  sends_.erase(sx->key);
}

// Posts the standing header receives, once: from then on this rank relays.
void Relay::start() {
  if (started_) return;
  started_ = true;
  for (int r = 0; r < ctx_.nranks; r++)
    if (r != ctx_.rank && isLocal(r)) {
      standing_.push_back(std::make_unique<InRecv>());
      standing_.back()->peer = r;
    }
  if (net_) standing_.push_back(std::make_unique<InRecv>());
  postHeaderRecvs();
}

bool Relay::progress() {
  routing_->checkNic();
  for (auto& [peer, text] : routing_->tickRails()) sendStatus(peer, kSeqRailView, zpSuccess, text);
  bool moved = applyNicNews();
  moved |= moveChunks();
  if (!owedDone_.empty()) answerLeavers();
  return moved;
}

bool Relay::moveChunks() {
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
    } else if (ch->state == Chunk::State::kReceiving && !ch->dataOp.done && !routing_->directAlive(ch->from)) {
      moved = true;
      abandon(cur);
    } else if (ch->state == Chunk::State::kReceiving && ch->dataOp.done) {
      moved = true;
      if (ch->dataOp.status == zpSuccess) {
        chunkArrived(cur);
        continue;
      }
      if (!routing_->directAlive(ch->from)) {
        chunkLost(cur);  // its path went down: the source sends it again
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
  if (!acks_.empty()) {
    flushAcks();
    moved = true;
  }
  return moved;
}

bool Relay::busy() const {
  if (!chunks_.empty() || !sends_.empty()) return true;
  for (auto& kv : deliveries_)
    if (kv.second.op && !kv.second.op->done) return true;
  return false;
}

std::vector<int> Relay::holdingFor() const {
  std::vector<int> out;
  for (auto& ch : chunks_) out.push_back(ch->state == Chunk::State::kSending ? ch->hdrOp.peer : ch->from);
  for (auto& kv : sends_) out.push_back(std::get<0>(kv.first));
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

std::vector<int> Relay::busyPeers() const {
  std::vector<int> out;
  for (auto& kv : deliveries_)
    if (kv.second.op && !kv.second.op->done) out.push_back(std::get<0>(kv.first));
  return out;
}

void Relay::dropOps(zpResult_t status, const std::string& why) {
  for (auto& kv : sends_) kv.second.op->finish(status, why);
  for (auto& kv : deliveries_)
    if (kv.second.op) kv.second.op->finish(status, why);
  sends_.clear();
  acks_.clear();
  deliveries_.clear();
  chunks_.clear();
  pending_.clear();
  inFlight_.clear();
  for (auto& q : waitingSlot_) q.clear();
  for (int p = 0; p < 2; p++) freeSlots_[p].clear();
  for (size_t i = 0; i < slotMemory_.size(); i++) freeSlots_[i / kSlotsPerPool].push_back(slotMemory_[i].get());
  spareSlots_.clear();
  for (auto& s : standing_) {
    s->posted = false;
    s->blocked = true;
  }
}

}  // namespace zp
