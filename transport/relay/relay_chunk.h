// What the relay's two source files share (relay.cc: chunks on their way;
// relay_failover.cc: acknowledgements and NIC failure): its constants and a
// chunk in flight. Internal to transport/relay.
#pragma once

#include <cstdint>
#include <memory>

#include "transport/relay/relay.h"

namespace zp {

constexpr uint64_t kRelayMagic = 0x5a5052454c415931ull;
// Staging slots per pool; with 512 KiB chunks, 8 MiB per pool.
constexpr int kSlotsPerPool = 16;
// Chunks of this rank's own sends in flight per first hop.
constexpr int kWindow = 128;
// Finished deliveries remembered per rank, to drop copies sent again.
constexpr size_t kFinishedKept = 4096;
// A relayed control message starts with this byte, so it is never empty.
constexpr char kControlMark = 'C';
enum Pool { kOutbound = 0, kInbound = 1 };

struct Relay::Chunk {
  RelayHeader hdr{};
  Op hdrOp, dataOp;
  char* data = nullptr;           // where its bytes are
  std::unique_ptr<char[]> own;    // an early chunk's bytes at its destination
  int from = -1;                  // the hop it comes from (receiving)
  InRecv* standing = nullptr;     // the shared-memory header receive it came through
  int pool = -1;                  // the pool of its slot, if data is one
  SendXfer* sx = nullptr;         // the routed send it belongs to (at the source)
  int firstHop = -1;              // at the source: where it goes first
  int srcProxy = -1;              // at the source: its path
  bool claimed = false;           // at the destination: received straight into the receive buffer
  bool dup = false;               // at the destination: a copy of bytes already here
  // Waiting for a staging slot, receiving its bytes, sending them on, or
  // dead (its previous hop failed: the communicator is broken).
  enum class State { kWaitingSlot, kReceiving, kSending, kFailed } state = State::kWaitingSlot;
};

// A standing receive of relay headers: from one local peer, or from any
// rank of another node.
struct Relay::InRecv {
  int peer = kAnyRemotePeer;
  RelayHeader hdr{};
  Op op;
  bool posted = false;
  bool blocked = false;  // a chunk from this peer waits for a slot: the lane is held
};

}  // namespace zp
