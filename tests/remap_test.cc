// Remap collectives: every token lands where the destination layout says,
// and forward then inverse returns every byte, for random layouts and for
// the planner's layouts, on 2, 3, 4 and 8 ranks (every rank a process).
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "include/zeppelin.h"
#include "src/plan/layout.h"
#include "src/plan/planner.h"
#include "tests/harness.h"

namespace {

using zp::plan::Layout;
using zp::plan::Segment;

// A random layout of lens over n ranks: each sequence cut into up to four
// runs on random ranks, each rank's runs in random order.
Layout randomLayout(const std::vector<int64_t>& lens, int n, std::mt19937_64& rng) {
  Layout l;
  l.seqLens = lens;
  l.ranks.assign(n, {});
  for (size_t s = 0; s < lens.size(); s++) {
    int64_t at = 0;
    while (at < lens[s]) {
      int64_t take = rng() % 3 == 0 ? lens[s] - at : 1 + (int64_t)(rng() % lens[s]);
      take = std::min(take, lens[s] - at);
      l.ranks[rng() % n].push_back({(int64_t)s, at, take});
      at += take;
    }
  }
  for (auto& segs : l.ranks) std::shuffle(segs.begin(), segs.end(), rng);
  return l;
}

zpLayout_t toC(const Layout& l) {
  std::vector<size_t> offs{0};
  std::vector<zpSegment_t> segs;
  for (const auto& r : l.ranks) {
    for (const Segment& s : r) segs.push_back({s.seq, s.start, s.count});
    offs.push_back(segs.size());
  }
  zpLayout_t out = nullptr;
  zpResult_t res = zpLayoutCreate(&out, (int)l.seqLens.size(), l.seqLens.data(), (int)l.ranks.size(), offs.data(),
                                  segs.data());
  EXPECT_EQ(res, zpSuccess) << zpGetLastError(nullptr);
  return out;
}

uint8_t byteOf(uint64_t seed, int64_t seq, int64_t tok, size_t b) {
  uint64_t h = seed ^ (uint64_t)seq * 0x9E3779B97F4A7C15ull ^ (uint64_t)tok * 0xC2B2AE3D27D4EB4Full ^ b * 0x165667B1ull;
  h ^= h >> 29;
  h *= 0xBF58476D1CE4E5B9ull;
  return (uint8_t)(h >> 56);
}

std::vector<uint8_t> bufferOf(const Layout& l, int rank, size_t tb, uint64_t seed) {
  std::vector<uint8_t> v;
  for (const Segment& s : l.ranks[rank])
    for (int64_t t = s.start; t < s.start + s.count; t++)
      for (size_t b = 0; b < tb; b++) v.push_back(byteOf(seed, s.seq, t, b));
  return v;
}

// One rank: forward into a poisoned buffer, check it against the
// destination layout, inverse into another, check it equals the input.
void roundTrip(zpComm_t comm, int rank, const Layout& from, const Layout& to, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const zpDataType_t types[] = {zpUint8, zpFloat32, zpFloat64, zpBfloat16, zpInt64};
  zpDataType_t dt = types[rng() % 5];
  size_t ept = 1 + rng() % 9, tb = ept * zpTypeSize(dt);
  zpLayout_t a = toC(from), b = toC(to);
  zpRemap_t remap = nullptr;
  ASSERT_EQ(zpRemapCreate(&remap, a, b, comm), zpSuccess) << zpGetLastError(comm);
  std::vector<uint8_t> in = bufferOf(from, rank, tb, seed), want = bufferOf(to, rank, tb, seed);
  std::vector<uint8_t> out(want.size() + 64, 0xA5), back(in.size() + 64, 0x5A);
  ASSERT_EQ(zpRemapExecute(remap, in.data(), out.data(), ept, dt, 0, comm, nullptr), zpSuccess) << zpGetLastError(comm);
  size_t wrong = 0;
  for (size_t i = 0; i < want.size(); i++) wrong += out[i] != want[i];
  EXPECT_EQ(wrong, 0u) << "rank " << rank << ": forward: wrong bytes (of " << want.size() << ")";
  for (size_t i = want.size(); i < out.size(); i++) ASSERT_EQ(out[i], 0xA5) << "written past the end";
  ASSERT_EQ(zpRemapExecute(remap, out.data(), back.data(), ept, dt, 1, comm, nullptr), zpSuccess)
      << zpGetLastError(comm);
  wrong = 0;
  for (size_t i = 0; i < in.size(); i++) wrong += back[i] != in[i];
  EXPECT_EQ(wrong, 0u) << "rank " << rank << ": inverse: wrong bytes";
  for (size_t i = in.size(); i < back.size(); i++) ASSERT_EQ(back[i], 0x5A) << "written past the end";
  EXPECT_EQ(zpRemapDestroy(remap), zpSuccess);
  zpLayoutDestroy(a);
  zpLayoutDestroy(b);
}

using namespace zp::plan;

TEST(Layout, ValidationNamesTheFirstProblem) {
  Layout l;
  l.seqLens = {10, 5};
  l.ranks = {{{0, 0, 6}}, {{0, 6, 4}, {1, 0, 5}}};
  std::string why;
  EXPECT_TRUE(validateLayout(l, &why)) << why;
  Layout gap = l;
  gap.ranks[1][0] = {0, 7, 3};
  EXPECT_FALSE(validateLayout(gap, &why));
  EXPECT_NE(why.find("tokens [6, 7) are on no rank"), std::string::npos) << why;
  Layout twice = l;
  twice.ranks[1][0] = {0, 5, 5};
  EXPECT_FALSE(validateLayout(twice, &why));
  EXPECT_NE(why.find("token 5 is on two ranks"), std::string::npos) << why;
  Layout outside = l;
  outside.ranks[1][1] = {1, 1, 5};
  EXPECT_FALSE(validateLayout(outside, &why));
  EXPECT_NE(why.find("outside"), std::string::npos) << why;
  Layout badSeq = l;
  badSeq.ranks[0][0].seq = 7;
  EXPECT_FALSE(validateLayout(badSeq, &why));
  EXPECT_NE(why.find("rank 0, segment 0"), std::string::npos) << why;
  Layout empty = l;
  empty.ranks[0].push_back({1, 0, 0});
  EXPECT_FALSE(validateLayout(empty, &why));
}

// Each kind of bad layout through the C API: zpInvalidArgument, no layout,
// and a message that names the rank, segment, sequence or tokens.
TEST(Layout, CApiNamesEachKindOfError) {
  struct Case {
    const char* what;
    std::vector<int64_t> lens;
    std::vector<size_t> offs;
    std::vector<zpSegment_t> segs;
    const char* message;
  };
  const int64_t huge = int64_t(1) << 47;
  const std::vector<Case> cases = {
      {"gap", {10}, {0, 1, 2}, {{0, 0, 4}, {0, 5, 5}}, "sequence 0: tokens [4, 5) are on no rank"},
      {"missing tail", {10}, {0, 1, 2}, {{0, 0, 4}, {0, 4, 5}}, "sequence 0: tokens [9, 10) are on no rank"},
      {"overlap", {10}, {0, 1, 2}, {{0, 0, 6}, {0, 5, 5}}, "token 5 is on two ranks"},
      {"out of range", {10}, {0, 1, 2}, {{0, 0, 5}, {0, 5, 6}}, "rank 1, segment 0: tokens [5, 11) of sequence 0"},
      {"negative start", {10}, {0, 2, 2}, {{0, -1, 1}, {0, 0, 10}}, "rank 0, segment 0: tokens [-1, 0)"},
      {"zero count", {10}, {0, 1, 3}, {{0, 0, 10}, {0, 3, 3}, {0, 4, 0}}, "rank 1, segment 1: token count 0"},
      {"negative count", {10}, {0, 1, 2}, {{0, 0, 10}, {0, 4, -2}}, "rank 1, segment 0: token count -2"},
      {"bad sequence id", {10}, {0, 1, 2}, {{0, 0, 10}, {3, 0, 1}}, "rank 1, segment 0: sequence 3 is not one of"},
      {"negative sequence id", {10}, {0, 1, 2}, {{-1, 0, 10}, {0, 0, 10}}, "rank 0, segment 0: sequence -1"},
      {"negative length", {10, -3}, {0, 1, 1}, {{0, 0, 10}}, "sequence 1 has a negative length"},
      {"offsets not from 0", {10}, {1, 1, 1}, {{0, 0, 10}}, "rankSegOffsets[0]"},
      {"offsets decreasing", {10}, {0, 1, 0}, {{0, 0, 10}}, "rankSegOffsets[2]"},
      {"too many tokens", {huge, huge, huge}, {0, 3, 3}, {{0, 0, huge}, {1, 0, huge}, {2, 0, huge}}, "2^48"},
  };
  for (const Case& c : cases) {
    zpLayout_t l = (zpLayout_t)&c;  // must be cleared on failure
    ZP_EXPECT_ERROR(zpInvalidArgument,
                    zpLayoutCreate(&l, (int)c.lens.size(), c.lens.data(), 2, c.offs.data(), c.segs.data()));
    EXPECT_EQ(l, nullptr) << c.what;
    EXPECT_NE(std::string(zpGetLastError(nullptr)).find(c.message), std::string::npos)
        << c.what << ": " << zpGetLastError(nullptr);
  }
  zpLayout_t l = nullptr;
  ZP_EXPECT_ERROR(zpInvalidArgument, zpLayoutCreate(&l, 1, nullptr, 2, nullptr, nullptr));
  ZP_EXPECT_ERROR(zpInvalidArgument, zpLayoutCreate(&l, -1, nullptr, 2, nullptr, nullptr));
  ZP_EXPECT_ERROR(zpInvalidArgument, zpLayoutCreate(nullptr, 0, nullptr, 1, nullptr, nullptr));
  // The same layouts are fine once corrected, and an empty batch is a layout.
  int64_t lens[] = {10};
  size_t offs[] = {0, 1, 2};
  zpSegment_t segs[] = {{0, 0, 4}, {0, 4, 6}};
  ZP_ASSERT_OK(zpLayoutCreate(&l, 1, lens, 2, offs, segs));
  const zpSegment_t* got = nullptr;
  size_t n = 0;
  ZP_ASSERT_OK(zpLayoutRankSegments(l, 1, &got, &n));
  ASSERT_EQ(n, 1u);
  EXPECT_EQ(got[0].seq, 0);
  EXPECT_EQ(got[0].start, 4);
  EXPECT_EQ(got[0].count, 6);
  int64_t tokens = -1;
  ZP_EXPECT_ERROR(zpInvalidArgument, zpLayoutRankTokens(l, 2, &tokens));
  ZP_EXPECT_ERROR(zpInvalidArgument, zpLayoutRankSegments(l, -1, &got, &n));
  ZP_EXPECT_OK(zpLayoutDestroy(l));
  size_t none[] = {0, 0, 0};
  ZP_ASSERT_OK(zpLayoutCreate(&l, 0, nullptr, 2, none, nullptr));
  ZP_EXPECT_OK(zpLayoutRankTokens(l, 1, &tokens));
  EXPECT_EQ(tokens, 0);
  ZP_EXPECT_OK(zpLayoutDestroy(l));
}

TEST(Layout, LayoutsAndPlanLayoutsThroughTheCApi) {
  int64_t lens[] = {10, 5};
  size_t offs[] = {0, 1, 3};
  zpSegment_t segs[] = {{0, 0, 6}, {0, 6, 4}, {1, 0, 5}};
  zpLayout_t l = nullptr;
  ZP_ASSERT_OK(zpLayoutCreate(&l, 2, lens, 2, offs, segs));
  int64_t tokens = 0;
  ZP_EXPECT_OK(zpLayoutRankTokens(l, 1, &tokens));
  EXPECT_EQ(tokens, 9);
  segs[1].start = 7;
  zpLayout_t bad = nullptr;
  ZP_EXPECT_ERROR(zpInvalidArgument, zpLayoutCreate(&bad, 2, lens, 2, offs, segs));
  EXPECT_EQ(bad, nullptr);
  ZP_EXPECT_OK(zpLayoutDestroy(l));

  zpAttnShape_t shape = {32, 8, 128, 2, 1};
  zpClusterModel_t cl = {2, 4, 4, 200, 200, 312, 0.5};
  int64_t batch[] = {100000, 30, 4000, 1, 70000};
  zpBatchPlan_t plan = nullptr;
  ZP_ASSERT_OK(zpPlanBatch(&plan, 5, batch, &shape, &cl, nullptr));
  zpLayout_t att = nullptr;
  ZP_ASSERT_OK(zpPlanGetLayout(plan, zpAttentionLayout, &att));
  int64_t sum = 0;
  for (int r = 0; r < 8; r++) {
    ZP_ASSERT_OK(zpLayoutRankTokens(att, r, &tokens));
    sum += tokens;
  }
  EXPECT_EQ(sum, 100000 + 30 + 4000 + 1 + 70000);
  ZP_EXPECT_ERROR(zpInvalidUsage, zpLayoutDestroy(att));
  ZP_EXPECT_OK(zpPlanDestroy(plan));
}

class RemapRanks : public ::testing::TestWithParam<int> {};

TEST_P(RemapRanks, RandomLayoutsRoundTripEveryByte) {
  const int n = GetParam();
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    for (int it = 0; it < 6; it++) {
      std::mt19937_64 rng(seed + it);  // the same layouts on every rank
      std::vector<int64_t> lens(1 + rng() % 40);
      for (auto& l : lens) l = 1 + rng() % (it % 2 ? 5 : 400);
      Layout from = randomLayout(lens, nranks, rng), to = randomLayout(lens, nranks, rng);
      roundTrip(comm, rank, from, to, seed * 31 + it);
    }
    zpCommDestroy(comm);
    if (::testing::Test::HasFailure()) _exit(1);
  }));
}

TEST_P(RemapRanks, PlannerLayoutsRoundTripEveryByte) {
  const int n = GetParam();
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    for (int it = 0; it < 4; it++) {
      std::mt19937_64 rng(seed + it);
      std::vector<int64_t> lens(1 + rng() % 30);
      for (auto& l : lens) l = 1 + (rng() % 5 == 0 ? rng() % 20000 : rng() % 500);
      zp::plan::ClusterModel c;
      c.nodes = nranks % 2 == 0 && nranks > 2 ? 2 : 1;
      c.ranksPerNode = nranks / c.nodes;
      zp::plan::BatchPlan p = zp::plan::planBatch(lens, it % 2, zp::plan::AttnShape(), c);
      roundTrip(comm, rank, p.linear, p.attention, seed * 17 + it);
    }
    zpCommDestroy(comm);
    if (::testing::Test::HasFailure()) _exit(1);
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, RemapRanks, ::testing::Values(2, 3, 4, 8));

TEST(Remap, BadArgumentsGetClearErrors) {
  zptest::expectAllOk(zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    Layout one;
    one.seqLens = {4};
    one.ranks = {{{0, 0, 4}}};
    Layout two;
    two.seqLens = {4};
    two.ranks = {{{0, 0, 2}}, {{0, 2, 2}}};
    zpLayout_t a = toC(one), b = toC(two);
    zpRemap_t r = nullptr;
    ZP_EXPECT_ERROR(zpInvalidArgument, zpRemapCreate(&r, a, b, comm));  // 1 rank vs 2
    ZP_EXPECT_ERROR(zpInvalidArgument, zpRemapCreate(&r, nullptr, b, comm));
    ASSERT_EQ(zpRemapCreate(&r, b, b, comm), zpSuccess);
    char buf[8];
    ZP_EXPECT_ERROR(zpInvalidArgument, zpRemapExecute(r, buf, buf + 4, 0, zpUint8, 0, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpRemapExecute(r, buf, buf + 4, 1, (zpDataType_t)99, 0, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpRemapExecute(r, buf, buf + 4, 1, zpUint8, 7, comm, nullptr));
    // A stream means device buffers: this communicator has no device.
    ZP_EXPECT_ERROR(zpInvalidArgument, zpRemapExecute(r, buf, buf + 4, 1, zpUint8, 0, comm, (zpStream_t)buf));
    EXPECT_NE(std::string(zpGetLastError(nullptr)).find("no device data plane"), std::string::npos)
        << zpGetLastError(nullptr);
    // Sizes whose byte counts would wrap around: a negative count cast to
    // size_t, and one whose product with the type size is exactly 2^64.
    ZP_EXPECT_ERROR(zpInvalidArgument, zpRemapExecute(r, buf, buf + 4, (size_t)-1, zpFloat32, 0, comm, nullptr));
    EXPECT_NE(std::string(zpGetLastError(nullptr)).find("too large"), std::string::npos) << zpGetLastError(nullptr);
    ZP_EXPECT_ERROR(zpInvalidArgument,
                    zpRemapExecute(r, buf, buf + 4, (size_t)1 << 62, zpFloat32, 0, comm, nullptr));
    // A communicator other than the remap's: this rank's own, of one rank.
    zpUniqueId selfId;
    ASSERT_EQ(zpGetUniqueId(&selfId), zpSuccess);
    zpComm_t self = nullptr;
    ASSERT_EQ(zpCommInitRank(&self, 1, selfId, 0), zpSuccess) << zpGetLastError(nullptr);
    ZP_EXPECT_ERROR(zpInvalidArgument, zpRemapExecute(r, buf, buf + 4, 1, zpUint8, 0, self, nullptr));
    EXPECT_NE(std::string(zpGetLastError(nullptr)).find("zpRemapCreate"), std::string::npos) << zpGetLastError(nullptr);
    zpRemap_t selfRemap = nullptr;
    ASSERT_EQ(zpRemapCreate(&selfRemap, a, a, self), zpSuccess) << zpGetLastError(nullptr);
    ZP_EXPECT_ERROR(zpInvalidArgument, zpRemapExecute(selfRemap, buf, buf + 4, 1, zpUint8, 0, comm, nullptr));
    // In place (or any overlap of in and out) is refused, as the header says
    // (it was accepted and gave whatever the copies' order made of it).
    char both[4] = {0, 0, 0, 0};
    ZP_EXPECT_ERROR(zpInvalidArgument, zpRemapExecute(r, both, both, 1, zpUint8, 0, comm, nullptr));
    EXPECT_NE(std::string(zpGetLastError(nullptr)).find("overlap"), std::string::npos) << zpGetLastError(nullptr);
    ZP_EXPECT_ERROR(zpInvalidArgument, zpRemapExecute(r, both, both + 1, 1, zpUint8, 0, comm, nullptr));
    // The remap still works after all these, on its own communicator: rank 0
    // holds tokens 0-1 and rank 1 tokens 2-3 in both layouts, so they stay.
    char in[2] = {(char)(10 + 2 * rank), (char)(11 + 2 * rank)}, out[2] = {0, 0};
    ZP_EXPECT_OK(zpRemapExecute(r, in, out, 1, zpUint8, 0, comm, nullptr));
    EXPECT_EQ(out[0], in[0]);
    EXPECT_EQ(out[1], in[1]);
    zpRemapDestroy(selfRemap);
    zpCommDestroy(self);
    zpRemapDestroy(r);
    zpLayoutDestroy(a);
    zpLayoutDestroy(b);
    zpCommDestroy(comm);
    if (::testing::Test::HasFailure()) _exit(1);
  }));
}

}  // namespace
