// remap_perf: remap forward (linear -> attention layout) and inverse on the
// planner's layouts of batches drawn from real sequence lengths, an
// nccl-tests style table over token widths. `zprun -n 4 build/bench/remap_perf`.
//   -L file    lengths, one per line (default tests/data/prolong64k.txt)
//   -t tokens  tokens per rank in a batch (default 16384)
//   -b/-e      bytes per token, smallest and largest (default 256 / 16K), x2 steps
//   -n/-w      timed / warm-up iterations (default 20 / 3)
//   -c 0|1     check every byte of every forward and inverse (default 1)
//   -s seed    batch seed (default 1)
// size = the batch's bytes per rank; busbw = the busiest rank's bytes that
// leave it (they cross shared memory or a NIC) per second; moved = the share
// of all bytes that change rank.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "common.h"
#include "src/util/cli.h"
#include "zeppelin.h"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void die(const char* what, zpComm_t comm) {
  fprintf(stderr, "remap_perf: %s: %s\n", what, zpGetLastError(comm));
  exit(1);
}

void barrier(zpComm_t comm, int n) {
  std::vector<char> s(n), r(n);
  std::vector<size_t> c(n, 1), d(n);
  for (int i = 0; i < n; i++) d[i] = i;
  if (zpAlltoallv(s.data(), c.data(), d.data(), r.data(), c.data(), d.data(), zpUint8, comm, nullptr) != zpSuccess)
    die("barrier", comm);
}

uint8_t byteOf(int64_t seq, int64_t t, size_t x, int iter) {
  uint64_t h = (uint64_t)seq * 0x9E3779B97F4A7C15ull ^ (uint64_t)t * 0xC2B2AE3D27D4EB4Full ^ x * 0x165667B1ull ^ iter;
  h ^= h >> 31;
  return (uint8_t)(h * 0xBF58476D1CE4E5B9ull >> 56);
}

std::vector<uint8_t> bufferOf(zpLayout_t l, int rank, size_t width, int iter) {
  const zpSegment_t* segs;
  size_t ns;
  zpLayoutRankSegments(l, rank, &segs, &ns);
  std::vector<uint8_t> v;
  for (size_t k = 0; k < ns; k++)
    for (int64_t t = segs[k].start; t < segs[k].start + segs[k].count; t++)
      for (size_t x = 0; x < width; x++) v.push_back(byteOf(segs[k].seq, t, x, iter));
  return v;
}

// Tokens of rank r in layout a that rank r also holds in layout b.
int64_t keptTokens(zpLayout_t a, zpLayout_t b, int r) {
  const zpSegment_t *sa, *sb;
  size_t na, nb;
  zpLayoutRankSegments(a, r, &sa, &na);
  zpLayoutRankSegments(b, r, &sb, &nb);
  int64_t kept = 0;
  for (size_t i = 0; i < na; i++)
    for (size_t j = 0; j < nb; j++)
      if (sa[i].seq == sb[j].seq) {
        int64_t lo = std::max(sa[i].start, sb[j].start), hi = std::min(sa[i].start + sa[i].count, sb[j].start + sb[j].count);
        if (hi > lo) kept += hi - lo;
      }
  return kept;
}

}  // namespace

int main(int argc, char** argv) {
  std::string file = ZP_SOURCE_DIR "/tests/data/prolong64k.txt";
  long tokensPerRank = 16384, iters = 20, warm = 3, check = 1, seed = 1;
  size_t minB = 256, maxB = 16384;
  CLI::App app("", "remap_perf");
  zp::cli::configure(app,
                     "usage: remap_perf [-L file] [-t tokens] [-b B] [-e B] [-n N] [-w N] [-c 0|1] [-s seed]\n", 14);
  app.description("Remap forward (linear -> attention layout) and inverse on the planner's\n"
                  "layouts of batches drawn from real sequence lengths, over token widths.");
  zp::cli::addValue(app, "-L", "file", "lengths, one per line (default tests/data/prolong64k.txt)",
                    [&](const std::string& v) { file = v; });
  zp::cli::addValue(app, "-t", "tokens", "tokens per rank in a batch (default 16384)",
                    zpbench::intFlag("-t", &tokensPerRank, 1));
  zp::cli::addValue(app, "-b", "B", "bytes per token, smallest (default 256), x2 steps",
                    zpbench::bytesFlag("-b", &minB));
  zp::cli::addValue(app, "-e", "B", "bytes per token, largest (default 16K)", zpbench::bytesFlag("-e", &maxB));
  zp::cli::addValue(app, "-n", "N", "timed iterations (default 20)", zpbench::intFlag("-n", &iters, 1));
  zp::cli::addValue(app, "-w", "N", "warm-up iterations (default 3)", zpbench::intFlag("-w", &warm, 0));
  zp::cli::addValue(app, "-c", "0|1", "check every byte of every forward and inverse (default 1)",
                    zpbench::intFlag("-c", &check, 0, 1));
  zp::cli::addValue(app, "-s", "seed", "batch seed (default 1)", zpbench::intFlag("-s", &seed, 0));
  zpbench::parseCommandLine(app, argc, argv, [&] {
    if (minB < 1 || maxB < minB) throw zp::cli::UsageError("-b must be at least 1 and at most -e");
  });
  zpComm_t comm;
  if (zpCommInitFromEnv(&comm, nullptr) != zpSuccess) die("init", nullptr);
  int n, rank;
  zpCommCount(comm, &n);
  zpCommUserRank(comm, &rank);
  // The batch: lengths from the file in a seeded order until n x tokensPerRank.
  std::vector<int64_t> all;
  std::ifstream f(file);
  for (int64_t x; f >> x;) all.push_back(x);
  if (all.empty()) {
    fprintf(stderr, "remap_perf: no lengths in %s\n", file.c_str());
    return 2;
  }
  std::mt19937_64 rng(seed);
  std::vector<int64_t> lens;
  int64_t budget = (int64_t)n * tokensPerRank, used = 0;
  for (size_t i = rng() % all.size(); used < budget; i = (i + 1) % all.size()) {
    int64_t l = std::min(all[i], budget - used);
    lens.push_back(l);
    used += l;
  }
  int nodes = zpbench::settingInt("ZP_NNODES", 1);
  if (nodes < 1 || n % nodes) nodes = 1;
  zpAttnShape_t shape = {32, 8, 128, 2, 1};
  zpClusterModel_t cluster = {nodes, n / nodes, 4, 200, 200, 312, 0.5};
  zpBatchPlan_t plan;
  if (zpPlanBatch(&plan, (int)lens.size(), lens.data(), &shape, &cluster, comm) != zpSuccess) die("plan", comm);
  zpLayout_t linear, attention;
  zpPlanGetLayout(plan, zpLinearLayout, &linear);
  zpPlanGetLayout(plan, zpAttentionLayout, &attention);
  zpRemap_t remap;
  if (zpRemapCreate(&remap, linear, attention, comm) != zpSuccess) die("remap create", comm);
  int64_t maxOff = 0, off = 0, myTok = 0;
  for (int r = 0; r < n; r++) {
    int64_t t;
    zpLayoutRankTokens(linear, r, &t);
    int64_t o = t - keptTokens(linear, attention, r);
    maxOff = std::max(maxOff, o);
    off += o;
    if (r == rank) myTok = t;
  }
  if (rank == 0) {
    printf("# remap_perf: %d ranks (%d nodes), %zu sequences, %lld tokens from %s; linear -> attention layout of "
           "zpPlanBatch; moved %.1f%% of tokens\n",
           n, nodes, lens.size(), (long long)used, file.c_str(), 100.0 * off / used);
    printf("# %10s %14s %12s %12s %10s %10s %8s\n", "B/token", "size(B)", "fwd(us)", "inv(us)", "algbw", "busbw",
           "#wrong");
  }
  unsigned long long wrongTotal = 0;
  for (size_t width = minB; width <= maxB; width *= 2) {
    std::vector<uint8_t> in = bufferOf(linear, rank, width, 0), want = check ? bufferOf(attention, rank, width, 0)
                                                                              : std::vector<uint8_t>();
    int64_t attTok;
    zpLayoutRankTokens(attention, rank, &attTok);
    std::vector<uint8_t> out(attTok * width), back(in.size());
    double tf = 0, ti = 0;
    unsigned long long wrong = 0;
    for (long it = 0; it < warm + iters; it++) {
      if (check) memset(out.data(), 0xA5, out.size()), memset(back.data(), 0x5A, back.size());
      barrier(comm, n);
      double t0 = now();
      if (zpRemapExecute(remap, in.data(), out.data(), width, zpUint8, 0, comm, nullptr) != zpSuccess) die("forward", comm);
      double t1 = now();
      barrier(comm, n);
      double t2 = now();
      if (zpRemapExecute(remap, out.data(), back.data(), width, zpUint8, 1, comm, nullptr) != zpSuccess) die("inverse", comm);
      double t3 = now();
      if (it >= warm) tf += t1 - t0, ti += t3 - t2;
      if (check) {
        for (size_t i = 0; i < out.size(); i++) wrong += out[i] != want[i];
        for (size_t i = 0; i < back.size(); i++) wrong += back[i] != in[i];
      }
    }
    // The slowest rank's times and everyone's wrong bytes, through an alltoallv to rank 0.
    double mine[3] = {tf / iters, ti / iters, (double)wrong};
    std::vector<double> got(3 * n);
    std::vector<size_t> sc(n, 0), sd(n, 0), rc(n, 0), rd(n, 0);
    sc[0] = 3;
    if (rank == 0)
      for (int r = 0; r < n; r++) rc[r] = 3, rd[r] = 3 * r;
    if (zpAlltoallv(mine, sc.data(), sd.data(), got.data(), rc.data(), rd.data(), zpFloat64, comm, nullptr) != zpSuccess)
      die("gather", comm);
    if (rank == 0) {
      double f = 0, v = 0, w = 0;
      for (int r = 0; r < n; r++) f = std::max(f, got[3 * r]), v = std::max(v, got[3 * r + 1]), w += got[3 * r + 2];
      size_t size = (size_t)(used / n) * width;
      printf("  %10zu %14zu %12.1f %12.1f %10.3f %10.3f %8.0f\n", width, size, f * 1e6, v * 1e6, size / f / 1e9,
             maxOff * (double)width / f / 1e9, check ? w : -1.0);
      wrongTotal += (unsigned long long)w;
    }
    (void)myTok;
  }
  if (rank == 0) printf("# algbw, busbw in GB/s (forward); #wrong: bytes wrong in forward and inverse, -1 unchecked\n");
  zpRemapDestroy(remap);
  zpPlanDestroy(plan);
  zpCommDestroy(comm);
  return wrongTotal ? 1 : 0;
}
