#include "src/core/comm.h"

#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "src/core/log.h"
#include "src/core/socket.h"
#include "src/core/topology.h"
#include "src/route/relay.h"
#include "transport/shm/shm_transport.h"
#include "transport/ucx/ucx_transport.h"

namespace zp {

const char* opKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kP2P: return "send/recv";
    case OpKind::kAlltoallv: return "alltoallv";
    case OpKind::kRelayHeader: return "relay header";
    case OpKind::kRelayData: return "relay data";
    case OpKind::kControl: return "relayed control message";
  }
  return "unknown operation";
}

Comm::Comm() = default;
Comm::~Comm() {
  if (proxyThread.joinable()) {
    proxyStop = true;
    proxyThread.join();
  }
  // The transports may still complete the relay's operations while they shut down.
  net.reset();
  shm.reset();
  relay.reset();
  if (nicProbeFd >= 0) close(nicProbeFd);
}

bool Comm::isLocal(int peer) const {
  return strncmp(ranks[peer].nodeId, ranks[rank].nodeId, sizeof(ranks[peer].nodeId)) == 0;
}

void Comm::setAsyncError(zpResult_t code, const std::string& msg, bool fromPeer) {
  if (asyncError != zpSuccess) return;
  asyncError = code;
  asyncMsg = msg;
  asyncFromPeer = fromPeer;
}

void Comm::onStatus(int peer, uint64_t seq, zpResult_t status, std::string text) {
  if (seq == kSeqNicDown) {
    NicDown n;
    char name[64] = "";
    if (sscanf(text.c_str(), "%d %d %63s", &n.node, &n.rail, name) >= 2 && n.node >= 0 && n.node < nnodes &&
        n.rail >= 0) {
      n.name = name;
      nicNews.push_back(n);  // acted on after the transports' progress, not inside their callbacks
    }
    return;
  }
  if (seq == kSeqRelayAck) {
    if (relay) relay->onAck(peer, text);
    return;
  }
  statuses[{peer, seq}] = {status, std::move(text)};
}

void Comm::sendStatus(int peer, uint64_t seq, zpResult_t status, const std::string& text) {
  if (isLocal(peer) || directAlive(peer) || !relay) route[peer]->sendStatus(peer, seq, status, text);
  else relay->sendControl(peer, seq, status, text);
}

bool Comm::nicUp(int node, int k) const {
  const std::vector<Nic>& nics = topo.node[node].nics;
  return k < 0 || k >= (int)nics.size() || !nics[k].down;
}

bool Comm::directAlive(int peer) const {
  if (isLocal(peer)) return true;
  int a = nodeOf[rank], b = nodeOf[peer];
  return nicUp(a, rail[rank]) && nicUp(b, rail[peer]) && nicUp(a, rail[peer]) && nicUp(b, rail[rank]);
}

void Comm::checkNic() {
  if (nicName.empty() || !nicUp(nodeOf[rank], rail[rank])) return;
  uint64_t now = nowMs();
  if (now - nicCheckedMs < 5) return;
  nicCheckedMs = now;
  if (nicProbeFd < 0) nicProbeFd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ifreq ifr;
  memset(&ifr, 0, sizeof(ifr));
  snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", nicName.c_str());
  if (nicProbeFd < 0 || ioctl(nicProbeFd, SIOCGIFFLAGS, &ifr) != 0) return;  // cannot tell: assume it works
  if ((ifr.ifr_flags & IFF_UP) && (ifr.ifr_flags & IFF_RUNNING)) return;
  ZP_WARN(kSubNet, "rank %d: NIC %s (rail %d of node %d) is down; its traffic moves to the node's other NICs", rank,
          nicName.c_str(), rail[rank], nodeOf[rank]);
  nicNews.push_back({nodeOf[rank], rail[rank], nicName});
}

bool Comm::applyNicNews() {
  if (nicNews.empty()) return false;
  std::vector<NicDown> news = std::move(nicNews);
  nicNews.clear();
  bool changed = false;
  for (const NicDown& n : news) {
    std::vector<Nic>& nics = topo.node[n.node].nics;
    if (n.rail >= (int)nics.size() || nics[n.rail].down) continue;
    nics[n.rail].down = true;
    changed = true;
    lastPlanKey.clear();  // plans made with the NIC are void
    ZP_INFO(kSubNet, "rank %d: NIC %s (rail %d of node %d) is down: routing around it", rank, n.name.c_str(), n.rail,
            n.node);
    std::string text = std::to_string(n.node) + " " + std::to_string(n.rail) + " " + n.name;
    for (int p = 0; p < nranks; p++)
      if (p != rank && directAlive(p)) route[p]->sendStatus(p, kSeqNicDown, zpSuccess, text);
    for (int p = 0; p < nranks; p++)
      if (!directAlive(p)) net->cutPeer(p, "the network path to rank " + std::to_string(p) + " is down (NIC " + n.name +
                                               " of node " + std::to_string(n.node) + ")");
    bool anyUp = false;
    for (int k = 0; k < (int)nics.size(); k++) anyUp |= !nics[k].down;
    if (!anyUp)
      setAsyncError(zpRemoteError, "node " + std::to_string(n.node) + " has no working NIC left (the last, " + n.name +
                                       ", went down): no path to its ranks");
  }
  if (changed) relay->onPathsChanged();
  return changed;
}

// The NIC this rank sends through: from ZP_TOPO_FILE if given, else found on
// the node (hwloc, sysfs) and picked by locality, restricted to ZP_NET_DEVICES.
// *rail is its index among the node's NICs (NIC k of every node forms rail k).
static zpResult_t chooseNic(Comm* c, std::string* nic, int* rail, double* bitsPerSec) {
  *rail = 0;
  *bitsPerSec = 0;
  int localRank = 0, localRanks = 0;
  for (int r = 0; r < c->nranks; r++)
    if (c->isLocal(r)) (r < c->rank ? localRank : localRanks)++;
  localRanks += localRank;
  std::string file = envString("ZP_TOPO_FILE");
  if (!file.empty()) {
    ClusterTopology topo;
    ZP_CHECK(loadTopoFile(file, &topo));
    if (topo.nranks() != c->nranks)
      return fail(zpInvalidArgument, "ZP_TOPO_FILE=%s describes %d ranks, but the communicator has %d", file.c_str(),
                  topo.nranks(), c->nranks);
    int idx = topo.rankNic[c->rank];
    if (idx >= 0) {
      *nic = topo.node[topo.rankNode[c->rank]].nics[idx].name;
      *bitsPerSec = topo.node[topo.rankNode[c->rank]].nics[idx].bitsPerSec;
      *rail = idx;
    }
  } else {
    NodeTopology node;
    ZP_CHECK(discoverNode(&node));
    std::string why;
    int idx = pickNic(node, localRank, localRanks, c->cfg.netDevices, &why);
    if (idx >= 0) {
      *nic = node.nics[idx].name;
      *bitsPerSec = node.nics[idx].bitsPerSec;
      *rail = idx;
    } else if (c->cfg.netDevices.find(',') == std::string::npos && if_nametoindex(c->cfg.netDevices.c_str())) {
      *nic = c->cfg.netDevices;  // named outright, though discovery passes it over (lo, a bridge)
    } else if (!c->cfg.netDevices.empty()) {
      return fail(zpInvalidArgument, "rank %d: ZP_NET_DEVICES=%s: %s", c->rank, c->cfg.netDevices.c_str(), why.c_str());
    } else {
      *nic = c->cfg.socketIfname;  // no NIC found: the bootstrap's interface, or UCX's choice
    }
  }
  ZP_INFO(kSubNet | kSubInit, "rank %d (local rank %d of %d): NIC %s", c->rank, localRank, localRanks,
          nic->empty() ? "chosen by UCX" : nic->c_str());
  return zpSuccess;
}

// The router's view of the cluster: nodes in order of first rank, NIC k of
// a node at the rate its owners (the ranks on rail k) reported.
static void buildTopology(Comm* c, const std::vector<double>& rates) {
  ClusterTopology& t = c->topo;
  t.node.assign(c->nnodes, NodeTopology());
  t.nodeRanks.assign(c->nnodes, {});
  t.rankNode = c->nodeOf;
  t.rankLocal = c->localIndex;
  t.rankNic = c->rail;
  for (int r = 0; r < c->nranks; r++) {
    NodeTopology& n = t.node[c->nodeOf[r]];
    t.nodeRanks[c->nodeOf[r]].push_back(r);
    if ((int)n.nics.size() <= c->rail[r]) n.nics.resize(c->rail[r] + 1);
    Nic& nic = n.nics[c->rail[r]];
    nic.name = "rail" + std::to_string(c->rail[r]);
    if (rates[r] > 0) nic.bitsPerSec = rates[r];
  }
}

// Shared memory within the node; UCX to other nodes. The second bootstrap
// round carries each rank's rail, its NIC's rate and its UCX worker address.
static zpResult_t initTransports(Comm* c, int rootFd) {
  c->sendSeq.assign(c->nranks, 0);
  c->recvSeq.assign(c->nranks, 0);
  c->nodeOf.assign(c->nranks, -1);
  c->localIndex.assign(c->nranks, 0);
  std::vector<int> nodeSize;
  for (int r = 0; r < c->nranks; r++) {
    for (int q = 0; q < r && c->nodeOf[r] < 0; q++)
      if (!strncmp(c->ranks[q].nodeId, c->ranks[r].nodeId, sizeof(c->ranks[r].nodeId))) c->nodeOf[r] = c->nodeOf[q];
    if (c->nodeOf[r] < 0) {
      c->nodeOf[r] = (int)nodeSize.size();
      nodeSize.push_back(0);
    }
    c->localIndex[r] = nodeSize[c->nodeOf[r]]++;
  }
  c->nnodes = (int)nodeSize.size();
  bool remote = c->nnodes > 1;
  // The router's settings first: the network transport sizes its protocols by the chunks.
  c->routeParams.mode = (RouteMode)c->cfg.routing;
  if (c->cfg.routeChunkBytes != Config::kRouterDefault) c->routeParams.chunkBytes = c->cfg.routeChunkBytes;
  if (c->cfg.routeDirectBelow != Config::kRouterDefault) c->routeParams.directBelow = c->cfg.routeDirectBelow;
  std::string address, nic;
  int32_t rail = 0;
  double rate = 0;
  zpResult_t res = remote ? chooseNic(c, &nic, &rail, &rate) : zpSuccess;
  c->nicName = nic;
  if (res == zpSuccess && remote) res = UcxTransport::create(c, nic, &c->net, &address);
  // Every rank takes part in the second round, even to say it failed (an
  // empty blob), so that nobody waits for it.
  const size_t head = sizeof(rail) + sizeof(rate);
  std::string blob;
  if (res == zpSuccess)
    blob = std::string((const char*)&rail, sizeof(rail)) + std::string((const char*)&rate, sizeof(rate)) + address;
  std::vector<std::string> blobs(c->nranks);
  zpResult_t ex = bootstrapAllgather(rootFd, c->rank, blob, c->cfg.timeoutMs, &blobs);
  ZP_CHECK(res);
  ZP_CHECK(ex);
  c->rail.assign(c->nranks, 0);
  std::vector<double> rates(c->nranks, 0);
  std::vector<std::string> addresses(c->nranks);
  for (int r = 0; r < c->nranks; r++) {
    if (blobs[r].size() < head) return fail(zpRemoteError, "rank %d failed to set up its transports", r);
    memcpy(&c->rail[r], blobs[r].data(), sizeof(int32_t));
    memcpy(&rates[r], blobs[r].data() + sizeof(int32_t), sizeof(double));
    addresses[r] = blobs[r].substr(head);
  }
  buildTopology(c, rates);
  if (c->net) ZP_CHECK(c->net->connect(addresses));
  ZP_CHECK(ShmTransport::create(c, &c->shm));
  c->transports = {c->shm.get()};
  if (c->net) c->transports.push_back(c->net.get());
  c->route.resize(c->nranks);
  for (int r = 0; r < c->nranks; r++)
    c->route[r] = c->isLocal(r) ? (Transport*)c->shm.get() : (Transport*)c->net.get();
  bool severalRails = false;
  for (int r = 1; r < c->nranks; r++) severalRails |= c->rail[r] != c->rail[0];
  if (c->cfg.routing != zpRoutingOff && remote && severalRails) c->relay = std::make_unique<Relay>(c);
  return zpSuccess;
}

// The proxy thread: progress while no call holds the lock. It sleeps
// without the lock (on the shared-memory doorbell, checking the network's
// event fd between naps), so a call can start at any time.
static void proxyLoop(Comm* c) {
  uint64_t lastMove = nowMs();
  while (!c->proxyStop.load()) {
    uint32_t token;
    bool armed = true;
    {
      std::lock_guard<std::mutex> lock(c->mu);
      if (c->asyncError != zpSuccess) break;  // the next call reports it
      token = c->shm->waitToken();
      if (c->progress()) {
        lastMove = nowMs();
        continue;
      }
      if (c->net) armed = c->net->arm();
    }
    if (!armed) continue;
    // Busy lately: short naps, so chunks from the network do not wait;
    // idle: longer ones (a doorbell wakes it at once either way).
    int napMs = nowMs() - lastMove < 200 ? 1 : 20;
    c->shm->sleep(token, napMs);
  }
}

zpResult_t commCreate(int nranks, const zpUniqueId& uid, int rank, const Config& cfg,
                      std::unique_ptr<Comm>* out) {
  auto c = std::make_unique<Comm>();
  c->rank = rank;
  c->nranks = nranks;
  c->cfg = cfg;
  if (!decodeId(uid, &c->id))
    return fail(zpInvalidArgument, "the zpUniqueId is not valid (not made by zpGetUniqueId, or corrupted)");
  if ((c->id.flags & kIdFlagRootAtRank0) && rank == 0) ZP_CHECK(startRootAt(c->id));

  RankInfo mine;
  memset(&mine, 0, sizeof(mine));
  mine.rank = rank;
  mine.pid = getpid();
  snprintf(mine.nodeId, sizeof(mine.nodeId), "%s", cfg.nodeId.c_str());
  gethostname(mine.hostname, sizeof(mine.hostname) - 1);
  int rootFd = -1;
  ZP_CHECK(bootstrapExchange(c->id, nranks, mine, cfg.timeoutMs, &c->ranks, &rootFd));
  zpResult_t res = initTransports(c.get(), rootFd);
  close(rootFd);
  ZP_CHECK(res);
  if (c->relay) c->proxyThread = std::thread(proxyLoop, c.get());
  ZP_INFO(kSubInit, "rank %d/%d on node '%s' (pid %d): communicator ready", rank, nranks, cfg.nodeId.c_str(),
          (int)getpid());
  *out = std::move(c);
  return zpSuccess;
}


bool Comm::progress() {
  bool moved = false;
  for (Transport* t : transports) moved |= t->progress();
  if (relay) {
    checkNic();
    moved |= applyNicNews();
    moved |= relay->progress();
  }
  return moved;
}

uint32_t Comm::waitToken() const { return shm ? shm->waitToken() : 0; }

void Comm::wait(uint32_t token, int ms) {
  // The network's events come through a file descriptor, shared memory's
  // through a futex: sleep on the one with work, and nap briefly when both have.
  // Relays may come from either side.
  bool relaying = relay && relay->busy();
  bool shmBusy = shm->busy() || relaying;
  bool netBusy = net && (net->busy() || relaying);
  if (!net) {
    shm->wait(token, ms);
  } else if (!shmBusy) {
    net->wait(ms);
  } else if (!netBusy) {
    net->wait(0);
    shm->wait(token, std::min(ms, 1));
  } else if (net->arm()) {
    // Both: poll the doorbell and the network's fd together, then nap briefly.
    shm->wait(token, std::min(ms, 1), [this] { return net->ready(); });
  }
}

void Comm::dropOps(zpResult_t status, const std::string& why) {
  for (Transport* t : transports) t->dropOps(status, why);
  if (relay) relay->dropOps(status, why);
}

std::vector<int> Comm::busyPeers() const {
  std::vector<int> out;
  for (Transport* t : transports)
    for (int p : t->busyPeers()) out.push_back(p);
  if (relay)
    for (int p : relay->waitingOn()) out.push_back(p);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

void Comm::checkAlive() {
  for (Transport* t : transports) t->checkAlive();
}

namespace {

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size() && i < 16; i++) s += (i ? ", " : "") + std::to_string(ranks[i]);
  if (ranks.size() > 16) s += ", ...";
  return s;
}

// Drives the comms' transports until done() holds, a comm breaks, or nothing
// moves for the timeout. `waitingOn` names the ranks still owed something.
zpResult_t progressUntil(const std::vector<Comm*>& comms, const std::function<bool()>& done,
                         const std::function<std::vector<int>(Comm*)>& waitingOn, const char* what) {
  uint64_t lastMove = nowMs();
  for (;;) {
    uint32_t token = comms.size() == 1 ? comms[0]->waitToken() : 0;
    bool moved = false;
    for (Comm* c : comms) moved |= c->progress();
    for (Comm* c : comms)
      if (c->asyncError != zpSuccess) {
        c->dropOps(c->asyncError, c->asyncMsg);
        if (!c->asyncFromPeer && !c->faultSent) {
          c->faultSent = true;
          for (Transport* t : c->transports) t->abortPeers(c->asyncError, c->asyncMsg);
        }
        return fail(c->asyncError, "rank %d: %s failed: %s", c->rank, what, c->asyncMsg.c_str());
      }
    if (done()) return zpSuccess;
    uint64_t now = nowMs();
    if (moved) {
      lastMove = now;
      continue;
    }
    int timeoutMs = comms[0]->cfg.timeoutMs;
    if (now - lastMove >= (uint64_t)timeoutMs) {
      for (Comm* c : comms) {
        std::vector<int> peers = waitingOn(c);
        if (peers.empty()) continue;
        std::string msg = what + std::string(": no progress for ") + std::to_string(timeoutMs / 1000.0).substr(0, 6) +
                          " s waiting for rank(s) " + rankList(peers) + " (ZP_TIMEOUT)";
        c->setAsyncError(zpRemoteError, msg);
        c->dropOps(zpRemoteError, msg);
        c->faultSent = true;
        for (Transport* t : c->transports) t->abortPeers(zpRemoteError, "rank " + std::to_string(c->rank) + ": " + msg);
        return fail(zpRemoteError, "rank %d: %s", c->rank, msg.c_str());
      }
      lastMove = now;
    }
    if (comms.size() == 1) {
      int sliceMs = (int)std::min<uint64_t>(100, timeoutMs - (now - lastMove) + 1);
      comms[0]->wait(token, std::max(sliceMs, 1));
    } else {
      // Several communicators: no single doorbell to sleep on, so nap briefly.
      usleep(50);
      static thread_local uint64_t lastCheck = 0;
      if (now - lastCheck >= 100) {
        lastCheck = now;
        for (Comm* c : comms) c->checkAlive();
      }
    }
  }
}

// Sends and receives with this same rank pair up locally, in call order.
void runSelfOps(Comm* comm, std::vector<Op*>& sends, std::vector<Op*>& recvs) {
  size_t n = std::min(sends.size(), recvs.size());
  for (size_t i = 0; i < n; i++) {
    Op* s = sends[i];
    Op* r = recvs[i];
    if (s->bytes != r->bytes) {
      std::string why = std::string(opKindName(s->kind)) + ": rank " + std::to_string(comm->rank) + " sends " +
                        std::to_string(s->bytes / s->typeSize) + " elements to itself but expects " +
                        std::to_string(r->bytes / r->typeSize);
      s->finish(zpInvalidUsage, why);
      r->finish(zpInvalidUsage, why);
      continue;
    }
    if (s->bytes) memmove(r->buf, s->buf, s->bytes);
    s->finish(zpSuccess);
    r->finish(zpSuccess);
  }
  const char* why = "a send to self needs a matching receive from self in the same group (and vice versa)";
  for (size_t i = n; i < sends.size(); i++) sends[i]->finish(zpInvalidUsage, why);
  for (size_t i = n; i < recvs.size(); i++) recvs[i]->finish(zpInvalidUsage, why);
}

}  // namespace

zpResult_t runOps(std::vector<CommOps>& work) {
  std::vector<Comm*> comms;
  for (CommOps& w : work) {
    Comm* c = w.comm;
    if (c->asyncError != zpSuccess)
      return fail(c->asyncError, "rank %d: the communicator is broken: %s", c->rank, c->asyncMsg.c_str());
    comms.push_back(c);
  }
  for (CommOps& w : work) {
    Comm* c = w.comm;
    std::vector<Op*> selfSends, selfRecvs;
    for (Op* op : w.ops) {
      if (op->peer == c->rank) {
        (op->isSend ? selfSends : selfRecvs).push_back(op);
        continue;
      }
      if (c->routes() && !c->isLocal(op->peer) && (op->routed || op->kind == OpKind::kP2P)) {
        c->relay->post(op);
        continue;
      }
      op->seq = op->isSend ? c->sendSeq[op->peer]++ : c->recvSeq[op->peer]++;
      c->route[op->peer]->post(op);
    }
    runSelfOps(c, selfSends, selfRecvs);
  }
  auto allDone = [&] {
    for (CommOps& w : work)
      for (Op* op : w.ops)
        if (!op->done) return false;
    return true;
  };
  ZP_CHECK(progressUntil(comms, allDone, [](Comm* c) { return c->busyPeers(); }, "send/recv"));
  for (CommOps& w : work)
    for (Op* op : w.ops)
      if (op->status != zpSuccess) return fail(op->status, "rank %d: %s", w.comm->rank, op->error.c_str());
  return zpSuccess;
}

zpResult_t runOps(Comm* comm, std::vector<Op*>& ops) {
  std::vector<CommOps> work{{comm, ops}};
  return runOps(work);
}

zpResult_t agreeOnResult(Comm* c, uint64_t seq, zpResult_t mine, const std::string& myMsg) {
  if (c->asyncError != zpSuccess)
    return fail(c->asyncError, "rank %d: the communicator is broken: %s", c->rank, c->asyncMsg.c_str());
  for (int p = 0; p < c->nranks; p++)
    if (p != c->rank) c->sendStatus(p, seq, mine, myMsg);
  auto missing = [&](Comm*) {
    std::vector<int> out;
    for (int p = 0; p < c->nranks; p++)
      if (p != c->rank && !c->statuses.count({p, seq})) out.push_back(p);
    return out;
  };
  ZP_CHECK(progressUntil({c}, [&] { return missing(c).empty(); }, missing, "collective status exchange"));
  zpResult_t first = zpSuccess;
  std::string firstMsg;
  for (int p = 0; p < c->nranks; p++) {
    zpResult_t st = mine;
    std::string msg = myMsg;
    if (p != c->rank) {
      auto it = c->statuses.find({p, seq});
      st = it->second.first;
      msg = it->second.second;
      c->statuses.erase(it);
    }
    if (st != zpSuccess && first == zpSuccess) {
      first = st;
      firstMsg = msg;
    }
  }
  if (first != zpSuccess) return fail(first, "rank %d: %s", c->rank, firstMsg.c_str());
  return zpSuccess;
}

// With routing, this rank may still be relaying chunks of transfers between
// other ranks. Every chunk it relays has an end on this node (a proxy serves
// its node's ranks), and that end's transfer is finished when it comes to
// destroy: so this rank stays until every rank it can reach has come (then no
// transfer is left anywhere), it holds no chunk, and no relay message waits
// in its rings, or the timeout passes. Ranks behind a NIC that is down are
// not waited for: their leaving messages would need relays themselves.
static void finishRelays(Comm* c) {
  for (int p = 0; p < c->nranks; p++)
    if (p != c->rank && c->directAlive(p)) c->route[p]->sendStatus(p, kSeqLeaving, zpSuccess, "");
  // Ranks not yet come, else those this rank still relays for.
  auto missing = [&](Comm*) {
    std::vector<int> out;
    for (int p = 0; p < c->nranks; p++)
      if (p != c->rank && c->directAlive(p) && !c->statuses.count({p, kSeqLeaving})) out.push_back(p);
    if (out.empty()) out = c->relay->busyPeers();
    if (out.empty()) out = c->shm->relayInboundPeers();
    return out;
  };
  auto done = [&] { return missing(c).empty(); };
  if (progressUntil({c}, done, missing, "zpCommDestroy (waiting for the ranks whose traffic this rank relays)") !=
      zpSuccess)
    ZP_WARN(kSubInit, "rank %d: %s", c->rank, lastError());
}

void commLeave(Comm* comm, bool abort) {
  if (comm->proxyThread.joinable()) {
    comm->proxyStop = true;
    comm->proxyThread.join();
  }
  std::lock_guard<std::mutex> lock(comm->mu);
  if (!abort && comm->routes() && comm->asyncError == zpSuccess) finishRelays(comm);
  std::string why = "rank " + std::to_string(comm->rank) + " aborted the communicator";
  for (Transport* t : comm->transports) {
    if (abort) t->abortPeers(zpRemoteError, why);
    t->leave();
  }
}

}  // namespace zp
