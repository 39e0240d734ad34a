// The relay's acknowledgements and its answer to NIC failure (relay.h): a
// routed send finishes when every chunk is acknowledged, and when a NIC
// goes down the chunks whose path used it are sent again on paths that work.
#include <algorithm>
#include <cstring>
#include <map>

#include "src/core/log.h"
#include "transport/relay/relay.h"
#include "transport/relay/relay_chunk.h"

namespace zp {

bool Relay::applyNicNews() {
  std::vector<NicDown> fresh = routing_->applyNicNews();
  if (fresh.empty()) return false;
  const int me = ctx_.rank;
  for (const NicDown& n : fresh) {
    ZP_INFO(kSubNet, "rank %d: NIC %s (rail %d of node %d) is down: routing around it", me, n.name.c_str(), n.rail,
            n.node);
    std::string text = routing_->encodeNicDown(n);
    for (int p = 0; p < ctx_.nranks; p++)
      if (p != me && routing_->directAlive(p)) via(p)->sendStatus(p, kSeqNicDown, zpSuccess, text);
    for (int p = 0; p < ctx_.nranks; p++)
      if (!routing_->directAlive(p))
        net_->cutPeer(p, "the network path to rank " + std::to_string(p) + " is down (NIC " + n.name + " of node " +
                             std::to_string(n.node) + ")");
    if (routing_->nodeCut(n.node))
      ctx_.sink->setAsyncError(zpRemoteError, "node " + std::to_string(n.node) + " has no working NIC left (the last, " +
                                           n.name + ", went down): no path to its ranks");
  }
  onPathsChanged();
  return true;
}

// Whether a chunk's path (src -> srcProxy -> network -> dstProxy -> dst)
// crosses a NIC that is down. Only the network hop can: shared memory does not fail.
bool Relay::pathDead(int srcProxy, int dstProxy) const { return !routing_->pathUp(srcProxy, dstProxy); }

void Relay::ack(int src, uint32_t kind, uint64_t xfer, uint64_t lo, uint64_t hi) {
  hi = std::max(hi, lo + 1);  // a zero-byte transfer's one chunk is acknowledged as [0, 1)
  std::vector<AckRange>& v = acks_[src];
  if (!v.empty() && v.back().kind == kind && v.back().xfer == xfer && v.back().hi == lo) v.back().hi = hi;
  else v.push_back({kind, xfer, lo, hi});
}

// Sends the acknowledgements gathered in this round, a few dozen per message.
void Relay::flushAcks() {
  const size_t kPerMessage = 16;
  for (auto& [src, ranges] : acks_)
    for (size_t i = 0; i < ranges.size(); i += kPerMessage) {
      size_t n = std::min(kPerMessage, ranges.size() - i);
      std::string payload((const char*)&ranges[i], n * sizeof(AckRange));
      sendStatus(src, kSeqRelayAck, zpSuccess, payload);
    }
  acks_.clear();
}

void Relay::onAck(int from, const std::string& payload) {
  size_t n = payload.size() / sizeof(AckRange);
  for (size_t i = 0; i < n; i++) {
    AckRange a;
    memcpy(&a, payload.data() + i * sizeof(AckRange), sizeof(a));
    auto it = sends_.find(Key(from, a.kind, a.xfer));
    if (it == sends_.end()) continue;  // finished: an acknowledgement sent again
    SendXfer& sx = it->second;
    for (auto c = sx.chunks.lower_bound(a.lo); c != sx.chunks.end() && c->first < a.hi; ++c)
      if (!c->second.acked && c->first + c->second.bytes <= a.hi) {
        c->second.acked = true;
        sx.unacked--;
        if (c->second.timed) routing_->chunkAcked(c->second.srcProxy, c->second.bytes);
      }
    maybeFinish(&sx);
  }
}

void Relay::repath(Sent* rec, int srcProxy, int dstProxy) {
  if (rec->srcProxy == srcProxy && rec->dstProxy == dstProxy) return;
  if (!rec->acked && rec->timed) {
    routing_->chunkDropped(rec->srcProxy, rec->bytes);
    routing_->chunkQueued(srcProxy, rec->bytes);
  }
  rec->srcProxy = srcProxy;
  rec->dstProxy = dstProxy;
}

void Relay::onPathsChanged() {
  const int me = ctx_.rank;
  // Chunks of this rank's sends that have not started: new paths where theirs is dead.
  std::vector<std::unique_ptr<Chunk>> moved;
  for (auto& [hop, queue] : pending_)
    for (auto q = queue.begin(); q != queue.end();)
      if (pathDead((*q)->srcProxy, (*q)->hdr.dstProxy)) {
        moved.push_back(std::move(*q));
        q = queue.erase(q);
      } else {
        ++q;
      }
  // Chunks already on their way along a dead path: send them again.
  std::vector<SendXfer*> touched;
  for (auto& [key, sx] : sends_) {
    for (auto& [offset, rec] : sx.chunks) {
      if (rec.acked || !pathDead(rec.srcProxy, rec.dstProxy)) continue;
      auto ch = std::make_unique<Chunk>();
      RelayHeader& h = ch->hdr;
      h.magic = kRelayMagic;
      h.kind = std::get<1>(key);
      h.src = me;
      h.dst = sx.op->peer;
      h.xfer = std::get<2>(key);
      h.total = sx.op->bytes;
      h.offset = offset;
      h.bytes = rec.bytes;
      ch->data = (char*)sx.op->buf + offset;
      ch->sx = &sx;
      sx.inBuffer++;
      moved.push_back(std::move(ch));
    }
    touched.push_back(&sx);
  }
  // New paths, per destination for all its chunks at once, so that they
  // spread over the NICs left (one at a time, all would take the NIC that
  // looks emptiest now). The NICs' queues count what this rank has yet to send.
  std::vector<uint64_t> backlog;
  for (auto& [hop, queue] : pending_)
    for (auto& ch : queue) {
      int k = routing_->rails()[ch->srcProxy];
      if ((int)backlog.size() <= k) backlog.resize(k + 1, 0);
      backlog[k] += ch->hdr.bytes;
    }
  std::map<int, std::vector<std::unique_ptr<Chunk>>> byDst;
  for (auto& ch : moved) byDst[ch->hdr.dst].push_back(std::move(ch));
  for (auto& [dst, list] : byDst) {
    // One schedule for all the moved bytes: each moved chunk takes the
    // proxies of the scheduled chunks its bytes fall on (full chunks first,
    // so that they line up with the schedule's).
    std::stable_sort(list.begin(), list.end(), [](const std::unique_ptr<Chunk>& x, const std::unique_ptr<Chunk>& y) {
      return x->hdr.bytes > y->hdr.bytes;
    });
    uint64_t total = 0;
    for (auto& ch : list) total += std::max<uint64_t>(ch->hdr.bytes, 1);
    std::vector<RouteChunk> path;
    std::string why;
    bool ok = pickChunks(dst, total, &path, &why, backlog);
    size_t pi = 0;
    uint64_t left = ok && !path.empty() ? path[0].bytes : 0;
    for (auto& ch : list) {
      SendXfer* sx = ch->sx;
      if (sx) sx->inBuffer--;  // queueChunk counts it again
      if (!ok || pi >= path.size()) {
        if (sx && sx->op->status == zpSuccess) {
          sx->op->status = zpRemoteError;
          sx->op->error = "no path left to rank " + std::to_string(dst) + ": " + why;
        }
        continue;
      }
      const RouteChunk& pc = path[pi];
      if (sx) repath(&sx->chunks[ch->hdr.offset], pc.srcProxy, pc.dstProxy);
      uint64_t b = std::max<uint64_t>(ch->hdr.bytes, 1);
      while (b > 0 && pi < path.size()) {  // the moved chunk's bytes, over the schedule's
        const uint64_t take = std::min(b, left);
        b -= take;
        left -= take;
        if (left == 0 && ++pi < path.size()) left = path[pi].bytes;
      }
      queueChunk(std::move(ch), pc.srcProxy, pc.dstProxy);
    }
  }
  for (SendXfer* sx : touched) maybeFinish(sx);
  // Acknowledge again what is here: acknowledgements on the dead path are lost.
  // (Chunks start at multiples of the chunk size: router.h.)
  for (auto& [key, d] : deliveries_)
    for (uint64_t off : d.have)
      ack(std::get<0>(key), std::get<1>(key), std::get<2>(key), off, off + std::min<uint64_t>(chunkBytes_, d.total - off));
  const size_t kRecent = 256;  // a send waits only for transfers that finished just now
  for (size_t i = finishedOrder_.size() > kRecent ? finishedOrder_.size() - kRecent : 0; i < finishedOrder_.size(); i++) {
    const Key& key = finishedOrder_[i];
    auto f = finished_.find(key);
    if (f != finished_.end()) ack(std::get<0>(key), std::get<1>(key), std::get<2>(key), 0, f->second);
  }
  pump();
}

}  // namespace zp
