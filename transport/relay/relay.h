// The router's executor on host buffers: carries routed transfers along
// their schedules (RouteChunk, src/route/route_schedule.h: the plan's pieces
// as chunks of at most chunkBytes, in the order they go), with every rank
// serving as a proxy for its node. The device routed alltoallv runs the same
// schedules as NCCL steps (collectives/alltoallv.cc).
//
// A transfer src -> dst (on another node) is queued chunk by chunk in its
// schedule's order. Each chunk travels as two messages per hop: a RelayHeader,
// then its bytes, over the transports' relay kinds (their own lane on shared
// memory, their own tags on UCX, so relays never queue behind user messages):
//   dispatch  src -> srcProxy over shared memory (skipped when src is it),
//   transfer  srcProxy -> dstProxy over the network,
//   combine   dstProxy -> dst over shared memory (skipped when dst is it).
// The destination places each chunk by (src, kind, transfer id, offset), in
// any arrival order, straight into the receive buffer when the receive is
// already posted, else into a buffer of its own until it is.
//
// A routed send finishes when the destination has acknowledged every chunk
// (acknowledgements travel back in batches as control messages), not when
// its chunks have left: until then the source can send any of them again.
// That is how NIC failure is survived: when a NIC goes down (src/route/nic_health.h),
// proxies drop chunks whose path used it, the source sends its
// unacknowledged chunks of such paths again on paths that work, and
// destinations acknowledge again what they hold (acknowledgements on the
// dead path are lost too). The destination keeps the first copy of each
// chunk and drops later ones, also after the transfer has finished (it
// remembers finished transfers), so nothing is delivered twice.
//
// Proxies stage chunks in fixed slots: one pool for chunks on their way out
// of the node and one for chunks coming in, so a rank that is both cannot
// fill all slots with outgoing chunks that wait for its own incoming ones.
// A proxy takes a chunk only when it has a free slot; until then the chunk
// waits at the previous hop, so a slow NIC slows its senders instead of
// filling memory. Incoming chunks end at their destination, which never
// waits for a slot: no cycle of waits can form.
//
// The relay is a Transport (src/core/transport.h) built on the two the
// communicator made, which it knows only as CarrierTransports: installed
// for the ranks of other nodes (src/route/routing_state.h), it takes their
// Ops from the executor like any transport, and sends its own messages over
// shared memory and UCX. Paths and NIC health come from the routing layer
// through src/core/routing.h; what it reports goes to the TransportSink.
//
// Everything here runs inside the executor's progress, i.e. under the
// communicator's lock, from a user call or from its progress thread (src/core/comm.h).
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "include/zeppelin.h"
#include "src/core/routing.h"
#include "src/core/transport.h"

namespace zp {

// The relay's control messages (msgid::Control, src/core/msg_id.h).
constexpr uint64_t kSeqLeaving = msgid::controlSeq(msgid::Control::kLeaving);
constexpr uint64_t kSeqNicDown = msgid::controlSeq(msgid::Control::kNicDown);
constexpr uint64_t kSeqRelayAck = msgid::controlSeq(msgid::Control::kAck);
constexpr uint64_t kSeqRailView = msgid::controlSeq(msgid::Control::kRailView);
constexpr uint64_t kSeqLeftDone = msgid::controlSeq(msgid::Control::kLeftDone);

struct RelayHeader {
  uint64_t magic;
  uint32_t kind;   // the user call's OpKind
  int32_t src, dst;  // the transfer's ends
  int32_t hop;       // who sent this message
  int32_t dstProxy;  // who takes the chunk off the network on dst's node
  int32_t srcProxy;  // who puts it on the network on src's node
  int32_t status;    // kControl: the status message's status
  uint64_t xfer;     // the transfer's id among (src, dst, kind)'s transfers
  uint64_t total;    // the transfer's bytes
  uint64_t offset, bytes;  // this chunk
  uint64_t dataSeq;  // the sequence number of the message with the bytes
  RailView rails;    // the source's view of the rails between src's and dst's nodes
};

class Relay : public Transport {
 public:
  // ctx: the communicator's; shm and net: the transports it relays over
  // (net is null on one node); routing: paths and NIC health. All outlive it.
  Relay(const TransportContext& ctx, CarrierTransport* shm, CarrierTransport* net, Routing* routing);
  ~Relay() override;

  // Transport. post takes an op with a rank of another node: a
  // point-to-point op gets its path from the NICs' queues (pickChunks);
  // a collective's carries its transfer (op->routed).
  void post(Op* op) override;
  // Directly while the network path works, else relayed like a one-chunk transfer.
  void sendStatus(int peer, uint64_t seq, zpResult_t status, const std::string& text) override;
  bool onControl(int peer, uint64_t seq, const std::string& text) override;
  // A routed point-to-point transfer from peer, the next one a receive would
  // take, of which a chunk has come (held until its receive is posted).
  bool arrived(int peer, uint64_t seq, size_t* bytes) override;
  bool progress() override;
  // Chunks in flight here (as source, proxy or destination).
  bool busy() const override;
  // Fails every routed op and forgets the chunks (the communicator broke;
  // the transports have already failed their ops).
  void dropOps(zpResult_t status, const std::string& why) override;
  // The transports below tell the peers.
  void abortPeers(zpResult_t, const std::string&) override {}
  // A leaving rank stays only while it is on a path: until every rank it
  // can reach has sent it kSeqLeftDone (an answer to its leaving message,
  // sent once none of that rank's unacknowledged chunks goes through it or
  // to it, from when on that rank's paths avoid it; or that rank's own
  // goodbye), and while it holds a chunk or a relay message waits in its
  // rings.
  // Ranks behind a NIC that is down are not waited for: their messages
  // would need relays themselves.
  std::vector<int> stayFor() override;
  // A communicator that broke or was aborted skips stayFor: its peers still
  // hear that this rank left. Every peer then also gets kSeqLeftDone: none
  // of this rank's chunks is on a path any more, so a peer that is leaving
  // itself waits for it no longer (also one whose leaving message came
  // too late for an answer).
  void leave() override;
  // Sources of routed receives still missing bytes.
  std::vector<int> busyPeers() const override;
  void checkAlive() override {}
  std::string describe(int peer) const override;

 private:
  // Tells every rank it can reach that this rank came to destroy (once):
  // kSeqLeaving, with the number of point-to-point transfers sent to it.
  void sayLeaving();
  // A peer's kSeqLeaving: new paths avoid it, it is owed a kSeqLeftDone,
  // and routed receives of transfers it never sent fail now, later ones
  // when posted.
  void onLeaving(int peer, const std::string& text);
  // Whether an unacknowledged chunk of this rank's sends goes through rank
  // (as a proxy) or to it.
  bool onPathThrough(int rank) const;
  // Sends kSeqLeftDone to the leaving ranks owed one whose paths are clear.
  void answerLeavers();
  std::string neverSent(int peer) const;
  // A routed send of op along its schedule; op finishes when every chunk is acknowledged.
  void send(Op* op, uint64_t xfer, const std::vector<RouteChunk>& chunks);
  // A routed receive; op finishes when every byte has arrived.
  void recv(Op* op, uint64_t xfer);
  // Moves chunks; true if anything moved.
  bool moveChunks();
  // The hops of chunks held here, and destinations of unacknowledged sends.
  std::vector<int> holdingFor() const;
  // A status message to a rank with no working network path to this one,
  // relayed like a one-chunk transfer.
  void sendControl(int peer, uint64_t seq, zpResult_t status, const std::string& text);
  // sendControl's path to peer: back the way its latest chunk came, if that works.
  bool pathBack(int peer, std::vector<RouteChunk>* chunks) const;
  // Acknowledgements from a destination (a kSeqRelayAck message).
  void onAck(int from, const std::string& payload);
  // Acts on NIC news: the router leaves the NIC out from now on, peers
  // behind it are cut off, what went that way is sent again, and the news
  // goes on to every rank this one can reach (once per NIC).
  bool applyNicNews();
  // A NIC went down: re-send and re-acknowledge.
  void onPathsChanged();
  Transport* via(int peer) const;
  bool isLocal(int peer) const { return local_[peer]; }

  struct Chunk;
  struct InRecv;
  using Key = std::tuple<int, uint32_t, uint64_t>;  // (peer, kind, xfer): src at the destination, dst at the source
  // The source's record of a routed send until every chunk is acknowledged.
  struct Sent {
    uint64_t bytes = 0;
    int srcProxy = -1, dstProxy = -1;  // its latest path
    bool acked = false;
    bool timed = false;  // counted in the rail estimates (Routing::chunkQueued)
  };
  struct SendXfer {
    Op* op = nullptr;
    Key key;
    std::map<uint64_t, Sent> chunks;  // by offset
    int unacked = 0;
    int inBuffer = 0;  // chunks of this send queued or on their way out of op's buffer
  };
  // The receiving end of one routed transfer, and chunks that came before it.
  struct Delivery {
    Op* op = nullptr;
    uint64_t got = 0;    // bytes placed (first copies)
    std::set<uint64_t> have;     // offsets of chunks placed
    std::set<uint64_t> claimed;  // offsets being received straight into op's buffer
    uint64_t total = 0;  // from the first header
    bool seen = false;   // a header has come (zero-byte transfers have one chunk)
    bool failed = false; // op failed (size mismatch): later chunks are dropped
    std::vector<std::unique_ptr<Chunk>> early;
  };
  void start();
  void postHeaderRecvs();
  void onHeader(const RelayHeader& h, int from, InRecv* standing);
  bool placeChunk(Chunk* ch);
  bool accept(Delivery& d, const RelayHeader& h);
  void finishDelivery(const Key& key);
  void sendChunk(Chunk* ch, int to);
  bool pump();
  void chunkArrived(std::list<std::unique_ptr<Chunk>>::iterator it);
  void chunkSent(Chunk* ch);
  void chunkLost(std::list<std::unique_ptr<Chunk>>::iterator it);
  void abandon(std::list<std::unique_ptr<Chunk>>::iterator it);
  void queueChunk(std::unique_ptr<Chunk> ch, int srcProxy, int dstProxy);
  // queued: bytes per rail to count on top of the node's NIC queues.
  bool pickChunks(int dst, uint64_t bytes, std::vector<RouteChunk>* chunks, std::string* why,
                  std::vector<uint64_t> queued = {});
  bool pathDead(int srcProxy, int dstProxy) const;
  void maybeFinish(SendXfer* sx);
  // A chunk of this rank's send takes another path (the rail estimates move it).
  void repath(Sent* rec, int srcProxy, int dstProxy);
  void ack(int src, uint32_t kind, uint64_t xfer, uint64_t lo, uint64_t hi);
  void flushAcks();
  void remember(const Key& key, uint64_t total);
  char* takeSlot(bool inbound);
  void freeSlot(char* slot, bool inbound);

  TransportContext ctx_;
  CarrierTransport* shm_;
  CarrierTransport* net_;
  Routing* routing_;
  uint64_t chunkBytes_;
  std::vector<char> local_;         // by rank: on this node
  bool leaving_ = false;            // stayFor: this rank's leaving messages went out
  std::set<int> left_;              // ranks that came to destroy
  // By rank: the path its latest chunk here came by (-1: none yet), the
  // way back for sendControl to a rank with no direct path (pathBack).
  struct Way {
    int srcProxy = -1, dstProxy = -1;
  };
  std::vector<Way> cameVia_;
  std::map<int, uint64_t> leftSent_;  // of those: the point-to-point transfers each sent this rank
  std::set<int> owedDone_;            // of those: still to be sent kSeqLeftDone
  std::set<int> doneFrom_;            // ranks that sent this one kSeqLeftDone
  bool started_ = false;
  std::vector<uint64_t> relaySendSeq_;  // by peer: chunks sent (msgid::chunkSeqs numbers their messages)
  std::vector<uint64_t> relayRecvSeq_;  // by peer: relay messages received
  std::vector<uint64_t> p2pSends_, p2pRecvs_;          // by peer: routed point-to-point transfers
  std::vector<std::unique_ptr<InRecv>> standing_;       // header receives: one per local peer, one for the network
  std::list<std::unique_ptr<Chunk>> chunks_;                   // in flight here
  std::map<int, std::deque<std::unique_ptr<Chunk>>> pending_;  // this rank's chunks not yet started, by first hop
  std::map<int, int> inFlight_;                                // this rank's chunks started, by first hop
  std::deque<Chunk*> waitingSlot_[2];  // chunks whose proxy waits for a slot (outbound, inbound)
  std::vector<std::unique_ptr<char[]>> slotMemory_;
  std::vector<char*> freeSlots_[2];
  std::vector<std::unique_ptr<char[]>> spareSlots_;  // replacing slots of abandoned chunks
  std::list<std::unique_ptr<Chunk>> abandoned_;      // cut off mid-receive: UCX may still hold them
  std::map<Key, Delivery> deliveries_;  // routed receives and early chunks, by key
  std::map<Key, SendXfer> sends_;       // routed sends until acknowledged, by (dst, kind, xfer)
  struct AckRange {
    uint32_t kind;
    uint64_t xfer, lo, hi;
  };
  std::map<int, std::vector<AckRange>> acks_;  // to send, by source
  std::map<Key, uint64_t> finished_;           // finished deliveries (their total), so late copies are dropped
  std::deque<Key> finishedOrder_;              // oldest first, to bound finished_
};

}  // namespace zp
