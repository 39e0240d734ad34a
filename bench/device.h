// -G 1: the benchmarks' buffers in device memory and their calls ordered on a
// CUDA stream (built with ZP_BENCH_CUDA; otherwise -G 1 is refused). The
// host buffers stay the place where data is filled and checked: a device
// buffer mirrors its host buffer, copied over before the check's call and
// back after it. The timed loop ends with a stream synchronisation, as in
// nccl-tests, so the time is the device's, not the enqueueing's.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "common.h"
#ifdef ZP_BENCH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace zpbench {

#ifdef ZP_BENCH_CUDA
inline void cudaCheck(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "rank %d: %s: %s\n", launcherRank(), what, cudaGetErrorString(e));
  exit(1);
}
constexpr bool kDeviceBuild = true;
#else
constexpr bool kDeviceBuild = false;
#endif

// Makes this rank's GPU current, as a trainer does (torch.cuda.set_device(
// local_rank)): its local rank (ZP_LOCAL_RANK, set by zprun) modulo the
// visible devices, the device a communicator takes by default
// (ZP_CUDA_DEVICE=local), so that the buffers are on the communicator's GPU.
inline void useLocalDevice() {
#ifdef ZP_BENCH_CUDA
  int count = 0;
  cudaCheck(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count > 0) cudaCheck(cudaSetDevice(settingInt("ZP_LOCAL_RANK", 0) % count), "cudaSetDevice");
#endif
}

// Exits 2 with a message if -G 1 was asked of a build or peer without it;
// else makes the rank's GPU current (useLocalDevice).
inline void requireDeviceSupport(const Options& o, const char* prog, bool peerSupportsIt = true) {
  if (!o.gpu) return;
  if (!kDeviceBuild || !peerSupportsIt) {
    if (launcherRank() == 0)
      fprintf(stderr, "%s: -G 1 needs %s\n", prog,
              kDeviceBuild ? "a library with device buffers (MPI here has none)" : "a build with CUDA (ZP_WITH_CUDA)");
    exit(2);
  }
  useLocalDevice();
}

// What a call reads or writes: the host buffer, or (-G 1) its device mirror.
class CallBuffer {
 public:
  CallBuffer(Buffer& host, bool device) : host_(host) {
#ifdef ZP_BENCH_CUDA
    if (device) {
      cudaCheck(cudaMalloc(&dev_, host.size() ? host.size() : 1), "cudaMalloc");
      toDevice();
    }
#else
    (void)device;
#endif
  }
  ~CallBuffer() {
#ifdef ZP_BENCH_CUDA
    if (dev_) cudaFree(dev_);
#endif
  }
  CallBuffer(const CallBuffer&) = delete;
  CallBuffer& operator=(const CallBuffer&) = delete;
  void* data() const { return dev_ ? dev_ : host_.data(); }
  void toDevice() {
#ifdef ZP_BENCH_CUDA
    if (dev_) cudaCheck(cudaMemcpy(dev_, host_.data(), host_.size(), cudaMemcpyHostToDevice), "cudaMemcpy to device");
#endif
  }
  void toHost() {
#ifdef ZP_BENCH_CUDA
    if (dev_) cudaCheck(cudaMemcpy(host_.data(), dev_, host_.size(), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
#endif
  }

 private:
  Buffer& host_;
  void* dev_ = nullptr;
};

// The stream of the calls: none (NULL) for host buffers.
class CallStream {
 public:
  explicit CallStream(bool device) {
#ifdef ZP_BENCH_CUDA
    if (device) cudaCheck(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), "cudaStreamCreate");
#else
    (void)device;
#endif
  }
  ~CallStream() {
#ifdef ZP_BENCH_CUDA
    if (s_) cudaStreamDestroy(s_);
#endif
  }
  CallStream(const CallStream&) = delete;
  CallStream& operator=(const CallStream&) = delete;
  void* get() const { return s_; }
  // Waits for everything enqueued so far (nothing to wait for on the host).
  void sync() {
#ifdef ZP_BENCH_CUDA
    if (s_) cudaCheck(cudaStreamSynchronize(s_), "cudaStreamSynchronize");
#endif
  }

 private:
#ifdef ZP_BENCH_CUDA
  cudaStream_t s_ = nullptr;
#else
  void* s_ = nullptr;
#endif
};

// The check's call: the host buffers' contents over to the device mirrors,
// the call, a synchronisation, and the results back to the host buffers.
template <class Call>
void runMirrored(CallBuffer& send, CallBuffer& recv, CallStream& stream, Call call) {
  send.toDevice();
  recv.toDevice();
  call();
  stream.sync();
  send.toHost();
  recv.toHost();
}

// A row's timing: `warmup` untimed calls, a barrier, `iters` timed calls;
// the slowest rank's mean time per call, in microseconds.
template <class Comm, class Call>
double timeCalls(Comm& comm, CallStream& stream, const Options& opt, Call call) {
  for (int i = 0; i < opt.warmup; ++i) call();
  stream.sync();
  comm.barrier();
  const double t0 = nowSeconds();
  for (int i = 0; i < opt.iters; ++i) call();
  stream.sync();
  return comm.maxDouble((nowSeconds() - t0) / opt.iters) * 1e6;
}

// A row's check of a call that moves blocks (alltoallv, send/recv): fresh
// inputs from the row's seed, poisoned outputs, one call, every received
// byte and guard byte checked. The wrong bytes of all ranks; a rank with
// any says where on stderr.
template <class Comm, class Call>
long long checkBlocks(Comm& comm, CallBuffer& sendCall, CallBuffer& recvCall, CallStream& stream, Call call,
                      Buffer& sendBuf, const Layout& sl, Buffer& recvBuf, const Layout& rl, const TypeInfo& t,
                      uint64_t seed, int rank, size_t bytes) {
  fillSend(sendBuf.data(), sl, t, seed, rank);
  poisonRecv(recvBuf.data(), rl, t);
  runMirrored(sendCall, recvCall, stream, call);
  std::string first;
  const size_t local = checkRun(sendBuf.data(), sl, recvBuf.data(), rl, t, seed, rank, &first);
  if (local != 0) fprintf(stderr, "rank %d: %zu wrong bytes at size %zu; first: %s\n", rank, local, bytes, first.c_str());
  return (long long)comm.sumU64(local);
}

}  // namespace zpbench
