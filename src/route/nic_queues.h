// The node's NIC queues: the bytes each rank of a node has handed to its NIC
// and not yet sent, which a rank picking a path for a point-to-point
// transfer reads to spread it over the node's NICs (pickPath). Each rank
// keeps its own count in the shared-memory carrier's word
// (CarrierTransport::sharedWord), where the node's ranks read it; the
// carrier knows nothing of what it counts. The relay keeps it up to date
// through Routing::addQueued. Runs under the communicator's lock.
#pragma once

#include <cstdint>
#include <vector>

#include "src/core/transport.h"

namespace zp {

// The carrier's shared word that holds a rank's queued bytes (the rail
// counters take the next ones: routing_state.cc).
constexpr int kNicQueueWord = 0;

class NicQueues {
 public:
  // local: the node's carrier (null: no count kept); rails[r], nodeOf[r]:
  // rank r's rail and node; node: this rank's. All outlive it.
  NicQueues(CarrierTransport* local, const std::vector<int>& rails, const std::vector<int>& nodeOf, int node)
      : local_(local), rails_(rails), nodeOf_(nodeOf), node_(node) {}
  // This rank queued (bytes > 0) or sent (bytes < 0) that many bytes.
  void add(int64_t bytes) {
    if (local_) local_->addSharedWord(kNicQueueWord, bytes);
  }
  // byRail[rail] += the bytes the node's ranks of that rail have queued.
  void addTo(std::vector<uint64_t>* byRail) const {
    if (!local_) return;
    for (size_t r = 0; r < rails_.size(); r++)
      if (nodeOf_[r] == node_) {
        if (byRail->size() <= (size_t)rails_[r]) byRail->resize(rails_[r] + 1, 0);
        (*byRail)[rails_[r]] += local_->sharedWord((int)r, kNicQueueWord);
      }
  }

 private:
  CarrierTransport* local_;
  const std::vector<int>& rails_;
  const std::vector<int>& nodeOf_;
  int node_;
};

}  // namespace zp
