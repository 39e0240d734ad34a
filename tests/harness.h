// Multi-process test harness: every rank is a real process (fork), as in a
// real job. The parent makes the unique id (its rendezvous thread serves the
// children), forks nranks children that each run the body, and collects how
// each ended. A child reports failed expectations through its exit code.
#pragma once

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "include/zeppelin.h"

namespace zptest {

// How one rank process ended.
struct RankExit {
  bool exited = false;  // normal exit (else killed by a signal)
  int code = -1;        // exit code or signal number
  bool ok() const { return exited && code == 0; }
};

// Runs body(rank, nranks, id) in nranks processes; returns their exits.
// Kills every rank still running after timeoutSec (the test then fails).
inline std::vector<RankExit> runRanks(int nranks, const std::function<void(int, int, const zpUniqueId&)>& body,
                                      int timeoutSec = 120) {
  zpUniqueId id;
  EXPECT_EQ(zpGetUniqueId(&id), zpSuccess);
  fflush(stdout);
  fflush(stderr);
  std::vector<pid_t> pids(nranks, -1);
  for (int r = 0; r < nranks; r++) {
    pid_t pid = fork();
    if (pid == 0) {
      body(r, nranks, id);
      fflush(stdout);
      fflush(stderr);
      _exit(::testing::Test::HasFailure() ? 1 : 0);
    }
    pids[r] = pid;
  }
  std::vector<RankExit> exits(nranks);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeoutSec);
  int left = nranks;
  while (left > 0) {
    for (int r = 0; r < nranks; r++) {
      if (pids[r] < 0) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        exits[r].exited = WIFEXITED(st);
        exits[r].code = WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st);
        pids[r] = -1;
        left--;
      }
    }
    if (left > 0 && std::chrono::steady_clock::now() > deadline) {
      ADD_FAILURE() << "ranks still running after " << timeoutSec << " s: killing them (a hang)";
      for (pid_t p : pids)
        if (p > 0) kill(p, SIGKILL);
      deadline = std::chrono::steady_clock::now() + std::chrono::hours(1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return exits;
}

// Expects every rank to have exited 0.
inline void expectAllOk(const std::vector<RankExit>& exits) {
  for (size_t r = 0; r < exits.size(); r++)
    EXPECT_TRUE(exits[r].ok()) << "rank " << r << (exits[r].exited ? " exited with code " : " killed by signal ")
                               << exits[r].code;
}

// Initializes a communicator in a child; aborts the child on failure.
inline zpComm_t initComm(int rank, int nranks, const zpUniqueId& id) {
  zpComm_t comm = nullptr;
  zpResult_t r = zpCommInitRank(&comm, nranks, id, rank);
  if (r != zpSuccess) {
    ADD_FAILURE() << "rank " << rank << ": zpCommInitRank: " << zpGetErrorString(r) << ": " << zpGetLastError(nullptr);
    fflush(stderr);
    _exit(1);
  }
  return comm;
}

// A fresh seed per run, printed so that a failure can be replayed with ZP_TEST_SEED.
inline uint64_t testSeed() {
  static uint64_t seed = [] {
    const char* s = getenv("ZP_TEST_SEED");
    uint64_t v = s ? strtoull(s, nullptr, 0) : std::random_device{}() * 0x9E3779B97F4A7C15ull ^ (uint64_t)getpid();
    printf("[ seed ] ZP_TEST_SEED=%llu\n", (unsigned long long)v);
    return v;
  }();
  return seed;
}

// The byte that element byte `i` of the message from src to dst carries.
inline uint8_t patternByte(uint64_t seed, int src, int dst, size_t i) {
  uint64_t x = seed ^ ((uint64_t)src << 48) ^ ((uint64_t)dst << 32) ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return (uint8_t)x;
}

constexpr uint8_t kPoison = 0xA5;

}  // namespace zptest
