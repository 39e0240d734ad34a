// The cost model behind the planner and the simulator, in one place.
//
// Attention for a sequence of s tokens costs 4 * s^2 * qHeads * headDim
// FLOPs forward (QK^T and PV, 2 FLOPs per multiply-add), half that when
// causal. Split over a ring of G ranks, each of the G steps computes on s/G
// query tokens against s/G key/value tokens (1/G^2 of the whole) while the
// next s/G tokens of K and V, 2 * s/G * kvHeads * headDim * elemBytes bytes,
// travel over the link the ring uses: an intra-node link, or one NIC when the
// ring spans nodes (rings run node by node, so per step only one hop leaves
// each node; the model assumes no more rings cross a node at once than it has
// NICs, which the router's spreading approximates). A step takes the longer of
// the two, so the communication is hidden when the compute is longer; the
// planner splits a sequence across a level only when it is.
#pragma once

#include <cstdint>

namespace zp::plan {

struct AttnShape {
  int qHeads = 32;  // Llama-3-8B-like defaults
  int kvHeads = 8;
  int headDim = 128;
  int elemBytes = 2;  // bf16
};

struct ClusterModel {
  int nodes = 1;
  int ranksPerNode = 8;
  int nicsPerNode = 4;
  double nicGbps = 200;        // per NIC, Gbit/s
  double intraNodeGBps = 200;  // per rank, GB/s, effective
  double tflops = 312;         // dense bf16 peak per rank
  double efficiency = 0.5;     // fraction of peak attention kernels reach
  int ranks() const { return nodes * ranksPerNode; }
};

// The link a ring uses.
enum class Link { Intra, Inter };

// Forward attention FLOPs of one whole sequence.
double attnFlops(int64_t len, bool causal, const AttnShape& shape);
// Seconds for that many FLOPs on one rank.
double computeSeconds(double flops, const ClusterModel& cluster);
// Bytes of K and V for that many tokens.
double kvBytes(int64_t tokens, const AttnShape& shape);
// Bytes per second a ring hop gets on a link (inter: one NIC).
double linkBytesPerSec(Link link, const ClusterModel& cluster);
// Bytes per second each rank gets when all ranks of a node send across nodes
// at once (all-gather, remap): its share of the node's NICs.
double nicShareBytesPerSec(const ClusterModel& cluster);

// One ring step of a sequence split over G ranks.
struct RingStep {
  double compute = 0;   // seconds
  double transfer = 0;  // seconds
};
RingStep ringStep(int64_t len, bool causal, int G, Link link, const AttnShape& shape,
                  const ClusterModel& cluster);
// True when every step's compute hides its transfer.
bool ringHides(int64_t len, bool causal, int G, Link link, const AttnShape& shape,
               const ClusterModel& cluster);
// Seconds one rank of the ring spends on the sequence: the first step needs
// no transfer, each later step the longer of its compute and its transfer.
// G == 1 is local attention.
double ringSeconds(int64_t len, bool causal, int G, Link link, const AttnShape& shape,
                   const ClusterModel& cluster);

}  // namespace zp::plan
