#include "src/route/route_schedule.h"

#include <algorithm>

namespace zp {

std::vector<RouteChunk> scheduleChunks(const std::vector<Piece>& pieces, uint64_t chunkBytes) {
  std::vector<RouteChunk> chunks;
  uint64_t rounds = 0;
  for (const Piece& p : pieces) rounds = std::max(rounds, (p.bytes + chunkBytes - 1) / chunkBytes);
  for (uint64_t k = 0; k < rounds; k++)
    for (const Piece& p : pieces) {
      const uint64_t at = k * chunkBytes;
      if (at >= p.bytes) continue;
      RouteChunk c;
      c.offset = p.offset + at;
      c.bytes = std::min(chunkBytes, p.bytes - at);
      c.srcProxy = p.srcProxy;
      c.dstProxy = p.dstProxy;
      c.round = (int)k;
      chunks.push_back(c);
    }
  return chunks;
}

void scheduleTransfers(std::vector<Transfer>* transfers, uint64_t chunkBytes) {
  for (Transfer& t : *transfers) t.chunks = scheduleChunks(t.pieces, chunkBytes);
}

}  // namespace zp
