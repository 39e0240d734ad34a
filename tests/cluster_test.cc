// Tests of zprun's emulated cluster (zprun --nodes): the nodes' identities,
// NICs and addresses as the ranks see them, reachability over the rails, the
// NIC rate limits, and that nothing of a run is left behind however it ends.
//
// Building clusters needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN): without it
// these tests skip, except the one that checks that zprun refuses clearly.
//
// The test binary is also the ranks' helper program: run with
// CLUSTER_TEST_HELPER="MODE ARGS..." in its environment it does only that
// (a TCP listener or client, a throughput sink or source; see helperMain)
// and exits before main. The ranks only ever talk to the 10.77.x.y addresses
// of the run's own namespaces.
//
// The build passes the launcher's path (and zp_env_rank's, for a Zeppelin
// job in a cluster) as string literals:
//   target_compile_definitions(... ZPRUN_PATH="$<TARGET_FILE:zprun>"
//                                  ZP_ENV_RANK_PATH="$<TARGET_FILE:zp_env_rank>")
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/process_util.h"

namespace {

using namespace zptest;

// ===========================================================================
// Helper modes: what the ranks run
// ===========================================================================

bool parseAddr(const std::string& host, int port, sockaddr_in* a) {
  memset(a, 0, sizeof *a);
  a->sin_family = AF_INET;
  a->sin_port = htons(static_cast<uint16_t>(port));
  return inet_pton(AF_INET, host.c_str(), &a->sin_addr) == 1;
}

// Listens on every address of the node at port; -1 on failure.
int listenOn(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a;
  parseAddr("0.0.0.0", port, &a);
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(fd, 16) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Accepts one connection before the deadline; -1 otherwise.
int acceptUntil(int listenFd, double deadline) {
  for (;;) {
    int left = static_cast<int>((deadline - nowSec()) * 1000);
    if (left <= 0) return -1;
    pollfd p{listenFd, POLLIN, 0};
    if (poll(&p, 1, left) <= 0) continue;
    int fd = accept4(listenFd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) return fd;
  }
}

// Connects to host:port, retrying (the listener may not be up yet) until the
// deadline; -1 otherwise.
int connectUntil(const std::string& host, int port, double deadline) {
  sockaddr_in a;
  if (!parseAddr(host, port, &a)) return -1;
  while (nowSec() < deadline) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return fd;
    close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

// Reads up to n bytes, waiting until the deadline; bytes read.
size_t readUntil(int fd, char* buf, size_t n, double deadline) {
  size_t got = 0;
  while (got < n) {
    int left = static_cast<int>((deadline - nowSec()) * 1000);
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, left) <= 0) continue;
    ssize_t r = read(fd, buf + got, n - got);
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  return got;
}

std::string localAddress(int fd) {
  sockaddr_in a;
  socklen_t len = sizeof a;
  char text[INET_ADDRSTRLEN] = "?";
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    inet_ntop(AF_INET, &a.sin_addr, text, sizeof text);
  return text;
}

// listen PORT SECONDS: accepts one connection, answers its "ping" with "pong".
int helperListen(int port, double seconds) {
  double deadline = nowSec() + seconds;
  int lfd = listenOn(port);
  if (lfd < 0) {
    printf("listen failed: %s\n", strerror(errno));
    return 1;
  }
  int fd = acceptUntil(lfd, deadline);
  if (fd < 0) {
    printf("nobody connected\n");
    return 1;
  }
  char buf[4];
  if (readUntil(fd, buf, 4, deadline) != 4 || memcmp(buf, "ping", 4) != 0) {
    printf("no ping\n");
    return 1;
  }
  if (write(fd, "pong", 4) != 4) return 1;
  printf("served on %s\n", localAddress(fd).c_str());
  close(fd);
  close(lfd);
  return 0;
}

// connect HOST PORT SECONDS: sends "ping", expects "pong".
int helperConnect(const std::string& host, int port, double seconds) {
  double deadline = nowSec() + seconds;
  int fd = connectUntil(host, port, deadline);
  if (fd < 0) {
    printf("cannot connect to %s:%d\n", host.c_str(), port);
    return 1;
  }
  char buf[4];
  if (write(fd, "ping", 4) != 4 || readUntil(fd, buf, 4, deadline) != 4 ||
      memcmp(buf, "pong", 4) != 0) {
    printf("no pong from %s:%d\n", host.c_str(), port);
    return 1;
  }
  printf("connected from %s to %s:%d\n", localAddress(fd).c_str(), host.c_str(), port);
  close(fd);
  return 0;
}

// sink PORT CONNS WARMUP SECONDS: accepts CONNS connections, then counts the
// bytes all of them deliver between WARMUP and WARMUP+SECONDS; prints
// "bits_per_sec N".
int helperSink(int port, int conns, double warmup, double seconds) {
  int lfd = listenOn(port);
  if (lfd < 0) {
    printf("listen failed: %s\n", strerror(errno));
    return 1;
  }
  std::vector<int> fds;
  double acceptDeadline = nowSec() + 20;
  while (static_cast<int>(fds.size()) < conns) {
    int fd = acceptUntil(lfd, acceptDeadline);
    if (fd < 0) {
      printf("only %zu of %d senders connected\n", fds.size(), conns);
      return 1;
    }
    fds.push_back(fd);
  }
  double start = nowSec(), from = start + warmup, to = from + seconds;
  uint64_t counted = 0;
  std::vector<char> buf(1 << 20);
  while (nowSec() < to) {
    std::vector<pollfd> p;
    for (int fd : fds) p.push_back({fd, POLLIN, 0});
    if (poll(p.data(), p.size(), 100) <= 0) continue;
    for (const pollfd& q : p) {
      if (!q.revents) continue;
      ssize_t r = read(q.fd, buf.data(), buf.size());
      if (r <= 0) {
        printf("a sender stopped early\n");
        return 1;
      }
      double t = nowSec();
      if (t >= from && t < to) counted += static_cast<uint64_t>(r);
    }
  }
  printf("bits_per_sec %.0f\n", counted * 8.0 / seconds);
  return 0;
}

// source HOST PORT SECONDS: sends as fast as it can for at most SECONDS, or
// until the sink closes.
int helperSource(const std::string& host, int port, double seconds) {
  double deadline = nowSec() + seconds;
  int fd = connectUntil(host, port, nowSec() + 20);
  if (fd < 0) {
    printf("cannot connect to %s:%d\n", host.c_str(), port);
    return 1;
  }
  std::vector<char> buf(1 << 20, 'z');
  while (nowSec() < deadline) {
    ssize_t n = send(fd, buf.data(), buf.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;  // the sink is done
  }
  close(fd);
  return 0;
}

int helperMain(const std::vector<std::string>& a) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  if (a.size() == 3 && a[0] == "listen") return helperListen(atoi(a[1].c_str()), atof(a[2].c_str()));
  if (a.size() == 4 && a[0] == "connect")
    return helperConnect(a[1], atoi(a[2].c_str()), atof(a[3].c_str()));
  if (a.size() == 5 && a[0] == "sink")
    return helperSink(atoi(a[1].c_str()), atoi(a[2].c_str()), atof(a[3].c_str()),
                      atof(a[4].c_str()));
  if (a.size() == 4 && a[0] == "source")
    return helperSource(a[1], atoi(a[2].c_str()), atof(a[3].c_str()));
  fprintf(stderr, "CLUSTER_TEST_HELPER: bad arguments\n");
  return 2;
}

// Runs the helper instead of the tests when CLUSTER_TEST_HELPER is set. A
// static constructor, so it works in a test binary whose main is gtest's; the
// helpers use nothing but the C library, whatever other static objects are
// not constructed yet.
struct HelperDispatch {
  HelperDispatch() {
    const char* spec = getenv("CLUSTER_TEST_HELPER");
    if (spec == nullptr || *spec == '\0') return;
    std::vector<std::string> args;
    std::istringstream in(spec);
    for (std::string w; in >> w;) args.push_back(w);
    int code = helperMain(args);
    fflush(stdout);
    fflush(stderr);
    _exit(code);
  }
} g_helperDispatch;

std::string selfPath() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return "";
  buf[n] = 0;
  return buf;
}

// The shell words that run this binary as a helper: `helper("listen 7000
// 20")`. The spec may use the shell's $((...)) and $VARS.
std::string helper(const std::string& spec) {
  return "env CLUSTER_TEST_HELPER=\"" + spec + "\" " + selfPath();
}

// ===========================================================================
// Running zprun
// ===========================================================================

// One zprun process (or a wrapper that execs it) with its output captured.
class Launch : public Child {
 public:
  explicit Launch(const std::vector<std::string>& args, const std::vector<std::string>& wrapper = {})
      : Child(zprunCommand(args, wrapper)) {}

  // Reads the output until zprun closes it, then reaps zprun. A zprun that
  // runs longer than limitSec gets SIGTERM (so it still removes its
  // cluster), then SIGKILL 15 s later.
  Result finish(double limitSec = 90) { return Child::finish(limitSec, 15); }
};

Result run(const std::vector<std::string>& args, double limitSec = 90) {
  Launch launch(args);
  return launch.finish(limitSec);
}

std::string findTool(const std::string& name) {
  for (const char* d : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) {
    std::string p = std::string(d) + "/" + name;
    if (access(p.c_str(), X_OK) == 0) return p;
  }
  return name;
}

bool haveClusterPrivileges() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, 7, "CapEff:") == 0) {
      unsigned long long caps = strtoull(line.c_str() + 7, nullptr, 16);
      return (caps & (1ull << 21)) && (caps & (1ull << 12));
    }
  }
  return false;
}

#define REQUIRE_ROOT()                                                        \
  do {                                                                        \
    if (!haveClusterPrivileges()) GTEST_SKIP() << "needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN)"; \
  } while (0)

// Everything a run with zprun pid `pid` may have made: namespaces
// zp<pid>-*, a state directory /run/zprun/zp<pid>-*, and (never expected)
// its interfaces in the machine's own namespace.
std::vector<std::string> leftoversOf(pid_t pid) {
  std::vector<std::string> found;
  std::string prefix = "zp" + std::to_string(pid) + "-";
  for (const std::string& l : lines(capture({findTool("ip"), "netns", "list"})))
    if (l.compare(0, prefix.size(), prefix) == 0) found.push_back("namespace " + l);
  for (const std::string& l : lines(capture({"ls", "/run/zprun"})))
    if (l.compare(0, prefix.size(), prefix) == 0) found.push_back("state directory " + l);
  for (const std::string& l : lines(capture({findTool("ip"), "-o", "link", "show"}))) {
    // "3: name@peer: <...>": our interface names never belong here.
    size_t a = l.find(": "), b = l.find_first_of(":@", a + 2);
    if (a == std::string::npos || b == std::string::npos) continue;
    std::string name = l.substr(a + 2, b - a - 2);
    if (name.compare(0, 5, "zpnic") == 0 || name.compare(0, 4, "rail") == 0 ||
        (name.compare(0, 4, "node") == 0 && name.find("nic") != std::string::npos))
      found.push_back("interface " + name);
  }
  return found;
}

#define EXPECT_NOTHING_LEFT(pid) \
  EXPECT_EQ(leftoversOf(pid), std::vector<std::string>()) << "left behind by zprun pid " << (pid)

// The output of a -p run, by rank.
std::map<int, std::vector<std::string>> byRank(const std::string& out) {
  std::map<int, std::vector<std::string>> m;
  for (const std::string& l : lines(out)) {
    if (l.size() < 4 || l[0] != '[') continue;
    size_t close = l.find("] ");
    if (close == std::string::npos) continue;
    m[atoi(l.substr(1, close - 1).c_str())].push_back(l.substr(close + 2));
  }
  return m;
}

// The value of "KEY value" / "KEY=value" lines of one rank.
std::string field(const std::vector<std::string>& ls, const std::string& key) {
  for (const std::string& l : ls)
    if (l.compare(0, key.size(), key) == 0) return l.substr(key.size());
  return "";
}

std::vector<std::string> withPrefix(const std::vector<std::string>& ls, const std::string& key) {
  std::vector<std::string> v;
  for (const std::string& l : ls)
    if (l.compare(0, key.size(), key) == 0) v.push_back(l.substr(key.size()));
  return v;
}

// What each rank reports about where it runs.
std::string infoScript() {
  std::string ip = findTool("ip");
  return "echo \"host $(hostname)\"; echo \"boot $(cat /proc/sys/kernel/random/boot_id)\"; "
         "env | grep '^ZP_' | sort; " +
         ip +
         " -o -4 addr show | while read n dev fam addr rest; do echo \"addr $dev $addr\"; done; "
         "for d in /sys/class/net/*; do echo \"sysnet ${d##*/}\"; done";
}

// Runs the info script on an N x R x K cluster and checks everything the
// ranks report.
void checkClusterLayout(int nodes, int ranksPerNode, int nics) {
  Result r = run({"--nodes", std::to_string(nodes), "--ranks-per-node", std::to_string(ranksPerNode),
                  "--nics-per-node", std::to_string(nics), "--nic-rate", "500mbit", "-p",
                  "--timeout", "60", "sh", "-c", infoScript()});
  ASSERT_EQ(r.exitCode, 0) << r.err << r.out;
  EXPECT_EQ(r.err, "");
  auto ranks = byRank(r.out);
  const int nranks = nodes * ranksPerNode;
  ASSERT_EQ(static_cast<int>(ranks.size()), nranks) << r.out;

  std::set<std::string> hosts, boots;
  std::string uniqueId;
  for (int rank = 0; rank < nranks; ++rank) {
    const auto& ls = ranks[rank];
    const int node = rank / ranksPerNode, local = rank % ranksPerNode;
    SCOPED_TRACE("rank " + std::to_string(rank));
    EXPECT_EQ(field(ls, "ZP_RANK="), std::to_string(rank));
    EXPECT_EQ(field(ls, "ZP_NRANKS="), std::to_string(nranks));
    EXPECT_EQ(field(ls, "ZP_LOCAL_RANK="), std::to_string(local));
    EXPECT_EQ(field(ls, "ZP_LOCAL_NRANKS="), std::to_string(ranksPerNode));
    EXPECT_EQ(field(ls, "ZP_HOST_RANKS="), std::to_string(nranks));  // every node's: they share the cores
    EXPECT_EQ(field(ls, "ZP_NODE_RANK="), std::to_string(node));
    EXPECT_EQ(field(ls, "ZP_NNODES="), std::to_string(nodes));
    EXPECT_EQ(field(ls, "ZP_LAUNCHER="), "zprun");
    EXPECT_EQ(field(ls, "ZP_NICS_PER_NODE="), std::to_string(nics));
    EXPECT_EQ(field(ls, "ZP_NIC_RATE_BPS="), "500000000");
    const std::string nic = "zpnic" + std::to_string(local % nics);
    EXPECT_EQ(field(ls, "ZP_NET_DEVICES="), nic);
    EXPECT_EQ(field(ls, "ZP_SOCKET_IFNAME="), nic);
    if (rank == 0) uniqueId = field(ls, "ZP_UNIQUE_ID=");
    EXPECT_EQ(field(ls, "ZP_UNIQUE_ID="), uniqueId);
    EXPECT_EQ(uniqueId.size(), 256u);

    // Identity: equal within a node (checked against the node's first rank).
    const std::string host = field(ls, "host "), boot = field(ls, "boot ");
    const auto& first = ranks[node * ranksPerNode];
    EXPECT_EQ(host, field(first, "host "));
    EXPECT_EQ(boot, field(first, "boot "));
    EXPECT_EQ(boot.size(), 36u) << boot;
    EXPECT_EQ(host, "zp" + std::to_string(r.pid) + "-" + host.substr(host.find('-') + 1, 4) +
                        "-node" + std::to_string(node));
    if (local == 0) {
      hosts.insert(host);
      boots.insert(boot);
    }

    // NICs: exactly the node's own, with the node's addresses.
    std::vector<std::string> want = {"lo 127.0.0.1/8"}, wantSys = {"lo"};
    for (int k = 0; k < nics; ++k) {
      want.push_back("zpnic" + std::to_string(k) + " 10.77." + std::to_string(k) + "." +
                     std::to_string(node + 1) + "/24");
      wantSys.push_back("zpnic" + std::to_string(k));
    }
    EXPECT_EQ(withPrefix(ls, "addr "), want);
    EXPECT_EQ(withPrefix(ls, "sysnet "), wantSys);
  }
  // ... and different between nodes.
  EXPECT_EQ(static_cast<int>(hosts.size()), nodes);
  EXPECT_EQ(static_cast<int>(boots.size()), nodes);
  // The machine's own boot id is not any node's.
  std::ifstream realBoot("/proc/sys/kernel/random/boot_id");
  std::string real;
  realBoot >> real;
  EXPECT_EQ(boots.count(real), 0u);
  EXPECT_NOTHING_LEFT(r.pid);
}

// ===========================================================================
// Tests
// ===========================================================================

TEST(Cluster, TwoNodesOfTwoRanks) {
  REQUIRE_ROOT();
  checkClusterLayout(2, 2, 1);
}

TEST(Cluster, TwoNodesOfFourRanksWithFourNics) {
  REQUIRE_ROOT();
  checkClusterLayout(2, 4, 4);
}

TEST(Cluster, ThreeNodesOfTwoRanksWithTwoNics) {
  REQUIRE_ROOT();
  checkClusterLayout(3, 2, 2);
}

TEST(Cluster, MoreRanksThanNicsShareThemEvenly) {
  REQUIRE_ROOT();
  Result r = run({"--nodes", "1", "--ranks-per-node", "5", "--nics-per-node", "2", "-p", "sh", "-c",
                  "echo $ZP_NET_DEVICES $ZP_NIC_RATE_BPS"});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  auto ranks = byRank(r.out);
  for (int rank = 0; rank < 5; ++rank)
    EXPECT_EQ(ranks[rank], std::vector<std::string>{"zpnic" + std::to_string(rank % 2) + " 0"});
  EXPECT_NOTHING_LEFT(r.pid);
}

TEST(Cluster, XMayGiveARankOtherNicsOfItsNode) {
  REQUIRE_ROOT();
  // zprun's own ZP_NODE_ID would merge the nodes: the ranks do not get it.
  setenv("ZP_NODE_ID", "one-node-for-all", 1);
  Result r = run({"--nodes", "2", "--nics-per-node", "2", "-x", "ZP_NET_DEVICES=zpnic0,zpnic1",
                  "sh", "-c", "echo $ZP_NET_DEVICES $ZP_SOCKET_IFNAME ${ZP_NODE_ID-unset}"});
  unsetenv("ZP_NODE_ID");
  ASSERT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(r.out, "zpnic0,zpnic1 zpnic0 unset\nzpnic0,zpnic1 zpnic0 unset\n");
  EXPECT_NOTHING_LEFT(r.pid);
}

TEST(Cluster, NodesReachEachOtherOnEveryRail) {
  REQUIRE_ROOT();
  // 2 nodes x 2 ranks x 2 NICs: the ranks of node 1 listen, those of node 0
  // connect to node 1's address on their own rail.
  std::string script =
      "if [ $ZP_NODE_RANK = 1 ]; then exec " + helper("listen $((7000 + ZP_LOCAL_RANK)) 20") +
      "; else exec " + helper("connect 10.77.$ZP_LOCAL_RANK.2 $((7000 + ZP_LOCAL_RANK)) 20") +
      "; fi";
  Result r = run({"--nodes", "2", "--ranks-per-node", "2", "--nics-per-node", "2", "-p",
                  "--timeout", "60", "sh", "-c", script});
  ASSERT_EQ(r.exitCode, 0) << r.err << r.out;
  auto ranks = byRank(r.out);
  EXPECT_EQ(ranks[0], std::vector<std::string>{"connected from 10.77.0.1 to 10.77.0.2:7000"});
  EXPECT_EQ(ranks[1], std::vector<std::string>{"connected from 10.77.1.1 to 10.77.1.2:7001"});
  EXPECT_EQ(ranks[2], std::vector<std::string>{"served on 10.77.0.2"});
  EXPECT_EQ(ranks[3], std::vector<std::string>{"served on 10.77.1.2"});
  EXPECT_NOTHING_LEFT(r.pid);
}

TEST(Cluster, MachineAddressesAreNotReachable) {
  REQUIRE_ROOT();
  // A node has no route out of the cluster: only its rails' subnets.
  Result r = run({"--nodes", "1", "--nics-per-node", "2", "sh", "-c",
                  findTool("ip") + " -4 route show"});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  auto routes = lines(r.out);
  ASSERT_EQ(routes.size(), 2u) << r.out;
  EXPECT_EQ(routes[0].compare(0, 26, "10.77.0.0/24 dev zpnic0 pr"), 0) << routes[0];
  EXPECT_EQ(routes[1].compare(0, 26, "10.77.1.0/24 dev zpnic1 pr"), 0) << routes[1];
  EXPECT_NOTHING_LEFT(r.pid);
}

// Measures TCP goodput in an N-node cluster: `senders` nodes send to node 0
// (or node 0 sends to `senders` nodes when fanOut), at `rate` per NIC.
// Returns the fraction of the rate that arrived.
double measureFraction(const std::string& rate, uint64_t rateBps, int mtu, int senders, bool fanOut,
                       std::string* detail, const std::vector<std::string>& gray = {}, int rail = 0) {
  const double warmup = 1, seconds = 3;
  std::string sink = helper("sink 7100 " + std::string(fanOut ? "1" : std::to_string(senders)) +
                            " " + std::to_string(warmup) + " " + std::to_string(seconds));
  std::string script;
  if (!fanOut) {
    script = "if [ $ZP_NODE_RANK = 0 ]; then exec " + sink + "; else exec " +
             helper("source 10.77." + std::to_string(rail) + ".1 7100 30") + "; fi";
  } else {
    // Node 0 runs one source per receiving node; each receiver reports.
    script = "if [ $ZP_NODE_RANK = 0 ]; then i=1; while [ $i -le " + std::to_string(senders) +
             " ]; do " + helper("source 10.77.0.$((i + 1)) 7100 " +
                                std::to_string(static_cast<int>(warmup + seconds + 1))) +
             " & i=$((i + 1)); done; wait; else exec " + sink + "; fi";
  }
  std::vector<std::string> args = {"--nodes", std::to_string(senders + 1), "--nics-per-node",
                                   std::to_string(rail + 1), "--nic-rate", rate, "--mtu", std::to_string(mtu)};
  args.insert(args.end(), gray.begin(), gray.end());
  for (const char* a : {"-p", "--timeout", "60", "sh", "-c"}) args.push_back(a);
  args.push_back(script);
  Result r = run(args);
  EXPECT_EQ(r.exitCode, 0) << r.err << r.out;
  EXPECT_NOTHING_LEFT(r.pid);
  double total = 0;
  for (const auto& entry : byRank(r.out)) {
    std::string v = field(entry.second, "bits_per_sec ");
    if (!v.empty()) total += atof(v.c_str());
  }
  double fraction = total / static_cast<double>(rateBps);
  char buf[200];
  snprintf(buf, sizeof buf, "%s, MTU %d, %d %s: %.1f Mbit/s = %.3f of the NIC rate", rate.c_str(),
           mtu, senders, fanOut ? "receivers" : "senders", total / 1e6, fraction);
  *detail = buf;
  printf("[ measured ] %s\n", buf);
  return fraction;
}

// The best of up to three measurements: the rate tests share the machine
// with whatever else runs, and a busy CPU can only make the fraction lower.
double bestFraction(const std::string& rate, uint64_t rateBps, int mtu, int peers, bool fanOut,
                    double enough, std::string* detail, const std::vector<std::string>& gray = {},
                    int rail = 0) {
  double best = 0;
  for (int attempt = 0; attempt < 3 && best <= enough; ++attempt) {
    std::string d;
    double f = measureFraction(rate, rateBps, mtu, peers, fanOut, &d, gray, rail);
    if (f > best || detail->empty()) {
      best = std::max(best, f);
      *detail = d;
    }
    if (f >= 1.01) return f;  // over the rate: no retry hides that
  }
  return best;
}

// TCP through one shaped NIC pair reaches most of the rate (the
// rest is TCP/IP/Ethernet headers, about 4.4% at MTU 1500, 0.7% at 9000),
// and never more.
TEST(ClusterRate, OneFlowGetsTheNicRateAtMtu1500) {
  REQUIRE_ROOT();
  std::string detail;
  double f = bestFraction("1gbit", 1000000000ull, 1500, 1, false, 0.85, &detail);
  EXPECT_GT(f, 0.85) << detail;
  EXPECT_LT(f, 1.01) << detail;
}

TEST(ClusterRate, OneFlowGetsTheNicRateAtMtu9000) {
  REQUIRE_ROOT();
  std::string detail;
  double f = bestFraction("1gbit", 1000000000ull, 9000, 1, false, 0.85, &detail);
  EXPECT_GT(f, 0.85) << detail;
  EXPECT_LT(f, 1.01) << detail;
}

TEST(ClusterRate, ReceiveSideIsLimitedToo) {
  REQUIRE_ROOT();
  // Two nodes send to one: their NICs could send twice the rate, but the
  // receiver's NIC takes only its rate.
  std::string detail;
  double f = bestFraction("200mbit", 200000000ull, 1500, 2, false, 0.8, &detail);
  EXPECT_GT(f, 0.8) << detail;
  EXPECT_LT(f, 1.01) << detail;
}

TEST(ClusterRate, SendSideIsShared) {
  REQUIRE_ROOT();
  // One node sends to two: its one NIC carries the rate in total.
  std::string detail;
  double f = bestFraction("200mbit", 200000000ull, 1500, 2, true, 0.8, &detail);
  EXPECT_GT(f, 0.8) << detail;
  EXPECT_LT(f, 1.01) << detail;
}

// A gray failure from the start: node 1's NIC 1 at a tenth of the others'
// rate. A flow over rail 1 gets that NIC's rate (measured against it), not
// the nominal one.
TEST(ClusterRate, OneNicAtARateOfItsOwn) {
  REQUIRE_ROOT();
  std::string detail;
  double f = bestFraction("1gbit", 100000000ull, 1500, 1, false, 0.8, &detail, {"--nic-rate-of", "1:1=100mbit"}, 1);
  EXPECT_GT(f, 0.8) << detail;
  EXPECT_LT(f, 1.01) << detail;
}

// A NIC's rate changed while the job runs: from 1 gbit to 100 mbit 0.3 s
// after the ranks start, before the sink's 1 s warm-up ends, so the whole
// measured window runs at the new rate.
TEST(ClusterRate, NicEventChangesTheRateWhileTheJobRuns) {
  REQUIRE_ROOT();
  std::string detail;
  double f = bestFraction("1gbit", 100000000ull, 1500, 1, false, 0.8, &detail,
                          {"--nic-event", "1:1@300ms=100mbit"}, 1);
  EXPECT_GT(f, 0.8) << detail;
  EXPECT_LT(f, 1.01) << detail;
}

// A NIC taken down and brought up again on schedule: the node sees its
// operstate go down, then up, and zprun reports each event once.
TEST(Cluster, NicEventTakesANicDownAndUp) {
  REQUIRE_ROOT();
  const std::string wait = "t=0; while [ \"$(cat /sys/class/net/zpnic1/operstate)\" != $1 ]; do "
                           "t=$((t + 1)); [ $t -gt 100 ] && exit 1; sleep 0.05; done; ";
  const std::string script = "if [ $ZP_NODE_RANK = 1 ]; then set -- down; " + wait + "echo saw down; set -- up; " +
                             wait + "echo saw up; fi";
  Result r = run({"--nodes", "2", "--nics-per-node", "2", "--nic-event", "1:1@500ms=down", "--nic-event",
                  "1:1@1500ms=up", "-p", "--timeout", "30", "sh", "-c", script});
  EXPECT_EQ(r.exitCode, 0) << r.err << r.out;
  EXPECT_NE(r.out.find("saw down"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("saw up"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("node 1 zpnic1: down"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("node 1 zpnic1: up"), std::string::npos) << r.err;
  EXPECT_NOTHING_LEFT(r.pid);
}

TEST(Cluster, ZeppelinJobOnOneEmulatedNode) {
  REQUIRE_ROOT();
#ifndef ZP_ENV_RANK_PATH
  GTEST_SKIP() << "built without ZP_ENV_RANK_PATH";
#else
  // The library's own rendezvous, hosted by rank 0 on 10.77.0.1, and shared
  // memory among the ranks of the node.
  Result r = run({"--nodes", "1", "--ranks-per-node", "3", "--timeout", "120",
                  unquoted(ZPTEST_STR(ZP_ENV_RANK_PATH))});
  EXPECT_EQ(r.exitCode, 0) << r.err << r.out;
  std::multiset<std::string> got;
  for (const auto& l : lines(r.out)) got.insert(l);
  EXPECT_EQ(got, (std::multiset<std::string>{"zp_env_rank 0 of 3: ok", "zp_env_rank 1 of 3: ok",
                                             "zp_env_rank 2 of 3: ok"}))
      << r.err;
  EXPECT_NOTHING_LEFT(r.pid);
#endif
}

TEST(Cluster, MpirunRunsOpenMpiRanksInTheNodes) {
  // zprun --mpirun: the usage, the command line (--dry-run needs no rights),
  // then a real mpirun whose ranks report where they run.
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"-n", "2", "--mpirun", "--", "true"},           // no --nodes
           {"--nodes", "2", "--mpirun", "true"},            // no -- before the program
           {"--nodes", "2", "-p", "--mpirun", "--", "true"},  // -p is mpirun's --tag-output
           {"--nodes", "2", "--mpirun", "--"},              // no program
       }) {
    Result r = run(args);
    EXPECT_EQ(r.exitCode, 2) << args[args.size() - 1] << "\n" << r.err;
    EXPECT_NE(r.err.find("Usage:"), std::string::npos) << r.err;
  }
  Result dry = run({"--nodes", "2", "--ranks-per-node", "3", "--nics-per-node", "2", "--dry-run",
                    "-x", "FOO=bar", "--mpirun", "--mca", "btl_tcp_links", "2", "--", "prog", "arg"});
  EXPECT_EQ(dry.exitCode, 0) << dry.err;
  for (const char* want : {" mpirun --allow-run-as-root ", " -np 6 ", " --map-by slot ",
                           " --mca oob_tcp_if_include zpnic0 ", " --mca btl self,vader,tcp ",
                           " --mca btl_tcp_if_include zpnic0,zpnic1 ", "--mpirun-agent zp",
                           " -x ZP_LOCAL_NRANKS=3 ", " -x ZP_HOST_RANKS=6 ", " -x ZP_NICS_PER_NODE=2 ", " -x FOO=bar ",
                           " --mca btl_tcp_links 2 prog arg\n"})
    EXPECT_NE(dry.out.find(want), std::string::npos) << want << "\n" << dry.out;

  REQUIRE_ROOT();
  int code = 0;
  capture({"sh", "-c", "command -v mpirun"}, &code);
  if (code != 0) GTEST_SKIP() << "mpirun (Open MPI) is not installed";
  const std::string script =
      "echo \"host $(hostname)\"; echo \"boot $(cat /proc/sys/kernel/random/boot_id)\"; "
      "env | grep '^ZP_' | sort; for d in /sys/class/net/*; do echo \"sysnet ${d##*/}\"; done; "
      "echo \"resolve $(getent hosts $(hostname | sed 's/-node[0-9]*$/-node1/'))\"";
  Result r = run({"--nodes", "2", "--ranks-per-node", "2", "--nics-per-node", "2", "--nic-rate",
                  "500mbit", "--timeout", "120", "--mpirun", "--tag-output", "--", "sh", "-c", script});
  ASSERT_EQ(r.exitCode, 0) << r.err << r.out;
  // "[1,RANK]<stdout>:TEXT" lines.
  std::map<int, std::vector<std::string>> ranks;
  for (const std::string& l : lines(r.out)) {
    size_t comma = l.find(','), end = l.find("]<stdout>:");
    if (l.compare(0, 1, "[") != 0 || comma == std::string::npos || end == std::string::npos) continue;
    ranks[atoi(l.substr(comma + 1, end - comma - 1).c_str())].push_back(l.substr(end + 10));
  }
  ASSERT_EQ(ranks.size(), 4u) << r.out;
  for (int rank = 0; rank < 4; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank));
    const auto& ls = ranks[rank];
    const int node = rank / 2;  // node by node, as zprun places its own ranks
    const std::string host = field(ls, "host ");
    EXPECT_EQ(host.substr(0, host.find('-') + 1), "zp" + std::to_string(r.pid) + "-");
    EXPECT_EQ(host.substr(host.rfind('-')), "-node" + std::to_string(node));
    EXPECT_EQ(host, field(ranks[node * 2], "host "));
    EXPECT_EQ(field(ls, "boot "), field(ranks[node * 2], "boot "));
    EXPECT_EQ(withPrefix(ls, "sysnet "), (std::vector<std::string>{"lo", "zpnic0", "zpnic1"}));
    EXPECT_EQ(field(ls, "ZP_LOCAL_NRANKS="), "2");
    EXPECT_EQ(field(ls, "ZP_HOST_RANKS="), "4");
    EXPECT_EQ(field(ls, "ZP_NNODES="), "2");
    EXPECT_EQ(field(ls, "ZP_NICS_PER_NODE="), "2");
    EXPECT_EQ(field(ls, "ZP_NIC_RATE_BPS="), "500000000");
    EXPECT_EQ(field(ls, "ZP_RANK="), "");  // the rank is MPI's
    // Node names resolve to rail-0 addresses from the cluster's own hosts file.
    std::istringstream resolved(field(ls, "resolve "));
    std::string addr, name;
    resolved >> addr >> name;
    EXPECT_EQ(addr, "10.77.0.2");
    EXPECT_EQ(name, host.substr(0, host.rfind('-')) + "-node1");
  }
  EXPECT_NE(field(ranks[0], "boot "), field(ranks[2], "boot "));
  EXPECT_NOTHING_LEFT(r.pid);
  // Nor any of mpirun's daemons (their command line names the agent).
  const std::string agent = "--mpirun-agent zp" + std::to_string(r.pid) + "-";
  std::string daemons;
  for (const std::string& l : lines(capture({"ps", "-eo", "pid,args"})))
    if (l.find(agent) != std::string::npos) daemons += l + "\n";
  EXPECT_EQ(daemons, "");
}

TEST(Cluster, FailingRankGivesItsExitCodeAndTheClusterIsRemoved) {
  REQUIRE_ROOT();
  Result r = run({"--nodes", "2", "--ranks-per-node", "2", "--grace", "1", "sh", "-c",
                  "if [ $ZP_RANK = 2 ]; then exit 7; fi; sleep 30"});
  EXPECT_EQ(r.exitCode, 7) << r.err;
  EXPECT_NE(r.err.find("rank 2 exited with code 7"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 20);
  EXPECT_NOTHING_LEFT(r.pid);
}

TEST(Cluster, ProgramThatCannotRunIsReportedAndTheClusterIsRemoved) {
  REQUIRE_ROOT();
  Result r = run({"--nodes", "2", "/nonexistent/zprun-cluster-test"});
  EXPECT_EQ(r.exitCode, 127) << r.err;
  EXPECT_NE(r.err.find("cannot execute /nonexistent/zprun-cluster-test"), std::string::npos) << r.err;
  EXPECT_NOTHING_LEFT(r.pid);
}

TEST(Cluster, TimeoutRemovesTheCluster) {
  REQUIRE_ROOT();
  Result r = run({"--nodes", "2", "--timeout", "1", "sleep", "60"});
  EXPECT_EQ(r.exitCode, 124) << r.err;
  EXPECT_LT(r.seconds, 15);
  EXPECT_NOTHING_LEFT(r.pid);
}

// A fresh directory /tmp/cluster_test_* for files the ranks write.
struct TempDir : zptest::TempDir {
  TempDir() : zptest::TempDir("cluster_test") {}
};

// How long the ranks may take to write their pid files (building the
// cluster comes first).
constexpr double kRanksStartSec = 30;

TEST(Cluster, SigintEndsTheJobAndRemovesTheCluster) {
  REQUIRE_ROOT();
  TempDir dir;
  Launch launch({"--nodes", "2", "--ranks-per-node", "2", "sh", "-c",
                 "trap 'echo got INT $ZP_RANK; exit 9' INT; echo $$ > " + dir.path() +
                     "/pid$ZP_RANK; sleep 60 & wait"});
  auto pids = waitForPidFiles(dir.path(), 4, kRanksStartSec);
  ASSERT_EQ(pids.size(), 4u);
  // The cluster exists while the job runs.
  EXPECT_FALSE(leftoversOf(launch.pid()).empty());
  kill(launch.pid(), SIGINT);
  Result r = launch.finish();
  EXPECT_EQ(r.exitCode, 9) << r.err;
  EXPECT_EQ(lines(r.out).size(), 4u) << r.out;
  EXPECT_TRUE(allDeadWithin(pids, 5));
  EXPECT_NOTHING_LEFT(r.pid);
}

TEST(Cluster, SigtermKillsStraysInsideTheNodes) {
  REQUIRE_ROOT();
  // A rank leaves a daemon behind in its node (its own session, out of reach
  // of the rank's process group); zprun still ends it and removes the node.
  TempDir dir;
  Launch launch({"--nodes", "2", "sh", "-c",
                 "setsid sleep 120 < /dev/null > /dev/null 2>&1 & echo $! > " + dir.path() +
                     "/stray$ZP_RANK; echo $$ > " + dir.path() + "/pid$ZP_RANK; exec sleep 60"});
  auto pids = waitForPidFiles(dir.path(), 2, kRanksStartSec);
  ASSERT_EQ(pids.size(), 2u);
  std::vector<pid_t> strays;
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream f(dir.path() + "/stray" + std::to_string(rank));
    long p = 0;
    if (f >> p) strays.push_back(static_cast<pid_t>(p));
  }
  ASSERT_EQ(strays.size(), 2u);
  kill(launch.pid(), SIGTERM);
  Result r = launch.finish();
  EXPECT_EQ(r.exitCode, 128 + SIGTERM) << r.err;
  EXPECT_TRUE(allDeadWithin(pids, 5));
  EXPECT_TRUE(allDeadWithin(strays, 5));
  EXPECT_NOTHING_LEFT(r.pid);
}

TEST(Cluster, SignalWhileBuildingTheClusterRemovesIt) {
  REQUIRE_ROOT();
  // A big cluster takes a while to build: SIGINT it at several points once
  // its state directory (made just before the first namespace) exists.
  for (int delayMs : {0, 20, 100}) {
    Launch launch({"--nodes", "20", "--nics-per-node", "2", "--nic-rate", "1gbit", "sleep", "60"});
    double deadline = nowSec() + 10;
    while (leftoversOf(launch.pid()).empty() && nowSec() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
    kill(launch.pid(), SIGINT);
    Result r = launch.finish();
    EXPECT_EQ(r.exitCode, 128 + SIGINT) << delayMs << " ms\n" << r.err;
    EXPECT_LT(r.seconds, 30);
    EXPECT_NOTHING_LEFT(r.pid);
  }
}

TEST(Cluster, CleanupRemovesWhatAKilledZprunLeftButNotLiveClusters) {
  REQUIRE_ROOT();
  TempDir dirA, dirB;
  // A: killed with SIGKILL, so it cannot remove its cluster.
  Launch a({"--nodes", "2", "sh", "-c", "echo $$ > " + dirA.path() + "/pid$ZP_RANK; exec sleep 60"});
  // B: alive while --cleanup runs.
  Launch b({"--nodes", "2", "sh", "-c", "echo $$ > " + dirB.path() + "/pid$ZP_RANK; exec sleep 60"});
  auto pidsA = waitForPidFiles(dirA.path(), 2, kRanksStartSec);
  auto pidsB = waitForPidFiles(dirB.path(), 2, kRanksStartSec);
  ASSERT_EQ(pidsA.size(), 2u);
  ASSERT_EQ(pidsB.size(), 2u);
  pid_t zprunA = a.pid(), zprunB = b.pid();
  kill(zprunA, SIGKILL);
  Result ra = a.finish();
  EXPECT_EQ(ra.termSignal, SIGKILL);
  EXPECT_TRUE(allDeadWithin(pidsA, 5));  // the ranks die with zprun
  auto left = leftoversOf(zprunA);
  EXPECT_EQ(left.size(), 4u);  // 2 nodes, the rails, the state directory

  Result c = run({"--cleanup"});
  EXPECT_EQ(c.exitCode, 0) << c.err;
  EXPECT_NE(c.out.find("removed network namespace zp" + std::to_string(zprunA) + "-"),
            std::string::npos)
      << c.out;
  EXPECT_NOTHING_LEFT(zprunA);
  // B's cluster is untouched and B still works.
  EXPECT_EQ(leftoversOf(zprunB).size(), 4u);
  EXPECT_EQ(c.out.find("zp" + std::to_string(zprunB) + "-"), std::string::npos) << c.out;
  kill(zprunB, SIGTERM);
  Result rb = b.finish();
  EXPECT_EQ(rb.exitCode, 128 + SIGTERM) << rb.err;
  EXPECT_NOTHING_LEFT(zprunB);
}

TEST(Cluster, ConcurrentRunsDoNotCollide) {
  REQUIRE_ROOT();
  std::string script = "echo $(hostname) $(" + findTool("ip") + " -o -4 addr show dev zpnic0 | wc -l)";
  std::vector<std::unique_ptr<Launch>> launches;
  for (int k = 0; k < 3; ++k)
    launches.emplace_back(new Launch({"--nodes", "2", "--nic-rate", "100mbit", "sh", "-c", script}));
  std::set<std::string> hosts;
  for (auto& l : launches) {
    Result r = l->finish();
    EXPECT_EQ(r.exitCode, 0) << r.err;
    for (const auto& line : lines(r.out)) hosts.insert(line);
    EXPECT_NOTHING_LEFT(r.pid);
  }
  EXPECT_EQ(hosts.size(), 6u);  // 3 runs x 2 nodes, all different
}

TEST(Cluster, DryRunPrintsTheCommandsAndBuildsNothing) {
  Result r = run({"--nodes", "2", "--ranks-per-node", "2", "--nics-per-node", "2", "--nic-rate",
                  "1gbit", "--mtu", "9000", "--dry-run", "sh", "-c", "true"});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  std::string tag = "zp" + std::to_string(r.pid) + "-";
  EXPECT_NE(r.out.find("ip netns add " + tag), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("type veth peer name node1nic1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("addr add 10.77.1.2/24 dev zpnic1"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tbf rate 1000000000bit burst"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mtu 9000"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("rank 3: node " + tag), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ip netns delete " + tag), std::string::npos) << r.out;
  EXPECT_NOTHING_LEFT(r.pid);
}

TEST(Cluster, BadClusterUsage) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--ranks-per-node", "2", "-n", "2", "true"},  // no --nodes
           {"-n", "2", "--nic-rate", "1gbit", "true"},
           {"-n", "2", "--dry-run", "true"},
           {"--nodes", "0", "true"},
           {"--nodes", "251", "true"},
           {"--nodes", "2", "--ranks-per-node", "600", "true"},  // 1200 ranks
           {"--nodes", "2", "--ranks-per-node", "2", "-n", "3", "true"},
           {"--nodes", "2", "--nics-per-node", "0", "true"},
           {"--nodes", "2", "--nics-per-node", "33", "true"},
           {"--nodes", "2", "--nic-rate", "fast", "true"},
           {"--nodes", "2", "--nic-rate", "1gbi", "true"},
           {"--nodes", "2", "--nic-rate", "-1gbit", "true"},
           {"--nodes", "2", "--nic-rate", "10kbit", "true"},
           {"--nodes", "2", "--mtu", "100", "true"},
           {"-n", "2", "--nic-rate-of", "0:0=1gbit", "true"},   // no --nodes
           {"--nodes", "2", "--nic-rate-of", "2:0=1gbit", "true"},  // node 2 of 0..1
           {"--nodes", "2", "--nic-rate-of", "1:1=1gbit", "true"},  // NIC 1 of one
           {"--nodes", "2", "--nic-rate-of", "1:0", "true"},
           {"--nodes", "2", "--nic-rate-of", "1:0=slow", "true"},
           {"--nodes", "2", "--nic-event", "1:0=down", "true"},      // no time
           {"--nodes", "2", "--nic-event", "1:0@soon=down", "true"},
           {"--nodes", "2", "--nic-event", "1:0@1s=sideways", "true"},
           {"--nodes", "2", "--nic-event", "1:0@-1s=up", "true"},
           {"--nodes", "2", "--mtu", "70000", "true"},
           {"--nodes", "2", "-x", "ZP_NODE_RANK=1", "true"},
           {"--nodes", "2", "-x", "ZP_NODE_ID=x", "true"},
           {"--nodes", "2"},  // no program
           {"--cleanup", "true"},
       }) {
    Result r = run(args);
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    EXPECT_EQ(r.exitCode, 2) << joined << "\n" << r.err;
    EXPECT_NE(r.err.find("Usage:"), std::string::npos) << joined << "\n" << r.err;
    EXPECT_NOTHING_LEFT(r.pid);
  }
}

TEST(Cluster, RateSpellings) {
  // tc's units; checked through --dry-run, which needs no privileges.
  for (const auto& c : std::vector<std::pair<std::string, std::string>>{
           {"1gbit", "1000000000"},   {"500mbit", "500000000"}, {"1.5gbit", "1500000000"},
           {"100Mbit", "100000000"}, {"125mbps", "1000000000"}, {"1000000", "1000000"},
           {"1gibit", "1073741824"}, {"20kibps", "163840"},   {"800kbit", "800000"}}) {
    Result r = run({"--nodes", "1", "--nic-rate", c.first, "--dry-run", "true"});
    EXPECT_EQ(r.exitCode, 0) << c.first << "\n" << r.err;
    EXPECT_NE(r.out.find("ZP_NIC_RATE_BPS=" + c.second + " "), std::string::npos)
        << c.first << "\n" << r.out;
  }
}

TEST(Cluster, WithoutPrivilegesFailsClearly) {
  // As nobody, with no capabilities at all.
  std::string setpriv = findTool("setpriv");
  if (access(setpriv.c_str(), X_OK) != 0) GTEST_SKIP() << "setpriv (util-linux) is not installed";
  if (getuid() != 0) {
    // Already unprivileged: zprun as we are.
    Result r = run({"--nodes", "2", "true"});
    EXPECT_EQ(r.exitCode, 3) << r.err;
    EXPECT_NE(r.err.find("needs root"), std::string::npos) << r.err;
    EXPECT_NOTHING_LEFT(r.pid);
    return;
  }
  std::vector<std::string> asNobody = {setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"};
  {
    Launch probe({"--help"}, asNobody);
    Result p = probe.finish();
    if (p.exitCode != 0) GTEST_SKIP() << "nobody cannot run " << zprunPath() << ": " << p.err;
  }
  Launch launch({"--nodes", "2", "--ranks-per-node", "2", "sh", "-c", "echo ran"}, asNobody);
  Result r = launch.finish();
  EXPECT_EQ(r.exitCode, 3) << r.err;
  EXPECT_NE(r.err.find("lacks CAP_SYS_ADMIN and CAP_NET_ADMIN"), std::string::npos) << r.err;
  EXPECT_EQ(r.out, "");
  EXPECT_NOTHING_LEFT(r.pid);

  // As root of a user namespace: the capabilities are there, but not over
  // the machine's /run; zprun says so when it tries.
  std::string unshare = findTool("unshare");
  if (access(unshare.c_str(), X_OK) != 0) return;
  int code = 0;
  capture({unshare, "-U", "-r", "true"}, &code);
  if (code != 0) return;  // user namespaces are disabled here
  Launch inUserns({"--nodes", "2", "sh", "-c", "echo ran"}, {unshare, "-U", "-r"});
  Result u = inUserns.finish();
  EXPECT_EQ(u.exitCode, 3) << u.err;
  EXPECT_NE(u.err.find("needs root"), std::string::npos) << u.err;
  EXPECT_EQ(u.out, "");
  EXPECT_NOTHING_LEFT(u.pid);
}

}  // namespace
