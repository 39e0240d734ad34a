// zpAlltoallv across real processes: random counts (with zeros, odd sizes and
// unaligned displacements), every byte checked, poison and guard bytes checked
// (the buffers and checks are in tests/checks.h).
#include "tests/harness.h"

namespace {

using zptest::checkedAlltoallv;
using zptest::randomCounts;

class AlltoallvRanks : public ::testing::TestWithParam<int> {};

TEST_P(AlltoallvRanks, RandomCountsEveryByteChecked) {
  int n = GetParam();
  uint64_t seed = zptest::testSeed() + n;
  auto exits = zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    for (int iter = 0; iter < 6; iter++) {
      // Small counts (eager), large counts (single copy), and many zeros.
      size_t maxCount = iter % 3 == 0 ? 17 : iter % 3 == 1 ? 3000 : 300000;
      auto counts = randomCounts(nranks, seed * 31 + iter, maxCount, 0.25);
      zpDataType_t dt = (zpDataType_t)(iter % zpNumTypes);
      checkedAlltoallv(comm, rank, counts, dt, seed + iter);
    }
    EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
  });
  zptest::expectAllOk(exits);
}

TEST_P(AlltoallvRanks, SixtyFourMiBPerRank) {
  int n = GetParam();
  uint64_t seed = zptest::testSeed() + 100 + n;
  auto exits = zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    size_t perPeer = (64u << 20) / nranks;  // 64 MiB sent by each rank in all
    checkedAlltoallv(comm, rank, zptest::uniformCounts(nranks, perPeer), zpUint8, seed);
    EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
  });
  zptest::expectAllOk(exits);
}

TEST_P(AlltoallvRanks, EveryDatatype) {
  int n = GetParam();
  uint64_t seed = zptest::testSeed() + 200 + n;
  auto exits = zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    for (int t = 0; t < zpNumTypes; t++) {
      auto counts = randomCounts(nranks, seed + t, 5000, 0.1);
      checkedAlltoallv(comm, rank, counts, (zpDataType_t)t, seed + t);
    }
    EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
  });
  zptest::expectAllOk(exits);
}

// The same through the ring only (ZP_SHM_PROTO=copy), no single-copy reads.
TEST_P(AlltoallvRanks, CopyProtocolRandomCounts) {
  int n = GetParam();
  uint64_t seed = zptest::testSeed() + 300 + n;
  auto exits = zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zptest::setShmProto("copy");
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    for (int iter = 0; iter < 3; iter++) {
      size_t maxCount = iter == 0 ? 17 : iter == 1 ? 3000 : 300000;
      checkedAlltoallv(comm, rank, randomCounts(nranks, seed * 31 + iter, maxCount, 0.25), zpFloat32, seed + iter);
    }
    EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
  });
  zptest::expectAllOk(exits);
}

// In a group the call's count and displacement arrays are read at the call,
// not at zpGroupEnd: one heap array serves two grouped calls (refilled for
// the second) and is freed before zpGroupEnd. Both calls' bytes are checked.
TEST_P(AlltoallvRanks, GroupedArraysCapturedAtTheCall) {
  int n = GetParam();
  uint64_t seed = zptest::testSeed() + 400 + n;
  auto exits = zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    zptest::AlltoallvRun a(rank, randomCounts(nranks, seed, 3000, 0.2), zpFloat32, seed);
    zptest::AlltoallvRun b(rank, randomCounts(nranks, seed + 1, 3000, 0.2), zpFloat32, seed + 1);
    size_t* arrays = new size_t[4 * nranks];
    auto fill = [&](const zptest::AlltoallvRun& r) {
      const size_t* from[4] = {r.sendCounts(), r.sendDispls(), r.recvCounts(), r.recvDispls()};
      for (int k = 0; k < 4; k++) std::copy(from[k], from[k] + nranks, arrays + k * nranks);
    };
    ZP_ASSERT_OK(zpGroupStart());
    for (zptest::AlltoallvRun* r : {&a, &b}) {
      fill(*r);
      r->recvBuffer().poison();
      ZP_EXPECT_OK(zpAlltoallv(r->sendBuffer().data(), arrays, arrays + nranks, r->recvBuffer().data(),
                               arrays + 2 * nranks, arrays + 3 * nranks, zpFloat32, comm, nullptr));
    }
    std::fill(arrays, arrays + 4 * nranks, (size_t)7);  // what a reused array would hold
    delete[] arrays;
    ZP_ASSERT_OK(zpGroupEnd());
    EXPECT_EQ(a.check(), "");
    EXPECT_EQ(b.check(), "");
    EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
  });
  zptest::expectAllOk(exits);
}

INSTANTIATE_TEST_SUITE_P(Ranks, AlltoallvRanks, ::testing::Values(2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param) + "ranks"; });

}  // namespace
