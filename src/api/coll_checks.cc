// The standard collectives' argument checks on this rank (src/api/coll_checks.h).
#include "src/api/coll_checks.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "src/core/log.h"

namespace zp {

// The v calls' counts (and all-gatherv's displacements) on this rank: no
// sum past the call's limit, all-gatherv's sendcount equal to its own
// recvcounts entry, receive ranges that do not overlap. Whether the ranks'
// recvcounts agree is checked across ranks, with the rest of the call.
zpResult_t checkCounts(const char* fn, const CollArgs& a, int n, int me, size_t ts, size_t* sendElems,
                       size_t* recvElems) {
  if (!a.counts) return fail(zpInvalidArgument, "%s: recvcounts is NULL", fn);
  const bool gather = a.kind == zp::CollKind::kAllGatherv;
  if (gather && !a.displs) return fail(zpInvalidArgument, "%s: rdispls is NULL", fn);
  const size_t maxElems = maxElements(ts);
  size_t total = 0;
  for (int p = 0; p < n; p++) {
    if (a.counts[p] > maxElems - total)
      return fail(zpInvalidArgument, "%s: recvcounts[%d]=%zu is too large (a negative value cast to size_t?)", fn, p,
                      a.counts[p]);
    total += a.counts[p];
  }
  if (!gather) {
    *sendElems = total;
    *recvElems = a.counts[me];
    return zpSuccess;
  }
  if (a.count != a.counts[me])
    return fail(zpInvalidArgument, "%s: rank %d's sendcount %zu differs from its recvcounts[%d]=%zu", fn, me, a.count,
                    me, a.counts[me]);
  std::vector<std::pair<size_t, int>> ranges;  // (first element, rank), non-empty ones
  for (int p = 0; p < n; p++) {
    if (a.displs[p] > maxElems - a.counts[p])
      return fail(zpInvalidArgument, "%s: rdispls[%d]=%zu is too large (a negative value cast to size_t?)", fn, p,
                      a.displs[p]);
    if (a.counts[p]) ranges.push_back({a.displs[p], p});
  }
  std::sort(ranges.begin(), ranges.end());
  size_t end = 0;
  for (size_t i = 0; i < ranges.size(); i++) {
    if (i && ranges[i].first < end)
      return fail(zpInvalidArgument, "%s: the receive ranges of ranks %d and %d overlap", fn, ranges[i - 1].second,
                      ranges[i].second);
    end = ranges[i].first + a.counts[ranges[i].second];
  }
  *sendElems = a.count;
  *recvElems = end;
  return zpSuccess;
}

// Send and receive buffers either do not overlap or are the call's in-place
// form (NCCL's): the same buffer for all-reduce, broadcast and reduce; this
// rank's block of the output as the input for all-gather(v); this rank's
// block of the input as the output for reduce-scatter(v). Any other overlap
// would read data the call has already overwritten.
zpResult_t checkOverlap(const char* fn, const CollArgs& a, int n, int me, size_t ts, size_t sendElems,
                        size_t recvElems) {
  using K = CollKind;
  if (a.kind == K::kAllGather) recvElems = a.count * (size_t)n;
  if (a.kind == K::kReduceScatter) sendElems = a.count * (size_t)n;
  const uintptr_t s = (uintptr_t)a.send, r = (uintptr_t)a.recv;
  const size_t sendBytes = sendElems * ts, recvBytes = recvElems * ts;
  if (!sendBytes || !recvBytes || s + sendBytes <= r || r + recvBytes <= s) return zpSuccess;
  size_t before = 0;  // elements of the blocks before this rank's (the v calls: back to back)
  if (a.kind == K::kAllGather || a.kind == K::kReduceScatter) before = (size_t)me * a.count;
  if (a.kind == K::kAllGatherv) before = a.displs[me];
  if (a.kind == K::kReduceScatterv)
    for (int p = 0; p < me; p++) before += a.counts[p];
  uintptr_t inPlace = r;  // where sendbuff must be
  const char* form = "recvbuff itself";
  if (a.kind == K::kAllGather || a.kind == K::kAllGatherv) {
    inPlace = r + before * ts;
    form = "recvbuff plus this rank's block offset";
  }
  if (a.kind == K::kReduceScatter || a.kind == K::kReduceScatterv) {
    inPlace = r - before * ts;  // recvbuff == sendbuff + this rank's offset
    form = "recvbuff minus this rank's block offset (recvbuff = sendbuff + offset)";
  }
  if (s == inPlace) return zpSuccess;
  return fail(zpInvalidArgument,
                  "%s: sendbuff and recvbuff overlap but are not the in-place form (on rank %d sendbuff must be %s, "
                  "%lld bytes from recvbuff; it is %lld bytes from it)",
                  fn, me, form, (long long)(inPlace - r), (long long)(s - r));
}

}  // namespace zp
