// The arithmetic of the reducing collectives: float16 / bfloat16 to and from
// float32, the reductions (vectorised, and the transports' reducers), avg.
#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "collectives/standard_internal.h"

namespace zp {
namespace detail {

namespace {

float halfToFloat(uint16_t h) {
  const uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      uint32_t m = man;
      do {
        e++;
        m <<= 1;
      } while (!(m & 0x400));
      bits = sign | (uint32_t)(127 - 15 - e) << 23 | (m & 0x3FF) << 13;
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | man << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | man << 13;
  }
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToHalf(float f) {  // round to nearest even
  uint32_t x;
  memcpy(&x, &f, 4);
  const uint16_t sign = (uint16_t)((x >> 16) & 0x8000);
  const uint32_t absx = x & 0x7FFFFFFF;
  if (absx >= 0x7F800000) return sign | (absx > 0x7F800000 ? 0x7E00 : 0x7C00);  // NaN, inf
  if (absx >= 0x477FF000) return sign | 0x7C00;  // rounds past the largest half: inf
  if (absx < 0x33000000) return sign;  // below half the smallest subnormal: zero
  if (absx < 0x38800000) {  // below the smallest normal: a subnormal, in units of 2^-24
    const int shift = 126 - (int)(absx >> 23);  // 14..24
    const uint32_t m = (absx & 0x7FFFFF) | 0x800000;
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (r & 1))) r++;
    return sign | (uint16_t)r;
  }
  uint32_t r = absx - 0x38000000;  // rebias the exponent from 127 to 15
  const uint32_t rem = r & 0x1FFF;
  r >>= 13;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) r++;
  return sign | (uint16_t)r;
}

float bf16ToFloat(uint16_t h) {
  uint32_t bits = (uint32_t)h << 16;
  float f;
  memcpy(&f, &bits, 4);
  return f;
}

uint16_t floatToBf16(float f) {  // round to nearest even
  uint32_t x;
  memcpy(&x, &f, 4);
  if ((x & 0x7FFFFFFF) > 0x7F800000) return (uint16_t)((x >> 16) | 0x40);  // NaN stays NaN
  x += 0x7FFF + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

// dst[i] = a[i] op b[i] (dst may be a or b); zpAvg sums, divided at the end.
// The bulk goes 16 bytes at a time as GCC vectors (the compiler picks the
// instructions: SSE2 on any x86-64): the plain loop stayed scalar at -O2,
// one element per instruction, a fifth of a large all-reduce's time, as
// GCC's cheap cost model vectorises no loop that needs a run-time check
// that dst does not overlap a or b. f works on vectors and scalars alike.
template <class T, class F>
void reduceWith(T* dst, const T* a, const T* b, size_t n, F f) {
  typedef T Vec __attribute__((vector_size(16)));  // SSE2: wider ones change the ABI of f
  constexpr size_t kLanes = sizeof(Vec) / sizeof(T);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    Vec x, y;
    memcpy(&x, a + i, sizeof(Vec));
    memcpy(&y, b + i, sizeof(Vec));
    x = f(x, y);
    memcpy(dst + i, &x, sizeof(Vec));
  }
  for (; i < n; i++) dst[i] = f(a[i], b[i]);
}
template <class T>
void reduce3(T* dst, const T* a, const T* b, size_t n, zpRedOp_t op) {
  // decltype(x)(...): back to the element type after C++'s integer promotion.
  switch (op) {
    case zpSum:
    case zpAvg: reduceWith(dst, a, b, n, [](auto x, auto y) { return decltype(x)(x + y); }); break;
    case zpProd: reduceWith(dst, a, b, n, [](auto x, auto y) { return decltype(x)(x * y); }); break;
    case zpMax: reduceWith(dst, a, b, n, [](auto x, auto y) { return decltype(x)(x < y ? y : x); }); break;  // std::max
    case zpMin: reduceWith(dst, a, b, n, [](auto x, auto y) { return decltype(x)(y < x ? y : x); }); break;  // std::min
    default: break;
  }
}

template <class T>
void divideBy(T* acc, size_t n, int by) {
  for (size_t i = 0; i < n; i++) acc[i] = (T)(acc[i] / (T)by);
}

template <class F>
void dispatch(zpDataType_t t, F f) {
  switch (t) {
    case zpInt8: f((int8_t*)nullptr); break;
    case zpUint8: f((uint8_t*)nullptr); break;
    case zpInt32: f((int32_t*)nullptr); break;
    case zpUint32: f((uint32_t*)nullptr); break;
    case zpInt64: f((int64_t*)nullptr); break;
    case zpUint64: f((uint64_t*)nullptr); break;
    case zpFloat64: f((double*)nullptr); break;
    default: f((float*)nullptr); break;  // float32, and the 16-bit floats' work type
  }
}

// The transports' reduce-while-copying: one reducer per (work type, op).
template <int T, int O>
void reduceBytes(void* dst, const void* a, const void* b, size_t bytes) {
  reduceElems(dst, a, b, bytes / zpTypeSize((zpDataType_t)T), (zpDataType_t)T, (zpRedOp_t)O);
}
template <int T>
constexpr OpReducer reducerOf(int o) {
  return OpReducer{o == 0   ? reduceBytes<T, 0>
                   : o == 1 ? reduceBytes<T, 1>
                   : o == 2 ? reduceBytes<T, 2>
                   : o == 3 ? reduceBytes<T, 3>
                            : reduceBytes<T, 4>,
                   T == zpInt8 || T == zpUint8 ? 1u : T == zpInt64 || T == zpUint64 || T == zpFloat64 ? 8u : 4u};
}

}  // namespace

void reduceElems(void* dst, const void* a, const void* b, size_t elems, zpDataType_t wt, zpRedOp_t op) {
  dispatch(wt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    reduce3((T*)dst, (const T*)a, (const T*)b, elems, op);
  });
}

// out = in[0] op in[1] op ... op in[k-1], in that order for every element,
// a cache-sized piece at a time (one pass over memory, not k-1). out may be
// in[0], no other.
void reduceMany(void* out, const std::vector<const char*>& in, size_t elems, zpDataType_t wt, zpRedOp_t op) {
  const size_t es = zpTypeSize(wt), piece = (32u << 10) / es;
  for (size_t at = 0; at < elems; at += piece) {
    const size_t len = std::min(piece, elems - at), skip = at * es;
    char* o = (char*)out + skip;
    reduceElems(o, in[0] + skip, in[1] + skip, len, wt, op);
    for (size_t r = 2; r < in.size(); r++) reduceElems(o, o, in[r] + skip, len, wt, op);
  }
}

#define ZP_REDUCERS(T) reducerOf<T>(0), reducerOf<T>(1), reducerOf<T>(2), reducerOf<T>(3), reducerOf<T>(4)
const OpReducer kReducers[zpNumTypes * zpNumOps] = {ZP_REDUCERS(0), ZP_REDUCERS(1), ZP_REDUCERS(2), ZP_REDUCERS(3),
                                                    ZP_REDUCERS(4), ZP_REDUCERS(5), ZP_REDUCERS(6), ZP_REDUCERS(7),
                                                    ZP_REDUCERS(8), ZP_REDUCERS(9)};
#undef ZP_REDUCERS

// Work buffers: the data in its work type (float32 for the 16-bit floats).
void toWork(const void* src, void* dst, size_t elems, zpDataType_t t) {
  if (t == zpFloat16)
    for (size_t i = 0; i < elems; i++) ((float*)dst)[i] = halfToFloat(((const uint16_t*)src)[i]);
  else if (t == zpBfloat16)
    for (size_t i = 0; i < elems; i++) ((float*)dst)[i] = bf16ToFloat(((const uint16_t*)src)[i]);
  else if (src != dst)
    memmove(dst, src, elems * zpTypeSize(t));
}

void fromWork(const void* src, void* dst, size_t elems, zpDataType_t t) {
  if (t == zpFloat16)
    for (size_t i = 0; i < elems; i++) ((uint16_t*)dst)[i] = floatToHalf(((const float*)src)[i]);
  else if (t == zpBfloat16)
    for (size_t i = 0; i < elems; i++) ((uint16_t*)dst)[i] = floatToBf16(((const float*)src)[i]);
  else if (src != dst)
    memmove(dst, src, elems * zpTypeSize(t));
}

void finishAvg(char* work, size_t elems, zpDataType_t wt, zpRedOp_t op, int n) {
  if (op != zpAvg) return;
  dispatch(wt, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    divideBy((T*)work, elems, n);
  });
}

}  // namespace detail
}  // namespace zp
