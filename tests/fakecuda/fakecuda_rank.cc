// One rank of a multi-process scenario of fakecuda_test:
//   fakecuda_rank <scenario> <nranks> <rank> <uniqueId as hex> [seed]
// Exits 0 when the scenario's checks pass on this rank, 1 (with a message on
// stderr) otherwise. Started by fork+exec, so each rank is a fresh process.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fakecuda.h"

namespace {

int gRank = -1, gN = 0;

[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void fail(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "fakecuda_rank %d/%d: FAIL: ", gRank, gN);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, "\n");
  va_end(ap);
  exit(1);
}

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) fail("%s:%d: %s: %s", __FILE__, __LINE__, #x, cudaGetErrorName(e_)); \
  } while (0)
#define NK(x)                                                                               \
  do {                                                                                      \
    ncclResult_t r_ = (x);                                                                  \
    if (r_ != ncclSuccess) fail("%s:%d: %s: %s", __FILE__, __LINE__, #x, ncclGetErrorString(r_)); \
  } while (0)

ncclUniqueId parseId(const char* hex) {
  ncclUniqueId id;
  if (strlen(hex) != 2 * sizeof id.internal) fail("bad id");
  for (size_t i = 0; i < sizeof id.internal; i++) {
    unsigned v;
    sscanf(hex + 2 * i, "%2x", &v);
    id.internal[i] = (char)v;
  }
  return id;
}

using Clock = std::chrono::steady_clock;

// Polls the async error until it is not ncclInProgress/ncclSuccess, or until
// the time is up; returns the last value seen.
ncclResult_t waitAsyncError(ncclComm_t c, double seconds, double* took = nullptr) {
  auto t0 = Clock::now();
  ncclResult_t r = ncclSuccess;
  while (std::chrono::duration<double>(Clock::now() - t0).count() < seconds) {
    NK(ncclCommGetAsyncError(c, &r));
    if (r != ncclSuccess && r != ncclInProgress) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (took) *took = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

// The ranks meet outside the communicator (files in FAKECUDA_TEST_DIR), so
// that no rank aborts before every rank has seen what the test checks.
void meet(const char* name) {
  const char* dir = getenv("FAKECUDA_TEST_DIR");
  if (!dir) fail("FAKECUDA_TEST_DIR is not set");
  std::string mine = std::string(dir) + "/" + name + "." + std::to_string(gRank);
  FILE* f = fopen(mine.c_str(), "w");
  if (!f) fail("cannot create %s", mine.c_str());
  fclose(f);
  auto t0 = Clock::now();
  for (int r = 0; r < gN; r++) {
    std::string theirs = std::string(dir) + "/" + name + "." + std::to_string(r);
    while (access(theirs.c_str(), F_OK) != 0) {
      if (Clock::now() - t0 > std::chrono::seconds(60)) fail("rank %d never reached %s", r, name);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

void waitReady(ncclComm_t c) {
  ncclResult_t r = ncclInProgress;
  auto t0 = Clock::now();
  while (r == ncclInProgress) {
    NK(ncclCommGetAsyncError(c, &r));
    if (Clock::now() - t0 > std::chrono::seconds(60)) fail("communicator never became ready");
  }
  NK(r);
}

// The byte that src sends to dst at index i of round k.
uint8_t pattern(int src, int dst, size_t i, int k) { return (uint8_t)(src * 31 + dst * 17 + i * 7 + k * 13 + (i >> 8)); }

size_t pairBytes(uint64_t seed, int src, int dst, int k) {
  std::mt19937_64 g(seed ^ ((uint64_t)src << 40) ^ ((uint64_t)dst << 20) ^ (uint64_t)k);
  size_t choices[] = {0, 1, 7, 4096, 65536 + 3, 1 << 20, (1 << 22) + 11};
  return choices[g() % 7] + (g() % 3 == 0 ? g() % 5000 : 0);
}

// Every rank sends to and receives from every other one in one group, sizes
// random per pair and round (both sides compute the same), checked byte by byte.
int scenarioExchange(ncclComm_t comm, uint64_t seed, bool nonblocking) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  for (int k = 0; k < 4; k++) {
    std::vector<void*> sb(gN), rb(gN);
    std::vector<size_t> sn(gN), rn(gN);
    for (int p = 0; p < gN; p++) {
      if (p == gRank) continue;
      sn[p] = pairBytes(seed, gRank, p, k);
      rn[p] = pairBytes(seed, p, gRank, k);
      CK(cudaMalloc(&sb[p], sn[p] ? sn[p] : 1));
      CK(cudaMalloc(&rb[p], rn[p] ? rn[p] : 1));
      std::vector<uint8_t> h(sn[p]);
      for (size_t i = 0; i < sn[p]; i++) h[i] = pattern(gRank, p, i, k);
      CK(cudaMemcpyAsync(sb[p], h.data(), sn[p], cudaMemcpyHostToDevice, s));
      CK(cudaStreamSynchronize(s));  // h is reused: the copy reads it when it runs
    }
    NK(ncclGroupStart());
    for (int p = 0; p < gN; p++) {
      if (p == gRank) continue;
      NK(ncclSend(sb[p], sn[p], ncclUint8, p, comm, s));
      NK(ncclRecv(rb[p], rn[p], ncclUint8, p, comm, s));
    }
    ncclResult_t r = ncclGroupEnd();
    if (nonblocking) {
      if (r != ncclInProgress && r != ncclSuccess) NK(r);
      waitReady(comm);
    } else {
      NK(r);
    }
    CK(cudaStreamSynchronize(s));
    for (int p = 0; p < gN; p++) {
      if (p == gRank) continue;
      std::vector<uint8_t> h(rn[p]);
      CK(cudaMemcpy(h.data(), rb[p], rn[p], cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < rn[p]; i++)
        if (h[i] != pattern(p, gRank, i, k))
          fail("round %d: byte %zu of %zu from rank %d is %u, expected %u", k, i, rn[p], p, h[i],
               pattern(p, gRank, i, k));
      CK(cudaFree(sb[p]));
      CK(cudaFree(rb[p]));
    }
  }
  CK(cudaStreamDestroy(s));
  return 0;
}

// Ungrouped send, then receive, on both ranks: each send waits for a receive
// that its peer only posts after its own send. Must be reported.
int scenarioDeadlock(ncclComm_t comm) {
  int peer = 1 - gRank;
  void *a, *b;
  CK(cudaMalloc(&a, 4096));
  CK(cudaMalloc(&b, 4096));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  NK(ncclSend(a, 4096, ncclInt8, peer, comm, s));
  NK(ncclRecv(b, 4096, ncclInt8, peer, comm, s));
  double took;
  ncclResult_t r = waitAsyncError(comm, 30, &took);
  if (r != ncclInvalidUsage) fail("deadlock not reported within 30 s (async error %s)", ncclGetErrorString(r));
  if (cudaStreamQuery(s) != cudaErrorNotReady) fail("the deadlocked stream completed by itself");
  fprintf(stderr, "rank %d: deadlock reported after %.2f s\n", gRank, took);
  meet("deadlock-seen");
  NK(ncclCommAbort(comm));
  CK(cudaStreamSynchronize(s));  // abort lets the stream move on
  return 0;
}

// Rank 1 dies right after init; rank 0's receive never completes, its async
// error says so within seconds, and abort unblocks the stream.
int scenarioDeadPeer(ncclComm_t comm) {
  if (gRank == 1) _exit(0);
  void* b;
  CK(cudaMalloc(&b, 1 << 16));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ncclResult_t ir = ncclRecv(b, 1 << 16, ncclInt8, 1, comm, s);
  if (ir != ncclSuccess && ir != ncclRemoteError) NK(ir);
  double took;
  ncclResult_t r = waitAsyncError(comm, 10, &took);
  if (r != ncclRemoteError && r != ncclSystemError) fail("no async error within 10 s (got %s)", ncclGetErrorString(r));
  fprintf(stderr, "rank 0: dead peer reported after %.3f s\n", took);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  if (ir == ncclSuccess && cudaStreamQuery(s) != cudaErrorNotReady) fail("a receive from a dead peer completed");
  auto t0 = Clock::now();
  NK(ncclCommAbort(comm));
  CK(cudaStreamSynchronize(s));
  fprintf(stderr, "rank 0: abort and stream sync took %.3f s\n", std::chrono::duration<double>(Clock::now() - t0).count());
  return 0;
}

// An injected error, then FAKENCCL_FAIL_AFTER_OPS (set by the test on rank
// 0 only): both arrive as async errors; the peer sees rank 0's abort.
int scenarioInject(ncclComm_t comm, const char* how) {
  int peer = 1 - gRank;
  void *a, *b;
  CK(cudaMalloc(&a, 64));
  CK(cudaMalloc(&b, 64));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (!strcmp(how, "api")) {
    if (gRank == 0) NK(fakencclInjectAsyncError(comm, ncclSystemError));
  } else {
    for (int k = 0; k < 3; k++) {
      NK(ncclGroupStart());
      NK(ncclSend(a, 64, ncclInt8, peer, comm, s));
      NK(ncclRecv(b, 64, ncclInt8, peer, comm, s));
      NK(ncclGroupEnd());
    }
  }
  ncclResult_t r = waitAsyncError(comm, 20);
  if (gRank == 0 && r != ncclSystemError) fail("injected error did not arrive (got %s)", ncclGetErrorString(r));
  if (gRank == 1 && r != ncclRemoteError) fail("peer's abort not seen (got %s)", ncclGetErrorString(r));
  NK(ncclCommAbort(comm));
  CK(cudaStreamSynchronize(s));
  return 0;
}

// A receive smaller than its send: ncclInvalidUsage on both ranks.
int scenarioSizeMismatch(ncclComm_t comm) {
  void* a;
  CK(cudaMalloc(&a, 4096));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  if (gRank == 0) NK(ncclSend(a, 4096, ncclInt8, 1, comm, s));
  else NK(ncclRecv(a, 2048, ncclInt8, 0, comm, s));
  ncclResult_t r = waitAsyncError(comm, 20);
  if (r != ncclInvalidUsage) fail("size mismatch not reported (got %s)", ncclGetErrorString(r));
  meet("mismatch-seen");
  NK(ncclCommAbort(comm));
  CK(cudaStreamSynchronize(s));
  return 0;
}

size_t tsize(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: case ncclFloat8e4m3: case ncclFloat8e5m2: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}

// Integer value of element i on rank r: small enough that every op is exact
// in every type (including fp8 for sum of small integers is not: fp8 only
// checks max/min, see below).
int64_t val(int r, size_t i) { return (int64_t)((r * 7 + i * 3) % 5) + 1 + (int64_t)(i % 2) * r; }

template <typename T>
void put(std::vector<char>& b, size_t i, double v) {
  T t = (T)v;
  memcpy(b.data() + i * sizeof(T), &t, sizeof(T));
}

void store(ncclDataType_t t, std::vector<char>& b, size_t i, double v) {
  switch (t) {
    case ncclInt8: return put<int8_t>(b, i, v);
    case ncclUint8: return put<uint8_t>(b, i, v);
    case ncclInt32: return put<int32_t>(b, i, v);
    case ncclUint32: return put<uint32_t>(b, i, v);
    case ncclInt64: return put<int64_t>(b, i, v);
    case ncclUint64: return put<uint64_t>(b, i, v);
    case ncclFloat32: return put<float>(b, i, v);
    case ncclFloat64: return put<double>(b, i, v);
    case ncclFloat16: { __half h = __float2half_rn((float)v); memcpy(b.data() + i * 2, &h, 2); return; }
    case ncclBfloat16: { __nv_bfloat16 h = __float2bfloat16_rn((float)v); memcpy(b.data() + i * 2, &h, 2); return; }
    case ncclFloat8e4m3: { __nv_fp8_e4m3 h((float)v); memcpy(b.data() + i, &h, 1); return; }
    case ncclFloat8e5m2: { __nv_fp8_e5m2 h((float)v); memcpy(b.data() + i, &h, 1); return; }
    default: fail("type");
  }
}

double load(ncclDataType_t t, const std::vector<char>& b, size_t i) {
  auto get = [&](auto zero) {
    decltype(zero) x;
    memcpy(&x, b.data() + i * sizeof x, sizeof x);
    return (double)x;
  };
  switch (t) {
    case ncclInt8: return get((int8_t)0);
    case ncclUint8: return get((uint8_t)0);
    case ncclInt32: return get((int32_t)0);
    case ncclUint32: return get((uint32_t)0);
    case ncclInt64: return get((int64_t)0);
    case ncclUint64: return get((uint64_t)0);
    case ncclFloat32: return get(0.0f);
    case ncclFloat64: return get(0.0);
    case ncclFloat16: { __half h; memcpy(&h, b.data() + i * 2, 2); return __half2float(h); }
    case ncclBfloat16: { __nv_bfloat16 h; memcpy(&h, b.data() + i * 2, 2); return __bfloat162float(h); }
    case ncclFloat8e4m3: { __nv_fp8_e4m3 h; memcpy(&h, b.data() + i, 1); return (float)h; }
    case ncclFloat8e5m2: { __nv_fp8_e5m2 h; memcpy(&h, b.data() + i, 1); return (float)h; }
    default: fail("type");
  }
}

// The exact result of op over ranks for element i (as a real number).
double expected(ncclRedOp_t op, size_t i, bool integer) {
  double acc = (double)val(0, i);
  for (int r = 1; r < gN; r++) {
    double x = (double)val(r, i);
    if (op == ncclSum || op == ncclAvg) acc += x;
    if (op == ncclProd) acc *= x;
    if (op == ncclMax) acc = std::max(acc, x);
    if (op == ncclMin) acc = std::min(acc, x);
  }
  if (op == ncclAvg) acc = integer ? (double)((int64_t)acc / gN) : acc / gN;
  return acc;
}

// Every type and op of all-reduce, then the other collectives; values are
// small integers so that the results are exact (fp8 checked on ops whose
// results stay representable).
int scenarioCollectives(ncclComm_t comm) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  const size_t n = 1000;
  ncclDataType_t types[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint32, ncclInt64, ncclUint64,
                            ncclFloat16, ncclFloat32, ncclFloat64, ncclBfloat16, ncclFloat8e4m3, ncclFloat8e5m2};
  ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  void *d, *o;
  CK(cudaMalloc(&d, n * 8 * gN));
  CK(cudaMalloc(&o, n * 8 * gN));
  for (ncclDataType_t t : types) {
    bool integer = t <= ncclUint64;
    bool fp8 = t == ncclFloat8e4m3 || t == ncclFloat8e5m2;
    std::vector<char> h(n * tsize(t) * gN), out(n * tsize(t) * gN);
    for (size_t i = 0; i < n; i++) store(t, h, i, (double)val(gRank, i));
    for (ncclRedOp_t op : ops) {
      if (fp8 && op != ncclMax && op != ncclMin) continue;
      if (op == ncclProd && gN > 3 && t != ncclInt64 && t != ncclUint64 && t != ncclFloat64 && t != ncclFloat32) continue;
      CK(cudaMemcpy(d, h.data(), n * tsize(t), cudaMemcpyHostToDevice));
      NK(ncclAllReduce(d, o, n, t, op, comm, s));
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(out.data(), o, n * tsize(t), cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < n; i++) {
        double want = expected(op, i, integer);
        std::vector<char> w(8);
        store(t, w, 0, want);  // the expected value rounded to the type, once
        if (load(t, out, i) != load(t, w, 0))
          fail("allreduce type %d op %d: element %zu is %g, expected %g", (int)t, (int)op, i, load(t, out, i),
               load(t, w, 0));
      }
    }
  }
  // Broadcast, reduce, all-gather and reduce-scatter on int32.
  std::vector<int32_t> h(n * gN), out(n * gN);
  for (size_t i = 0; i < n * gN; i++) h[i] = (int32_t)(gRank * 100000 + i);
  CK(cudaMemcpy(d, h.data(), n * gN * 4, cudaMemcpyHostToDevice));
  int root = gN - 1;
  NK(ncclBroadcast(d, o, n, ncclInt32, root, comm, s));
  CK(cudaMemcpyAsync(out.data(), o, n * 4, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  for (size_t i = 0; i < n; i++)
    if (out[i] != (int32_t)(root * 100000 + i)) fail("broadcast element %zu: %d", i, out[i]);
  NK(ncclReduce(d, o, n, ncclInt32, ncclSum, root, comm, s));
  CK(cudaMemcpyAsync(out.data(), o, n * 4, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  if (gRank == root)
    for (size_t i = 0; i < n; i++) {
      int64_t w = 0;
      for (int r = 0; r < gN; r++) w += r * 100000 + (int64_t)i;
      if (out[i] != w) fail("reduce element %zu: %d, expected %lld", i, out[i], (long long)w);
    }
  NK(ncclAllGather(d, o, n, ncclInt32, comm, s));
  CK(cudaMemcpyAsync(out.data(), o, n * gN * 4, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  for (int r = 0; r < gN; r++)
    for (size_t i = 0; i < n; i++)
      if (out[r * n + i] != (int32_t)(r * 100000 + i)) fail("allgather element %d:%zu: %d", r, i, out[r * n + i]);
  NK(ncclReduceScatter(d, o, n, ncclInt32, ncclMax, comm, s));
  CK(cudaMemcpyAsync(out.data(), o, n * 4, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  for (size_t i = 0; i < n; i++)
    if (out[i] != (int32_t)((gN - 1) * 100000 + gRank * n + i)) fail("reducescatter element %zu: %d", i, out[i]);
  // Split: even and odd ranks, all-reduce of the rank numbers on each half.
  ncclComm_t half;
  NK(ncclCommSplit(comm, gRank % 2, gRank, &half, nullptr));
  int hn, hr;
  NK(ncclCommCount(half, &hn));
  NK(ncclCommUserRank(half, &hr));
  if (hn != (gN + 1 - gRank % 2) / 2 || hr != gRank / 2) fail("split: rank %d of %d", hr, hn);
  int32_t mine = gRank, sum = 0;
  CK(cudaMemcpy(d, &mine, 4, cudaMemcpyHostToDevice));
  NK(ncclAllReduce(d, o, 1, ncclInt32, ncclSum, half, s));
  CK(cudaMemcpyAsync(&sum, o, 4, cudaMemcpyDeviceToHost, s));
  CK(cudaStreamSynchronize(s));
  int32_t want = 0;
  for (int r = gRank % 2; r < gN; r += 2) want += r;
  if (sum != want) fail("split all-reduce: %d, expected %d", sum, want);
  NK(ncclCommDestroy(half));
  CK(cudaFree(d));
  CK(cudaFree(o));
  CK(cudaStreamDestroy(s));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "usage: %s scenario nranks rank idhex [seed]\n", argv[0]);
    return 2;
  }
  std::string sc = argv[1];
  gN = atoi(argv[2]);
  gRank = atoi(argv[3]);
  ncclUniqueId id = parseId(argv[4]);
  uint64_t seed = argc > 5 ? strtoull(argv[5], nullptr, 0) : 1;
  CK(cudaSetDevice(gRank % 8));
  bool nonblocking = sc == "exchange-nonblocking";
  ncclComm_t comm;
  if (nonblocking) {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm, gN, id, gRank, &cfg);
    if (r != ncclInProgress) fail("nonblocking init returned %s, not ncclInProgress", ncclGetErrorString(r));
    waitReady(comm);
  } else {
    NK(ncclCommInitRank(&comm, gN, id, gRank));
  }
  int rc;
  if (sc == "exchange" || sc == "exchange-nonblocking") rc = scenarioExchange(comm, seed, nonblocking);
  else if (sc == "deadlock") return scenarioDeadlock(comm);
  else if (sc == "deadpeer") return scenarioDeadPeer(comm);
  else if (sc == "inject-api") return scenarioInject(comm, "api");
  else if (sc == "inject-env") return scenarioInject(comm, "env");
  else if (sc == "size-mismatch") return scenarioSizeMismatch(comm);
  else if (sc == "collectives") rc = scenarioCollectives(comm);
  else fail("unknown scenario %s", sc.c_str());
  if (nonblocking) {
    ncclResult_t r = ncclCommFinalize(comm);
    if (r != ncclInProgress && r != ncclSuccess) NK(r);
    waitReady(comm);
  } else {
    NK(ncclCommFinalize(comm));
  }
  NK(ncclCommDestroy(comm));
  return rc;
}
