// tcp_rails: plain TCP over an emulated cluster's NICs, the floor under any
// transport there (run by zprun --nodes 2 --ranks-per-node K --nics-per-node K).
// Local rank k of node 0 and local rank k of node 1 open one connection over
// NIC k and move -s bytes each way at once (a thread sends, the main thread
// receives), as the routed zipf alltoallv's inter-node bytes cross rail k.
// Each rank prints its time, its payload rate one way, its own user and
// system time; rank 0 also the machine's cores over its transfer
// (/proc/stat: every process, namespaces do not separate it), so the CPU
// cost of the kernel's TCP, veth, bridge and tc per byte can be read off.
//
//   build/zprun --nodes 2 --ranks-per-node 4 --nics-per-node 4 --nic-rate 1gbit build/bench/tcp_rails -s 126M
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"
#include "src/util/cli.h"

namespace {

int envInt(const char* name) {
  const char* v = getenv(name);
  if (!v) {
    fprintf(stderr, "tcp_rails: %s is not set (run it under zprun --nodes 2)\n", name);
    exit(2);
  }
  return atoi(v);
}

// Every byte of len, or exit: a short transfer would make the rate a lie.
void sendAll(int fd, size_t total) {
  std::vector<char> buf(1 << 20, 7);
  for (size_t left = total; left > 0;) {
    ssize_t n = send(fd, buf.data(), std::min(left, buf.size()), 0);
    if (n <= 0) {
      perror("tcp_rails: send");
      exit(1);
    }
    left -= (size_t)n;
  }
}

void recvAll(int fd, size_t total) {
  std::vector<char> buf(1 << 20);
  for (size_t got = 0; got < total;) {
    ssize_t n = recv(fd, buf.data(), buf.size(), 0);
    if (n <= 0) {
      perror("tcp_rails: recv");
      exit(1);
    }
    got += (size_t)n;
  }
}

int connectRail(int node, int k) {
  char addr[32];
  snprintf(addr, sizeof addr, "10.77.%d.1", k);  // NIC k of node 0 (zprun's addressing)
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons((uint16_t)(5200 + k));
  inet_pton(AF_INET, addr, &sa.sin_addr);
  if (node == 0) {
    int l = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (sockaddr*)&sa, sizeof sa) || listen(l, 1)) {
      perror("tcp_rails: bind");
      exit(1);
    }
    int fd = accept(l, nullptr, nullptr);
    close(l);
    return fd;
  }
  for (int tries = 0; tries < 500; tries++) {  // node 0 may not listen yet
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(fd, (sockaddr*)&sa, sizeof sa) == 0) return fd;
    close(fd);
    usleep(20000);
  }
  fprintf(stderr, "tcp_rails: cannot connect to %s\n", addr);
  exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  size_t total = 126u << 20;  // the routed zipf's inter-node bytes per rail
  CLI::App app("", "tcp_rails");
  zp::cli::configure(app, "usage: tcp_rails [-s size]   (under zprun --nodes 2)\n", 14);
  app.description("Plain TCP over an emulated cluster's NICs: one connection per rail,\n"
                  "both ways at once.");
  zp::cli::addValue(app, "-s", "size", "bytes each way per rail, K/M/G suffixes (default 126M)",
                    [&](const std::string& v) {
                      zpbench::bytesFlag("-s", &total)(v);
                      if (total == 0) throw zp::cli::UsageError("bad -s '" + v + "': expected at least 1 byte");
                    });
  zpbench::parseCommandLine(app, argc, argv);
  const int rank = envInt("ZP_RANK"), k = envInt("ZP_LOCAL_RANK"), rpn = envInt("ZP_LOCAL_NRANKS");
  const int node = rank / rpn;
  if (node > 1) return 0;
  const int fd = connectRail(node, k);
  // One byte each way: both ends connected before the clock starts.
  char c = 1;
  if (send(fd, &c, 1, 0) != 1 || recv(fd, &c, 1, MSG_WAITALL) != 1) return 1;
  usleep(200000);  // every rail's pair connected
  const zpbench::MachineCpu m0 = zpbench::machineCpu();
  const zpbench::ProcessCpu p0 = zpbench::processCpu();
  const double t0 = zpbench::nowSeconds();
  std::thread sender(sendAll, fd, total);
  recvAll(fd, total);
  sender.join();
  const double t = zpbench::nowSeconds() - t0;
  const zpbench::ProcessCpu p = zpbench::processCpu() - p0;
  const zpbench::MachineCpu m = zpbench::machineCpu() - m0;
  printf("rank %d nic %d: %.0f MiB each way in %.0f ms (%.0f Mbit/s one way); own user %.0f sys %.0f ms", rank, k,
         total / 1048576.0, t * 1e3, total * 8 / t / 1e6, p.user * 1e3, p.sys * 1e3);
  if (rank == 0)
    printf("; the machine's cores: user %.0f sys %.0f softirq %.0f idle %.0f ms", m.user * 1e3, m.sys * 1e3,
           m.softirq * 1e3, m.idle * 1e3);
  printf("\n");
  close(fd);
  return 0;
}
