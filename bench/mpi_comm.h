// BenchComm over MPI: the same interface as zp_comm.h, so alltoallv_perf.cc
// builds against either. MPI counts and displacements are int (in elements);
// sizes that do not fit are skipped by the caller (see fits()).
#pragma once

// Only the C API is used: skip the deprecated C++ bindings (and their warnings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <climits>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common.h"
#include "zeppelin.h"  // only for the zpDataType_t values in TypeInfo

namespace zpbench {

class BenchComm {
 public:
  // True if every rank's counts and displacements fit in int.
  static bool fits(const Matrix& m) {
    for (int r = 0; r < m.n; ++r)
      if (sendLayout(m, r).totalElems > size_t(INT_MAX) ||
          recvLayout(m, r).totalElems > size_t(INT_MAX))
        return false;
    return true;
  }
  static const char* limitNote() { return "MPI int counts/displacements overflow"; }
  // Host buffers only here (-G 1 is refused).
  static bool supportsDevice() { return false; }
  static bool deviceOnly() { return false; }

  void init(int* argc, char*** argv) {
    check(MPI_Init(argc, argv), "MPI_Init");
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);  // so check() can report
    check(MPI_Comm_rank(MPI_COMM_WORLD, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(MPI_COMM_WORLD, &nranks_), "MPI_Comm_size");
  }
  int rank() const { return rank_; }
  int nranks() const { return nranks_; }

  std::string describe() const {
    char v[MPI_MAX_LIBRARY_VERSION_STRING];
    int len = 0;
    MPI_Get_library_version(v, &len);
    std::string s(v, size_t(len));
    size_t cut = s.find_first_of(",\n");  // the first clause is enough
    if (cut != std::string::npos) s.resize(cut);
    return s + " (MPI_Alltoallv)";
  }

  void alltoallv(const void* sendBuf, const Layout& s, void* recvBuf, const Layout& r,
                 const TypeInfo& t, void* /*stream: always NULL*/ = nullptr) {
    toInt(s.counts, &sc_);
    toInt(s.displs, &sd_);
    toInt(r.counts, &rc_);
    toInt(r.displs, &rd_);
    MPI_Datatype dt = mpiType(t);
    check(MPI_Alltoallv(sendBuf, sc_.data(), sd_.data(), dt, recvBuf, rc_.data(), rd_.data(), dt,
                        MPI_COMM_WORLD),
          "MPI_Alltoallv");
  }

  void barrier() { check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier"); }
  void barrierCall(void* /*stream: always NULL*/ = nullptr) { barrier(); }  // barrier_perf

  // The standard collectives (coll_perf.cc), sum where they reduce.
  // (stream: always NULL, as alltoallv's)
  void allreduce(const void* s, void* r, size_t count, const TypeInfo& t, void* = nullptr) {
    check(MPI_Allreduce(s, r, int(count), mpiType(t), MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  }
  void allgather(const void* s, void* r, size_t count, const TypeInfo& t, void* = nullptr) {
    check(MPI_Allgather(s, int(count), mpiType(t), r, int(count), mpiType(t), MPI_COMM_WORLD), "MPI_Allgather");
  }
  void reducescatter(const void* s, void* r, size_t count, const TypeInfo& t, void* = nullptr) {
    check(MPI_Reduce_scatter_block(s, r, int(count), mpiType(t), MPI_SUM, MPI_COMM_WORLD),
          "MPI_Reduce_scatter_block");
  }
  // MPI_Bcast has one buffer: the root copies its input there first, as
  // Zeppelin's root does for separate buffers.
  void broadcast(const void* s, void* r, size_t count, const TypeInfo& t, int root, void* = nullptr) {
    if (rank_ == root && s != r) memcpy(r, s, count * t.size);
    check(MPI_Bcast(r, int(count), mpiType(t), root, MPI_COMM_WORLD), "MPI_Bcast");
  }

  // As zp_comm.h: one group of an optional send and an optional receive.
  void sendrecvBytes(const void* sendBuf, size_t sendBytes, int to, void* recvBuf, size_t recvBytes, int from) {
    MPI_Request req[2];
    int k = 0;
    if (from >= 0) check(MPI_Irecv(recvBuf, int(recvBytes), MPI_BYTE, from, 0, MPI_COMM_WORLD, &req[k++]), "MPI_Irecv");
    if (to >= 0)
      check(MPI_Isend(sendBuf, int(sendBytes), MPI_BYTE, to, 0, MPI_COMM_WORLD, &req[k++]), "MPI_Isend");
    check(MPI_Waitall(k, req, MPI_STATUSES_IGNORE), "MPI_Waitall");
  }

  // As zp_comm.h's (sendrecv_perf): count elements to `to`, count from `from`.
  void sendrecv(const void* sendBuf, int to, void* recvBuf, int from, size_t count, const TypeInfo& t,
                void* /*stream: host buffers only*/ = nullptr) {
    check(MPI_Sendrecv(sendBuf, int(count), mpiType(t), to, 0, recvBuf, int(count), mpiType(t), from, 0,
                       MPI_COMM_WORLD, MPI_STATUS_IGNORE),
          "MPI_Sendrecv");
  }

  std::vector<uint64_t> allgatherU64(const std::vector<uint64_t>& mine) {
    std::vector<uint64_t> r(mine.size() * size_t(nranks_));
    check(MPI_Allgather(mine.data(), int(mine.size()), MPI_UINT64_T, r.data(), int(mine.size()), MPI_UINT64_T,
                        MPI_COMM_WORLD),
          "MPI_Allgather");
    return r;
  }

  double maxDouble(double v) {
    double out = 0;
    check(MPI_Allreduce(&v, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD), "MPI_Allreduce");
    return out;
  }

  unsigned long long sumU64(unsigned long long v) {
    unsigned long long out = 0;
    check(MPI_Allreduce(&v, &out, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD),
          "MPI_Allreduce");
    return out;
  }

  void finalize() { check(MPI_Finalize(), "MPI_Finalize"); }

 private:
  // MPI has no 16-bit float types; the bytes move the same as uint16.
  static MPI_Datatype mpiType(const TypeInfo& t) {
    switch (t.zpType) {
      case zpInt8:
        return MPI_INT8_T;
      case zpUint8:
        return MPI_UINT8_T;
      case zpInt32:
        return MPI_INT32_T;
      case zpUint32:
        return MPI_UINT32_T;
      case zpInt64:
        return MPI_INT64_T;
      case zpUint64:
        return MPI_UINT64_T;
      case zpFloat32:
        return MPI_FLOAT;
      case zpFloat64:
        return MPI_DOUBLE;
      default:
        return MPI_UINT16_T;  // half, bfloat16
    }
  }

  // Callers only pass layouts that passed fits().
  static void toInt(const std::vector<size_t>& in, std::vector<int>* out) {
    out->resize(in.size());
    for (size_t i = 0; i < in.size(); ++i) (*out)[i] = int(in[i]);
  }

  void check(int err, const char* what) {
    if (err == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(err, msg, &len);
    fprintf(stderr, "rank %d: %s failed: %.*s\n", rank_, what, len, msg);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
  }

  int rank_ = -1;
  int nranks_ = 0;
  std::vector<int> sc_, sd_, rc_, rd_;
};

}  // namespace zpbench
