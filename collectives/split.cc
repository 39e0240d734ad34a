// zpCommSplit's exchange over the parent: every rank's (color, key), the
// child's members and secret, and the transports' blobs among them.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/standard_internal.h"
#include "src/core/log.h"

namespace zp {

zpResult_t commSplit(Comm* parent, int color, int key, zpResult_t localCheck, const Config& cfg,
                     size_t netEagerUpTo, std::unique_ptr<Comm>* child) {
  using namespace detail;  // splitmix, run, kStepSplit
  const int n = parent->nranks(), me = parent->rank();
  const std::string localMsg = localCheck == zpSuccess ? "" : lastError();
  // Every rank's (color, key, whether its own arguments were good), by an
  // all-gather whose header names the split: a rank calling something else
  // meanwhile (a plain all-gather of three int32 too) is caught by the
  // collective's header check like any other.
  int32_t mine[3] = {color, key, localCheck == zpSuccess ? 1 : 0};
  std::vector<int32_t> all(3 * (size_t)n);
  CollArgs gather{CollKind::kAllGather, mine, all.data(), 3, zpInt32, zpSum, 0};
  gather.forSplit = true;
  ZP_CHECK(collective(parent, gather, nullptr));
  // Every rank takes the next sequence number, those that join no child too,
  // so that the parent's numbering stays the same everywhere.
  const uint64_t seq = parent->nextCollSeq();
  if (localCheck != zpSuccess) return fail(localCheck, "rank %d: %s", me, localMsg.c_str());
  for (int r = 0; r < n; r++)
    if (!all[3 * r + 2])
      return fail(zpInvalidUsage, "rank %d: zpCommSplit: rank %d passed an invalid argument (its zpGetLastError says "
                  "which)", me, r);
  if (color == ZP_SPLIT_NOCOLOR) return zpSuccess;
  std::vector<int> members;
  for (int r = 0; r < n; r++)
    if (all[3 * r] == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(), [&](int x, int y) { return all[3 * x + 1] < all[3 * y + 1]; });
  const int newRank = (int)(std::find(members.begin(), members.end(), me) - members.begin());
  // The child's secret (it names the child's shared memory): the parent's,
  // this split's number and the color, so that siblings and later splits
  // never share a name.
  uint64_t x = splitmix(seq ^ splitmix((uint64_t)(uint32_t)color));
  for (int i = 0; i < 16; i++) x = splitmix(x ^ parent->secret()[i]);
  const uint64_t h[2] = {splitmix(x), splitmix(x ^ 0x5a5a5a5a5a5a5a5aull)};
  uint8_t secret[16];
  memcpy(secret, h, 16);
  // The transports' blob round among the child's members, over the parent:
  // the sizes, then the blobs (a UCX address has no fixed size).
  int round = 0;
  auto exchange = [&](const std::string& blob, std::vector<std::string>* out) -> zpResult_t {
    const int m = (int)members.size();
    out->assign(m, std::string());
    std::vector<uint64_t> sizes(m, 0);
    sizes[newRank] = blob.size();
    std::vector<Op> ops;
    for (int i = 0; i < m; i++)
      if (i != newRank) {
        ops.emplace_back(OpKind::kCollective, true, members[i], &sizes[newRank], sizeof(uint64_t), 1);
        ops.emplace_back(OpKind::kCollective, false, members[i], &sizes[i], sizeof(uint64_t), 1);
      }
    ZP_CHECK(run(parent, ops, msgid::collectiveXfer(seq, kStepSplit + (uint64_t)round++)));
    for (int i = 0; i < m; i++) {
      if (sizes[i] > (1u << 20))
        return fail(zpInternalError, "rank %d: zpCommSplit: rank %d's transport address is %llu bytes", me, members[i],
                    (unsigned long long)sizes[i]);
      (*out)[i].resize(sizes[i]);
    }
    (*out)[newRank] = blob;
    ops.clear();
    for (int i = 0; i < m; i++)
      if (i != newRank) {
        ops.emplace_back(OpKind::kCollective, true, members[i], (void*)blob.data(), blob.size(), 1);
        ops.emplace_back(OpKind::kCollective, false, members[i], &(*out)[i][0], sizes[i], 1);
      }
    return run(parent, ops, msgid::collectiveXfer(seq, kStepSplit + (uint64_t)round++));
  };
  return Comm::createChild(*parent, members, newRank, cfg, netEagerUpTo, secret, exchange, child);
}

}  // namespace zp
