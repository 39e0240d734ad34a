// BenchComm over Zeppelin: the few operations the benchmarks need. Any failed
// call prints the result code and the library's message, aborts the
// communicator (so the other ranks fail at once instead of waiting for the
// timeout) and exits with status 1. mpi_comm.h has the same interface over MPI.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common.h"
#include "zeppelin.h"

namespace zpbench {

class ZpBenchComm {
 public:
  // Counts and displacements are size_t: every size fits.
  static bool fits(const Matrix&) { return true; }
  static const char* limitNote() { return ""; }
  // Device buffers on a stream (-G 1), in a build with CUDA.
  static bool supportsDevice() { return true; }
  static bool deviceOnly() { return false; }

  // routing: a zpRouting_t, or zpRoutingDefault for the library's choice.
  void init(int*, char***, int routing = zpRoutingDefault) {
    rank_ = launcherRank();  // for messages until the communicator knows
    zpConfig_t cfg = ZP_CONFIG_INITIALIZER;
    cfg.routing = routing;
    check(zpCommInitFromEnv(&comm_, &cfg), "zpCommInitFromEnv");
    check(zpCommUserRank(comm_, &rank_), "zpCommUserRank");
    check(zpCommCount(comm_, &nranks_), "zpCommCount");
  }

  // A second communicator over the same ranks, with its own routing mode:
  // rank 0 makes a unique id and hands it out over `first`.
  void initLike(ZpBenchComm& first, int routing) {
    rank_ = first.rank_;
    nranks_ = first.nranks_;
    zpUniqueId id = {};
    if (rank_ == 0) check(zpGetUniqueId(&id), "zpGetUniqueId");
    std::vector<zpUniqueId> ids(size_t(nranks_), id);
    std::vector<zpUniqueId> got(static_cast<size_t>(nranks_));
    first.exchange(ids.data(), got.data(), zpUint8, sizeof(zpUniqueId));
    zpConfig_t cfg = ZP_CONFIG_INITIALIZER;
    cfg.routing = routing;
    check(zpCommInitRankConfig(&comm_, nranks_, got[0], rank_, &cfg), "zpCommInitRankConfig");
  }
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }

  std::string describe() const {
    int v = 0;
    zpGetVersion(&v);
    // The routing mode applies across nodes with several rails, host and
    // device buffers alike; the header says which one this run asked for.
    char buf[128];
    snprintf(buf, sizeof buf, "Zeppelin %d.%d.%d (ZP_ROUTING=%s)", v / 10000, v / 100 % 100, v % 100,
             setting("ZP_ROUTING").c_str());
    return buf;
  }

  // stream: NULL for host buffers, a cudaStream_t for device buffers.
  void alltoallv(const void* sendBuf, const Layout& s, void* recvBuf, const Layout& r,
                 const TypeInfo& t, void* stream = nullptr) {
    check(zpAlltoallv(sendBuf, s.counts.data(), s.displs.data(), recvBuf, r.counts.data(),
                      r.displs.data(), zpDataType_t(t.zpType), comm_, zpStream_t(stream)),
          "zpAlltoallv");
  }

  // Sends sendBytes to `to` and receives recvBytes from `from` as one group;
  // a peer of -1 means no such side.
  void sendrecvBytes(const void* sendBuf, size_t sendBytes, int to, void* recvBuf, size_t recvBytes, int from) {
    check(zpGroupStart(), "zpGroupStart");
    if (to >= 0) check(zpSend(sendBuf, sendBytes, zpUint8, to, comm_, nullptr), "zpSend");
    if (from >= 0) check(zpRecv(recvBuf, recvBytes, zpUint8, from, comm_, nullptr), "zpRecv");
    check(zpGroupEnd(), "zpGroupEnd");
  }

  // The standard collectives (coll_perf.cc), sum where they reduce; stream
  // as alltoallv's.
  void allreduce(const void* s, void* r, size_t count, const TypeInfo& t, void* stream = nullptr) {
    check(zpAllReduce(s, r, count, zpDataType_t(t.zpType), zpSum, comm_, zpStream_t(stream)), "zpAllReduce");
  }
  void allgather(const void* s, void* r, size_t count, const TypeInfo& t, void* stream = nullptr) {
    check(zpAllGather(s, r, count, zpDataType_t(t.zpType), comm_, zpStream_t(stream)), "zpAllGather");
  }
  void reducescatter(const void* s, void* r, size_t count, const TypeInfo& t, void* stream = nullptr) {
    check(zpReduceScatter(s, r, count, zpDataType_t(t.zpType), zpSum, comm_, zpStream_t(stream)), "zpReduceScatter");
  }
  void broadcast(const void* s, void* r, size_t count, const TypeInfo& t, int root, void* stream = nullptr) {
    check(zpBroadcast(s, r, count, zpDataType_t(t.zpType), root, comm_, zpStream_t(stream)), "zpBroadcast");
  }

  // Every rank's k values, at every rank, in rank order.
  std::vector<uint64_t> allgatherU64(const std::vector<uint64_t>& mine) {
    std::vector<uint64_t> s, r(mine.size() * size_t(nranks_));
    for (int i = 0; i < nranks_; ++i) s.insert(s.end(), mine.begin(), mine.end());
    exchange(s.data(), r.data(), zpUint64, mine.size());
    return r;
  }

  // Sends count elements to peer `to` and receives count from `from`, as one group.
  void sendrecv(const void* sendBuf, int to, void* recvBuf, int from, size_t count,
                const TypeInfo& t, void* stream = nullptr) {
    check(zpGroupStart(), "zpGroupStart");
    check(zpSend(sendBuf, count, zpDataType_t(t.zpType), to, comm_, zpStream_t(stream)), "zpSend");
    check(zpRecv(recvBuf, count, zpDataType_t(t.zpType), from, comm_, zpStream_t(stream)), "zpRecv");
    check(zpGroupEnd(), "zpGroupEnd");
  }

  // The library's own barrier (barrier_perf).
  void barrierCall(void* stream = nullptr) { check(zpBarrier(comm_, zpStream_t(stream)), "zpBarrier"); }

  // One byte to and from every rank: nobody leaves before all have arrived.
  // (A zero-count alltoallv would do if the library always synchronizes on
  // it; a byte each way makes the barrier independent of that choice.)
  void barrier() {
    std::vector<unsigned char> s(size_t(nranks_), 1), r(static_cast<size_t>(nranks_));
    exchange(s.data(), r.data(), zpUint8);
  }

  // The maximum of v over all ranks (an alltoallv of one double each way).
  double maxDouble(double v) {
    std::vector<double> s(size_t(nranks_), v), r(static_cast<size_t>(nranks_));
    exchange(s.data(), r.data(), zpFloat64);
    double m = r[0];
    for (double x : r) m = x > m ? x : m;
    return m;
  }

  unsigned long long sumU64(unsigned long long v) {
    std::vector<uint64_t> s(size_t(nranks_), v), r(static_cast<size_t>(nranks_));
    exchange(s.data(), r.data(), zpUint64);
    unsigned long long sum = 0;
    for (uint64_t x : r) sum += x;
    return sum;
  }

  void finalize() {
    check(zpCommDestroy(comm_), "zpCommDestroy");
    comm_ = nullptr;
  }

 protected:
  // Block i (k elements) of s goes to rank i; block i of r comes from rank i.
  void exchange(const void* s, void* r, zpDataType_t type, size_t k = 1) {
    std::vector<size_t> counts(size_t(nranks_), k), displs(static_cast<size_t>(nranks_));
    for (int i = 0; i < nranks_; ++i) displs[size_t(i)] = size_t(i) * k;
    check(zpAlltoallv(s, counts.data(), displs.data(), r, counts.data(), displs.data(), type, comm_,
                      nullptr),
          "zpAlltoallv (control)");
  }

  void check(zpResult_t res, const char* what) {
    if (res == zpSuccess) return;
    fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank_, what, zpGetErrorString(res),
            zpGetLastError(comm_));
    fflush(stderr);
    if (comm_ != nullptr) zpCommAbort(comm_);
    exit(1);
  }

  zpComm_t comm_ = nullptr;
  int rank_ = -1;
  int nranks_ = 0;
};

#ifndef ZP_BENCH_NCCL
using BenchComm = ZpBenchComm;
#endif

}  // namespace zpbench
