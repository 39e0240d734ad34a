#include "src/core/bootstrap.h"

#include <poll.h>
#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "src/core/config.h"
#include "src/core/log.h"
#include "src/core/socket.h"

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
  uint64_t deadlineMs;
  size_t got = 0;
  JoinHeader hdr;
  std::string peer;
};

// Limit on one rank's transport address (second round).
constexpr uint32_t kMaxBlob = 64 << 10;

// A connection that hands over less than a header within this time is dropped:
// a real rank sends its header right after connecting.
constexpr int kHeaderTimeoutMs = 10000;

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

// Serves one communicator's rendezvous, then returns.
void rootMain(int listenFd, IdLayout id) {
  std::vector<Pending> pending;
  std::vector<int> rankFd;  // by rank, -1 until joined
  std::vector<RankInfo> table;
  int nranks = -1, joined = 0;
  uint64_t joinDeadline = UINT64_MAX;  // set by the first rank, from its timeout
  int rankTimeoutMs = 0;
  std::string failure;

  auto dropPending = [&](size_t i, const char* why) {
    ZP_WARN(kSubBootstrap, "bootstrap root: dropped connection from %s: %s", pending[i].peer.c_str(), why);
    close(pending[i].fd);
    pending.erase(pending.begin() + i);
  };

  while (failure.empty() && (nranks < 0 || joined < nranks)) {
    std::vector<pollfd> fds;
    fds.push_back({listenFd, POLLIN, 0});
    for (auto& p : pending) fds.push_back({p.fd, POLLIN, 0});
    for (int fd : rankFd)
      if (fd >= 0) fds.push_back({fd, POLLIN, 0});  // a joined rank that closes has died
    uint64_t now = nowMs();
    uint64_t next = joinDeadline;
    for (auto& p : pending) next = std::min(next, p.deadlineMs);
    int waitMs = next == UINT64_MAX ? 1000 : (int)std::min<uint64_t>(next > now ? next - now : 0, 1000);
    int rc = poll(fds.data(), fds.size(), waitMs);
    if (rc < 0 && errno != EINTR) { failure = std::string("poll: ") + strerror(errno); break; }
    now = nowMs();
    if (now >= joinDeadline) {
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
        // Reject garbage as soon as the magic is readable.
        if (p.got >= sizeof(uint32_t) && p.hdr.magic != kIdMagic) { dropPending(i, "bad magic (not a Zeppelin rank)"); continue; }
        if (p.got >= offsetof(JoinHeader, nranks) && memcmp(p.hdr.secret, id.secret, sizeof(id.secret)) != 0) {
          dropPending(i, "wrong secret (a rank of another communicator, or a stranger)");
          continue;
        }
        if (p.got < sizeof(JoinHeader)) continue;
        const JoinHeader& h = p.hdr;
        int r = h.info.rank;
        std::string err;
        if (h.nranks <= 0 || h.nranks > (1 << 20)) err = "bad nranks " + std::to_string(h.nranks);
        else if (nranks >= 0 && h.nranks != nranks)
          err = "rank " + std::to_string(r) + " says nranks=" + std::to_string(h.nranks) +
                " but earlier ranks said " + std::to_string(nranks);
        else if (r < 0 || r >= h.nranks) err = "rank " + std::to_string(r) + " out of range [0," + std::to_string(h.nranks) + ")";
        else if (nranks >= 0 && rankFd[r] >= 0) err = "rank " + std::to_string(r) + " joined twice";
        if (!err.empty()) {
          ZP_WARN(kSubBootstrap, "bootstrap root: refused %s: %s", p.peer.c_str(), err.c_str());
          sendReply(p.fd, zpInvalidUsage, err, nullptr, nowMs() + 1000);
          close(p.fd);
          pending.erase(pending.begin() + i);
          continue;
        }
        if (nranks < 0) {
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
        pending.erase(pending.begin() + i);
        continue;
      }
      if (now >= p.deadlineMs) dropPending(i, "no complete header in time");
    }
    // New connections.
    if (fds[0].revents & POLLIN) {
      sockaddr_storage from;
      socklen_t len = sizeof(from);
      int fd = accept4(listenFd, (sockaddr*)&from, &len, SOCK_CLOEXEC);
      if (fd >= 0) {
        if (pending.size() >= 4096) {
          close(fd);
        } else {
          Pending p;
          p.fd = fd;
          p.deadlineMs = nowMs() + kHeaderTimeoutMs;
          p.peer = addrToString(from);
          pending.push_back(p);
        }
      }
    }
  }

  for (auto& p : pending) close(p.fd);
  close(listenFd);
  uint64_t replyDeadline = nowMs() + 30000;
  for (int r = 0; r < (int)rankFd.size(); r++) {
    if (rankFd[r] < 0) continue;
    if (failure.empty()) sendReply(rankFd[r], zpSuccess, "", &table, replyDeadline);
    else sendReply(rankFd[r], zpRemoteError, failure, nullptr, replyDeadline);
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

}  // namespace

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
  zpResult_t r = connectUntil(rootAddr, deadline, &fd);
  if (r != zpSuccess)
    return fail(r, "rank %d: cannot reach the bootstrap root at %s within %d ms: %s", mine.rank,
                addrToString(rootAddr).c_str(), timeoutMs, lastError());
  JoinHeader h;
  memset(&h, 0, sizeof(h));
  h.magic = kIdMagic;
  memcpy(h.secret, id.secret, sizeof(h.secret));
  h.nranks = nranks;
  h.timeoutMs = timeoutMs;
  h.info = mine;
  JoinReply reply;
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
  if (reply.status != zpSuccess) {
    close(fd);
    reply.message[sizeof(reply.message) - 1] = 0;
    return fail((zpResult_t)reply.status, "rank %d: bootstrap failed: %s", mine.rank, reply.message);
  }
  all->resize(nranks);
  r = recvAll(fd, all->data(), nranks * sizeof(RankInfo), deadline);
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
