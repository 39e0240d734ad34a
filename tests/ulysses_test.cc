// The variable-length Ulysses all-to-all against a single-process reference:
// random packed batches in random sequence-parallel layouts, odd head counts
// (some ranks with no heads), GQA (keys and values with fewer heads, summed
// on the way back), on 2, 3, 4 and 8 ranks.
#include <gtest/gtest.h>

#include <climits>
#include <cmath>
#include <random>
#include <string>

#include "include/zeppelin.h"
#include "tests/harness.h"

namespace {

// The element of token t (position in the packed batch), head h, dim d.
double valueOf(uint64_t seed, int64_t t, int h, int d) {
  uint64_t x = seed ^ (uint64_t)t * 0x9E3779B97F4A7C15ull ^ (uint64_t)h * 0xC2B2AE3D27D4EB4Full ^ (uint64_t)d;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  return (double)(x >> 52) - 2048;  // small integers: float sums stay exact
}

struct Batch {
  std::vector<int64_t> lens, cu;
  std::vector<size_t> offs;
  std::vector<zpSegment_t> segs;
  std::vector<std::vector<int64_t>> tokens;  // per rank: packed positions in buffer order
};

Batch randomBatch(std::mt19937_64& rng, int G) {
  Batch b;
  b.lens.resize(1 + rng() % 12);
  for (auto& l : b.lens) l = 1 + rng() % (rng() % 4 == 0 ? 300 : 20);
  b.cu.assign(1, 0);
  for (auto l : b.lens) b.cu.push_back(b.cu.back() + l);
  std::vector<std::vector<zpSegment_t>> per(G);
  for (size_t s = 0; s < b.lens.size(); s++)
    for (int64_t at = 0; at < b.lens[s];) {
      int64_t take = std::min<int64_t>(b.lens[s] - at, 1 + rng() % b.lens[s]);
      per[rng() % G].push_back({(int64_t)s, at, take});
      at += take;
    }
  b.offs.assign(1, 0);
  b.tokens.resize(G);
  for (int r = 0; r < G; r++) {
    std::shuffle(per[r].begin(), per[r].end(), rng);
    for (auto& sg : per[r]) {
      b.segs.push_back(sg);
      for (int64_t t = 0; t < sg.count; t++) b.tokens[r].push_back(b.cu[sg.seq] + sg.start + t);
    }
    b.offs.push_back(b.segs.size());
  }
  return b;
}

template <class E>
void runCase(zpComm_t comm, int rank, int G, std::mt19937_64& rng, zpDataType_t dt, bool gqa) {
  Batch b = randomBatch(rng, G);
  int qHeads = 1 + rng() % 11, g = gqa ? std::vector<int>{1, 2, 3, 4}[rng() % 4] : 1;
  if (qHeads % g) qHeads = g * (1 + qHeads / g);
  int heads = qHeads / g, D = 1 + rng() % 5;
  uint64_t seed = rng();
  zpLayout_t layout = nullptr;
  ASSERT_EQ(zpLayoutCreate(&layout, (int)b.lens.size(), b.lens.data(), G, b.offs.data(), b.segs.data()), zpSuccess)
      << zpGetLastError(nullptr);
  // This rank's heads, as the reference computes them.
  int qlo = rank * qHeads / G, qhi = (rank + 1) * qHeads / G;
  int lo = qlo == qhi ? 0 : qlo / g, hi = qlo == qhi ? 0 : (qhi + g - 1) / g, mh = hi - lo;
  const std::vector<int64_t>& mine = b.tokens[rank];
  const int64_t T = b.cu.back();
  std::vector<E> in(mine.size() * heads * D), out(T * mh * D + 7, (E)NAN);
  for (size_t i = 0; i < mine.size(); i++)
    for (int h = 0; h < heads; h++)
      for (int d = 0; d < D; d++) in[(i * heads + h) * D + d] = (E)valueOf(seed, mine[i], h, d);
  ASSERT_EQ(zpUlyssesAlltoall(in.data(), out.data(), layout, qHeads, heads, D, dt, 0, comm, nullptr), zpSuccess)
      << zpGetLastError(comm);
  size_t wrong = 0;
  for (int64_t t = 0; t < T; t++)
    for (int h = 0; h < mh; h++)
      for (int d = 0; d < D; d++) wrong += out[(t * mh + h) * D + d] != (E)valueOf(seed, t, lo + h, d);
  EXPECT_EQ(wrong, 0u) << "rank " << rank << ": sequence to head, " << qHeads << "/" << heads << " heads";
  for (size_t i = T * mh * D; i < out.size(); i++) ASSERT_TRUE(std::isnan((double)out[i])) << "written past the end";
  // Back: every rank's head-parallel values (rank-dependent), summed where a head lives on several ranks.
  std::vector<E> hp(T * mh * D), back(mine.size() * heads * D + 7, (E)NAN);
  for (int64_t t = 0; t < T; t++)
    for (int h = 0; h < mh; h++)
      for (int d = 0; d < D; d++) hp[(t * mh + h) * D + d] = (E)(valueOf(seed + 1, t, lo + h, d) + rank);
  ASSERT_EQ(zpUlyssesAlltoall(hp.data(), back.data(), layout, qHeads, heads, D, dt, 1, comm, nullptr), zpSuccess)
      << zpGetLastError(comm);
  wrong = 0;
  for (size_t i = 0; i < mine.size(); i++)
    for (int h = 0; h < heads; h++) {
      double holders = 0, rankSum = 0;
      for (int p = 0; p < G; p++) {
        int a = p * qHeads / G, z = (p + 1) * qHeads / G;
        if (a < z && a / g <= h && h < (z + g - 1) / g) {
          holders++;
          rankSum += p;
        }
      }
      for (int d = 0; d < D; d++)
        wrong += back[(i * heads + h) * D + d] != (E)(holders * valueOf(seed + 1, mine[i], h, d) + rankSum);
    }
  EXPECT_EQ(wrong, 0u) << "rank " << rank << ": head to sequence, " << qHeads << "/" << heads << " heads";
  for (size_t i = mine.size() * heads * D; i < back.size(); i++) ASSERT_TRUE(std::isnan((double)back[i]));
  zpLayoutDestroy(layout);
}

class UlyssesRanks : public ::testing::TestWithParam<int> {};

TEST_P(UlyssesRanks, MatchesTheReferenceForOddHeadsAndGqa) {
  const int n = GetParam();
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    for (int it = 0; it < 8; it++) {
      std::mt19937_64 rng(seed + it);  // the same batch on every rank
      if (it % 2) runCase<double>(comm, rank, nranks, rng, zpFloat64, it % 4 == 1);
      else runCase<float>(comm, rank, nranks, rng, zpFloat32, it % 4 == 2);
    }
    zpCommDestroy(comm);
    if (::testing::Test::HasFailure()) _exit(1);
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, UlyssesRanks, ::testing::Values(2, 3, 4, 8));

TEST(Ulysses, BadArgumentsGetClearErrors) {
  zptest::expectAllOk(zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    int64_t lens[] = {4};
    size_t offs[] = {0, 1, 2};
    zpSegment_t segs[] = {{0, 0, 2}, {0, 2, 2}};
    zpLayout_t l = nullptr;
    ASSERT_EQ(zpLayoutCreate(&l, 1, lens, 2, offs, segs), zpSuccess);
    std::vector<float> a(64), b(64);
    ZP_EXPECT_ERROR(zpInvalidArgument, zpUlyssesAlltoall(a.data(), b.data(), l, 6, 4, 2, zpFloat32, 0, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpUlyssesAlltoall(a.data(), b.data(), l, 4, 4, 2, zpFloat32, 2, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpUlyssesAlltoall(a.data(), b.data(), nullptr, 4, 4, 2, zpFloat32, 0, comm, nullptr));
    // Replicated key/value heads are summed going back: bf16 cannot be.
    ZP_EXPECT_ERROR(zpInvalidArgument, zpUlyssesAlltoall(a.data(), b.data(), l, 4, 1, 2, zpBfloat16, 1, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument,
                    zpUlyssesAlltoall(a.data(), b.data(), l, 4, 4, 2, zpFloat32, 0, comm, (zpStream_t)a.data()));
    // A stream means device buffers: this communicator has none.
    EXPECT_NE(std::string(zpGetLastError(nullptr)).find("no device data plane"), std::string::npos)
        << zpGetLastError(nullptr);
    // Shapes whose byte counts would wrap around size_t: refused before any
    // buffer is sized (they crashed before).
    ZP_EXPECT_ERROR(zpInvalidArgument,
                    zpUlyssesAlltoall(a.data(), b.data(), l, 1 << 30, 1 << 30, 1 << 30, zpFloat32, 0, comm, nullptr));
    EXPECT_NE(std::string(zpGetLastError(nullptr)).find("too large"), std::string::npos) << zpGetLastError(nullptr);
    // A head count whose per-head tables alone would take gigabytes (INT_MAX
    // heads of one element: under the size cap).
    ZP_EXPECT_ERROR(zpInvalidArgument,
                    zpUlyssesAlltoall(a.data(), b.data(), l, INT_MAX, INT_MAX, 1, zpUint8, 0, comm, nullptr));
    EXPECT_NE(std::string(zpGetLastError(nullptr)).find("2147483647 query heads"), std::string::npos)
        << zpGetLastError(nullptr);
    int64_t bigLens[] = {int64_t(1) << 40};
    zpSegment_t bigSegs[] = {{0, 0, int64_t(1) << 39}, {0, int64_t(1) << 39, int64_t(1) << 39}};
    zpLayout_t big = nullptr;
    ASSERT_EQ(zpLayoutCreate(&big, 1, bigLens, 2, offs, bigSegs), zpSuccess) << zpGetLastError(nullptr);
    ZP_EXPECT_ERROR(zpInvalidArgument,
                    zpUlyssesAlltoall(a.data(), b.data(), big, 1024, 1024, 1024, zpFloat32, 0, comm, nullptr));
    zpLayoutDestroy(big);
    // Nothing was sent by the refused calls: the next one works.
    std::vector<float> in(2 * 2 * 3), out(4 * 1 * 3, NAN);
    for (size_t i = 0; i < in.size(); i++) in[i] = (float)(100 * rank + i);
    ASSERT_EQ(zpUlyssesAlltoall(in.data(), out.data(), l, 2, 2, 3, zpFloat32, 0, comm, nullptr), zpSuccess)
        << zpGetLastError(comm);
    for (int t = 0; t < 4; t++)  // token t is rank t/2's local token t%2; this rank's head is head `rank`
      for (int d = 0; d < 3; d++)
        EXPECT_EQ(out[t * 3 + d], (float)(100 * (t / 2) + ((t % 2) * 2 + rank) * 3 + d)) << t << " " << d;
    zpLayoutDestroy(l);
    zpCommDestroy(comm);
    if (::testing::Test::HasFailure()) _exit(1);
  }));
}

}  // namespace

// An allocation that fails inside a call is zpSystemError on every rank, not
// a std::bad_alloc through the C API (headDim = INT_MAX aborted the process).
TEST(Ulysses, OutOfMemoryIsAnErrorNotAnAbort) {
  zptest::expectAllOk(zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    int64_t lens[] = {64};
    size_t offs[] = {0, 1, 2};
    zpSegment_t segs[] = {{0, 0, 32}, {0, 32, 32}};
    zpLayout_t l = nullptr;
    ASSERT_EQ(zpLayoutCreate(&l, 1, lens, 2, offs, segs), zpSuccess);
    std::vector<float> a(64), b(64);
    // 64 tokens x 2 heads x INT_MAX x 4 bytes: below the size cap, far above memory.
    ZP_EXPECT_ERROR(zpSystemError, zpUlyssesAlltoall(a.data(), b.data(), l, 2, 2, INT_MAX, zpFloat32, 0, comm, nullptr));
    EXPECT_NE(std::string(zpGetLastError(nullptr)).find("out of memory"), std::string::npos) << zpGetLastError(nullptr);
    zpLayoutDestroy(l);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}
