#include "src/core/bootstrap.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <functional>
#include <map>
#include <thread>

#include "src/core/config.h"
#include "src/core/log.h"
#include "src/core/socket.h"
#include "src/util/clock.h"

namespace zp {

namespace {

// What the root answers each rank: a status, and on success the whole table.
struct JoinReply {
  uint32_t magic;
  int32_t status;  // zpResult_t
  char message[256];
};

// A connection to the root that has not presented a full, valid header yet.
struct Pending {
  int fd;
  uint64_t acceptedMs;
  uint64_t deadlineMs;
  size_t got = 0;
  JoinHeader hdr;
  std::string peer;    // address and port, for the log
  std::string source;  // address only: the bound per source
  bool knowsSecret = false;  // its secret matched: a real rank, never evicted
};

// Limit on one rank's transport address (second round).
constexpr uint32_t kMaxBlob = 64 << 10;

// A connection that hands over less than a header within this time is dropped:
// a real rank sends its header right after connecting.
constexpr int kHeaderTimeoutMs = 10000;
// Connections that have not shown the secret yet: at most this many in all
// and from one address; a new one beyond either bound evicts the oldest
// (idle ones age, a real rank's header arrives at once), so that strangers
// never crowd out a rank. An evicted rank is told to retry (kBusyStatus).
constexpr size_t kMaxPending = 4096;
constexpr size_t kMaxPendingPerSource = 512;
// New connections taken per turn of the loop (their headers are read on the next).
constexpr int kAcceptBatch = 64;
// accept4 out of descriptors (EMFILE, ENFILE): the listening socket rests
// this long instead of being polled again at once (it stays readable).
constexpr int kAcceptPauseMs = 100;
// The status of a reply that asks a rank to connect again.
constexpr int32_t kBusyStatus = zpInProgress;
// After ranks of two jobs met at one root: for how long (at most) it goes on
// refusing the id's ranks that come later, so that they fail at once too.
constexpr uint64_t kRefuseLateMs = 30000;

void sendReply(int fd, zpResult_t status, const std::string& msg,
               const std::vector<RankInfo>* table, uint64_t deadlineMs) {
  JoinReply r;
  memset(&r, 0, sizeof(r));
  r.magic = kIdMagic;
  r.status = status;
  snprintf(r.message, sizeof(r.message), "%s", msg.c_str());
  if (sendAll(fd, &r, sizeof(r), deadlineMs) != zpSuccess) return;
  if (table) sendAll(fd, table->data(), table->size() * sizeof(RankInfo), deadlineMs);
}

// One line per second at most about dropped connections (a flood of
// strangers must not flood the log), with how many went unmentioned.
class DropLog {
 public:
  void note(const std::string& peer, const char* why) {
    uint64_t now = nowMs();
    if (lastMs_ && now - lastMs_ < 1000) {
      unlogged_++;
      return;
    }
    if (unlogged_)
      ZP_WARN(kSubBootstrap, "bootstrap root: dropped connection from %s: %s (and %llu more since the last such line)",
              peer.c_str(), why, (unsigned long long)unlogged_);
    else
      ZP_WARN(kSubBootstrap, "bootstrap root: dropped connection from %s: %s", peer.c_str(), why);
    lastMs_ = now;
    unlogged_ = 0;
  }
  void flush() {
    if (unlogged_) ZP_WARN(kSubBootstrap, "bootstrap root: dropped %llu more connections", (unsigned long long)unlogged_);
    unlogged_ = 0;
  }

 private:
  uint64_t lastMs_ = 0;
  uint64_t unlogged_ = 0;
};

std::string sourceOf(const sockaddr_storage& a) {
  std::string s = addrToString(a);
  size_t colon = s.rfind(':');  // "host:port" or "[v6]:port"
  return colon == std::string::npos ? s : s.substr(0, colon);
}

// New connections on listenFd, a batch of them: each pending until its
// header comes, within the bounds on pending connections (evictOldest makes
// room); out of descriptors, the listening socket rests (*listenPausedUntil).
void acceptConnections(int listenFd, std::vector<Pending>* pendingOut, std::map<std::string, size_t>* perSourceOut,
                       DropLog* dropLogOut, uint64_t* listenPausedUntil,
                       const std::function<bool(const std::string*, const char*)>& evictOldest) {
  std::vector<Pending>& pending = *pendingOut;
  std::map<std::string, size_t>& perSource = *perSourceOut;
  DropLog& dropLog = *dropLogOut;
  for (int a = 0; a < kAcceptBatch; a++) {
    sockaddr_storage from;
    socklen_t len = sizeof(from);
    int fd = accept4(listenFd, (sockaddr*)&from, &len, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: the oldest stranger makes room for the
        // next in the queue (a rank may be behind it); with none to
        // evict, the listening socket rests: it stays readable, and
        // polling it again at once would spin.
        if (evictOldest(nullptr, "evicted: the root is out of file descriptors")) continue;
        dropLog.note("the listening socket", strerror(errno));
        *listenPausedUntil = nowMs() + kAcceptPauseMs;
      }
      break;  // EAGAIN: none left; ECONNABORTED and the like: next turn
    }
    Pending p;
    p.fd = fd;
    p.acceptedMs = nowMs();
    p.deadlineMs = p.acceptedMs + kHeaderTimeoutMs;
    p.peer = addrToString(from);
    p.source = sourceOf(from);
    if (perSource[p.source] >= kMaxPendingPerSource)
      evictOldest(&p.source, "evicted: too many connections without a header from this address");
    else if (pending.size() >= kMaxPending)
      evictOldest(nullptr, "evicted: too many connections without a header");
    if (pending.size() >= kMaxPending) {  // every one knows the secret (cannot happen with real ranks)
      dropLog.note(p.peer, "refused: too many ranks connecting at once");
      close(fd);
      continue;
    }
    perSource[p.source]++;
    pending.push_back(std::move(p));
  }
}

// The end of a rendezvous (failure empty: every rank joined): each joined
// rank gets the table or the failure, then, on success, the second round
// (every rank's blob to every rank); the ranks' sockets close.
void answerRanks(const std::vector<int>& rankFd, const std::vector<RankInfo>& table, int rankTimeoutMs,
                 std::string failure, zpResult_t failStatus) {
  uint64_t replyDeadline = nowMs() + 30000;
  for (int r = 0; r < (int)rankFd.size(); r++) {
    if (rankFd[r] < 0) continue;
    if (failure.empty()) sendReply(rankFd[r], zpSuccess, "", &table, replyDeadline);
    else sendReply(rankFd[r], failStatus, failure, nullptr, replyDeadline);
  }
  if (failure.empty()) {
    // Second round: every rank's transport address (UCX worker address),
    // which a rank only creates once the table says it has remote peers.
    std::vector<std::string> blobs(rankFd.size());
    uint64_t roundDeadline = nowMs() + (uint64_t)std::max(rankTimeoutMs, 1000);
    for (int r = 0; r < (int)rankFd.size() && failure.empty(); r++) {
      uint32_t len = 0;
      if (recvAll(rankFd[r], &len, sizeof(len), roundDeadline) != zpSuccess || len > kMaxBlob) {
        failure = "rank " + std::to_string(r) + " left during the address exchange";
        break;
      }
      blobs[r].resize(len);
      if (len && recvAll(rankFd[r], &blobs[r][0], len, roundDeadline) != zpSuccess)
        failure = "rank " + std::to_string(r) + " left during the address exchange";
    }
    std::string all;
    if (failure.empty())
      for (auto& b : blobs) {
        uint32_t len = (uint32_t)b.size();
        all.append((const char*)&len, sizeof(len));
        all += b;
      }
    for (int r = 0; r < (int)rankFd.size(); r++) {
      int32_t ok = failure.empty() ? 1 : 0;
      if (sendAll(rankFd[r], &ok, sizeof(ok), replyDeadline) == zpSuccess && ok)
        sendAll(rankFd[r], all.data(), all.size(), replyDeadline);
    }
  }
  for (int fd : rankFd)
    if (fd >= 0) close(fd);
  if (!failure.empty()) ZP_WARN(kSubBootstrap, "bootstrap root: %s", failure.c_str());
}

// Tells every joined rank that the rendezvous failed, and lets it go.
void failJoined(std::vector<int>* rankFd, zpResult_t status, const std::string& why) {
  for (int& fd : *rankFd) {
    if (fd < 0) continue;
    sendReply(fd, status, why, nullptr, nowMs() + 1000);
    close(fd);
    fd = -1;
  }
}

// Serves one communicator's rendezvous, then returns.
void rootMain(int listenFd, IdLayout id) {
  std::vector<Pending> pending;  // in order of arrival
  std::map<std::string, size_t> perSource;  // pending connections by source address
  std::vector<int> rankFd;  // by rank, -1 until joined
  std::vector<RankInfo> table;
  JoinHeader first;  // the first rank's header: the others must be of its job
  // Ranks of two jobs met here (failure says so): every rank of the id that
  // comes until refuseUntil is told the same.
  bool refusing = false;
  uint64_t refuseUntil = 0;
  zpResult_t failStatus = zpRemoteError;
  int nranks = -1, joined = 0;
  uint64_t joinDeadline = UINT64_MAX;  // set by the first rank, from its timeout
  uint64_t listenPausedUntil = 0;
  int rankTimeoutMs = 0;
  std::string failure;
  DropLog dropLog;
  // Accepts come in batches until the queue is empty: never block in one.
  fcntl(listenFd, F_SETFL, fcntl(listenFd, F_GETFL) | O_NONBLOCK);

  auto forget = [&](size_t i) {
    auto it = perSource.find(pending[i].source);
    if (it != perSource.end() && --it->second == 0) perSource.erase(it);
    pending.erase(pending.begin() + i);
  };
  auto dropPending = [&](size_t i, const char* why) {
    dropLog.note(pending[i].peer, why);
    close(pending[i].fd);
    forget(i);
  };
  // Makes room by dropping the oldest connection that has not shown the
  // secret (from `source` if given); false if there is none.
  auto evictOldest = [&](const std::string* source, const char* why) {
    for (size_t i = 0; i < pending.size(); i++) {
      if (pending[i].knowsSecret || (source && pending[i].source != *source)) continue;
      // In case it is a rank whose header is still on its way: ask it to retry.
      JoinReply r;
      memset(&r, 0, sizeof(r));
      r.magic = kIdMagic;
      r.status = kBusyStatus;
      snprintf(r.message, sizeof(r.message), "the bootstrap root is busy: connect again");
      (void)!send(pending[i].fd, &r, sizeof(r), MSG_DONTWAIT | MSG_NOSIGNAL);
      dropPending(i, why);
      return true;
    }
    return false;
  };

  while (refusing ? nowMs() < refuseUntil : failure.empty() && (nranks < 0 || joined < nranks)) {
    uint64_t now = nowMs();
    bool listening = now >= listenPausedUntil;
    std::vector<pollfd> fds;
    fds.push_back({listening ? listenFd : -1, POLLIN, 0});
    for (auto& p : pending) fds.push_back({p.fd, POLLIN, 0});
    for (int fd : rankFd)
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});  // a joined rank that closes has died
    uint64_t next = refusing ? refuseUntil : joinDeadline;
    for (auto& p : pending) next = std::min(next, p.deadlineMs);
    if (!listening) next = std::min(next, listenPausedUntil);
    int waitMs = next == UINT64_MAX ? 1000 : (int)std::min<uint64_t>(next > now ? next - now : 0, 1000);
    int rc = poll(fds.data(), fds.size(), waitMs);
    if (rc < 0 && errno != EINTR) { failure = std::string("poll: ") + strerror(errno); break; }
    now = nowMs();
    if (!refusing && now >= joinDeadline) {
      failure = "timed out: only " + std::to_string(joined) + " of " + std::to_string(nranks) +
                " ranks joined";
      break;
    }
    // Joined ranks: any readable event means the rank went away.
    size_t k = 1 + pending.size();
    for (int r = 0; r < (int)rankFd.size(); r++) {
      if (rankFd[r] < 0) continue;
      if (fds[k++].revents) failure = "rank " + std::to_string(r) + " disconnected before all ranks joined";
    }
    // Pending connections: read what is there, validate full headers.
    for (size_t i = pending.size(); i-- > 0;) {
      Pending& p = pending[i];
      if (fds[1 + i].revents) {
        ssize_t n = recv(p.fd, (char*)&p.hdr + p.got, sizeof(JoinHeader) - p.got, MSG_DONTWAIT);
        if (n <= 0 && !(n < 0 && (errno == EAGAIN || errno == EINTR))) {
          dropPending(i, "closed before sending a complete header");
          continue;
        }
        if (n > 0) p.got += n;
        std::string err;
        JoinCheck check = checkJoinHeader(p.hdr, p.got, id.secret, nranks, rankFd, &err, nranks < 0 ? nullptr : &first);
        if (check == JoinCheck::kStranger) {
          dropPending(i, err.c_str());
          continue;
        }
        p.knowsSecret = p.got >= offsetof(JoinHeader, nranks);
        if (check == JoinCheck::kIncomplete) continue;
        const JoinHeader& h = p.hdr;
        int r = h.info.rank;
        if (refusing || check == JoinCheck::kConflict) {
          if (!refusing) {
            // The joined ranks hear it now, and so does every rank of the
            // id that comes until refuseUntil.
            failure = err;
            failStatus = zpInvalidUsage;
            refusing = true;
            refuseUntil = now + std::min<uint64_t>(std::max(rankTimeoutMs, (int)std::max(h.timeoutMs, 1000)), kRefuseLateMs);
            failJoined(&rankFd, failStatus, failure);
            joined = 0;
          }
          sendReply(p.fd, failStatus, failure, nullptr, nowMs() + 1000);
          close(p.fd);
          forget(i);
          continue;
        }
        if (check == JoinCheck::kInvalid) {
          ZP_WARN(kSubBootstrap, "bootstrap root: refused %s: %s", p.peer.c_str(), err.c_str());
          sendReply(p.fd, zpInvalidUsage, err, nullptr, nowMs() + 1000);
          close(p.fd);
          forget(i);
          continue;
        }
        if (nranks < 0) {
          first = h;
          nranks = h.nranks;
          rankFd.assign(nranks, -1);
          table.resize(nranks);
        }
        table[r] = h.info;
        rankFd[r] = p.fd;
        joined++;
        // The ranks give up after their timeout; so does the root.
        if (joinDeadline == UINT64_MAX) joinDeadline = now + (uint64_t)std::max(h.timeoutMs, 1000);
        rankTimeoutMs = std::max(rankTimeoutMs, (int)h.timeoutMs);
        ZP_TRACE(kSubBootstrap, "bootstrap root: rank %d/%d joined from %s", r, nranks, p.peer.c_str());
        forget(i);
        continue;
      }
      if (now >= p.deadlineMs) dropPending(i, "no complete header in time");
    }
    // New connections, a batch per turn.
    if (listening && (fds[0].revents & POLLIN))
      acceptConnections(listenFd, &pending, &perSource, &dropLog, &listenPausedUntil, evictOldest);
  }
  dropLog.flush();

  for (auto& p : pending) close(p.fd);
  close(listenFd);
  answerRanks(rankFd, table, rankTimeoutMs, failure, failStatus);
}

}  // namespace

JoinCheck checkJoinHeader(const JoinHeader& h, size_t got, const uint8_t secret[16], int nranks,
                          const std::vector<int>& rankFd, std::string* why, const JoinHeader* first) {
  // Garbage is rejected as soon as the magic, then the secret, is readable.
  if (got >= sizeof(uint32_t) && h.magic != kIdMagic) {
    *why = "bad magic (not a Zeppelin rank)";
    return JoinCheck::kStranger;
  }
  if (got >= offsetof(JoinHeader, nranks) && memcmp(h.secret, secret, sizeof(h.secret)) != 0) {
    *why = "wrong secret (a rank of another communicator, or a stranger)";
    return JoinCheck::kStranger;
  }
  if (got < sizeof(JoinHeader)) return JoinCheck::kIncomplete;
  int r = h.info.rank;
  if (h.nranks <= 0 || h.nranks > (1 << 20)) *why = "bad nranks " + std::to_string(h.nranks);
  else if (r < 0 || r >= h.nranks) *why = "rank " + std::to_string(r) + " out of range [0," + std::to_string(h.nranks) + ")";
  else if (h.timeoutMs <= 0) *why = "bad timeout " + std::to_string(h.timeoutMs) + " ms";
  else if (strnlen(h.job, sizeof(h.job)) == sizeof(h.job)) *why = "a job identity without its end";
  if (!why->empty()) return JoinCheck::kInvalid;
  // A rank that cannot be of the job of those that joined: one id, two jobs.
  const std::string twoJobs = "two jobs use one unique id (give each job its own id from zpGetUniqueId)";
  const std::string job(h.job, strnlen(h.job, sizeof(h.job)));
  if (nranks >= 0 && h.nranks != nranks)
    *why = "rank " + std::to_string(r) + " says nranks=" + std::to_string(h.nranks) + ", earlier ranks said " +
           std::to_string(nranks) + ": " + twoJobs + ", or the ranks disagree";
  else if (nranks >= 0 && (r >= (int)rankFd.size() || rankFd[r] >= 0))
    *why = "rank " + std::to_string(r) + " joined twice: " + twoJobs + ", or two processes say they are rank " +
           std::to_string(r);
  else if (first && job != std::string(first->job, strnlen(first->job, sizeof(first->job))))
    *why = "rank " + std::to_string(r) + " is of job '" + job.substr(0, 60) + "', rank " +
           std::to_string(first->info.rank) + " of job '" + std::string(first->job).substr(0, 60) + "': " + twoJobs +
           "; ranks of one job from separate launches need ZP_JOB_ID set alike";
  return why->empty() ? JoinCheck::kComplete : JoinCheck::kConflict;
}

std::string jobIdentity() {
  const std::string own = envString("ZP_JOB_ID");
  std::string out = own.empty() ? "" : "ZP_JOB_ID=" + own;
  auto digest = [](const std::string& text) {  // FNV-1a, in hex
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ull;
    char buf[20];
    snprintf(buf, sizeof(buf), "%016llx", (unsigned long long)h);
    return std::string(buf);
  };
  if (own.empty()) {
    // zprun makes a random id per job and gives it every rank.
    const std::string zprunId = envString("ZP_UNIQUE_ID");
    if (!zprunId.empty()) out = "zprun " + digest(zprunId).substr(0, 12);
    for (const char* v : {"SLURM_JOB_ID", "SLURM_STEP_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
                          "TORCHELASTIC_RUN_ID", "LSB_JOBID", "PBS_JOBID"}) {
      const std::string value = envString(v);
      if (!value.empty()) out += (out.empty() ? "" : " ") + std::string(v) + "=" + value;
    }
  }
  if (out.size() >= sizeof(JoinHeader::job)) out = out.substr(0, 60) + "... (" + digest(out) + ")";
  return out;
}

sockaddr_storage idAddress(const IdLayout& id) {
  sockaddr_storage s;
  memset(&s, 0, sizeof(s));
  memcpy(&s, &id.addr, sizeof(id.addr));
  return s;
}

void setIdAddress(IdLayout* id, const sockaddr_storage& addr) {
  memcpy(&id->addr, &addr, sizeof(id->addr));
}

bool decodeId(const zpUniqueId& id, IdLayout* out) {
  memcpy(out, id.internal, sizeof(IdLayout));
  if (out->magic != kIdMagic || out->version != kIdVersion) return false;
  return out->addr.sin6_family == AF_INET || out->addr.sin6_family == AF_INET6;
}

zpUniqueId encodeId(const IdLayout& layout) {
  zpUniqueId id;
  memset(&id, 0, sizeof(id));
  memcpy(id.internal, &layout, sizeof(layout));
  return id;
}

std::string idToHex(const zpUniqueId& id) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (unsigned char c : id.internal) {
    s += kHex[c >> 4];
    s += kHex[c & 15];
  }
  return s;
}

bool idFromHex(const std::string& hex, zpUniqueId* id) {
  if (hex.size() != 2 * sizeof(id->internal)) return false;
  auto nib = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < sizeof(id->internal); i++) {
    int hi = nib(hex[2 * i]), lo = nib(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    id->internal[i] = (char)(hi << 4 | lo);
  }
  return true;
}

static zpResult_t startRootOn(IdLayout layout, zpUniqueId* idOut) {
  int fd = -1;
  sockaddr_storage addr = idAddress(layout);
  ZP_CHECK(listenOn(&addr, &fd));
  setIdAddress(&layout, addr);
  try {
    std::thread(rootMain, fd, layout).detach();
  } catch (const std::exception& e) {
    close(fd);
    return fail(zpSystemError, "cannot start the bootstrap root thread: %s", e.what());
  }
  ZP_INFO(kSubBootstrap, "bootstrap root listening on %s", addrToString(addr).c_str());
  if (idOut) *idOut = encodeId(layout);
  return zpSuccess;
}

zpResult_t startRoot(zpUniqueId* id) {
  IdLayout layout;
  memset(&layout, 0, sizeof(layout));
  layout.magic = kIdMagic;
  layout.version = kIdVersion;
  sockaddr_storage addr;
  ZP_CHECK(interfaceAddress(envString("ZP_SOCKET_IFNAME"), &addr));
  setIdAddress(&layout, addr);
  if (getrandom(layout.secret, sizeof(layout.secret), 0) != (ssize_t)sizeof(layout.secret))
    return fail(zpSystemError, "getrandom failed: %s", strerror(errno));
  return startRootOn(layout, id);
}

zpResult_t startRootAt(const IdLayout& layout) { return startRootOn(layout, nullptr); }

zpResult_t makeRank0Id(const std::string& host, int port, const std::string& seedText, zpUniqueId* id) {
  IdLayout layout;
  memset(&layout, 0, sizeof(layout));
  layout.magic = kIdMagic;
  layout.version = kIdVersion;
  layout.flags = kIdFlagRootAtRank0;
  sockaddr_storage addr;
  ZP_CHECK(resolveAddress(host, port, &addr));
  setIdAddress(&layout, addr);
  // Every rank derives the same secret from what the launcher gave all of them.
  uint64_t h = 0xcbf29ce484222325ull;
  for (int round = 0; round < 2; round++) {
    for (unsigned char c : seedText) h = (h ^ c) * 0x100000001b3ull;
    h ^= h >> 29;
    memcpy(layout.secret + 8 * round, &h, 8);
  }
  *id = encodeId(layout);
  return zpSuccess;
}

zpResult_t bootstrapExchange(const IdLayout& id, int nranks, const RankInfo& mine, int timeoutMs,
                             std::vector<RankInfo>* all, int* rootFd) {
  uint64_t deadline = nowMs() + timeoutMs;
  int fd = -1;
  sockaddr_storage rootAddr = idAddress(id);
  JoinHeader h;
  memset(&h, 0, sizeof(h));
  h.magic = kIdMagic;
  memcpy(h.secret, id.secret, sizeof(h.secret));
  h.nranks = nranks;
  h.timeoutMs = timeoutMs;
  h.info = mine;
  snprintf(h.job, sizeof(h.job), "%s", jobIdentity().c_str());
  JoinReply reply;
  // The root may evict this connection before reading it (strangers flood
  // it): it then says so, and the rank connects again within its timeout.
  for (int attempt = 0;; attempt++) {
    zpResult_t r = connectUntil(rootAddr, deadline, &fd);
    if (r != zpSuccess)
      return fail(r, "rank %d: cannot reach the bootstrap root at %s within %d ms: %s", mine.rank,
                  addrToString(rootAddr).c_str(), timeoutMs, lastError());
    r = sendAll(fd, &h, sizeof(h), deadline);
    if (r == zpSuccess) r = recvAll(fd, &reply, sizeof(reply), deadline);
    if (r != zpSuccess) {
      close(fd);
      return fail(zpRemoteError, "rank %d: bootstrap with %s failed: %s (did every rank of %d start?)",
                  mine.rank, addrToString(rootAddr).c_str(), lastError(), nranks);
    }
    if (reply.magic != kIdMagic) {
      close(fd);
      return fail(zpRemoteError, "rank %d: bootstrap root sent a bad reply", mine.rank);
    }
    if (reply.status != kBusyStatus) break;
    close(fd);
    fd = -1;
    if (nowMs() >= deadline)
      return fail(zpRemoteError, "rank %d: the bootstrap root at %s stayed too busy to admit it for %d ms (%d tries)",
                  mine.rank, addrToString(rootAddr).c_str(), timeoutMs, attempt + 1);
    usleep(std::min(1000 * (1 << std::min(attempt, 6)), 50000));
  }
  if (reply.status != zpSuccess) {
    close(fd);
    reply.message[sizeof(reply.message) - 1] = 0;
    return fail((zpResult_t)reply.status, "rank %d: bootstrap failed: %s", mine.rank, reply.message);
  }
  all->resize(nranks);
  zpResult_t r = recvAll(fd, all->data(), nranks * sizeof(RankInfo), deadline);
  if (r != zpSuccess) {
    close(fd);
    return fail(zpRemoteError, "rank %d: bootstrap table lost: %s", mine.rank, lastError());
  }
  *rootFd = fd;
  for (int i = 0; i < nranks; i++) {
    (*all)[i].nodeId[sizeof((*all)[i].nodeId) - 1] = 0;
    (*all)[i].hostname[sizeof((*all)[i].hostname) - 1] = 0;
    if ((*all)[i].rank != i) {
      close(fd);
      *rootFd = -1;
      return fail(zpInternalError, "bootstrap table out of order at %d", i);
    }
  }
  return zpSuccess;
}

zpResult_t bootstrapAllgather(int rootFd, int rank, const std::string& mine, int timeoutMs,
                              std::vector<std::string>* all) {
  uint64_t deadline = nowMs() + timeoutMs;
  uint32_t len = (uint32_t)mine.size();
  int32_t ok = 0;
  zpResult_t r = sendAll(rootFd, &len, sizeof(len), deadline);
  if (r == zpSuccess && len) r = sendAll(rootFd, mine.data(), len, deadline);
  if (r == zpSuccess) r = recvAll(rootFd, &ok, sizeof(ok), deadline);
  if (r != zpSuccess || !ok)
    return fail(zpRemoteError, "rank %d: the address exchange failed (a rank left during init)", rank);
  for (std::string& b : *all) {
    if (recvAll(rootFd, &len, sizeof(len), deadline) != zpSuccess || len > kMaxBlob)
      return fail(zpRemoteError, "rank %d: the address exchange was cut off", rank);
    b.resize(len);
    if (len && recvAll(rootFd, &b[0], len, deadline) != zpSuccess)
      return fail(zpRemoteError, "rank %d: the address exchange was cut off", rank);
  }
  return zpSuccess;
}

}  // namespace zp
