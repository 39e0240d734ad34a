// The C API's layout object: a checked zp::plan::Layout, with its segments
// also flat for zpLayoutRankSegments.
#pragma once

#include <string>
#include <vector>

#include "include/zeppelin.h"
#include "src/plan/plan.h"

struct zpLayout {
  zp::plan::Layout layout;
  std::vector<zpSegment_t> flat;  // all ranks' segments, rank by rank
  std::vector<size_t> offsets;    // rank r's are flat[offsets[r] .. offsets[r+1])
  bool ownedByPlan = false;
};

namespace zp::plan {
// Every token of every sequence on exactly one rank; else false, with the
// first problem (rank, segment, sequence and tokens) in *why.
bool validateLayout(const Layout& layout, std::string* why);
void fillLayout(zpLayout* l, Layout layout);
}  // namespace zp::plan
