// Bad input: every error returns the documented code and leaves a message in
// zpGetLastError; nothing crashes, hangs, or writes where it must not. Ranks
// that disagree (counts, call order) get zpInvalidUsage or another error
// within the timeout, and a communicator survives argument errors and count
// mismatches.
#include <climits>
#include <condition_variable>
#include <mutex>
#include <cstring>
#include <set>

#include <sys/stat.h>

#include "src/core/bootstrap.h"
#include "src/core/topology.h"
#include "tests/harness.h"
#include "tests/process_util.h"

namespace {

using zptest::AlltoallvRun;
using zptest::GuardedBuffer;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string lowercase(std::string s) {
  for (char& c : s) c = (char)tolower((unsigned char)c);
  return s;
}

// ---- Calls that need no communicator ----

TEST(ErrorStrings, EveryResultCodeHasItsOwnString) {
  std::set<std::string> seen;
  for (int r = 0; r < zpNumResults; r++) {
    const char* s = zpGetErrorString((zpResult_t)r);
    ASSERT_NE(s, nullptr) << r;
    EXPECT_STRNE(s, "") << r;
    EXPECT_TRUE(seen.insert(s).second) << "two codes share the string '" << s << "'";
  }
  for (int r : {(int)zpNumResults, 99, -1, INT_MAX}) {
    ASSERT_NE(zpGetErrorString((zpResult_t)r), nullptr) << r;
    EXPECT_STRNE(zpGetErrorString((zpResult_t)r), "") << r;
  }
}

TEST(Version, GetVersionReturnsTheHeadersVersion) {
  int v = -1;
  ZP_EXPECT_OK(zpGetVersion(&v));
  EXPECT_EQ(v, ZP_VERSION_CODE);
  EXPECT_EQ(ZP_VERSION_CODE, ZP_VERSION(ZP_MAJOR, ZP_MINOR, ZP_PATCH));
  ZP_EXPECT_ERROR(zpInvalidArgument, zpGetVersion(nullptr));
}

TEST(TypeSize, EveryTypeHasItsSizeAndInvalidOnesZero) {
  const size_t sizes[zpNumTypes] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2};
  for (int t = 0; t < zpNumTypes; t++) EXPECT_EQ(zpTypeSize((zpDataType_t)t), sizes[t]) << t;
  for (int t : {(int)zpNumTypes, 42, -1, INT_MIN}) EXPECT_EQ(zpTypeSize((zpDataType_t)t), 0u) << t;
}

TEST(Errors, GetUniqueIdWithNullIsInvalidArgument) { ZP_EXPECT_ERROR(zpInvalidArgument, zpGetUniqueId(nullptr)); }

TEST(Errors, GroupEndWithoutGroupStartIsInvalidUsage) {
  zptest::expectAllOk({zptest::runInChild([] {
    ZP_EXPECT_ERROR(zpInvalidUsage, zpGroupEnd());
    // Groups still work after that.
    ZP_EXPECT_OK(zpGroupStart());
    ZP_EXPECT_OK(zpGroupEnd());
    ZP_EXPECT_ERROR(zpInvalidUsage, zpGroupEnd());
  })});
}

// Every call that takes a communicator, with `comm`: each must return code.
void expectEveryCallFails(zpComm_t comm, zpResult_t code, const char* mustMention = nullptr) {
  float buf[8] = {0};
  size_t counts[2] = {1, 1}, displs[2] = {0, 1};
  int i = 0;
  zpResult_t e = zpSuccess;
  std::vector<std::pair<const char*, std::function<zpResult_t()>>> calls = {
      {"zpSend", [&] { return zpSend(buf, 1, zpFloat32, 0, comm, nullptr); }},
      {"zpRecv", [&] { return zpRecv(buf, 1, zpFloat32, 0, comm, nullptr); }},
      {"zpAlltoallv",
       [&] { return zpAlltoallv(buf, counts, displs, buf + 4, counts, displs, zpFloat32, comm, nullptr); }},
      {"zpCommCount", [&] { return zpCommCount(comm, &i); }},
      {"zpCommUserRank", [&] { return zpCommUserRank(comm, &i); }},
      {"zpCommGetAsyncError", [&] { return zpCommGetAsyncError(comm, &e); }},
      {"zpCommDestroy", [&] { return zpCommDestroy(comm); }},
      {"zpCommAbort", [&] { return zpCommAbort(comm); }},
  };
  for (auto& c : calls) {
    zp::clearLastError();
    EXPECT_EQ(c.second(), code) << c.first;
    std::string msg = zpGetLastError(nullptr);
    EXPECT_NE(msg, "") << c.first << " left no message";
    if (mustMention) {
      EXPECT_TRUE(contains(lowercase(msg), mustMention)) << c.first << ": '" << msg << "'";
    }
  }
  // Inside a group the call is refused at once, and the group stays usable.
  ZP_EXPECT_OK(zpGroupStart());
  ZP_EXPECT_ERROR(code, zpSend(buf, 1, zpFloat32, 0, comm, nullptr));
  ZP_EXPECT_OK(zpGroupEnd());
}

TEST(Errors, NullCommunicatorIsInvalidArgument) {
  zptest::expectAllOk({zptest::runInChild([] { expectEveryCallFails(nullptr, zpInvalidArgument); })});
}

TEST(Errors, GarbagePointerAsCommunicatorIsInvalidArgument) {
  zptest::expectAllOk({zptest::runInChild([] {
    // Not-a-communicator pointers: small, misaligned, stack, heap full of
    // bytes that look like pointers. None may be dereferenced.
    uint64_t onStack[16];
    for (auto& w : onStack) w = (uint64_t)(uintptr_t)&onStack[0];
    std::vector<uint64_t> onHeap(64, 0xdeadbeefdeadbeefull);
    for (zpComm_t bogus : {(zpComm_t)(uintptr_t)0x10, (zpComm_t)(uintptr_t)0x7, (zpComm_t)(uintptr_t)-1,
                           (zpComm_t)(void*)onStack, (zpComm_t)(void*)onHeap.data(),
                           (zpComm_t)(void*)((char*)onHeap.data() + 3)})
      expectEveryCallFails(bogus, zpInvalidArgument);
  })});
}

TEST(Errors, DestroyedCommunicatorIsInvalidArgumentMentioningDestroyed) {
  auto exits = zptest::runRanks(2, [](int rank, int n, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, n, id);
    ZP_EXPECT_OK(zpCommDestroy(comm));
    expectEveryCallFails(comm, zpInvalidArgument, "destroyed");
  });
  zptest::expectAllOk(exits);
}

TEST(Errors, AbortedCommunicatorIsInvalidArgumentMentioningDestroyed) {
  auto exits = zptest::runRanks(2, [](int rank, int n, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, n, id);
    ZP_EXPECT_OK(zpCommAbort(comm));
    expectEveryCallFails(comm, zpInvalidArgument, "destroyed");
  });
  zptest::expectAllOk(exits);
}

// ---- zpCommInitRank ----

// Runs fn(id) in a child with a fresh id whose root no rank will ever join:
// every init there must fail on its arguments, before any rendezvous.
void inChildWithId(const std::function<void(const zpUniqueId&)>& fn) {
  zptest::expectAllOk({zptest::runInChild([&] {
    zptest::setTimeoutSeconds(30);  // an init that wrongly goes ahead fails instead of hanging
    zpUniqueId id;
    ZP_ASSERT_OK(zpGetUniqueId(&id));
    fn(id);
  })});
}

TEST(InitErrors, NullCommPointerIsInvalidArgument) {
  inChildWithId([](const zpUniqueId& id) { ZP_EXPECT_ERROR(zpInvalidArgument, zpCommInitRank(nullptr, 1, id, 0)); });
}

TEST(InitErrors, NonPositiveNranksIsInvalidArgument) {
  inChildWithId([](const zpUniqueId& id) {
    for (int n : {0, -1, INT_MIN}) {
      zpComm_t comm = nullptr;
      ZP_EXPECT_ERROR(zpInvalidArgument, zpCommInitRank(&comm, n, id, 0));
    }
  });
}

TEST(InitErrors, RankOutOfRangeIsInvalidArgument) {
  inChildWithId([](const zpUniqueId& id) {
    for (auto nr : {std::make_pair(2, -1), std::make_pair(2, 2), std::make_pair(1, 1), std::make_pair(4, INT_MAX),
                    std::make_pair(4, INT_MIN)}) {
      zpComm_t comm = nullptr;
      ZP_EXPECT_ERROR(zpInvalidArgument, zpCommInitRank(&comm, nr.first, id, nr.second));
    }
  });
}

TEST(InitErrors, ZeroOrGarbageUniqueIdIsInvalidArgument) {
  uint64_t seed = zptest::testCaseSeed();
  inChildWithId([seed](const zpUniqueId& good) {
    zpComm_t comm = nullptr;
    zpUniqueId zero;
    memset(&zero, 0, sizeof(zero));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpCommInitRank(&comm, 1, zero, 0));
    zpUniqueId garbage;
    std::mt19937_64 rng(seed);
    for (char& c : garbage.internal) c = (char)rng();
    ZP_EXPECT_ERROR(zpInvalidArgument, zpCommInitRank(&comm, 1, garbage, 0));
    // A real id with a wrong version, or a wrong address family.
    zp::IdLayout layout;
    ASSERT_TRUE(zp::decodeId(good, &layout));
    zp::IdLayout badVersion = layout;
    badVersion.version = 77;
    ZP_EXPECT_ERROR(zpInvalidArgument, zpCommInitRank(&comm, 1, zp::encodeId(badVersion), 0));
    zp::IdLayout badFamily = layout;
    badFamily.addr.sin6_family = 12345;
    ZP_EXPECT_ERROR(zpInvalidArgument, zpCommInitRank(&comm, 1, zp::encodeId(badFamily), 0));
  });
}

TEST(InitErrors, BadConfigIsInvalidArgument) {
  inChildWithId([](const zpUniqueId& id) {
    zpComm_t comm = nullptr;
    zpConfig_t badMagic = ZP_CONFIG_INITIALIZER;
    badMagic.magic = 0x12345678;
    ZP_EXPECT_ERROR(zpInvalidArgument, zpCommInitRankConfig(&comm, 1, id, 0, &badMagic));
    zpConfig_t zeroed;
    memset(&zeroed, 0, sizeof(zeroed));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpCommInitRankConfig(&comm, 1, id, 0, &zeroed));
    for (size_t size : {(size_t)0, (size_t)1, (size_t)1 << 40}) {
      zpConfig_t badSize = ZP_CONFIG_INITIALIZER;
      badSize.size = size;
      ZP_EXPECT_ERROR(zpInvalidArgument, zpCommInitRankConfig(&comm, 1, id, 0, &badSize));
    }
    for (int t : {0, -5, INT_MIN + 1}) {
      zpConfig_t badTimeout = ZP_CONFIG_INITIALIZER;
      badTimeout.timeoutMs = t;
      ZP_EXPECT_ERROR(zpInvalidArgument, zpCommInitRankConfig(&comm, 1, id, 0, &badTimeout));
    }
    zpConfig_t badRouting = ZP_CONFIG_INITIALIZER;
    badRouting.routing = 99;
    ZP_EXPECT_ERROR(zpInvalidArgument, zpCommInitRankConfig(&comm, 1, id, 0, &badRouting));
  });
}

TEST(InitErrors, BadEnvironmentIsInvalidArgument) {
  const std::vector<std::pair<const char*, const char*>> bad = {
      {"ZP_TIMEOUT", "abc"},        {"ZP_TIMEOUT", "-1"},        {"ZP_TIMEOUT", "0"},
      {"ZP_TIMEOUT", "5s"},         {"ZP_SHM_PROTO", "fast"},    {"ZP_ROUTING", "zigzag"},
      {"ZP_SHM_RING_BYTES", "1000"}, {"ZP_SHM_RING_BYTES", "3M"}, {"ZP_SHM_EAGER", "lots"}};
  for (auto& kv : bad)
    inChildWithId([&](const zpUniqueId& id) {
      setenv(kv.first, kv.second, 1);
      zpComm_t comm = nullptr;
      SCOPED_TRACE(std::string(kv.first) + "=" + kv.second);
      ZP_EXPECT_ERROR(zpInvalidArgument, zpCommInitRank(&comm, 1, id, 0));
      EXPECT_TRUE(contains(zpGetLastError(nullptr), kv.first)) << "the message should name " << kv.first << ": "
                                                               << zpGetLastError(nullptr);
    });
}

// ZP_DEBUG_FILE naming a FIFO that nobody reads: opening it for writing
// would wait for a reader, and init used to hang there for good. It is
// refused with a warning, and the log goes to stderr. (A fresh process:
// the log reads its settings once per process.)
// A build without UCX (ZP_WITH_UCX=OFF, or AUTO without UCX) serves one
// node only: ranks that say they are on two nodes (zpConfig_t.nodeId) must
// each fail at init, in time, saying that the build has no UCX, not crash
// or hang. A build with UCX connects them instead (the multinode tests).
TEST(InitErrors, CommunicatorAcrossNodesWithoutUcxSaysSo) {
#if ZP_WITH_UCX
  GTEST_SKIP() << "this build has UCX (ZP_WITH_UCX=ON or AUTO with UCX found)";
#else
  zptest::RunOptions opts;
  opts.timeoutSec = 30;  // a rank still waiting then is hanging
  auto exits = zptest::runRanks(3, [&](int rank, int n, const zpUniqueId& id) {
    const std::string node = rank == 0 ? "node-a" : "node-b";
    zpConfig_t cfg = ZP_CONFIG_INITIALIZER;
    cfg.nodeId = node.c_str();
    zpComm_t comm = nullptr;
    zpResult_t r = zpCommInitRankConfig(&comm, n, id, rank, &cfg);
    const std::string msg = zpGetLastError(nullptr);
    EXPECT_EQ(r, zpInvalidUsage) << "rank " << rank << ": " << msg;
    EXPECT_EQ(comm, nullptr);
    EXPECT_TRUE(contains(msg, "spans 2 nodes") && contains(msg, "this build of Zeppelin has no UCX") &&
                contains(msg, "-DZP_WITH_UCX=ON"))
        << "rank " << rank << ": " << msg;
  }, opts);
  zptest::expectAllOk(exits);
#endif
}

TEST(InitErrors, DebugFileThatIsAFifoIsRefused) {
  zptest::TempDir dir("zp_fifo");
  const std::string fifo = dir.path() + "/log";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  zptest::Child c({"env", "ZP_DEBUG=INFO", "ZP_DEBUG_FILE=" + fifo, zptest::unquoted(ZPTEST_STR(ZP_C_API_CHECK_PATH))});
  zptest::Result r = c.finish(20);
  EXPECT_EQ(r.exitCode, 0) << "killed by signal " << r.termSignal << " (a hang?); stderr: " << r.err;
  EXPECT_TRUE(contains(r.err, "ZP_DEBUG_FILE=" + fifo + " is not a regular file")) << r.err;
  EXPECT_TRUE(contains(r.err, "ZP INFO")) << "the log should go to stderr: " << r.err;
}

// NCCL_DEBUG_SUBSYS=COLL's per-call lines: with ZP_DEBUG=INFO and
// ZP_DEBUG_SUBSYS=COLL every collective call logs one line with its
// arguments and an opCount (the communicator's data calls so far), and no
// send/recv line; with P2P, the reverse.
// (c_api_check in a fresh process: the log reads its settings once.)
TEST(Logging, CollAndP2PSubsystemsLogEveryCall) {
  auto run = [](const char* subsys) {
    zptest::Child c({"env", "ZP_DEBUG=INFO", std::string("ZP_DEBUG_SUBSYS=") + subsys,
                     zptest::unquoted(ZPTEST_STR(ZP_C_API_CHECK_PATH))});
    zptest::Result r = c.finish(60);
    EXPECT_EQ(r.exitCode, 0) << r.err;
    return r.err;
  };
  const std::string coll = run("COLL"), p2p = run("P2P");
  EXPECT_TRUE(contains(coll, "Alltoallv: opCount 0 sendbuff ") && contains(coll, "sends 5 receives 5 datatype float64"))
      << coll;
  EXPECT_TRUE(contains(coll, "AllReduce: opCount 3 sendbuff ") &&
              contains(coll, "count 3 datatype float64 op max root 0 ") && contains(coll, "[nranks=1] stream (nil)"))
      << coll;
  EXPECT_FALSE(contains(coll, "INFO Send: ")) << coll;
  EXPECT_TRUE(contains(p2p, "Send: opCount 1 buff ") && contains(p2p, "Recv: opCount 2 buff "))
      << "a group's send and receive, one line each: " << p2p;
  EXPECT_TRUE(contains(p2p, "count 5 datatype float64 peer 0 comm ")) << p2p;
  EXPECT_FALSE(contains(p2p, "INFO AllReduce: ") || contains(p2p, "INFO Alltoallv: ")) << p2p;
}

// ZP_TOPO_FILE naming a FIFO: opening it for reading would wait for a
// writer. It is refused as not a regular file.
TEST(InitErrors, TopoFileThatIsAFifoIsRefused) {
  zptest::TempDir dir("zp_fifo");
  const std::string fifo = dir.path() + "/topo.json";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  zptest::RankExit child = zptest::runInChild(
      [&] {
        zp::ClusterTopology t;
        EXPECT_EQ(zp::loadTopoFile(fifo, &t), zpInvalidArgument);
        EXPECT_TRUE(contains(zp::lastError(), "topology file '" + fifo + "' is not a regular file")) << zp::lastError();
      },
      20);
  EXPECT_TRUE(child.ok()) << (child.exited ? "exit code " : "signal ") << child.code;
}

// A long timeout (here 35 days) either works or is refused; they must
// not turn into a short one. Rank 1 joins 1.5 s after rank 0, which any
// timeout of more than that must allow.
TEST(InitErrors, LongTimeoutInEnvironmentWorksOrIsRefused) {
  uint64_t seed = zptest::testCaseSeed();
  for (const char* t : {"3000000"}) {
    SCOPED_TRACE(std::string("ZP_TIMEOUT=") + t);
    zpUniqueId uid;
    ASSERT_EQ(zpGetUniqueId(&uid), zpSuccess);
    zptest::RunOptions opts;
    opts.timeoutSec = 20;  // a rank still waiting then is hanging
    auto exits = zptest::runRanksWithId(uid, 2, [&](int rank, int n, const zpUniqueId& id) {
      setenv("ZP_TIMEOUT", t, 1);
      if (rank == 1) usleep(1500 * 1000);
      zpComm_t comm = nullptr;
      zpResult_t r = zpCommInitRank(&comm, n, id, rank);
      if (r == zpInvalidArgument) return;  // refused: fine
      ASSERT_EQ(r, zpSuccess) << "ZP_TIMEOUT=" << t << ": " << zpGetLastError(nullptr);
      zptest::checkedAlltoallv(comm, rank, zptest::randomCounts(n, seed, 5000, 0.1), zpInt8, seed);
      ZP_EXPECT_OK(zpCommDestroy(comm));
    }, opts);
    zptest::expectAllOk(exits);
  }
}

TEST(InitErrors, LargestTimeoutInConfigWorks) {
  uint64_t seed = zptest::testCaseSeed();
  auto exits = zptest::runRanks(2, [&](int rank, int n, const zpUniqueId& id) {
    if (rank == 1) usleep(1500 * 1000);
    zpConfig_t cfg = ZP_CONFIG_INITIALIZER;
    cfg.timeoutMs = INT_MAX;
    zpComm_t comm = nullptr;
    ZP_ASSERT_OK(zpCommInitRankConfig(&comm, n, id, rank, &cfg));
    zptest::checkedAlltoallv(comm, rank, zptest::randomCounts(n, seed, 5000, 0.1), zpInt8, seed);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

// ---- Bad arguments on a live communicator ----
// Both ranks make the same bad calls (each must be refused locally, before
// any message moves); then a checked alltoallv shows the communicator works.

void onTwoRanks(const std::function<void(zpComm_t, int rank, int n)>& body) {
  uint64_t seed = zptest::testCaseSeed();
  auto exits = zptest::runRanks(2, [&](int rank, int n, const zpUniqueId& id) {
    zptest::setTimeoutSeconds(30);  // a bad call wrongly accepted fails instead of hanging
    zpComm_t comm = zptest::initComm(rank, n, id);
    body(comm, rank, n);
    zptest::checkedAlltoallv(comm, rank, zptest::randomCounts(n, seed, 3000, 0.1), zpInt32, seed);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

// Send and receive with the same arguments both must refuse.
#define EXPECT_SEND_AND_RECV_FAIL(code, buf, count, dt, peer, comm, stream) \
  do {                                                                     \
    ZP_EXPECT_ERROR(code, zpSend(buf, count, dt, peer, comm, stream));     \
    ZP_EXPECT_ERROR(code, zpRecv(buf, count, dt, peer, comm, stream));     \
  } while (0)

TEST(ArgErrors, SendRecvNullBufferWithCountIsInvalidArgument) {
  onTwoRanks([](zpComm_t comm, int rank, int) {
    EXPECT_SEND_AND_RECV_FAIL(zpInvalidArgument, nullptr, 4, zpFloat32, 1 - rank, comm, nullptr);
    EXPECT_SEND_AND_RECV_FAIL(zpInvalidArgument, nullptr, 1, zpInt8, rank, comm, nullptr);
  });
}

TEST(ArgErrors, SendRecvHugeCountIsInvalidArgument) {
  onTwoRanks([](zpComm_t comm, int rank, int) {
    std::vector<uint8_t> buf(64);
    // (size_t)-1 and -10: negative ints cast to size_t; 2^62 floats: 2^64
    // bytes, 0 after wrapping; 2^61+1 doubles: 8 bytes after wrapping.
    for (size_t count : {(size_t)-1, (size_t)-10, (size_t)1 << 62})
      EXPECT_SEND_AND_RECV_FAIL(zpInvalidArgument, buf.data(), count, zpFloat32, 1 - rank, comm, nullptr);
    EXPECT_SEND_AND_RECV_FAIL(zpInvalidArgument, buf.data(), ((size_t)1 << 61) + 1, zpFloat64, 1 - rank, comm,
                              nullptr);
  });
}

TEST(ArgErrors, SendRecvBadPeerIsInvalidArgument) {
  onTwoRanks([](zpComm_t comm, int, int n) {
    float buf[4] = {0};
    // (-1 is ZP_ANY_SOURCE, a valid receive peer: tests/any_source_check.h.)
    for (int peer : {-2, n, n + 1, INT_MAX, INT_MIN}) {
      EXPECT_SEND_AND_RECV_FAIL(zpInvalidArgument, buf, 4, zpFloat32, peer, comm, nullptr);
      EXPECT_TRUE(contains(zpGetLastError(nullptr), std::to_string(peer)))
          << "the message should name peer " << peer << ": " << zpGetLastError(nullptr);
    }
  });
}

TEST(ArgErrors, SendRecvBadDatatypeIsInvalidArgument) {
  onTwoRanks([](zpComm_t comm, int rank, int) {
    float buf[4] = {0};
    for (int dt : {42, (int)zpNumTypes, -1, INT_MAX})
      EXPECT_SEND_AND_RECV_FAIL(zpInvalidArgument, buf, 4, (zpDataType_t)dt, 1 - rank, comm, nullptr);
  });
}

TEST(ArgErrors, SendRecvNonNullStreamIsInvalidArgument) {
  onTwoRanks([](zpComm_t comm, int rank, int) {
    float buf[4] = {0};
    EXPECT_SEND_AND_RECV_FAIL(zpInvalidArgument, buf, 4, zpFloat32, 1 - rank, comm, (zpStream_t)(uintptr_t)0x1000);
  });
}

TEST(ArgErrors, BadCallInsideGroupIsRefusedAtOnceAndTheGroupRunsTheRest) {
  uint64_t seed = zptest::testCaseSeed();
  onTwoRanks([seed](zpComm_t comm, int rank, int) {
    int peer = 1 - rank;
    GuardedBuffer send(1000, 1), recv(1000, 2);
    send.fill(seed, rank, peer);
    ZP_ASSERT_OK(zpGroupStart());
    ZP_EXPECT_OK(zpSend(send.data(), 1000, zpUint8, peer, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpSend(send.data(), 1000, zpUint8, 7, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpRecv(nullptr, 1000, zpUint8, peer, comm, nullptr));
    ZP_EXPECT_OK(zpRecv(recv.data(), 1000, zpUint8, peer, comm, nullptr));
    ZP_EXPECT_OK(zpGroupEnd());
    EXPECT_EQ(recv.wrongBytes(seed, peer, rank), 0u);
    EXPECT_EQ(recv.guardBytesWritten(), 0u);
  });
}

// Valid alltoallv arguments for n ranks (4 floats to each peer) that a test
// then spoils in one place.
struct A2AArgs {
  std::vector<size_t> sc, sd, rc, rd;
  std::vector<float> send, recv;
  explicit A2AArgs(int n) : sc(n, 4), sd(n), rc(n, 4), rd(n), send(4 * n + 8), recv(4 * n + 8) {
    for (int p = 0; p < n; p++) sd[p] = rd[p] = 4 * p;
  }
  zpResult_t call(zpComm_t comm, zpDataType_t dt = zpFloat32, zpStream_t stream = nullptr) {
    return callWith(comm, send.data(), recv.data(), dt, stream);
  }
  zpResult_t callWith(zpComm_t comm, const void* sbuf, void* rbuf, zpDataType_t dt = zpFloat32,
                      zpStream_t stream = nullptr) {
    return zpAlltoallv(sbuf, sc.data(), sd.data(), rbuf, rc.data(), rd.data(), dt, comm, stream);
  }
};

TEST(ArgErrors, AlltoallvNullBufferWithCountsIsInvalidArgument) {
  onTwoRanks([](zpComm_t comm, int, int n) {
    A2AArgs a(n);
    ZP_EXPECT_ERROR(zpInvalidArgument, a.callWith(comm, nullptr, a.recv.data()));
    ZP_EXPECT_ERROR(zpInvalidArgument, a.callWith(comm, a.send.data(), nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, a.callWith(comm, nullptr, nullptr));
  });
}

TEST(ArgErrors, AlltoallvNullBuffersWithZeroCountsSucceed) {
  onTwoRanks([](zpComm_t comm, int, int n) {
    A2AArgs a(n);
    std::fill(a.sc.begin(), a.sc.end(), 0);
    std::fill(a.rc.begin(), a.rc.end(), 0);
    ZP_EXPECT_OK(a.callWith(comm, nullptr, nullptr));
  });
}

TEST(ArgErrors, AlltoallvNullCountOrDisplacementArrayIsInvalidArgument) {
  onTwoRanks([](zpComm_t comm, int, int n) {
    A2AArgs a(n);
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAlltoallv(a.send.data(), nullptr, a.sd.data(), a.recv.data(), a.rc.data(),
                                                   a.rd.data(), zpFloat32, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAlltoallv(a.send.data(), a.sc.data(), nullptr, a.recv.data(), a.rc.data(),
                                                   a.rd.data(), zpFloat32, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAlltoallv(a.send.data(), a.sc.data(), a.sd.data(), a.recv.data(), nullptr,
                                                   a.rd.data(), zpFloat32, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAlltoallv(a.send.data(), a.sc.data(), a.sd.data(), a.recv.data(),
                                                   a.rc.data(), nullptr, zpFloat32, comm, nullptr));
  });
}

TEST(ArgErrors, AlltoallvHugeCountIsInvalidArgument) {
  onTwoRanks([](zpComm_t comm, int, int n) {
    for (size_t huge : {(size_t)-1, (size_t)-10, (size_t)1 << 62 /* x4 bytes wraps to 0 */}) {
      for (int side = 0; side < 2; side++) {
        A2AArgs a(n);
        (side ? a.rc : a.sc)[1] = huge;
        ZP_EXPECT_ERROR(zpInvalidArgument, a.call(comm));
      }
    }
  });
}

TEST(ArgErrors, AlltoallvDisplacementPlusCountOverflowIsInvalidArgument) {
  onTwoRanks([](zpComm_t comm, int, int n) {
    // Displacements that overflow with the count, or wrap to a small byte
    // offset once multiplied by the type size.
    for (size_t displ : {(size_t)-1, (size_t)-3, (size_t)-10, ((size_t)1 << 62) + 1, (size_t)1 << 62}) {
      for (int side = 0; side < 2; side++) {
        A2AArgs a(n);
        (side ? a.rd : a.sd)[n - 1] = displ;
        ZP_EXPECT_ERROR(zpInvalidArgument, a.call(comm));
      }
    }
  });
}

TEST(ArgErrors, AlltoallvBadDatatypeIsInvalidArgument) {
  onTwoRanks([](zpComm_t comm, int, int n) {
    A2AArgs a(n);
    for (int dt : {42, (int)zpNumTypes, -1}) ZP_EXPECT_ERROR(zpInvalidArgument, a.call(comm, (zpDataType_t)dt));
  });
}

TEST(ArgErrors, AlltoallvNonNullStreamIsInvalidArgument) {
  onTwoRanks([](zpComm_t comm, int, int n) {
    A2AArgs a(n);
    ZP_EXPECT_ERROR(zpInvalidArgument, a.call(comm, zpFloat32, (zpStream_t)(uintptr_t)0x1000));
  });
}

TEST(ArgErrors, AlltoallvOverlappingReceiveRangesIsInvalidArgument) {
  onTwoRanks([](zpComm_t comm, int, int n) {
    A2AArgs a(n);
    a.rd[1] = 2;  // [2, 6) overlaps rank 0's [0, 4)
    ZP_EXPECT_ERROR(zpInvalidArgument, a.call(comm));
    A2AArgs same(n);
    same.rd[1] = 0;  // the same range twice
    ZP_EXPECT_ERROR(zpInvalidArgument, same.call(comm));
  });
}

TEST(ArgErrors, AlltoallvReceiveRangeOverlappingSendRangeIsInvalidArgument) {
  onTwoRanks([](zpComm_t comm, int, int n) {
    A2AArgs a(n);
    ZP_EXPECT_ERROR(zpInvalidArgument, a.callWith(comm, a.send.data(), a.send.data()));      // in place
    ZP_EXPECT_ERROR(zpInvalidArgument, a.callWith(comm, a.send.data(), a.send.data() + 3));  // partly
    ZP_EXPECT_ERROR(zpInvalidArgument, a.callWith(comm, a.send.data() + 4 * n - 1, a.send.data()));
  });
}

// Collective buffers that overlap without being the call's in-place form are
// refused on every rank before anything moves (issue 28: a partial overlap or
// a wrong in-place offset returned zpSuccess with wrong data); the in-place
// forms still work.
TEST(ArgErrors, CollectiveBuffersOverlappingOutOfPlaceAreInvalidArgument) {
  onTwoRanks([](zpComm_t comm, int rank, int n) {
    const size_t count = 64;
    std::vector<float> buf(2 * n * count, 1.0f);
    float* b = buf.data();
    const size_t other = (size_t)((rank + 1) % n) * count;  // another rank's block
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllReduce(b, b + 1, count, zpFloat32, zpSum, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllReduce(b + 1, b, count, zpFloat32, zpSum, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllGather(b + other, b, count, zpFloat32, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllGather(b + 1, b, count, zpFloat32, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpReduceScatter(b, b + other, count, zpFloat32, zpSum, comm, nullptr));
    std::vector<size_t> counts(n, count), displs(n);
    for (int p = 0; p < n; p++) displs[p] = (size_t)p * count;
    ZP_EXPECT_ERROR(zpInvalidArgument,
                    zpAllGatherv(b + other, count, b, counts.data(), displs.data(), zpFloat32, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpReduceScatterv(b, b + other, counts.data(), zpFloat32, zpSum, comm, nullptr));
    // In place: this rank's block of the output is the input.
    for (size_t i = 0; i < buf.size(); i++) buf[i] = i / count == (size_t)rank ? float(rank + 1) : -1.0f;
    ZP_EXPECT_OK(zpAllGather(b + (size_t)rank * count, b, count, zpFloat32, comm, nullptr));
    for (size_t i = 0; i < (size_t)n * count; i++) ASSERT_EQ(buf[i], float(i / count + 1)) << i;
  });
}

// Send and receive ranges in one buffer are fine as long as they are disjoint.
TEST(ArgErrors, AlltoallvDisjointRangesInOneBufferAreAccepted) {
  onTwoRanks([](zpComm_t comm, int rank, int n) {
    // [send to 0][send to 1][recv from 0][recv from 1], 4 floats each.
    std::vector<float> buf(8 * n);
    for (int p = 0; p < n; p++)
      for (int i = 0; i < 4; i++) buf[4 * p + i] = (float)(100 * rank + 10 * p + i);
    std::vector<size_t> sc(n, 4), sd(n), rc(n, 4), rd(n);
    for (int p = 0; p < n; p++) {
      sd[p] = 4 * p;
      rd[p] = 4 * n + 4 * p;
    }
    ZP_EXPECT_OK(zpAlltoallv(buf.data(), sc.data(), sd.data(), buf.data(), rc.data(), rd.data(), zpFloat32, comm,
                             nullptr));
    for (int p = 0; p < n; p++)
      for (int i = 0; i < 4; i++) EXPECT_EQ(buf[4 * n + 4 * p + i], (float)(100 * p + 10 * rank + i));
  });
}

TEST(ArgErrors, DestroyWithCallsQueuedInAnOpenGroupIsInvalidUsage) {
  uint64_t seed = zptest::testCaseSeed();
  onTwoRanks([seed](zpComm_t comm, int rank, int) {
    int peer = 1 - rank;
    GuardedBuffer send(100, 1), recv(100, 2);
    send.fill(seed, rank, peer);
    ZP_ASSERT_OK(zpGroupStart());
    ZP_EXPECT_OK(zpSend(send.data(), 100, zpUint8, peer, comm, nullptr));
    ZP_EXPECT_OK(zpRecv(recv.data(), 100, zpUint8, peer, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidUsage, zpCommDestroy(comm));
    ZP_EXPECT_ERROR(zpInvalidUsage, zpCommAbort(comm));
    ZP_ASSERT_OK(zpGroupEnd());  // the queued calls still run
    EXPECT_EQ(recv.wrongBytes(seed, peer, rank), 0u);
  });
}

TEST(ArgErrors, NullOutputPointersAreInvalidArgument) {
  onTwoRanks([](zpComm_t comm, int, int) {
    ZP_EXPECT_ERROR(zpInvalidArgument, zpCommCount(comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpCommUserRank(comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpCommGetAsyncError(comm, nullptr));
  });
}

// ---- Ranks that disagree on counts ----

struct MismatchCase {
  int nranks;
  const char* proto;
  size_t sends, expects;  // elements (zpFloat32) the sender sends, the receiver expects
  bool toSelf = false;    // the pair is a rank and itself
};
void PrintTo(const MismatchCase& c, std::ostream* os) {
  *os << c.nranks << " ranks, ZP_SHM_PROTO=" << c.proto << ", sends " << c.sends << ", expects " << c.expects
      << (c.toSelf ? ", to self" : "");
}
std::string mismatchName(const ::testing::TestParamInfo<MismatchCase>& i) {
  const MismatchCase& c = i.param;
  return std::to_string(c.nranks) + "ranks_" + c.proto + "_sends" + std::to_string(c.sends) + "_expects" +
         std::to_string(c.expects) + (c.toSelf ? "_self" : "");
}

std::vector<MismatchCase> mismatchCases() {
  std::vector<MismatchCase> cases;
  const std::pair<size_t, size_t> counts[] = {{10, 12}, {12, 10}, {40000, 41000}, {41000, 40000}, {0, 7}, {7, 0}};
  for (int n : {2, 3, 4})
    for (const char* proto : {"auto", "copy"})
      for (auto c : counts) cases.push_back({n, proto, c.first, c.second});
  cases.push_back({3, "auto", 10, 12, true});
  cases.push_back({3, "auto", 41000, 40000, true});
  cases.push_back({65, "auto", 10, 12});
  return cases;
}

class AlltoallvMismatch : public ::testing::TestWithParam<MismatchCase> {};

// Rank src sends c.sends to dst, which expects c.expects; every other pair
// agrees. Every rank must return zpInvalidUsage naming the counts, write
// nothing outside its receive ranges, and go on working.
TEST_P(AlltoallvMismatch, EveryRankReturnsInvalidUsageAndTheCommunicatorWorksOn) {
  MismatchCase c = GetParam();
  uint64_t seed = zptest::testCaseSeed();
  int src = (int)(seed % c.nranks);
  int dst = c.toSelf ? src : (src + 1 + (int)((seed >> 8) % (c.nranks - 1))) % c.nranks;
  auto exits = zptest::runRanks(c.nranks, [&](int rank, int n, const zpUniqueId& id) {
    zptest::setShmProto(c.proto);
    zptest::setTimeoutSeconds(60);
    if (n > 16) setenv("ZP_SHM_RING_BYTES", "65536", 1);
    zpComm_t comm = zptest::initComm(rank, n, id);
    zptest::CountMatrix m = zptest::randomCounts(n, seed, 3000, 0.2);
    std::vector<size_t> sendCounts = m[rank], recvCounts(n);
    for (int p = 0; p < n; p++) recvCounts[p] = m[p][rank];
    if (rank == src) sendCounts[dst] = c.sends;
    if (rank == dst) recvCounts[src] = c.expects;
    AlltoallvRun run(rank, n, sendCounts, recvCounts, zpFloat32, seed);
    zp::clearLastError();
    zpResult_t r = run.run(comm);
    std::string msg = zpGetLastError(comm);
    EXPECT_EQ(r, zpInvalidUsage) << "rank " << rank << " (rank " << src << " sends " << c.sends << " to rank " << dst
                                 << ", which expects " << c.expects << "): " << msg;
    EXPECT_TRUE(contains(msg, std::to_string(c.sends)) && contains(msg, std::to_string(c.expects)))
        << "rank " << rank << ": the message should name both counts: '" << msg << "'";
    EXPECT_EQ(run.bytesWrittenOutsideRanges(), 0u) << "rank " << rank;
    EXPECT_TRUE(run.sendBufferUnchanged()) << "rank " << rank;
    zpResult_t async = zpInternalError;
    ZP_EXPECT_OK(zpCommGetAsyncError(comm, &async));
    EXPECT_EQ(async, zpSuccess) << "a count mismatch does not break the communicator";
    // Afterwards, correct calls work: small, then large.
    zptest::checkedAlltoallv(comm, rank, zptest::randomCounts(n, seed + 1, 300, 0.1), zpFloat32, seed + 1);
    zptest::checkedAlltoallv(comm, rank, zptest::randomCounts(n, seed + 2, 60000, 0.1), zpFloat32, seed + 2);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

INSTANTIATE_TEST_SUITE_P(Counts, AlltoallvMismatch, ::testing::ValuesIn(mismatchCases()), mismatchName);

class P2PMismatch : public ::testing::TestWithParam<MismatchCase> {};

// Rank 0 sends c.sends elements, rank 1 receives c.expects: the receive fails
// with zpInvalidUsage and writes nothing; the send succeeds or fails the same
// way; nothing hangs, and the next messages get through.
TEST_P(P2PMismatch, ReceiverGetsInvalidUsageWritesNothingAndTheNextMessagesWork) {
  MismatchCase c = GetParam();
  uint64_t seed = zptest::testCaseSeed();
  auto exits = zptest::runRanks(2, [&](int rank, int n, const zpUniqueId& id) {
    zptest::setShmProto(c.proto);
    zptest::setTimeoutSeconds(60);
    zpComm_t comm = zptest::initComm(rank, n, id);
    if (rank == 0) {
      GuardedBuffer send(c.sends * 4, 1);
      send.fill(seed, 0, 1);
      zpResult_t r = zpSend(send.data(), c.sends, zpFloat32, 1, comm, nullptr);
      EXPECT_TRUE(r == zpSuccess || r == zpInvalidUsage) << zpGetErrorString(r) << ": " << zpGetLastError(comm);
    } else {
      GuardedBuffer recv(c.expects * 4, 3);
      zp::clearLastError();
      zpResult_t r = zpRecv(recv.data(), c.expects, zpFloat32, 0, comm, nullptr);
      std::string msg = zpGetLastError(comm);
      EXPECT_EQ(r, zpInvalidUsage) << msg;
      EXPECT_TRUE(contains(msg, std::to_string(c.sends)) && contains(msg, std::to_string(c.expects)))
          << "the message should name both counts: '" << msg << "'";
      EXPECT_EQ(recv.writtenBytes(), 0u) << "a refused receive wrote into its buffer";
      EXPECT_EQ(recv.guardBytesWritten(), 0u);
    }
    // Both ways, small and large, the pair still talks.
    int peer = 1 - rank;
    for (size_t bytes : {(size_t)100, (size_t)200000}) {
      GuardedBuffer send(bytes, 2), recv(bytes, 5);
      send.fill(seed + bytes, rank, peer);
      ZP_ASSERT_OK(zpGroupStart());
      ZP_EXPECT_OK(zpSend(send.data(), bytes, zpUint8, peer, comm, nullptr));
      ZP_EXPECT_OK(zpRecv(recv.data(), bytes, zpUint8, peer, comm, nullptr));
      ZP_ASSERT_OK(zpGroupEnd());
      EXPECT_EQ(recv.wrongBytes(seed + bytes, peer, rank), 0u);
    }
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

std::vector<MismatchCase> p2pMismatchCases() {
  std::vector<MismatchCase> cases;
  for (const char* proto : {"auto", "copy"})
    for (auto c : std::vector<std::pair<size_t, size_t>>{{10, 12}, {12, 10}, {40000, 41000}, {41000, 40000}, {0, 7}, {7, 0}})
      cases.push_back({2, proto, c.first, c.second});
  // Larger than the 2 MiB ring, through the ring: the sender is still
  // pushing the refused message when the receiver moves on.
  cases.push_back({2, "copy", 600000, 500000});
  cases.push_back({2, "copy", 500000, 600000});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Counts, P2PMismatch, ::testing::ValuesIn(p2pMismatchCases()), mismatchName);

// Rank 0 calls zpAlltoallv with zpFloat32, rank 1 with zpInt8, and the counts
// agree: 10 elements from 0 to 1, nothing else. The bytes do not (40 sent, 10
// expected), so the ranks disagree, and both must return an error.
TEST(AlltoallvDisagreement, DatatypesOfDifferentSizesFailOnEveryRank) {
  auto exits = zptest::runRanks(2, [&](int rank, int n, const zpUniqueId& id) {
    zptest::setTimeoutSeconds(30);
    zpComm_t comm = zptest::initComm(rank, n, id);
    std::vector<size_t> sc(2, 0), rc(2, 0), displs(2, 0);
    if (rank == 0) sc[1] = 10;
    if (rank == 1) rc[0] = 10;
    std::vector<float> send(10, 1.0f), recv(10);
    zpResult_t r = zpAlltoallv(send.data(), sc.data(), displs.data(), recv.data(), rc.data(), displs.data(),
                               rank == 0 ? zpFloat32 : zpInt8, comm, nullptr);
    EXPECT_NE(r, zpSuccess) << "rank " << rank << " succeeded although the ranks disagree on the bytes";
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

// ---- Ranks that call operations in different orders ----

struct Finished {
  std::atomic<int> ranks{0};
};

// Rank 0 sends to rank 1 and then joins an alltoallv; rank 1 (and any other
// rank) joins the alltoallv first. Rank 1, which sees the wrong message
// first, fails with zpInvalidUsage and tells every peer. The others' calls
// fail too, except that rank 0's alltoallv may already have finished its own
// part (an eager send needs no answer): then its communicator must report
// the error (zpCommGetAsyncError) and its next call must fail. Ranks stay
// alive until all have their results, so the errors come from the call
// order, not from a peer that exited.
void differentOrders(int nranks, size_t sendBytes) {
  zptest::Shared<Finished> finished;
  auto exits = zptest::runRanks(nranks, [&](int rank, int n, const zpUniqueId& id) {
    zptest::setTimeoutSeconds(8);
    zpComm_t comm = zptest::initComm(rank, n, id);
    std::vector<uint8_t> msg(sendBytes, 1);
    A2AArgs a(n);
    if (rank == 0) {
      zpResult_t sendResult = zpSend(msg.data(), sendBytes, zpUint8, 1, comm, nullptr);
      zpResult_t r = a.call(comm);
      if (r == zpSuccess) {
        zpResult_t async = zpSuccess;
        EXPECT_TRUE(zptest::waitFor([&] { return zpCommGetAsyncError(comm, &async) == zpSuccess && async != zpSuccess; }, 20))
            << "rank 0: no error reported after an unmatched send (the send returned " << zpGetErrorString(sendResult)
            << ")";
        EXPECT_EQ(async, zpInvalidUsage);
        EXPECT_NE(a.call(comm), zpSuccess) << "rank 0: a call on the broken communicator succeeded";
      }
    } else {
      zp::clearLastError();
      zpResult_t r = a.call(comm);
      EXPECT_NE(r, zpSuccess) << "rank " << rank << ": alltoallv succeeded although rank 0 called zpSend first";
      if (rank == 1) {
        EXPECT_EQ(r, zpInvalidUsage) << zpGetLastError(comm);
        EXPECT_STRNE(zpGetLastError(comm), "");
        // The receive rank 0's send was meant for fails too (the pair is out of step).
        EXPECT_NE(zpRecv(msg.data(), sendBytes, zpUint8, 0, comm, nullptr), zpSuccess);
      }
    }
    finished->ranks++;
    EXPECT_TRUE(zptest::waitFor([&] { return finished->ranks == n; }, 100));
    zpCommDestroy(comm);
  });
  zptest::expectAllOk(exits);
}

TEST(OrderErrors, EagerSendThenAlltoallvAgainstAlltoallvFirstReachesEveryRank) { differentOrders(2, 64); }

TEST(OrderErrors, LargeSendThenAlltoallvAgainstAlltoallvFirstReachesEveryRank) { differentOrders(3, 1 << 20); }

// One rank refuses its zpAlltoallv arguments (overlapping receive ranges, a
// NULL count array, an invalid datatype) while the others make a valid
// call, with small (eager) and large (single-copy) blocks: the refusing
// rank still takes part with empty messages carrying a row that says it
// refused, so it returns its own zpInvalidArgument, every other rank
// zpInvalidUsage naming it and its reason, nothing lands outside the
// receive ranges, and the next alltoallv works on every rank.
TEST(ArgErrors, OneRanksRefusedAlltoallvFailsOnEveryRankWithItsReasonAndTheNextCallRuns) {
  struct Case {
    const char* reason;
    size_t count;  // elements to and from every peer
    std::function<zpResult_t(A2AArgs&, zpComm_t)> bad;
  };
  const std::vector<Case> cases = {
      {"receive ranges for ranks", 4,
       [](A2AArgs& a, zpComm_t comm) {
         a.rd[1] = a.rd[0];
         return a.call(comm);
       }},
      {"sendcounts is NULL", 20000,
       [](A2AArgs& a, zpComm_t comm) {
         return zpAlltoallv(a.send.data(), nullptr, a.sd.data(), a.recv.data(), a.rc.data(), a.rd.data(), zpFloat32,
                            comm, nullptr);
       }},
      {"invalid datatype 42", 4, [](A2AArgs& a, zpComm_t comm) { return a.call(comm, (zpDataType_t)42); }},
  };
  uint64_t seed = zptest::testCaseSeed();
  // 65 ranks: above the 64 that carry their counts in band, the outcome is
  // agreed by status messages in rank order, where rank 0's count mismatch
  // with the refusing rank may come first: every rank still fails, naming
  // rank 1, and the next call runs.
  for (int nranks : {3, 65}) {
    auto exits = zptest::runRanks(nranks, [&](int rank, int n, const zpUniqueId& id) {
      zptest::setTimeoutSeconds(30);
      if (n > 16) setenv("ZP_SHM_RING_BYTES", "65536", 1);
      zpComm_t comm = zptest::initComm(rank, n, id);
      for (const Case& k : cases) {
        SCOPED_TRACE(std::string(k.reason) + ", " + std::to_string(n) + " ranks");
        A2AArgs a(n);
        for (int p = 0; p < n; p++) {
          a.sc[p] = a.rc[p] = k.count;
          a.sd[p] = a.rd[p] = (size_t)p * k.count;
        }
        a.send.assign(k.count * n, 1.0f);
        a.recv.assign(k.count * n + 8, -1.0f);
        zp::clearLastError();
        const zpResult_t r = rank == 1 ? k.bad(a, comm) : a.call(comm);
        const std::string msg = zpGetLastError(comm);
        if (rank == 1) {
          EXPECT_EQ(r, zpInvalidArgument) << msg;
          EXPECT_TRUE(contains(msg, k.reason)) << msg;
        } else {
          EXPECT_EQ(r, zpInvalidUsage) << msg;
          if (n <= 64) {
            EXPECT_TRUE(contains(msg, "rank 1 refused zpAlltoallv: ")) << msg;
            EXPECT_TRUE(contains(msg, k.reason)) << msg;
          } else {
            EXPECT_TRUE(contains(msg, "rank 1")) << msg;
          }
          for (size_t i = k.count * n; i < a.recv.size(); i++) ASSERT_EQ(a.recv[i], -1.0f) << "written past the ranges";
        }
        zptest::checkedAlltoallv(comm, rank, zptest::randomCounts(n, seed, 3000, 0.1), zpInt32, seed);
      }
      zpResult_t async = zpInternalError;
      ZP_EXPECT_OK(zpCommGetAsyncError(comm, &async));
      EXPECT_EQ(async, zpSuccess);
      ZP_EXPECT_OK(zpCommDestroy(comm));
    });
    zptest::expectAllOk(exits);
  }
}

// Rank 1 sends an eager message nobody receives, then every rank calls a
// collective (small, fused with its header, and large). Rank 0 meets the
// unmatched message where the collective's header should be: the two
// ranks' message streams are out of step for good, so rank 0's call fails
// naming what happened (a send/recv message from rank 1, and its position),
// the communicator is marked broken on every rank (zpCommGetAsyncError;
// a rank whose part of the call was already done may return success from
// it), and every later call fails at once with that error instead of
// failing anew as "another collective".
TEST(OrderErrors, UnmatchedEagerSendIsReportedAndBreaksTheCommunicatorOnEveryRank) {
  for (size_t count : {(size_t)16, (size_t)100000}) {
    zptest::Shared<Finished> finished;
    auto exits = zptest::runRanks(3, [&](int rank, int n, const zpUniqueId& id) {
      zptest::setTimeoutSeconds(20);
      zpComm_t comm = zptest::initComm(rank, n, id);
      std::vector<uint8_t> msg(64, 1);
      if (rank == 1) ZP_EXPECT_OK(zpSend(msg.data(), msg.size(), zpUint8, 0, comm, nullptr));  // eager: it returns
      std::vector<float> x(count, 1.0f);
      zp::clearLastError();
      const zpResult_t r = zpAllReduce(x.data(), x.data(), count, zpFloat32, zpSum, comm, nullptr);
      const std::string text = zpGetLastError(comm);
      if (rank == 0) {
        EXPECT_EQ(r, zpInvalidUsage) << text;
        EXPECT_TRUE(contains(text, "rank 1 sent its message #0 (send/recv) while rank 0 expected message #0 "
                                   "(collective)")) << text;
      }
      zpResult_t async = zpSuccess;
      EXPECT_TRUE(zptest::waitFor([&] { return zpCommGetAsyncError(comm, &async) == zpSuccess && async != zpSuccess; },
                                  10))
          << "rank " << rank << ": the communicator is not marked broken";
      EXPECT_EQ(async, zpInvalidUsage) << "rank " << rank;
      // Later calls fail at once with the communicator's error.
      zp::clearLastError();
      EXPECT_NE(zpBarrier(comm, nullptr), zpSuccess) << "rank " << rank;
      EXPECT_TRUE(contains(zpGetLastError(comm), "rank 1 sent its message #0 (send/recv)"))
          << "rank " << rank << ": " << zpGetLastError(comm);
      EXPECT_FALSE(contains(zpGetLastError(comm), "another collective")) << zpGetLastError(comm);
      finished->ranks++;
      EXPECT_TRUE(zptest::waitFor([&] { return finished->ranks == n; }, 100));
      zpCommAbort(comm);
    });
    zptest::expectAllOk(exits);
  }
}

}  // namespace

namespace {

// zpGetLastError(comm) is that communicator's last failed call, from any
// thread; zpGetLastError(NULL) is the calling thread's.
TEST(Errors, LastErrorIsKeptPerCommunicator) {
  zptest::expectAllOk({zptest::runInChild([] {
    zpComm_t a = nullptr, b = nullptr;
    for (zpComm_t* c : {&a, &b}) {
      zpUniqueId id;
      ZP_EXPECT_OK(zpGetUniqueId(&id));
      ZP_EXPECT_OK(zpCommInitRank(c, 1, id, 0));
    }
    float x = 0;
    ZP_EXPECT_ERROR(zpInvalidArgument, zpSend(&x, 1, zpFloat32, 5, a, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpRecv(nullptr, 3, zpFloat32, 0, b, nullptr));
    EXPECT_TRUE(contains(zpGetLastError(a), "peer 5")) << zpGetLastError(a);
    EXPECT_TRUE(contains(zpGetLastError(b), "NULL")) << zpGetLastError(b);
    EXPECT_STREQ(zpGetLastError(nullptr), zpGetLastError(b));
    // A failure in a group is the last error of every communicator in it.
    ZP_EXPECT_OK(zpGroupStart());
    ZP_EXPECT_OK(zpSend(&x, 1, zpFloat32, 0, a, nullptr));
    ZP_EXPECT_ERROR(zpInvalidUsage, zpGroupEnd());
    EXPECT_TRUE(contains(zpGetLastError(a), "send to self")) << zpGetLastError(a);
    EXPECT_TRUE(contains(zpGetLastError(b), "NULL")) << zpGetLastError(b);
    // Another thread's failure on a is a's last error here too; this thread's own stays.
    std::thread([&] { zpSend(&x, 1, (zpDataType_t)99, 0, a, nullptr); }).join();
    EXPECT_TRUE(contains(zpGetLastError(a), "datatype 99")) << zpGetLastError(a);
    EXPECT_FALSE(contains(zpGetLastError(nullptr), "datatype 99")) << zpGetLastError(nullptr);
    ZP_EXPECT_OK(zpCommDestroy(a));
    ZP_EXPECT_OK(zpCommDestroy(b));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpSend(&x, 1, zpFloat32, 0, a, nullptr));
    EXPECT_TRUE(contains(zpGetLastError(a), "destroyed")) << zpGetLastError(a);
  })});
}

}  // namespace

namespace {

// A communicator destroyed by one thread while another thread's open group
// has calls queued on it: the group ends with an error (it touched freed
// memory before), and the destroy itself succeeds.
TEST(Errors, DestroyWhileAnotherThreadsGroupHoldsCallsIsAnError) {
  zptest::expectAllOk({zptest::runInChild([] {
    zpUniqueId id;
    ZP_EXPECT_OK(zpGetUniqueId(&id));
    zpComm_t comm = nullptr;
    ZP_EXPECT_OK(zpCommInitRank(&comm, 1, id, 0));
    std::vector<float> x(1 << 16, 1.0f), y(1 << 16, 0.0f);
    std::mutex mu;
    std::condition_variable cv;
    int stage = 0;
    zpResult_t end = zpSuccess;
    std::string why;
    std::thread a([&] {
      ZP_EXPECT_OK(zpGroupStart());
      ZP_EXPECT_OK(zpSend(x.data(), x.size(), zpFloat32, 0, comm, nullptr));
      ZP_EXPECT_OK(zpRecv(y.data(), y.size(), zpFloat32, 0, comm, nullptr));
      {
        std::unique_lock<std::mutex> lock(mu);
        stage = 1;
        cv.notify_all();
        cv.wait(lock, [&] { return stage == 2; });
      }
      end = zpGroupEnd();
      why = zpGetLastError(nullptr);
    });
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return stage == 1; });
    }
    ZP_EXPECT_OK(zpCommDestroy(comm));
    // Reuse the memory a freed communicator would have had.
    std::vector<std::unique_ptr<char[]>> churn;
    for (int i = 0; i < 256; i++) churn.emplace_back(new char[4096]());
    {
      std::lock_guard<std::mutex> lock(mu);
      stage = 2;
      cv.notify_all();
    }
    a.join();
    EXPECT_EQ(end, zpInvalidUsage) << why;
    EXPECT_NE(why.find("destroyed while calls on it were queued in a group"), std::string::npos) << why;
    EXPECT_EQ(y[0], 0.0f);  // nothing was received after the destroy
  })});
}

}  // namespace

namespace {

// Issue 16, item 8: two threads running calls on one communicator at once.
// Each rank's calls then meet the peers' in whatever order the lock gives
// them, which differs between ranks, so data got mixed silently. Now the
// second thread's call is refused at once, saying why, and the first
// thread's call completes with the right bytes. Before, rank 0's second
// call waited for the lock and then for a peer that never joined it.
TEST(Errors, SecondThreadCallingWhileACallRunsIsRefused) {
  setenv("ZP_TIMEOUT", "10", 1);
  auto exits = zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    std::vector<float> data(1000);
    if (rank == 1) {
      usleep(1500 * 1000);  // rank 0's receive waits meanwhile
      for (size_t i = 0; i < data.size(); i++) data[i] = (float)i + 0.5f;
      ZP_EXPECT_OK(zpSend(data.data(), data.size(), zpFloat32, 0, comm, nullptr));
      zptest::barrier(comm, nranks);
      ZP_EXPECT_OK(zpCommDestroy(comm));
      return;
    }
    std::atomic<bool> recvDone{false};
    zpResult_t recvResult = zpInternalError;
    std::thread receiver([&] {
      recvResult = zpRecv(data.data(), data.size(), zpFloat32, 1, comm, nullptr);
      recvDone = true;
    });
    usleep(300 * 1000);  // the receiver is in its call
    EXPECT_FALSE(recvDone.load());
    float in = 1, out = 0;
    auto start = std::chrono::steady_clock::now();
    zp::clearLastError();
    zpResult_t r = zpAllReduce(&in, &out, 1, zpFloat32, zpSum, comm, nullptr);
    double took = zptest::secondsSince(start);
    std::string why = zpGetLastError(nullptr);
    EXPECT_EQ(r, zpInvalidUsage) << why;
    EXPECT_NE(why.find("another thread is running a call on this communicator"), std::string::npos) << why;
    EXPECT_LT(took, 0.5) << "the second thread's call waited instead of being refused";
    receiver.join();
    EXPECT_EQ(recvResult, zpSuccess) << zpGetLastError(comm);
    for (size_t i = 0; i < data.size(); i++)
      if (data[i] != (float)i + 0.5f) {
        ADD_FAILURE() << "element " << i << " is " << data[i];
        break;
      }
    // Calls one after the other from different threads are fine.
    std::thread([&] { zptest::barrier(comm, nranks); }).join();
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }, 120);
  unsetenv("ZP_TIMEOUT");
  zptest::expectAllOk(exits);
}

}  // namespace
