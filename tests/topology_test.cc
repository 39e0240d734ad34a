// The topology module: the topology file's JSON reader and schema (every bad
// file is a zpInvalidArgument with a line and column, never a crash), clusters
// that do not exist (64 nodes x 8 ranks x 8 NICs), the NIC affinity rule, and
// discovery on this machine and in a private network namespace. No test sends
// anything over any network.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/core/topology.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <net/if.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/core/log.h"
#include "tests/process_util.h"

namespace {

using zp::ClusterTopology;
using zp::Nic;
using zp::NodeTopology;

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// Sets (or with nullptr unsets) an environment variable for one scope.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* old = getenv(name);
    had_ = old != nullptr;
    if (had_) old_ = old;
    if (value) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~ScopedEnv() {
    if (had_) setenv(name_.c_str(), old_.c_str(), 1);
    else unsetenv(name_.c_str());
  }

 private:
  std::string name_, old_;
  bool had_ = false;
};

std::string dataDir() {
#ifdef ZP_TEST_DATA_DIR
  return ZP_TEST_DATA_DIR;
#else
  std::string f = __FILE__;
  size_t slash = f.rfind('/');
  return (slash == std::string::npos ? std::string(".") : f.substr(0, slash)) + "/data";
#endif
}

// A scratch file, removed at the end of the scope.
class TempFile {
 public:
  explicit TempFile(const std::string& text) {
    const char* dir = getenv("TMPDIR");
    path_ = std::string(dir && *dir ? dir : "/tmp") + "/zp_topo_test_XXXXXX";
    int fd = mkstemp(&path_[0]);
    EXPECT_GE(fd, 0) << strerror(errno);
    if (fd >= 0) {
      EXPECT_EQ(write(fd, text.data(), text.size()), (ssize_t)text.size());
      close(fd);
    }
  }
  ~TempFile() { unlink(path_.c_str()); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Runs body in a forked child (stderr to /dev/null if quiet) and returns what
// it returned, or "CRASH ..." if the child died.
std::string inChild(const std::function<std::string()>& body, bool quiet = false) {
  int fds[2];
  if (pipe(fds) != 0) return "CRASH pipe";
  pid_t pid = fork();
  if (pid < 0) return "CRASH fork";
  if (pid == 0) {
    close(fds[0]);
    if (quiet) {
      int devnull = open("/dev/null", O_WRONLY);
      if (devnull >= 0) dup2(devnull, 2);
    }
    std::string s = body();
    (void)!write(fds[1], s.data(), s.size());
    _exit(0);
  }
  close(fds[1]);
  std::string got;
  char buf[4096];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof(buf))) > 0) got.append(buf, (size_t)n);
  close(fds[0]);
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return "CRASH status " + std::to_string(status) + ": " + got;
  return got;
}

std::string findIp() {
  for (const char* p : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (access(p, X_OK) == 0) return p;
  return "";
}

int run(const std::vector<std::string>& argv) {
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_WRONLY);
    if (devnull >= 0) {
      dup2(devnull, 1);
      dup2(devnull, 2);
    }
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Parses text; on failure returns the message (which must be non-empty and
// come with zpInvalidArgument), on success "".
std::string parseError(const std::string& text, ClusterTopology* out = nullptr) {
  ClusterTopology t;
  zp::clearLastError();
  zpResult_t r = zp::parseTopo(text, "test.json", &t);
  if (r == zpSuccess) {
    if (out) *out = t;
    return "";
  }
  EXPECT_EQ(r, zpInvalidArgument) << text;
  std::string msg = zp::lastError();
  EXPECT_FALSE(msg.empty()) << text;
  return msg.empty() ? "(no message)" : msg;
}

NodeTopology makeNode(int nics, int numaNodes = 1, std::vector<int> nicNuma = {}) {
  NodeTopology n;
  n.name = "n";
  n.numaNodes = numaNodes;
  for (int k = 0; k < nics; k++) {
    Nic nic;
    nic.name = "zpnic" + std::to_string(k);
    nic.bitsPerSec = 1e9;
    nic.numa = k < (int)nicNuma.size() ? nicNuma[(size_t)k] : -1;
    n.nics.push_back(nic);
  }
  return n;
}

const char* kTwoNics =
    "\"nics\": [{\"name\": \"zpnic0\", \"bandwidth\": \"1gbit\"}, {\"name\": \"zpnic1\", \"bandwidth\": 1e9}]";

// ---- Rates ----

TEST(TopoRate, ParsesNumbersAndTcUnits) {
  struct Case {
    const char* text;
    double bits;
  } cases[] = {
      {"0", 0},           {"1000000000", 1e9}, {"1e9", 1e9},         {"1gbit", 1e9},     {"1Gbit", 1e9},
      {"2.5gbit", 2.5e9}, {"100mbit", 1e8},    {"400gbit", 4e11},    {"10kbit", 1e4},    {"1tbit", 1e12},
      {"7bit", 7},        {"1kibit", 1024},    {"1mibit", 1048576},  {"1gibit", 1073741824.0},
      {"1bps", 8},        {"25gbps", 2e11},    {"1kibps", 8192},     {" 1gbit ", 1e9},   {"1MBPS", 8e6},
  };
  for (const Case& c : cases) {
    double b = -1;
    EXPECT_TRUE(zp::parseBitsPerSec(c.text, &b)) << c.text;
    EXPECT_DOUBLE_EQ(b, c.bits) << c.text;
  }
  for (const char* bad : {"", " ", "fast", "-1", "1 gbit", "1gb", "gbit", "1e999", "nan", "inf", "1..2", "0x10",
                          "1gbitx", "--1"}) {
    double b = -1;
    EXPECT_FALSE(zp::parseBitsPerSec(bad, &b)) << "'" << bad << "' parsed as " << b;
  }
}

TEST(TopoRate, Formats) {
  EXPECT_EQ(zp::formatBitsPerSec(0), "unknown");
  EXPECT_EQ(zp::formatBitsPerSec(1e9), "1 Gbit/s");
  EXPECT_EQ(zp::formatBitsPerSec(2.5e9), "2.5 Gbit/s");
  EXPECT_EQ(zp::formatBitsPerSec(5e8), "500 Mbit/s");
  EXPECT_EQ(zp::formatBitsPerSec(4e11), "400 Gbit/s");
  EXPECT_EQ(zp::formatBitsPerSec(12), "12 bit/s");
}

// ---- The topology file: good files ----

TEST(TopoFile, ExampleFileLoads) {
  ClusterTopology t;
  std::string path = dataDir() + "/topo_2x4x4.json";
  ASSERT_EQ(zp::loadTopoFile(path, &t), zpSuccess) << zp::lastError();
  ASSERT_EQ(t.nodes(), 2);
  ASSERT_EQ(t.nranks(), 8);
  EXPECT_EQ(t.ranksPerNode(), 4);
  EXPECT_EQ(t.node[0].name, "node0");
  EXPECT_EQ(t.node[1].name, "node1");
  for (int n = 0; n < 2; n++) {
    const NodeTopology& node = t.node[(size_t)n];
    ASSERT_EQ(node.nics.size(), 4u);
    EXPECT_EQ(node.numaNodes, 1);
    EXPECT_TRUE(node.gpus.empty());
    for (int k = 0; k < 4; k++) {
      EXPECT_EQ(node.nics[(size_t)k].name, "zpnic" + std::to_string(k));
      EXPECT_EQ(node.nics[(size_t)k].bitsPerSec, 1e9);
      EXPECT_EQ(node.nics[(size_t)k].numa, -1);
    }
  }
  for (int r = 0; r < 8; r++) {
    EXPECT_EQ(t.rankNode[(size_t)r], r / 4) << r;
    EXPECT_EQ(t.rankLocal[(size_t)r], r % 4) << r;
    EXPECT_EQ(t.rankNic[(size_t)r], r % 4) << r;
    EXPECT_EQ(t.nodeRanks[(size_t)(r / 4)][(size_t)(r % 4)], r);
  }
  EXPECT_TRUE(contains(zp::describe(t), "rank 5 (local 1): nic zpnic1")) << zp::describe(t);
}

TEST(TopoFile, SmallestFileOfTheDocumentation) {
  ClusterTopology t;
  ASSERT_EQ(parseError(std::string("{\"nodes\": 2, \"ranksPerNode\": 4, ") + kTwoNics + "}", &t), "");
  ASSERT_EQ(t.nranks(), 8);
  // No affinity given: local rank i uses NIC i % 2.
  for (int r = 0; r < 8; r++) EXPECT_EQ(t.rankNic[(size_t)r], (r % 4) % 2) << r;
  EXPECT_EQ(t.node[1].name, "node1");
}

TEST(TopoFile, CommentsVersionAndBom) {
  ClusterTopology t;
  EXPECT_EQ(parseError(std::string("\xEF\xBB\xBF{\"comment\": \"hi\", \"version\": 1, \"nodes\": [{\"comment\": "
                                   "[\"a\", \"b\"], \"ranks\": 1}], \"nics\": [{\"name\": \"e\", \"bandwidth\": "
                                   "null, \"comment\": \"\\u00e9t\\u00e9 \\ud83d\\ude80\"}]}"),
                       &t),
            "");
  ASSERT_EQ(t.nodes(), 1);
  EXPECT_EQ(t.node[0].nics[0].bitsPerSec, 0);  // null: unknown
  EXPECT_EQ(t.rankNic[0], 0);
}

TEST(TopoFile, ExplicitRankListsAndPerNodeOverrides) {
  ClusterTopology t;
  std::string text = std::string("{\n") +
                     "  \"nics\": [{\"name\": \"a\", \"bandwidth\": \"10gbit\"}],\n"
                     "  \"nodes\": [\n"
                     "    {\"name\": \"x\", \"ranks\": [6, 0, 2, 4], \"affinity\": [0, \"a\", 0, 0]},\n"
                     "    {\"name\": \"y\", \"ranks\": [1, 3, 5],\n"
                     "     \"numaNodes\": 2, \"gpus\": 3,\n"
                     "     \"nics\": [{\"name\": \"b0\", \"bandwidth\": 25e9, \"numa\": 1, \"pci\": \"0000:17:00.0\"},\n"
                     "              {\"name\": \"b1\", \"bandwidth\": \"25gbps\", \"numa\": 0}],\n"
                     "     \"affinity\": [\"b1\", \"b0\", 1]}\n"
                     "  ]\n"
                     "}\n";
  ASSERT_EQ(parseError(text, &t), "");
  ASSERT_EQ(t.nodes(), 2);
  ASSERT_EQ(t.nranks(), 7);
  EXPECT_EQ(t.ranksPerNode(), -1);
  EXPECT_EQ(t.nodeRanks[0], (std::vector<int>{6, 0, 2, 4}));
  EXPECT_EQ(t.nodeRanks[1], (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(t.rankNode, (std::vector<int>{0, 1, 0, 1, 0, 1, 0}));
  EXPECT_EQ(t.rankLocal, (std::vector<int>{1, 0, 2, 1, 3, 2, 0}));
  EXPECT_EQ(t.rankNic, (std::vector<int>{0, 1, 0, 0, 0, 1, 0}));
  EXPECT_EQ(t.node[1].numaNodes, 2);
  EXPECT_EQ(t.node[1].gpus.size(), 3u);
  EXPECT_EQ(t.node[1].nics[0].pciBusId, "0000:17:00.0");
  EXPECT_EQ(t.node[1].nics[0].numa, 1);
  EXPECT_EQ(t.node[1].nics[1].bitsPerSec, 2e11);
  EXPECT_EQ(t.node[0].nics[0].bitsPerSec, 1e10);

  // Back to text and again: the same cluster.
  ClusterTopology again;
  std::string json = zp::toJson(t);
  ASSERT_EQ(parseError(json, &again), "") << json;
  EXPECT_EQ(again, t) << json;
  EXPECT_TRUE(contains(json, "\"ranks\": [")) << json;  // a list: counts cannot say 6, 0, 2, 4
}

// A cluster that does not exist: 64 nodes x 8 ranks x 8 NICs, generated here,
// in the explicit form (node objects, NUMA placement, PCI ids, some nodes with
// and some without affinity) and in the short form.
TEST(TopoFile, Generated64x8x8) {
  const int kNodes = 64, kRanks = 8, kNics = 8;
  std::ostringstream f;
  f << "{\n  \"comment\": \"generated by topology_test\",\n  \"version\": 1,\n  \"ranksPerNode\": " << kRanks
    << ",\n  \"numaNodes\": 2,\n  \"nodes\": [\n";
  for (int n = 0; n < kNodes; n++) {
    f << "    {\"name\": \"gpu-host-" << n << "\", \"nics\": [";
    for (int k = 0; k < kNics; k++) {
      char pci[32];
      snprintf(pci, sizeof(pci), "0000:%02x:00.0", 0x10 + k);
      f << (k ? ", " : "") << "{\"name\": \"mlx5_" << k << "\", \"bandwidth\": \"400gbit\", \"numa\": " << k / 4
        << ", \"pci\": \"" << pci << "\"}";
    }
    f << "]";
    if (n % 2) {  // odd nodes: explicit affinity, reversed
      f << ", \"affinity\": [";
      for (int l = 0; l < kRanks; l++) f << (l ? ", " : "") << kNics - 1 - l;
      f << "]";
    }
    f << "}" << (n + 1 < kNodes ? "," : "") << "\n";
  }
  f << "  ]\n}\n";
  TempFile file(f.str());
  ClusterTopology t;
  ASSERT_EQ(zp::loadTopoFile(file.path(), &t), zpSuccess) << zp::lastError();
  ASSERT_EQ(t.nodes(), kNodes);
  ASSERT_EQ(t.nranks(), kNodes * kRanks);
  EXPECT_EQ(t.ranksPerNode(), kRanks);
  for (int r = 0; r < t.nranks(); r++) {
    int n = r / kRanks, l = r % kRanks;
    ASSERT_EQ(t.rankNode[(size_t)r], n);
    ASSERT_EQ(t.rankLocal[(size_t)r], l);
    const NodeTopology& node = t.node[(size_t)n];
    ASSERT_EQ(node.nics.size(), (size_t)kNics);
    int nic = t.rankNic[(size_t)r];
    if (n % 2) {
      EXPECT_EQ(nic, kNics - 1 - l) << r;
    } else {
      // Default rule: ranks 0-3 sit on NUMA node 0, 4-7 on 1; each takes its
      // own NIC of its NUMA node.
      EXPECT_EQ(nic, l) << r;
      EXPECT_EQ(node.nics[(size_t)nic].numa, l * 2 / kRanks) << r;
    }
  }
  EXPECT_EQ(t.node[63].name, "gpu-host-63");
  EXPECT_EQ(t.node[5].nics[7].pciBusId, "0000:17:00.0");
  EXPECT_EQ(t.node[5].nics[7].bitsPerSec, 4e11);

  ClusterTopology again;
  ASSERT_EQ(parseError(zp::toJson(t), &again), "");
  EXPECT_EQ(again, t);

  // The short form of a uniform cluster, and its short form back.
  std::ostringstream s;
  s << "{\"nodes\": " << kNodes << ", \"ranksPerNode\": " << kRanks << ", \"nics\": [";
  for (int k = 0; k < kNics; k++) s << (k ? ", " : "") << "{\"name\": \"nic" << k << "\", \"bandwidth\": \"200gbit\"}";
  s << "]}";
  ClusterTopology u;
  ASSERT_EQ(parseError(s.str(), &u), "");
  ASSERT_EQ(u.nranks(), kNodes * kRanks);
  for (int r = 0; r < u.nranks(); r++) EXPECT_EQ(u.rankNic[(size_t)r], r % kRanks) << r;
  std::string json = zp::toJson(u);
  EXPECT_TRUE(contains(json, "\"nodes\": 64,")) << json;
  EXPECT_LT(json.size(), 2000u);
  ASSERT_EQ(parseError(json, &again), "");
  EXPECT_EQ(again, u);
}

TEST(TopoFile, DefaultAffinityIsPickNic) {
  ClusterTopology t;
  ASSERT_EQ(parseError("{\"nodes\": 1, \"ranksPerNode\": 6, \"numaNodes\": 2, \"nics\": ["
                       "{\"name\": \"a\", \"bandwidth\": 1, \"numa\": 1}, {\"name\": \"b\", \"bandwidth\": 1, \"numa\": 0},"
                       "{\"name\": \"c\", \"bandwidth\": 1, \"numa\": 0}]}",
                       &t),
            "");
  for (int l = 0; l < 6; l++) EXPECT_EQ(t.rankNic[(size_t)l], zp::pickNic(t.node[0], l, 6, "")) << l;
  // Ranks 0-2 on NUMA 0 (b, c), 3-5 on NUMA 1 (a).
  EXPECT_EQ(t.rankNic, (std::vector<int>{1, 2, 1, 0, 0, 0}));
}

TEST(TopoFile, NodeWithoutNics) {
  ClusterTopology t;
  ASSERT_EQ(parseError("{\"nodes\": 1, \"ranksPerNode\": 2, \"nics\": []}", &t), "");
  EXPECT_EQ(t.rankNic, (std::vector<int>{-1, -1}));
  ClusterTopology again;
  ASSERT_EQ(parseError(zp::toJson(t), &again), "");
  EXPECT_EQ(again, t);
}

// ---- The topology file: bad files ----

struct Bad {
  std::string text;
  std::string want;  // part of the message
};

void expectAllFail(const std::vector<Bad>& cases) {
  for (const Bad& c : cases) {
    std::string msg = parseError(c.text);
    EXPECT_TRUE(contains(msg, c.want)) << "text: " << c.text << "\nmessage: " << msg << "\nwanted: " << c.want;
    // A syntax error names its line and column, a schema error the value by its JSON pointer.
    EXPECT_TRUE(msg.compare(0, 15, "test.json: line") == 0 || msg.compare(0, 14, "test.json: at ") == 0) << msg;
  }
}

TEST(TopoJson, SyntaxErrorsNameLineAndColumn) {
  std::string deep = "{\"a\": " + std::string(100, '[') + std::string(100, ']') + "}";
  expectAllFail({
      {"", "line 1, column 1: the document is empty"},
      {"   \n  ", "line 2, column 3: the document is empty"},
      {"{", "line 1, column 2: syntax error while parsing object key - unexpected end of input"},
      {"{\"nodes\": 2,}", "line 1, column 13: syntax error while parsing object key - unexpected '}'"},
      {"{\"a\": [1, 2,]}", "line 1, column 13: syntax error while parsing value - unexpected ']'"},
      {"{\"a\": [1 2]}", "line 1, column 10: syntax error while parsing array - unexpected number literal; expected ']'"},
      {"{'nodes': 2}", "line 1, column 2: syntax error while parsing object key - invalid literal"},
      {"{nodes: 2}", "syntax error while parsing object key - invalid literal; last read: '{no'"},
      {"{\"nodes\": 2 \"x\": 1}", "line 1, column 15: syntax error while parsing object - unexpected string literal; expected '}'"},
      {"{\"a\" 1}", "line 1, column 6: syntax error while parsing object separator - unexpected number literal; expected ':'"},
      {"{\"a\": tru}", "line 1, column 10: syntax error while parsing value - invalid literal; last read: '\"a\": tru}'"},
      {"{\"a\": True}", "line 1, column 7: syntax error while parsing value - invalid literal; last read: '\"a\": T'"},
      {"{\"a\": NaN}", "line 1, column 7: syntax error while parsing value - invalid literal; last read: '\"a\": N'"},
      {"{\"a\": -Infinity}", "line 1, column 8: syntax error while parsing value - invalid number; expected digit after '-'"},
      {"{\"a\": 01}", "line 1, column 8: syntax error while parsing object - unexpected number literal"},
      {"{\"a\": 1.}", "line 1, column 9: syntax error while parsing value - invalid number; expected digit after '.'"},
      {"{\"a\": .5}", "line 1, column 7: syntax error while parsing value - invalid literal; last read: '\"a\": .'"},
      {"{\"a\": 1e}", "line 1, column 9: syntax error while parsing value - invalid number; expected '+', '-', or digit after exponent"},
      {"{\"a\": +1}", "line 1, column 7: syntax error while parsing value - invalid literal"},
      {"{\"a\": 1e999}", "number overflow parsing '1e999'"},
      {"{\"a\": \"x\ny\"}", "line 1, column 9: syntax error while parsing value - invalid string: control character U+000A (LF) must be escaped"},
      {"{\"a\": \"x\ty\"}", "line 1, column 9: syntax error while parsing value - invalid string: control character U+0009 (HT) must be escaped"},
      {"{\"a\": \"abc", "line 1, column 11: syntax error while parsing value - invalid string: missing closing quote"},
      {"{\"a\": \"\\q\"}", "line 1, column 9: syntax error while parsing value - invalid string: forbidden character after backslash"},
      {"{\"a\": \"\\u12g4\"}", "invalid string: '\\u' must be followed by 4 hex digits"},
      {"{\"a\": \"\\ud800\"}", "invalid string: surrogate U+D800..U+DBFF must be followed by U+DC00..U+DFFF"},
      {"{\"a\": \"\\udc00\"}", "invalid string: surrogate U+DC00..U+DFFF must follow U+D800..U+DBFF"},
      {"{\"a\": \"\xff\"}", "line 1, column 8: syntax error while parsing value - invalid string: ill-formed UTF-8 byte; last read: '\"\\xff'"},
      {"{\"a\": \"\xc0\xaf\"}", "ill-formed UTF-8 byte; last read: '\"\\xc0'"},           // overlong '/'
      {"{\"a\": \"\xed\xa0\x80\"}", "ill-formed UTF-8 byte; last read: '\"\\xed\\xa0'"},       // a surrogate in UTF-8
      {"{\"a\": \"\xe2\x82\"}", "ill-formed UTF-8 byte; last read: '\"\\xe2\\x82\"'"},           // cut short
      {"{\"\xc3\xa9\xc3\xa9\": x}", "line 1, column 8: syntax error while parsing value - invalid literal"},  // columns count characters
      {"{\"a\": 1} x", "line 1, column 10: syntax error while parsing value - invalid literal; last read: '1} x'; expected end of input"},
      {"{\"a\": 1}{}", "line 1, column 9: syntax error while parsing value - unexpected '{'; expected end of input"},
      {"{\"a\": 1, \"a\": 2}", "at the top level: duplicate key \"a\""},
      {deep, "nesting deeper than 64 levels"},
      {"// a comment\n{}", "line 1, column 1: syntax error while parsing value - invalid literal; last read: '/'"},
      {"{\"nodes\": 2, /* c */ \"x\": 1}", "line 1, column 14: syntax error while parsing object key - invalid literal"},
      {std::string("{\"a\": \0}", 8), "line 1, column 7: syntax error while parsing value - unexpected end of input"},
      {"{\n  \"nodes\": 2,\n  \"ranksPerNode\": x\n}", "line 3, column 19: syntax error while parsing value - invalid literal"},
      {"{\r\n\t\"a\": [\r\n\t\t1,\r\n\t\t]\r\n}", "line 4, column 3: syntax error while parsing value - unexpected ']'"},
  });
}

TEST(TopoSchema, WrongTypesMissingFieldsAndUnknownKeys) {
  const std::string nics = kTwoNics;
  auto top = [&](const std::string& rest) { return "{\"nodes\": 2, \"ranksPerNode\": 2, " + nics + rest + "}"; };
  auto withNic = [](const std::string& nic) {
    return "{\"nodes\": 1, \"ranksPerNode\": 1, \"nics\": [" + nic + "]}";
  };
  expectAllFail({
      {"[]", "at the top level: the document must be an object, not an array"},
      {"\"x\"", "the document must be an object, not a string"},
      {"{}", "at the top level: missing \"nodes\""},
      {"{\"nodes\": \"2\"}", "at /nodes: \"nodes\" must be a node count or an array of node objects, not a string"},
      {"{\"nodes\": null}", "\"nodes\" must be a node count or an array of node objects, not null"},
      {"{\"nodes\": 2}", "node 0 has no \"ranks\", and there is no top-level \"ranksPerNode\""},
      {"{\"nodes\": 2, \"ranksPerNode\": 4}", "node 0 has no \"nics\""},
      {"{\"nodes\": 2.5, \"ranksPerNode\": 4}", "at /nodes: \"nodes\" must be an integer in [1, 65536], not 2.5"},
      {"{\"nodes\": 0, \"ranksPerNode\": 4}", "\"nodes\" must be an integer in [1, 65536], not 0"},
      {"{\"nodes\": 1e6, \"ranksPerNode\": 4}", "\"nodes\" must be an integer in [1, 65536], not 1000000"},
      {"{\"nodes\": 2, \"ranksPerNode\": -1}", "\"ranksPerNode\" must be an integer in [1, 65536], not -1"},
      {"{\"nodes\": 2, \"ranksPerNode\": \"4\"}", "\"ranksPerNode\" must be an integer in [1, 65536], not a string"},
      {"{\"nodes\": 2, \"ranksPerNode\": 4, \"nics\": {}}", "\"nics\" of node 0 must be an array of NIC objects, not an object"},
      {"{\"nodes\": 2, \"ranksPerNode\": 4, \"nics\": [\"eth0\"]}", "NIC 0 of node 0 must be an object with \"name\" and \"bandwidth\", not a string"},
      {top(", \"version\": 2"), "\"version\" must be 1"},
      {top(", \"nic\": []"), "unknown key \"nic\" in the top level (known keys: version, comment, nodes,"},
      {top(", \"comment\": 5"), "\"comment\" must be a string or an array of strings"},
      {top(", \"comment\": [\"a\", 1]"), "\"comment\" must be a string or an array of strings"},
      {top(", \"numaNodes\": 0"), "\"numaNodes\" of node 0 must be an integer in [1, 1024], not 0"},
      {top(", \"gpus\": -1"), "\"gpus\" of node 0 must be an integer in [0, 1024], not -1"},
      {top(", \"gpus\": true"), "\"gpus\" of node 0 must be an integer in [0, 1024], not a boolean"},
      {withNic("{\"bandwidth\": 1}"), "NIC 0 of node 0 has no \"name\""},
      {withNic("{\"name\": \"\", \"bandwidth\": 1}"), "\"name\" of NIC 0 of node 0 must be a non-empty string"},
      {withNic("{\"name\": 3, \"bandwidth\": 1}"), "\"name\" of NIC 0 of node 0 must be a non-empty string"},
      {withNic("{\"name\": \"e\"}"), "NIC 'e' of node 0 has no \"bandwidth\""},
      {withNic("{\"name\": \"e\", \"bandwidth\": \"fast\"}"), "\"bandwidth\" of NIC 'e' is \"fast\": expected a positive rate"},
      {withNic("{\"name\": \"e\", \"bandwidth\": \"0gbit\"}"), "\"bandwidth\" of NIC 'e' is \"0gbit\""},
      {withNic("{\"name\": \"e\", \"bandwidth\": -5}"), "\"bandwidth\" of NIC 'e' must be positive, not -5"},
      {withNic("{\"name\": \"e\", \"bandwidth\": 0}"), "\"bandwidth\" of NIC 'e' must be positive, not 0"},
      {withNic("{\"name\": \"e\", \"bandwidth\": true}"), "\"bandwidth\" of NIC 'e' must be a number, a string or null, not a boolean"},
      {withNic("{\"name\": \"e\", \"bandwidth\": 1, \"numa\": 1}"), "\"numa\" of NIC 'e' of node 0 must be an integer in [-1, 0], not 1"},
      {withNic("{\"name\": \"e\", \"bandwidth\": 1, \"numa\": \"0\"}"), "must be an integer in [-1, 0], not a string"},
      {withNic("{\"name\": \"e\", \"bandwidth\": 1, \"pci\": \"17:00.0\"}"), "\"pci\" of NIC 'e' must be a PCI bus id"},
      {withNic("{\"name\": \"e\", \"bandwidth\": 1, \"speed\": 1}"), "unknown key \"speed\" in NIC 0 of node 0"},
      {withNic("{\"name\": \"e\", \"bandwidth\": 1}, {\"name\": \"e\", \"bandwidth\": 2}"), "node 0 has two NICs named 'e'"},
      {"{\"nodes\": [], \"ranksPerNode\": 1}", "\"nodes\" is empty"},
      {"{\"nodes\": [5], \"ranksPerNode\": 1}", "at /nodes/0: each element of \"nodes\" must be a node object, not a number"},
      {"{\"nodes\": [{\"name\": \"\"}], \"ranksPerNode\": 1}", "\"name\" of node 0 must be a non-empty string"},
      {"{\"nodes\": [{\"nmae\": \"x\"}], \"ranksPerNode\": 1}", "unknown key \"nmae\" in node 0 (known keys: comment, name, ranks,"},
      {"{\"nodes\": [{\"ranks\": 0}], " + nics + "}", "\"ranks\" of node 0 must be an integer in [1, 65536], not 0"},
      {"{\"nodes\": [{\"ranks\": \"2\"}], " + nics + "}", "\"ranks\" of node 0 must be an integer in [1, 65536], not a string"},
      {"{\"nodes\": [{\"ranks\": []}], " + nics + "}", "\"ranks\" of node 0 is empty"},
      {"{\"nodes\": [{\"ranks\": [0, 1]}, {\"ranks\": [1, 2]}], " + nics + "}", "rank 1 appears twice (also in node 0)"},
      {"{\"nodes\": [{\"ranks\": [0, 1]}, {\"ranks\": [2, 7]}], " + nics + "}", "rank 7 in node 1 is out of range: the cluster has 4 ranks (0..3)"},
      {"{\"nodes\": [{\"ranks\": [0, -1]}], " + nics + "}", "a rank in \"ranks\" of node 0 must be an integer in [0, 4194303], not -1"},
      {"{\"nodes\": [{\"ranks\": [0, 1]}, {\"ranks\": 2}], " + nics + "}", "node 1 gives its ranks as a count but node 0 as a list"},
      {"{\"nodes\": [{\"ranks\": 2}, {\"name\": \"b\", \"ranks\": [2, 3]}], " + nics + "}", "node 1 ('b') gives its ranks as a list but node 0 as a count"},
  });
}

TEST(TopoSchema, AffinityErrors) {
  auto file = [](const std::string& affinity) {
    return std::string("{\"nodes\": [{\"name\": \"n0\", \"affinity\": ") + affinity +
           "}], \"ranksPerNode\": 2, " + kTwoNics + "}";
  };
  expectAllFail({
      {file("[\"zpnic0\", \"zpnic9\"]"),
       "at /nodes/0/affinity/1: unknown NIC 'zpnic9' in \"affinity\" of node 0 ('n0') (its NICs: zpnic0, zpnic1)"},
      {file("[0, 2]"), "a NIC index in \"affinity\" of node 0 ('n0') must be an integer in [0, 1], not 2"},
      {file("[0, -1]"), "must be an integer in [0, 1], not -1"},
      {file("[0]"), "\"affinity\" of node 0 ('n0') has 1 entries for 2 ranks"},
      {file("[0, 1, 1]"), "has 3 entries for 2 ranks"},
      {file("[0, true]"), "each entry of \"affinity\" must be a NIC name or index, not a boolean"},
      {file("\"zpnic0\""), "\"affinity\" of node 0 ('n0') must be an array of NIC names or indexes, not a string"},
      {"{\"nodes\": 1, \"ranksPerNode\": 1, \"nics\": [], \"affinity\": [0]}", "names a NIC, but the node has none"},
      {"{\"nodes\": 1, \"ranksPerNode\": 1, \"nics\": [], \"affinity\": [\"x\"]}", "unknown NIC 'x' in \"affinity\" of node 0 (its NICs: none)"},
  });
  // A top-level affinity applies to every node, checked against each node's NICs.
  std::string msg = parseError(std::string("{\"ranksPerNode\": 1, \"affinity\": [\"zpnic1\"], ") + kTwoNics +
                               ", \"nodes\": [{}, {\"nics\": [{\"name\": \"other\", \"bandwidth\": 1}]}]}");
  EXPECT_TRUE(contains(msg, "unknown NIC 'zpnic1' in \"affinity\" of node 1 (its NICs: other)")) << msg;
}

TEST(TopoFile, UnreadableFiles) {
  ClusterTopology t;
  t.rankNode = {42};
  EXPECT_EQ(zp::loadTopoFile("/nonexistent/topo.json", &t), zpInvalidArgument);
  EXPECT_TRUE(contains(zp::lastError(), "topology file '/nonexistent/topo.json': cannot open it")) << zp::lastError();
  EXPECT_EQ(zp::loadTopoFile("/tmp", &t), zpInvalidArgument);
  EXPECT_TRUE(contains(zp::lastError(), "is a directory")) << zp::lastError();
  EXPECT_EQ(zp::loadTopoFile("", &t), zpInvalidArgument);
  EXPECT_EQ(zp::loadTopoFile("x", nullptr), zpInvalidArgument);
  TempFile bad("{\n  \"nodes\": 2,\n  \"ranksPerNode\": 4,\n  \"nics\": [{\"name\": \"e\", \"bandwidth\": \"1 gbit\"}]\n}\n");
  EXPECT_EQ(zp::loadTopoFile(bad.path(), &t), zpInvalidArgument);
  EXPECT_TRUE(contains(zp::lastError(), bad.path() + ": at /nics/0/bandwidth: \"bandwidth\" of NIC 'e' is \"1 gbit\""))
      << zp::lastError();
  EXPECT_EQ(t.rankNode, std::vector<int>{42});  // untouched on error
}

// Every prefix of a good file, and every one-byte change of it, either loads
// or fails with zpInvalidArgument and a located message: never a crash. Runs
// in a child whose stderr is /dev/null: each rejection logs a warning.
TEST(TopoJson, TruncatedAndMutatedFilesNeverCrash) {
  std::ifstream in(dataDir() + "/topo_2x4x4.json");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string good = ss.str();
  ASSERT_GT(good.size(), 100u);
  std::string got = inChild(
      [&] {
        size_t ok = 0, bad = 0;
        std::string problem;
        auto check = [&](const std::string& text) {
          ClusterTopology t;
          zpResult_t r = zp::parseTopo(text, "m.json", &t);
          if (r == zpSuccess) {
            ok++;
          } else if (r != zpInvalidArgument || (std::string(zp::lastError()).compare(0, 12, "m.json: line") != 0 &&
                                                std::string(zp::lastError()).compare(0, 11, "m.json: at ") != 0)) {
            if (problem.empty()) problem = "result " + std::to_string(r) + ", '" + zp::lastError() + "' for:\n" + text;
          } else {
            bad++;
          }
        };
        for (size_t n = 0; n < good.size(); n++) check(good.substr(0, n));
        const char kBytes[] = {'{', '}', '[', ']', '"', ',', ':', '0', '-', 'x', ' ', '\\', '\0', '\n', (char)0xff, (char)0xc3};
        for (size_t i = 0; i < good.size(); i++) {
          for (char c : kBytes) {
            std::string m = good;
            m[i] = c;
            check(m);
          }
        }
        return problem.empty() ? std::to_string(ok) + " " + std::to_string(bad) : "FAIL " + problem;
      },
      /*quiet=*/true);
  ASSERT_NE(got.compare(0, 5, "CRASH"), 0) << got;
  ASSERT_NE(got.compare(0, 4, "FAIL"), 0) << got;
  size_t ok = 0, bad = 0;
  ASSERT_EQ(sscanf(got.c_str(), "%zu %zu", &ok, &bad), 2) << got;
  EXPECT_GT(bad, good.size());  // every prefix but none is bad, and more
  EXPECT_GT(ok, 0u);            // e.g. changes inside comments
}

// ---- Affinity ----

TEST(Affinity, SpreadsRanksEvenlyOverEquallyCloseNics) {
  for (int K = 1; K <= 8; K++) {
    NodeTopology node = makeNode(K);
    for (int R = 1; R <= 8; R++) {
      std::vector<int> count((size_t)K, 0);
      std::vector<int> all = zp::pickNics(node, R, "");
      ASSERT_EQ(all.size(), (size_t)R);
      for (int i = 0; i < R; i++) {
        std::string why = "unset";
        int nic = zp::pickNic(node, i, R, "", &why);
        EXPECT_EQ(nic, i % K) << "rank " << i << " of " << R << " over " << K << " NICs";
        EXPECT_EQ(why, "");
        EXPECT_EQ(all[(size_t)i], nic);
        count[(size_t)nic]++;
      }
      for (int k = 0; k < K; k++) {
        int want = k < R ? 1 : 0;
        if (R >= K) want = R / K + (k < R % K ? 1 : 0);
        EXPECT_EQ(count[(size_t)k], want) << "NIC " << k << ", R=" << R << " K=" << K;
        EXPECT_LE(count[(size_t)k], (R + K - 1) / K);
        EXPECT_GE(count[(size_t)k], R / K);
      }
    }
  }
}

TEST(Affinity, PrefersNicsOfTheRanksNumaNode) {
  // 2 NUMA nodes, NICs 0 and 1 on node 0, 2 and 3 on node 1: ranks 0-3 sit on
  // NUMA node 0, 4-7 on 1, and share their node's NICs round robin.
  NodeTopology node = makeNode(4, 2, {0, 0, 1, 1});
  EXPECT_EQ(zp::pickNics(node, 8, ""), (std::vector<int>{0, 1, 0, 1, 2, 3, 2, 3}));
  EXPECT_EQ(zp::pickNics(node, 2, ""), (std::vector<int>{0, 2}));
  EXPECT_EQ(zp::pickNics(node, 3, ""), (std::vector<int>{0, 1, 2}));
  // NICs listed in another order: still by NUMA node.
  NodeTopology mixed = makeNode(4, 2, {1, 0, 1, 0});
  EXPECT_EQ(zp::pickNics(mixed, 4, ""), (std::vector<int>{1, 3, 0, 2}));
  // All NICs on NUMA node 0: ranks of both nodes share all of them evenly.
  NodeTopology lopsided = makeNode(2, 2, {0, 0});
  EXPECT_EQ(zp::pickNics(lopsided, 4, ""), (std::vector<int>{0, 1, 0, 1}));
  // A NIC of unknown NUMA node counts as close to every rank.
  NodeTopology unknown = makeNode(3, 2, {0, -1, 1});
  EXPECT_EQ(zp::pickNics(unknown, 4, ""), (std::vector<int>{0, 1, 1, 2}));
}

TEST(Affinity, PrefersNicsFewPciHopsFromTheRanksGpu) {
  // 4 GPUs, 2 NICs: GPUs 0 and 1 share a PCIe switch with NIC 1, GPUs 2 and 3
  // with NIC 0.
  NodeTopology node = makeNode(2);
  for (int g = 0; g < 4; g++) {
    zp::Gpu gpu;
    gpu.numa = 0;
    gpu.nicHops = g < 2 ? std::vector<int>{6, 2} : std::vector<int>{2, 6};
    node.gpus.push_back(gpu);
  }
  EXPECT_EQ(zp::pickNics(node, 4, ""), (std::vector<int>{1, 1, 0, 0}));
  EXPECT_EQ(zp::pickNics(node, 8, ""), (std::vector<int>{1, 1, 0, 0, 1, 1, 0, 0}));
  // Hops unknown (e.g. veths): all equally close.
  for (auto& g : node.gpus) g.nicHops.clear();
  EXPECT_EQ(zp::pickNics(node, 4, ""), (std::vector<int>{0, 1, 0, 1}));
  // NUMA decides before hops.
  node = makeNode(2, 2, {1, 0});
  for (int g = 0; g < 2; g++) {
    zp::Gpu gpu;
    gpu.numa = g;
    gpu.nicHops = {1, 9};
    node.gpus.push_back(gpu);
  }
  EXPECT_EQ(zp::pickNics(node, 2, ""), (std::vector<int>{1, 0}));
}

TEST(Affinity, NetDevicesRestrictsTheCandidatesInItsOrder) {
  NodeTopology node = makeNode(4);
  EXPECT_EQ(zp::pickNics(node, 4, "zpnic2,zpnic0"), (std::vector<int>{2, 0, 2, 0}));
  EXPECT_EQ(zp::pickNics(node, 3, " zpnic3 , ,zpnic1,zpnic3,"), (std::vector<int>{3, 1, 3}));
  // One device: every rank uses it.
  for (int R = 1; R <= 8; R++)
    for (int i = 0; i < R; i++) EXPECT_EQ(zp::pickNic(node, i, R, "zpnic1"), 1);
  std::string why;
  EXPECT_EQ(zp::pickNic(node, 0, 2, "zpnic0,eth9", &why), -1);
  EXPECT_EQ(why, "ZP_NET_DEVICES names 'eth9', which is not a NIC of this node (its NICs: zpnic0, zpnic1, zpnic2, zpnic3)");
  EXPECT_TRUE(zp::pickNics(node, 2, "eth9", &why).empty());
  EXPECT_EQ(zp::pickNic(node, 0, 2, ",", &why), -1);
  EXPECT_TRUE(contains(why, "names no NIC")) << why;
  // Restricted, then the closest: NUMA node 1's ranks get zpnic3, node 0's zpnic0.
  NodeTopology numa = makeNode(4, 2, {0, 0, 1, 1});
  EXPECT_EQ(zp::pickNics(numa, 4, "zpnic3,zpnic0"), (std::vector<int>{0, 0, 3, 3}));
}

TEST(Affinity, NoNicOrBadRanks) {
  std::string why;
  EXPECT_EQ(zp::pickNic(makeNode(0), 0, 1, "", &why), -1);
  EXPECT_EQ(why, "the node has no NICs");
  EXPECT_EQ(zp::pickNic(makeNode(2), 2, 2, "", &why), -1);
  EXPECT_TRUE(contains(why, "out of range")) << why;
  EXPECT_EQ(zp::pickNic(makeNode(2), -1, 2, "", &why), -1);
  EXPECT_EQ(zp::pickNic(makeNode(2), 0, 0, "", &why), -1);
  EXPECT_TRUE(zp::pickNics(makeNode(2), 0, "", &why).empty());
}

// ---- Discovery ----

// This machine's interfaces as the kernel reports them (if_nameindex and
// SIOCGIFFLAGS, not /sys): up, not the loopback; physical if sysfs shows a
// device behind them.
std::set<std::string> expectedNics() {
  std::set<std::string> phys, virt;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);  // for ioctl only; never used to send
  EXPECT_GE(fd, 0);
  struct if_nameindex* list = if_nameindex();
  EXPECT_NE(list, nullptr);
  for (struct if_nameindex* i = list; i && i->if_index; i++) {
    struct ifreq req;
    memset(&req, 0, sizeof(req));
    snprintf(req.ifr_name, sizeof(req.ifr_name), "%s", i->if_name);
    if (ioctl(fd, SIOCGIFFLAGS, &req) != 0) continue;
    if ((req.ifr_flags & IFF_LOOPBACK) || !(req.ifr_flags & IFF_UP)) continue;
    struct stat st;
    bool physical = stat(("/sys/class/net/" + std::string(i->if_name) + "/device").c_str(), &st) == 0;
    (physical ? phys : virt).insert(i->if_name);
  }
  if (list) {
    if_freenameindex(list);
  }
  close(fd);
  return phys.empty() ? virt : phys;
}

TEST(Discovery, FindsThisMachinesInterfaces) {
  ScopedEnv rate("ZP_NIC_RATE_BPS", nullptr);
  NodeTopology node;
  ASSERT_EQ(zp::discoverNode(&node), zpSuccess) << zp::lastError();
  std::set<std::string> found;
  for (const Nic& n : node.nics) {
    EXPECT_TRUE(found.insert(n.name).second) << "twice: " << n.name;
    EXPECT_NE(n.name, "lo");
    EXPECT_GE(n.bitsPerSec, 0);
    EXPECT_GE(n.numa, -1);
    EXPECT_LT(n.numa, node.numaNodes);
    EXPECT_TRUE(n.pciBusId.empty() || n.pciBusId.size() >= 12) << n.pciBusId;
  }
  EXPECT_EQ(found, expectedNics());
  EXPECT_GE(node.numaNodes, 1);
  EXPECT_FALSE(node.name.empty());
  for (const zp::Gpu& g : node.gpus) EXPECT_EQ(g.nicHops.size(), node.nics.size());
  std::string text = zp::describe(node);
  for (const Nic& n : node.nics) EXPECT_TRUE(contains(text, n.name)) << text;
  // Whatever was found is a valid node of a topology file.
  ClusterTopology t;
  ASSERT_EQ(parseError("{\"nodes\": [" + zp::toJson(node, 2, zp::pickNics(node, 2, "")) + "]}", &t), "")
      << zp::toJson(node);
  ASSERT_EQ(t.node[0].nics.size(), node.nics.size());
  for (size_t k = 0; k < node.nics.size(); k++) {
    EXPECT_EQ(t.node[0].nics[k].name, node.nics[k].name);
    EXPECT_EQ(t.node[0].nics[k].bitsPerSec, node.nics[k].bitsPerSec);
    EXPECT_EQ(t.node[0].nics[k].numa, node.nics[k].numa);
    EXPECT_EQ(t.node[0].nics[k].pciBusId, node.nics[k].pciBusId);
  }
  if (!node.nics.empty()) {
    EXPECT_EQ(t.rankNic[0], zp::pickNic(node, 0, 2, ""));
  }
}

TEST(Discovery, NicRateOverride) {
  NodeTopology plain;
  {
    ScopedEnv rate("ZP_NIC_RATE_BPS", nullptr);
    ASSERT_EQ(zp::discoverNode(&plain), zpSuccess);
  }
  {
    ScopedEnv rate("ZP_NIC_RATE_BPS", "0");  // zprun: not limited
    NodeTopology n;
    ASSERT_EQ(zp::discoverNode(&n), zpSuccess);
    EXPECT_EQ(n.nics, plain.nics);
  }
  {
    ScopedEnv rate("ZP_NIC_RATE_BPS", "123456789");
    NodeTopology n;
    ASSERT_EQ(zp::discoverNode(&n), zpSuccess);
    ASSERT_EQ(n.nics.size(), plain.nics.size());
    for (size_t k = 0; k < n.nics.size(); k++) {
      double want = plain.nics[k].bitsPerSec > 0 ? std::min(plain.nics[k].bitsPerSec, 123456789.0) : 123456789.0;
      EXPECT_EQ(n.nics[k].bitsPerSec, want) << n.nics[k].name;
    }
  }
  {
    ScopedEnv rate("ZP_NIC_RATE_BPS", "fast");
    NodeTopology n;
    n.name = "untouched";
    EXPECT_EQ(zp::discoverNode(&n), zpInvalidArgument);
    EXPECT_TRUE(contains(zp::lastError(), "ZP_NIC_RATE_BPS='fast' is not a rate")) << zp::lastError();
    EXPECT_EQ(n.name, "untouched");
  }
  EXPECT_EQ(zp::discoverNode(nullptr), zpInvalidArgument);
}

// In a child: moves into a private network namespace with its own sysfs (as
// `ip netns exec` does), adds veth pairs (name, peer) and brings up the
// named ends. Returns "" or why it could not ("SKIP ...": no privileges or
// no ip tool). The namespace, and its veths, vanish with the child.
std::string enterPrivateNode(const std::vector<std::pair<std::string, std::string>>& veths,
                             const std::vector<std::string>& up) {
  const std::string ip = findIp();
  if (ip.empty()) return "SKIP no ip tool";
  if (unshare(CLONE_NEWNET | CLONE_NEWNS) != 0) return "SKIP unshare: " + std::string(strerror(errno));
  if (mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0 || umount2("/sys", MNT_DETACH) != 0 ||
      mount("sysfs", "/sys", "sysfs", 0, nullptr) != 0)
    return "SKIP mount sysfs: " + std::string(strerror(errno));
  // No IPv6 chatter between the veth ends (they only reach each other anyway).
  int fd = open("/proc/sys/net/ipv6/conf/default/disable_ipv6", O_WRONLY);
  if (fd >= 0) {
    (void)!write(fd, "1", 1);
    close(fd);
  }
  for (const auto& v : veths)
    if (run({ip, "link", "add", v.first, "type", "veth", "peer", "name", v.second}) != 0)
      return "SKIP ip link add " + v.first + " failed";
  for (const std::string& name : up)
    if (run({ip, "link", "set", name, "up"}) != 0) return "SKIP ip link set " + name + " up failed";
  return "";
}

// An emulated node: its only NICs are veths. Discovery must find them although
// they are virtual. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and the ip
// tool; skips otherwise.
TEST(Discovery, FindsVirtualNicsWhenThereIsNoPhysicalOne) {
  std::string got = inChild([] {
    std::string why = enterPrivateNode({{"zpnic0", "zpnic10"}, {"zpnic2", "zpdown"}},
                                       {"zpnic0", "zpnic10", "zpnic2", "lo"});
    if (!why.empty()) return why;
    setenv("ZP_NIC_RATE_BPS", "250mbit", 1);
    NodeTopology node;
    if (zp::discoverNode(&node) != zpSuccess) return std::string("FAIL ") + zp::lastError();
    std::string out;
    for (const Nic& n : node.nics)
      out += n.name + " " + std::to_string((long long)n.bitsPerSec) + (n.isVirtual ? " virtual" : " physical") +
             (n.pciBusId.empty() ? "" : " pci") + "\n";
    for (int p : zp::pickNics(node, 4, "")) out += "pick " + std::to_string(p) + "\n";
    return out;
  });
  if (got.compare(0, 4, "SKIP") == 0) GTEST_SKIP() << got;
  // Sorted by name with numbers compared as numbers; zpdown is down; lo is
  // the loopback; veths report 10 Gbit/s, capped by ZP_NIC_RATE_BPS.
  EXPECT_EQ(got,
            "zpnic0 250000000 virtual\n"
            "zpnic2 250000000 virtual\n"
            "zpnic10 250000000 virtual\n"
            "pick 0\npick 1\npick 2\npick 0\n");
}

// A GPU server as hwloc would see it, in hwloc's XML: 2 packages, each with a
// NUMA node and a host bridge holding two PCIe switches; switch s of package p
// holds GPU 2p+s and NIC zpnic<(2p+s+1) % 4>.
std::string gpuServerXml() {
  std::string x =
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
      "<topology version=\"2.0\">\n"
      "<object type=\"Machine\" os_index=\"0\" cpuset=\"0x3\" complete_cpuset=\"0x3\" nodeset=\"0x3\" "
      "complete_nodeset=\"0x3\" gp_index=\"1\">\n";
  int gp = 2;
  char buf[2048];
  for (int p = 0; p < 2; p++) {
    const char* set = p ? "0x2" : "0x1";
    int bus = 0x10 + 0x10 * p;
    snprintf(buf, sizeof(buf),
             "<object type=\"Package\" os_index=\"%d\" cpuset=\"%s\" complete_cpuset=\"%s\" nodeset=\"%s\" "
             "complete_nodeset=\"%s\" gp_index=\"%d\">\n"
             "<object type=\"NUMANode\" os_index=\"%d\" cpuset=\"%s\" complete_cpuset=\"%s\" nodeset=\"%s\" "
             "complete_nodeset=\"%s\" gp_index=\"%d\" local_memory=\"1073741824\"/>\n"
             "<object type=\"PU\" os_index=\"%d\" cpuset=\"%s\" complete_cpuset=\"%s\" nodeset=\"%s\" "
             "complete_nodeset=\"%s\" gp_index=\"%d\"/>\n"
             "<object type=\"Bridge\" gp_index=\"%d\" bridge_type=\"0-1\" depth=\"0\" bridge_pci=\"0000:[%02x-%02x]\">\n",
             p, set, set, set, set, gp, p, set, set, set, set, gp + 1, p, set, set, set, set, gp + 2, gp + 3, bus,
             bus + 2);
    x += buf;
    gp += 4;
    for (int s = 0; s < 2; s++) {
      int sub = bus + 1 + s;
      snprintf(buf, sizeof(buf),
               "<object type=\"Bridge\" gp_index=\"%d\" pci_busid=\"0000:%02x:%02x.0\" "
               "pci_type=\"0604 [10b5:9797] [0000:0000] 01\" bridge_type=\"1-1\" depth=\"1\" "
               "bridge_pci=\"0000:[%02x-%02x]\">\n"
               "<object type=\"PCIDev\" gp_index=\"%d\" pci_busid=\"0000:%02x:00.0\" "
               "pci_type=\"0302 [10de:20b0] [10de:1450] a1\"/>\n"
               "<object type=\"PCIDev\" gp_index=\"%d\" pci_busid=\"0000:%02x:01.0\" "
               "pci_type=\"0200 [15b3:101b] [15b3:0007] 00\">\n"
               "<object type=\"OSDev\" gp_index=\"%d\" name=\"zpnic%d\" osdev_type=\"2\"/>\n"
               "</object>\n</object>\n",
               gp, bus, s, sub, sub, gp + 1, sub, gp + 2, sub, gp + 3, (2 * p + s + 1) % 4);
      x += buf;
      gp += 4;
    }
    x += "</object>\n</object>\n";
  }
  return x + "</object>\n</topology>\n";
}

// Discovery's hwloc side on a machine with GPUs and NICs on PCIe switches
// (an XML topology in HWLOC_XMLFILE stands in for the hardware; the NICs'
// names are veths of a private namespace): PCI bus ids, NUMA nodes, GPUs, the
// hops between them, and the affinity they give.
TEST(Discovery, GpusNicsNumaAndPciHopsFromHwloc) {
  TempFile xml(gpuServerXml());
  std::string path = xml.path();
  std::string got = inChild([&] {
    std::string why = enterPrivateNode({{"zpnic0", "peer0"}, {"zpnic1", "peer1"}, {"zpnic2", "peer2"}, {"zpnic3", "peer3"}},
                                       {"zpnic0", "zpnic1", "zpnic2", "zpnic3"});
    if (!why.empty()) return why;
    setenv("HWLOC_XMLFILE", path.c_str(), 1);
    unsetenv("ZP_NIC_RATE_BPS");
    NodeTopology node;
    if (zp::discoverNode(&node) != zpSuccess) return std::string("FAIL ") + zp::lastError();
    std::string out = "numa " + std::to_string(node.numaNodes) + "\n";
    for (const Nic& n : node.nics) out += n.name + " numa " + std::to_string(n.numa) + " pci " + n.pciBusId + "\n";
    for (const zp::Gpu& g : node.gpus) {
      out += "gpu " + g.pciBusId + " numa " + std::to_string(g.numa) + " hops";
      for (int h : g.nicHops) out += " " + std::to_string(h);
      out += " nearest " + std::to_string(g.nic) + "\n";
    }
    for (int R : {4, 8, 2}) {
      out += "R=" + std::to_string(R) + ":";
      for (int p : zp::pickNics(node, R, "")) out += " " + std::to_string(p);
      out += "\n";
    }
    out += "only zpnic0,zpnic3:";
    for (int p : zp::pickNics(node, 4, "zpnic0,zpnic3")) out += " " + std::to_string(p);
    return out + "\n";
  });
  if (got.compare(0, 4, "SKIP") == 0) GTEST_SKIP() << got;
  EXPECT_EQ(got,
            "numa 2\n"
            "zpnic0 numa 1 pci 0000:22:01.0\n"
            "zpnic1 numa 0 pci 0000:11:01.0\n"
            "zpnic2 numa 0 pci 0000:12:01.0\n"
            "zpnic3 numa 1 pci 0000:21:01.0\n"
            // Same switch: GPU, switch, NIC = 2 hops; same host bridge: 4;
            // the other package: up to the machine and down again = 8.
            // The nearest NIC: on the GPU's NUMA node, fewest hops.
            "gpu 0000:11:00.0 numa 0 hops 8 2 4 8 nearest 1\n"
            "gpu 0000:12:00.0 numa 0 hops 8 4 2 8 nearest 2\n"
            "gpu 0000:21:00.0 numa 1 hops 4 8 8 2 nearest 3\n"
            "gpu 0000:22:00.0 numa 1 hops 2 8 8 4 nearest 0\n"
            // Rank i drives GPU i % 4 and takes the NIC on its switch.
            "R=4: 1 2 3 0\n"
            "R=8: 1 2 3 0 1 2 3 0\n"
            "R=2: 1 2\n"
            // Restricted: both candidates are on NUMA node 1, 8 hops from
            // GPUs 0 and 1, which share them; GPUs 2 and 3 take the one on
            // their switch.
            "only zpnic0,zpnic3: 0 3 3 0\n");
}

// ---- A GPU node from sysfs alone (tests/data/sysfs_gpu_node, README there) ----

std::string sysfsFixture() { return dataDir() + "/sysfs_gpu_node"; }

TEST(IbRate, ParsesTheKernelsRateFiles) {
  double b = 0;
  EXPECT_TRUE(zp::parseIbRate("200 Gb/sec (4X HDR)\n", &b));
  EXPECT_EQ(b, 200e9);
  EXPECT_TRUE(zp::parseIbRate("2.5 Gb/sec (1X SDR)", &b));
  EXPECT_EQ(b, 2.5e9);
  EXPECT_TRUE(zp::parseIbRate("100 Gb/sec", &b));
  EXPECT_EQ(b, 100e9);
  for (const char* bad : {"", "\n", "fast", "200", "200 Gb/s", "200Gb/sec", "200 Mb/sec (4X)", "-5 Gb/sec",
                          "0 Gb/sec (4X HDR)", "nan Gb/sec", "inf Gb/sec", "1e400 Gb/sec", "0x10 Gb/sec",
                          "200 Gb/sec (4X HDR", "200 Gb/sec junk", " Gb/sec", "2 00 Gb/sec"}) {
    b = -1;
    EXPECT_FALSE(zp::parseIbRate(bad, &b)) << "'" << bad << "'";
    EXPECT_EQ(b, -1) << "'" << bad << "'";
  }
}

// Discovery with ZP_SYSFS_ROOT: NICs with their HCA ports' rates (a
// malformed rate file ignored), GPUs from the PCI classes with their NUMA
// nodes, hops and nearest NIC, and ranks on GPUs taking those NICs.
TEST(Discovery, GpuNodeFromSysfs) {
  const std::string root = sysfsFixture();
  ScopedEnv sys("ZP_SYSFS_ROOT", root.c_str()), rate("ZP_NIC_RATE_BPS", nullptr);
  NodeTopology node;
  ASSERT_EQ(zp::discoverNode(&node), zpSuccess) << zp::lastError();
  EXPECT_EQ(node.numaNodes, 2);
  ASSERT_EQ(node.nics.size(), 4u) << zp::describe(node);
  auto nic = [&](size_t k) {
    const Nic& n = node.nics[k];
    return n.name + " " + zp::formatBitsPerSec(n.bitsPerSec) + " numa " + std::to_string(n.numa) + " pci " +
           n.pciBusId + " hca " + n.hca;
  };
  EXPECT_EQ(nic(0), "eth0 1 Gbit/s numa 0 pci 0000:00:1f.6 hca ");
  EXPECT_EQ(nic(1), "ib0 200 Gbit/s numa 0 pci 0000:01:00.1 hca mlx5_0:1");
  EXPECT_EQ(nic(2), "ib1 400 Gbit/s numa 1 pci 0000:81:00.1 hca mlx5_1:1");
  // mlx5_2's rate file says "fast": ignored, the interface's own speed stays.
  EXPECT_EQ(nic(3), "ib2 100 Gbit/s numa 1 pci 0000:82:00.0 hca mlx5_2:1");
  ASSERT_EQ(node.gpus.size(), 2u) << zp::describe(node);
  EXPECT_EQ(node.gpus[0].pciBusId, "0000:01:00.0");
  EXPECT_EQ(node.gpus[0].numa, 0);
  // Same bridge: 2 hops; eth0 on the same root complex: 3; the other root
  // complex: up to devices/ and down again.
  EXPECT_EQ(node.gpus[0].nicHops, (std::vector<int>{3, 2, 6, 6}));
  EXPECT_EQ(node.gpus[0].nic, 1);
  EXPECT_EQ(node.gpus[1].pciBusId, "0000:81:00.0");
  EXPECT_EQ(node.gpus[1].numa, 1);
  EXPECT_EQ(node.gpus[1].nicHops, (std::vector<int>{5, 6, 2, 4}));
  EXPECT_EQ(node.gpus[1].nic, 2);
  // Rank i drives GPU i % 2 and takes its nearest NIC.
  EXPECT_EQ(zp::pickNics(node, 4, ""), (std::vector<int>{1, 2, 1, 2}));
  std::string text = zp::describe(node);
  EXPECT_TRUE(contains(text, "hca mlx5_1:1")) << text;
  EXPECT_TRUE(contains(text, "gpu 1: pci 0000:81:00.0  numa 1  nearest NIC ib1")) << text;
  // The topology file carries the GPUs (bus id, NUMA node, nearest NIC) and
  // the HCAs; without "affinity" its rule gives the same NICs.
  ClusterTopology t;
  ASSERT_EQ(parseError("{\"nodes\": [" + zp::toJson(node, 4) + "]}", &t), "") << zp::toJson(node, 4);
  ASSERT_EQ(t.node[0].gpus.size(), 2u);
  EXPECT_EQ(t.node[0].gpus[1].pciBusId, "0000:81:00.0");
  EXPECT_EQ(t.node[0].gpus[1].numa, 1);
  EXPECT_EQ(t.node[0].gpus[1].nic, 2);
  EXPECT_EQ(t.node[0].nics[2].hca, "mlx5_1:1");
  EXPECT_EQ(t.rankNic, (std::vector<int>{1, 2, 1, 2}));
  // And writes them back the same.
  ClusterTopology again;
  ASSERT_EQ(parseError(zp::toJson(t), &again), "") << zp::toJson(t);
  EXPECT_EQ(again, t);
}

// A rate file that is missing, empty, garbage, huge or a directory: ignored
// (the interface's speed, here unknown), never a failure or a crash.
TEST(Discovery, MalformedRateFilesAreIgnored) {
  zptest::TempDir dir("zp_sysfs");
  const std::string copy = dir.path() + "/sys";
  ASSERT_EQ(std::system(("cp -a '" + sysfsFixture() + "' '" + copy + "'").c_str()), 0);
  const std::string rateFile = copy + "/class/infiniband/mlx5_0/ports/1/rate";
  const std::vector<std::string> contents = {"", "\n", "garbage", "-200 Gb/sec (4X HDR)", "200 Mb/sec",
                                             std::string(100000, '9') + " Gb/sec", std::string("\0\xff\x01", 3)};
  ScopedEnv sys("ZP_SYSFS_ROOT", copy.c_str()), rate("ZP_NIC_RATE_BPS", nullptr);
  auto ib0 = [&]() -> std::string {
    NodeTopology node;
    if (zp::discoverNode(&node) != zpSuccess) return std::string("FAIL ") + zp::lastError();
    for (const Nic& n : node.nics)
      if (n.name == "ib0") return zp::formatBitsPerSec(n.bitsPerSec) + " " + n.hca;
    return "no ib0";
  };
  for (const std::string& c : contents) {
    std::ofstream(rateFile, std::ios::binary | std::ios::trunc) << c;
    EXPECT_EQ(ib0(), "unknown mlx5_0:1") << "'" << c.substr(0, 40) << "'";
  }
  ASSERT_EQ(unlink(rateFile.c_str()), 0);
  EXPECT_EQ(ib0(), "unknown mlx5_0:1") << "no rate file";
  ASSERT_EQ(mkdir(rateFile.c_str(), 0755), 0);
  EXPECT_EQ(ib0(), "unknown mlx5_0:1") << "a directory";
  // The right text again: the rate is back.
  ASSERT_EQ(rmdir(rateFile.c_str()), 0);
  std::ofstream(rateFile) << "200 Gb/sec (4X HDR)\n";
  EXPECT_EQ(ib0(), "200 Gbit/s mlx5_0:1");
}

TEST(TopoSchema, GpuObjects) {
  const std::string nics = "\"nics\": [{\"name\": \"a\", \"bandwidth\": 1e9}, {\"name\": \"b\", \"bandwidth\": 1e9}]";
  ClusterTopology t;
  // GPU 0 near b, GPU 1 near a: ranks follow their GPUs.
  ASSERT_EQ(parseError("{\"nodes\": 1, \"ranksPerNode\": 4, \"numaNodes\": 2, " + nics +
                           ", \"gpus\": [{\"pci\": \"0000:17:00.0\", \"numa\": 1, \"nic\": \"b\"}, {\"nic\": 0}]}",
                       &t),
            "");
  ASSERT_EQ(t.node[0].gpus.size(), 2u);
  EXPECT_EQ(t.node[0].gpus[0].pciBusId, "0000:17:00.0");
  EXPECT_EQ(t.node[0].gpus[0].numa, 1);
  EXPECT_EQ(t.node[0].gpus[0].nic, 1);
  EXPECT_EQ(t.node[0].gpus[1].nic, 0);
  EXPECT_EQ(t.rankNic, (std::vector<int>{1, 0, 1, 0}));
  auto top = [&](const std::string& gpus) { return "{\"nodes\": 1, \"ranksPerNode\": 2, " + nics + ", \"gpus\": " + gpus + "}"; };
  EXPECT_EQ(parseError(top("[{\"nic\": \"c\"}]")),
            "test.json: at /gpus/0/nic: unknown NIC 'c' in \"nic\" of GPU 0 of node 0 (its NICs: a, b)");
  EXPECT_TRUE(contains(parseError(top("[{\"nic\": 2}]")), "a NIC index in \"nic\" of GPU 0 of node 0 must be an integer in [0, 1]"));
  EXPECT_TRUE(contains(parseError(top("[{\"pci\": \"17:00.0\"}]")), "\"pci\" of GPU 0 of node 0 must be a PCI bus id"));
  EXPECT_TRUE(contains(parseError(top("[{\"numa\": 1}]")), "\"numa\" of GPU 0 of node 0 must be an integer in [-1, 0]"));
  EXPECT_TRUE(contains(parseError(top("[{\"nics\": 1}]")), "unknown key \"nics\" in GPU 0 of node 0"));
  EXPECT_TRUE(contains(parseError(top("[3]")), "GPU 0 of node 0 must be an object"));
  EXPECT_TRUE(contains(parseError("{\"nodes\": 1, \"ranksPerNode\": 1, \"nics\": [{\"name\": \"a\", \"bandwidth\": 1, "
                                  "\"hca\": 5}]}"),
                       "\"hca\" of NIC 'a' must be a non-empty string"));
}

// ---- zptopo ----

#ifdef ZPTOPO_PATH
struct ToolRun {
  int status = -1;
  std::string out;
};

ToolRun runTool(const std::string& args) {
  ToolRun r;
  std::string cmd = std::string(ZPTOPO_PATH) + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.out.append(buf, n);
  int st = pclose(p);
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

// The JSON document of zptopo --json's output (the log lines before it aside).
nlohmann::json jsonIn(const std::string& out) {
  const size_t at = out.compare(0, 1, "{") == 0 ? 0 : out.find("\n{") + 1;
  return nlohmann::json::parse(out.substr(at), nullptr, false);
}

TEST(Zptopo, HelpAndBadOptions) {
  ToolRun r = runTool("-h");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "usage: zptopo")) << r.out;
  r = runTool("--bogus");
  EXPECT_EQ(r.status, 2) << r.out;
  EXPECT_TRUE(contains(r.out, "unknown argument '--bogus'")) << r.out;
}

TEST(Zptopo, ShowsThisRank) {
  ScopedEnv topo("ZP_TOPO_FILE", nullptr), devices("ZP_NET_DEVICES", nullptr), rate("ZP_NIC_RATE_BPS", nullptr);
  ScopedEnv local("ZP_LOCAL_RANK", "1"), nlocal("ZP_LOCAL_NRANKS", "3"), id("ZP_NODE_ID", "test-node-7");
  ToolRun r = runTool("");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "node id:     test-node-7 (ZP_NODE_ID)")) << r.out;
  EXPECT_TRUE(contains(r.out, "local rank:  1 of 3")) << r.out;
  r = runTool("--json");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "\"localRank\": 1,")) << r.out;
  EXPECT_TRUE(contains(r.out, "\"nodeId\": \"test-node-7\"")) << r.out;
  NodeTopology node;
  {
    ScopedEnv none("ZP_NIC_RATE_BPS", nullptr);
    ASSERT_EQ(zp::discoverNode(&node), zpSuccess);
  }
  for (const Nic& n : node.nics) EXPECT_TRUE(contains(r.out, "\"name\": \"" + n.name + "\"")) << r.out;
  {
    ScopedEnv bad("ZP_NET_DEVICES", "no-such-nic0");
    r = runTool("");
    EXPECT_EQ(r.status, 1) << r.out;
    EXPECT_TRUE(contains(r.out, "ZP_NET_DEVICES names 'no-such-nic0'")) << r.out;
  }
  {
    ScopedEnv bad("ZP_LOCAL_RANK", "3");
    r = runTool("");
    EXPECT_EQ(r.status, 2) << r.out;
    EXPECT_TRUE(contains(r.out, "ZP_LOCAL_RANK='3' is not an integer in [0, 2]")) << r.out;
  }
}

TEST(Zptopo, PrintsTheTopologyFilesCluster) {
  const std::string path = dataDir() + "/topo_2x4x4.json";
  ScopedEnv topo("ZP_TOPO_FILE", path.c_str()), rank("ZP_RANK", "6");
  ToolRun r = runTool("");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "rank 6:         node 1 (node1), local rank 2 of 4, nic zpnic2")) << r.out;
  EXPECT_TRUE(contains(r.out, "cluster: 2 nodes, 8 ranks (4 per node)")) << r.out;
  r = runTool("--json");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "\"nic\": \"zpnic2\"")) << r.out;
  // Its "cluster" member is a topology file of the same cluster.
  size_t at = r.out.find("\"cluster\": ");
  size_t end = r.out.rfind('}');
  ASSERT_NE(at, std::string::npos);
  ClusterTopology fromTool, fromFile;
  ASSERT_EQ(parseError(r.out.substr(at + 11, end - at - 11), &fromTool), "") << r.out;
  ASSERT_EQ(zp::loadTopoFile(path, &fromFile), zpSuccess);
  EXPECT_EQ(fromTool, fromFile);

  TempFile bad("{\"nodes\": 1,, }");
  ScopedEnv badTopo("ZP_TOPO_FILE", bad.path().c_str());
  r = runTool("");
  EXPECT_EQ(r.status, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "line 1, column 13")) << r.out;
}
// On a GPU node (the sysfs fixture): each rank's GPU, NIC and proxy rail,
// the GPUs' nearest NICs, and the warning for the malformed rate file.
TEST(Zptopo, ShowsRanksOnGpusAndTheirNics) {
  const std::string root = sysfsFixture();
  ScopedEnv topo("ZP_TOPO_FILE", nullptr), devices("ZP_NET_DEVICES", nullptr), rate("ZP_NIC_RATE_BPS", nullptr);
  ScopedEnv sys("ZP_SYSFS_ROOT", root.c_str()), local("ZP_LOCAL_RANK", "1"), nlocal("ZP_LOCAL_NRANKS", "4");
  ScopedEnv debug("ZP_DEBUG", "WARN");
  ToolRun r = runTool("");
  EXPECT_EQ(r.status, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "NIC:         ib1 (400 Gbit/s)")) << r.out;
  EXPECT_TRUE(contains(r.out, "  local rank 1: gpu 1 (0000:81:00.0) -> nic ib1 (400 Gbit/s), the GPU's nearest")) << r.out;
  EXPECT_TRUE(contains(r.out, "  local rank 2: gpu 0 (0000:01:00.0) -> nic ib0 (200 Gbit/s), the GPU's nearest")) << r.out;
  EXPECT_TRUE(contains(r.out, "gpu 0: pci 0000:01:00.0  numa 0  nearest NIC ib0")) << r.out;
  EXPECT_TRUE(contains(r.out, "mlx5_2/ports/1/rate holds 'fast', not a rate such as '200 Gb/sec (4X HDR)': ignored"))
      << r.out;
  r = runTool("--json");
  EXPECT_EQ(r.status, 0) << r.out;
  nlohmann::json j = jsonIn(r.out);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["ranks"][3], nlohmann::json::parse(R"({"localRank": 3, "gpu": 1, "nic": "ib1", "proxyFor": "ib1"})"))
      << r.out;
  EXPECT_EQ(j["gpus"][0]["nicHops"], nlohmann::json::parse("[3, 2, 6, 6]")) << r.out;
  EXPECT_EQ(j["gpus"][0]["nic"], "ib0") << r.out;
  EXPECT_TRUE(contains(r.out, "\"hca\": \"mlx5_0:1\"")) << r.out;
}
#endif  // ZPTOPO_PATH

}  // namespace

namespace {

// Issue 16, item 8: a topology file of small values cost ~200 bytes of
// memory per value on every rank (63 MB: 3.5 GB). The file is bounded
// (16 MiB) and so is the parse (2^20 values): an 8 MB file of 4M numbers is
// refused after the first 2^20, with the parse's peak memory far below what
// the whole would take (about 800 MB). Measured in a child (its own peak RSS).
TEST(TopoFile, HugeFilesAreRefusedWithBoundedMemory) {
  std::string many = "{\"comment\": [";
  for (int i = 0; i < 4 << 20; i++) many += i ? ",0" : "0";
  many += "], \"nodes\": 1}";
  TempFile big(many);
  TempFile tooBig(std::string(17 << 20, ' ') + "{\"nodes\": 1}");
  int pipeFds[2];
  ASSERT_EQ(pipe(pipeFds), 0);
  pid_t child = fork();
  if (child == 0) {
    close(pipeFds[0]);
    auto rssKb = [] {
      long size = 0, resident = 0;
      FILE* f = fopen("/proc/self/statm", "r");
      if (f && fscanf(f, "%ld %ld", &size, &resident) != 2) resident = 0;
      if (f) fclose(f);
      return resident * sysconf(_SC_PAGESIZE) / 1024;
    };
    long before = rssKb();
    ClusterTopology t;
    char report[1024];
    zpResult_t r1 = zp::loadTopoFile(big.path(), &t);
    std::string why1 = zp::lastError();
    rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    zpResult_t r2 = zp::loadTopoFile(tooBig.path(), &t);
    std::string why2 = zp::lastError();
    snprintf(report, sizeof(report), "%d %d %ld\n%s\n%s\n", (int)r1, (int)r2, ru.ru_maxrss - before,
             why1.substr(0, 300).c_str(), why2.substr(0, 300).c_str());
    if (write(pipeFds[1], report, strlen(report)) < 0) _exit(2);
    _exit(0);
  }
  close(pipeFds[1]);
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = read(pipeFds[0], buf, sizeof(buf))) > 0) out.append(buf, (size_t)n);
  close(pipeFds[0]);
  int st = 0;
  waitpid(child, &st, 0);
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << "the child ended with " << st;
  std::istringstream in(out);
  int r1 = 0, r2 = 0;
  long peakKb = 0;
  std::string why1, why2;
  in >> r1 >> r2 >> peakKb;
  std::getline(in, why1);
  std::getline(in, why1);
  std::getline(in, why2);
  EXPECT_EQ(r1, zpInvalidArgument);
  EXPECT_TRUE(contains(why1, "more than 1048576 values")) << why1;
  EXPECT_EQ(r2, zpInvalidArgument);
  EXPECT_TRUE(contains(why2, "larger than 16 MiB")) << why2;
  EXPECT_LT(peakKb, 400 << 10) << "parsing the 8 MB file took " << (peakKb >> 10) << " MB more memory";
  printf("[ info ] 8 MB file of 4M values: refused, peak RSS +%ld MB\n", peakKb >> 10);
}

}  // namespace
