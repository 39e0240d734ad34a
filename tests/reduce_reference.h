// The reductions' reference for the collectives' tests (the gtest suite and
// zp_multinode_rank): inputs that depend only on (seed, rank, index), small
// integers (and halves), so that sums, products, maxima and minima are exact
// in every datatype whatever the order of the additions, and results are
// compared exactly. zpAvg divides the sum once; for float16 / bfloat16 the
// expected value is rounded to the type by the test's own conversion (not
// the library's) and compared exactly too.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "include/zeppelin.h"

namespace zptest {

constexpr zpDataType_t kTypes[] = {zpInt8, zpUint8, zpInt32, zpUint32, zpInt64,
                               zpUint64, zpFloat16, zpFloat32, zpFloat64, zpBfloat16};
constexpr zpRedOp_t kOps[] = {zpSum, zpProd, zpMax, zpMin, zpAvg};

// ---- The test's own 16-bit float conversions (independent of the library's) ----
inline uint16_t toBf16(double v) {  // round to nearest even, through float
  float f = (float)v;
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t lower = x & 0xFFFF, upper = x >> 16;
  if (lower > 0x8000 || (lower == 0x8000 && (upper & 1))) upper++;
  return (uint16_t)upper;
}
inline double fromBf16(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}
inline double fromHalf(uint16_t h) {
  int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  double v = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return (h & 0x8000) ? -v : v;
}
inline uint16_t toHalf(double v) {  // for values in the normal range or zero: nearest even
  if (v == 0) return 0;
  uint16_t sign = v < 0 ? 0x8000 : 0;
  double a = std::fabs(v);
  int e;
  std::frexp(a, &e);  // a = f * 2^e, f in [0.5, 1)
  double scaled = std::ldexp(a, 11 - e);  // 11 significant bits: [1024, 2048)
  double r = std::nearbyint(scaled);      // the FPU's nearest even
  if (r == 2048) {
    r = 1024;
    e++;
  }
  return sign | (uint16_t)((e + 14) << 10) | (uint16_t)((int)r - 1024);
}

// Element i of rank r's input for this case, as a double: small integers
// (1..3 for products, so that 8 ranks stay exact; -8..8 otherwise, 0..8 for
// unsigned types).
inline double inputValue(uint64_t seed, int r, size_t i, zpDataType_t t, zpRedOp_t op) {
  uint64_t h = seed ^ (uint64_t)r * 0x9E3779B97F4A7C15ull ^ (uint64_t)i * 0xBF58476D1CE4E5B9ull;
  h ^= h >> 29;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 32;
  if (op == zpProd) return 1 + (double)(h % 3);
  const bool unsignedType = t == zpUint8 || t == zpUint32 || t == zpUint64;
  return unsignedType ? (double)(h % 9) : (double)(h % 17) - 8;
}

inline void store(void* buf, size_t i, zpDataType_t t, double v) {
  switch (t) {
    case zpInt8: ((int8_t*)buf)[i] = (int8_t)v; break;
    case zpUint8: ((uint8_t*)buf)[i] = (uint8_t)v; break;
    case zpInt32: ((int32_t*)buf)[i] = (int32_t)v; break;
    case zpUint32: ((uint32_t*)buf)[i] = (uint32_t)v; break;
    case zpInt64: ((int64_t*)buf)[i] = (int64_t)v; break;
    case zpUint64: ((uint64_t*)buf)[i] = (uint64_t)v; break;
    case zpFloat16: ((uint16_t*)buf)[i] = toHalf(v); break;
    case zpFloat32: ((float*)buf)[i] = (float)v; break;
    case zpFloat64: ((double*)buf)[i] = v; break;
    case zpBfloat16: ((uint16_t*)buf)[i] = toBf16(v); break;
    default: break;
  }
}

inline double load(const void* buf, size_t i, zpDataType_t t) {
  switch (t) {
    case zpInt8: return ((const int8_t*)buf)[i];
    case zpUint8: return ((const uint8_t*)buf)[i];
    case zpInt32: return ((const int32_t*)buf)[i];
    case zpUint32: return ((const uint32_t*)buf)[i];
    case zpInt64: return (double)((const int64_t*)buf)[i];
    case zpUint64: return (double)((const uint64_t*)buf)[i];
    case zpFloat16: return fromHalf(((const uint16_t*)buf)[i]);
    case zpFloat32: return ((const float*)buf)[i];
    case zpFloat64: return ((const double*)buf)[i];
    case zpBfloat16: return fromBf16(((const uint16_t*)buf)[i]);
    default: return 0;
  }
}

inline bool isInteger(zpDataType_t t) { return t != zpFloat16 && t != zpFloat32 && t != zpFloat64 && t != zpBfloat16; }

// What element i of the reduction over every rank must be, as the type holds it.
inline double expected(uint64_t seed, int n, size_t i, zpDataType_t t, zpRedOp_t op) {
  double acc = inputValue(seed, 0, i, t, op);
  for (int r = 1; r < n; r++) {
    double v = inputValue(seed, r, i, t, op);
    if (op == zpSum || op == zpAvg) acc += v;
    if (op == zpProd) acc *= v;
    if (op == zpMax) acc = std::max(acc, v);
    if (op == zpMin) acc = std::min(acc, v);
  }
  if (op == zpAvg) acc = isInteger(t) ? std::trunc(acc / n) : acc / n;
  // As the type holds it (the float types round once; avg is the only inexact op).
  std::vector<char> one(8);
  store(one.data(), 0, t, t == zpFloat32 ? (double)(float)acc : acc);
  return load(one.data(), 0, t);
}

// Every element of got[0, count) against the reduction of elements
// [first, first + count) of the ranks' inputs; "" or what is wrong.
inline std::string checkReduced(const void* got, size_t count, size_t first, uint64_t seed, int n, zpDataType_t t,
                         zpRedOp_t op) {
  size_t wrong = 0, firstWrong = 0;
  for (size_t i = 0; i < count; i++)
    if (load(got, i, t) != expected(seed, n, first + i, t, op) && wrong++ == 0) firstWrong = i;
  if (!wrong) return "";
  return std::to_string(wrong) + " of " + std::to_string(count) + " wrong, first at " + std::to_string(firstWrong) +
         ": " + std::to_string(load(got, firstWrong, t)) + " instead of " +
         std::to_string(expected(seed, n, first + firstWrong, t, op));
}

inline void fillInput(void* buf, size_t count, size_t first, uint64_t seed, int rank, zpDataType_t t, zpRedOp_t op) {
  for (size_t i = 0; i < count; i++) store(buf, i, t, inputValue(seed, rank, first + i, t, op));
}

}  // namespace zptest
