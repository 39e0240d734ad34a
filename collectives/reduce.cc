#include "collectives/reduce.h"

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace zp {

bool validRedOp(int op) { return op >= zpSum && op < zpNumOps; }

const char* redOpName(int op) {
  switch (op) {
    case zpSum: return "sum";
    case zpProd: return "prod";
    case zpMax: return "max";
    case zpMin: return "min";
    case zpAvg: return "avg";
    default: return "invalid op";
  }
}

const char* typeName(int t) {
  switch (t) {
    case zpInt8: return "int8";
    case zpUint8: return "uint8";
    case zpInt32: return "int32";
    case zpUint32: return "uint32";
    case zpInt64: return "int64";
    case zpUint64: return "uint64";
    case zpFloat16: return "float16";
    case zpFloat32: return "float32";
    case zpFloat64: return "float64";
    case zpBfloat16: return "bfloat16";
    default: return "invalid datatype";
  }
}

zpDataType_t workType(zpDataType_t t) { return isHalf(t) ? zpFloat32 : t; }

namespace {

// Signed integers add and multiply as unsigned, so overflow wraps (two's
// complement) instead of being undefined behaviour.
template <class T, bool = std::is_integral<T>::value>
struct ArithOf {
  using type = T;
};
template <class T>
struct ArithOf<T, true> {
  using type = typename std::make_unsigned<T>::type;
};
template <class T>
using Arith = typename ArithOf<T>::type;

// Plain loops over non-aliasing-checked pointers: GCC vectorizes them (with a
// runtime overlap check, since dst may equal a or b).
template <class T>
void reduceT(T* dst, const T* a, const T* b, size_t n, zpRedOp_t op) {
  using A = Arith<T>;
  switch (op) {
    case zpSum:
    case zpAvg:
      for (size_t i = 0; i < n; i++) dst[i] = (T)((A)a[i] + (A)b[i]);
      break;
    case zpProd:
      for (size_t i = 0; i < n; i++) dst[i] = (T)((A)a[i] * (A)b[i]);
      break;
    case zpMax:
      for (size_t i = 0; i < n; i++) dst[i] = a[i] < b[i] ? b[i] : a[i];
      break;
    case zpMin:
      for (size_t i = 0; i < n; i++) dst[i] = b[i] < a[i] ? b[i] : a[i];
      break;
    default:
      break;
  }
}

template <class T>
void avgT(T* buf, size_t n, int nranks) {
  for (size_t i = 0; i < n; i++) buf[i] = (T)(buf[i] / (T)nranks);
}

}  // namespace

void reduce(void* dst, const void* a, const void* b, size_t n, zpDataType_t t, zpRedOp_t op) {
  switch (t) {
    case zpInt8: return reduceT((int8_t*)dst, (const int8_t*)a, (const int8_t*)b, n, op);
    case zpUint8: return reduceT((uint8_t*)dst, (const uint8_t*)a, (const uint8_t*)b, n, op);
    case zpInt32: return reduceT((int32_t*)dst, (const int32_t*)a, (const int32_t*)b, n, op);
    case zpUint32: return reduceT((uint32_t*)dst, (const uint32_t*)a, (const uint32_t*)b, n, op);
    case zpInt64: return reduceT((int64_t*)dst, (const int64_t*)a, (const int64_t*)b, n, op);
    case zpUint64: return reduceT((uint64_t*)dst, (const uint64_t*)a, (const uint64_t*)b, n, op);
    case zpFloat32: return reduceT((float*)dst, (const float*)a, (const float*)b, n, op);
    case zpFloat64: return reduceT((double*)dst, (const double*)a, (const double*)b, n, op);
    default: return;  // 16-bit floats are reduced as float32 (workType)
  }
}

void finishAvg(void* buf, size_t n, zpDataType_t t, int nranks) {
  switch (t) {
    case zpInt8: return avgT((int8_t*)buf, n, nranks);
    case zpUint8: return avgT((uint8_t*)buf, n, nranks);
    case zpInt32: return avgT((int32_t*)buf, n, nranks);
    case zpUint32: return avgT((uint32_t*)buf, n, nranks);
    case zpInt64: return avgT((int64_t*)buf, n, nranks);
    case zpUint64: return avgT((uint64_t*)buf, n, nranks);
    case zpFloat32: return avgT((float*)buf, n, nranks);
    case zpFloat64: return avgT((double*)buf, n, nranks);
    default: return;
  }
}

float halfBitsToFloat(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000 | (man << 13);  // inf, nan
  } else if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      int e = -1;
      do {
        man <<= 1;
        e++;
      } while (!(man & 0x400));
      bits = sign | (uint32_t)(127 - 15 - e) << 23 | (man & 0x3ff) << 13;
    }
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToHalfBits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  uint32_t absx = x & 0x7fffffff;
  if (absx >= 0x7f800000) return (uint16_t)(sign | 0x7c00 | (absx > 0x7f800000 ? 0x200 : 0));  // inf, nan
  if (absx >= 0x477ff000) return (uint16_t)(sign | 0x7c00);  // rounds to beyond 65504: inf
  if (absx < 0x38800000) {
    // Subnormal half (or zero): shift the mantissa with its hidden bit into
    // place and round to nearest even on the bits shifted out.
    if (absx < 0x33000000) return (uint16_t)sign;  // below half the smallest subnormal
    // The value in units of 2^-24 (the smallest subnormal) is man * 2^(e - 126).
    uint32_t e = absx >> 23, man = (absx & 0x7fffff) | 0x800000;
    uint32_t shift = 126 - e;  // 14..24
    uint32_t v = man >> shift, rest = man & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rest > half || (rest == half && (v & 1))) v++;  // 1024 is the smallest normal: right too
    return (uint16_t)(sign | v);
  }
  // Normal: rebias the exponent, round the 13 dropped bits to nearest even.
  uint32_t v = absx - ((127 - 15) << 23);
  uint32_t rest = v & 0x1fff;
  v >>= 13;
  if (rest > 0x1000 || (rest == 0x1000 && (v & 1))) v++;  // a carry into the exponent is right
  return (uint16_t)(sign | v);
}

float bf16BitsToFloat(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToBf16Bits(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);  // nan stays (quiet) nan
  uint32_t rest = x & 0xffff, v = x >> 16;
  if (rest > 0x8000 || (rest == 0x8000 && (v & 1))) v++;
  return (uint16_t)v;
}

void halfToFloat(float* dst, const void* src, size_t n, zpDataType_t t) {
  const uint16_t* s = (const uint16_t*)src;
  if (t == zpBfloat16)
    for (size_t i = 0; i < n; i++) dst[i] = bf16BitsToFloat(s[i]);
  else
    for (size_t i = 0; i < n; i++) dst[i] = halfBitsToFloat(s[i]);
}

void floatToHalf(void* dst, const float* src, size_t n, zpDataType_t t) {
  uint16_t* d = (uint16_t*)dst;
  if (t == zpBfloat16)
    for (size_t i = 0; i < n; i++) d[i] = floatToBf16Bits(src[i]);
  else
    for (size_t i = 0; i < n; i++) d[i] = floatToHalfBits(src[i]);
}

}  // namespace zp
