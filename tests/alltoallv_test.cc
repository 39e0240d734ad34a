// zpAlltoallv across real processes: random counts (with zeros, odd sizes and
// unaligned displacements), every byte checked, poison and guard bytes checked.
#include <cstring>
#include <numeric>

#include "tests/harness.h"

namespace {

using zptest::kPoison;
using zptest::patternByte;

constexpr size_t kGuard = 256;

// Counts matrix (elements) for all ranks from one seed: every rank computes the same.
std::vector<std::vector<size_t>> randomCounts(int n, uint64_t seed, size_t maxCount, double zeroFraction) {
  std::mt19937_64 rng(seed);
  std::vector<std::vector<size_t>> c(n, std::vector<size_t>(n));
  for (auto& row : c)
    for (auto& v : row) v = (std::uniform_real_distribution<>(0, 1)(rng) < zeroFraction) ? 0 : rng() % (maxCount + 1);
  return c;
}

// Runs one alltoallv on this rank with the given matrix and checks everything.
void checkedAlltoallv(zpComm_t comm, int rank, int n, const std::vector<std::vector<size_t>>& counts,
                      zpDataType_t dt, uint64_t seed) {
  size_t ts = zpTypeSize(dt);
  std::mt19937_64 rng(seed + rank);
  std::vector<size_t> sc(n), sd(n), rc(n), rd(n);
  size_t sendTotal = 0, recvTotal = 0;
  for (int p = 0; p < n; p++) {
    sc[p] = counts[rank][p];
    rc[p] = counts[p][rank];
    // Displacements leave random gaps so ranges start at odd element offsets.
    sd[p] = sendTotal + rng() % 3;
    sendTotal = sd[p] + sc[p];
    rd[p] = recvTotal + rng() % 3;
    recvTotal = rd[p] + rc[p];
  }
  std::vector<uint8_t> send(sendTotal * ts + 1), recv(recvTotal * ts + kGuard + 1);
  // Offset by one byte: buffers need not be aligned.
  uint8_t* sbuf = send.data() + 1;
  uint8_t* rbuf = recv.data() + 1;
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < sc[p] * ts; i++) sbuf[sd[p] * ts + i] = patternByte(seed, rank, p, i);
  memset(recv.data(), kPoison, recv.size());
  zpResult_t r = zpAlltoallv(sbuf, sc.data(), sd.data(), rbuf, rc.data(), rd.data(), dt, comm, nullptr);
  ASSERT_EQ(r, zpSuccess) << zpGetLastError(comm);
  std::vector<bool> covered(recvTotal * ts, false);
  size_t wrong = 0;
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < rc[p] * ts; i++) {
      covered[rd[p] * ts + i] = true;
      if (rbuf[rd[p] * ts + i] != patternByte(seed, p, rank, i)) wrong++;
    }
  EXPECT_EQ(wrong, 0u) << "rank " << rank << ": wrong bytes received";
  size_t touched = 0;  // bytes outside every receive range must keep the poison
  for (size_t i = 0; i < covered.size(); i++)
    if (!covered[i] && rbuf[i] != kPoison) touched++;
  for (size_t i = 0; i < kGuard; i++)
    if (rbuf[recvTotal * ts + i] != kPoison) touched++;
  if (recv[0] != kPoison) touched++;
  EXPECT_EQ(touched, 0u) << "rank " << rank << ": bytes outside the receive ranges were written";
}

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
      checkedAlltoallv(comm, rank, nranks, counts, dt, seed + iter);
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
    std::vector<std::vector<size_t>> counts(nranks, std::vector<size_t>(nranks, perPeer));
    checkedAlltoallv(comm, rank, nranks, counts, zpUint8, seed);
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
      checkedAlltoallv(comm, rank, nranks, counts, (zpDataType_t)t, seed + t);
    }
    EXPECT_EQ(zpCommDestroy(comm), zpSuccess);
  });
  zptest::expectAllOk(exits);
}

INSTANTIATE_TEST_SUITE_P(Ranks, AlltoallvRanks, ::testing::Values(2, 3, 4, 8),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param) + "ranks"; });

}  // namespace
