// trainer: a custom trainer built on Zeppelin's public API, one transformer
// layer forward and backward on packed batches of variable-length
// sequences, data parallel x context parallel, checked against a
// single-process run of the same layer.
//
//   build/zprun -n 4 build/examples/trainer [--dp D] [--tokens N] [--scale S] [--seed X] [--lengths FILE]
//
// The ranks form a D x C grid (C = nranks / D; D defaults to 2 when the rank
// count is even) by two zpCommSplit calls: the C ranks of a context-parallel
// group (consecutive ranks) share one batch of N tokens, planned, remapped
// and attended over their group's communicator; the D groups draw different
// batches. The weight gradients and the loss are summed over the whole job
// with zpAllReduce, as a data-parallel step would.
//
// The layer (float32; hidden 64, 4 query heads and 2 key/value heads of 16,
// MLP 128, causal):
//   qkv = x Wqkv                       linear layout (each rank its tokens)
//   q, k, v  --remap-->                attention layout (the plan's rings)
//   o = attention(q, k, v)             zpAttentionForward, reference kernels
//   o  --inverse remap-->              linear layout
//   y = x + o Wo;  z = y + gelu(y W1) W2;  loss = sum(z * g)
// and back by hand, with zpAttentionBackward in the middle. The
// single-process run is the same layer in float64 over each whole batch,
// with its own attention; every rank compares its rows of dx, rank 0 the
// loss and the weight gradients summed over the D batches.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <zeppelin.h>

namespace {

constexpr int kHidden = 64, kHeads = 4, kKvHeads = 2, kHeadDim = 16, kMlp = 128;
constexpr int kQkv = (kHeads + 2 * kKvHeads) * kHeadDim;  // q, k, v of one token, side by side

zpComm_t gComm = nullptr;

[[noreturn]] void die(const char* what) {
  fprintf(stderr, "trainer: %s: %s\n", what, zpGetLastError(gComm));
  if (gComm) zpCommAbort(gComm);
  exit(1);
}
void check(zpResult_t r, const char* what) {
  if (r != zpSuccess) die(what);
}

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// ---- Dense helpers (row-major) ----
// C[m, n] (+)= A[m, k] B[k, n]
template <class T>
void matmul(const T* A, const T* B, T* C, int64_t m, int k, int n, bool add = false) {
  for (int64_t i = 0; i < m; i++) {
    T* c = C + i * n;
    if (!add)
      for (int j = 0; j < n; j++) c[j] = 0;
    for (int p = 0; p < k; p++) {
      const T a = A[i * k + p];
      const T* b = B + (int64_t)p * n;
      for (int j = 0; j < n; j++) c[j] += a * b[j];
    }
  }
}
// C[m, n] (+)= A[m, k] B[n, k]^T
template <class T>
void matmulBt(const T* A, const T* B, T* C, int64_t m, int k, int n, bool add = false) {
  for (int64_t i = 0; i < m; i++)
    for (int j = 0; j < n; j++) {
      T s = add ? C[i * n + j] : T(0);
      for (int p = 0; p < k; p++) s += A[i * k + p] * B[(int64_t)j * k + p];
      C[i * n + j] = s;
    }
}
// C[k, n] += A[m, k]^T B[m, n]  (weight gradients)
template <class T>
void matmulAtAdd(const T* A, const T* B, T* C, int64_t m, int k, int n) {
  for (int64_t i = 0; i < m; i++)
    for (int p = 0; p < k; p++) {
      const T a = A[i * k + p];
      for (int j = 0; j < n; j++) C[(int64_t)p * n + j] += a * B[i * n + j];
    }
}
template <class T>
T gelu(T x) {
  const T c = (T)0.7978845608028654;
  return (T)0.5 * x * ((T)1 + std::tanh(c * (x + (T)0.044715 * x * x * x)));
}
template <class T>
T geluGrad(T x) {
  const T c = (T)0.7978845608028654, u = c * (x + (T)0.044715 * x * x * x), t = std::tanh(u);
  return (T)0.5 * ((T)1 + t) + (T)0.5 * x * ((T)1 - t * t) * c * ((T)1 + (T)3 * (T)0.044715 * x * x);
}

struct Weights {
  std::vector<float> qkv, o, w1, w2;  // [hidden, qkv], [heads*dim, hidden], [hidden, mlp], [mlp, hidden]
};

// ---- The single-process layer, in float64 over the whole batch ----
struct Reference {
  double loss = 0;
  std::vector<double> dx, dqkv, dwo, dw1, dw2;
};

Reference referenceLayer(const std::vector<float>& X, const std::vector<float>& G, const Weights& w,
                         const std::vector<int64_t>& lens) {
  int64_t total = 0;
  for (int64_t l : lens) total += l;
  auto d = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  const std::vector<double> x = d(X), g = d(G), Wqkv = d(w.qkv), Wo = d(w.o), W1 = d(w.w1), W2 = d(w.w2);
  std::vector<double> qkv(total * kQkv), o(total * kHeads * kHeadDim, 0), y(total * kHidden), pre(total * kMlp),
      h(total * kMlp), z(total * kHidden);
  matmul(x.data(), Wqkv.data(), qkv.data(), total, kHidden, kQkv);
  const double scale = 1.0 / std::sqrt((double)kHeadDim);
  const int grp = kHeads / kKvHeads;
  auto Q = [&](int64_t t, int hd) { return &qkv[t * kQkv + hd * kHeadDim]; };
  auto K = [&](int64_t t, int hk) { return &qkv[t * kQkv + (kHeads + hk) * kHeadDim]; };
  auto V = [&](int64_t t, int hk) { return &qkv[t * kQkv + (kHeads + kKvHeads + hk) * kHeadDim]; };
  // Attention forward, keeping the probabilities for backward.
  std::vector<std::vector<double>> P(total * kHeads);
  int64_t base = 0;
  for (int64_t L : lens) {
    for (int64_t i = 0; i < L; i++)
      for (int hd = 0; hd < kHeads; hd++) {
        std::vector<double>& p = P[(base + i) * kHeads + hd];
        p.resize(i + 1);
        double mx = -INFINITY;
        for (int64_t j = 0; j <= i; j++) {
          double s = 0;
          for (int e = 0; e < kHeadDim; e++) s += Q(base + i, hd)[e] * K(base + j, hd / grp)[e];
          p[j] = s * scale;
          mx = std::max(mx, p[j]);
        }
        double sum = 0;
        for (double& e : p) sum += (e = std::exp(e - mx));
        double* oi = &o[((base + i) * kHeads + hd) * kHeadDim];
        for (int64_t j = 0; j <= i; j++) {
          p[j] /= sum;
          for (int e = 0; e < kHeadDim; e++) oi[e] += p[j] * V(base + j, hd / grp)[e];
        }
      }
    base += L;
  }
  matmul(o.data(), Wo.data(), y.data(), total, kHeads * kHeadDim, kHidden);
  for (int64_t i = 0; i < total * kHidden; i++) y[i] += x[i];
  matmul(y.data(), W1.data(), pre.data(), total, kHidden, kMlp);
  for (int64_t i = 0; i < total * kMlp; i++) h[i] = gelu(pre[i]);
  matmul(h.data(), W2.data(), z.data(), total, kMlp, kHidden);
  Reference r;
  for (int64_t i = 0; i < total * kHidden; i++) {
    z[i] += y[i];
    r.loss += z[i] * g[i];
  }
  // Backward.
  r.dw2.assign(kMlp * kHidden, 0);
  r.dw1.assign(kHidden * kMlp, 0);
  r.dwo.assign(kHeads * kHeadDim * kHidden, 0);
  r.dqkv.assign(kHidden * kQkv, 0);
  std::vector<double> dh(total * kMlp), dy(g), dO(total * kHeads * kHeadDim), dqkv(total * kQkv, 0);
  matmulAtAdd(h.data(), g.data(), r.dw2.data(), total, kMlp, kHidden);
  matmulBt(g.data(), W2.data(), dh.data(), total, kHidden, kMlp);
  for (int64_t i = 0; i < total * kMlp; i++) dh[i] *= geluGrad(pre[i]);
  matmulAtAdd(y.data(), dh.data(), r.dw1.data(), total, kHidden, kMlp);
  matmulBt(dh.data(), W1.data(), dy.data(), total, kMlp, kHidden, true);
  matmulAtAdd(o.data(), dy.data(), r.dwo.data(), total, kHeads * kHeadDim, kHidden);
  matmulBt(dy.data(), Wo.data(), dO.data(), total, kHidden, kHeads * kHeadDim);
  base = 0;
  for (int64_t L : lens) {
    for (int64_t i = 0; i < L; i++)
      for (int hd = 0; hd < kHeads; hd++) {
        const std::vector<double>& p = P[(base + i) * kHeads + hd];
        const double* doi = &dO[((base + i) * kHeads + hd) * kHeadDim];
        const double* oi = &o[((base + i) * kHeads + hd) * kHeadDim];
        double Di = 0;
        for (int e = 0; e < kHeadDim; e++) Di += doi[e] * oi[e];
        double* dq = &dqkv[(base + i) * kQkv + hd * kHeadDim];
        for (int64_t j = 0; j <= i; j++) {
          const int hk = hd / grp;
          double dp = 0;
          for (int e = 0; e < kHeadDim; e++) dp += doi[e] * V(base + j, hk)[e];
          const double ds = p[j] * (dp - Di) * scale;
          double* dk = &dqkv[(base + j) * kQkv + (kHeads + hk) * kHeadDim];
          double* dv = &dqkv[(base + j) * kQkv + (kHeads + kKvHeads + hk) * kHeadDim];
          for (int e = 0; e < kHeadDim; e++) {
            dq[e] += ds * K(base + j, hk)[e];
            dk[e] += ds * Q(base + i, hd)[e];
            dv[e] += p[j] * doi[e];
          }
        }
      }
    base += L;
  }
  matmulAtAdd(x.data(), dqkv.data(), r.dqkv.data(), total, kHidden, kQkv);
  r.dx = dy;
  matmulBt(dqkv.data(), Wqkv.data(), r.dx.data(), total, kQkv, kHidden, true);
  return r;
}

// max |got - want| / max |want|
double relError(const float* got, const double* want, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; i++) {
    if (std::isnan(got[i])) return INFINITY;
    diff = std::max(diff, std::fabs(got[i] - want[i]));
    scale = std::max(scale, std::fabs(want[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

void usage() {
  fprintf(stderr,
          "usage: trainer [--dp D] [--tokens N (4096)] [--scale S (16)] [--seed X] [--lengths FILE]\n"
          "  D data-parallel groups (default 2 for an even rank count, else 1), each of nranks / D\n"
          "  context-parallel ranks sharing a batch. Draws sequence lengths from FILE (one per line;\n"
          "  default tests/data/prolong64k.txt of the source tree), divides them by S, until each\n"
          "  batch holds N tokens.\n");
}

// The command line.
struct Options {
  int64_t tokens = 4096, scale = 16, dp = 0;  // dp 0: 2 for an even rank count, else 1
  uint64_t seed = 0;
  bool seedGiven = false;
  std::string lengthsFile = ZP_SOURCE_DIR "/tests/data/prolong64k.txt";
};

// A value an option cannot take; what() is the whole message.
class BadValue : public CLI::ParseError {
 public:
  explicit BadValue(const std::string& message) : CLI::ParseError("BadValue", message, 2) {}
};

// Reads the command line with CLI11. Every option takes a value; each value
// is read as soon as it is met (the first bad one is the one reported), by
// strtoll / strtoull as before. An option given twice keeps its last value.
// Returns 0, or the exit code after saying why: 2 for a bad value, an
// unknown argument or a missing value (the usage).
int parseOptions(int argc, char** argv, Options* o) {
  CLI::App app("", "trainer");
  app.set_help_flag();  // no -h: like any argument it does not know, it prints the usage
  auto value = [&](const char* name, std::function<bool(const std::string&)> take) {
    app.add_option_function<std::string>(
           name,
           [name, take](const std::string& v) {
             if (!take(v)) throw BadValue(std::string("bad value for ") + name + ": " + v);
           })
        ->trigger_on_parse();
  };
  auto integer = [](const std::string& v, int64_t* out, int64_t lo) {
    char* end = nullptr;
    *out = strtoll(v.c_str(), &end, 10);
    return !*end && *out >= lo;
  };
  value("--dp", [o, integer](const std::string& v) { return integer(v, &o->dp, 1); });
  value("--tokens", [o, integer](const std::string& v) { return integer(v, &o->tokens, 1); });
  value("--scale", [o, integer](const std::string& v) { return integer(v, &o->scale, 1); });
  value("--seed", [o](const std::string& v) {
    char* end = nullptr;
    o->seed = strtoull(v.c_str(), &end, 10);
    o->seedGiven = true;
    return !*end;
  });
  value("--lengths", [o](const std::string& v) {
    o->lengthsFile = v;
    return true;
  });
  try {
    app.parse(argc, argv);
  } catch (const BadValue& e) {
    fprintf(stderr, "trainer: %s\n", e.what());
    return 2;
  } catch (const CLI::ParseError&) {
    usage();
    return 2;
  }
  return 0;
}

// The sequence lengths to draw from: the positive integers of the file.
std::vector<int64_t> readLengths(const std::string& path) {
  std::vector<int64_t> pool;
  if (FILE* f = fopen(path.c_str(), "r")) {
    long long v;
    while (fscanf(f, "%lld", &v) == 1)
      if (v > 0) pool.push_back(v);
    fclose(f);
  }
  return pool;
}

// The ranks as a D x C grid: the whole job, my context-parallel group
// (consecutive ranks, one batch) and my data-parallel group (the ranks at my
// place in every other batch's group; the job-wide sums below could run on
// it too, but the whole job is what a data-parallel step sums over when
// every rank holds weights).
struct Grid {
  zpComm_t world = nullptr, cpComm = nullptr, dpComm = nullptr;
  int worldRank = 0, worldN = 1;
  int dp = 1, cp = 1;     // data-parallel groups, ranks in each
  int dpIndex = 0;        // my batch's group
  int rank = 0, n = 1;    // my place in my batch's group
};

// Splits the job (gComm) into the grid; returns 0 or the exit code.
int makeGrid(int64_t dpArg, Grid* grid) {
  Grid& gr = *grid;
  gr.world = gComm;
  zpCommUserRank(gComm, &gr.worldRank);
  zpCommCount(gComm, &gr.worldN);
  const int worldRank = gr.worldRank, worldN = gr.worldN;
  const int dp = dpArg ? (int)dpArg : worldN % 2 == 0 ? 2 : 1, cp = worldN / dp;
  if (dp > worldN || worldN % dp) {
    if (worldRank == 0) fprintf(stderr, "trainer: --dp %d does not divide %d ranks\n", dp, worldN);
    return 2;
  }
  gr.dp = dp;
  gr.cp = cp;
  gr.dpIndex = worldRank / cp;
  check(zpCommSplit(gComm, gr.dpIndex, worldRank % cp, &gr.cpComm, nullptr), "zpCommSplit (context-parallel groups)");
  check(zpCommSplit(gComm, worldRank % cp, gr.dpIndex, &gr.dpComm, nullptr), "zpCommSplit (data-parallel groups)");
  int dpRank = 0;
  zpCommUserRank(gr.cpComm, &gr.rank);
  zpCommCount(gr.cpComm, &gr.n);
  zpCommUserRank(gr.dpComm, &dpRank);
  if (dpRank != gr.dpIndex) die("zpCommSplit: the data-parallel group's ranks are out of order");
  return 0;
}

std::vector<float> draw(std::mt19937_64& from, size_t count, float amp) {
  std::uniform_real_distribution<float> uni(-1, 1);
  std::vector<float> v(count);
  for (float& e : v) e = amp * uni(from);
  return v;
}

// The weights, the same everywhere.
Weights drawWeights(uint64_t seed) {
  std::mt19937_64 rng(seed);
  Weights w;
  w.qkv = draw(rng, kHidden * kQkv, 0.25f);
  w.o = draw(rng, kHeads * kHeadDim * kHidden, 0.25f);
  w.w1 = draw(rng, kHidden * kMlp, 0.25f);
  w.w2 = draw(rng, kMlp * kHidden, 0.25f);
  return w;
}

// Batch d: lengths drawn from the pool (divided by scale) until it holds
// `tokens` tokens, its input and the loss's weights; from a seed of its own.
struct Batch {
  std::vector<int64_t> lens;
  std::vector<float> X, G;
};
Batch drawBatch(uint64_t seed, int d, const std::vector<int64_t>& pool, int64_t tokens, int64_t scale) {
  std::mt19937_64 brng(seed ^ (0x9E3779B97F4A7C15ull * (uint64_t)(d + 1)));
  Batch b;
  int64_t sum = 0;
  while (sum < tokens) {
    int64_t l = std::max<int64_t>(1, pool[brng() % pool.size()] / scale);
    l = std::min(l, tokens - sum);
    b.lens.push_back(l);
    sum += l;
  }
  b.X = draw(brng, sum * kHidden, 1.0f);
  b.G = draw(brng, sum * kHidden, 1.0f);
  return b;
}

// The batch as its group runs it: the plan for this communicator's cluster,
// the remap between its layouts, the attention driver, and my tokens.
struct Planned {
  zpBatchPlan_t plan = nullptr;
  zpLayout_t lin = nullptr, att = nullptr;
  zpRemap_t remap = nullptr;
  zpAttention_t attn = nullptr;
  int64_t Tl = 0, Ta = 0;     // my tokens in the linear and the attention layout
  std::vector<int64_t> rows;  // batch row of each of my linear-layout tokens
};

Planned planBatch(const std::vector<int64_t>& lens, int rank) {
  const int nseq = (int)lens.size();
  std::vector<int64_t> cu(nseq + 1, 0);
  for (int s = 0; s < nseq; s++) cu[s + 1] = cu[s] + lens[s];
  Planned p;
  zpAttnShape_t shape = {kHeads, kKvHeads, kHeadDim, 4, 1};
  check(zpPlanBatch(&p.plan, nseq, lens.data(), &shape, nullptr, gComm), "zpPlanBatch");
  check(zpPlanGetLayout(p.plan, zpLinearLayout, &p.lin), "zpPlanGetLayout");
  check(zpPlanGetLayout(p.plan, zpAttentionLayout, &p.att), "zpPlanGetLayout");
  check(zpRemapCreate(&p.remap, p.lin, p.att, gComm), "zpRemapCreate");
  zpAttnConfig_t cfg = {kHeads, kKvHeads, kHeadDim, 0.0f, zpAttnRefForward, zpAttnRefBackward, nullptr, 1, zpFloat32};
  check(zpAttentionCreate(&p.attn, p.plan, &cfg, gComm), "zpAttentionCreate");
  zpLayoutRankTokens(p.lin, rank, &p.Tl);
  zpLayoutRankTokens(p.att, rank, &p.Ta);
  const zpSegment_t* linSegs = nullptr;
  size_t nLinSegs = 0;
  zpLayoutRankSegments(p.lin, rank, &linSegs, &nLinSegs);
  for (size_t i = 0; i < nLinSegs; i++)
    for (int64_t t = 0; t < linSegs[i].count; t++) p.rows.push_back(cu[linSegs[i].seq] + linSegs[i].start + t);
  return p;
}

// What this rank computed of the layer: its rows of dx, its share of the
// weight gradients (dWqkv, dWo, dW1, dW2 in one array, to sum in one call),
// its share of the loss, and how long forward and backward took.
struct LayerRun {
  std::vector<float> dx, grads;
  double loss = 0, forwardSec = 0, backwardSec = 0;
};

// The layer over my rows x of the batch (g: the loss's weights of them),
// on my batch's group (gComm).
LayerRun runLayer(const Planned& p, const Weights& w, const std::vector<float>& x, const std::vector<float>& g) {
  const int64_t Tl = p.Tl, Ta = p.Ta;
  const zpRemap_t remap = p.remap;
  const zpAttention_t attn = p.attn;
  LayerRun run;
  // ---- Forward ----
  const int HD = kHeads * kHeadDim, HkD = kKvHeads * kHeadDim;
  const double t0 = now();
  std::vector<float> qkvLin(Tl * kQkv), qkvAtt(Ta * kQkv);
  matmul(x.data(), w.qkv.data(), qkvLin.data(), Tl, kHidden, kQkv);
  check(zpRemapExecute(remap, qkvLin.data(), qkvAtt.data(), kQkv, zpFloat32, 0, gComm, nullptr), "remap qkv");
  std::vector<float> q(Ta * HD), k(Ta * HkD), v(Ta * HkD), oAtt(Ta * HD), lse(Ta * kHeads);
  for (int64_t t = 0; t < Ta; t++) {
    memcpy(&q[t * HD], &qkvAtt[t * kQkv], HD * sizeof(float));
    memcpy(&k[t * HkD], &qkvAtt[t * kQkv + HD], HkD * sizeof(float));
    memcpy(&v[t * HkD], &qkvAtt[t * kQkv + HD + HkD], HkD * sizeof(float));
  }
  check(zpAttentionForward(attn, q.data(), k.data(), v.data(), oAtt.data(), lse.data(), nullptr),
        "zpAttentionForward");
  std::vector<float> oLin(Tl * HD), y(x), pre(Tl * kMlp), h(Tl * kMlp), z(Tl * kHidden);
  check(zpRemapExecute(remap, oAtt.data(), oLin.data(), HD, zpFloat32, 1, gComm, nullptr), "remap attention out");
  matmul(oLin.data(), w.o.data(), y.data(), Tl, HD, kHidden, true);
  matmul(y.data(), w.w1.data(), pre.data(), Tl, kHidden, kMlp);
  for (int64_t i = 0; i < Tl * kMlp; i++) h[i] = gelu(pre[i]);
  z = y;
  matmul(h.data(), w.w2.data(), z.data(), Tl, kMlp, kHidden, true);
  for (int64_t i = 0; i < Tl * kHidden; i++) run.loss += (double)z[i] * g[i];
  const double t1 = now();

  // ---- Backward ----
  const size_t nW[4] = {w.qkv.size(), w.o.size(), w.w1.size(), w.w2.size()};
  run.grads.assign(nW[0] + nW[1] + nW[2] + nW[3], 0.0f);
  float* dWqkv = run.grads.data();
  float* dWo = dWqkv + nW[0];
  float* dW1 = dWo + nW[1];
  float* dW2 = dW1 + nW[2];
  std::vector<float> dh(Tl * kMlp), dy(g), dOLin(Tl * HD), dOAtt(Ta * HD), dq(Ta * HD), dk(Ta * HkD), dv(Ta * HkD),
      dqkvAtt(Ta * kQkv), dqkvLin(Tl * kQkv);
  matmulAtAdd(h.data(), g.data(), dW2, Tl, kMlp, kHidden);
  matmulBt(g.data(), w.w2.data(), dh.data(), Tl, kHidden, kMlp);
  for (int64_t i = 0; i < Tl * kMlp; i++) dh[i] *= geluGrad(pre[i]);
  matmulAtAdd(y.data(), dh.data(), dW1, Tl, kHidden, kMlp);
  matmulBt(dh.data(), w.w1.data(), dy.data(), Tl, kMlp, kHidden, true);
  matmulAtAdd(oLin.data(), dy.data(), dWo, Tl, HD, kHidden);
  matmulBt(dy.data(), w.o.data(), dOLin.data(), Tl, kHidden, HD);
  check(zpRemapExecute(remap, dOLin.data(), dOAtt.data(), HD, zpFloat32, 0, gComm, nullptr), "remap dout");
  check(zpAttentionBackward(attn, q.data(), k.data(), v.data(), oAtt.data(), lse.data(), dOAtt.data(), dq.data(),
                            dk.data(), dv.data(), nullptr),
        "zpAttentionBackward");
  for (int64_t t = 0; t < Ta; t++) {
    memcpy(&dqkvAtt[t * kQkv], &dq[t * HD], HD * sizeof(float));
    memcpy(&dqkvAtt[t * kQkv + HD], &dk[t * HkD], HkD * sizeof(float));
    memcpy(&dqkvAtt[t * kQkv + HD + HkD], &dv[t * HkD], HkD * sizeof(float));
  }
  check(zpRemapExecute(remap, dqkvAtt.data(), dqkvLin.data(), kQkv, zpFloat32, 1, gComm, nullptr), "remap dqkv");
  matmulAtAdd(x.data(), dqkvLin.data(), dWqkv, Tl, kHidden, kQkv);
  run.dx = dy;
  matmulBt(dqkvLin.data(), w.qkv.data(), run.dx.data(), Tl, kQkv, kHidden, true);
  run.forwardSec = t1 - t0;
  run.backwardSec = now() - t1;
  return run;
}

// Adds the single-process runs of the other batches (1 to dp - 1) to ref,
// batch 0's: the loss and weight gradients a data-parallel step sums.
void addOtherBatches(Reference* ref, const Options& opt, const std::vector<int64_t>& pool, int dp, const Weights& w) {
  for (int d = 1; d < dp; d++) {
    const Batch b = drawBatch(opt.seed, d, pool, opt.tokens, opt.scale);
    const Reference r = referenceLayer(b.X, b.G, w, b.lens);
    ref->loss += r.loss;
    for (auto pr : {std::make_pair(&ref->dqkv, &r.dqkv), std::make_pair(&ref->dwo, &r.dwo),
                    std::make_pair(&ref->dw1, &r.dw1), std::make_pair(&ref->dw2, &r.dw2)})
      for (size_t i = 0; i < pr.first->size(); i++) (*pr.first)[i] += (*pr.second)[i];
  }
}

// Rank 0's verdict: the loss and the weight gradients summed over the job
// (sum: dWqkv, dWo, dW1, dW2) against ref, the single-process runs of every
// batch summed, and the worst rank's dx error. Prints the report; true if
// it passed.
bool judge(const Options& opt, const Grid& grid, const Weights& w, const Batch& mine, const Planned& p,
           const std::vector<double>& sum, double lossSum, double worstDx, const LayerRun& run, const Reference& ref) {
  const double bound = 1e-4;  // float32 sums over 64-128 terms against float64
  const int nseq = (int)mine.lens.size();
  int64_t total = 0;
  for (int64_t l : mine.lens) total += l;
  int local = 0, intra = 0, inter = 0;
  for (int s = 0; s < nseq; s++) {
    int cls = 0, gsz = 0;
    const int* rr = nullptr;
    zpPlanSequence(p.plan, s, &cls, &gsz, &rr);
    (cls == 0 ? local : cls == 1 ? intra : inter)++;
  }
  auto rel = [](const std::vector<double>& got, const std::vector<double>& want) {
    double diff = 0, scale = 0;
    for (size_t i = 0; i < want.size(); i++) {
      diff = std::max(diff, std::fabs(got[i] - want[i]));
      scale = std::max(scale, std::fabs(want[i]));
    }
    return scale > 0 ? diff / scale : diff;
  };
  const size_t nW[4] = {w.qkv.size(), w.o.size(), w.w1.size(), w.w2.size()};
  auto slice = [&](size_t from, size_t count) {
    return std::vector<double>(sum.begin() + from, sum.begin() + from + count);
  };
  const double errs[5] = {std::fabs(lossSum - ref.loss) / std::max(1.0, std::fabs(ref.loss)),
                          rel(slice(0, nW[0]), ref.dqkv), rel(slice(nW[0], nW[1]), ref.dwo),
                          rel(slice(nW[0] + nW[1], nW[2]), ref.dw1),
                          rel(slice(nW[0] + nW[1] + nW[2], nW[3]), ref.dw2)};
  printf("# trainer: %d ranks as %d data-parallel x %d context-parallel (zpCommSplit), seed %llu\n", grid.worldN,
         grid.dp, grid.cp, (unsigned long long)opt.seed);
  printf("# batch 0 of %d: %d sequences, %lld tokens (lengths from %s / %lld)\n", grid.dp, nseq, (long long)total,
         opt.lengthsFile.c_str(), (long long)opt.scale);
  printf("# plan: %d local, %d intra-node rings, %d inter-node rings; layer: hidden %d, %d/%d heads of %d, mlp %d\n",
         local, intra, inter, kHidden, kHeads, kKvHeads, kHeadDim, kMlp);
  printf("# rank 0: forward %.1f ms, backward %.1f ms\n", run.forwardSec * 1e3, run.backwardSec * 1e3);
  printf("# weight gradients and loss: zpAllReduce over all %d ranks\n", grid.worldN);
  printf("# relative error vs the single-process float64 runs (max |err| / max |ref|, bound %.0e):\n", bound);
  printf("#   loss %.2e  dWqkv %.2e  dWo %.2e  dW1 %.2e  dW2 %.2e  dx (worst rank) %.2e\n", errs[0], errs[1], errs[2],
         errs[3], errs[4], worstDx);
  bool failed = false;
  for (double e : errs) failed |= !(e < bound);
  failed |= !(worstDx < bound);
  printf("%s\n", failed ? "FAIL" : "PASS");
  return !failed;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  if (int code = parseOptions(argc, argv, &opt)) return code;
  const std::vector<int64_t> pool = readLengths(opt.lengthsFile);
  if (pool.empty()) {
    fprintf(stderr, "trainer: no lengths in %s (one positive integer per line)\n", opt.lengthsFile.c_str());
    return 2;
  }

  check(zpCommInitFromEnv(&gComm, nullptr), "zpCommInitFromEnv");
  Grid grid;
  if (makeGrid(opt.dp, &grid)) {
    zpCommDestroy(gComm);
    return 2;
  }
  const zpComm_t worldComm = grid.world;
  // Rank 0 picks the seed (fresh unless given), and every rank gets it.
  if (grid.worldRank == 0 && !opt.seedGiven) opt.seed = std::random_device{}();
  check(zpBroadcast(&opt.seed, &opt.seed, 1, zpUint64, 0, gComm, nullptr), "sharing the seed");

  const Weights w = drawWeights(opt.seed);
  const Batch mine = drawBatch(opt.seed, grid.dpIndex, pool, opt.tokens, opt.scale);
  gComm = grid.cpComm;  // the batch's plan, remap and attention run on its group
  const Planned p = planBatch(mine.lens, grid.rank);
  std::vector<float> x(p.Tl * kHidden), g(p.Tl * kHidden);
  for (int64_t t = 0; t < p.Tl; t++) {
    memcpy(&x[t * kHidden], &mine.X[p.rows[t] * kHidden], kHidden * sizeof(float));
    memcpy(&g[t * kHidden], &mine.G[p.rows[t] * kHidden], kHidden * sizeof(float));
  }
  LayerRun run = runLayer(p, w, x, g);

  // Weight gradients summed over every rank of the job (each batch's
  // group holds its batch's share, the groups their batches'), in place;
  // the loss in float64.
  check(zpAllReduce(run.grads.data(), run.grads.data(), run.grads.size(), zpFloat32, zpSum, worldComm, nullptr),
        "summing the weight gradients");
  double lossSum = run.loss;
  check(zpAllReduce(&lossSum, &lossSum, 1, zpFloat64, zpSum, worldComm, nullptr), "summing the loss");
  const std::vector<double> sum(run.grads.begin(), run.grads.end());

  // The single-process runs (each batch; rank 0 sums them), and the comparison.
  Reference ref = referenceLayer(mine.X, mine.G, w, mine.lens);
  std::vector<double> refDx(p.Tl * kHidden);
  for (int64_t t = 0; t < p.Tl; t++)
    for (int e = 0; e < kHidden; e++) refDx[t * kHidden + e] = ref.dx[p.rows[t] * kHidden + e];
  double dxErr = relError(run.dx.data(), refDx.data(), refDx.size());
  // Every rank's dx error, everywhere.
  std::vector<double> dxErrs(grid.worldN, 0.0);
  check(zpAllGather(&dxErr, dxErrs.data(), 1, zpFloat64, worldComm, nullptr), "gathering dx errors");
  int failed = 0;
  if (grid.worldRank == 0) {
    double worstDx = 0;
    for (double e : dxErrs) worstDx = std::max(worstDx, e);
    addOtherBatches(&ref, opt, pool, grid.dp, w);
    failed = !judge(opt, grid, w, mine, p, sum, lossSum, worstDx, run, ref);
  }
  // Everyone learns the verdict, so every rank's exit code tells it.
  check(zpBroadcast(&failed, &failed, 1, zpInt32, 0, worldComm, nullptr), "sharing the verdict");
  zpAttentionDestroy(p.attn);
  zpRemapDestroy(p.remap);
  zpPlanDestroy(p.plan);
  zpCommDestroy(grid.cpComm);
  zpCommDestroy(grid.dpComm);
  gComm = worldComm;
  zpCommDestroy(worldComm);
  return failed ? 1 : 0;
}
