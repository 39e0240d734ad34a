// zpCommSplit across real processes: random colors and keys (with
// ZP_SPLIT_NOCOLOR and single-rank children), many children alive at once
// with collectives on parent and children interleaved, children outliving
// their parent, errors, abort.
#include <algorithm>
#include <random>

#include "tests/harness.h"

namespace {

// What a rank expects of its child: the members (parent ranks) in new-rank order.
std::vector<int> expectedMembers(const std::vector<int>& colors, const std::vector<int>& keys, int color) {
  std::vector<int> m;
  for (int r = 0; r < (int)colors.size(); r++)
    if (colors[r] == color) m.push_back(r);
  std::stable_sort(m.begin(), m.end(), [&](int a, int b) { return keys[a] < keys[b]; });
  return m;
}

// Checks that comm is the communicator of `members`, this rank being parent rank `me`:
// its size and rank, and an all-gather and an all-reduce over it.
void checkChild(zpComm_t child, const std::vector<int>& members, int me, const char* what) {
  int count = -1, rank = -1;
  ZP_ASSERT_OK(zpCommCount(child, &count));
  ZP_ASSERT_OK(zpCommUserRank(child, &rank));
  ASSERT_EQ(count, (int)members.size()) << what;
  ASSERT_EQ(rank, (int)(std::find(members.begin(), members.end(), me) - members.begin())) << what;
  std::vector<int64_t> got(members.size(), -1);
  int64_t mine = me;
  ZP_ASSERT_OK(zpAllGather(&mine, got.data(), 1, zpInt64, child, nullptr));
  for (size_t i = 0; i < members.size(); i++) EXPECT_EQ(got[i], members[i]) << what << ", new rank " << i;
  std::vector<int64_t> sum(1000, -1), in(1000, me);
  ZP_ASSERT_OK(zpAllReduce(in.data(), sum.data(), in.size(), zpInt64, zpSum, child, nullptr));
  int64_t want = 0;
  for (int m : members) want += m;
  EXPECT_EQ(sum[999], want) << what;
}

class SplitRandom : public ::testing::TestWithParam<int> {};

TEST_P(SplitRandom, RandomColorsAndKeysMakeTheRightCommunicators) {
  const int nranks = GetParam();
  uint64_t seed = zptest::testCaseSeed();
  auto exits = zptest::runRanks(nranks, [&](int rank, int n, const zpUniqueId& id) {
    zpComm_t world = zptest::initComm(rank, n, id);
    std::vector<zpComm_t> alive;
    for (int round = 0; round < 6; round++) {
      // Every rank draws the same table: colors in {NOCOLOR, 0, 1, 2}, keys
      // with ties; in odd rounds one rank gets a color of its own.
      std::mt19937_64 g(seed + round);
      std::vector<int> colors(n), keys(n);
      for (int r = 0; r < n; r++) {
        colors[r] = (int)(g() % 4) - 1;
        keys[r] = (int)(g() % 3) - 1;
      }
      if (round % 2) colors[g() % n] = 7;
      zpComm_t child = (zpComm_t)0x1;
      ZP_ASSERT_OK(zpCommSplit(world, colors[rank], keys[rank], &child, nullptr));
      if (colors[rank] == ZP_SPLIT_NOCOLOR) {
        EXPECT_EQ(child, nullptr);
      } else {
        ASSERT_NE(child, nullptr);
        checkChild(child, expectedMembers(colors, keys, colors[rank]), rank, "child");
        alive.push_back(child);
      }
      // The parent still works between splits.
      ZP_ASSERT_OK(zpBarrier(world, nullptr));
    }
    // Children of every round are still alive and usable; then destroyed.
    for (zpComm_t c : alive) ZP_EXPECT_OK(zpBarrier(c, nullptr));
    for (zpComm_t c : alive) ZP_EXPECT_OK(zpCommDestroy(c));
    ZP_EXPECT_OK(zpCommDestroy(world));
  });
  zptest::expectAllOk(exits);
}
INSTANTIATE_TEST_SUITE_P(Ranks, SplitRandom, ::testing::Values(2, 5, 8),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param) + "ranks"; });

// A data x context parallel grid (the trainer's): rows and columns of a
// 2 x (n/2) grid, a split of a split, a copy of the world; collectives and
// send/recv on all of them interleaved; the world destroyed first.
TEST(Split, GridChildrenInterleavedAndOutliveTheParent) {
  auto exits = zptest::runRanks(8, [&](int rank, int n, const zpUniqueId& id) {
    zpComm_t world = zptest::initComm(rank, n, id);
    const int cp = 4;  // context-parallel group size; dp = n / cp
    zpComm_t cpComm, dpComm, dup, half;
    ZP_ASSERT_OK(zpCommSplit(world, rank / cp, rank % cp, &cpComm, nullptr));
    ZP_ASSERT_OK(zpCommSplit(world, rank % cp, rank / cp, &dpComm, nullptr));
    ZP_ASSERT_OK(zpCommSplit(world, 0, -rank, &dup, nullptr));  // reversed order
    int cpRank = -1;
    ZP_ASSERT_OK(zpCommUserRank(cpComm, &cpRank));
    ZP_ASSERT_OK(zpCommSplit(cpComm, cpRank % 2, 0, &half, nullptr));  // nested
    std::vector<int> cpMembers, dpMembers, dupMembers, halfMembers;
    for (int r = 0; r < n; r++) {
      if (r / cp == rank / cp) cpMembers.push_back(r);
      if (r % cp == rank % cp) dpMembers.push_back(r);
      dupMembers.insert(dupMembers.begin(), r);
      if (r / cp == rank / cp && (r % cp) % 2 == cpRank % 2) halfMembers.push_back(r);
    }
    for (int it = 0; it < 5; it++) {
      checkChild(cpComm, cpMembers, rank, "cp");
      checkChild(world, {0, 1, 2, 3, 4, 5, 6, 7}, rank, "world");
      checkChild(dpComm, dpMembers, rank, "dp");
      // A ring of send/recv on the copy of the world, in its reversed order.
      int dn = 0, dr = 0;
      ZP_ASSERT_OK(zpCommCount(dup, &dn));
      ZP_ASSERT_OK(zpCommUserRank(dup, &dr));
      int out = rank * 100 + it, in = -1;
      ZP_ASSERT_OK(zpGroupStart());
      ZP_EXPECT_OK(zpSend(&out, 1, zpInt32, (dr + 1) % dn, dup, nullptr));
      ZP_EXPECT_OK(zpRecv(&in, 1, zpInt32, (dr + dn - 1) % dn, dup, nullptr));
      ZP_ASSERT_OK(zpGroupEnd());
      EXPECT_EQ(in, dupMembers[(dr + dn - 1) % dn] * 100 + it);
      checkChild(half, halfMembers, rank, "half");
      checkChild(dup, dupMembers, rank, "dup");
    }
    // The parent goes first; its children live on.
    ZP_ASSERT_OK(zpBarrier(world, nullptr));
    ZP_EXPECT_OK(zpCommDestroy(world));
    checkChild(cpComm, cpMembers, rank, "cp after the world's destroy");
    checkChild(dpComm, dpMembers, rank, "dp after the world's destroy");
    for (zpComm_t c : {half, cpComm, dpComm, dup}) {
      ZP_EXPECT_OK(zpBarrier(c, nullptr));
      ZP_EXPECT_OK(zpCommDestroy(c));
    }
  });
  zptest::expectAllOk(exits);
}

TEST(Split, BadArgumentsFailEveryRank) {
  auto exits = zptest::runRanks(4, [&](int rank, int n, const zpUniqueId& id) {
    zpComm_t world = zptest::initComm(rank, n, id);
    zpComm_t child = nullptr;
    // A negative color other than ZP_SPLIT_NOCOLOR, on rank 2 only.
    zp::clearLastError();
    zpResult_t r = zpCommSplit(world, rank == 2 ? -5 : 0, 0, &child, nullptr);
    EXPECT_EQ(r, rank == 2 ? zpInvalidArgument : zpInvalidUsage) << zpGetLastError(world);
    EXPECT_NE(std::string(zpGetLastError(world)).find(rank == 2 ? "color -5" : "rank 2"), std::string::npos)
        << zpGetLastError(world);
    EXPECT_EQ(child, nullptr);
    // newcomm NULL on rank 0.
    r = zpCommSplit(world, 0, 0, rank == 0 ? nullptr : &child, nullptr);
    EXPECT_EQ(r, rank == 0 ? zpInvalidArgument : zpInvalidUsage) << zpGetLastError(world);
    // A bad config on rank 3.
    zpConfig_t cfg = ZP_CONFIG_INITIALIZER;
    cfg.magic = 1;
    r = zpCommSplit(world, 0, 0, &child, rank == 3 ? &cfg : nullptr);
    EXPECT_EQ(r, rank == 3 ? zpInvalidArgument : zpInvalidUsage) << zpGetLastError(world);
    // Rank 1 splits while the others all-reduce: every rank is told.
    int64_t x = 1, y = 0;
    r = rank == 1 ? zpCommSplit(world, 0, 0, &child, nullptr) : zpAllReduce(&x, &y, 1, zpInt64, zpSum, world, nullptr);
    EXPECT_EQ(r, zpInvalidUsage) << zpGetLastError(world);
    EXPECT_NE(std::string(zpGetLastError(world)).find("rank 1"), std::string::npos) << zpGetLastError(world);
    // Rank 1 splits while the others all-gather three int32, the shape of the
    // split's own exchange: it must not pass for one (issue 28).
    int32_t three[3] = {7, 8, 9};
    std::vector<int32_t> gathered(3 * (size_t)n);
    r = rank == 1 ? zpCommSplit(world, 0, 0, &child, nullptr)
                  : zpAllGather(three, gathered.data(), 3, zpInt32, world, nullptr);
    EXPECT_EQ(r, zpInvalidUsage) << zpGetLastError(world);
    EXPECT_NE(std::string(zpGetLastError(world)).find("zpCommSplit"), std::string::npos) << zpGetLastError(world);
    EXPECT_EQ(child, nullptr);
    // Inside a group: refused at once, on the caller only.
    ZP_ASSERT_OK(zpGroupStart());
    ZP_EXPECT_ERROR(zpInvalidUsage, zpCommSplit(world, 0, 0, &child, nullptr));
    ZP_ASSERT_OK(zpGroupEnd());
    ZP_EXPECT_ERROR(zpInvalidArgument, zpCommSplit(nullptr, 0, 0, &child, nullptr));
    // The world still works, and so does a good split.
    ZP_ASSERT_OK(zpCommSplit(world, rank % 2, 0, &child, nullptr));
    ZP_EXPECT_OK(zpBarrier(child, nullptr));
    ZP_EXPECT_OK(zpCommDestroy(child));
    ZP_EXPECT_OK(zpCommDestroy(world));
  });
  zptest::expectAllOk(exits);
}

// Aborting a child fails its other members' calls on it (zpRemoteError),
// and leaves the parent and the sibling untouched.
TEST(Split, AbortingAChildLeavesTheParentAndSiblings) {
  auto exits = zptest::runRanks(4, [&](int rank, int n, const zpUniqueId& id) {
    zptest::setTimeoutSeconds(30);
    zpComm_t world = zptest::initComm(rank, n, id);
    zpComm_t child, sibling;
    ZP_ASSERT_OK(zpCommSplit(world, rank < 2 ? 0 : 1, 0, &child, nullptr));
    ZP_ASSERT_OK(zpCommSplit(world, 0, 0, &sibling, nullptr));
    if (rank == 1) {
      ZP_EXPECT_OK(zpCommAbort(child));
    } else if (rank == 0) {
      auto start = std::chrono::steady_clock::now();
      std::vector<float> a(1 << 20, 1), b(1 << 20);
      zpResult_t r = zpAllReduce(a.data(), b.data(), a.size(), zpFloat32, zpSum, child, nullptr);
      EXPECT_EQ(r, zpRemoteError) << zpGetLastError(child);
      EXPECT_LT(zptest::secondsSince(start), 20.0);
      ZP_EXPECT_OK(zpCommDestroy(child));
    } else {
      ZP_EXPECT_OK(zpBarrier(child, nullptr));
      ZP_EXPECT_OK(zpCommDestroy(child));
    }
    int64_t x = rank, y = -1;
    ZP_EXPECT_OK(zpAllReduce(&x, &y, 1, zpInt64, zpSum, world, nullptr));
    EXPECT_EQ(y, 6);
    ZP_EXPECT_OK(zpAllReduce(&x, &y, 1, zpInt64, zpMax, sibling, nullptr));
    EXPECT_EQ(y, 3);
    ZP_EXPECT_OK(zpCommDestroy(sibling));
    ZP_EXPECT_OK(zpCommDestroy(world));
  });
  zptest::expectAllOk(exits);
}

}  // namespace
