// plan_step: a plan measured against its model (issue 23). One variable-length
// batch's attention, forward and backward, run by the ring-attention driver
// with the reference CPU kernels on host memory, under two plans of the same
// batch: the planner's (idle-aware, run in the order it carries) and the
// legacy planner's (loads summed per rank, rings by class and size). For
// each, the step model's prediction (src/sim/simulator.h, the plan's
// attention with its waits and exposed communication, no linear layers) for
// a calibration of this machine (bench/calibrate.py), and the measured time.
//
//   zprun --nodes 2 --ranks-per-node 2 --nics-per-node 2 --nic-rate 1gbit
//     build/bench/plan_step --calibration machine.json --lengths FILE
//
// The shape is the one calibrate.py measures (2 query heads, 1 key/value
// head of 64, float32), and the plans are made for the calibration's
// cluster with this job's nodes and ranks per node. Two kernels:
//  - ref (default): the reference CPU kernels. --share scales the
//    calibration's compute rate: calibrate.py measures one thread alone, and
//    ranks that outnumber the cores get a share of one (default: this
//    machine's cores over the job's ranks, at most 1, as on an emulated
//    cluster, where every rank runs here). Ranks that wait give their core
//    to the others, which the model cannot know: use as many ranks as cores.
//  - sleep: each block call sleeps for its FLOPs at the calibration's rate
//    at its best efficiency (the model then uses that one efficiency), as a
//    GPU kernel leaves the CPU free; it computes nothing. Any number of
//    ranks share the cores faithfully, and model and measurement differ
//    only by what the plan's schedule, the network and the driver add.
// --model-only prints the model's rows without running the passes.
// Columns: the model's forward and backward seconds (its waits and exposed
// communication included) and its idle; measured, the median and the least
// over -n passes of the slowest rank's forward and backward; their ratio;
// the measured forward alone (the model charges a backward 2.5 forwards,
// cost_model.h's kAttnBackwardFlops, as FlashAttention-2's is; the reference
// CPU kernel's is about one).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common.h"
#include "src/sim/calibration.h"
#include "src/plan/planner.h"
#include "src/sim/simulator.h"
#include "src/util/cli.h"
#include "src/util/strings.h"
#include "zeppelin.h"

namespace {

using namespace zp::plan;
using namespace zp::sim;

[[noreturn]] void die(const char* what, zpComm_t comm) {
  fprintf(stderr, "plan_step: %s: %s\n", what, zpGetLastError(comm));
  if (comm) zpCommAbort(comm);
  exit(1);
}

// The kernel calibrate.py measures (micro_bench BM_AttnRefCausal).
constexpr int kQHeads = 2, kKvHeads = 1, kHeadDim = 64;

// The sleeping kernel: a block's FLOPs (cost_model.h's count: 4 sq sk
// heads dim, halved under a causal mask; backward kAttnBackwardFlops times
// that) at `flopsPerSecond`; the last 200 us spun, as sleeps overshoot.
struct SleepRate {
  double flopsPerSecond;
};
void sleepFor(double seconds) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  if (seconds > 200e-6) std::this_thread::sleep_for(std::chrono::duration<double>(seconds - 200e-6));
  while (std::chrono::steady_clock::now() < until) {
  }
}
double blockFlops(const zpAttnBlock_t* b) {
  if (b->mask == zpMaskSkip) return 0;
  return 4.0 * double(b->sq) * double(b->sk) * b->qHeads * b->headDim * (b->mask == zpMaskCausal ? 0.5 : 1.0);
}
zpResult_t sleepForward(const zpAttnBlock_t* b, void* user) {
  sleepFor(blockFlops(b) / static_cast<SleepRate*>(user)->flopsPerSecond);
  return zpSuccess;
}
zpResult_t sleepBackward(const zpAttnBlock_t* b, void* user) {
  sleepFor(kAttnBackwardFlops * blockFlops(b) / static_cast<SleepRate*>(user)->flopsPerSecond);
  return zpSuccess;
}

// The C API plan of an internal one: its rings and its order.
zpBatchPlan_t toApi(const BatchPlan& p, int nranks, int ranksPerNode, bool causal, zpComm_t comm) {
  std::vector<int64_t> lens;
  std::vector<size_t> offsets = {0};
  std::vector<int> ranks;
  for (const SeqPlacement& s : p.seqs) {
    lens.push_back(s.len);
    ranks.insert(ranks.end(), s.ranks.begin(), s.ranks.end());
    offsets.push_back(ranks.size());
  }
  zpBatchPlan_t out = nullptr;
  if (zpPlanCreate(&out, int(lens.size()), lens.data(), causal, nranks, ranksPerNode, offsets.data(), ranks.data()) !=
      zpSuccess)
    die("zpPlanCreate", comm);
  if (zpPlanSetRingOrder(out, int(p.order.size()), p.order.data()) != zpSuccess) die("zpPlanSetRingOrder", comm);
  return out;
}

struct Measured {
  std::vector<double> seconds;  // per forward and backward, the slowest rank's
  std::vector<double> forward;  // the slowest rank's forward alone
};

// Forward and backward passes of the driver under `plan`, each between two
// barriers; the slowest rank's time per pass.
Measured run(zpBatchPlan_t plan, const SleepRate* sleep, int passes, int warm, int rank, zpComm_t comm) {
  zpLayout_t layout;
  if (zpPlanGetLayout(plan, zpAttentionLayout, &layout) != zpSuccess) die("zpPlanGetLayout", comm);
  int64_t T = 0;
  if (zpLayoutRankTokens(layout, rank, &T) != zpSuccess) die("zpLayoutRankTokens", comm);
  const size_t nq = size_t(T) * kQHeads * kHeadDim, nk = size_t(T) * kKvHeads * kHeadDim;
  std::mt19937 rng(1234 + rank);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> q(nq), k(nk), v(nk), out(nq), dout(nq), dq(nq), dk(nk), dv(nk), lse(size_t(T) * kQHeads);
  for (auto* b : {&q, &k, &v, &dout})
    for (float& x : *b) x = u(rng);
  zpAttnConfig_t cfg = {};
  cfg.qHeads = kQHeads;
  cfg.kvHeads = kKvHeads;
  cfg.headDim = kHeadDim;
  cfg.forward = sleep ? sleepForward : zpAttnRefForward;
  cfg.backward = sleep ? sleepBackward : zpAttnRefBackward;
  cfg.user = const_cast<SleepRate*>(sleep);
  cfg.kernelAccumulates = 1;
  cfg.datatype = zpFloat32;
  zpAttention_t attn;
  if (zpAttentionCreate(&attn, plan, &cfg, comm) != zpSuccess) die("zpAttentionCreate", comm);
  Measured m;
  for (int i = 0; i < warm + passes; ++i) {
    if (zpBarrier(comm, nullptr) != zpSuccess) die("zpBarrier", comm);
    const double t0 = zpbench::nowSeconds();
    if (zpAttentionForward(attn, q.data(), k.data(), v.data(), out.data(), lse.data(), nullptr) != zpSuccess)
      die("zpAttentionForward", comm);
    const double fwd = zpbench::nowSeconds() - t0;
    if (zpAttentionBackward(attn, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                            dk.data(), dv.data(), nullptr) != zpSuccess)
      die("zpAttentionBackward", comm);
    double t[2] = {zpbench::nowSeconds() - t0, fwd}, slowest[2];
    if (zpAllReduce(t, slowest, 2, zpFloat64, zpMax, comm, nullptr) != zpSuccess) die("zpAllReduce", comm);
    if (i >= warm) m.seconds.push_back(slowest[0]), m.forward.push_back(slowest[1]);
  }
  zpAttentionDestroy(attn);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  std::string lengthsFile, calibrationFile;
  long divide = 64, perRank = 8192, passes = 3, warm = 1;
  long seed = 1;
  double share = 0;
  bool modelOnly = false;
  long ranksPerNode = 0;
  std::string kernel = "ref";
  CLI::App app("", "plan_step");
  zp::cli::configure(app,
                     "usage: plan_step --calibration FILE --lengths FILE [--divide N] [--tokens-per-rank N]\n"
                     "                 [--seed X] [--kernel ref|sleep] [--share X] [--ranks-per-node N] [--model-only]\n"
                     "                 [-n N] [-w N]\n",
                     24);
  app.description("A batch's attention, forward and backward, under the planner's plan and the legacy\n"
                  "planner's: measured, and predicted by the step model for a calibration (issue 23).");
  zp::cli::addValue(app, "--calibration", "FILE", "bench/calibrate.py's file for this machine\n(or a preset: a800, h800, h200)",
                    [&](const std::string& s) { calibrationFile = s; });
  zp::cli::addValue(app, "--lengths", "FILE", "one sequence length per line", [&](const std::string& s) { lengthsFile = s; });
  zp::cli::addValue(app, "--divide", "N", "every length divided by N, at least 1 (default 64)",
                    zpbench::intFlag("--divide", &divide, 1));
  zp::cli::addValue(app, "--tokens-per-rank", "N", "the batch's tokens per rank (default 8192)",
                    zpbench::intFlag("--tokens-per-rank", &perRank, 1));
  zp::cli::addValue(app, "--seed", "X", "the batch's draw (default 1)", zpbench::intFlag("--seed", &seed, 0));
  zp::cli::addValue(app, "--share", "X", "share of the calibration's compute rate per rank", [&](const std::string& s) {
    if (!zp::parseDouble(s, 1e-6, 1, &share)) throw zp::cli::UsageError("--share: '" + s + "' is not in (0, 1]");
  });
  zp::cli::addValue(app, "--ranks-per-node", "N", "the plans' ranks per node (default: the launcher's)",
                    zpbench::intFlag("--ranks-per-node", &ranksPerNode, 1));
  zp::cli::addValue(app, "--kernel", "ref|sleep", "the block kernels (default ref)", [&](const std::string& k) {
    if (k != "ref" && k != "sleep") throw zp::cli::UsageError("--kernel: '" + k + "' is not ref or sleep");
    kernel = k;
  });
  zp::cli::addFlag(app, "--model-only", &modelOnly, "the model's rows only, no passes run");
  zp::cli::addValue(app, "-n", "N", "timed passes (default 3)", zpbench::intFlag("-n", &passes, 1));
  zp::cli::addValue(app, "-w", "N", "warm-up passes (default 1)", zpbench::intFlag("-w", &warm, 0));
  zpbench::parseCommandLine(app, argc, argv, [&] {
    if (lengthsFile.empty() || calibrationFile.empty())
      throw zp::cli::UsageError("--calibration and --lengths are required");
  });

  Calibration cal;
  try {
    if (!calibrationPreset(calibrationFile, &cal)) cal = readCalibration(calibrationFile);
  } catch (const std::exception& e) {
    fprintf(stderr, "plan_step: %s\n", e.what());
    return 2;
  }
  std::vector<int64_t> all;
  {
    std::ifstream f(lengthsFile);
    int64_t x;
    while (f >> x) all.push_back(std::max<int64_t>(1, x / divide));
    if (all.empty()) {
      fprintf(stderr, "plan_step: no lengths in '%s'\n", lengthsFile.c_str());
      return 2;
    }
  }

  zpComm_t comm;
  if (zpCommInitFromEnv(&comm, nullptr) != zpSuccess) die("init", nullptr);
  int n, rank;
  zpCommCount(comm, &n);
  zpCommUserRank(comm, &rank);
  const char* local = getenv("ZP_LOCAL_NRANKS");
  const int rpn = ranksPerNode > 0 ? int(ranksPerNode) : local ? std::max(1, atoi(local)) : n;
  if (n % rpn != 0) {
    if (rank == 0) fprintf(stderr, "plan_step: %d ranks per node do not divide the %d ranks\n", rpn, n);
    zpCommDestroy(comm);
    return 2;
  }
  // calibrate.py measured one thread alone; on an emulated cluster every
  // rank of the job shares this machine's cores.
  const bool sleeping = kernel == "sleep";
  if (share == 0) share = sleeping ? 1 : std::min(1.0, double(std::thread::hardware_concurrency()) / n);

  ClusterModel c = cal.cluster;
  c.nodes = n / rpn;
  c.ranksPerNode = rpn;
  c.tflops *= share;
  SleepRate rate{0};
  if (sleeping) {  // the kernel's best rate for every block, and the model's too
    double best = c.attnEfficiency.empty() ? c.efficiency : 0;
    for (const auto& point : c.attnEfficiency) best = std::max(best, point.second);
    c.attnEfficiency.clear();
    c.efficiency = best;
    rate.flopsPerSecond = c.tflops * 1e12 * best;
  }
  StepConfig step;
  step.causal = true;
  step.recompute = false;
  step.model.layers = 1;
  step.model.hidden = step.model.ffn = 1;  // the linear layers are not run
  step.model.attn = {kQHeads, kKvHeads, kHeadDim, int(sizeof(float))};
  std::mt19937_64 rng(seed);
  const std::vector<int64_t> lens = formBatch(all, perRank * n, rng);

  PlanOptions planner, legacy;
  planner.forwardPasses = legacy.forwardPasses = 1;
  legacy.legacy = true;
  struct Row {
    const char* name;
    BatchPlan plan;
  };
  std::vector<Row> rows = {{"planner", planBatch(lens, true, step.model.attn, c, planner)},
                           {"legacy", planBatch(lens, true, step.model.attn, c, legacy)}};
  if (rank == 0) {
    int64_t total = 0, longest = 0;
    for (int64_t l : lens) total += l, longest = std::max(longest, l);
    printf("# %d ranks (%d nodes x %d), %zu sequences, %lld tokens (longest %lld), seed %ld; %s /%ld\n", n, c.nodes,
           rpn, lens.size(), (long long)total, (long long)longest, seed, lengthsFile.c_str(), divide);
    printf("# model: calibration %s, %s kernel, compute share %.2f\n", calibrationFile.c_str(), kernel.c_str(), share);
    printf("%-8s %10s %10s %10s %10s %10s %10s\n", "plan", "model s", "idle s", "measured", "min", "meas/model",
           "forward");
  }
  for (const Row& r : rows) {
    const StrategyResult model = simulatePlan(r.plan, step, c, false);
    const double attn = model.stepSeconds - model.parts.linear;
    if (modelOnly) {
      if (rank == 0) printf("%-8s %10.3f %10.3f\n", r.name, attn, model.parts.idle);
      continue;
    }
    zpBatchPlan_t api = toApi(r.plan, n, rpn, true, comm);
    const Measured m = run(api, sleeping ? &rate : nullptr, int(passes), int(warm), rank, comm);
    zpPlanDestroy(api);
    const double measured = zpbench::median(m.seconds);
    if (rank == 0)
      printf("%-8s %10.3f %10.3f %10.3f %10.3f %10.2f %10.3f\n", r.name, attn, model.parts.idle, measured,
             *std::min_element(m.seconds.begin(), m.seconds.end()), measured / attn, zpbench::median(m.forward));
  }
  zpCommDestroy(comm);
  return 0;
}
