// The reference CPU attention block kernel (float32 in and out, float64
// inside, exact softmax), the example of the block-kernel contract in
// include/zeppelin.h, and the log-sum-exp merge of partial outputs.
#include <cmath>
#include <vector>

#include "collectives/ext/ext.h"
#include "include/zeppelin.h"

namespace {

zpResult_t checkBlock(const zpAttnBlock_t* b, const char* fn, bool backward) {
  if (!b) return zpSetLastError(nullptr, zpInvalidArgument, "%s: block is NULL", fn);
  if (b->sq < 0 || b->sk < 0 || b->qHeads < 1 || b->kvHeads < 1 || b->headDim < 1 || b->qHeads % b->kvHeads)
    return zpSetLastError(nullptr, zpInvalidArgument, "%s: sq %lld, sk %lld, %d query heads, %d key/value heads, head dim %d", fn,
                    (long long)b->sq, (long long)b->sk, b->qHeads, b->kvHeads, b->headDim);
  if (b->mask != zpMaskFull && b->mask != zpMaskCausal && b->mask != zpMaskSkip)
    return zpSetLastError(nullptr, zpInvalidArgument, "%s: mask %d", fn, (int)b->mask);
  if (b->mask == zpMaskCausal && b->sq != b->sk)
    return zpSetLastError(nullptr, zpInvalidArgument, "%s: a causal block is a diagonal block: sq %lld != sk %lld", fn,
                    (long long)b->sq, (long long)b->sk);
  bool empty = b->sq == 0 || b->sk == 0 || b->mask == zpMaskSkip;
  if (!empty && (!b->q || !b->k || !b->v || !b->out || !b->lse))
    return zpSetLastError(nullptr, zpInvalidArgument, "%s: a NULL pointer among q, k, v, out, lse", fn);
  if (backward && !empty && (!b->dout || !b->dq || !b->dk || !b->dv))
    return zpSetLastError(nullptr, zpInvalidArgument, "%s: a NULL pointer among dout, dq, dk, dv", fn);
  return zpSuccess;
}

}  // namespace

zpResult_t zpAttnRefForward(const zpAttnBlock_t* b, void* /*user*/) try {
  ZPX_CHECK(checkBlock(b, "zpAttnRefForward", false));
  const int64_t sq = b->sq, sk = b->sk;
  const int H = b->qHeads, Hk = b->kvHeads, D = b->headDim, g = H / Hk;
  std::vector<double> s(sk), acc(D);
  for (int64_t i = 0; i < sq; i++)
    for (int h = 0; h < H; h++) {
      float* o = b->out + (i * H + h) * D;
      float& lse = b->lse[h * sq + i];
      int64_t n = b->mask == zpMaskSkip ? 0 : b->mask == zpMaskCausal ? i + 1 : sk;
      if (n == 0) {  // nothing visible: out 0, lse -inf (adds nothing when merged)
        if (b->accumulate) continue;
        for (int d = 0; d < D; d++) o[d] = 0;
        lse = -INFINITY;
        continue;
      }
      const float* qi = b->q + (i * H + h) * D;
      double mx = -INFINITY;
      for (int64_t j = 0; j < n; j++) {
        const float* kj = b->k + (j * Hk + h / g) * D;
        double dot = 0;
        for (int d = 0; d < D; d++) dot += (double)qi[d] * kj[d];
        s[j] = dot * b->scale;
        mx = std::max(mx, s[j]);
      }
      double sum = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < n; j++) {
        double p = std::exp(s[j] - mx);
        sum += p;
        const float* vj = b->v + (j * Hk + h / g) * D;
        for (int d = 0; d < D; d++) acc[d] += p * vj[d];
      }
      const double blockLse = mx + std::log(sum);
      if (b->accumulate && lse != -INFINITY) {  // fold into the running result, as zpAttnMergeLse does
        const double m = std::max<double>(lse, blockLse), wa = std::exp(lse - m), wb = std::exp(blockLse - m);
        for (int d = 0; d < D; d++) o[d] = (float)((wa * o[d] + wb * acc[d] / sum) / (wa + wb));
        lse = (float)(m + std::log(wa + wb));
        continue;
      }
      for (int d = 0; d < D; d++) o[d] = (float)(acc[d] / sum);
      lse = (float)blockLse;
    }
  return zpSuccess;
} catch (...) {
  return zpx::failFromException("zpAttnRefForward");
}

zpResult_t zpAttnRefBackward(const zpAttnBlock_t* b, void* /*user*/) try {
  ZPX_CHECK(checkBlock(b, "zpAttnRefBackward", true));
  const int64_t sq = b->sq, sk = b->sk;
  const int H = b->qHeads, Hk = b->kvHeads, D = b->headDim, g = H / Hk;
  if (b->mask == zpMaskSkip || sq == 0 || sk == 0) return zpSuccess;
  for (int64_t i = 0; i < sq; i++)
    for (int h = 0; h < H; h++) {
      const float* qi = b->q + (i * H + h) * D;
      const float* doi = b->dout + (i * H + h) * D;
      const float* oi = b->out + (i * H + h) * D;
      // Against the full row's out and lse (of all blocks merged), so that
      // the blocks' gradients add up to the full gradient.
      double Di = 0;
      for (int d = 0; d < D; d++) Di += (double)doi[d] * oi[d];
      double lse = b->lse[h * sq + i];
      int64_t n = b->mask == zpMaskCausal ? i + 1 : sk;
      float* dqi = b->dq + (i * H + h) * D;
      for (int64_t j = 0; j < n; j++) {
        const float* kj = b->k + (j * Hk + h / g) * D;
        const float* vj = b->v + (j * Hk + h / g) * D;
        double dot = 0, dp = 0;
        for (int d = 0; d < D; d++) {
          dot += (double)qi[d] * kj[d];
          dp += (double)doi[d] * vj[d];
        }
        double p = std::exp(dot * b->scale - lse);
        double ds = p * (dp - Di) * b->scale;
        float* dkj = b->dk + (j * Hk + h / g) * D;
        float* dvj = b->dv + (j * Hk + h / g) * D;
        for (int d = 0; d < D; d++) {
          dqi[d] += (float)(ds * kj[d]);
          dkj[d] += (float)(ds * qi[d]);
          dvj[d] += (float)(p * doi[d]);
        }
      }
    }
  return zpSuccess;
} catch (...) {
  return zpx::failFromException("zpAttnRefBackward");
}

zpResult_t zpAttnMergeLse(float* out, float* lse, const float* partOut, const float* partLse, int64_t sq,
                                 int qHeads, int headDim) try {
  if (sq < 0 || qHeads < 1 || headDim < 1)
    return zpSetLastError(nullptr, zpInvalidArgument, "zpAttnMergeLse: sq %lld, %d heads, head dim %d", (long long)sq, qHeads, headDim);
  if (sq && (!out || !lse || !partOut || !partLse)) return zpSetLastError(nullptr, zpInvalidArgument, "zpAttnMergeLse: NULL pointer");
  for (int64_t i = 0; i < sq; i++)
    for (int h = 0; h < qHeads; h++) {
      float& l = lse[h * sq + i];
      double a = l, c = partLse[h * sq + i];
      if (c == -INFINITY) continue;
      double m = std::max(a, c), wa = a == -INFINITY ? 0 : std::exp(a - m), wc = std::exp(c - m);
      const float fa = (float)(wa / (wa + wc)), fc = (float)(wc / (wa + wc));
      float* o = out + (i * qHeads + h) * headDim;
      const float* po = partOut + (i * qHeads + h) * headDim;
      if (fa == 0)  // the accumulator was empty (and may hold anything)
        for (int d = 0; d < headDim; d++) o[d] = po[d];
      else
        for (int d = 0; d < headDim; d++) o[d] = fa * o[d] + fc * po[d];
      l = (float)(m + std::log(wa + wc));
    }
  return zpSuccess;
} catch (...) {
  return zpx::failFromException("zpAttnMergeLse");
}
