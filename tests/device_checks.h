// Checks of device calls shared by tests/device_test.cc (one node) and
// tests/multinode_rank.cc (across the nodes of an emulated cluster): ""
// when all is right, else what was wrong. Without gtest, for both.
//
// deviceAttentionError: the attention driver on device buffers against the
// host driver on the same numbers.
// Forward and backward run on device buffers of a datatype, enqueued behind
// a host function that holds the stream until both calls have returned (a
// call that waited for the device would never return; the hold gives up
// after 20 s and the check says so), and with the double (ZP_TEST_DOUBLE)
// no call may wait for any stream (fakecudaHostWaits). The user's kernels
// must see the caller's stream, device buffers and the datatype. Then the
// host driver runs forward on the same numbers in float32, and backward
// from the device's own out and lse. Bounds: float32 equal bit for bit (the
// same kernels in the same order); bfloat16 and float16 the host's float32
// result correctly rounded (within half a unit in the last place); lse
// equal; and the host driver on the same 16-bit buffers gives the device's
// bytes. On a GPU the reference kernel adds key/value gradients atomically
// in any order: there the bound is 1e-5 relative for float32 and one unit
// in the last place for 16-bit types, and for dk and dv also what another
// order of float32 additions can change, from each element's sum of |terms|
// (magnitudeBackward; on the double, checked to bound |result|). Unverified
// on a GPU: the H200 run had the 1-unit bound, which dk and dv missed
// by 2-3 units where terms cancel.
#pragma once

#include <cuda_runtime_api.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "collectives/ext/device/attn_kernels.h"
#include "include/zeppelin.h"
#include "tests/checks.h"
#ifdef ZP_TEST_DOUBLE
#include "tests/fakecuda/fakecuda.h"
#endif

namespace zptest {

// Whether a CUDA device is there, asked in a child process: "" if so, else
// why not. CUDA does not survive fork(): a parent that calls it, even
// cudaGetDeviceCount, leaves every child it forks later with
// cudaErrorInitializationError, so a test parent that forks ranks must never
// call CUDA itself. Asked once per process.
inline std::string cudaDeviceMissing() {
  static const std::string answer = [] {
    int fds[2];
    if (pipe(fds) != 0) return std::string("pipe failed");
    const pid_t pid = fork();
    if (pid < 0) return std::string("fork failed");
    if (pid == 0) {
      int count = 0;
      const cudaError_t e = cudaGetDeviceCount(&count);
      const std::string why = e != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(e)
                              : count == 0     ? std::string("cudaGetDeviceCount: no device")
                                               : std::string();
      if (!why.empty() && write(fds[1], why.data(), why.size()) < 0) _exit(1);
      _exit(0);
    }
    close(fds[1]);
    std::string why;
    char buf[256];
    for (ssize_t got; (got = read(fds[0], buf, sizeof buf)) > 0;) why.append(buf, (size_t)got);
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::string("the probe process failed");
    return why;
  }();
  return answer;
}

// A copy of a host buffer's whole storage (its guards included) in device
// memory, and back: the device call writes where the host call would.
class DeviceMirror {
 public:
  explicit DeviceMirror(GuardedBuffer& host) : host_(host) {
    if (cudaMalloc(&dev_, host.storage().size()) != cudaSuccess) dev_ = nullptr;
    if (dev_) upload();
  }
  ~DeviceMirror() {
    if (dev_) cudaFree(dev_);
  }
  bool ok() const { return dev_ != nullptr; }
  void* data() const { return (char*)dev_ + host_.offset(); }
  cudaError_t upload() {
    return cudaMemcpy(dev_, host_.storage().data(), host_.storage().size(), cudaMemcpyHostToDevice);
  }
  cudaError_t copyBack() {
    return cudaMemcpy(host_.storage().data(), dev_, host_.storage().size(), cudaMemcpyDeviceToHost);
  }

 private:
  GuardedBuffer& host_;
  void* dev_ = nullptr;
};

// One rank's checked alltoallv on device buffers and a stream of its own.
inline std::string deviceAlltoallvError(zpComm_t comm, int rank, const zptest::CountMatrix& counts, zpDataType_t dt,
                                        uint64_t seed) {
  AlltoallvRun run(rank, counts, dt, seed);
  run.recvBuffer().poison();
  DeviceMirror send(run.sendBuffer()), recv(run.recvBuffer());
  if (!send.ok() || !recv.ok()) return "cudaMalloc failed";
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return "cudaStreamCreate failed";
  zpResult_t r = zpAlltoallv(send.data(), run.sendCounts(), run.sendDispls(), recv.data(), run.recvCounts(),
                             run.recvDispls(), dt, comm, stream);
  std::string err;
  if (r != zpSuccess) err = std::string("zpAlltoallv: ") + zpGetErrorString(r) + ": " + zpGetLastError(comm);
  cudaError_t e = cudaStreamSynchronize(stream);
  if (e != cudaSuccess) err += std::string("cudaStreamSynchronize: ") + cudaGetErrorString(e);
  cudaStreamDestroy(stream);
  if (!err.empty()) return "rank " + std::to_string(rank) + ": " + err;
  if (recv.copyBack() != cudaSuccess || send.copyBack() != cudaSuccess) return "copying back failed";
  return run.check();
}


// Test inputs are multiples of 1/64 in [-2, 2]: exact in float32, bfloat16
// and float16, so every type's inputs are the same numbers, written here
// without rounding (and read back by a decoder of the test's own).
inline uint16_t exactBits(float x, zpDataType_t dt) {
  uint32_t b;
  memcpy(&b, &x, 4);
  if (dt == zpBfloat16) return (uint16_t)(b >> 16);
  if (x == 0) return (uint16_t)((b >> 16) & 0x8000);
  const int e = (int)((b >> 23) & 0xFF) - 127 + 15;  // normal in float16 for these values
  return (uint16_t)(((b >> 16) & 0x8000) | e << 10 | ((b >> 13) & 0x3FF));
}
inline double widen(const void* base, size_t i, zpDataType_t dt) {
  if (dt == zpFloat64) return ((const double*)base)[i];
  if (dt == zpFloat32) return ((const float*)base)[i];
  const uint16_t h = ((const uint16_t*)base)[i];
  if (dt == zpBfloat16) {
    const uint32_t b = (uint32_t)h << 16;
    float f;
    memcpy(&f, &b, 4);
    return f;
  }
  const int e = (h >> 10) & 0x1F, m = h & 0x3FF;
  const double mag = e == 0x1F ? (m ? NAN : INFINITY) : e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
  return h & 0x8000 ? -mag : mag;
}
// Half the spacing of datatype's numbers at x: the most a correctly rounded
// x may be off.
inline double halfUlp(double x, zpDataType_t dt) {
  if (dt == zpFloat32 || x == 0 || !std::isfinite(x)) return 0;
  int e = 0;
  std::frexp(x, &e);  // |x| in [2^(e-1), 2^e)
  const int bits = dt == zpBfloat16 ? 8 : 11;
  double ulp = std::ldexp(1.0, e - bits);
  if (dt == zpFloat16) ulp = std::max(ulp, std::ldexp(1.0, -24));
  return ulp / 2;
}

// The user's block kernel on the device path: it checks that it is given
// the caller's stream, device buffers and the datatype, then enqueues the
// reference kernel.
struct KernelSpy {
  zpStream_t stream = nullptr;
  zpDataType_t datatype = zpFloat32;
  int calls = 0, wrongStream = 0, hostBuffers = 0, wrongType = 0;
  void look(const zpAttnBlock_t* b) {
    calls++;
    if (b->stream != stream) wrongStream++;
    if (b->datatype != datatype) wrongType++;
    for (const void* p : {b->q, b->k, b->v, (const void*)b->out, (const void*)b->lse, b->dout, (const void*)b->dq,
                          (const void*)b->dk, (const void*)b->dv}) {
      cudaPointerAttributes a;
      if (p && (cudaPointerGetAttributes(&a, p) != cudaSuccess || a.type != cudaMemoryTypeDevice)) hostBuffers++;
    }
  }
  static zpResult_t forward(const zpAttnBlock_t* b, void* user) {
    ((KernelSpy*)user)->look(b);
    return zpAttnRefForward(b, nullptr);
  }
  static zpResult_t backward(const zpAttnBlock_t* b, void* user) {
    ((KernelSpy*)user)->look(b);
    return zpAttnRefBackward(b, nullptr);
  }
};

// The reference backward kernel on float32 host blocks, adding each key and
// value gradient's terms as |term|: run through the host driver, it gives
// every element of dk and dv the sum of its terms' magnitudes, which bounds
// what another order of the additions can change (below).
inline zpResult_t magnitudeBackward(const zpAttnBlock_t* b, void*) {
  if (b->mask == zpMaskSkip || b->sq == 0 || b->sk == 0) return zpSuccess;
  const zpx::AttnRefBlock<float> k = zpx::AttnRefBlock<float>::of(*b);
  for (size_t i = 0; i < (size_t)b->sq * b->qHeads; i++) k.backward(i, [](float* p, float v) { *p += std::fabs(v); });
  return zpSuccess;
}

// A batch for n ranks with rings of every kind (rng draws alike on every
// rank): one long sequence over all ranks and a short one over the same
// ring (they travel together; the short one has empty chunks), one over the
// first and last rank in reverse order, and a local sequence on each rank.
// Across nodes both rings span nodes.
inline zpBatchPlan_t deviceAttentionPlan(int n, int causal, int ranksPerNode, std::mt19937_64& rng) {
  std::vector<int64_t> lens = {100 + (int64_t)(rng() % 300), 1 + (int64_t)(rng() % (3 * n)),
                               50 + (int64_t)(rng() % 150)};
  std::vector<size_t> offs = {0};
  std::vector<int> ranks;
  for (int pass = 0; pass < 2; pass++) {
    for (int r = 0; r < n; r++) ranks.push_back(r);
    offs.push_back(ranks.size());
  }
  ranks.push_back(n - 1);
  ranks.push_back(0);
  offs.push_back(ranks.size());
  for (int r = 0; r < n; r++) {
    lens.push_back(1 + (int64_t)(rng() % 150));
    ranks.push_back(r);
    offs.push_back(ranks.size());
  }
  zpBatchPlan_t plan = nullptr;
  zpPlanCreate(&plan, (int)lens.size(), lens.data(), causal, n, ranksPerNode, offs.data(), ranks.data());
  return plan;
}

// A host copy and a device copy of one of the driver's buffers.
struct DeviceBuffer {
  std::vector<uint8_t> host;
  void* dev = nullptr;
  DeviceBuffer(size_t bytes, uint8_t fill) : host(bytes, fill) {
    if (cudaMalloc(&dev, bytes ? bytes : 1) != cudaSuccess) dev = nullptr;
    if (dev && bytes) cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(dev); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  cudaError_t toDevice() { return cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice); }
  cudaError_t toHost() { return cudaMemcpy(host.data(), dev, host.size(), cudaMemcpyDeviceToHost); }
};

// A host function that holds its stream until the gate opens (or 20 s pass,
// which it records): work enqueued behind it cannot run.
struct StreamGate {
  std::atomic<bool> open{false}, timedOut{false};
  static void CUDART_CB hold(void* p) {
    StreamGate* g = (StreamGate*)p;
    auto end = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!g->open.load())
      if (std::chrono::steady_clock::now() > end) {
        g->timedOut = true;
        return;
      }
  }
};

// One forward and backward pass of dt on plan (heads 4, key/value heads 2,
// head dim 16) on stream, checked as the header says; checkRun, if given,
// checks the device driver after both calls ("" or what is wrong) into
// *runErr, so that the rank still runs the host passes with the others.
inline std::string deviceAttentionPassError(zpComm_t comm, int rank, zpBatchPlan_t plan, zpDataType_t dt,
                                            int accumulate, cudaStream_t stream, uint64_t seed,
                                            const std::function<std::string(zpAttention_t)>& checkRun,
                                            std::string* runErr) {
  const int H = 4, Hk = 2, D = 16;
  std::string where = "rank " + std::to_string(rank) + ", " + std::to_string(zpTypeSize(dt) * 8) + "-bit " +
                      (dt == zpBfloat16 ? "bfloat16" : dt == zpFloat16 ? "float16" : "float32") +
                      (accumulate ? ", kernel folds blocks: " : ": ");
  auto zpFailed = [&](const char* what) { return where + what + ": " + zpGetLastError(comm); };
  zpLayout_t layout = nullptr;
  int64_t T = 0;
  if (zpPlanGetLayout(plan, zpAttentionLayout, &layout) != zpSuccess ||
      zpLayoutRankTokens(layout, rank, &T) != zpSuccess)
    return zpFailed("the plan's layout");
  const size_t es = zpTypeSize(dt), qn = T * H * D, kn = T * Hk * D;
  // Inputs: this rank's own numbers.
  std::mt19937_64 mine(seed + rank);
  auto input = [&](size_t elems, std::vector<float>* f32, DeviceBuffer* dev) {
    f32->resize(elems);
    for (size_t i = 0; i < elems; i++) {
      (*f32)[i] = (float)((int)(mine() % 257) - 128) / 64;
      if (dt == zpFloat32) {
        memcpy(&dev->host[i * 4], &(*f32)[i], 4);
      } else {
        const uint16_t b = exactBits((*f32)[i], dt);
        memcpy(&dev->host[i * 2], &b, 2);
      }
    }
    return dev->toDevice();
  };
  DeviceBuffer q(qn * es, 0), k(kn * es, 0), v(kn * es, 0), dout(qn * es, 0);
  // Outputs poisoned with NaN (0xFF bytes).
  DeviceBuffer out(qn * es, 0xFF), lse(H * T * 4, 0xFF), dq(qn * es, 0xFF), dk(kn * es, 0xFF), dv(kn * es, 0xFF);
  std::vector<float> qf, kf, vf, doutf;
  for (DeviceBuffer* b : {&q, &k, &v, &dout, &out, &lse, &dq, &dk, &dv})
    if (!b->dev) return where + "cudaMalloc failed";
  if (input(qn, &qf, &q) != cudaSuccess || input(kn, &kf, &k) != cudaSuccess || input(kn, &vf, &v) != cudaSuccess ||
      input(qn, &doutf, &dout) != cudaSuccess)
    return where + "copying the inputs failed";

  // The device pass, enqueued behind a held stream.
  KernelSpy spy;
  spy.stream = stream;
  spy.datatype = dt;
  zpAttnConfig_t cfg = {H, Hk, D, 0.0f, KernelSpy::forward, KernelSpy::backward, &spy, accumulate, dt};
  zpAttention_t attn = nullptr;
  if (zpAttentionCreate(&attn, plan, &cfg, comm) != zpSuccess) return zpFailed("zpAttentionCreate");
  StreamGate gate;
  if (cudaLaunchHostFunc(stream, StreamGate::hold, &gate) != cudaSuccess) return where + "cudaLaunchHostFunc failed";
#ifdef ZP_TEST_DOUBLE
  const unsigned long long waits = fakecudaHostWaits();
#endif
  zpResult_t fr = zpAttentionForward(attn, q.dev, k.dev, v.dev, out.dev, (float*)lse.dev, stream);
  std::string err = fr == zpSuccess ? "" : zpFailed("zpAttentionForward");
  zpResult_t br = zpAttentionBackward(attn, q.dev, k.dev, v.dev, out.dev, (float*)lse.dev, dout.dev, dq.dev, dk.dev,
                                      dv.dev, stream);
  if (br != zpSuccess && err.empty()) err = zpFailed("zpAttentionBackward");
#ifdef ZP_TEST_DOUBLE
  if (fakecudaHostWaits() != waits && err.empty()) err = where + "the pass waited for the device";
#endif
  gate.open = true;
  const cudaError_t synced = cudaStreamSynchronize(stream);
  if (err.empty() && checkRun && !(*runErr = checkRun(attn)).empty()) *runErr = where + *runErr;
  zpAttentionDestroy(attn);
  // First: the failure a GPU shows too (the double's count of host waits
  // then has changed as well).
  if (gate.timedOut) return where + "a call waited for the held stream" + (err.empty() ? "" : "; " + err);
  if (!err.empty()) return err;
  if (synced != cudaSuccess) return where + "cudaStreamSynchronize: " + cudaGetErrorString(synced);
  if (spy.calls == 0 || spy.wrongStream || spy.hostBuffers || spy.wrongType)
    return where + "of " + std::to_string(spy.calls) + " kernel calls, " + std::to_string(spy.wrongStream) +
           " on another stream, " + std::to_string(spy.hostBuffers) + " buffers not on the device, " +
           std::to_string(spy.wrongType) + " of another type";
  for (DeviceBuffer* b : {&out, &lse, &dq, &dk, &dv})
    if (b->toHost() != cudaSuccess) return where + "copying the results back failed";

  // The host driver on the same numbers, float32; backward from the
  // device's own out and lse.
  std::vector<float> outH(qn, NAN), lseH(H * T, NAN), dqH(qn, NAN), dkH(kn, NAN), dvH(kn, NAN), outIn(qn);
  for (size_t i = 0; i < qn; i++) outIn[i] = (float)widen(out.host.data(), i, dt);
  zpAttnConfig_t hostCfg = {H, Hk, D, 0.0f, zpAttnRefForward, zpAttnRefBackward, nullptr, accumulate, zpFloat32};
  if (zpAttentionCreate(&attn, plan, &hostCfg, comm) != zpSuccess) return zpFailed("zpAttentionCreate (host)");
  if (zpAttentionForward(attn, qf.data(), kf.data(), vf.data(), outH.data(), lseH.data(), nullptr) != zpSuccess)
    err = zpFailed("zpAttentionForward (host)");
  else if (zpAttentionBackward(attn, qf.data(), kf.data(), vf.data(), outIn.data(), (const float*)lse.host.data(),
                               doutf.data(), dqH.data(), dkH.data(), dvH.data(), nullptr) != zpSuccess)
    err = zpFailed("zpAttentionBackward (host)");
  zpAttentionDestroy(attn);
  if (!err.empty()) return err;
  // Each dk / dv element's sum of |terms|, and how many terms a gradient may
  // have at most (every query row of the batch, once per query head of its
  // key/value head: an upper bound).
  std::vector<float> dqS(qn, 0.0f), dkS(kn, NAN), dvS(kn, NAN);
  hostCfg.backward = magnitudeBackward;
  if (zpAttentionCreate(&attn, plan, &hostCfg, comm) != zpSuccess) return zpFailed("zpAttentionCreate (magnitudes)");
  if (zpAttentionBackward(attn, qf.data(), kf.data(), vf.data(), outIn.data(), (const float*)lse.host.data(),
                          doutf.data(), dqS.data(), dkS.data(), dvS.data(), nullptr) != zpSuccess)
    err = zpFailed("zpAttentionBackward (magnitudes)");
  zpAttentionDestroy(attn);
  if (!err.empty()) return err;
  int nranks = 0, nseqs = 0, causal = 0;
  const int64_t* lens = nullptr;
  if (zpPlanGetInfo(plan, &nranks, &nseqs, &lens, &causal) != zpSuccess) return zpFailed("zpPlanGetInfo");
  const double terms = (double)std::accumulate(lens, lens + nseqs, int64_t(0)) * (H / Hk);

  // Element by element: how many are off by more than the bound.
  // sums: the elements' sums of |terms|, for gradients whose terms a GPU
  // adds in any order.
  auto offBy = [&](const char* name, const DeviceBuffer& got, zpDataType_t gotType, const std::vector<float>& want,
                   const std::vector<float>* sums = nullptr) {
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < want.size(); i++) {
      const double g = widen(got.host.data(), i, gotType), w = want[i];
#ifdef ZP_TEST_DOUBLE
      // The same order as the host: correctly rounded. And the magnitudes
      // bound the sums (checked here, where they can be: a GPU relies on them).
      const double bound = halfUlp(w, gotType);
      if (sums && !(std::fabs(w) <= (*sums)[i] * (1 + 1e-6) + 1e-30)) {
        if (bad++ == 0) first = i;
        continue;
      }
#else
      double bound = gotType == zpFloat32 ? 1e-5 * std::fabs(w) + 1e-6 : 2 * halfUlp(w, gotType);
      // Two float32 sums of the same terms in other orders differ by at most
      // 2 (terms - 1) 2^-24 times the sum of |terms|; then the rounding to
      // the datatype. Where terms cancel, that is many units in the last
      // place of a small result (2-3 on the H200).
      if (sums)
        bound = std::max(bound, halfUlp(std::max(std::fabs(g), std::fabs(w)), gotType) +
                                    2 * terms * std::ldexp((double)(*sums)[i], -24));
#endif
      const bool same = (std::isnan(g) && std::isnan(w)) || g == w || std::fabs(g - w) <= bound;
      if (!same && bad++ == 0) first = i;
    }
    if (!bad) return std::string();
    char text[200];
    snprintf(text, sizeof text, "%s: %zu of %zu off, the first at %zu: %.9g vs %.9g; ", name, bad, want.size(), first,
             widen(got.host.data(), first, gotType), (double)want[first]);
    return std::string(text);
  };
  err = offBy("out", out, dt, outH) + offBy("lse", lse, zpFloat32, lseH) + offBy("dq", dq, dt, dqH) +
        offBy("dk", dk, dt, dkH, &dkS) + offBy("dv", dv, dt, dvH, &dvS);
  if (!err.empty() || dt == zpFloat32) return err.empty() ? "" : where + err;

  // The host driver on the 16-bit buffers themselves (the inputs' host
  // copies; backward from the device's out and lse) gives the device's
  // bytes: the same functors in the same order. (On a GPU the atomic
  // additions make the gradients' last bits vary: compared only on the double.)
  std::vector<uint8_t> outB(qn * es), dqB(qn * es), dkB(kn * es), dvB(kn * es);
  std::vector<float> lseB(H * T);
  cfg.forward = zpAttnRefForward;
  cfg.backward = zpAttnRefBackward;
  cfg.user = nullptr;
  if (zpAttentionCreate(&attn, plan, &cfg, comm) != zpSuccess) return zpFailed("zpAttentionCreate (host, 16-bit)");
  if (zpAttentionForward(attn, q.host.data(), k.host.data(), v.host.data(), outB.data(), lseB.data(), nullptr) !=
      zpSuccess)
    err = zpFailed("zpAttentionForward (host, 16-bit)");
  else if (zpAttentionBackward(attn, q.host.data(), k.host.data(), v.host.data(), out.host.data(),
                               (const float*)lse.host.data(), dout.host.data(), dqB.data(), dkB.data(), dvB.data(),
                               nullptr) != zpSuccess)
    err = zpFailed("zpAttentionBackward (host, 16-bit)");
  zpAttentionDestroy(attn);
  if (!err.empty()) return err;
  auto differ = [&](const char* name, const std::vector<uint8_t>& host, const DeviceBuffer& dev) {
#ifdef ZP_TEST_DOUBLE
    return memcmp(host.data(), dev.host.data(), host.size()) ? std::string(name) + " differs; " : std::string();
#else
    (void)host, (void)dev;
    return std::string();
#endif
  };
  err = differ("out", outB, out) + differ("dq", dqB, dq) + differ("dk", dkB, dk) + differ("dv", dvB, dv);
#ifdef ZP_TEST_DOUBLE
  if (memcmp(lseB.data(), lse.host.data(), lseB.size() * 4)) err += "lse differs; ";
#endif
  return err.empty() ? "" : where + "the host driver on 16-bit buffers: " + err;
}

inline std::string deviceAttentionError(zpComm_t comm, int rank, zpBatchPlan_t plan, zpDataType_t dt, int accumulate,
                                        cudaStream_t stream, uint64_t seed,
                                        const std::function<std::string(zpAttention_t)>& checkRun = nullptr) {
  std::string runErr;
  const std::string err = deviceAttentionPassError(comm, rank, plan, dt, accumulate, stream, seed, checkRun, &runErr);
  return err + (err.empty() || runErr.empty() ? "" : "; ") + runErr;
}

}  // namespace zptest
