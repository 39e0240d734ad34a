// Small TCP helpers for the bootstrap. Every blocking step takes a deadline so
// that nothing here can hang past the communicator's timeout.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "include/zeppelin.h"

namespace zp {

std::string addrToString(const sockaddr_storage& addr);
// The address of interface ifname; empty ifname means loopback.
zpResult_t interfaceAddress(const std::string& ifname, sockaddr_storage* out);
// Resolves host:port (numeric or name) to an address.
zpResult_t resolveAddress(const std::string& host, int port, sockaddr_storage* out);
// Listens on addr (port 0 picks one; addr is updated with it).
zpResult_t listenOn(sockaddr_storage* addr, int* fd);
// Connects, retrying refused connections until the deadline (the listener
// may not be up yet).
zpResult_t connectUntil(const sockaddr_storage& addr, uint64_t deadlineMs, int* fd);
// Full transfers; zpRemoteError on EOF, reset or deadline.
zpResult_t sendAll(int fd, const void* buf, size_t len, uint64_t deadlineMs);
zpResult_t recvAll(int fd, void* buf, size_t len, uint64_t deadlineMs);

}  // namespace zp
