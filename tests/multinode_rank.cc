// zp_multinode_rank: one rank of a job that zprun runs on an emulated
// cluster (zprun --nodes ...). ZP_TEST_MODE picks what it does:
//   check    (default) alltoallv with random counts and grouped send/recv to
//            partners on this and other nodes, every byte checked;
//   late     messages sent just before their sender leaves, received
//            after its connection closed (lateMode);
//   kill     rank ZP_TEST_VICTIM kills itself in the middle of a loop of
//            alltoallv calls; every other rank must get zpRemoteError;
//   foreign  before init, the last rank connects to the rendezvous port from
//            its node and sends garbage, a wrong secret, and nothing; the
//            communicator must still form and work;
//   idle     rank 0 sends 8 MiB to the first rank of node 1 with zpSend /
//            zpRecv while every other rank sleeps outside the library for
//            5 s: the routed chunks must go through their proxy threads (the
//            pair must finish before the sleepers wake, the bytes must be
//            right, and node 1's NICs other than the receiver's must have
//            received some of them).
//   nicdown  rank 0 sends ZP_TEST_BYTES (default 256 MiB) to the first rank
//            of node 1 with zpSend / zpRecv; ZP_TEST_DOWN_MS after it starts,
//            rank 0 downs NIC ZP_TEST_DOWN_NIC of its node (default the last;
//            `ip link set ... down`, as a failing NIC would). Every byte must
//            arrive, the NIC must have gone down before the send finished,
//            and the communicator must still work (an alltoallv, every byte
//            checked) and close cleanly. Rank 0 prints the bandwidth after
//            the failure as a share of the other NICs' rate.
//   nicdownleave  node 0's last NIC down, its rank exchanges with a rank of
//            node 1 while the others destroy the communicator
//            (nicDownLeaveMode).
//   rails    a routed send/recv pair, round after round, and the rails'
//            report at the end (railsMode);
//   skew     zipf-skewed zpAlltoallvs back to back, the rails' and the
//            wait report at the end (skewMode);
//   slices   the hierarchical all-reduce cut into many pipeline slices
//            (with ZP_COLL_RING_ABOVE=0 ZP_COLL_SLICE=...): odd counts up to
//            ZP_TEST_MAX_COUNT, in place and out of place, every element and
//            guard checked;
//   zero     ZeRO's collectives, all-gather(v) and reduce-scatter(v), on
//            the hierarchical path (run with ZP_COLL_RING_ABOVE=0, so that
//            every count takes it): counts 0, 1, primes, random and a few
//            MiB per rank; reduce-scatter(v) in every type, the ops in turn;
//            in place and out of place; outputs poisoned, every element,
//            gap and guard checked (ZP_TEST_ROUNDS cases of each call,
//            20 by default: every type twice; the MiB ones unless
//            ZP_TEST_MAX_COUNT is below). Ten cases again on a child whose
//            ranks take the nodes in turn (no node's ranks contiguous), and
//            on a child without the last rank (nodes of different sizes:
//            the flat rings). With
//            ZP_ROUTING=off, or on with the default ZP_ROUTE_DIRECT_BELOW,
//            the cross-node bytes of a 4 MiB-per-rank all-gather and
//            reduce-scatter must be spread evenly over each node's NICs
//            (every NIC 0.9-1.25 of its share);
//   remap    remaps between random layouts of a random batch (forward and
//            inverse, every byte checked), the cross-node part through the router;
//   attention  the ring-attention driver forward and backward against a
//            float64 reference (tests/attention_check.h): random rings, the
//            planner's plans for this cluster, one ring of all ranks;
//            causal and not; GQA and not;
//   killcoll a 64 MiB all-reduce across nodes (the hierarchical one) in
//            which rank ZP_TEST_VICTIM dies at ZP_TEST_KILL_AT: "before" (it
//            never makes the call: it dies 300 ms after a barrier), "node"
//            (2 ms into it: the node's reduce-scatter of the first slices)
//            or "rail" (once its own shard has been reduced in the node: the
//            ring over the NICs under way); a thread of
//            the victim watches its output and raises SIGKILL. Every other
//            rank must return zpRemoteError within ZP_TIMEOUT, or finish
//            with every element right (possible only for a rank whose part
//            was done when the victim died), write nothing outside its
//            buffers, and abort or destroy its communicator;
//   anysource  receives from any source (tests/any_source_check.h)
//   earlybye ranks that finish early leave while others run routed traffic
//            (earlyByeMode)
//   refusal  rank 1 refuses its arguments in collectives and alltoallv that
//            the others call validly (refusalMode);
//   alldown  as nicdown, but rank 0 downs every NIC of its node: no path is
//            left, and every rank must get an error (not hang) within
//            ZP_TIMEOUT, from the transfer or from an alltoallv after it.
//   device   (zp_multinode_rank_double: built against the CUDA/NCCL test
//            double, whose NCCL ranks meet on socket files, so across
//            network namespaces) device buffers across nodes: alltoallv with
//            random counts, every byte checked, and the attention driver on
//            device buffers against the host driver on rings that span nodes
//            (tests/device_checks.h), in float32 and bfloat16.
//   devroute (zp_multinode_rank_double) routed alltoallv on device buffers
//            with the run's ZP_ROUTING (off, rail or balanced): random
//            counts with zeros, every byte checked; one
//            transfer from rank 0 to node 1's second rank (its first with
//            one rank per node), where the double's byte counters must show
//            who carried it across nodes (off: rank 0 alone; rail: the owner
//            of the destination's rail; balanced: several ranks of node 0),
//            and no call may wait for the device; calls on three
//            streams back to back (they share the staging: ordered by
//            events); the call captured in a CUDA graph and launched twice
//            with fresh inputs; and
//            mismatched counts, an error on every rank with nothing written.
//   devslow  (zp_multinode_rank_double; 2 nodes x 4 ranks x 4 NICs, one NIC
//            of rail ZP_TEST_SLOW_RAIL slow) host sends until every rank's
//            rail report names that rail slow, then a routed device transfer
//            whose slow-rail proxy must carry under a quarter of the other
//            proxies' mean, and a random routed device alltoallv, every byte
//            checked.
// Prints one line per rank and exits 0 when its part went as expected and,
// its communicator destroyed, no UCX request of it is left in the process.
#include <arpa/inet.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <cstdlib>
#include <string>
#include <random>
#include <thread>

#include "src/core/bootstrap.h"
#include "transport/ucx/ucx_transport.h"
#include "tests/any_source_check.h"
#include "tests/attention_check.h"
#include "tests/checks.h"
#include "tests/reduce_reference.h"
#ifdef ZP_TEST_DOUBLE
#include <nccl.h>

#include "tests/device_checks.h"
#endif

namespace {

int envInt(const char* name, int dflt) {
  const char* v = getenv(name);
  return v ? atoi(v) : dflt;
}

// Grouped exchange with the ranks `shift` away, random sizes; "" if all bytes are right.
std::string sendRecvError(zpComm_t comm, int rank, int n, int shift, uint64_t seed) {
  int to = (rank + shift) % n, from = (rank - shift + n) % n;
  std::mt19937_64 sizes(seed);
  size_t sizeTo = 0, sizeFrom = 0;
  for (int r = 0; r < n; r++) {  // every rank draws the sizes of all pairs alike
    size_t s = sizes() % 5 == 0 ? 0 : sizes() % (3u << 20);  // empty transfers too
    if (r == rank) sizeTo = s;
    if (r == from) sizeFrom = s;
  }
  zptest::GuardedBuffer send(sizeTo, 1), recv(sizeFrom, 3);
  send.fill(seed, rank, to);
  zpGroupStart();
  zpSend(send.data(), sizeTo, zpUint8, to, comm, nullptr);
  zpRecv(recv.data(), sizeFrom, zpUint8, from, comm, nullptr);
  zpResult_t r = zpGroupEnd();
  if (r != zpSuccess) return std::string("send/recv: ") + zpGetErrorString(r) + ": " + zpGetLastError(comm);
  if (size_t w = recv.wrongBytes(seed, from, rank)) return "send/recv: " + std::to_string(w) + " wrong bytes";
  if (size_t g = recv.guardBytesWritten()) return "send/recv: " + std::to_string(g) + " guard bytes written";
  return "";
}

// The end of a mode: err (empty if all went right) printed and the
// communicator aborted, else destroyed and "ok" printed; the exit code.
int finishMode(zpComm_t comm, int rank, int n, const std::string& err) {
  if (!err.empty()) {
    fprintf(stderr, "rank %d: %s\n", rank, err.c_str());
    zpCommAbort(comm);
    return 1;
  }
  if (zpCommDestroy(comm) != zpSuccess) {
    fprintf(stderr, "rank %d: zpCommDestroy failed: %s\n", rank, zpGetLastError(nullptr));
    return 1;
  }
  printf("rank %d of %d: ok\n", rank, n);
  return 0;
}

// ZP_TEST_MODE=refusal: rank 1 refuses its own arguments (overlapping
// buffers) in an all-reduce, small and large, and in an alltoallv, while
// every other rank makes the valid call: rank 1 must return
// zpInvalidArgument, every other rank zpInvalidUsage naming "rank 1
// refused" and the reason, and the next call (an all-reduce of known
// values) must give the right sum everywhere.
int refusalMode(zpComm_t comm, int rank, int n, uint64_t) {
  std::string err;
  auto expect = [&](const char* what, zpResult_t r, const char* fn) {
    const std::string msg = zpGetLastError(comm);
    if (rank == 1 && (r != zpInvalidArgument || msg.find("overlap") == std::string::npos))
      err = std::string(what) + ": the refusing rank returned " + zpGetErrorString(r) + ": " + msg;
    if (rank != 1 && (r != zpInvalidUsage || msg.find(std::string("rank 1 refused ") + fn + ": ") == std::string::npos ||
                      msg.find("overlap") == std::string::npos))
      err = std::string(what) + ": returned " + zpGetErrorString(r) + ": " + msg;
    std::vector<float> x(100, float(rank + 1)), sum(100, 0.0f);
    if (err.empty() && zpAllReduce(x.data(), sum.data(), 100, zpFloat32, zpSum, comm, nullptr) != zpSuccess)
      err = std::string(what) + ": the next call failed: " + zpGetLastError(comm);
    else if (err.empty() && sum[99] != float(n * (n + 1) / 2))
      err = std::string(what) + ": the next call's sum is " + std::to_string(sum[99]);
  };
  for (size_t count : {(size_t)16, (size_t)300000}) {
    std::vector<float> send(count, 1.0f), recv(count + 1, 0.0f);
    zpResult_t r = zpAllReduce(rank == 1 ? recv.data() + 1 : send.data(), recv.data(), count, zpFloat32, zpSum, comm,
                               nullptr);
    expect(count == 16 ? "small all-reduce" : "large all-reduce", r, "zpAllReduce");
  }
  for (size_t count : {(size_t)4, (size_t)100000}) {
    std::vector<size_t> sc(n, count), sd(n), rc(n, count), rd(n);
    for (int p = 0; p < n; p++) sd[p] = rd[p] = (size_t)p * count;
    if (rank == 1) rd[1] = rd[0];  // two receive ranges overlap
    std::vector<float> send(count * n, 1.0f), recv(count * n, 0.0f);
    zpResult_t r =
        zpAlltoallv(send.data(), sc.data(), sd.data(), recv.data(), rc.data(), rd.data(), zpFloat32, comm, nullptr);
    expect(count == 4 ? "small alltoallv" : "large alltoallv", r, "zpAlltoallv");
  }
  return finishMode(comm, rank, n, err);
}

// ZP_TEST_MODE=refused: every rank sends to the rank one node on and
// receives from the rank one node back, each receive one element more or
// less than the send (eager, relayed or direct, and rendezvous sizes): every
// receive fails with zpInvalidUsage naming both counts and writes nothing
// (poisoned buffer and guards checked byte by byte); a matched exchange of
// the same sizes then works.
int refusedMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  const int rpn = envInt("ZP_LOCAL_NRANKS", 1);
  const int to = (rank + rpn) % n, from = (rank - rpn + n) % n;
  std::string err;
  // grouped: each rank sends and receives in one group; alone: node 0's
  // ranks only send and node 1's only receive (after 50 ms: the chunks come
  // before the receive is posted), as separate calls.
  for (bool alone : {false, true})
  for (size_t count : {(size_t)1000, (size_t)100000, (size_t)1000000})
    for (int delta : {1, -1}) {
      const size_t expect = count + delta;
      zptest::GuardedBuffer send(count * 4, 1), recv(expect * 4, 3);
      send.fill(seed + count, rank, to);
      zpResult_t r = zpInvalidUsage;
      if (!alone) {
        zpGroupStart();
        zpSend(send.data(), count, zpFloat32, to, comm, nullptr);
        zpRecv(recv.data(), expect, zpFloat32, from, comm, nullptr);
        r = zpGroupEnd();
      } else if (rank < rpn) {
        if (zpSend(send.data(), count, zpFloat32, rpn + rank, comm, nullptr) != zpSuccess)
          err = "a send to a refused receive failed: " + std::string(zpGetLastError(comm));
      } else if (rank < 2 * rpn) {
        usleep(50000);
        r = zpRecv(recv.data(), expect, zpFloat32, rank - rpn, comm, nullptr);
      }
      std::string msg = r == zpInvalidUsage && alone && (rank < rpn || rank >= 2 * rpn)
                            ? "(not a receiver) " + std::to_string(count) + " " + std::to_string(expect)
                            : zpGetLastError(comm);
      std::string what = std::string(alone ? "alone: " : "grouped: ") + std::to_string(count) + " floats received as " + std::to_string(expect) + ": ";
      if (r != zpInvalidUsage) err = what + "returned " + zpGetErrorString(r) + ": " + msg;
      else if (msg.find(std::to_string(count)) == std::string::npos || msg.find(std::to_string(expect)) == std::string::npos)
        err = what + "the error does not name both counts: " + msg;
      else if (size_t w = recv.writtenBytes()) err = what + std::to_string(w) + " bytes of the refused receive written";
      else if (size_t g = recv.guardBytesWritten()) err = what + std::to_string(g) + " guard bytes written";
      if (err.empty()) err = sendRecvError(comm, rank, n, rpn, seed + count + delta);
      if (!err.empty()) return finishMode(comm, rank, n, err);
    }
  return finishMode(comm, rank, n, err);
}

// ZP_TEST_MODE=late: rank 0 sends two messages to the first rank of node 1
// and destroys its communicator at once; the receiver drives progress for a
// second (it hears the goodbye and the connection close) and only then asks
// for them. Both must arrive whole; a third receive, of a message never sent,
// must fail with zpRemoteError at once.
int lateMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  const int to = envInt("ZP_LOCAL_NRANKS", 1);
  const size_t sizes[2] = {1000, 3000};
  if (rank == 0 && to < n) {
    for (size_t s : sizes) {
      zptest::GuardedBuffer msg(s, 1);
      msg.fill(seed + s, 0, to);
      if (zpSend(msg.data(), s, zpUint8, to, comm, nullptr) != zpSuccess) {
        printf("rank 0: send: %s\n", zpGetLastError(comm));
        return 1;
      }
    }
  }
  // zpCommDestroy waits for no timeout (the test sets ZP_TIMEOUT=60): with
  // routing on, the leaving ranks stay until rank `to` leaves too, which it
  // does once its receive of a message never sent has failed.
  auto destroy = [&] {
    const auto start = std::chrono::steady_clock::now();
    const zpResult_t r = zpCommDestroy(comm);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (r == zpSuccess && s <= 10) return true;
    printf("rank %d: zpCommDestroy returned %s after %.1f s\n", rank, zpGetErrorString(r), s);
    return false;
  };
  if (rank != to) {
    if (!destroy()) return 1;
    printf("rank %d: ok\n", rank);
    return 0;
  }
  for (int i = 0; i < 100; i++) {
    zpResult_t async = zpSuccess;
    zpCommGetAsyncError(comm, &async);  // progress: the goodbye, then the closed connection
    usleep(10000);
  }
  for (size_t s : sizes) {
    zptest::GuardedBuffer msg(s, 3);
    if (zpRecv(msg.data(), s, zpUint8, 0, comm, nullptr) != zpSuccess) {
      printf("rank %d: a message rank 0 sent before it left was lost: %s\n", rank, zpGetLastError(comm));
      return 1;
    }
    if (size_t w = msg.wrongBytes(seed + s, 0, to)) {
      printf("rank %d: %zu wrong bytes\n", rank, w);
      return 1;
    }
  }
  char byte;
  const auto start = std::chrono::steady_clock::now();
  const zpResult_t r = zpRecv(&byte, 1, zpUint8, 0, comm, nullptr);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (r != zpRemoteError || s > 3) {
    printf("rank %d: a receive of a message never sent returned %s after %.1f s\n", rank, zpGetErrorString(r), s);
    return 1;
  }
  if (!destroy()) return 1;
  printf("rank %d: ok\n", rank);
  return 0;
}

// ZP_TEST_MODE=earlybye: after an exchange of every rank with the rank one
// node on (relayed: every rank carries chunks as a proxy), the first rank
// of each node (a worker) goes on sending routed traffic round the ring of
// workers, every byte checked, for ZP_TEST_SECONDS (4), while the other
// ranks destroy the communicator at once: their zpCommDestroy must return
// within 1.5 s (a leaving rank used to wait for every rank to come to
// destroy), so the workers' later chunks take paths without them. Worker 0
// says each round whether another follows, so all run the same rounds.
int earlyByeMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  const int rpn = envInt("ZP_LOCAL_NRANKS", 1);
  const double seconds = envInt("ZP_TEST_SECONDS", 4);
  using Clock = std::chrono::steady_clock;
  std::string err = sendRecvError(comm, rank, n, rpn, seed);
  if (!err.empty()) return finishMode(comm, rank, n, "the first exchange: " + err);
  // zpCommDestroy, timed: "" if it succeeded within limit seconds.
  auto destroyWithin = [&](double limit, double* took) {
    const auto bye = Clock::now();
    const zpResult_t r = zpCommDestroy(comm);
    *took = std::chrono::duration<double>(Clock::now() - bye).count();
    if (r == zpSuccess && *took <= limit) return std::string();
    char why[128];
    snprintf(why, sizeof why, "zpCommDestroy returned %s after %.2f s", zpGetErrorString(r), *took);
    return std::string(why);
  };
  double took = 0;
  if (rank % rpn != 0) {
    err = destroyWithin(1.5, &took);
    if (!err.empty()) {
      printf("rank %d: %s while the workers ran\n", rank, err.c_str());
      return 1;
    }
    printf("rank %d: destroyed in %.2f s: ok\n", rank, took);
    return 0;
  }
  const auto start = Clock::now();
  int rounds = 0;
  for (int go = 1; go && err.empty(); rounds++) {
    err = sendRecvError(comm, rank, n, rpn, seed + 1 + rounds);
    if (rank == 0) go = std::chrono::duration<double>(Clock::now() - start).count() < seconds;
    zpGroupStart();
    for (int w = rpn; w < n && rank == 0; w += rpn) zpSend(&go, 1, zpInt32, w, comm, nullptr);
    if (rank != 0) zpRecv(&go, 1, zpInt32, 0, comm, nullptr);
    if (zpGroupEnd() != zpSuccess && err.empty()) err = std::string("the round's flag: ") + zpGetLastError(comm);
  }
  if (!err.empty()) return finishMode(comm, rank, n, "round " + std::to_string(rounds) + ": " + err);
  printf("rank %d: %d rounds in %.1f s\n", rank, rounds, std::chrono::duration<double>(Clock::now() - start).count());
  err = destroyWithin(5, &took);
  if (!err.empty()) {
    printf("rank %d: the worker's %s\n", rank, err.c_str());
    return 1;
  }
  printf("rank %d: ok\n", rank);
  return 0;
}

// Foreign connections to the rendezvous: they must be dropped, never joined.
void connectAsStranger(const zpUniqueId& id) {
  zp::IdLayout layout;
  if (!zp::decodeId(id, &layout)) return;
  sockaddr_storage addr = zp::idAddress(layout);
  for (int kind = 0; kind < 3; kind++) {
    // The root (at rank 0) may not listen yet: it cannot finish without this
    // rank, so keep trying for a while.
    int fd = -1;
    for (int attempt = 0; attempt < 500 && fd < 0; attempt++) {
      fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
      if (connect(fd, (sockaddr*)&addr, sizeof(sockaddr_in)) != 0) {
        close(fd);
        fd = -1;
        usleep(10000);
      }
    }
    if (fd < 0) continue;
    if (kind == 0) {
      const char garbage[] = "GET / HTTP/1.0\r\n\r\n";
      send(fd, garbage, sizeof(garbage), MSG_NOSIGNAL);
    } else if (kind == 1) {
      zp::JoinHeader h;
      memset(&h, 0, sizeof(h));
      h.magic = zp::kIdMagic;  // right magic, wrong (zero) secret
      h.nranks = 1;
      send(fd, &h, sizeof(h), MSG_NOSIGNAL);
    }
    // kind 2 sends nothing; all three stay open while the ranks join.
  }
}

// Bytes this node's NIC k has sent or received (read in the node's namespace).
unsigned long long nicBytes(int k, const char* what) {
  unsigned long long v = 0;
  std::string path = "/sys/class/net/zpnic" + std::to_string(k) + "/statistics/" + what;
  if (FILE* f = fopen(path.c_str(), "r")) {
    if (fscanf(f, "%llu", &v) != 1) v = 0;
    fclose(f);
  }
  return v;
}

bool nicIsUp(int k) {
  char state[32] = "";
  std::string path = "/sys/class/net/zpnic" + std::to_string(k) + "/operstate";
  if (FILE* f = fopen(path.c_str(), "r")) {
    if (fscanf(f, "%31s", state) != 1) state[0] = 0;
    fclose(f);
  }
  return strcmp(state, "down") != 0;
}

int attentionMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  const int rpn = envInt("ZP_LOCAL_NRANKS", n);
  std::string err;
  int k = 0;
  double largest = 0;
  for (zptest::AttnPlanKind kind :
       {zptest::AttnPlanKind::RandomRings, zptest::AttnPlanKind::Planner, zptest::AttnPlanKind::OneRing,
          zptest::AttnPlanKind::CommPlanner})
    for (bool causal : {true, false}) {
      zptest::AttnCase c;
      c.causal = causal;
      c.kvHeads = k % 3 == 0 ? 4 : k % 3 == 1 ? 2 : 1;
      c.accumulate = k % 2;
      zptest::AttnErrors e;
      std::string why = zptest::checkDistributedAttention(comm, rank, n, rpn, seed + k++, c, &e);
      largest = std::max(largest, e.max());
      if (!why.empty() && err.empty())
        err = std::string(zptest::planKindName(kind)) + (causal ? ", causal, " : ", not causal, ") +
              std::to_string(c.kvHeads) + " kv heads: " + why;
    }
  // The planner reads the cluster from the communicator: rings that span
  // nodes are inter-node rings, and a huge sequence gets one.
  std::vector<int64_t> lens = {int64_t(1) << 22, 100, 3000, 1};
  zpAttnShape_t shape = {32, 8, 128, 2, 1};
  zpBatchPlan_t plan = nullptr;
  if (err.empty() && zpPlanBatch(&plan, (int)lens.size(), lens.data(), &shape, nullptr, comm) != zpSuccess)
    err = std::string("zpPlanBatch from the communicator: ") + zpGetLastError(nullptr);
  bool sawInter = false;
  for (size_t s = 0; plan && s < lens.size() && err.empty(); s++) {
    int cls = -1, g = 0;
    const int* ranks = nullptr;
    zpPlanSequence(plan, (int64_t)s, &cls, &g, &ranks);
    bool spans = false;
    for (int i = 0; i < g; i++) spans |= ranks[i] / rpn != ranks[0] / rpn;
    sawInter |= cls == 2;
    if ((cls == 2) != spans || (cls == 0) != (g == 1))
      err = "sequence " + std::to_string(s) + ": class " + std::to_string(cls) + " for a ring of " + std::to_string(g) +
            " ranks" + (spans ? " across nodes" : "");
  }
  if (err.empty() && n > rpn && !sawInter) err = "no inter-node ring for a sequence of 4M tokens";
  if (plan) zpPlanDestroy(plan);
  zpCommDestroy(comm);
  if (!err.empty()) {
    fprintf(stderr, "rank %d: %s\n", rank, err.c_str());
    return 1;
  }
  printf("rank %d: ok (largest relative error %.2e, bound 1e-5)\n", rank, largest);
  return 0;
}

// Destroys the communicator (a rank done with its part may still relay
// others' chunks: destroy stays for them) and prints this rank's outcome:
// "rank R of N: ok", or what went wrong.
int destroyAndReport(zpComm_t comm, int rank, int n, std::string err) {
  if (err.empty() && zpCommDestroy(comm) != zpSuccess) err = std::string("destroy: ") + zpGetLastError(nullptr);
  if (!err.empty()) {
    printf("rank %d: %s\n", rank, err.c_str());
    return 1;
  }
  printf("rank %d of %d: ok\n", rank, n);
  return 0;
}

// ZP_TEST_MODE=killcoll (see the top of the file).
int killCollMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  const int victim = envInt("ZP_TEST_VICTIM", n - 1);
  const char* atEnv = getenv("ZP_TEST_KILL_AT");
  const std::string at = atEnv ? atEnv : "rail";
  const double timeoutMs = 1000.0 * envInt("ZP_TIMEOUT", 60);
  const size_t count = 16u << 20;  // float32: 64 MiB
  auto value = [&](int r, size_t i) { return (float)((seed + (uint64_t)r * 7919 + i * 31) % 97); };
  zptest::GuardedBuffer in(count * 4), out(count * 4);
  float* x = (float*)in.data();
  const float* y = (const float*)out.data();
  for (size_t i = 0; i < count; i++) x[i] = value(rank, i);
  if (zpResult_t br = zpBarrier(comm, nullptr)) {  // every rank ready
    // The victim left the barrier before this rank had all it needed from
    // it (a loaded machine): the death comes here, and must be the same
    // remote error as in the call.
    if (rank == victim || br != zpRemoteError) {
      printf("rank %d: barrier: %s\n", rank, zpGetLastError(comm));
      return 1;
    }
    printf("rank %d: remote error as expected (in the barrier before the call): %s\n", rank, zpGetLastError(comm));
    return (rank % 2 ? zpCommAbort(comm) : zpCommDestroy(comm)) == zpSuccess ? 0 : 1;
  }
  if (rank == victim) {
    if (at == "before") {  // once the others are surely past the barrier, in the call
      usleep(300000);
      raise(SIGKILL);
    }
    // Written elements of 1024 spread over the output (four poison bytes are never a sum).
    auto written = [y] {
      int w = 0;
      for (size_t k = 0; k < 1024; k++) {
        uint32_t v;
        memcpy(&v, y + k * (count / 1024) + 7, 4);
        w += v != 0xA5A5A5A5u;
      }
      return w;
    };
    // Its own shard is 1024 / ZP_LOCAL_NRANKS of the samples: all written,
    // the node's reduce-scatter is done and the ring over the NICs under way.
    const int shardSamples = 1024 / envInt("ZP_LOCAL_NRANKS", n);
    std::thread([at, rank, written, shardSamples] {
      if (at == "node")
        usleep(2000);
      else
        while (written() < shardSamples) usleep(50);
      printf("rank %d: killed (%d of 1024 samples of its output written)\n", rank, written());
      fflush(stdout);
      raise(SIGKILL);
    }).detach();
  }
  const auto start = std::chrono::steady_clock::now();
  zpResult_t r = zpAllReduce(in.data(), out.data(), count, zpFloat32, zpSum, comm, nullptr);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (rank == victim) {
    printf("rank %d: the victim's call returned (%s): killed too late\n", rank, zpGetErrorString(r));
    return 1;
  }
  std::string err;
  if (in.guardBytesWritten() + out.guardBytesWritten()) err = "written past the buffers";
  for (size_t i = 0; i < count && err.empty(); i++)
    if (x[i] != value(rank, i)) err = "the input was written at " + std::to_string(i);
  if (r == zpSuccess) {
    for (size_t i = 0; i < count && err.empty(); i++) {
      float want = 0;
      for (int p = 0; p < n; p++) want += value(p, i);
      if (y[i] != want) err = "finished with element " + std::to_string(i) + " wrong";
    }
    if (err.empty()) printf("rank %d: finished right after %.0f ms\n", rank, ms);
  } else {
    zpResult_t async = zpSuccess;
    zpCommGetAsyncError(comm, &async);
    if (r != zpRemoteError || async != zpRemoteError)
      err = std::string("WRONG ERROR ") + zpGetErrorString(r) + ": " + zpGetLastError(comm);
    else if (ms >= timeoutMs)
      err = "the death was noticed only after ZP_TIMEOUT (" + std::to_string(ms) + " ms)";
    else
      printf("rank %d: remote error as expected after %.0f ms: %s\n", rank, ms, zpGetLastError(comm));
  }
  zpResult_t end = rank % 2 ? zpCommAbort(comm) : zpCommDestroy(comm);
  if (end != zpSuccess && err.empty()) err = std::string(rank % 2 ? "abort" : "destroy") + " failed: " + zpGetErrorString(end);
  if (!err.empty()) printf("rank %d: %s\n", rank, err.c_str());
  return err.empty() ? 0 : 1;
}

// Remap round trips between random layouts: the same on every rank (seeded).
// The standard collectives across nodes (their rings' steps to other
// nodes go through the relay): all-reduce, all-gather, reduce-scatter,
// broadcast, reduce, all-gatherv and reduce-scatterv of integers, every
// element checked.
int collectivesMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  std::string err;
  const size_t count = 100003;
  auto value = [&](int r, size_t i) { return (int64_t)((seed + (uint64_t)r * 7919 + i * 31) % 1000); };
  std::vector<int64_t> a(count), want(count, 0);
  for (size_t i = 0; i < count; i++) {
    a[i] = value(rank, i);
    for (int r = 0; r < n; r++) want[i] += value(r, i);
  }
  if (zpAllReduce(a.data(), a.data(), count, zpInt64, zpSum, comm, nullptr) != zpSuccess || a != want)
    err = std::string("allreduce: ") + zpGetLastError(comm);
  std::vector<int64_t> mine(count), all(count * n);
  for (size_t i = 0; i < count; i++) mine[i] = value(rank, i);
  if (err.empty() && zpAllGather(mine.data(), all.data(), count, zpInt64, comm, nullptr) != zpSuccess)
    err = std::string("allgather: ") + zpGetLastError(comm);
  for (int r = 0; r < n && err.empty(); r++)
    for (size_t i = 0; i < count && err.empty(); i++)
      if (all[(size_t)r * count + i] != value(r, i)) err = "allgather: rank " + std::to_string(r) + "'s block is wrong";
  std::vector<int64_t> blocks(count * n), part(count);
  for (size_t i = 0; i < count * n; i++) blocks[i] = value(rank, i);
  if (err.empty() && zpReduceScatter(blocks.data(), part.data(), count, zpInt64, zpMax, comm, nullptr) != zpSuccess)
    err = std::string("reducescatter: ") + zpGetLastError(comm);
  for (size_t i = 0; i < count && err.empty(); i++) {
    int64_t m = 0;
    for (int r = 0; r < n; r++) m = std::max(m, value(r, (size_t)rank * count + i));
    if (part[i] != m) err = "reducescatter: element " + std::to_string(i) + " is wrong";
  }
  const int root = n - 1;
  std::vector<int64_t> b(count, rank == root ? 7 : 0), red(count, -1);
  if (err.empty() && zpBroadcast(b.data(), b.data(), count, zpInt64, root, comm, nullptr) != zpSuccess)
    err = std::string("broadcast: ") + zpGetLastError(comm);
  if (err.empty() && b != std::vector<int64_t>(count, 7)) err = "broadcast: wrong data";
  if (err.empty() && zpReduce(a.data(), red.data(), count, zpInt64, zpMin, 0, comm, nullptr) != zpSuccess)
    err = std::string("reduce: ") + zpGetLastError(comm);
  if (err.empty() && rank == 0 && red != want) err = "reduce: wrong data";  // a holds want everywhere
  // The v calls, uneven blocks (rank r: r * 1000 + 17 elements), and a
  // small all-reduce (recursive doubling below ZP_COLL_RING_ABOVE).
  std::vector<size_t> counts(n), displs(n);
  size_t total = 0;
  for (int r = 0; r < n; r++) {
    counts[r] = (size_t)r * 1000 + 17;
    displs[r] = total;
    total += counts[r];
  }
  std::vector<int64_t> vin(total), vout(total, -1);
  for (size_t i = 0; i < total; i++) vin[i] = value(rank, i);
  if (err.empty() && zpReduceScatterv(vin.data(), vout.data(), counts.data(), zpInt64, zpSum, comm, nullptr) != zpSuccess)
    err = std::string("reducescatterv: ") + zpGetLastError(comm);
  for (size_t i = 0; i < counts[rank] && err.empty(); i++) {
    int64_t s = 0;
    for (int r = 0; r < n; r++) s += value(r, displs[rank] + i);
    if (vout[i] != s) err = "reducescatterv: element " + std::to_string(i) + " is wrong";
  }
  if (err.empty() && zpAllGatherv(vin.data() + displs[rank], counts[rank], vout.data(), counts.data(), displs.data(),
                                  zpInt64, comm, nullptr) != zpSuccess)
    err = std::string("allgatherv: ") + zpGetLastError(comm);
  if (err.empty() && vout != vin) {
    for (int r = 0; r < n && err.empty(); r++)
      for (size_t i = 0; i < counts[r] && err.empty(); i++)
        if (vout[displs[r] + i] != value(r, displs[r] + i)) err = "allgatherv: rank " + std::to_string(r) + "'s block is wrong";
  }
  std::vector<int64_t> small(7);
  for (size_t i = 0; i < 7; i++) small[i] = value(rank, i);
  if (err.empty() && zpAllReduce(small.data(), small.data(), 7, zpInt64, zpSum, comm, nullptr) != zpSuccess)
    err = std::string("small allreduce: ") + zpGetLastError(comm);
  for (size_t i = 0; i < 7 && err.empty(); i++)
    if (small[i] != want[i]) err = "small allreduce: wrong data";
  return destroyAndReport(comm, rank, n, err);
}

// One all-gather(v) or reduce-scatter(v) of zeroMode's, every element
// checked; "" or what is wrong. counts: every rank's block (the plain calls
// when all equal and !v).
std::string zeroCall(zpComm_t comm, int rank, int n, uint64_t seed, bool gather, bool v,
                     const std::vector<size_t>& counts, zpDataType_t t, zpRedOp_t op, bool inPlace) {
  using zptest::GuardedBuffer;
  const size_t ts = zpTypeSize(t);
  std::string what = std::string(gather ? "all-gather" : "reduce-scatter") + (v ? "v" : "") + " of " +
                     std::to_string(counts[rank]) + " " + std::to_string((int)t) + "-typed elements (op " +
                     std::to_string((int)op) + (inPlace ? ", in place)" : ")") + ": ";
  const size_t count = counts[rank];
  size_t total = 0, before = 0;
  for (int p = 0; p < n; p++) {
    if (p < rank) before += counts[p];
    total += counts[p];
  }
  if (gather) {
    // Rank p's block is the byte pattern (seed, p); blocks in reverse rank
    // order with a gap of p elements before block p for v, packed otherwise.
    std::vector<size_t> displs(n);
    size_t at = 0;
    for (int p = v ? n - 1 : 0; v ? p >= 0 : p < n; p += v ? -1 : 1) {
      at += v ? (size_t)p : 0;
      displs[p] = at;
      at += counts[p];
    }
    GuardedBuffer mine(count * ts), all(at * ts);
    uint8_t* in = inPlace ? all.data() + displs[rank] * ts : mine.data();
    zptest::fillPattern(in, count * ts, seed, rank, 0);
    const zpResult_t r = v ? zpAllGatherv(in, count, all.data(), counts.data(), displs.data(), t, comm, nullptr)
                           : zpAllGather(in, all.data(), count, t, comm, nullptr);
    if (r != zpSuccess) return what + zpGetLastError(comm);
    size_t gapBytes = 0;
    for (int p = 0; p < n; p++) {
      if (size_t w = zptest::wrongPatternBytes(all.data() + displs[p] * ts, counts[p] * ts, seed, p, 0))
        return what + std::to_string(w) + " wrong bytes in rank " + std::to_string(p) + "'s block";
      gapBytes += zptest::unpoisonedBytes(all.data() + (displs[p] - (v ? p : 0)) * ts, (v ? p : 0) * ts);
    }
    if (gapBytes) return what + std::to_string(gapBytes) + " bytes of the gaps between blocks written";
    if (all.guardBytesWritten() + mine.guardBytesWritten()) return what + "written past the buffers";
    if (!inPlace && mine.wrongBytes(seed, rank, 0)) return what + "the send buffer changed";
    return "";
  }
  GuardedBuffer send(total * ts), recv(count * ts);
  zptest::fillInput(send.data(), total, 0, seed, rank, t, op);
  void* out = inPlace ? send.data() + before * ts : recv.data();
  const zpResult_t r = v ? zpReduceScatterv(send.data(), out, counts.data(), t, op, comm, nullptr)
                         : zpReduceScatter(send.data(), out, count, t, op, comm, nullptr);
  if (r != zpSuccess) return what + zpGetLastError(comm);
  std::string e = zptest::checkReduced(out, count, before, seed, n, t, op);
  if (!e.empty()) return what + e;
  if (send.guardBytesWritten() + recv.guardBytesWritten()) return what + "written past the buffers";
  if (!inPlace) {  // the input untouched
    std::vector<uint8_t> want(total * ts + 1);
    zptest::fillInput(want.data(), total, 0, seed, rank, t, op);
    if (memcmp(want.data(), send.data(), total * ts) != 0) return what + "the send buffer changed";
  }
  return "";
}

// Bytes sent by each NIC of this node during f(), read by the node's first
// rank (others get zeros) between barriers, so that every rank's sends of
// f are on the wire and nobody else's are.
template <class F>
std::vector<unsigned long long> nicTxDuring(zpComm_t comm, bool reader, int nics, F f) {
  std::vector<unsigned long long> tx(nics, 0);
  zpBarrier(comm, nullptr);
  for (int k = 0; k < nics && reader; k++) tx[k] = nicBytes(k, "tx_bytes");
  f();
  zpBarrier(comm, nullptr);
  for (int k = 0; k < nics && reader; k++) tx[k] = nicBytes(k, "tx_bytes") - tx[k];
  return tx;
}

int zeroMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  const int rpn = envInt("ZP_LOCAL_NRANKS", n), nics = envInt("ZP_NICS_PER_NODE", 1);
  std::string err;
  auto note = [&](const std::string& e) {
    if (err.empty() && !e.empty()) err = e;
  };
  std::mt19937_64 rng(seed);  // the same draws on every rank
  // Every type for the reductions, with two ops each, the counts in turn.
  auto cases = [&](zpComm_t c, int me, int m, int rounds) {
    const size_t plain[] = {0, 1, 2, 13, 1009, 20011, 1 + rng() % 60000};
    for (int i = 0; i < rounds; i++) {
      const zpDataType_t t = zptest::kTypes[i % 10];
      const zpRedOp_t op = zptest::kOps[(i + i / 10) % 5];
      const bool inPlace = i % 2 == 1, gatherInPlace = i % 3 == 1;
      std::vector<size_t> same(m, plain[i % 7]), uneven(m);
      for (size_t& x : uneven) x = rng() % 4 == 0 ? 0 : 1 + rng() % (i % 3 == 0 ? 30000 : 9);
      const uint64_t s = rng();
      note(zeroCall(c, me, m, s, false, false, same, t, op, inPlace));
      note(zeroCall(c, me, m, s + 1, false, true, uneven, t, op, !inPlace));
      note(zeroCall(c, me, m, s + 2, true, false, same, t, op, gatherInPlace));
      note(zeroCall(c, me, m, s + 3, true, true, uneven, t, op, !gatherInPlace));
    }
  };
  cases(comm, rank, n, envInt("ZP_TEST_ROUNDS", 20));
  // A few MiB per rank: float32 sum and bfloat16 avg; all-gather of uint8
  // and (v) float64 (unless ZP_TEST_MAX_COUNT is below).
  const size_t big = (1u << 20) + 3;
  if (big <= (size_t)envInt("ZP_TEST_MAX_COUNT", 1 << 30)) {
    note(zeroCall(comm, rank, n, rng(), false, false, std::vector<size_t>(n, big), zpFloat32, zpSum, false));
    note(zeroCall(comm, rank, n, rng(), false, true, std::vector<size_t>(n, big - 2), zpBfloat16, zpAvg, true));
    note(zeroCall(comm, rank, n, rng(), true, false, std::vector<size_t>(n, 4 * big), zpUint8, zpSum, true));
    std::vector<size_t> bigv(n);
    for (int p = 0; p < n; p++) bigv[p] = (big >> 1) + (size_t)p * 1000;
    note(zeroCall(comm, rank, n, rng(), true, true, bigv, zpFloat64, zpSum, false));
  }
  // The cross-node bytes over the NICs, rail-aligned, each rank's over its
  // own NIC: with routing off, and with routing on where the rail ring's
  // slices go direct (the default ZP_ROUTE_DIRECT_BELOW). A node sends
  // (N-1)/N of the buffer (the reduce-scatter's input, the all-gather's
  // output), a share on each NIC: each must carry 0.9-1.25 of it (TCP's
  // headers and acknowledgements on top).
  const char* routing = getenv("ZP_ROUTING");
  const int nodes = n / rpn;
  const bool direct = (routing && std::string(routing) == "off") || !getenv("ZP_ROUTE_DIRECT_BELOW");
  if (direct && nodes > 1 && rpn % nics == 0) {
    const bool reader = rank % rpn == 0;
    const size_t count = 1u << 20;  // float32: 4 MiB per rank
    std::vector<float> in(count * n, 1.0f), out(count);
    for (bool gather : {true, false}) {
      const std::vector<unsigned long long> tx = nicTxDuring(comm, reader, nics, [&] {
        zpResult_t r = gather ? zpAllGather(in.data() + (size_t)rank * count, in.data(), count, zpFloat32, comm, nullptr)
                              : zpReduceScatter(in.data(), out.data(), count, zpFloat32, zpSum, comm, nullptr);
        if (r != zpSuccess) note(std::string("NIC check: ") + zpGetLastError(comm));
      });
      const double share = (double)count * 4 * n * (nodes - 1) / nodes / nics;
      std::string line;
      bool spread = true;
      for (int k = 0; k < nics; k++) {
        line += " " + std::to_string(tx[k] >> 10);
        spread &= tx[k] >= share * 0.9 && tx[k] <= share * 1.25;
      }
      if (reader && !spread)
        note(std::string(gather ? "all-gather" : "reduce-scatter") + " of 4 MiB per rank: the node's NICs sent" +
             line + " KiB, each should have sent about " + std::to_string((long long)share >> 10) + " KiB");
      if (reader) printf("rank %d: %s, KiB sent by each NIC of its node:%s\n", rank, gather ? "all-gather" : "reduce-scatter", line.c_str());
    }
  }
  // A child whose ranks take the nodes in turn (child rank place * nodes +
  // node): nodes of equal size whose ranks are not contiguous, so that no
  // node's blocks are either.
  if (nodes > 1) {
    zpComm_t child = nullptr;
    const int key = (rank % rpn) * nodes + rank / rpn;
    if (zpCommSplit(comm, 0, key, &child, nullptr) != zpSuccess) note(std::string("split: ") + zpGetLastError(comm));
    if (child) {
      cases(child, key, n, 10);
      if (zpCommDestroy(child) != zpSuccess) note("destroying the child failed");
    }
  }
  // Nodes of different sizes: a child without the last rank takes the flat
  // rings (and a child's rails are its own).
  if (n > 2) {
    zpComm_t child = nullptr;
    if (zpCommSplit(comm, rank == n - 1 ? ZP_SPLIT_NOCOLOR : 0, rank, &child, nullptr) != zpSuccess)
      note(std::string("split: ") + zpGetLastError(comm));
    if (child) {
      cases(child, rank, n - 1, 10);
      if (zpCommDestroy(child) != zpSuccess) note("destroying the child failed");
    }
  }
  return destroyAndReport(comm, rank, n, err);
}

// The hierarchical all-reduce's pipeline (run with ZP_COLL_RING_ABOVE=0 and
// a small ZP_COLL_SLICE, so that every count takes it and is cut into many
// slices, some of them empty where a shard has fewer elements than there are
// slices): counts 0, 1, primes and others no slice count divides, up to
// ZP_TEST_MAX_COUNT; int64 sum
// in place, int32 max and float32 sum (of small integers: exact in any
// order) out of place, bfloat16 sum (float32 work buffer); every element
// checked on every rank, outputs poisoned first, guard elements past each
// buffer checked untouched.
int slicesMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  std::string err;
  const size_t kGuard = 16;
  auto value = [&](int r, size_t i) { return (int64_t)((seed + (uint64_t)r * 7919 + i * 31) % 97); };
  const size_t maxCount = (size_t)envInt("ZP_TEST_MAX_COUNT", 1 << 30);
  for (size_t count : {(size_t)0, (size_t)1, (size_t)2, (size_t)3, (size_t)5, (size_t)7, (size_t)13, (size_t)31,
                       (size_t)1009, (size_t)20011, (size_t)100003}) {
    if (count > maxCount) break;
    auto fail = [&](const char* what, size_t i) {
      if (err.empty()) err = std::string(what) + " of " + std::to_string(count) + ": element " + std::to_string(i) + " is wrong";
    };
    auto callFailed = [&](const char* what) {
      if (err.empty()) err = std::string(what) + " of " + std::to_string(count) + ": " + zpGetLastError(comm);
    };
    std::vector<int64_t> sum(count, 0), max(count, 0);
    for (size_t i = 0; i < count; i++)
      for (int r = 0; r < n; r++) {
        sum[i] += value(r, i);
        max[i] = std::max(max[i], value(r, i) * (r % 3 == 1 ? -1 : 1));
      }
    // int64 sum, in place.
    std::vector<int64_t> a(count + kGuard, -7);
    for (size_t i = 0; i < count; i++) a[i] = value(rank, i);
    if (zpAllReduce(a.data(), a.data(), count, zpInt64, zpSum, comm, nullptr) != zpSuccess) callFailed("int64 sum");
    for (size_t i = 0; i < count + kGuard; i++)
      if (a[i] != (i < count ? sum[i] : -7)) fail("int64 sum in place", i);
    // int32 max, out of place.
    std::vector<int32_t> in(count), out(count + kGuard, -99999);
    for (size_t i = 0; i < count; i++) in[i] = (int32_t)(value(rank, i) * (rank % 3 == 1 ? -1 : 1));
    if (zpAllReduce(in.data(), out.data(), count, zpInt32, zpMax, comm, nullptr) != zpSuccess) callFailed("int32 max");
    for (size_t i = 0; i < count + kGuard; i++)
      if (out[i] != (i < count ? (int32_t)max[i] : -99999)) fail("int32 max out of place", i);
    for (size_t i = 0; i < count; i++)
      if (in[i] != (int32_t)(value(rank, i) * (rank % 3 == 1 ? -1 : 1))) fail("int32 max's input", i);
    // float32 sum, out of place.
    std::vector<float> fin(count), fout(count + kGuard, -1.5f);
    for (size_t i = 0; i < count; i++) fin[i] = (float)value(rank, i);
    if (zpAllReduce(fin.data(), fout.data(), count, zpFloat32, zpSum, comm, nullptr) != zpSuccess) callFailed("float32 sum");
    for (size_t i = 0; i < count + kGuard; i++)
      if (fout[i] != (i < count ? (float)sum[i] : -1.5f)) fail("float32 sum out of place", i);
    // bfloat16 sum (sums below 256: exact in bfloat16), in place.
    std::vector<uint16_t> h(count + kGuard, 0xFFFF);
    auto bf16 = [](float f) {
      uint32_t x;
      memcpy(&x, &f, 4);
      return (uint16_t)(x >> 16);
    };
    const int64_t scale = std::max<int64_t>(1, 97 * n / 255 + 1);
    for (size_t i = 0; i < count; i++) h[i] = bf16((float)(value(rank, i) / scale));
    if (zpAllReduce(h.data(), h.data(), count, zpBfloat16, zpSum, comm, nullptr) != zpSuccess) callFailed("bfloat16 sum");
    for (size_t i = 0; i < count + kGuard; i++) {
      int64_t want = 0;
      for (int r = 0; r < n; r++) want += value(r, i) / scale;
      if (h[i] != (i < count ? bf16((float)want) : 0xFFFF)) fail("bfloat16 sum in place", i);
    }
  }
  return destroyAndReport(comm, rank, n, err);
}

int remapMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  std::string err;
  for (int it = 0; it < 4 && err.empty(); it++) {
    std::mt19937_64 rng(seed + it);
    std::vector<int64_t> lens(1 + rng() % 30);
    for (auto& l : lens) l = 1 + rng() % 3000;
    auto randomLayout = [&](std::vector<size_t>* offs, std::vector<zpSegment_t>* segs) {
      std::vector<std::vector<zpSegment_t>> per(n);
      for (size_t s = 0; s < lens.size(); s++)
        for (int64_t at = 0; at < lens[s];) {
          int64_t take = std::min<int64_t>(lens[s] - at, 1 + rng() % lens[s]);
          per[rng() % n].push_back({(int64_t)s, at, take});
          at += take;
        }
      offs->assign(1, 0);
      for (auto& v : per) {
        segs->insert(segs->end(), v.begin(), v.end());
        offs->push_back(segs->size());
      }
    };
    std::vector<size_t> oa, ob;
    std::vector<zpSegment_t> sa, sb;
    randomLayout(&oa, &sa);
    randomLayout(&ob, &sb);
    zpLayout_t a = nullptr, b = nullptr;
    zpLayoutCreate(&a, (int)lens.size(), lens.data(), n, oa.data(), sa.data());
    zpLayoutCreate(&b, (int)lens.size(), lens.data(), n, ob.data(), sb.data());
    const size_t tb = 64;  // bytes per token
    auto fill = [&](const std::vector<size_t>& offs, const std::vector<zpSegment_t>& segs) {
      std::vector<uint8_t> v;
      for (size_t k = offs[rank]; k < offs[rank + 1]; k++)
        for (int64_t t = segs[k].start; t < segs[k].start + segs[k].count; t++)
          for (size_t x = 0; x < tb; x++) v.push_back((uint8_t)((seed + segs[k].seq * 131 + t * 7 + x) * 2654435761u >> 13));
      return v;
    };
    std::vector<uint8_t> in = fill(oa, sa), want = fill(ob, sb), out(want.size(), 0xA5), back(in.size(), 0x5A);
    zpRemap_t r = nullptr;
    if (zpRemapCreate(&r, a, b, comm) != zpSuccess ||
        zpRemapExecute(r, in.data(), out.data(), tb, zpUint8, 0, comm, nullptr) != zpSuccess ||
        zpRemapExecute(r, out.data(), back.data(), tb, zpUint8, 1, comm, nullptr) != zpSuccess)
      err = std::string("remap failed: ") + zpGetLastError(comm);
    else if (out != want)
      err = "forward: wrong bytes";
    else if (back != in)
      err = "inverse: wrong bytes";
    zpRemapDestroy(r);
    zpLayoutDestroy(a);
    zpLayoutDestroy(b);
  }
  zpCommDestroy(comm);
  if (!err.empty()) {
    fprintf(stderr, "rank %d: %s\n", rank, err.c_str());
    return 1;
  }
  printf("rank %d of %d: ok\n", rank, n);
  return 0;
}

int allDownMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  const int rpn = envInt("ZP_LOCAL_NRANKS", 1), nics = envInt("ZP_NICS_PER_NODE", 1);
  const size_t bytes = 64u << 20;
  zpResult_t r = zpSuccess;
  std::string what = "alltoallv";
  if (rank == 0 || rank == rpn) {
    zptest::GuardedBuffer buf(bytes, 1);
    std::thread downer;
    if (rank == 0)
      downer = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        for (int k = 0; k < nics; k++)
          if (system(("ip link set zpnic" + std::to_string(k) + " down").c_str()) != 0) fprintf(stderr, "ip failed\n");
      });
    r = rank == 0 ? zpSend(buf.data(), bytes, zpUint8, rpn, comm, nullptr)
                  : zpRecv(buf.data(), bytes, zpUint8, 0, comm, nullptr);
    if (downer.joinable()) downer.join();
    what = "the transfer";
  }
  std::string err = r != zpSuccess ? zpGetLastError(comm) : "";
  if (r == zpSuccess) {
    err = zptest::alltoallvError(comm, rank, zptest::randomCounts(n, seed, 1000, 0), zpUint8, seed);
    what = "the alltoallv after it";
  }
  zpCommDestroy(comm);
  if (err.empty()) {
    fprintf(stderr, "rank %d: no error although node 0 lost every NIC\n", rank);
    return 1;
  }
  printf("rank %d of %d: error as expected from %s: %s\n", rank, n, what.c_str(), err.c_str());
  return 0;
}

// ZP_TEST_MODE=rails: rank 0 sends ZP_TEST_BYTES (default 64 MiB) to the
// first rank of node 1 again and again, for ZP_TEST_SECONDS (default 8),
// with fresh bytes each time, every byte and guard checked; every other rank
// waits in a broadcast that says whether another round comes. Rank 0 prints
// the first and the last round's time; every rank prints its node's rails
// as zpCommGetRailReport gives them at the end.
// One round of the rails modes: rank 0 sends buf (filled from seed) to node
// 1's first rank (rpn), which receives it into poison and checks every byte;
// *ms: the send or receive alone. "" or what went wrong.
std::string pairRound(zpComm_t comm, int rank, int rpn, zptest::GuardedBuffer& buf, uint64_t seed, double* ms) {
  if (rank == 0) buf.fill(seed, 0, rpn);
  else memset(buf.data(), 0xA5, buf.size());  // poison: every byte must be written again
  const auto t0 = std::chrono::steady_clock::now();
  zpResult_t r = rank == 0 ? zpSend(buf.data(), buf.size(), zpUint8, rpn, comm, nullptr)
                           : zpRecv(buf.data(), buf.size(), zpUint8, 0, comm, nullptr);
  *ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (r != zpSuccess) return std::string("failed: ") + zpGetLastError(comm);
  if (rank == rpn && buf.wrongBytes(seed, 0, rpn)) return "wrong bytes";
  return "";
}

// Prints this rank's wait report (at most `most` entries), one line per
// peer, into *out and the calls it covers into *calls; an error if it
// cannot be had.
std::string printWaitReport(zpComm_t comm, int rank, int most, std::vector<zpWaitEntry_t>* out, int* calls) {
  out->resize(most);
  int entries = 0;
  if (zpCommGetWaitReport(comm, out->data(), most, &entries, calls) != zpSuccess)
    return std::string("zpCommGetWaitReport: ") + zpGetLastError(comm);
  out->resize(std::min(entries, most));
  for (const zpWaitEntry_t& e : *out)
    printf("rank %d: waited for rank %d, last in %d of %d calls, %.1f ms in all\n", rank, e.rank, e.callsLast, *calls,
           e.totalWaitSec * 1e3);
  return "";
}

// Prints this rank's rail report, one line per rail; an error if it cannot be had.
std::string printRails(zpComm_t comm, int rank) {
  zpRailEntry_t rails[8];
  int count = 0;
  if (zpCommGetRailReport(comm, rails, 8, &count) != zpSuccess)
    return std::string("zpCommGetRailReport: ") + zpGetLastError(comm);
  for (int i = 0; i < count && i < 8; i++)
    printf("rank %d: rail %d %s: %s, %.0f Mbit/s measured, %.0f nominal, %d changes\n", rank, rails[i].rail,
           rails[i].nic, rails[i].slow ? "slow" : "healthy", rails[i].bitsPerSec / 1e6,
           rails[i].nominalBitsPerSec / 1e6, rails[i].changes);
  return "";
}


int railsMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  using Clock = std::chrono::steady_clock;
  const int rpn = envInt("ZP_LOCAL_NRANKS", 1), seconds = envInt("ZP_TEST_SECONDS", 8);
  const size_t bytes = (size_t)envInt("ZP_TEST_BYTES", 64 << 20);
  std::string err;
  zptest::GuardedBuffer buf(bytes, 1);
  auto start = Clock::now();
  double firstMs = 0, lastMs = 0;
  int rounds = 0;
  for (;; rounds++) {
    int32_t more = rank == 0 && std::chrono::duration<double>(Clock::now() - start).count() < seconds;
    if (zpBroadcast(&more, &more, 1, zpInt32, 0, comm, nullptr) != zpSuccess) {
      err = std::string("broadcast failed: ") + zpGetLastError(comm);
      break;
    }
    if (!more) break;
    if (rank != 0 && rank != rpn) continue;
    err = pairRound(comm, rank, rpn, buf, seed + rounds, &lastMs);
    if (rounds == 0) firstMs = lastMs;
    if (!err.empty()) err = "round " + std::to_string(rounds) + ": " + err;
    else if (buf.guardBytesWritten()) err = "guard bytes written";
    if (!err.empty()) break;
  }
  if (err.empty()) err = printRails(comm, rank);
  if (rank == 0 && err.empty())
    printf("rank 0: %d rounds of %zu bytes, the first %.0f ms, the last %.0f ms\n", rounds, bytes, firstMs, lastMs);
  return destroyAndReport(comm, rank, n, err);
}

// ZP_TEST_MODE=lag: ZP_TEST_ROUNDS (default 40) zpAlltoallvs of random
// counts (up to 64K floats per pair), every byte and guard checked, rank
// ZP_TEST_VICTIM (default the last; -1: none) sleeping 50 ms before each.
// Then every rank checks its wait report: the victim must come first on
// every other rank, last in at least 80% of the calls and 30 ms late on
// average; without a victim nobody may stand out (last in most calls, late
// by over ZP_STRAGGLER_MS on average). The WARN lines are the caller's to
// count.
int lagMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  const int rounds = envInt("ZP_TEST_ROUNDS", 40), victim = envInt("ZP_TEST_VICTIM", n - 1);
  const double thresholdSec = envInt("ZP_STRAGGLER_MS", 10) / 1000.0;
  std::string err;
  for (int round = 0; round < rounds && err.empty(); round++) {
    zptest::AlltoallvRun a(rank, zptest::randomCounts(n, seed + round, 64 * 1024, 0.1), zpFloat32, seed + round);
    if (rank == victim) usleep(50 * 1000);
    if (a.run(comm) != zpSuccess) err = "round " + std::to_string(round) + ": " + zpGetLastError(comm);
    else err = a.check();
  }
  std::vector<zpWaitEntry_t> e;
  int calls = 0;
  if (err.empty()) err = printWaitReport(comm, rank, 4, &e, &calls);
  const int entries = (int)e.size();
  if (err.empty() && victim >= 0 && rank != victim &&
      (entries < 1 || e[0].rank != victim || e[0].callsLast < rounds * 8 / 10 ||
       e[0].totalWaitSec / e[0].callsLast < 0.030))
    err = "the wait report does not name rank " + std::to_string(victim);
  for (int i = 0; i < entries && i < 4 && err.empty() && (victim < 0 || rank == victim); i++)
    if (2 * e[i].callsLast > calls && e[i].totalWaitSec / e[i].callsLast > thresholdSec)
      err = "rank " + std::to_string(e[i].rank) + " stands out in the wait report without a laggard";
  return destroyAndReport(comm, rank, n, err);
}

// ZP_TEST_MODE=skew: ZP_TEST_ROUNDS (default 4) zpAlltoallvs back to back
// whose bytes follow route_perf's zipf law with rank 3 the heaviest (pair
// (s, d) gets S n^2 z[s] z[d] / (sum z)^2, z[r] = (1 + (r - 3 mod n))^-1.2,
// S = ZP_TEST_BYTES, default 32 MiB, per rank on average): rank 3 sends
// and receives the most, most of it within its node, and is the proxy of
// its rail. Nothing runs between the calls (as in a benchmark); the last
// call's every byte and guard is checked. Every rank prints its node's
// rails and its wait report; the caller counts the WARN lines.
int skewMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  const int rounds = envInt("ZP_TEST_ROUNDS", 4);
  const double S = (double)envInt("ZP_TEST_BYTES", 32 << 20);
  std::vector<double> z(n);
  double sum = 0;
  for (int r = 0; r < n; r++) sum += z[r] = 1.0 / std::pow(1.0 + (r - 3 + n) % n, 1.2);
  zptest::CountMatrix m(n, std::vector<size_t>(n));
  for (int s = 0; s < n; s++)
    for (int d = 0; d < n; d++) m[s][d] = (size_t)(S * n * n * z[s] / sum * z[d] / sum);
  zptest::AlltoallvRun a(rank, m, zpUint8, seed);
  std::string err;
  for (int round = 0; round < rounds && err.empty(); round++) {
    zpResult_t r = round + 1 < rounds ? zpAlltoallv(a.sendBuffer().data(), a.sendCounts(), a.sendDispls(),
                                                    a.recvBuffer().data(), a.recvCounts(), a.recvDispls(), zpUint8,
                                                    comm, nullptr)
                                      : a.run(comm);  // the last: poisoned first, then checked
    if (r != zpSuccess) err = "round " + std::to_string(round) + ": " + zpGetLastError(comm);
  }
  if (err.empty()) err = a.check();
  if (err.empty()) err = printRails(comm, rank);
  std::vector<zpWaitEntry_t> e;
  int calls = 0;
  if (err.empty()) err = printWaitReport(comm, rank, 8, &e, &calls);
  return destroyAndReport(comm, rank, n, err);
}

int nicDownMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  using Clock = std::chrono::steady_clock;
  const int rpn = envInt("ZP_LOCAL_NRANKS", 1), nics = envInt("ZP_NICS_PER_NODE", 1);
  const int victim = envInt("ZP_TEST_DOWN_NIC", nics - 1), downMs = envInt("ZP_TEST_DOWN_MS", 150);
  const size_t bytes = (size_t)envInt("ZP_TEST_BYTES", 256 << 20);
  const double rateBps = atof(getenv("ZP_NIC_RATE_BPS") ? getenv("ZP_NIC_RATE_BPS") : "0");
  std::string err;
  if (rank == 0 || rank == rpn) {
    zptest::GuardedBuffer buf(bytes, 1);
    if (rank == 0) buf.fill(seed, 0, rpn);
    auto txAll = [&] {
      unsigned long long v = 0;
      for (int k = 0; k < nics; k++) v += nicBytes(k, "tx_bytes");
      return v;
    };
    unsigned long long tx0 = txAll(), txDown = 0;
    auto start = Clock::now();
    Clock::time_point downAt;
    std::thread downer;
    if (rank == 0)
      downer = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(downMs));
        txDown = txAll();
        downAt = Clock::now();
        std::string cmd = "ip link set zpnic" + std::to_string(victim) + " down";
        if (system(cmd.c_str()) != 0) fprintf(stderr, "rank 0: %s failed\n", cmd.c_str());
      });
    zpResult_t r = rank == 0 ? zpSend(buf.data(), bytes, zpUint8, rpn, comm, nullptr)
                             : zpRecv(buf.data(), bytes, zpUint8, 0, comm, nullptr);
    auto end = Clock::now();
    bool downBeforeEnd = rank == 0 && !nicIsUp(victim);
    unsigned long long tx1 = txAll();
    if (downer.joinable()) downer.join();
    if (r != zpSuccess) err = std::string("transfer failed: ") + zpGetLastError(comm);
    else if (rank == rpn && buf.wrongBytes(seed, 0, rpn)) err = "wrong bytes";
    else if (rank == rpn && buf.guardBytesWritten()) err = "guard bytes written";
    else if (rank == 0 && !downBeforeEnd) err = "the send finished before the NIC went down: raise ZP_TEST_BYTES";
    if (rank == 0 && err.empty()) {
      // Payload after the failure: the NICs' byte counters (headers and
      // retransmissions included) scaled by payload / counted bytes.
      double after = std::chrono::duration<double>(end - downAt).count();
      double payloadAfter = (double)(tx1 - txDown) * bytes / (double)(tx1 - tx0);
      double total = std::chrono::duration<double>(end - start).count();
      printf("rank 0: %zu MiB in %.3f s; NIC %d down after %.3f s; afterwards %.1f MiB in %.3f s = %.1f%% of the "
             "other %d NICs' rate\n",
             bytes >> 20, total, victim, total - after, payloadAfter / (1 << 20), after,
             rateBps > 0 ? 100 * payloadAfter * 8 / after / (rateBps * (nics - 1)) : 0.0, nics - 1);
    }
  }
  // The communicator works on without the NIC.
  std::string more = zptest::alltoallvError(comm, rank, zptest::randomCounts(n, seed + 1, 300000, 0.2), zpFloat32,
                                            seed + 1);
  if (err.empty()) err = more;
  zpResult_t d = zpCommDestroy(comm);
  if (err.empty() && d != zpSuccess) err = "zpCommDestroy failed";
  if (!err.empty()) {
    fprintf(stderr, "rank %d: %s\n", rank, err.c_str());
    return 1;
  }
  printf("rank %d of %d: ok\n", rank, n);
  return 0;
}

// ZP_TEST_MODE=nicdownleave: node 0's last NIC is down, so its rank (the
// last of node 0) reaches node 1 only through its node's other ranks. It
// exchanges ZP_TEST_BYTES with a rank of node 1 (ZP_TEST_PARTNER, node 1's
// first by default) while every other rank calls zpCommDestroy
// ZP_TEST_LEAVE_MS into the exchange: the proxies the exchange needs must
// stay until it is done.
int nicDownLeaveMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  const int rpn = envInt("ZP_LOCAL_NRANKS", 1), nics = envInt("ZP_NICS_PER_NODE", 1);
  const int leaveMs = envInt("ZP_TEST_LEAVE_MS", 50);
  const size_t bytes = (size_t)envInt("ZP_TEST_BYTES", 64 << 20);
  const int lonely = rpn - 1, partner = envInt("ZP_TEST_PARTNER", rpn);
  std::string err;
  if (rank == 0 && system(("ip link set zpnic" + std::to_string(nics - 1) + " down").c_str()) != 0)
    err = "could not take the NIC down";
  // Every rank learns of the NIC before the exchange: its own check finds
  // it (node 0) or node 0's ranks tell it, and an alltoallv goes around it.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  if (err.empty())
    err = zptest::alltoallvError(comm, rank, zptest::randomCounts(n, seed, 20000, 0.2), zpFloat32, seed);
  if (err.empty() && (rank == lonely || rank == partner)) {
    const int peer = rank == lonely ? partner : lonely;
    zptest::GuardedBuffer out(bytes, 1), in(bytes, 3);
    out.fill(seed, rank, peer);
    zpGroupStart();
    zpSend(out.data(), bytes, zpUint8, peer, comm, nullptr);
    zpRecv(in.data(), bytes, zpUint8, peer, comm, nullptr);
    if (zpGroupEnd() != zpSuccess) err = std::string("exchange: ") + zpGetLastError(comm);
    else if (in.wrongBytes(seed, peer, rank)) err = "wrong bytes";
    else if (in.guardBytesWritten()) err = "guard bytes written";
  } else if (err.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(leaveMs));
  }
  return destroyAndReport(comm, rank, n, err);
}

#ifdef ZP_TEST_DOUBLE
int deviceMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  std::string err;
  ncclComm_t nccl = nullptr;
  int device = -1;
  if (zpCommGetNcclComm(comm, &nccl) != zpSuccess || ncclCommCuDevice(nccl, &device) != ncclSuccess)
    err = std::string("no NCCL communicator: ") + zpGetLastError(comm);
  cudaStream_t stream = nullptr;
  if (err.empty() && (cudaSetDevice(device) != cudaSuccess ||
                      cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess))
    err = "no stream on device " + std::to_string(device);
  std::mt19937_64 rng(seed);
  for (int round = 0; round < 3 && err.empty(); round++) {
    err = zptest::deviceAlltoallvError(comm, rank, zptest::randomCounts(n, rng(), 20000, 0.2), zpFloat32, rng());
    if (!err.empty()) err = "alltoallv: " + err;
  }
  // A split across nodes (even ranks, odd ranks) carries device calls too:
  // the child makes its own NCCL communicator through the parent.
  if (err.empty() && n > 2) {
    zpComm_t half = nullptr;
    if (zpCommSplit(comm, rank % 2, rank, &half, nullptr) != zpSuccess)
      err = std::string("zpCommSplit: ") + zpGetLastError(comm);
    int hr = 0, hn = 0;
    if (err.empty()) {
      zpCommUserRank(half, &hr);
      zpCommCount(half, &hn);
      err = zptest::deviceAlltoallvError(half, hr, zptest::randomCounts(hn, rng(), 20000, 0.2), zpFloat32, rng());
      if (!err.empty()) err = "alltoallv on the split: " + err;
    }
    if (half) zpCommDestroy(half);
  }
  const int rpn = envInt("ZP_LOCAL_NRANKS", n);
  int round = 0;
  for (zpDataType_t dt : {zpFloat32, zpBfloat16}) {
    if (!err.empty()) break;
    zpBatchPlan_t plan = zptest::deviceAttentionPlan(n, (int)(rng() % 2), rpn, rng);
    if (!plan) {
      err = std::string("zpPlanCreate: ") + zpGetLastError(nullptr);
      break;
    }
    err = zptest::deviceAttentionError(comm, rank, plan, dt, round++ % 2, stream, rng());
    zpPlanDestroy(plan);
  }
  if (stream) cudaStreamDestroy(stream);
  zpCommDestroy(comm);
  if (!err.empty()) {
    fprintf(stderr, "rank %d (device %d): %s\n", rank, device, err.c_str());
    return 1;
  }
  printf("rank %d of %d: ok\n", rank, n);
  return 0;
}

// The bytes this rank's NCCL sends carried to ranks of other nodes so far.
unsigned long long interNodeBytes(zpComm_t comm, int rank, int n, int rpn) {
  ncclComm_t nccl = nullptr;
  if (zpCommGetNcclComm(comm, &nccl) != zpSuccess) return ~0ull;
  unsigned long long total = 0;
  for (int p = 0; p < n; p++) {
    unsigned long long sent = 0;
    if (p / rpn != rank / rpn && fakencclPeerBytes(nccl, p, &sent) == ncclSuccess) total += sent;
  }
  return total;
}

// One routed device alltoallv whose only traffic is `bytes` from rank 0 to
// rank `to`: "" if every byte arrived, no call waited for the device, and
// the inter-node bytes were carried as `routing` would carry them.
std::string proxyCheck(zpComm_t comm, int rank, int n, int rpn, int routing, uint64_t seed) {
  const int to = rpn >= 2 ? rpn + 1 : rpn;
  const size_t count = 128 << 10;  // float32: 512 KiB, many chunks (ZP_ROUTE_CHUNK)
  zptest::CountMatrix m(n, std::vector<size_t>(n, 0));
  m[0][to] = count;
  zptest::AlltoallvRun run(rank, m, zpFloat32, seed);
  run.recvBuffer().poison();
  zptest::DeviceMirror send(run.sendBuffer()), recv(run.recvBuffer());
  if (!send.ok() || !recv.ok()) return "cudaMalloc failed";
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return "cudaStreamCreate failed";
  const unsigned long long before = interNodeBytes(comm, rank, n, rpn), waits = fakecudaHostWaits();
  zpResult_t r = zpAlltoallv(send.data(), run.sendCounts(), run.sendDispls(), recv.data(), run.recvCounts(),
                             run.recvDispls(), zpFloat32, comm, stream);
  std::string err;
  if (r != zpSuccess) err = std::string("zpAlltoallv: ") + zpGetLastError(comm);
  if (err.empty() && fakecudaHostWaits() != waits) err = "zpAlltoallv waited for the device";
  if (err.empty() && cudaStreamSynchronize(stream) != cudaSuccess) err = "cudaStreamSynchronize failed";
  cudaStreamDestroy(stream);
  if (err.empty() && (recv.copyBack() != cudaSuccess || send.copyBack() != cudaSuccess)) err = "copying back failed";
  if (err.empty()) err = run.check();
  // Every rank's carried bytes, at every rank (over the host path; every
  // rank makes this call, also after a failure, so that none waits for it).
  uint64_t mine = interNodeBytes(comm, rank, n, rpn) - before;
  std::vector<uint64_t> all(n);
  if (zpAllGather(&mine, all.data(), 1, zpUint64, comm, nullptr) != zpSuccess && err.empty())
    err = std::string("zpAllGather: ") + zpGetLastError(comm);
  if (!err.empty()) return err;
  const uint64_t total = count * 4;
  std::string who;
  uint64_t sum = 0;
  int carriers = 0;
  for (int p = 0; p < n; p++) {
    sum += all[p];
    carriers += all[p] > 0;
    who += " " + std::to_string(all[p]);
  }
  const std::string mode = routing == zpRoutingOff ? "off" : routing == zpRoutingRail ? "rail" : "balanced";
  std::string bad;
  if (sum != total) bad = "the inter-node bytes add up to " + std::to_string(sum) + ", not " + std::to_string(total);
  else if (routing == zpRoutingOff && all[0] != total) bad = "rank 0 did not send its own bytes";
  else if (routing == zpRoutingRail && all[to % rpn] != total)
    bad = "the owner of the destination's rail (rank " + std::to_string(to % rpn) + ") did not carry them all";
  else if (routing == zpRoutingBalanced && (carriers < 2 || all[0] == total))
    bad = "balanced routing did not spread them over node 0's proxies";
  return bad.empty() ? "" : mode + ": " + bad + " (inter-node bytes sent by rank:" + who + ")";
}

// Calls enqueued back to back on three streams, with no synchronisation
// between them: each reuses the staging of the one before, and must wait
// for it on the device (an event), not on the host.
std::string streamsCheck(zpComm_t comm, int rank, int n, uint64_t seed) {
  constexpr int kCalls = 3;
  std::vector<std::unique_ptr<zptest::AlltoallvRun>> runs;
  std::vector<std::unique_ptr<zptest::DeviceMirror>> sends, recvs;
  std::vector<cudaStream_t> streams(kCalls, nullptr);
  std::string err;
  for (int i = 0; i < kCalls; i++) {
    runs.emplace_back(new zptest::AlltoallvRun(rank, zptest::randomCounts(n, seed + i, 40000, 0.1), zpFloat32,
                                               seed + kCalls + i));
    runs[i]->recvBuffer().poison();
    sends.emplace_back(new zptest::DeviceMirror(runs[i]->sendBuffer()));
    recvs.emplace_back(new zptest::DeviceMirror(runs[i]->recvBuffer()));
    if (!sends[i]->ok() || !recvs[i]->ok() || cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking) != cudaSuccess)
      return "cudaMalloc or cudaStreamCreate failed";
  }
  for (int i = 0; i < kCalls && err.empty(); i++)
    if (zpAlltoallv(sends[i]->data(), runs[i]->sendCounts(), runs[i]->sendDispls(), recvs[i]->data(),
                    runs[i]->recvCounts(), runs[i]->recvDispls(), zpFloat32, comm, streams[i]) != zpSuccess)
      err = std::string("zpAlltoallv: ") + zpGetLastError(comm);
  for (int i = 0; i < kCalls; i++) {
    if (cudaStreamSynchronize(streams[i]) != cudaSuccess && err.empty()) err = "cudaStreamSynchronize failed";
    cudaStreamDestroy(streams[i]);
  }
  for (int i = 0; i < kCalls && err.empty(); i++) {
    if (recvs[i]->copyBack() != cudaSuccess || sends[i]->copyBack() != cudaSuccess) err = "copying back failed";
    else err = runs[i]->check();
  }
  return err.empty() ? "" : "calls on three streams: " + err;
}

// The routed call captured in a CUDA graph (global mode: no allocation, no
// wait for an event from outside the capture), not run by the capture,
// then launched twice with fresh inputs, every byte checked each time.
std::string captureCheck(zpComm_t comm, int rank, int n, uint64_t seed) {
  zptest::AlltoallvRun run(rank, zptest::randomCounts(n, seed, 20000, 0.2), zpFloat32, seed + 1);
  run.recvBuffer().poison();
  zptest::DeviceMirror send(run.sendBuffer()), recv(run.recvBuffer());
  cudaStream_t stream = nullptr;
  if (!send.ok() || !recv.ok() || cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
    return "capture: cudaMalloc or cudaStreamCreate failed";
  std::string err;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) != cudaSuccess) err = "cudaStreamBeginCapture failed";
  if (err.empty() && zpAlltoallv(send.data(), run.sendCounts(), run.sendDispls(), recv.data(), run.recvCounts(),
                                 run.recvDispls(), zpFloat32, comm, stream) != zpSuccess)
    err = std::string("zpAlltoallv: ") + zpGetLastError(comm);
  cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (err.empty() && ended != cudaSuccess) err = std::string("cudaStreamEndCapture: ") + cudaGetErrorString(ended);
  if (err.empty() && (recv.copyBack() != cudaSuccess || run.recvBuffer().writtenBytes() != 0))
    err = "the capture ran the call";
  if (err.empty() && cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) err = "cudaGraphInstantiate failed";
  for (int launch = 0; launch < 2 && err.empty(); launch++) {
    run.refill(seed * 31 + launch + 1);
    if (send.upload() != cudaSuccess || recv.upload() != cudaSuccess) err = "uploading";
    else if (cudaGraphLaunch(exec, stream) != cudaSuccess || cudaStreamSynchronize(stream) != cudaSuccess)
      err = "the launch failed";
    else if (recv.copyBack() != cudaSuccess || send.copyBack() != cudaSuccess) err = "copying back";
    else err = run.check();
    if (!err.empty()) err = "launch " + std::to_string(launch) + ": " + err;
  }
  if (exec) cudaGraphExecDestroy(exec);
  if (graph) cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  return err.empty() ? "" : "captured in a graph: " + err;
}

// Rank 0 sends 100 elements to the last rank, which expects 99.
std::string mismatchCheck(zpComm_t comm, int rank, int n, uint64_t seed) {
  std::vector<size_t> send(n, 100), recvCounts(n, 100);
  if (rank == n - 1) recvCounts[0] = 99;
  zptest::AlltoallvRun run(rank, n, send, recvCounts, zpFloat32, seed);
  zptest::DeviceMirror s(run.sendBuffer()), r(run.recvBuffer());
  if (!s.ok() || !r.ok()) return "cudaMalloc failed";
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return "cudaStreamCreate failed";
  zpResult_t res = zpAlltoallv(s.data(), run.sendCounts(), run.sendDispls(), r.data(), run.recvCounts(),
                               run.recvDispls(), zpFloat32, comm, stream);
  const std::string msg = zpGetLastError(comm);
  const std::string want = "rank 0 sends 100 elements to rank " + std::to_string(n - 1) + " but rank " +
                           std::to_string(n - 1) + " expects 99";
  std::string err;
  if (res != zpInvalidUsage) err = std::string("mismatched counts gave ") + zpGetErrorString(res) + ": " + msg;
  else if (msg.find(want) == std::string::npos) err = "mismatched counts: a wrong message: " + msg;
  if (cudaStreamSynchronize(stream) != cudaSuccess && err.empty()) err = "cudaStreamSynchronize failed";
  cudaStreamDestroy(stream);
  if (err.empty() && r.copyBack() != cudaSuccess) err = "copying back failed";
  if (err.empty() && run.recvBuffer().writtenBytes() != 0) err = "mismatched counts: the receive buffer was written";
  return err;
}

// Makes the communicator's GPU current: "" or what failed.
std::string useCommDevice(zpComm_t comm, int* device) {
  ncclComm_t nccl = nullptr;
  if (zpCommGetNcclComm(comm, &nccl) != zpSuccess || ncclCommCuDevice(nccl, device) != ncclSuccess ||
      cudaSetDevice(*device) != cudaSuccess)
    return std::string("no NCCL communicator: ") + zpGetLastError(comm);
  return "";
}

// Whether this rank's rail report calls `rail` slow.
bool railNamedSlow(zpComm_t comm, int rail) {
  zpRailEntry_t rails[8];
  int count = 0;
  if (zpCommGetRailReport(comm, rails, 8, &count) != zpSuccess) return false;
  for (int i = 0; i < count && i < 8; i++)
    if (rails[i].rail == rail) return rails[i].slow != 0;
  return false;
}

int deviceSlowRailMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  using Clock = std::chrono::steady_clock;
  const int rpn = envInt("ZP_LOCAL_NRANKS", n), slow = envInt("ZP_TEST_SLOW_RAIL", 2);
  const int seconds = envInt("ZP_TEST_SECONDS", 20);
  int device = -1;
  std::string err = useCommDevice(comm, &device);
  // Host sends from rank 0 to node 1's first rank until every rank's report
  // names the rail (the device path's own transfers are not measured).
  const size_t bytes = 32 << 20;
  zptest::GuardedBuffer buf(bytes, 1);
  const auto start = Clock::now();
  int32_t named = 0;
  for (int round = 0; err.empty(); round++) {
    const int32_t mine = railNamedSlow(comm, slow) ? 1 : 0;
    int32_t late = rank == 0 && Clock::now() - start > std::chrono::seconds(seconds);
    if (zpAllReduce(&mine, &named, 1, zpInt32, zpMin, comm, nullptr) != zpSuccess ||
        zpBroadcast(&late, &late, 1, zpInt32, 0, comm, nullptr) != zpSuccess) {
      err = std::string("agreeing on the rails: ") + zpGetLastError(comm);
      break;
    }
    if (named || late) break;
    if (rank != 0 && rank != rpn) continue;
    double ms = 0;
    err = pairRound(comm, rank, rpn, buf, seed + round, &ms);
    if (!err.empty()) err = "host round: " + err;
  }
  if (err.empty() && !named)
    err = "rail " + std::to_string(slow) + " was not named slow on every rank within " + std::to_string(seconds) + " s";
  // One routed device transfer from rank 0 to node 1's second rank: the
  // proxy of the slow rail must carry much less than the others (with
  // nominal rates each of the 4 rails carries about a quarter).
  const int to = rpn + 1;
  const size_t count = 2 << 20;  // float32: 8 MiB
  zptest::CountMatrix m(n, std::vector<size_t>(n, 0));
  m[0][to] = count;
  zptest::AlltoallvRun run(rank, m, zpFloat32, seed);
  run.recvBuffer().poison();
  zptest::DeviceMirror send(run.sendBuffer()), recv(run.recvBuffer());
  const unsigned long long before = interNodeBytes(comm, rank, n, rpn);
  cudaStream_t stream = nullptr;
  if (send.ok() && recv.ok() && cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) == cudaSuccess) {
    zpResult_t r = zpAlltoallv(send.data(), run.sendCounts(), run.sendDispls(), recv.data(), run.recvCounts(),
                               run.recvDispls(), zpFloat32, comm, stream);
    if (r != zpSuccess && err.empty()) err = std::string("device zpAlltoallv: ") + zpGetLastError(comm);
    if (err.empty() && cudaStreamSynchronize(stream) != cudaSuccess) err = "cudaStreamSynchronize failed";
    cudaStreamDestroy(stream);
    if (err.empty() && recv.copyBack() != cudaSuccess) err = "copying back failed";
    if (err.empty()) err = run.check();
  } else if (err.empty()) {
    err = "cudaMalloc or cudaStreamCreate failed";
  }
  uint64_t mine = interNodeBytes(comm, rank, n, rpn) - before;
  std::vector<uint64_t> all(n);
  if (zpAllGather(&mine, all.data(), 1, zpUint64, comm, nullptr) != zpSuccess && err.empty())
    err = std::string("zpAllGather: ") + zpGetLastError(comm);
  if (err.empty()) {
    uint64_t others = 0;
    std::string who;
    for (int p = 0; p < rpn; p++) {
      if (p != slow) others += all[p];
      who += " " + std::to_string(all[p]);
    }
    if (all[slow] * 4 * (rpn - 1) > others)
      err = "the slow rail's proxy (rank " + std::to_string(slow) + ") carried over a quarter of the others' mean" +
            " (inter-node bytes sent by node 0's ranks:" + who + ")";
    else if (rank == 0)
      printf("rank 0: device transfer carried by node 0's ranks:%s bytes\n", who.c_str());
  }
  // And every byte of a full routed device alltoallv planned the same way.
  if (err.empty())
    err = zptest::deviceAlltoallvError(comm, rank, zptest::randomCounts(n, seed + 1, 200000, 0.1), zpFloat32, seed + 2);
  if (zpCommDestroy(comm) != zpSuccess && err.empty()) err = "zpCommDestroy failed";
  if (!err.empty()) {
    fprintf(stderr, "rank %d (device %d): %s\n", rank, device, err.c_str());
    return 1;
  }
  printf("rank %d of %d: ok\n", rank, n);
  return 0;
}

int deviceRouteMode(zpComm_t comm, int rank, int n, uint64_t seed) {
  const int rpn = envInt("ZP_LOCAL_NRANKS", n);
  const char* env = getenv("ZP_ROUTING");
  const std::string mode = env && *env ? env : "balanced";
  const int routing = mode == "off" ? zpRoutingOff : mode == "rail" ? zpRoutingRail : zpRoutingBalanced;
  int device = -1;
  std::string err = useCommDevice(comm, &device);
  // Every rank makes every call, also after a failed check (the first
  // failure is reported), so that a wrong result ends the run at once
  // instead of leaving peers waiting for the rank that stopped.
  std::mt19937_64 rng(seed);
  auto note = [&](const std::string& what, const std::string& e) {
    if (err.empty() && !e.empty()) err = what + e;
  };
  for (int round = 0; round < 3; round++) {
    const zpDataType_t dt = round == 1 ? zpUint8 : zpFloat32;  // 1-byte elements: odd chunk ends
    note("alltoallv: ", zptest::deviceAlltoallvError(comm, rank, zptest::randomCounts(n, rng(), 20000, 0.25), dt, rng()));
  }
  note("", streamsCheck(comm, rank, n, rng()));
  note("", proxyCheck(comm, rank, n, rpn, routing, rng()));
  note("", captureCheck(comm, rank, n, rng()));
  note("", mismatchCheck(comm, rank, n, rng()));
  // And the communicator still works.
  note("after the mismatch: ",
       zptest::deviceAlltoallvError(comm, rank, zptest::randomCounts(n, rng(), 5000, 0.25), zpFloat32, rng()));
  if (zpCommDestroy(comm) != zpSuccess && err.empty()) err = "zpCommDestroy failed";
  if (!err.empty()) {
    fprintf(stderr, "rank %d (device %d, ZP_ROUTING=%s): %s\n", rank, device, mode.c_str(), err.c_str());
    return 1;
  }
  printf("rank %d of %d: ok\n", rank, n);
  return 0;
}
#endif

}  // namespace

int runRank() {
  const std::string mode = getenv("ZP_TEST_MODE") ? getenv("ZP_TEST_MODE") : "check";
  const int envRank = envInt("ZP_RANK", -1), envN = envInt("ZP_NRANKS", 0);
  if (mode == "foreign" && envRank == envN - 1) {
    zpUniqueId id;
    const char* hex = getenv("ZP_UNIQUE_ID");
    if (hex && zp::idFromHex(hex, &id)) connectAsStranger(id);
  }
  zpComm_t comm = nullptr;
  zpResult_t r = zpCommInitFromEnv(&comm, nullptr);
  if (r != zpSuccess) {
    fprintf(stderr, "zp_multinode_rank: init: %s: %s\n", zpGetErrorString(r), zpGetLastError(nullptr));
    return 1;
  }
  int rank = -1, n = 0;
  zpCommUserRank(comm, &rank);
  zpCommCount(comm, &n);
  // Rank 0 draws the seed: fresh inputs every run (ZP_TEST_SEED repeats a
  // run; rank 0 prints the seed it used).
  uint64_t seed = rank == 0 ? (std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}()) : 0;
  if (rank == 0 && getenv("ZP_TEST_SEED")) seed = strtoull(getenv("ZP_TEST_SEED"), nullptr, 10);
  if (rank == 0) printf("rank 0: seed %llu (ZP_TEST_SEED repeats it)\n", (unsigned long long)seed);
  zpGroupStart();
  for (int p = 1; p < n && rank == 0; p++) zpSend(&seed, 1, zpUint64, p, comm, nullptr);
  if (rank != 0) zpRecv(&seed, 1, zpUint64, 0, comm, nullptr);
  if ((r = zpGroupEnd()) != zpSuccess) {
    fprintf(stderr, "rank %d: sharing the seed: %s\n", rank, zpGetLastError(comm));
    return 1;
  }

  if (mode == "kill") {
    const int victim = envInt("ZP_TEST_VICTIM", n - 1);
    auto start = std::chrono::steady_clock::now();
    for (int it = 0; it < 1000; it++) {
      if (rank == victim && it == 3) raise(SIGKILL);
      std::string err = zptest::alltoallvError(comm, rank, zptest::randomCounts(n, seed + it, 20000, 0.1), zpUint8,
                                               seed + it);
      if (err.empty()) continue;
      zpResult_t async = zpSuccess;
      zpCommGetAsyncError(comm, &async);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      bool ok = async == zpRemoteError && err.find("remote process") != std::string::npos;
      printf("rank %d: %s after %d calls, %.0f ms: %s\n", rank, ok ? "remote error as expected" : "WRONG ERROR", it,
             ms, err.c_str());
      zpCommAbort(comm);
      return ok ? 0 : 1;
    }
    printf("rank %d: no error although rank %d died\n", rank, victim);
    return 1;
  }

  if (mode == "late") return lateMode(comm, rank, n, seed);
  if (mode == "earlybye") return earlyByeMode(comm, rank, n, seed);
  if (mode == "refused") return refusedMode(comm, rank, n, seed);
  if (mode == "anysource") {
    const std::string err = zptest::anySourceErrors(comm, rank, n, seed);
    if (zpCommDestroy(comm) != zpSuccess || !err.empty()) {
      fprintf(stderr, "%s\n", err.empty() ? "zpCommDestroy failed" : err.c_str());
      return 1;
    }
    printf("rank %d: ok\n", rank);
    return 0;
  }
  if (mode == "refusal") return refusalMode(comm, rank, n, seed);
  if (mode == "nicdown") return nicDownMode(comm, rank, n, seed);
  if (mode == "nicdownleave") return nicDownLeaveMode(comm, rank, n, seed);
  if (mode == "rails") return railsMode(comm, rank, n, seed);
  if (mode == "lag") return lagMode(comm, rank, n, seed);
  if (mode == "skew") return skewMode(comm, rank, n, seed);
  if (mode == "alldown") return allDownMode(comm, rank, n, seed);
  if (mode == "remap") return remapMode(comm, rank, n, seed);
  if (mode == "killcoll") return killCollMode(comm, rank, n, seed);
  if (mode == "collectives") return collectivesMode(comm, rank, n, seed);
  if (mode == "slices") return slicesMode(comm, rank, n, seed);
  if (mode == "zero") return zeroMode(comm, rank, n, seed);
  if (mode == "attention") return attentionMode(comm, rank, n, seed);
#ifdef ZP_TEST_DOUBLE
  if (mode == "device") return deviceMode(comm, rank, n, seed);
  if (mode == "devroute") return deviceRouteMode(comm, rank, n, seed);
  if (mode == "devslow") return deviceSlowRailMode(comm, rank, n, seed);
#endif

  if (mode == "idle") {
    const int rpn = envInt("ZP_LOCAL_NRANKS", 1), nics = envInt("ZP_NICS_PER_NODE", 1);
    const size_t bytes = 8u << 20;
    std::string err;
    if (rank == 0 || rank == rpn) {
      // Received bytes of this node's NIC k (read on the receiving side: the
      // sender is done once its proxies have taken the chunks, before they
      // are on the wire).
      auto rxBytes = [&](int k) {
        unsigned long long v = 0;
        std::string path = "/sys/class/net/zpnic" + std::to_string(k) + "/statistics/rx_bytes";
        if (FILE* f = fopen(path.c_str(), "r")) {
          if (fscanf(f, "%llu", &v) != 1) v = 0;
          fclose(f);
        }
        return v;
      };
      std::vector<unsigned long long> before(nics);
      for (int k = 0; k < nics; k++) before[k] = rxBytes(k);
      zptest::GuardedBuffer buf(bytes, 1);
      if (rank == 0) buf.fill(seed, 0, rpn);
      auto start = std::chrono::steady_clock::now();
      r = rank == 0 ? zpSend(buf.data(), bytes, zpUint8, rpn, comm, nullptr)
                    : zpRecv(buf.data(), bytes, zpUint8, 0, comm, nullptr);
      double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      int busyNics = 0;
      for (int k = 1; k < nics; k++) busyNics += rxBytes(k) - before[k] > (1u << 20);
      if (r != zpSuccess) err = std::string("transfer failed: ") + zpGetLastError(comm);
      else if (rank == rpn && buf.wrongBytes(seed, 0, rpn)) err = "wrong bytes";
      else if (rank == rpn && buf.guardBytesWritten()) err = "guard bytes written";
      else if (s > 4.5) err = "took " + std::to_string(s) + " s: the proxies did not relay while their ranks slept";
      else if (rank == rpn && nics > 1 && busyNics == 0) err = "only the receiver's NIC carried the transfer";
    } else {
      sleep(5);
    }
    std::string barrierErr = zptest::alltoallvError(comm, rank, zptest::randomCounts(n, seed, 16, 0), zpUint8, seed);
    if (err.empty()) err = barrierErr;
    zpCommDestroy(comm);
    if (!err.empty()) {
      fprintf(stderr, "rank %d: %s\n", rank, err.c_str());
      return 1;
    }
    printf("rank %d of %d: ok\n", rank, n);
    return 0;
  }

  int failures = 0;
  const size_t maxCounts[] = {0, 30, 4000, 300000};
  for (int it = 0; it < 8; it++) {
    zpDataType_t dt = (zpDataType_t)((seed + it) % zpNumTypes);
    std::string err = zptest::alltoallvError(comm, rank, zptest::randomCounts(n, seed + it, maxCounts[it % 4], 0.2),
                                             dt, seed * 7 + it);
    if (err.empty()) err = sendRecvError(comm, rank, n, 1 + it % (n - 1 > 0 ? n - 1 : 1), seed * 13 + it);
    if (!err.empty()) {
      fprintf(stderr, "rank %d of %d, iteration %d: %s\n", rank, n, it, err.c_str());
      failures++;
      break;
    }
  }
  if ((r = zpCommDestroy(comm)) != zpSuccess) failures++;
  if (failures) return 1;
  printf("rank %d of %d: ok\n", rank, n);
  return 0;
}

// Every mode ends with its communicator destroyed: then no UCX request may be
// left (a NIC that went down leaves requests on force-closed endpoints whose
// completions never come; destroy must free them all).
int main() {
  int rc = runRank();
  long live = zp::UcxTransport::liveRequests();
  if (rc == 0 && live != 0) {
    fprintf(stderr, "rank %s: %ld UCX requests not freed after the communicator was destroyed\n",
            getenv("ZP_RANK") ? getenv("ZP_RANK") : "?", live);
    rc = 1;
  }
  return rc;
}
