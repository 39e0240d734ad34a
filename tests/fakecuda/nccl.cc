// The double's NCCL: communicators of separate processes joined by Unix
// domain sockets of the double's own (not Zeppelin's transports, so a bug
// there cannot hide itself), grouped point-to-point calls with NCCL's
// semantics, enqueued on the callers' streams.
//
// Sends are rendezvous: a send moves no byte before its receive has been
// posted (the receiver's "clear to send" arrives), so an ungrouped send that
// waits for a receive queued behind another send deadlocks as it can on a
// GPU. A send that waits longer than FAKENCCL_DEADLOCK_SECONDS (default 10)
// is reported as such a deadlock: a message on stderr, the communicator's
// async error set to ncclInvalidUsage, and the stream's work failing
// (cudaErrorLaunchFailure), so a test sees it instead of hanging.
//
// A peer that exits without finalizing its communicator makes the
// communicator's async error ncclRemoteError within a poll interval; work
// waiting for it stays blocked (NCCL kernels spin) until ncclCommAbort.
//
// Each communicator's queue of work enqueued but not yet done is bounded
// (FAKENCCL_QUEUE_DEPTH operations), as NCCL's is: an enqueue that would pass
// the bound blocks the host until the device side drains some (see
// waitForQueueRoom).
//
// Two ranks on the same GPU of the same host are refused at init ("Duplicate
// GPU detected"), as NCCL refuses them, unless NCCL_HOSTID tells them apart.
#include <nccl.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>
#include <thread>
#include <type_traits>

#include "tests/fakecuda/fakecuda.h"
#include "tests/fakecuda/internal.h"

using namespace fakecuda;

namespace {

enum MsgType : uint32_t { kHello = 1, kClearToSend = 2, kData = 3, kBye = 4 };
struct Msg {
  uint32_t type;
  uint32_t from;
  uint64_t seq;
  uint64_t bytes;
};

struct SendOp {
  int peer;
  uint64_t seq;
  const char* src;  // alias
  size_t bytes;
  bool cleared = false;  // the receive is posted: its size is ctsBytes
  size_t ctsBytes = 0;
  bool sent = false;
};
struct RecvOp {
  int peer;
  uint64_t seq;
  char* dst;  // alias
  size_t bytes;
  bool done = false;
};

thread_local std::string tlsLastError;
std::string& lastErrorText() {
  static std::string& s = *new std::string;
  return s;
}
ncclResult_t failWith(ncclResult_t r, const std::string& text) {
  std::lock_guard<std::mutex> l(lock());
  lastErrorText() = text;
  return r;
}

bool writeAll(int fd, const void* p, size_t n) {
  const char* c = (const char*)p;
  while (n > 0) {
    ssize_t w = send(fd, c, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    c += w;
    n -= (size_t)w;
  }
  return true;
}

bool readAll(int fd, void* p, size_t n) {
  char* c = (char*)p;
  while (n > 0) {
    ssize_t r = read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= (size_t)r;
  }
  return true;
}

// Each rank listens on a socket file (not the abstract namespace, which is
// per network namespace: ranks of an emulated cluster live in different
// ones but share the file system), in $TMPDIR or /tmp, removed once every
// peer has connected.
std::string socketPath(uint64_t token, int rank) {
  const char* dir = getenv("TMPDIR");
  char buf[sizeof(sockaddr_un::sun_path)];
  snprintf(buf, sizeof buf, "%s/fakenccl-%016llx-%d", dir && *dir && strlen(dir) < 60 ? dir : "/tmp",
           (unsigned long long)token, rank);
  return buf;
}

sockaddr_un socketAddress(const std::string& path, socklen_t* len) {
  sockaddr_un a;
  memset(&a, 0, sizeof(a));
  a.sun_family = AF_UNIX;
  memcpy(a.sun_path, path.data(), std::min(path.size(), sizeof(a.sun_path) - 1));
  *len = (socklen_t)sizeof(a);
  return a;
}

}  // namespace

struct ncclComm {
  int rank = 0, nranks = 0, device = 0;
  uint64_t token = 0;
  bool blocking = true;
  std::vector<int> fd;  // by peer; -1 for this rank
  std::vector<std::unique_ptr<std::mutex>> writeMu;
  std::vector<uint64_t> sendSeq, recvSeq;  // the next sequence number with each peer
  std::vector<uint64_t> sentBytes;         // by peer: bytes sent so far (fakencclPeerBytes), under lock()
  // Under lock():
  std::map<std::pair<int, uint64_t>, SendOp*> sends;
  std::map<std::pair<int, uint64_t>, RecvOp*> recvs;
  std::map<std::pair<int, uint64_t>, size_t> earlyClear;  // clear-to-send before the send was posted
  ncclResult_t state = ncclInProgress;  // init or finalize under way, else ncclSuccess
  ncclResult_t error = ncclSuccess;
  std::string errorText;
  bool aborted = false, finalizing = false, byeSent = false, stopReceiver = false;
  std::vector<bool> peerBye;
  int inflight = 0;  // stream items with ops of this communicator
  // The host thread using the communicator (the one-thread rule): inside an
  // enqueue call, or with its operations in a group it has not ended yet.
  std::atomic<std::thread::id> user{};
  // The bounded work queue (waitForQueueRoom), under lock(): operations
  // enqueued on streams and not done yet, the most there ever were, how many
  // are done so far (progress), how many times a host thread blocked on a
  // full queue (fakencclQueueBlocks), and how many host threads are blocked
  // on it now.
  int64_t pendingOps = 0, mostPendingOps = 0;
  uint64_t doneOps = 0, queueBlocks = 0;
  int hostsBlockedOnQueue = 0;
  std::thread init, receiver;
  int wake[2] = {-1, -1};

  void opsEnqueued(int64_t n) {  // lock() held
    pendingOps += n;
    mostPendingOps = std::max(mostPendingOps, pendingOps);
  }
  void opsDone(int64_t n) {  // lock() held
    pendingOps -= n;
    doneOps += (uint64_t)n;
  }

  // The call-order rule (NCCL runs one communicator's operations one after
  // another, in call order, whatever their streams: it orders each launch
  // after the previous one with events): the previous launch not captured
  // in a graph, under lock(); whether a launch ever followed one on another
  // stream (for the deadlock report).
  Dep last;
  bool acrossStreams = false;
  // Adds the previous launch to what a launch on stream s must wait for.
  void launchAfterPrevious(const std::shared_ptr<Stream>& s, std::vector<Dep>* after) {  // lock() held
    if (!last.stream || last.stream == s) return;  // none, or the stream's own order already
    after->push_back(last);
    acrossStreams = true;
  }

  void setError(ncclResult_t r, const std::string& text) {  // lock() held
    if (error != ncclSuccess) return;
    error = r;
    errorText = text;
    lastErrorText() = text;
    fprintf(stderr, "fakenccl: rank %d: %s\n", rank, text.c_str());
    changed().notify_all();
  }
};

namespace {

// Which host a rank is on, as NCCL tells (getHostHash, src/misc/utils.cc):
// NCCL_HOSTID if set, else the host name (per UTS namespace: each node of an
// emulated cluster has its own) and the boot id.
uint64_t hostHash() {
  std::string id;
  if (const char* env = getenv("NCCL_HOSTID")) {
    id = env;
  } else {
    char name[256] = {0};
    gethostname(name, sizeof name - 1);
    id = name;
    if (FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r")) {
      char boot[64] = {0};
      if (fscanf(f, "%63s", boot) == 1) id += boot;
      fclose(f);
    }
  }
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char ch : id) h = (h ^ ch) * 0x100000001b3ull;
  return h;
}

// ---- Setting up the mesh: rank j connects to every rank below it ----
// Each hello carries the rank's host hash and device, answered by the
// accepting rank's, so that every rank knows every peer's (NCCL gathers its
// peers' info at init alike). *why says what failed.
ncclResult_t connectMesh(ncclComm* c, std::string* why) {
  const uint64_t myHost = hostHash();
  std::vector<uint64_t> peerHost(c->nranks, myHost);
  std::vector<int> peerDevice(c->nranks, c->device);
  const int deadlineSec = envInt("FAKENCCL_INIT_SECONDS", 120);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(deadlineSec);
  socklen_t len;
  const std::string path = socketPath(c->token, c->rank);
  sockaddr_un me = socketAddress(path, &len);
  int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (lfd < 0 || bind(lfd, (sockaddr*)&me, len) != 0 || listen(lfd, c->nranks) != 0) {
    if (lfd >= 0) close(lfd);
    return ncclSystemError;
  }
  struct Unlink {
    const std::string& path;
    ~Unlink() { unlink(path.c_str()); }
  } unlinkOnReturn{path};
  for (int j = 0; j < c->rank; j++) {
    sockaddr_un peer = socketAddress(socketPath(c->token, j), &len);
    for (;;) {
      int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (connect(fd, (sockaddr*)&peer, len) == 0) {
        Msg hello{kHello, (uint32_t)c->rank, myHost, (uint64_t)c->device}, reply;
        if (!writeAll(fd, &hello, sizeof hello) || !readAll(fd, &reply, sizeof reply) || reply.type != kHello ||
            (int)reply.from != j) {
          close(fd);
          close(lfd);
          *why = "rank " + std::to_string(j) + " did not answer the hello";
          return ncclSystemError;
        }
        peerHost[j] = reply.seq;
        peerDevice[j] = (int)reply.bytes;
        c->fd[j] = fd;
        break;
      }
      close(fd);
      {
        std::lock_guard<std::mutex> l(lock());
        if (c->aborted) break;
      }
      if (std::chrono::steady_clock::now() > deadline) {
        close(lfd);
        *why = "rank " + std::to_string(j) + " did not come within FAKENCCL_INIT_SECONDS";
        return ncclRemoteError;
      }
      usleep(1000);
    }
  }
  for (int k = c->rank + 1; k < c->nranks; k++) {
    pollfd p{lfd, POLLIN, 0};
    for (;;) {
      if (poll(&p, 1, 100) > 0) break;
      std::lock_guard<std::mutex> l(lock());
      if (c->aborted || std::chrono::steady_clock::now() > deadline) {
        close(lfd);
        *why = c->aborted ? "aborted during init" : "a peer did not come within FAKENCCL_INIT_SECONDS";
        return ncclRemoteError;
      }
    }
    int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
    Msg hello;
    if (fd < 0 || !readAll(fd, &hello, sizeof hello) || hello.type != kHello || (int)hello.from <= c->rank ||
        (int)hello.from >= c->nranks) {
      close(lfd);
      *why = "a bad hello";
      return ncclSystemError;
    }
    Msg reply{kHello, (uint32_t)c->rank, myHost, (uint64_t)c->device};
    writeAll(fd, &reply, sizeof reply);
    peerHost[hello.from] = hello.seq;
    peerDevice[hello.from] = (int)hello.bytes;
    c->fd[hello.from] = fd;
  }
  close(lfd);
  // NCCL refuses two ranks of one communicator on one GPU of one host
  // (init.cc: "Duplicate GPU detected"), on every rank, as ncclInvalidUsage.
  // Ranks that share a GPU must look like different hosts: NCCL_HOSTID.
  for (int p = 0; p < c->nranks; p++)
    if (p != c->rank && peerHost[p] == myHost && peerDevice[p] == c->device) {
      *why = "Duplicate GPU detected: rank " + std::to_string(std::min(p, c->rank)) + " and rank " +
             std::to_string(std::max(p, c->rank)) + " both on CUDA device " + std::to_string(c->device) +
             " of the same host (give each rank its own NCCL_HOSTID to let them share it)";
      return ncclInvalidUsage;
    }
  return ncclSuccess;
}

// ---- The receiving side: one thread per communicator reads every peer ----
void receive(ncclComm* c) {
  std::vector<pollfd> fds;
  std::vector<int> peerOf;
  for (int p = 0; p < c->nranks; p++)
    if (c->fd[p] >= 0) {
      fds.push_back({c->fd[p], POLLIN, 0});
      peerOf.push_back(p);
    }
  fds.push_back({c->wake[0], POLLIN, 0});
  std::vector<char> discard;
  for (;;) {
    if (poll(fds.data(), fds.size(), 200) < 0 && errno != EINTR) return;
    if (fds.back().revents) return;  // destroy or abort
    for (size_t i = 0; i + 1 < fds.size(); i++) {
      if (fds[i].fd < 0 || !fds[i].revents) continue;
      const int p = peerOf[i];
      Msg m;
      if (!readAll(fds[i].fd, &m, sizeof m)) {
        std::lock_guard<std::mutex> l(lock());
        if (!c->peerBye[p] && !c->aborted)
          c->setError(ncclRemoteError, "rank " + std::to_string(p) +
                                           " closed its connection without finalizing the communicator (the "
                                           "process died?)");
        fds[i].fd = -1;
        continue;
      }
      std::unique_lock<std::mutex> l(lock());
      if (m.type == kBye) {
        c->peerBye[p] = true;
      } else if (m.type == kClearToSend) {
        auto it = c->sends.find({p, m.seq});
        if (it != c->sends.end()) {
          it->second->cleared = true;
          it->second->ctsBytes = m.bytes;
        } else {
          c->earlyClear[{p, m.seq}] = m.bytes;
        }
        changed().notify_all();
      } else if (m.type == kData) {
        auto it = c->recvs.find({p, m.seq});
        RecvOp* r = it == c->recvs.end() ? nullptr : it->second;
        l.unlock();
        // A receive is posted before its clear-to-send goes out, so it is there.
        bool ok;
        if (r && m.bytes <= r->bytes) {
          ok = readAll(fds[i].fd, r->dst, m.bytes);
        } else {
          discard.resize(m.bytes);
          ok = readAll(fds[i].fd, discard.data(), m.bytes);
        }
        l.lock();
        if (!r) {
          c->setError(ncclInternalError, "data from rank " + std::to_string(p) + " for no posted receive");
        } else {
          if (m.bytes > r->bytes)
            c->setError(ncclInvalidUsage, "rank " + std::to_string(p) + " sends " + std::to_string(m.bytes) +
                                              " bytes to rank " + std::to_string(c->rank) + ", which receives " +
                                              std::to_string(r->bytes));
          r->done = true;
          c->recvs.erase(it);
        }
        if (!ok && !c->aborted) c->setError(ncclRemoteError, "rank " + std::to_string(p) + " died mid-message");
        changed().notify_all();
      }
    }
  }
}

// ---- The bounded work queue ----
// NCCL queues a communicator's work for the device in bounded host-side
// structures, and an enqueue call that finds them full spins until the GPU
// has consumed enough:
// - the work FIFO, NCCL_WORK_FIFO_BYTES (1 MiB by default, src/init.cc):
//   uploadWork calls waitWorkFifoAvailable, which loops until
//   `desiredProduced - comm->workFifoConsumed <= comm->workFifoBytes`, and
//   workFifoConsumed moves only as the kernels read their work (NVIDIA/nccl,
//   src/enqueue.cc; RCCL added a warning for hosts stuck there, ROCm/rccl#1772);
// - the proxy's op pool, MAX_OPS_PER_PEER = 2 * MAXCHANNELS * 2 *
//   NCCL_MAX_DEV_WORK_P2P_PER_BATCH per local rank (src/include/proxy.h);
// - and below NCCL, CUDA's queue of pending launches per stream, about 1000
//   (a launch past it waits for the device: NVIDIA developer forums, "CUDA
//   stream are blocked when launch lots of kernels (>1000)").
// How many operations fill them depends on sizes, channels and protocols;
// the double counts operations (each send, receive or collective is one) and
// takes 1024 per communicator by default, the order of all three.
// FAKENCCL_QUEUE_DEPTH sets it (0: unbounded). A group larger than the bound
// is admitted when the queue is empty (NCCL splits it into several kernels).
// Work enqueued by a graph launch is not bounded (NCCL keeps a graph's work in
// memory of its own, not in the FIFO).
int queueDepth() {
  static const int depth = envInt("FAKENCCL_QUEUE_DEPTH", 1024);
  return depth;
}

// Blocks the calling host thread while n more operations would not fit in
// c's queue, until the device side has done enough (lock() held via l). On a
// GPU the host spins; it never returns if the work ahead waits for something
// only this host thread could still provide (a stream it holds, a send it has
// not enqueued yet): a hang. The double reports that and aborts: when no
// operation of the communicator completes for FAKENCCL_DEADLOCK_SECONDS
// while the host is blocked here, or when a send or receive ahead of the
// block is found deadlocked (runOps). Each block counts as a host wait
// (fakecudaHostWaits) and in fakencclQueueBlocks.
ncclResult_t waitForQueueRoom(std::unique_lock<std::mutex>& l, ncclComm* c, int64_t n, const char* call) {
  const int64_t depth = queueDepth();
  auto full = [&] { return c->pendingOps > 0 && c->pendingOps + n > depth; };
  if (depth <= 0 || !full()) return ncclSuccess;
  c->queueBlocks++;
  countHostWait();
  c->hostsBlockedOnQueue++;
  const int stallSec = envInt("FAKENCCL_DEADLOCK_SECONDS", 10);
  uint64_t seen = c->doneOps;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(stallSec);
  while (full() && !c->aborted) {
    if (c->doneOps != seen) {
      seen = c->doneOps;
      deadline = std::chrono::steady_clock::now() + std::chrono::seconds(stallSec);
    } else if (std::chrono::steady_clock::now() > deadline) {
      fprintf(stderr,
              "fakenccl: rank %d: %s blocked the host on a full work queue (%lld operations of the communicator "
              "enqueued and not done, the bound is %lld: FAKENCCL_QUEUE_DEPTH) and none of them has completed in "
              "%d s: the work ahead waits on this host (a stream it holds, or a send or receive it has not "
              "enqueued yet). On a GPU NCCL's enqueue spins here forever (the bounded work queue rule).\n",
              c->rank, call, (long long)c->pendingOps, (long long)depth, stallSec);
      abort();
    }
    changed().wait_for(l, std::chrono::milliseconds(50));
  }
  c->hostsBlockedOnQueue--;
  // NCCL's wait gives up with ncclInternalError when the communicator is aborted.
  if (c->aborted) {
    lastErrorText() = std::string(call) + ": the communicator was aborted while the host waited for room in its queue";
    return ncclInternalError;
  }
  return ncclSuccess;
}

// ---- Groups ----
struct PendingOp {
  bool isSend;
  ncclComm* comm;
  int peer;
  void* buf;  // device address
  size_t bytes;
  std::shared_ptr<Stream> stream;
};
thread_local int tlsGroupDepth = 0;
thread_local std::vector<PendingOp> tlsGroup;

// A send or receive of c deadlocked (waited FAKENCCL_DEADLOCK_SECONDS) while
// a host thread of this process is blocked on c's full queue: aborts, naming
// the bounded work queue rule. Called with lock() held.
void queueDeadlock(ncclComm* c, const char* what) {
  if (c->hostsBlockedOnQueue == 0) return;
  fprintf(stderr,
          "fakenccl: rank %d: %s has waited %d s for its peer while this rank's host is blocked on a full work queue "
          "(%lld operations enqueued and not done; FAKENCCL_QUEUE_DEPTH %d): what would match it can only be enqueued "
          "after the block, which never ends. On a GPU this hangs (the bounded work queue rule).\n",
          c->rank, what, envInt("FAKENCCL_DEADLOCK_SECONDS", 10), (long long)c->pendingOps, queueDepth());
  abort();
}

// Runs on a stream's thread: the group's ops on that stream.
cudaError_t runOps(std::vector<SendOp>& sends, std::vector<ncclComm*>& sendComm, std::vector<RecvOp>& recvs,
                   std::vector<ncclComm*>& recvComm) {
  std::unique_lock<std::mutex> l(lock());
  for (size_t i = 0; i < recvs.size(); i++) recvComm[i]->recvs[{recvs[i].peer, recvs[i].seq}] = &recvs[i];
  for (size_t i = 0; i < sends.size(); i++) {
    ncclComm* c = sendComm[i];
    c->sends[{sends[i].peer, sends[i].seq}] = &sends[i];
    auto early = c->earlyClear.find({sends[i].peer, sends[i].seq});
    if (early != c->earlyClear.end()) {
      sends[i].cleared = true;
      sends[i].ctsBytes = early->second;
      c->earlyClear.erase(early);
    }
  }
  l.unlock();
  // Clear to send, for every receive from another process.
  for (size_t i = 0; i < recvs.size(); i++) {
    ncclComm* c = recvComm[i];
    if (recvs[i].peer == c->rank) continue;
    Msg m{kClearToSend, (uint32_t)c->rank, recvs[i].seq, recvs[i].bytes};
    std::lock_guard<std::mutex> w(*c->writeMu[recvs[i].peer]);
    writeAll(c->fd[recvs[i].peer], &m, sizeof m);
  }
  const int deadlockSec = envInt("FAKENCCL_DEADLOCK_SECONDS", 10);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(deadlockSec);
  cudaError_t result = cudaSuccess;
  l.lock();
  for (;;) {
    bool allDone = true, aborted = false;
    for (size_t i = 0; i < sends.size(); i++) {
      SendOp& s = sends[i];
      ncclComm* c = sendComm[i];
      aborted |= c->aborted;
      if (s.sent || c->aborted) continue;
      if (s.peer == c->rank) {  // to itself: a copy once the receive is posted
        auto it = c->recvs.find({c->rank, s.seq});
        if (it == c->recvs.end()) {
          allDone = false;
          continue;
        }
        RecvOp* r = it->second;
        if (s.bytes > r->bytes)
          c->setError(ncclInvalidUsage, "rank " + std::to_string(c->rank) + " sends " + std::to_string(s.bytes) +
                                            " bytes to itself, which receives " + std::to_string(r->bytes));
        else
          memcpy(r->dst, s.src, s.bytes);
        c->sentBytes[c->rank] += s.bytes;
        r->done = true;
        c->recvs.erase(it);
        s.sent = true;
        changed().notify_all();
        continue;
      }
      if (!s.cleared) {
        allDone = false;
        continue;
      }
      // Clear to send: the bytes go out (without the lock: the receiver reads them).
      l.unlock();
      Msg m{kData, (uint32_t)c->rank, s.seq, s.bytes};
      bool ok;
      {
        std::lock_guard<std::mutex> w(*c->writeMu[s.peer]);
        ok = writeAll(c->fd[s.peer], &m, sizeof m) && writeAll(c->fd[s.peer], s.src, s.bytes);
      }
      l.lock();
      s.sent = true;
      if (ok) c->sentBytes[s.peer] += s.bytes;
      if (!ok && !c->aborted) c->setError(ncclRemoteError, "rank " + std::to_string(s.peer) + " is gone");
      if (s.ctsBytes < s.bytes)
        c->setError(ncclInvalidUsage, "rank " + std::to_string(c->rank) + " sends " + std::to_string(s.bytes) +
                                          " bytes to rank " + std::to_string(s.peer) + ", which receives " +
                                          std::to_string(s.ctsBytes));
    }
    for (size_t i = 0; i < recvs.size(); i++) {
      aborted |= recvComm[i]->aborted;
      if (!recvs[i].done && !recvComm[i]->aborted) allDone = false;
    }
    if (allDone || aborted) break;
    // A send whose receive never comes: with no group around it, both ranks
    // may be sending first. Reported, and the stream moves on (failed).
    if (std::chrono::steady_clock::now() > deadline) {
      // The host of this process blocked on a full queue behind this op:
      // whatever would match it can only come after the block, which never
      // ends (a GPU hangs). Reported by the rule's name, not as a plain
      // deadlock that the double then lets the stream move past.
      for (ncclComm* c : sendComm) queueDeadlock(c, "a send");
      for (ncclComm* c : recvComm) queueDeadlock(c, "a receive");
      for (size_t i = 0; i < sends.size(); i++)
        if (!sends[i].sent && !sends[i].cleared) {
          ncclComm* c = sendComm[i];
          c->setError(ncclInvalidUsage,
                      "ncclSend of " + std::to_string(sends[i].bytes) + " bytes from rank " + std::to_string(c->rank) +
                          " to rank " + std::to_string(sends[i].peer) + " has waited " + std::to_string(deadlockSec) +
                          " s for its receive: a deadlock (an ungrouped send before a receive on both ranks?" +
                          (c->acrossStreams ? " Or a receive on another stream, which runs after this send: NCCL "
                                              "runs a communicator's operations in call order, whatever their "
                                              "streams (the call-order rule)" : "") + ")");
        }
      for (size_t i = 0; i < recvs.size(); i++)
        if (!recvs[i].done)
          recvComm[i]->setError(ncclInvalidUsage,
                                "ncclRecv from rank " + std::to_string(recvs[i].peer) + " has waited " +
                                    std::to_string(deadlockSec) + " s: a deadlock?" +
                                    (recvComm[i]->acrossStreams ? " (the call-order rule: NCCL runs a communicator's "
                                                                  "operations in call order, whatever their streams)"
                                                                : ""));
      result = cudaErrorLaunchFailure;
      break;
    }
    changed().wait_for(l, std::chrono::milliseconds(50));
  }
  // Whatever did not finish (abort, deadlock) is forgotten.
  for (size_t i = 0; i < sends.size(); i++) sendComm[i]->sends.erase({sends[i].peer, sends[i].seq});
  for (size_t i = 0; i < recvs.size(); i++) {
    auto it = recvComm[i]->recvs.find({recvs[i].peer, recvs[i].seq});
    if (it != recvComm[i]->recvs.end() && it->second == &recvs[i]) recvComm[i]->recvs.erase(it);
  }
  return result;
}

// What a launch of grouped sends and receives runs, made fresh for each run.
MakeRun groupRun(std::vector<PendingOp> ops) {
  for (PendingOp& op : ops) {
    op.stream = nullptr;  // the maker must not keep the stream alive
    op.buf = op.bytes ? deviceAlias(op.buf, op.bytes) : nullptr;
  }
  return [ops]() -> RunFn {
    auto sends = std::make_shared<std::vector<SendOp>>();
    auto recvs = std::make_shared<std::vector<RecvOp>>();
    auto sendComm = std::make_shared<std::vector<ncclComm*>>();
    auto recvComm = std::make_shared<std::vector<ncclComm*>>();
    std::vector<ncclComm*> comms;
    std::map<ncclComm*, int64_t> opsOf;  // the queue's count, by communicator
    for (const PendingOp& op : ops) {
      opsOf[op.comm]++;
      if (op.isSend) {
        sends->push_back(SendOp{op.peer, op.comm->sendSeq[op.peer]++, (const char*)op.buf, op.bytes});
        sendComm->push_back(op.comm);
      } else {
        recvs->push_back(RecvOp{op.peer, op.comm->recvSeq[op.peer]++, (char*)op.buf, op.bytes});
        recvComm->push_back(op.comm);
      }
      if (std::find(comms.begin(), comms.end(), op.comm) == comms.end()) comms.push_back(op.comm);
    }
    for (ncclComm* c : comms) c->inflight++;
    for (auto& o : opsOf) o.first->opsEnqueued(o.second);
    return [=] {
      cudaError_t e = runOps(*sends, *sendComm, *recvs, *recvComm);
      std::lock_guard<std::mutex> l2(lock());
      for (ncclComm* c : comms) c->inflight--;
      for (auto& o : opsOf) o.first->opsDone(o.second);
      changed().notify_all();
      return e;
    };
  };
}

ncclResult_t launchGroup(std::vector<PendingOp> ops, const char* call) {
  // Every op is checked before any is enqueued.
  for (PendingOp& op : ops) {
    ncclResult_t error;
    std::string text;
    {
      std::lock_guard<std::mutex> l(lock());
      error = op.comm->aborted ? ncclInvalidUsage : op.comm->error;
      text = op.comm->aborted ? "the communicator was aborted" : op.comm->errorText;
    }
    if (error != ncclSuccess) return failWith(error, text);
  }
  // Room in each communicator's queue for its ops (not for those a stream
  // capture records: a graph's work is not queued until it is launched).
  {
    std::unique_lock<std::mutex> l(lock());
    std::map<ncclComm*, int64_t> enqueuing;
    for (PendingOp& op : ops)
      if (!op.stream->capture) enqueuing[op.comm]++;
    for (auto& e : enqueuing) {
      ncclResult_t r = waitForQueueRoom(l, e.first, e.second, call);
      if (r != ncclSuccess) return r;
    }
  }
  // Sequence numbers are taken when an item is made: at once, or, for a
  // stream that is capturing, at every launch of the graph (a captured NCCL
  // operation runs again at each launch, and matches its peers' launches in
  // order).
  std::vector<std::shared_ptr<Stream>> streams;
  for (PendingOp& op : ops)
    if (std::find(streams.begin(), streams.end(), op.stream) == streams.end()) streams.push_back(op.stream);
  if (streams.empty()) return ncclSuccess;  // an empty group
  std::unique_lock<std::mutex> l(lock());
  bool capturing = false;
  for (auto& s : streams) capturing |= s->capture != nullptr;
  cudaError_t e = cudaSuccess;
  if (!capturing) {
    // The call-order rule: the whole group is one launch on its first
    // stream, after every stream's earlier work and every communicator's
    // previous launch; the other streams' later work waits for it.
    std::vector<Dep> after;
    std::vector<ncclComm*> comms;
    for (auto& s : streams)
      if (s != streams[0]) after.push_back({s, s->enqueued});
    for (PendingOp& op : ops)
      if (std::find(comms.begin(), comms.end(), op.comm) == comms.end()) comms.push_back(op.comm);
    for (ncclComm* c : comms) c->launchAfterPrevious(streams[0], &after);
    Dep done;
    e = submitLocked(streams[0], groupRun(ops), std::move(after), &done);
    for (size_t i = 1; i < streams.size() && e == cudaSuccess; i++)
      e = submitLocked(streams[i], [] { return RunFn(); }, {done});
    if (e == cudaSuccess)
      for (ncclComm* c : comms) c->last = done;
  } else {
    // In a capture: one node per stream, with that stream's ops in call
    // order (the call-order rule is not applied to captured work).
    for (size_t i = 0; i < streams.size() && e == cudaSuccess; i++) {
      std::vector<PendingOp> mine;
      for (PendingOp& op : ops)
        if (op.stream == streams[i]) mine.push_back(op);
      e = submitLocked(streams[i], groupRun(mine));
    }
  }
  l.unlock();
  if (e != cudaSuccess) {
    setError(e);
    return failWith(ncclUnhandledCudaError, std::string("enqueueing on the stream: ") + cudaGetErrorString(e));
  }
  return ncclSuccess;
}

// ---- The one-thread rule: NCCL communicators are not thread-safe ----
// NCCL leaves concurrent calls on one communicator from two host threads
// undefined (their operations interleave in a different order on each rank);
// the double's global lock would serialize them and hide it. So a
// communicator belongs to the host thread inside an enqueue call on it, and
// to the thread whose open group holds its operations until that group ends.
// Another thread's enqueue meanwhile is refused and breaks the communicator
// (its error, ncclInvalidUsage, on stderr as every such error). Query, abort
// and destroy are not enqueue calls and may come from any thread, as with
// NCCL.
thread_local std::vector<ncclComm*> tlsGroupComms;  // held by this thread's open group

class CommUse {
 public:
  CommUse(ncclComm* c, const char* call) : c_(c) {
    std::thread::id none;
    const std::thread::id me = std::this_thread::get_id();
    if (c->user.compare_exchange_strong(none, me)) {
      held_ = true;
    } else if (none != me) {
      std::lock_guard<std::mutex> l(lock());
      c->setError(ncclInvalidUsage, std::string(call) + " on a communicator that another host thread is using (in a "
                                                         "call, or in a group it has not ended): NCCL communicators "
                                                         "are not thread-safe (the one-thread rule)");
      ok_ = false;
      return;
    }
    // Inside a group the communicator stays this thread's until the group ends.
    if (held_ && tlsGroupDepth > 0) {
      tlsGroupComms.push_back(c);
      held_ = false;
    }
  }
  ~CommUse() {
    if (held_) c_->user.store(std::thread::id());
  }
  CommUse(const CommUse&) = delete;
  CommUse& operator=(const CommUse&) = delete;
  bool ok() const { return ok_; }

 private:
  ncclComm* c_;
  bool held_ = false, ok_ = true;
};

// At the outermost ncclGroupEnd: the group's communicators are free again.
void releaseGroupComms() {
  for (ncclComm* c : tlsGroupComms) c->user.store(std::thread::id());
  tlsGroupComms.clear();
}

ncclResult_t p2p(bool isSend, const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                 cudaStream_t stream) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  if (!comm) return failWith(ncclInvalidArgument, "comm is NULL");
  if ((int)type < 0 || (int)type >= (int)(sizeof sizes / sizeof sizes[0]))
    return failWith(ncclInvalidArgument, "invalid datatype");
  if (peer < 0 || peer >= comm->nranks) return failWith(ncclInvalidArgument, "peer out of range");
  const size_t bytes = count * sizes[type];
  int dev = -1;
  if (bytes && !deviceAlias(buf, bytes, &dev))
    return failWith(ncclInvalidArgument, std::string(isSend ? "ncclSend" : "ncclRecv") +
                                             ": the buffer is not device memory of that size (a host pointer?)");
  if (bytes && dev != comm->device)
    return failWith(ncclInvalidArgument, "the buffer is on another device than the communicator");
  auto s = streamOf(stream);
  if (!s) return failWith(ncclInvalidArgument, "invalid stream");
  CommUse use(comm, isSend ? "ncclSend" : "ncclRecv");
  if (!use.ok()) return failWith(ncclInvalidUsage, "the communicator is in use by another host thread");
  tlsGroup.push_back(PendingOp{isSend, comm, peer, (void*)buf, bytes, s});
  if (tlsGroupDepth > 0) return ncclSuccess;
  std::vector<PendingOp> ops;
  ops.swap(tlsGroup);
  return launchGroup(std::move(ops), isSend ? "ncclSend" : "ncclRecv");  // a call outside a group is a group of one
}

// ---- Collectives: every rank's input to every rank (the double's own
// point-to-point), then each computes its result itself, in rank order ----
float halfToFloat(uint16_t h) {
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  float v = e == 0 ? std::ldexp((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp((float)(1024 + m), e - 25);
  return (h & 0x8000) ? -v : v;
}
uint16_t floatToHalf(float f) {  // nearest even, normal range and zero (what tests use)
  if (f == 0) return std::signbit(f) ? 0x8000 : 0;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  int e;
  std::frexp(std::fabs(f), &e);
  float r = std::nearbyint(std::ldexp(std::fabs(f), 11 - e));
  if (r == 2048) {
    r = 1024;
    e++;
  }
  if (e + 14 >= 31) return sign | 0x7C00;
  if (e + 14 <= 0) return sign;  // the double does not make subnormals
  return sign | (uint16_t)((e + 14) << 10) | (uint16_t)((int)r - 1024);
}
float bf16ToFloat(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}
uint16_t floatToBf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t lower = x & 0xFFFF, upper = x >> 16;
  if (lower > 0x8000 || (lower == 0x8000 && (upper & 1))) upper++;
  return (uint16_t)upper;
}

template <class T>
T combine(T a, T b, ncclRedOp_t op) {
  switch (op) {
    case ncclProd: return (T)(a * b);
    case ncclMax: return std::max(a, b);
    case ncclMin: return std::min(a, b);
    default: return (T)(a + b);  // sum, avg
  }
}

// out[i] = op over r of in[r][i], in rank order, as NCCL computes it: T is
// how the type adds, and round() rounds to the type after every step (a
// 16-bit type is rounded at each hop of NCCL's rings, not once at the end).
// ncclAvg of a floating type is NCCL's pre-multiplied sum: each input times
// 1/n (rounded to the type) in the type, then summed; of an integer type
// the sum divided once (truncating).
template <class T, class Load, class Store, class Round>
void reduceAll(const std::vector<const char*>& in, char* out, size_t count, ncclRedOp_t op, int n, Load load,
               Store store, Round round, bool floating) {
  const bool preMultiply = op == ncclAvg && floating;
  const T scale = round((T)(1.0 / n));
  auto input = [&](int r, size_t i) { return preMultiply ? round((T)(load(in[r], i) * scale)) : load(in[r], i); };
  for (size_t i = 0; i < count; i++) {
    T acc = input(0, i);
    for (int r = 1; r < n; r++) acc = round(combine(acc, input(r, i), op));
    if (op == ncclAvg && !floating) acc = (T)(acc / (T)n);
    store(out, i, acc);
  }
}

template <class T>
void reduceNative(const std::vector<const char*>& in, char* out, size_t count, ncclRedOp_t op, int n) {
  reduceAll<T>(in, out, count, op, n, [](const char* p, size_t i) { return ((const T*)p)[i]; },
               [](char* p, size_t i, T v) { ((T*)p)[i] = v; }, [](T v) { return v; },
               std::is_floating_point<T>::value);
}

void reduceTyped(ncclDataType_t t, const std::vector<const char*>& in, char* out, size_t count, ncclRedOp_t op,
                 int n) {
  switch (t) {
    case ncclInt8: reduceNative<int8_t>(in, out, count, op, n); break;
    case ncclUint8: reduceNative<uint8_t>(in, out, count, op, n); break;
    case ncclInt32: reduceNative<int32_t>(in, out, count, op, n); break;
    case ncclUint32: reduceNative<uint32_t>(in, out, count, op, n); break;
    case ncclInt64: reduceNative<int64_t>(in, out, count, op, n); break;
    case ncclUint64: reduceNative<uint64_t>(in, out, count, op, n); break;
    case ncclFloat32: reduceNative<float>(in, out, count, op, n); break;
    case ncclFloat64: reduceNative<double>(in, out, count, op, n); break;
    case ncclFloat16:
      reduceAll<float>(in, out, count, op, n, [](const char* p, size_t i) { return halfToFloat(((const uint16_t*)p)[i]); },
                       [](char* p, size_t i, float v) { ((uint16_t*)p)[i] = floatToHalf(v); },
                       [](float v) { return halfToFloat(floatToHalf(v)); }, true);
      break;
    case ncclBfloat16:
      reduceAll<float>(in, out, count, op, n, [](const char* p, size_t i) { return bf16ToFloat(((const uint16_t*)p)[i]); },
                       [](char* p, size_t i, float v) { ((uint16_t*)p)[i] = floatToBf16(v); },
                       [](float v) { return bf16ToFloat(floatToBf16(v)); }, true);
      break;
    default: break;
  }
}

enum class Coll { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter };

ncclResult_t collective(Coll kind, const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                        int root, ncclComm_t comm, cudaStream_t stream) {
  static const size_t sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};
  if (!comm) return failWith(ncclInvalidArgument, "comm is NULL");
  if ((int)type < 0 || (int)type >= 10) return failWith(ncclInvalidArgument, "invalid datatype");
  if ((int)op < 0 || (int)op > (int)ncclAvg) return failWith(ncclInvalidArgument, "invalid reduction op");
  const int n = comm->nranks, me = comm->rank;
  if ((kind == Coll::kBroadcast || kind == Coll::kReduce) && (root < 0 || root >= n))
    return failWith(ncclInvalidArgument, "invalid root");
  const size_t es = sizes[type];
  const size_t inBytes = (kind == Coll::kReduceScatter ? count * n : count) * es;
  const size_t outBytes = (kind == Coll::kAllGather ? count * n : count) * es;
  const bool readsIn = kind != Coll::kBroadcast || me == root;
  const bool writesOut = kind != Coll::kReduce || me == root;
  char* in = readsIn && inBytes ? (char*)deviceAlias(send, inBytes) : nullptr;
  char* out = writesOut && outBytes ? (char*)deviceAlias(recv, outBytes) : nullptr;
  if ((readsIn && inBytes && !in) || (writesOut && outBytes && !out))
    return failWith(ncclInvalidArgument, "a collective's buffer is not device memory of its size (a host pointer?)");
  auto s = streamOf(stream);
  if (!s) return failWith(ncclInvalidArgument, "invalid stream");
  static const char* const names[] = {"ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclAllGather",
                                      "ncclReduceScatter"};
  CommUse use(comm, names[(int)kind]);
  if (!use.ok()) return failWith(ncclInvalidUsage, "the communicator is in use by another host thread");
  std::unique_lock<std::mutex> l(lock());
  if (comm->aborted || comm->error != ncclSuccess) return comm->aborted ? ncclInvalidUsage : comm->error;
  if (!s->capture) {
    ncclResult_t r = waitForQueueRoom(l, comm, 1, names[(int)kind]);
    if (r != ncclSuccess) return r;
  }
  // Made at once, or at every launch of a graph that captured it (fresh
  // sequence numbers and scratch each time).
  MakeRun make = [=]() -> RunFn {
    // Which pairs talk, decided alike on every rank: the broadcast's root to
    // everyone, otherwise everyone to everyone.
    auto sends = std::make_shared<std::vector<SendOp>>();
    auto recvs = std::make_shared<std::vector<RecvOp>>();
    auto tmp = std::make_shared<std::vector<std::vector<char>>>(n);
    for (int p = 0; p < n; p++) {
      if (p == me) continue;
      if (kind != Coll::kBroadcast || me == root) sends->push_back(SendOp{p, comm->sendSeq[p]++, in, inBytes});
      if (kind == Coll::kBroadcast) {
        if (p == root) recvs->push_back(RecvOp{p, comm->recvSeq[p]++, out, outBytes});
      } else {
        (*tmp)[p].resize(inBytes);
        recvs->push_back(RecvOp{p, comm->recvSeq[p]++, (*tmp)[p].data(), inBytes});
      }
    }
    auto sendComm = std::make_shared<std::vector<ncclComm*>>(sends->size(), comm);
    auto recvComm = std::make_shared<std::vector<ncclComm*>>(recvs->size(), comm);
    comm->inflight++;
    comm->opsEnqueued(1);
    return [=] {
      cudaError_t e = runOps(*sends, *sendComm, *recvs, *recvComm);
      if (e == cudaSuccess) {
        std::vector<const char*> all(n);
        for (int p = 0; p < n; p++) all[p] = p == me ? in : (*tmp)[p].data();
        switch (kind) {
          case Coll::kBroadcast:
            if (me == root && out != in && outBytes) memmove(out, in, outBytes);
            break;
          case Coll::kAllGather:
            for (int p = 0; p < n; p++) memmove(out + p * inBytes, all[p], inBytes);
            break;
          case Coll::kReduceScatter:
            for (int p = 0; p < n; p++) all[p] += me * count * es;
            reduceTyped(type, all, out, count, op, n);
            break;
          default:
            if (out) reduceTyped(type, all, out, count, op, n);
        }
      }
      std::lock_guard<std::mutex> l2(lock());
      comm->inflight--;
      comm->opsDone(1);
      changed().notify_all();
      return e;
    };
  };
  std::vector<Dep> after;
  if (!s->capture) comm->launchAfterPrevious(s, &after);
  Dep done;
  cudaError_t e = submitLocked(s, make, std::move(after), &done);
  if (done.stream) comm->last = done;
  if (e != cudaSuccess) {
    setError(e);
    lastErrorText() = std::string("enqueueing on the stream: ") + cudaGetErrorString(e);
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

void sendBye(ncclComm* c) {
  for (int p = 0; p < c->nranks; p++)
    if (c->fd[p] >= 0) {
      Msg m{kBye, (uint32_t)c->rank, 0, 0};
      std::lock_guard<std::mutex> w(*c->writeMu[p]);
      writeAll(c->fd[p], &m, sizeof m);
    }
}

void teardown(ncclComm* c) {
  if (c->init.joinable()) c->init.join();
  if (c->wake[1] >= 0) {
    char b = 1;
    if (write(c->wake[1], &b, 1) < 0) {
    }
  }
  for (int fd : c->fd)
    if (fd >= 0) shutdown(fd, SHUT_RDWR);  // unblocks a reader or writer stuck on a peer
  if (c->receiver.joinable()) c->receiver.join();
  {
    std::unique_lock<std::mutex> l(lock());
    changed().wait(l, [&] { return c->inflight == 0; });
  }
  for (int fd : c->fd)
    if (fd >= 0) close(fd);
  if (c->wake[0] >= 0) close(c->wake[0]);
  if (c->wake[1] >= 0) close(c->wake[1]);
  delete c;
}

}  // namespace

extern "C" {

ncclResult_t ncclGetVersion(int* version) {
  if (!version) return ncclInvalidArgument;
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t) {
  std::lock_guard<std::mutex> l(lock());
  tlsLastError = lastErrorText();
  return tlsLastError.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  if (!id) return ncclInvalidArgument;
  memset(id, 0, sizeof(*id));
  std::random_device rd;
  uint64_t token = ((uint64_t)rd() << 32) ^ rd() ^ ((uint64_t)getpid() << 16);
  memcpy(id->internal, "FAKENCCL", 8);
  memcpy(id->internal + 8, &token, sizeof token);
  return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* out, int nranks, ncclUniqueId id, int rank, ncclConfig_t* config) {
  if (!out) return failWith(ncclInvalidArgument, "comm is NULL");
  *out = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) return failWith(ncclInvalidArgument, "bad rank or nranks");
  if (memcmp(id.internal, "FAKENCCL", 8) != 0) return failWith(ncclInvalidArgument, "not a fakenccl unique id");
  if (enterRuntime() != cudaSuccess)
    return failWith(ncclUnhandledCudaError, "CUDA failure 'initialization error' (a child of fork() after CUDA was used)");
  ncclComm* c = new ncclComm;
  c->rank = rank;
  c->nranks = nranks;
  c->device = currentDevice();
  memcpy(&c->token, id.internal + 8, sizeof c->token);
  c->blocking = !config || config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
  c->fd.assign(nranks, -1);
  for (int p = 0; p < nranks; p++) c->writeMu.emplace_back(new std::mutex);
  c->sendSeq.assign(nranks, 0);
  c->recvSeq.assign(nranks, 0);
  c->sentBytes.assign(nranks, 0);
  c->peerBye.assign(nranks, false);
  if (pipe2(c->wake, O_CLOEXEC) != 0) {
    delete c;
    return failWith(ncclSystemError, "pipe failed");
  }
  // Init is done when the mesh is: a failure after that (a peer that died
  // right away) is an asynchronous error of a communicator that exists.
  auto setUp = [c] {
    std::string why;
    ncclResult_t r = connectMesh(c, &why);
    std::lock_guard<std::mutex> l(lock());
    if (r == ncclInvalidUsage) {
      c->setError(r, why);  // NCCL's own words
    } else if (r != ncclSuccess) {
      c->setError(r, "fakenccl: could not connect the ranks of the communicator (" + why + ")");
    } else if (!c->aborted) {
      c->receiver = std::thread(receive, c);
    }
    c->state = ncclSuccess;
    changed().notify_all();
    return r;
  };
  *out = c;
  if (c->blocking) {
    ncclResult_t r = setUp();
    if (r != ncclSuccess) {
      teardown(c);
      *out = nullptr;
      return r;
    }
    return ncclSuccess;
  }
  c->init = std::thread(setUp);
  return ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t* out, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(out, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* state) {
  if (!c || !state) return ncclInvalidArgument;
  bool bye = false;
  {
    std::lock_guard<std::mutex> l(lock());
    if (c->finalizing && c->state == ncclInProgress && c->inflight == 0) {
      bye = !c->byeSent;
      c->byeSent = true;
      c->state = ncclSuccess;
    }
    *state = c->error != ncclSuccess ? c->error : c->state;
  }
  if (bye) sendBye(c);
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t c, int* count) {
  if (!c || !count) return ncclInvalidArgument;
  *count = c->nranks;
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t c, int* rank) {
  if (!c || !rank) return ncclInvalidArgument;
  *rank = c->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t c, int* device) {
  if (!c || !device) return ncclInvalidArgument;
  *device = c->device;
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() {
  tlsGroupDepth++;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  if (tlsGroupDepth == 0) return failWith(ncclInvalidUsage, "ncclGroupEnd without ncclGroupStart");
  if (--tlsGroupDepth > 0) return ncclSuccess;
  std::vector<PendingOp> ops;
  ops.swap(tlsGroup);
  const ncclResult_t r = launchGroup(std::move(ops), "ncclGroupEnd");
  releaseGroupComms();
  return r;
}

ncclResult_t ncclSend(const void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                      cudaStream_t stream) {
  return p2p(true, buf, count, type, peer, comm, stream);
}

ncclResult_t ncclRecv(void* buf, size_t count, ncclDataType_t type, int peer, ncclComm_t comm, cudaStream_t stream) {
  return p2p(false, buf, count, type, peer, comm, stream);
}

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op,
                           ncclComm_t comm, cudaStream_t stream) {
  return collective(Coll::kAllReduce, send, recv, count, type, op, 0, comm, stream);
}
ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return collective(Coll::kBroadcast, send, recv, count, type, ncclSum, root, comm, stream);
}
ncclResult_t ncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type, ncclRedOp_t op, int root,
                        ncclComm_t comm, cudaStream_t stream) {
  return collective(Coll::kReduce, send, recv, count, type, op, root, comm, stream);
}
ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t type, ncclComm_t comm,
                           cudaStream_t stream) {
  return collective(Coll::kAllGather, send, recv, sendcount, type, ncclSum, 0, comm, stream);
}
ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t type, ncclRedOp_t op,
                               ncclComm_t comm, cudaStream_t stream) {
  return collective(Coll::kReduceScatter, send, recv, recvcount, type, op, 0, comm, stream);
}

ncclResult_t ncclCommFinalize(ncclComm_t c) {
  if (!c) return ncclInvalidArgument;
  std::unique_lock<std::mutex> l(lock());
  c->finalizing = true;
  c->state = ncclInProgress;
  if (c->blocking) changed().wait(l, [&] { return c->inflight == 0 || c->aborted; });
  if (c->inflight > 0) return ncclInProgress;
  c->state = ncclSuccess;
  const bool bye = !c->byeSent;
  c->byeSent = true;
  l.unlock();
  if (bye) sendBye(c);
  return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (!c) return ncclInvalidArgument;
  bool bye;
  {
    // Destroy waits for the communicator's work, as NCCL does.
    std::unique_lock<std::mutex> l(lock());
    changed().wait(l, [&] { return c->inflight == 0 || c->aborted; });
    bye = !c->byeSent;
    c->byeSent = true;
    // How deep a program's queue got, to compare with FAKENCCL_QUEUE_DEPTH.
    if (envInt("FAKENCCL_QUEUE_REPORT", 0))
      fprintf(stderr, "fakenccl: rank %d: at most %lld operations queued, %llu host blocks on a full queue\n", c->rank,
              (long long)c->mostPendingOps, (unsigned long long)c->queueBlocks);
  }
  if (bye) sendBye(c);
  teardown(c);
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) {
  if (!c) return ncclInvalidArgument;
  {
    std::lock_guard<std::mutex> l(lock());
    c->aborted = true;
    changed().notify_all();
  }
  teardown(c);
  return ncclSuccess;
}

// Allocations as cudaMalloc's: device memory the host cannot touch, and
// not permitted while a stream capture forbids unsafe calls (NCCL maps
// memory with the driver's cuMem calls, which a capture refuses likewise).
ncclResult_t ncclMemAlloc(void** p, size_t bytes) {
  if (!p) return ncclInvalidArgument;
  if (captureUnsafe("ncclMemAlloc") != cudaSuccess)
    return failWith(ncclUnhandledCudaError, "ncclMemAlloc: operation not permitted when stream is capturing");
  *p = allocDevice(bytes, currentDevice());
  return *p ? ncclSuccess : ncclSystemError;
}

ncclResult_t ncclMemFree(void* p) {
  if (captureUnsafe("ncclMemFree") != cudaSuccess)
    return failWith(ncclUnhandledCudaError, "ncclMemFree: operation not permitted when stream is capturing");
  return freeDevice(p) ? ncclSuccess : ncclInvalidArgument;
}

ncclResult_t fakencclPeerBytes(ncclComm_t c, int peer, unsigned long long* sent) {
  if (!c || !sent || peer < 0 || peer >= c->nranks) return ncclInvalidArgument;
  std::lock_guard<std::mutex> l(lock());
  *sent = c->sentBytes[peer];
  return ncclSuccess;
}

ncclResult_t fakencclQueueStats(ncclComm_t c, unsigned long long* blocks, unsigned long long* most) {
  if (!c) return ncclInvalidArgument;
  std::lock_guard<std::mutex> l(lock());
  if (blocks) *blocks = c->queueBlocks;
  if (most) *most = (unsigned long long)c->mostPendingOps;
  return ncclSuccess;
}

ncclResult_t fakencclInjectAsyncError(ncclComm_t c, ncclResult_t error) {
  if (!c) return ncclInvalidArgument;
  std::lock_guard<std::mutex> l(lock());
  c->setError(error, "an error injected by the test (fakencclInjectAsyncError)");
  return ncclSuccess;
}

}  // extern "C"
