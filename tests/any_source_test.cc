// Receives from any source (ZP_ANY_SOURCE, zpRecvFrom) on one node: the
// scenario of any_source_check.h on 2, 3 and 4 ranks with both
// shared-memory protocols (single copy above the eager size, or through the
// ring), and a communicator of one rank (a wildcard can only take a send to
// itself in the same group; alone it fails at once).
#include <gtest/gtest.h>

#include "tests/any_source_check.h"
#include "tests/harness.h"

namespace {

struct AnySourceParam {
  int nranks;
  const char* proto;
};
void PrintTo(const AnySourceParam& p, std::ostream* os) { *os << p.nranks << " ranks, ZP_SHM_PROTO=" << p.proto; }

class AnySource : public ::testing::TestWithParam<AnySourceParam> {};

TEST_P(AnySource, EveryMessageInEachSendersOrderEveryByteChecked) {
  const uint64_t seed = zptest::testCaseSeed();
  const AnySourceParam p = GetParam();
  auto exits = zptest::runRanks(p.nranks, [&](int rank, int n, const zpUniqueId& id) {
    zptest::setShmProto(p.proto);
    zptest::setTimeoutSeconds(30);  // a wildcard that never matches fails instead of hanging
    zpComm_t comm = zptest::initComm(rank, n, id);
    const std::string err = zptest::anySourceErrors(comm, rank, n, seed);
    EXPECT_EQ(err, "");
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

INSTANTIATE_TEST_SUITE_P(Ranks, AnySource,
                         ::testing::Values(AnySourceParam{2, "auto"}, AnySourceParam{3, "auto"},
                                           AnySourceParam{4, "auto"}, AnySourceParam{3, "copy"}),
                         [](const ::testing::TestParamInfo<AnySourceParam>& i) {
                           return std::to_string(i.param.nranks) + "ranks_" + i.param.proto;
                         });

TEST(AnySourceOneRank, AWildcardTakesASendToSelfInItsGroupAndFailsAloneAtOnce) {
  auto exits = zptest::runRanks(1, [&](int rank, int n, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, n, id);
    zptest::GuardedBuffer out(1000, 1), in(1000, 3);
    out.fill(7, 0, 0);
    int src = -7;
    ZP_EXPECT_OK(zpGroupStart());
    ZP_EXPECT_OK(zpRecvFrom(in.data(), 1000, zpUint8, ZP_ANY_SOURCE, &src, comm, nullptr));
    ZP_EXPECT_OK(zpSend(out.data(), 1000, zpUint8, 0, comm, nullptr));
    ZP_EXPECT_OK(zpGroupEnd());
    EXPECT_EQ(src, 0);
    EXPECT_EQ(in.wrongBytes(7, 0, 0), 0u);
    EXPECT_EQ(in.guardBytesWritten(), 0u);
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(zpRecv(in.data(), 1000, zpUint8, ZP_ANY_SOURCE, comm, nullptr), zpInvalidUsage);
    EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
    EXPECT_NE(std::string(zpGetLastError(comm)).find("no message can ever match it"), std::string::npos)
        << zpGetLastError(comm);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

}  // namespace
