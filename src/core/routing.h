// The seam between the relay (transport/relay) and the routing layer
// (src/route) that decides its paths. Core declares it so that neither side
// includes the other: the routing layer implements Routing, the communicator
// holds it (Comm::routing), the relay and the collectives use it.
#pragma once

#include <cstdint>
#include <string>
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

// A collective's transfer as the router planned it: its id among the
// transfers of its (source, destination, kind), and its pieces (null: the
// relay picks a path from the NICs' queues, as for point-to-point calls).
// Carried by Op::routed.
struct RoutedXfer {
  uint64_t id = 0;
  const std::vector<Piece>* pieces = nullptr;
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

  bool operator==(const Transfer& o) const {
    return src == o.src && dst == o.dst && srcNode == o.srcNode && dstNode == o.dstNode &&
           bytes == o.bytes && direct == o.direct && pieces == o.pieces;
  }
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
  // The pieces of a point-to-point transfer src -> dst of `bytes`, from the
  // bytes waiting on each NIC of src's node (the node's NIC queues, plus
  // extraByRail); false with the reason in *why if there is no path.
  virtual bool pickPath(int src, int dst, uint64_t bytes, const std::vector<uint64_t>& extraByRail,
                        std::vector<Piece>* pieces, std::string* why) = 0;
  // The router's plan for a collective whose inter-node demand is `bytes`
  // ([src][dst]): its transfers, by (src, dst). `key` identifies the call's
  // shape, and the plan of the last key is kept (plans repeat from call to
  // call). A NIC that goes down voids it.
  virtual zpResult_t plan(const std::vector<uint64_t>& key, const std::vector<std::vector<uint64_t>>& bytes,
                          const std::vector<Transfer>** out, std::string* why) = 0;
};

}  // namespace zp
