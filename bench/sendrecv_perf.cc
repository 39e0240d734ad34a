// sendrecv_perf: nccl-tests style sweep of a ring shift. Every rank sends
// `size` bytes to (rank+1)%n and receives as many from (rank-1+n)%n, both in
// one zpGroupStart / zpGroupEnd. algbw = busbw = size / time, where time is
// the slowest rank's mean time per iteration. Built with ZP_BENCH_MPI as
// mpi_sendrecv_perf (MPI_Sendrecv on the same traffic), the peer of
// bench/compare_latency.py.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common.h"
#include "device.h"
#ifdef ZP_BENCH_MPI
#include "mpi_comm.h"
static const char* const kProg = "mpi_sendrecv_perf";
static constexpr bool kPeerHasDevice = false;
#else
#include "zp_comm.h"
static const char* const kProg = "sendrecv_perf";
static constexpr bool kPeerHasDevice = true;
#endif

using namespace zpbench;

int main(int argc, char** argv) {
  const Options opt = parseOptions(argc, argv, kProg, /*withPattern=*/false);
  requireDeviceSupport(opt, kProg, kPeerHasDevice);
  BenchComm comm;
  comm.init(&argc, &argv);
  const int n = comm.nranks(), rank = comm.rank();
  const int shift = opt.shift % n;
  const int next = (rank + shift) % n, prev = (rank - shift + n) % n;
  const NicInfo nic = nicInfo();
  // Only traffic that leaves the node counts against a NIC.
  const bool crossNode = nic.nodeOf(next) != nic.nodeOf(rank);
  const TypeInfo& t = *opt.type;
  const bool root = rank == 0;

  if (root) {
    char params[256];
    snprintf(params, sizeof params, "nranks %d  send to rank+%d, receive from rank-%d  iters %d  warmup %d  datatype %s  check %d  gpu %d",
             n, shift, shift, opt.iters, opt.warmup, t.name, opt.check, opt.gpu);
    printRunHeader(kProg, comm.describe(), params, nic);
  }

  unsigned long long totalWrong = 0;
  double busbwSum = 0;
  int rows = 0;
  for (size_t size : sizeSweep(opt)) {
    const size_t count = size / t.size;
    const size_t bytes = count * t.size;
    const Layout sl = singlePeerLayout(n, next, count), rl = singlePeerLayout(n, prev, count);
    Buffer sendBuf(bytes);
    Buffer recvBuf(bytes + kGuardBytes);
    memset(sendBuf.data(), 0x11, sendBuf.size());  // touch pages before timing
    memset(recvBuf.data(), 0, recvBuf.size());
    CallStream stream(opt.gpu);
    CallBuffer sendCall(sendBuf, opt.gpu), recvCall(recvBuf, opt.gpu);
    auto call = [&] { comm.sendrecv(sendCall.data(), next, recvCall.data(), prev, count, t, stream.get()); };

    const SchedStat before = schedStat();
    const double timeUs = timeCalls(comm, stream, opt, call);
    const SchedStat spent = schedStat() - before;

    long long wrong = -1;
    if (opt.check) {
      const uint64_t seed = sizeSeed(opt.seed, size);
      wrong = checkBlocks(comm, sendCall, recvCall, stream, call, sendBuf, sl, recvBuf, rl, t, seed, rank,
                          bytes);
      totalWrong += wrong;
    }

    const double algbw = timeUs > 0 ? double(bytes) / (timeUs * 1e3) : 0.0;  // GB/s
    busbwSum += algbw;
    ++rows;
    // Collective: every rank takes part even when only some cross nodes.
    double pct = comm.maxDouble(crossNode ? nicPercent(nic, double(bytes), timeUs) : -1);
    if (nic.bitsPerSec > 0 && pct < 0) pct = 0;
    if (root) printTableRow(bytes, count, t.name, timeUs, algbw, algbw, wrong, pct);
    // Where a call's time went on the rank that waited longest for a core:
    // a busy machine's latency is mostly ranks off their cores.
    const double perCall = 1e-3 / (opt.iters + opt.warmup);
    const double queued = comm.maxDouble(spent.queuedNs * perCall), onCpu = comm.maxDouble(spent.onCpuNs * perCall);
    const double slices = comm.maxDouble(double(spent.slices) / (opt.iters + opt.warmup));
    if (root) printf("#  sched %zu B: per call (worst rank) %.3f us on a core, %.3f us waiting for one, %.4f slices\n",
                     bytes, onCpu, queued, slices);
  }
  if (root) printTableFooter(totalWrong, opt.check != 0, busbwSum, rows);
  comm.finalize();
  return totalWrong == 0 ? 0 : 1;
}
