// zpSend / zpRecv across real processes: grouped exchanges (ring, all pairs,
// several messages per pair, to self), ungrouped pairs in both orders, sizes
// around the eager threshold up to 64 MiB, unaligned buffers, every datatype,
// long streams of messages. Each case runs with both shared-memory protocols
// (ZP_SHM_PROTO=auto: single copy above 32 KiB where allowed; copy: through
// the ring). Every received byte is checked, receive buffers are poisoned and
// guarded, send buffers must not change.
#include <algorithm>
#include <memory>

#include "tests/harness.h"
#include "transport/shm/shm_transport.h"

namespace {

using zptest::GuardedBuffer;

// One message of an exchange; every rank builds the same list.
struct Msg {
  int src, dst;
  size_t count;
  zpDataType_t dt;
  uint64_t seed;  // of its pattern (distinct per message)
  size_t bytes() const { return count * zpTypeSize(dt); }
};

std::string describe(const Msg& m) {
  return "message " + std::to_string(m.src) + "->" + std::to_string(m.dst) + " of " + std::to_string(m.count) +
         " x type " + std::to_string((int)m.dt);
}

// Posts this rank's sends and receives of msgs, in list order, inside one
// group, and checks every byte.
void exchange(zpComm_t comm, int rank, const std::vector<Msg>& msgs) {
  std::vector<std::unique_ptr<GuardedBuffer>> sendBufs(msgs.size()), recvBufs(msgs.size());
  ZP_ASSERT_OK(zpGroupStart());
  for (size_t i = 0; i < msgs.size(); i++) {
    const Msg& m = msgs[i];
    if (m.src == rank) {
      sendBufs[i].reset(new GuardedBuffer(m.bytes(), m.seed % 8));
      sendBufs[i]->fill(m.seed, m.src, m.dst);
      ZP_EXPECT_OK(zpSend(sendBufs[i]->data(), m.count, m.dt, m.dst, comm, nullptr));
    }
    if (m.dst == rank) {
      recvBufs[i].reset(new GuardedBuffer(m.bytes(), (m.seed >> 8) % 8));
      ZP_EXPECT_OK(zpRecv(recvBufs[i]->data(), m.count, m.dt, m.src, comm, nullptr));
    }
  }
  ZP_ASSERT_OK(zpGroupEnd());
  for (size_t i = 0; i < msgs.size(); i++) {
    const Msg& m = msgs[i];
    if (recvBufs[i]) {
      EXPECT_EQ(recvBufs[i]->wrongBytes(m.seed, m.src, m.dst), 0u) << "rank " << rank << ": " << describe(m);
      EXPECT_EQ(recvBufs[i]->guardBytesWritten(), 0u) << "rank " << rank << ": " << describe(m);
    }
    if (sendBufs[i]) {
      EXPECT_EQ(sendBufs[i]->wrongBytes(m.seed, m.src, m.dst), 0u) << "send buffer changed: " << describe(m);
      EXPECT_EQ(sendBufs[i]->guardBytesWritten(), 0u) << "send guard written: " << describe(m);
    }
  }
}

// Byte sizes that matter: empty, tiny, odd, around the 32 KiB eager
// threshold, around the 256 KiB fragment, beyond the 2 MiB ring.
const std::vector<size_t> kSizes = {0,     1,      2,      7,      4095,           32767,   32768,
                                    32769, 65535,  262143, 262145, (2u << 20) + 1, 5u << 20};

// A seed for one message from a test's seed and the message's number.
uint64_t mix(uint64_t a, uint64_t b) {
  return (a ^ (b + 0x9E3779B97F4A7C15ull + (a << 6) + (a >> 2))) * 0xff51afd7ed558ccdull;
}

// ---- Any number of ranks, both protocols ----

struct P2PParam {
  int nranks;
  const char* proto;
};
void PrintTo(const P2PParam& p, std::ostream* os) { *os << p.nranks << " ranks, ZP_SHM_PROTO=" << p.proto; }

class P2P : public ::testing::TestWithParam<P2PParam> {
 protected:
  // Runs body on every rank with a communicator using the parameter's protocol.
  void run(const std::function<void(zpComm_t, int rank, int n)>& body) {
    const char* proto = GetParam().proto;
    auto exits = zptest::runRanks(GetParam().nranks, [&](int rank, int n, const zpUniqueId& id) {
      zptest::setShmProto(proto);
      zpComm_t comm = zptest::initComm(rank, n, id);
      body(comm, rank, n);
      // Ranks that only talk to some peers finish at different times: all
      // leave together.
      zptest::barrier(comm, n);
      ZP_EXPECT_OK(zpCommDestroy(comm));
    });
    zptest::expectAllOk(exits);
  }
};

TEST_P(P2P, RingExchangeInOneGroup) {
  uint64_t seed = zptest::testCaseSeed();
  run([&](zpComm_t comm, int rank, int n) {
    for (size_t it = 0; it < kSizes.size(); it++) {
      // Every rank sends a different size: rank r's comes from kSizes[it + r].
      std::vector<Msg> msgs;
      for (int r = 0; r < n; r++) {
        size_t bytes = kSizes[(it + r) % kSizes.size()];
        msgs.push_back({r, (r + 1) % n, bytes, zpUint8, mix(seed, it * 64 + r)});
      }
      exchange(comm, rank, msgs);
    }
  });
}

TEST_P(P2P, AllPairsInOneGroupRandomSizes) {
  uint64_t seed = zptest::testCaseSeed();
  run([&](zpComm_t comm, int rank, int n) {
    const size_t maxCounts[] = {100, 40000, 400000};
    for (int round = 0; round < 3; round++) {
      std::mt19937_64 rng(mix(seed, round));
      zpDataType_t dt = (zpDataType_t)(rng() % zpNumTypes);
      size_t maxCount = maxCounts[round] / zpTypeSize(dt);
      std::vector<Msg> msgs;
      for (int s = 0; s < n; s++)
        for (int d = 0; d < n; d++) {  // self included
          size_t count = rng() % 5 == 0 ? 0 : rng() % (maxCount + 1);
          msgs.push_back({s, d, count, dt, rng()});
        }
      std::shuffle(msgs.begin(), msgs.end(), rng);  // the call order within the group is arbitrary
      exchange(comm, rank, msgs);
    }
  });
}

TEST_P(P2P, SeveralSendsToOnePeerInOneGroupMatchInOrder) {
  uint64_t seed = zptest::testCaseSeed();
  run([&](zpComm_t comm, int rank, int n) {
    // Different sizes per message, eager and single-copy mixed: a receive
    // matched out of order fails on its count or on its bytes.
    const size_t sizes[] = {5, 40000, 0, 1, 70001, 13, 32768};
    std::vector<Msg> msgs;
    for (int k = 0; k < 7; k++)
      for (int s = 0; s < n; s++)
        for (int d = 0; d < n; d++)
          if (s != d) msgs.push_back({s, d, sizes[(k + s + 2 * d) % 7], zpUint8, mix(seed, k * 4096 + s * 64 + d)});
    exchange(comm, rank, msgs);
  });
}

TEST_P(P2P, SendToSelfAndReceiveFromSelfInOneGroup) {
  uint64_t seed = zptest::testCaseSeed();
  run([&](zpComm_t comm, int rank, int n) {
    for (size_t bytes : {(size_t)0, (size_t)1, (size_t)33, (size_t)40000, (size_t)1 << 20}) {
      // To self, twice (matched in order), with a ring exchange in the same group.
      std::vector<Msg> msgs;
      for (int r = 0; r < n; r++) {
        msgs.push_back({r, r, bytes, zpUint8, mix(seed, bytes + 3 * r)});
        msgs.push_back({r, (r + 1) % n, bytes / 2 + 1, zpUint8, mix(seed, bytes + 3 * r + 1)});
        msgs.push_back({r, r, bytes / 3 + 7, zpUint8, mix(seed, bytes + 3 * r + 2)});
      }
      exchange(comm, rank, msgs);
    }
  });
}

TEST_P(P2P, GroupSpanningTwoCommunicators) {
  uint64_t seed = zptest::testCaseSeed();
  run([&](zpComm_t comm, int rank, int n) {
    std::vector<zpComm_t> more = zptest::makeMoreComms(comm, rank, n, 1);
    zpComm_t other = more[0];
    // Forward ring on one communicator, backward ring on the other, one group.
    const size_t bytes = 50000 + 2 * rank;
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    GuardedBuffer sendA(bytes, 1), sendB(bytes, 2), recvA(50000 + 2 * prev, 3), recvB(50000 + 2 * next, 5);
    sendA.fill(seed, rank, next);
    sendB.fill(seed + 1, rank, prev);
    ZP_ASSERT_OK(zpGroupStart());
    ZP_EXPECT_OK(zpSend(sendA.data(), bytes, zpUint8, next, comm, nullptr));
    ZP_EXPECT_OK(zpRecv(recvB.data(), recvB.size(), zpUint8, next, other, nullptr));
    ZP_EXPECT_OK(zpSend(sendB.data(), bytes, zpUint8, prev, other, nullptr));
    ZP_EXPECT_OK(zpRecv(recvA.data(), recvA.size(), zpUint8, prev, comm, nullptr));
    ZP_ASSERT_OK(zpGroupEnd());
    EXPECT_EQ(recvA.wrongBytes(seed, prev, rank), 0u);
    EXPECT_EQ(recvB.wrongBytes(seed + 1, next, rank), 0u);
    EXPECT_EQ(recvA.guardBytesWritten() + recvB.guardBytesWritten(), 0u);
    ZP_EXPECT_OK(zpCommDestroy(other));
  });
}

// A group may hold collectives too: sends, receives and an alltoallv queued
// together, all complete at zpGroupEnd.
TEST_P(P2P, GroupWithSendRecvAndAlltoallv) {
  uint64_t seed = zptest::testCaseSeed();
  run([&](zpComm_t comm, int rank, int n) {
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    GuardedBuffer send(40000, 1), recv(40000, 2);
    send.fill(seed, rank, next);
    zptest::AlltoallvRun a2a(rank, zptest::randomCounts(n, seed + 1, 20000, 0.2), zpFloat16, seed + 1);
    ZP_ASSERT_OK(zpGroupStart());
    ZP_EXPECT_OK(zpSend(send.data(), 40000, zpUint8, next, comm, nullptr));
    ZP_EXPECT_OK(a2a.run(comm));
    ZP_EXPECT_OK(zpRecv(recv.data(), 40000, zpUint8, prev, comm, nullptr));
    ZP_ASSERT_OK(zpGroupEnd());
    EXPECT_EQ(recv.wrongBytes(seed, prev, rank), 0u);
    EXPECT_EQ(a2a.check(), "");
  });
}

TEST_P(P2P, ManyMessagesPerPairInOneGroup) {
  uint64_t seed = zptest::testCaseSeed();
  run([&](zpComm_t comm, int rank, int n) {
    std::mt19937_64 rng(seed);
    std::vector<Msg> msgs;
    int perPair = n <= 4 ? 200 : 60;
    for (int k = 0; k < perPair; k++)
      for (int s = 0; s < n; s++)
        for (int d = 0; d < n; d++)
          if (s != d) msgs.push_back({s, d, rng() % 700, zpUint8, rng()});
    exchange(comm, rank, msgs);
  });
}

std::string p2pName(const ::testing::TestParamInfo<P2PParam>& i) {
  return std::to_string(i.param.nranks) + "ranks_" + i.param.proto;
}

INSTANTIATE_TEST_SUITE_P(Ranks, P2P,
                         ::testing::Values(P2PParam{2, "auto"}, P2PParam{3, "auto"}, P2PParam{4, "auto"},
                                           P2PParam{8, "auto"}, P2PParam{2, "copy"}, P2PParam{3, "copy"},
                                           P2PParam{4, "copy"}, P2PParam{8, "copy"}),
                         p2pName);

// ---- Two ranks: ungrouped calls, orders, long streams ----

// How the shared-memory transport is set up: the protocol, a ring small
// enough that long messages wrap it many times, the eager threshold at its
// extremes.
struct ShmSetup {
  const char* name;
  const char* proto;
  const char* ringBytes;  // nullptr: the default
  const char* eagerBytes = nullptr;  // ZP_SHM_EAGER (0: every message single copy); nullptr: the default
};
void PrintTo(const ShmSetup& s, std::ostream* os) { *os << s.name; }

class P2PTwoRanks : public ::testing::TestWithParam<ShmSetup> {
 public:
  void run(const std::function<void(zpComm_t, int rank)>& body, int timeoutSec = 120) {
    ShmSetup setup = GetParam();
    auto exits = zptest::runRanks(2, [&](int rank, int n, const zpUniqueId& id) {
      zptest::setShmProto(setup.proto);
      if (setup.ringBytes) setenv("ZP_SHM_RING_BYTES", setup.ringBytes, 1);
      if (setup.eagerBytes) setenv("ZP_SHM_EAGER", setup.eagerBytes, 1);
      zpComm_t comm = zptest::initComm(rank, n, id);
      body(comm, rank);
      ZP_EXPECT_OK(zpCommDestroy(comm));
    }, timeoutSec);
    zptest::expectAllOk(exits);
  }
};

// An ungrouped send of m by its source, or receive by its destination, checked.
void sendOne(zpComm_t comm, const Msg& m) {
  GuardedBuffer buf(m.bytes(), m.seed % 8);
  buf.fill(m.seed, m.src, m.dst);
  ZP_EXPECT_OK(zpSend(buf.data(), m.count, m.dt, m.dst, comm, nullptr));
  EXPECT_EQ(buf.wrongBytes(m.seed, m.src, m.dst), 0u) << "send buffer changed: " << describe(m);
}

void recvOne(zpComm_t comm, const Msg& m) {
  GuardedBuffer buf(m.bytes(), (m.seed >> 8) % 8);
  ZP_EXPECT_OK(zpRecv(buf.data(), m.count, m.dt, m.src, comm, nullptr));
  EXPECT_EQ(buf.wrongBytes(m.seed, m.src, m.dst), 0u) << describe(m);
  EXPECT_EQ(buf.guardBytesWritten(), 0u) << describe(m);
}

TEST_P(P2PTwoRanks, UngroupedPingPongAllSizesUpTo64MiB) {
  uint64_t seed = zptest::testCaseSeed();
  run([&](zpComm_t comm, int rank) {
    std::vector<size_t> sizes = kSizes;
    sizes.push_back(64u << 20);
    for (size_t i = 0; i < sizes.size(); i++) {
      // 0 sends then receives; 1 receives then sends.
      Msg there{0, 1, sizes[i], zpUint8, mix(seed, 2 * i)};
      Msg back{1, 0, sizes[sizes.size() - 1 - i], zpUint8, mix(seed, 2 * i + 1)};
      if (rank == 0) {
        sendOne(comm, there);
        recvOne(comm, back);
      } else {
        recvOne(comm, there);
        sendOne(comm, back);
      }
    }
  });
}

struct Order {
  std::atomic<int> started{0};  // the rank that must call first is about to
};

// Rank 0 sends and rank 1 receives three sizes without a group; `first`
// calls first and the other waits until then (and a little longer).
void ungroupedInOrder(P2PTwoRanks* t, int first) {
  uint64_t seed = zptest::testCaseSeed();
  zptest::Shared<Order> order;
  t->run([&](zpComm_t comm, int rank) {
    int i = 0;
    for (size_t bytes : {(size_t)17, (size_t)32768, (size_t)3 << 20}) {
      Msg m{0, 1, bytes, zpUint8, mix(seed, i)};
      if (rank == first) {
        order->started = ++i;
      } else {
        ++i;
        ASSERT_TRUE(zptest::waitFor([&] { return order->started >= i; }, 60));
        usleep(20000);  // most likely the other call is under way by now (either way is correct)
      }
      if (rank == 0) sendOne(comm, m);
      else recvOne(comm, m);
    }
  });
}

TEST_P(P2PTwoRanks, UngroupedReceiverCallsFirst) { ungroupedInOrder(this, 1); }

TEST_P(P2PTwoRanks, UngroupedSenderCallsFirst) { ungroupedInOrder(this, 0); }

TEST_P(P2PTwoRanks, ThousandsOfUngroupedMessagesBackToBack) {
  uint64_t seed = zptest::testCaseSeed();
  run([&](zpComm_t comm, int rank) {
    std::mt19937_64 rng(seed);
    // Small ones (they pile up in the ring), then some single-copy sized ones.
    for (int k = 0; k < 3000; k++) {
      Msg m{0, 1, k < 2980 ? rng() % 300 : 33000 + rng() % 100000, zpUint8, rng()};
      rank == 0 ? sendOne(comm, m) : recvOne(comm, m);
    }
    // The other way, in one group per side.
    std::vector<Msg> msgs;
    for (int k = 0; k < 1000; k++) msgs.push_back({1, 0, rng() % 1000, zpUint8, rng()});
    exchange(comm, rank, msgs);
  });
}

TEST_P(P2PTwoRanks, EveryDatatypeBothWays) {
  uint64_t seed = zptest::testCaseSeed();
  run([&](zpComm_t comm, int rank) {
    for (int t = 0; t < zpNumTypes; t++) {
      zpDataType_t dt = (zpDataType_t)t;
      // Counts are in elements: an odd count, and one above the eager size.
      std::vector<Msg> msgs = {{0, 1, 1001 + (size_t)t, dt, mix(seed, 4 * t)},
                               {1, 0, 999, dt, mix(seed, 4 * t + 1)},
                               {0, 1, 40001, dt, mix(seed, 4 * t + 2)},
                               {1, 0, 40003, dt, mix(seed, 4 * t + 3)}};
      exchange(comm, rank, msgs);
    }
  });
}

TEST_P(P2PTwoRanks, NestedGroupsRunAtTheOutermostEnd) {
  uint64_t seed = zptest::testCaseSeed();
  run([&](zpComm_t comm, int rank) {
    int peer = 1 - rank;
    GuardedBuffer send(5000, 3), recv(5000, 1);
    send.fill(seed, rank, peer);
    ZP_ASSERT_OK(zpGroupStart());
    ZP_ASSERT_OK(zpGroupStart());
    ZP_EXPECT_OK(zpSend(send.data(), 5000, zpUint8, peer, comm, nullptr));
    ZP_EXPECT_OK(zpRecv(recv.data(), 5000, zpUint8, peer, comm, nullptr));
    ZP_ASSERT_OK(zpGroupEnd());
    EXPECT_EQ(recv.writtenBytes(), 0u) << "the inner zpGroupEnd already ran the calls";
    ZP_ASSERT_OK(zpGroupEnd());
    EXPECT_EQ(recv.wrongBytes(seed, peer, rank), 0u);
    EXPECT_EQ(recv.guardBytesWritten(), 0u);
  });
}

TEST_P(P2PTwoRanks, ZeroCountWithNullBuffers) {
  run([&](zpComm_t comm, int rank) {
    int peer = 1 - rank;
    // Ungrouped, rank 0 first.
    if (rank == 0) ZP_EXPECT_OK(zpSend(nullptr, 0, zpFloat32, peer, comm, nullptr));
    else ZP_EXPECT_OK(zpRecv(nullptr, 0, zpFloat32, peer, comm, nullptr));
    // Grouped, both ways and to self.
    ZP_ASSERT_OK(zpGroupStart());
    ZP_EXPECT_OK(zpSend(nullptr, 0, zpInt64, peer, comm, nullptr));
    ZP_EXPECT_OK(zpRecv(nullptr, 0, zpInt64, peer, comm, nullptr));
    ZP_EXPECT_OK(zpSend(nullptr, 0, zpInt8, rank, comm, nullptr));
    ZP_EXPECT_OK(zpRecv(nullptr, 0, zpInt8, rank, comm, nullptr));
    ZP_EXPECT_OK(zpGroupEnd());
  });
}

INSTANTIATE_TEST_SUITE_P(Shm, P2PTwoRanks,
                         ::testing::Values(ShmSetup{"auto", "auto", nullptr}, ShmSetup{"copy", "copy", nullptr},
                                           ShmSetup{"copy_ring64K", "copy", "65536"},
                                           ShmSetup{"auto_eager0", "auto", nullptr, "0"},
                                           ShmSetup{"auto_eager1G", "auto", nullptr, "1G"}),
                         [](const ::testing::TestParamInfo<ShmSetup>& i) { return std::string(i.param.name); });

// The shortcut for small messages (ShmTransport::moveNow): a ring of
// groups of one small send and one small receive, random sizes below the
// single-copy threshold, every byte checked, moves every send at once (the
// receives too when their message comes within the poll); a message larger
// than a record goes the general way; and a receive that expects another
// size is refused by the shortcut and still fails with the error that
// names both sizes.
TEST(P2PShortcut, SmallMessagesMoveAtOnceTheRestTheGeneralWay) {
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(2, [&](int rank, int n, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, n, id);
    const int kCalls = 300;
    long before = zp::ShmTransport::opsMovedNow();
    for (int i = 0; i < kCalls; i++) {
      const size_t count = mix(seed, (uint64_t)i) % 8000;  // bytes, below ZP_SHM_EAGER (32 KiB)
      exchange(comm, rank,
               {{0, 1, count, zpUint8, mix(seed, 1000 + 2 * (uint64_t)i)},
                {1, 0, count, zpUint8, mix(seed, 1001 + 2 * (uint64_t)i)}});
    }
    const long moved = zp::ShmTransport::opsMovedNow() - before;
    EXPECT_GE(moved, kCalls) << "every send takes the shortcut";
    EXPECT_LE(moved, 2 * kCalls);
    before = zp::ShmTransport::opsMovedNow();
    exchange(comm, rank, {{0, 1, 1u << 20, zpFloat32, mix(seed, 1)}, {1, 0, 1u << 20, zpFloat32, mix(seed, 2)}});
    EXPECT_EQ(zp::ShmTransport::opsMovedNow() - before, 0) << "4 MiB is not one record";
    // Rank 0 sends 8 elements, rank 1 expects 16.
    GuardedBuffer buf(64, 3);
    buf.fill(mix(seed, 3), 0, 1);
    if (rank == 0) {
      ZP_EXPECT_OK(zpSend(buf.data(), 8, zpFloat32, 1, comm, nullptr));
    } else {
      EXPECT_EQ(zpRecv(buf.data(), 16, zpFloat32, 0, comm, nullptr), zpInvalidUsage);
      EXPECT_NE(std::string(zpGetLastError(comm)).find("rank 0 sends 8 elements to rank 1 but rank 1 expects 16"),
                std::string::npos)
          << zpGetLastError(comm);
    }
    zptest::barrier(comm, n);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}


// A long single-copy read does not hold up the receiver's other peers: it
// is read a piece per progress pass (shm_transport.cc, kReadPiece), and
// the other peers' messages move between pieces. That is what lets a proxy
// keep relaying its rail's chunks while it reads a zipf alltoallv's block
// of a hundred MiB (docs/routing.md). Rank 1 receives 256 MiB from rank 0
// and 4 MiB from rank 2 in one group, both offers already in its rings
// when it starts (rank 0's is read first, being the first peer): rank 2's
// send must end within the first half of rank 1's call, not after rank 0's
// whole message. Every byte checked; both go by single copy.
TEST(P2PSingleCopy, ALongReadLetsTheReceiversOtherPeersMoveBetweenPieces) {
  const uint64_t seed = zptest::testCaseSeed();
  struct Times {
    std::atomic<int64_t> smallSendEndNs{0};
  };
  zptest::Shared<Times> times;
  zptest::expectAllOk(zptest::runRanks(3, [&](int rank, int n, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, n, id);
    using Clock = std::chrono::steady_clock;
    // steady_clock is CLOCK_MONOTONIC: one clock for all ranks of the machine.
    auto ns = [](Clock::time_point t) {
      return (int64_t)std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
    };
    const size_t big = 256u << 20, small = 4u << 20;
    const size_t bytes = rank == 0 ? big : small;
    const long offered = zp::ShmTransport::singleCopySends();
    zptest::barrier(comm, n);
    if (rank != 1) {
      GuardedBuffer buf(bytes, 3);
      buf.fill(seed + rank, rank, 1);
      ZP_EXPECT_OK(zpSend(buf.data(), bytes, zpUint8, 1, comm, nullptr));
      if (rank == 2) times->smallSendEndNs = ns(Clock::now());
      EXPECT_EQ(zp::ShmTransport::singleCopySends() - offered, 1) << "rank " << rank << ": not sent by single copy";
    } else {
      GuardedBuffer from0(big, 5), from2(small, 1);
      // Both offers are in this rank's rings before it asks for them.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      const Clock::time_point start = Clock::now();
      ZP_ASSERT_OK(zpGroupStart());
      ZP_EXPECT_OK(zpRecv(from0.data(), big, zpUint8, 0, comm, nullptr));
      ZP_EXPECT_OK(zpRecv(from2.data(), small, zpUint8, 2, comm, nullptr));
      ZP_ASSERT_OK(zpGroupEnd());
      const int64_t startNs = ns(start), endNs = ns(Clock::now());
      EXPECT_EQ(from0.wrongBytes(seed + 0, 0, 1), 0u);
      EXPECT_EQ(from2.wrongBytes(seed + 2, 2, 1), 0u);
      EXPECT_EQ(from0.guardBytesWritten() + from2.guardBytesWritten(), 0u);
      zptest::barrier(comm, n);  // rank 2 has noted its time
      const int64_t small2 = times->smallSendEndNs.load();
      EXPECT_LT(small2 - startNs, (endNs - startNs) / 2)
          << "rank 2's 4 MiB ended " << (small2 - startNs) / 1e6 << " ms into rank 1's call of "
          << (endNs - startNs) / 1e6 << " ms";
      ZP_EXPECT_OK(zpCommDestroy(comm));
      return;
    }
    zptest::barrier(comm, n);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

}  // namespace
