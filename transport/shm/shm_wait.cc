// Shared memory's waiting: the doorbell a writer rings (notify), and how a
// rank waits for its peers: it polls while a core is free or the tasks
// waiting for one are mostly the job's ranks, and where other tasks fill the
// cores it polls while its peers are on other CPUs and sleeps at once when
// one is on its own (wait, sleep; planSpin says why).
// The rest of the transport is in shm_transport.cc.
#include <fcntl.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "src/core/log.h"
#include "src/util/clock.h"
#include "transport/shm/shm_layout.h"
#include "transport/shm/shm_transport.h"

namespace zp {
namespace {

// The machine's runnable tasks of the moment: /proc/loadavg's fourth field,
// "runnable/threads", the calling thread included; -1 if it cannot be read.
// The file is not kept open (a communicator leaves no descriptor behind).
int runnableTasks() {
  int running = -1;
  char buf[128];
  const int fd = open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
  const ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf) - 1) : -1;
  if (fd >= 0) close(fd);
  if (n > 0) {
    buf[n] = 0;
    if (sscanf(buf, "%*f %*f %*f %d/", &running) != 1) running = -1;
  }
  return running;
}

}  // namespace

void ShmTransport::wakePeer(Peer& p) {
  p.seg->doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (p.seg->sleeping.load(std::memory_order_seq_cst))
    futex(&p.seg->doorbell, FUTEX_WAKE, INT32_MAX, nullptr);
  // A full socket (EAGAIN) holds bytes the sleeper has not taken yet: it is
  // woken already.
  if (p.seg->pollers.load(std::memory_order_seq_cst) && p.bellLen)
    sendto(bellFd_, "", 1, MSG_DONTWAIT | MSG_NOSIGNAL, (const sockaddr*)&p.bell, p.bellLen);
}

void ShmTransport::bellAddress(const std::string& segName, sockaddr_un* addr, socklen_t* len) {
  // An abstract name (a leading NUL): nothing in the file system to leave
  // behind, gone with the process. The segment's name is unique to the
  // job and rank.
  const std::string name = "zp-bell" + segName;
  *addr = {};
  addr->sun_family = AF_UNIX;
  const size_t n = std::min(name.size(), sizeof(addr->sun_path) - 1);
  memcpy(addr->sun_path + 1, name.data(), n);
  *len = (socklen_t)(offsetof(sockaddr_un, sun_path) + 1 + n);
}

void ShmTransport::openBell() {
  mine_->netns = 0;
  bellFd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (bellFd_ < 0) return;  // no bell: waits as before (a doorbell, the network polled between naps)
  sockaddr_un addr;
  socklen_t len;
  bellAddress(name_, &addr, &len);
  struct stat ns;
  // Abstract names belong to a network namespace: a peer can ring this bell
  // only from the same one (compared in connectBells).
  if (bind(bellFd_, (const sockaddr*)&addr, len) == 0 && stat("/proc/self/ns/net", &ns) == 0)
    mine_->netns = (uint64_t)ns.st_ino;
}

void ShmTransport::connectBells() {
  bellWorks_ = mine_->netns != 0;
  for (Peer& p : peers_) {
    if (p.seg->netns != 0) bellAddress(segName(p.rank), &p.bell, &p.bellLen);
    bellWorks_ &= p.seg->netns == mine_->netns;
  }
}

bool ShmTransport::inboundReady() const {
  for (const Peer& p : peers_) {
    if (ringFresh(p.inCtrl)) return true;
    for (const Lane& l : p.lane)
      if (ringFresh(l.in)) return true;
  }
  return false;
}

uint32_t ShmTransport::waitToken() const {
  return mine_ ? mine_->doorbell.load(std::memory_order_seq_cst) : 0;
}

bool ShmTransport::waitsForSingleCopy() const {
  if (!groups_.empty()) return true;
  for (const Peer& p : peers_) {
    for (const Lane& l : p.lane)
      if (!l.finWait.empty()) return true;
    // Not kLaneStanding's receives: they stand ready at all times.
    const std::deque<Op*>& recvq = p.lane[0].recvq;
    if (p.cma && !recvq.empty() && recvq.front()->bytes >= ctx_.cfg->shmEagerBytes) return true;
  }
  return false;
}

void ShmTransport::sampleLoad() const {
  // At most every 10 ms (a read is a few microseconds; a wait that ends
  // within a microsecond must not pay it each time). The node's sleeping
  // ranks are counted at the same moment as the machine's runnable tasks,
  // so that one can be taken from the other (planSpin).
  const uint64_t now = stampUs() / 1000;  // read at every wait: the cheap clock
  if (load_.read && now - load_.ms < 10) return;
  load_.read = true;
  load_.ms = now;
  load_.last = load_.now;
  load_.now.runnable = runnableTasks();
  load_.now.asleep = 0;
  for (const Peer& p : peers_) {
    if (!p.seg) continue;
    const uint32_t sleepers =
        p.seg->sleeping.load(std::memory_order_relaxed) + p.seg->pollers.load(std::memory_order_relaxed);
    load_.now.asleep += sleepers > 0;
  }
}

SpinInputs ShmTransport::loadInputs() const {
  sampleLoad();
  SpinInputs in;
  in.cores = cores_;
  in.localRanks = (int)peers_.size() + 1;
  in.hostRanks = hostRanks_;
  const LoadReading r = steadierReading(in, load_.last, load_.now);
  in.runnable = r.runnable;
  in.localAsleep = r.asleep;
  return in;
}

SpinPlan ShmTransport::spinPlan() const {
  SpinInputs in = loadInputs();
  // Only looked at where it matters (it walks every peer's lanes).
  in.singleCopy = oversubscribed_ && waitsForSingleCopy();
  in.spinUs = spinUs_;
  in.spinBusyUs = spinBusyUs_;
  in.recentWaitUs = waitMeanUs_;
  // The peers' CPUs only where they matter (not on the quiet path).
  in.loadedPolls = othersFillTheCores(in) && !peerOnMyCore();
  return planSpin(in);
}

void ShmTransport::noteWait(uint64_t us) {
  // A wait counts as at most a little over the longest busy poll: one long
  // wait then raises the mean, a run of them takes it past that poll.
  us = std::min<uint64_t>(us, (uint64_t)kBusySpinScale * spinBusyUs_ + 1);
  waitMeanUs_ = (7 * waitMeanUs_ + us) / 8;
}

namespace {
std::atomic<long> gSleepsForAPeerOnTheCore{0};
}  // namespace

long ShmTransport::sleepsForAPeerOnTheCore() { return gSleepsForAPeerOnTheCore.load(); }

bool ShmTransport::peerOnMyCore() const {
  // The peers' CPUs are as of their last such wait: a peer that moved since
  // is seen where it was until it waits again, which costs one wrong choice.
  const int cpu = sched_getcpu() + 1;
  if (mine_) mine_->waitCpu.store(cpu, std::memory_order_relaxed);
  for (const Peer& p : peers_)
    if (!p.gone && p.seg && p.seg->waitCpu.load(std::memory_order_relaxed) == cpu) {
      gSleepsForAPeerOnTheCore.fetch_add(1, std::memory_order_relaxed);
      return true;
    }
  return false;
}

void ShmTransport::wait(uint32_t token, int ms, const std::function<bool()>& elsewhere, int fd, bool poll) {
  if (!mine_) return;
  // Poll first: within a call the answer usually comes sooner than a futex
  // sleep and wake-up (spinPlan says how long, and whether each poll yields).
  // With a core for every rank of the node a poll does not yield: a peer
  // never waits for this rank's core, and a sched_yield per poll (a system
  // call, and a task switch when anything else is runnable) was most of a
  // small message's latency. Open MPI's shared memory polls the same way.
  const SpinPlan plan = poll ? spinPlan() : SpinPlan{0, false};
  // The deadline is set at the first look at the clock, 16 polls in: most
  // waits of a small message end sooner, without reading the clock at all
  // (they count as 0 us in the mean of waits, noteWait).
  uint64_t started = 0, spinUntil = 0;
  for (int i = 0; plan.us > 0; i++) {
    if (mine_->doorbell.load(std::memory_order_acquire) != token || inboundReady()) {
      const uint64_t us = started ? stampUs() - started : 0;
      noteWait(us);
      return;
    }
    if ((i & 15) == 15) {
      if (elsewhere && elsewhere()) return;
      const uint64_t now = stampUs();
      if (spinUntil == 0) {
        started = now;
        spinUntil = now + plan.us;
      }
      if (now > spinUntil) break;
    }
    if (plan.yield)
      sched_yield();
    else
      cpuRelax();
  }
  if (elsewhere && elsewhere()) return;
  if (!started) started = stampUs();
  const bool rang = fd >= 0 && bellWorks_ ? sleepWith(token, ms, fd) : sleep(token, ms);
  const uint64_t us = stampUs() - started;
  noteWait(us);
  if (!rang) checkAlive();
}

bool ShmTransport::sleep(uint32_t token, int ms) {
  if (!mine_) return true;
  mine_->sleeping.fetch_add(1, std::memory_order_seq_cst);
  if (inboundReady()) {  // came before the writer could see this rank asleep (notify)
    mine_->sleeping.fetch_sub(1, std::memory_order_relaxed);
    return true;
  }
  timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000};
  long rc = futex(&mine_->doorbell, FUTEX_WAIT, token, &ts);
  int err = errno;
  mine_->sleeping.fetch_sub(1, std::memory_order_relaxed);
  return !(rc != 0 && err == ETIMEDOUT);
}

bool ShmTransport::sleepWith(uint32_t token, int ms, int fd) {
  // As sleep, with the doorbell's token compared here instead of by the
  // futex: a writer that bumped it before it could see this rank counted
  // among the pollers is seen below.
  mine_->pollers.fetch_add(1, std::memory_order_seq_cst);
  if (inboundReady() || mine_->doorbell.load(std::memory_order_seq_cst) != token) {
    mine_->pollers.fetch_sub(1, std::memory_order_relaxed);
    return true;
  }
  pollfd fds[2] = {{bellFd_, POLLIN, 0}, {fd, POLLIN, 0}};
  const int n = ::poll(fds, 2, ms);
  mine_->pollers.fetch_sub(1, std::memory_order_relaxed);
  // Rung (perhaps more than once, or after the poll ended): empty it.
  char drain[64];
  while (recv(bellFd_, drain, sizeof(drain), MSG_DONTWAIT) > 0) {
  }
  return n != 0;
}

}  // namespace zp
