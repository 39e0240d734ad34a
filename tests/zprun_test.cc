// Tests of the zprun launcher: runs the built zprun with small shell-script
// ranks and checks exit codes, messages, output prefixing, signal handling and
// that no rank outlives zprun.
//
// The build passes the launcher's path as a string literal:
//   target_compile_definitions(zprun_test PRIVATE ZPRUN_PATH="$<TARGET_FILE:zprun>")
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "tests/process_util.h"

namespace {

using namespace zptest;

// One zprun process with its stdout and stderr captured. stdinData: written
// to zprun's stdin, which is then closed; nullptr gives zprun /dev/null.
class Launch : public Child {
 public:
  explicit Launch(const std::vector<std::string>& args, const char* stdinData = nullptr)
      : Child(zprunCommand(args), stdinData) {}

  // Reads the output until zprun closes it, then reaps zprun. A zprun that
  // runs longer than limitSec is killed (the result shows it).
  Result finish(double limitSec = 60) { return Child::finish(limitSec); }
};

Result run(const std::vector<std::string>& args, const char* stdinData = nullptr,
           double limitSec = 60) {
  Launch launch(args, stdinData);
  return launch.finish(limitSec);
}

std::multiset<std::string> lineSet(const std::string& text) {
  auto v = lines(text);
  return {v.begin(), v.end()};
}

int countOf(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
  return n;
}

// A fresh directory /tmp/zprun_test_* for files the ranks write.
struct TempDir : zptest::TempDir {
  TempDir() : zptest::TempDir("zprun_test") {}
};

// How long the ranks may take to write their pid files.
constexpr double kRanksStartSec = 20;

// ---------------------------------------------------------------------------

TEST(Zprun, StartsAllRanksWithTheirEnvironment) {
  Result r = run({"-n", "3", "sh", "-c",
                  "echo rank $ZP_RANK of $ZP_NRANKS local $ZP_LOCAL_RANK/$ZP_LOCAL_NRANKS "
                  "$ZP_LAUNCHER; exit 0"});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(lineSet(r.out), (std::multiset<std::string>{"rank 0 of 3 local 0/3 zprun",
                                                         "rank 1 of 3 local 1/3 zprun",
                                                         "rank 2 of 3 local 2/3 zprun"}));
  EXPECT_EQ(r.err, "");
}

TEST(Zprun, WithoutNodesNoClusterVariablesAndTheMachinesIdentity) {
  // Cluster mode's variables, hostname and boot id are its own: a plain run
  // keeps the machine's.
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::ifstream bootFile("/proc/sys/kernel/random/boot_id");
  std::string boot;
  bootFile >> boot;
  Result r = run({"-n", "2", "sh", "-c",
                  "echo \"${ZP_NODE_RANK-no}${ZP_NNODES-no}${ZP_NET_DEVICES-no}"
                  "${ZP_NIC_RATE_BPS-no} $(hostname) $(cat /proc/sys/kernel/random/boot_id)\""});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  std::string want = "nononono " + std::string(host) + " " + boot;
  EXPECT_EQ(lines(r.out), (std::vector<std::string>{want, want}));
}

TEST(Zprun, AllRanksGetTheSameHexUniqueId) {
  Result r = run({"-n", "4", "sh", "-c", "echo $ZP_UNIQUE_ID"});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  auto ids = lines(r.out);
  ASSERT_EQ(ids.size(), 4u);
  EXPECT_EQ(ids[0].size(), 256u);  // 128 bytes in hex
  EXPECT_EQ(ids[0].find_first_not_of("0123456789abcdef"), std::string::npos) << ids[0];
  for (const auto& id : ids) EXPECT_EQ(id, ids[0]);
}

TEST(Zprun, PassesArgumentsUnchanged) {
  Result r = run({"-n", "1", "--", "sh", "-c", "printf '<%s>' \"$@\"", "sh", "a b", "-n", "--x"});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(r.out, "<a b><-n><--x>");
}

TEST(Zprun, PrefixesEachLineWithItsRank) {
  Result r = run({"--prefix", "-n", "2", "sh", "-c",
                  "echo out$ZP_RANK; echo second$ZP_RANK; echo err$ZP_RANK >&2; "
                  "printf partial$ZP_RANK"});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(lineSet(r.out),
            (std::multiset<std::string>{"[0] out0", "[0] second0", "[0] partial0", "[1] out1",
                                        "[1] second1", "[1] partial1"}));
  EXPECT_EQ(lineSet(r.err), (std::multiset<std::string>{"[0] err0", "[1] err1"}));
  // Each rank's own lines stay in order.
  auto out = lines(r.out);
  std::vector<std::string> rank0;
  for (const auto& l : out)
    if (l.compare(0, 4, "[0] ") == 0) rank0.push_back(l);
  EXPECT_EQ(rank0, (std::vector<std::string>{"[0] out0", "[0] second0", "[0] partial0"}));
}

TEST(Zprun, PrefixKeepsLongOutputComplete) {
  // More than a pipe buffer per rank, written in one go.
  Result r = run({"-p", "-n", "3", "sh", "-c", "seq 1 20000"});
  ASSERT_EQ(r.exitCode, 0) << r.err;
  auto out = lines(r.out);
  EXPECT_EQ(out.size(), 60000u);
  EXPECT_EQ(countOf(r.out, "] 20000\n"), 3);
}

TEST(Zprun, ExtraEnvironmentWithX) {
  setenv("ZPRUN_TEST_OWN", "mine", 1);
  Result r = run({"-n", "2", "-x", "A=1", "-x", "B=x=y", "-x", "ZPRUN_TEST_OWN", "-x", "A=2", "sh",
                  "-c", "echo \"$A|$B|$ZPRUN_TEST_OWN\""});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(lineSet(r.out), (std::multiset<std::string>{"2|x=y|mine", "2|x=y|mine"}));
}

TEST(Zprun, FailingRankGivesItsExitCode) {
  Result r = run({"-n", "3", "sh", "-c", "if [ $ZP_RANK = 1 ]; then exit 3; fi; exit 0"});
  EXPECT_EQ(r.exitCode, 3);
  EXPECT_NE(r.err.find("zprun: rank 1 exited with code 3"), std::string::npos) << r.err;
}

TEST(Zprun, RankKilledBySignal) {
  Result r = run({"-n", "2", "sh", "-c", "if [ $ZP_RANK = 1 ]; then kill -9 $$; fi; exit 0"});
  EXPECT_EQ(r.exitCode, 128 + SIGKILL);
  EXPECT_NE(r.err.find("zprun: rank 1 killed by signal SIGKILL"), std::string::npos) << r.err;
}

TEST(Zprun, OthersExitingOnTheirOwnWithinGraceAreReported) {
  // Rank 0 fails first; the others notice (here: after a short sleep) and fail
  // too. The first failure decides the exit code.
  Result r = run({"-n", "3", "--grace", "20", "sh", "-c",
                  "if [ $ZP_RANK = 0 ]; then exit 4; fi; sleep 0.3; exit 1"});
  EXPECT_EQ(r.exitCode, 4);
  EXPECT_NE(r.err.find("rank 0 exited with code 4"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 exited with code 1"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 10);  // no waiting for the grace period
  EXPECT_EQ(r.err.find("SIGTERM"), std::string::npos) << r.err;
}

TEST(Zprun, GracePeriodThenSigtermThenSigkill) {
  // Rank 0 fails; the others ignore SIGTERM, so only SIGKILL ends them:
  // about grace (1 s) + 2 s.
  Result r = run({"-n", "3", "--grace", "1", "sh", "-c",
                  "if [ $ZP_RANK = 0 ]; then exit 5; fi; trap '' TERM; sleep 60"});
  EXPECT_EQ(r.exitCode, 5);
  EXPECT_NE(r.err.find("SIGTERM"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("SIGKILL"), std::string::npos) << r.err;
  EXPECT_GE(r.seconds, 2.5);
  EXPECT_LT(r.seconds, 15);
}

TEST(Zprun, SigtermEndsRanksAfterGrace) {
  Result r = run({"-n", "2", "--grace", "0.5", "sh", "-c",
                  "if [ $ZP_RANK = 1 ]; then exit 6; fi; sleep 60"});
  EXPECT_EQ(r.exitCode, 6);
  EXPECT_NE(r.err.find("SIGTERM"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("SIGKILL"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 10);
}

TEST(Zprun, NonexistentProgramIsReportedOnce) {
  Result r = run({"-n", "4", "/nonexistent/zprun-test-program", "arg"});
  EXPECT_EQ(r.exitCode, 127);
  EXPECT_EQ(countOf(r.err, "zprun: cannot execute /nonexistent/zprun-test-program: "), 1)
      << r.err;
  EXPECT_NE(r.err.find("No such file or directory"), std::string::npos) << r.err;
}

TEST(Zprun, ProgramNotFoundInPath) {
  Result r = run({"-n", "2", "zprun-test-no-such-program"});
  EXPECT_EQ(r.exitCode, 127);
  EXPECT_EQ(countOf(r.err, "cannot execute zprun-test-no-such-program"), 1) << r.err;
}

TEST(Zprun, NonExecutableFile) {
  TempDir dir;
  std::string file = dir.path() + "/not-executable";
  std::ofstream(file) << "#!/bin/sh\necho hi\n";
  chmod(file.c_str(), 0644);
  Result r = run({"-n", "2", file});
  EXPECT_EQ(r.exitCode, 127);
  EXPECT_EQ(countOf(r.err, "cannot execute " + file + ": "), 1) << r.err;
  EXPECT_EQ(r.out, "");
}

TEST(Zprun, TimeoutKillsTheJob) {
  Result r = run({"-n", "2", "--timeout", "1", "sleep", "60"});
  EXPECT_EQ(r.exitCode, 124);
  EXPECT_NE(r.err.find("timeout"), std::string::npos) << r.err;
  EXPECT_GE(r.seconds, 0.9);
  EXPECT_LT(r.seconds, 10);
}

TEST(Zprun, TimeoutEscalatesToSigkill) {
  Result r = run({"-n", "2", "--timeout", "0.5", "sh", "-c", "trap '' TERM; sleep 60"});
  EXPECT_EQ(r.exitCode, 124);
  EXPECT_NE(r.err.find("SIGKILL"), std::string::npos) << r.err;
  EXPECT_LT(r.seconds, 10);
}

TEST(Zprun, TimeoutNotReachedIsHarmless) {
  Result r = run({"-n", "2", "--timeout", "30", "true"});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_LT(r.seconds, 10);
}

TEST(Zprun, StdinGoesToRankZeroOnly) {
  Result r = run({"-n", "3", "sh", "-c", "read x; echo \"$ZP_RANK:[$x]\""}, "hello\n");
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_EQ(lineSet(r.out), (std::multiset<std::string>{"0:[hello]", "1:[]", "2:[]"}));
}

TEST(Zprun, BadUsage) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"true"},                          // no -n
           {"-n", "0", "true"},               // too few
           {"-n", "1025", "true"},            // too many
           {"-n", "x", "true"},               // not a number
           {"-n", "2"},                       // no program
           {"-n"},                            // no value
           {"-n", "2", "--bogus", "true"},    // unknown option
           {"-n", "2", "-x", "=1", "true"},   // bad variable
           {"-n", "2", "-x", "ZP_RANK=1", "true"},  // reserved
           {"-n", "2", "--timeout", "0", "true"},
           {"-n", "2", "--grace", "-1", "true"},
       }) {
    Result r = run(args);
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    EXPECT_EQ(r.exitCode, 2) << joined;
    EXPECT_NE(r.err.find("Usage:"), std::string::npos) << joined << "\n" << r.err;
    EXPECT_EQ(r.out, "") << joined;
  }
}

TEST(Zprun, Help) {
  for (const char* flag : {"-h", "--help"}) {
    Result r = run({flag});
    EXPECT_EQ(r.exitCode, 0);
    EXPECT_NE(r.out.find("Usage:"), std::string::npos);
  }
}

TEST(Zprun, OptionSpellings) {
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"-np", "2", "sh", "-c", "echo $ZP_NRANKS"},
           {"-n2", "sh", "-c", "echo $ZP_NRANKS"},
           {"--np=2", "--grace=1", "--timeout=30", "sh", "-c", "echo $ZP_NRANKS"},
       }) {
    Result r = run(args);
    EXPECT_EQ(r.exitCode, 0) << args[0] << "\n" << r.err;
    EXPECT_EQ(r.out, "2\n2\n") << args[0];
  }
}

TEST(Zprun, SigintIsForwardedToAllRanks) {
  TempDir dir;
  // Each rank reports the signal it got and exits with its own code.
  Launch launch({"-n", "3", "sh", "-c",
                 "trap 'echo got INT $ZP_RANK; exit 9' INT; echo $$ > " + dir.path() +
                     "/pid$ZP_RANK; sleep 60 & wait"});
  auto pids = waitForPidFiles(dir.path(), 3, kRanksStartSec);
  ASSERT_EQ(pids.size(), 3u);
  kill(launch.pid(), SIGINT);
  Result r = launch.finish();
  EXPECT_EQ(r.exitCode, 9) << r.err;
  EXPECT_EQ(lineSet(r.out),
            (std::multiset<std::string>{"got INT 0", "got INT 1", "got INT 2"}));  // once each
  EXPECT_NE(r.err.find("received SIGINT"), std::string::npos) << r.err;
  EXPECT_TRUE(allDeadWithin(pids, 5));
}

TEST(Zprun, SigtermEndsTheJobNonZero) {
  TempDir dir;
  Launch launch({"-n", "2", "sh", "-c", "echo $$ > " + dir.path() + "/pid$ZP_RANK; exec sleep 60"});
  auto pids = waitForPidFiles(dir.path(), 2, kRanksStartSec);
  ASSERT_EQ(pids.size(), 2u);
  kill(launch.pid(), SIGTERM);
  Result r = launch.finish();
  EXPECT_EQ(r.exitCode, 128 + SIGTERM) << r.err;
  EXPECT_LT(r.seconds, 10);
  EXPECT_TRUE(allDeadWithin(pids, 5));
}

TEST(Zprun, InterruptedJobIsNeverSuccessful) {
  // The ranks catch SIGINT and exit 0; zprun still reports the interruption.
  TempDir dir;
  Launch launch({"-n", "2", "sh", "-c",
                 "trap 'exit 0' INT; echo $$ > " + dir.path() + "/pid$ZP_RANK; sleep 60 & wait"});
  ASSERT_EQ(waitForPidFiles(dir.path(), 2, kRanksStartSec).size(), 2u);
  kill(launch.pid(), SIGINT);
  Result r = launch.finish();
  EXPECT_EQ(r.exitCode, 128 + SIGINT) << r.err;
}

TEST(Zprun, SecondSignalKillsAtOnce) {
  TempDir dir;
  Launch launch({"-n", "2", "--grace", "30", "sh", "-c",
                 "trap '' INT TERM; echo $$ > " + dir.path() + "/pid$ZP_RANK; sleep 60"});
  ASSERT_EQ(waitForPidFiles(dir.path(), 2, kRanksStartSec).size(), 2u);
  kill(launch.pid(), SIGINT);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  kill(launch.pid(), SIGINT);
  Result r = launch.finish();
  EXPECT_NE(r.exitCode, 0);
  EXPECT_LT(r.seconds, 10);
  EXPECT_NE(r.err.find("killing"), std::string::npos) << r.err;
}

TEST(Zprun, RanksDieWithZprun) {
  // Even SIGKILL, which zprun cannot catch, takes the ranks with it.
  TempDir dir;
  Launch launch({"-n", "3", "sh", "-c", "echo $$ > " + dir.path() + "/pid$ZP_RANK; exec sleep 60"});
  auto pids = waitForPidFiles(dir.path(), 3, kRanksStartSec);
  ASSERT_EQ(pids.size(), 3u);
  kill(launch.pid(), SIGKILL);
  Result r = launch.finish();
  EXPECT_EQ(r.termSignal, SIGKILL);
  EXPECT_TRUE(allDeadWithin(pids, 5));
}

TEST(Zprun, NoChildOfARankIsLeftRunning) {
  // A rank that leaves a background child behind: zprun ends it, and does not
  // wait for it to close the output pipe.
  TempDir dir;
  Result r = run({"-p", "-n", "2", "sh", "-c",
                  "sleep 60 & echo $! > " + dir.path() + "/pid$ZP_RANK; echo done"});
  EXPECT_EQ(r.exitCode, 0) << r.err;
  EXPECT_LT(r.seconds, 10);
  EXPECT_EQ(lineSet(r.out), (std::multiset<std::string>{"[0] done", "[1] done"}));
  auto pids = waitForPidFiles(dir.path(), 2, 1);
  ASSERT_EQ(pids.size(), 2u);
  EXPECT_TRUE(allDeadWithin(pids, 5));
}

}  // namespace
