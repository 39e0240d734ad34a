// Network transport over UCX (UCP tag matching) for ranks on other nodes,
// host buffers. UCX picks the wire (TCP here, InfiniBand / RoCE in a cluster)
// and pipelines large messages itself (rendezvous); many messages are in
// flight at once since every posted Op is one UCP request.
//
// Tags: [type 2 bits | op kind 6 bits | source rank 20 bits | sequence 36 bits].
// A receive matches on everything but the kind, then checks the kind, so
// ranks that call operations in different orders get an error, not a hang.
//
// Each rank's context is bound to its NIC (ZP_NET_DEVICES, or
// ZP_SOCKET_IFNAME): UCX 1.13 can hang setting up connections when a context
// sees several NICs. Waiting sleeps on the worker's event fd.
//
// A build without UCX (ZP_WITH_UCX=0: configured with -DZP_WITH_UCX=OFF, or
// AUTO without UCX) compiles ucx_none.cc instead of ucx_transport.cc: the
// class keeps its interface, so the code that holds one compiles unchanged,
// but available() says why there is none and create() fails, so a
// communicator that spans nodes fails at init (Comm::initTransports).
#pragma once

// Every file that includes this header must see the same class: CMake
// defines ZP_WITH_UCX (0 or 1) for the library and for what links it.
#ifndef ZP_WITH_UCX
#error "ZP_WITH_UCX is not defined: it is set by CMakeLists.txt (0 or 1) for every target that includes this header"
#endif
#if ZP_WITH_UCX
#include <ucp/api/ucp.h>
#endif

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "src/core/transport.h"

namespace zp {

class UcxTransport : public CarrierTransport {
 public:
  // Whether this build has UCX; if not, *why says so and what to do.
  static bool available(std::string* why);
  // Creates the context and worker; *address is what peers need to connect.
  // nic: the one network device this rank uses (empty: UCX picks).
  // eagerUpTo: messages up to this size go eagerly, never by rendezvous (the
  // relay's chunks; 0: UCX's own threshold).
  static zpResult_t create(const TransportContext& ctx, const std::string& nic, size_t eagerUpTo,
                           std::unique_ptr<UcxTransport>* out, std::string* address);
  // Creates endpoints to every remote peer from their addresses (indexed by rank).
  zpResult_t connect(const std::vector<std::string>& addresses) override;
  ~UcxTransport() override;

  void post(Op* op) override;
  void sendStatus(int peer, uint64_t collSeq, zpResult_t status, const std::string& text) override;
  // Probes the worker for peer's message (its whole tag: kind included).
  bool arrived(int peer, uint64_t seq, size_t* bytes) override;
  bool progress() override;
  bool busy() const override;
  void dropOps(zpResult_t status, const std::string& why) override;
  void abortPeers(zpResult_t code, const std::string& why) override;
  void leave() override;
  std::vector<int> busyPeers() const override;
  void checkAlive() override {}  // UCX reports dead peers through the endpoint error handler
  std::string describe(int peer) const override;
  // Waiting (Transport): an event fd.
  Wakeup wakeup() const override { return Wakeup::kEventFd; }
  void waitEvents(int ms) override { wait(ms); }
  bool armEvents() override { return arm(); }
  bool eventsReady() const override { return ready(); }
#if ZP_WITH_UCX
  int eventFd() const override { return efd_; }
#endif
  // Sleeps on the worker's event fd until something arrives or ms pass.
  void wait(int ms);
  // wait() in two steps, for a thread that must not hold the communicator's
  // lock while it sleeps: arm() under the lock (false: events are waiting
  // already), then sleep() without it.
  bool arm();
  void sleep(int ms) const;
  // After arm(): true if events have come since (does not block).
  bool ready() const;
  // Stops using the network path to peer (a NIC on it is down, see
  // the router's NIC health, src/route/nic_health.h): its operations fail with why, its endpoint is closed
  // by force, and its errors no longer break the communicator.
  void cutPeer(int peer, const std::string& why) override;

  struct Request;  // one UCP request and what it completes
  // Requests of every UcxTransport in this process not yet freed. Zero once
  // every communicator is destroyed: each Request is freed by its completion
  // or, at the latest, by its transport's destructor (every rank of the
  // multinode tests checks this after destroying its communicator).
  static long liveRequests();

 private:
#if ZP_WITH_UCX
  struct Peer {
    ucp_ep_h ep = nullptr;
    // Control messages (statuses, the relay's acknowledgements) on an
    // endpoint of their own: on ep they would wait behind megabytes of
    // eager data queued for the same peer.
    ucp_ep_h ctrlEp = nullptr;
    bool failed = false;
    bool bye = false;
    // One past the highest sequence number of the messages posted to this
    // peer and of those received from it (relays aside), and what the peer
    // said of its own with its goodbye (UcxTransport::completesAfterBye).
    uint64_t sentEnd = 0, receivedEnd = 0;
    uint64_t peerSentEnd = 0, peerReceivedEnd = 0;
    bool cut = false;  // cutPeer: unreachable, but alive
    std::string why;
  };
  struct EpArg {  // what the endpoint error handler is told
    UcxTransport* t;
    int peer;
  };
  struct OpState {
    int parts = 0;  // UCP requests still running for this op
    std::vector<Request*> reqs;
  };

  UcxTransport(const TransportContext& ctx, const std::string& nic, size_t eagerUpTo)
      : ctx_(ctx), device_(nic), eagerUpTo_(eagerUpTo) {}
  zpResult_t init(std::string* address);
  void submit(Op* op, bool meta);
  void releasePart(Op* op);
  void attach(Request* r, ucs_status_ptr_t handle);
  bool takeProbed(Request* r);
  void onCallback(Request* r, ucs_status_t status, size_t length, ucp_tag_t senderTag);
  void complete(Request* r, ucs_status_t status, size_t length, ucp_tag_t senderTag);
  void postCtrlRecv();
  void sendToAll(uint32_t type, zpResult_t code, const std::string& why);
  void sendCtrl(int peer, uint32_t type, uint64_t seq, int32_t status, const std::string& text);
  // A control message's payload: this, then its text.
  struct CtrlHead {
    int32_t status;
    uint32_t unused;
    // A goodbye's: one past the highest sequence number of the messages the
    // leaving rank sent to the receiver, and of those it received from it.
    uint64_t sentEnd, receivedEnd;
  };
  void onCtrl(int peer, uint32_t type, uint64_t seq, const CtrlHead& h, std::string text);
  void peerFailed(int peer, const std::string& why);
  std::vector<ucs_status_ptr_t> closing_;  // forced closes of cut peers' endpoints
  void finishOp(Op* op, zpResult_t st, const std::string& err);
  // Fails the peer's ops; after its goodbye (afterBye), all but those that
  // complete still (completesAfterBye).
  void failPeerOps(int peer, const std::string& why, bool afterBye = false);
  // After the peer's goodbye: whether op completes still, a receive of a
  // message it sent or a send it received before leaving.
  bool completesAfterBye(const Op* op) const;
  static void sendCb(void* request, ucs_status_t status, void* user);
  static void recvCb(void* request, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user);
  static void epErrorCb(void* arg, ucp_ep_h ep, ucs_status_t status);

  TransportContext ctx_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::string device_;
  size_t eagerUpTo_ = 0;
  std::vector<Peer> peers_;  // by rank; only remote ranks have endpoints
  std::map<Op*, OpState> ops_;
  std::set<Request*> ctrlReqs_;  // control sends in flight, and the posted control receive
  std::set<Request*> orphans_;   // requests dropOps gave up waiting for (their ops are done)
  std::vector<Request*> probing_;  // user receives waiting for their message (takeProbed)
  Request* ctrlRecv_ = nullptr;
  std::vector<char> ctrlBuf_;
  std::vector<std::pair<int, std::string>> epErrors_;  // reported inside ucp_worker_progress
  std::vector<std::unique_ptr<EpArg>> epArgs_;
#else
  UcxTransport() = default;  // never made: create() fails in a build without UCX
#endif
};

}  // namespace zp
