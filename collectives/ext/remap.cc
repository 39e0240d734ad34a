// Remap collectives: move tokens between two layouts of one batch (the C API
// is in include/zeppelin.h). A remap is planned once, from the two layouts
// alone, the same way on every rank; each execution packs the tokens for
// each peer, runs one zpAlltoallv (through the router across nodes), and
// unpacks. Tokens that stay on their rank are copied directly.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "collectives/ext/ext.h"
#include "include/zeppelin.h"
#include "src/util/nvtx.h"

namespace {

// Tokens [fromOff, fromOff + count) of a rank's from-buffer are tokens
// [toOff, toOff + count) of a (maybe other) rank's to-buffer.
struct Run {
  int64_t fromOff, toOff, count;
};

struct Place {
  int64_t start, count;
  int rank;
  int64_t off;  // within the rank's buffer, in tokens
};

// Per sequence, where its tokens are, in token order.
std::vector<std::vector<Place>> placesBySeq(const zpx::LayoutView& l) {
  std::vector<std::vector<Place>> by(l.seqLens.size());
  for (size_t r = 0; r < l.ranks.size(); r++) {
    int64_t off = 0;
    for (const zpSegment_t& s : l.ranks[r]) {
      by[s.seq].push_back({s.start, s.count, (int)r, off});
      off += s.count;
    }
  }
  for (auto& v : by) std::sort(v.begin(), v.end(), [](const Place& a, const Place& b) { return a.start < b.start; });
  return by;
}

void append(std::vector<Run>* runs, Run r) {
  if (!runs->empty()) {
    Run& b = runs->back();
    if (b.fromOff + b.count == r.fromOff && b.toOff + b.count == r.toOff) {
      b.count += r.count;
      return;
    }
  }
  runs->push_back(r);
}

}  // namespace

struct zpRemap {
  int nranks = 0, rank = 0;
  int64_t fromTokens = 0, toTokens = 0;  // this rank's buffer sizes, in tokens
  std::vector<std::vector<Run>> sendRuns;  // by peer: my from-tokens that go to its to-buffer
  std::vector<std::vector<Run>> recvRuns;  // by peer: its from-tokens that come to my to-buffer
  std::vector<char> sendBuf, recvBuf;
};

namespace {

// Device buffers: every run is a send and a receive of one group on the
// stream (this rank's own runs go to itself), straight from in to out: no
// staging buffer, no copy kernel. Both sides list a pair's runs in the same
// order (zpRemapCreate sweeps the same sequences on every rank), so the k-th
// send matches the k-th receive. The buffers are checked before the group
// opens: a call refused inside it would leave the others to run unmatched.
zpResult_t executeOnStream(const zpRemap* remap, const char* src, char* dst, size_t tb, int inverse, zpComm_t comm,
                           zpStream_t stream) {
  if (src) ZPX_CHECK(zpCommCheckBuffer(comm, src, stream));
  if (dst) ZPX_CHECK(zpCommCheckBuffer(comm, dst, stream));
  const auto& outRuns = inverse ? remap->recvRuns : remap->sendRuns;
  const auto& inRuns = inverse ? remap->sendRuns : remap->recvRuns;
  auto srcOff = [&](const Run& r) { return inverse ? r.toOff : r.fromOff; };
  auto dstOff = [&](const Run& r) { return inverse ? r.fromOff : r.toOff; };
  ZPX_CHECK(zpGroupStart());
  zpResult_t res = zpSuccess;
  for (int p = 0; p < remap->nranks && res == zpSuccess; p++) {
    for (const Run& r : outRuns[p])
      if (res == zpSuccess) res = zpSend(src + srcOff(r) * tb, r.count * tb, zpUint8, p, comm, stream);
    for (const Run& r : inRuns[p])
      if (res == zpSuccess) res = zpRecv(dst + dstOff(r) * tb, r.count * tb, zpUint8, p, comm, stream);
  }
  zpResult_t end = zpGroupEnd();
  return res != zpSuccess ? res : end;
}

}  // namespace

zpResult_t zpRemapCreate(zpRemap_t* remap, zpLayout_t from, zpLayout_t to, zpComm_t comm) try {
  if (!remap || !from || !to) return zpSetLastError(comm, zpInvalidArgument, "zpRemapCreate: NULL argument");
  *remap = nullptr;
  int n = 0, me = 0;
  zpResult_t res = zpCommCount(comm, &n);
  if (res != zpSuccess) return res;
  ZPX_CHECK(zpCommUserRank(comm, &me));
  zpx::LayoutView a, b;
  ZPX_CHECK(zpx::viewLayout(from, &a));
  ZPX_CHECK(zpx::viewLayout(to, &b));
  if ((int)a.ranks.size() != n || (int)b.ranks.size() != n)
    return zpSetLastError(comm, zpInvalidArgument, "zpRemapCreate: the layouts have %zu and %zu ranks, the communicator %d",
                    a.ranks.size(), b.ranks.size(), n);
  if (a.seqLens != b.seqLens) return zpSetLastError(comm, zpInvalidArgument, "zpRemapCreate: the layouts are of different batches");
  auto out = std::make_unique<zpRemap>();
  out->nranks = n;
  out->rank = me;
  out->sendRuns.resize(n);
  out->recvRuns.resize(n);
  for (const zpSegment_t& s : a.ranks[me]) out->fromTokens += s.count;
  for (const zpSegment_t& s : b.ranks[me]) out->toTokens += s.count;
  auto pa = placesBySeq(a), pb = placesBySeq(b);
  for (size_t s = 0; s < pa.size(); s++) {
    size_t i = 0, j = 0;
    int64_t t = 0;  // the next token of sequence s
    while (i < pa[s].size() && j < pb[s].size()) {
      const Place &x = pa[s][i], &y = pb[s][j];
      int64_t end = std::min(x.start + x.count, y.start + y.count);
      Run r{x.off + (t - x.start), y.off + (t - y.start), end - t};
      if (x.rank == me) append(&out->sendRuns[y.rank], r);
      if (y.rank == me) append(&out->recvRuns[x.rank], r);
      t = end;
      if (t == x.start + x.count) i++;
      if (t == y.start + y.count) j++;
    }
  }
  *remap = out.release();
  return zpSuccess;
} catch (...) {
  return zpx::failFromException("zpRemapCreate");
}

zpResult_t zpRemapExecute(zpRemap_t remap, const void* in, void* out, size_t elemsPerToken,
                                 zpDataType_t datatype, int inverse, zpComm_t comm, zpStream_t stream) try {
  ZP_NVTX_RANGE("zpRemapExecute");
  if (!remap) return zpSetLastError(comm, zpInvalidArgument, "zpRemapExecute: remap is NULL");
  size_t ts = zpTypeSize(datatype);
  if (!ts) return zpSetLastError(comm, zpInvalidArgument, "zpRemapExecute: invalid datatype %d", (int)datatype);
  if (elemsPerToken == 0) return zpSetLastError(comm, zpInvalidArgument, "zpRemapExecute: elemsPerToken is 0");
  if (inverse != 0 && inverse != 1)
    return zpSetLastError(comm, zpInvalidArgument, "zpRemapExecute: inverse is %d, not 0 (forward) or 1 (inverse)", inverse);
  const int n = remap->nranks, me = remap->rank;
  // The runs were planned for the creating communicator's ranks: another one
  // would send them to the wrong ranks (or read past the count arrays).
  int commN = 0, commMe = 0;
  ZPX_CHECK(zpCommCount(comm, &commN));
  ZPX_CHECK(zpCommUserRank(comm, &commMe));
  if (commN != n || commMe != me)
    return zpSetLastError(comm, zpInvalidArgument,
                    "zpRemapExecute: the remap was created as rank %d of %d, but this is rank %d of %d: pass the "
                    "communicator given to zpRemapCreate",
                    me, n, commMe, commN);
  // Checked before any size is multiplied out, so that no product wraps around.
  const int64_t maxTokens = std::max<int64_t>(1, std::max(remap->fromTokens, remap->toTokens));
  if (elemsPerToken > ZP_MAX_CALL_BYTES / ts / (uint64_t)maxTokens)
    return zpSetLastError(comm, zpInvalidArgument,
                    "zpRemapExecute: %lld tokens of %zu elements of %zu bytes are too large (a negative value cast to "
                    "size_t?)",
                    (long long)maxTokens, elemsPerToken, ts);
  const size_t tb = elemsPerToken * ts;
  // Forward: my from-buffer (in) to my to-buffer (out); inverse: the reverse.
  const std::vector<std::vector<Run>>& outRuns = inverse ? remap->recvRuns : remap->sendRuns;
  const std::vector<std::vector<Run>>& inRuns = inverse ? remap->sendRuns : remap->recvRuns;
  auto srcOff = [&](const Run& r) { return inverse ? r.toOff : r.fromOff; };
  auto dstOff = [&](const Run& r) { return inverse ? r.fromOff : r.toOff; };
  std::vector<size_t> sc(n, 0), sd(n, 0), rc(n, 0), rd(n, 0);
  size_t sTotal = 0, rTotal = 0;
  for (int p = 0; p < n; p++) {
    if (p == me) continue;
    sd[p] = sTotal;
    for (const Run& r : outRuns[p]) sc[p] += r.count * tb;
    sTotal += sc[p];
    rd[p] = rTotal;
    for (const Run& r : inRuns[p]) rc[p] += r.count * tb;
    rTotal += rc[p];
  }
  // A rank with no tokens on one side may pass NULL for that buffer.
  if (!in && (sTotal || !outRuns[me].empty())) return zpSetLastError(comm, zpInvalidArgument, "zpRemapExecute: in is NULL");
  if (!out && (rTotal || !outRuns[me].empty())) return zpSetLastError(comm, zpInvalidArgument, "zpRemapExecute: out is NULL");
  // A remap reads in while it writes out: the two must not overlap (as the header says).
  // The inverse reads the to-layout's buffer and writes the from-layout's.
  const int64_t inTokens = inverse ? remap->toTokens : remap->fromTokens;
  const int64_t outTokens = inverse ? remap->fromTokens : remap->toTokens;
  const uintptr_t i0 = (uintptr_t)in, i1 = i0 + inTokens * tb;
  const uintptr_t o0 = (uintptr_t)out, o1 = o0 + outTokens * tb;
  if (in && out && i0 < i1 && o0 < o1 && i0 < o1 && o0 < i1)
    return zpSetLastError(comm, zpInvalidArgument, "zpRemapExecute: in and out overlap (in place is not supported)");
  const char* src = (const char*)in;
  char* dst = (char*)out;
  if (stream) return executeOnStream(remap, src, dst, tb, inverse, comm, stream);
  remap->sendBuf.resize(std::max<size_t>(sTotal, 1));
  remap->recvBuf.resize(std::max<size_t>(rTotal, 1));
  for (int p = 0; p < n; p++) {
    if (p == me) continue;
    char* w = remap->sendBuf.data() + sd[p];
    for (const Run& r : outRuns[p]) {
      memcpy(w, src + srcOff(r) * tb, r.count * tb);
      w += r.count * tb;
    }
  }
  zpResult_t res = zpAlltoallv(remap->sendBuf.data(), sc.data(), sd.data(), remap->recvBuf.data(), rc.data(),
                               rd.data(), zpUint8, comm, nullptr);
  if (res != zpSuccess) return res;
  for (const Run& r : outRuns[me]) memmove(dst + dstOff(r) * tb, src + srcOff(r) * tb, r.count * tb);
  for (int p = 0; p < n; p++) {
    if (p == me) continue;
    const char* rp = remap->recvBuf.data() + rd[p];
    for (const Run& r : inRuns[p]) {
      memcpy(dst + dstOff(r) * tb, rp, r.count * tb);
      rp += r.count * tb;
    }
  }
  return zpSuccess;
} catch (...) {
  return zpx::failFromException("zpRemapExecute");
}

zpResult_t zpRemapDestroy(zpRemap_t remap) try {
  if (!remap) return zpSetLastError(nullptr, zpInvalidArgument, "zpRemapDestroy: remap is NULL");
  delete remap;
  return zpSuccess;
} catch (...) {
  return zpx::failFromException("zpRemapDestroy");
}
