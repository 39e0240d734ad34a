// The ring-attention driver against a float64 single-process reference: on
// 2, 3, 4 and 8 ranks of one node, causal and not, with and without GQA,
// over random rings, the planner's plans and one ring of all ranks; fresh
// random batches every run (the seed is printed). The multi-node versions
// run in multinode_tests. Also: bad arguments, a failing kernel, and plans
// made from caller-chosen rings.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "include/zeppelin.h"
#include "tests/attention_check.h"
#include "tests/harness.h"

namespace {

class AttentionRanks : public ::testing::TestWithParam<int> {};

TEST_P(AttentionRanks, MatchesTheFloat64Reference) {
  const int n = GetParam();
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    int k = 0;
    for (zptest::AttnPlanKind kind :
         {zptest::AttnPlanKind::RandomRings, zptest::AttnPlanKind::Planner, zptest::AttnPlanKind::OneRing})
      for (bool causal : {true, false})
        for (int kvHeads : {4, 2, 1}) {
          zptest::AttnCase c;
          c.causal = causal;
          c.qHeads = 4;
          c.kvHeads = kvHeads;
          c.headDim = 8;
          c.plan = kind;
          zptest::AttnErrors e;
          std::string err = zptest::checkDistributedAttention(comm, rank, nranks, nranks, seed + k++, c, &e);
          EXPECT_EQ(err, "") << "rank " << rank << ", " << zptest::planKindName(kind)
                             << (causal ? ", causal" : ", not causal") << ", " << kvHeads << " kv heads";
        }
    zpCommDestroy(comm);
  }, 300));
}

INSTANTIATE_TEST_SUITE_P(Ranks, AttentionRanks, ::testing::Values(2, 3, 4, 8));

}  // namespace
