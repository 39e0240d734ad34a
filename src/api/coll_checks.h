// The standard collectives' argument checks on one rank, for the C face's
// entry points (src/api/api.cc); whether the ranks agree is checked across
// ranks, inside the call.
#pragma once

#include <cstddef>

#include "collectives/collectives.h"
#include "include/zeppelin.h"

namespace zp {

// The v calls' counts (and all-gatherv's displacements): sets the elements
// this rank sends and receives.
zpResult_t checkCounts(const char* fn, const CollArgs& a, int n, int me, size_t ts, size_t* sendElems,
                       size_t* recvElems);
// Send and receive buffers that overlap only in the call's in-place form.
zpResult_t checkOverlap(const char* fn, const CollArgs& a, int n, int me, size_t ts, size_t sendElems,
                        size_t recvElems);

}  // namespace zp
