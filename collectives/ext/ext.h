// The extension layer: remaps, the Ulysses exchange, rings and the attention
// driver, built only on the public C API (include/zeppelin.h), as a user's
// own extension would be. What its files share lives here.
#pragma once

#include <cstdint>
#include <vector>

#include "include/zeppelin.h"

// Propagates a non-success result.
#define ZPX_CHECK(call)                                    \
  do {                                                     \
    zpResult_t zpx_check_res_ = (call);                    \
    if (zpx_check_res_ != zpSuccess) return zpx_check_res_; \
  } while (0)

namespace zpx {

// A layout as plain data, read through the public API: its batch and every
// rank's segments in buffer order.
struct LayoutView {
  std::vector<int64_t> seqLens;
  std::vector<std::vector<zpSegment_t>> ranks;
};
zpResult_t viewLayout(zpLayout_t layout, LayoutView* out);

// What the attention driver (attention.cc) started on this rank in its last
// forward and its last backward call, for tests: each group's first kernel
// work and each local sequence's kernel call, in the order they started
// (enqueued, with a stream), a local by its sequence id and a group by its
// first sequence in the plan's order (zpPlanRingOrder). One entry per group
// or sequence, kept until the next call of the same direction. NULL for a
// NULL driver.
struct AttentionRunLog {
  std::vector<int64_t> forward, backward;
};
const AttentionRunLog* attentionRunLog(zpAttention_t attn);

// For an entry point's catch (...): no C++ exception may cross the C API.
// Out of memory is zpSystemError, anything else zpInternalError.
zpResult_t failFromException(const char* fn);

}  // namespace zpx
