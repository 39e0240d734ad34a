#include "src/plan/cost_model.h"

#include <algorithm>

namespace zp::plan {

double attnFlops(int64_t len, bool causal, const AttnShape& shape) {
  double s = static_cast<double>(len);
  return 4.0 * s * s * shape.qHeads * shape.headDim * (causal ? 0.5 : 1.0);
}

double computeSeconds(double flops, const ClusterModel& cluster) {
  return flops / (cluster.tflops * 1e12 * cluster.efficiency);
}

double kvBytes(int64_t tokens, const AttnShape& shape) {
  return 2.0 * static_cast<double>(tokens) * shape.kvHeads * shape.headDim * shape.elemBytes;
}

double linkBytesPerSec(Link link, const ClusterModel& cluster) {
  if (link == Link::Intra) return cluster.intraNodeGBps * 1e9;
  return cluster.nicGbps * 1e9 / 8.0;
}

double nicShareBytesPerSec(const ClusterModel& cluster) {
  return cluster.nicsPerNode * cluster.nicGbps * 1e9 / 8.0 / cluster.ranksPerNode;
}

RingStep ringStep(int64_t len, bool causal, int G, Link link, const AttnShape& shape,
                  const ClusterModel& cluster) {
  RingStep st;
  double g = G;
  st.compute = computeSeconds(attnFlops(len, causal, shape), cluster) / (g * g);
  // The largest chunk a rank holds decides how long its hop takes.
  int64_t chunk = (len + G - 1) / G;
  st.transfer = G > 1 ? kvBytes(chunk, shape) / linkBytesPerSec(link, cluster) : 0.0;
  return st;
}

bool ringHides(int64_t len, bool causal, int G, Link link, const AttnShape& shape,
               const ClusterModel& cluster) {
  RingStep st = ringStep(len, causal, G, link, shape, cluster);
  return st.compute >= st.transfer;
}

double ringSeconds(int64_t len, bool causal, int G, Link link, const AttnShape& shape,
                   const ClusterModel& cluster) {
  RingStep st = ringStep(len, causal, G, link, shape, cluster);
  return st.compute + (G - 1) * std::max(st.compute, st.transfer);
}

}  // namespace zp::plan
