// Layouts: checking them, and their C API object (include/zeppelin.h).
#include "src/plan/layout.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "src/core/log.h"

namespace zp::plan {

bool validateLayout(const Layout& layout, std::string* why) {
  auto bad = [&](const std::string& m) {
    if (why) *why = m;
    return false;
  };
  // No buffer could hold more tokens than this (2^48, the bytes one call may
  // move), and below it sums of lengths and offsets cannot overflow.
  constexpr int64_t kMaxTokens = int64_t(1) << 48;
  const int64_t N = (int64_t)layout.seqLens.size();
  int64_t total = 0;
  for (int64_t i = 0; i < N; i++) {
    if (layout.seqLens[i] < 0) return bad("sequence " + std::to_string(i) + " has a negative length");
    if (layout.seqLens[i] > kMaxTokens - total)
      return bad("sequence " + std::to_string(i) + ": the batch has more than 2^48 tokens");
    total += layout.seqLens[i];
  }
  struct Piece {
    int64_t start, count;
    int rank;
  };
  std::vector<std::vector<Piece>> bySeq(N);
  for (size_t r = 0; r < layout.ranks.size(); r++)
    for (size_t k = 0; k < layout.ranks[r].size(); k++) {
      const Segment& s = layout.ranks[r][k];
      std::string where = "rank " + std::to_string(r) + ", segment " + std::to_string(k) + ": ";
      if (s.seq < 0 || s.seq >= N)
        return bad(where + "sequence " + std::to_string(s.seq) + " is not one of the " + std::to_string(N));
      if (s.count < 1) return bad(where + "token count " + std::to_string(s.count) + " (must be >= 1)");
      if (s.start < 0 || s.start > layout.seqLens[s.seq] - s.count)
        return bad(where + "tokens [" + std::to_string(s.start) + ", " +
                   (s.start <= INT64_MAX - s.count ? std::to_string(s.start + s.count) : "beyond 2^63") +
                   ") of sequence " + std::to_string(s.seq) + " are outside its " +
                   std::to_string(layout.seqLens[s.seq]) + " tokens");
      bySeq[s.seq].push_back({s.start, s.count, (int)r});
    }
  for (int64_t i = 0; i < N; i++) {
    auto& v = bySeq[i];
    std::sort(v.begin(), v.end(), [](const Piece& x, const Piece& y) { return x.start < y.start; });
    int64_t next = 0;
    for (const Piece& p : v) {
      if (p.start > next)
        return bad("sequence " + std::to_string(i) + ": tokens [" + std::to_string(next) + ", " +
                   std::to_string(p.start) + ") are on no rank");
      if (p.start < next)
        return bad("sequence " + std::to_string(i) + ": token " + std::to_string(p.start) +
                   " is on two ranks (rank " + std::to_string(p.rank) + " and another)");
      next = p.start + p.count;
    }
    if (next != layout.seqLens[i])
      return bad("sequence " + std::to_string(i) + ": tokens [" + std::to_string(next) + ", " +
                 std::to_string(layout.seqLens[i]) + ") are on no rank");
  }
  return true;
}

void fillLayout(zpLayout* l, Layout layout) {
  l->layout = std::move(layout);
  l->flat.clear();
  l->offsets.assign(1, 0);
  for (const auto& segs : l->layout.ranks) {
    for (const Segment& s : segs) l->flat.push_back({s.seq, s.start, s.count});
    l->offsets.push_back(l->flat.size());
  }
}

}  // namespace zp::plan

zpResult_t zpLayoutCreate(zpLayout_t* layout, int nseqs, const int64_t* seqLens, int nranks,
                                 const size_t* offsets, const zpSegment_t* segments) try {
  if (!layout) return zp::fail(zpInvalidArgument, "zpLayoutCreate: layout is NULL");
  *layout = nullptr;
  if (nseqs < 0 || nranks < 1)
    return zp::fail(zpInvalidArgument, "zpLayoutCreate: %d sequences and %d ranks (need >= 0 and >= 1)", nseqs, nranks);
  if ((nseqs && !seqLens) || !offsets)
    return zp::fail(zpInvalidArgument, "zpLayoutCreate: seqLens or rankSegOffsets is NULL");
  if (offsets[0] != 0) return zp::fail(zpInvalidArgument, "zpLayoutCreate: rankSegOffsets[0] is %zu, not 0", offsets[0]);
  for (int r = 0; r < nranks; r++)
    if (offsets[r + 1] < offsets[r])
      return zp::fail(zpInvalidArgument, "zpLayoutCreate: rankSegOffsets[%d] = %zu is less than rankSegOffsets[%d] = %zu",
                      r + 1, offsets[r + 1], r, offsets[r]);
  if (offsets[nranks] && !segments) return zp::fail(zpInvalidArgument, "zpLayoutCreate: segments is NULL");
  zp::plan::Layout l;
  l.seqLens.assign(seqLens, seqLens + nseqs);
  l.ranks.resize(nranks);
  for (int r = 0; r < nranks; r++)
    for (size_t k = offsets[r]; k < offsets[r + 1]; k++)
      l.ranks[r].push_back({segments[k].seq, segments[k].start, segments[k].count});
  std::string why;
  if (!zp::plan::validateLayout(l, &why)) return zp::fail(zpInvalidArgument, "zpLayoutCreate: %s", why.c_str());
  auto out = std::make_unique<zpLayout>();
  zp::plan::fillLayout(out.get(), std::move(l));
  *layout = out.release();
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpLayoutCreate");
}

zpResult_t zpLayoutGetInfo(zpLayout_t layout, int* nranks, int* nseqs, const int64_t** seqLens) try {
  if (!layout) return zp::fail(zpInvalidArgument, "zpLayoutGetInfo: layout is NULL");
  if (nranks) *nranks = (int)layout->layout.ranks.size();
  if (nseqs) *nseqs = (int)layout->layout.seqLens.size();
  if (seqLens) *seqLens = layout->layout.seqLens.data();
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpLayoutGetInfo");
}

zpResult_t zpLayoutDestroy(zpLayout_t layout) try {
  if (!layout) return zp::fail(zpInvalidArgument, "zpLayoutDestroy: layout is NULL");
  if (layout->ownedByPlan) return zp::fail(zpInvalidUsage, "zpLayoutDestroy: this layout belongs to a plan");
  delete layout;
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpLayoutDestroy");
}

zpResult_t zpLayoutRankTokens(zpLayout_t layout, int rank, int64_t* tokens) try {
  if (!layout || !tokens) return zp::fail(zpInvalidArgument, "zpLayoutRankTokens: NULL argument");
  if (rank < 0 || rank >= (int)layout->layout.ranks.size())
    return zp::fail(zpInvalidArgument, "zpLayoutRankTokens: rank %d of %zu", rank, layout->layout.ranks.size());
  *tokens = 0;
  for (const auto& s : layout->layout.ranks[rank]) *tokens += s.count;
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpLayoutRankTokens");
}

zpResult_t zpLayoutRankSegments(zpLayout_t layout, int rank, const zpSegment_t** segments, size_t* count) try {
  if (!layout || !segments || !count) return zp::fail(zpInvalidArgument, "zpLayoutRankSegments: NULL argument");
  if (rank < 0 || rank >= (int)layout->layout.ranks.size())
    return zp::fail(zpInvalidArgument, "zpLayoutRankSegments: rank %d of %zu", rank, layout->layout.ranks.size());
  *segments = layout->flat.data() + layout->offsets[rank];
  *count = layout->offsets[rank + 1] - layout->offsets[rank];
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpLayoutRankSegments");
}

