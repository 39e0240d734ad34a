// The reference attention block kernel and the log-sum-exp merge against a
// float64 reference of whole causal / non-causal attention with GQA: a
// single block, and a sequence cut into two chunks whose block pairs are
// full, causal (diagonal) or skipped, as zigzag chunking makes them.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "include/zeppelin.h"
#include "tests/attention_check.h"
#include "tests/harness.h"

namespace {

// Relative to the reference's norm; absolute where the reference is zero up
// to rounding (a one-token sequence has exactly zero dq and dk: the softmax
// of one score does not depend on it).
double relErr(const std::vector<float>& got, const std::vector<double>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); i++) {
    if (std::isnan(got[i])) return INFINITY;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return den > 1e-12 ? std::sqrt(num / den) : std::sqrt(num);
}

std::vector<float> randomVec(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = nd(rng);
  return v;
}

// Rows [a, b) of a [s, heads, D] tensor, and back.
std::vector<float> rows(const std::vector<float>& t, int64_t a, int64_t b, int heads, int D) {
  return std::vector<float>(t.begin() + a * heads * D, t.begin() + b * heads * D);
}

TEST(AttentionRef, SingleBlockMatchesTheReference) {
  std::mt19937_64 rng(zptest::testCaseSeed());
  for (int it = 0; it < 12; it++) {
    int Hk = 1 + rng() % 3, H = Hk * (1 + rng() % 3), D = 1 + rng() % 16;
    int64_t s = 1 + rng() % 40;
    bool causal = it % 2;
    float scale = 1.0f / std::sqrt((float)D);
    auto q = randomVec(s * H * D, rng), k = randomVec(s * Hk * D, rng), v = randomVec(s * Hk * D, rng),
         dout = randomVec(s * H * D, rng);
    const zptest::RefSeq ref =
        zptest::referenceAttention(q.data(), k.data(), v.data(), dout.data(), s, H, Hk, D, scale, causal);
    std::vector<float> out(s * H * D, NAN), lse(H * s, NAN), dq(s * H * D, 0), dk(s * Hk * D, 0), dv(s * Hk * D, 0);
    zpAttnBlock_t b = {q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(), dk.data(),
                       dv.data(), s, s, H, Hk, D, scale, causal ? zpMaskCausal : zpMaskFull, 0, zpFloat32, nullptr};
    ASSERT_EQ(zpAttnRefForward(&b, nullptr), zpSuccess);
    ASSERT_EQ(zpAttnRefBackward(&b, nullptr), zpSuccess);
    EXPECT_LT(relErr(out, ref.out), 1e-5);
    EXPECT_LT(relErr(lse, ref.lse), 1e-5);
    EXPECT_LT(relErr(dq, ref.dq), 1e-5);
    EXPECT_LT(relErr(dk, ref.dk), 1e-5);
    EXPECT_LT(relErr(dv, ref.dv), 1e-5);
  }
}

// A sequence in two chunks A = [0, m) and B = [m, s): queries of B see A fully
// and B causally (or fully), queries of A see A causally and B not at all (or
// fully). Block results merged by lse, gradients summed, equal the whole.
TEST(AttentionRef, BlocksMergedByLseEqualTheWhole) {
  std::mt19937_64 rng(zptest::testCaseSeed());
  for (int it = 0; it < 12; it++) {
    int Hk = 1 + rng() % 2, H = Hk * (1 + rng() % 4), D = 1 + rng() % 12;
    int64_t m = 1 + rng() % 20, s = 2 * m;  // equal chunks: causal blocks are diagonal
    bool causal = it % 2;
    float scale = 0.5f;
    auto q = randomVec(s * H * D, rng), k = randomVec(s * Hk * D, rng), v = randomVec(s * Hk * D, rng),
         dout = randomVec(s * H * D, rng);
    const zptest::RefSeq ref =
        zptest::referenceAttention(q.data(), k.data(), v.data(), dout.data(), s, H, Hk, D, scale, causal);
    std::vector<float> out(s * H * D, NAN), lse(H * s, NAN), dq(s * H * D, 0), dk(s * Hk * D, 0), dv(s * Hk * D, 0);
    // Per query chunk: its key chunks and masks.
    struct Pair {
      int qc, kc;
      zpAttnMask_t mask;
    };
    std::vector<Pair> pairs = {{0, 0, causal ? zpMaskCausal : zpMaskFull}, {0, 1, causal ? zpMaskSkip : zpMaskFull},
                               {1, 0, zpMaskFull}, {1, 1, causal ? zpMaskCausal : zpMaskFull}};
    std::vector<std::vector<float>> qo(2), ql(2);
    for (int c = 0; c < 2; c++) {
      qo[c].assign(m * H * D, 0);
      ql[c].assign(H * m, -INFINITY);
    }
    for (const Pair& p : pairs) {
      if (p.mask == zpMaskSkip) continue;
      auto qq = rows(q, p.qc * m, p.qc * m + m, H, D), kk = rows(k, p.kc * m, p.kc * m + m, Hk, D),
           vv = rows(v, p.kc * m, p.kc * m + m, Hk, D);
      std::vector<float> po(m * H * D, NAN), pl(H * m, NAN);
      zpAttnBlock_t b = {qq.data(), kk.data(), vv.data(), po.data(), pl.data(), nullptr, nullptr, nullptr, nullptr,
                         m, m, H, Hk, D, scale, p.mask, 0, zpFloat32, nullptr};
      ASSERT_EQ(zpAttnRefForward(&b, nullptr), zpSuccess);
      ASSERT_EQ(zpAttnMergeLse(qo[p.qc].data(), ql[p.qc].data(), po.data(), pl.data(), m, H, D, nullptr), zpSuccess);
    }
    // The same blocks folded in by the kernel itself (accumulate) give the
    // same rows as the merge.
    for (int c = 0; c < 2; c++) {
      std::vector<float> ao(m * H * D, 0), al(H * m, -INFINITY);
      for (const Pair& p : pairs) {
        if (p.mask == zpMaskSkip || p.qc != c) continue;
        auto qq = rows(q, p.qc * m, p.qc * m + m, H, D), kk = rows(k, p.kc * m, p.kc * m + m, Hk, D),
             vv = rows(v, p.kc * m, p.kc * m + m, Hk, D);
        zpAttnBlock_t b = {qq.data(), kk.data(), vv.data(), ao.data(), al.data(), nullptr, nullptr, nullptr, nullptr,
                           m, m, H, Hk, D, scale, p.mask, 1, zpFloat32, nullptr};
        ASSERT_EQ(zpAttnRefForward(&b, nullptr), zpSuccess);
      }
      double worst = 0;
      for (size_t e = 0; e < ao.size(); e++) worst = std::max(worst, (double)std::fabs(ao[e] - qo[c][e]));
      for (size_t e = 0; e < al.size(); e++) worst = std::max(worst, (double)std::fabs(al[e] - ql[c][e]));
      EXPECT_LT(worst, 1e-5) << "chunk " << c << ": accumulate differs from merge";
    }
    for (int c = 0; c < 2; c++) {
      std::copy(qo[c].begin(), qo[c].end(), out.begin() + c * m * H * D);
      for (int h = 0; h < H; h++)
        for (int64_t i = 0; i < m; i++) lse[h * s + c * m + i] = ql[c][h * m + i];
    }
    EXPECT_LT(relErr(out, ref.out), 1e-5);
    EXPECT_LT(relErr(lse, ref.lse), 1e-5);
    std::vector<float> gq[2] = {std::vector<float>(m * H * D, 0), std::vector<float>(m * H * D, 0)};
    std::vector<float> gk[2] = {std::vector<float>(m * Hk * D, 0), std::vector<float>(m * Hk * D, 0)};
    std::vector<float> gv[2] = {std::vector<float>(m * Hk * D, 0), std::vector<float>(m * Hk * D, 0)};
    for (const Pair& p : pairs) {
      if (p.mask == zpMaskSkip) continue;
      auto qq = rows(q, p.qc * m, p.qc * m + m, H, D), kk = rows(k, p.kc * m, p.kc * m + m, Hk, D),
           vv = rows(v, p.kc * m, p.kc * m + m, Hk, D), dd = rows(dout, p.qc * m, p.qc * m + m, H, D);
      zpAttnBlock_t b = {qq.data(), kk.data(), vv.data(), qo[p.qc].data(), ql[p.qc].data(), dd.data(),
                         gq[p.qc].data(), gk[p.kc].data(), gv[p.kc].data(), m, m, H, Hk, D, scale, p.mask, 0, zpFloat32, nullptr};
      ASSERT_EQ(zpAttnRefBackward(&b, nullptr), zpSuccess);
    }
    for (int c = 0; c < 2; c++) {
      std::copy(gq[c].begin(), gq[c].end(), dq.begin() + c * m * H * D);
      std::copy(gk[c].begin(), gk[c].end(), dk.begin() + c * m * Hk * D);
      std::copy(gv[c].begin(), gv[c].end(), dv.begin() + c * m * Hk * D);
    }
    EXPECT_LT(relErr(dq, ref.dq), 1e-5);
    EXPECT_LT(relErr(dk, ref.dk), 1e-5);
    EXPECT_LT(relErr(dv, ref.dv), 1e-5);
  }
}

TEST(AttentionRef, BadBlocksGetClearErrors) {
  float x = 0;
  zpAttnBlock_t b = {&x, &x, &x, &x, &x, nullptr, nullptr, nullptr, nullptr, 2, 3, 4, 3, 8, 1, zpMaskFull, 0, zpFloat32, nullptr};
  ZP_EXPECT_ERROR(zpInvalidArgument, zpAttnRefForward(&b, nullptr));  // 3 does not divide 4
  b.kvHeads = 2;
  b.mask = zpMaskCausal;
  ZP_EXPECT_ERROR(zpInvalidArgument, zpAttnRefForward(&b, nullptr));  // causal but not diagonal
  b.mask = zpMaskFull;
  ZP_EXPECT_ERROR(zpInvalidArgument, zpAttnRefBackward(&b, nullptr));  // no dout
  ZP_EXPECT_ERROR(zpInvalidArgument, zpAttnRefForward(nullptr, nullptr));
}

}  // namespace
