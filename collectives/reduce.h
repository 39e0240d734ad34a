// Element-wise reduction kernels of the collectives, on host memory.
//
// float16 and bfloat16 are reduced in float32 (their "work type"): a
// collective converts them once on entry, moves and reduces float32, and
// rounds once at the end, so the result does not depend on how many partial
// sums were rounded on the way (NCCL rounds per step; this is more exact).
#pragma once

#include <cstddef>

#include "include/zeppelin.h"

namespace zp {

bool validRedOp(int op);
const char* redOpName(int op);
const char* typeName(int datatype);

// The type data is moved and reduced in: float32 for float16 and bfloat16,
// the type itself otherwise.
zpDataType_t workType(zpDataType_t t);
inline bool isHalf(zpDataType_t t) { return t == zpFloat16 || t == zpBfloat16; }

// dst[i] = a[i] op b[i] for n elements of a work type (zpAvg sums; the
// caller divides at the end with finishAvg). dst may equal a or b. Integer
// sums and products wrap around.
void reduce(void* dst, const void* a, const void* b, size_t n, zpDataType_t workType, zpRedOp_t op);
// Divides n elements of a work type by nranks in place (zpAvg's last step;
// integers truncate toward zero).
void finishAvg(void* buf, size_t n, zpDataType_t workType, int nranks);

// float16 / bfloat16 <-> float32, rounding to nearest even (NaN stays NaN).
void halfToFloat(float* dst, const void* src, size_t n, zpDataType_t t);
void floatToHalf(void* dst, const float* src, size_t n, zpDataType_t t);
float halfBitsToFloat(uint16_t h);
uint16_t floatToHalfBits(float f);
float bf16BitsToFloat(uint16_t h);
uint16_t floatToBf16Bits(float f);

}  // namespace zp
