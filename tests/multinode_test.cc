// Zeppelin across nodes: zprun builds an emulated cluster (network
// namespaces, rate-limited NICs) and runs zp_multinode_rank in it. Needs
// root (CI has it); without, the tests skip and say why.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace {

struct CommandResult {
  int status = -1;
  std::string output;
};

CommandResult run(const std::string& cmd) {
  CommandResult r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof(buf), p)) r.output.append(buf, n);
  r.status = pclose(p);
  return r;
}

// Namespaces whose names zprun's runs use; none may outlive a run.
std::string zpNamespaces() {
  std::string out;
  for (const std::string& line : {run("ip netns list").output})
    for (size_t pos = 0; (pos = line.find("zp", pos)) != std::string::npos; pos++)
      if (pos == 0 || line[pos - 1] == '\n') out += line.substr(pos, line.find('\n', pos) - pos) + " ";
  return out;
}

size_t countLines(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t pos = 0; (pos = text.find(needle, pos)) != std::string::npos; pos += needle.size()) n++;
  return n;
}

class Multinode : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to make network namespaces (CI runs as root)";
    before_ = zpNamespaces();
  }
  void TearDown() override {
    if (geteuid() == 0) EXPECT_EQ(zpNamespaces(), before_) << "a namespace of the emulated cluster was left behind";
  }
  // zprunArgs: more of zprun's options (a NIC's own rate, NIC events).
  CommandResult zprun(int nodes, int rpn, int nics, const std::string& env, const std::string& zprunArgs = "") {
    std::string cmd = env + " " ZPRUN_PATH " --timeout 240 --stacks --nodes " + std::to_string(nodes) + " --ranks-per-node " +
                      std::to_string(rpn) + " --nics-per-node " + std::to_string(nics) + " --nic-rate 1gbit " +
                      zprunArgs + " " + ZP_MULTINODE_RANK_PATH;
    return run(cmd);
  }
  std::string before_;
};

struct Shape {
  int nodes, rpn, nics;
};

class MultinodeShapes : public Multinode, public ::testing::WithParamInterface<Shape> {
 protected:
  // Runs ZP_TEST_MODE=mode with routing off, on, and relaying every
  // transfer in small chunks; every rank must say it is ok.
  void expectOkInEveryRouting(const std::string& mode) {
    const Shape& s = GetParam();
    for (const std::string& routing : {"ZP_ROUTING=off", "", "ZP_ROUTE_DIRECT_BELOW=0 ZP_ROUTE_CHUNK=64K"}) {
      const std::string env = "ZP_TEST_MODE=" + mode + " " + routing;
      CommandResult r = zprun(s.nodes, s.rpn, s.nics, env);
      EXPECT_EQ(r.status, 0) << env << "\n" << r.output;
      EXPECT_EQ(countLines(r.output, ": ok"), (size_t)(s.nodes * s.rpn)) << env << "\n" << r.output;
    }
  }
};

// A NIC of the sending node fails in the middle of a 256 MiB routed send:
// the bytes arrive intact on the other NICs, the failure is logged once with
// the NIC's name, and the communicator goes on working without it.
// With 4 MiB chunks a relayed chunk is almost surely half received when the
// NIC goes down: its receive can then be neither cancelled nor completed,
// and destroy must still free it (every rank checks that no UCX request is
// left; with 512 KiB chunks that case came up in 3 runs of 5).
TEST_F(Multinode, NicDownInTheMiddleOfARoutedTransfer) {
  for (const char* env : {"ZP_TEST_MODE=nicdown", "ZP_TEST_MODE=nicdown ZP_ROUTE_CHUNK=4M"}) {
    CommandResult r = zprun(2, 4, 4, env);
    EXPECT_EQ(r.status, 0) << env << "\n" << r.output;
    EXPECT_EQ(countLines(r.output, ": ok"), 8u) << env << "\n" << r.output;
    EXPECT_EQ(countLines(r.output, "NIC zpnic3 (rail 3 of node 0) is down"), 1u) << env << "\n" << r.output;
  }
}

// Node 0's last NIC is down, so its rank reaches node 1 only through the
// node's other ranks; they (and node 1's other ranks) destroy the
// communicator 50 ms into a 64 MiB exchange between it and node 1's first
// rank. They must stay for it: the exchange completes, every byte checked,
// and every rank's destroy succeeds (they used to leave at once: the
// exchange then had no path and both ends waited until ZP_TIMEOUT).
TEST_F(Multinode, ProxiesStayForARankWithoutANicWhenTheyLeave) {
  CommandResult r = zprun(2, 4, 4, "ZP_TEST_MODE=nicdownleave ZP_TIMEOUT=20");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, " of 8: ok"), 8u) << r.output;
}

// Every NIC of a node fails during a transfer: no path is left, and every
// rank returns an error within the timeout instead of hanging.
TEST_F(Multinode, NoPathLeftGivesAnErrorOnEveryRank) {
  CommandResult r = zprun(2, 2, 2, "ZP_TEST_MODE=alldown ZP_TIMEOUT=10");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, "error as expected"), 4u) << r.output;
}

// Measured rails (src/route/rail_rates.h). One NIC of node 1 runs at a
// tenth of the others' rate: every rank of both nodes names it once (with
// two nodes a slow path cannot be pinned on one end), the rail report says
// so, and the routed sends move off it: the last round takes well under
// the first (nominal split: the slow NIC's quarter sets the time).
TEST_F(Multinode, ASlowNicIsNamedAndRoutedAround) {
  CommandResult r = zprun(2, 4, 4, "ZP_TEST_MODE=rails ZP_TEST_SECONDS=6 ZP_TIMEOUT=60", "--nic-rate-of 1:2=100mbit");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, " of 8: ok"), 8u) << r.output;
  EXPECT_EQ(countLines(r.output, "(rail 2 of node 1) moves"), 4u) << r.output;
  EXPECT_EQ(countLines(r.output, "(rail 2 of node 0) moves"), 4u) << r.output;
  EXPECT_EQ(countLines(r.output, "routing around it"), 8u) << r.output;
  EXPECT_EQ(countLines(r.output, ": rail 2 zpnic2: slow"), 8u) << r.output;
  EXPECT_EQ(countLines(r.output, ": healthy"), 24u) << r.output;
  double first = 0, last = 0;
  size_t at = r.output.find("rounds of");
  ASSERT_NE(at, std::string::npos) << r.output;
  ASSERT_EQ(sscanf(r.output.c_str() + r.output.find("the first", at), "the first %lf ms, the last %lf ms", &first, &last),
            2)
      << r.output;
  EXPECT_LT(last, 0.6 * first) << r.output;
}

// Every NIC at its rate: nothing is named, whatever the noise of the machine.
TEST_F(Multinode, EvenRailsAreNeverNamed) {
  CommandResult r = zprun(2, 4, 4, "ZP_TEST_MODE=rails ZP_TEST_SECONDS=6 ZP_TIMEOUT=60");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, " of 8: ok"), 8u) << r.output;
  EXPECT_EQ(countLines(r.output, "routing around it"), 0u) << r.output;
  EXPECT_EQ(countLines(r.output, ": healthy"), 32u) << r.output;
}

// The slow NIC comes back to its rate while the job runs: it is named back
// and takes its full share again.
TEST_F(Multinode, ARecoveredNicGetsItsShareBack) {
  CommandResult r = zprun(2, 4, 4, "ZP_TEST_MODE=rails ZP_TEST_SECONDS=12 ZP_TIMEOUT=60",
                          "--nic-rate-of 1:2=100mbit --nic-event 1:2@6s=1gbit");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, " of 8: ok"), 8u) << r.output;
  // Named and named back on every rank (a rank may see the NIC's last slow
  // samples after its first fast ones, and change once more each way).
  EXPECT_GE(countLines(r.output, "routing around it"), 8u) << r.output;
  EXPECT_GE(countLines(r.output, "back to its full share"), 8u) << r.output;
  EXPECT_EQ(countLines(r.output, ": healthy"), 32u) << r.output;
}

// A NIC that flaps between its rate and a tenth of it every 500 ms for 30 s:
// every byte arrives, no call fails, and the rails change state at most
// once per second each (RailRates::kDwellUs).
TEST_F(Multinode, AFlappingNicLosesNothing) {
  std::string events;
  for (int i = 1; i <= 60; i++)
    events += " --nic-event 1:2@" + std::to_string(i * 500) + "ms=" + (i % 2 ? "100mbit" : "1gbit");
  CommandResult r = zprun(2, 4, 4, "ZP_TEST_MODE=rails ZP_TEST_SECONDS=30 ZP_TIMEOUT=60", events);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, " of 8: ok"), 8u) << r.output;
  size_t changes = countLines(r.output, "routing around it") + countLines(r.output, "back to its full share");
  EXPECT_LE(changes, 8u * 31) << r.output;
}

// Stragglers located in zpAlltoallv across nodes: the last rank sleeps 50
// ms before each of 40 alltoallvs, routed (the count rows it gathers first)
// and with routing off (its messages' first bytes over UCX and shared
// memory); every other rank's wait report names it, each in one WARN line,
// and nobody is named in a run without it. A relayed row's arrival includes
// the relay hops' latency, much the same for a pair in every call: with
// the 2 cores of the test machine loaded (load 15) that came to 11 ms on
// average for one pair in about half the calls (named at the default 10 ms
// in a run without a laggard), so the threshold here is half the lag.
TEST_F(Multinode, ARankThatLagsBeforeAlltoallvsIsNamed) {
  for (const char* routing : {"", "ZP_ROUTING=off "}) {
    const std::string env = std::string(routing) + "ZP_TEST_MODE=lag ZP_TIMEOUT=60 ZP_STRAGGLER_MS=25";
    CommandResult r = zprun(2, 2, 2, env);
    EXPECT_EQ(r.status, 0) << env << "\n" << r.output;
    EXPECT_EQ(countLines(r.output, ": ok"), 4u) << env << "\n" << r.output;
    EXPECT_EQ(countLines(r.output, ": rank 3 came last in"), 3u) << env << "\n" << r.output;
    EXPECT_EQ(countLines(r.output, "came last in"), 3u) << env << "\n" << r.output;
    r = zprun(2, 2, 2, env + " ZP_TEST_VICTIM=-1");
    EXPECT_EQ(r.status, 0) << env << "\n" << r.output;
    EXPECT_EQ(countLines(r.output, ": ok"), 4u) << env << "\n" << r.output;
    EXPECT_EQ(countLines(r.output, "came last in"), 0u) << env << "\n" << r.output;
  }
}

TEST_P(MultinodeShapes, RemapRoundTripsEveryByteAcrossNodes) {
  const Shape& s = GetParam();
  CommandResult r = zprun(s.nodes, s.rpn, s.nics, "ZP_TEST_MODE=remap");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, ": ok"), (size_t)(s.nodes * s.rpn)) << r.output;
}

// The standard collectives across nodes, routing on and off.
TEST_P(MultinodeShapes, CollectivesAcrossNodesEveryElementChecked) {
  const Shape& s = GetParam();
  for (const char* env : {"ZP_TEST_MODE=collectives", "ZP_TEST_MODE=collectives ZP_ROUTING=off"}) {
    CommandResult r = zprun(s.nodes, s.rpn, s.nics, env);
    EXPECT_EQ(r.status, 0) << env << "\n" << r.output;
    EXPECT_EQ(countLines(r.output, ": ok"), (size_t)(s.nodes * s.rpn)) << env << "\n" << r.output;
  }
}

// ZeRO's collectives, all-gather(v) and reduce-scatter(v), on the
// hierarchical path (every count, ZP_COLL_RING_ABOVE=0), routing on (the
// rail ring's messages cut into slices below ZP_ROUTE_DIRECT_BELOW: 512K,
// and 16K for many uneven slices, each type once, without the MiB calls)
// and off; but for the 16K run, each node's NICs must share the cross-node
// bytes evenly. Routing off, on 3 nodes of 2 ranks, is where a peer's
// goodbye was taken for the loss of what it had sent before (UCX: the
// goodbye says which messages were sent and received, and a receive of one
// that waits unmatched after the connection closed is still posted).
TEST_P(MultinodeShapes, ZeroCollectivesAcrossNodesEveryElementChecked) {
  const Shape& s = GetParam();
  for (const char* env : {"ZP_TEST_MODE=zero ZP_COLL_RING_ABOVE=0",
                          "ZP_TEST_MODE=zero ZP_COLL_RING_ABOVE=0 ZP_ROUTE_DIRECT_BELOW=16K ZP_TEST_MAX_COUNT=100000 "
                          "ZP_TEST_ROUNDS=10",
                          "ZP_TEST_MODE=zero ZP_COLL_RING_ABOVE=0 ZP_ROUTING=off"}) {
    CommandResult r = zprun(s.nodes, s.rpn, s.nics, env);
    EXPECT_EQ(r.status, 0) << env << "\n" << r.output;
    EXPECT_EQ(countLines(r.output, ": ok"), (size_t)(s.nodes * s.rpn)) << env << "\n" << r.output;
    if (std::string(env).find("16K") == std::string::npos)  // routing off, or slices that go direct
      EXPECT_EQ(countLines(r.output, "KiB sent by each NIC"), (size_t)(2 * s.nodes)) << env << "\n" << r.output;
  }
}

// Messages a rank sent just before it destroyed its communicator, asked
// for only after the receiver has heard its goodbye (routing off: and seen
// its connection close): they still arrive (UCX keeps them unmatched in the
// worker; the relay has them acknowledged before it leaves); a receive of a
// message never sent fails at once, the sender's goodbye says so (routing
// on: the relay's leaving message, which counts the messages sent; it used
// to fail only when the leaving ranks gave up waiting for the receiver, at
// ZP_TIMEOUT). zpCommDestroy waits for no timeout either (ZP_TIMEOUT=60
// here; the receiver checks its receive within 3 s, every rank its destroy
// within 10 s).
TEST_F(Multinode, MessagesSentBeforeAGoodbyeArriveAfterTheConnectionCloses) {
  for (const char* env : {"ZP_TEST_MODE=late ZP_TIMEOUT=60 ZP_ROUTING=off",
                          "ZP_TEST_MODE=late ZP_TIMEOUT=60 ZP_ROUTING=balanced"}) {
    CommandResult r = zprun(2, 2, 2, env);
    EXPECT_EQ(r.status, 0) << env << "\n" << r.output;
    EXPECT_EQ(countLines(r.output, ": ok"), 4u) << env << "\n" << r.output;
    EXPECT_EQ(countLines(r.output, "waiting for the ranks whose traffic"), 0u) << env << "\n" << r.output;
  }
}

// With routing on, ranks that finish early destroy the communicator while
// the first rank of each node still runs routed traffic (every byte
// checked): their destroy returns within 1.5 s instead of waiting for the
// workers to come to destroy, and the workers' paths avoid them from then
// on (balanced, and rail mode; 2 and 4 ranks per node).
TEST_F(Multinode, RanksThatFinishEarlyLeaveWhileOthersRunRoutedTraffic) {
  for (const auto& c : {std::make_pair(2, "ZP_ROUTING=balanced"), std::make_pair(2, "ZP_ROUTING=rail"),
                        std::make_pair(4, "ZP_ROUTING=balanced")}) {
    const std::string env = std::string("ZP_TEST_MODE=earlybye ZP_TIMEOUT=60 ") + c.second;
    CommandResult r = zprun(2, c.first, c.first, env);
    EXPECT_EQ(r.status, 0) << env << "\n" << r.output;
    EXPECT_EQ(countLines(r.output, ": ok"), (size_t)(2 * c.first)) << env << "\n" << r.output;
  }
}

// One rank per node, three nodes: the hierarchical all-reduce's node steps
// are empty and its rail ring spans every rank.
TEST_F(Multinode, CollectivesWithOneRankPerNode) {
  for (const char* env : {"ZP_TEST_MODE=collectives", "ZP_TEST_MODE=slices ZP_COLL_RING_ABOVE=0 ZP_COLL_SLICE=4K"}) {
    CommandResult r = zprun(3, 1, 1, env);
    EXPECT_EQ(r.status, 0) << env << "\n" << r.output;
    EXPECT_EQ(countLines(r.output, ": ok"), 3u) << env << "\n" << r.output;
  }
}

// The hierarchical all-reduce pipelined in slices, every count on the
// hierarchical path: slices of 8 bytes (one element or none: more slices
// than some shards have elements) for counts up to 31; slices of 16K
// (uneven, up to 25 of them) for every count, relayed in small chunks.
TEST_P(MultinodeShapes, PipelinedAllReduceSlicesEveryElementChecked) {
  const Shape& s = GetParam();
  for (const char* env : {"ZP_TEST_MODE=slices ZP_TEST_MAX_COUNT=31 ZP_COLL_RING_ABOVE=0 ZP_COLL_SLICE=8",
                          "ZP_TEST_MODE=slices ZP_COLL_RING_ABOVE=0 ZP_COLL_SLICE=16K ZP_ROUTE_DIRECT_BELOW=0 "
                          "ZP_ROUTE_CHUNK=4K"}) {
    CommandResult r = zprun(s.nodes, s.rpn, s.nics, env);
    EXPECT_EQ(r.status, 0) << env << "\n" << r.output;
    EXPECT_EQ(countLines(r.output, ": ok"), (size_t)(s.nodes * s.rpn)) << env << "\n" << r.output;
  }
}

// Ring attention across nodes (rings over nodes go through the router)
// against the float64 reference.
TEST_P(MultinodeShapes, RingAttentionMatchesTheReferenceAcrossNodes) {
  const Shape& s = GetParam();
  CommandResult r = zprun(s.nodes, s.rpn, s.nics, "ZP_TEST_MODE=attention");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, ": ok"), (size_t)(s.nodes * s.rpn)) << r.output;
  // The same with every inter-node block and gradient relayed in small
  // chunks through the proxies of every NIC (the test's blocks are small).
  r = zprun(s.nodes, s.rpn, s.nics, "ZP_TEST_MODE=attention ZP_ROUTE_DIRECT_BELOW=0 ZP_ROUTE_CHUNK=4K");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, ": ok"), (size_t)(s.nodes * s.rpn)) << r.output;
}

#ifdef ZP_MULTINODE_RANK_DOUBLE_PATH
// Device buffers across nodes, on the CUDA/NCCL test double (whose NCCL
// ranks meet on socket files, so across the cluster's network namespaces):
// alltoallv every byte checked, and the attention driver on rings that
// span nodes against the host driver.
TEST_F(Multinode, DeviceCallsAcrossNodesOnTheDouble) {
  CommandResult r = run("ZP_TEST_MODE=device ZP_CHECK_MODE=full " ZPRUN_PATH
                        " --timeout 240 --nodes 2 --ranks-per-node 2 --nics-per-node 2 --nic-rate 1gbit "
                        ZP_MULTINODE_RANK_DOUBLE_PATH);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, ": ok"), 4u) << r.output;
}

// A slow NIC steers the routed device alltoallv too: once host traffic has
// every rank name node 1's NIC 2 slow, the device path plans with the same
// rail reports, so the proxy of rail 2 carries a small share of a device
// transfer (the relay's schedule, run as NCCL steps); every byte checked.
TEST_F(Multinode, ASlowRailSteersTheRoutedDeviceAlltoallvOnTheDouble) {
  CommandResult r = run("ZP_TEST_MODE=devslow ZP_TIMEOUT=60 " ZPRUN_PATH
                        " --timeout 180 --nodes 2 --ranks-per-node 4 --nics-per-node 4 --nic-rate 1gbit"
                        " --nic-rate-of 1:2=100mbit " ZP_MULTINODE_RANK_DOUBLE_PATH);
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, " of 8: ok"), 8u) << r.output;
}

// Routed alltoallv on device buffers: the router's plans as NCCL steps
// (dispatch, proxy-to-proxy transfer, combine) in small chunks, with routing
// off, rail and balanced; every byte checked, the double's byte counters
// showing that the proxies carried the inter-node bytes, mismatched counts
// an error on every rank (checks on: ZP_CHECK_MODE=full, which routing off
// needs to see them).
TEST_P(MultinodeShapes, RoutedDeviceAlltoallvOnTheDouble) {
  const Shape& s = GetParam();
  for (const char* routing : {"balanced", "rail", "off"}) {
    CommandResult r = run(std::string("ZP_TEST_MODE=devroute ZP_CHECK_MODE=full ZP_ROUTE_CHUNK=16K ZP_ROUTE_DIRECT_BELOW=0 ZP_TIMEOUT=60 ") +
                          "ZP_ROUTING=" + routing + " " ZPRUN_PATH " --timeout 120 --nodes " + std::to_string(s.nodes) +
                          " --ranks-per-node " + std::to_string(s.rpn) + " --nics-per-node " +
                          std::to_string(s.nics) + " --nic-rate 1gbit " ZP_MULTINODE_RANK_DOUBLE_PATH);
    EXPECT_EQ(r.status, 0) << routing << "\n" << r.output;
    EXPECT_EQ(countLines(r.output, ": ok"), (size_t)(s.nodes * s.rpn)) << routing << "\n" << r.output;
  }
}
#endif

TEST_P(MultinodeShapes, AlltoallvAndSendRecvEveryByteChecked) {
  Shape s = GetParam();
  CommandResult r = zprun(s.nodes, s.rpn, s.nics, "");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, ": ok"), (size_t)(s.nodes * s.rpn)) << r.output;
}

TEST_P(MultinodeShapes, EveryTransferRelayedInSmallChunksEveryByteChecked) {
  // No transfer below the direct threshold, and many chunks per transfer:
  // every byte across nodes goes through the relay, most through proxies.
  Shape s = GetParam();
  CommandResult r = zprun(s.nodes, s.rpn, s.nics, "ZP_ROUTE_DIRECT_BELOW=0 ZP_ROUTE_CHUNK=64K");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, ": ok"), (size_t)(s.nodes * s.rpn)) << r.output;
}

TEST_P(MultinodeShapes, WithRoutingOffEveryByteChecked) {
  // Each rank straight to its peers over the network, no relays through the node's rails.
  Shape s = GetParam();
  CommandResult r = zprun(s.nodes, s.rpn, s.nics, "ZP_ROUTING=off");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, ": ok"), (size_t)(s.nodes * s.rpn)) << r.output;
}

// A receive of another count than its send's fails and writes nothing,
// whichever way the bytes come: straight over UCX (eager and rendezvous),
// relayed through proxies, or direct below the relay's threshold.
TEST_P(MultinodeShapes, RefusedReceiveWritesNothing) { expectOkInEveryRouting("refused"); }

// One rank refuses its arguments across nodes (routing off, on, and relayed
// in small chunks): every rank fails the call, the others naming it and its
// reason, and the next call runs (the header round and alltoallv's count
// exchange through the relay).
TEST_P(MultinodeShapes, OneRanksRefusedCallFailsOnEveryRankAndTheNextRuns) { expectOkInEveryRouting("refusal"); }

// Receives from any source across nodes (any_source_check.h): each
// sender's messages in order with the sender reported, named receives
// after wildcards, groups with rings and sends to self, a collective's
// messages left alone, a refused count writing nothing; every byte checked,
// whichever way the bytes come (UCX, the relay, small relayed chunks).
TEST_P(MultinodeShapes, ReceivesFromAnySourceEveryByteChecked) { expectOkInEveryRouting("anysource"); }

// One NIC per node: with routing on, transfers go straight over UCX.
TEST_F(Multinode, RefusedReceiveWritesNothingOnOneRail) {
  CommandResult r = zprun(2, 2, 1, "ZP_TEST_MODE=refused");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, ": ok"), 4u) << r.output;
}

TEST_P(MultinodeShapes, SendRecvIsRelayedByProxiesWhoseRanksSleep) {
  Shape s = GetParam();
  CommandResult r = zprun(s.nodes, s.rpn, s.nics, "ZP_TEST_MODE=idle");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, ": ok"), (size_t)(s.nodes * s.rpn)) << r.output;
}

TEST_P(MultinodeShapes, ForeignConnectionsAreDroppedAndTheCommunicatorWorks) {
  Shape s = GetParam();
  CommandResult r = zprun(s.nodes, s.rpn, s.nics, "ZP_TEST_MODE=foreign");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(countLines(r.output, ": ok"), (size_t)(s.nodes * s.rpn)) << r.output;
  EXPECT_NE(r.output.find("dropped connection"), std::string::npos) << "the root should log what it dropped\n"
                                                                     << r.output;
}

TEST_P(MultinodeShapes, KilledRankOnAnotherNodeGivesRemoteErrorEverywhere) {
  Shape s = GetParam();
  int n = s.nodes * s.rpn;
  // The victim is on the last node; every other rank must see zpRemoteError
  // within the timeout (death is noticed well before it).
  CommandResult r = zprun(s.nodes, s.rpn, s.nics, "ZP_TEST_MODE=kill ZP_TEST_VICTIM=" + std::to_string(n - 1) + " ZP_TIMEOUT=60");
  EXPECT_NE(r.status, 0) << "zprun must report the killed rank\n" << r.output;
  EXPECT_NE(r.output.find("killed by signal"), std::string::npos) << r.output;
  EXPECT_EQ(countLines(r.output, "remote error as expected"), (size_t)(n - 1)) << r.output;
  EXPECT_EQ(countLines(r.output, "WRONG ERROR"), 0u) << r.output;
}

// A rank dies in the middle of a 64 MiB hierarchical all-reduce on 2
// nodes x 2 ranks: before the call, in the node's reduce-scatter (early in
// the pipeline of slices), once its own shard is reduced in the node (the
// ring over the NICs under way; ZP_TEST_MODE=killcoll, which prints how
// much of its output the victim had when it died). Every survivor returns
// zpRemoteError within ZP_TIMEOUT (or, if its part was done, the exact
// result), writes nothing outside its buffers, and aborts or destroys.
TEST_F(Multinode, ADeadRankInTheMiddleOfTheHierarchicalAllReduce) {
  // Not "rail" (a death once the victim's shard is reduced, while the ring
  // runs over the NICs): there UCX 1.13.1 itself aborts a survivor in about
  // 2% of runs (an assertion inside ucp_worker_progress, docs/collectives.md),
  // which would make this test flaky; run it by hand with
  // ZP_TEST_KILL_AT=rail ZP_TEST_VICTIM=2. "node" (2 ms in) runs
  // kNodeRuns times: now and then a survivor on the other node learns of the
  // death from its peers before its own UCX endpoint to the victim fails,
  // with a rendezvous from the victim under way; UcxTransport::dropOps used
  // to wait 5 s for it, past ZP_TIMEOUT=3 (issue 28, item 5).
  constexpr int kNodeRuns = 30;
  std::vector<std::pair<const char*, int>> cases = {{"before", 3}};
  for (int i = 0; i < kNodeRuns; i++) cases.push_back({"node", 1});
  for (const auto& [at, victim] : cases) {
    const std::string env = std::string("ZP_TEST_MODE=killcoll ZP_TIMEOUT=3 ZP_TEST_KILL_AT=") + at +
                            " ZP_TEST_VICTIM=" + std::to_string(victim);
    CommandResult r = zprun(2, 2, 2, env);
    EXPECT_NE(r.status, 0) << "zprun must report the killed rank\n" << r.output;
    EXPECT_NE(r.output.find("killed by signal"), std::string::npos) << env << "\n" << r.output;
    const size_t failed = countLines(r.output, "remote error as expected"), finished = countLines(r.output, "finished right");
    EXPECT_EQ(failed + finished, 3u) << env << "\n" << r.output;
    EXPECT_GE(failed, 1u) << env << "\n" << r.output;
    if (std::string(at) != "rail") EXPECT_EQ(failed, 3u) << env << "\n" << r.output;
    // In the node's reduce-scatter (of the pipeline's first slices): its
    // own shard (512 of the 1024 samples) not all reduced yet. In the ring:
    // all of it reduced.
    const size_t k = r.output.find("killed (");
    const int samples = k == std::string::npos ? -1 : atoi(r.output.c_str() + k + 8);
    if (std::string(at) == "node") EXPECT_TRUE(samples >= 0 && samples < 512) << env << "\n" << r.output;
    if (std::string(at) == "rail") EXPECT_GE(samples, 512) << env << "\n" << r.output;
    EXPECT_EQ(countLines(r.output, "killed too late"), 0u) << env << "\n" << r.output;
    if (std::string(at) != "node" || ::testing::Test::HasFailure()) std::printf("%s\n%s", env.c_str(), r.output.c_str());
    if (::testing::Test::HasFailure()) break;
  }
}

INSTANTIATE_TEST_SUITE_P(Clusters, MultinodeShapes,
                         ::testing::Values(Shape{2, 2, 2}, Shape{2, 4, 4}, Shape{3, 2, 2}),
                         [](const ::testing::TestParamInfo<Shape>& i) {
                           return std::to_string(i.param.nodes) + "x" + std::to_string(i.param.rpn) + "x" +
                                  std::to_string(i.param.nics);
                         });

}  // namespace
