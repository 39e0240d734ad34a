// The communicator and its executor. A collective or a group of
// point-to-point calls becomes a list of Ops (one per send or receive with one
// peer); the executor posts them to the transport that reaches each peer and
// drives progress until all are done, a peer fails, or the timeout expires.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <atomic>
#include <mutex>
#include <thread>
#include <string>
#include <utility>
#include <vector>

#include "include/zeppelin.h"
#include "src/core/bootstrap.h"
#include "src/core/config.h"
#include "src/core/topology.h"
#include "src/route/router.h"

namespace zp {

class Relay;
class ShmTransport;
class Transport;
class UcxTransport;

// Which call an Op belongs to; carried in every message so that a rank that
// calls operations in a different order than its peer gets an error, not a hang.
// The router's relays (src/route/relay.h) have kinds of their own: a header
// describing a chunk, then the chunk.
// kControl marks a relayed control message (Comm::sendStatus to a rank
// with no working network path to this one).
enum class OpKind : uint32_t { kP2P = 0, kAlltoallv = 1, kRelayHeader = 2, kRelayData = 3, kControl = 4 };
const char* opKindName(OpKind kind);

// A receive from any rank of another node (the router's relay headers).
constexpr int kAnyRemotePeer = -2;

// Control messages ride on status messages with collective sequence numbers
// no call reaches (UCX tags carry 36 bits).
constexpr uint64_t kSeqLeaving = (1ull << 36) - 1;  // this rank reached zpCommDestroy
constexpr uint64_t kSeqNicDown = (1ull << 36) - 2;  // text: "node rail name"
constexpr uint64_t kSeqRelayAck = (1ull << 36) - 3; // text: the relay's acknowledgements

struct Op {
  bool isSend = false;
  int peer = -1;  // a rank, or kAnyRemotePeer
  OpKind kind = OpKind::kP2P;
  void* buf = nullptr;  // for sends, read only
  size_t bytes = 0;
  size_t typeSize = 1;  // to report mismatches in elements
  uint64_t seq = 0;     // position among this pair's messages, set when posted
  bool done = false;
  zpResult_t status = zpSuccess;
  std::string error;
  size_t progressed = 0;  // bytes moved so far
  // Optional metadata sent ahead of the data (a send's `meta`, copied into
  // the matching receive's `meta`): alltoallv ships each rank's counts so
  // every rank can check every pair without another round of messages.
  void* meta = nullptr;
  uint32_t metaBytes = 0;
  // Routed through the relay (the router's plan for a collective's transfer):
  // its id among the pair's transfers of this kind, and its pieces.
  bool routed = false;
  uint64_t xfer = 0;
  const std::vector<Piece>* pieces = nullptr;

  void finish(zpResult_t st, std::string err = {}) {
    done = true;
    status = st;
    if (st != zpSuccess && error.empty()) error = std::move(err);
  }
};

inline Op makeOp(OpKind kind, bool isSend, int peer, void* buf, size_t bytes, size_t typeSize) {
  Op op;
  op.kind = kind;
  op.isSend = isSend;
  op.peer = peer;
  op.buf = buf;
  op.bytes = bytes;
  op.typeSize = typeSize;
  return op;
}

struct Comm {
  int rank = 0;
  int nranks = 0;
  Config cfg;
  IdLayout id;
  std::vector<RankInfo> ranks;
  std::unique_ptr<ShmTransport> shm;  // ranks of this node
  std::unique_ptr<UcxTransport> net;  // ranks of other nodes (none on a single node)
  std::vector<Transport*> transports;  // shm, then net if there is one
  std::vector<Transport*> route;      // by peer: the transport that reaches it
  // The layout, by rank: its node (0..nnodes-1, in order of first rank), its
  // index among its node's ranks, and its rail (the index of its NIC).
  int nnodes = 1;
  std::vector<int> nodeOf, localIndex, rail;
  // The router's view (nodes, ranks, NICs with their rates) and settings;
  // relay is set when inter-node traffic is routed (routes()).
  ClusterTopology topo;
  RouteParams routeParams;
  std::unique_ptr<Relay> relay;
  // The last alltoallv's plan, and the count matrix it was made from.
  Plan lastPlan;
  std::vector<uint64_t> lastPlanKey;
  std::mutex mu;  // one call at a time per communicator; whoever holds it drives progress
  // With routing, a thread serves relays while no call runs (proxies must
  // move other ranks' chunks even when their own rank computes).
  std::thread proxyThread;
  std::atomic<bool> proxyStop{false};
  // NIC failure (routed communicators): this rank watches its own NIC and
  // passes news of any NIC found down to every rank it can reach.
  std::string nicName;
  int nicProbeFd = -1;
  uint64_t nicCheckedMs = 0;
  struct NicDown {
    int node, rail;
    std::string name;
  };
  std::vector<NicDown> nicNews;  // heard, not yet acted on

  // Per peer, how many messages each way so far: the k-th send to a peer
  // matches the peer's k-th receive from this rank.
  std::vector<uint64_t> sendSeq, recvSeq;
  uint64_t collSeq = 0;
  // Status reports of collectives, by (peer, collective sequence).
  std::map<std::pair<int, uint64_t>, std::pair<zpResult_t, std::string>> statuses;


  // A failure that breaks the communicator: a dead or aborted peer, a timeout.
  zpResult_t asyncError = zpSuccess;
  std::string asyncMsg;
  bool asyncFromPeer = false;  // a peer told us; else we found it and tell the peers
  bool faultSent = false;

  Comm();
  ~Comm();

  bool isLocal(int peer) const;
  // Inter-node traffic goes through the router: routing is on, and there are
  // several nodes and several rails to spread it over.
  bool routes() const { return relay != nullptr; }

  // Moves every transport forward; true if anything moved.
  bool progress();
  // Sleeps until a transport may have news, at most ms.
  uint32_t waitToken() const;
  void wait(uint32_t token, int ms);
  void dropOps(zpResult_t status, const std::string& why);
  std::vector<int> busyPeers() const;
  void checkAlive();
  // Breaks the communicator. An error found here is passed on to every peer
  // (fromPeer: it came from one), so that all ranks fail, not just the first.
  void setAsyncError(zpResult_t code, const std::string& msg, bool fromPeer = false);
  void onStatus(int peer, uint64_t collSeq, zpResult_t status, std::string text);
  // A status or control message to peer: directly, or through the relay
  // when no network path joins the two ranks any more.
  void sendStatus(int peer, uint64_t collSeq, zpResult_t status, const std::string& text);
  // The network path between this rank and peer works: no NIC it depends on
  // is down. In a rail-optimized network (the emulated cluster), packets to
  // a rank leave on the NIC of its rail, so both ends' rails on both nodes count.
  bool directAlive(int peer) const;
  bool nicUp(int node, int rail) const;
  // Looks at this rank's NIC (every few ms); down: the news goes out.
  void checkNic();
  // Acts on NIC news: the router leaves the NIC out from now on, peers
  // behind it are cut off, the relay re-sends what went that way, and the
  // news goes on to every rank this one can reach (once per NIC).
  bool applyNicNews();
};

zpResult_t commCreate(int nranks, const zpUniqueId& id, int rank, const Config& cfg,
                      std::unique_ptr<Comm>* out);
// Tells peers this rank is leaving (abort: and that they must fail at once).
// Call without holding comm->mu (it stops the proxy thread, then takes it).
void commLeave(Comm* comm, bool abort);

// What the planner needs of a communicator's layout: each rank's node, NICs
// per node (the most any node has) and their rate in bits/s (0: unknown).
struct CommShape {
  std::vector<int> nodeOf;
  int nicsPerNode = 0;
  double nicBitsPerSec = 0;
};
zpResult_t commShape(zpComm_t comm, const char* fn, CommShape* out);

// Runs ops on several communicators together (a group may span them).
struct CommOps {
  Comm* comm;
  std::vector<Op*> ops;
};
zpResult_t runOps(std::vector<CommOps>& work);
zpResult_t runOps(Comm* comm, std::vector<Op*>& ops);

// Every rank reports its result of collective number collSeq; every rank
// returns the first failure (in rank order) with its message, so all ranks
// agree on the outcome.
zpResult_t agreeOnResult(Comm* comm, uint64_t collSeq, zpResult_t mine, const std::string& myMsg);

}  // namespace zp
