#include "src/plan/cost_model.h"

#include <algorithm>
#include <cmath>

namespace zp::plan {

Link zeppelinInterLink(const ClusterModel& c) { return c.routeEfficiency > 0 ? Link::Routed : Link::Inter; }

double attnFlops(int64_t len, bool causal, const AttnShape& shape) {
  double s = static_cast<double>(len);
  return 4.0 * s * s * shape.qHeads * shape.headDim * (causal ? 0.5 : 1.0);
}

double attnEfficiencyAt(double chunk, const ClusterModel& c) {
  const auto& t = c.attnEfficiency;
  if (t.empty()) return c.efficiency;
  if (chunk <= t.front().first) return t.front().second;
  if (chunk >= t.back().first) return t.back().second;
  size_t i = 1;
  while (t[i].first < chunk) ++i;
  // Kernel efficiency grows roughly with the logarithm of the tile count.
  // The log of a step's width is kept for the step asked about last: the
  // planner asks for the chunks of every sequence of every candidate, mostly
  // in one or two steps of the table.
  thread_local double lastLo = 0, lastHi = 0, lastWidth = 0;
  if (t[i - 1].first != lastLo || t[i].first != lastHi)
    lastLo = t[i - 1].first, lastHi = t[i].first, lastWidth = std::log(t[i].first / t[i - 1].first);
  double f = std::log(chunk / t[i - 1].first) / lastWidth;
  return t[i - 1].second + f * (t[i].second - t[i - 1].second);
}

double attnComputeSeconds(double flops, double chunk, const ClusterModel& c) {
  return flops / (c.tflops * 1e12 * attnEfficiencyAt(chunk, c));
}

double computeSeconds(double flops, const ClusterModel& cluster) {
  return flops / (cluster.tflops * 1e12 * cluster.efficiency);
}

double kvBytes(int64_t tokens, const AttnShape& shape) {
  return 2.0 * static_cast<double>(tokens) * shape.kvHeads * shape.headDim * shape.elemBytes;
}

double linkBytesPerSec(Link link, const ClusterModel& c) {
  switch (link) {
    case Link::Intra:
      return c.intraNodeGBps * 1e9;
    case Link::Routed:
      if (c.routeEfficiency > 0) {
        // What the relays add goes over the NVLink of the sending GPU (and
        // of the receiving one) beside its own NIC, so it is capped by that
        // link; and the router never does worse than the GPU's own NIC.
        const double nic = c.nicGbps * 1e9 / 8.0;
        const double routed = std::min(c.routeEfficiency * c.nicsPerNode * nic, nic + c.intraNodeGBps * 1e9);
        return std::max(nic, routed);
      }
      [[fallthrough]];
    case Link::Inter:
      break;
    case Link::PerGpu:
      return std::min(c.nicGbps * 1e9 / 8.0, nicShareBytesPerSec(c));
  }
  return c.nicGbps * 1e9 / 8.0;
}

double linkLatency(Link link, const ClusterModel& c) { return link == Link::Intra ? c.intraLatency : c.interLatency; }

double nicShareBytesPerSec(const ClusterModel& cluster) {
  return cluster.nicsPerNode * cluster.nicGbps * 1e9 / 8.0 / cluster.ranksPerNode;
}

double ringStepCompute(int64_t len, bool causal, int G, const AttnShape& shape, const ClusterModel& cluster) {
  const double g = G;
  return attnComputeSeconds(attnFlops(len, causal, shape) / (g * g), double(len) / G, cluster);
}

RingStep ringStep(int64_t len, bool causal, int G, Link link, const AttnShape& shape,
                  const ClusterModel& cluster) {
  RingStep st;
  st.compute = ringStepCompute(len, causal, G, shape, cluster);
  // The largest chunk a rank holds decides how long its hop takes.
  int64_t chunk = (len + G - 1) / G;
  st.transfer = G > 1 ? linkLatency(link, cluster) + kvBytes(chunk, shape) / linkBytesPerSec(link, cluster) : 0.0;
  return st;
}

RingStep backwardStep(const RingStep& fwd, double latency) {
  RingStep b;
  b.compute = kAttnBackwardFlops * fwd.compute;
  b.transfer = fwd.transfer > 0 ? latency + 2 * (fwd.transfer - latency) : 0.0;
  return b;
}

bool ringHides(int64_t len, bool causal, int G, Link link, const AttnShape& shape,
               const ClusterModel& cluster) {
  RingStep st = ringStep(len, causal, G, link, shape, cluster);
  return st.compute >= st.transfer;
}

namespace {

// G steps, the first without a transfer to wait for.
double stepsSeconds(const RingStep& st, int G) { return st.compute + (G - 1) * std::max(st.compute, st.transfer); }

}  // namespace

double ringSeconds(int64_t len, bool causal, int G, Link link, const AttnShape& shape,
                   const ClusterModel& cluster) {
  return stepsSeconds(ringStep(len, causal, G, link, shape, cluster), G);
}

double ringBackwardSeconds(int64_t len, bool causal, int G, Link link, const AttnShape& shape,
                           const ClusterModel& cluster) {
  return stepsSeconds(backwardStep(ringStep(len, causal, G, link, shape, cluster), linkLatency(link, cluster)), G);
}

RingSeconds ringBothSeconds(int64_t len, bool causal, int G, Link link, const AttnShape& shape,
                            const ClusterModel& cluster) {
  const RingStep st = ringStep(len, causal, G, link, shape, cluster);
  return {stepsSeconds(st, G), stepsSeconds(backwardStep(st, linkLatency(link, cluster)), G)};
}

}  // namespace zp::plan
