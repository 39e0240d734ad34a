// BenchComm over NCCL itself, for nccl_alltoallv_perf and the nccl_ variants
// of coll_perf (nccl_all_reduce_perf, ...): the same traffic as Zeppelin's
// programs moved by NCCL's grouped ncclSend / ncclRecv and by its own
// collectives, so that a GPU run puts Zeppelin and NCCL side by side. NCCL's communicator is the one
// under Zeppelin's (zpCommGetNcclComm): the same ranks and devices, created
// by Zeppelin's bootstrap; the benchmark's own control messages (barrier,
// timings, the check's sums) go through Zeppelin's host path, outside the
// timed loop.
#pragma once

#include <nccl.h>

#include "zp_comm.h"

namespace zpbench {

class NcclBenchComm : public ZpBenchComm {
 public:
  static bool supportsDevice() { return true; }
  static bool deviceOnly() { return true; }  // NCCL moves device buffers only

  void init(int* argc, char*** argv) {
    ZpBenchComm::init(argc, argv);
    check(zpCommGetNcclComm(comm_, &nccl_), "zpCommGetNcclComm");
  }

  std::string describe() const {
    int v = 0;
    ncclGetVersion(&v);
    // PXN (NCCL's own rail relay through a peer GPU) is the run's choice.
    const char* pxn = getenv("NCCL_PXN_DISABLE");
    char buf[128];
    snprintf(buf, sizeof buf, "NCCL %d.%d.%d (its own calls, NCCL_PXN_DISABLE=%s)", v / 10000, v / 100 % 100,
             v % 100, pxn && *pxn ? pxn : "unset");
    return buf;
  }

  void alltoallv(const void* sendBuf, const Layout& s, void* recvBuf, const Layout& r, const TypeInfo& t,
                 void* stream) {
    const char* sb = static_cast<const char*>(sendBuf);
    char* rb = static_cast<char*>(recvBuf);
    ncclCheck(ncclGroupStart(), "ncclGroupStart");
    for (int p = 0; p < nranks_; ++p) {
      if (s.counts[size_t(p)])
        ncclCheck(ncclSend(sb + s.displs[size_t(p)] * t.size, s.counts[size_t(p)] * t.size, ncclUint8, p, nccl_,
                           cudaStream_t(stream)),
                  "ncclSend");
      if (r.counts[size_t(p)])
        ncclCheck(ncclRecv(rb + r.displs[size_t(p)] * t.size, r.counts[size_t(p)] * t.size, ncclUint8, p, nccl_,
                           cudaStream_t(stream)),
                  "ncclRecv");
    }
    ncclCheck(ncclGroupEnd(), "ncclGroupEnd");
  }

  // The standard collectives (coll_perf.cc), sum where they reduce. NCCL
  // has no barrier (nccl-tests has no barrier_perf): barrier_perf has no
  // NCCL variant.
  void allreduce(const void* s, void* r, size_t count, const TypeInfo& t, void* stream) {
    ncclCheck(ncclAllReduce(s, r, count, ncclType(t), ncclSum, nccl_, cudaStream_t(stream)), "ncclAllReduce");
  }
  void allgather(const void* s, void* r, size_t count, const TypeInfo& t, void* stream) {
    ncclCheck(ncclAllGather(s, r, count, ncclType(t), nccl_, cudaStream_t(stream)), "ncclAllGather");
  }
  void reducescatter(const void* s, void* r, size_t count, const TypeInfo& t, void* stream) {
    ncclCheck(ncclReduceScatter(s, r, count, ncclType(t), ncclSum, nccl_, cudaStream_t(stream)), "ncclReduceScatter");
  }
  void broadcast(const void* s, void* r, size_t count, const TypeInfo& t, int root, void* stream) {
    ncclCheck(ncclBroadcast(s, r, count, ncclType(t), root, nccl_, cudaStream_t(stream)), "ncclBroadcast");
  }

 private:
  // zpDataType_t has NCCL's values (zeppelin.h).
  static ncclDataType_t ncclType(const TypeInfo& t) { return ncclDataType_t(t.zpType); }

  // Zeppelin made the communicator nonblocking: a call may answer
  // ncclInProgress, and then its state is polled until it settles.
  void ncclCheck(ncclResult_t r, const char* what) {
    while (r == ncclInProgress) ncclCommGetAsyncError(nccl_, &r);
    if (r == ncclSuccess) return;
    fprintf(stderr, "rank %d: %s failed: %s: %s\n", rank_, what, ncclGetErrorString(r), ncclGetLastError(nccl_));
    fflush(stderr);
    zpCommAbort(comm_);
    exit(1);
  }

  ncclComm_t nccl_ = nullptr;
};

using BenchComm = NcclBenchComm;

}  // namespace zpbench
