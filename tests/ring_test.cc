// Ring exchanges: blocks of random, per-step sizes passed round rings over
// all ranks and over subsets in shuffled order, double buffered, every byte
// checked after every step; the bidirectional mode; several rings alive.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "include/zeppelin.h"
#include "tests/harness.h"

namespace {

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t h = a ^ (b + 0x9E3779B97F4A7C15ull);
  h ^= h >> 31;
  return h * 0xBF58476D1CE4E5B9ull;
}

uint8_t byteOf(uint64_t seed, int origin, int step, size_t i) {
  uint64_t h = seed ^ (uint64_t)origin * 0x9E3779B97F4A7C15ull ^ (uint64_t)step * 0xC2B2AE3D27D4EB4Full ^ i;
  h ^= h >> 29;
  return (uint8_t)(h * 0xBF58476D1CE4E5B9ull >> 56);
}

// Runs G-1 steps of the ring `ring` (this rank at position pos): the block
// that started at ring position o travels on; its size depends on (o, seed).
void passAround(zpComm_t comm, const std::vector<int>& ring, int pos, uint64_t seed) {
  const int G = (int)ring.size();
  auto sizeOf = [&](int origin) { return (size_t)(mix(seed, origin) % 70000); };
  zpRing_t r = nullptr;
  ASSERT_EQ(zpRingCreate(&r, comm, G, ring.data(), 0), zpSuccess) << zpGetLastError(comm);
  std::vector<uint8_t> cur(sizeOf(pos)), bufs[2];
  for (size_t i = 0; i < cur.size(); i++) cur[i] = byteOf(seed, pos, 0, i);
  for (int step = 1; step < G; step++) {
    int from = ((pos - step) % G + G) % G;  // whose block arrives now
    std::vector<uint8_t>& next = bufs[step % 2];
    next.assign(sizeOf(from) + 16, 0xA5);
    ASSERT_EQ(zpRingExchangeStart(r, cur.data(), cur.size(), next.data(), sizeOf(from), nullptr), zpSuccess);
    ZP_EXPECT_ERROR(zpInvalidUsage, zpRingExchangeStart(r, cur.data(), cur.size(), next.data(), sizeOf(from), nullptr));
    ASSERT_EQ(zpRingExchangeWait(r), zpSuccess) << zpGetLastError(comm);
    size_t wrong = 0;
    for (size_t i = 0; i < sizeOf(from); i++) wrong += next[i] != byteOf(seed, from, 0, i);
    for (size_t i = sizeOf(from); i < next.size(); i++) wrong += next[i] != 0xA5;
    EXPECT_EQ(wrong, 0u) << "step " << step << ": block of ring position " << from;
    next.resize(sizeOf(from));
    cur.swap(next);
  }
  ASSERT_EQ(zpRingDestroy(r), zpSuccess);
}

class RingRanks : public ::testing::TestWithParam<int> {};

TEST_P(RingRanks, VariableBlocksGoRoundEveryRingEveryByteChecked) {
  const int n = GetParam();
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    // All ranks in order.
    std::vector<int> all(nranks);
    for (int i = 0; i < nranks; i++) all[i] = i;
    passAround(comm, all, rank, seed);
    // Two rings in shuffled order: even ranks and odd ranks (one rank alone is a ring of one).
    std::mt19937_64 rng(seed);
    std::vector<int> even, odd;
    for (int i = 0; i < nranks; i++) (i % 2 ? odd : even).push_back(i);
    std::shuffle(even.begin(), even.end(), rng);
    std::shuffle(odd.begin(), odd.end(), rng);
    const std::vector<int>& mine = rank % 2 ? odd : even;
    int pos = (int)(std::find(mine.begin(), mine.end(), rank) - mine.begin());
    passAround(comm, mine, pos, seed + 1);
    // Several rings alive at once on one communicator, used in turn.
    zpRing_t a = nullptr, b = nullptr;
    std::vector<int> rev(all.rbegin(), all.rend());
    ASSERT_EQ(zpRingCreate(&a, comm, nranks, all.data(), 0), zpSuccess);
    ASSERT_EQ(zpRingCreate(&b, comm, nranks, rev.data(), 1), zpSuccess);
    // Bidirectional: equal sizes in a step; first half from the previous rank, second from the next.
    for (int step = 0; step < 3; step++) {
      size_t sz = 1 + mix(seed, step) % 50000;
      std::vector<uint8_t> send(sz), recv(sz, 0xA5);
      for (size_t i = 0; i < sz; i++) send[i] = byteOf(seed, rank, step, i);
      ASSERT_EQ(zpRingExchangeStart(b, send.data(), sz, recv.data(), sz, nullptr), zpSuccess);
      ASSERT_EQ(zpRingExchangeWait(b), zpSuccess) << zpGetLastError(comm);
      int pos = nranks - 1 - rank, prev = rev[(pos + nranks - 1) % nranks], next = rev[(pos + 1) % nranks];
      size_t wrong = 0;
      for (size_t i = 0; i < sz / 2; i++) wrong += recv[i] != byteOf(seed, prev, step, i);
      for (size_t i = sz / 2; i < sz; i++) wrong += recv[i] != byteOf(seed, next, step, i);
      EXPECT_EQ(wrong, 0u) << "bidirectional step " << step;
      uint8_t x = (uint8_t)rank, y = 0;
      ASSERT_EQ(zpRingExchangeStart(a, &x, 1, &y, 1, nullptr), zpSuccess);
      ASSERT_EQ(zpRingExchangeWait(a), zpSuccess);
      EXPECT_EQ(y, (uint8_t)((rank + nranks - 1) % nranks));
    }
    zpRingDestroy(a);
    zpRingDestroy(b);
    zpRing_t bad = nullptr;
    std::vector<int> dup = {0, 0};
    ZP_EXPECT_ERROR(zpInvalidArgument, zpRingCreate(&bad, comm, 2, dup.data(), 0));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpRingExchangeWait(nullptr));
    zpCommDestroy(comm);
    if (::testing::Test::HasFailure()) _exit(1);
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, RingRanks, ::testing::Values(2, 3, 4, 8));

}  // namespace
