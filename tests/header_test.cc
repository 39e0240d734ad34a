// The public header compiles as C++ on its own (it is included first, before
// anything that could hide a missing include), and its definitions are what
// the API promises: NCCL's values, a 128-byte id, a usable config initializer,
// C linkage. Also runs the C99 program tests/c_api_check.c.
#include "zeppelin.h"

#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>
#include <type_traits>

namespace {

static_assert(sizeof(zpUniqueId) == 128 && ZP_UNIQUE_ID_BYTES == 128, "zpUniqueId is 128 bytes, as ncclUniqueId");
static_assert(std::is_trivially_copyable<zpUniqueId>::value, "an id travels as plain bytes");
static_assert(std::is_pointer<zpComm_t>::value && std::is_pointer<zpStream_t>::value, "handles are pointers");

TEST(Header, ResultCodesHaveNcclValues) {
  EXPECT_EQ(zpSuccess, 0);
  EXPECT_EQ(zpUnhandledCudaError, 1);
  EXPECT_EQ(zpSystemError, 2);
  EXPECT_EQ(zpInternalError, 3);
  EXPECT_EQ(zpInvalidArgument, 4);
  EXPECT_EQ(zpInvalidUsage, 5);
  EXPECT_EQ(zpRemoteError, 6);
  EXPECT_EQ(zpInProgress, 7);
  EXPECT_EQ(zpNumResults, 8);
}

TEST(Header, DatatypesHaveNcclValues) {
  EXPECT_EQ(zpInt8, 0);
  EXPECT_EQ(zpChar, 0);
  EXPECT_EQ(zpUint8, 1);
  EXPECT_EQ(zpInt32, 2);
  EXPECT_EQ(zpInt, 2);
  EXPECT_EQ(zpUint32, 3);
  EXPECT_EQ(zpInt64, 4);
  EXPECT_EQ(zpUint64, 5);
  EXPECT_EQ(zpFloat16, 6);
  EXPECT_EQ(zpHalf, 6);
  EXPECT_EQ(zpFloat32, 7);
  EXPECT_EQ(zpFloat, 7);
  EXPECT_EQ(zpFloat64, 8);
  EXPECT_EQ(zpDouble, 8);
  EXPECT_EQ(zpBfloat16, 9);
  EXPECT_EQ(zpNumTypes, 10);
}

TEST(Header, ConfigInitializerFillsSizeMagicVersionAndLeavesTheRestUndefined) {
  zpConfig_t cfg = ZP_CONFIG_INITIALIZER;
  EXPECT_EQ(cfg.size, sizeof(zpConfig_t));
  EXPECT_EQ(cfg.magic, ZP_CONFIG_MAGIC);
  EXPECT_EQ(cfg.version, (unsigned)ZP_VERSION_CODE);
  EXPECT_EQ(cfg.timeoutMs, ZP_CONFIG_UNDEF_INT);
  EXPECT_EQ(cfg.routing, ZP_CONFIG_UNDEF_INT);
  EXPECT_EQ(cfg.nodeId, nullptr);
  EXPECT_EQ(cfg.netDevices, nullptr);
  EXPECT_EQ(ZP_VERSION_CODE, ZP_VERSION(ZP_MAJOR, ZP_MINOR, ZP_PATCH));
}

TEST(Header, FunctionsHaveCLinkageSignatures) {
  // Plain function pointers of the declared C types (a C++ overload or a
  // missing declaration would not compile).
  zpResult_t (*version)(int*) = zpGetVersion;
  zpResult_t (*init)(zpComm_t*, int, zpUniqueId, int) = zpCommInitRank;
  zpResult_t (*a2a)(const void*, const size_t*, const size_t*, void*, const size_t*, const size_t*, zpDataType_t,
                    zpComm_t, zpStream_t) = zpAlltoallv;
  size_t (*typeSize)(zpDataType_t) = zpTypeSize;
  EXPECT_NE(version, nullptr);
  EXPECT_NE(init, nullptr);
  EXPECT_NE(a2a, nullptr);
  EXPECT_EQ(typeSize(zpFloat16), 2u);
}

#ifdef ZP_C_API_CHECK_PATH
TEST(Header, C99ProgramRunsASingleRankCommunicator) {
  std::string cmd = std::string("\"") + ZP_C_API_CHECK_PATH + "\"";
  int st = system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(st)) << cmd;
  EXPECT_EQ(WEXITSTATUS(st), 0) << cmd;
}
#endif

}  // namespace
