// The communicator and its executor. A collective or a group of
// point-to-point calls becomes a list of Ops (src/core/transport.h); the
// executor posts each to the transport that reaches its peer and drives every
// transport's progress until all are done, a peer fails, or the timeout
// expires. The communicator knows its transports only through the Transport
// interface: it makes those of the table of host transports that it needs
// (hostTransports(), src/core/transport.h), and a layer above may install
// another for some peers (the relay, by the routing layer in src/route).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "include/zeppelin.h"
#include "src/core/bootstrap.h"
#include "src/core/config.h"
#include "src/core/routing.h"
#include "src/core/topology.h"
#include "src/core/transport.h"
#include "src/core/wait_stats.h"
#include "src/util/function_ref.h"

namespace zp {

// What the planner needs of a communicator's layout: each rank's node, NICs
// per node (the most any node has) and their rate in bits/s (0: unknown).
struct CommShape {
  std::vector<int> nodeOf;
  int nicsPerNode = 0;
  double nicBitsPerSec = 0;
};

class Comm : public TransportSink {
 public:
  // Bootstrap, then shared memory within the node and UCX across nodes.
  // netEagerUpTo: the network sends messages up to this size eagerly
  // (TransportSetup::eagerUpTo), which the layer above decides (with
  // routing, the relay's chunks: routedEagerBytes in src/route).
  static zpResult_t create(int nranks, const zpUniqueId& id, int rank, const Config& cfg, size_t netEagerUpTo,
                           std::unique_ptr<Comm>* out);
  // Every rank gives a blob and gets every rank's (all->size() == nranks).
  using BlobExchange = std::function<zpResult_t(const std::string& mine, std::vector<std::string>* all)>;
  // A communicator of some of parent's ranks (zpCommSplit): parent's ranks
  // `members`, in their new order, this one being members[rank]. No
  // bootstrap: the ranks' identities come from the parent, and the blob
  // round that sets up the transports (NIC rail and rate, device hello, UCX
  // address) runs through `exchange` (over the parent's transports).
  // `secret` names its shared resources, different for every child;
  // netEagerUpTo as for create.
  static zpResult_t createChild(const Comm& parent, const std::vector<int>& members, int rank, const Config& cfg,
                                size_t netEagerUpTo, const uint8_t secret[16], const BlobExchange& exchange,
                                std::unique_ptr<Comm>* out);
  // The secret of the unique id this communicator was made from (or derived).
  const uint8_t* secret() const { return id_.secret; }
  ~Comm() override;
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const { return rank_; }
  int nranks() const { return nranks_; }
  const Config& cfg() const { return cfg_; }
  bool isLocal(int peer) const;
  // The layout, by rank: its node (0..nnodes-1, in order of first rank), its
  // index among its node's ranks, and its rail (the index of its NIC).
  int nnodes() const { return nnodes_; }
  const std::vector<int>& nodeOf() const { return nodeOf_; }
  const std::vector<int>& localIndex() const { return localIndex_; }
  const std::vector<int>& rail() const { return rail_; }
  // Nodes, their ranks and NICs with the rates their owners reported, as
  // found at init (the router keeps its own copy, with NICs that went down).
  const ClusterTopology& cluster() const { return cluster_; }
  // The layout as the planner sees it (zpPlanBatch).
  CommShape shape() const;
  // This rank's network device (empty on one node, or when UCX picks).
  const std::string& nicName() const { return nicName_; }
  // The names of this node's NICs, by rail (empty on one node).
  const std::vector<std::string>& nodeNicNames() const { return nodeNicNames_; }
  // The transport from the table that reaches peer, for a transport built
  // on them (the relay).
  CarrierTransport* carrierFor(int peer) const { return carrierByPeer_[peer]; }
  TransportContext transportContext();

  // Makes t the transport that reaches `peers` (a layer above: the relay).
  // Control messages that came before it is installed are handed to it.
  void installTransport(std::unique_ptr<Transport> t, const std::vector<int>& peers);
  // The routing state (src/route) of a communicator whose traffic to other
  // nodes is routed, else null. It outlives the installed transports.
  Routing* routing() const { return routing_.get(); }
  void setRouting(std::unique_ptr<Routing> routing) { routing_ = std::move(routing); }
  Transport* transportFor(int peer) const { return byPeer_[peer]; }
  // The device data plane (NCCL); null when this communicator moves host
  // buffers only, for the reason noDeviceWhy() gives.
  StreamTransport* streamTransport() const { return device_.get(); }
  const std::string& noDeviceWhy() const { return noDeviceWhy_; }
  // Starts a thread that drives progress while no call runs (a relay must
  // move other ranks' chunks even while its own rank computes).
  void startProgressThread();

  // One call at a time per communicator; whoever holds it drives progress.
  std::mutex& mutex() { return mu_; }
  // A call's hold on the communicator: mutex(), and the mark that this
  // thread runs a call on it. A call from a second thread while one runs is
  // refused (zpInvalidUsage) instead of waiting for the lock: NCCL leaves
  // concurrent use of one communicator undefined, and here the two threads'
  // calls would meet in a different order on each rank, mixing their data.
  // Not for zpCommGetAsyncError, zpCommAbort or zpCommDestroy, which may
  // come from any thread.
  class Call {
   public:
    Call(Comm* c, const char* fn);
    ~Call();
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    // zpSuccess if held; else the error (already recorded with fail()).
    zpResult_t status() const { return status_; }

   private:
    Comm* c_;
    zpResult_t status_;
  };
  // The next collective's sequence number (the same on every rank).
  uint64_t nextCollSeq() { return collSeq_++; }
  // Which peers this rank waits for (wait_stats.h), made at the first call
  // that records; with mutex() held.
  WaitStats& waitStats() {
    if (!waitStats_) waitStats_.reset(new WaitStats(nranks_, rank_, (uint64_t)cfg_.stragglerMs * 1000));
    return *waitStats_;
  }
  // The API call running now (its name as Call got it), for messages about
  // a wait: what the user called, not the transfers under it.
  const char* callName() const { return callName_ ? callName_ : "a call"; }
  // Data calls made on this communicator so far (any thread): the opCount
  // of ZP_DEBUG_SUBSYS=COLL / P2P lines, the same on every rank for the
  // same call sequence. A load and a store, not a locked add (this is on
  // every call's path): calls on one communicator come from one thread at a
  // time (Call refuses others), so none is lost but in such misuse.
  uint64_t nextOpCount() {
    const uint64_t n = opCount_.load(std::memory_order_relaxed);
    opCount_.store(n + 1, std::memory_order_relaxed);
    return n;
  }
  // A failure that broke the communicator (any thread), and its message
  // (with mutex() held: it is written under the lock, before the code).
  zpResult_t asyncError() const { return asyncError_.load(std::memory_order_acquire); }
  const std::string& asyncMessage() const { return asyncMsg_; }
  // Between calls: drives progress when no call holds the lock, so that a
  // caller who polls learns of a peer's failure; returns the async error.
  // From any thread, while another runs a call (NCCL's polling pattern).
  zpResult_t pollAsyncError();

  // TransportSink.
  void onStatus(int peer, uint64_t collSeq, zpResult_t status, std::string text) override;
  void setAsyncError(zpResult_t code, const std::string& msg, bool fromPeer = false) override;

  // Runs ops on several communicators together (a group may span them).
  struct Work {
    Comm* comm;
    std::vector<Op*> ops;
  };
  // until (if given): returns once it is true, not once every op is done;
  // the ops not done yet move on with the next call's progress, and must
  // outlive it (a later runOps must wait for them). A failed op is reported
  // only once every op is done.
  static zpResult_t runOps(std::vector<Work>& work, FunctionRef<bool()> until = nullptr);
  zpResult_t runOps(std::vector<Op*>& ops, FunctionRef<bool()> until = nullptr);
  // Device ops (each with its stream) to the StreamTransport, as one group;
  // returns once they are enqueued. Call with mutex() held.
  zpResult_t enqueueOnStreams(const std::vector<Op*>& ops);
  // A standard collective to the StreamTransport, on stream.
  zpResult_t enqueueCollectiveOnStream(const CollArgs& args, void* stream);
  // An error if calls may not run: the communicator is broken, or was destroyed.
  zpResult_t checkUsable() const;
  // Every rank reports its result of collective number collSeq; every rank
  // returns the first failure (in rank order) with its message, so all ranks
  // agree on the outcome.
  zpResult_t agreeOnResult(uint64_t collSeq, zpResult_t mine, const std::string& myMsg);
  // Tells peers this rank is leaving (abort: and that they must fail at
  // once). Call without holding mutex() (it stops the progress thread, then takes it).
  void leave(bool abort);
  // From any thread, without the lock: a call blocked in this communicator
  // returns zpRemoteError within a wait slice (100 ms), so that zpCommAbort
  // never waits for it to time out.
  void requestAbort() { abortRequested_ = true; }

 private:
  Comm() = default;
  void findNodes();
  zpResult_t initTransports(const BlobExchange& exchange);
  zpResult_t connectTransports(const std::vector<const TransportKind*>& kinds,
                               const std::vector<std::vector<std::string>>& addresses);
  void progressLoop();
  // Moves every transport forward; true if anything moved.
  bool progress();
  // Sleeps until a transport may have news, at most ms.
  uint32_t waitToken() const;
  void wait(uint32_t token, int ms);
  void dropOps(zpResult_t status, const std::string& why);
  std::vector<int> busyPeers() const;
  void checkAlive();
  // Tells every peer the communicator broke (once, unless a peer told us).
  void passOnFault(zpResult_t code, const std::string& why);
  // This rank found the communicator broken (msg, code): it breaks it, tells
  // the peers (zpRemoteError, with this rank named) before it drops the
  // operations, so that dropOps may cut a peer that still holds a request.
  void breakHere(zpResult_t code, const std::string& msg);
  void sendStatus(int peer, uint64_t collSeq, zpResult_t status, const std::string& text);
  static zpResult_t progressUntil(const std::vector<Comm*>& comms, FunctionRef<bool()> done,
                                  FunctionRef<std::vector<int>(Comm*)> waitingOn, const char* what);
  // any_source.cc: receives without a single peer when posted. The sends
  // and receives of ops with this same rank, paired locally.
  void runSelfOps(std::vector<Op*>& ops);
  // Gives op its sequence number and posts it to its peer's transport.
  void postOp(Op* op);
  // Marks the receives naming a rank that come after a receive from any
  // source (anyHeld_: posted once it is matched); true if any such receive
  // waits to be matched.
  bool holdBehindAnySource(std::vector<Op*>& ops);
  // Matches and posts receives from any source whose message has come, and
  // the receives held behind them, in call order; true while some wait.
  bool matchAnySource(std::vector<Op*>& ops);
  // Fails the receives not posted yet (the call failed).
  void failUnposted(std::vector<Op*>& ops, zpResult_t status);
  std::vector<char> anyHeld_;   // by op of the running call: held behind a receive from any source
  std::vector<char> anyTaken_;  // matchAnySource's ranks not to match now
  int anyNext_ = 0;             // where its next search starts
  // runOps' work: n lists of ops on comms (each list's communicator).
  static zpResult_t runWork(Work* work, size_t n, const std::vector<Comm*>& comms, FunctionRef<bool()> until);
  std::vector<Comm*> self_;  // {this}: runOps' list of one communicator
  // The running call's first receive that stamps the wait statistics'
  // entry (Op::enteredUs), while runWork waits: progressUntil stamps it
  // when it first finds the call waiting (its first look at the clock),
  // then forgets it.
  Op* waitEntry_ = nullptr;

  int rank_ = 0;
  int nranks_ = 0;
  Config cfg_;
  IdLayout id_;
  std::vector<RankInfo> ranks_;
  int nnodes_ = 1;
  std::vector<int> nodeOf_, localIndex_, rail_;
  ClusterTopology cluster_;
  std::string nicName_;
  std::vector<std::string> nodeNicNames_;

  std::vector<std::unique_ptr<CarrierTransport>> carriers_;  // made from the table, in its order
  std::vector<CarrierTransport*> carrierByPeer_;             // the one of them that reaches each peer
  Transport* doorbell_ = nullptr;  // the one woken by a doorbell (shared memory)
  Transport* events_ = nullptr;    // the one woken by an event fd (the network), if any
  std::unique_ptr<Routing> routing_;   // before installed_: the relay uses it until it goes
  std::vector<std::unique_ptr<Transport>> installed_;  // by layers above
  std::unique_ptr<StreamTransport> device_;             // device buffers on streams (NCCL), if any
  std::string noDeviceWhy_;
  int inheritedDevice_ = -1;  // a split child's: its parent's device
  size_t netEagerUpTo_ = 0;   // TransportSetup::eagerUpTo, from create's caller
  std::vector<Transport*> transports_;  // the carriers, then the installed ones
  std::vector<Transport*> byPeer_;      // the transport that reaches each peer
  std::vector<std::pair<int, std::pair<uint64_t, std::string>>> earlyControl_;  // control messages nobody took yet

  std::mutex mu_;
  std::atomic<std::thread::id> caller_{};  // the thread running a call (Call), if any
  std::thread progressThread_;
  std::atomic<bool> progressStop_{false};

  // Per peer, how many messages each way so far: the k-th send to a peer
  // matches the peer's k-th receive from this rank.
  std::vector<uint64_t> sendSeq_, recvSeq_;
  uint64_t collSeq_ = 0;
  std::unique_ptr<WaitStats> waitStats_;
  const char* callName_ = nullptr;  // set by Call
  // Status reports of collectives, by (peer, collective sequence).
  std::map<std::pair<int, uint64_t>, std::pair<zpResult_t, std::string>> statuses_;

  // Set only with mu_ held (transports' callbacks run inside progress(),
  // under the lock), but read by pollAsyncError without it while another
  // thread's call holds it: an atomic, stored after the message.
  std::atomic<zpResult_t> asyncError_{zpSuccess};
  std::string asyncMsg_;
  bool asyncFromPeer_ = false;  // a peer told us; else we found it and tell the peers
  bool faultSent_ = false;
  bool left_ = false;  // leave() ran: calls still queued in a group fail
  std::atomic<bool> abortRequested_{false};
  std::atomic<uint64_t> opCount_{0};
};

// How many times calls of this process have waited on their peers over the
// host transports (every such wait is one Comm::progressUntil). Tests check
// that a device call adds none when it must only enqueue. Exact for calls
// from one thread; concurrent waits on several threads may count as one.
uint64_t hostPeerWaits();

// The process's interrupt check (zpSetInterruptCheck; NULL: none). A call
// that has waited on its peers for kInterruptCheckMs asks it, and asks again
// each kInterruptCheckMs while it waits.
using InterruptCheck = int (*)(void* arg);
void setInterruptCheck(InterruptCheck check, void* arg);
constexpr uint64_t kInterruptCheckMs = 100;

}  // namespace zp
