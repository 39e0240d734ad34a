// The seam between the relay (transport/relay) and the routing layer
// (src/route) that decides its paths. Core declares it so that neither side
// includes the other: the routing layer implements Routing, the communicator
// holds it (Comm::routing), the relay and the collectives use it.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "include/zeppelin.h"

namespace zp {

// One piece of a routed transfer: a byte range and the proxies that carry it
// across the network (a proxy equal to the transfer's end: no relay hop there).
struct Piece {
  uint64_t offset = 0, bytes = 0;  // within the transfer
  int srcProxy = -1;               // global rank on the source node that sends it
  int sendNic = -1;                // NIC index on the source node
  int dstProxy = -1;               // global rank on the destination node that receives it
  int recvNic = -1;                // NIC index on the destination node

  bool operator==(const Piece& o) const {
    return offset == o.offset && bytes == o.bytes && srcProxy == o.srcProxy && sendNic == o.sendNic &&
           dstProxy == o.dstProxy && recvNic == o.recvNic;
  }
};

// One chunk of a routed transfer's schedule (src/route/route_schedule.h):
// bytes [offset, offset + bytes) of the transfer go from its source to
// srcProxy (the dispatch hop, none if srcProxy is the source), over the
// network to dstProxy, and on to the destination (the combine hop, none if
// dstProxy is the destination). Chunk k of every piece is in round k: an
// executor that pipelines hops runs round k's dispatch beside round k-1's
// network hop and round k-2's combine. The host relay and the device routed
// alltoallv both execute schedules of these.
struct RouteChunk {
  uint64_t offset = 0, bytes = 0;  // within the transfer; bytes <= the chunk size
  int srcProxy = -1, dstProxy = -1;
  int round = 0;

  bool direct(int src, int dst) const { return srcProxy == src && dstProxy == dst; }
  bool operator==(const RouteChunk& o) const {
    return offset == o.offset && bytes == o.bytes && srcProxy == o.srcProxy && dstProxy == o.dstProxy &&
           round == o.round;
  }
};

// A collective's transfer as the router scheduled it: its id among the
// transfers of its (source, destination, kind), and its chunks in the order
// they go (null: the relay picks a path from the NICs' queues, as for
// point-to-point calls). Carried by Op::routed.
struct RoutedXfer {
  uint64_t id = 0;
  const std::vector<RouteChunk>* chunks = nullptr;
};

// One inter-node transfer of a call as the router planned it (plain data:
// src/route/router.h's RoutePlan holds them).
struct Transfer {
  int src = -1, dst = -1;          // global ranks
  int srcNode = -1, dstNode = -1;
  uint64_t bytes = 0;
  // On the direct path because of the mode, its size (directBelow) or a
  // missing rail. (A routed transfer may also need no relay, e.g. in rail
  // mode when s owns d's rail; it is not marked direct.)
  bool direct = false;
  std::vector<Piece> pieces;       // by offset, covering [0, bytes) once
  // The pieces as a schedule of chunks (filled by the routing layer for the
  // plans it executes; the router's own plans leave it empty).
  std::vector<RouteChunk> chunks;

  bool operator==(const Transfer& o) const {
    return src == o.src && dst == o.dst && srcNode == o.srcNode && dstNode == o.dstNode &&
           bytes == o.bytes && direct == o.direct && pieces == o.pieces && chunks == o.chunks;
  }
};

// One rank's measurement of the rails between its node and another
// (src/route/rail_rates.h), carried in relay headers: rail k's rate relative
// to the fastest rail's is scale[k] / 255 (0: not measured), the fastest's
// rate topKbps kbit/s (0: no view), and bit k of slowMask is the measuring
// rank's verdict that rail k is slow.
struct RailView {
  static constexpr int kRails = 8;
  uint8_t scale[kRails] = {};
  uint32_t topKbps = 0;
  uint8_t slowMask = 0;
  bool empty() const { return topKbps == 0; }
};

// One rail of this rank's node as measured (zpCommGetRailReport).
struct RailStatus {
  int rail = -1;
  std::string nic;           // its NIC's name on this node
  double nominalBitsPerSec = 0;
  double bitsPerSec = 0;     // measured (0: no evidence yet)
  bool slow = false;         // routed around
  int changes = 0;           // state changes so far
};

// A NIC found down: its node, its rail (index among the node's NICs), its name.
struct NicDown {
  int node, rail;
  std::string name;
};

// The routing state of one communicator: the routing setting, NIC health
// and the router's last plan. Everything runs under the communicator's lock.
class Routing {
 public:
  virtual ~Routing() = default;
  // Bytes of a relayed chunk (the router's chunkBytes).
  virtual uint64_t chunkBytes() const = 0;
  // Every rank's rail: the index of its NIC among its node's.
  virtual const std::vector<int>& rails() const = 0;
  // The one answer to "is routing on, and above what size?": transfers
  // between nodes of fewer bytes go direct (ZP_ROUTE_DIRECT_BELOW), larger
  // ones may be relayed. A communicator without a Routing (Comm::routing()
  // null: routing off, one node, or one rail) relays nothing.
  virtual uint64_t directBelow() const = 0;

  // NIC health. Whether the network path between this rank and peer works
  // (no NIC it depends on is down); the same between ranks a and b.
  virtual bool directAlive(int peer) const = 0;
  virtual bool pathUp(int a, int b) const = 0;
  // Rank r lacks a direct path to some rank of another node: its traffic
  // with that rank needs proxies (those of its node stay for it when they
  // come to destroy the communicator, and pickPath keeps them).
  virtual bool reliesOnProxies(int r) const = 0;
  // True if every NIC of the node is down.
  virtual bool nodeCut(int node) const = 0;
  // Looks at this rank's NIC (every few ms); news of it going down is queued.
  virtual void checkNic() = 0;
  // News from a peer (the text of encodeNicDown); queued.
  virtual void heardNicDown(const std::string& text) = 0;
  // Marks the queued news down and returns the NICs that were up until now;
  // plans made with them are void.
  virtual std::vector<NicDown> applyNicNews() = 0;
  virtual std::string encodeNicDown(const NicDown& nic) const = 0;

  // The node's NIC queues (src/route/nic_queues.h): this rank queued
  // (bytes > 0) or sent (bytes < 0) that many bytes on its NIC.
  virtual void addQueued(int64_t bytes) = 0;
  // Measured rails (src/route/rail_rates.h). A chunk of this rank's sends
  // whose network hop leaves from srcProxy: queued, acknowledged, or taken
  // off its path.
  virtual void chunkQueued(int srcProxy, uint64_t bytes) = 0;
  virtual void chunkAcked(int srcProxy, uint64_t bytes) = 0;
  virtual void chunkDropped(int srcProxy, uint64_t bytes) = 0;
  // This node's view of its rails, for the headers of this rank's sends;
  // the view in the header of a chunk from src to dst (its source node's).
  virtual RailView railView() const = 0;
  virtual void heardRailView(int src, int dst, const RailView& view) = 0;
  // Reads the node's rail counters, logs rails that turned slow or
  // recovered, and returns the messages (peer, text) that tell the other
  // nodes of a changed verdict; the relay sends them as kRailView control
  // messages, and the peer passes them to heardRailNews.
  virtual std::vector<std::pair<int, std::string>> tickRails() = 0;
  virtual void heardRailNews(int from, const std::string& text) = 0;
  // This rank's verdict on its node's rails, one word for a routed call's
  // count rows (every rank plans with every rank's word).
  virtual uint64_t railReport() const = 0;
  virtual std::vector<RailStatus> railStatus() const = 0;

  // The schedule of a point-to-point transfer src -> dst of `bytes`, from
  // the bytes waiting on each NIC of src's node (the node's NIC queues, plus
  // extraByRail) and the rails' measured rates; false with the reason in
  // *why if there is no path.
  virtual bool pickPath(int src, int dst, uint64_t bytes, const std::vector<uint64_t>& extraByRail,
                        std::vector<RouteChunk>* chunks, std::string* why) = 0;
  // rank came to destroy the communicator: pickPath makes it no proxy from
  // now on (its NIC carries no new chunk unless another rank owns it too),
  // except for a path whose source or destination is a rank of its node
  // that relies on proxies (reliesOnProxies): for that rank it stays.
  virtual void proxyLeft(int rank) = 0;
  // The router's plan for a collective whose inter-node demand is `bytes`
  // ([src][dst]), with the NICs' rates scaled by every rank's railReport
  // (by rank; empty: nominal rates): its transfers, by (src, dst), each
  // with its schedule (Transfer::chunks). `key`
  // identifies the call's shape and reports, and the plan of the last key
  // is kept (plans repeat from call to call). A NIC that goes down voids it.
  virtual zpResult_t plan(const std::vector<uint64_t>& key, const std::vector<std::vector<uint64_t>>& bytes,
                          const std::vector<uint64_t>& railReports, const std::vector<Transfer>** out,
                          std::string* why) = 0;
};

}  // namespace zp
