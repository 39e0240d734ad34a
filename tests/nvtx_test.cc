// NVTX ranges (src/util/nvtx.h): a profiler that reads NVTX sees each C API
// call of every rank as a range of the domain "Zeppelin", closed when the
// call returns. Checked through an NVTX injection library
// (tests/nvtx_spy.cc), attached the way a profiler attaches.
#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "tests/harness.h"

namespace {

TEST(Nvtx, EveryCallIsARangeOfItsOwnOnEveryRank) {
#ifndef ZP_TEST_NVTX_SPY
  GTEST_SKIP() << "this build has no NVTX ranges (no CUDA toolkit with nvtx3 headers)";
#else
  char dir[] = "/tmp/zp-nvtx-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  // Read by each rank at its first NVTX call (the ranks are forked after
  // this; the test process itself makes none).
  setenv("NVTX_INJECTION64_PATH", ZP_TEST_NVTX_SPY, 1);
  setenv("NVTX_SPY_DIR", dir, 1);
  const int n = 2;
  auto exits = zptest::runRanks(n, [](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nranks, id);
    float x[4] = {1, 2, 3, 4}, y[4];
    ZP_EXPECT_OK(zpAllReduce(x, y, 4, zpFloat32, zpSum, comm, nullptr));
    ZP_EXPECT_OK(zpGroupStart());
    ZP_EXPECT_OK(zpSend(x, 4, zpFloat32, 1 - rank, comm, nullptr));
    ZP_EXPECT_OK(zpRecv(y, 4, zpFloat32, 1 - rank, comm, nullptr));
    ZP_EXPECT_OK(zpGroupEnd());
    ZP_EXPECT_OK(zpBarrier(comm, nullptr));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  unsetenv("NVTX_INJECTION64_PATH");
  unsetenv("NVTX_SPY_DIR");
  zptest::expectAllOk(exits);

  // One log per rank; in each, the calls' ranges in call order, every one
  // closed, none of another domain.
  const std::vector<std::string> want = {"zpCommInitRankConfig", "zpAllReduce", "zpSend",       "zpRecv",
                                         "zpGroupEnd",           "zpBarrier",   "zpCommDestroy"};
  std::vector<std::string> logs;
  DIR* d = opendir(dir);
  ASSERT_NE(d, nullptr);
  while (dirent* e = readdir(d))
    if (std::string(e->d_name).size() > 4) logs.push_back(std::string(dir) + "/" + e->d_name);
  closedir(d);
  EXPECT_EQ(logs.size(), (size_t)n) << "one log per rank";
  for (const std::string& path : logs) {
    std::ifstream in(path);
    std::vector<std::string> calls;  // the outermost ranges
    int depth = 0;
    for (std::string line; std::getline(in, line);) {
      if (line.rfind("push Zeppelin ", 0) == 0) {
        if (depth++ == 0) calls.push_back(line.substr(14));
      } else if (line == "pop Zeppelin") {
        EXPECT_GT(depth--, 0) << path << ": a range closed that was not open";
      } else {
        ADD_FAILURE() << path << ": not a range of the domain Zeppelin: " << line;
      }
    }
    EXPECT_EQ(depth, 0) << path << ": ranges left open";
    EXPECT_EQ(calls, want) << path;
    unlink(path.c_str());
  }
  rmdir(dir);
#endif
}

}  // namespace
