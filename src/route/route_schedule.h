// The one relay schedule: a routing plan's pieces as chunks in the order
// they go (src/core/routing.h's RouteChunk), as plain data. The host relay
// (transport/relay) queues a transfer's chunks in this order, each on its
// proxies; the device routed alltoallv (collectives/alltoallv.cc) runs the
// same chunks as NCCL groups, one per pipeline stage (a chunk's dispatch in
// stage `round`, its network hop in `round + 1`, its combine in `round + 2`).
//
// A piece of b bytes becomes ceil(b / chunkBytes) chunks of chunkBytes, the
// last one shorter; chunk k of every piece is in round k. The schedule is
// ordered by round, then by piece, so that every proxy's chunks start as
// early as the pipeline allows. A piece of 0 bytes has no chunk.
#pragma once

#include <cstdint>
#include <vector>

#include "src/core/routing.h"

namespace zp {

// The schedule of one transfer's pieces (chunkBytes >= 1).
std::vector<RouteChunk> scheduleChunks(const std::vector<Piece>& pieces, uint64_t chunkBytes);

// Fills Transfer::chunks of every transfer of a plan.
void scheduleTransfers(std::vector<Transfer>* transfers, uint64_t chunkBytes);

}  // namespace zp
