// Process helpers shared by the launcher's tests (zprun_test.cc and
// cluster_test.cc): starting zprun with its output captured, running a
// command, waiting for ranks' pid files, and checking that processes are gone.
//
// The build passes the launcher's path as a string literal:
//   target_compile_definitions(... ZPRUN_PATH="$<TARGET_FILE:zprun>")
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#ifndef ZEPPELIN_TESTS_PROCESS_UTIL_H_
#define ZEPPELIN_TESTS_PROCESS_UTIL_H_

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#ifndef ZPRUN_PATH
#error "build with -DZPRUN_PATH=\"/path/to/zprun\""
#endif

// A macro's value as a string literal: ZPTEST_STR(ZPRUN_PATH).
#define ZPTEST_STR2(x) #x
#define ZPTEST_STR(x) ZPTEST_STR2(x)

namespace zptest {

// A path given with or without quotes, without them.
inline std::string unquoted(std::string p) {
  if (p.size() >= 2 && p.front() == '"' && p.back() == '"') p = p.substr(1, p.size() - 2);
  return p;
}

inline std::string zprunPath() { return unquoted(ZPTEST_STR(ZPRUN_PATH)); }

inline double nowSec() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

struct Result {
  int exitCode = -1;   // -1 if the process was killed by a signal
  int termSignal = 0;  // the signal that killed it, if any
  std::string out, err;
  double seconds = 0;
  pid_t pid = -1;  // its pid (zprun's: a cluster's names carry it)
};

// One process with its stdout and stderr captured.
class Child {
 public:
  // argv[0] is looked up in PATH when it has no '/'. stdinData: written to
  // the process's stdin, which is then closed; nullptr gives it /dev/null.
  explicit Child(const std::vector<std::string>& command, const char* stdinData = nullptr) {
    start_ = nowSec();
    int out[2], err[2], in[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) abort();
    if (stdinData != nullptr && pipe2(in, O_CLOEXEC) != 0) abort();
    std::vector<std::string> argvStrings = command;
    std::vector<char*> argv;
    for (std::string& s : argvStrings) argv.push_back(&s[0]);
    argv.push_back(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      int inFd = stdinData != nullptr ? in[0] : open("/dev/null", O_RDONLY);
      dup2(inFd, 0);
      dup2(out[1], 1);
      dup2(err[1], 2);
      execvp(argv[0], argv.data());
      _exit(99);
    }
    close(out[1]);
    close(err[1]);
    outFd_ = out[0];
    errFd_ = err[0];
    if (stdinData != nullptr) {
      close(in[0]);
      // Small inputs only: fits in the pipe, so this cannot block.
      ssize_t n = write(in[1], stdinData, strlen(stdinData));
      (void)n;
      close(in[1]);
    }
  }

  ~Child() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (outFd_ >= 0) close(outFd_);
    if (errFd_ >= 0) close(errFd_);
  }

  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }

  // Reads the output until the process closes it, then reaps the process.
  // One that runs longer than limitSec is killed (the result shows it): at
  // once with SIGKILL when termGraceSec < 0, else first with SIGTERM and
  // then with SIGKILL termGraceSec later.
  Result finish(double limitSec, double termGraceSec = -1) {
    Result r;
    r.pid = pid_;
    double deadline = nowSec() + limitSec;
    bool terminated = false;
    while (outFd_ >= 0 || errFd_ >= 0) {
      pollfd fds[2];
      int n = 0;
      if (outFd_ >= 0) fds[n++] = {outFd_, POLLIN, 0};
      if (errFd_ >= 0) fds[n++] = {errFd_, POLLIN, 0};
      int left = static_cast<int>((deadline - nowSec()) * 1000);
      if (left <= 0 || poll(fds, n, left) == 0) {
        if (termGraceSec < 0 || terminated) {
          kill(pid_, SIGKILL);
          break;
        }
        kill(pid_, SIGTERM);
        terminated = true;
        deadline = nowSec() + termGraceSec;
        continue;
      }
      for (int k = 0; k < n; ++k) {
        if (!fds[k].revents) continue;
        int* fd = fds[k].fd == outFd_ ? &outFd_ : &errFd_;
        std::string* text = fds[k].fd == outFd_ ? &r.out : &r.err;
        char buf[4096];
        ssize_t got = read(*fd, buf, sizeof buf);
        if (got > 0) {
          text->append(buf, got);
        } else if (got == 0 || errno != EINTR) {
          close(*fd);
          *fd = -1;
        }
      }
    }
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    if (WIFEXITED(status)) r.exitCode = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.termSignal = WTERMSIG(status);
    r.seconds = nowSec() - start_;
    return r;
  }

 private:
  pid_t pid_ = -1;
  int outFd_ = -1, errFd_ = -1;
  double start_ = 0;
};

// The command that runs zprun with args, behind a wrapper (such as setpriv
// or unshare) that execs it, if any.
inline std::vector<std::string> zprunCommand(const std::vector<std::string>& args,
                                             const std::vector<std::string>& wrapper = {}) {
  std::vector<std::string> command = wrapper;
  command.push_back(zprunPath());
  command.insert(command.end(), args.begin(), args.end());
  return command;
}

// Runs a command (no shell) and returns its stdout; exit code in *code.
inline std::string capture(const std::vector<std::string>& argv, int* code = nullptr) {
  int out[2];
  if (pipe2(out, O_CLOEXEC) != 0) abort();
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (std::string& s : args) cargv.push_back(&s[0]);
  cargv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    int devNull = open("/dev/null", O_RDWR);
    dup2(devNull, 0);
    dup2(out[1], 1);
    dup2(devNull, 2);
    execvp(cargv[0], cargv.data());
    _exit(127);
  }
  close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = read(out[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    text.append(buf, n);
  }
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (code != nullptr) *code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return text;
}

inline std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> v;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) v.push_back(l);
  return v;
}

// A fresh directory /tmp/PREFIX_XXXXXX for files the ranks write, removed
// with all in it at the end.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix) {
    std::string tmpl = "/tmp/" + prefix + "_XXXXXX";
    path_ = mkdtemp(&tmpl[0]);
  }
  ~TempDir() { capture({"rm", "-rf", path_}); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Waits until count files pid0..pid{count-1} exist in dir and returns the pids
// they hold (written by ranks as `echo $$ > dir/pid$ZP_RANK`); fewer if they
// are not all there within limitSec.
inline std::vector<pid_t> waitForPidFiles(const std::string& dir, int count, double limitSec) {
  std::vector<pid_t> pids;
  double deadline = nowSec() + limitSec;
  while (nowSec() < deadline) {
    pids.clear();
    for (int r = 0; r < count; ++r) {
      std::ifstream f(dir + "/pid" + std::to_string(r));
      long pid = 0;
      if (f >> pid && pid > 0) pids.push_back(static_cast<pid_t>(pid));
    }
    if (static_cast<int>(pids.size()) == count) return pids;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pids;
}

// True if pid is gone or a zombie (dead, waiting for a reaper that is not us).
inline bool isDead(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string all((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  size_t paren = all.rfind(')');
  return paren == std::string::npos || (paren + 2 < all.size() && all[paren + 2] == 'Z');
}

inline bool allDeadWithin(const std::vector<pid_t>& pids, double limitSec) {
  double deadline = nowSec() + limitSec;
  for (;;) {
    bool all = true;
    for (pid_t p : pids) all = all && isDead(p);
    if (all) return true;
    if (nowSec() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace zptest

#endif  // ZEPPELIN_TESTS_PROCESS_UTIL_H_
