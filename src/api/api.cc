// The C face of the base layers: argument checks, handles, each
// communicator's last error, and the calls into the core and collectives.
#include <algorithm>
#include <cstdarg>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <utility>
#include <vector>

#include "collectives/collectives.h"
#include "include/zeppelin.h"
#include "src/api/coll_checks.h"
#include "src/api/handles.h"
#include "src/core/bootstrap.h"
#include "src/core/comm.h"
#include "src/core/config.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "src/route/routing_setting.h"
#include "src/route/routing_state.h"
#include "src/util/clock.h"
#include "src/util/nvtx.h"
#include "src/util/per_thread.h"

namespace {

// What a live handle stands for.
struct HandleState {
  // Shared with the groups that have calls on it queued (on any thread), so
  // that destroying it while one is open leaves them an error, not freed memory.
  std::shared_ptr<zp::Comm> impl;
  // The message of the last call on this communicator that failed (any thread).
  std::mutex errorMu;
  std::string lastError;
};

// A handle is a number, never an address: the k-th communicator made in this
// process (k = 1, 2, ...) is kHandleBase + k * kHandleStep, above every
// user-space address, never reused and never dereferenced. So a destroyed
// communicator's handle costs no memory (it is one that was handed out and
// is no longer live: a late call gets "destroyed", neither freed memory nor
// another communicator), and a garbage pointer is never mistaken for one.
static_assert(sizeof(uintptr_t) == 8, "handles are 64-bit numbers");
constexpr uintptr_t kHandleBase = 0x5a70000000000000ull, kHandleStep = 16;

std::mutex gHandlesMu;
uint64_t gHandlesMade = 0;
std::unordered_map<zpComm_t, std::shared_ptr<HandleState>> gLive;  // handles not yet destroyed
// Bumped by every destroy: a thread's cached lookups (lookup) from an
// earlier epoch are not trusted.
std::atomic<uint64_t> gDestroyEpoch{0};

std::shared_ptr<HandleState> stateOf(zpComm_t handle) {
  std::lock_guard<std::mutex> lock(gHandlesMu);
  auto it = gLive.find(handle);
  return it == gLive.end() ? nullptr : it->second;
}

// Under gHandlesMu: a handle this process returned once (live or destroyed).
bool handedOut(zpComm_t handle) {
  uintptr_t v = (uintptr_t)handle;
  return v > kHandleBase && (v - kHandleBase) % kHandleStep == 0 && (v - kHandleBase) / kHandleStep <= gHandlesMade;
}

// A call on handle returns r: a failure's message (this thread's last error)
// becomes the communicator's last error too.
zpResult_t notedFailure(zpComm_t handle, zpResult_t r) {
  if (std::shared_ptr<HandleState> h = stateOf(handle)) {
    std::lock_guard<std::mutex> lock(h->errorMu);
    h->lastError = zp::lastError();
  }
  return r;
}
inline zpResult_t noted(zpComm_t handle, zpResult_t r) { return r == zpSuccess ? r : notedFailure(handle, r); }

// The last few handles this thread resolved, so that a call does not take
// the global lock and hash the handle (every data call resolves one). An
// entry holds the communicator weakly (a destroyed one is freed as before)
// and counts only while no communicator was destroyed since it was made.
struct LookupCache {
  struct Entry {
    zpComm_t handle = nullptr;
    uint64_t epoch = 0;
    std::weak_ptr<zp::Comm> comm;
  };
  Entry entries[4];
  unsigned next = 0;
};

// What this file keeps per thread.
struct ApiThread {
  LookupCache lookups;
  // Communicators with calls queued in this thread's open group: a failing
  // zpGroupEnd is their last error.
  std::vector<zpComm_t> groupComms;
  // The handle of the open group's last send or receive and its
  // communicator, which the group holds: the group's next call on it
  // needs no lookup. Cleared when the group ends.
  zpComm_t groupHandle = nullptr;
  zp::Comm* groupComm = nullptr;
};
ApiThread& thisThread() { return zp::PerThread<ApiThread>::get(); }

void inGroup(zpComm_t handle) {
  std::vector<zpComm_t>& comms = thisThread().groupComms;
  // The common case first: another call on the communicator of the last
  // (the list is not empty only while a group is open).
  if (!comms.empty() && comms.back() == handle) return;
  if (!zp::groupOpen()) return;
  if (std::find(comms.begin(), comms.end(), handle) == comms.end()) comms.push_back(handle);
}

// Resolves a handle (a number: nothing is dereferenced) to a reference that
// keeps its communicator alive.
zpResult_t lookup(zpComm_t handle, const char* fn, std::shared_ptr<zp::Comm>* out) {
  if (!handle) return zp::fail(zpInvalidArgument, "%s: comm is NULL", fn);
  LookupCache& cache = thisThread().lookups;
  const uint64_t epoch = gDestroyEpoch.load(std::memory_order_acquire);
  for (LookupCache::Entry& e : cache.entries) {
    if (e.handle != handle || e.epoch != epoch) continue;
    // No communicator was destroyed since the entry was made, so it is the
    // handle's.
    if ((*out = e.comm.lock())) return zpSuccess;
  }
  std::lock_guard<std::mutex> lock(gHandlesMu);
  auto it = gLive.find(handle);
  if (it != gLive.end() && it->second->impl) {
    *out = it->second->impl;
    LookupCache::Entry& e = cache.entries[cache.next++ % 4];
    e.handle = handle;
    e.epoch = epoch;
    e.comm = *out;
    return zpSuccess;
  }
  if (handedOut(handle)) return zp::fail(zpInvalidArgument, "%s: the communicator was destroyed", fn);
  return zp::fail(zpInvalidArgument, "%s: %p is not a communicator", fn, (void*)handle);
}

struct NamedBuffer {
  const char* name;
  const void* ptr;
};

// A data call's datatype, and its buffers against its stream: a stream means
// device buffers (enqueued, as in NCCL), NULL means host buffers (done on
// return). Mixing the two is refused here, with what to pass instead, since
// NCCL would fault on the device and the host path would touch device memory.
zpResult_t checkBuffers(const char* fn, zp::Comm* c, zpDataType_t dtype, zpStream_t stream,
                        std::initializer_list<NamedBuffer> buffers);
inline zpResult_t checkDataCall(const char* fn, zp::Comm* c, zpDataType_t dtype, zpStream_t stream,
                                std::initializer_list<NamedBuffer> buffers) {
  // Host buffers on a communicator without a device: nothing to look up
  // (every small host call comes this way).
  if (!stream && !c->streamTransport() && zp::typeSize(dtype) != 0) return zpSuccess;
  return checkBuffers(fn, c, dtype, stream, buffers);
}

zpResult_t checkBuffers(const char* fn, zp::Comm* c, zpDataType_t dtype, zpStream_t stream,
                        std::initializer_list<NamedBuffer> buffers) {
  if (zpTypeSize(dtype) == 0) return zp::fail(zpInvalidArgument, "%s: invalid datatype %d", fn, (int)dtype);
  zp::StreamTransport* device = c->streamTransport();
  if (stream && !device)
    return zp::fail(zpInvalidArgument,
                    "%s: a non-NULL stream means device buffers, but this communicator has no device data plane (%s); "
                    "pass NULL as the stream for host buffers",
                    fn, c->noDeviceWhy().c_str());
  if (!device) return zpSuccess;
  for (const NamedBuffer& b : buffers) {
    if (!b.ptr) continue;
    zp::StreamTransport::Memory where;
    int ordinal = -1;
    ZP_CHECK(device->memoryOf(b.ptr, stream, &where, &ordinal));
    if (stream && where == zp::StreamTransport::Memory::kHost)
      return zp::fail(zpInvalidArgument,
                      "%s: %s (%p) is host memory but a stream was given: pass device memory to order the call on "
                      "the stream, or NULL as the stream for host buffers",
                      fn, b.name, b.ptr);
    if (!stream && where == zp::StreamTransport::Memory::kDevice)
      return zp::fail(zpInvalidArgument,
                      "%s: %s (%p) is device memory (GPU %d) but the stream is NULL, which means host buffers: pass "
                      "the CUDA stream to order the call on",
                      fn, b.name, b.ptr, ordinal);
    if (stream && ordinal != device->device())
      return zp::fail(zpInvalidArgument, "%s: %s (%p) is on GPU %d but this communicator's device is GPU %d", fn,
                      b.name, b.ptr, ordinal, device->device());
  }
  return zpSuccess;
}


}  // namespace

const char* zpGetErrorString(zpResult_t r) {
  switch (r) {
    case zpSuccess: return "no error";
    case zpUnhandledCudaError: return "unhandled cuda error";
    case zpSystemError: return "unhandled system error";
    case zpInternalError: return "internal error - please report this issue";
    case zpInvalidArgument: return "invalid argument";
    case zpInvalidUsage: return "invalid usage";
    case zpRemoteError: return "remote process exited or there was a network error";
    case zpInProgress: return "operation in progress";
    default: return "unknown result code";
  }
}

// Called from static initializers (the extension layer's kernels): touches
// none of this file's globals.
zpResult_t zpAddDeviceInitHook(zpDeviceInitHook_t hook) try {
  return zp::streamTransportKind().addInitHook(hook);
} catch (...) {
  return zp::failFromException("zpAddDeviceInitHook");
}

zpResult_t zpSetLastError(zpComm_t comm, zpResult_t code, const char* format, ...) {
  if (code == zpSuccess) {
    zp::clearLastError();
    return zpSuccess;
  }
  va_list ap;
  va_start(ap, format);
  zpResult_t r = zp::failv(code, format ? format : "", ap);
  va_end(ap);
  return noted(comm, r);
}

const char* zpGetLastError(zpComm_t comm) {
  std::shared_ptr<HandleState> h = stateOf(comm);
  if (!h) return zp::lastError();
  // A copy per thread: another thread may fail on the communicator meanwhile.
  thread_local std::string copy;
  std::lock_guard<std::mutex> lock(h->errorMu);
  copy = h->lastError;
  return copy.c_str();
}

zpResult_t zpGetVersion(int* version) try {
  if (!version) return zp::fail(zpInvalidArgument, "zpGetVersion: version is NULL");
  *version = ZP_VERSION_CODE;
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpGetVersion");
}

zpResult_t zpGetParam(const char* name, const char** value) try {
  if (!name || !value) return zp::fail(zpInvalidArgument, "zpGetParam: name or value is NULL");
  const zp::Param* p = zp::findParam(name);
  if (!p) return zp::fail(zpInvalidArgument, "zpGetParam: %s is not a Zeppelin setting (zpconfig --list)", name);
  thread_local std::string copy;  // valid until this thread's next call
  copy = zp::envString(name, p->dflt);
  *value = copy.c_str();
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpGetParam");
}

size_t zpTypeSize(zpDataType_t t) { return zp::typeSize(t); }

zpResult_t zpGetUniqueId(zpUniqueId* id) try {
  if (!id) return zp::fail(zpInvalidArgument, "zpGetUniqueId: uniqueId is NULL");
  return zp::startRoot(id);
} catch (...) {
  return zp::failFromException("zpGetUniqueId");
}

// A new handle for a communicator made here (init or split).
static zpComm_t newHandle(std::unique_ptr<zp::Comm> impl) {
  zp::enableRouting(impl.get());
  auto h = std::make_shared<HandleState>();
  h->impl = std::move(impl);
  std::lock_guard<std::mutex> lock(gHandlesMu);
  zpComm_t handle = (zpComm_t)(kHandleBase + ++gHandlesMade * kHandleStep);
  gLive.emplace(handle, std::move(h));
  return handle;
}

zpResult_t zpCommInitRankConfig(zpComm_t* comm, int nranks, zpUniqueId id, int rank, zpConfig_t* config) try {
  ZP_NVTX_RANGE("zpCommInitRankConfig");
  if (!comm) return zp::fail(zpInvalidArgument, "zpCommInitRank: comm is NULL");
  *comm = nullptr;
  if (nranks <= 0) return zp::fail(zpInvalidArgument, "zpCommInitRank: nranks=%d must be positive", nranks);
  if (rank < 0 || rank >= nranks)
    return zp::fail(zpInvalidArgument, "zpCommInitRank: rank %d is not in [0, %d)", rank, nranks);
  zp::Config cfg;
  ZP_CHECK(zp::resolveConfig(config, &cfg));
  std::unique_ptr<zp::Comm> impl;
  ZP_CHECK(zp::Comm::create(nranks, id, rank, cfg, zp::routedEagerBytes(cfg), &impl));
  *comm = newHandle(std::move(impl));
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpCommInitRankConfig");
}

zpResult_t zpCommInitRank(zpComm_t* comm, int nranks, zpUniqueId id, int rank) try {
  return zpCommInitRankConfig(comm, nranks, id, rank, nullptr);
} catch (...) {
  return zp::failFromException("zpCommInitRank");
}

static zpResult_t destroy(zpComm_t comm, bool abort, const char* fn) {
  std::shared_ptr<zp::Comm> c;
  ZP_CHECK(lookup(comm, fn, &c));
  if (zp::groupOpen() && zp::groupUses(c.get()))
    return zp::fail(zpInvalidUsage, "%s: the communicator has calls queued in an open group", fn);
  // A call blocked on the communicator in another thread holds its lock:
  // make it return first, so that abort does not wait for its timeout.
  if (abort) c->requestAbort();
  c.reset();
  std::shared_ptr<zp::Comm> impl;
  {
    std::lock_guard<std::mutex> lock(gHandlesMu);
    auto it = gLive.find(comm);
    // Another thread destroyed it meanwhile.
    if (it == gLive.end()) return zp::fail(zpInvalidArgument, "%s: the communicator was destroyed", fn);
    impl = std::move(it->second->impl);
    gLive.erase(it);
    gDestroyEpoch.fetch_add(1, std::memory_order_release);
  }
  impl->leave(abort);
  return zpSuccess;
}

zpResult_t zpCommDestroy(zpComm_t comm) try {
  ZP_NVTX_RANGE("zpCommDestroy");
  return noted(comm, destroy(comm, false, "zpCommDestroy"));
} catch (...) {
  return zp::failFromException("zpCommDestroy");
}
zpResult_t zpCommAbort(zpComm_t comm) try {
  ZP_NVTX_RANGE("zpCommAbort");
  return noted(comm, destroy(comm, true, "zpCommAbort"));
} catch (...) {
  return zp::failFromException("zpCommAbort");
}

// The calls that read one value of a communicator: the handle looked up,
// the out pointer checked (named outName in the message), *out = get(comm).
template <class T, class Get>
static zpResult_t commValue(zpComm_t comm, const char* fn, const char* outName, T* out, Get get) {
  std::shared_ptr<zp::Comm> c;
  ZP_CHECK(noted(comm, lookup(comm, fn, &c)));
  if (!out) return noted(comm, zp::fail(zpInvalidArgument, "%s: %s is NULL", fn, outName));
  *out = get(*c);
  return zpSuccess;
}

zpResult_t zpCommGetAsyncError(zpComm_t comm, zpResult_t* asyncError) try {
  // There is no background thread: polling here is what lets a waiting
  // caller learn of a peer's failure between calls.
  return commValue(comm, "zpCommGetAsyncError", "asyncError", asyncError,
                   [](zp::Comm& c) { return c.pollAsyncError(); });
} catch (...) {
  return zp::failFromException("zpCommGetAsyncError");
}

zpResult_t zpSetInterruptCheck(zpInterruptCheck_t check, void* arg) {
  zp::setInterruptCheck(check, arg);
  return zpSuccess;
}

zpResult_t zpCommGetWaitReport(zpComm_t comm, zpWaitEntry_t* entries, int maxEntries, int* nEntries,
                               int* nCalls) try {
  const char* fn = "zpCommGetWaitReport";
  std::shared_ptr<zp::Comm> c;
  ZP_CHECK(noted(comm, lookup(comm, fn, &c)));
  if (!nEntries || !nCalls) return noted(comm, zp::fail(zpInvalidArgument, "%s: nEntries or nCalls is NULL", fn));
  if (maxEntries < 0 || (maxEntries > 0 && !entries))
    return noted(comm, zp::fail(zpInvalidArgument, "%s: entries is NULL with maxEntries %d (0 asks only the count)",
                                fn, maxEntries));
  zp::Comm::Call call(c.get(), fn);
  ZP_CHECK(noted(comm, call.status()));
  int calls = 0;
  std::vector<zp::WaitStats::Entry> report = c->waitStats().report(&calls);
  for (int i = 0; i < maxEntries && i < (int)report.size(); i++)
    entries[i] = zpWaitEntry_t{report[i].rank, report[i].callsLast, report[i].totalUs / 1e6, report[i].maxUs / 1e6};
  *nEntries = (int)report.size();
  *nCalls = calls;
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpCommGetWaitReport");
}

zpResult_t zpCommGetRailReport(zpComm_t comm, zpRailEntry_t* entries, int maxEntries, int* nEntries) try {
  const char* fn = "zpCommGetRailReport";
  std::shared_ptr<zp::Comm> c;
  ZP_CHECK(noted(comm, lookup(comm, fn, &c)));
  if (!nEntries) return noted(comm, zp::fail(zpInvalidArgument, "%s: nEntries is NULL", fn));
  if (maxEntries < 0 || (maxEntries > 0 && !entries))
    return noted(comm, zp::fail(zpInvalidArgument, "%s: entries is NULL with maxEntries %d (0 asks only the count)",
                                fn, maxEntries));
  zp::Comm::Call call(c.get(), fn);
  ZP_CHECK(noted(comm, call.status()));
  std::vector<zp::RailStatus> rails;
  if (const zp::Routing* routing = c->routing()) rails = routing->railStatus();
  for (int i = 0; i < maxEntries && i < (int)rails.size(); i++) {
    zpRailEntry_t& e = entries[i];
    e = zpRailEntry_t{};
    e.rail = rails[i].rail;
    snprintf(e.nic, sizeof(e.nic), "%s", rails[i].nic.c_str());
    e.nominalBitsPerSec = rails[i].nominalBitsPerSec;
    e.bitsPerSec = rails[i].bitsPerSec;
    e.slow = rails[i].slow;
    e.changes = rails[i].changes;
  }
  *nEntries = (int)rails.size();
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpCommGetRailReport");
}

zpResult_t zpCommCount(const zpComm_t comm, int* count) try {
  return commValue(comm, "zpCommCount", "count", count, [](zp::Comm& c) { return c.nranks(); });
} catch (...) {
  return zp::failFromException("zpCommCount");
}

zpResult_t zpCommUserRank(const zpComm_t comm, int* rank) try {
  return commValue(comm, "zpCommUserRank", "rank", rank, [](zp::Comm& c) { return c.rank(); });
} catch (...) {
  return zp::failFromException("zpCommUserRank");
}

static zpResult_t split(zpComm_t comm, int color, int key, zpComm_t* newcomm, zpConfig_t* config) {
  std::shared_ptr<zp::Comm> c;
  ZP_CHECK(lookup(comm, "zpCommSplit", &c));
  if (zp::groupOpen())
    return zp::fail(zpInvalidUsage, "zpCommSplit: called inside a group (zpGroupStart); call it outside");
  if (newcomm) *newcomm = nullptr;
  // This rank's own arguments; a bad one still takes part in the exchange,
  // so that every rank fails at once rather than at its timeout.
  zp::Config cfg = c->cfg();
  zpResult_t local = zpSuccess;
  if (!newcomm) local = zp::fail(zpInvalidArgument, "zpCommSplit: newcomm is NULL");
  else if (color < ZP_SPLIT_NOCOLOR)
    local = zp::fail(zpInvalidArgument, "zpCommSplit: color %d is negative (only ZP_SPLIT_NOCOLOR = %d may be)",
                     color, ZP_SPLIT_NOCOLOR);
  else if (config) local = zp::resolveConfig(config, &cfg);
  std::unique_ptr<zp::Comm> child;
  {
    zp::Comm::Call call(c.get(), "zpCommSplit");
    ZP_CHECK(call.status());
    ZP_CHECK(zp::commSplit(c.get(), color, key, local, cfg, zp::routedEagerBytes(cfg), &child));
  }
  if (child) *newcomm = newHandle(std::move(child));
  return zpSuccess;
}

zpResult_t zpCommSplit(zpComm_t comm, int color, int key, zpComm_t* newcomm, zpConfig_t* config) try {
  ZP_NVTX_RANGE("zpCommSplit");
  return noted(comm, split(comm, color, key, newcomm, config));
} catch (...) {
  return zp::failFromException("zpCommSplit");
}

zpResult_t zpCommCheckBuffer(zpComm_t comm, const void* buf, zpStream_t stream) try {
  std::shared_ptr<zp::Comm> c;
  ZP_CHECK(noted(comm, lookup(comm, "zpCommCheckBuffer", &c)));
  return noted(comm, checkDataCall("zpCommCheckBuffer", c.get(), zpUint8, stream, {{"buf", buf}}));
} catch (...) {
  return zp::failFromException("zpCommCheckBuffer");
}

zpResult_t zpCommGetNcclComm(zpComm_t comm, struct ncclComm** ncclComm) try {
  std::shared_ptr<zp::Comm> c;
  ZP_CHECK(noted(comm, lookup(comm, "zpCommGetNcclComm", &c)));
  if (!ncclComm) return noted(comm, zp::fail(zpInvalidArgument, "zpCommGetNcclComm: ncclComm is NULL"));
  *ncclComm = nullptr;
  if (!c->streamTransport())
    return noted(comm, zp::fail(zpInvalidUsage, "zpCommGetNcclComm: the communicator has no NCCL communicator (%s)",
                                c->noDeviceWhy().c_str()));
  *ncclComm = static_cast<struct ncclComm*>(c->streamTransport()->native());
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpCommGetNcclComm");
}

zpResult_t zpGroupStart(void) try { return zp::groupStart(); } catch (...) {  return zp::failFromException("zpGroupStart"); }

zpResult_t zpGroupEnd(void) try {
  ZP_NVTX_RANGE("zpGroupEnd");
  bool ended = false;
  zpResult_t r = zp::groupEnd(&ended);
  if (ended) {
    ApiThread& t = thisThread();
    if (r != zpSuccess)
      for (zpComm_t h : t.groupComms) noted(h, r);
    t.groupComms.clear();  // keeps its storage: a group per step allocates nothing here
    t.groupHandle = nullptr;
    t.groupComm = nullptr;
  }
  return r;
} catch (...) {
  return zp::failFromException("zpGroupEnd");
}

static zpResult_t p2p(bool isSend, void* buf, size_t count, zpDataType_t datatype, int peer, zpComm_t comm,
                      zpStream_t stream, int* source = nullptr) {
  const char* fn = isSend ? "zpSend" : "zpRecv";
  std::shared_ptr<zp::Comm> hold;
  zp::Comm* c = nullptr;
  ApiThread& t = thisThread();
  const bool known = comm && comm == t.groupHandle;  // the open group's, held by it
  if (known) {
    c = t.groupComm;
  } else {
    ZP_CHECK(lookup(comm, fn, &hold));
    c = hold.get();
  }
  // NCCL has no receive from any source, and a device receive is enqueued
  // with its peer known: refused before the buffer is looked at.
  if (!isSend && peer == ZP_ANY_SOURCE && stream)
    return zp::fail(zpInvalidArgument,
                    "%s: a receive from any source (ZP_ANY_SOURCE) takes host buffers and a NULL stream: NCCL, "
                    "which moves device buffers, has no receive from any source",
                    fn);
  ZP_CHECK(checkDataCall(fn, c, datatype, stream, {{isSend ? "sendbuff" : "recvbuff", buf}}));
  const uint64_t opCount = c->nextOpCount();
  ZP_INFO(zp::kSubP2P, "%s: opCount %llx buff %p count %zu datatype %s peer %d comm %p [nranks=%d] stream %p", fn + 2,
          (unsigned long long)opCount, buf, count, zp::typeName(datatype), peer, (void*)comm, c->nranks(), stream);
  if (known) return zp::enqueueP2P(c, nullptr, isSend, buf, count, datatype, peer, stream, source);
  inGroup(comm);
  ZP_CHECK(zp::enqueueP2P(c, std::move(hold), isSend, buf, count, datatype, peer, stream, source));
  if (zp::groupOpen()) {  // queued: the group holds c now
    t.groupHandle = comm;
    t.groupComm = c;
  }
  return zpSuccess;
}

zpResult_t zpSend(const void* sendbuff, size_t count, zpDataType_t datatype, int peer, zpComm_t comm,
                         zpStream_t stream) try {
  ZP_NVTX_RANGE("zpSend");
  return noted(comm, p2p(true, const_cast<void*>(sendbuff), count, datatype, peer, comm, stream));
} catch (...) {
  return zp::failFromException("zpSend");
}

zpResult_t zpRecv(void* recvbuff, size_t count, zpDataType_t datatype, int peer, zpComm_t comm,
                         zpStream_t stream) try {
  ZP_NVTX_RANGE("zpRecv");
  return noted(comm, p2p(false, recvbuff, count, datatype, peer, comm, stream));
} catch (...) {
  return zp::failFromException("zpRecv");
}

zpResult_t zpRecvFrom(void* recvbuff, size_t count, zpDataType_t datatype, int peer, int* source, zpComm_t comm,
                      zpStream_t stream) try {
  ZP_NVTX_RANGE("zpRecvFrom");
  return noted(comm, p2p(false, recvbuff, count, datatype, peer, comm, stream, source));
} catch (...) {
  return zp::failFromException("zpRecvFrom");
}

// A copy of the count and displacement arrays of a call that may run later
// (queued in a group, at zpGroupEnd), so that the caller may free or reuse
// its own: each non-null *arrays[k] (n elements) is pointed into the copy,
// which the queued call keeps alive.
static std::shared_ptr<std::vector<size_t>> keepArrays(size_t n, std::initializer_list<const size_t**> arrays) {
  auto kept = std::make_shared<std::vector<size_t>>();
  kept->reserve(n * arrays.size());
  for (const size_t** a : arrays)
    if (*a) kept->insert(kept->end(), *a, *a + n);
  size_t at = 0;
  for (const size_t** a : arrays)
    if (*a) *a = kept->data() + n * at++;
  return kept;
}

static zpResult_t alltoallv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[], void* recvbuff,
                            const size_t recvcounts[], const size_t rdispls[], zpDataType_t datatype, zpComm_t comm,
                            zpStream_t stream) {
  std::shared_ptr<zp::Comm> c;
  ZP_CHECK(lookup(comm, "zpAlltoallv", &c));
  const zpResult_t bad =
      checkDataCall("zpAlltoallv", c.get(), datatype, stream, {{"sendbuff", sendbuff}, {"recvbuff", recvbuff}});
  if (bad != zpSuccess) {  // refused with the peers where they exchange anything (zeppelin.h, "Errors")
    if (zp::groupOpen()) return bad;
    const std::string why = zp::lastError();
    zp::Comm::Call call(c.get(), "zpAlltoallv");
    if (call.status() != zpSuccess) return zp::fail(bad, "%s", why.c_str());
    return zp::refuseAlltoallv(c.get(), bad, why, stream);
  }
  const uint64_t opCount = c->nextOpCount();
  if (zp::logEnabled(zp::kLogInfo, zp::kSubColl) && sendcounts && recvcounts) {
    size_t sent = 0, received = 0;
    for (int p = 0; p < c->nranks(); p++) sent += sendcounts[p], received += recvcounts[p];
    zp::logMessage(zp::kLogInfo, zp::kSubColl,
                   "Alltoallv: opCount %llx sendbuff %p recvbuff %p sends %zu receives %zu datatype %s comm %p "
                   "[nranks=%d] stream %p",
                   (unsigned long long)opCount, sendbuff, recvbuff, sent, received, zp::typeName(datatype),
                   (void*)comm, c->nranks(), stream);
  }
  inGroup(comm);
  if (zp::groupOpen()) {
    // Queued: the group keeps its own copy of the four arrays (the caller may
    // free or reuse them before zpGroupEnd, as NCCL's scalars).
    auto kept = keepArrays((size_t)c->nranks(), {&sendcounts, &sdispls, &recvcounts, &rdispls});
    zp::queueCollective(c, [=, raw = c.get()] {
      (void)kept;
      return zp::alltoallv(raw, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, datatype, stream);
    });
    return zpSuccess;
  }
  // By the communicator's address, as the standard collectives' closure.
  return zp::enqueueCollective(c, "zpAlltoallv", [=, raw = c.get()] {
    return zp::alltoallv(raw, sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, datatype, stream);
  });
}

zpResult_t zpAlltoallv(const void* sendbuff, const size_t sendcounts[], const size_t sdispls[],
                              void* recvbuff, const size_t recvcounts[], const size_t rdispls[],
                              zpDataType_t datatype, zpComm_t comm, zpStream_t stream) try {
  ZP_NVTX_RANGE("zpAlltoallv");
  return noted(comm, alltoallv(sendbuff, sendcounts, sdispls, recvbuff, recvcounts, rdispls, datatype, comm, stream));
} catch (...) {
  return zp::failFromException("zpAlltoallv");
}

// ---- The standard collectives ----

// One collective's arguments on this rank (whether the ranks agree is
// checked inside, across ranks): zpInvalidArgument naming the first bad one.
static zpResult_t checkCollArgs(const char* fn, const zp::CollArgs& a, zp::Comm* c, zpStream_t stream) {
  const int n = c->nranks(), me = c->rank();
  if (a.kind == zp::CollKind::kBarrier) return zpSuccess;  // no buffers; its stream is not used
  const size_t ts = zpTypeSize(a.dtype);
  if (ts == 0) return zp::fail(zpInvalidArgument, "%s: invalid datatype %d", fn, (int)a.dtype);
  const bool reduces = a.kind == zp::CollKind::kAllReduce || a.kind == zp::CollKind::kReduce ||
                       a.kind == zp::CollKind::kReduceScatter || a.kind == zp::CollKind::kReduceScatterv;
  if (reduces && ((int)a.op < 0 || a.op >= zpNumOps))
    return zp::fail(zpInvalidArgument, "%s: invalid reduction op %d", fn, (int)a.op);
  const bool rooted = a.kind == zp::CollKind::kBroadcast || a.kind == zp::CollKind::kReduce;
  if (rooted && (a.root < 0 || a.root >= n))
    return zp::fail(zpInvalidArgument, "%s: root %d is not a rank of this communicator (0..%d)", fn, a.root, n - 1);
  // all-gather and reduce-scatter move n blocks of count: checked before multiplying.
  const bool blocks = a.kind == zp::CollKind::kAllGather || a.kind == zp::CollKind::kReduceScatter;
  if (blocks ? a.count > zp::maxElements(ts) / (size_t)n : a.count > zp::maxElements(ts))
    return zp::fail(zpInvalidArgument, "%s: count %zu is too large (a negative value cast to size_t?)", fn, a.count);
  size_t sendElems = a.count, recvElems = a.count;
  if (a.kind == zp::CollKind::kAllGatherv || a.kind == zp::CollKind::kReduceScatterv)
    ZP_CHECK(zp::checkCounts(fn, a, n, me, ts, &sendElems, &recvElems));
  // Which buffers this rank reads and writes.
  const bool readsSend = a.kind != zp::CollKind::kBroadcast || me == a.root;
  const bool writesRecv = a.kind != zp::CollKind::kReduce || me == a.root;
  if (sendElems && readsSend && !a.send) return zp::fail(zpInvalidArgument, "%s: sendbuff is NULL", fn);
  if (recvElems && writesRecv && !a.recv) return zp::fail(zpInvalidArgument, "%s: recvbuff is NULL", fn);
  if (readsSend && writesRecv) ZP_CHECK(zp::checkOverlap(fn, a, n, me, ts, sendElems, recvElems));
  // A stream means device buffers (NCCL's collective).
  return checkDataCall(fn, c, a.dtype, stream, {{"sendbuff", a.send}, {"recvbuff", a.recv}});
}

// Checks one collective's arguments on this rank, then runs it or queues it
// in the group. A call this rank refuses still takes part in the header
// round where the call would have had one (a host call, or a device call
// with ZP_CHECK_MODE=full) and is not in a group: every rank fails it with
// this rank's reason, and the next call runs (zeppelin.h, "Errors").
static zpResult_t collective(const char* fn, zp::CollArgs a, zpComm_t comm, zpStream_t stream,
                             std::shared_ptr<const std::vector<size_t>> keep = nullptr) {
  std::shared_ptr<zp::Comm> c;
  ZP_CHECK(lookup(comm, fn, &c));
  if (a.kind == zp::CollKind::kBarrier) stream = nullptr;
  const zpResult_t bad = checkCollArgs(fn, a, c.get(), stream);
  if (bad != zpSuccess) {
    if (zp::groupOpen() || (stream && !c->cfg().checkDeviceCalls)) return bad;
    const std::string why = zp::lastError();
    zp::Comm::Call call(c.get(), fn);
    if (call.status() != zpSuccess) return zp::fail(bad, "%s", why.c_str());  // this rank's own error first
    return zp::refuseCollective(c.get(), a.kind, bad, why);
  }
  const uint64_t opCount = c->nextOpCount();
  ZP_INFO(zp::kSubColl,
          "%s: opCount %llx sendbuff %p recvbuff %p count %zu datatype %s op %s root %d comm %p [nranks=%d] stream %p",
          fn + 2, (unsigned long long)opCount, a.send, a.recv, a.count, zp::typeName(a.dtype), zp::opName(a.op), a.root,
          (void*)comm, c->nranks(), stream);
  inGroup(comm);
  // The closure takes the communicator's address: a queued one is held by
  // the group with it, and one run at once by c (no reference count moves).
  return zp::enqueueCollective(c, fn, [raw = c.get(), a, stream, keep] { return zp::collective(raw, a, stream); });
}

zpResult_t zpAllReduce(const void* sendbuff, void* recvbuff, size_t count, zpDataType_t datatype, zpRedOp_t op,
                       zpComm_t comm, zpStream_t stream) try {
  ZP_NVTX_RANGE("zpAllReduce");
  return noted(comm, collective("zpAllReduce", {zp::CollKind::kAllReduce, sendbuff, recvbuff, count, datatype, op, 0},
                                comm, stream));
} catch (...) {
  return zp::failFromException("zpAllReduce");
}

zpResult_t zpBroadcast(const void* sendbuff, void* recvbuff, size_t count, zpDataType_t datatype, int root,
                       zpComm_t comm, zpStream_t stream) try {
  ZP_NVTX_RANGE("zpBroadcast");
  return noted(comm, collective("zpBroadcast",
                                {zp::CollKind::kBroadcast, sendbuff, recvbuff, count, datatype, zpSum, root}, comm,
                                stream));
} catch (...) {
  return zp::failFromException("zpBroadcast");
}

zpResult_t zpReduce(const void* sendbuff, void* recvbuff, size_t count, zpDataType_t datatype, zpRedOp_t op, int root,
                    zpComm_t comm, zpStream_t stream) try {
  ZP_NVTX_RANGE("zpReduce");
  return noted(comm, collective("zpReduce", {zp::CollKind::kReduce, sendbuff, recvbuff, count, datatype, op, root},
                                comm, stream));
} catch (...) {
  return zp::failFromException("zpReduce");
}

zpResult_t zpAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, zpDataType_t datatype, zpComm_t comm,
                       zpStream_t stream) try {
  ZP_NVTX_RANGE("zpAllGather");
  return noted(comm, collective("zpAllGather",
                                {zp::CollKind::kAllGather, sendbuff, recvbuff, sendcount, datatype, zpSum, 0}, comm,
                                stream));
} catch (...) {
  return zp::failFromException("zpAllGather");
}

zpResult_t zpReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount, zpDataType_t datatype, zpRedOp_t op,
                           zpComm_t comm, zpStream_t stream) try {
  ZP_NVTX_RANGE("zpReduceScatter");
  return noted(comm, collective("zpReduceScatter",
                                {zp::CollKind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0}, comm,
                                stream));
} catch (...) {
  return zp::failFromException("zpReduceScatter");
}

// The v calls run later inside a group: the call keeps its own copy of the counts.
static zpResult_t collectiveV(const char* fn, zp::CollArgs a, zpComm_t comm, zpStream_t stream) {
  std::shared_ptr<zp::Comm> c;
  ZP_CHECK(lookup(comm, fn, &c));
  auto counts = keepArrays((size_t)c->nranks(), {&a.counts, &a.displs});
  return collective(fn, a, comm, stream, counts);
}

zpResult_t zpAllGatherv(const void* sendbuff, size_t sendcount, void* recvbuff, const size_t recvcounts[],
                        const size_t rdispls[], zpDataType_t datatype, zpComm_t comm, zpStream_t stream) try {
  ZP_NVTX_RANGE("zpAllGatherv");
  return noted(comm, collectiveV("zpAllGatherv",
                                 {zp::CollKind::kAllGatherv, sendbuff, recvbuff, sendcount, datatype, zpSum, 0,
                                  recvcounts, rdispls},
                                 comm, stream));
} catch (...) {
  return zp::failFromException("zpAllGatherv");
}

zpResult_t zpReduceScatterv(const void* sendbuff, void* recvbuff, const size_t recvcounts[], zpDataType_t datatype,
                            zpRedOp_t op, zpComm_t comm, zpStream_t stream) try {
  ZP_NVTX_RANGE("zpReduceScatterv");
  return noted(comm, collectiveV("zpReduceScatterv",
                                 {zp::CollKind::kReduceScatterv, sendbuff, recvbuff, 0, datatype, op, 0, recvcounts,
                                  nullptr},
                                 comm, stream));
} catch (...) {
  return zp::failFromException("zpReduceScatterv");
}

zpResult_t zpBarrier(zpComm_t comm, zpStream_t stream) try {
  ZP_NVTX_RANGE("zpBarrier");
  return noted(comm, collective("zpBarrier", {zp::CollKind::kBarrier, nullptr, nullptr, 0, zpUint8, zpSum, 0}, comm,
                                stream));
} catch (...) {
  return zp::failFromException("zpBarrier");
}

zpResult_t zp::commShape(zpComm_t comm, const char* fn, CommShape* out) {
  std::shared_ptr<zp::Comm> c;
  ZP_CHECK(lookup(comm, fn, &c));
  *out = c->shape();
  return zpSuccess;
}
