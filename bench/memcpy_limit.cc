// memcpy_limit: the machine's aggregate memcpy bandwidth, the ceiling for a
// shared-memory collective (every byte an alltoallv delivers is copied at
// least once). T threads (default: all online cores) each copy their own
// buffer into another, repeatedly, for a fixed time after a warmup copy. The
// result counts bytes copied (once, not read + write), summed over threads;
// -r NRANKS also prints that divided by the ranks that would share the machine.
#include <unistd.h>

#include <atomic>
#include <cfloat>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"
#include "src/util/cli.h"
#include "src/util/strings.h"

using namespace zpbench;

namespace {

struct Result {
  double bytes = 0;
  double seconds = 0;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = int(sysconf(_SC_NPROCESSORS_ONLN));
  if (threads < 1) threads = 1;
  int nranks = 0;
  size_t bufBytes = 64u << 20;
  double seconds = 1.0;
  CLI::App app("", "memcpy_limit");
  zp::cli::configure(app, "usage: memcpy_limit [-t threads] [-r nranks] [-s bufsize] [-T seconds]\n", 14);
  app.description("The machine's aggregate memcpy bandwidth: every thread copies its own\n"
                  "buffer into another, repeatedly, for a fixed time after a warmup copy.");
  zp::cli::addValue(app, "-t", "threads", zp::strprintf("copying threads (default: online cores, %d here)", threads),
                    zpbench::intFlag("-t", &threads, 1, 4096));
  zp::cli::addValue(app, "-r", "nranks", "also print the aggregate divided by nranks (per-rank limit)",
                    zpbench::intFlag("-r", &nranks, 1, 4096));
  zp::cli::addValue(app, "-s", "bufsize", "bytes per buffer, K/M/G suffixes (default 64M)", [&](const std::string& v) {
    zpbench::bytesFlag("-s", &bufBytes)(v);
    if (bufBytes == 0) throw zp::cli::UsageError("bad -s '" + v + "': expected at least 1 byte");
  });
  zp::cli::addValue(app, "-T", "seconds", "measuring time (default 1)", [&](const std::string& v) {
    if (!zp::parseDouble(v, 0, DBL_MAX, &seconds) || seconds <= 0)
      throw zp::cli::UsageError("bad -T '" + v + "': expected seconds > 0");
  });
  zpbench::parseCommandLine(app, argc, argv);

  std::vector<Result> results(static_cast<size_t>(threads));
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  auto work = [&](int id) {
    // Each thread allocates and touches its own buffers, so pages land on its
    // NUMA node and no page fault is timed.
    Buffer src(bufBytes), dst(bufBytes);
    memset(src.data(), id + 1, bufBytes);
    memset(dst.data(), 0, bufBytes);
    memcpy(dst.data(), src.data(), bufBytes);  // warmup
    ready.fetch_add(1);
    while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
    // Every thread runs for the same wall time from the same start, so the
    // per-thread rates add up to the machine's concurrent rate.
    Result r;
    const double t0 = nowSeconds();
    double t = t0;
    do {
      memcpy(dst.data(), src.data(), bufBytes);
      src.data()[0]++;  // a fresh source byte each round: no round repeats the last
      r.bytes += double(bufBytes);
      t = nowSeconds();
    } while (t - t0 < seconds);
    r.seconds = t - t0;
    results[size_t(id)] = r;
  };
  std::vector<std::thread> pool;
  for (int i = 0; i < threads; ++i) pool.emplace_back(work, i);
  while (ready.load() < threads) std::this_thread::yield();
  go.store(true, std::memory_order_release);
  for (std::thread& th : pool) th.join();

  double aggregate = 0;  // GB/s
  printf("# memcpy_limit: %d threads, %zu bytes per buffer, %.2f s each\n", threads, bufBytes,
         seconds);
  for (int i = 0; i < threads; ++i) {
    const Result& r = results[size_t(i)];
    const double gbps = r.bytes / r.seconds / 1e9;
    printf("#   thread %d: %.2f GB/s\n", i, gbps);
    aggregate += gbps;
  }
  printf("aggregate copy bandwidth: %.2f GB/s (bytes copied, counted once)\n", aggregate);
  if (nranks > 0) printf("per-rank limit (%d ranks): %.2f GB/s\n", nranks, aggregate / nranks);
  printf("copy_limit_GBps=%.3f\n", aggregate);
  if (nranks > 0) printf("copy_limit_per_rank_GBps=%.3f\n", aggregate / nranks);
  printf("threads=%d\n", threads);
  return 0;
}
