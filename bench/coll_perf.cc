// all_reduce_perf, all_gather_perf, reduce_scatter_perf, broadcast_perf,
// barrier_perf:
// nccl-tests style sweeps of the standard collectives, built from this file
// once per collective (ZP_BENCH_COLL) against Zeppelin, with ZP_BENCH_MPI
// against MPI (mpi_all_reduce_perf, ...) and, in a build with CUDA, with
// ZP_BENCH_NCCL against NCCL's own collectives (nccl_all_reduce_perf, ...,
// device buffers only; no barrier), so all measure the same calls the same
// way. -G 1: device buffers, the calls on a CUDA stream (device.h).
//
// size is nccl-tests' size: the all-reduce's and the broadcast's buffer, the
// all-gather's whole output, the reduce-scatter's whole input. Time = the
// slowest rank's mean per call; algbw = size / time; busbw as nccl-tests:
// all-reduce algbw * 2(n-1)/n, all-gather and reduce-scatter algbw * (n-1)/n,
// broadcast algbw. -c 1 checks every element after the timed loop: inputs
// are small integers, so sums are exact in every datatype and order.
// barrier_perf times zpBarrier (MPI_Barrier): its rows differ only in the
// size printed, and it has no bandwidth and nothing to check.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "device.h"
#ifdef ZP_BENCH_MPI
#include "mpi_comm.h"
#define PROG_PREFIX "mpi_"
#elif defined(ZP_BENCH_NCCL)
#include "nccl_comm.h"
#define PROG_PREFIX "nccl_"
#else
#include "zp_comm.h"
#define PROG_PREFIX ""
#endif

using namespace zpbench;

namespace {

enum Coll { kAllReduce, kAllGather, kReduceScatter, kBroadcast, kBarrier };
constexpr Coll kColl = Coll(ZP_BENCH_COLL);
const char* const kNames[] = {PROG_PREFIX "all_reduce_perf", PROG_PREFIX "all_gather_perf",
                              PROG_PREFIX "reduce_scatter_perf", PROG_PREFIX "broadcast_perf",
                              PROG_PREFIX "barrier_perf"};
const char* const kProg = kNames[kColl];

double busFactor(int n) {
  if (kColl == kAllReduce) return 2.0 * (n - 1) / n;
  if (kColl == kBroadcast) return 1.0;
  if (kColl == kBarrier) return 0.0;
  return double(n - 1) / n;
}

// Element i of rank r's input: small integers, exact in every type.
double inputOf(int r, size_t i) { return double((r + i) % 8); }

void store(void* buf, size_t i, const TypeInfo& t, double v) {
  switch (t.size) {
    case 4:
      if (t.zpType == 7) ((float*)buf)[i] = (float)v;
      else ((int32_t*)buf)[i] = (int32_t)v;
      break;
    case 8:
      if (t.zpType == 8) ((double*)buf)[i] = v;
      else ((int64_t*)buf)[i] = (int64_t)v;
      break;
    default: ((uint8_t*)buf)[i] = (uint8_t)v;
  }
}

double load(const void* buf, size_t i, const TypeInfo& t) {
  switch (t.size) {
    case 4: return t.zpType == 7 ? ((const float*)buf)[i] : ((const int32_t*)buf)[i];
    case 8: return t.zpType == 8 ? ((const double*)buf)[i] : (double)((const int64_t*)buf)[i];
    default: return ((const uint8_t*)buf)[i];
  }
}

// barrier_perf's call; NCCL has none (no nccl_barrier_perf is built).
template <class Comm>
void barrierOf(Comm& comm, void* stream) {
#ifdef ZP_BENCH_NCCL
  (void)comm, (void)stream;
#else
  comm.barrierCall(stream);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  Options opt = parseOptions(argc, argv, kProg, /*withPattern=*/false);
  if (BenchComm::deviceOnly()) opt.gpu = 1;
  requireDeviceSupport(opt, kProg, BenchComm::supportsDevice());
  const TypeInfo& t = *opt.type;
  if (opt.check && t.size == 2) {
    if (launcherRank() == 0) fprintf(stderr, "%s: -c 1 supports 8-, 32- and 64-bit types; pass -d float or -c 0\n", kProg);
    return 2;
  }
  BenchComm comm;
  comm.init(&argc, &argv);
  const int n = comm.nranks(), rank = comm.rank();
  const bool root = rank == 0;
  if (root) {
    char params[256];
    snprintf(params, sizeof params, "nranks %d  op sum  root 0  iters %d  warmup %d  datatype %s  check %d  gpu %d", n,
             opt.iters, opt.warmup, t.name, opt.check, opt.gpu);
    printRunHeader(kProg, comm.describe(), params, nicInfo());
  }
  unsigned long long totalWrong = 0;
  double busbwSum = 0;
  int rows = 0;
  for (size_t size : sizeSweep(opt)) {
    // count: elements per rank's block (the all-gather's input, the
    // reduce-scatter's output), or of the whole buffer.
    const bool blocks = kColl == kAllGather || kColl == kReduceScatter;
    const size_t count = blocks ? size / t.size / n : size / t.size;
    const size_t inElems = kColl == kAllGather ? count : blocks ? count * n : count;
    const size_t outElems = kColl == kReduceScatter ? count : blocks ? count * n : count;
    Buffer in(inElems * t.size), out(outElems * t.size);
    memset(in.data(), 0, in.size());  // touch every page before timing
    memset(out.data(), 0, out.size());
    CallStream stream(opt.gpu);
    CallBuffer inCall(in, opt.gpu), outCall(out, opt.gpu);
    auto call = [&] {
      void* const s = stream.get();
      switch (kColl) {
        case kAllReduce: comm.allreduce(inCall.data(), outCall.data(), count, t, s); break;
        case kAllGather: comm.allgather(inCall.data(), outCall.data(), count, t, s); break;
        case kReduceScatter: comm.reducescatter(inCall.data(), outCall.data(), count, t, s); break;
        case kBroadcast: comm.broadcast(inCall.data(), outCall.data(), count, t, 0, s); break;
        case kBarrier: barrierOf(comm, s); break;
      }
    };
    for (int i = 0; i < opt.warmup; ++i) call();
    stream.sync();
    comm.barrier();
    // On an emulated cluster, each NIC's transmitted bytes over the timed
    // calls, read by the first rank of each node (its namespace's NICs).
    const NicInfo nic = nicInfo();
    // zprun's description of the emulated cluster, from the environment:
    // this source is built against MPI too (mpi_*_perf), which links no Zeppelin.
    const int nics = getenv("ZP_NICS_PER_NODE") ? atoi(getenv("ZP_NICS_PER_NODE")) : 0;
    const bool nicReader = nics > 0 && rank % nic.ranksPerNode == 0;
    const std::vector<uint64_t> tx0 = nicReader ? nicTxBytes(nics) : std::vector<uint64_t>();
    const double t0 = nowSeconds();
    for (int i = 0; i < opt.iters; ++i) call();
    stream.sync();
    const double timeUs = comm.maxDouble((nowSeconds() - t0) / opt.iters) * 1e6;
    std::string nicLine;
    if (nics > 0) {
      const std::vector<uint64_t> tx1 = nicReader ? nicTxBytes(nics) : std::vector<uint64_t>();
      for (int node = 0; node < n / nic.ranksPerNode; node++) {
        nicLine += node ? "; node " + std::to_string(node) + ":" : "#   MiB per call sent by each NIC, node 0:";
        for (int k = 0; k < nics; k++) {
          const bool mine = nicReader && nic.nodeOf(rank) == node;
          const unsigned long long b = comm.sumU64(mine ? tx1[k] - tx0[k] : 0);
          char cell[32];
          snprintf(cell, sizeof cell, " %.1f", b / 1048576.0 / opt.iters);
          nicLine += cell;
        }
      }
    }

    long long wrong = -1;
    if (opt.check && kColl != kBarrier) {
      for (size_t i = 0; i < inElems; i++) store(in.data(), i, t, inputOf(rank, i));
      memset(out.data(), 0xA5, out.size());
      runMirrored(inCall, outCall, stream, call);
      size_t local = 0;
      for (size_t i = 0; i < outElems; i++) {
        double want = 0;
        if (kColl == kAllReduce || kColl == kReduceScatter) {
          const size_t at = kColl == kReduceScatter ? (size_t)rank * count + i : i;
          for (int r = 0; r < n; r++) want += inputOf(r, at);
        } else if (kColl == kAllGather) {
          want = inputOf((int)(i / count), i % count);
        } else {
          want = inputOf(0, i);
        }
        local += load(out.data(), i, t) != want;
      }
      const unsigned long long all = comm.sumU64(local);
      totalWrong += all;
      wrong = (long long)all;
    }
    const size_t bytes = (kColl == kAllGather ? outElems : inElems) * t.size;
    const double algbw = timeUs > 0 ? double(bytes) / (timeUs * 1e3) : 0.0;  // GB/s
    const double busbw = algbw * busFactor(n);
    busbwSum += busbw;
    ++rows;
    if (root) printTableRow(bytes, kColl == kAllGather ? outElems : inElems, t.name, timeUs, algbw, busbw, wrong);
    if (root && !nicLine.empty()) printf("%s\n", nicLine.c_str());
  }
  if (root) printTableFooter(totalWrong, opt.check != 0, busbwSum, rows);
  comm.finalize();
  return totalWrong == 0 ? 0 : 1;
}
