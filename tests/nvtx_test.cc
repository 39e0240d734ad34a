// NVTX ranges (src/util/nvtx.h): a profiler that reads NVTX sees each C API
// call of every rank as a range of the domain "Zeppelin", closed when the
// call returns. Checked through an NVTX injection library
// (tests/nvtx_spy.cc), attached the way a profiler attaches.
#include <dirent.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <sstream>
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
    // The extension layer's calls too (its exchange runs on a thread of its
    // own: its zpGroupEnd is a range of that thread).
    const int order[2] = {0, 1};
    zpRing_t ring = nullptr;
    ZP_EXPECT_OK(zpRingCreate(&ring, comm, 2, order, 0));
    ZP_EXPECT_OK(zpRingExchangeStart(ring, x, sizeof x, y, sizeof y, nullptr));
    ZP_EXPECT_OK(zpRingExchangeWait(ring));
    ZP_EXPECT_OK(zpRingDestroy(ring));
    // A call refused at once is a range too (the others of the layer, with
    // no handle: each range opens before the arguments are checked).
    EXPECT_EQ(zpAttentionForward(nullptr, x, x, x, y, y, nullptr), zpInvalidArgument);
    EXPECT_EQ(zpAttentionBackward(nullptr, x, x, x, x, x, x, y, y, y, nullptr), zpInvalidArgument);
    EXPECT_EQ(zpUlyssesAlltoall(x, y, nullptr, 1, 1, 1, zpFloat32, 0, comm, nullptr), zpInvalidArgument);
    EXPECT_EQ(zpRemapExecute(nullptr, x, y, 1, zpFloat32, 0, comm, nullptr), zpInvalidArgument);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  unsetenv("NVTX_INJECTION64_PATH");
  unsetenv("NVTX_SPY_DIR");
  zptest::expectAllOk(exits);

  // One log per rank; in each, the calls' ranges in call order on the
  // calling thread, every range of every thread closed, none of another
  // domain.
  const std::vector<std::string> want = {"zpCommInitRankConfig", "zpAllReduce",         "zpSend",
                                         "zpRecv",               "zpGroupEnd",          "zpBarrier",
                                         "zpRingExchangeStart",  "zpRingExchangeWait",  "zpAttentionForward",
                                         "zpAttentionBackward",  "zpUlyssesAlltoall",   "zpRemapExecute",
                                         "zpCommDestroy"};
  std::vector<std::string> logs;
  DIR* d = opendir(dir);
  ASSERT_NE(d, nullptr);
  while (dirent* e = readdir(d))
    if (std::string(e->d_name).size() > 4) logs.push_back(std::string(dir) + "/" + e->d_name);
  closedir(d);
  EXPECT_EQ(logs.size(), (size_t)n) << "one log per rank";
  for (const std::string& path : logs) {
    std::ifstream in(path);
    std::map<std::string, int> depth;                     // by thread
    std::map<std::string, std::vector<std::string>> calls;  // by thread: the outermost ranges
    for (std::string line; std::getline(in, line);) {
      std::istringstream words(line);
      std::string what, thread, domain, name;
      words >> what >> thread >> domain >> name;
      if (domain != "Zeppelin") {
        ADD_FAILURE() << path << ": not a range of the domain Zeppelin: " << line;
      } else if (what == "push") {
        if (depth[thread]++ == 0) calls[thread].push_back(name);
      } else if (what == "pop") {
        EXPECT_GT(depth[thread]--, 0) << path << ": a range closed that was not open";
      }
    }
    for (auto& t : depth) EXPECT_EQ(t.second, 0) << path << ": ranges left open on thread " << t.first;
    std::vector<std::string> caller;  // the thread that made the communicator
    for (auto& t : calls)
      if (!t.second.empty() && t.second[0] == want[0]) caller = t.second;
    EXPECT_EQ(caller, want) << path;
    unlink(path.c_str());
  }
  rmdir(dir);
#endif
}

}  // namespace
