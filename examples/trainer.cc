// trainer: a custom trainer built on Zeppelin's public API, one transformer
// layer forward and backward on a packed batch of variable-length sequences,
// checked against a single-process run of the same layer.
//
//   build/zprun -n 4 build/examples/trainer [--tokens N] [--scale S] [--seed X] [--lengths FILE]
//
// The layer (float32; hidden 64, 4 query heads and 2 key/value heads of 16,
// MLP 128, causal):
//   qkv = x Wqkv                       linear layout (each rank its tokens)
//   q, k, v  --remap-->                attention layout (the plan's rings)
//   o = attention(q, k, v)             zpAttentionForward, reference kernels
//   o  --inverse remap-->              linear layout
//   y = x + o Wo;  z = y + gelu(y W1) W2;  loss = sum(z * g)
// and back by hand, with zpAttentionBackward in the middle. The weight
// gradients are summed over ranks on rank 0. The single-process run is the
// same layer in float64 over the whole batch, with its own attention; every
// rank compares its rows of dx, rank 0 the loss and the weight gradients.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
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
          "usage: trainer [--tokens N (4096)] [--scale S (16)] [--seed X] [--lengths FILE]\n"
          "  Draws sequence lengths from FILE (one per line; default tests/data/prolong64k.txt\n"
          "  of the source tree), divides them by S, until the batch holds N tokens.\n");
}

}  // namespace

int main(int argc, char** argv) {
  int64_t tokens = 4096, scale = 16;
  uint64_t seed = 0;
  bool seedGiven = false;
  std::string lengthsFile = ZP_SOURCE_DIR "/tests/data/prolong64k.txt";
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (i + 1 >= argc) {
      usage();
      return 2;
    }
    char* end = nullptr;
    if (a == "--tokens") {
      tokens = strtoll(argv[++i], &end, 10);
    } else if (a == "--scale") {
      scale = strtoll(argv[++i], &end, 10);
    } else if (a == "--seed") {
      seed = strtoull(argv[++i], &end, 10);
      seedGiven = true;
    } else if (a == "--lengths") {
      lengthsFile = argv[++i];
      continue;
    } else {
      usage();
      return 2;
    }
    if (!end || *end || tokens < 1 || scale < 1) {
      fprintf(stderr, "trainer: bad value for %s: %s\n", a.c_str(), argv[i]);
      return 2;
    }
  }
  std::vector<int64_t> pool;
  if (FILE* f = fopen(lengthsFile.c_str(), "r")) {
    long long v;
    while (fscanf(f, "%lld", &v) == 1)
      if (v > 0) pool.push_back(v);
    fclose(f);
  }
  if (pool.empty()) {
    fprintf(stderr, "trainer: no lengths in %s (one positive integer per line)\n", lengthsFile.c_str());
    return 2;
  }

  check(zpCommInitFromEnv(&gComm, nullptr), "zpCommInitFromEnv");
  int rank = 0, n = 1;
  zpCommUserRank(gComm, &rank);
  zpCommCount(gComm, &n);
  // Rank 0 picks the seed (fresh unless given); every rank draws the same batch.
  if (rank == 0 && !seedGiven) seed = std::random_device{}();
  zpGroupStart();
  for (int p = 1; p < n && rank == 0; p++) zpSend(&seed, 1, zpUint64, p, gComm, nullptr);
  if (rank != 0) zpRecv(&seed, 1, zpUint64, 0, gComm, nullptr);
  check(zpGroupEnd(), "sharing the seed");

  std::mt19937_64 rng(seed);
  std::vector<int64_t> lens;
  int64_t total = 0;
  while (total < tokens) {
    int64_t l = std::max<int64_t>(1, pool[rng() % pool.size()] / scale);
    l = std::min(l, tokens - total);
    lens.push_back(l);
    total += l;
  }
  const int nseq = (int)lens.size();
  std::uniform_real_distribution<float> uni(-1, 1);
  auto draw = [&](size_t count, float amp) {
    std::vector<float> v(count);
    for (float& e : v) e = amp * uni(rng);
    return v;
  };
  Weights w;
  w.qkv = draw(kHidden * kQkv, 0.25f);
  w.o = draw(kHeads * kHeadDim * kHidden, 0.25f);
  w.w1 = draw(kHidden * kMlp, 0.25f);
  w.w2 = draw(kMlp * kHidden, 0.25f);
  const std::vector<float> X = draw(total * kHidden, 1.0f), G = draw(total * kHidden, 1.0f);
  std::vector<int64_t> cu(nseq + 1, 0);
  for (int s = 0; s < nseq; s++) cu[s + 1] = cu[s] + lens[s];

  // The plan, for this communicator's cluster, and the remap between layouts.
  zpAttnShape_t shape = {kHeads, kKvHeads, kHeadDim, 4, 1};
  zpBatchPlan_t plan = nullptr;
  check(zpPlanBatch(&plan, nseq, lens.data(), &shape, nullptr, gComm), "zpPlanBatch");
  zpLayout_t lin = nullptr, att = nullptr;
  check(zpPlanGetLayout(plan, zpLinearLayout, &lin), "zpPlanGetLayout");
  check(zpPlanGetLayout(plan, zpAttentionLayout, &att), "zpPlanGetLayout");
  zpRemap_t remap = nullptr;
  check(zpRemapCreate(&remap, lin, att, gComm), "zpRemapCreate");
  zpAttnConfig_t cfg = {kHeads, kKvHeads, kHeadDim, 0.0f, zpAttnRefForward, zpAttnRefBackward, nullptr, 1, zpFloat32};
  zpAttention_t attn = nullptr;
  check(zpAttentionCreate(&attn, plan, &cfg, gComm), "zpAttentionCreate");
  int64_t Tl = 0, Ta = 0;
  zpLayoutRankTokens(lin, rank, &Tl);
  zpLayoutRankTokens(att, rank, &Ta);
  const zpSegment_t* linSegs = nullptr;
  size_t nLinSegs = 0;
  zpLayoutRankSegments(lin, rank, &linSegs, &nLinSegs);
  std::vector<int64_t> rows;  // batch row of each of my linear-layout tokens
  for (size_t i = 0; i < nLinSegs; i++)
    for (int64_t t = 0; t < linSegs[i].count; t++) rows.push_back(cu[linSegs[i].seq] + linSegs[i].start + t);
  std::vector<float> x(Tl * kHidden), g(Tl * kHidden);
  for (int64_t t = 0; t < Tl; t++) {
    memcpy(&x[t * kHidden], &X[rows[t] * kHidden], kHidden * sizeof(float));
    memcpy(&g[t * kHidden], &G[rows[t] * kHidden], kHidden * sizeof(float));
  }

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
  double loss = 0;
  for (int64_t i = 0; i < Tl * kHidden; i++) loss += (double)z[i] * g[i];
  const double t1 = now();

  // ---- Backward ----
  // grads: dWqkv, dWo, dW1, dW2 (this rank's share), then the loss: one array to sum on rank 0.
  const size_t nW[4] = {w.qkv.size(), w.o.size(), w.w1.size(), w.w2.size()};
  std::vector<float> grads(nW[0] + nW[1] + nW[2] + nW[3] + 1, 0.0f);
  float* dWqkv = grads.data();
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
  std::vector<float> dx(dy);
  matmulBt(dqkvLin.data(), w.qkv.data(), dx.data(), Tl, kQkv, kHidden, true);
  const double t2 = now();

  // Weight gradients and the loss, summed on rank 0.
  grads.back() = 0;
  std::vector<double> sum(grads.size(), 0.0), lossSum(1, loss);
  if (rank == 0) {
    std::vector<float> part(grads.size());
    std::vector<double> lossPart(1);
    for (int i = 0; i < (int)grads.size() - 1; i++) sum[i] = grads[i];
    for (int p = 1; p < n; p++) {
      zpGroupStart();
      zpRecv(part.data(), part.size(), zpFloat32, p, gComm, nullptr);
      zpRecv(lossPart.data(), 1, zpFloat64, p, gComm, nullptr);
      check(zpGroupEnd(), "gathering gradients");
      for (size_t i = 0; i < part.size(); i++) sum[i] += part[i];
      lossSum[0] += lossPart[0];
    }
  } else {
    zpGroupStart();
    zpSend(grads.data(), grads.size(), zpFloat32, 0, gComm, nullptr);
    zpSend(lossSum.data(), 1, zpFloat64, 0, gComm, nullptr);
    check(zpGroupEnd(), "sending gradients");
  }

  // The single-process run, and the comparison.
  const Reference ref = referenceLayer(X, G, w, lens);
  std::vector<double> refDx(Tl * kHidden);
  for (int64_t t = 0; t < Tl; t++)
    for (int e = 0; e < kHidden; e++) refDx[t * kHidden + e] = ref.dx[rows[t] * kHidden + e];
  const double bound = 1e-4;  // float32 sums over 64-128 terms against float64
  double dxErr = relError(dx.data(), refDx.data(), refDx.size());
  // Every rank's dx error, to rank 0.
  std::vector<double> dxErrs(n, 0.0);
  if (rank == 0) {
    dxErrs[0] = dxErr;
    zpGroupStart();
    for (int p = 1; p < n; p++) zpRecv(&dxErrs[p], 1, zpFloat64, p, gComm, nullptr);
    check(zpGroupEnd(), "gathering dx errors");
  } else {
    check(zpSend(&dxErr, 1, zpFloat64, 0, gComm, nullptr), "sending the dx error");
  }
  int failed = 0;
  if (rank == 0) {
    int local = 0, intra = 0, inter = 0;
    for (int s = 0; s < nseq; s++) {
      int cls = 0, gsz = 0;
      const int* rr = nullptr;
      zpPlanSequence(plan, s, &cls, &gsz, &rr);
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
    auto slice = [&](size_t from, size_t count) {
      return std::vector<double>(sum.begin() + from, sum.begin() + from + count);
    };
    const double errs[5] = {std::fabs(lossSum[0] - ref.loss) / std::max(1.0, std::fabs(ref.loss)),
                            rel(slice(0, nW[0]), ref.dqkv), rel(slice(nW[0], nW[1]), ref.dwo),
                            rel(slice(nW[0] + nW[1], nW[2]), ref.dw1),
                            rel(slice(nW[0] + nW[1] + nW[2], nW[3]), ref.dw2)};
    double worstDx = 0;
    for (double e : dxErrs) worstDx = std::max(worstDx, e);
    printf("# trainer: %d ranks, seed %llu, %d sequences, %lld tokens (lengths from %s / %lld)\n", n,
           (unsigned long long)seed, nseq, (long long)total, lengthsFile.c_str(), (long long)scale);
    printf("# plan: %d local, %d intra-node rings, %d inter-node rings; layer: hidden %d, %d/%d heads of %d, mlp %d\n",
           local, intra, inter, kHidden, kHeads, kKvHeads, kHeadDim, kMlp);
    printf("# rank 0: forward %.1f ms, backward %.1f ms\n", (t1 - t0) * 1e3, (t2 - t1) * 1e3);
    printf("# relative error vs the single-process float64 run (max |err| / max |ref|, bound %.0e):\n", bound);
    printf("#   loss %.2e  dWqkv %.2e  dWo %.2e  dW1 %.2e  dW2 %.2e  dx (worst rank) %.2e\n", errs[0], errs[1],
           errs[2], errs[3], errs[4], worstDx);
    for (double e : errs) failed |= !(e < bound);
    failed |= !(worstDx < bound);
    printf("%s\n", failed ? "FAIL" : "PASS");
  }
  check(zpGroupStart(), "zpGroupStart");
  // Everyone learns the verdict, so every rank's exit code tells it.
  if (rank == 0)
    for (int p = 1; p < n; p++) zpSend(&failed, 1, zpInt32, p, gComm, nullptr);
  else
    zpRecv(&failed, 1, zpInt32, 0, gComm, nullptr);
  check(zpGroupEnd(), "sharing the verdict");
  zpAttentionDestroy(attn);
  zpRemapDestroy(remap);
  zpPlanDestroy(plan);
  zpCommDestroy(gComm);
  return failed ? 1 : 0;
}
