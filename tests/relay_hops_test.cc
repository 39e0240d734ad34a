// The rail estimates' evidence (src/route/rail_rates.h): a relayed chunk is
// on its rail from the moment its source-side proxy posts it on the NIC
// until the far proxy acknowledges its arrival, and at no other time. The
// relays of a 2-node cluster (ranks 0, 1 on node 0; 2, 3 on node 1) run one
// at a time over transports that only record what is posted; the test
// plays the peers' part and watches what each relay counts.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "src/core/bootstrap.h"
#include "src/core/routing.h"
#include "src/core/transport.h"
#include "transport/relay/relay.h"
#include "transport/relay/relay_chunk.h"

namespace zp {
namespace {

constexpr uint64_t kChunk = 64 * 1024;

// A carrier that keeps what is posted and sent, for the test to answer.
class RecordingCarrier : public CarrierTransport {
 public:
  void post(Op* op) override { posted.push_back(op); }
  void sendStatus(int peer, uint64_t seq, zpResult_t, const std::string& text) override {
    statuses.push_back({peer, seq, text});
  }
  bool progress() override { return false; }
  bool busy() const override { return false; }
  void dropOps(zpResult_t, const std::string&) override {}
  void abortPeers(zpResult_t, const std::string&) override {}
  void leave() override {}
  std::vector<int> busyPeers() const override { return {}; }
  void checkAlive() override {}
  std::string describe(int) const override { return "recording"; }
  zpResult_t connect(const std::vector<std::string>&) override { return zpSuccess; }

  // The first op not yet done that matches.
  Op* find(bool isSend, OpKind kind, int peer) {
    for (Op* op : posted)
      if (!op->done && op->isSend == isSend && op->kind == kind && op->peer == peer) return op;
    return nullptr;
  }
  struct Status {
    int peer;
    uint64_t seq;
    std::string text;
  };
  std::vector<Op*> posted;
  std::vector<Status> statuses;
};

// Paths and NIC health of a healthy 2x2 cluster with one rail per local
// rank, and what the relay counts on this rank's rail.
class CountingRouting : public Routing {
 public:
  uint64_t chunkBytes() const override { return kChunk; }
  const std::vector<int>& rails() const override { return rails_; }
  uint64_t directBelow() const override { return 0; }
  bool directAlive(int) const override { return true; }
  bool pathUp(int, int) const override { return true; }
  bool nodeCut(int) const override { return false; }
  void checkNic() override {}
  void heardNicDown(const std::string&) override {}
  std::vector<NicDown> applyNicNews() override { return {}; }
  std::string encodeNicDown(const NicDown&) const override { return ""; }
  void addQueued(int64_t) override {}
  bool railsMeasured() const override { return true; }
  void hopPosted(uint64_t bytes) override { onRail += (int64_t)bytes; }
  void hopAcked(uint64_t bytes) override {
    onRail -= (int64_t)bytes;
    acked += bytes;
  }
  void hopDropped(uint64_t bytes) override { onRail -= (int64_t)bytes; }
  RailView railView() const override { return {}; }
  void heardRailView(int, int, const RailView&) override {}
  std::vector<std::pair<int, std::string>> tickRails() override { return {}; }
  void heardRailNews(int, const std::string&) override {}
  uint64_t railReport() const override { return 0; }
  std::vector<RailStatus> railStatus() const override { return {}; }
  bool pickPath(int, int, uint64_t, const std::vector<uint64_t>&, std::vector<RouteChunk>*, std::string* why) override {
    *why = "not in this test";
    return false;
  }
  void proxyLeft(int) override {}
  zpResult_t plan(const std::vector<uint64_t>&, const std::vector<std::vector<uint64_t>>&, const std::vector<uint64_t>&,
                  const std::vector<Transfer>**, std::string*) override {
    return zpInternalError;
  }

  int64_t onRail = 0;  // bytes on this rank's rail now
  uint64_t acked = 0;  // bytes acknowledged so far
 private:
  std::vector<int> rails_{0, 1, 0, 1};
};

class NullSink : public TransportSink {
 public:
  void onStatus(int, uint64_t, zpResult_t, std::string) override {}
  void setAsyncError(zpResult_t code, const std::string& msg, bool) override {
    error = code;
    why = msg;
  }
  zpResult_t error = zpSuccess;
  std::string why;
};

// One rank's relay over recording carriers.
struct RankRelay {
  std::vector<RankInfo> ranks;
  Config cfg;
  NullSink sink;
  RecordingCarrier shm, net;
  CountingRouting routing;
  std::unique_ptr<Relay> relay;

  explicit RankRelay(int rank) : ranks(4) {
    for (int r = 0; r < 4; r++) {
      memset(&ranks[r], 0, sizeof(RankInfo));
      ranks[r].rank = r;
      snprintf(ranks[r].nodeId, sizeof(ranks[r].nodeId), "node%d", r / 2);
    }
    TransportContext ctx;
    ctx.rank = rank;
    ctx.nranks = 4;
    ctx.cfg = &cfg;
    ctx.ranks = &ranks;
    ctx.sink = &sink;
    relay = std::make_unique<Relay>(ctx, &shm, &net, &routing);
  }
  // Delivers a relay message into the receive the relay posted for it.
  void deliver(RecordingCarrier& via, OpKind kind, int from, const void* bytes, size_t n) {
    Op* op = via.find(false, kind, from);
    ASSERT_NE(op, nullptr) << "no receive posted from rank " << from;
    ASSERT_EQ(op->bytes, n);
    memcpy(op->buf, bytes, n);
    op->finish(zpSuccess);
    relay->progress();
  }
};

RelayHeader chunkHeader(int src, int dst, int hop, int dstProxy, uint64_t offset, uint64_t total) {
  RelayHeader h{};
  h.magic = kRelayMagic;
  h.kind = (uint32_t)OpKind::kP2P;
  h.src = src;
  h.dst = dst;
  h.hop = hop;
  h.dstProxy = dstProxy;
  h.xfer = 0;
  h.total = total;
  h.offset = offset;
  h.bytes = kChunk;
  return h;
}

// The source queues chunks for its proxy: nothing is on the rail yet, for
// however long the proxy takes to take them (a proxy busy with its own
// traffic leaves its NIC idle, not slow).
TEST(RelayHops, ChunksWaitingForTheirProxyAreNotOnTheRail) {
  RankRelay src(0);
  std::vector<char> buf(4 * kChunk, 7);
  std::vector<RouteChunk> chunks;
  for (int i = 0; i < 4; i++) chunks.push_back({(uint64_t)i * kChunk, kChunk, 1, 3, i});
  RoutedXfer xfer;
  xfer.id = 5;
  xfer.chunks = &chunks;
  Op send(OpKind::kAlltoallv, true, 3, buf.data(), buf.size(), 1);
  send.routed = &xfer;
  src.relay->post(&send);
  for (int i = 0; i < 10; i++) src.relay->progress();
  EXPECT_NE(src.shm.find(true, OpKind::kChunkHeader, 1), nullptr) << "the chunks go to the proxy over shared memory";
  EXPECT_EQ(src.net.find(true, OpKind::kChunkHeader, 3), nullptr) << "nothing goes on the source's own NIC";
  EXPECT_EQ(src.routing.onRail, 0) << "chunks not yet on the NIC count on the rail";
  src.relay.reset();
}

// The proxy posts a chunk on its NIC: on the rail from then; the network's
// send completing is not its arrival (only the far proxy's acknowledgement is).
TEST(RelayHops, AChunkIsOnTheRailFromItsPostOnTheNicToTheFarProxysAcknowledgement) {
  RankRelay proxy(1);
  proxy.relay->progress();  // posts its standing receives
  RelayHeader h = chunkHeader(0, 3, 0, 3, 0, 2 * kChunk);
  proxy.deliver(proxy.shm, OpKind::kChunkHeader, 0, &h, sizeof(h));
  EXPECT_EQ(proxy.routing.onRail, 0) << "a chunk still coming from its source is not on the NIC";
  std::vector<char> data(kChunk, 3);
  proxy.deliver(proxy.shm, OpKind::kChunkData, 0, data.data(), data.size());
  Op* hdrOut = proxy.net.find(true, OpKind::kChunkHeader, 3);
  Op* dataOut = proxy.net.find(true, OpKind::kChunkData, 3);
  ASSERT_NE(hdrOut, nullptr);
  ASSERT_NE(dataOut, nullptr);
  EXPECT_EQ(proxy.routing.onRail, (int64_t)kChunk);
  hdrOut->finish(zpSuccess);
  dataOut->finish(zpSuccess);
  proxy.relay->progress();
  EXPECT_EQ(proxy.routing.onRail, (int64_t)kChunk) << "a send handed to the network has not arrived";
  EXPECT_EQ(proxy.routing.acked, 0u);
  uint64_t bytes = kChunk;
  EXPECT_TRUE(proxy.relay->onControl(3, kSeqHopAck, std::string((const char*)&bytes, sizeof(bytes))));
  EXPECT_EQ(proxy.routing.onRail, 0);
  EXPECT_EQ(proxy.routing.acked, kChunk);
  // An acknowledgement for more than is out counts no more than is out.
  EXPECT_TRUE(proxy.relay->onControl(3, kSeqHopAck, std::string((const char*)&bytes, sizeof(bytes))));
  EXPECT_EQ(proxy.routing.acked, kChunk);
  EXPECT_EQ(proxy.sink.error, zpSuccess) << proxy.sink.why;
}

// The far proxy acknowledges a chunk's network hop to the proxy that sent
// it as soon as it has come, before the chunk goes on to its destination.
TEST(RelayHops, TheFarProxyAcknowledgesTheHopWhenTheChunkArrives) {
  RankRelay far(2);
  far.relay->progress();
  RelayHeader h = chunkHeader(0, 3, 1, 2, kChunk, 2 * kChunk);
  far.deliver(far.net, OpKind::kChunkHeader, kAnyRemotePeer, &h, sizeof(h));
  std::vector<char> data(kChunk, 3);
  for (const auto& s : far.net.statuses) EXPECT_NE(s.seq, kSeqHopAck) << "acknowledged before the bytes came";
  far.deliver(far.net, OpKind::kChunkData, 1, data.data(), data.size());
  EXPECT_NE(far.shm.find(true, OpKind::kChunkData, 3), nullptr) << "the chunk goes on to its destination";
  uint64_t acked = 0;
  int acks = 0;
  for (const auto& s : far.net.statuses)
    if (s.seq == kSeqHopAck) {
      EXPECT_EQ(s.peer, 1);
      ASSERT_EQ(s.text.size(), sizeof(uint64_t));
      uint64_t b;
      memcpy(&b, s.text.data(), sizeof(b));
      acked += b;
      acks++;
    }
  EXPECT_EQ(acks, 1);
  EXPECT_EQ(acked, kChunk);
  EXPECT_EQ(far.sink.error, zpSuccess) << far.sink.why;
}

}  // namespace
}  // namespace zp
