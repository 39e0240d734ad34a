// ring_perf: nccl-tests style table of ring exchanges (zpRingExchangeStart /
// Wait), for each kind of ring: all ranks, the ranks of one node, one rank
// per node; one-way and bidirectional. Every rank sends `size` bytes a step.
//   -b/-e  smallest / largest size (default 64K / 64M), x4 steps
//   -n/-w  timed / warm-up steps (default 20 / 3)
//   -c 0|1 check every byte of every step (default 1)
// algbw = size / step time; busbw = algbw (each link carries one block per
// step in each direction used).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "src/util/cli.h"
#include "zeppelin.h"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void die(const char* what, zpComm_t comm) {
  fprintf(stderr, "ring_perf: %s: %s\n", what, zpGetLastError(comm));
  exit(1);
}

uint8_t byteOf(int rank, long step, size_t i) { return (uint8_t)((rank * 131 + step * 7 + i * 2654435761u) >> 11); }

}  // namespace

int main(int argc, char** argv) {
  size_t minB = 64 << 10, maxB = 64 << 20;
  long iters = 20, warm = 3, check = 1;
  CLI::App app("", "ring_perf");
  zp::cli::configure(app, "usage: ring_perf [-b B] [-e B] [-n N] [-w N] [-c 0|1]\n", 14);
  app.description("Ring exchanges for rings of all ranks, one node's ranks and one rank per\n"
                  "node, one-way and bidirectional; every rank sends `size` bytes a step.");
  zp::cli::addValue(app, "-b", "B", "smallest size (default 64K), x4 steps", zpbench::bytesFlag("-b", &minB));
  zp::cli::addValue(app, "-e", "B", "largest size (default 64M)", zpbench::bytesFlag("-e", &maxB));
  zp::cli::addValue(app, "-n", "N", "timed steps (default 20)", zpbench::intFlag("-n", &iters, 1));
  zp::cli::addValue(app, "-w", "N", "warm-up steps (default 3)", zpbench::intFlag("-w", &warm, 0));
  zp::cli::addValue(app, "-c", "0|1", "check every byte of every step (default 1)",
                    zpbench::intFlag("-c", &check, 0, 1));
  zpbench::parseCommandLine(app, argc, argv, [&] {
    if (minB < 2 || maxB < minB) throw zp::cli::UsageError("-b must be at least 2 and at most -e");
  });
  zpComm_t comm;
  if (zpCommInitFromEnv(&comm, nullptr) != zpSuccess) die("init", nullptr);
  int n, rank;
  zpCommCount(comm, &n);
  zpCommUserRank(comm, &rank);
  int rpn = zpbench::settingInt("ZP_LOCAL_NRANKS", n);
  if (rpn < 1 || n % rpn) rpn = n;
  int nodes = n / rpn, node = rank / rpn;  // zprun numbers ranks node by node
  struct Kind {
    const char* name;
    std::vector<int> ranks;
  };
  std::vector<Kind> kinds;
  std::vector<int> all(n), local, across;
  for (int i = 0; i < n; i++) all[i] = i;
  for (int i = 0; i < rpn; i++) local.push_back(node * rpn + i);
  for (int k = 0; k < nodes; k++) across.push_back(k * rpn + rank % rpn);
  kinds.push_back({"all", all});
  if (nodes > 1 && rpn > 1) kinds.push_back({"node", local});
  if (nodes > 1) kinds.push_back({"across", across});
  if (rank == 0) {
    printf("# ring_perf: %d ranks (%d nodes x %d); kinds: all ranks, one node's ranks, one rank per node\n", n, nodes,
           rpn);
    printf("# %-7s %5s %12s %12s %10s %8s\n", "ring", "bidir", "size(B)", "time(us)", "algbw", "#wrong");
  }
  unsigned long long wrongAll = 0;
  for (const Kind& kind : kinds)
    for (int bidir = 0; bidir < 2; bidir++) {
      zpRing_t ring;
      if (zpRingCreate(&ring, comm, (int)kind.ranks.size(), kind.ranks.data(), bidir) != zpSuccess) die("ring", comm);
      for (size_t size = minB; size <= maxB; size *= 4) {
        std::vector<uint8_t> send(size), recv(size);
        double t = 0;
        unsigned long long wrong = 0;
        int G = (int)kind.ranks.size();
        int pos = 0;
        while (kind.ranks[pos] != rank) pos++;
        int prev = kind.ranks[(pos + G - 1) % G], next = kind.ranks[(pos + 1) % G];
        for (long it = 0; it < warm + iters; it++) {
          if (check) {
            for (size_t i = 0; i < size; i++) send[i] = byteOf(rank, it, i);
            memset(recv.data(), 0xA5, size);
          }
          double t0 = now();
          if (zpRingExchangeStart(ring, send.data(), size, recv.data(), size, nullptr) != zpSuccess ||
              zpRingExchangeWait(ring) != zpSuccess)
            die("exchange", comm);
          if (it >= warm) t += now() - t0;
          if (check)
            for (size_t i = 0; i < size; i++) {
              int from = bidir && i >= size / 2 ? next : prev;
              wrong += recv[i] != byteOf(from, it, i);
            }
        }
        // The slowest rank's time and all wrong bytes, gathered at rank 0.
        double mine[2] = {t / iters, (double)wrong};
        std::vector<double> got(2 * n);
        std::vector<size_t> sc(n, 0), sd(n, 0), rc(n, 0), rd(n, 0);
        sc[0] = 2;
        if (rank == 0)
          for (int r = 0; r < n; r++) rc[r] = 2, rd[r] = 2 * r;
        if (zpAlltoallv(mine, sc.data(), sd.data(), got.data(), rc.data(), rd.data(), zpFloat64, comm, nullptr) !=
            zpSuccess)
          die("gather", comm);
        if (rank == 0) {
          double tm = 0, w = 0;
          for (int r = 0; r < n; r++) tm = std::max(tm, got[2 * r]), w += got[2 * r + 1];
          printf("  %-7s %5d %12zu %12.1f %10.3f %8.0f\n", kind.name, bidir, size, tm * 1e6, size / tm / 1e9,
                 check ? w : -1.0);
          wrongAll += (unsigned long long)w;
        }
      }
      zpRingDestroy(ring);
    }
  if (rank == 0) printf("# algbw in GB/s: bytes a rank sends per step / step time (slowest rank)\n");
  zpCommDestroy(comm);
  return wrongAll ? 1 : 0;
}
