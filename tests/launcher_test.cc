// Jobs started by real launchers: zprun and Open MPI's mpirun run the test
// program zp_env_rank, whose ranks find each other through
// zpCommInitFromEnv and check an alltoallv byte by byte.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "tests/harness.h"

#ifndef ZPRUN_PATH
#error "build with ZPRUN_PATH=\"/path/to/zprun\""
#endif
#ifndef ZP_ENV_RANK_PATH
#error "build with ZP_ENV_RANK_PATH=\"/path/to/zp_env_rank\""
#endif

namespace {

struct Outcome {
  bool exited = false;
  int code = -1;  // exit code, or the signal that ended it
  std::string output;  // stdout and stderr together
};

// Runs argv (found in PATH if it has no slash) with a clean launcher
// environment plus `env`, in its own process group; kills the whole group if
// it runs longer than timeoutSec.
Outcome runCommand(const std::vector<std::string>& argv, const std::vector<std::pair<std::string, std::string>>& env,
                   int timeoutSec) {
  int pipeFds[2];
  if (pipe2(pipeFds, O_CLOEXEC) != 0) return {};
  fflush(stdout);
  fflush(stderr);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    zptest::clearLauncherEnv();
    for (auto& kv : env) setenv(kv.first.c_str(), kv.second.c_str(), 1);
    dup2(pipeFds[1], 1);
    dup2(pipeFds[1], 2);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    std::vector<char*> args;
    for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    fprintf(stderr, "cannot run %s: %s\n", args[0], strerror(errno));
    _exit(127);
  }
  close(pipeFds[1]);
  Outcome out;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSec);
  bool killed = false;
  for (;;) {
    pollfd p = {pipeFds[0], POLLIN, 0};
    int rc = poll(&p, 1, 200);
    if (rc > 0) {
      char buf[4096];
      ssize_t n = read(pipeFds[0], buf, sizeof(buf));
      if (n > 0) {
        out.output.append(buf, n);
        continue;
      }
      if (n == 0) break;  // every writer is gone
    }
    if (!killed && std::chrono::steady_clock::now() > deadline) {
      kill(-pid, SIGKILL);
      killed = true;
      out.output += "\n[killed after " + std::to_string(timeoutSec) + " s]\n";
      break;
    }
  }
  close(pipeFds[0]);
  int st = 0;
  waitpid(pid, &st, 0);
  out.exited = WIFEXITED(st);
  out.code = WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st);
  return out;
}

size_t countOf(const std::string& text, const std::string& part) {
  size_t n = 0;
  for (size_t pos = text.find(part); pos != std::string::npos; pos = text.find(part, pos + 1)) n++;
  return n;
}

bool inPath(const std::string& program) {
  const char* path = getenv("PATH");
  if (!path) return false;
  std::string dirs = path;
  size_t start = 0;
  while (start <= dirs.size()) {
    size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string candidate = dirs.substr(start, end - start) + "/" + program;
    if (access(candidate.c_str(), X_OK) == 0) return true;
    start = end + 1;
  }
  return false;
}

TEST(Launcher, ZprunRunsACheckedJobOfFourRanks) {
  Outcome o = runCommand({ZPRUN_PATH, "-n", "4", ZP_ENV_RANK_PATH}, {}, 120);
  EXPECT_TRUE(o.exited && o.code == 0) << (o.exited ? "exit code " : "signal ") << o.code << "\n" << o.output;
  EXPECT_EQ(countOf(o.output, " of 4: ok"), 4u) << o.output;
}

TEST(Launcher, MpirunRunsACheckedJobOfThreeRanks) {
  if (!inPath("mpirun")) GTEST_SKIP() << "mpirun is not in PATH (install openmpi-bin to run this test)";
  Outcome o = runCommand({"mpirun", "--oversubscribe", "--allow-run-as-root", "--mca", "oob_tcp_if_include", "lo",
                          "--mca", "btl_tcp_if_include", "lo", "-np", "3", ZP_ENV_RANK_PATH},
                         {{"OMPI_ALLOW_RUN_AS_ROOT", "1"}, {"OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1"}}, 120);
  EXPECT_TRUE(o.exited && o.code == 0) << (o.exited ? "exit code " : "signal ") << o.code << "\n" << o.output;
  EXPECT_EQ(countOf(o.output, " of 3: ok"), 3u) << o.output;
}

}  // namespace
