// alltoallv_perf: nccl-tests style sweep of an all-to-all with variable
// counts. Built from this file against Zeppelin (alltoallv_perf, run under
// zprun), with ZP_BENCH_MPI against MPI (mpi_alltoallv_perf, run under
// mpirun) and, in a build with CUDA, with ZP_BENCH_NCCL as NCCL's own grouped
// ncclSend / ncclRecv (nccl_alltoallv_perf, device buffers only), so all
// measure exactly the same traffic the same way. -G 1: device buffers.
//
// Per size: warmup, a barrier, `iters` timed calls; time = the slowest rank's
// mean per call. algbw = largest per-rank byte count (max over ranks of
// max(bytes sent, bytes received)) / time; busbw = algbw * (n-1)/n.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "device.h"
#ifdef ZP_BENCH_MPI
#include "mpi_comm.h"
static const char* const kProg = "mpi_alltoallv_perf";
#elif defined(ZP_BENCH_NCCL)
#include "nccl_comm.h"
static const char* const kProg = "nccl_alltoallv_perf";
#else
#include "zp_comm.h"
static const char* const kProg = "alltoallv_perf";
#endif

using namespace zpbench;

int main(int argc, char** argv) {
  Options opt = parseOptions(argc, argv, kProg, /*withPattern=*/true);
  if (BenchComm::deviceOnly()) opt.gpu = 1;
  requireDeviceSupport(opt, kProg, BenchComm::supportsDevice());
  BenchComm comm;
  comm.init(&argc, &argv);
  const int n = comm.nranks(), rank = comm.rank();
  const TypeInfo& t = *opt.type;
  const bool root = rank == 0;
  const NicInfo nic = nicInfo();

  // Every rank reads the file, so all fail (or not) together.
  std::vector<double> fileWeights;
  if (opt.pattern == "matrix") {
    std::string err;
    if (!readMatrixFile(opt.matrixFile, n, &fileWeights, &err)) {
      if (root) fprintf(stderr, "%s: %s\n", kProg, err.c_str());
      comm.finalize();
      return 2;
    }
  }

  if (root) {
    char params[512];
    snprintf(params, sizeof params, "nranks %d  pattern %s%s%s  seed %llu  iters %d  warmup %d  datatype %s  check %d  gpu %d", n,
             opt.pattern.c_str(), opt.matrixFile.empty() ? "" : ":", opt.matrixFile.c_str(),
             (unsigned long long)opt.seed, opt.iters, opt.warmup, t.name, opt.check, opt.gpu);
    printRunHeader(kProg, comm.describe(), params, nic);
  }

  unsigned long long totalWrong = 0;
  double busbwSum = 0;
  int rows = 0;
  for (size_t size : sizeSweep(opt)) {
    const Matrix m = buildMatrix(opt, n, size, fileWeights);
    const size_t elems = rowElems(size, n, t.size);
    if (!BenchComm::fits(m)) {
      if (root) printf("# %zu bytes skipped: %s\n", elems * t.size, BenchComm::limitNote());
      continue;
    }
    const Layout sl = sendLayout(m, rank), rl = recvLayout(m, rank);
    Buffer sendBuf(sl.totalElems * t.size);
    Buffer recvBuf(rl.totalElems * t.size + kGuardBytes);
    // Touch every page before timing so first-touch faults are not measured.
    memset(sendBuf.data(), 0x11, sendBuf.size());
    memset(recvBuf.data(), 0, recvBuf.size());
    CallStream stream(opt.gpu);
    CallBuffer sendCall(sendBuf, opt.gpu), recvCall(recvBuf, opt.gpu);
    auto call = [&] { comm.alltoallv(sendCall.data(), sl, recvCall.data(), rl, t, stream.get()); };

    const double timeUs = timeCalls(comm, stream, opt, call);

    long long wrong = -1;
    if (opt.check) {
      const uint64_t seed = sizeSeed(opt.seed, size);
      wrong = checkBlocks(comm, sendCall, recvCall, stream, call, sendBuf, sl, recvBuf, rl, t, seed, rank,
                          elems * t.size);
      totalWrong += wrong;
    }

    const double bytes = double(maxRankBytes(m, t.size));
    const double algbw = timeUs > 0 ? bytes / (timeUs * 1e3) : 0.0;  // GB/s
    const double busbw = algbw * double(n - 1) / double(n);
    busbwSum += busbw;
    ++rows;
    double pct = -1;
    if (nic.bitsPerSec > 0) {
      // The busiest rank's bytes to and from other nodes.
      double cross = 0;
      for (int r = 0; r < n; r++) {
        double out = 0, in = 0;
        for (int p = 0; p < n; p++)
          if (nic.nodeOf(p) != nic.nodeOf(r)) {
            out += double(m.at(r, p)) * double(t.size);
            in += double(m.at(p, r)) * double(t.size);
          }
        cross = std::max(cross, std::max(out, in));
      }
      pct = nicPercent(nic, cross, timeUs);
    }
    if (root) printTableRow(elems * t.size, elems, t.name, timeUs, algbw, busbw, wrong, pct);
  }
  if (root) printTableFooter(totalWrong, opt.check != 0, busbwSum, rows);
  comm.finalize();
  return totalWrong == 0 ? 0 : 1;
}
