// Receives from any source (ZP_ANY_SOURCE, zpRecvFrom) checked on every
// rank, shared by the shared-memory suite (any_source_test.cc) and the rank
// of the multinode tests (multinode_rank.cc, mode "anysource"), so that one
// scenario runs on one node and across nodes with routing off and on:
//   - blocking wildcards take every rank's messages, each sender's in the
//     order sent, with the sender reported; receives naming a rank then
//     take what is left of it, in order;
//   - in groups: a ring of sends and wildcards with a send to self (one
//     wildcard takes the predecessor's message, the other its own); a
//     receive naming a rank, called before wildcards, takes its first
//     message; called after a wildcard, it waits for the wildcard to take
//     the first (call order, as MPI's posting order);
//   - a collective's message that comes while a wildcard waits is not taken;
//   - a wildcard of another count fails with zpInvalidUsage and writes
//     nothing, and the next one works; a wildcard send or one with a
//     stream is refused at once.
// Every byte of every message is checked (pattern of seed, source and
// index), receive buffers are poisoned and guarded. Every rank makes every
// call whatever it found, so that a failed check ends the run instead of
// leaving peers waiting.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "tests/checks.h"

namespace zptest {

namespace anysource {

// The pattern's seed of message k from src in one part of the scenario.
inline uint64_t msgSeed(uint64_t seed, int part, int src, int k) {
  return (seed ^ (uint64_t)part * 0x9E3779B97F4A7C15ull ^ (uint64_t)src << 40 ^ (uint64_t)k << 20) * 0xff51afd7ed558ccdull;
}

struct State {
  zpComm_t comm;
  int rank, n;
  uint64_t seed;
  std::string err;
  void note(const std::string& e) {
    if (err.empty() && !e.empty()) err = "rank " + std::to_string(rank) + ": " + e;
  }
  void ok(zpResult_t r, const std::string& what) {
    if (r != zpSuccess) note(what + ": " + zpGetErrorString(r) + ": " + zpGetLastError(comm));
  }
};

inline void sendMsg(State& s, int part, int to, int k, size_t bytes) {
  GuardedBuffer b(bytes, (size_t)(k % 7));
  b.fill(msgSeed(s.seed, part, s.rank, k), s.rank, to);
  s.ok(zpSend(bytes ? b.data() : nullptr, bytes, zpUint8, to, s.comm, nullptr), "send");
}

// That buffer b holds src's message k of this part, and nothing around it.
inline void checkMsg(State& s, const GuardedBuffer& b, int part, int src, int k, const std::string& what) {
  if (size_t w = b.wrongBytes(msgSeed(s.seed, part, src, k), src, s.rank))
    s.note(what + ": " + std::to_string(w) + " of " + std::to_string(b.size()) + " bytes are not rank " +
           std::to_string(src) + "'s message " + std::to_string(k));
  if (b.guardBytesWritten()) s.note(what + ": bytes around the receive buffer were written");
}

// Blocking calls: each rank but rcv sends k+1 messages; rcv takes (n-1)*k
// of them from any source, then what is left of each rank by name.
inline void blocking(State& s, int part, int rcv, int k, size_t bytes) {
  if (s.rank != rcv) {
    for (int i = 0; i <= k; i++) sendMsg(s, part, rcv, i, bytes);
    return;
  }
  std::vector<int> got(s.n, 0);
  for (int i = 0; i < (s.n - 1) * k; i++) {
    GuardedBuffer b(bytes, (size_t)(i % 5));
    int src = -7;
    s.ok(zpRecvFrom(bytes ? b.data() : nullptr, bytes, zpUint8, ZP_ANY_SOURCE, &src, s.comm, nullptr), "recv from any");
    if (src < 0 || src >= s.n || src == rcv || got[src] > k) {
      s.note("a receive from any source reported source " + std::to_string(src));
      continue;
    }
    checkMsg(s, b, part, src, got[src]++, "a receive from any source (" + std::to_string(bytes) + " bytes)");
  }
  for (int p = 0; p < s.n; p++)
    for (; p != rcv && got[p] <= k; got[p]++) {
      GuardedBuffer b(bytes, 3);
      s.ok(zpRecv(bytes ? b.data() : nullptr, bytes, zpUint8, p, s.comm, nullptr), "recv naming the rank");
      checkMsg(s, b, part, p, got[p], "a receive naming rank " + std::to_string(p) + " after receives from any source");
    }
}

// Grouped, every message of `bytes`, three groups (a barrier after each,
// so that no message of one is taken by a wildcard of another):
//   ring: a send to the next rank, a wildcard, a send to self, a second
//     wildcard: one takes the previous rank's message, the other its own;
//   rcv takes two messages from every rank with a receive naming rank
//     `named`, called first, then wildcards: the named one takes that
//     rank's first message; per source, the wildcards in call order get
//     the rest in the order sent;
//   only `named` sends rcv two messages; rcv calls a wildcard, then a
//     receive naming `named`: the wildcard, called first, takes the first.
inline void grouped(State& s, int part, int rcv, size_t bytes) {
  const int next = (s.rank + 1) % s.n, prev = (s.rank + s.n - 1) % s.n;
  const int named = (rcv + 1) % s.n;
  const std::string size = " (" + std::to_string(bytes) + " bytes)";
  std::vector<std::unique_ptr<GuardedBuffer>> out, in;
  std::vector<int> src(4 * s.n, -7);
  auto send = [&](int to, int k) {
    out.emplace_back(new GuardedBuffer(bytes, (size_t)k % 7));
    out.back()->fill(msgSeed(s.seed, part, s.rank, k), s.rank, to);
    s.ok(zpSend(out.back()->data(), bytes, zpUint8, to, s.comm, nullptr), "grouped send");
  };
  auto recvAny = [&] {
    in.emplace_back(new GuardedBuffer(bytes, in.size() % 5));
    s.ok(zpRecvFrom(in.back()->data(), bytes, zpUint8, ZP_ANY_SOURCE, &src[in.size() - 1], s.comm, nullptr),
         "grouped recv from any");
  };
  auto barrier = [&] { s.ok(zpBarrier(s.comm, nullptr), "barrier"); };
  // Per source, that the wildcards in[from..] got its messages `expect` in order.
  auto checkWild = [&](size_t from, std::vector<std::vector<int>> expect, const std::string& what) {
    std::vector<size_t> at(s.n, 0);
    for (size_t i = from; i < in.size(); i++) {
      const int p = src[i];
      if (p < 0 || p >= s.n || at[p] >= expect[p].size()) {
        s.note(what + ": a wildcard reported source " + std::to_string(p) + size);
        continue;
      }
      checkMsg(s, *in[i], part, p, expect[p][at[p]++], what + size);
    }
  };

  s.ok(zpGroupStart(), "zpGroupStart");
  send(next, 0);
  recvAny();
  send(s.rank, 1);
  recvAny();
  s.ok(zpGroupEnd(), "zpGroupEnd of a ring with receives from any source");
  std::vector<std::vector<int>> ring(s.n);
  ring[prev].push_back(0);
  ring[s.rank].push_back(1);
  checkWild(0, ring, "a ring of sends and receives from any source, with a send to self");
  barrier();

  in.clear();
  GuardedBuffer first(bytes, 1);
  s.ok(zpGroupStart(), "zpGroupStart");
  if (s.rank == rcv) {
    s.ok(zpRecv(first.data(), bytes, zpUint8, named, s.comm, nullptr), "grouped recv naming");
    while (in.size() < 2 * (size_t)(s.n - 1) - 1) recvAny();
  } else {
    send(rcv, 2);
    send(rcv, 3);
  }
  s.ok(zpGroupEnd(), "zpGroupEnd of a named receive then receives from any source");
  if (s.rank == rcv) {
    checkMsg(s, first, part, named, 2, "a receive naming its rank, called before wildcards in a group" + size);
    std::vector<std::vector<int>> rest(s.n, std::vector<int>{2, 3});
    rest[rcv].clear();
    rest[named] = {3};
    checkWild(0, rest, "wildcards after a named receive in a group");
  }
  barrier();

  in.clear();
  s.ok(zpGroupStart(), "zpGroupStart");
  if (s.rank == rcv) {
    recvAny();
    s.ok(zpRecv(first.data(), bytes, zpUint8, named, s.comm, nullptr), "grouped recv naming after a wildcard");
  } else if (s.rank == named) {
    send(rcv, 4);
    send(rcv, 5);
  }
  s.ok(zpGroupEnd(), "zpGroupEnd of a wildcard then a named receive");
  if (s.rank == rcv) {
    std::vector<std::vector<int>> firstOne(s.n);
    firstOne[named] = {4};
    checkWild(0, firstOne, "a wildcard called before a named receive");
    checkMsg(s, first, part, named, 5, "a receive naming its rank, called after a wildcard" + size);
  }
  barrier();
}

// Rank 0 waits in a wildcard while every rank but 1 calls an all-reduce
// (their messages to rank 0 come first); rank 1 sends after a while. The
// wildcard takes rank 1's message, then rank 0's all-reduce runs.
inline void besideCollective(State& s, int part) {
  GuardedBuffer b(64, 1);
  if (s.rank == 0) {
    int src = -7;
    s.ok(zpRecvFrom(b.data(), 64, zpUint8, ZP_ANY_SOURCE, &src, s.comm, nullptr), "recv from any beside a collective");
    if (src != 1) s.note("a receive from any source beside an all-reduce reported " + std::to_string(src));
    else checkMsg(s, b, part, 1, 0, "a receive from any source beside an all-reduce");
  } else if (s.rank == 1) {
    usleep(300 * 1000);
    sendMsg(s, part, 0, 0, 64);
  }
  int64_t v = s.rank + 1, sum = 0;
  s.ok(zpAllReduce(&v, &sum, 1, zpInt64, zpSum, s.comm, nullptr), "all-reduce after a receive from any source");
  if (sum != (int64_t)s.n * (s.n + 1) / 2) s.note("the all-reduce beside a receive from any source summed " + std::to_string(sum));
}

// Rank 1 sends 100 bytes, rank 0 takes them from any source into 99: that
// fails and writes nothing; 100 more then arrive whole.
inline void mismatch(State& s, int part) {
  if (s.rank == 1) {
    GuardedBuffer b(100, 1);
    b.fill(msgSeed(s.seed, part, 1, 0), 1, 0);
    zpSend(b.data(), 100, zpUint8, 0, s.comm, nullptr);  // its outcome is not promised: the receiver's is
    sendMsg(s, part, 0, 1, 100);
  }
  if (s.rank != 0) return;
  GuardedBuffer shortBuf(99, 2);
  int src = -7;
  const zpResult_t r = zpRecvFrom(shortBuf.data(), 99, zpUint8, ZP_ANY_SOURCE, &src, s.comm, nullptr);
  if (r != zpInvalidUsage) s.note(std::string("a receive from any source of the wrong count returned ") + zpGetErrorString(r));
  if (shortBuf.writtenBytes() || shortBuf.guardBytesWritten())
    s.note("a refused receive from any source wrote " + std::to_string(shortBuf.writtenBytes()) + " bytes");
  GuardedBuffer b(100, 4);
  s.ok(zpRecvFrom(b.data(), 100, zpUint8, ZP_ANY_SOURCE, &src, s.comm, nullptr), "recv from any after a refused one");
  if (src != 1) s.note("after a refused receive, a receive from any source reported " + std::to_string(src));
  checkMsg(s, b, part, 1, 1, "a receive from any source after a refused one");
}

// Refused at once, without a peer: a send to ZP_ANY_SOURCE, a wildcard on a stream.
inline void refusedLocally(State& s) {
  char byte = 0;
  if (zpSend(&byte, 1, zpUint8, ZP_ANY_SOURCE, s.comm, nullptr) != zpInvalidArgument)
    s.note("a send to ZP_ANY_SOURCE was not refused");
  int src = -7;
  const zpResult_t r = zpRecvFrom(&byte, 1, zpUint8, ZP_ANY_SOURCE, &src, s.comm, (zpStream_t)0x1);
  if (r != zpInvalidArgument || !strstr(zpGetLastError(s.comm), "any source"))
    s.note(std::string("a receive from any source on a stream: ") + zpGetErrorString(r) + ": " + zpGetLastError(s.comm));
}

}  // namespace anysource

// The whole scenario (n >= 2); "" when every check passed.
inline std::string anySourceErrors(zpComm_t comm, int rank, int n, uint64_t seed) {
  anysource::State s{comm, rank, n, seed, {}};
  anysource::refusedLocally(s);
  // Sizes: empty, tiny, odd, past the eager size (single copy on one node,
  // rendezvous over UCX, several relay chunks).
  const size_t sizes[] = {0, 1, 4097, 40000, 300001};
  int part = 0;
  for (size_t bytes : sizes) {
    anysource::blocking(s, part, part % n, 3, bytes);
    // The next part's messages (of another size) must not meet this part's wildcards.
    s.ok(zpBarrier(comm, nullptr), "barrier");
    part++;
  }
  for (size_t bytes : {(size_t)8, (size_t)40000, (size_t)300001}) {
    anysource::grouped(s, part, part % n, bytes);
    part++;
  }
  if (n >= 3) anysource::besideCollective(s, part++);
  s.ok(zpBarrier(comm, nullptr), "barrier");
  anysource::mismatch(s, part++);
  return s.err;
}

}  // namespace zptest
