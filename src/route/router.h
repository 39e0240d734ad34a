// The router's planning part (idea 2 of docs/design.md): it maps every inter-node
// transfer of a collective call onto NIC paths, as plain data. Nothing here
// does I/O or logs (errors come back as a message); every rank computes the
// same plan from the same input (see "Determinism" below).
//
// ---- The cluster model ----
// N nodes; node n has local ranks 0..R_n-1 and K_n NICs, NIC k with a
// bandwidth bw(n,k) per direction (full duplex: sending and receiving are
// separate resources). Each rank has one affine NIC (ClusterTopology::rankNic);
// the ranks whose affine NIC is k "own" NIC k of their node (several ranks may
// share one). A NIC of unknown rate (0 in the topology) counts with the mean of
// the cluster's known rates, or 1 byte/s if no rate is known at all.
//
// Networks are rail-optimized by default (RouteParams::railOnly): NIC k of one
// node reaches NIC k of every other node ("rail k") and nothing else; a piece
// on rail k leaves node a on NIC k and enters node b on NIC k. This is how
// zprun's emulated cluster is wired (one isolated bridge per rail) and how
// rail-only GPU clusters work. With railOnly = false ("full fabric") any NIC
// of one node reaches any NIC of another.
//
// ---- Demand ----
// bytes[src][dst] between ranks, or a sparse list of TransferDemand. Entries
// between ranks of one node stay on shared memory: they are not routed, and
// count only in the shared-memory term of the cost (RoutePlan::rankShmBytes).
// Entries with src == dst (local copies) and with 0 bytes are ignored.
//
// ---- Routes ----
// The route of an inter-node transfer s -> d (s on node a, d on node b) is a
// list of pieces {offset, bytes, srcProxy, sendNic, dstProxy, recvNic}:
//   dispatch  s hands [offset, offset+bytes) to srcProxy, a rank of node a,
//             over shared memory (no hop when srcProxy == s);
//   transfer  srcProxy sends it from NIC sendNic of node a to NIC recvNic of
//             node b, where dstProxy, a rank of node b, receives it;
//   combine   dstProxy hands it to d over shared memory (no hop if dstProxy == d).
// With railOnly, sendNic == recvNic (the rail). A piece is a run of whole
// chunks of RouteParams::chunkBytes C: its offset is a multiple of C and its
// length too, except the piece that ends the transfer. The pieces of a
// transfer cover [0, bytes) exactly once, in offset order. In a routed (not
// direct, below) transfer, srcProxy owns sendNic and dstProxy owns recvNic,
// so a relayed side (srcProxy != s, dstProxy != d) always goes through an
// owner of the NIC; relays are spread over the ranks that share a NIC (the
// least loaded one, in relayed plus intra-node bytes, lowest local rank on
// ties). Only a direct transfer may have s drive a NIC it does not own.
//
// A transfer is "direct" when it takes the path a transfer takes without any
// routing: s itself sends and d itself receives, one piece. With railOnly
// that is rail rankNic[d]: the sender's own NIC when s and d share a rail,
// else NIC rankNic[d] of node a, driven by s (the path the kernel picks for
// d's address, which sits on rail rankNic[d]); an error if node a has no NIC
// with that index. With full fabric it is s's NIC to d's NIC.
//
// ---- Modes ----
// off       every transfer is direct: no relays, one path per transfer.
// rail      PXN-like: s -> d goes through the proxy of node a that owns NIC
//           rankNic[d] (s itself when it owns it) and is received by d on its
//           own NIC: a dispatch hop only, never a combine hop. Where node a
//           has no owner of that NIC, the direct path; where node a has no NIC
//           with that index (railOnly, uneven NIC counts) or d has no NIC,
//           the rail of s if node b owns it (a combine hop at b), else the
//           lowest usable rail. Full fabric: the owner of NIC index
//           rankNic[d] on node a (else s itself), to d's NIC.
// balanced  (default) each transfer's chunks are split over the rails (with
//           full fabric: over send NICs and receive NICs independently) and
//           their proxies so that the most loaded NIC direction carries as
//           little as possible: send and receive directions count
//           separately, NIC loads in time (bytes / bandwidth). Only NICs with
//           an owner on their node carry routed traffic. Every NIC is kept at
//           most one chunk past the lower bound where the planner can (its
//           cap: bound x bandwidth + C bytes). Relay hops are charged shmCost
//           chunk-times each: among placements within the caps, a chunk goes
//           on a rail that needs more hops only if that rail finishes earlier
//           by more than the charge, so relaying is used where it pays; and
//           of the ways to reach the same NIC loads, the one with the fewest
//           relayed bytes is taken. The caps come first: a chunk that would
//           take a NIC past its cap goes elsewhere even if that needs relay
//           hops (so with shmCost near 1 or more, relaying can cost more than
//           it saves; the charge is meant to be small). How (railOnly):
//             1. node pairs, largest first: each group of a pair's transfers
//                with the same own rails (rankNic of s and d) water-fills its
//                chunks over the pair's usable rails (an owner on both
//                nodes), each chunk where the later of its two NICs finishes
//                first, charged as above; then every transfer's last short
//                piece, largest first;
//             2. a local search over alternating paths: node a moves chunks
//                of one of its pairs from its most loaded rail k to rail j;
//                the far node of that pair gives back chunks of another pair
//                from j to k, and so on; a move is made when the sum over NIC
//                directions of weight x bytes^2 (weight: the node's mean rate
//                / the NIC's rate) plus 2 shmCost C per relayed byte-hop
//                falls and no NIC passes the time of the one relieved (nor its
//                cap, bound + one chunk, unless that one is over its own);
//                short pieces move alone by the same rule, off NICs past the
//                bound; the search ends when no NIC is over its cap, or when
//                nothing moves (or after a work budget on huge inputs);
//             3. per node pair, each rail's chunks go to the transfers that
//                need no relay hop on it, then (a max flow) to those that
//                need one, then to the rest.
//           Full fabric: each node's sides on their own: counts per NIC by
//           water-filling, owners' chunks kept on their own NIC up to the
//           level reached, the rest spread; the two sides' chunk sequences of
//           a transfer are zipped into pieces.
// In rail and balanced modes, transfers of fewer than directBelow bytes take
// the direct path (a relay would cost more than it saves; the threshold is to
// be measured by bench/route_perf). A pair of nodes with no usable rail in
// common (railOnly, NICs without owners) also falls back to the direct path.
//
// ---- Loads and cost ----
// For every NIC: the bytes it sends and receives, the part of them that is
// relayed, and the times bytes / bandwidth. maxNicTime = the largest send or
// receive time of any NIC. Shared memory: a rank's shm bytes are the bytes it
// relays as a proxy (dispatch hops it receives, combine hops it delivers)
// plus the intra-node demand it sends and receives; shmTime = shmCost x
// max over ranks of (shm bytes / bandwidth of its NIC), i.e. a byte over
// shared memory costs shmCost byte-times of the rank's NIC. The plan's cost
// = maxNicTime + shmTime, an estimate of the call's time when the relay hops
// are pipelined with the network.
//
// ---- Lower bound (lowerBound, RoutePlan::lowerBound) ----
// A bound on maxNicTime for any plan that obeys the params (transfers below
// directBelow, and pairs without a usable rail, on their direct path; all other
// traffic only on NICs that have an owner), the largest of:
//   * for every node and direction: the water level of its bytes over its
//     NICs. Bytes on direct paths are fixed on their NIC; the rest fills the
//     node's owned NICs to the level T with sum_k max(0, T bw_k - fixed_k) =
//     routed bytes. Without direct paths this is the node's total outgoing
//     (incoming) inter-node bytes / the sum of its owned NICs' bandwidths;
//   * every transfer that cannot be split (at most one chunk): its bytes over
//     the fastest path it may take (the best usable rail, both ends counted).
// For balanced plans with railOnly, when each rail has the same share of its
// node's bandwidth on every node and no transfer is forced direct, the bound
// is reachable up to chunk granularity; the planner then keeps every NIC
// within one chunk of it (time <= bound + C / bw of that NIC), which
// tests/router_test.cc checks on random and adversarial demands (it is not
// proven for every input). Rail coupling can make the bound unreachable
// otherwise: e.g. direct transfers that load NIC 0 on one node's receive side
// and NIC 1 on the sender's send side push a pair's traffic in opposite
// directions.
//
// ---- Point to point (pickPath) ----
// For zpSend/zpRecv there is no global plan: the sender decides alone from the
// bytes queued on its node's NICs. Off, rail and small transfers: as above.
// Balanced: the chunks go over the rails (full fabric: send NICs, each paired
// with the same-index NIC of node b when it has an owner, else d's NIC) that
// finish first, given the queued bytes, with the same relay charge; proxies
// are picked from the ranks' local indices (no load information).
//
// ---- Determinism ----
// Every loop runs in index order, every sort has a total order (ties broken
// by rank, node and NIC indices), and no unordered container is iterated. The
// arithmetic is in doubles but the same on every rank that runs the same
// binary on the same input, so every rank computes the same plan.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "include/zeppelin.h"
#include "src/core/topology.h"
#include "src/core/config.h"
#include "src/core/routing.h"  // Piece

namespace zp {

// The values are zpRouting_t's (zpConfig_t.routing, ZP_ROUTING).
enum class RouteMode : int {
  kOff = zpRoutingOff,
  kRail = zpRoutingRail,
  kBalanced = zpRoutingBalanced,
};
const char* routeModeName(RouteMode mode);  // "off", "rail", "balanced"

// Defaults of RouteParams: the chunk size and direct threshold are the
// configuration's (src/core/config.h); the relayed byte's cost is here.
// A relayed byte costs this many byte-times of a NIC (shared memory copies at
// ~4 GB/s next to 1 Gbit/s NICs: 1/32).
constexpr double kRouteDefaultShmCost = 1.0 / 32;

struct RouteParams {
  RouteMode mode = RouteMode::kBalanced;
  uint64_t chunkBytes = kRouteDefaultChunkBytes;  // C, >= 1
  double shmCost = kRouteDefaultShmCost;          // >= 0, finite
  uint64_t directBelow = kRouteDefaultDirectBelow;
  bool railOnly = true;
};

// One entry of a sparse demand: src sends bytes to dst.
struct TransferDemand {
  int src = 0, dst = 0;
  uint64_t bytes = 0;
};

struct NicLoad {
  int node = -1, nic = -1;
  double bytesPerSec = 0;          // the rate times are computed with
  bool rateKnown = false;          // false: the substitute for an unknown rate
  int owners = 0;                  // ranks of the node whose affine NIC this is
  uint64_t sendBytes = 0, recvBytes = 0;
  uint64_t relaySendBytes = 0;     // of sendBytes: dispatched to a proxy first
  uint64_t relayRecvBytes = 0;     // of recvBytes: combined by a proxy afterwards
  double sendTime = 0, recvTime = 0;  // bytes / bytesPerSec, seconds

  double time() const { return sendTime > recvTime ? sendTime : recvTime; }
  bool operator==(const NicLoad& o) const {
    return node == o.node && nic == o.nic && bytesPerSec == o.bytesPerSec &&
           rateKnown == o.rateKnown && owners == o.owners && sendBytes == o.sendBytes &&
           recvBytes == o.recvBytes && relaySendBytes == o.relaySendBytes &&
           relayRecvBytes == o.relayRecvBytes && sendTime == o.sendTime && recvTime == o.recvTime;
  }
};

struct RoutePlan {
  RouteParams params;
  std::vector<Transfer> transfers;    // inter-node transfers with bytes > 0, by (src, dst)
  std::vector<int> nicBase;           // by node: index of its NIC 0 in loads
  std::vector<NicLoad> loads;         // by node, then NIC
  std::vector<uint64_t> rankRelayBytes;  // by rank: bytes it relays as a proxy
  std::vector<uint64_t> rankShmBytes;    // by rank: intra-node demand sent + received
  uint64_t interNodeBytes = 0;        // sum of the transfers' bytes
  uint64_t intraNodeBytes = 0;        // demand between ranks of one node
  uint64_t relayedBytes = 0;          // sum over pieces of bytes x relay hops (0..2)
  double maxNicTime = 0;              // seconds
  double shmTime = 0;                 // seconds, see the top of this file
  double cost = 0;                    // maxNicTime + shmTime
  double lowerBound = 0;              // lowerBound() of the same input

  const NicLoad& load(int node, int nic) const { return loads[(size_t)(nicBase[node] + nic)]; }
  bool operator==(const RoutePlan& o) const;
};

// Plans the demand. zpInvalidArgument, with the reason in *why, for a bad
// topology (inconsistent sizes, ranks without a NIC that must send or receive
// across nodes), bad params, a rank out of range, a duplicate (src, dst) in a
// sparse demand, a matrix that is not nranks x nranks, byte totals beyond
// 2^62, or a transfer with no path (off mode, or direct, on a rail node a
// does not have and no usable rail in common). On error *out is untouched.
zpResult_t planRoutes(const ClusterTopology& topo, const std::vector<TransferDemand>& demand,
                      const RouteParams& params, RoutePlan* out, std::string* why = nullptr);
zpResult_t planRoutes(const ClusterTopology& topo, const std::vector<std::vector<uint64_t>>& bytes,
                      const RouteParams& params, RoutePlan* out, std::string* why = nullptr);

// The lower bound above (seconds); -1 if planRoutes would reject the input.
double lowerBound(const ClusterTopology& topo, const std::vector<TransferDemand>& demand,
                  const RouteParams& params);
double lowerBound(const ClusterTopology& topo, const std::vector<std::vector<uint64_t>>& bytes,
                  const RouteParams& params);

// The pieces of one point-to-point transfer src -> dst (on different nodes),
// decided from queuedBytes alone: the bytes waiting on each NIC of src's node
// (by NIC index; missing entries count as 0). zpInvalidArgument for bad
// ranks, ranks on one node, bytes == 0, bad params or no path.
zpResult_t pickPath(const ClusterTopology& topo, int src, int dst, uint64_t bytes,
                    const std::vector<uint64_t>& queuedBytes, const RouteParams& params,
                    std::vector<Piece>* out, std::string* why = nullptr);

// Human-readable, several lines each ending in '\n': a summary (mode, bytes,
// max NIC time against the bound, relayed bytes, cost), every NIC's loads,
// and the pieces of the first maxTransfers transfers.
std::string describe(const RoutePlan& plan, size_t maxTransfers = 16);

}  // namespace zp
