// The attention driver's element-wise work and the reference block kernels,
// as functors that compile three ways from this one text: as host code for
// the driver's host path (a loop over the index range), by nvcc for the GPU
// (kernels.cu), and as host code for the CUDA test double
// (tests/fakecuda/ext_kernels.cc). One text means the host and the device
// path do the same arithmetic in the same order per element, so their
// results are equal wherever the order of elements does not matter.
//
// Each functor has operator()(i) for one index and mapped(map), a copy whose
// pointers went through map(ptr, bytes) (the double's device aliases).
#pragma once

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "include/zeppelin.h"

#if defined(__CUDACC__)
#define ZPX_HD __host__ __device__
#else
#define ZPX_HD
#endif

namespace zpx {

// The 16-bit float types as stored (bits), told apart by type.
struct Bf16 {
  uint16_t bits;
};
struct Half {
  uint16_t bits;
};

ZPX_HD inline float bitsToFloat(uint32_t b) {
  float f;
  memcpy(&f, &b, 4);
  return f;
}
ZPX_HD inline uint32_t floatToBits(float f) {
  uint32_t b;
  memcpy(&b, &f, 4);
  return b;
}

ZPX_HD inline float toFloat(float x) { return x; }
ZPX_HD inline float toFloat(Bf16 x) { return bitsToFloat((uint32_t)x.bits << 16); }
ZPX_HD inline float toFloat(Half x) {
  const uint32_t sign = (uint32_t)(x.bits >> 15) << 31, exp = (x.bits >> 10) & 0x1F, man = x.bits & 0x3FF;
  if (exp == 0x1F) return bitsToFloat(sign | 0x7F800000u | man << 13);
  if (exp != 0) return bitsToFloat(sign | (exp + 127 - 15) << 23 | man << 13);
  // zero or subnormal: man * 2^-24, exact in float
  const float f = (float)man * 5.9604644775390625e-8f;
  return sign ? -f : f;
}

// Rounding to nearest even.
template <class T>
ZPX_HD inline T fromFloat(float f);
template <>
ZPX_HD inline float fromFloat<float>(float f) {
  return f;
}
template <>
ZPX_HD inline Bf16 fromFloat<Bf16>(float f) {
  uint32_t x = floatToBits(f);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return {(uint16_t)((x >> 16) | 0x40)};  // NaN stays NaN
  x += 0x7FFF + ((x >> 16) & 1);
  return {(uint16_t)(x >> 16)};
}
template <>
ZPX_HD inline Half fromFloat<Half>(float f) {
  const uint32_t x = floatToBits(f);
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  const uint32_t absx = x & 0x7FFFFFFF;
  if (absx >= 0x7F800000) return {(uint16_t)(sign | (absx > 0x7F800000 ? 0x7E00 : 0x7C00))};  // NaN, inf
  if (absx >= 0x477FF000) return {(uint16_t)(sign | 0x7C00)};  // rounds past the largest half: inf
  if (absx < 0x33000000) return {sign};                          // below half the smallest subnormal
  if (absx < 0x38800000) {                                        // a subnormal, in units of 2^-24
    const int shift = 126 - (int)(absx >> 23);
    const uint32_t m = (absx & 0x7FFFFF) | 0x800000, rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    uint32_t r = m >> shift;
    if (rem > halfway || (rem == halfway && (r & 1))) r++;
    return {(uint16_t)(sign | r)};
  }
  uint32_t r = absx - 0x38000000;  // rebias the exponent from 127 to 15
  const uint32_t rem = r & 0x1FFF;
  r >>= 13;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
  return {(uint16_t)(sign | r)};
}

// Calls f.template run<T>() with T the element type of an attention input
// (float32, float16, bfloat16); false for any other type.
template <class F>
bool withInputType(zpDataType_t t, F&& f) {
  switch (t) {
    case zpFloat32: f.template run<float>(); return true;
    case zpBfloat16: f.template run<Bf16>(); return true;
    case zpFloat16: f.template run<Half>(); return true;
    default: return false;
  }
}

template <class P, class Map>
P* mapPtr(Map map, P* p, size_t bytes) {
  return p && bytes ? (P*)map((const void*)p, bytes) : p;
}

// dst[i] = value.
struct FillF32 {
  float* dst;
  float value;
  size_t n;
  ZPX_HD void operator()(size_t i) const { dst[i] = value; }
  template <class Map>
  FillF32 mapped(Map map) const {
    return {mapPtr(map, dst, n * 4), value, n};
  }
};

// dst[i] = src[i] converted (an input type to float32 or back).
template <class D, class S>
struct Convert {
  D* dst;
  const S* src;
  size_t n;
  ZPX_HD void operator()(size_t i) const { dst[i] = fromFloat<D>(toFloat(src[i])); }
  template <class Map>
  Convert mapped(Map map) const {
    return {mapPtr(map, dst, n * sizeof(D)), mapPtr(map, src, n * sizeof(S)), n};
  }
};

// Folds a block's partial result into (out, lse): index i * heads + h is
// row i's head h (zpAttnMergeLse).
struct MergeLse {
  float *out, *lse;
  const float *partOut, *partLse;
  int64_t sq;
  int heads, headDim;
  ZPX_HD void operator()(size_t idx) const {
    const int64_t i = (int64_t)(idx / heads);
    const int h = (int)(idx % heads);
    float& l = lse[h * sq + i];
    const double a = l, c = partLse[h * sq + i];
    if (c == -INFINITY) return;
    const double m = a > c ? a : c, wa = a == -INFINITY ? 0 : exp(a - m), wc = exp(c - m);
    const float fa = (float)(wa / (wa + wc)), fc = (float)(wc / (wa + wc));
    float* o = out + (i * heads + h) * headDim;
    const float* po = partOut + (i * heads + h) * headDim;
    if (fa == 0)  // the accumulator was empty (and may hold anything)
      for (int d = 0; d < headDim; d++) o[d] = po[d];
    else
      for (int d = 0; d < headDim; d++) o[d] = fa * o[d] + fc * po[d];
    l = (float)(m + log(wa + wc));
  }
  template <class Map>
  MergeLse mapped(Map map) const {
    const size_t rows = (size_t)sq * heads;
    return {mapPtr(map, out, rows * headDim * 4), mapPtr(map, lse, rows * 4), mapPtr(map, partOut, rows * headDim * 4),
            mapPtr(map, partLse, rows * 4), sq, heads, headDim};
  }
};

// The reference block kernels (float64 inside, exact softmax; the contract
// of zpAttnBlock_t): index i * qHeads + h is query row i's head h. Inputs q,
// k, v, dout of type T; out, lse, dq, dk, dv float32.
template <class T>
struct AttnRefBlock {
  const T *q, *k, *v, *dout;
  float *out, *lse, *dq, *dk, *dv;
  int64_t sq, sk;
  int H, Hk, D;
  double scale;
  int mask, accumulate;

  ZPX_HD int64_t visible(int64_t i) const { return mask == zpMaskSkip ? 0 : mask == zpMaskCausal ? i + 1 : sk; }
  ZPX_HD double dot(const T* a, const T* b) const {
    double s = 0;
    for (int d = 0; d < D; d++) s += (double)toFloat(a[d]) * toFloat(b[d]);
    return s;
  }

  // Forward of row idx, with acc holding D doubles of scratch.
  ZPX_HD void forward(size_t idx, double* acc) const {
    const int64_t i = (int64_t)(idx / H);
    const int h = (int)(idx % H), g = H / Hk;
    float* o = out + (i * H + h) * D;
    float& l = lse[h * sq + i];
    const int64_t n = visible(i);
    if (n == 0) {  // nothing visible: out 0, lse -inf (adds nothing when merged)
      if (accumulate) return;
      for (int d = 0; d < D; d++) o[d] = 0;
      l = -INFINITY;
      return;
    }
    const T* qi = q + (i * H + h) * D;
    double mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
      const double s = dot(qi, k + (j * Hk + h / g) * D) * scale;
      mx = s > mx ? s : mx;
    }
    double sum = 0;
    for (int d = 0; d < D; d++) acc[d] = 0;
    for (int64_t j = 0; j < n; j++) {
      const double p = exp(dot(qi, k + (j * Hk + h / g) * D) * scale - mx);
      sum += p;
      const T* vj = v + (j * Hk + h / g) * D;
      for (int d = 0; d < D; d++) acc[d] += p * toFloat(vj[d]);
    }
    const double blockLse = mx + log(sum);
    if (accumulate && l != -INFINITY) {  // fold into the running result, as zpAttnMergeLse does
      const double ll = l, m = ll > blockLse ? ll : blockLse, wa = exp(ll - m), wb = exp(blockLse - m);
      for (int d = 0; d < D; d++) o[d] = (float)((wa * o[d] + wb * acc[d] / sum) / (wa + wb));
      l = (float)(m + log(wa + wb));
      return;
    }
    for (int d = 0; d < D; d++) o[d] = (float)(acc[d] / sum);
    l = (float)blockLse;
  }

  // Backward of row idx: adds into dq (its own row) and into dk and dv
  // (shared between rows: add is how, an atomic add on a GPU).
  template <class Add>
  ZPX_HD void backward(size_t idx, Add add) const {
    const int64_t i = (int64_t)(idx / H);
    const int h = (int)(idx % H), g = H / Hk;
    const T* qi = q + (i * H + h) * D;
    const T* doi = dout + (i * H + h) * D;
    const float* oi = out + (i * H + h) * D;
    // Against the full row's out and lse (of all blocks merged), so that
    // the blocks' gradients add up to the full gradient.
    double Di = 0;
    for (int d = 0; d < D; d++) Di += (double)toFloat(doi[d]) * oi[d];
    const double rowLse = lse[h * sq + i];
    const int64_t n = visible(i);
    float* dqi = dq + (i * H + h) * D;
    for (int64_t j = 0; j < n; j++) {
      const T* kj = k + (j * Hk + h / g) * D;
      const T* vj = v + (j * Hk + h / g) * D;
      const double p = exp(dot(qi, kj) * scale - rowLse);
      const double ds = p * (dot(doi, vj) - Di) * scale;
      float* dkj = dk + (j * Hk + h / g) * D;
      float* dvj = dv + (j * Hk + h / g) * D;
      for (int d = 0; d < D; d++) {
        dqi[d] += (float)(ds * toFloat(kj[d]));
        add(&dkj[d], (float)(ds * toFloat(qi[d])));
        add(&dvj[d], (float)(p * toFloat(doi[d])));
      }
    }
  }

  template <class Map>
  AttnRefBlock mapped(Map map) const {
    const size_t qn = (size_t)sq * H * D, kn = (size_t)sk * Hk * D;
    AttnRefBlock b = *this;
    b.q = mapPtr(map, q, qn * sizeof(T));
    b.k = mapPtr(map, k, kn * sizeof(T));
    b.v = mapPtr(map, v, kn * sizeof(T));
    b.dout = mapPtr(map, dout, qn * sizeof(T));
    b.out = mapPtr(map, out, qn * 4);
    b.lse = mapPtr(map, lse, (size_t)sq * H * 4);
    b.dq = mapPtr(map, dq, qn * 4);
    b.dk = mapPtr(map, dk, kn * 4);
    b.dv = mapPtr(map, dv, kn * 4);
    return b;
  }

  static AttnRefBlock of(const zpAttnBlock_t& b) {
    return {(const T*)b.q, (const T*)b.k, (const T*)b.v, (const T*)b.dout, b.out, b.lse, b.dq, b.dk, b.dv,
            b.sq,          b.sk,          b.qHeads,      b.kvHeads,         b.headDim, (double)b.scale, (int)b.mask,
            b.accumulate};
  }
};

// The device reference kernel keeps its row's accumulator in registers and
// local memory: head dims up to this.
constexpr int kAttnRefMaxHeadDim = 256;

}  // namespace zpx
