#include "transport/shm/shm_transport.h"

#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "src/core/log.h"
#include "src/core/socket.h"

namespace zp {

constexpr uint64_t kSegMagic = 0x5a50534547000001ull;
constexpr uint64_t kProbeValue = 0x70726f6265a5a5a5ull;
constexpr int kMaxLocal = 256;
constexpr uint64_t kCtrlRingBytes = 64 << 10;
constexpr uint64_t kRecord = 64;  // records are multiples of this
// A reducing single-copy receive reads this much at a time (fits in L2);
// a group, this much of all its members together.
constexpr size_t kReduceSlice = 256 << 10;
std::atomic<long> gGroupsReduced{0};  // ShmTransport::groupsReduced()

struct alignas(64) RingCtl {
  alignas(64) std::atomic<uint64_t> head;  // written by the producer
  alignas(64) std::atomic<uint64_t> tail;  // written by the consumer
  alignas(64) std::atomic<uint32_t> producerWaiting;
};

struct SegHeader {
  uint64_t magic;
  uint32_t nlocal;
  std::atomic<uint32_t> ready;
  uint64_t ringBytes;
  uint64_t ownerBase;  // where the owner mapped this segment (for the cma probe)
  uint64_t probe;
  alignas(64) std::atomic<uint32_t> doorbell;
  alignas(64) std::atomic<uint32_t> sleeping;  // threads of the owner asleep on the doorbell
  alignas(64) std::atomic<uint64_t> netQueued;
  alignas(64) std::atomic<uint8_t> mappedBy[kMaxLocal];  // local rank i has mapped this segment
  uint8_t cmaOkFrom[kMaxLocal];  // the owner can read local rank i's memory
  // What the owner sends to local rank i by single copy (an RTS): messages
  // from eagerBytes on when cmaTo[i] (its protocol choice, made at init).
  uint64_t eagerBytes;
  std::atomic<uint8_t> cmaTo[kMaxLocal];
  // The owner's init failed after it made this segment: why (failedWhy
  // first, then failed), for the peers waiting for it to map theirs.
  std::atomic<uint32_t> failed;
  char failedWhy[512];
};

enum MsgType : uint32_t { kPad = 1, kData, kRts, kMeta, kFin, kStatus, kBye, kAbort };

struct MsgHdr {
  uint32_t type;
  uint32_t len;     // payload bytes after the header (pad: bytes to skip, header included)
  uint64_t seq;     // the op's position among this pair's messages
  uint64_t total;   // the whole message's bytes
  uint64_t offset;  // data: where this fragment goes
  uint64_t addr;    // rts: the sender's buffer
  int32_t status;   // fin / status: a zpResult_t
  uint32_t kind;    // OpKind
  uint64_t collSeq;
  uint32_t lane;    // fin: the lane of the send it completes
};
static_assert(sizeof(MsgHdr) <= kRecord, "header must fit one record");

namespace {

uint64_t roundRecord(uint64_t n) { return (n + kRecord - 1) & ~(kRecord - 1); }

size_t segmentBytes(uint32_t nlocal, uint64_t ringBytes) {
  size_t hdr = roundRecord(sizeof(SegHeader));
  return hdr + nlocal * ((kLanes + 1) * sizeof(RingCtl) + kLanes * ringBytes + kCtrlRingBytes);
}

// Rings for writer slot `slot` inside a segment mapped at base: one per lane,
// then the control ring. in: the reader's side of the lanes, else the writer's.
void locateRings(void* base, uint32_t nlocal, uint64_t ringBytes, int slot, Lane* lanes, bool in, Ring* ctrl) {
  char* p = (char*)base + roundRecord(sizeof(SegHeader));
  RingCtl* ctls = (RingCtl*)p + slot * (kLanes + 1);
  char* buf = p + nlocal * (kLanes + 1) * sizeof(RingCtl) + slot * (kLanes * ringBytes + kCtrlRingBytes);
  for (int l = 0; l < kLanes; l++) {
    Ring& r = in ? lanes[l].in : lanes[l].out;
    r.ctl = &ctls[l];
    r.buf = buf + l * ringBytes;
    r.cap = ringBytes;
  }
  ctrl->ctl = &ctls[kLanes];
  ctrl->buf = buf + kLanes * ringBytes;
  ctrl->cap = kCtrlRingBytes;
}

// Producer: room for a record of `bytes` (a multiple of kRecord, at most
// cap/2), contiguous; records never wrap, a pad fills the end instead.
MsgHdr* ringClaim(Ring& r, uint64_t bytes) {
  uint64_t head = r.ctl->head.load(std::memory_order_relaxed);
  uint64_t tail = r.ctl->tail.load(std::memory_order_acquire);
  uint64_t pos = head & (r.cap - 1);
  uint64_t pad = (r.cap - pos < bytes) ? r.cap - pos : 0;
  if (pad + bytes > r.cap - (head - tail)) return nullptr;
  if (pad) {
    MsgHdr* h = (MsgHdr*)(r.buf + pos);
    h->type = kPad;
    h->len = (uint32_t)pad;
    head += pad;
    pos = 0;
  }
  r.pendingHead = head + bytes;
  return (MsgHdr*)(r.buf + pos);
}

void ringPublish(Ring& r) { r.ctl->head.store(r.pendingHead, std::memory_order_release); }

// Claims a record of `bytes` and fills the header fields every op's record has.
MsgHdr* claimOpRecord(Ring& r, uint64_t bytes, uint32_t type, const Op* op) {
  MsgHdr* h = ringClaim(r, bytes);
  if (!h) return nullptr;
  memset(h, 0, sizeof(MsgHdr));
  h->type = type;
  h->seq = op->seq;
  h->total = op->bytes;
  h->kind = (uint32_t)op->kind;
  return h;
}

// Consumer: the next record, or null.
MsgHdr* ringPeek(Ring& r) {
  for (;;) {
    uint64_t tail = r.ctl->tail.load(std::memory_order_relaxed);
    uint64_t head = r.ctl->head.load(std::memory_order_acquire);
    if (head == tail) return nullptr;
    MsgHdr* h = (MsgHdr*)(r.buf + (tail & (r.cap - 1)));
    if (h->type != kPad) return h;
    r.ctl->tail.store(tail + h->len, std::memory_order_release);
  }
}

// Consumer: frees the record; true if the producer is waiting for room.
bool ringPop(Ring& r, const MsgHdr* h) {
  uint64_t tail = r.ctl->tail.load(std::memory_order_relaxed);
  r.ctl->tail.store(tail + kRecord + roundRecord(h->len), std::memory_order_release);
  if (r.ctl->producerWaiting.load(std::memory_order_acquire)) {
    r.ctl->producerWaiting.store(0, std::memory_order_relaxed);
    return true;
  }
  return false;
}

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, (uint32_t*)addr, op, val, ts, nullptr, 0);
}

int pidfdOpen(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

// Whether a peer process has exited: its pidfd is readable, or (no pidfd:
// it was gone, and reaped, before this rank could open one, or the kernel
// has no pidfd_open) no process has its pid any more.
bool processExited(pid_t pid, int pidfd) {
  if (pidfd >= 0) {
    pollfd pf = {pidfd, POLLIN, 0};
    return poll(&pf, 1, 0) > 0;
  }
  return kill(pid, 0) != 0 && errno == ESRCH;
}

std::vector<char> makeRecord(uint32_t type, uint64_t seq, int32_t status, uint64_t collSeq,
                             const std::string& text = {}, uint32_t lane = 0) {
  size_t len = std::min<size_t>(text.size(), 512);
  std::vector<char> rec(kRecord + roundRecord(len), 0);
  MsgHdr* h = (MsgHdr*)rec.data();
  h->type = type;
  h->len = (uint32_t)len;
  h->seq = seq;
  h->status = status;
  h->collSeq = collSeq;
  h->lane = lane;
  memcpy(rec.data() + kRecord, text.data(), len);
  return rec;
}

// Single copy: len bytes at address `from` of process pid into to, over
// short reads; 0 or the errno.
int readPeer(pid_t pid, void* to, uint64_t from, size_t len) {
  for (size_t got = 0; got < len;) {
    iovec liov = {(char*)to + got, len - got};
    iovec riov = {(void*)(uintptr_t)(from + got), len - got};
    const ssize_t n = process_vm_readv(pid, &liov, 1, &riov, 1, 0);
    if (n <= 0) return n < 0 ? errno : EIO;
    got += (size_t)n;
  }
  return 0;
}

}  // namespace

zpResult_t ShmTransport::create(const TransportContext& ctx, std::unique_ptr<ShmTransport>* out) {
  std::unique_ptr<ShmTransport> t(new ShmTransport(ctx));
  ZP_CHECK(t->init());
  *out = std::move(t);
  return zpSuccess;
}

std::string ShmTransport::segName(int rank) const {
  const uint8_t* k = ctx_.id->secret;
  char buf[96];
  snprintf(buf, sizeof(buf), "/zp-%02x%02x%02x%02x%02x%02x%02x%02x-r%d", k[0], k[1], k[2], k[3], k[4], k[5], k[6], k[7],
           rank);
  return buf;
}

zpResult_t ShmTransport::init() {
  const TransportContext& c = ctx_;
  const Config& cfg = *c.cfg;
  for (int r = 0; r < c.nranks; r++)
    if (c.sameNode(c.rank, r)) local_.push_back(r);
  if ((int)local_.size() > kMaxLocal)
    return fail(zpInvalidUsage, "%zu ranks on node '%s': at most %d are supported", local_.size(),
                cfg.nodeId.c_str(), kMaxLocal);
  const uint32_t nlocal = (uint32_t)local_.size();
  myLocalIdx_ = (int)(std::find(local_.begin(), local_.end(), c.rank) - local_.begin());
  peerIndex_.assign(c.nranks, -1);
  ringBytes_ = cfg.shmRingBytes;
  fragMax_ = std::min<size_t>(ringBytes_ / 4, 256 << 10);
  spinUs_ = cfg.shmSpinUs;
  cpu_set_t cpus;
  oversubscribed_ = sched_getaffinity(0, sizeof(cpus), &cpus) == 0 && (int)nlocal > CPU_COUNT(&cpus);
  if (nlocal == 1) return zpSuccess;

  // This rank's segment. Every rank of the node makes one of the same size.
  name_ = segName(c.rank);
  segBytes_ = segmentBytes(nlocal, ringBytes_);
  const double nodeBytes = (double)nlocal * segBytes_;
  struct statvfs vfs;
  const bool sized = statvfs("/dev/shm", &vfs) == 0 && vfs.f_blocks > 0;  // 0 blocks: no limit
  const double shmSize = sized ? (double)vfs.f_blocks * vfs.f_frsize : 0;
  auto mib = [](double bytes) {
    char buf[32];
    snprintf(buf, sizeof(buf), "%.1f MiB", bytes / (1 << 20));
    return std::string(buf);
  };
  const std::string needs = "the " + std::to_string(nlocal) + " ranks on this node need " + mib(nodeBytes) +
                            " of it (" + std::to_string(nlocal) + " segments of " + mib((double)segBytes_) +
                            ", with ZP_SHM_RING_BYTES=" + std::to_string(ringBytes_) + ")";
  const char* advice = "make /dev/shm larger (docker run --shm-size=...) or ZP_SHM_RING_BYTES smaller";
  // Bound to fail on every rank alike: say so before taking any of it.
  if (sized && nodeBytes > shmSize)
    return fail(zpSystemError, "rank %d: /dev/shm is too small for shared memory: it holds %s, and %s; %s", c.rank,
                mib(shmSize).c_str(), needs.c_str(), advice);
  int fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) {
    const int e = errno;
    return fail(zpSystemError, "rank %d: cannot create its shared memory /dev/shm%s: %s%s", c.rank, name_.c_str(),
                strerror(e), e == EEXIST ? " (is this unique id used twice?)" : "");
  }
  // Reserve every page now: ftruncate alone gives a file whose pages tmpfs
  // finds only when they are first touched, and one it cannot back then
  // kills the toucher with SIGBUS.
  int e;
  while ((e = posix_fallocate(fd, 0, segBytes_)) == EINTR) {
  }
  if (e != 0) {
    close(fd);
    shm_unlink(name_.c_str());
    const bool have = statvfs("/dev/shm", &vfs) == 0;
    return fail(zpSystemError,
                "rank %d: cannot reserve %s of /dev/shm for shared memory: %s; /dev/shm holds %s, %s of it free, and "
                "%s; %s",
                c.rank, mib((double)segBytes_).c_str(), strerror(e),
                have ? mib((double)vfs.f_blocks * vfs.f_frsize).c_str() : "?",
                have ? mib((double)vfs.f_bavail * vfs.f_frsize).c_str() : "?", needs.c_str(), advice);
  }
  void* base = mmap(nullptr, segBytes_, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  e = errno;
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name_.c_str());
    return fail(zpSystemError, "rank %d: mmap of %zu bytes of shared memory failed: %s", c.rank, segBytes_,
                strerror(e));
  }
  mine_ = (SegHeader*)base;
  mine_->magic = kSegMagic;
  mine_->nlocal = nlocal;
  mine_->ringBytes = ringBytes_;
  mine_->ownerBase = (uint64_t)(uintptr_t)base;
  mine_->probe = kProbeValue;
  mine_->ready.store(1, std::memory_order_release);
  return zpSuccess;
}

zpResult_t ShmTransport::mapPeer(Peer& p) {
  const TransportContext& c = ctx_;
  const char* name = p.segName.c_str();
  // Every local peer made its segment before the bootstrap round that came
  // before this: any failure here is final, none means "not there yet".
  int fd = shm_open(name, O_RDWR, 0);
  if (fd < 0) {
    const int e = errno;
    if (processExited(p.pid, p.pidfd)) {
      shm_unlink(name);  // it cannot remove its segment any more
      return fail(zpRemoteError, "rank %d (pid %d) died during init", p.rank, p.pid);
    }
    if (e == ENOENT)
      return fail(zpRemoteError,
                  "rank %d: local rank %d's shared memory /dev/shm%s is gone: that rank gave up its init (its error "
                  "says why), or it sees another /dev/shm (another container or mount namespace; ZP_NODE_ID tells "
                  "such ranks apart)",
                  c.rank, p.rank, name);
    return fail(zpSystemError, "rank %d: cannot open local rank %d's shared memory /dev/shm%s: %s", c.rank, p.rank,
                name, strerror(e));
  }
  struct stat st;
  const size_t bytes = fstat(fd, &st) == 0 ? (size_t)st.st_size : 0;
  void* base =
      bytes >= sizeof(SegHeader) ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  const int e = errno;
  close(fd);
  if (base == MAP_FAILED)
    return fail(zpSystemError, "rank %d: cannot map local rank %d's shared memory /dev/shm%s (%zu bytes): %s", c.rank,
                p.rank, name, bytes, bytes >= sizeof(SegHeader) ? strerror(e) : "too small");
  SegHeader* s = (SegHeader*)base;
  zpResult_t res = zpSuccess;
  if (s->magic != kSegMagic || s->ready.load(std::memory_order_acquire) != 1)
    res = fail(zpInternalError, "rank %d: local rank %d's shared memory /dev/shm%s is not a segment ready for use",
               c.rank, p.rank, name);
  else if (s->nlocal != local_.size() || s->ringBytes != ringBytes_ || bytes != segBytes_)
    res = fail(zpInternalError,
               "rank %d: local rank %d's shared memory is for %u ranks on this node and %llu-byte rings (%zu bytes), "
               "this rank's for %zu and %llu (%zu bytes)",
               c.rank, p.rank, s->nlocal, (unsigned long long)s->ringBytes, bytes, local_.size(),
               (unsigned long long)ringBytes_, segBytes_);
  if (res != zpSuccess) {
    munmap(base, bytes);
    return res;
  }
  p.seg = s;
  p.segBytes = bytes;
  return zpSuccess;
}

void ShmTransport::publishFailure(const std::string& why) {
  if (!mine_ || mine_->failed.load(std::memory_order_relaxed)) return;
  snprintf(mine_->failedWhy, sizeof(mine_->failedWhy), "%s", why.c_str());
  mine_->failed.store(1, std::memory_order_release);
}

zpResult_t ShmTransport::peerFailed(const Peer& p) const {
  if (!p.seg->failed.load(std::memory_order_acquire)) return zpSuccess;
  const std::string why(p.seg->failedWhy, strnlen(p.seg->failedWhy, sizeof(p.seg->failedWhy)));
  return fail(zpRemoteError, "rank %d: local rank %d failed to set up shared memory: %s", ctx_.rank, p.rank,
              why.c_str());
}

zpResult_t ShmTransport::connect(const std::vector<uint64_t>& ringBytes) {
  const TransportContext& c = ctx_;
  connecting_ = true;
  if (!mine_) {  // alone on its node
    connected_ = true;
    return zpSuccess;
  }
  const uint32_t nlocal = (uint32_t)local_.size();
  const uint64_t deadline = nowMs() + c.cfg->timeoutMs;
  zpResult_t res = zpSuccess;
  // Compared here, from the bootstrap, so that every rank of the node finds
  // the difference itself and says the same.
  for (int r : local_)
    if (res == zpSuccess && ringBytes[r] != ringBytes_)
      res = fail(zpInvalidUsage,
                 "rank %d: ZP_SHM_RING_BYTES differs between the ranks of node '%s': it is %llu on rank %d and %llu "
                 "on rank %d; it must be the same on every rank",
                 c.rank, c.cfg->nodeId.c_str(), (unsigned long long)ringBytes_, c.rank,
                 (unsigned long long)ringBytes[r], r);
  for (uint32_t i = 0; i < nlocal && res == zpSuccess; i++) {
    if ((int)i == myLocalIdx_) continue;
    Peer np;
    np.rank = local_[i];
    np.localIdx = (int)i;
    np.pid = (*c.ranks)[np.rank].pid;
    np.pidfd = pidfdOpen(np.pid);
    np.segName = segName(np.rank);
    res = mapPeer(np);
    if (res != zpSuccess) {
      if (np.pidfd >= 0) close(np.pidfd);
      break;
    }
    peerIndex_[np.rank] = (int)peers_.size();
    peers_.push_back(std::move(np));
    Peer& p = peers_.back();
    // One that failed already says why here: better than what this rank
    // would find next (its segment gone, once it has given up).
    if ((res = peerFailed(p)) != zpSuccess) break;
    locateRings(p.seg, nlocal, ringBytes_, myLocalIdx_, p.lane, false, &p.outCtrl);
    locateRings(mine_, nlocal, ringBytes_, p.localIdx, p.lane, true, &p.inCtrl);
    // Can this process read the peer's memory (single copy)? Test it on the
    // peer's probe word, then publish the answer in this rank's segment.
    uint64_t got = 0;
    iovec liov = {&got, sizeof(got)};
    iovec riov = {(void*)(uintptr_t)(p.seg->ownerBase + offsetof(SegHeader, probe)), sizeof(got)};
    bool canRead = process_vm_readv(p.pid, &liov, 1, &riov, 1, 0) == (ssize_t)sizeof(got) && got == kProbeValue;
    if (!canRead)
      ZP_INFO(kSubShm, "rank %d cannot read rank %d's memory (%s): large messages from it use the copy protocol",
              c.rank, p.rank, strerror(errno));
    mine_->cmaOkFrom[p.localIdx] = canRead ? 1 : 0;
    p.seg->mappedBy[myLocalIdx_].store(1, std::memory_order_release);
  }
  // Wait until every local peer has mapped this segment; then its name can go,
  // so that nothing is left in /dev/shm however the processes end.
  // Only a peer that has not mapped it yet can hold this up; one that has may
  // already have finished its init and left. A peer whose init failed says
  // so in its segment: then the communicator cannot form.
  while (res == zpSuccess) {
    bool all = true;
    for (Peer& p : peers_) {
      if ((res = peerFailed(p)) != zpSuccess) break;
      if (mine_->mappedBy[p.localIdx].load(std::memory_order_acquire)) continue;
      all = false;
      if (processExited(p.pid, p.pidfd)) {
        shm_unlink(p.segName.c_str());  // it cannot remove its segment any more
        res = fail(zpRemoteError, "rank %d (pid %d) died during init", p.rank, p.pid);
        break;
      }
    }
    if (all || res != zpSuccess) break;
    if (nowMs() > deadline) {
      res = fail(zpRemoteError, "rank %d: timed out waiting for local ranks to map shared memory", c.rank);
      break;
    }
    usleep(200);
  }
  if (res != zpSuccess) {
    publishFailure(lastError());
    return res;
  }
  shm_unlink(name_.c_str());
  connected_ = true;

  const Config& cfg = *c.cfg;
  mine_->eagerBytes = cfg.shmEagerBytes;
  for (Peer& p : peers_) {
    bool peerCanRead = p.seg->cmaOkFrom[myLocalIdx_] != 0;
    p.cma = cfg.shmProto != ShmProto::kCopy && peerCanRead;
    mine_->cmaTo[p.localIdx].store(p.cma ? 1 : 0, std::memory_order_release);
    if (cfg.shmProto == ShmProto::kCma && !peerCanRead)
      ZP_WARN(kSubShm, "ZP_SHM_PROTO=cma, but rank %d cannot read rank %d's memory; using copy", p.rank, c.rank);
    ZP_INFO(kSubShm | kSubInit, "rank %d -> rank %d: SHM/%s (eager below %zu bytes, ring %zu bytes)", c.rank,
            p.rank, p.cma ? "CMA" : "copy", cfg.shmEagerBytes, (size_t)ringBytes_);
  }
  return zpSuccess;
}

ShmTransport::~ShmTransport() {
  if (mine_ && !connected_) {
    // Init failed here, so the communicator cannot form: peers still
    // waiting for this rank stop at once.
    publishFailure("rank " + std::to_string(ctx_.rank) + " gave up its init");
    // Failed before connect: so did every rank (the bootstrap round between
    // failed, or told of a failure), and none maps a segment any more. The
    // names of the node's segments go, also those of peers that died after
    // making theirs, which they cannot remove any more.
    if (!connecting_)
      for (int r : local_) shm_unlink(segName(r).c_str());
  }
  for (Peer& p : peers_) {
    if (p.seg) munmap(p.seg, p.segBytes);
    if (p.pidfd >= 0) close(p.pidfd);
  }
  if (mine_) {
    munmap(mine_, segBytes_);
    shm_unlink(name_.c_str());  // in case init failed before unlinking
  }
}

ShmTransport::Peer* ShmTransport::peer(int rank) {
  int i = (rank >= 0 && rank < (int)peerIndex_.size()) ? peerIndex_[rank] : -1;
  return i < 0 ? nullptr : &peers_[i];
}

std::string ShmTransport::describe(int rank) const {
  int i = (rank >= 0 && rank < (int)peerIndex_.size()) ? peerIndex_[rank] : -1;
  if (i < 0) return "none";
  return peers_[i].cma ? "SHM/CMA" : "SHM/copy";
}

bool ShmTransport::hasWork(const Peer& p) {
  // The relay lane's receives stand ready at all times: they are no work.
  for (const Lane& l : p.lane)
    if (!l.sendq.empty() || !l.finWait.empty()) return true;
  return !p.lane[0].recvq.empty();
}

void ShmTransport::addNetQueued(int64_t bytes) {
  if (mine_) mine_->netQueued.fetch_add((uint64_t)bytes, std::memory_order_relaxed);
}

uint64_t ShmTransport::netQueued(int rank) const {
  if (rank == ctx_.rank) return mine_ ? mine_->netQueued.load(std::memory_order_relaxed) : 0;
  int i = (rank >= 0 && rank < (int)peerIndex_.size()) ? peerIndex_[rank] : -1;
  return i < 0 ? 0 : peers_[i].seg->netQueued.load(std::memory_order_relaxed);
}

bool ShmTransport::busy() const {
  for (const Peer& p : peers_)
    if (hasWork(p)) return true;
  return !groups_.empty();
}

bool ShmTransport::canReduceGroup(int rank, size_t bytes) const {
  const int i = (rank >= 0 && rank < (int)peerIndex_.size()) ? peerIndex_[rank] : -1;
  if (i < 0 || peers_[i].gone) return false;
  const SegHeader* s = peers_[i].seg;  // what the sender decided at its init
  return s->cmaTo[myLocalIdx_].load(std::memory_order_acquire) && bytes >= s->eagerBytes;
}

long ShmTransport::groupsReduced() { return gGroupsReduced.load(); }

bool ShmTransport::runGroups() {
  bool did = false;
  for (auto it = groups_.begin(); it != groups_.end();) {
    const OpReduceGroup& g = *it->first;
    GroupWait& w = it->second;
    zpResult_t status = zpSuccess;
    std::string why;
    for (Op* op : w.ops)
      if (op->done && op->status != zpSuccess && status == zpSuccess) {
        status = op->status;
        why = op->error;
      }
    if (status == zpSuccess && (int)w.in.size() < g.members) {
      ++it;
      continue;
    }
    did = true;
    if (status == zpSuccess) status = reduceGroup(g, w, &why);
    // Every member ends now, and every sender whose buffer was offered hears
    // how (an arrived member's sender waits for its FIN).
    for (const GroupMember& m : w.in) {
      Peer* p = peer(m.rank);
      if (!p->gone) pushCtrl(*p, makeRecord(kFin, m.seq, status, 0, why, m.lane));
    }
    for (Op* op : w.ops) {
      if (op->done) continue;
      if (Peer* p = peer(op->peer)) {  // not arrived yet: it must not be matched any more
        std::deque<Op*>& q = p->lane[laneOf(op->kind)].recvq;
        q.erase(std::remove(q.begin(), q.end(), op), q.end());
      }
      if (status == zpSuccess) op->progressed = op->bytes;
      op->finish(status, why);
    }
    it = groups_.erase(it);
  }
  for (Peer& p : peers_)
    if (p.dirty) notify(p);
  return did;
}

zpResult_t ShmTransport::reduceGroup(const OpReduceGroup& g, GroupWait& w, std::string* why) {
  std::sort(w.in.begin(), w.in.end(),
            [](const GroupMember& a, const GroupMember& b) { return a.op->groupSlot < b.op->groupSlot; });
  const size_t k = w.in.size(), es = g.reduce->elemSize;
  // A piece of every member at once in cache: 4 KiB at least, whole elements.
  const size_t piece = std::max<size_t>(4096, (kReduceSlice / k) & ~size_t(4095)) / es * es;
  thread_local std::vector<char> bufs;
  if (bufs.size() < piece * k) bufs.resize(piece * k);
  for (size_t at = 0; at < g.bytes; at += piece) {
    const size_t len = std::min(piece, g.bytes - at);
    for (size_t m = 0; m < k; m++) {
      const Peer& p = *peer(w.in[m].rank);
      if (const int err = readPeer(p.pid, bufs.data() + m * piece, w.in[m].addr + at, len))
        return readFailed(p, g.bytes, err, why);
    }
    char* out = (char*)g.out + at;
    g.reduce->fn(out, (const char*)g.src + at, bufs.data(), len);
    for (size_t m = 1; m < k; m++) g.reduce->fn(out, out, bufs.data() + m * piece, len);
  }
  gGroupsReduced++;
  return zpSuccess;
}

void ShmTransport::post(Op* op) {
  Peer* p = peer(op->peer);
  if (op->group) groups_[op->group].ops.push_back(op);  // even if it fails here: the group fails with it
  if (!p) {
    op->finish(zpInternalError, "no shared-memory path to rank " + std::to_string(op->peer));
    return;
  }
  if (p->gone || (p->bye && op->isSend)) {
    op->finish(p->gone ? p->goneCode : zpRemoteError, p->goneWhy);
    return;
  }
  Lane& l = p->lane[laneOf(op->kind)];
  (op->isSend ? l.sendq : l.recvq).push_back(op);
}

std::vector<int> ShmTransport::relayInboundPeers() {
  std::vector<int> out;
  for (Peer& p : peers_)
    if (p.rank != ctx_.rank && !p.gone && ringPeek(p.lane[laneOf(OpKind::kRelayHeader)].in)) out.push_back(p.rank);
  return out;
}

void ShmTransport::sendStatus(int rank, uint64_t collSeq, zpResult_t status, const std::string& text) {
  if (Peer* p = peer(rank))
    if (!p->gone) pushCtrl(*p, makeRecord(kStatus, 0, status, collSeq, text));
}

bool ShmTransport::pushCtrl(Peer& p, std::vector<char> record) {
  if (p.ctrlBacklog.empty()) {
    if (MsgHdr* h = ringClaim(p.outCtrl, record.size())) {
      memcpy(h, record.data(), record.size());
      ringPublish(p.outCtrl);
      p.dirty = true;
      return true;
    }
  }
  p.ctrlBacklog.push_back(std::move(record));
  return false;
}

void ShmTransport::notify(Peer& p) {
  p.dirty = false;
  p.seg->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (p.seg->sleeping.load(std::memory_order_seq_cst))
    futex(&p.seg->doorbell, FUTEX_WAKE, INT32_MAX, nullptr);
}

uint32_t ShmTransport::waitToken() const {
  return mine_ ? mine_->doorbell.load(std::memory_order_seq_cst) : 0;
}

bool ShmTransport::waitsForSingleCopy() const {
  if (!groups_.empty()) return true;
  for (const Peer& p : peers_) {
    for (const Lane& l : p.lane)
      if (!l.finWait.empty()) return true;
    // Not the relay lane's receives: they stand ready at all times.
    const std::deque<Op*>& recvq = p.lane[0].recvq;
    if (p.cma && !recvq.empty() && recvq.front()->bytes >= ctx_.cfg->shmEagerBytes) return true;
  }
  return false;
}

bool ShmTransport::othersRunnable() {
  // /proc/loadavg's fourth field: "runnable/threads", the runnable count of
  // the moment (this rank included), read at most every 10 ms.
  const uint64_t now = nowMs();
  if (now - runnableCheckedMs_ < 10) return othersRunnable_;
  runnableCheckedMs_ = now;
  othersRunnable_ = true;  // when it cannot tell: sleep, the safe choice
  const int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return othersRunnable_;
  char buf[128];
  const ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return othersRunnable_;
  buf[n] = 0;
  int running = 0;
  if (sscanf(buf, "%*f %*f %*f %d/", &running) == 1)
    othersRunnable_ = running > (int)peers_.size() + 1;  // more than this node's ranks
  return othersRunnable_;
}

// A spinning core's hint to the CPU (x86's pause: less power, and the
// sibling hyperthread gets the pipeline).
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

void ShmTransport::wait(uint32_t token, int ms, const std::function<bool()>& elsewhere) {
  if (!mine_) return;
  // Poll first: within a call the answer usually comes sooner than a futex
  // sleep and wake-up. With more ranks than cores each poll yields the core,
  // so that the peer that has to answer gets to run.
  // But not for a single-copy transfer when ranks outnumber cores and
  // other work competes for them too: a poller stays runnable and takes its
  // share of the cores from the peer doing the copy, while a sleeper is off
  // the run queue until it is woken. With nothing else competing, polling
  // wins or ties. The measurements and their command:
  // docs/collectives.md, "Polling or sleeping while a peer copies".
  auto nowUs = [] {
    timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
  };
  // With a core for every rank of the node, a poll does not yield: a peer
  // never waits for this rank's core, and a sched_yield per poll (a system
  // call, and a task switch when anything else is runnable) was most of a
  // small message's latency. Open MPI's shared memory polls the same way.
  const int spinUs = oversubscribed_ && waitsForSingleCopy() && othersRunnable() ? 0 : spinUs_;
  uint64_t spinUntil = nowUs() + spinUs;
  for (int i = 0; spinUs > 0; i++) {
    if (mine_->doorbell.load(std::memory_order_acquire) != token) return;
    if ((i & 15) == 15) {
      if (elsewhere && elsewhere()) return;
      if (nowUs() > spinUntil) break;
    }
    if (oversubscribed_)
      sched_yield();
    else
      cpuRelax();
  }
  if (elsewhere && elsewhere()) return;
  if (!sleep(token, ms)) checkAlive();
}

bool ShmTransport::sleep(uint32_t token, int ms) {
  if (!mine_) return true;
  mine_->sleeping.fetch_add(1, std::memory_order_seq_cst);
  timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  long rc = futex(&mine_->doorbell, FUTEX_WAIT, token, &ts);
  int err = errno;
  mine_->sleeping.fetch_sub(1, std::memory_order_relaxed);
  return !(rc != 0 && err == ETIMEDOUT);
}

void ShmTransport::checkAlive() {
  for (Peer& p : peers_) {
    if (p.gone || p.bye || !processExited(p.pid, p.pidfd)) continue;
    // A peer that said goodbye before exiting left cleanly.
    drainCtrl(p);
    // If it died before its init finished, its segment still has a name,
    // which it cannot remove any more.
    shm_unlink(p.segName.c_str());
    if (!p.bye)
      peerGone(p, zpRemoteError, "rank " + std::to_string(p.rank) + " (pid " + std::to_string(p.pid) + ") died",
               true);
  }
}

zpResult_t ShmTransport::readFailed(const Peer& p, size_t bytes, int err, std::string* why) {
  *why = "reading " + std::to_string(bytes) + " bytes from rank " + std::to_string(p.rank) +
         " failed: " + strerror(err);
  if (err != ESRCH) return zpSystemError;
  // The peer's process is gone, found before checkAlive did: the
  // communicator is broken now, as checkAlive would make it (the call that
  // read fails with zpRemoteError, and so must zpCommGetAsyncError, even
  // while another thread holds the progress lock).
  ctx_.sink->setAsyncError(zpRemoteError, *why);
  return zpRemoteError;
}

void ShmTransport::peerGone(Peer& p, zpResult_t code, const std::string& why, bool breaksComm, bool fromPeer) {
  if (p.gone) return;
  p.gone = true;
  p.goneCode = code;
  p.goneWhy = why;
  ZP_INFO(kSubShm, "rank %d: %s", ctx_.rank, why.c_str());
  failOps(p, code, why);
  if (breaksComm) ctx_.sink->setAsyncError(code, why, fromPeer);
}

void ShmTransport::failOps(Peer& p, zpResult_t code, const std::string& why) {
  for (auto& kv : groups_)  // its members that arrived (the others are in recvq); runGroups ends the rest
    for (const GroupMember& m : kv.second.in)
      if (m.rank == p.rank) m.op->finish(code, why);
  for (Lane& l : p.lane) {
    for (Op* op : l.sendq) op->finish(code, why);
    for (Op* op : l.recvq) op->finish(code, why);
    for (auto& kv : l.finWait) kv.second->finish(code, why);
    l.sendq.clear();
    l.recvq.clear();
    l.finWait.clear();
  }
}

void ShmTransport::dropOps(zpResult_t status, const std::string& why) {
  for (Peer& p : peers_) failOps(p, status, why);
  for (auto& kv : groups_)
    for (Op* op : kv.second.ops)
      if (!op->done) op->finish(status, why);
  groups_.clear();
}

void ShmTransport::sendToAll(uint32_t type, zpResult_t code, const std::string& why) {
  // Every peer, also those this rank gave up on (they may still be alive and
  // waiting): the rings stay mapped, so a write to a dead peer's is harmless.
  for (Peer& p : peers_) {
    // Straight into the ring, or not at all: a rank on its way out cannot wait for room.
    std::vector<char> rec = makeRecord(type, 0, code, 0, why);
    if (MsgHdr* h = ringClaim(p.outCtrl, rec.size())) {
      memcpy(h, rec.data(), rec.size());
      ringPublish(p.outCtrl);
    }
    notify(p);
  }
}

void ShmTransport::abortPeers(zpResult_t code, const std::string& why) { sendToAll(kAbort, code, why); }

void ShmTransport::leave() {
  sendToAll(kBye, zpRemoteError, "rank " + std::to_string(ctx_.rank) + " destroyed the communicator");
}

std::vector<int> ShmTransport::busyPeers() const {
  std::vector<int> out;
  for (const Peer& p : peers_)
    if (hasWork(p)) out.push_back(p.rank);
  return out;
}

bool ShmTransport::progress() {
  bool did = false;
  // Sends first, to every peer, and their doorbells rung at once: a receive
  // may be a long single-copy read, and peers should not wait for it to learn
  // what this rank offers them.
  for (Peer& p : peers_) {
    if (p.gone) continue;
    did |= drainCtrl(p);
    for (int l = 0; l < kLanes && !p.gone; l++) did |= progressSend(p, l);
    if (p.dirty) notify(p);
  }
  for (Peer& p : peers_) {
    for (int l = 0; l < kLanes && !p.gone; l++) {
      did |= progressRecv(p, l);
      Lane& lane = p.lane[l];
      if (!p.gone && p.bye && !lane.recvq.empty() && !ringPeek(lane.in)) {
        for (Op* op : lane.recvq) op->finish(zpRemoteError, p.goneWhy);
        lane.recvq.clear();
      }
    }
    if (p.dirty) notify(p);
  }
  if (!groups_.empty()) did |= runGroups();
  return did;
}

bool ShmTransport::drainCtrl(Peer& p) {
  bool did = false;
  while (!p.ctrlBacklog.empty()) {
    std::vector<char>& rec = p.ctrlBacklog.front();
    MsgHdr* h = ringClaim(p.outCtrl, rec.size());
    if (!h) break;
    memcpy(h, rec.data(), rec.size());
    ringPublish(p.outCtrl);
    p.ctrlBacklog.pop_front();
    p.dirty = did = true;
  }
  while (MsgHdr* h = ringPeek(p.inCtrl)) {
    did = true;
    std::string text(((const char*)h) + kRecord, std::min<uint32_t>(h->len, 512));
    switch (h->type) {
      case kFin: {
        std::map<uint64_t, Op*>& finWait = p.lane[h->lane < kLanes ? h->lane : 0].finWait;
        auto it = finWait.find(h->seq);
        if (it != finWait.end()) {
          Op* op = it->second;
          finWait.erase(it);
          op->progressed = op->bytes;
          op->finish((zpResult_t)h->status, text);
        }
        break;
      }
      case kStatus:
        ctx_.sink->onStatus(p.rank, h->collSeq, (zpResult_t)h->status, text);
        break;
      case kBye: {
        // Only operations with this peer fail, and receives only once the
        // messages it sent before leaving are used up.
        p.bye = true;
        p.goneWhy = text;
        for (Lane& l : p.lane) {
          for (Op* op : l.sendq) op->finish(zpRemoteError, text);
          for (auto& kv : l.finWait) kv.second->finish(zpRemoteError, text);
          l.sendq.clear();
          l.finWait.clear();
        }
        break;
      }
      case kAbort: {
        zpResult_t code = (zpResult_t)h->status;
        ringPop(p.inCtrl, h);
        peerGone(p, code, text, true, true);
        return true;
      }
      default:
        break;
    }
    if (ringPop(p.inCtrl, h)) p.dirty = true;
  }
  return did;
}

bool ShmTransport::progressRecv(Peer& p, int lane) {
  Lane& l = p.lane[lane];
  bool did = false;
  while (MsgHdr* h = ringPeek(l.in)) {
    if (l.discarding) {
      // Fragments of a message whose receive was refused: skip them.
      l.discardLeft -= std::min<uint64_t>(l.discardLeft, h->len);
      if (l.discardLeft == 0) l.discarding = false;
      if (ringPop(l.in, h)) p.dirty = true;
      did = true;
      continue;
    }
    if (l.recvq.empty()) break;  // not asked for yet: it waits in the ring
    Op* op = l.recvq.front();
    did = true;
    if (h->seq != op->seq || h->kind != (uint32_t)op->kind) {
      std::string why = "rank " + std::to_string(p.rank) + " sent its message #" + std::to_string(h->seq) + " (" +
                        opKindName((OpKind)h->kind) + ") while rank " + std::to_string(ctx_.rank) +
                        " expected message #" + std::to_string(op->seq) + " (" + opKindName(op->kind) +
                        "): the ranks called operations in different orders";
      // The pair's message streams no longer line up: nothing later can be matched.
      peerGone(p, zpInvalidUsage, why, true);
      return true;
    }
    if (h->type == kMeta) {
      memcpy(op->meta, (const char*)h + kRecord, std::min<uint32_t>(h->len, op->metaBytes));
      if (ringPop(l.in, h)) p.dirty = true;
      continue;
    }
    if (op->progressed == 0 && h->total != op->bytes) {
      std::string why = std::string(opKindName(op->kind)) + ": rank " + std::to_string(p.rank) + " sends " +
                        std::to_string(h->total / op->typeSize) + " elements to rank " +
                        std::to_string(ctx_.rank) + " but rank " + std::to_string(ctx_.rank) +
                        " expects " + std::to_string(op->bytes / op->typeSize);
      if (h->type == kRts) {
        pushCtrl(p, makeRecord(kFin, h->seq, zpInvalidUsage, 0, why, lane));
      } else {
        uint64_t left = h->total - h->len;
        if (left) {
          l.discarding = true;
          l.discardLeft = left;
        }
      }
      if (ringPop(l.in, h)) p.dirty = true;
      l.recvq.pop_front();
      op->finish(zpInvalidUsage, why);
      continue;
    }
    if (h->type == kRts && op->group) {
      // A group's member: read with the others once all can be (runGroups).
      groups_[op->group].in.push_back({p.rank, lane, h->seq, h->addr, op});
      if (ringPop(l.in, h)) p.dirty = true;
      l.recvq.pop_front();
      continue;
    }
    if (op->group) {  // the sender chose the copy protocol after all (canReduceGroup said it would not)
      peerGone(p, zpInternalError,
               "rank " + std::to_string(p.rank) + " sent fragments where a single-copy transfer was expected", true);
      return true;
    }
    if (h->type == kRts) {
      // Single copy: pull the sender's bytes straight into the receive
      // buffer; or, for a reducing receive, a slice at a time into a buffer
      // that stays in cache, reduced into the receive buffer at once.
      size_t done = 0;
      int err = 0;
      const size_t slice = op->reduce ? kReduceSlice - kReduceSlice % op->reduce->elemSize : op->bytes;
      thread_local std::vector<char> sliceBuf;
      if (op->reduce && sliceBuf.size() < slice) sliceBuf.resize(slice);
      while (done < op->bytes && !err) {
        const size_t want = std::min(slice, op->bytes - done);
        char* to = op->reduce ? sliceBuf.data() : (char*)op->buf + done;
        err = readPeer(p.pid, to, h->addr + done, want);
        if (err) break;
        if (op->reduce) op->reduce->fn((char*)op->buf + done, (const char*)op->reduceSrc + done, to, want);
        done += want;
      }
      uint64_t seq = h->seq;
      if (ringPop(l.in, h)) p.dirty = true;
      l.recvq.pop_front();
      if (err) {
        std::string why;
        const zpResult_t status = readFailed(p, op->bytes, err, &why);
        pushCtrl(p, makeRecord(kFin, seq, zpSystemError, 0, why, lane));
        op->finish(status, why);
      } else {
        pushCtrl(p, makeRecord(kFin, seq, zpSuccess, 0, {}, lane));
        op->progressed = op->bytes;
        op->finish(zpSuccess);
      }
      continue;
    }
    // A data fragment: bounds were fixed by the matching receive.
    if (h->offset != op->progressed || h->offset + h->len > op->bytes) {
      peerGone(p, zpInternalError, "corrupt fragment from rank " + std::to_string(p.rank), true);
      return true;
    }
    if (h->len && op->reduce)  // fragments hold whole elements: fragMax_ is a multiple of 64
      op->reduce->fn((char*)op->buf + h->offset, (const char*)op->reduceSrc + h->offset, (const char*)h + kRecord,
                     h->len);
    else if (h->len)
      memcpy((char*)op->buf + h->offset, (const char*)h + kRecord, h->len);  // buf may be NULL when empty
    op->progressed += h->len;
    if (ringPop(l.in, h)) p.dirty = true;
    if (op->progressed == op->bytes) {
      l.recvq.pop_front();
      op->finish(zpSuccess);
    }
  }
  return did;
}

bool ShmTransport::progressSend(Peer& p, int lane) {
  Lane& l = p.lane[lane];
  bool did = false;
  uint64_t need = 0;
  while (!l.sendq.empty()) {
    Op* op = l.sendq.front();
    if (op->metaBytes) {
      need = kRecord + roundRecord(op->metaBytes);
      MsgHdr* h = claimOpRecord(l.out, need, kMeta, op);
      if (!h) goto full;
      h->len = op->metaBytes;
      memcpy((char*)h + kRecord, op->meta, op->metaBytes);
      ringPublish(l.out);
      op->metaBytes = 0;  // sent
      p.dirty = did = true;
    }
    bool rendezvous = p.cma && op->bytes >= ctx_.cfg->shmEagerBytes;
    if (rendezvous) {
      need = kRecord;
      MsgHdr* h = claimOpRecord(l.out, need, kRts, op);
      if (!h) goto full;
      h->addr = (uint64_t)(uintptr_t)op->buf;
      ringPublish(l.out);
      l.finWait[op->seq] = op;
      l.sendq.pop_front();
      p.dirty = did = true;
      continue;
    }
    // Fragments through the ring; a zero-byte message is one empty fragment.
    do {
      size_t len = std::min(op->bytes - op->progressed, fragMax_);
      need = kRecord + roundRecord(len);
      MsgHdr* h = claimOpRecord(l.out, need, kData, op);
      if (!h) goto full;
      h->len = (uint32_t)len;
      h->offset = op->progressed;
      if (len) memcpy((char*)h + kRecord, (const char*)op->buf + op->progressed, len);
      ringPublish(l.out);
      op->progressed += len;
      p.dirty = did = true;
    } while (op->progressed < op->bytes);
    l.sendq.pop_front();
    op->finish(zpSuccess);
  }
  return did;
full:
  // Ask the receiver to ring when it frees room, then look once more in case
  // it did so before seeing the flag.
  l.out.ctl->producerWaiting.store(1, std::memory_order_seq_cst);
  if (ringClaim(l.out, need)) did = true;
  return did;
}

}  // namespace zp
