#include "src/core/comm.h"

#include <net/if.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <mutex>

#include "src/core/log.h"
#include "src/core/peer_info.h"
#include "src/core/topology.h"
#include "src/util/clock.h"

namespace zp {

const char* opKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kP2P: return "send/recv";
    case OpKind::kAlltoallv: return "alltoallv";
    case OpKind::kChunkHeader: return "chunk header";
    case OpKind::kChunkData: return "chunk data";
    case OpKind::kControl: return "forwarded control message";
    case OpKind::kCollective: return "collective";
  }
  return "unknown operation";
}

bool TransportContext::sameNode(int a, int b) const {
  return strncmp((*ranks)[a].nodeId, (*ranks)[b].nodeId, sizeof((*ranks)[a].nodeId)) == 0;
}

Comm::~Comm() {
  if (progressThread_.joinable()) {
    progressStop_ = true;
    progressThread_.join();
  }
  // The transports may still complete a relay's operations while they shut
  // down: the installed transports go last. The carriers go in the
  // table's reverse order (the network before shared memory).
  while (!carriers_.empty()) carriers_.pop_back();
  installed_.clear();
}

bool Comm::isLocal(int peer) const {
  if (!nodeOf_.empty()) return nodeOf_[peer] == nodeOf_[rank_];  // findNodes has run (collectives ask per op)
  return strncmp(ranks_[peer].nodeId, ranks_[rank_].nodeId, sizeof(ranks_[peer].nodeId)) == 0;
}

CommShape Comm::shape() const {
  CommShape out;
  out.nodeOf = nodeOf_;
  for (const NodeTopology& n : cluster_.node) {
    out.nicsPerNode = std::max(out.nicsPerNode, (int)n.nics.size());
    for (const Nic& nic : n.nics) out.nicBitsPerSec = std::max(out.nicBitsPerSec, nic.bitsPerSec);
  }
  return out;
}

TransportContext Comm::transportContext() {
  TransportContext ctx;
  ctx.rank = rank_;
  ctx.nranks = nranks_;
  ctx.cfg = &cfg_;
  ctx.id = &id_;
  ctx.ranks = &ranks_;
  ctx.sink = this;
  return ctx;
}

Comm::Call::Call(Comm* c, const char* fn) : c_(c), status_(zpSuccess) {
  // One locked instruction when the lock is free, the common case. Held, it
  // is another call's (refused: its order against this one would differ
  // between ranks) or a poller's (pollAsyncError, the progress thread: they
  // let go soon). A call that took the lock but has not yet said whose it is
  // is waited for, as a poller is.
  if (!c->mu_.try_lock()) {
    if (c->caller_.load(std::memory_order_relaxed) != std::thread::id()) {
      c_ = nullptr;
      status_ = fail(zpInvalidUsage,
                     "rank %d: %s: another thread is running a call on this communicator; calls on one communicator "
                     "must come from one thread at a time (their order would differ between ranks)",
                     c->rank_, fn);
      return;
    }
    c->mu_.lock();
  }
  c->caller_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  c->callName_ = fn;
}

Comm::Call::~Call() {
  if (!c_) return;
  c_->caller_.store(std::thread::id(), std::memory_order_relaxed);
  c_->mu_.unlock();
}

void Comm::setAsyncError(zpResult_t code, const std::string& msg, bool fromPeer) {
  // With mu_ held: the first failure wins; the code is published last, so a
  // reader without the lock never sees a code before its message is written.
  if (asyncError_.load(std::memory_order_relaxed) != zpSuccess) return;
  asyncMsg_ = msg;
  asyncFromPeer_ = fromPeer;
  asyncError_.store(code, std::memory_order_release);
}

void Comm::onStatus(int peer, uint64_t seq, zpResult_t status, std::string text) {
  if (msgid::isControl(seq)) {
    // A transport's own message (the relay's acknowledgements, NIC news):
    // acted on after the transports' progress, never inside their callbacks.
    for (Transport* t : transports_)
      if (t->onControl(peer, seq, text)) return;
    earlyControl_.push_back({peer, {seq, std::move(text)}});
    return;
  }
  statuses_[{peer, seq}] = {status, std::move(text)};
}

void Comm::sendStatus(int peer, uint64_t seq, zpResult_t status, const std::string& text) {
  byPeer_[peer]->sendStatus(peer, seq, status, text);
}

void Comm::installTransport(std::unique_ptr<Transport> t, const std::vector<int>& peers) {
  Transport* raw = t.get();
  installed_.push_back(std::move(t));
  transports_.push_back(raw);
  for (int p : peers) byPeer_[p] = raw;
  std::vector<std::pair<int, std::pair<uint64_t, std::string>>> early;
  early.swap(earlyControl_);
  for (auto& e : early)
    if (!raw->onControl(e.first, e.second.first, e.second.second)) earlyControl_.push_back(std::move(e));
}

// Each rank's node (in order of first rank) and its index there.
void Comm::findNodes() {
  nodeOf_.assign(nranks_, -1);
  localIndex_.assign(nranks_, 0);
  std::vector<int> nodeSize;
  for (int r = 0; r < nranks_; r++) {
    for (int q = 0; q < r && nodeOf_[r] < 0; q++)
      if (!strncmp(ranks_[q].nodeId, ranks_[r].nodeId, sizeof(ranks_[r].nodeId))) nodeOf_[r] = nodeOf_[q];
    if (nodeOf_[r] < 0) {
      nodeOf_[r] = (int)nodeSize.size();
      nodeSize.push_back(0);
    }
    localIndex_[r] = nodeSize[nodeOf_[r]]++;
  }
  nnodes_ = (int)nodeSize.size();
}

// The transports made, and every rank's addresses for them ([kind][rank]):
// connects them, and each peer gets the first that reaches it.
zpResult_t Comm::connectTransports(const std::vector<const TransportKind*>& kinds,
                                   const std::vector<std::vector<std::string>>& addresses) {
  // Connected in the table's reverse order, as before the table: the
  // network's endpoints, then shared memory (which waits for the node's ranks).
  for (size_t i = carriers_.size(); i-- > 0;) ZP_CHECK(carriers_[i]->connect(addresses[i]));
  transports_.clear();
  for (auto& t : carriers_) {
    transports_.push_back(t.get());
    if (!doorbell_ && t->wakeup() == Transport::Wakeup::kDoorbell) doorbell_ = t.get();
    if (!events_ && t->wakeup() == Transport::Wakeup::kEventFd) events_ = t.get();
  }
  const TransportContext ctx = transportContext();
  carrierByPeer_.assign(nranks_, nullptr);
  for (int r = 0; r < nranks_; r++)
    for (size_t i = 0; i < kinds.size() && !carrierByPeer_[r]; i++)
      if (kinds[i]->canReach(ctx, r)) carrierByPeer_[r] = carriers_[i].get();
  byPeer_.assign(carrierByPeer_.begin(), carrierByPeer_.end());
  return zpSuccess;
}

zpResult_t Comm::initTransports(const BlobExchange& exchange) {
  sendSeq_.assign(nranks_, 0);
  recvSeq_.assign(nranks_, 0);
  findNodes();
  bool remote = nnodes_ > 1;
  PeerInfo mine;
  snprintf(mine.host, sizeof(mine.host), "%s", ranks_[rank_].hostname);
  mine.node = nodeOf_[rank_];
  mine.settings = algoSettingsOf(cfg_);
  std::string nic;
  // The kinds of host transport this communicator needs: those that reach some rank.
  const TransportContext ctx = transportContext();
  std::vector<const TransportKind*> kinds;
  for (const TransportKind& k : hostTransports()) {
    bool needed = false;
    for (int r = 0; r < nranks_ && !needed; r++) needed = k.canReach(ctx, r);
    if (needed) kinds.push_back(&k);
  }
  // A build without UCX reaches no other node: say so before looking for
  // NICs, whose errors would hide the cause. Every rank of such a
  // communicator spans nodes, so every rank fails here with this message.
  // (Only the network may be missing from a build.)
  std::string missing;
  zpResult_t res = zpSuccess;
  for (const TransportKind* k : kinds)
    if (res == zpSuccess && !k->available(&missing))
      res = fail(zpInvalidUsage, "rank %d: this communicator spans %d nodes (ranks on different hosts or ZP_NODE_ID), "
                 "but %s", rank_, nnodes_, missing.c_str());
  // On one node no NIC is used, but settings that name one, or where to find
  // one, are checked as across nodes: a typo is not silently ignored.
  const bool nicSettings =
      !envString("ZP_TOPO_FILE").empty() || !envString("ZP_SYSFS_ROOT").empty() || !cfg_.netDevices.empty();
  if (res == zpSuccess && (remote || nicSettings)) {
    int localRanks = 0;
    for (int r = 0; r < nranks_; r++) localRanks += isLocal(r);
    int rail = 0;
    res = chooseNic(cfg_, rank_, nranks_, localIndex_[rank_], localRanks, &nic, &rail, &mine.nicBitsPerSec,
                    &nodeNicNames_);
    mine.rail = rail;
  }
  nicName_ = nic;
  // The transports are made before the round below: a rank that cannot
  // have its shared-memory segment (no room in /dev/shm) tells every rank
  // there, and after it every local peer's segment exists. With routing,
  // the relay's chunks go eagerly (see UcxTransport::create): the size
  // comes from the layer above, which knows the routing setting.
  TransportSetup setup;
  setup.nic = nic;
  setup.eagerUpTo = netEagerUpTo_;
  std::vector<std::string> myConnect(kinds.size());
  for (size_t i = 0; i < kinds.size() && res == zpSuccess; i++) {
    std::unique_ptr<CarrierTransport> t;
    res = kinds[i]->create(ctx, setup, &t, &myConnect[i]);
    if (res == zpSuccess) carriers_.push_back(std::move(t));
  }
  // The device data plane rides along: whether this rank can use a CUDA
  // device, and (rank 0) the key that every rank needs to join it.
  const StreamTransportKind& stream = streamTransportKind();
  std::string noDevice;
  mine.deviceUsable = res == zpSuccess && stream.usable(&noDevice);  // else lastError() keeps this rank's reason
  if (rank_ == 0 && mine.deviceUsable) {
    std::string joinKey;
    if (stream.makeJoinKey(&joinKey) == zpSuccess && joinKey.size() == sizeof(mine.joinKey)) {
      memcpy(mine.joinKey, joinKey.data(), sizeof(mine.joinKey));
    } else {
      mine.deviceUsable = 0;
      noDevice = lastError();
    }
  }
  // Every rank takes part in the second round, even to say it failed, so
  // that nobody waits for it and every rank can say why (peer_info.h).
  std::vector<std::string> blobs(nranks_);
  zpResult_t ex = exchange(res == zpSuccess ? encodePeerBlob(mine, myConnect) : encodeFailedBlob(res, lastError()),
                           &blobs);
  ZP_CHECK(res);
  ZP_CHECK(ex);
  rail_.assign(nranks_, 0);
  std::vector<double> rates(nranks_, 0);
  std::vector<std::vector<std::string>> connect(kinds.size(), std::vector<std::string>(nranks_));  // [kind][rank]
  std::string joinKey;
  AlgoSettings first;  // rank 0's
  for (int r = 0; r < nranks_; r++) {
    PeerInfo theirs;
    std::vector<std::string> theirConnect;
    ZP_CHECK(decodePeerBlob(r, blobs[r], kinds.size(), &theirs, &theirConnect));
    // Settings that differ fail init here, on every rank alike (every rank
    // has every record and nobody has connected yet), not a later call.
    if (r == 0) first = theirs.settings;
    ZP_CHECK(sameSettings(rank_, r, first, theirs.settings));
    rail_[r] = theirs.rail;
    rates[r] = theirs.nicBitsPerSec;
    if (r == 0) joinKey.assign(theirs.joinKey, sizeof(theirs.joinKey));
    // This rank's own reason first (it says what to fix here), else the first rank's that has none.
    if (!theirs.deviceUsable && r == rank_) noDeviceWhy_ = "rank " + std::to_string(r) + ": " + noDevice;
    if (!theirs.deviceUsable && noDeviceWhy_.empty())
      noDeviceWhy_ = "rank " + std::to_string(r) + " (" + theirs.host + ") has no usable CUDA device";
    for (size_t i = 0; i < kinds.size(); i++) connect[i][r] = std::move(theirConnect[i]);
  }
  cluster_ = clusterOf(nnodes_, nodeOf_, localIndex_, rail_, rates);
  ZP_CHECK(connectTransports(kinds, connect));
  // NCCL's init is collective: every rank starts it, or (some rank has no
  // device) none does, and the communicator moves host buffers only.
  if (!noDeviceWhy_.empty()) {
    ZP_INFO(kSubInit, "rank %d: no device data plane: %s", rank_, noDeviceWhy_.c_str());
    return zpSuccess;
  }
  // A split child stays on its parent's device (as ncclCommSplit does); a
  // new communicator picks one by ZP_CUDA_DEVICE.
  int device = inheritedDevice_;
  if (device < 0) ZP_CHECK(stream.chooseDevice(localIndex_[rank_], &device));
  return stream.create(ctx, joinKey, device, &device_);
}

zpResult_t Comm::create(int nranks, const zpUniqueId& uid, int rank, const Config& cfg, size_t netEagerUpTo,
                        std::unique_ptr<Comm>* out) {
  stampUs();  // its rate is measured once per process, here rather than in the first call
  std::unique_ptr<Comm> c(new Comm());
  c->rank_ = rank;
  c->nranks_ = nranks;
  c->cfg_ = cfg;
  c->netEagerUpTo_ = netEagerUpTo;
  if (!decodeId(uid, &c->id_))
    return fail(zpInvalidArgument, "the zpUniqueId is not valid (not made by zpGetUniqueId, or corrupted)");
  if ((c->id_.flags & kIdFlagRootAtRank0) && rank == 0) ZP_CHECK(startRootAt(c->id_));

  RankInfo mine;
  memset(&mine, 0, sizeof(mine));
  mine.rank = rank;
  mine.pid = getpid();
  snprintf(mine.nodeId, sizeof(mine.nodeId), "%s", cfg.nodeId.c_str());
  gethostname(mine.hostname, sizeof(mine.hostname) - 1);
  int rootFd = -1;
  ZP_CHECK(bootstrapExchange(c->id_, nranks, mine, cfg.timeoutMs, &c->ranks_, &rootFd));
  zpResult_t res = c->initTransports([&](const std::string& blob, std::vector<std::string>* all) {
    return bootstrapAllgather(rootFd, rank, blob, cfg.timeoutMs, all);
  });
  close(rootFd);
  ZP_CHECK(res);
  ZP_INFO(kSubInit, "rank %d/%d on node '%s' (pid %d): communicator ready", rank, nranks, cfg.nodeId.c_str(),
          (int)getpid());
  *out = std::move(c);
  return zpSuccess;
}

zpResult_t Comm::createChild(const Comm& parent, const std::vector<int>& members, int rank, const Config& cfg,
                             size_t netEagerUpTo, const uint8_t secret[16], const BlobExchange& exchange,
                             std::unique_ptr<Comm>* out) {
  std::unique_ptr<Comm> c(new Comm());
  c->rank_ = rank;
  c->nranks_ = (int)members.size();
  c->cfg_ = cfg;
  c->netEagerUpTo_ = netEagerUpTo;
  // The node identity stays the parent's: the ranks' records come from it.
  c->cfg_.nodeId = parent.cfg_.nodeId;
  c->id_ = parent.id_;
  c->id_.flags = 0;
  memcpy(c->id_.secret, secret, sizeof(c->id_.secret));
  for (size_t i = 0; i < members.size(); i++) {
    RankInfo info = parent.ranks_[members[i]];
    info.rank = (int32_t)i;
    c->ranks_.push_back(info);
  }
  if (parent.device_) c->inheritedDevice_ = parent.device_->device();
  ZP_CHECK(c->initTransports(exchange));
  ZP_INFO(kSubInit, "rank %d/%d (rank %d of the parent): split communicator ready", rank, c->nranks_, parent.rank_);
  *out = std::move(c);
  return zpSuccess;
}

zpResult_t Comm::pollAsyncError() {
  if (mu_.try_lock()) {
    progress();
    checkAlive();
    // The device data plane fails on its own (an NCCL kernel that found a
    // dead peer): its failure breaks the communicator, and the peers hear of it.
    std::string why;
    zpResult_t deviceError = device_ && asyncError_ == zpSuccess ? device_->asyncError(&why) : zpSuccess;
    if (deviceError != zpSuccess) setAsyncError(deviceError, "rank " + std::to_string(rank_) + ": " + why);
    mu_.unlock();
  }
  // Another thread's call holds the lock: it drives progress, and whatever
  // it has found is already published.
  return asyncError_.load(std::memory_order_acquire);
}

void Comm::passOnFault(zpResult_t code, const std::string& why) {
  faultSent_ = true;
  for (Transport* t : transports_) t->abortPeers(code, why);
}

void Comm::breakHere(zpResult_t code, const std::string& msg) {
  setAsyncError(code, msg);
  passOnFault(zpRemoteError, "rank " + std::to_string(rank_) + ": " + msg);
  dropOps(code, msg);
}

zpResult_t Comm::agreeOnResult(uint64_t seq, zpResult_t mine, const std::string& myMsg) {
  if (asyncError_ != zpSuccess)
    return fail(asyncError_, "rank %d: the communicator is broken: %s", rank_, asyncMsg_.c_str());
  for (int p = 0; p < nranks_; p++)
    if (p != rank_) sendStatus(p, seq, mine, myMsg);
  auto missing = [&](Comm*) {
    std::vector<int> out;
    for (int p = 0; p < nranks_; p++)
      if (p != rank_ && !statuses_.count({p, seq})) out.push_back(p);
    return out;
  };
  ZP_CHECK(progressUntil({this}, [&] { return missing(this).empty(); }, missing, "collective status exchange"));
  zpResult_t first = zpSuccess;
  std::string firstMsg;
  for (int p = 0; p < nranks_; p++) {
    zpResult_t st = mine;
    std::string msg = myMsg;
    if (p != rank_) {
      auto it = statuses_.find({p, seq});
      st = it->second.first;
      msg = it->second.second;
      statuses_.erase(it);
    }
    if (st != zpSuccess && first == zpSuccess) {
      first = st;
      firstMsg = msg;
    }
  }
  if (first != zpSuccess) return fail(first, "rank %d: %s", rank_, firstMsg.c_str());
  return zpSuccess;
}

void Comm::leave(bool abort) {
  if (progressThread_.joinable()) {
    progressStop_ = true;
    progressThread_.join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  left_ = true;
  // The device communicator first: an abort must unblock device work that
  // waits for a dead peer before the transports say goodbye.
  if (device_) device_->close(abort || asyncError_ != zpSuccess);
  if (!abort && asyncError_ == zpSuccess) {
    // A transport may have to stay for other ranks (a relay still carrying
    // their chunks): every transport is asked at least once.
    auto stay = [&](Comm*) {
      std::vector<int> out;
      for (Transport* t : transports_)
        for (int p : t->stayFor()) out.push_back(p);
      return out;
    };
    if (!stay(this).empty() &&
        progressUntil({this}, [&] { return stay(this).empty(); }, stay,
                      "zpCommDestroy (waiting for the ranks whose traffic this rank carries)") != zpSuccess)
      ZP_WARN(kSubInit, "rank %d: %s", rank_, lastError());
  }
  std::string why = "rank " + std::to_string(rank_) + " aborted the communicator";
  for (Transport* t : transports_) {
    if (abort) t->abortPeers(zpRemoteError, why);
    t->leave();
  }
}

}  // namespace zp
