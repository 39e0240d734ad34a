// The seam between the executor and the transports. A collective or a group
// of point-to-point calls becomes a list of Ops (one per send or receive with
// one peer); the executor hands each Op to the transport that reaches its
// peer and drives every transport's progress until the Ops are done. A
// transport knows nothing of the communicator above it: what it needs at
// creation comes in a TransportContext, and what it reports back goes to a
// TransportSink.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "include/zeppelin.h"
#include "src/util/clock.h"
#include "src/core/bootstrap.h"
#include "src/core/config.h"
#include "src/core/msg_id.h"

namespace zp {

// Which call an Op belongs to; carried in every message so that a rank that
// calls operations in a different order than its peer gets an error, not a
// hang. kChunkHeader, kChunkData and kControl are a layer's built on the
// carriers (the relay's): a header describing a chunk, the chunk, and a
// control message it forwards.
enum class OpKind : uint32_t {
  kP2P = 0,
  kAlltoallv = 1,
  kChunkHeader = 2,
  kChunkData = 3,
  kControl = 4,
  kCollective = 5,  // all-reduce, all-gather, reduce-scatter, broadcast, reduce, barrier
};
const char* opKindName(OpKind kind);

// Lanes: ordered channels between a pair of ranks. A carrier keeps a ring or
// a tag space per lane, so that a lane's messages never wait behind
// another's, and knows nothing of who uses which. kLaneCalls carries the
// calls; kLaneStanding a layer built on the carriers (the relay) whose
// receives stand ready at all times (they are no work: busy() and the wait
// statistics leave them out) and may match any rank of another node
// (kAnyRemotePeer), so that its messages never wait for a receive their
// hop has not posted yet; a receive on it from a named rank is posted only
// for a message that rank has announced there, so it completes even after
// that rank's goodbye.
constexpr int kLanes = 2;
constexpr uint8_t kLaneCalls = 0, kLaneStanding = 1;

// A receive on kLaneStanding from any rank of another node.
constexpr int kAnyRemotePeer = -2;
// A user's receive from any rank (ZP_ANY_SOURCE): the executor gives it
// its peer once that peer's next message has come (Transport::arrived),
// and only then posts it; a transport never sees this value.
constexpr int kAnySource = ZP_ANY_SOURCE;

// A routed op's transfer (src/core/routing.h); the executor carries the
// pointer without looking at it.
struct RoutedXfer;

// How a receive reduces what arrives into its buffer (the collectives):
// fn(dst, a, b, bytes) stores a op b elementwise; bytes is a multiple of
// elemSize.
struct OpReducer {
  void (*fn)(void* dst, const void* a, const void* b, size_t bytes);
  size_t elemSize;
};

// Receives reduced together (a direct reduce-scatter's blocks from every
// peer): once every member can be read, out = src op in[0] op in[1] ... in
// slot order, a cache-sized piece of all of them at a time, so that out and
// src pass through memory once for the whole group instead of once per
// peer, and the sum's order (the bits) stays fixed. Each member is a
// receive of `bytes` (its buf unused) with Op::group and its slot; all on
// one transport whose canReduceGroup holds for each. The group outlives
// its ops.
struct OpReduceGroup {
  void* out;
  const void* src;
  size_t bytes;
  const OpReducer* reduce;
  int members;
};

struct Op {
  // User-provided, so that a value-initialized Op (emplace_back()) is not
  // zero-filled first: the members' own initializers set every field, and
  // the fill (a rep stos of the whole Op) was a tenth of a small message's call.
  Op() noexcept {}
  // Made in place in a list of ops (emplace_back), not made then moved:
  // a move copies the whole Op, its error string included.
  Op(OpKind k, bool send, int to, void* b, size_t n, size_t ts) noexcept
      : isSend(send), peer(to), kind(k), buf(b), bytes(n), typeSize(ts) {}
  // The small fields first, side by side: an Op is made for every call,
  // and padding between them would be bytes to write each time.
  bool isSend = false;
  uint8_t lane = kLaneCalls;  // the channel it travels on (seq counts per lane)
  bool done = false;
  // Receives whose arrival the per-peer wait statistics use (WaitStats:
  // a host receive from a known peer other than this rank), marked by
  // whoever makes the op. The transports stamp only these (arrivedUs,
  // enteredUs below), and the caller reads the stamps when the call has
  // run: a call that never waited costs no set-up before it runs.
  bool stampsArrival = false;
  int peer = -1;  // a rank, kAnyRemotePeer, or kAnySource until the executor matches it
  OpKind kind = OpKind::kP2P;
  zpResult_t status = zpSuccess;
  void* buf = nullptr;  // for sends, read only
  size_t bytes = 0;
  size_t typeSize = 1;  // to report mismatches in elements
  uint64_t seq = 0;     // position among this pair's messages of its lane, set when posted
  std::string error;
  size_t progressed = 0;  // bytes moved so far
  // Optional metadata sent ahead of the data (a send's `meta`, copied into
  // the matching receive's `meta`): alltoallv ships each rank's counts so
  // every rank can check every pair without another round of messages.
  void* meta = nullptr;
  uint32_t metaBytes = 0;
  // A collective's transfer planned by the router (its id and pieces); null
  // for point-to-point calls, which the relay routes itself.
  const RoutedXfer* routed = nullptr;
  // The CUDA stream (cudaStream_t) a device op is ordered on; null for host
  // buffers, which the Transports move. Device ops go to the StreamTransport.
  void* stream = nullptr;
  // Receives only, on a transport whose canReduce() is true: the bytes are
  // not stored but reduced, buf[i] = reduceSrc[i] op incoming[i] (reduceSrc
  // may equal buf), while they are copied in: no pass over a temporary.
  const OpReducer* reduce = nullptr;
  const void* reduceSrc = nullptr;
  // Receives only: a member of a group reduced together (OpReduceGroup).
  const OpReduceGroup* group = nullptr;
  int groupSlot = 0;
  // Sends only: the receiver reduces what this carries (a direct
  // reduce-scatter's block), so shared memory may pipeline it through its
  // ring instead of letting the receiver read it (ZP_SHM_REDUCE_COPY).
  bool reducedByPeer = false;
  // Receives from any source (kAnySource) only: where to write the rank
  // it was matched with (zpRecvFrom), or null.
  int* source = nullptr;
  // Receives with stampsArrival: when, in stampUs(), the peer's message
  // began to arrive (the moment the peer entered the call), 0 if not seen.
  // A transport that sees a message's first bytes or its meta says so
  // (noteArrival); otherwise finishing notes it if the message is small
  // enough that its end is its arrival. A larger message whose start no transport saw stays 0
  // (charged nothing): its end would charge the peer for the transfer, not
  // for a late start.
  uint64_t arrivedUs = 0;
  // When this rank began to wait for it (its entry, for the same
  // statistics), 0 if it never did. Shared memory's shortcut (moveNow)
  // stamps the receive it polls for at its first look at the clock, after
  // the call's sends went out, and the executor's general path a call's
  // first stamped receive where a pass over the transports after posting
  // left the call waiting (Comm::waitEntry_): a call whose messages are
  // there by then reads no clock for it and is counted clean.
  uint64_t enteredUs = 0;
  void noteEntered(uint64_t us) {
    if (stampsArrival && !enteredUs) enteredUs = us;
  }
  static constexpr size_t kArrivalAtFinishMax = 64 * 1024;
  void noteArrival() {
    if (stampsArrival && !arrivedUs) arrivedUs = stampUs();
  }
  // The same with a time the transport read already (stampUs()), or
  // kArrivedAtOnce: the message was there before this rank waited for it
  // measurably (earlier than any entry: charged nothing).
  static constexpr uint64_t kArrivedAtOnce = 1;
  void noteArrival(uint64_t us) {
    if (stampsArrival && !arrivedUs) arrivedUs = us;
  }

  void finish(zpResult_t st) {  // without a string to make: most ops finish with zpSuccess
    if (bytes <= kArrivalAtFinishMax) noteArrival();
    done = true;
    status = st;
  }
  void finish(zpResult_t st, std::string err) {
    finish(st);
    if (st != zpSuccess && error.empty()) error = std::move(err);
  }
};

// What a transport reports back to its communicator.
class TransportSink {
 public:
  virtual ~TransportSink() = default;
  // A status or control message from peer (Transport::sendStatus at its end).
  virtual void onStatus(int peer, uint64_t collSeq, zpResult_t status, std::string text) = 0;
  // The communicator is broken (a dead peer, a protocol error). fromPeer: a
  // peer said so (it is not passed on again).
  virtual void setAsyncError(zpResult_t code, const std::string& msg, bool fromPeer = false) = 0;
};

// What a transport is told when it is created.
struct TransportContext {
  int rank = 0, nranks = 0;
  const Config* cfg = nullptr;
  const IdLayout* id = nullptr;                   // the unique id (its secret names shared resources)
  const std::vector<RankInfo>* ranks = nullptr;  // every rank's bootstrap record (pid, node)
  TransportSink* sink = nullptr;
  bool sameNode(int a, int b) const;
};

class Transport {
 public:
  virtual ~Transport() = default;
  // Queues an op; ops with one peer complete in the order posted per direction.
  virtual void post(Op* op) = 0;
  // A small control message (a collective's outcome); delivered through TransportSink::onStatus.
  virtual void sendStatus(int peer, uint64_t collSeq, zpResult_t status, const std::string& text) = 0;
  // A control message (a status message whose sequence number is a
  // msgid::Control, src/core/msg_id.h), from peer; true if this transport took it.
  virtual bool onControl(int /*peer*/, uint64_t /*seq*/, const std::string& /*text*/) { return false; }
  // Whether receives may carry an OpReducer (Op::reduce).
  virtual bool canReduce() const { return false; }
  // Whether a receive of `bytes` from peer may be a member of an
  // OpReduceGroup.
  virtual bool canReduceGroup(int /*peer*/, size_t /*bytes*/) const { return false; }
  // The executor's shortcut for a call's small messages, tried before it
  // posts them: moves now the ops it can finish without queuing them, in
  // the order the ops come, and leaves the others untouched for post().
  // An op it finishes gets its seq from sendSeq / recvSeq (by peer), which
  // it advances; after an op it leaves, it leaves every later op of the
  // same direction too, so that each pair's messages keep their order (a
  // receive from any source, which has no peer yet, is always left). It
  // finishes ops with success only: anything unusual is post()'s to handle.
  virtual void moveNow(const std::vector<Op*>& /*ops*/, std::vector<uint64_t>& /*sendSeq*/,
                       std::vector<uint64_t>& /*recvSeq*/) {}
  // A receive from any source (kAnySource): whether peer's next
  // point-to-point message (of kLaneCalls, number seq among the pair's) has
  // come, and its size (*bytes), while no receive from peer is posted here.
  // False until it has, and for messages of other kinds (a collective's
  // waits for its own call). A transport that cannot tell keeps the default:
  // its peers are never matched.
  virtual bool arrived(int /*peer*/, uint64_t /*seq*/, size_t* /*bytes*/) { return false; }
  // Non-blocking; true if anything moved.
  virtual bool progress() = 0;
  // True while ops are posted and not finished.
  virtual bool busy() const = 0;
  // Fails and forgets every posted op (the communicator is broken).
  virtual void dropOps(zpResult_t status, const std::string& why) = 0;
  // Tells every peer that this communicator is broken (why, with the code
  // they should return); they fail everything pending and to come.
  virtual void abortPeers(zpResult_t code, const std::string& why) = 0;
  // Before leave(): ranks this one must stay for (a relay still carrying
  // their traffic). The executor drives progress until it is empty.
  virtual std::vector<int> stayFor() { return {}; }
  // Says goodbye to every peer: operations with this rank fail from now on,
  // once what it already sent has been received.
  virtual void leave() = 0;
  // Peers with unfinished ops, for timeout messages.
  virtual std::vector<int> busyPeers() const = 0;
  // Notices peers that died.
  virtual void checkAlive() = 0;
  // How this transport reaches a peer, for logs ("SHM/CMA", "UCX/tcp zpnic0").
  virtual std::string describe(int peer) const = 0;

  // Waiting. When nothing moved, the executor sleeps until a transport may
  // have news: shared memory is woken by a doorbell (a futex word: a token
  // read before progress, slept on after it), the network by an event
  // file descriptor (armed, then polled). A transport says which it has;
  // one built on others (the relay) has neither and is woken through them.
  enum class Wakeup { kNone, kDoorbell, kEventFd };
  virtual Wakeup wakeup() const { return Wakeup::kNone; }
  // kDoorbell: a token that changes whenever a peer rings; a wait until it
  // differs from `token` or ms pass, which polls first if `poll` and then
  // stops as soon as `elsewhere` (news from another transport) holds; and
  // the sleep alone, safe without the communicator's lock (false if the
  // time ran out). Where sleepsWithFd(), both sleeps also end when fd (if
  // >= 0: another transport's eventFd) becomes readable.
  virtual uint32_t waitToken() const { return 0; }
  virtual void waitDoorbell(uint32_t /*token*/, int /*ms*/, const std::function<bool()>& /*elsewhere*/, int /*fd*/,
                            bool /*poll*/) {}
  virtual bool sleepDoorbell(uint32_t /*token*/, int /*ms*/, int /*fd*/) { return false; }
  virtual bool sleepsWithFd() const { return false; }
  // kEventFd: sleeps until events come or ms pass; the same in two steps
  // for a thread that must not hold the lock while it sleeps: arm (false:
  // events are waiting already), then eventsReady (events came since), or
  // a sleep on eventFd (readable once events came).
  virtual void waitEvents(int /*ms*/) {}
  virtual bool armEvents() { return false; }
  virtual bool eventsReady() const { return false; }
  virtual int eventFd() const { return -1; }
};

// A transport another transport is built on (shared memory and UCX, under
// the relay): lanes (Op::lane), and what a layer above needs of them
// beyond Transport. Each answers what it can; the rest keep these defaults.
class CarrierTransport : public Transport {
 public:
  // Shared memory: kSharedWords words per rank of this node that all of
  // them can read (kept in shared memory), and this rank's own to add to.
  // What they count is their user's (the routing layer's NIC queues and
  // rail counters, src/route/routing_state.cc).
  static constexpr int kSharedWords = 17;
  virtual uint64_t sharedWord(int /*rank*/, int /*index*/) const { return 0; }
  virtual void addSharedWord(int /*index*/, int64_t /*delta*/) {}
  // Shared memory: local peers whose messages on `lane` wait unread here.
  virtual std::vector<int> waitingOn(int /*lane*/) { return {}; }
  // The network: stops using the path to peer (a NIC on it is down): its
  // operations fail with why, and its errors no longer break the communicator.
  virtual void cutPeer(int /*peer*/, const std::string& /*why*/) {}
  // Connects to every peer it reaches, given every rank's address (indexed
  // by rank: what TransportKind::create gave at that rank).
  virtual zpResult_t connect(const std::vector<std::string>& addresses) = 0;
};

// What a host transport is made with besides the context.
struct TransportSetup {
  std::string nic;       // this rank's network device (empty: the transport picks)
  size_t eagerUpTo = 0;  // the network: messages up to this size go eagerly (the relay's chunks)
};

// A host transport as the executor's table lists it (transport/transports.cc,
// as NCCL's ncclTransports[]): the communicator makes every kind that
// reaches some rank, in the table's order, and each peer is reached by the
// first kind that can.
struct TransportKind {
  const char* name;
  // Whether it carries this rank's traffic to peer (ctx.rank itself included).
  bool (*canReach)(const TransportContext& ctx, int peer);
  // Whether this build has it; if not, *why says why and what to do.
  bool (*available)(std::string* why);
  // Made before init's setup round; *address is its connect blob, what
  // every peer needs to connect to it, opaque to the communicator, which
  // carries it beside its PeerInfo (src/core/peer_info.h) to
  // CarrierTransport::connect at every rank after the round.
  zpResult_t (*create)(const TransportContext& ctx, const TransportSetup& setup,
                       std::unique_ptr<CarrierTransport>* out, std::string* address);
};
const std::vector<TransportKind>& hostTransports();

// A standard collective's arguments (NCCL's), as the C API takes them.
enum class CollKind { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kBarrier, kAllGatherv, kReduceScatterv };
struct CollArgs {
  CollKind kind;
  const void* send;
  void* recv;
  size_t count;  // all-gather(v): this rank's sendcount; reduce-scatter: per rank received; reduce-scatterv: 0
  zpDataType_t dtype;
  zpRedOp_t op;
  int root;
  // The v calls: recvcounts (nranks of them) and all-gatherv's rdispls, in
  // elements; the caller keeps them alive until the call has run.
  const size_t* counts = nullptr;
  const size_t* displs = nullptr;
  // The all-gather inside zpCommSplit: its header check names it, so that a
  // rank calling zpAllGather against another's zpCommSplit is a mismatch.
  bool forSplit = false;
};

// A data plane whose work is ordered on the caller's CUDA stream (NCCL, for
// device buffers). Unlike a Transport it is not progressed: ops are enqueued
// on their streams and complete on the device later, and a failure after
// that is polled (asyncError), as with NCCL itself.
class StreamTransport {
 public:
  virtual ~StreamTransport() = default;
  enum class Memory { kHost, kDevice };
  // Where buf, passed to a call on stream (NULL: a host call), lives; an
  // error if the runtime cannot tell.
  virtual zpResult_t memoryOf(const void* buf, void* stream, Memory* where, int* device) = 0;
  // Enqueues ops (each on its op->stream) as one group, so that sends and
  // receives among them cannot deadlock; returns without waiting for the
  // device. Ops are not marked done: their completion is the stream's.
  virtual zpResult_t enqueue(const std::vector<Op*>& ops) = 0;
  // Enqueues a standard collective (not kBarrier) on stream.
  virtual zpResult_t enqueueCollective(const CollArgs& args, void* stream) = 0;
  // Device memory of at least `bytes` for a call's own staging on stream
  // (routed alltoallv's chunks). Work enqueued on stream after
  // acquireStaging may use it; a caller that acquired must release it, with
  // the same stream and buffer, after its last op that uses it, also when
  // an enqueue failed. The host never waits for the device here.
  virtual zpResult_t acquireStaging(size_t bytes, void* stream, void** buf) = 0;
  virtual zpResult_t releaseStaging(void* stream, void* buf) = 0;
  // A failure after enqueue (zpSuccess if none), its message in *why.
  virtual zpResult_t asyncError(std::string* why) = 0;
  // Ends the device communicator: abort drops queued work at once (a peer
  // may be dead); otherwise it waits for the work, up to the timeout.
  virtual void close(bool abort) = 0;
  // The device communicator (ncclComm_t) and its device ordinal.
  virtual void* native() = 0;
  virtual int device() const = 0;
  // "NCCL 2.28.9 on device 0", for logs.
  virtual std::string describe() const = 0;
};

// The device data plane as the transport table lists it (streamTransportKind(),
// defined in transport/transports.cc beside hostTransports()). Its start is
// collective: rank 0 makes a join key that init's setup round carries to
// every rank (PeerInfo, src/core/peer_info.h), and every rank, once all can
// use a device, creates it with that key.
struct StreamTransportKind {
  const char* name;
  // Whether this build has it and this process a device it may use; if
  // not, *why says why.
  bool (*usable)(std::string* why);
  // Rank 0's part before the setup round: what every rank needs to join
  // (NCCL's unique id), opaque to the communicator.
  zpResult_t (*makeJoinKey)(std::string* key);
  // The device this rank uses (ZP_CUDA_DEVICE), given its index among its
  // node's ranks.
  zpResult_t (*chooseDevice)(int localRank, int* device);
  // Creates this rank's end on device from rank 0's key (collective: every
  // rank calls it with the same key); gives up after ctx.cfg->timeoutMs.
  zpResult_t (*create)(const TransportContext& ctx, const std::string& joinKey, int device,
                       std::unique_ptr<StreamTransport>* out);
  // zpAddDeviceInitHook: hook(device) runs once per device in this process,
  // with the device current, where its first device communicator is made.
  zpResult_t (*addInitHook)(void (*hook)(int device));
};
const StreamTransportKind& streamTransportKind();

}  // namespace zp
