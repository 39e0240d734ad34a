// All-gather(v) on host buffers: the ring or direct exchange, or the
// hierarchical one across nodes (standard_nodes.cc).
#include <cstring>
#include <vector>

#include "collectives/standard_internal.h"
#include "src/core/log.h"

namespace zp {
namespace detail {


// Direct all-gather in buf (element size es) over blocks b: this rank's
// block (at `first` if given, else in buf) to every other rank, theirs
// from them, in one round. hasAll as in ringAllGather.
zpResult_t Call::allGatherDirect(char* buf, size_t es, const Blocks& b, const char* first, int hasAll) {
  allGatherDirectRound(buf, es, b, first, hasAll);
  return step.run(4000);
}
void Call::allGatherDirectRound(char* buf, size_t es, const Blocks& b, const char* first, int hasAll) {
  const char* from = first ? first : buf + b.off[me] * es;
  for (int i = 1; i < n; i++) {
    const int to = mod(me + i, n), src = mod(me - i, n);
    if (to != hasAll) step.send(to, from, b.cnt[me] * es, es);
    if (me != hasAll) step.recv(src, buf + b.off[src] * es, b.cnt[src] * es, es);
  }
}

// ---- All-gather over blocks b (the user's type, user displacements) ----
zpResult_t Call::allGather(const char* sendbuff, char* recvbuff, const Blocks& b) {
  char* mine = recvbuff + b.off[me] * ts;
  const Family f = n > 1 ? family(b.total * ts / n) : Family::kLatency;
  std::vector<int> local, rail;
  std::vector<std::vector<int>> grid;
  if (n > 1 && f == Family::kRing && nodeGrid(&local, &rail, &grid))
    ZP_CHECK(allGatherNodes(sendbuff, recvbuff, b, local, rail, grid));
  else if (n > 1 && f == Family::kRing)
    ZP_CHECK(ringAllGather(recvbuff, ts, b, 0, sendbuff));
  else if (n > 1)
    ZP_CHECK(allGatherDirect(recvbuff, ts, b, sendbuff));
  if (sendbuff != mine && b.cnt[me]) memmove(mine, sendbuff, b.cnt[me] * ts);
  return zpSuccess;
}

}  // namespace detail
}  // namespace zp
