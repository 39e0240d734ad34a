#include "src/core/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "src/core/log.h"
#include "src/util/clock.h"

namespace zp {

static socklen_t addrLen(const sockaddr_storage& a) {
  return a.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
}

std::string addrToString(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (a.ss_family == AF_INET) {
    auto* s = (const sockaddr_in*)&a;
    inet_ntop(AF_INET, &s->sin_addr, host, sizeof(host));
    port = ntohs(s->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  if (a.ss_family == AF_INET6) {
    auto* s = (const sockaddr_in6*)&a;
    inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof(host));
    port = ntohs(s->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return "<unknown address family>";
}

zpResult_t interfaceAddress(const std::string& ifname, sockaddr_storage* out) {
  memset(out, 0, sizeof(*out));
  if (ifname.empty()) {
    // Loopback unless told otherwise: a multi-node launcher names the interface.
    auto* s = (sockaddr_in*)out;
    s->sin_family = AF_INET;
    s->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    return zpSuccess;
  }
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0)
    return fail(zpSystemError, "getifaddrs failed: %s", strerror(errno));
  bool found = false;
  for (ifaddrs* i = list; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr || ifname != i->ifa_name) continue;
    if (i->ifa_addr->sa_family == AF_INET) {
      memcpy(out, i->ifa_addr, sizeof(sockaddr_in));
      found = true;
    }
  }
  for (ifaddrs* i = list; i && !found; i = i->ifa_next) {
    if (!i->ifa_addr || ifname != i->ifa_name) continue;
    if (i->ifa_addr->sa_family == AF_INET6) {
      memcpy(out, i->ifa_addr, sizeof(sockaddr_in6));
      found = true;
    }
  }
  freeifaddrs(list);
  if (!found)
    return fail(zpInvalidArgument, "ZP_SOCKET_IFNAME=%s: no such interface with an IP address",
                ifname.c_str());
  return zpSuccess;
}

zpResult_t resolveAddress(const std::string& host, int port, sockaddr_storage* out) {
  if (port <= 0 || port > 65535) return fail(zpInvalidArgument, "port %d out of range", port);
  addrinfo hints;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res)
    return fail(zpInvalidArgument, "cannot resolve '%s': %s", host.c_str(), gai_strerror(rc));
  memset(out, 0, sizeof(*out));
  memcpy(out, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  return zpSuccess;
}

zpResult_t listenOn(sockaddr_storage* addr, int* fdOut) {
  int fd = socket(addr->ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return fail(zpSystemError, "socket: %s", strerror(errno));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (bind(fd, (sockaddr*)addr, addrLen(*addr)) != 0 || listen(fd, 1024) != 0) {
    int e = errno;
    close(fd);
    return fail(zpSystemError, "cannot listen on %s: %s", addrToString(*addr).c_str(), strerror(e));
  }
  socklen_t len = sizeof(*addr);
  getsockname(fd, (sockaddr*)addr, &len);
  *fdOut = fd;
  return zpSuccess;
}

zpResult_t connectUntil(const sockaddr_storage& addr, uint64_t deadlineMs, int* fdOut) {
  int delayMs = 1;
  for (;;) {
    int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return fail(zpSystemError, "socket: %s", strerror(errno));
    if (connect(fd, (const sockaddr*)&addr, addrLen(addr)) == 0) {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      *fdOut = fd;
      return zpSuccess;
    }
    int e = errno;
    close(fd);
    bool retry = (e == ECONNREFUSED || e == ETIMEDOUT || e == EAGAIN || e == ENETUNREACH ||
                  e == EHOSTUNREACH || e == EINTR);
    if (!retry || nowMs() >= deadlineMs)
      return fail(zpRemoteError, "cannot connect to %s: %s", addrToString(addr).c_str(), strerror(e));
    usleep(delayMs * 1000);
    delayMs = delayMs < 100 ? delayMs * 2 : 100;
  }
}

static zpResult_t waitFd(int fd, short events, uint64_t deadlineMs) {
  for (;;) {
    uint64_t now = nowMs();
    if (now >= deadlineMs) return fail(zpRemoteError, "socket timed out");
    pollfd p = {fd, events, 0};
    int rc = poll(&p, 1, (int)(deadlineMs - now));
    if (rc > 0) return zpSuccess;
    if (rc < 0 && errno != EINTR) return fail(zpSystemError, "poll: %s", strerror(errno));
  }
}

// sendAll and recvAll: move(p, len) moves what the socket takes now (send
// or recv, never blocking); when it takes nothing, wait for `events` until
// the deadline. A failure is "<what> failed: <errno's text, or closed>".
template <class Move>
static zpResult_t moveAll(int fd, char* p, size_t len, uint64_t deadlineMs, short events, Move move,
                          const char* what, const char* closed) {
  while (len > 0) {
    ssize_t n = move(p, len);
    if (n > 0) { p += n; len -= n; continue; }
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
      ZP_CHECK(waitFd(fd, events, deadlineMs));
      continue;
    }
    return fail(zpRemoteError, "%s failed: %s", what, n < 0 ? strerror(errno) : closed);
  }
  return zpSuccess;
}

zpResult_t sendAll(int fd, const void* buf, size_t len, uint64_t deadlineMs) {
  auto sendNow = [fd](const char* p, size_t n) { return send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT); };
  return moveAll(fd, (char*)buf, len, deadlineMs, POLLOUT, sendNow, "send", "connection closed");
}

zpResult_t recvAll(int fd, void* buf, size_t len, uint64_t deadlineMs) {
  auto recvNow = [fd](char* p, size_t n) { return recv(fd, p, n, MSG_DONTWAIT); };
  return moveAll(fd, (char*)buf, len, deadlineMs, POLLIN, recvNow, "receive", "connection closed by peer");
}

}  // namespace zp
