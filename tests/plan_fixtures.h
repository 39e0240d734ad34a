// What the planner's and the simulator's tests share.
#pragma once

#include "src/plan/planner.h"

namespace zptest {

// An A800-like cluster model: 8 ranks and 4 NICs of 200 Gbit/s per node,
// 200 GB/s within the node, 312 TFLOPS at 50%.
inline zp::plan::ClusterModel a800Model(int nodes = 1) {
  zp::plan::ClusterModel c;
  c.nodes = nodes;
  c.ranksPerNode = 8;
  c.nicsPerNode = 4;
  c.nicGbps = 200;
  c.intraNodeGBps = 200;
  c.tflops = 312;
  c.efficiency = 0.5;
  return c;
}

}  // namespace zptest
