// The NCCL half of the test double. Every rank is a communicator in some
// process; ranks talk over the double's own Unix domain sockets in the
// abstract namespace (local only, nothing on a network), named from the
// random ncclUniqueId and the rank, so that a bug in Zeppelin's transports
// cannot hide itself here.
//
// Point-to-point is rendezvous: a receive, when it RUNS on its stream, sends
// "ready to receive" (RTR) with its size to the sender; a send, when it runs,
// waits for that RTR and only then sends the bytes. So a send never completes
// before its receive is posted, and ungrouped send-first exchanges deadlock as
// they can on a GPU: a wait longer than FAKENCCL_DEADLOCK_SECONDS is reported.
#include "internal.h"

#include "fakecuda.h"

#include <nccl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>

namespace fakecuda {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint32_t kIdMagic = 0xfa4ecc1d;
struct IdBits {
  uint32_t magic;
  uint32_t reserved;
  uint8_t key[16];
};
static_assert(sizeof(IdBits) <= NCCL_UNIQUE_ID_BYTES, "ncclUniqueId too small");

enum MsgType : uint32_t { HELLO = 1, RTR, DATA, SIZE_ERR, COLL, SPLIT, STATUS_REQ, STATUS_REP, BYE };
struct Hdr {
  uint32_t type;
  int32_t a;
  uint64_t b;
  uint64_t c;
  uint64_t len;  // payload bytes that follow
};

struct Env {
  long deadlockSec = envLong("FAKENCCL_DEADLOCK_SECONDS", 10);
  long initTimeoutSec = envLong("FAKENCCL_INIT_TIMEOUT_SECONDS", 60);
  long failAfterOps = envLong("FAKENCCL_FAIL_AFTER_OPS", -1);
  long failResult = envLong("FAKENCCL_FAIL_RESULT", ncclSystemError);
  long nonblockingUs = envLong("FAKENCCL_NONBLOCKING_US", 2000);
};
const Env& E() {
  static Env* e = new Env();
  return *e;
}

size_t typeSize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    default: return 0;
  }
}

const char* typeName(int t) {
  static const char* names[] = {"ncclInt8", "ncclUint8", "ncclInt32", "ncclUint32", "ncclInt64", "ncclUint64",
                                "ncclFloat16", "ncclFloat32", "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3",
                                "ncclFloat8e5m2"};
  return t >= 0 && t < 12 ? names[t] : "(invalid type)";
}

std::mutex gLastErrMu;
char gLastErr[2048] = "";

// Records an NCCL error message (ncclGetLastError) and prints it.
void ncclComplain(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void ncclComplain(const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  {
    std::lock_guard<std::mutex> lk(gLastErrMu);
    snprintf(gLastErr, sizeof gLastErr, "%s", buf);
  }
  fprintf(stderr, "fakenccl[pid %d]: %s\n", (int)getpid(), buf);
}

struct RecvSlot {
  char* dst = nullptr;
  size_t bytes = 0;
  bool done = false;
  bool failed = false;
};

enum class CollKind { AllReduce, Broadcast, Reduce, AllGather, ReduceScatter };
const char* collName(CollKind k) {
  switch (k) {
    case CollKind::AllReduce: return "ncclAllReduce";
    case CollKind::Broadcast: return "ncclBroadcast";
    case CollKind::Reduce: return "ncclReduce";
    case CollKind::AllGather: return "ncclAllGather";
    case CollKind::ReduceScatter: return "ncclReduceScatter";
  }
  return "?";
}

struct P2P {
  bool send;
  int peer;
  const void* buf;
  size_t count;
  ncclDataType_t dt;
  uint64_t seq = 0;  // n-th send to / receive from this peer, from 1
};

struct Coll {
  CollKind kind;
  const void* sendbuff;
  void* recvbuff;
  size_t count;  // AllGather: sendcount; ReduceScatter: recvcount
  ncclDataType_t dt;
  ncclRedOp_t op;
  int root;
  uint64_t seq = 0;
};

struct Comm {
  uint8_t key[16];
  int nranks = 0, rank = 0, device = 0;
  bool blocking = true;

  std::vector<int> out, in;  // sockets to / from each peer
  std::vector<std::unique_ptr<std::mutex>> outMu;
  int wakeFd = -1;
  std::thread progress, initThread, finalizeThread;

  std::mutex mu;
  std::condition_variable cv;
  bool initDone = false;
  ncclResult_t initResult = ncclSuccess;
  bool finalizing = false, finalized = false;
  ncclResult_t asyncErr = ncclSuccess;
  Clock::time_point busyUntil{};
  std::atomic<bool> aborted{false}, closing{false};

  std::vector<uint64_t> sendSeq, recvSeq;  // assigned when enqueued
  uint64_t collSeq = 0, splitSeq = 0;
  std::map<std::pair<int, uint64_t>, std::pair<size_t, int>> rtr;  // (peer, seq) -> (bytes, type)
  std::map<std::pair<int, uint64_t>, std::shared_ptr<RecvSlot>> slots;
  std::map<std::pair<uint64_t, int>, std::vector<char>> collIn;  // (collSeq, from)
  std::map<std::pair<uint64_t, int>, std::pair<int, int>> splitIn;
  std::map<uint64_t, std::string> statusRep;
  uint64_t nextReq = 0;
  std::vector<char> bye, gone;
  std::vector<char> inDone;  // progress thread saw EOF (the fd stays open until teardown: no reuse races)
  struct Blocked {
    std::string what;
    Clock::time_point since;
  };
  std::map<uint64_t, Blocked> blocked;
  uint64_t nextBlocked = 0;
  int queued = 0;   // batches enqueued and not finished
  int running = 0;  // batches inside runBatch
  long opsRun = 0;

  std::string idHex() const {
    char b[40];
    for (int i = 0; i < 8; i++) snprintf(b + 2 * i, 3, "%02x", key[i]);
    return b;
  }

  // Sets the asynchronous error once (the first cause is the one reported).
  void fail(ncclResult_t r) {
    if (asyncErr == ncclSuccess) asyncErr = r;
    cv.notify_all();
  }
};

using CommPtr = std::shared_ptr<Comm>;

std::mutex gCommsMu;
std::map<const void*, CommPtr>& comms() {
  static auto* m = new std::map<const void*, CommPtr>();
  return *m;
}

CommPtr findComm(ncclComm_t h) {
  std::lock_guard<std::mutex> lk(gCommsMu);
  auto it = comms().find(h);
  return it == comms().end() ? nullptr : it->second;
}

// ---- sockets ----

sockaddr_un addrOf(const uint8_t key[16], int rank, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  char name[100];
  int n = snprintf(name, sizeof name, "fakenccl-");
  for (int i = 0; i < 16; i++) n += snprintf(name + n, sizeof name - n, "%02x", key[i]);
  n += snprintf(name + n, sizeof name - n, "-%d", rank);
  a.sun_path[0] = '\0';  // abstract namespace: no file, gone with the process
  memcpy(a.sun_path + 1, name, (size_t)n);
  *len = (socklen_t)(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

bool writeAll(int fd, const void* p, size_t n) {
  const char* c = (const char*)p;
  while (n) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= (size_t)w;
  }
  return true;
}

// 1: all read; 0: EOF before anything; -1: error or EOF midway.
int readAll(int fd, void* p, size_t n) {
  char* c = (char*)p;
  size_t got = 0;
  while (got < n) {
    ssize_t r = recv(fd, c + got, n - got, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return got == 0 ? 0 : -1;
    if (r < 0) return -1;
    got += (size_t)r;
  }
  return 1;
}

void peerDied(Comm& c, int p, const char* how) {
  std::lock_guard<std::mutex> lk(c.mu);
  if (c.gone[p] || c.aborted || c.closing) return;
  c.gone[p] = 1;
  ncclComplain("communicator %s rank %d: peer rank %d %s without ncclCommDestroy (did its process die?): "
               "the communicator's operations will not complete; ncclCommGetAsyncError reports ncclRemoteError",
               c.idHex().c_str(), c.rank, p, how);
  c.fail(ncclRemoteError);
}

bool sendMsg(Comm& c, int p, const Hdr& h, const void* payload) {
  if (p == c.rank) die("internal: message to self");
  std::lock_guard<std::mutex> lk(*c.outMu[p]);
  if (c.out[p] < 0) return false;
  if (writeAll(c.out[p], &h, sizeof h) && (!h.len || writeAll(c.out[p], payload, h.len))) return true;
  {
    // A peer that said goodbye may be gone already; so may everyone while
    // this rank finalizes: not a death.
    std::lock_guard<std::mutex> g(c.mu);
    if (c.bye[p] || c.finalizing || c.finalized || c.closing) return false;
  }
  peerDied(c, p, "is unreachable (broken connection)");
  return false;
}

std::string describeBlocked(Comm& c) {
  // Caller holds c.mu.
  if (c.blocked.empty()) return "nothing (no operation of this communicator is waiting)";
  std::string s;
  auto now = Clock::now();
  for (auto& [id, b] : c.blocked) {
    char t[64];
    snprintf(t, sizeof t, " (waiting %.1f s)", std::chrono::duration<double>(now - b.since).count());
    if (!s.empty()) s += "; ";
    s += b.what + t;
  }
  return s;
}

void handleMessage(Comm& c, int p, const Hdr& h) {
  int fd = c.in[p];
  std::vector<char> payload;
  auto readPayload = [&]() -> bool {
    payload.resize(h.len);
    return !h.len || readAll(fd, payload.data(), h.len) == 1;
  };
  switch (h.type) {
    case RTR: {
      std::lock_guard<std::mutex> lk(c.mu);
      c.rtr[{p, h.b}] = {(size_t)h.c, h.a};
      c.cv.notify_all();
      return;
    }
    case DATA: {
      std::shared_ptr<RecvSlot> slot;
      {
        std::lock_guard<std::mutex> lk(c.mu);
        auto it = c.slots.find({p, h.b});
        if (it != c.slots.end()) slot = it->second;
      }
      bool ok;
      if (slot && slot->bytes == h.len) {
        ok = !h.len || readAll(fd, slot->dst, h.len) == 1;
      } else {
        ok = readPayload();  // aborted receive, or a protocol slip: drop the bytes
      }
      if (!ok) return peerDied(c, p, "closed its connection in the middle of a message");
      std::lock_guard<std::mutex> lk(c.mu);
      if (slot) slot->done = true;
      c.cv.notify_all();
      return;
    }
    case SIZE_ERR: {
      if (!readPayload()) return peerDied(c, p, "closed its connection in the middle of a message");
      std::lock_guard<std::mutex> lk(c.mu);
      auto it = c.slots.find({p, h.b});
      if (it != c.slots.end()) it->second->failed = true;
      ncclComplain("communicator %s rank %d: %s", c.idHex().c_str(), c.rank, std::string(payload.begin(), payload.end()).c_str());
      c.fail(ncclInvalidUsage);
      return;
    }
    case COLL: {
      if (!readPayload()) return peerDied(c, p, "closed its connection in the middle of a message");
      std::lock_guard<std::mutex> lk(c.mu);
      c.collIn[{h.b, p}] = std::move(payload);
      c.cv.notify_all();
      return;
    }
    case SPLIT: {
      std::lock_guard<std::mutex> lk(c.mu);
      c.splitIn[{h.b, p}] = {h.a, (int)(int64_t)h.c};
      c.cv.notify_all();
      return;
    }
    case STATUS_REQ: {
      std::string s;
      {
        std::lock_guard<std::mutex> lk(c.mu);
        s = describeBlocked(c);
      }
      Hdr r{STATUS_REP, 0, h.b, 0, s.size()};
      sendMsg(c, p, r, s.data());
      return;
    }
    case STATUS_REP: {
      if (!readPayload()) return peerDied(c, p, "closed its connection in the middle of a message");
      std::lock_guard<std::mutex> lk(c.mu);
      c.statusRep[h.b] = std::string(payload.begin(), payload.end());
      c.cv.notify_all();
      return;
    }
    case BYE: {
      std::lock_guard<std::mutex> lk(c.mu);
      c.bye[p] = 1;
      return;
    }
    default:
      ncclComplain("communicator %s rank %d: unknown message type %u from rank %d", c.idHex().c_str(), c.rank,
                   h.type, p);
      std::lock_guard<std::mutex> lk(c.mu);
      c.fail(ncclInternalError);
  }
}

void progressLoop(CommPtr cp) {
  Comm& c = *cp;
  for (;;) {
    std::vector<pollfd> fds{{c.wakeFd, POLLIN, 0}};
    std::vector<int> who{-1};
    for (int p = 0; p < c.nranks; p++)
      if (c.in[p] >= 0 && !c.inDone[p]) {
        fds.push_back({c.in[p], POLLIN, 0});
        who.push_back(p);
      }
    int n = poll(fds.data(), fds.size(), 200);
    if (c.closing || c.aborted) return;
    if (n <= 0) continue;
    for (size_t i = 1; i < fds.size(); i++) {
      if (!fds[i].revents) continue;
      int p = who[i];
      Hdr h;
      int r = readAll(c.in[p], &h, sizeof h);
      if (r == 1) {
        handleMessage(c, p, h);
        continue;
      }
      if (c.closing || c.aborted) return;
      bool orderly;
      {
        std::lock_guard<std::mutex> lk(c.mu);
        orderly = c.bye[p];
      }
      if (!orderly) peerDied(c, p, r == 0 ? "closed its connection" : "broke its connection");
      c.inDone[p] = 1;
    }
  }
}

void wake(Comm& c) {
  uint64_t one = 1;
  if (write(c.wakeFd, &one, sizeof one) < 0) {
  }
}

// Builds the full mesh. Returns ncclSuccess or an error (with a message).
ncclResult_t connectMesh(Comm& c) {
  auto deadline = Clock::now() + std::chrono::seconds(E().initTimeoutSec);
  int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  socklen_t len;
  sockaddr_un a = addrOf(c.key, c.rank, &len);
  if (lfd < 0 || bind(lfd, (sockaddr*)&a, len) != 0 || listen(lfd, c.nranks + 4) != 0) {
    int e = errno;
    if (lfd >= 0) close(lfd);
    ncclComplain("communicator %s: rank %d cannot listen: %s%s", c.idHex().c_str(), c.rank, strerror(e),
                 e == EADDRINUSE ? " (another rank of this id has the same rank number)" : "");
    return e == EADDRINUSE ? ncclInvalidUsage : ncclSystemError;
  }
  ncclResult_t res = ncclSuccess;
  for (int p = 0; p < c.nranks && res == ncclSuccess; p++) {
    if (p == c.rank) continue;
    socklen_t plen;
    sockaddr_un pa = addrOf(c.key, p, &plen);
    for (;;) {
      int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (connect(fd, (sockaddr*)&pa, plen) == 0) {
        Hdr h{HELLO, c.rank, (uint64_t)c.nranks, 0, 0};
        if (!writeAll(fd, &h, sizeof h)) {
          close(fd);
          res = ncclSystemError;
          ncclComplain("communicator %s rank %d: hello to rank %d failed", c.idHex().c_str(), c.rank, p);
        } else {
          c.out[p] = fd;
        }
        break;
      }
      close(fd);
      if (c.aborted) {
        res = ncclSystemError;
        break;
      }
      if (Clock::now() > deadline) {
        ncclComplain("communicator %s rank %d: rank %d of %d did not appear within %ld s "
                     "(FAKENCCL_INIT_TIMEOUT_SECONDS)",
                     c.idHex().c_str(), c.rank, p, c.nranks, E().initTimeoutSec);
        res = ncclSystemError;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  for (int k = 0; k < c.nranks - 1 && res == ncclSuccess; k++) {
    pollfd pf{lfd, POLLIN, 0};
    int n = 0;
    while (res == ncclSuccess && (n = poll(&pf, 1, 100)) == 0) {
      if (c.aborted) res = ncclSystemError;
      if (Clock::now() > deadline) {
        ncclComplain("communicator %s rank %d: only %d of %d peers connected within %ld s", c.idHex().c_str(),
                     c.rank, k, c.nranks - 1, E().initTimeoutSec);
        res = ncclSystemError;
      }
    }
    if (res) break;
    int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    Hdr h;
    if (fd < 0 || readAll(fd, &h, sizeof h) != 1 || h.type != HELLO) {
      if (fd >= 0) close(fd);
      ncclComplain("communicator %s rank %d: a peer connected but sent no hello", c.idHex().c_str(), c.rank);
      res = ncclSystemError;
      break;
    }
    int p = h.a;
    if ((int)h.b != c.nranks || p < 0 || p >= c.nranks || p == c.rank || c.in[p] >= 0) {
      ncclComplain("communicator %s rank %d: a peer says it is rank %d of %d, this rank has nranks %d "
                   "(every rank must pass the same nranks, and distinct ranks)",
                   c.idHex().c_str(), c.rank, p, (int)h.b, c.nranks);
      close(fd);
      res = ncclInvalidUsage;
      break;
    }
    c.in[p] = fd;
  }
  close(lfd);  // later connections (none expected) are refused
  return res;
}

void closeAll(Comm& c) {
  for (int p = 0; p < c.nranks; p++) {
    std::lock_guard<std::mutex> lk(*c.outMu[p]);
    if (c.out[p] >= 0) close(c.out[p]);
    c.out[p] = -1;
  }
  for (int p = 0; p < c.nranks; p++)
    if (c.in[p] >= 0) {
      close(c.in[p]);
      c.in[p] = -1;
    }
  if (c.wakeFd >= 0) close(c.wakeFd);
  c.wakeFd = -1;
}

ncclResult_t initComm(const CommPtr& cp) {
  Comm& c = *cp;
  ncclResult_t r = connectMesh(c);
  if (r == ncclSuccess) c.progress = std::thread(progressLoop, cp);
  std::lock_guard<std::mutex> lk(c.mu);
  c.initDone = true;
  c.initResult = r;
  if (r) c.fail(r);
  c.cv.notify_all();
  return r;
}

CommPtr newComm(const uint8_t key[16], int nranks, int rank, bool blocking) {
  auto c = std::make_shared<Comm>();
  memcpy(c->key, key, 16);
  c->nranks = nranks;
  c->rank = rank;
  c->device = currentDevice();
  c->blocking = blocking;
  c->out.assign(nranks, -1);
  c->in.assign(nranks, -1);
  for (int i = 0; i < nranks; i++) c->outMu.emplace_back(new std::mutex);
  c->sendSeq.assign(nranks, 0);
  c->recvSeq.assign(nranks, 0);
  c->bye.assign(nranks, 0);
  c->gone.assign(nranks, 0);
  c->inDone.assign(nranks, 0);
  c->wakeFd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  return c;
}

ncclResult_t createComm(ncclComm_t* out, int nranks, const uint8_t key[16], int rank, bool blocking) {
  CommPtr c = newComm(key, nranks, rank, blocking);
  {
    std::lock_guard<std::mutex> lk(gCommsMu);
    comms()[c.get()] = c;
  }
  *out = reinterpret_cast<ncclComm_t>(c.get());
  if (blocking) {
    ncclResult_t r = initComm(c);
    if (r) {
      // A failed blocking init leaves no communicator behind.
      c->closing = true;
      if (c->progress.joinable()) c->progress.join();
      closeAll(*c);
      std::lock_guard<std::mutex> lk(gCommsMu);
      comms().erase(c.get());
      *out = nullptr;
    }
    return r;
  }
  // Nonblocking: ncclInProgress now; ncclCommGetAsyncError says when done.
  c->initThread = std::thread([c] {
    std::this_thread::sleep_for(std::chrono::microseconds(1000 + rand() % 20000));
    initComm(c);
  });
  return ncclInProgress;
}

// ---- waiting inside an operation ----

// Asks a peer what its operations on this communicator wait for (1 s).
std::string askStatus(Comm& c, int peer) {
  uint64_t id;
  {
    std::lock_guard<std::mutex> lk(c.mu);
    id = ++c.nextReq;
  }
  if (!sendMsg(c, peer, Hdr{STATUS_REQ, 0, id, 0, 0}, nullptr)) return "(unreachable)";
  std::unique_lock<std::mutex> lk(c.mu);
  c.cv.wait_for(lk, std::chrono::seconds(1), [&] { return c.statusRep.count(id) || c.aborted; });
  auto it = c.statusRep.find(id);
  if (it == c.statusRep.end()) return "(no answer within 1 s)";
  std::string s = it->second;
  c.statusRep.erase(it);
  return s;
}

// Waits (holding lk on c.mu) until pred() or the communicator is aborted;
// false when aborted. A wait longer than FAKENCCL_DEADLOCK_SECONDS is
// reported once, naming this op and what the peer is blocked on, and becomes
// the communicator's asynchronous error; the op keeps waiting (a spinning
// kernel) until it is satisfied or the communicator is aborted.
template <typename Pred>
bool opWait(Comm& c, std::unique_lock<std::mutex>& lk, Pred pred, const std::string& what, int peer) {
  if (pred()) return true;
  uint64_t id = ++c.nextBlocked;
  auto since = Clock::now();
  c.blocked[id] = {what, since};
  bool reported = false;
  bool ok = true;
  while (!pred()) {
    if (c.aborted) {
      ok = false;
      break;
    }
    c.cv.wait_for(lk, std::chrono::milliseconds(50));
    if (!reported && peer >= 0 && c.asyncErr == ncclSuccess &&
        Clock::now() - since > std::chrono::seconds(E().deadlockSec)) {
      reported = true;
      lk.unlock();
      std::string theirs = askStatus(c, peer);
      lk.lock();
      if (pred() || c.aborted) continue;
      ncclComplain("communicator %s: DEADLOCK (or a missing operation): rank %d: %s has waited %ld s "
                   "(FAKENCCL_DEADLOCK_SECONDS); rank %d is blocked in: %s",
                   c.idHex().c_str(), c.rank, what.c_str(), E().deadlockSec, peer, theirs.c_str());
      c.fail(ncclInvalidUsage);
    }
  }
  c.blocked.erase(id);
  return ok;
}

// After an error: an operation never completes by itself (NCCL's kernels
// spin); only an abort lets the stream move on.
void spinUntilAbort(Comm& c, std::unique_lock<std::mutex>& lk, const std::string& what) {
  opWait(c, lk, [] { return false; }, what + " (after an error on this communicator)", -1);
}

// ---- reductions ----

float toFloat(ncclDataType_t t, const char* p) {
  switch (t) {
    case ncclFloat16: { __half h; memcpy(&h, p, 2); return __half2float(h); }
    case ncclBfloat16: { __nv_bfloat16 h; memcpy(&h, p, 2); return __bfloat162float(h); }
    case ncclFloat8e4m3: { __nv_fp8_e4m3 h; memcpy(&h, p, 1); return (float)h; }
    case ncclFloat8e5m2: { __nv_fp8_e5m2 h; memcpy(&h, p, 1); return (float)h; }
    default: return 0;
  }
}

void fromFloat(ncclDataType_t t, float f, char* p) {
  switch (t) {
    case ncclFloat16: { __half h = __float2half_rn(f); memcpy(p, &h, 2); break; }
    case ncclBfloat16: { __nv_bfloat16 h = __float2bfloat16_rn(f); memcpy(p, &h, 2); break; }
    case ncclFloat8e4m3: { __nv_fp8_e4m3 h(f); memcpy(p, &h, 1); break; }
    case ncclFloat8e5m2: { __nv_fp8_e5m2 h(f); memcpy(p, &h, 1); break; }
    default: break;
  }
}

// Integers wrap (arithmetic in the unsigned type of the same width).
template <typename T>
void reduceInt(const std::vector<const char*>& in, size_t count, ncclRedOp_t op, char* out) {
  using U = std::make_unsigned_t<T>;
  for (size_t i = 0; i < count; i++) {
    T acc;
    memcpy(&acc, in[0] + i * sizeof(T), sizeof(T));
    for (size_t r = 1; r < in.size(); r++) {
      T x;
      memcpy(&x, in[r] + i * sizeof(T), sizeof(T));
      switch (op) {
        case ncclSum: case ncclAvg: acc = (T)(U)((U)acc + (U)x); break;
        case ncclProd: acc = (T)(U)((U)acc * (U)x); break;
        case ncclMax: acc = std::max(acc, x); break;
        case ncclMin: acc = std::min(acc, x); break;
        default: break;
      }
    }
    if (op == ncclAvg) acc = (T)(acc / (T)in.size());
    memcpy(out + i * sizeof(T), &acc, sizeof(T));
  }
}

template <typename T>
void reduceFloat(const std::vector<const char*>& in, size_t count, ncclRedOp_t op, char* out) {
  for (size_t i = 0; i < count; i++) {
    T acc;
    memcpy(&acc, in[0] + i * sizeof(T), sizeof(T));
    for (size_t r = 1; r < in.size(); r++) {
      T x;
      memcpy(&x, in[r] + i * sizeof(T), sizeof(T));
      switch (op) {
        case ncclSum: case ncclAvg: acc += x; break;
        case ncclProd: acc *= x; break;
        case ncclMax: acc = std::fmax(acc, x); break;
        case ncclMin: acc = std::fmin(acc, x); break;
        default: break;
      }
    }
    if (op == ncclAvg) acc /= (T)in.size();
    memcpy(out + i * sizeof(T), &acc, sizeof(T));
  }
}

// Half, bfloat16 and fp8: each value to float32, reduced in float32, rounded
// once to the type (round to nearest even).
void reduceNarrow(ncclDataType_t t, const std::vector<const char*>& in, size_t count, ncclRedOp_t op, char* out) {
  size_t sz = typeSize(t);
  for (size_t i = 0; i < count; i++) {
    float acc = toFloat(t, in[0] + i * sz);
    for (size_t r = 1; r < in.size(); r++) {
      float x = toFloat(t, in[r] + i * sz);
      switch (op) {
        case ncclSum: case ncclAvg: acc += x; break;
        case ncclProd: acc *= x; break;
        case ncclMax: acc = std::fmax(acc, x); break;
        case ncclMin: acc = std::fmin(acc, x); break;
        default: break;
      }
    }
    if (op == ncclAvg) acc /= (float)in.size();
    fromFloat(t, acc, out + i * sz);
  }
}

// Reduces the inputs (in rank order, so every rank gets the same bits).
void reduce(ncclDataType_t t, const std::vector<const char*>& in, size_t count, ncclRedOp_t op, char* out) {
  switch (t) {
    case ncclInt8: return reduceInt<int8_t>(in, count, op, out);
    case ncclUint8: return reduceInt<uint8_t>(in, count, op, out);
    case ncclInt32: return reduceInt<int32_t>(in, count, op, out);
    case ncclUint32: return reduceInt<uint32_t>(in, count, op, out);
    case ncclInt64: return reduceInt<int64_t>(in, count, op, out);
    case ncclUint64: return reduceInt<uint64_t>(in, count, op, out);
    case ncclFloat32: return reduceFloat<float>(in, count, op, out);
    case ncclFloat64: return reduceFloat<double>(in, count, op, out);
    default: return reduceNarrow(t, in, count, op, out);
  }
}

// ---- batches: the operations of one group on one stream ----

// The operations of one group on one stream, possibly of several
// communicators: like the kernels of one NCCL group, they progress together,
// so nothing in a group waits for a later member of the same group.
struct BatchOp {
  CommPtr c;
  bool isP2P;
  P2P p2p;
  Coll coll;
  bool skip = false;  // its communicator failed or was aborted
  std::shared_ptr<RecvSlot> slot;
  std::vector<char> own;  // a collective's own input, copied before any write
};

struct Batch {
  std::vector<BatchOp> ops;
  std::vector<CommPtr> comms;  // each communicator once
};

std::string p2pName(const Comm& c, const P2P& o) {
  char b[200];
  size_t bytes = o.count * typeSize(o.dt);
  if (o.send)
    snprintf(b, sizeof b, "ncclSend #%llu of %zu bytes (%zu x %s) from rank %d to rank %d", (unsigned long long)o.seq,
             bytes, o.count, typeName(o.dt), c.rank, o.peer);
  else
    snprintf(b, sizeof b, "ncclRecv #%llu of %zu bytes (%zu x %s) on rank %d from rank %d", (unsigned long long)o.seq,
             bytes, o.count, typeName(o.dt), c.rank, o.peer);
  return b;
}

std::string collDesc(const Comm& c, const Coll& o) {
  char b[200];
  snprintf(b, sizeof b, "%s #%llu (%zu x %s) on rank %d", collName(o.kind), (unsigned long long)o.seq, o.count,
           typeName(o.dt), c.rank);
  return b;
}

// Device bytes of a buffer when the op runs (pinned host memory is itself).
char* runAlias(const void* p, size_t n) {
  if (n == 0) return (char*)p;
  std::string why;
  return aliasOf(p, n, &why);
}

struct CollPlan {
  size_t inBytes;           // what this rank's sendbuff holds
  std::vector<int> sendTo;  // peers this rank sends to
  std::vector<int> recvFrom;
  size_t sendBytes;  // bytes sent to each peer
};

CollPlan planColl(const Comm& c, const Coll& o) {
  CollPlan p;
  size_t n = o.count * typeSize(o.dt);
  p.sendBytes = n;
  p.inBytes = n;
  auto allOthers = [&](std::vector<int>& v) {
    for (int r = 0; r < c.nranks; r++)
      if (r != c.rank) v.push_back(r);
  };
  switch (o.kind) {
    case CollKind::AllReduce:
    case CollKind::AllGather:
      allOthers(p.sendTo);
      allOthers(p.recvFrom);
      break;
    case CollKind::Broadcast:
      if (c.rank == o.root) allOthers(p.sendTo);
      else p.recvFrom.push_back(o.root);
      break;
    case CollKind::Reduce:
      if (c.rank == o.root) allOthers(p.recvFrom);
      else p.sendTo.push_back(o.root);
      break;
    case CollKind::ReduceScatter:
      p.inBytes = n * c.nranks;
      allOthers(p.sendTo);
      allOthers(p.recvFrom);
      break;
  }
  return p;
}

// An op whose communicator has an error does not complete by itself (NCCL's
// kernels spin): it waits for the abort, then the stream moves on.
void failOp(BatchOp& op, std::unique_lock<std::mutex>& lk, ncclResult_t why, const std::string& what) {
  if (why != ncclSuccess) op.c->fail(why);
  spinUntilAbort(*op.c, lk, what);
  op.skip = true;
}

// Skips ops of failed or aborted communicators; true if op may go on.
bool usable(BatchOp& op, std::unique_lock<std::mutex>& lk, const std::string& what) {
  if (op.skip) return false;
  if (op.c->aborted) {
    op.skip = true;
    return false;
  }
  if (op.c->asyncErr != ncclSuccess) {
    failOp(op, lk, ncclSuccess, what);
    return false;
  }
  return true;
}

void runCollective(BatchOp& op, std::unique_lock<std::mutex>& lk) {
  Comm& c = *op.c;
  const Coll& o = op.coll;
  CollPlan p = planColl(c, o);
  std::string name = collDesc(c, o);
  for (int peer : p.recvFrom) {
    std::pair<uint64_t, int> k{o.seq, peer};
    std::string what = name + ", waiting for rank " + std::to_string(peer) + "'s part";
    if (!opWait(c, lk, [&] { return c.collIn.count(k) > 0; }, what, peer)) {
      op.skip = true;
      return;
    }
    if (c.collIn[k].size() != p.sendBytes) {
      ncclComplain("communicator %s: %s: rank %d sent %zu bytes, this rank expected %zu (different counts or types "
                   "on different ranks)",
                   c.idHex().c_str(), name.c_str(), peer, c.collIn[k].size(), p.sendBytes);
      return failOp(op, lk, ncclInvalidUsage, name);
    }
  }
  std::map<int, std::vector<char>> got;
  for (int peer : p.recvFrom) {
    got[peer] = std::move(c.collIn[{o.seq, peer}]);
    c.collIn.erase({o.seq, peer});
  }
  size_t n = o.count * typeSize(o.dt);
  bool writes = !(o.kind == CollKind::Reduce && c.rank != o.root);
  size_t outBytes = o.kind == CollKind::AllGather ? n * c.nranks : n;
  char* out = writes ? runAlias(o.recvbuff, outBytes) : nullptr;
  if (writes && !out) {
    ncclComplain("%s: recvbuff %p was freed before the operation ran", name.c_str(), o.recvbuff);
    return failOp(op, lk, ncclUnhandledCudaError, name);
  }
  lk.unlock();
  auto input = [&](int r) -> const char* { return r == c.rank ? op.own.data() : got[r].data(); };
  switch (o.kind) {
    case CollKind::AllReduce:
    case CollKind::Reduce:
      if (writes) {
        std::vector<const char*> in;
        for (int r = 0; r < c.nranks; r++) in.push_back(input(r));
        reduce(o.dt, in, o.count, o.op, out);
      }
      break;
    case CollKind::Broadcast:
      memmove(out, input(o.root), n);
      break;
    case CollKind::AllGather:
      for (int r = 0; r < c.nranks; r++) memmove(out + (size_t)r * n, input(r), n);
      break;
    case CollKind::ReduceScatter: {
      std::vector<const char*> in;
      for (int r = 0; r < c.nranks; r++) in.push_back(r == c.rank ? op.own.data() + (size_t)c.rank * n : input(r));
      reduce(o.dt, in, o.count, o.op, out);
      break;
    }
  }
  lk.lock();
}

cudaError_t runBatch(Batch& b) {
  for (auto& cp : b.comms) {
    Comm& c = *cp;
    std::lock_guard<std::mutex> lk(c.mu);
    c.running++;
    c.opsRun++;
    if (E().failAfterOps >= 0 && c.opsRun > E().failAfterOps && c.asyncErr == ncclSuccess && !c.aborted) {
      ncclComplain("communicator %s rank %d: FAKENCCL_FAIL_AFTER_OPS=%ld reached: operation %ld fails with %s",
                   c.idHex().c_str(), c.rank, E().failAfterOps, c.opsRun,
                   ncclGetErrorString((ncclResult_t)E().failResult));
      c.fail((ncclResult_t)E().failResult);
    }
  }

  // 1. Post every receive of the group (RTR to its sender).
  for (auto& op : b.ops) {
    if (!op.isP2P || op.p2p.send) continue;
    Comm& c = *op.c;
    std::unique_lock<std::mutex> lk(c.mu);
    std::string name = p2pName(c, op.p2p);
    if (!usable(op, lk, name)) continue;
    auto s = std::make_shared<RecvSlot>();
    s->bytes = op.p2p.count * typeSize(op.p2p.dt);
    s->dst = runAlias(op.p2p.buf, s->bytes);
    if (!s->dst) {
      ncclComplain("%s: its buffer %p was freed before the operation ran", name.c_str(), op.p2p.buf);
      failOp(op, lk, ncclUnhandledCudaError, name);
      continue;
    }
    c.slots[{op.p2p.peer, op.p2p.seq}] = s;
    op.slot = s;
    lk.unlock();
    sendMsg(c, op.p2p.peer, Hdr{RTR, (int32_t)op.p2p.dt, op.p2p.seq, s->bytes, 0}, nullptr);
  }

  // 2. Contributions to collectives (buffered at their destinations).
  for (auto& op : b.ops) {
    if (op.isP2P) continue;
    Comm& c = *op.c;
    std::unique_lock<std::mutex> lk(c.mu);
    std::string name = collDesc(c, op.coll);
    if (!usable(op, lk, name)) continue;
    CollPlan p = planColl(c, op.coll);
    bool reads = op.coll.kind != CollKind::Broadcast || c.rank == op.coll.root;
    if (reads) {
      const char* in = runAlias(op.coll.sendbuff, p.inBytes);
      if (!in) {
        ncclComplain("%s: sendbuff %p was freed before the operation ran", name.c_str(), op.coll.sendbuff);
        failOp(op, lk, ncclUnhandledCudaError, name);
        continue;
      }
      op.own.assign(in, in + p.inBytes);  // in-place operations are allowed
    }
    lk.unlock();
    for (int peer : p.sendTo) {
      size_t off = op.coll.kind == CollKind::ReduceScatter ? (size_t)peer * p.sendBytes : 0;
      sendMsg(c, peer, Hdr{COLL, 0, op.coll.seq, 0, p.sendBytes}, op.own.data() + off);
    }
  }

  // 3. Sends: each waits until its receive is posted (rendezvous).
  for (auto& op : b.ops) {
    if (!op.isP2P || !op.p2p.send) continue;
    Comm& c = *op.c;
    const P2P& o = op.p2p;
    std::unique_lock<std::mutex> lk(c.mu);
    std::string name = p2pName(c, o);
    if (!usable(op, lk, name)) continue;
    std::pair<int, uint64_t> k{o.peer, o.seq};
    if (!opWait(c, lk, [&] { return c.rtr.count(k) > 0; }, name + ", waiting for the matching ncclRecv", o.peer)) {
      op.skip = true;
      continue;
    }
    auto [rbytes, rtype] = c.rtr[k];
    c.rtr.erase(k);
    size_t bytes = o.count * typeSize(o.dt);
    if (rbytes != bytes || rtype != (int)o.dt) {
      char msg[600];
      size_t rts = typeSize((ncclDataType_t)rtype);
      snprintf(msg, sizeof msg,
               "%s: the matching ncclRecv on rank %d receives %zu bytes (%zu x %s); NCCL requires the same count "
               "and datatype on both sides (ncclInvalidUsage on both ranks)",
               name.c_str(), o.peer, rbytes, rts ? rbytes / rts : 0, typeName(rtype));
      ncclComplain("communicator %s: %s", c.idHex().c_str(), msg);
      c.fail(ncclInvalidUsage);
      lk.unlock();
      sendMsg(c, o.peer, Hdr{SIZE_ERR, 0, o.seq, 0, strlen(msg)}, msg);
      lk.lock();
      failOp(op, lk, ncclInvalidUsage, name);
      continue;
    }
    const char* src = runAlias(o.buf, bytes);
    if (!src) {
      ncclComplain("%s: its buffer %p was freed before the operation ran", name.c_str(), o.buf);
      failOp(op, lk, ncclUnhandledCudaError, name);
      continue;
    }
    lk.unlock();
    bool ok = sendMsg(c, o.peer, Hdr{DATA, 0, o.seq, 0, bytes}, src);
    lk.lock();
    if (!ok) failOp(op, lk, ncclSuccess, name);
  }

  // 4. Receives complete when their bytes are in.
  for (auto& op : b.ops) {
    if (!op.isP2P || op.p2p.send || !op.slot) continue;
    Comm& c = *op.c;
    std::unique_lock<std::mutex> lk(c.mu);
    std::string name = p2pName(c, op.p2p);
    auto s = op.slot;
    bool ok = opWait(c, lk, [&] { return s->done || s->failed; }, name + ", waiting for the matching ncclSend",
                     op.p2p.peer);
    c.slots.erase({op.p2p.peer, op.p2p.seq});
    if (ok && s->failed) failOp(op, lk, ncclSuccess, name);
  }

  // 5. Collectives: every input this rank needs, then the result.
  for (auto& op : b.ops) {
    if (op.isP2P) continue;
    std::unique_lock<std::mutex> lk(op.c->mu);
    if (!usable(op, lk, collDesc(*op.c, op.coll))) continue;
    runCollective(op, lk);
  }

  for (auto& cp : b.comms) {
    std::lock_guard<std::mutex> lk(cp->mu);
    cp->running--;
    cp->queued--;
    cp->cv.notify_all();
  }
  return cudaSuccess;
}

// ---- groups ----

struct Pending {
  CommPtr c;
  StreamPtr s;
  bool isP2P;
  P2P p2p;
  Coll coll;
};

thread_local int tlGroupDepth = 0;
thread_local std::vector<Pending> tlGroupOps;
thread_local ncclResult_t tlGroupErr = ncclSuccess;

// Enqueues the gathered operations, one batch per stream.
ncclResult_t flushGroup() {
  std::vector<Pending> ops;
  ops.swap(tlGroupOps);
  ncclResult_t err = tlGroupErr;
  tlGroupErr = ncclSuccess;
  if (err) {
    ncclComplain("ncclGroupEnd: an operation of the group was invalid (%s): none of its %zu operations was issued",
                 ncclGetErrorString(err), ops.size());
    return err;
  }
  std::vector<std::pair<StreamPtr, std::shared_ptr<Batch>>> batches;
  for (auto& p : ops) {
    auto it = std::find_if(batches.begin(), batches.end(), [&](auto& x) { return x.first == p.s; });
    if (it == batches.end()) {
      batches.push_back({p.s, std::make_shared<Batch>()});
      it = batches.end() - 1;
    }
    Batch& b = *it->second;
    if (std::find(b.comms.begin(), b.comms.end(), p.c) == b.comms.end()) b.comms.push_back(p.c);
    Comm& c = *p.c;
    std::lock_guard<std::mutex> lk(c.mu);
    BatchOp op;
    op.c = p.c;
    op.isP2P = p.isP2P;
    op.p2p = p.p2p;
    op.coll = p.coll;
    // Sequence numbers in issue order: the n-th send to a peer matches that
    // peer's n-th receive from this rank, as NCCL matches them.
    if (p.isP2P) op.p2p.seq = p.p2p.send ? ++c.sendSeq[p.p2p.peer] : ++c.recvSeq[p.p2p.peer];
    else op.coll.seq = ++c.collSeq;
    b.ops.push_back(std::move(op));
  }
  bool anyNonblocking = false;
  for (auto& [s, batch] : batches) {
    for (auto& cp : batch->comms) {
      std::lock_guard<std::mutex> lk(cp->mu);
      cp->queued++;
      if (!cp->blocking) {
        anyNonblocking = true;
        // ncclInProgress for a while, as a nonblocking group end can be.
        cp->busyUntil = Clock::now() + std::chrono::microseconds(E().nonblockingUs ? rand() % E().nonblockingUs : 0);
      }
    }
    Work w;
    auto b = batch;
    w.fn = [b] { return runBatch(*b); };
    enqueue(s, std::move(w));
  }
  return anyNonblocking ? ncclInProgress : ncclSuccess;
}

ncclResult_t addOp(Pending p) {
  if (tlGroupDepth > 0) {
    tlGroupOps.push_back(std::move(p));
    return ncclSuccess;
  }
  tlGroupOps.push_back(std::move(p));
  return flushGroup();  // an ungrouped operation is a group of one
}

ncclResult_t groupFail(ncclResult_t r) {
  if (tlGroupDepth > 0 && tlGroupErr == ncclSuccess) tlGroupErr = r;
  return r;
}

// NCCL's checks of an operation's communicator, stream and buffers.
ncclResult_t checkOp(const char* api, ncclComm_t h, cudaStream_t stream, CommPtr* cp, StreamPtr* sp) {
  *cp = findComm(h);
  if (!*cp) {
    ncclComplain("%s: invalid communicator %p (destroyed or aborted?)", api, (void*)h);
    return ncclInvalidArgument;
  }
  Comm& c = **cp;
  {
    std::lock_guard<std::mutex> lk(c.mu);
    if (!c.initDone) {
      ncclComplain("%s: the communicator is still initializing (poll ncclCommGetAsyncError until ncclSuccess)", api);
      return ncclInvalidUsage;
    }
    if (c.finalizing || c.finalized) {
      ncclComplain("%s: the communicator has been finalized", api);
      return ncclInvalidUsage;
    }
    if (c.asyncErr != ncclSuccess) {
      ncclComplain("%s: the communicator has an asynchronous error (%s); abort it", api, ncclGetErrorString(c.asyncErr));
      return c.asyncErr;
    }
  }
  cudaError_t err;
  *sp = resolveStream(stream, &err);
  if (!*sp) {
    ncclComplain("%s: invalid stream %p", api, (void*)stream);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t checkBuf(const char* api, const char* name, const Comm& c, const void* p, size_t bytes) {
  if (bytes == 0) return ncclSuccess;
  PtrInfo info = lookup(p);
  if (info.kind == MemKind::Unregistered) {
    ncclComplain("%s: %s %p is not device memory (pageable host memory, or freed)", api, name, p);
    return ncclInvalidArgument;
  }
  if (info.kind == MemKind::Device && info.device != c.device) {
    ncclComplain("%s: %s %p is memory of device %d, the communicator's rank %d is on device %d", api, name, p,
                 info.device, c.rank, c.device);
    return ncclInvalidArgument;
  }
  size_t off = (size_t)((const char*)p - info.base);
  if (bytes > info.size - off) {
    ncclComplain("%s: %s [%p, +%zu) runs %zu bytes past the end of its allocation of %zu bytes", api, name, p, bytes,
                 bytes - (info.size - off), info.size);
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

ncclResult_t p2pOp(const char* api, bool send, const void* buf, size_t count, ncclDataType_t dt, int peer,
                   ncclComm_t comm, cudaStream_t stream) {
  CommPtr c;
  StreamPtr s;
  ncclResult_t r = checkOp(api, comm, stream, &c, &s);
  if (r) return groupFail(r);
  if (!typeSize(dt)) {
    ncclComplain("%s: invalid datatype %d", api, (int)dt);
    return groupFail(ncclInvalidArgument);
  }
  if (peer < 0 || peer >= c->nranks) {
    ncclComplain("%s: peer %d is not a rank of this communicator (0..%d)", api, peer, c->nranks - 1);
    return groupFail(ncclInvalidArgument);
  }
  if (peer == c->rank) {
    // NCCL supports it; the double does not (nothing in Zeppelin needs it yet).
    ncclComplain("%s: to/from its own rank %d: not supported by the test double", api, peer);
    return groupFail(ncclInvalidUsage);
  }
  r = checkBuf(api, send ? "sendbuff" : "recvbuff", *c, buf, count * typeSize(dt));
  if (r) return groupFail(r);
  Pending p{c, s, true, P2P{send, peer, buf, count, dt}, Coll{}};
  return addOp(std::move(p));
}

ncclResult_t collOp(CollKind kind, const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t dt,
                    ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  const char* api = collName(kind);
  CommPtr c;
  StreamPtr s;
  ncclResult_t r = checkOp(api, comm, stream, &c, &s);
  if (r) return groupFail(r);
  size_t es = typeSize(dt);
  if (!es) {
    ncclComplain("%s: invalid datatype %d", api, (int)dt);
    return groupFail(ncclInvalidArgument);
  }
  if ((int)op < 0 || op >= ncclNumOps) {
    ncclComplain("%s: invalid or user-defined reduction op %d (not in the test double)", api, (int)op);
    return groupFail(ncclInvalidArgument);
  }
  if (root < 0 || root >= c->nranks) {
    ncclComplain("%s: root %d is not a rank (0..%d)", api, root, c->nranks - 1);
    return groupFail(ncclInvalidArgument);
  }
  size_t n = count * es, inBytes = n, outBytes = n;
  if (kind == CollKind::AllGather) outBytes = n * c->nranks;
  if (kind == CollKind::ReduceScatter) inBytes = n * c->nranks;
  bool readsSend = kind != CollKind::Broadcast || c->rank == root;
  bool writesRecv = !(kind == CollKind::Reduce && c->rank != root);
  if (readsSend && (r = checkBuf(api, "sendbuff", *c, sendbuff, inBytes))) return groupFail(r);
  if (writesRecv && (r = checkBuf(api, "recvbuff", *c, recvbuff, outBytes))) return groupFail(r);
  Pending p{c, s, false, P2P{}, Coll{kind, sendbuff, recvbuff, count, dt, op, root}};
  return addOp(std::move(p));
}

void randomKey(uint8_t key[16]) {
  std::random_device rd;
  for (int i = 0; i < 16; i += 4) {
    uint32_t x = rd();
    memcpy(key + i, &x, 4);
  }
}

ncclResult_t checkId(const ncclUniqueId& id, uint8_t key[16]) {
  IdBits b;
  memcpy(&b, id.internal, sizeof b);
  if (b.magic != kIdMagic) {
    ncclComplain("ncclCommInitRank: the ncclUniqueId was not made by ncclGetUniqueId of the test double");
    return ncclInvalidArgument;
  }
  memcpy(key, b.key, 16);
  return ncclSuccess;
}

// Waits for the communicator's enqueued batches to finish.
void drain(Comm& c) {
  std::unique_lock<std::mutex> lk(c.mu);
  c.cv.wait(lk, [&] { return c.queued == 0 || c.aborted; });
}

void sayBye(Comm& c) {
  for (int p = 0; p < c.nranks; p++)
    if (p != c.rank && !c.gone[p]) sendMsg(c, p, Hdr{BYE, 0, 0, 0, 0}, nullptr);
}

void teardown(const CommPtr& cp) {
  Comm& c = *cp;
  if (c.initThread.joinable()) c.initThread.join();
  if (c.finalizeThread.joinable()) c.finalizeThread.join();
  c.closing = true;
  wake(c);
  if (c.progress.joinable()) c.progress.join();
  closeAll(c);
  std::lock_guard<std::mutex> lk(gCommsMu);
  comms().erase(cp.get());
}

}  // namespace
}  // namespace fakecuda

using namespace fakecuda;

// ================= the NCCL API =================

FAKECUDA_API ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

FAKECUDA_API const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

FAKECUDA_API const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return gLastErr;
}

FAKECUDA_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (!uniqueId) return ncclInvalidArgument;
  memset(uniqueId, 0, sizeof *uniqueId);
  IdBits b{kIdMagic, 0, {}};
  randomKey(b.key);
  memcpy(uniqueId->internal, &b, sizeof b);
  return ncclSuccess;
}

FAKECUDA_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                                 ncclConfig_t* config) {
  if (!comm) return ncclInvalidArgument;
  *comm = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    ncclComplain("ncclCommInitRank: rank %d of %d is invalid", rank, nranks);
    return ncclInvalidArgument;
  }
  int dev;
  cudaGetDevice(&dev);
  (void)dev;
  bool blocking = true;
  if (config) {
    ncclConfig_t ref = NCCL_CONFIG_INITIALIZER;
    if (config->magic != ref.magic || config->size < offsetof(ncclConfig_t, blocking) + sizeof(int)) {
      ncclComplain("ncclCommInitRankConfig: the config was not initialized with NCCL_CONFIG_INITIALIZER");
      return ncclInvalidArgument;
    }
    if (config->blocking != NCCL_CONFIG_UNDEF_INT && config->blocking != 0 && config->blocking != 1) {
      ncclComplain("ncclCommInitRankConfig: config.blocking must be 0 or 1, not %d", config->blocking);
      return ncclInvalidArgument;
    }
    blocking = config->blocking != 0;
  }
  uint8_t key[16];
  ncclResult_t r = checkId(commId, key);
  if (r) return r;
  return createComm(comm, nranks, key, rank, blocking);
}

FAKECUDA_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return ncclCommInitRankConfig(comm, nranks, commId, rank, nullptr);
}

FAKECUDA_API ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  if (!comm || ndev < 1) return ncclInvalidArgument;
  int count = 0;
  cudaGetDeviceCount(&count);
  for (int i = 0; i < ndev; i++) {
    int d = devlist ? devlist[i] : i;
    if (d < 0 || d >= count) {
      ncclComplain("ncclCommInitAll: device %d does not exist (%d devices)", d, count);
      return ncclInvalidArgument;
    }
  }
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  std::vector<ncclResult_t> res(ndev);
  std::vector<std::thread> ts;
  for (int i = 0; i < ndev; i++)
    ts.emplace_back([&, i] {
      cudaSetDevice(devlist ? devlist[i] : i);
      res[i] = ncclCommInitRank(&comm[i], ndev, id, i);
    });
  for (auto& t : ts) t.join();
  for (auto r : res)
    if (r) return r;
  return ncclSuccess;
}

FAKECUDA_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (!asyncError) return ncclInvalidArgument;
  CommPtr c = findComm(comm);
  if (!c) {
    ncclComplain("ncclCommGetAsyncError: invalid communicator %p", (void*)comm);
    return ncclInvalidArgument;
  }
  std::lock_guard<std::mutex> lk(c->mu);
  if (!c->initDone) *asyncError = ncclInProgress;
  else if (c->asyncErr != ncclSuccess) *asyncError = c->asyncErr;
  else if (c->finalizing) *asyncError = ncclInProgress;
  else if (Clock::now() < c->busyUntil) *asyncError = ncclInProgress;
  else *asyncError = ncclSuccess;
  return ncclSuccess;
}

FAKECUDA_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  CommPtr c = findComm(comm);
  if (!c || !count) return ncclInvalidArgument;
  *count = c->nranks;
  return ncclSuccess;
}

FAKECUDA_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  CommPtr c = findComm(comm);
  if (!c || !device) return ncclInvalidArgument;
  *device = c->device;
  return ncclSuccess;
}

FAKECUDA_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  CommPtr c = findComm(comm);
  if (!c || !rank) return ncclInvalidArgument;
  *rank = c->rank;
  return ncclSuccess;
}

FAKECUDA_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  CommPtr c = findComm(comm);
  if (!c) return ncclInvalidArgument;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    if (!c->initDone) {
      ncclComplain("ncclCommFinalize: the communicator is still initializing");
      return ncclInvalidUsage;
    }
    if (c->finalizing || c->finalized) {
      ncclComplain("ncclCommFinalize: called twice");
      return ncclInvalidUsage;
    }
    c->finalizing = true;
  }
  auto finish = [c] {
    drain(*c);
    sayBye(*c);
    std::lock_guard<std::mutex> lk(c->mu);
    c->finalizing = false;
    c->finalized = true;
    c->cv.notify_all();
  };
  if (c->blocking) {
    finish();
    std::lock_guard<std::mutex> lk(c->mu);
    return c->asyncErr;
  }
  c->finalizeThread = std::thread(finish);
  return ncclInProgress;
}

FAKECUDA_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  CommPtr c = findComm(comm);
  if (!c) {
    ncclComplain("ncclCommDestroy: invalid communicator %p (destroyed twice?)", (void*)comm);
    return ncclInvalidArgument;
  }
  if (c->initThread.joinable()) c->initThread.join();
  if (c->finalizeThread.joinable()) c->finalizeThread.join();
  bool bye;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    bye = !c->finalized && c->initResult == ncclSuccess;
  }
  // As NCCL: waits for the communicator's queued work (forever if a peer
  // never does its part: abort instead).
  drain(*c);
  if (bye) sayBye(*c);
  teardown(c);
  return ncclSuccess;
}

FAKECUDA_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (!comm) return ncclSuccess;
  CommPtr c = findComm(comm);
  if (!c) {
    ncclComplain("ncclCommAbort: invalid communicator %p (destroyed twice?)", (void*)comm);
    return ncclInvalidArgument;
  }
  c->aborted = true;
  // Unblocks any thread inside a socket call; peers then see the
  // connections close without a goodbye, as they would see a dead process.
  for (int p = 0; p < c->nranks; p++) {
    if (c->out[p] >= 0) shutdown(c->out[p], SHUT_RDWR);
    if (c->in[p] >= 0) shutdown(c->in[p], SHUT_RDWR);
  }
  {
    std::unique_lock<std::mutex> lk(c->mu);
    c->cv.notify_all();
    // Running operations return at once; queued ones do when they run.
    c->cv.wait(lk, [&] { return c->running == 0; });
  }
  teardown(c);
  return ncclSuccess;
}

FAKECUDA_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                        ncclConfig_t* config) {
  if (!newcomm) return ncclInvalidArgument;
  *newcomm = nullptr;
  CommPtr c = findComm(comm);
  if (!c) {
    ncclComplain("ncclCommSplit: invalid communicator %p", (void*)comm);
    return ncclInvalidArgument;
  }
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    ncclComplain("ncclCommSplit: color %d is negative", color);
    return ncclInvalidArgument;
  }
  bool blocking = c->blocking;
  if (config) {
    ncclConfig_t ref = NCCL_CONFIG_INITIALIZER;
    if (config->magic != ref.magic) {
      ncclComplain("ncclCommSplit: the config was not initialized with NCCL_CONFIG_INITIALIZER");
      return ncclInvalidArgument;
    }
    if (config->blocking != NCCL_CONFIG_UNDEF_INT) blocking = config->blocking != 0;
  }
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lk(c->mu);
    if (!c->initDone || c->asyncErr) {
      ncclComplain("ncclCommSplit: the parent communicator is not ready or has an error");
      return c->asyncErr ? c->asyncErr : ncclInvalidUsage;
    }
    seq = ++c->splitSeq;
  }
  for (int p = 0; p < c->nranks; p++)
    if (p != c->rank) sendMsg(*c, p, Hdr{SPLIT, color, seq, (uint64_t)(int64_t)key, 0}, nullptr);
  std::vector<std::pair<int, int>> ck(c->nranks);  // (color, key) per parent rank
  {
    std::unique_lock<std::mutex> lk(c->mu);
    auto deadline = Clock::now() + std::chrono::seconds(E().initTimeoutSec);
    for (int p = 0; p < c->nranks; p++) {
      if (p == c->rank) {
        ck[p] = {color, key};
        continue;
      }
      while (!c->splitIn.count({seq, p})) {
        if (c->aborted || c->asyncErr || Clock::now() > deadline) {
          ncclComplain("ncclCommSplit: rank %d did not take part (error, abort or %ld s)", p, E().initTimeoutSec);
          return c->asyncErr ? c->asyncErr : ncclSystemError;
        }
        c->cv.wait_for(lk, std::chrono::milliseconds(50));
      }
      ck[p] = c->splitIn[{seq, p}];
      c->splitIn.erase({seq, p});
    }
  }
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  std::vector<int> members;
  for (int p = 0; p < c->nranks; p++)
    if (ck[p].first == color) members.push_back(p);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return ck[a].second != ck[b].second ? ck[a].second < ck[b].second : a < b; });
  int newRank = (int)(std::find(members.begin(), members.end(), c->rank) - members.begin());
  // Every member derives the same new key from the parent's, the split's
  // number and the color.
  uint8_t nk[16];
  uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&](uint64_t v) {
    h ^= v;
    h *= 0x100000001b3ULL;
    h ^= h >> 29;
  };
  for (int i = 0; i < 16; i++) mix(c->key[i]);
  mix(seq);
  mix((uint64_t)color);
  for (int i = 0; i < 16; i += 8) {
    mix(i);
    memcpy(nk + i, &h, 8);
  }
  int saved;
  cudaGetDevice(&saved);
  cudaSetDevice(c->device);
  ncclResult_t r = createComm(newcomm, (int)members.size(), nk, newRank, blocking);
  cudaSetDevice(saved);
  return r;
}

FAKECUDA_API ncclResult_t ncclGroupStart() {
  tlGroupDepth++;
  return ncclSuccess;
}

FAKECUDA_API ncclResult_t ncclGroupEnd() {
  if (tlGroupDepth == 0) {
    ncclComplain("ncclGroupEnd: no matching ncclGroupStart");
    return ncclInvalidUsage;
  }
  if (--tlGroupDepth > 0) return ncclSuccess;
  return flushGroup();
}

FAKECUDA_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                                   ncclComm_t comm, cudaStream_t stream) {
  return p2pOp("ncclSend", true, sendbuff, count, datatype, peer, comm, stream);
}

FAKECUDA_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                                   cudaStream_t stream) {
  return p2pOp("ncclRecv", false, recvbuff, count, datatype, peer, comm, stream);
}

FAKECUDA_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                        ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return collOp(CollKind::AllReduce, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

FAKECUDA_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                        int root, ncclComm_t comm, cudaStream_t stream) {
  return collOp(CollKind::Broadcast, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

FAKECUDA_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                     ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return collOp(CollKind::Reduce, sendbuff, recvbuff, count, datatype, op, root, comm, stream);
}

FAKECUDA_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                        ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return collOp(CollKind::AllGather, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}

FAKECUDA_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                            ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                            cudaStream_t stream) {
  return collOp(CollKind::ReduceScatter, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}

FAKECUDA_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  if (!ptr) return ncclInvalidArgument;
  cudaError_t e = deviceMalloc(ptr, size, "ncclMemAlloc");
  if (e) return e == cudaErrorInvalidValue ? ncclInvalidArgument : ncclUnhandledCudaError;
  return ncclSuccess;
}

FAKECUDA_API ncclResult_t ncclMemFree(void* ptr) {
  cudaError_t e = deviceFree(ptr, "ncclMemFree");
  return e ? ncclInvalidArgument : ncclSuccess;
}

// ================= extension =================

FAKECUDA_API ncclResult_t fakencclInjectAsyncError(ncclComm_t comm, ncclResult_t err) {
  CommPtr c = findComm(comm);
  if (!c || err == ncclSuccess || err == ncclInProgress || err < 0 || err >= ncclNumResults) return ncclInvalidArgument;
  std::lock_guard<std::mutex> lk(c->mu);
  ncclComplain("communicator %s rank %d: injected asynchronous error %s", c->idHex().c_str(), c->rank,
               ncclGetErrorString(err));
  c->fail(err);
  return ncclSuccess;
}
