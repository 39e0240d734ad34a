// all_reduce_perf, all_gather_perf, reduce_scatter_perf, broadcast_perf:
// nccl-tests style sweeps of the standard collectives, one source built once
// per collective (ZP_BENCH_COLL = 0..3), against Zeppelin (run under zprun)
// and with ZP_BENCH_MPI against MPI (mpi_*_perf, under mpirun), so both
// measure the same calls the same way.
//
// Sizes are nccl-tests': all-reduce and broadcast, the buffer; all-gather,
// the whole output (n blocks); reduce-scatter, the whole input (n blocks).
// Per size: warmup, a barrier, `iters` timed calls; time = the slowest
// rank's mean per call; algbw = size / time and busbw as nccl-tests:
//   all-reduce algbw * 2(n-1)/n, all-gather and reduce-scatter algbw *
//   (n-1)/n, broadcast algbw.
// -c 1 fills every rank's input with small integers (a function of seed,
// rank and index) and checks every element of the result against the
// reduction computed here: with such inputs every summation order gives the
// same exact result in every type, so the check is exact (tolerance 0),
// whatever order the library reduces in.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#ifdef ZP_BENCH_MPI
#include "mpi_comm.h"
#define ZP_BENCH_PREFIX "mpi_"
#else
#include "zp_comm.h"
#define ZP_BENCH_PREFIX ""
#endif

using namespace zpbench;

namespace {

enum Coll { kAllReduce = 0, kAllGather = 1, kReduceScatter = 2, kBroadcast = 3 };
constexpr Coll kColl = Coll(ZP_BENCH_COLL);
const char* const kProgs[] = {ZP_BENCH_PREFIX "all_reduce_perf", ZP_BENCH_PREFIX "all_gather_perf",
                              ZP_BENCH_PREFIX "reduce_scatter_perf", ZP_BENCH_PREFIX "broadcast_perf"};
const bool kReduces = kColl == kAllReduce || kColl == kReduceScatter;

uint64_t mix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Element i of rank r's input: small integers that every type holds exactly,
// as do their sums and products over up to 32 ranks (prod: 1, 2 or -1 with
// few 2s; max / min: up to +-100; unsigned types: non-negative).
int64_t value(uint64_t seed, int r, size_t i, int op, bool sgn) {
  uint64_t h = mix(seed ^ mix(uint64_t(r) * 0x10001 + i));
  switch (op) {
    case 1: return (h % 8 == 0) ? 2 : (sgn && h % 8 == 1) ? -1 : 1;  // prod
    case 2: case 3: return sgn ? int64_t(h % 201) - 100 : int64_t(h % 201);
    default: return sgn ? int64_t(h % 17) - 8 : int64_t(h % 17);
  }
}

// float -> IEEE half / bfloat16, round to nearest even (finite values in
// half's normal range, which is all the check needs) and back.
uint16_t toHalf(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000, a = x & 0x7fffffff;
  if (a < 0x38800000) return uint16_t(sign);  // zero (nothing smaller occurs)
  uint32_t v = a - ((127 - 15) << 23), rest = v & 0x1fff;
  v >>= 13;
  if (rest > 0x1000 || (rest == 0x1000 && (v & 1))) v++;
  return uint16_t(sign | v);
}
uint16_t toBf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fff + ((x >> 16) & 1);
  return uint16_t(x >> 16);
}

void store(unsigned char* p, size_t i, const TypeInfo& t, double v) {
  switch (t.zpType) {
    case zpInt8: ((int8_t*)p)[i] = int8_t(int64_t(v)); break;
    case zpUint8: ((uint8_t*)p)[i] = uint8_t(int64_t(v)); break;
    case zpInt32: ((int32_t*)p)[i] = int32_t(int64_t(v)); break;
    case zpUint32: ((uint32_t*)p)[i] = uint32_t(int64_t(v)); break;
    case zpInt64: ((int64_t*)p)[i] = int64_t(v); break;
    case zpUint64: ((uint64_t*)p)[i] = uint64_t(int64_t(v)); break;
    case zpFloat16: ((uint16_t*)p)[i] = toHalf(float(v)); break;
    case zpBfloat16: ((uint16_t*)p)[i] = toBf16(float(v)); break;
    case zpFloat32: ((float*)p)[i] = float(v); break;
    default: ((double*)p)[i] = v; break;
  }
}

bool isSigned(const TypeInfo& t) {
  return t.zpType != zpUint8 && t.zpType != zpUint32 && t.zpType != zpUint64;
}

// The expected element: the reduction over n ranks of value(seed, r, idx),
// integers wrapping in their own width, avg the (wrapped) sum over n (floats:
// in float32 for the 16-bit types, rounded once, as zeppelin.h defines).
double expected(uint64_t seed, int n, size_t idx, const TypeInfo& t, int op) {
  const bool sgn = isSigned(t);
  int64_t acc = value(seed, 0, idx, op, sgn);
  for (int r = 1; r < n; r++) {
    int64_t v = value(seed, r, idx, op, sgn);
    if (op == 1) acc = int64_t(uint64_t(acc) * uint64_t(v));
    else if (op == 2) acc = acc > v ? acc : v;
    else if (op == 3) acc = acc < v ? acc : v;
    else acc = int64_t(uint64_t(acc) + uint64_t(v));
  }
  if (op != 4) return double(acc);
  switch (t.zpType) {
    case zpInt8: return double(int8_t(acc) / n);
    case zpUint8: return double(uint8_t(acc) / n);
    case zpInt32: return double(int32_t(acc) / n);
    case zpUint32: return double(uint32_t(acc) / uint32_t(n));
    case zpInt64: return double(acc / n);
    case zpUint64: return double(uint64_t(acc) / uint64_t(n));
    case zpFloat64: return double(acc) / n;
    default: return double(float(acc) / float(n));
  }
}

}  // namespace

int main(int argc, char** argv) {
  const char* prog = kProgs[kColl];
  const Options opt = parseOptions(argc, argv, prog, Flags::kCollective);
  BenchComm comm;
  comm.init(&argc, &argv);
  const int n = comm.nranks(), rank = comm.rank();
  const TypeInfo& t = *opt.type;
  const bool root = rank == 0;
  if (const char* why = BenchComm::unsupported(t, opt.op, kReduces)) {
    if (root) fprintf(stderr, "%s: -d %s -o %s: %s\n", prog, t.name, kOpNames[opt.op], why);
    comm.finalize();
    return 2;
  }
  if (opt.root >= n) {
    if (root) fprintf(stderr, "%s: -r %d: there are only %d ranks\n", prog, opt.root, n);
    comm.finalize();
    return 2;
  }
  if (root) {
    char params[256];
    snprintf(params, sizeof params, "nranks %d  op %s  root %d  iters %d  warmup %d  datatype %s  check %d", n,
             kReduces ? kOpNames[opt.op] : "none", kColl == kBroadcast ? opt.root : -1, opt.iters, opt.warmup, t.name,
             opt.check);
    printRunHeader(prog, comm.describe(), params, NicInfo());
  }

  unsigned long long totalWrong = 0;
  double busbwSum = 0;
  int rows = 0;
  for (size_t size : sizeSweep(opt)) {
    // count: elements of the call's count argument (per block for the
    // gather and the scatter), a whole number of them per rank.
    const bool blocks = kColl == kAllGather || kColl == kReduceScatter;
    const size_t count = blocks ? size / t.size / size_t(n) : size / t.size;
    const size_t total = blocks ? count * size_t(n) : count;  // elements of the size column
    const size_t sendElems = kColl == kAllGather ? count : total;
    const size_t recvElems = kColl == kReduceScatter ? count : total;
    Buffer sendBuf(sendElems * t.size), recvBuf(recvElems * t.size);
    memset(sendBuf.data(), 0x11, sendBuf.size());  // touch every page before timing
    memset(recvBuf.data(), 0, recvBuf.size());
    auto call = [&] {
      switch (kColl) {
        case kAllReduce: comm.allReduce(sendBuf.data(), recvBuf.data(), count, t, opt.op); break;
        case kAllGather: comm.allGather(sendBuf.data(), recvBuf.data(), count, t); break;
        case kReduceScatter: comm.reduceScatter(sendBuf.data(), recvBuf.data(), count, t, opt.op); break;
        case kBroadcast: comm.broadcast(recvBuf.data(), recvBuf.data(), count, t, opt.root); break;  // in place
      }
    };
    for (int i = 0; i < opt.warmup; ++i) call();
    comm.barrier();
    const double t0 = nowSeconds();
    for (int i = 0; i < opt.iters; ++i) call();
    const double timeUs = comm.maxDouble((nowSeconds() - t0) / opt.iters) * 1e6;

    long long wrong = -1;
    if (opt.check) {
      const uint64_t seed = sizeSeed(opt.seed, size);
      const bool sgn = isSigned(t);
      const int op = kReduces ? opt.op : 0;
      // Inputs: broadcast's on the root, in its one buffer.
      if (kColl == kBroadcast) {
        if (rank == opt.root)
          for (size_t i = 0; i < count; i++) store(recvBuf.data(), i, t, double(value(seed, opt.root, i, 0, sgn)));
        else
          memset(recvBuf.data(), kPoison, recvBuf.size());
      } else {
        for (size_t i = 0; i < sendElems; i++) store(sendBuf.data(), i, t, double(value(seed, rank, i, op, sgn)));
        memset(recvBuf.data(), kPoison, recvBuf.size());
      }
      call();
      std::vector<unsigned char> want(t.size);
      size_t local = 0, firstBad = size_t(-1);
      for (size_t i = 0; i < recvElems; i++) {
        double v = 0;
        switch (kColl) {
          case kAllReduce: v = expected(seed, n, i, t, op); break;
          case kReduceScatter: v = expected(seed, n, size_t(rank) * count + i, t, op); break;
          case kAllGather: v = double(value(seed, int(i / count), i % count, 0, sgn)); break;
          case kBroadcast: v = double(value(seed, opt.root, i, 0, sgn)); break;
        }
        store(want.data(), 0, t, v);
        if (memcmp(want.data(), recvBuf.data() + i * t.size, t.size) != 0) {
          if (firstBad == size_t(-1)) firstBad = i;
          local += t.size;
        }
      }
      if (local)
        fprintf(stderr, "rank %d: %zu wrong bytes at size %zu; first at element %zu\n", rank, local, size, firstBad);
      const unsigned long long all = comm.sumU64(local);
      totalWrong += all;
      wrong = (long long)all;
    }

    const double bytes = double(total * t.size);
    const double algbw = timeUs > 0 ? bytes / (timeUs * 1e3) : 0.0;  // GB/s
    const double factor = kColl == kAllReduce ? 2.0 * (n - 1) / n : kColl == kBroadcast ? 1.0 : double(n - 1) / n;
    const double busbw = algbw * factor;
    busbwSum += busbw;
    ++rows;
    if (root) printTableRow(total * t.size, blocks ? count : total, t.name, timeUs, algbw, busbw, wrong);
  }
  if (root) printTableFooter(totalWrong, opt.check != 0, busbwSum, rows);
  comm.finalize();
  return totalWrong == 0 ? 0 : 1;
}
