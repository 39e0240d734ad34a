// Running ip and tc: see iproute.h.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/launcher/cluster/iproute.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <map>
#include <sstream>

#include "src/launcher/cluster/cluster.h"
#include "src/util/strings.h"

namespace zpcluster {
namespace {

constexpr double kCommandTimeoutSec = 60;  // one ip / tc command; they take milliseconds

// Finds a program of iproute2. Also looks in the sbin directories, which the
// PATH of a non-login root shell (sudo -E, su) may lack.
std::string findTool(const std::string& name) {
  std::vector<std::string> dirs;
  const char* path = getenv("PATH");
  std::stringstream in(path != nullptr ? path : "");
  for (std::string d; std::getline(in, d, ':');)
    if (!d.empty()) dirs.push_back(d);
  for (const char* d : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) dirs.push_back(d);
  for (const std::string& d : dirs) {
    std::string p = d + "/" + name;
    struct stat st;
    if (stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

}  // namespace

double nowSec() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

const std::string& toolPath(const std::string& name) {
  static std::map<std::string, std::string> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, findTool(name)).first;
  return it->second;
}

std::string CommandResult::describe() const {
  std::string what;
  if (!started) what = "could not run";
  else if (WIFEXITED(status)) what = "exited with code " + std::to_string(WEXITSTATUS(status));
  else what = "killed by signal " + std::to_string(WTERMSIG(status));
  std::string out = zp::trim(output);
  return out.empty() ? what : what + ": " + out;
}

CommandResult runCommand(const std::vector<std::string>& argv) {
  CommandResult res;
  const std::string& file = toolPath(argv[0]);
  if (file.empty()) {
    res.output = argv[0] + ": command not found";
    return res;
  }
  int pipeFds[2];
  if (pipe2(pipeFds, O_CLOEXEC) != 0) {
    res.output = std::string("pipe: ") + strerror(errno);
    return res;
  }
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(&a[0]);
  cargv.push_back(nullptr);
  int devNull = open("/dev/null", O_RDONLY | O_CLOEXEC);

  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGPIPE, SIGTTIN, SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (devNull >= 0) dup2(devNull, 0);
    dup2(pipeFds[1], 1);
    dup2(pipeFds[1], 2);
    execv(file.c_str(), cargv.data());
    static const char kMsg[] = "exec failed\n";
    ssize_t ignored = write(2, kMsg, sizeof kMsg - 1);
    (void)ignored;
    _exit(127);
  }
  int forkErrno = errno;
  close(pipeFds[1]);
  if (devNull >= 0) close(devNull);
  if (pid < 0) {
    close(pipeFds[0]);
    res.output = std::string("fork: ") + strerror(forkErrno);
    return res;
  }
  setpgid(pid, pid);
  res.started = true;

  double deadline = nowSec() + kCommandTimeoutSec;
  for (;;) {
    pollfd p{pipeFds[0], POLLIN, 0};
    int left = static_cast<int>((deadline - nowSec()) * 1000);
    if (left <= 0) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      res.output += "\n(zprun killed it after " + std::to_string(static_cast<int>(kCommandTimeoutSec)) +
                    " s)";
      break;
    }
    int n = poll(&p, 1, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[4096];
    ssize_t got = read(pipeFds[0], buf, sizeof buf);
    if (got > 0) {
      if (res.output.size() < 64 * 1024) res.output.append(buf, static_cast<size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    break;  // EOF
  }
  close(pipeFds[0]);
  while (waitpid(pid, &res.status, 0) < 0 && errno == EINTR) {
  }
  return res;
}

std::string quoteArg(const std::string& arg) {
  bool plain = !arg.empty();
  for (char c : arg)
    plain = plain && (isalnum(static_cast<unsigned char>(c)) || strchr("-_./=:,+@%", c) != nullptr);
  if (plain) return arg;
  std::string q = "'";
  for (char c : arg) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string joinCommand(const std::vector<std::string>& argv) {
  std::string s;
  for (const std::string& a : argv) {
    if (!s.empty()) s += ' ';
    s += quoteArg(a);
  }
  return s;
}

}  // namespace zpcluster
