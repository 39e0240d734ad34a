// The table of ZP_* parameters (src/core/params.cc) is the only place the
// library's environment variables are declared: the code reads none that is
// not in it, docs/configuration.md shows exactly it, and the configuration's
// defaults are the table's.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "src/core/config.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "tests/harness.h"
#include "src/util/strings.h"

namespace {

std::string readFile(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every string literal of the source tree that starts with a ZP_ name (a
// variable read, set by a launcher, or named in "ZP_X=value") must be a
// declared parameter.
TEST(Params, EveryZpVariableTheCodeNamesIsInTheTable) {
  const std::filesystem::path root = ZP_SOURCE_DIR;
  const std::regex literal("\"(ZP_[A-Z0-9_]+)[=\"]");
  std::set<std::string> seen;
  int files = 0;
  for (const char* dir : {"src", "transport", "collectives", "bench", "examples"}) {
    for (const auto& e : std::filesystem::recursive_directory_iterator(root / dir)) {
      const std::string ext = e.path().extension().string();
      if (!e.is_regular_file() || (ext != ".cc" && ext != ".h" && ext != ".cu" && ext != ".py")) continue;
      files++;
      const std::string text = readFile(e.path());
      for (std::sregex_iterator m(text.begin(), text.end(), literal), end; m != end; ++m) {
        const std::string name = (*m)[1];
        seen.insert(name);
        EXPECT_NE(zp::findParam(name), nullptr)
            << std::filesystem::relative(e.path(), root).string() << " names " << name
            << ", which is not declared in src/core/params.cc";
      }
    }
  }
  EXPECT_GT(files, 50);
  // The scan sees the variables it must (a broken pattern would pass anything).
  for (const char* name : {"ZP_TIMEOUT", "ZP_ROUTING", "ZP_RANK", "ZP_UNIQUE_ID", "ZP_NIC_RATE_BPS"})
    EXPECT_TRUE(seen.count(name)) << name;
}

TEST(Params, TheConfigurationPageShowsTheTable) {
  const std::string page = readFile(std::filesystem::path(ZP_SOURCE_DIR) / "docs" / "configuration.md");
  const std::string begin = "<!-- params:begin", end = "<!-- params:end -->";
  size_t b = page.find(begin), e = page.find(end);
  ASSERT_NE(b, std::string::npos) << "docs/configuration.md has no params:begin marker";
  ASSERT_NE(e, std::string::npos) << "docs/configuration.md has no params:end marker";
  b = page.find('\n', b) + 1;
  EXPECT_EQ(page.substr(b, e - b), zp::paramsMarkdown())
      << "docs/configuration.md is out of date: regenerate its table with zpconfig --markdown";
}

TEST(Params, TheConfigurationsDefaultsAreTheTables) {
  const zp::Config c;
  auto size = [](const char* name) {
    size_t v = 0;
    EXPECT_TRUE(zp::parseSize(zp::findParam(name)->dflt, &v)) << name;
    return v;
  };
  EXPECT_EQ(c.timeoutMs, std::stoi(zp::findParam("ZP_TIMEOUT")->dflt) * 1000);
  EXPECT_EQ(c.routing, zpRoutingBalanced);
  EXPECT_STREQ(zp::findParam("ZP_ROUTING")->dflt, "balanced");
  EXPECT_EQ(c.shmProto, zp::ShmProto::kAuto);
  EXPECT_STREQ(zp::findParam("ZP_SHM_PROTO")->dflt, "auto");
  EXPECT_EQ(c.shmEagerBytes, size("ZP_SHM_EAGER"));
  EXPECT_EQ(c.shmRingBytes, size("ZP_SHM_RING_BYTES"));
  EXPECT_EQ(c.shmSpinUs, std::stoi(zp::findParam("ZP_SHM_SPIN_US")->dflt));
  EXPECT_EQ(c.shmSpinBusyUs, std::stoi(zp::findParam("ZP_SHM_SPIN_BUSY_US")->dflt));
  EXPECT_EQ(c.routeChunkBytes, size("ZP_ROUTE_CHUNK"));
  EXPECT_EQ(c.routeDirectBelow, size("ZP_ROUTE_DIRECT_BELOW"));
}

TEST(Params, ValuesAreCheckedAgainstTheTable) {
  setenv("ZP_ROUTE_CHUNK", "1K", 1);
  zp::Config c;
  EXPECT_EQ(zp::resolveConfig(nullptr, &c), zpInvalidArgument);
  setenv("ZP_ROUTE_CHUNK", "64K", 1);
  ASSERT_EQ(zp::resolveConfig(nullptr, &c), zpSuccess);
  EXPECT_EQ(c.routeChunkBytes, 64u << 10);
  unsetenv("ZP_ROUTE_CHUNK");
  setenv("ZP_SHM_RING_BYTES", "96K", 1);  // in range, but not a power of two
  EXPECT_EQ(zp::resolveConfig(nullptr, &c), zpInvalidArgument);
  unsetenv("ZP_SHM_RING_BYTES");
  setenv("ZP_ROUTING", "RAIL", 1);
  ASSERT_EQ(zp::resolveConfig(nullptr, &c), zpSuccess);
  EXPECT_EQ(c.routing, zpRoutingRail);
  unsetenv("ZP_ROUTING");
  setenv("ZP_SHM_SPIN_US", "lots", 1);
  EXPECT_EQ(zp::resolveConfig(nullptr, &c), zpInvalidArgument);
  unsetenv("ZP_SHM_SPIN_US");
  // The poll while tasks wait for a core: 0 (sleep at once) up to 10 s.
  for (const char* bad : {"-1", "10000001", "lots", "5us"}) {
    setenv("ZP_SHM_SPIN_BUSY_US", bad, 1);
    EXPECT_EQ(zp::resolveConfig(nullptr, &c), zpInvalidArgument) << bad;
  }
  for (int good : {0, 20, 10000000}) {
    setenv("ZP_SHM_SPIN_BUSY_US", std::to_string(good).c_str(), 1);
    ASSERT_EQ(zp::resolveConfig(nullptr, &c), zpSuccess) << good;
    EXPECT_EQ(c.shmSpinBusyUs, good);
  }
  unsetenv("ZP_SHM_SPIN_BUSY_US");
}

// zpconfig --env (run after prefix, e.g. "env NAME=VALUE ") exits 1 and
// marks NAME=VALUE as refused.
void expectZpconfigRefuses(const std::string& prefix, const std::string& name, const std::string& value) {
  const std::string cmd = prefix + ZPCONFIG_PATH + " --env 2>/dev/null";
  FILE* out = popen(cmd.c_str(), "r");
  ASSERT_NE(out, nullptr);
  std::string text;
  char buf[512];
  while (fgets(buf, sizeof buf, out)) text += buf;
  const int status = pclose(out);
  EXPECT_EQ(WEXITSTATUS(status), 1) << text;
  EXPECT_NE(text.find(name + "=" + value + "   <- "), std::string::npos) << text;
}

// Settings the configuration does not read itself (logging, discovery) are
// checked too: nothing set is silently ignored (issue 26, item 6). zpconfig
// --env says the same of each value, and exits 1.
TEST(Params, EverySettingIsCheckedAtInitAndByZpconfig) {
  zp::Config c;
  const char* bad[][2] = {{"ZP_DEBUG", "LOUD"}, {"ZP_DEBUG_SUBSYS", "INIT,BOGUS"}, {"ZP_TIMEOUT", "abc"},
                          {"ZP_CHECK_MODE", "paranoid"}};
  for (const auto& b : bad) {
    setenv(b[0], b[1], 1);
    EXPECT_EQ(zp::resolveConfig(nullptr, &c), zpInvalidArgument) << b[0] << "=" << b[1];
    EXPECT_NE(std::string(zp::lastError()).find(b[0]), std::string::npos) << zp::lastError();
    expectZpconfigRefuses("", b[0], b[1]);
    unsetenv(b[0]);
  }
  for (const auto& good : {"INIT,SHM", "^NET", "coll"}) {
    setenv("ZP_DEBUG_SUBSYS", good, 1);
    EXPECT_EQ(zp::resolveConfig(nullptr, &c), zpSuccess) << good << ": " << zp::lastError();
  }
  unsetenv("ZP_DEBUG_SUBSYS");
}

// The settings that name a NIC, or where to find one, are checked at init on
// one node as across nodes (they were ignored there), on every rank, with
// the variable named; zpconfig --env runs the same checks. A NIC that exists
// passes.
TEST(Params, NicSettingsAreCheckedOnOneNodeAndByZpconfig) {
  const char* bad[][2] = {{"ZP_TOPO_FILE", "/nonexistent"}, {"ZP_SYSFS_ROOT", "/nonexistent"},
                          {"ZP_NET_DEVICES", "nosuchnic"}};
  for (const auto& b : bad) {
    auto exits = zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
      setenv(b[0], b[1], 1);
      zpComm_t comm = nullptr;
      EXPECT_EQ(zpCommInitRank(&comm, nranks, id, rank), zpInvalidArgument) << b[0];
      EXPECT_NE(std::string(zpGetLastError(nullptr)).find(b[0]), std::string::npos) << zpGetLastError(nullptr);
    });
    zptest::expectAllOk(exits);
    expectZpconfigRefuses(std::string("env ") + b[0] + "=" + b[1] + " ", b[0], b[1]);
  }
  auto exits = zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
    setenv("ZP_NET_DEVICES", "lo", 1);
    zpComm_t comm = nullptr;
    ASSERT_EQ(zpCommInitRank(&comm, nranks, id, rank), zpSuccess) << zpGetLastError(nullptr);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

TEST(ParamsDeathTest, ReadingAnUndeclaredVariableAborts) {
  EXPECT_DEATH(zp::envString("ZP_NOT_DECLARED"), "ZP_NOT_DECLARED is read but not declared");
}

}  // namespace
