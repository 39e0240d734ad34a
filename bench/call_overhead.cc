// call_overhead: what a device call costs the calling host before it returns,
// with the peers' arguments checked first (ZP_CHECK_MODE=full) and without
// (local, the default), side by side in one run: two communicators over the
// same ranks, one per mode, used in alternating blocks of calls.
//
// One rank's host can be made late by --late-us per call (busy, before the
// call), as a data loader or a Python step would make it. With full checks
// every rank's call waits for that rank's arguments; with local checks a
// call only enqueues, so the others are not held back.
//
// Time per call is the host's, from entering the call to its return (the
// stream is synchronised only between blocks, outside the timing). Printed:
// per call kind and mode, the mean and median over calls, of the rank where
// they are largest.
//
//   zprun -n 4 build/bench/call_overhead --late-us 200        (a GPU)
//   FAKECUDA_DELAY_US=0 zprun -n 4 build/tests/call_overhead_double --late-us 200
#include <cuda_runtime_api.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench/common.h"
#include "include/zeppelin.h"

namespace {

void check(zpResult_t r, const char* what, zpComm_t comm) {
  if (r == zpSuccess) return;
  fprintf(stderr, "call_overhead: %s: %s: %s\n", what, zpGetErrorString(r), zpGetLastError(comm));
  exit(1);
}

void cudaCheck(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "call_overhead: %s: %s\n", what, cudaGetErrorString(e));
  exit(1);
}

double nowUs() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void busyUs(double us) {
  const double end = nowUs() + us;
  while (nowUs() < end) {
  }
}

}  // namespace

int main(int argc, char** argv) {
  int blocks = 40, perBlock = 50, lateRank = 0;
  double lateUs = 0;
  size_t count = 256;
  CLI::App app{"Host time per device call, ZP_CHECK_MODE=local against full, side by side"};
  app.add_option("--blocks", blocks, "blocks of calls per call kind and mode (alternating modes)")->check(CLI::Range(1, 100000));
  app.add_option("--per-block", perBlock, "calls per block")->check(CLI::Range(1, 100000));
  app.add_option("--late-us", lateUs, "microseconds one rank's host spends before each call")->check(CLI::Range(0.0, 1e6));
  app.add_option("--late-rank", lateRank, "the late rank")->check(CLI::Range(0, 1 << 24));
  app.add_option("--count", count, "float32 elements of the all-reduce, and per peer of the alltoallv")
      ->check(CLI::Range((size_t)1, (size_t)1 << 24));
  CLI11_PARSE(app, argc, argv);

  // The rank's GPU, as a trainer picks it (zprun's local rank).
  int devices = 0;
  cudaCheck(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  cudaCheck(cudaSetDevice(zpbench::settingInt("ZP_LOCAL_RANK", 0) % devices), "cudaSetDevice");

  zpConfig_t localCfg = ZP_CONFIG_INITIALIZER, fullCfg = ZP_CONFIG_INITIALIZER;
  localCfg.checkMode = zpCheckLocal;
  fullCfg.checkMode = zpCheckFull;
  zpComm_t comms[2] = {nullptr, nullptr};  // [0] local, [1] full
  check(zpCommInitFromEnv(&comms[0], &localCfg), "zpCommInitFromEnv", nullptr);
  int rank = 0, n = 0;
  check(zpCommUserRank(comms[0], &rank), "zpCommUserRank", comms[0]);
  check(zpCommCount(comms[0], &n), "zpCommCount", comms[0]);
  check(zpCommSplit(comms[0], 0, rank, &comms[1], &fullCfg), "zpCommSplit", comms[0]);

  cudaStream_t stream;
  cudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  void *send = nullptr, *recv = nullptr;
  cudaCheck(cudaMalloc(&send, count * n * 4), "cudaMalloc");
  cudaCheck(cudaMalloc(&recv, count * n * 4), "cudaMalloc");
  cudaCheck(cudaMemset(send, 0, count * n * 4), "cudaMemset");
  std::vector<size_t> counts(n, count), displs(n);
  for (int p = 0; p < n; p++) displs[p] = (size_t)p * count;

  struct Kind {
    const char* name;
    std::function<zpResult_t(zpComm_t)> call;
  } kinds[] = {
      {"allreduce", [&](zpComm_t c) { return zpAllReduce(send, recv, count, zpFloat32, zpSum, c, stream); }},
      {"alltoallv",
       [&](zpComm_t c) {
         return zpAlltoallv(send, counts.data(), displs.data(), recv, counts.data(), displs.data(), zpFloat32, c,
                            stream);
       }},
  };
  if (rank == 0)
    printf("# call_overhead: host time of a device call until it returns; %d ranks, %zu float32 %s; rank %d's host "
           "late by %.0f us per call\n# %-10s %-6s %10s %10s\n",
           n, count, "per call (alltoallv: per peer)", lateRank, lateUs, "call", "checks", "mean_us", "p50_us");
  for (const Kind& k : kinds) {
    std::vector<double> times[2];
    for (int b = 0; b < 2 * blocks; b++) {
      const int mode = b % 2;
      for (int i = 0; i < perBlock; i++) {
        if (rank == lateRank) busyUs(lateUs);
        const double t0 = nowUs();
        check(k.call(comms[mode]), k.name, comms[mode]);
        times[mode].push_back(nowUs() - t0);
      }
      cudaCheck(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    }
    for (int mode = 0; mode < 2; mode++) {
      std::vector<double>& t = times[mode];
      double stats[2] = {0, 0};  // mean, median
      for (double x : t) stats[0] += x / t.size();
      std::nth_element(t.begin(), t.begin() + t.size() / 2, t.end());
      stats[1] = t[t.size() / 2];
      double worst[2];  // of the ranks, on the host (NULL stream)
      check(zpAllReduce(stats, worst, 2, zpFloat64, zpMax, comms[0], nullptr), "zpAllReduce", comms[0]);
      if (rank == 0) printf("  %-10s %-6s %10.1f %10.1f\n", k.name, mode ? "full" : "local", worst[0], worst[1]);
    }
  }
  cudaCheck(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  cudaFree(send);
  cudaFree(recv);
  cudaStreamDestroy(stream);
  check(zpCommDestroy(comms[1]), "zpCommDestroy", comms[1]);
  check(zpCommDestroy(comms[0]), "zpCommDestroy", comms[0]);
  return 0;
}
