// The standard collectives on host buffers: every datatype and op, in place
// and out of place, counts 0, 1, primes and large, 2 to 8 ranks, inside
// groups; mismatched calls and a dead rank. Every rank checks every element
// against a reference it computes itself from every rank's inputs (which
// depend only on the seed, the rank and the index).
//
// Inputs are small integers (and halves), exact in every datatype whatever
// the order of the additions: results are compared exactly
// (tests/reduce_reference.h, shared with the multinode tests).
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "src/core/comm.h"  // zp::hostPeerWaits
#include "tests/harness.h"
#include "tests/reduce_reference.h"
#include "transport/shm/shm_transport.h"

namespace {

using zptest::GuardedBuffer;

using zptest::checkReduced;
using zptest::fillInput;
using zptest::kOps;
using zptest::kTypes;

// ---- All-reduce, reduce-scatter, reduce: every type and op ----

// Every case runs with each family of algorithms forced (ZP_COLL_ALGO):
// rings, the latency ones (recursive doubling, trees, direct exchange) and
// the one-node bandwidth ones (direct exchange).
class CollectiveRanks : public ::testing::TestWithParam<std::tuple<int, const char*>> {
 protected:
  // Runs body(comm, rank, nranks, seed) on the parameter's ranks, each with
  // the algorithm forced before its communicator is made.
  void onEveryRank(const std::function<void(zpComm_t, int, int, uint64_t)>& body) const {
    const uint64_t seed = zptest::testCaseSeed();
    const char* algo = std::get<1>(GetParam());
    zptest::expectAllOk(zptest::runRanks(std::get<0>(GetParam()), [&](int rank, int nranks, const zpUniqueId& id) {
      setenv("ZP_COLL_ALGO", algo, 1);
      zpComm_t comm = zptest::initComm(rank, nranks, id);
      body(comm, rank, nranks, seed);
      ZP_EXPECT_OK(zpCommDestroy(comm));
    }));
  }
};

TEST_P(CollectiveRanks, AllReduceEveryTypeAndOpInAndOutOfPlace) {
  onEveryRank([&](zpComm_t comm, int rank, int nranks, uint64_t seed) {
    const size_t counts[] = {0, 1, 7, 1009};
    int c = 0;
    for (zpDataType_t t : kTypes)
      for (zpRedOp_t op : kOps)
        for (bool inPlace : {false, true}) {
          const size_t count = counts[c++ % 4], ts = zpTypeSize(t);
          const uint64_t s = seed + c;
          GuardedBuffer send(count * ts), recv(count * ts);
          fillInput(send.data(), count, 0, s, rank, t, op);
          void* in = send.data();
          void* out = inPlace ? send.data() : recv.data();
          ASSERT_EQ(zpAllReduce(in, out, count, t, op, comm, nullptr), zpSuccess) << zpGetLastError(comm);
          EXPECT_EQ(checkReduced(out, count, 0, s, nranks, t, op), "")
              << "type " << t << " op " << op << (inPlace ? " in place" : "") << " count " << count;
          EXPECT_EQ(send.guardBytesWritten() + recv.guardBytesWritten(), 0u) << "written past the buffers";
        }
  });
}

TEST_P(CollectiveRanks, ReduceScatterAndReduceEveryTypeAndOp) {
  onEveryRank([&](zpComm_t comm, int rank, int nranks, uint64_t seed) {
    int c = 0;
    for (zpDataType_t t : kTypes)
      for (zpRedOp_t op : kOps) {
        const size_t ts = zpTypeSize(t), count = (size_t)(c % 3 == 0 ? 13 : 1 + c % 5);
        const uint64_t s = seed + ++c;
        const bool inPlace = c % 2 == 0;
        // Reduce-scatter: n blocks of count in, block `rank` out.
        GuardedBuffer send(count * nranks * ts), recv(count * ts);
        fillInput(send.data(), count * nranks, 0, s, rank, t, op);
        void* out = inPlace ? send.data() + (size_t)rank * count * ts : recv.data();
        ASSERT_EQ(zpReduceScatter(send.data(), out, count, t, op, comm, nullptr), zpSuccess) << zpGetLastError(comm);
        EXPECT_EQ(checkReduced(out, count, (size_t)rank * count, s, nranks, t, op), "")
            << "reduce-scatter type " << t << " op " << op;
        // Reduce to a root that moves round: the others' recvbuff stays untouched.
        const int root = c % nranks;
        GuardedBuffer in(count * ts), res(count * ts);
        fillInput(in.data(), count, 0, s, rank, t, op);
        ASSERT_EQ(zpReduce(in.data(), res.data(), count, t, op, root, comm, nullptr), zpSuccess)
            << zpGetLastError(comm);
        if (rank == root)
          EXPECT_EQ(checkReduced(res.data(), count, 0, s, nranks, t, op), "") << "reduce type " << t << " op " << op;
        else
          EXPECT_EQ(res.writtenBytes(), 0u) << "reduce wrote a non-root's recvbuff";
        EXPECT_EQ(send.guardBytesWritten() + recv.guardBytesWritten() + res.guardBytesWritten(), 0u);
      }
  });
}

// ---- All-gather and broadcast: every byte from where it belongs ----

TEST_P(CollectiveRanks, AllGatherAndBroadcastMoveEveryByte) {
  onEveryRank([&](zpComm_t comm, int rank, int nranks, uint64_t seed) {
    for (size_t count : {(size_t)0, (size_t)1, (size_t)31, (size_t)100003})
      for (bool inPlace : {false, true}) {
        // All-gather of bytes: rank r's block is the pattern (seed, r).
        GuardedBuffer send(count), recv(count * nranks);
        char* mine = inPlace ? (char*)recv.data() + (size_t)rank * count : (char*)send.data();
        zptest::fillPattern((uint8_t*)mine, count, seed + count, rank, 0);
        ASSERT_EQ(zpAllGather(mine, recv.data(), count, zpUint8, comm, nullptr), zpSuccess) << zpGetLastError(comm);
        for (int r = 0; r < nranks; r++)
          EXPECT_EQ(zptest::wrongPatternBytes(recv.data() + (size_t)r * count, count, seed + count, r, 0), 0u)
              << "the block of rank " << r << ", count " << count;
        EXPECT_EQ(recv.guardBytesWritten(), 0u);
        // Broadcast from a root that moves round.
        const int root = (int)(count % nranks);
        GuardedBuffer b(count * 8), bout(count * 8);
        if (rank == root) zptest::fillPattern(b.data(), b.size(), seed, root, 1);
        void* out = inPlace ? b.data() : bout.data();
        ASSERT_EQ(zpBroadcast(b.data(), out, count, zpFloat64, root, comm, nullptr), zpSuccess)
            << zpGetLastError(comm);
        EXPECT_EQ(zptest::wrongPatternBytes((uint8_t*)out, count * 8, seed, root, 1), 0u) << "broadcast " << count;
        EXPECT_EQ(b.guardBytesWritten() + bout.guardBytesWritten(), 0u);
      }
    ZP_EXPECT_OK(zpBarrier(comm, nullptr));
  });
}

// ---- The v calls: per-rank counts (zeros among them), gaps between the
// all-gatherv's blocks that must stay untouched ----

// Per-rank counts from a seed (the same on every rank), about one in four zero.
std::vector<size_t> unevenCounts(uint64_t seed, int n, size_t maxCount) {
  std::mt19937_64 rng(seed);
  std::vector<size_t> counts(n);
  for (size_t& x : counts) x = rng() % 4 == 0 ? 0 : 1 + rng() % maxCount;
  return counts;
}

TEST_P(CollectiveRanks, AllGathervAndReduceScattervUnevenCounts) {
  onEveryRank([&](zpComm_t comm, int rank, int nranks, uint64_t seed) {
    int c = 0;
    for (zpDataType_t t : kTypes)
      for (zpRedOp_t op : kOps) {
        const uint64_t s = seed + ++c;
        const size_t ts = zpTypeSize(t);
        const bool inPlace = c % 2 == 0;
        const std::vector<size_t> counts = unevenCounts(s, nranks, c % 3 == 0 ? 3000 : 9);
        size_t total = 0, before = 0;
        for (int p = 0; p < nranks; p++) {
          if (p < rank) before += counts[p];
          total += counts[p];
        }
        // Reduce-scatterv: the whole input, this rank's block out.
        GuardedBuffer send(total * ts), recv(counts[rank] * ts);
        fillInput(send.data(), total, 0, s, rank, t, op);
        void* out = inPlace ? send.data() + before * ts : recv.data();
        ASSERT_EQ(zpReduceScatterv(send.data(), out, counts.data(), t, op, comm, nullptr), zpSuccess)
            << zpGetLastError(comm);
        EXPECT_EQ(checkReduced(out, counts[rank], before, s, nranks, t, op), "")
            << "reduce-scatterv type " << t << " op " << op << (inPlace ? " in place" : "");
        EXPECT_EQ(send.guardBytesWritten() + recv.guardBytesWritten(), 0u);
        if (op != zpSum) continue;
        // All-gatherv of this type: blocks in reverse rank order with a gap
        // of (rank of the block) elements before each; the gaps stay poison.
        std::vector<size_t> displs(nranks);
        size_t at = 0;
        for (int p = nranks - 1; p >= 0; p--) {
          at += (size_t)p;
          displs[p] = at;
          at += counts[p];
        }
        GuardedBuffer mine(counts[rank] * ts), all(at * ts);
        char* in = inPlace ? (char*)all.data() + displs[rank] * ts : (char*)mine.data();
        fillInput(in, counts[rank], 0, s, rank, t, op);
        ASSERT_EQ(zpAllGatherv(in, counts[rank], all.data(), counts.data(), displs.data(), t, comm, nullptr), zpSuccess)
            << zpGetLastError(comm);
        for (int p = 0; p < nranks; p++) {
          std::vector<char> want(counts[p] * ts + 1);  // the input rank p filled in
          fillInput(want.data(), counts[p], 0, s, p, t, op);
          EXPECT_EQ(memcmp(all.data() + displs[p] * ts, want.data(), counts[p] * ts), 0)
              << "all-gatherv: the block of rank " << p << ", type " << t;
          const size_t gap = (size_t)p;  // the gap before block p
          EXPECT_EQ(zptest::unpoisonedBytes(all.data() + (displs[p] - gap) * ts, gap * ts), 0u) << "a gap was written";
        }
        EXPECT_EQ(all.guardBytesWritten() + mine.guardBytesWritten(), 0u);
      }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectiveRanks,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 8), ::testing::Values("ring", "tree", "direct")),
                         [](const ::testing::TestParamInfo<std::tuple<int, const char*>>& p) {
                           return std::to_string(std::get<0>(p.param)) + "_" + std::get<1>(p.param);
                         });

TEST(Collectives, AllReduceOfSixteenMiBPerRank) {
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(4, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    const size_t count = (4u << 20) + 3;  // float32: 16 MiB and a bit, not a multiple of the rank count
    std::vector<float> data(count);
    fillInput(data.data(), count, 0, seed, rank, zpFloat32, zpSum);
    ASSERT_EQ(zpAllReduce(data.data(), data.data(), count, zpFloat32, zpSum, comm, nullptr), zpSuccess)
        << zpGetLastError(comm);
    EXPECT_EQ(checkReduced(data.data(), count, 0, seed, nranks, zpFloat32, zpSum), "");
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// Large calls reduce while they copy, over both shared-memory protocols:
// single copy (the receiver reads the sender's memory a slice at a time and
// reduces each) and copy (fragments through the ring, reduced as they are
// taken out): a 64 MiB all-reduce, then a reduce-scatterv and an
// all-gatherv of uneven blocks, every element checked.
class LargeCollectives : public ::testing::TestWithParam<const char*> {};

TEST_P(LargeCollectives, ReduceWhileCopyingEveryElement) {
  const uint64_t seed = zptest::testCaseSeed();
  const std::string proto = GetParam();
  zptest::expectAllOk(zptest::runRanks(4, [&](int rank, int nranks, const zpUniqueId& id) {
    zptest::setShmProto(proto.c_str());
    setenv("ZP_COLL_ALGO", "ring", 1);
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    if (proto == "cma") {
      const size_t count = (16u << 20) + 5;  // float32: 64 MiB and a bit
      std::vector<float> data(count);
      fillInput(data.data(), count, 0, seed, rank, zpFloat32, zpSum);
      ASSERT_EQ(zpAllReduce(data.data(), data.data(), count, zpFloat32, zpSum, comm, nullptr), zpSuccess)
          << zpGetLastError(comm);
      EXPECT_EQ(checkReduced(data.data(), count, 0, seed, nranks, zpFloat32, zpSum), "");
    }
    const std::vector<size_t> counts = {(3u << 20) + 1, 0, 777777, (1u << 20) + 3};  // int32 elements
    size_t total = 0, before = 0;
    for (int p = 0; p < nranks; p++) {
      if (p < rank) before += counts[p];
      total += counts[p];
    }
    std::vector<int32_t> in(total), out(counts[rank] + 1, -1);
    fillInput(in.data(), total, 0, seed + 1, rank, zpInt32, zpMax);
    ASSERT_EQ(zpReduceScatterv(in.data(), out.data(), counts.data(), zpInt32, zpMax, comm, nullptr), zpSuccess)
        << zpGetLastError(comm);
    EXPECT_EQ(checkReduced(out.data(), counts[rank], before, seed + 1, nranks, zpInt32, zpMax), "");
    EXPECT_EQ(out[counts[rank]], -1) << "written past the block";
    std::vector<size_t> displs(nranks);
    for (int p = 0; p < nranks; p++) displs[p] = p == 0 ? 0 : displs[p - 1] + counts[p - 1];
    std::vector<int32_t> all(total);
    ASSERT_EQ(zpAllGatherv(in.data() + before, counts[rank], all.data(), counts.data(), displs.data(), zpInt32, comm,
                           nullptr),
              zpSuccess)
        << zpGetLastError(comm);
    for (int p = 0; p < nranks; p++) {
      std::vector<int32_t> want(counts[p]);
      fillInput(want.data(), counts[p], displs[p], seed + 1, p, zpInt32, zpMax);
      EXPECT_TRUE(std::equal(want.begin(), want.end(), all.begin() + (long)displs[p])) << "the block of rank " << p;
    }
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

INSTANTIATE_TEST_SUITE_P(Protocols, LargeCollectives, ::testing::Values("cma", "copy"));

// A direct reduce-scatter whose blocks are large enough for single copy is
// one reduce group on each rank (the shared-memory transport reads every
// peer's block a piece at a time and reduces them together): every type
// and op, in and out of place, all-reduce, reduce-scatter and
// reduce-scatterv with blocks below the single-copy threshold and empty
// ones among them (those ranks reduce the plain way in the same call).
class ReduceGroups : public ::testing::TestWithParam<int> {};

TEST_P(ReduceGroups, EveryTypeAndOpInAndOutOfPlace) {
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(GetParam(), [&](int rank, int nranks, const zpUniqueId& id) {
    setenv("ZP_COLL_ALGO", "direct", 1);
    setenv("ZP_SHM_REDUCE_COPY", "1G", 1);  // every block from 32 KiB on by single copy (the next test: above)
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    const long before = zp::ShmTransport::groupsReduced();
    long calls = 0;  // of which this rank's block is a group
    int c = 0;
    for (zpDataType_t t : kTypes)
      for (zpRedOp_t op : kOps) {
        const size_t ts = zpTypeSize(t), block = (32u << 10) + 17 + (size_t)c % 29;  // >= 32 KiB in any type
        const uint64_t s = seed + (uint64_t)++c;
        const bool inPlace = c % 2 == 0;
        const size_t count = block * (size_t)nranks + (size_t)c % (size_t)nranks;  // blocks a little uneven
        GuardedBuffer send(count * ts), recv(count * ts);
        fillInput(send.data(), count, 0, s, rank, t, op);
        void* out = inPlace ? send.data() : recv.data();
        ASSERT_EQ(zpAllReduce(send.data(), out, count, t, op, comm, nullptr), zpSuccess) << zpGetLastError(comm);
        EXPECT_EQ(checkReduced(out, count, 0, s, nranks, t, op), "") << "all-reduce, type " << t << " op " << op;
        EXPECT_EQ(send.guardBytesWritten() + recv.guardBytesWritten(), 0u);
        calls++;
        // Reduce-scatterv: block sizes from none to twice the threshold.
        std::vector<size_t> counts(nranks);
        for (int p = 0; p < nranks; p++) counts[p] = (p + c) % 3 == 0 ? 0 : (p + c) % 3 == 1 ? 100 + p : 2 * block + p;
        size_t total = 0, first = 0;
        for (int p = 0; p < nranks; p++) {
          if (p < rank) first += counts[p];
          total += counts[p];
        }
        GuardedBuffer in(total * ts), mine(counts[rank] * ts);
        fillInput(in.data(), total, 0, s + 1, rank, t, op);
        ASSERT_EQ(zpReduceScatterv(in.data(), mine.data(), counts.data(), t, op, comm, nullptr), zpSuccess)
            << zpGetLastError(comm);
        EXPECT_EQ(checkReduced(mine.data(), counts[rank], first, s + 1, nranks, t, op), "")
            << "reduce-scatterv, type " << t << " op " << op;
        EXPECT_EQ(in.guardBytesWritten() + mine.guardBytesWritten(), 0u);
        if (counts[rank] * ts >= (32u << 10)) calls++;
      }
    // Every call whose block was large enough went through a group.
    EXPECT_EQ(zp::ShmTransport::groupsReduced() - before, calls);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, ReduceGroups, ::testing::Values(2, 3, 5));

// A block its receiver reduces goes through the ring at every size by
// default (ZP_SHM_REDUCE_COPY=0), the sender copying while the receiver
// reduces: no rank offers it by single copy and no reduce group forms; with
// the setting at 1G such blocks are read by single copy in groups. Blocks
// above the eager size: just over 48 KiB and over 256 KiB. Every element
// checked both ways, all-reduce and reduce-scatter, in and out of place.
TEST_P(ReduceGroups, ReducedBlocksArePipelinedThroughTheRing) {
  const uint64_t seed = zptest::testCaseSeed();
  for (const char* copyFrom : {"", "1G"}) {  // "": the default
    SCOPED_TRACE(std::string("ZP_SHM_REDUCE_COPY=") + copyFrom);
    zptest::expectAllOk(zptest::runRanks(GetParam(), [&](int rank, int nranks, const zpUniqueId& id) {
      setenv("ZP_COLL_ALGO", "direct", 1);
      if (*copyFrom)
        setenv("ZP_SHM_REDUCE_COPY", copyFrom, 1);
      else
        unsetenv("ZP_SHM_REDUCE_COPY");
      zpComm_t comm = zptest::initComm(rank, nranks, id);
      for (size_t blockBytes : {size_t(48) << 10, size_t(256) << 10}) {
        SCOPED_TRACE("blocks of " + std::to_string(blockBytes) + " bytes and 12");
        const long groups = zp::ShmTransport::groupsReduced(), offered = zp::ShmTransport::singleCopySends();
        const zpDataType_t t = zpFloat32;
        const size_t block = blockBytes / 4 + 3, count = block * (size_t)nranks;
        for (int c = 0; c < 4; ++c) {
          const uint64_t s = seed + (uint64_t)c;
          GuardedBuffer send(count * 4), recv(count * 4);
          fillInput(send.data(), count, 0, s, rank, t, zpSum);
          void* out = c % 2 ? send.data() : recv.data();
          if (c < 2) {
            ASSERT_EQ(zpAllReduce(send.data(), out, count, t, zpSum, comm, nullptr), zpSuccess)
                << zpGetLastError(comm);
            EXPECT_EQ(checkReduced(out, count, 0, s, nranks, t, zpSum), "") << "all-reduce " << c;
          } else {
            const size_t each = count / (size_t)nranks;
            char* mine = (char*)out + (c % 2 ? (size_t)rank * each * 4 : 0);
            ASSERT_EQ(zpReduceScatter(send.data(), mine, each, t, zpSum, comm, nullptr), zpSuccess)
                << zpGetLastError(comm);
            EXPECT_EQ(checkReduced(mine, each, (size_t)rank * each, s, nranks, t, zpSum), "")
                << "reduce-scatter " << c;
          }
          EXPECT_EQ(send.guardBytesWritten() + recv.guardBytesWritten(), 0u);
        }
        if (!*copyFrom) {
          EXPECT_EQ(zp::ShmTransport::groupsReduced() - groups, 0);
          // (the all-gather half of an all-reduce still offers its blocks)
          EXPECT_EQ(zp::ShmTransport::singleCopySends() - offered, 2L * (nranks - 1));
        } else {
          EXPECT_EQ(zp::ShmTransport::groupsReduced() - groups, 4);
        }
      }
      ZP_EXPECT_OK(zpCommDestroy(comm));
    }));
  }
}

// Recursive doubling (the all-reduce below ZP_COLL_RING_ABOVE) and the
// reduce's tree send what their receivers reduce through the ring too: of
// a 64 KiB all-reduce only the result handed back to the ranks above the
// largest power of two p is offered by single copy (n - p sends), and
// nothing of a reduce. Every element checked.
TEST_P(ReduceGroups, RecursiveDoublingAndTheTreeSendThroughTheRing) {
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(GetParam(), [&](int rank, int nranks, const zpUniqueId& id) {
    setenv("ZP_COLL_ALGO", "tree", 1);
    unsetenv("ZP_SHM_REDUCE_COPY");
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    int p = 1;
    while (p * 2 <= nranks) p *= 2;
    const zpDataType_t t = zpFloat32;
    const size_t count = (64u << 10) / 4 + 5;
    GuardedBuffer send(count * 4), recv(count * 4);
    const long offered = zp::ShmTransport::singleCopySends();
    fillInput(send.data(), count, 0, seed, rank, t, zpSum);
    ASSERT_EQ(zpAllReduce(send.data(), recv.data(), count, t, zpSum, comm, nullptr), zpSuccess) << zpGetLastError(comm);
    EXPECT_EQ(checkReduced(recv.data(), count, 0, seed, nranks, t, zpSum), "");
    long mine = zp::ShmTransport::singleCopySends() - offered, all = 0;
    ASSERT_EQ(zpAllReduce(&mine, &all, 1, zpInt64, zpSum, comm, nullptr), zpSuccess);
    EXPECT_EQ(all, long(nranks - p)) << "sends offered by single copy in the all-reduce, over all ranks";
    const long before = zp::ShmTransport::singleCopySends();
    fillInput(send.data(), count, 0, seed + 1, rank, t, zpSum);
    ASSERT_EQ(zpReduce(send.data(), recv.data(), count, t, zpSum, 0, comm, nullptr), zpSuccess) << zpGetLastError(comm);
    if (rank == 0) EXPECT_EQ(checkReduced(recv.data(), count, 0, seed + 1, nranks, t, zpSum), "");
    EXPECT_EQ(zp::ShmTransport::singleCopySends() - before, 0) << "sends offered by single copy in the reduce";
    EXPECT_EQ(send.guardBytesWritten() + recv.guardBytesWritten(), 0u);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// The order of a float sum is fixed, so its bits are the same on every run
// and over both protocols: block b is its owner's element, then every other
// rank's in rank order (reduceScatterDirectFinish), whether the transport
// reduces a group or the collective reduces what it received.
class ReduceOrder : public ::testing::TestWithParam<const char*> {};

TEST_P(ReduceOrder, FloatSumsInTheDocumentedOrder) {
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(4, [&](int rank, int nranks, const zpUniqueId& id) {
    zptest::setShmProto(GetParam());
    setenv("ZP_COLL_ALGO", "direct", 1);
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    const size_t count = 4 * 50000 + 3;
    auto value = [&](int r, size_t i) {  // in [-1, 1), all 24 bits of the significand used
      uint64_t h = (seed ^ (uint64_t)r << 40 ^ i) * 0x9E3779B97F4A7C15ull;
      h = (h ^ (h >> 31)) * 0xBF58476D1CE4E5B9ull;
      return (float)((double)((h ^ (h >> 29)) >> 11) / 9007199254740992.0 * 2 - 1);
    };
    std::vector<float> x(count);
    for (size_t i = 0; i < count; i++) x[i] = value(rank, i);
    ASSERT_EQ(zpAllReduce(x.data(), x.data(), count, zpFloat32, zpSum, comm, nullptr), zpSuccess)
        << zpGetLastError(comm);
    size_t wrong = 0;
    for (int b = 0, at = 0; b < nranks; b++) {  // block b: count * (b + 1) / n - count * b / n elements
      const size_t end = count * (size_t)(b + 1) / (size_t)nranks;
      for (size_t i = (size_t)at; i < end; i++) {
        float acc = value(b, i);
        for (int r = 0; r < nranks; r++)
          if (r != b) acc = acc + value(r, i);
        wrong += memcmp(&acc, &x[i], 4) != 0;
      }
      at = (int)end;
    }
    EXPECT_EQ(wrong, 0u) << "elements whose bits differ from the documented order's";
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

INSTANTIATE_TEST_SUITE_P(Protocols, ReduceOrder, ::testing::Values("cma", "copy"));

// Collectives inside a group run after the group's sends and receives, in
// call order, and both are right.
TEST(Collectives, InAGroupWithSendAndRecv) {
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(3, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    const int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
    GuardedBuffer out(1000), in(1000);
    zptest::fillPattern(out.data(), 1000, seed, rank, next);
    std::vector<int64_t> a(100), b(100);
    fillInput(a.data(), 100, 0, seed, rank, zpInt64, zpSum);
    fillInput(b.data(), 100, 0, seed + 1, rank, zpInt64, zpMax);
    ZP_ASSERT_OK(zpGroupStart());
    ZP_EXPECT_OK(zpSend(out.data(), 1000, zpUint8, next, comm, nullptr));
    ZP_EXPECT_OK(zpAllReduce(a.data(), a.data(), 100, zpInt64, zpSum, comm, nullptr));
    ZP_EXPECT_OK(zpRecv(in.data(), 1000, zpUint8, prev, comm, nullptr));
    ZP_EXPECT_OK(zpAllReduce(b.data(), b.data(), 100, zpInt64, zpMax, comm, nullptr));
    ZP_ASSERT_OK(zpGroupEnd());
    EXPECT_EQ(in.wrongBytes(seed, prev, rank), 0u);
    EXPECT_EQ(checkReduced(a.data(), 100, 0, seed, nranks, zpInt64, zpSum), "");
    EXPECT_EQ(checkReduced(b.data(), 100, 0, seed + 1, nranks, zpInt64, zpMax), "");
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// A small all-reduce on one node is one round: its header check travels
// with its data (each header as its message's meta), where the check and
// recursive doubling were 1 + log2(n) rounds, each a wait on the peers
// (zp::hostPeerWaits counts them). A larger one still checks first.
TEST(CollectiveRounds, SmallAllReduceOnOneNodeIsOneRound) {
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(3, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    for (size_t count : {1, 7, 1000}) {
      std::vector<float> x(count);
      fillInput(x.data(), count, 0, seed + count, rank, zpFloat32, zpSum);
      const uint64_t before = zp::hostPeerWaits();
      ZP_ASSERT_OK(zpAllReduce(x.data(), x.data(), count, zpFloat32, zpSum, comm, nullptr));
      EXPECT_EQ(zp::hostPeerWaits() - before, 1u) << count << " float32";
      EXPECT_EQ(checkReduced(x.data(), count, 0, seed + count, nranks, zpFloat32, zpSum), "");
    }
    std::vector<float> big(65536, 1.0f);
    const uint64_t before = zp::hostPeerWaits();
    ZP_ASSERT_OK(zpAllReduce(big.data(), big.data(), big.size(), zpFloat32, zpSum, comm, nullptr));
    EXPECT_GE(zp::hostPeerWaits() - before, 2u) << "64K float32: checked apart";
    EXPECT_EQ(big[12345], (float)nranks);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// ---- Errors ----

// One rank passes another count (then another op, datatype, root): every
// rank returns zpInvalidUsage naming it, nothing is written, and the
// communicator still works.
TEST(CollectiveErrors, MismatchedCallsAreInvalidUsageOnEveryRank) {
  zptest::expectAllOk(zptest::runRanks(4, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    GuardedBuffer send(400), recv(400);
    const bool odd = rank == 2;
    ZP_EXPECT_ERROR(zpInvalidUsage, zpAllReduce(send.data(), recv.data(), odd ? 99 : 100, zpFloat32, zpSum, comm, nullptr));
    EXPECT_NE(std::string(zpGetLastError(comm)).find("rank 2 calls allreduce of 99 float32 (sum)"), std::string::npos)
        << zpGetLastError(comm);
    ZP_EXPECT_ERROR(zpInvalidUsage, zpAllReduce(send.data(), recv.data(), 100, zpFloat32, odd ? zpMax : zpSum, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidUsage, zpAllReduce(send.data(), recv.data(), 100, odd ? zpInt32 : zpFloat32, zpSum, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidUsage, zpBroadcast(send.data(), recv.data(), 100, zpFloat32, odd ? 1 : 0, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidUsage, odd ? zpBarrier(comm, nullptr)
                                        : zpAllGather(send.data(), recv.data(), 25, zpFloat32, comm, nullptr));
    // A small all-reduce (one round, its header and then its data) against
    // a barrier (its header alone): messages of two sizes, refused both
    // ways, and the second round names the calls.
    ZP_EXPECT_ERROR(zpInvalidUsage, odd ? zpBarrier(comm, nullptr)
                                        : zpAllReduce(send.data(), recv.data(), 2, zpFloat32, zpSum, comm, nullptr));
    EXPECT_NE(std::string(zpGetLastError(comm)).find("rank 0 calls allreduce of 2 float32 (sum) but rank 2 calls barrier"),
              std::string::npos)
        << zpGetLastError(comm);
    // The v calls: one rank's recvcounts differ (the same total), then its sendcount and its entry.
    std::vector<size_t> counts = {1, 2, 3, 4};
    if (odd) counts = {1, 3, 2, 4};
    ZP_EXPECT_ERROR(zpInvalidUsage, zpReduceScatterv(send.data(), recv.data(), counts.data(), zpFloat32, zpSum, comm, nullptr));
    EXPECT_NE(std::string(zpGetLastError(comm)).find("recvcounts[1]=2 but rank 2 calls reducescatterv"),
              std::string::npos)
        << zpGetLastError(comm);
    const size_t displs[] = {0, 1, 4, 7};
    ZP_EXPECT_ERROR(zpInvalidUsage, zpAllGatherv(send.data(), counts[rank], recv.data(), counts.data(), displs,
                                                 zpFloat32, comm, nullptr));
    EXPECT_EQ(recv.writtenBytes() + recv.guardBytesWritten(), 0u) << "a refused call wrote";
    std::vector<int32_t> x(10, rank + 1);
    ZP_ASSERT_OK(zpAllReduce(x.data(), x.data(), 10, zpInt32, zpSum, comm, nullptr));
    EXPECT_EQ(x[9], nranks * (nranks + 1) / 2);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// A small all-reduce's data can never be taken for a peer's header. Rank 1
// makes a one-rank-node all-reduce (which sends its header and its data in
// one message) whose data is crafted to look like rank 0's all-gather
// header: one int64 equal to the 64-bit digest by which headers used to be
// compared (the same formula, computed here), and three int64 equal to the
// whole header as it is now laid out. Rank 0's all-gather must not succeed
// with that data as rank 1's header: both ranks fail with zpInvalidUsage
// naming both calls, nothing is written, and the next call runs.
TEST(CollectiveErrors, DataCanNeverPassForAHeader) {
  auto step = [](uint64_t d, uint64_t v) {
    d = (d ^ v) * 0x9E3779B97F4A7C15ull;
    return d ^ (d >> 32);
  };
  // The old digest of an all-gather of one int64 with the default settings.
  uint64_t settings = 0;
  for (uint64_t v : std::initializer_list<uint64_t>{0, 256u << 10, 1u << 20, 2, 512u << 10}) settings = step(settings, v);
  uint64_t digest = 0;
  for (uint64_t v : std::initializer_list<uint64_t>{3 /* allgather */, 1, (uint64_t)zpInt64, 0, 0, 0, settings})
    digest = step(digest, v);
  // The header as laid out now (collectives/standard_internal.h).
  // magic 0x5a, kind 3 (allgather), root 0; count 1; dtype, op 0.
  const std::vector<uint64_t> header = {0x5a | (3u << 8), 1, (uint64_t)zpInt64};
  for (const std::vector<uint64_t>& forged : {std::vector<uint64_t>{digest}, header}) {
    zptest::expectAllOk(zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
      zptest::setTimeoutSeconds(20);
      zpComm_t comm = zptest::initComm(rank, nranks, id);
      GuardedBuffer recv(forged.size() * 8 * nranks);
      zpResult_t r;
      if (rank == 0) {
        const int64_t mine = 42;
        r = zpAllGather(&mine, recv.data(), 1, zpInt64, comm, nullptr);
      } else {
        r = zpAllReduce(forged.data(), recv.data(), forged.size(), zpInt64, zpSum, comm, nullptr);
      }
      const std::string msg = zpGetLastError(comm);
      EXPECT_EQ(r, zpInvalidUsage) << "rank " << rank << " took data for a header";
      EXPECT_NE(msg.find("rank 0 calls allgather of 1 int64 but rank 1 calls allreduce of " +
                         std::to_string(forged.size()) + " int64 (sum)"),
                std::string::npos)
          << msg;
      EXPECT_EQ(recv.writtenBytes() + recv.guardBytesWritten(), 0u) << "a refused call wrote";
      ZP_EXPECT_OK(zpBarrier(comm, nullptr));
      ZP_EXPECT_OK(zpCommDestroy(comm));
    }));
  }
}

// One rank cuts the hierarchical all-reduce into other slices
// (ZP_COLL_SLICE), or relays from another size: its messages would not match
// the others', so init fails on every rank, naming the setting and both
// values, before any call runs. The values are compared exactly, not by a
// hash: 1050378 against 1090457 bytes (a pair whose 64-bit settings hash,
// together with another field, could be matched) and direct-below values
// near 2.6e14 fail like any other.
TEST(CollectiveErrors, SettingsThatChooseTheAlgorithmMustAgreeAtInit) {
  struct Case {
    const char *name, *mine, *others, *shown;
  };
  for (const Case& k : {Case{"ZP_COLL_SLICE", "64K", "1090457", "65536 bytes"},
                        Case{"ZP_COLL_SLICE", "1050378", "1090457", "1050378 bytes"},
                        Case{"ZP_ROUTE_DIRECT_BELOW", "260000000000001", "260000000000000", "260000000000001 bytes"},
                        Case{"ZP_COLL_ALGO", "ring", "auto", "ring"}}) {
    zptest::expectAllOk(zptest::runRanks(3, [&](int rank, int nranks, const zpUniqueId& id) {
      setenv(k.name, rank == 1 ? k.mine : k.others, 1);
      zpComm_t comm = nullptr;
      ZP_EXPECT_ERROR(zpInvalidUsage, zpCommInitRank(&comm, nranks, id, rank));
      const std::string msg = zpGetLastError(nullptr);
      EXPECT_NE(msg.find(std::string(k.name) + " is " + k.shown + " on rank 1"), std::string::npos) << msg;
      EXPECT_NE(msg.find(std::string("but ") + k.others), std::string::npos) << msg;
      EXPECT_EQ(comm, nullptr);
    }));
  }
  // The same settings everywhere, by zpConfig_t on one rank and the
  // environment on the others, make one communicator.
  zptest::expectAllOk(zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
    zpConfig_t cfg = ZP_CONFIG_INITIALIZER;
    if (rank == 0) cfg.routing = zpRoutingOff;
    else setenv("ZP_ROUTING", "off", 1);
    zpComm_t comm = nullptr;
    ZP_ASSERT_OK(zpCommInitRankConfig(&comm, nranks, id, rank, &cfg));
    ZP_EXPECT_OK(zpBarrier(comm, nullptr));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

TEST(CollectiveErrors, BadArgumentsAreRefusedBeforeAnythingMoves) {
  zptest::expectAllOk(zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    float buf[4] = {};
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllReduce(buf, buf, 4, (zpDataType_t)42, zpSum, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllReduce(buf, buf, 4, zpFloat32, (zpRedOp_t)9, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllReduce(nullptr, buf, 4, zpFloat32, zpSum, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpReduce(buf, buf, 4, zpFloat32, zpSum, 2, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpBroadcast(buf, buf, 4, zpFloat32, -1, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllGather(buf, buf, (size_t)-1, zpFloat32, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllReduce(buf, buf, 4, zpFloat32, zpSum, comm, (zpStream_t)buf));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpBarrier(nullptr, nullptr));
    const size_t counts[] = {2, 2}, displs[] = {0, 2}, overlapping[] = {0, 1}, huge[] = {(size_t)-1, 1};
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllGatherv(buf, 2, buf, nullptr, displs, zpFloat32, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllGatherv(buf, 2, buf, counts, nullptr, zpFloat32, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllGatherv(buf, 3, buf, counts, displs, zpFloat32, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllGatherv(buf, 2, buf, counts, overlapping, zpFloat32, comm, nullptr));
    EXPECT_NE(std::string(zpGetLastError(comm)).find("ranks 0 and 1 overlap"), std::string::npos) << zpGetLastError(comm);
    ZP_EXPECT_ERROR(zpInvalidArgument, zpReduceScatterv(buf, buf, huge, zpFloat32, zpSum, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpReduceScatterv(buf, nullptr, counts, zpFloat32, zpSum, comm, nullptr));
    // None of those moved anything: the ranks are still in step.
    ZP_EXPECT_OK(zpBarrier(comm, nullptr));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// One rank refuses its own arguments (a wrong in-place offset, overlapping
// buffers, a NULL array, a root out of range) while the others make the
// valid call: the refusing rank still takes part in the header round, so
// it returns its own zpInvalidArgument and every other rank zpInvalidUsage
// naming it and its reason, nothing is written, and the next calls run on
// every rank with the right results (the ranks stay in step). Small calls
// (the fused all-reduce on the others' side) and large ones, and the v calls.
TEST(CollectiveErrors, OneRanksRefusedCallFailsOnEveryRankWithItsReasonAndTheNextCallRuns) {
  struct Case {
    const char* fn;
    const char* reason;  // part of the refusing rank's message
    size_t count;
    // The call, on rank `rank`; bad: this rank spoils its arguments.
    std::function<zpResult_t(zpComm_t, int rank, int n, bool bad, float* send, float* recv, size_t count)> call;
  };
  const std::vector<Case> cases = {
      {"zpAllGather", "not the in-place form", 64,
       [](zpComm_t comm, int rank, int n, bool bad, float* send, float* recv, size_t count) {
         // In place, but at the next rank's block instead of this rank's.
         float* in = bad ? recv + (size_t)((rank + 1) % n) * count : send;
         return zpAllGather(in, recv, count, zpFloat32, comm, nullptr);
       }},
      {"zpAllReduce", "overlap", 64,  // small: the others fuse the header with the data
       [](zpComm_t comm, int, int, bool bad, float* send, float* recv, size_t count) {
         return zpAllReduce(bad ? recv + 1 : send, recv, count, zpFloat32, zpSum, comm, nullptr);
       }},
      {"zpAllReduce", "overlap", 100000,
       [](zpComm_t comm, int, int, bool bad, float* send, float* recv, size_t count) {
         return zpAllReduce(bad ? recv + 1 : send, recv, count, zpFloat32, zpSum, comm, nullptr);
       }},
      {"zpReduceScatterv", "recvcounts is NULL", 1000,
       [](zpComm_t comm, int, int n, bool bad, float* send, float* recv, size_t count) {
         std::vector<size_t> counts(n, count);
         return zpReduceScatterv(send, recv, bad ? nullptr : counts.data(), zpFloat32, zpSum, comm, nullptr);
       }},
      {"zpBroadcast", "root 7 is not a rank", 10,
       [](zpComm_t comm, int, int, bool bad, float* send, float* recv, size_t count) {
         return zpBroadcast(send, recv, count, zpFloat32, bad ? 7 : 0, comm, nullptr);
       }},
  };
  zptest::expectAllOk(zptest::runRanks(3, [&](int rank, int n, const zpUniqueId& id) {
    zptest::setTimeoutSeconds(20);  // out of step, the next call would fail or wait, not this one
    zpComm_t comm = zptest::initComm(rank, n, id);
    for (const Case& k : cases) {
      SCOPED_TRACE(std::string(k.fn) + " of " + std::to_string(k.count));
      std::vector<float> send(k.count * n, 1.0f);
      GuardedBuffer recv(k.count * n * sizeof(float));
      zp::clearLastError();
      const zpResult_t r = k.call(comm, rank, n, rank == 1, send.data(), (float*)recv.data(), k.count);
      const std::string msg = zpGetLastError(comm);
      if (rank == 1) {
        EXPECT_EQ(r, zpInvalidArgument) << msg;
        EXPECT_NE(msg.find(k.reason), std::string::npos) << msg;
      } else {
        EXPECT_EQ(r, zpInvalidUsage) << msg;
        EXPECT_NE(msg.find(std::string("rank 1 refused ") + k.fn + ": "), std::string::npos) << msg;
        EXPECT_NE(msg.find(k.reason), std::string::npos) << msg;
        EXPECT_EQ(recv.writtenBytes() + recv.guardBytesWritten(), 0u) << "a refused call wrote";
      }
      // The next call runs everywhere, with the right sum.
      std::vector<float> x(k.count, float(rank + 1)), sum(k.count, 0.0f);
      ZP_EXPECT_OK(zpAllReduce(x.data(), sum.data(), k.count, zpFloat32, zpSum, comm, nullptr));
      EXPECT_EQ(sum[0], float(n * (n + 1) / 2));
      EXPECT_EQ(sum[k.count - 1], float(n * (n + 1) / 2));
    }
    zpResult_t async = zpInternalError;
    ZP_EXPECT_OK(zpCommGetAsyncError(comm, &async));
    EXPECT_EQ(async, zpSuccess) << "a refused call does not break the communicator";
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// Small and large: a large one waits for the dead rank's block in a reduce
// group, with the others' blocks already offered.
class DeadRank : public ::testing::TestWithParam<size_t> {};

TEST_P(DeadRank, IsARemoteErrorOnEveryOtherRank) {
  zptest::Shared<std::atomic<int>> ready;
  const size_t count = GetParam();
  zptest::expectAllOk(zptest::runRanks(4, [&](int rank, int nranks, const zpUniqueId& id) {
    zptest::setTimeoutSeconds(20);
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    (*ready)++;
    ASSERT_TRUE(zptest::waitFor([&] { return ready->load() == nranks; }, 60));
    if (rank == 1) _exit(0);
    std::vector<float> x(count, 1.0f);
    auto start = std::chrono::steady_clock::now();
    ZP_EXPECT_ERROR(zpRemoteError, zpAllReduce(x.data(), x.data(), count, zpFloat32, zpSum, comm, nullptr));
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
    zpCommAbort(comm);
  }));
}

INSTANTIATE_TEST_SUITE_P(CollectiveErrors, DeadRank, ::testing::Values(1000, 1u << 20));

// ---- A rank killed in the middle of a large collective ----
//
// Four ranks start a 64 MiB all-reduce (reduce-scatter, all-gather), and
// the test's parent process kills one of them from outside at a chosen
// moment: before the call (the survivors are in it, the victim never
// comes), early in it (all four in it, a fraction of a millisecond on:
// the reduce-scatter's messages in flight), while the victim reduces (the
// first of its results are in its output: a reduce group of the direct
// reduce-scatter, or the ring's first round, half done), or late (half of
// the victim's output has arrived: the all-gather under way, the
// reduce-scatter's sends possibly still in flight). The victim's output buffer is shared memory,
// so the parent sees how far it got: it stops the victim (SIGSTOP), counts
// what the victim's call had written, then kills it (SIGKILL).
//
// Every survivor must return within the timeout, never crash or write
// outside its buffers (guards, and the input of an out-of-place call
// unchanged), and then abort or destroy its communicator. A survivor whose
// messages with the victim were all done when it died may finish the call
// (as with NCCL): it must then hold the exact result. Every survivor must
// fail (zpRemoteError) when the victim never joined, and in an all-reduce
// killed before the victim had all of its block of the result: each
// survivor still needed the victim's part of it.
enum class DeadIn { kAllReduce, kReduceScatter, kAllGather };
enum class DeathMoment { kBeforeCall, kEarly, kReducing, kLate };
struct MidCallDeath {
  const char* proto;  // ZP_SHM_PROTO
  const char* algo;   // ZP_COLL_ALGO
  DeadIn coll;
  DeathMoment when;
};
std::string describe(const MidCallDeath& c) {
  const char* coll[] = {"allreduce", "reducescatter", "allgather"};
  const char* when[] = {"beforeCall", "early", "reducing", "late"};
  return std::string(coll[(int)c.coll]) + "_" + when[(int)c.when] + "_" + c.proto + "_" + c.algo;
}
void PrintTo(const MidCallDeath& c, std::ostream* os) { *os << describe(c); }
std::string midCallDeathName(const ::testing::TestParamInfo<MidCallDeath>& i) { return describe(i.param); }

struct DeathWatch {
  std::atomic<int> inCall{0};       // ranks about to make the call
  std::atomic<int> victimPid{0};
  std::atomic<int64_t> killedAtNs{0};  // steady clock (CLOCK_MONOTONIC, the same in every process)
  std::atomic<uint64_t> victimWritten{0};  // elements of the victim's output its call had written when it died
  std::atomic<int> victimReturned{0};     // the victim's call returned before the kill (the kill came too late)
};

// The victim's output: shared with the parent, which watches it.
class SharedOutput {
 public:
  explicit SharedOutput(size_t bytes) : bytes_(bytes + 2 * zptest::kGuardBytes) {
    p_ = (uint8_t*)mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p_ == MAP_FAILED) abort();
    memset(p_, zptest::kPoison, bytes_);
  }
  ~SharedOutput() { munmap(p_, bytes_); }
  float* data() { return (float*)(p_ + zptest::kGuardBytes); }
  size_t elems() const { return (bytes_ - 2 * zptest::kGuardBytes) / 4; }
  // Whether element i was written (a float of four poison bytes is never a result).
  bool written(size_t i) const {
    uint32_t x;
    memcpy(&x, p_ + zptest::kGuardBytes + i * 4, 4);
    return x != 0xA5A5A5A5u;
  }
  uint64_t writtenElems() const {
    uint64_t n = 0;
    for (size_t i = 0; i < elems(); i++) n += written(i);
    return n;
  }

 private:
  size_t bytes_;
  uint8_t* p_;
};

class MidCallDeaths : public ::testing::TestWithParam<MidCallDeath> {};

// Inputs of 64 MiB that are quick to make and to check: element j of rank
// r's input is table[r][j % kPeriod] (inputValue's), a prime period, so
// that a block moved by any multiple of the block size still shows.
constexpr size_t kPeriod = 65521;
using PeriodicTable = std::vector<float>;  // kPeriod elements
PeriodicTable periodicTable(uint64_t seed, int rank) {
  PeriodicTable t(kPeriod);
  fillInput(t.data(), kPeriod, 0, seed, rank, zpFloat32, zpSum);
  return t;
}
// Calls f(i, k, run) over runs of p[first, first + count) that hold table[k, k + run).
template <class F>
void overPeriods(size_t count, size_t first, F f) {
  for (size_t i = 0; i < count;) {
    const size_t k = (first + i) % kPeriod, run = std::min(count - i, kPeriod - k);
    f(i, k, run);
    i += run;
  }
}
void fillPeriodic(float* p, size_t count, size_t first, const PeriodicTable& t) {
  overPeriods(count, first, [&](size_t i, size_t k, size_t run) { memcpy(p + i, t.data() + k, run * 4); });
}
// "" if p[0, count) holds elements [first, first + count) of the table, else where it does not.
std::string periodicMismatch(const float* p, size_t count, size_t first, const PeriodicTable& t) {
  std::string err;
  overPeriods(count, first, [&](size_t i, size_t k, size_t run) {
    if (err.empty() && memcmp(p + i, t.data() + k, run * 4) != 0)
      for (size_t e = 0; e < run && err.empty(); e++)
        if (memcmp(p + i + e, t.data() + k + e, 4) != 0)
          err = "element " + std::to_string(i + e) + " is " + std::to_string(p[i + e]) + " instead of " +
                std::to_string(t[k + e]);
  });
  return err;
}

// ZP_TIMEOUT of the ranks. A death must be noticed within half of it: a
// timeout counts from the last progress, which stopped with the victim (a
// few ms before the kill), so a death waited out shows only as a wait close
// to the whole timeout.
constexpr double kMidCallTimeoutSec = 10;

TEST_P(MidCallDeaths, EverySurvivorFailsOrFinishesRightWithinTheTimeout) {
  const MidCallDeath c = GetParam();
  const uint64_t seed = zptest::testCaseSeed();
  const int n = 4, victim = 1 + (int)(seed % (n - 1));
  // 64 MiB of float32 on the large side: the all-reduce's buffers, the
  // reduce-scatter's input, the all-gather's output.
  const size_t block = 4u << 20, big = block * n;
  const size_t outElems = c.coll == DeadIn::kReduceScatter ? block : big;
  const size_t inElems = c.coll == DeadIn::kAllGather ? block : big;
  SharedOutput victimOut(outElems * 4);
  zptest::Shared<DeathWatch> watch;
  zptest::RunOptions opts;
  opts.timeoutSec = 90;
  // The parent: waits for the moment, stops the victim, counts what its
  // call had written, kills it.
  opts.afterFork = [&] {
    const int callers = c.when == DeathMoment::kBeforeCall ? n - 1 : n;
    ASSERT_TRUE(zptest::waitFor([&] { return watch->inCall.load() == callers && watch->victimPid.load() != 0; }, 60));
    const pid_t pid = watch->victimPid.load();
    ASSERT_GT(pid, 0);  // (kill(0, ...) would stop the whole process group)
    if (c.when == DeathMoment::kEarly) {
      usleep((useconds_t)(seed >> 8) % 1000);
    } else if (c.when == DeathMoment::kReducing) {
      // The first of 256 elements spread over the output written; polled
      // without sleeping, so that the victim is stopped soon after.
      auto any = [&] {
        for (size_t k = 0; k < 256; k++)
          if (victimOut.written(k * (outElems / 256) + (outElems / 256) / 2)) return true;
        return false;
      };
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (!any() && std::chrono::steady_clock::now() < until) sched_yield();
    } else if (c.when == DeathMoment::kLate) {
      // Half of 256 elements spread over the output written.
      auto half = [&] {
        int w = 0;
        for (size_t k = 0; k < 256; k++) w += victimOut.written(k * (outElems / 256) + (outElems / 256) / 2);
        return w >= 128;
      };
      EXPECT_TRUE(zptest::waitFor(half, 60)) << "the victim's output was never half written";
    } else {
      usleep(2000);
    }
    kill(pid, SIGSTOP);
    int st = 0;
    EXPECT_EQ(waitpid(pid, &st, WUNTRACED), pid);
    EXPECT_TRUE(WIFSTOPPED(st)) << "the victim ended before it was stopped";
    watch->victimWritten = victimOut.writtenElems();
    watch->killedAtNs = std::chrono::steady_clock::now().time_since_epoch().count();
    kill(pid, SIGKILL);
  };
  std::vector<zptest::RankExit> exits = zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zptest::setShmProto(c.proto);
    setenv("ZP_COLL_ALGO", c.algo, 1);
    zptest::setTimeoutSeconds(kMidCallTimeoutSec);
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    GuardedBuffer in(inElems * 4), mine(rank == victim ? 0 : outElems * 4);
    float* out = rank == victim ? victimOut.data() : (float*)mine.data();
    const size_t first = c.coll == DeadIn::kAllGather ? (size_t)rank * block : 0;
    std::vector<PeriodicTable> tables;
    for (int p = 0; p < nranks; p++) tables.push_back(periodicTable(seed, p));
    PeriodicTable sums(kPeriod, 0.0f);  // exact: small integers
    for (int p = 0; p < nranks; p++)
      for (size_t k = 0; k < kPeriod; k++) sums[k] += tables[p][k];
    fillPeriodic((float*)in.data(), inElems, first, tables[rank]);
    zptest::barrier(comm, nranks);  // every rank ready: the test's timing starts here
    if (rank == victim) {
      watch->victimPid = getpid();
      if (c.when == DeathMoment::kBeforeCall) {
        for (;;) pause();  // until killed
      }
    }
    watch->inCall++;
    const auto start = std::chrono::steady_clock::now();
    zpResult_t r = c.coll == DeadIn::kAllReduce
                       ? zpAllReduce(in.data(), out, big, zpFloat32, zpSum, comm, nullptr)
                   : c.coll == DeadIn::kReduceScatter
                       ? zpReduceScatter(in.data(), out, block, zpFloat32, zpSum, comm, nullptr)
                       : zpAllGather(in.data(), out, block, zpFloat32, comm, nullptr);
    const auto end = std::chrono::steady_clock::now();
    if (rank == victim) {
      watch->victimReturned = 1;
      ADD_FAILURE() << "the victim's call returned (" << zpGetErrorString(r) << ") before it was killed";
      for (;;) pause();
    }
    // A survivor may finish before the kill: what the victim had then decides what it may do.
    EXPECT_TRUE(zptest::waitFor([&] { return watch->killedAtNs.load() != 0; }, 60));
    const auto killedAt = std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(watch->killedAtNs.load()));
    const bool before = c.when == DeathMoment::kBeforeCall;
    const bool mustFail = before || (c.coll == DeadIn::kAllReduce && watch->victimWritten.load() < block);
    if (r == zpSuccess) {
      EXPECT_FALSE(mustFail) << "rank " << rank << " finished although it needed the dead rank "
                             << victim << " (" << watch->victimWritten.load() << " elements of its output written)";
      std::string wrong;
      if (c.coll == DeadIn::kAllReduce) wrong = periodicMismatch(out, big, 0, sums);
      if (c.coll == DeadIn::kReduceScatter) wrong = periodicMismatch(out, block, (size_t)rank * block, sums);
      if (c.coll == DeadIn::kAllGather)
        for (int p = 0; p < nranks && wrong.empty(); p++)
          wrong = periodicMismatch(out + (size_t)p * block, block, (size_t)p * block, tables[p]);
      EXPECT_EQ(wrong, "") << "rank " << rank << " finished with a wrong result";
    } else {
      EXPECT_EQ(r, zpRemoteError) << "rank " << rank << ": " << zpGetLastError(comm);
      EXPECT_GT(watch->killedAtNs.load(), 0) << "rank " << rank << " failed before the victim was killed: "
                                             << zpGetLastError(comm);
      EXPECT_LT(std::chrono::duration<double>(end - killedAt).count(), kMidCallTimeoutSec / 2)
          << "rank " << rank << " did not notice the death: it waited it out (ZP_TIMEOUT)";
      zpResult_t async = zpSuccess;
      ZP_EXPECT_OK(zpCommGetAsyncError(comm, &async));
      EXPECT_EQ(async, zpRemoteError);
    }
    EXPECT_LT(std::chrono::duration<double>(end - start).count(), 60.0);
    printf("[ death ] rank %d: %s after %.0f ms (victim rank %d, %llu of %zu elements of its output written)\n", rank,
           zpGetErrorString(r), std::chrono::duration<double, std::milli>(end - start).count(), victim,
           (unsigned long long)watch->victimWritten.load(), outElems);
    // Nothing written outside the buffers: guards, and the input untouched.
    EXPECT_EQ(in.guardBytesWritten() + mine.guardBytesWritten(), 0u) << "rank " << rank << " wrote past its buffers";
    EXPECT_EQ(periodicMismatch((const float*)in.data(), inElems, first, tables[rank]), "")
        << "rank " << rank << ": the input was written";
    if (rank % 2) ZP_EXPECT_OK(zpCommAbort(comm));
    else ZP_EXPECT_OK(zpCommDestroy(comm));
  }, opts);
  for (int r = 0; r < n; r++) {
    if (r == victim)
      EXPECT_TRUE(!exits[r].exited && exits[r].code == SIGKILL) << "the victim should have died of SIGKILL";
    else
      EXPECT_TRUE(exits[r].ok()) << "rank " << r << (exits[r].exited ? " exited with code " : " killed by signal ")
                                 << exits[r].code;
  }
  EXPECT_EQ(watch->victimReturned.load(), 0);
  if (c.when != DeathMoment::kBeforeCall)  // the kill landed before the victim's call was done
    EXPECT_LT(watch->victimWritten.load(), outElems) << "the victim had all of its output when it was killed";
  if (c.when == DeathMoment::kLate || c.when == DeathMoment::kReducing) EXPECT_GT(watch->victimWritten.load(), 0u);
}

std::vector<MidCallDeath> midCallDeaths() {
  std::vector<MidCallDeath> out;
  for (const char* proto : {"cma", "copy"})
    for (const char* algo : {"direct", "ring"}) {
      for (DeathMoment m : {DeathMoment::kBeforeCall, DeathMoment::kEarly, DeathMoment::kReducing, DeathMoment::kLate})
        out.push_back({proto, algo, DeadIn::kAllReduce, m});
      out.push_back({proto, algo, DeadIn::kReduceScatter, DeathMoment::kEarly});
      out.push_back({proto, algo, DeadIn::kAllGather, DeathMoment::kLate});
    }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Kills, MidCallDeaths, ::testing::ValuesIn(midCallDeaths()), midCallDeathName);

}  // namespace
