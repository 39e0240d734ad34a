// memcpy_limit: the machine's aggregate memcpy bandwidth, the ceiling for a
// shared-memory collective (every byte an alltoallv delivers is copied at
// least once). T threads (default: all online cores) each copy their own
// buffer into another, repeatedly, for a fixed time after a warmup copy. The
// result counts bytes copied (once, not read + write), summed over threads;
// -r NRANKS also prints that divided by the ranks that would share the machine.
#include <getopt.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "common.h"
#include "src/util/strings.h"

using namespace zpbench;

namespace {

void usage(FILE* f) {
  fprintf(f,
          "usage: memcpy_limit [-t threads] [-r nranks] [-s bufsize] [-T seconds]\n"
          "  -t threads  copying threads (default: online cores, %ld here)\n"
          "  -r nranks   also print the aggregate divided by nranks (per-rank limit)\n"
          "  -s bufsize  bytes per buffer, K/M/G suffixes (default 64M)\n"
          "  -T seconds  measuring time (default 1)\n",
          sysconf(_SC_NPROCESSORS_ONLN));
}

[[noreturn]] void bad(const char* what, const char* arg) {
  fprintf(stderr, "memcpy_limit: bad %s '%s'\n", what, arg);
  usage(stderr);
  exit(2);
}

bool parsePositiveInt(const char* s, int* out) { return s && zp::parseInt(std::string(s), 1, 1 << 20, out); }

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
  int c;
  opterr = 0;
  while ((c = getopt(argc, argv, ":t:r:s:T:h")) != -1) {
    switch (c) {
      case 't':
        if (!parsePositiveInt(optarg, &threads)) bad("-t", optarg);
        break;
      case 'r':
        if (!parsePositiveInt(optarg, &nranks)) bad("-r", optarg);
        break;
      case 's':
        if (!parseBytes(optarg, &bufBytes) || bufBytes == 0) bad("-s", optarg);
        break;
      case 'T': {
        char* end = nullptr;
        seconds = strtod(optarg, &end);
        if (end == optarg || *end != '\0' || !(seconds > 0) || !std::isfinite(seconds))
          bad("-T", optarg);
        break;
      }
      case 'h':
        usage(stdout);
        return 0;
      case ':':
        bad("option, needs a value:", argv[optind - 1]);
      default: {
        char opt[3] = {'-', char(optopt), '\0'};
        bad("option", opt);
      }
    }
  }
  if (optind < argc) bad("argument", argv[optind]);

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
