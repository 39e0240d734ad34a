// The ring-attention driver against a float64 single-process reference: on
// 2, 3, 4 and 8 ranks of one node, causal and not, with and without GQA,
// over random rings, the planner's plans and one ring of all ranks, with the
// driver merging blocks or the kernel folding them in itself; fresh
// random batches every run (the seed is printed). The multi-node versions
// run in multinode_tests. Every run also checks the driver's run log: its
// rings and local sequences in the plan's order forward, reversed backward;
// on 4 and 8 ranks also under a plan whose order was shuffled
// (zpPlanSetRingOrder). Also: bad arguments, a failing kernel, plans made
// from caller-chosen rings, and a plan's order through the C API.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include <random>
#include <string>

#include "collectives/ext/ext.h"
#include "include/zeppelin.h"
#include "tests/attention_check.h"
#include "tests/harness.h"

namespace {

// The run log of both passes against the plan's order (attention_check.h).
std::string runLogError(zpAttention_t attn, zpBatchPlan_t plan, int rank) {
  const zpx::AttentionRunLog* log = zpx::attentionRunLog(attn);
  if (!log) return "no run log";
  std::string f = zptest::runOrderError(plan, rank, log->forward, false),
              b = zptest::runOrderError(plan, rank, log->backward, true);
  return f + (f.empty() || b.empty() ? "" : "; ") + b;
}

class AttentionRanks : public ::testing::TestWithParam<int> {};

TEST_P(AttentionRanks, MatchesTheFloat64Reference) {
  const int n = GetParam();
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    int k = 0;
    double largest = 0;  // reported, so the margin under the bound can be seen
    for (zptest::AttnPlanKind kind :
         {zptest::AttnPlanKind::RandomRings, zptest::AttnPlanKind::Planner, zptest::AttnPlanKind::OneRing,
          zptest::AttnPlanKind::CommPlanner})
      for (bool causal : {true, false})
        for (int kvHeads : {4, 2, 1}) {
          zptest::AttnCase c;
          c.causal = causal;
          c.qHeads = 4;
          c.kvHeads = kvHeads;
          c.headDim = 8;
          c.plan = kind;
          c.accumulate = k % 2;
          c.checkRun = [&](zpAttention_t a, zpBatchPlan_t p) { return runLogError(a, p, rank); };
          zptest::AttnErrors e;
          std::string err = zptest::checkDistributedAttention(comm, rank, nranks, nranks, seed + k++, c, &e);
          largest = std::max(largest, e.max());
          EXPECT_EQ(err, "") << "rank " << rank << ", " << zptest::planKindName(kind)
                             << (causal ? ", causal" : ", not causal") << ", " << kvHeads << " kv heads"
                             << (c.accumulate ? ", kernel accumulates" : "");
        }
    printf("rank %d of %d: largest relative error %.2e (bound 1e-5)\n", rank, nranks, largest);
    zpCommDestroy(comm);
  }, 300));
}

INSTANTIATE_TEST_SUITE_P(Ranks, AttentionRanks, ::testing::Values(2, 3, 4, 8));

// A plan whose order interleaves rings and local sequences and is not the
// default (shuffledOrderPlan: an intra-node ring before an inter-node one, a
// ring named by its second sequence id, locals out of id order): the results
// match the reference and every rank's run log follows the order forward and
// reversed backward. Several shuffles, causal and not, the kernel folding
// blocks in itself or not.
class AttentionOrder : public ::testing::TestWithParam<int> {};

TEST_P(AttentionOrder, RunsThePlansOrderForwardAndReversedBackward) {
  const int n = GetParam();
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    for (int k = 0; k < 6; k++) {
      zptest::AttnCase c;
      c.causal = k % 2 == 0;
      c.qHeads = 4;
      c.kvHeads = k < 3 ? 2 : 4;
      c.headDim = 8;
      c.plan = zptest::AttnPlanKind::ShuffledOrder;
      c.accumulate = k / 2 % 2;
      c.checkRun = [&](zpAttention_t a, zpBatchPlan_t p) { return runLogError(a, p, rank); };
      zptest::AttnErrors e;
      EXPECT_EQ(zptest::checkDistributedAttention(comm, rank, nranks, nranks, seed + k, c, &e), "")
          << "rank " << rank << ", shuffle " << k << (c.causal ? ", causal" : ", not causal");
    }
    zpCommDestroy(comm);
  }, 300));
}

INSTANTIATE_TEST_SUITE_P(Ranks, AttentionOrder, ::testing::Values(4, 8));

// zpPlanRingOrder and zpPlanSetRingOrder: the default order of zpPlanCreate
// (inter-node rings, intra-node rings, locals, each by id), a new order
// read back, and bad orders refused by name with the plan unchanged.
TEST(PlanOrder, GetAndSetThroughTheCApi) {
  // 4 ranks, 2 per node: 0 intra [0, 1], 1 local, 2 inter [1, 2], 3 local, 4 inter [3, 0].
  int64_t lens[] = {10, 3, 7, 5, 9};
  size_t offs[] = {0, 2, 3, 5, 6, 8};
  int ranks[] = {0, 1, 2, 1, 2, 3, 3, 0};
  zpBatchPlan_t plan = nullptr;
  ZP_ASSERT_OK(zpPlanCreate(&plan, 5, lens, 1, 4, 2, offs, ranks));
  const int64_t* order = nullptr;
  int n = 0;
  ZP_ASSERT_OK(zpPlanRingOrder(plan, &order, &n));
  EXPECT_EQ(std::vector<int64_t>(order, order + n), (std::vector<int64_t>{2, 4, 0, 1, 3}));
  const int64_t mine[] = {3, 0, 4, 1, 2};
  ZP_EXPECT_OK(zpPlanSetRingOrder(plan, 5, mine));
  ZP_ASSERT_OK(zpPlanRingOrder(plan, &order, &n));
  EXPECT_EQ(std::vector<int64_t>(order, order + n), std::vector<int64_t>(mine, mine + 5));
  // Refused, the plan unchanged.
  auto refused = [&](int count, const int64_t* seqs, const char* words) {
    ZP_EXPECT_ERROR(zpInvalidArgument, zpPlanSetRingOrder(plan, count, seqs));
    const std::string msg = zpGetLastError(nullptr);
    EXPECT_NE(msg.find("zpPlanSetRingOrder"), std::string::npos) << msg;
    EXPECT_NE(msg.find(words), std::string::npos) << msg;
    ZP_EXPECT_OK(zpPlanRingOrder(plan, &order, &n));
    EXPECT_EQ(std::vector<int64_t>(order, order + n), std::vector<int64_t>(mine, mine + 5));
  };
  const int64_t shorter[] = {0, 1, 2, 3}, longer[] = {0, 1, 2, 3, 4, 0}, twice[] = {0, 1, 2, 2, 4},
                outside[] = {0, 1, 5, 3, 4}, negative[] = {0, 1, 2, -1, 4};
  refused(4, shorter, "names 4 sequences, the plan has 5");
  refused(6, longer, "names 6 sequences, the plan has 5");
  refused(5, twice, "sequence 2 is named twice");
  refused(5, outside, "order[2] = 5 is not a sequence");
  refused(5, negative, "order[3] = -1 is not a sequence");
  refused(-1, mine, "negative");
  refused(0, mine, "names 0 sequences");
  refused(5, nullptr, "seqs is NULL");
  ZP_EXPECT_ERROR(zpInvalidArgument, zpPlanSetRingOrder(nullptr, 5, mine));
  EXPECT_NE(std::string(zpGetLastError(nullptr)).find("zpPlanSetRingOrder: plan is NULL"), std::string::npos);
  ZP_EXPECT_ERROR(zpInvalidArgument, zpPlanRingOrder(nullptr, &order, &n));
  EXPECT_NE(std::string(zpGetLastError(nullptr)).find("zpPlanRingOrder"), std::string::npos);
  ZP_EXPECT_ERROR(zpInvalidArgument, zpPlanRingOrder(plan, nullptr, &n));
  ZP_EXPECT_ERROR(zpInvalidArgument, zpPlanRingOrder(plan, &order, nullptr));
  ZP_EXPECT_OK(zpPlanDestroy(plan));
}

}  // namespace

namespace {

// A kernel that fails on its third call on rank 0.
struct FailingKernel {
  int rank = 0, calls = 0;
};
zpResult_t failingForward(const zpAttnBlock_t* b, void* user) {
  auto* f = (FailingKernel*)user;
  if (f->rank == 0 && ++f->calls == 3) return zpInvalidUsage;
  return zpAttnRefForward(b, nullptr);
}

TEST(Attention, BadArgumentsAndPlansGetClearErrors) {
  zptest::expectAllOk(zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    int64_t lens[] = {10, 3};
    size_t offs[] = {0, 2, 3};
    int ranks[] = {0, 1, 1};
    zpBatchPlan_t plan = nullptr;
    ZP_ASSERT_OK(zpPlanCreate(&plan, 2, lens, 1, 2, 0, offs, ranks));
    int cls = -1, g = 0;
    const int* rr = nullptr;
    ZP_EXPECT_OK(zpPlanSequence(plan, 0, &cls, &g, &rr));
    EXPECT_EQ(cls, 1);
    EXPECT_EQ(g, 2);
    ZP_EXPECT_OK(zpPlanSequence(plan, 1, &cls, &g, &rr));
    EXPECT_EQ(cls, 0);
    // Bad plans: a rank twice, out of range, a zero length, broken offsets.
    zpBatchPlan_t bad = nullptr;
    int twice[] = {1, 1, 0};
    ZP_EXPECT_ERROR(zpInvalidArgument, zpPlanCreate(&bad, 2, lens, 1, 2, 0, offs, twice));
    EXPECT_NE(std::string(zpGetLastError(nullptr)).find("twice"), std::string::npos) << zpGetLastError(nullptr);
    int outside[] = {0, 2, 1};
    ZP_EXPECT_ERROR(zpInvalidArgument, zpPlanCreate(&bad, 2, lens, 1, 2, 0, offs, outside));
    int64_t zero[] = {10, 0};
    ZP_EXPECT_ERROR(zpInvalidArgument, zpPlanCreate(&bad, 2, zero, 1, 2, 0, offs, ranks));
    size_t backwards[] = {0, 2, 1};
    ZP_EXPECT_ERROR(zpInvalidArgument, zpPlanCreate(&bad, 2, lens, 1, 2, 0, backwards, ranks));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpPlanCreate(&bad, 2, lens, 1, 2, 0, nullptr, ranks));
    EXPECT_EQ(bad, nullptr);
    // A plan for 3 ranks on a 2-rank communicator; bad heads, no kernel.
    zpBatchPlan_t three = nullptr;
    int ranks3[] = {0, 2, 1};
    ZP_ASSERT_OK(zpPlanCreate(&three, 2, lens, 0, 3, 0, offs, ranks3));
    zpAttnConfig_t cfg = {4, 2, 8, 0.0f, zpAttnRefForward, zpAttnRefBackward, nullptr, 0, zpFloat32};
    zpAttention_t attn = nullptr;
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAttentionCreate(&attn, three, &cfg, comm));
    EXPECT_NE(std::string(zpGetLastError(nullptr)).find("3 ranks"), std::string::npos) << zpGetLastError(nullptr);
    zpAttnConfig_t c2 = cfg;
    c2.kvHeads = 3;
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAttentionCreate(&attn, plan, &c2, comm));
    c2 = cfg;
    c2.forward = nullptr;
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAttentionCreate(&attn, plan, &c2, comm));
    c2 = cfg;
    c2.scale = -1;
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAttentionCreate(&attn, plan, &c2, comm));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAttentionCreate(&attn, plan, nullptr, comm));
    EXPECT_EQ(attn, nullptr);
    // NULL buffers on a rank with tokens; backward without a backward kernel.
    c2 = cfg;
    c2.backward = nullptr;
    ZP_ASSERT_OK(zpAttentionCreate(&attn, plan, &c2, comm));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAttentionForward(attn, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr));
    ZP_EXPECT_ERROR(zpInvalidUsage, zpAttentionBackward(attn, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                                        nullptr, nullptr, nullptr, nullptr));
    ZP_EXPECT_OK(zpAttentionDestroy(attn));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAttentionDestroy(nullptr));
    zpPlanDestroy(three);
    zpPlanDestroy(plan);
    zpCommDestroy(comm);
  }));
}

// A failing kernel: its rank gets the kernel's error and aborts the
// communicator; rank 1, which waits for rank 0's next block, gets an error at
// once rather than after the timeout. (Rank 2 may finish: it has every block
// it needs once its last send is out.)
TEST(Attention, AFailingKernelIsAnErrorNotAHang) {
  zptest::expectAllOk(zptest::runRanks(3, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    int64_t lens[] = {600, 40};
    size_t offs[] = {0, 3, 4};
    int ranks[] = {0, 1, 2, 0};
    zpBatchPlan_t plan = nullptr;
    ZP_ASSERT_OK(zpPlanCreate(&plan, 2, lens, 1, 3, 0, offs, ranks));
    FailingKernel fk;
    fk.rank = rank;
    zpAttnConfig_t cfg = {2, 2, 8, 0.0f, failingForward, zpAttnRefBackward, &fk, 0, zpFloat32};
    zpAttention_t attn = nullptr;
    ZP_ASSERT_OK(zpAttentionCreate(&attn, plan, &cfg, comm));
    zpLayout_t layout = nullptr;
    ZP_ASSERT_OK(zpPlanGetLayout(plan, zpAttentionLayout, &layout));
    int64_t T = 0;
    ZP_ASSERT_OK(zpLayoutRankTokens(layout, rank, &T));
    std::vector<float> q(T * 16, 0.5f), out(T * 16), lse(T * 2);
    auto start = std::chrono::steady_clock::now();
    zpResult_t r = zpAttentionForward(attn, q.data(), q.data(), q.data(), out.data(), lse.data(), nullptr);
    if (rank == 0) {
      EXPECT_EQ(r, zpInvalidUsage);
      EXPECT_NE(std::string(zpGetLastError(nullptr)).find("forward block kernel failed"), std::string::npos)
          << zpGetLastError(nullptr);
      zpAttentionDestroy(attn);
      zpCommAbort(comm);
    } else {
      if (rank == 1) EXPECT_NE(r, zpSuccess);
      EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30));
      zpAttentionDestroy(attn);
      zpCommDestroy(comm);
    }
    zpPlanDestroy(plan);
  }));
}

}  // namespace

namespace {

zpResult_t dyingForward(const zpAttnBlock_t* b, void* user) {
  if (*(int*)user == 2) kill(getpid(), SIGKILL);  // rank 2 dies in its first kernel call
  return zpAttnRefForward(b, nullptr);
}

// A rank dies in the middle of a ring: every other rank gets an error (none
// hangs). Each aborts on its error, as a trainer would, so that the ranks
// still waiting on it fail at once too.
TEST(Attention, ARankThatDiesIsAnErrorOnEveryOtherRank) {
  std::vector<zptest::RankExit> exits = zptest::runRanks(4, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    int64_t lens[] = {2000};
    size_t offs[] = {0, 4};
    int ranks[] = {0, 1, 2, 3};
    zpBatchPlan_t plan = nullptr;
    ZP_ASSERT_OK(zpPlanCreate(&plan, 1, lens, 1, 4, 0, offs, ranks));
    int me = rank;
    zpAttnConfig_t cfg = {2, 2, 8, 0.0f, dyingForward, zpAttnRefBackward, &me, 0, zpFloat32};
    zpAttention_t attn = nullptr;
    ZP_ASSERT_OK(zpAttentionCreate(&attn, plan, &cfg, comm));
    std::vector<float> x(500 * 16, 0.25f), out(500 * 16), lse(500 * 2);
    auto start = std::chrono::steady_clock::now();
    zpResult_t r = zpAttentionForward(attn, x.data(), x.data(), x.data(), out.data(), lse.data(), nullptr);
    EXPECT_NE(r, zpSuccess) << "rank " << rank << " finished although rank 2 died";
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
    zpAttentionDestroy(attn);
    zpCommAbort(comm);
    zpPlanDestroy(plan);
  });
  for (int r = 0; r < 4; r++) {
    if (r == 2)
      EXPECT_TRUE(!exits[r].exited && exits[r].code == SIGKILL);
    else
      EXPECT_TRUE(exits[r].ok()) << "rank " << r << " ended with " << exits[r].code;
  }
}

}  // namespace
