// The cost model behind the planner and the simulator, in one place.
//
// Attention for a sequence of s tokens costs 4 * s^2 * qHeads * headDim
// FLOPs forward (QK^T and PV, 2 FLOPs per multiply-add), half that when
// causal. Split over a ring of G ranks, each of the G steps computes on s/G
// query tokens against s/G key/value tokens (1/G^2 of the whole) while the
// next s/G tokens of K and V, 2 * s/G * kvHeads * headDim * elemBytes bytes,
// travel over the link the ring uses: an intra-node link, one NIC when a ring
// that spans nodes goes through the NIC next to its GPU (rings run node by
// node, so per step only one hop leaves each node), or, for Zeppelin's rings
// through its routing layer, a share of every NIC of the node. A step takes
// the longer of the two, so the communication is hidden when the compute is
// longer; the planner splits a sequence across a level only when it is.
//
// Two terms make short chunks cost more than their FLOPs, which is what makes
// context parallelism of short sequences a loss (the paper's motivation):
// attention kernels reach a fraction of peak that grows with the chunk
// length (attnEfficiency, a table; empty: `efficiency` at every length), and
// every message pays a latency before its bytes flow.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

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
  double efficiency = 0.5;     // fraction of peak attention kernels reach (when the table is empty)
  // Fraction of peak by query chunk length in tokens: (length, efficiency)
  // points, lengths increasing; linear in log(length) between points, the end
  // values beyond them. Empty: `efficiency` everywhere.
  std::vector<std::pair<double, double>> attnEfficiency;
  double intraLatency = 0;  // seconds before a message's bytes flow, within a node
  double interLatency = 0;  // the same across nodes
  // Zeppelin's routing layer spreads an inter-node ring's hop over all of
  // its node's NICs (through the other GPUs of the node): it gets this
  // fraction of the node's NIC bandwidth, at most its own NIC plus the
  // NVLink the relayed part crosses, at least its own NIC. 0: no routing,
  // one NIC per hop.
  double routeEfficiency = 0;
  int ranks() const { return nodes * ranksPerNode; }
};

// The link a ring uses: within a node; across nodes through one NIC (as a
// ring of NCCL or Transformer Engine does: the NIC next to the GPU); across
// nodes through the routing layer (every NIC of the node).
// PerGpu: across nodes while every GPU of the node sends at once, each
// through its own NIC (its share of the node's NICs when GPUs share them),
// as the rings of hierarchical context parallelism do (Transformer Engine's
// a2a+p2p, USP).
enum class Link { Intra, Inter, Routed, PerGpu };

// The link an inter-node ring of Zeppelin's plan uses: Routed when the model
// has a routing layer (routeEfficiency > 0), else Inter.
Link zeppelinInterLink(const ClusterModel& cluster);

// Forward attention FLOPs of one whole sequence.
double attnFlops(int64_t len, bool causal, const AttnShape& shape);
// The fraction of peak an attention kernel reaches on chunks of that many
// query tokens.
double attnEfficiencyAt(double chunkTokens, const ClusterModel& cluster);
// Seconds for that many attention FLOPs on chunks of chunkTokens query tokens.
double attnComputeSeconds(double flops, double chunkTokens, const ClusterModel& cluster);
// Seconds for that many FLOPs at the constant `efficiency` (the planner's
// mean-load estimate; equal to attnComputeSeconds when the table is empty).
double computeSeconds(double flops, const ClusterModel& cluster);
// Bytes of K and V for that many tokens.
double kvBytes(int64_t tokens, const AttnShape& shape);
// Bytes per second a ring hop gets on a link.
double linkBytesPerSec(Link link, const ClusterModel& cluster);
// Latency of one message on a link.
double linkLatency(Link link, const ClusterModel& cluster);
// Bytes per second each rank gets when all ranks of a node send across nodes
// at once (all-gather, remap): its share of the node's NICs.
double nicShareBytesPerSec(const ClusterModel& cluster);

// One ring step of a sequence split over G ranks.
struct RingStep {
  double compute = 0;   // seconds
  double transfer = 0;  // seconds, latency included (0 when G == 1)
};
// The forward step. The backward step computes 2.5 times the FLOPs
// (FlashAttention's backward: 5 matrix products against 2) and moves K, V
// and their gradients (twice the bytes): backwardStep.
RingStep ringStep(int64_t len, bool causal, int G, Link link, const AttnShape& shape,
                  const ClusterModel& cluster);
// Its compute alone (the same figure), for a caller that needs no transfer.
double ringStepCompute(int64_t len, bool causal, int G, const AttnShape& shape, const ClusterModel& cluster);
RingStep backwardStep(const RingStep& forward, double latency);
constexpr double kAttnBackwardFlops = 2.5;
// True when every step's compute hides its transfer.
bool ringHides(int64_t len, bool causal, int G, Link link, const AttnShape& shape,
               const ClusterModel& cluster);
// Seconds one rank of the ring spends on the sequence's forward: the first
// step needs no transfer, each later step the longer of its compute and its
// transfer. G == 1 is local attention.
double ringSeconds(int64_t len, bool causal, int G, Link link, const AttnShape& shape,
                   const ClusterModel& cluster);
// The same for the backward pass (backwardStep's compute and transfer).
double ringBackwardSeconds(int64_t len, bool causal, int G, Link link, const AttnShape& shape,
                           const ClusterModel& cluster);
// Both, from one ringStep (the planner asks for both for every sequence of
// every candidate).
struct RingSeconds {
  double forward = 0, backward = 0;
};
RingSeconds ringBothSeconds(int64_t len, bool causal, int G, Link link, const AttnShape& shape,
                            const ClusterModel& cluster);

}  // namespace zp::plan
