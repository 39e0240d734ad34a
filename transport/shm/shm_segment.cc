// The shared-memory transport's segments: making and reserving this rank's
// (create, init), mapping the local peers' once they all exist (connect,
// mapPeer), telling them of a failure, and unmapping at the end.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>

#include <cstdio>

#include "src/core/log.h"
#include "src/core/params.h"
#include "src/util/clock.h"
#include "transport/shm/shm_layout.h"

namespace zp {

namespace {

// Maps [addr, addr + len)'s pages now (MADV_POPULATE_WRITE, Linux 5.14 on),
// best effort: otherwise a ring's first lap takes a page fault in both
// processes every 4 KiB of messages, which more than doubled a small
// message's time until the ring had gone round once (2 MiB of traffic per
// pair by default).
void prefault(void* addr, size_t len) {
#ifdef MADV_POPULATE_WRITE
  const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
  const uintptr_t from = (uintptr_t)addr & ~(page - 1), to = (uintptr_t)addr + len;
  madvise((void*)from, to - from, MADV_POPULATE_WRITE);
#else
  (void)addr;
  (void)len;
#endif
}

std::atomic<int> gNodeCores{0};  // ShmTransport::nodeCoresCounted()

}  // namespace

int ShmTransport::nodeCoresCounted() { return gNodeCores.load(); }

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

uint64_t ShmTransport::ownerKey(int rank) const {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a over the id's secret and the rank
  for (uint8_t b : ctx_.id->secret) h = (h ^ b) * 0x100000001b3ull;
  for (int i = 0; i < 4; i++) h = (h ^ (uint8_t)(rank >> (8 * i))) * 0x100000001b3ull;
  return h;
}

zpResult_t ShmTransport::createUnnamed(int* out) {
  // A file of /dev/shm's tmpfs that never has a name: /dev/shm's size
  // bounds it as before, and nothing is left there however the processes
  // end (a named segment, until every local rank had opened it, stayed
  // behind when the whole job was killed then). Local peers open it
  // through /proc/<pid>/fd/<fd> (mapPeer).
  int fd = open("/dev/shm", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (fd < 0 && (errno == EOPNOTSUPP || errno == EISDIR || errno == EINVAL)) {
    // No O_TMPFILE here (a kernel before 3.11, a /dev/shm that is not
    // tmpfs): a name for as long as it takes to remove it again.
    fd = shm_open(name_.c_str(), O_CREAT | O_EXCL | O_RDWR | O_CLOEXEC, 0600);
    if (fd >= 0) shm_unlink(name_.c_str());
  }
  if (fd < 0) {
    const int e = errno;
    return fail(zpSystemError, "rank %d: cannot create its shared memory in /dev/shm: %s", ctx_.rank, strerror(e));
  }
  *out = fd;
  return zpSuccess;
}

std::string ShmTransport::address() const {
  const int64_t fd = fd_;
  return std::string((const char*)&ctx_.cfg->shmRingBytes, sizeof(uint64_t)) + std::string((const char*)&fd, sizeof(fd));
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
  spinBusyUs_ = cfg.shmSpinBusyUs;
  // zprun's count of the job's ranks on this machine (its range checked):
  // not part of the configuration, since only this waiting reads it.
  long long hostRanks = 0;
  ZP_CHECK(paramInt("ZP_HOST_RANKS", &hostRanks));
  hostRanks_ = (int)hostRanks;
  if (nlocal == 1) return zpSuccess;

  // This rank's CPUs, published in its segment; connect counts the node's.
  uint64_t cpus[kCpuMaskWords] = {};
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int i = 0; i < kCpuMaskWords * 64 && i < CPU_SETSIZE; i++)
      if (CPU_ISSET(i, &set)) cpus[i / 64] |= 1ull << (i % 64);
  } else {
    const long online = std::min<long>(sysconf(_SC_NPROCESSORS_ONLN), kCpuMaskWords * 64);
    for (long i = 0; i < online; i++) cpus[i / 64] |= 1ull << (i % 64);
  }

  // This rank's segment. Every rank of the node makes one of the same size.
  name_ = segName(c.rank);
  segBytes_ = segmentBytes(nlocal, ringBytes_);
  struct statvfs vfs;
  const bool sized = statvfs("/dev/shm", &vfs) == 0 && vfs.f_blocks > 0;  // 0 blocks: no limit
  const double shmSize = sized ? (double)vfs.f_blocks * vfs.f_frsize : 0;
  auto mib = [](double bytes) {
    char buf[32];
    snprintf(buf, sizeof(buf), "%.1f MiB", bytes / (1 << 20));
    return std::string(buf);
  };
  // A /dev/shm too small for the rings asked for (a container's 64 MiB):
  // smaller rings, down to kMinShmRingBytes, rather than no communicator.
  // From /dev/shm's size, not its free space, so that every rank of the node
  // picks the same size however their reservations interleave.
  while (sized && (double)nlocal * segmentBytes(nlocal, ringBytes_) > shmSize && ringBytes_ / 2 >= kMinShmRingBytes)
    ringBytes_ /= 2;
  if (ringBytes_ != cfg.shmRingBytes) {
    fragMax_ = std::min<size_t>(ringBytes_ / 4, 256 << 10);
    segBytes_ = segmentBytes(nlocal, ringBytes_);
    if (myLocalIdx_ == 0)  // one warning per node
      ZP_WARN(kSubShm,
              "/dev/shm holds %s, too little for %u ranks with ZP_SHM_RING_BYTES=%zu: using %llu-byte rings "
              "(%s of /dev/shm); make /dev/shm larger (docker run --shm-size=...) for the full rings",
              mib(shmSize).c_str(), nlocal, cfg.shmRingBytes, (unsigned long long)ringBytes_,
              mib((double)nlocal * segBytes_).c_str());
  }
  const double nodeBytes = (double)nlocal * segBytes_;
  const std::string needs = "the " + std::to_string(nlocal) + " ranks on this node need " + mib(nodeBytes) +
                            " of it (" + std::to_string(nlocal) + " segments of " + mib((double)segBytes_) +
                            ", with ZP_SHM_RING_BYTES=" + std::to_string(ringBytes_) + ")";
  const char* advice = "make /dev/shm larger (docker run --shm-size=...) or ZP_SHM_RING_BYTES smaller";
  // Bound to fail on every rank alike: say so before taking any of it.
  if (sized && nodeBytes > shmSize)
    return fail(zpSystemError, "rank %d: /dev/shm is too small for shared memory: it holds %s, and %s; %s", c.rank,
                mib(shmSize).c_str(), needs.c_str(), advice);
  int fd = -1;
  ZP_CHECK(createUnnamed(&fd));
  // Reserve every page now: ftruncate alone gives a file whose pages tmpfs
  // finds only when they are first touched, and one it cannot back then
  // kills the toucher with SIGBUS.
  int e;
  while ((e = posix_fallocate(fd, 0, segBytes_)) == EINTR) {
  }
  if (e != 0) {
    close(fd);
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
  if (base == MAP_FAILED) {
    close(fd);
    return fail(zpSystemError, "rank %d: mmap of %zu bytes of shared memory failed: %s", c.rank, segBytes_,
                strerror(e));
  }
  prefault(base, segBytes_);  // the rings every local peer writes here
  mine_ = (SegHeader*)base;
  mine_->magic = kSegMagic;
  mine_->nlocal = nlocal;
  mine_->ringBytes = ringBytes_;
  mine_->ownerBase = (uint64_t)(uintptr_t)base;
  mine_->probe = kProbeValue;
  mine_->owner = ownerKey(c.rank);
  memcpy(mine_->cpus, cpus, sizeof(cpus));
  fd_ = fd;  // until every local peer has opened it (connect)
  openBell();
  mine_->ready.store(1, std::memory_order_release);
  return zpSuccess;
}

zpResult_t ShmTransport::mapPeer(Peer& p) {
  const TransportContext& c = ctx_;
  const char* name = p.segPath.c_str();
  // Every local peer made its segment before the bootstrap round that came
  // before this, and keeps it open until every local rank has mapped it:
  // any failure here is final.
  int fd = p.segFd >= 0 ? open(name, O_RDWR | O_CLOEXEC) : -1;
  if (fd < 0) {
    const int e = p.segFd >= 0 ? errno : ENOENT;
    if (processExited(p.pid, p.pidfd)) return fail(zpRemoteError, "rank %d (pid %d) died during init", p.rank, p.pid);
    if (e == ENOENT)
      return fail(zpRemoteError,
                  "rank %d: local rank %d's shared memory %s is gone: that rank gave up its init (its error says "
                  "why), or it runs in another PID namespace (another container; ZP_NODE_ID tells such ranks apart)",
                  c.rank, p.rank, name);
    const bool denied = e == EACCES || e == EPERM;
    return fail(zpSystemError, "rank %d: cannot open local rank %d's shared memory %s: %s%s", c.rank, p.rank, name,
                strerror(e),
                denied ? " (the ranks of a node open each other's segments through /proc: they must run as one "
                         "user, with a /proc that shows each other's processes)"
                       : "");
  }
  struct stat st;
  const size_t bytes = fstat(fd, &st) == 0 ? (size_t)st.st_size : 0;
  void* base =
      bytes >= sizeof(SegHeader) ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
  const int e = errno;
  close(fd);
  if (base == MAP_FAILED)
    return fail(zpSystemError, "rank %d: cannot map local rank %d's shared memory %s (%zu bytes): %s", c.rank,
                p.rank, name, bytes, bytes >= sizeof(SegHeader) ? strerror(e) : "too small");
  SegHeader* s = (SegHeader*)base;
  zpResult_t res = zpSuccess;
  if (s->magic != kSegMagic || s->ready.load(std::memory_order_acquire) != 1 || s->owner != ownerKey(p.rank))
    res = fail(zpInternalError,
               "rank %d: %s is not local rank %d's shared memory of this communicator, ready for use (was pid %d "
               "reused?)",
               c.rank, name, p.rank, p.pid);
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
  // The rings this rank writes there: its slot's.
  Lane lanes[kLanes];
  Ring ctrl;
  locateRings(base, s->nlocal, ringBytes_, myLocalIdx_, lanes, false, &ctrl);
  prefault(lanes[0].out.buf, ctrl.buf + ctrl.cap - lanes[0].out.buf);
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

zpResult_t ShmTransport::connect(const std::vector<std::string>& addresses) {
  std::vector<uint64_t> ringBytes(addresses.size(), 0);
  std::vector<int64_t> fds(addresses.size(), -1);
  for (size_t r = 0; r < addresses.size(); r++)
    if (addresses[r].size() == sizeof(uint64_t) + sizeof(int64_t)) {
      memcpy(&ringBytes[r], addresses[r].data(), sizeof(uint64_t));
      memcpy(&fds[r], addresses[r].data() + sizeof(uint64_t), sizeof(int64_t));
    }
  return connect(ringBytes, fds);
}

zpResult_t ShmTransport::connect(const std::vector<uint64_t>& ringBytes, const std::vector<int64_t>& fds) {
  const TransportContext& c = ctx_;
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
    if (res == zpSuccess && ringBytes[r] != c.cfg->shmRingBytes)  // the settings (ringBytes_ may be smaller: init)
      res = fail(zpInvalidUsage,
                 "rank %d: ZP_SHM_RING_BYTES differs between the ranks of node '%s': it is %llu on rank %d and %llu "
                 "on rank %d; it must be the same on every rank",
                 c.rank, c.cfg->nodeId.c_str(), (unsigned long long)c.cfg->shmRingBytes, c.rank,
                 (unsigned long long)ringBytes[r], r);
  for (uint32_t i = 0; i < nlocal && res == zpSuccess; i++) {
    if ((int)i == myLocalIdx_) continue;
    Peer np;
    np.rank = local_[i];
    np.localIdx = (int)i;
    np.pid = (*c.ranks)[np.rank].pid;
    np.pidfd = pidfdOpen(np.pid);
    np.segFd = fds[np.rank] >= 0 && fds[np.rank] <= INT32_MAX ? (int)fds[np.rank] : -1;
    np.segPath = "/proc/" + std::to_string(np.pid) + "/fd/" + std::to_string(np.segFd);
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
  // Wait until every local peer has mapped this segment; then nobody needs
  // its descriptor any more.
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
  close(fd_);
  fd_ = -1;
  connected_ = true;
  connectBells();
  // The node's cores: what its ranks' masks cover together (coresOfMasks).
  std::vector<const uint64_t*> masks = {mine_->cpus};
  for (const Peer& p : peers_) masks.push_back(p.seg->cpus);
  cores_ = std::max(coresOfMasks(masks.data(), (int)masks.size()), 1);
  oversubscribed_ = (int)nlocal > cores_;
  gNodeCores.store(cores_);
  ZP_INFO(kSubShm | kSubInit, "rank %d: %u ranks on this node, %d core%s in their CPU masks together%s", c.rank,
          nlocal, cores_, cores_ == 1 ? "" : "s", oversubscribed_ ? ": more ranks than cores" : "");

  const Config& cfg = *c.cfg;
  mine_->eagerBytes = cfg.shmEagerBytes;
  mine_->reduceCopyFrom = cfg.shmReduceCopyFrom;
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
  // Init failed here, so the communicator cannot form: peers still waiting
  // for this rank stop at once.
  if (mine_ && !connected_) publishFailure("rank " + std::to_string(ctx_.rank) + " gave up its init");
  if (fd_ >= 0) close(fd_);
  for (Peer& p : peers_) {
    if (p.seg) munmap(p.seg, p.segBytes);
    if (p.pidfd >= 0) close(p.pidfd);
  }
  if (bellFd_ >= 0) close(bellFd_);
  if (mine_) munmap(mine_, segBytes_);
}

}  // namespace zp
