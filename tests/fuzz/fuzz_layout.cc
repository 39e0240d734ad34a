// Layouts and plans from the user's arrays (zpLayoutCreate, zpPlanCreate):
// any arrays are either accepted, and then consistent (every token of every
// sequence on exactly one rank), or refused with a message.
#include <cstdlib>
#include <vector>

#include "include/zeppelin.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

int64_t length(zpfuzz::Input& in) {
  switch (in.below(4)) {
    case 0: return in.take<int64_t>();  // anything, INT64_MAX and negatives included
    case 1: return (int64_t)1 << in.below(63);
    default: return (int64_t)in.below(64);
  }
}

void layout(zpfuzz::Input& in) {
  int nseqs = (int)in.below(6), nranks = 1 + (int)in.below(5);
  std::vector<int64_t> lens(nseqs);
  for (auto& l : lens) l = length(in);
  std::vector<size_t> offsets(nranks + 1, 0);
  size_t total = 0;
  for (int r = 0; r < nranks; r++) offsets[r + 1] = total += in.below(5);
  // Any offset but the last may be wrong (the last is the segments' count:
  // the array holds that many, as the header requires of the caller).
  if (in.below(8) == 0) offsets[in.below(nranks)] = in.take<size_t>();
  std::vector<zpSegment_t> segs(total);
  for (auto& s : segs) {
    s.seq = in.below(4) == 0 ? in.take<int64_t>() : (int64_t)in.below(nseqs + 1);
    s.start = in.below(4) == 0 ? in.take<int64_t>() : (int64_t)in.below(70);
    s.count = in.below(4) == 0 ? in.take<int64_t>() : (int64_t)in.below(70);
  }
  zpLayout_t l = nullptr;
  if (zpLayoutCreate(&l, nseqs, lens.data(), nranks, offsets.data(), segs.data()) != zpSuccess) {
    if (zpGetLastError(nullptr)[0] == 0) abort();
    return;
  }
  // Accepted: the ranks' tokens add up to the batch's.
  int64_t tokens = 0, batch = 0;
  for (int r = 0; r < nranks; r++) {
    int64_t t = 0;
    if (zpLayoutRankTokens(l, r, &t) != zpSuccess || t < 0) abort();
    tokens += t;
  }
  for (int64_t x : lens) batch += x;
  if (tokens != batch) abort();
  zpLayoutDestroy(l);
}

void plan(zpfuzz::Input& in) {
  int nseqs = (int)in.below(5), nranks = 1 + (int)in.below(6), perNode = (int)in.below(4);
  int causal = in.below(2);
  std::vector<int64_t> lens(nseqs);
  for (auto& l : lens) l = length(in);
  std::vector<size_t> offsets(nseqs + 1, 0);
  size_t total = 0;
  for (int s = 0; s < nseqs; s++) offsets[s + 1] = total += in.below(4);
  if (in.below(8) == 0 && nseqs) offsets[in.below(nseqs)] = in.take<size_t>();  // not the last (see layout())
  std::vector<int> ranks(total);
  for (int& r : ranks) r = in.below(8) == 0 ? in.take<int>() : (int)in.below(nranks);
  zpBatchPlan_t p = nullptr;
  if (zpPlanCreate(&p, nseqs, lens.data(), causal, nranks, perNode, offsets.data(), ranks.data()) != zpSuccess) {
    if (zpGetLastError(nullptr)[0] == 0) abort();
    return;
  }
  for (int kind = 0; kind < 2; kind++) {
    int64_t tokens = 0;
    for (int r = 0; r < nranks; r++) {
      const zpSegment_t* segs = nullptr;
      size_t n = 0;
      if (zpPlanRankSegments(p, (zpLayoutKind_t)kind, r, &segs, &n) != zpSuccess) abort();
      for (size_t i = 0; i < n; i++) tokens += segs[i].count;
    }
    int64_t batch = 0;
    for (int64_t x : lens) batch += x;
    if (tokens != batch) abort();
  }
  zpPlanDestroy(p);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zpfuzz::Input in(data, size);
  if (in.below(2)) layout(in);
  else plan(in);
  return 0;
}
