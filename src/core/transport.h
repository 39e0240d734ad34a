// What the executor needs from a transport. Each peer of a communicator is
// reached through exactly one transport (shared memory on the node, the
// network across nodes); the executor posts a peer's Ops to it and drives
// every transport's progress until the Ops are done.
#pragma once

#include <string>
#include <vector>

#include "include/zeppelin.h"

namespace zp {

struct Op;

class Transport {
 public:
  virtual ~Transport() = default;
  // Queues an op; ops with one peer complete in the order posted per direction.
  virtual void post(Op* op) = 0;
  // A small control message (a collective's outcome); delivered through Comm::onStatus.
  virtual void sendStatus(int peer, uint64_t collSeq, zpResult_t status, const std::string& text) = 0;
  // Non-blocking; true if anything moved.
  virtual bool progress() = 0;
  // True while ops are posted and not finished.
  virtual bool busy() const = 0;
  // Fails and forgets every posted op (the communicator is broken).
  virtual void dropOps(zpResult_t status, const std::string& why) = 0;
  // Tells every peer that this communicator is broken (why, with the code
  // they should return); they fail everything pending and to come.
  virtual void abortPeers(zpResult_t code, const std::string& why) = 0;
  // Says goodbye to every peer: operations with this rank fail from now on,
  // once what it already sent has been received.
  virtual void leave() = 0;
  // Peers with unfinished ops, for timeout messages.
  virtual std::vector<int> busyPeers() const = 0;
  // Notices peers that died.
  virtual void checkAlive() = 0;
  // How this transport reaches a peer, for logs ("SHM/CMA", "UCX/tcp zpnic0").
  virtual std::string describe(int peer) const = 0;
};

}  // namespace zp
