// The variable-length Ulysses all-to-all (DeepSpeed-Ulysses, VeOmni): the
// exchange between sequence parallel ([my tokens, heads, dim], as a layout
// places them) and head parallel ([every token of the batch, my heads, dim])
// for a packed batch. No divisibility rules: rank r of G takes query heads
// [r*Hq/G, (r+1)*Hq/G), and for a tensor with fewer heads (GQA keys and
// values: Hq/H query heads share one) the heads its query heads use, so a
// head may live on several ranks; going back, their contributions are summed
// (the key/value gradients of the query heads that shared them).
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "collectives/ext/ext.h"
#include "include/zeppelin.h"
#include "src/util/nvtx.h"
#ifdef ZP_WITH_CUDA
#include <cuda_runtime_api.h>

#include "collectives/ext/device/kernels.h"
#endif

namespace {

struct HeadRange {
  int lo, hi;
};

constexpr int kMaxHeads = 1 << 16;  // query heads (and so heads) of one call

// The heads of a tensor with `heads` heads that rank r of G holds.
HeadRange headsOf(int r, int G, int qHeads, int heads) {
  int qlo = (int)((int64_t)r * qHeads / G), qhi = (int)((int64_t)(r + 1) * qHeads / G);
  if (qlo == qhi) return {0, 0};
  int g = qHeads / heads;  // query heads per head
  return {qlo / g, (qhi + g - 1) / g};
}

template <class T>
void addInto(char* dst, const char* src, size_t n) {
  T* d = (T*)dst;
  const T* s = (const T*)src;
  for (size_t i = 0; i < n; i++) d[i] += s[i];
}

// The call's shape, as the main function works it out, for the device path.
struct Exchange {
  int G, me, heads, myHeads;
  int direction;
  bool replicated;  // a head on several ranks: going back, their parts are summed
  size_t ts, row;  // element size; one head of one token, in bytes
  std::vector<HeadRange> hr;
  std::vector<int64_t> mine;                // my tokens, as positions in the packed batch
  std::vector<std::vector<int64_t>> theirs; // every rank's
  std::vector<size_t> sc, sd, rc, rd;       // the alltoallv's, in elements
  size_t sTot, rTot;
};

#ifdef ZP_WITH_CUDA
// Maximal runs of consecutive positions in v: (first position, count). A
// layout segment's tokens are consecutive in the packed batch.
std::vector<std::pair<int64_t, int64_t>> runsOf(const std::vector<int64_t>& v) {
  std::vector<std::pair<int64_t, int64_t>> runs;
  for (int64_t t : v) {
    if (!runs.empty() && runs.back().first + runs.back().second == t) runs.back().second++;
    else runs.push_back({t, 1});
  }
  return runs;
}

zpResult_t cudaFailed(zpComm_t comm, const char* what, cudaError_t e) {
  return zpSetLastError(comm, zpUnhandledCudaError, "zpUlyssesAlltoall: %s: %s", what, cudaGetErrorString(e));
}

// Device buffers: pack and unpack with strided device copies
// (cudaMemcpy2DAsync: one per peer for the head slices, one per segment for
// the tokens) into staging buffers allocated in stream order, and the
// zpAlltoallv between them on the stream. Nothing blocks the host on the GPU.
zpResult_t exchangeOnStream(const Exchange& x, const char* src, char* dst, zpDataType_t datatype, zpComm_t comm,
                            zpStream_t stream) {
  cudaStream_t s = (cudaStream_t)stream;
  const cudaMemcpyKind d2d = cudaMemcpyDeviceToDevice;
  char *sb = nullptr, *rb = nullptr;
  cudaError_t e = cudaMallocAsync((void**)&sb, x.sTot * x.ts + 1, s);
  if (e == cudaSuccess) e = cudaMallocAsync((void**)&rb, x.rTot * x.ts + 1, s);
  if (e != cudaSuccess) {
    if (sb) cudaFreeAsync(sb, s);
    return cudaFailed(comm, "cudaMallocAsync", e);
  }
  const size_t stride = (size_t)x.heads * x.row, mineRow = (size_t)x.myHeads * x.row;
  for (int p = 0; p < x.G && e == cudaSuccess; p++) {
    const size_t hpRow = (size_t)(x.hr[p].hi - x.hr[p].lo) * x.row;
    char* w = sb + x.sd[p] * x.ts;
    if (x.direction == 0) {
      // My tokens, p's heads: a strided slice of each token row.
      if (hpRow && !x.mine.empty())
        e = cudaMemcpy2DAsync(w, hpRow, src + x.hr[p].lo * x.row, stride, hpRow, x.mine.size(), d2d, s);
    } else {
      for (const auto& run : runsOf(x.theirs[p])) {
        if (e == cudaSuccess) e = cudaMemcpyAsync(w, src + run.first * mineRow, run.second * mineRow, d2d, s);
        w += run.second * mineRow;
      }
    }
  }
  if (e == cudaSuccess && x.direction == 1 && x.replicated)
    e = cudaMemsetAsync(dst, 0, x.mine.size() * stride, s);
  zpResult_t res = e == cudaSuccess ? zpAlltoallv(sb, x.sc.data(), x.sd.data(), rb, x.rc.data(), x.rd.data(),
                                                  datatype, comm, stream)
                                    : cudaFailed(comm, "packing", e);
  for (int p = 0; p < x.G && res == zpSuccess && e == cudaSuccess; p++) {
    const size_t hpRow = (size_t)(x.hr[p].hi - x.hr[p].lo) * x.row;
    const char* r = rb + x.rd[p] * x.ts;
    if (x.direction == 0) {
      for (const auto& run : runsOf(x.theirs[p])) {
        if (e == cudaSuccess) e = cudaMemcpyAsync(dst + run.first * mineRow, r, run.second * mineRow, d2d, s);
        r += run.second * mineRow;
      }
    } else if (hpRow && !x.mine.empty()) {
      // A head held by several ranks comes back from each: their parts are
      // summed (a kernel) into the zeroed output; otherwise each lands once.
      if (!x.replicated)
        e = cudaMemcpy2DAsync(dst + x.hr[p].lo * x.row, stride, r, hpRow, hpRow, x.mine.size(), d2d, s);
      else
        e = zpx::launchAddStrided(dst + x.hr[p].lo * x.row, stride / x.ts, r, x.mine.size(), hpRow / x.ts, x.ts, s);
    }
  }
  if (res == zpSuccess && e != cudaSuccess) res = cudaFailed(comm, "unpacking", e);
  cudaFreeAsync(sb, s);
  cudaFreeAsync(rb, s);
  return res;
}
#endif

}  // namespace

zpResult_t zpUlyssesAlltoall(const void* in, void* out, zpLayout_t layout, int qHeads, int heads, int headDim,
                                    zpDataType_t datatype, int direction, zpComm_t comm, zpStream_t stream) try {
  ZP_NVTX_RANGE("zpUlyssesAlltoall");
  const char* fn = "zpUlyssesAlltoall";
  if (!layout) return zpSetLastError(comm, zpInvalidArgument, "%s: layout is NULL", fn);
  size_t ts = zpTypeSize(datatype);
  if (!ts) return zpSetLastError(comm, zpInvalidArgument, "%s: invalid datatype %d", fn, (int)datatype);
  if (qHeads < 1 || heads < 1 || headDim < 1 || qHeads % heads)
    return zpSetLastError(comm, zpInvalidArgument, "%s: %d query heads, %d heads, head dim %d: need >= 1 and heads dividing query heads",
                    fn, qHeads, heads, headDim);
  if (direction != 0 && direction != 1)
    return zpSetLastError(comm, zpInvalidArgument, "%s: direction %d is not 0 (sequence to head) or 1 (head to sequence)", fn,
                    direction);
  int G = 0, me = 0;
  zpResult_t res = zpCommCount(comm, &G);
  if (res != zpSuccess) return res;
  ZPX_CHECK(zpCommUserRank(comm, &me));
  zpx::LayoutView l;
  ZPX_CHECK(zpx::viewLayout(layout, &l));
  if ((int)l.ranks.size() != G)
    return zpSetLastError(comm, zpInvalidArgument, "%s: the layout has %zu ranks, the communicator %d", fn, l.ranks.size(), G);
  std::vector<int64_t> cu(l.seqLens.size() + 1, 0);  // cu_seqlens: where each sequence starts in the packed batch
  for (size_t s = 0; s < l.seqLens.size(); s++) cu[s + 1] = cu[s] + l.seqLens[s];
  const int64_t total = cu.back();
  // Every buffer of the call holds at most total x heads x headDim elements;
  // checked before any size is multiplied out, so that none wraps around.
  if ((uint64_t)headDim > ZP_MAX_CALL_BYTES / ts / (uint64_t)heads / (uint64_t)std::max<int64_t>(total, 1))
    return zpSetLastError(comm, zpInvalidArgument, "%s: %lld tokens x %d heads x head dim %d x %zu bytes is too large", fn,
                    (long long)total, heads, headDim, ts);
  // Which ranks hold each head is a table per head, filled by a loop over
  // the heads: bounded before it is made (heads = INT_MAX filled 8 GiB),
  // far above any model's head count.
  if (qHeads > kMaxHeads)
    return zpSetLastError(comm, zpInvalidArgument, "%s: %d query heads: at most %d are supported", fn, qHeads,
                          kMaxHeads);
  std::vector<HeadRange> hr(G);
  bool replicated = false;
  std::vector<int> holders(heads, 0);
  for (int p = 0; p < G; p++) {
    hr[p] = headsOf(p, G, qHeads, heads);
    for (int h = hr[p].lo; h < hr[p].hi; h++) replicated |= ++holders[h] > 1;
  }
  if (direction == 1 && replicated && datatype != zpFloat32 && datatype != zpFloat64)
    return zpSetLastError(comm, zpInvalidArgument, "%s: going back, heads held by several ranks are summed: float32 or float64 only",
                    fn);
  // Tokens of each rank, as global positions in the packed batch, in the rank's buffer order.
  auto tokensOf = [&](int r) {
    std::vector<int64_t> v;
    for (const zpSegment_t& s : l.ranks[r])
      for (int64_t t = 0; t < s.count; t++) v.push_back(cu[s.seq] + s.start + t);
    return v;
  };
  std::vector<int64_t> mine = tokensOf(me);
  const size_t row = (size_t)headDim * ts;  // one head of one token
  const int myHeads = hr[me].hi - hr[me].lo;
  std::vector<size_t> sc(G), sd(G), rc(G), rd(G);
  std::vector<std::vector<int64_t>> theirs(G);
  size_t sTot = 0, rTot = 0;
  for (int p = 0; p < G; p++) {
    theirs[p] = tokensOf(p);
    int hp = hr[p].hi - hr[p].lo;
    // Sequence to head: my tokens with p's heads go to p; p's tokens with my heads come here.
    size_t send = direction == 0 ? mine.size() * hp : theirs[p].size() * myHeads;
    size_t recv = direction == 0 ? theirs[p].size() * myHeads : mine.size() * hp;
    sc[p] = send * headDim;
    rc[p] = recv * headDim;
    sd[p] = sTot;
    rd[p] = rTot;
    sTot += sc[p];
    rTot += rc[p];
  }
  size_t inBytes = direction == 0 ? mine.size() * heads * row : (size_t)total * myHeads * row;
  size_t outBytes = direction == 0 ? (size_t)total * myHeads * row : mine.size() * heads * row;
  if ((inBytes && !in) || (outBytes && !out)) return zpSetLastError(comm, zpInvalidArgument, "%s: in or out is NULL", fn);
  if (stream) {
    if (in) ZPX_CHECK(zpCommCheckBuffer(comm, in, stream));
    if (out) ZPX_CHECK(zpCommCheckBuffer(comm, out, stream));
#ifdef ZP_WITH_CUDA
    Exchange x{G, me, heads, myHeads, direction, replicated, ts, row, hr, mine, theirs, sc, sd, rc, rd, sTot, rTot};
    return exchangeOnStream(x, (const char*)in, (char*)out, datatype, comm, stream);
#else
    return zpSetLastError(comm, zpInvalidArgument, "%s: a stream means device buffers: this build has no CUDA", fn);
#endif
  }
  std::vector<char> sbuf(sTot * ts + 1), rbuf(rTot * ts + 1);
  const char* src = (const char*)in;
  char* dst = (char*)out;
  for (int p = 0; p < G; p++) {
    char* w = sbuf.data() + sd[p] * ts;
    if (direction == 0) {
      int hp = hr[p].hi - hr[p].lo;
      for (size_t i = 0; i < mine.size(); i++, w += hp * row)
        memcpy(w, src + (i * heads + hr[p].lo) * row, hp * row);
    } else {
      for (int64_t t : theirs[p]) {
        memcpy(w, src + (size_t)t * myHeads * row, myHeads * row);
        w += myHeads * row;
      }
    }
  }
  ZPX_CHECK(zpAlltoallv(sbuf.data(), sc.data(), sd.data(), rbuf.data(), rc.data(), rd.data(), datatype, comm, nullptr));
  if (direction == 1 && replicated) memset(dst, 0, outBytes);
  for (int p = 0; p < G; p++) {
    const char* r = rbuf.data() + rd[p] * ts;
    if (direction == 0) {
      for (int64_t t : theirs[p]) {
        memcpy(dst + (size_t)t * myHeads * row, r, myHeads * row);
        r += myHeads * row;
      }
    } else {
      int hp = hr[p].hi - hr[p].lo;
      for (size_t i = 0; i < mine.size(); i++, r += hp * row) {
        char* d = dst + (i * heads + hr[p].lo) * row;
        if (!replicated) memcpy(d, r, hp * row);
        else if (datatype == zpFloat32) addInto<float>(d, r, (size_t)hp * headDim);
        else addInto<double>(d, r, (size_t)hp * headDim);
      }
    }
  }
  return zpSuccess;
} catch (...) {
  return zpx::failFromException("zpUlyssesAlltoall");
}
