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
// --steps K measures planning ahead instead (issue 39): K batches one after
// another, each run with its plan (made beforehand), while each step also
// plans a batch of a larger job through the C API (--plan-ranks ranks of
// the h800 preset, Llama-3-8B, --plan-tokens-per-rank): inline (zpPlanBatch
// before the passes) or ahead (zpPlanBatchAhead of the next batch, waited
// for after them), -n rounds of each in turn. With the sleeping kernel the
// CPU is free while a block "runs", as a GPU kernel leaves it.
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
#include <stdexcept>
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

// One plan's attention on this rank, ready to run: its buffers (random
// inputs) and the driver.
class Passes {
 public:
  Passes(zpBatchPlan_t plan, const SleepRate* sleep, int rank, zpComm_t comm) : comm_(comm) {
    zpLayout_t layout;
    if (zpPlanGetLayout(plan, zpAttentionLayout, &layout) != zpSuccess) die("zpPlanGetLayout", comm);
    int64_t T = 0;
    if (zpLayoutRankTokens(layout, rank, &T) != zpSuccess) die("zpLayoutRankTokens", comm);
    const size_t nq = size_t(T) * kQHeads * kHeadDim, nk = size_t(T) * kKvHeads * kHeadDim;
    std::mt19937 rng(1234 + rank);
    std::uniform_real_distribution<float> u(-1, 1);
    for (auto* b : {&q_, &out_, &dout_, &dq_}) b->resize(nq);
    for (auto* b : {&k_, &v_, &dk_, &dv_}) b->resize(nk);
    lse_.resize(size_t(T) * kQHeads);
    for (auto* b : {&q_, &k_, &v_, &dout_})
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
    if (zpAttentionCreate(&attn_, plan, &cfg, comm) != zpSuccess) die("zpAttentionCreate", comm);
  }
  ~Passes() { zpAttentionDestroy(attn_); }
  Passes(const Passes&) = delete;
  Passes& operator=(const Passes&) = delete;
  void forward() {
    if (zpAttentionForward(attn_, q_.data(), k_.data(), v_.data(), out_.data(), lse_.data(), nullptr) != zpSuccess)
      die("zpAttentionForward", comm_);
  }
  void backward() {
    if (zpAttentionBackward(attn_, q_.data(), k_.data(), v_.data(), out_.data(), lse_.data(), dout_.data(),
                            dq_.data(), dk_.data(), dv_.data(), nullptr) != zpSuccess)
      die("zpAttentionBackward", comm_);
  }

 private:
  zpComm_t comm_;
  zpAttention_t attn_ = nullptr;
  std::vector<float> q_, k_, v_, out_, dout_, dq_, dk_, dv_, lse_;
};

// The slowest rank's value of each of t[0..n).
void slowest(double* t, int n, zpComm_t comm) {
  std::vector<double> in(t, t + n);
  if (zpAllReduce(in.data(), t, size_t(n), zpFloat64, zpMax, comm, nullptr) != zpSuccess) die("zpAllReduce", comm);
}

struct Measured {
  std::vector<double> seconds;  // per forward and backward, the slowest rank's
  std::vector<double> forward;  // the slowest rank's forward alone
};

// Forward and backward passes of the driver under `plan`, each between two
// barriers; the slowest rank's time per pass.
Measured run(zpBatchPlan_t plan, const SleepRate* sleep, int passes, int warm, int rank, zpComm_t comm) {
  Passes attn(plan, sleep, rank, comm);
  Measured m;
  for (int i = 0; i < warm + passes; ++i) {
    if (zpBarrier(comm, nullptr) != zpSuccess) die("zpBarrier", comm);
    const double t0 = zpbench::nowSeconds();
    attn.forward();
    const double fwd = zpbench::nowSeconds() - t0;
    attn.backward();
    double t[2] = {zpbench::nowSeconds() - t0, fwd};
    slowest(t, 2, comm);
    if (i >= warm) m.seconds.push_back(t[0]), m.forward.push_back(t[1]);
  }
  return m;
}

// The plan-ahead measurement (--steps): what planning adds to a step,
// planned inline and planned ahead.
struct AheadSetup {
  // The planned job's batches (full lengths): one per step and one more
  // (each step plans one batch either way: inline its own, ahead the next).
  std::vector<std::vector<int64_t>> big;
  zpAttnShape_t shape;                    // the planned job's model
  zpClusterModel_t cluster;               // the planned job's cluster
  std::vector<zpBatchPlan_t> runs;        // each step's plan on this job (made beforehand)
  const SleepRate* sleep;
};

// Steps one after another; each runs its batch's plan (forward and
// backward) and plans a batch of the planned job through the C API:
// inline, its own batch before its passes (zpPlanBatch); ahead, the next
// step's batch on the planner's thread while its passes run
// (zpPlanBatchAhead, waited for once they end; the first step's batch is
// planned before the steps, as a job plans its first batch before it
// starts). Per step, the slowest rank's seconds from the step's start
// until its passes are done and the next plan is in hand; and the planning
// alone (inline) or the wait for it after the passes (ahead).
void aheadSteps(const AheadSetup& in, bool ahead, int rank, zpComm_t comm, std::vector<double>* step,
                std::vector<double>* planning) {
  // Batch k planned: on the planner's thread (handle), or here.
  auto plan = [&](size_t k, zpPlanAhead_t* handle) {
    const std::vector<int64_t>& lens = in.big[k];
    if (handle) {
      if (zpPlanBatchAhead(handle, int(lens.size()), lens.data(), &in.shape, &in.cluster, nullptr) != zpSuccess)
        die("zpPlanBatchAhead", comm);
      return;
    }
    zpBatchPlan_t p = nullptr;
    if (zpPlanBatch(&p, int(lens.size()), lens.data(), &in.shape, &in.cluster, nullptr) != zpSuccess)
      die("zpPlanBatch", comm);
    zpPlanDestroy(p);
  };
  auto wait = [&](zpPlanAhead_t handle) {
    zpBatchPlan_t p = nullptr;
    if (zpPlanAheadWait(handle, &p) != zpSuccess) die("zpPlanAheadWait", comm);
    zpPlanDestroy(p);
  };
  zpPlanAhead_t next = nullptr;
  if (ahead) plan(0, &next), wait(next);  // the first batch, before the steps
  for (size_t k = 0; k < in.runs.size(); ++k) {
    Passes attn(in.runs[k], in.sleep, rank, comm);
    if (zpBarrier(comm, nullptr) != zpSuccess) die("zpBarrier", comm);
    const double t0 = zpbench::nowSeconds();
    next = nullptr;
    if (ahead) plan(k + 1, &next);
    if (!ahead) plan(k, nullptr);
    const double planned = zpbench::nowSeconds();
    attn.forward();
    attn.backward();
    const double passed = zpbench::nowSeconds();
    if (next) wait(next);
    const double end = zpbench::nowSeconds();
    double t[2] = {end - t0, ahead ? end - passed : planned - t0};
    slowest(t, 2, comm);
    step->push_back(t[0]);
    planning->push_back(t[1]);
  }
}

// --steps: aheadSteps planned inline and ahead, `rounds` times each in
// turn; prints the medians. raw: the file's lengths (the planned job's),
// all: divided (this job's).
void planAheadRows(const std::vector<int64_t>& raw, const std::vector<int64_t>& all, int64_t perRank, long seed,
                   int steps, int rounds, int64_t planRanks, int64_t planPerRank, const ClusterModel& c,
                   const AttnShape& attn, const SleepRate* sleep, int rank, zpComm_t comm) {
  const int n = c.ranks();
  Calibration h800;
  calibrationPreset("h800", &h800);
  AheadSetup in;
  in.sleep = sleep;
  in.shape = {32, 8, 128, 2, 1};  // Llama-3-8B, bf16, causal
  const ClusterModel& h = h800.cluster;
  in.cluster = {int(planRanks / h.ranksPerNode), h.ranksPerNode, h.nicsPerNode, h.nicGbps, h.intraNodeGBps, h.tflops,
                h.efficiency};
  std::mt19937_64 rng(seed);
  const size_t start = rng() % all.size();  // formBatch's draw, then batch after batch
  size_t next = start, nextBig = start;
  PlanOptions planner;
  planner.forwardPasses = 1;
  size_t bigSeqs = 0;
  for (int k = 0; k <= steps; ++k) {
    in.big.push_back(nextBatch(raw, planPerRank * planRanks, &nextBig));
    bigSeqs += in.big.back().size();
    if (k == steps) break;
    const BatchPlan p = planBatch(nextBatch(all, perRank * n, &next), true, attn, c, planner);
    in.runs.push_back(toApi(p, n, c.ranksPerNode, true, comm));
  }
  if (rank == 0) {
    printf("# %d steps, each this job's batch (planned beforehand) forward and backward, and one plan (zpPlanBatch)\n"
           "# of a batch of %lld ranks, h800 (8 per node), llama-8b, %lld tokens per rank, %.0f sequences on average\n",
           steps, (long long)planRanks, (long long)planPerRank, double(bigSeqs) / (steps + 1));
    printf("%-8s %6s %12s %12s %12s\n", "planning", "round", "step s", "min step s", "planning s");
  }
  std::vector<double> pooled[2][2];  // [ahead][step, planning]
  for (int round = 0; round < rounds; ++round)
    for (int ahead = 0; ahead < 2; ++ahead) {
      std::vector<double> stepS, planS;
      aheadSteps(in, ahead != 0, rank, comm, &stepS, &planS);
      if (rank == 0)
        printf("%-8s %6d %12.3f %12.3f %12.3f\n", ahead ? "ahead" : "inline", round, zpbench::median(stepS),
               *std::min_element(stepS.begin(), stepS.end()), zpbench::median(planS));
      pooled[ahead][0].insert(pooled[ahead][0].end(), stepS.begin(), stepS.end());
      pooled[ahead][1].insert(pooled[ahead][1].end(), planS.begin(), planS.end());
    }
  if (rank == 0)
    for (int ahead = 0; ahead < 2; ++ahead)
      printf("%-8s %6s %12.3f %12.3f %12.3f\n", ahead ? "ahead" : "inline", "all", zpbench::median(pooled[ahead][0]),
             *std::min_element(pooled[ahead][0].begin(), pooled[ahead][0].end()), zpbench::median(pooled[ahead][1]));
  for (zpBatchPlan_t p : in.runs) zpPlanDestroy(p);
}

}  // namespace

int main(int argc, char** argv) {
  std::string lengthsFile, calibrationFile;
  long divide = 64, perRank = 8192, passes = 3, warm = 1;
  long seed = 1;
  double share = 0;
  bool modelOnly = false;
  long ranksPerNode = 0;
  long steps = 0, planRanks = 4096, planPerRank = 16384;
  std::string kernel = "ref";
  CLI::App app("", "plan_step");
  zp::cli::configure(app,
                     "usage: plan_step --calibration FILE --lengths FILE [--divide N] [--tokens-per-rank N]\n"
                     "                 [--seed X] [--kernel ref|sleep] [--share X] [--ranks-per-node N] [--model-only]\n"
                     "                 [-n N] [-w N] [--steps K [--plan-ranks N] [--plan-tokens-per-rank N]]\n",
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
  zp::cli::addValue(app, "--steps", "K",
                    "planning inline against planning ahead instead: K steps, each also planning one\n"
                    "batch of the planned job (-n rounds of each, in turn)",
                    zpbench::intFlag("--steps", &steps, 1));
  zp::cli::addValue(app, "--plan-ranks", "N", "with --steps: the planned job's ranks (default 4096, a multiple of 8)",
                    zpbench::intFlag("--plan-ranks", &planRanks, 8));
  zp::cli::addValue(app, "--plan-tokens-per-rank", "N", "with --steps: its tokens per rank (default 16384)",
                    zpbench::intFlag("--plan-tokens-per-rank", &planPerRank, 1));
  zp::cli::addValue(app, "-n", "N", "timed passes (default 3)", zpbench::intFlag("-n", &passes, 1));
  zp::cli::addValue(app, "-w", "N", "warm-up passes (default 1)", zpbench::intFlag("-w", &warm, 0));
  zpbench::parseCommandLine(app, argc, argv, [&] {
    if (lengthsFile.empty() || calibrationFile.empty())
      throw zp::cli::UsageError("--calibration and --lengths are required");
    if (planRanks % 8 != 0) throw zp::cli::UsageError("--plan-ranks: not a multiple of 8 (the h800 preset's node)");
  });

  Calibration cal;
  try {
    if (!calibrationPreset(calibrationFile, &cal)) cal = readCalibration(calibrationFile);
  } catch (const std::exception& e) {
    fprintf(stderr, "plan_step: %s\n", e.what());
    return 2;
  }
  std::vector<int64_t> all;
  try {
    all = readLengths(lengthsFile);
  } catch (const std::invalid_argument& e) {
    fprintf(stderr, "plan_step: %s\n", e.what());
    return 2;
  }
  const std::vector<int64_t> raw = all;
  for (int64_t& x : all) x = std::max<int64_t>(1, x / divide);

  zpComm_t comm;
  if (zpCommInitFromEnv(&comm, nullptr) != zpSuccess) die("init", nullptr);
  int n, rank;
  zpCommCount(comm, &n);
  zpCommUserRank(comm, &rank);
  const int rpn = ranksPerNode > 0 ? int(ranksPerNode) : std::max(1, zpbench::settingInt("ZP_LOCAL_NRANKS", n));
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
  if (steps > 0) {
    planAheadRows(raw, all, perRank, seed, int(steps), int(passes), planRanks, planPerRank, c, step.model.attn,
                  sleeping ? &rate : nullptr, rank, comm);
    zpCommDestroy(comm);
    return 0;
  }
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
