// The executor's receives that have no single peer when they are posted:
// receives from any source (ZP_ANY_SOURCE) and sends and receives with this
// same rank. A receive from any source is matched as MPI matches, in call
// order: it takes the next message of the first rank found to have one
// waiting (Transport::arrived), and a receive naming a rank that comes
// after it in the call is held back until it is matched, so that it cannot
// take a message the earlier receive could have. Each rank's messages stay
// in the order sent: a rank is matched only when no receive from it is
// under way. Nothing is posted for a receive until its peer is known, so a
// transport never sees one without a peer.
#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "src/core/comm.h"

namespace zp {

void Comm::postOp(Op* op) {
  op->seq = op->isSend ? sendSeq_[op->peer]++ : recvSeq_[op->peer]++;
  byPeer_[op->peer]->post(op);
}

// Sends and receives with this same rank pair up locally, in call order;
// sends to self left over go to receives from any source, in call order
// (their messages are here: they are in the same call).
void Comm::runSelfOps(std::vector<Op*>& ops) {
  std::vector<Op*> sends, recvs;
  for (Op* op : ops)
    if (op->peer == rank_) (op->isSend ? sends : recvs).push_back(op);
  for (Op* op : ops)
    if (op->peer == kAnySource && recvs.size() < sends.size()) {
      op->peer = rank_;
      if (op->source) *op->source = rank_;
      recvs.push_back(op);
    }
  size_t n = std::min(sends.size(), recvs.size());
  for (size_t i = 0; i < n; i++) {
    Op* s = sends[i];
    Op* r = recvs[i];
    if (s->bytes != r->bytes) {
      std::string why = std::string(opKindName(s->kind)) + ": rank " + std::to_string(rank_) + " sends " +
                        std::to_string(s->bytes / s->typeSize) + " elements to itself but expects " +
                        std::to_string(r->bytes / r->typeSize);
      s->finish(zpInvalidUsage, why);
      r->finish(zpInvalidUsage, why);
      continue;
    }
    if (s->bytes) memmove(r->buf, s->buf, s->bytes);
    s->finish(zpSuccess);
    r->finish(zpSuccess);
  }
  const char* why = "a send to self needs a matching receive from self in the same group (and vice versa)";
  for (size_t i = n; i < sends.size(); i++) sends[i]->finish(zpInvalidUsage, why);
  for (size_t i = n; i < recvs.size(); i++) recvs[i]->finish(zpInvalidUsage, why);
}

bool Comm::holdBehindAnySource(std::vector<Op*>& ops) {
  anyHeld_.assign(ops.size(), 0);
  bool behind = false;
  for (size_t i = 0; i < ops.size(); i++) {
    Op* op = ops[i];
    if (op->done) continue;
    if (op->peer == kAnySource) {
      if (nranks_ == 1)
        op->finish(zpInvalidUsage, "a receive from any source on a communicator of one rank, with no send to "
                                   "itself left in the group: no message can ever match it");
      else
        behind = true;
    } else if (behind && !op->isSend && op->peer >= 0) {
      anyHeld_[i] = 1;
    }
  }
  return behind;
}

bool Comm::matchAnySource(std::vector<Op*>& ops) {
  if (anyHeld_.size() != ops.size()) return false;  // no receive from any source among them
  // Ranks whose next message is spoken for: a receive from them is under way.
  std::vector<char>& taken = anyTaken_;
  taken.assign(nranks_, 0);
  taken[rank_] = 1;
  for (size_t i = 0; i < ops.size(); i++)
    if (!anyHeld_[i] && !ops[i]->isSend && !ops[i]->done && ops[i]->peer >= 0) taken[ops[i]->peer] = 1;
  bool posted = false, left = false;
  for (size_t i = 0; i < ops.size() && !left; i++) {
    Op* op = ops[i];
    if (anyHeld_[i]) {  // every receive from any source before it is matched
      anyHeld_[i] = 0;
      taken[op->peer] = 1;
      postOp(op);
      posted = true;
      continue;
    }
    if (op->peer != kAnySource || op->done) continue;
    // The search starts after the rank matched last, so that ranks whose
    // messages keep coming take turns.
    int found = -1;
    size_t bytes = 0;
    for (int k = 0; k < nranks_ && found < 0; k++) {
      const int p = (anyNext_ + k) % nranks_;
      if (!taken[p] && byPeer_[p]->arrived(p, recvSeq_[p], &bytes)) found = p;
    }
    if (found < 0) {  // nothing has come: this one and everything after it wait
      left = true;
      break;
    }
    anyNext_ = (found + 1) % nranks_;
    taken[found] = 1;
    op->peer = found;
    if (op->source) *op->source = found;
    postOp(op);
    posted = true;
  }
  if (posted) progress();  // a message that is here already moves now, not after a wait
  return left;
}

void Comm::failUnposted(std::vector<Op*>& ops, zpResult_t status) {
  for (size_t i = 0; i < ops.size(); i++)
    if (!ops[i]->done && (ops[i]->peer == kAnySource || (i < anyHeld_.size() && anyHeld_[i]))) {
      ops[i]->finish(status, "not run: another operation of the call failed");
      if (i < anyHeld_.size()) anyHeld_[i] = 0;
    }
}

}  // namespace zp
