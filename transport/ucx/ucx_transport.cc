#include "transport/ucx/ucx_transport.h"

#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "src/core/log.h"
#include "src/util/clock.h"

namespace zp {

namespace {

// kLaneStanding's messages have a tag type of their own and match on the
// whole tag, or on type and kind alone for a receive from any rank
// (kAnyRemotePeer: source and sequence masked out).
enum TagType : uint64_t { kTagData = 0, kTagMeta = 1, kTagCtrl = 2, kTagStanding = 3 };
enum CtrlType : uint32_t { kCtrlStatus = 1, kCtrlBye = 2, kCtrlAbort = 3 };
constexpr int kTypeShift = 62, kKindShift = 56, kSrcShift = msgid::kSeqBits;  // the sequence below
constexpr uint64_t kSeqMask = (1ull << kSrcShift) - 1;
constexpr uint64_t kSrcMask = (1ull << 20) - 1;
constexpr ucp_tag_t kMatchAllButKind = ~(0x3Full << kKindShift);
constexpr ucp_tag_t kMatchType = 3ull << kTypeShift;
constexpr ucp_tag_t kMatchTypeKind = kMatchType | 0x3Full << kKindShift;
constexpr size_t kCtrlMax = 1024;
// How long dropOps lets UCX finish the requests of a broken communicator
// before it cuts the peers that hold them (at most a quarter of ZP_TIMEOUT).
constexpr uint64_t kDropGraceMs = 500;
// How long the abort and goodbye messages may take to leave (sendToAll).
constexpr uint64_t kCtrlSendMs = 2000;

ucp_tag_t makeTag(uint64_t type, uint64_t kind, uint64_t src, uint64_t seq) {
  return type << kTypeShift | (kind & 0x3F) << kKindShift | (src & kSrcMask) << kSrcShift | (seq & kSeqMask);
}
uint32_t tagKind(ucp_tag_t t) { return (uint32_t)((t >> kKindShift) & 0x3F); }
int tagSrc(ucp_tag_t t) { return (int)((t >> kSrcShift) & kSrcMask); }

std::atomic<long> gLiveRequests{0};  // UcxTransport::liveRequests()

}  // namespace

struct UcxTransport::Request {
  Request(UcxTransport* t_, Op* op_, bool meta_) : t(t_), op(op_), meta(meta_) { gLiveRequests++; }
  ~Request() { gLiveRequests--; }
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  UcxTransport* t;
  Op* op;  // null for control messages
  bool meta;
  void* ucx = nullptr;
  std::string payload;  // a control send owns its bytes; a refused receive drains into it
  ucp_tag_t probeTag = 0;  // a receive that waits in probing_ for its message
  // UCX may call the callback before the posting call returns; the
  // completion is then kept here and handled once the call has returned.
  bool early = false;
  ucs_status_t earlyStatus = UCS_OK;
  size_t earlyLength = 0;
  ucp_tag_t earlyTag = 0;
};

namespace {
// Records a failure; the op completes once every UCP request of it has.
void fault(Op* op, zpResult_t st, const std::string& err) {
  if (op->status != zpSuccess) return;
  op->status = st;
  op->error = err;
}
}  // namespace

zpResult_t UcxTransport::create(const TransportContext& ctx, const std::string& nic, size_t eagerUpTo,
                                std::unique_ptr<UcxTransport>* out, std::string* address) {
  std::unique_ptr<UcxTransport> t(new UcxTransport(ctx, nic, eagerUpTo));
  ZP_CHECK(t->init(address));
  *out = std::move(t);
  return zpSuccess;
}

zpResult_t UcxTransport::init(std::string* address) {
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) return fail(zpSystemError, "UCX: cannot read its configuration: %s", ucs_status_string(st));
  if (!device_.empty()) {
    st = ucp_config_modify(config, "NET_DEVICES", device_.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return fail(zpInvalidArgument, "UCX: NET_DEVICES=%s refused: %s", device_.c_str(), ucs_status_string(st));
    }
  }
  // Relayed chunks go eagerly: a rendezvous would make each chunk's
  // receiver answer (RTR) behind the bulk data it is sending itself the
  // other way, which slows both directions of a loaded NIC (docs/routing.md,
  // "Relayed chunks travel eagerly"). The sender's window bounds what is in
  // flight.
  if (eagerUpTo_ > 0 && !getenv("UCX_RNDV_THRESH")) {
    std::string thresh = std::to_string(eagerUpTo_ + 1);
    st = ucp_config_modify(config, "RNDV_THRESH", thresh.c_str());
    if (st != UCS_OK) {
      ucp_config_release(config);
      return fail(zpSystemError, "UCX: RNDV_THRESH=%s refused: %s", thresh.c_str(), ucs_status_string(st));
    }
  }
  ucp_params_t params;
  memset(&params, 0, sizeof(params));
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 0;
  st = ucp_init(&params, config, &context_);
  ucp_config_release(config);
  if (st != UCS_OK)
    return fail(zpSystemError, "UCX: ucp_init failed (NET_DEVICES=%s): %s", device_.empty() ? "all" : device_.c_str(),
                ucs_status_string(st));
  ucp_worker_params_t wp;
  memset(&wp, 0, sizeof(wp));
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;  // one call at a time per communicator, any thread
  st = ucp_worker_create(context_, &wp, &worker_);
  if (st != UCS_OK) return fail(zpSystemError, "UCX: cannot create a worker: %s", ucs_status_string(st));
  st = ucp_worker_get_efd(worker_, &efd_);
  if (st != UCS_OK) return fail(zpSystemError, "UCX: no wake-up fd: %s", ucs_status_string(st));
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  st = ucp_worker_get_address(worker_, &addr, &len);
  if (st != UCS_OK) return fail(zpSystemError, "UCX: no worker address: %s", ucs_status_string(st));
  address->assign((const char*)addr, len);
  ucp_worker_release_address(worker_, addr);
  peers_.resize(ctx_.nranks);
  ctrlBuf_.resize(kCtrlMax);
  return zpSuccess;
}

zpResult_t UcxTransport::connect(const std::vector<std::string>& addresses) {
  for (int r = 0; r < ctx_.nranks; r++) {
    if (ctx_.sameNode(ctx_.rank, r)) continue;
    if (addresses[r].empty())
      return fail(zpInternalError, "rank %d has no network address, but rank %d is on another node", r, ctx_.rank);
    auto arg = std::make_unique<EpArg>(EpArg{this, r});
    ucp_ep_params_t ep;
    memset(&ep, 0, sizeof(ep));
    ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.address = (const ucp_address_t*)addresses[r].data();
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = epErrorCb;
    ep.err_handler.arg = arg.get();
    for (ucp_ep_h* h : {&peers_[r].ep, &peers_[r].ctrlEp}) {
      ucs_status_t st = ucp_ep_create(worker_, &ep, h);
      if (st != UCS_OK)
        return fail(zpSystemError, "UCX: cannot create an endpoint to rank %d: %s", r, ucs_status_string(st));
    }
    epArgs_.push_back(std::move(arg));
    ZP_INFO(kSubNet | kSubInit, "rank %d -> rank %d (node '%s'): %s", ctx_.rank, r, (*ctx_.ranks)[r].nodeId,
            describe(r).c_str());
  }
  postCtrlRecv();
  return zpSuccess;
}

UcxTransport::~UcxTransport() {
  if (worker_) {
    // Close in flush mode: an eager send is complete for its sender before
    // its bytes have left, and a forced close would drop them. A peer that
    // no longer answers gets a forced close after a grace period.
    std::vector<ucs_status_ptr_t> closing = std::move(closing_);
    for (auto& p : peers_)
      for (ucp_ep_h* h : {&p.ep, &p.ctrlEp}) {
        if (!*h) continue;
        ucp_request_param_t prm;
        memset(&prm, 0, sizeof(prm));
        prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = p.failed ? UCP_EP_CLOSE_FLAG_FORCE : 0;
        closing.push_back(ucp_ep_close_nbx(*h, &prm));
        *h = nullptr;
      }
    uint64_t deadline = nowMs() + 3000;
    for (ucs_status_ptr_t& r : closing) {
      while (UCS_PTR_IS_PTR(r) && ucp_request_check_status(r) == UCS_INPROGRESS && nowMs() < deadline)
        ucp_worker_progress(worker_);
      if (UCS_PTR_IS_PTR(r)) {
        if (ucp_request_check_status(r) == UCS_INPROGRESS) ucp_request_cancel(worker_, r);
        ucp_request_free(r);
      }
    }
    if (ctrlRecv_ && ctrlRecv_->ucx) ucp_request_cancel(worker_, ctrlRecv_->ucx);
    // Receives still posted (a standing receive from any rank, kLaneStanding).
    // A cancel may complete at once and edit ops_: collect first.
    std::vector<void*> posted;
    for (auto& kv : ops_)
      for (Request* r : kv.second.reqs)
        if (r->ucx) posted.push_back(r->ucx);
    for (void* r : posted) ucp_request_cancel(worker_, r);
    for (int i = 0; i < 100 && ucp_worker_progress(worker_); i++) {
    }
    // Messages nobody will receive any more (goodbyes of peers that left at
    // the same time, data of a call that failed): take them, so UCX has no
    // unmatched messages to complain about. Not forever: the rendezvous of
    // a sender that died can never be taken (zpCommDestroy hung there after
    // a rank died in the middle of the hierarchical all-reduce); then the
    // rest is left to ucp_worker_destroy (nothing progresses the worker
    // before it, so nothing writes into the sink).
    ucp_tag_recv_info_t info;
    std::vector<char> sink;
    const uint64_t drainUntil = nowMs() + 1000;
    bool stuck = false;
    while (!stuck) {
      ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, 0, 0, 1, &info);
      if (!msg) break;
      sink.resize(std::max<size_t>(info.length, 1));
      ucp_request_param_t prm;
      memset(&prm, 0, sizeof(prm));
      ucs_status_ptr_t r = ucp_tag_msg_recv_nbx(worker_, sink.data(), info.length, msg, &prm);
      while (UCS_PTR_IS_PTR(r) && ucp_request_check_status(r) == UCS_INPROGRESS && nowMs() < drainUntil)
        ucp_worker_progress(worker_);
      if (UCS_PTR_IS_PTR(r)) {
        stuck = ucp_request_check_status(r) == UCS_INPROGRESS;
        ucp_request_free(r);
      }
    }
    if (stuck) ZP_INFO(kSubNet, "UCX: a message of a peer that is gone could not be taken; left to the worker's end");
    ucp_worker_destroy(worker_);
  }
  if (context_) ucp_cleanup(context_);
  delete ctrlRecv_;
  for (Request* r : ctrlReqs_) delete r;
  for (Request* r : orphans_) delete r;
  // Requests whose completion never came (a send stuck on an endpoint that
  // was force-closed when its NIC went down): no callback can run after the
  // worker is gone, so they are ours to free.
  for (auto& kv : ops_)
    for (Request* r : kv.second.reqs) delete r;
}

long UcxTransport::liveRequests() { return gLiveRequests.load(); }

bool UcxTransport::available(std::string*) { return true; }

std::string UcxTransport::describe(int) const {
  return "UCX" + (device_.empty() ? std::string() : " (NIC " + device_ + ")");
}

void UcxTransport::post(Op* op) {
  if (op->peer == kAnyRemotePeer) {
    ops_[op].parts++;
    submit(op, false);
    releasePart(op);
    return;
  }
  Peer& p = peers_[op->peer];
  bool usable = !p.failed && p.ep && !(p.bye && !completesAfterBye(op));
  // A peer closes its connection after its goodbye; a message it sent
  // before may still wait, unmatched, in this rank's worker: its receive is
  // posted still (on the worker: it needs no endpoint).
  if (!usable && !op->isSend && p.bye && completesAfterBye(op)) {
    ucp_tag_recv_info_t info;
    usable = ucp_tag_probe_nb(worker_, makeTag(kTagData, (uint64_t)op->kind, op->peer, op->seq), kMatchAllButKind, 0,
                              &info) != nullptr;
  }
  if (!usable) {
    op->finish(zpRemoteError, p.why.empty() ? "no network path to rank " + std::to_string(op->peer) : p.why);
    return;
  }
  if (op->isSend && op->lane == kLaneCalls) p.sentEnd = std::max(p.sentEnd, op->seq + 1);
  // One part held while posting, so that a part completing inside the
  // posting call cannot finish the op early.
  ops_[op].parts++;
  if (op->metaBytes) submit(op, true);
  submit(op, false);
  releasePart(op);
}

bool UcxTransport::arrived(int peer, uint64_t seq, size_t* bytes) {
  ucp_tag_recv_info_t info;
  if (!ucp_tag_probe_nb(worker_, makeTag(kTagData, (uint64_t)OpKind::kP2P, peer, seq), ~0ull, 0, &info)) return false;
  *bytes = info.length;
  return true;
}

void UcxTransport::releasePart(Op* op) {
  auto it = ops_.find(op);
  if (--it->second.parts > 0) return;
  ops_.erase(it);
  op->finish(op->status, op->error);
}

// Hands a posted request its UCX handle, and runs a completion that came early.
void UcxTransport::attach(Request* r, ucs_status_ptr_t handle) {
  r->ucx = handle;
  if (r->early) complete(r, r->earlyStatus, r->earlyLength, r->earlyTag);
}

void UcxTransport::onCallback(Request* r, ucs_status_t status, size_t length, ucp_tag_t tag) {
  if (!r->ucx) {
    r->early = true;
    r->earlyStatus = status;
    r->earlyLength = length;
    r->earlyTag = tag;
    return;
  }
  complete(r, status, length, tag);
}

void UcxTransport::submit(Op* op, bool meta) {
  Request* r = new Request(this, op, meta);
  ucp_request_param_t prm;
  memset(&prm, 0, sizeof(prm));
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  prm.user_data = r;
  void* buf = meta ? op->meta : op->buf;
  size_t len = meta ? op->metaBytes : op->bytes;
  OpState& s = ops_[op];
  s.parts++;
  s.reqs.push_back(r);
  ucs_status_ptr_t st;
  const bool standingLane = op->lane != kLaneCalls;
  uint64_t type = standingLane ? kTagStanding : meta ? kTagMeta : kTagData;
  if (!op->isSend && !standingLane && !meta && op->peer != kAnyRemotePeer) {
    // A user's receive is posted only once its message is here and its size
    // known (probe), so one of another size writes nothing into the buffer
    // (a posted receive would take a shorter message, or the start of a
    // longer one). A rendezvous message still lands in the buffer directly.
    r->probeTag = makeTag(type, (uint64_t)op->kind, op->peer, op->seq);
    probing_.push_back(r);
    ZP_TRACE(kSubNet, "rank %d: waiting for recv data #%llu from rank %d, %zu bytes", ctx_.rank,
             (unsigned long long)op->seq, op->peer, len);
    takeProbed(r);
    return;
  }
  if (op->isSend) {
    prm.cb.send = sendCb;
    st = ucp_tag_send_nbx(peers_[op->peer].ep, buf, len, makeTag(type, (uint64_t)op->kind, ctx_.rank, op->seq),
                          &prm);
  } else {
    prm.cb.recv = recvCb;
    if (op->peer == kAnyRemotePeer)
      st = ucp_tag_recv_nbx(worker_, buf, len, makeTag(type, (uint64_t)op->kind, 0, 0), kMatchTypeKind, &prm);
    else
      st = ucp_tag_recv_nbx(worker_, buf, len, makeTag(type, (uint64_t)op->kind, op->peer, op->seq),
                            standingLane ? ~0ull : kMatchAllButKind, &prm);
  }
  ZP_TRACE(kSubNet, "rank %d: posted %s %s #%llu with rank %d, %zu bytes", ctx_.rank, op->isSend ? "send" : "recv",
           meta ? "meta" : "data", (unsigned long long)op->seq, op->peer, len);
  if (UCS_PTR_IS_ERR(st)) {
    s.reqs.pop_back();
    delete r;
    fault(op, zpRemoteError, std::string("UCX: cannot post a message with rank ") + std::to_string(op->peer) + ": " +
                                 ucs_status_string(UCS_PTR_STATUS(st)));
    releasePart(op);
    return;
  }
  attach(r, st);
}

// Takes r's message if it has come (true): into the receive buffer when its
// kind and size are the ones expected, else into a sink, and complete()
// reports the mismatch. r leaves probing_ (the caller's index i, if any, stays valid).
bool UcxTransport::takeProbed(Request* r) {
  ucp_tag_recv_info_t info;
  ucp_tag_message_h msg = ucp_tag_probe_nb(worker_, r->probeTag, kMatchAllButKind, 1, &info);
  if (!msg) return false;
  probing_.erase(std::find(probing_.begin(), probing_.end(), r));
  Op* op = r->op;
  op->noteArrival();  // its header is here (a large message's data is yet to come)
  void* buf = op->buf;
  if (info.length != op->bytes || tagKind(info.sender_tag) != (uint32_t)op->kind) {
    r->payload.resize(std::max<size_t>(info.length, 1));
    buf = &r->payload[0];
  }
  ucp_request_param_t prm;
  memset(&prm, 0, sizeof(prm));
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  prm.user_data = r;
  prm.cb.recv = recvCb;
  ucs_status_ptr_t st = ucp_tag_msg_recv_nbx(worker_, buf, info.length, msg, &prm);
  if (UCS_PTR_IS_ERR(st)) {
    OpState& s = ops_.at(op);
    s.reqs.erase(std::find(s.reqs.begin(), s.reqs.end(), r));
    delete r;
    fault(op, zpRemoteError, std::string("UCX: cannot receive a message from rank ") + std::to_string(op->peer) +
                                 ": " + ucs_status_string(UCS_PTR_STATUS(st)));
    releasePart(op);
    return true;
  }
  attach(r, st);
  return true;
}

void UcxTransport::sendCb(void*, ucs_status_t status, void* user) {
  Request* r = (Request*)user;
  r->t->onCallback(r, status, 0, 0);
}

void UcxTransport::recvCb(void*, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user) {
  Request* r = (Request*)user;
  r->t->onCallback(r, status, info ? info->length : 0, info ? info->sender_tag : 0);
}

void UcxTransport::epErrorCb(void* arg, ucp_ep_h, ucs_status_t status) {
  EpArg* a = (EpArg*)arg;
  a->t->epErrors_.push_back({a->peer, ucs_status_string(status)});
}

void UcxTransport::complete(Request* r, ucs_status_t status, size_t length, ucp_tag_t tag) {
  if (r->ucx) ucp_request_free(r->ucx);
  if (r == ctrlRecv_) {
    // A control message; the receive is posted again from progress().
    ctrlRecv_ = nullptr;
    if (status == UCS_OK && length >= sizeof(CtrlHead)) {
      CtrlHead h;
      memcpy(&h, ctrlBuf_.data(), sizeof(h));
      onCtrl(tagSrc(tag), tagKind(tag), tag & kSeqMask, h,
             std::string(ctrlBuf_.data() + sizeof(h), length - sizeof(h)));
    }
    delete r;
    return;
  }
  if (!r->op) {  // a control send, or an orphan of dropOps
    ctrlReqs_.erase(r);
    orphans_.erase(r);
    delete r;
    return;
  }
  Op* op = r->op;
  bool meta = r->meta;
  ZP_TRACE(kSubNet, "rank %d: completed %s %s #%llu with rank %d: %s, %zu bytes", ctx_.rank,
           op->isSend ? "send" : "recv", meta ? "meta" : "data", (unsigned long long)op->seq, op->peer,
           ucs_status_string(status), length);
  OpState& s = ops_.at(op);
  for (size_t i = 0; i < s.reqs.size(); i++)
    if (s.reqs[i] == r) {
      s.reqs.erase(s.reqs.begin() + i);
      break;
    }
  delete r;
  const int me = ctx_.rank, peer = op->peer;
  if (status == UCS_ERR_CANCELED) {
    // The op was failed on purpose (dead peer, broken communicator); its error is already set.
  } else if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    fault(op, zpInvalidUsage, std::string(opKindName(op->kind)) + ": rank " + std::to_string(peer) +
                                  " sends more than the " + std::to_string(op->bytes / op->typeSize) +
                                  " elements rank " + std::to_string(me) + " expects");
  } else if (status != UCS_OK) {
    fault(op, zpRemoteError, "network error with rank " + std::to_string(peer) + ": " + ucs_status_string(status));
  } else if (!op->isSend && !meta) {
    if (tagKind(tag) != (uint32_t)op->kind) {
      std::string why = "rank " + std::to_string(peer) + " sent a " + opKindName((OpKind)tagKind(tag)) +
                        " message while rank " + std::to_string(me) + " expected " + opKindName(op->kind) +
                        ": the ranks called operations in different orders";
      fault(op, zpInvalidUsage, why);
      ctx_.sink->setAsyncError(zpInvalidUsage, why);
    } else if (length != op->bytes) {
      fault(op, zpInvalidUsage, std::string(opKindName(op->kind)) + ": rank " + std::to_string(peer) + " sends " +
                                    std::to_string(length / op->typeSize) + " elements to rank " +
                                    std::to_string(me) + " but rank " + std::to_string(me) + " expects " +
                                    std::to_string(op->bytes / op->typeSize));
    } else {
      op->progressed = length;
      if (op->lane == kLaneCalls) peers_[peer].receivedEnd = std::max(peers_[peer].receivedEnd, op->seq + 1);
    }
  } else if (op->isSend && !meta) {
    op->progressed = op->bytes;
  } else if (!op->isSend) {
    op->noteArrival();  // the meta goes ahead of the data: the peer has entered its call
  }
  releasePart(op);
}

void UcxTransport::finishOp(Op* op, zpResult_t st, const std::string& err) {
  // The op is done once UCX has let go of its buffers: cancel what is left.
  fault(op, st, err);
  auto it = ops_.find(op);
  if (it == ops_.end()) return;
  // A cancel may complete the request at once, which edits the op's list (and
  // may finish the op): walk a copy.
  std::vector<Request*> reqs = it->second.reqs;
  for (Request* r : reqs) {
    auto probing = std::find(probing_.begin(), probing_.end(), r);
    if (probing == probing_.end()) {
      ucp_request_cancel(worker_, r->ucx);
    } else {  // not given to UCX yet
      probing_.erase(probing);
      complete(r, UCS_ERR_CANCELED, 0, 0);
    }
  }
}

bool UcxTransport::completesAfterBye(const Op* op) const {
  const Peer& p = peers_[op->peer];
  // A named receive on the standing lane is for a message its peer has
  // announced on the lane, so sent before its goodbye, which may overtake
  // it on another lane of the endpoint (kLaneStanding).
  if (op->lane == kLaneStanding) return !op->isSend;
  return op->lane == kLaneCalls && op->seq < (op->isSend ? p.peerReceivedEnd : p.peerSentEnd);
}

void UcxTransport::failPeerOps(int peer, const std::string& why, bool afterBye) {
  std::vector<Op*> victims;
  for (auto& kv : ops_)
    if (kv.first->peer == peer && !(afterBye && completesAfterBye(kv.first))) victims.push_back(kv.first);
  for (Op* op : victims) finishOp(op, zpRemoteError, why);
}

void UcxTransport::postCtrlRecv() {
  if (ctrlRecv_ || !worker_) return;
  Request* r = new Request(this, nullptr, false);
  ucp_request_param_t prm;
  memset(&prm, 0, sizeof(prm));
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  prm.user_data = r;
  prm.cb.recv = recvCb;
  ctrlRecv_ = r;
  ucs_status_ptr_t st = ucp_tag_recv_nbx(worker_, ctrlBuf_.data(), ctrlBuf_.size(), makeTag(kTagCtrl, 0, 0, 0),
                                         kMatchType, &prm);
  if (UCS_PTR_IS_ERR(st)) {
    ctrlRecv_ = nullptr;
    delete r;
    ctx_.sink->setAsyncError(zpSystemError, std::string("UCX: cannot post the control receive: ") +
                                            ucs_status_string(UCS_PTR_STATUS(st)));
    return;
  }
  attach(r, st);
}

void UcxTransport::sendCtrl(int peer, uint32_t type, uint64_t seq, int32_t status, const std::string& text) {
  Peer& p = peers_[peer];
  CtrlHead h{status, 0, 0, 0};
  if (type == kCtrlBye) {
    h.sentEnd = p.sentEnd;
    h.receivedEnd = p.receivedEnd;
  }
  // Statuses overtake queued data; goodbyes and aborts must not (they tell
  // the peer that everything sent before them has arrived).
  ucp_ep_h ep = type == kCtrlStatus ? p.ctrlEp : p.ep;
  if (!ep || p.failed) return;
  Request* r = new Request(this, nullptr, false);
  r->payload.assign((const char*)&h, sizeof(h));
  r->payload += text.substr(0, kCtrlMax - sizeof(h));
  ucp_request_param_t prm;
  memset(&prm, 0, sizeof(prm));
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  prm.user_data = r;
  prm.cb.send = sendCb;
  ucs_status_ptr_t st =
      ucp_tag_send_nbx(ep, r->payload.data(), r->payload.size(), makeTag(kTagCtrl, type, ctx_.rank, seq), &prm);
  if (UCS_PTR_IS_ERR(st)) {
    delete r;
    return;
  }
  ctrlReqs_.insert(r);
  attach(r, st);
}

void UcxTransport::sendStatus(int peer, uint64_t collSeq, zpResult_t status, const std::string& text) {
  sendCtrl(peer, kCtrlStatus, collSeq, status, text);
}

void UcxTransport::onCtrl(int peer, uint32_t type, uint64_t seq, const CtrlHead& h, std::string text) {
  if (peer < 0 || peer >= ctx_.nranks) return;
  const int32_t status = h.status;
  switch (type) {
    case kCtrlStatus:
      ctx_.sink->onStatus(peer, seq, (zpResult_t)status, std::move(text));
      break;
    case kCtrlBye:
    case kCtrlAbort: {
      Peer& p = peers_[peer];
      p.bye = true;
      p.why = text;
      if (type == kCtrlAbort) {
        ctx_.sink->setAsyncError((zpResult_t)status, text, true);
        failPeerOps(peer, text);
        break;
      }
      // A goodbye says which messages the peer sent and received: a
      // receive of one it sent, and a send it received (a rendezvous waits
      // for the receiver's acknowledgement), complete still (the goodbye may
      // overtake the data or the acknowledgement, which can travel on other
      // lanes of the endpoint); everything else fails: it never comes.
      p.peerSentEnd = h.sentEnd;
      p.peerReceivedEnd = h.receivedEnd;
      failPeerOps(peer, text, /*afterBye=*/true);
      break;
    }
    default:
      break;
  }
}

void UcxTransport::cutPeer(int peer, const std::string& why) {
  Peer& p = peers_[peer];
  if (p.cut) return;
  p.cut = true;
  p.failed = true;
  p.why = why;
  failPeerOps(peer, why);
  // Sends stuck in the dead path's socket complete (with an error) only when
  // their endpoint goes; until then they hold their buffers.
  for (ucp_ep_h* h : {&p.ep, &p.ctrlEp}) {
    if (!*h) continue;
    ucp_request_param_t prm;
    memset(&prm, 0, sizeof(prm));
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_EP_CLOSE_FLAG_FORCE;
    ucs_status_ptr_t r = ucp_ep_close_nbx(*h, &prm);
    *h = nullptr;
    if (UCS_PTR_IS_PTR(r)) closing_.push_back(r);
  }
}

void UcxTransport::peerFailed(int peer, const std::string& status) {
  Peer& p = peers_[peer];
  if (p.failed) return;
  p.failed = true;
  if (p.why.empty())
    p.why = "rank " + std::to_string(peer) + " on node '" + (*ctx_.ranks)[peer].nodeId + "' is unreachable (" + status +
            "): it died or its network failed";
  ZP_INFO(kSubNet, "rank %d: %s", ctx_.rank, p.why.c_str());
  if (!p.bye) ctx_.sink->setAsyncError(zpRemoteError, p.why);
  failPeerOps(peer, p.why);
}

bool UcxTransport::progress() {
  bool did = false;
  postCtrlRecv();
  size_t before = ops_.size();
  while (ucp_worker_progress(worker_)) did = true;
  if (!epErrors_.empty()) {
    // A peer that leaves says goodbye, then closes: its goodbye may still be
    // waiting, unmatched, behind the control message just taken. Take all
    // control messages first, so that a clean exit is not mistaken for a death.
    for (int i = 0; i < 64; i++) {
      postCtrlRecv();
      if (!ucp_worker_progress(worker_) && ctrlRecv_) break;
    }
  }
  // Receives whose messages have come (taking one may complete it and edit probing_).
  for (size_t i = 0; i < probing_.size();)
    if (takeProbed(probing_[i])) did = true;
    else i++;
  auto errors = std::move(epErrors_);
  epErrors_.clear();
  for (size_t i = 0; i < closing_.size();) {
    if (ucp_request_check_status(closing_[i]) != UCS_INPROGRESS) {
      ucp_request_free(closing_[i]);
      closing_.erase(closing_.begin() + i);
    } else {
      i++;
    }
  }
  for (auto& e : errors) peerFailed(e.first, e.second);
  return did || ops_.size() != before || !errors.empty();
}

// A standing receive from any rank (kLaneStanding) is no work.
static bool standing(const Op* op) { return op->peer == kAnyRemotePeer; }

bool UcxTransport::busy() const {
  for (auto& kv : ops_)
    if (!standing(kv.first)) return true;
  return false;
}

std::vector<int> UcxTransport::busyPeers() const {
  std::vector<int> out;
  for (auto& kv : ops_)
    if (!standing(kv.first)) out.push_back(kv.first->peer);
  return out;
}

void UcxTransport::wait(int ms) {
  if (arm()) sleep(ms);
}

// Arming fails with BUSY when events are already waiting: then do not sleep.
bool UcxTransport::arm() { return ucp_worker_arm(worker_) == UCS_OK; }

void UcxTransport::sleep(int ms) const {
  pollfd p = {efd_, POLLIN, 0};
  poll(&p, 1, ms);
}

bool UcxTransport::ready() const {
  pollfd p = {efd_, POLLIN, 0};
  return poll(&p, 1, 0) > 0;
}

void UcxTransport::dropOps(zpResult_t status, const std::string& why) {
  std::vector<Op*> ops;
  for (auto& kv : ops_) ops.push_back(kv.first);
  for (Op* op : ops) finishOp(op, status, why);
  // Callers free their buffers when we return: wait until UCX let go of
  // them. Not for a receive from a peer whose endpoint failed: UCX may have
  // matched it (a rendezvous whose data was still to come), and then it can
  // be neither cancelled nor completed, while no byte can come from that
  // peer any more.
  auto mayStillUse = [&](const Op* op) {
    return op->isSend || op->peer < 0 || !peers_[op->peer].failed;
  };
  auto waiting = [&] {
    for (auto& kv : ops_)
      if (mayStillUse(kv.first)) return true;
    return false;
  };
  // A short grace, then every peer still holding one of these requests is
  // cut: its endpoints force-closed, which completes them. Waiting longer
  // only outlasted ZP_TIMEOUT: a rendezvous send to a rank that died before
  // this rank's UCX noticed holds on until UCX's own timeouts (seconds). The
  // communicator is broken and the peers were told first (Comm::giveUp).
  const uint64_t graceMs = std::min<uint64_t>(kDropGraceMs, std::max(ctx_.cfg->timeoutMs, 4) / 4);
  uint64_t deadline = nowMs() + graceMs;
  while (waiting() && nowMs() < deadline) ucp_worker_progress(worker_);
  if (waiting()) {
    std::set<int> holders;
    for (auto& kv : ops_)
      if (mayStillUse(kv.first) && kv.first->peer >= 0) holders.insert(kv.first->peer);
    for (int peer : holders) cutPeer(peer, why);
    deadline = nowMs() + graceMs;
    while (waiting() && nowMs() < deadline) ucp_worker_progress(worker_);
  }
  size_t stuck = 0;
  for (auto& kv : ops_) {
    stuck += mayStillUse(kv.first);
    kv.first->finish(kv.first->status, kv.first->error);
  }
  if (stuck) ZP_WARN(kSubNet, "UCX: %zu operations did not release their buffers", stuck);
  // Such a request stays ours (freed by a late completion or by the
  // destructor); its op is done.
  for (auto& kv : ops_)
    for (Request* r : kv.second.reqs) {
      r->op = nullptr;
      orphans_.insert(r);
    }
  ops_.clear();
}

void UcxTransport::sendToAll(uint32_t type, zpResult_t code, const std::string& why) {
  for (int r = 0; r < (int)peers_.size(); r++)
    if (peers_[r].ep) sendCtrl(r, type, 0, code, why);
  // Bounded: a peer that is gone cannot hold this rank up. An abort comes
  // from a failing rank before dropOps' grace, so it is held to the same
  // share of ZP_TIMEOUT (the peers hear within the timeout they were
  // promised); a goodbye, from a healthy destroy, gets the full bound.
  uint64_t boundMs = kCtrlSendMs;
  if (type == kCtrlAbort) boundMs = std::min<uint64_t>(boundMs, std::max(ctx_.cfg->timeoutMs, 4) / 4);
  uint64_t deadline = nowMs() + boundMs;
  while (!ctrlReqs_.empty() && nowMs() < deadline) ucp_worker_progress(worker_);
}

void UcxTransport::abortPeers(zpResult_t code, const std::string& why) { sendToAll(kCtrlAbort, code, why); }

void UcxTransport::leave() {
  sendToAll(kCtrlBye, zpRemoteError, "rank " + std::to_string(ctx_.rank) + " destroyed the communicator");
}

}  // namespace zp
