// attn_perf: how much of a ring's communication the attention driver hides
// behind the block kernel. One sequence split over a ring of all ranks (in
// rank order; launch on one node for an intra-node ring, one rank per node
// for an inter-node one), not causal (every step one kernel call on one
// key/value block) or causal (-C: zigzag chunks, every step a few calls on
// half the pairs). The block kernel does no arithmetic and touches no host
// memory: it sleeps (as the CPU does while a GPU kernel runs) for its share
// of the work, so that a rank's kernel calls of one step take T in all,
// with T set as a multiple of C, the measured time of one block's ring
// exchange alone. The driver's own work (merging partial outputs by their
// lse, adding gradients) runs on the CPU and counts.
//   -b BYTES   key/value block per rank, keys and values (default 8M)
//   -r LIST    kernel times as multiples of C (default 0.25,0.5,1,2,4)
//   -a 0|1     the kernel folds each block into the running output itself
//              (zpAttnConfig_t.kernelAccumulates; default 1, as a device
//              kernel must: the host cannot merge device memory), or the
//              driver merges partial outputs on the CPU (0)
//   -C         causal (zigzag)
//   -n/-w      timed / warm-up passes (default 5 / 1)
//   -G 1       device buffers on a CUDA stream (a build with CUDA): the
//              kernel is a host function on the stream that sleeps for its
//              share (it holds the stream as a kernel would, without a GPU
//              kernel of its own), the driver's merges and additions are
//              device kernels, exchanges run on the driver's own stream, and
//              every pass and exchange ends with a stream synchronisation
// Columns: per step = pass time / G (G kernel steps, G-1 exchanges forward;
// backward also carries the key/value gradients, so its C is measured with
// twice the bytes); vs max = per step / max(T, C) (1.00: the slower of the
// two sets the pace, nothing else shows); hidden = the share of the
// exchanges' time that did not add to the pass: 1 - (pass - G*T) / ((G-1)*C)
// forward; backward moves G-1 blocks and G gradients, (G-1/2) * C2 with C2
// measured for a block and its gradient together. When the kernel is the
// faster, at most the kernel's time can hide exchanges.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "device.h"
#include "src/util/cli.h"
#include "src/util/strings.h"
#include "zeppelin.h"

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

void die(const char* what, zpComm_t comm) {
  fprintf(stderr, "attn_perf: %s: %s\n", what, zpGetLastError(comm));
  if (comm) zpCommAbort(comm);
  exit(1);
}

// T for a whole block pair (blockTokens x blockTokens); a call on part of
// one (the driver may cut a block's rows in two) takes its share.
struct TimedKernel {
  double seconds = 0;
  double blockTokens = 1;
};

void sleepUntil(double t) {
  double left = t - now();
  if (left <= 0) return;
  timespec ts;
  ts.tv_sec = (time_t)left;
  ts.tv_nsec = (long)((left - (double)ts.tv_sec) * 1e9);
  nanosleep(&ts, nullptr);
}

// Like a GPU kernel, it leaves host memory alone: the driver's buffers it
// would write hold zeros from the start (vectors, and the driver's scratch),
// so the merges see numbers.
zpResult_t timedKernel(const zpAttnBlock_t* b, void* user) {
  const TimedKernel* k = (const TimedKernel*)user;
  double share = (double)b->sq * (double)b->sk / (k->blockTokens * k->blockTokens);
  if (b->mask == zpMaskCausal) share /= 2;
  if (!b->stream) {
    sleepUntil(now() + k->seconds * share);
    return zpSuccess;
  }
#ifdef ZP_BENCH_CUDA
  // On the stream: a host function holds it for the kernel's time.
  double* seconds = new double(k->seconds * share);
  auto sleepFor = [](void* p) {
    sleepUntil(now() + *(double*)p);
    delete (double*)p;
  };
  if (cudaLaunchHostFunc((cudaStream_t)b->stream, sleepFor, seconds) == cudaSuccess) return zpSuccess;
  delete seconds;
#endif
  return zpUnhandledCudaError;
}

}  // namespace

int main(int argc, char** argv) {
  size_t blockBytes = 8u << 20;
  std::vector<double> rs = {0.25, 0.5, 1, 2, 4};
  long iters = 5, warm = 1, accumulate = 1, gpu = 0;
  bool causal = false;
  CLI::App app("", "attn_perf");
  zp::cli::configure(app, "usage: attn_perf [-b BYTES] [-r R1,R2,...] [-a 0|1] [-C] [-n N] [-w N] [-G 0|1]\n", 14);
  app.description("How much of a ring's communication the attention driver hides behind a\n"
                  "block kernel that takes a set time T, a multiple of C (one block's exchange).");
  zp::cli::addValue(app, "-b", "BYTES", "key/value block per rank, keys and values (default 8M)",
                    zpbench::bytesFlag("-b", &blockBytes));
  zp::cli::addValue(app, "-r", "LIST", "kernel times as multiples of C (default 0.25,0.5,1,2,4)",
                    [&](const std::string& ratios) {
                      rs.clear();
                      for (size_t at = 0; at < ratios.size();) {
                        size_t end = ratios.find(',', at);
                        if (end == std::string::npos) end = ratios.size();
                        std::string item = ratios.substr(at, end - at);
                        double r = 0;
                        if (!zp::parseDouble(item, 0, DBL_MAX, &r))
                          throw zp::cli::UsageError("-r: '" + item + "' is not a non-negative number");
                        rs.push_back(r);
                        at = end + 1;
                      }
                    });
  zp::cli::addValue(app, "-a", "0|1",
                    "the kernel folds each block into the running output\n"
                    "itself (default 1), or the driver merges on the CPU (0)",
                    zpbench::intFlag("-a", &accumulate, 0, 1));
  zp::cli::addFlag(app, "-C", &causal, "causal (zigzag)");
  zp::cli::addValue(app, "-n", "N", "timed passes (default 5)", zpbench::intFlag("-n", &iters, 1));
  zp::cli::addValue(app, "-w", "N", "warm-up passes (default 1)", zpbench::intFlag("-w", &warm, 0));
  zp::cli::addValue(app, "-G", "0|1", "device buffers on a CUDA stream (default 0)", zpbench::intFlag("-G", &gpu, 0, 1));
  const int H = 8, Hk = 8, D = 64;
  const size_t tokenBytes = 2 * (size_t)Hk * D * sizeof(float);
  zpbench::parseCommandLine(app, argc, argv, [&] {
    if (blockBytes < tokenBytes)
      throw zp::cli::UsageError(zp::strprintf("-b must be at least %zu bytes", tokenBytes));
  });
  const int64_t tokens = (int64_t)(blockBytes / tokenBytes);
  if (gpu && !zpbench::kDeviceBuild) {
    fprintf(stderr, "attn_perf: -G 1 needs a build with CUDA (ZP_WITH_CUDA)\n");
    return 2;
  }
  if (gpu) zpbench::useLocalDevice();
  zpComm_t comm;
  if (zpCommInitFromEnv(&comm, nullptr) != zpSuccess) die("init", nullptr);
  int n, rank;
  zpCommCount(comm, &n);
  zpCommUserRank(comm, &rank);
  if (n < 2) {
    fprintf(stderr, "attn_perf: needs at least 2 ranks (a ring)\n");
    return 2;
  }
  const int rpn = zpbench::settingInt("ZP_LOCAL_NRANKS", n);
  std::vector<int> ring(n);
  for (int i = 0; i < n; i++) ring[i] = i;

  // Every rank joins before and after each timed pass.
  std::vector<size_t> ones(n, 1), displs(n);
  for (int i = 0; i < n; i++) displs[i] = i;
  std::vector<char> bs(n), br(n);
  auto barrier = [&] {
    if (zpAlltoallv(bs.data(), ones.data(), displs.data(), br.data(), ones.data(), displs.data(), zpUint8, comm,
                    nullptr) != zpSuccess)
      die("barrier", comm);
  };

  // -G 1: the stream of every call, device buffers, and the wait that ends
  // a timed exchange or pass (the device's time, as in nccl-tests).
  zpStream_t stream = nullptr;
  std::vector<void*> deviceBuffers;
  auto buffer = [&](std::vector<float>& host) -> void* {
#ifdef ZP_BENCH_CUDA
    if (gpu) {
      void* d = nullptr;
      zpbench::cudaCheck(cudaMalloc(&d, host.size() * sizeof(float)), "cudaMalloc");
      zpbench::cudaCheck(cudaMemcpy(d, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy");
      deviceBuffers.push_back(d);
      return d;
    }
#endif
    return host.data();
  };
  auto finish = [&] {
#ifdef ZP_BENCH_CUDA
    if (stream) zpbench::cudaCheck(cudaStreamSynchronize((cudaStream_t)stream), "cudaStreamSynchronize");
#endif
  };
#ifdef ZP_BENCH_CUDA
  if (gpu) {
    cudaStream_t s = nullptr;
    zpbench::cudaCheck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    stream = (zpStream_t)s;
  }
#endif

  // C: one block's exchange alone (and twice the bytes, for backward).
  auto exchangeSeconds = [&](size_t bytes) {
    zpRing_t r = nullptr;
    if (zpRingCreate(&r, comm, n, ring.data(), 0) != zpSuccess) die("zpRingCreate", comm);
    // Buffers taken in turn, as the driver's are: one pair used again and
    // again would stay in the caches and make C look shorter than a
    // block's transfer in a pass.
    std::vector<std::vector<float>> send(4, std::vector<float>(bytes / 4, 1)), recv(4, std::vector<float>(bytes / 4, 0));
    std::vector<void*> sendAt, recvAt;
    for (int i = 0; i < 4; i++) {
      sendAt.push_back(buffer(send[i]));
      recvAt.push_back(buffer(recv[i]));
    }
    std::vector<double> t;
    for (long i = 0; i < warm + 4 * iters; i++) {  // more samples: T is set from it
      barrier();
      double t0 = now();
      if (zpRingExchangeStart(r, sendAt[i % 4], bytes, recvAt[i % 4], bytes, stream) != zpSuccess ||
          zpRingExchangeWait(r))
        die("ring exchange", comm);
      finish();
      if (i >= warm) t.push_back(now() - t0);
    }
    zpRingDestroy(r);
    return zpbench::median(t);
  };
  const size_t kvBytes = (size_t)tokens * tokenBytes;
  const double C = exchangeSeconds(kvBytes), C2 = exchangeSeconds(2 * kvBytes);

  const int64_t len = tokens * n;
  size_t offs[2] = {0, (size_t)n};
  zpBatchPlan_t plan = nullptr;
  if (zpPlanCreate(&plan, 1, &len, causal ? 1 : 0, n, rpn, offs, ring.data()) != zpSuccess) die("zpPlanCreate", comm);
  TimedKernel kern;
  kern.blockTokens = (double)tokens;
  zpAttnConfig_t cfg = {H, Hk, D, 0.0f, timedKernel, timedKernel, &kern, accumulate ? 1 : 0, zpFloat32};
  zpAttention_t attn = nullptr;
  if (zpAttentionCreate(&attn, plan, &cfg, comm) != zpSuccess) die("zpAttentionCreate", comm);
  std::vector<float> qh(tokens * H * D, 0.5f), kh(tokens * Hk * D, 0.5f), vh(tokens * Hk * D, 0.5f),
      outh(tokens * H * D), lseh(tokens * H), dqh(qh.size()), dkh(kh.size()), dvh(vh.size());
  void *q = buffer(qh), *k = buffer(kh), *v = buffer(vh), *out = buffer(outh), *dq = buffer(dqh), *dk = buffer(dkh),
       *dv = buffer(dvh);
  float* lse = (float*)buffer(lseh);

  if (rank == 0) {
    printf("# attn_perf: ring of %d ranks (%s), one sequence of %lld tokens, %lld per rank, %s; %s; %s\n", n,
           rpn >= n ? "one node" : "across nodes", (long long)len, (long long)tokens,
           causal ? "causal (zigzag)" : "not causal",
           accumulate ? "the kernel folds blocks in (-a 1)"
                      : gpu ? "the driver merges blocks by device kernels (-a 0)"
                            : "the driver merges blocks on the CPU (-a 0)",
           gpu ? "device buffers on a stream (-G 1)" : "host buffers");
    printf("# key/value block %zu bytes; C (one block's exchange alone) = %.3f ms, backward (with gradients) = %.3f ms\n",
           kvBytes, C * 1e3, C2 * 1e3);
    printf("#\n# %6s %9s | %12s %12s %8s %7s | %12s %12s %8s %7s\n", "T/C", "T(ms)", "fwd pass(ms)", "per step(ms)",
           "vs max", "hidden", "bwd pass(ms)", "per step(ms)", "vs max", "hidden");
  }
  for (double r : rs) {
    // Causal zigzag steps cover half of a block pair's work.
    const double T = r * C;
    kern.seconds = causal ? 2 * T : T;
    std::vector<double> tf, tb;
    for (long i = 0; i < warm + iters; i++) {
      barrier();
      double t0 = now();
      if (zpAttentionForward(attn, q, k, v, out, lse, stream) != zpSuccess) die("zpAttentionForward", comm);
      finish();
      double t1 = now();
      barrier();
      double t2 = now();
      if (zpAttentionBackward(attn, q, k, v, out, lse, q, dq, dk, dv, stream) != zpSuccess)
        die("zpAttentionBackward", comm);
      finish();
      double t3 = now();
      if (i >= warm) {
        tf.push_back(t1 - t0);
        tb.push_back(t3 - t2);
      }
    }
    if (rank != 0) continue;
    const double f = zpbench::median(tf), b = zpbench::median(tb);
    auto hidden = [&](double pass, double c, double hops) {
      return std::min(1.0, std::max(0.0, 1.0 - (pass - n * T) / (hops * c)));
    };
    printf("  %6.2f %9.3f | %12.3f %12.3f %8.2f %6.0f%% | %12.3f %12.3f %8.2f %6.0f%%\n", r, T * 1e3, f * 1e3,
           f / n * 1e3, f / n / std::max(T, C), 100 * hidden(f, C, n - 1), b * 1e3, b / n * 1e3,
           b / n / std::max(T, C2), 100 * hidden(b, C2, n - 0.5));
  }
  zpAttentionDestroy(attn);
  zpPlanDestroy(plan);
#ifdef ZP_BENCH_CUDA
  for (void* d : deviceBuffers) cudaFree(d);
  if (stream) cudaStreamDestroy((cudaStream_t)stream);
#endif
  zpCommDestroy(comm);
  return 0;
}
