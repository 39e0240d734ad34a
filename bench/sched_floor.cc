// sched_floor: what the scheduler alone allows an 8-byte ring shift between
// two processes on this machine, with no library in the way. Two forked
// processes share one page; in each call each writes the call's number to
// its own word and waits until the other's word has it (the exchange of
// sendrecv_perf -c 0 on 2 ranks). How a process waits:
//
//   spin    polls the peer's word (with a pause) until it changes
//   futex   sleeps on the peer's word at once (FUTEX_WAIT), woken by the
//           peer's FUTEX_WAKE after its write
//   hybrid  polls for --spin-us microseconds, then sleeps as futex does
//
// Any library's waiting is one of these or a mix, and pays their costs on
// top, so with other processes on the cores the best of the three is a
// floor for a library's loaded latency (bench/busy_latency.py runs this as
// libraries floor-spin, floor-futex and floor-hybrid beside the others).
// Prints one line: microseconds per call, and the worse process's
// microseconds per call on a core and waiting for one
// (/proc/thread-self/schedstat over the timed calls), as busy_latency.py
// reads them. Exits 1 if a word ever held a number it should not.
//
//   build/bench/sched_floor --mode spin -n 100000 -w 1000
#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>

#include "common.h"
#include "src/util/cli.h"
#include "src/util/clock.h"

namespace {

enum class Mode { kSpin, kFutex, kHybrid };

struct alignas(64) Word {
  std::atomic<uint32_t> seq{0};
  std::atomic<uint32_t> sleeping{0};  // the owner of the other word sleeps on this one
};

struct Shared {
  Word word[2];
  alignas(64) double usPerCall[2], onCpuUs[2], waitCpuUs[2];
  int wrong[2];
};

long futex(std::atomic<uint32_t>* addr, int op, uint32_t val) {
  return syscall(SYS_futex, reinterpret_cast<uint32_t*>(addr), op, val, nullptr, nullptr, 0);
}

inline void relax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

// Waits until w.seq reaches want (the peer may be one call further: it
// posts its next as soon as it has seen this process's), as mode says.
void waitFor(Word& w, uint32_t want, Mode mode, uint64_t spinNs) {
  if (mode != Mode::kFutex) {
    const uint64_t until = mode == Mode::kSpin ? UINT64_MAX : zp::nowNs() + spinNs;
    for (uint32_t polls = 0;; polls++) {
      if (w.seq.load(std::memory_order_acquire) >= want) return;
      relax();
      if ((polls & 63) == 63 && mode == Mode::kHybrid && zp::nowNs() > until) break;
    }
  }
  for (;;) {
    w.sleeping.store(1, std::memory_order_seq_cst);
    const uint32_t seen = w.seq.load(std::memory_order_seq_cst);
    if (seen >= want) break;
    futex(&w.seq, FUTEX_WAIT, seen);
  }
  w.sleeping.store(0, std::memory_order_relaxed);
}

void post(Word& w, uint32_t seq, Mode mode) {
  w.seq.store(seq, std::memory_order_seq_cst);
  if (mode != Mode::kSpin && w.sleeping.load(std::memory_order_seq_cst)) futex(&w.seq, FUTEX_WAKE, 1);
}

void runRank(Shared* s, int me, Mode mode, uint64_t spinNs, uint32_t iters, uint32_t warmup) {
  Word& mine = s->word[me];
  Word& theirs = s->word[1 - me];
  int wrong = 0;
  uint64_t t0 = 0;
  zpbench::SchedStat before;
  for (uint32_t call = 1; call <= warmup + iters; call++) {
    if (call == warmup + 1) {
      before = zpbench::schedStat();
      t0 = zp::nowNs();
    }
    post(mine, call, mode);
    waitFor(theirs, call, mode, spinNs);
    // The peer may already be one call ahead, never more: it waits for this one's next.
    const uint32_t seen = theirs.seq.load(std::memory_order_acquire);
    wrong += seen != call && seen != call + 1;
  }
  const uint64_t t = zp::nowNs() - t0;
  const zpbench::SchedStat spent = zpbench::schedStat() - before;
  s->usPerCall[me] = t / 1000.0 / iters;
  s->onCpuUs[me] = spent.onCpuNs / 1000.0 / iters;
  s->waitCpuUs[me] = spent.queuedNs / 1000.0 / iters;
  s->wrong[me] = wrong;
}

}  // namespace

int main(int argc, char** argv) {
  Mode mode = Mode::kSpin;
  int spinUs = 50, iters = 100000, warmup = 1000;
  CLI::App app("", "sched_floor");
  zp::cli::configure(app, "usage: sched_floor [--mode spin|futex|hybrid] [--spin-us N] [-n iters] [-w warmup]\n", 14);
  app.description("An 8-byte ring shift between two processes with no library: the\n"
                  "scheduler's floor for a library's latency on this machine.");
  zp::cli::addValue(app, "--mode", "how", "spin, futex or hybrid (default spin)", [&](const std::string& v) {
    if (v == "spin") mode = Mode::kSpin;
    else if (v == "futex") mode = Mode::kFutex;
    else if (v == "hybrid") mode = Mode::kHybrid;
    else throw zp::cli::UsageError("bad --mode '" + v + "': expected spin, futex or hybrid");
  });
  zp::cli::addValue(app, "--spin-us", "N", "hybrid: microseconds polled before sleeping (default 50)",
                    zpbench::intFlag("--spin-us", &spinUs, 0, 1000000));
  zp::cli::addValue(app, "-n", "iters", "timed calls (default 100000)", zpbench::intFlag("-n", &iters, 1, 1 << 30));
  zp::cli::addValue(app, "-w", "warmup", "calls before timing (default 1000)",
                    zpbench::intFlag("-w", &warmup, 0, 1 << 30));
  zpbench::parseCommandLine(app, argc, argv);
  void* page = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (page == MAP_FAILED) return perror("mmap"), 1;
  Shared* s = new (page) Shared();
  pid_t child = fork();
  if (child < 0) return perror("fork"), 1;
  runRank(s, child == 0 ? 1 : 0, mode, (uint64_t)spinUs * 1000, (uint32_t)iters, (uint32_t)warmup);
  if (child == 0) _exit(0);
  int status = 0;
  if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    return fprintf(stderr, "sched_floor: the second process failed\n"), 1;
  auto worse = [](const double* v) { return v[0] > v[1] ? v[0] : v[1]; };
  printf("%g %g %g %d\n", worse(s->usPerCall), worse(s->onCpuUs), worse(s->waitCpuUs), s->wrong[0] + s->wrong[1]);
  return s->wrong[0] + s->wrong[1] ? 1 : 0;
}
