// Tests of the CUDA/NCCL test double itself, above all that it CATCHES wrong
// code: host access to device memory, missing synchronisation, early reads,
// deadlocks, dead peers. Multi-process cases start fakecuda_rank with
// fork+exec (posix_spawn), never a bare fork of this multithreaded process.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fcntl.h>

#include <atomic>
#include <mutex>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "fakecuda.h"

extern char** environ;

namespace {

#define CK(x) ASSERT_EQ(cudaSuccess, (x)) << #x
#define NK(x) ASSERT_EQ(ncclSuccess, (x)) << #x

using Clock = std::chrono::steady_clock;

TEST(FakeCudaMemory, HostReadOfDeviceMemoryDiesWithSegv) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        void* p;
        if (cudaMalloc(&p, 4096) != cudaSuccess) _exit(3);
        volatile char c = *(volatile char*)p;  // what a host bug does
        (void)c;
        _exit(0);
      },
      testing::KilledBySignal(SIGSEGV), "");
  EXPECT_EXIT(
      {
        void* p;
        if (cudaMalloc(&p, 100) != cudaSuccess) _exit(3);
        ((volatile char*)p)[50] = 1;  // an interior write
        _exit(0);
      },
      testing::KilledBySignal(SIGSEGV), "");
}

TEST(FakeCudaMemory, AliasOutsideAKernelAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        void* p;
        if (cudaMalloc(&p, 64) == cudaSuccess) fakecudaAlias(p, 64);
      },
      "host code touched device memory");
}

struct KernelArgs {
  void* p;
  size_t n;
  int value;
};
void fillKernel(void* a) {
  auto* k = (KernelArgs*)a;
  memset(fakecudaAlias(k->p, k->n), k->value, k->n);
}

void launchOneByteTooFar() {
  void* p;
  if (cudaMalloc(&p, 64) != cudaSuccess) return;
  KernelArgs k{p, 65, 1};
  fakecudaLaunch(nullptr, fillKernel, &k, sizeof k);
  cudaDeviceSynchronize();
}

TEST(FakeCudaMemory, KernelOutOfBoundsAborts) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(launchOneByteTooFar(), "runs 1 bytes past the end");
}

TEST(FakeCudaMemory, CopiesPointerAttributesAndBounds) {
  CK(cudaSetDevice(3));
  char* d;
  CK(cudaMalloc((void**)&d, 1000));
  std::vector<char> h(1000), back(1000);
  for (int i = 0; i < 1000; i++) h[i] = (char)(i * 7);
  CK(cudaMemcpy(d, h.data(), 1000, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(back.data(), d, 1000, cudaMemcpyDefault));
  EXPECT_EQ(h, back);

  cudaPointerAttributes a;
  CK(cudaPointerGetAttributes(&a, d + 999));  // interior pointer
  EXPECT_EQ(cudaMemoryTypeDevice, a.type);
  EXPECT_EQ(3, a.device);
  EXPECT_EQ(d + 999, a.devicePointer);
  EXPECT_EQ(nullptr, a.hostPointer);
  CK(cudaPointerGetAttributes(&a, h.data()));
  EXPECT_EQ(cudaMemoryTypeUnregistered, a.type);
  void* pinned;
  CK(cudaMallocHost(&pinned, 256));
  CK(cudaPointerGetAttributes(&a, pinned));
  EXPECT_EQ(cudaMemoryTypeHost, a.type);
  EXPECT_EQ(pinned, a.hostPointer);

  // A strided copy: 10 rows of 5 bytes, host pitch 100, device pitch 8.
  std::vector<char> rows(1000), rowsBack(1000, 0);
  for (int i = 0; i < 1000; i++) rows[i] = (char)(i % 101);
  CK(cudaMemcpy2DAsync(d, 8, rows.data(), 100, 5, 10, cudaMemcpyHostToDevice, cudaStreamPerThread));
  CK(cudaMemcpy2DAsync(rowsBack.data(), 100, d, 8, 5, 10, cudaMemcpyDeviceToHost, cudaStreamPerThread));
  CK(cudaStreamSynchronize(cudaStreamPerThread));
  for (int r = 0; r < 10; r++)
    for (int c = 0; c < 100; c++) ASSERT_EQ(c < 5 ? rows[r * 100 + c] : 0, rowsBack[r * 100 + c]);

  // Bounds: a copy past the end is refused at the call.
  EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpy(d + 1, h.data(), 1000, cudaMemcpyHostToDevice));
  EXPECT_EQ(cudaErrorInvalidValue, cudaGetLastError());
  EXPECT_EQ(cudaSuccess, cudaGetLastError());
  EXPECT_EQ(cudaErrorInvalidValue, cudaMemsetAsync(d + 500, 0, 501, nullptr));
  EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpy2DAsync(d, 100, h.data(), 100, 100, 11, cudaMemcpyHostToDevice, nullptr));
  // Kinds that contradict the pointers.
  EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpy(d, h.data(), 10, cudaMemcpyDeviceToDevice));
  EXPECT_EQ(cudaErrorInvalidValue, cudaMemcpy(h.data(), d, 10, cudaMemcpyHostToHost));
  // Memset on host memory is no device memset.
  EXPECT_EQ(cudaErrorInvalidValue, cudaMemset(h.data(), 0, 10));
  // Free: unknown and interior pointers, double free.
  EXPECT_EQ(cudaErrorInvalidValue, cudaFree(h.data()));
  EXPECT_EQ(cudaErrorInvalidValue, cudaFree(d + 1));
  CK(cudaFree(d));
  EXPECT_EQ(cudaErrorInvalidValue, cudaFree(d));
  CK(cudaPointerGetAttributes(&a, d));
  EXPECT_EQ(cudaMemoryTypeUnregistered, a.type);
  CK(cudaFreeHost(pinned));
  (void)cudaGetLastError();
  CK(cudaSetDevice(0));
}

TEST(FakeCudaMemory, FreshDeviceMemoryIsNotZero) {
  void* d;
  CK(cudaMalloc(&d, 64));
  std::vector<unsigned char> h(64);
  CK(cudaMemcpy(h.data(), d, 64, cudaMemcpyDeviceToHost));
  EXPECT_EQ(0xa5, h[0]);
  CK(cudaFree(d));
}

TEST(FakeCudaDevices, CountPropertiesAndPerThreadDevice) {
  int n;
  CK(cudaGetDeviceCount(&n));
  EXPECT_EQ(8, n);
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 2));
  EXPECT_STREQ("fakecuda", p.name);
  EXPECT_EQ(cudaErrorInvalidDevice, cudaSetDevice(8));
  (void)cudaGetLastError();
  char bus[32];
  CK(cudaDeviceGetPCIBusId(bus, sizeof bus, 2));
  EXPECT_STREQ("0000:03:00.0", bus);
  CK(cudaSetDevice(5));
  int other = -1;
  std::thread([&] { cudaGetDevice(&other); }).join();
  EXPECT_EQ(0, other);  // the current device is per thread
  int mine;
  CK(cudaGetDevice(&mine));
  EXPECT_EQ(5, mine);
  CK(cudaSetDevice(0));
}

// Two host functions on two streams, the first stream slow: without an
// event the second runs first; with one it never does.
TEST(FakeCudaStreams, OrderBetweenStreamsOnlyThroughEvents) {
  cudaStream_t a, b;
  CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  CK(fakecudaStreamSetDelay(a, 3000));
  cudaEvent_t e;
  CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  struct Log {
    std::mutex mu;
    std::string s;
  } log;
  auto A = [](void* p) {
    auto* l = (Log*)p;
    std::lock_guard<std::mutex> g(l->mu);
    l->s += 'A';
  };
  auto B = [](void* p) {
    auto* l = (Log*)p;
    std::lock_guard<std::mutex> g(l->mu);
    l->s += 'B';
  };
  int outOfOrder = 0;
  for (int i = 0; i < 10; i++) {
    log.s.clear();
    CK(cudaLaunchHostFunc(a, A, &log));
    CK(cudaLaunchHostFunc(b, B, &log));
    CK(cudaStreamSynchronize(a));
    CK(cudaStreamSynchronize(b));
    outOfOrder += log.s == "BA";
  }
  EXPECT_GT(outOfOrder, 0) << "no reordering without an event; seed " << fakecudaSeed();
  for (int i = 0; i < 20; i++) {
    log.s.clear();
    CK(cudaLaunchHostFunc(a, A, &log));
    CK(cudaEventRecord(e, a));
    CK(cudaStreamWaitEvent(b, e, 0));
    CK(cudaLaunchHostFunc(b, B, &log));
    CK(cudaStreamSynchronize(b));
    EXPECT_EQ("AB", log.s) << "seed " << fakecudaSeed();
    CK(cudaStreamSynchronize(a));
  }
  CK(cudaEventDestroy(e));
  CK(cudaStreamDestroy(a));
  CK(cudaStreamDestroy(b));
}

// A kernel writes on stream a; a copy to the host on stream b reads the old
// bytes unless an event orders it after the kernel.
TEST(FakeCudaStreams, ReadBeforeSynchronisationIsWrong) {
  cudaStream_t a, b;
  CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  CK(fakecudaStreamSetDelay(a, 2000));
  void* d;
  CK(cudaMalloc(&d, 4096));
  cudaEvent_t e;
  CK(cudaEventCreate(&e));
  std::vector<unsigned char> h(4096);
  int wrong = 0;
  for (int i = 0; i < 10; i++) {
    CK(cudaMemset(d, 0, 4096));
    CK(cudaDeviceSynchronize());
    KernelArgs k{d, 4096, 1 + i};
    CK(fakecudaLaunch(a, fillKernel, &k, sizeof k));
    CK(cudaMemcpyAsync(h.data(), d, 4096, cudaMemcpyDeviceToHost, b));
    CK(cudaStreamSynchronize(b));
    wrong += h[0] != 1 + i;
    CK(cudaStreamSynchronize(a));
  }
  EXPECT_GT(wrong, 0) << "an unsynchronised read was never wrong; seed " << fakecudaSeed();
  for (int i = 0; i < 10; i++) {
    KernelArgs k{d, 4096, 50 + i};
    CK(fakecudaLaunch(a, fillKernel, &k, sizeof k));
    CK(cudaEventRecord(e, a));
    CK(cudaStreamWaitEvent(b, e, 0));
    CK(cudaMemcpyAsync(h.data(), d, 4096, cudaMemcpyDeviceToHost, b));
    CK(cudaStreamSynchronize(b));
    EXPECT_EQ(50 + i, h[4095]);
  }
  float ms;
  CK(cudaEventSynchronize(e));
  EXPECT_EQ(cudaSuccess, cudaEventElapsedTime(&ms, e, e));
  CK(cudaFree(d));
  CK(cudaEventDestroy(e));
  CK(cudaStreamDestroy(a));
  CK(cudaStreamDestroy(b));
}

// A pageable host buffer reused right after cudaMemcpyAsync: the copy reads
// it when it runs, so the device gets the later bytes.
TEST(FakeCudaStreams, PageableCopyReadsTheHostWhenItRuns) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CK(fakecudaStreamSetDelay(s, 5000));
  void* d;
  CK(cudaMalloc(&d, 64));
  std::vector<char> h(64, 1);
  CK(cudaMemcpyAsync(d, h.data(), 64, cudaMemcpyHostToDevice, s));
  std::fill(h.begin(), h.end(), 2);  // too early
  CK(cudaStreamSynchronize(s));
  std::vector<char> back(64);
  CK(cudaMemcpy(back.data(), d, 64, cudaMemcpyDeviceToHost));
  EXPECT_EQ(2, back[0]);
  CK(cudaFree(d));
  CK(cudaStreamDestroy(s));
}

// The legacy stream waits for earlier work of blocking streams and later
// work of blocking streams waits for it; non-blocking streams are free.
TEST(FakeCudaStreams, LegacyStreamImplicitSynchronisation) {
  cudaStream_t blocking, free;
  CK(cudaStreamCreate(&blocking));
  CK(cudaStreamCreateWithFlags(&free, cudaStreamNonBlocking));
  CK(fakecudaStreamSetDelay(blocking, 3000));
  CK(fakecudaStreamSetDelay(free, 3000));
  std::atomic<int> flag{0};
  auto set = [](void* p) { ((std::atomic<int>*)p)->store(1); };
  struct Seen {
    std::atomic<int>* flag;
    int seen = -1;
  } seen{&flag};
  auto look = [](void* p) {
    auto* s = (Seen*)p;
    s->seen = s->flag->load();
  };
  CK(cudaLaunchHostFunc(blocking, set, &flag));
  CK(cudaLaunchHostFunc(nullptr, look, &seen));
  CK(cudaStreamSynchronize(nullptr));
  EXPECT_EQ(1, seen.seen) << "the legacy stream did not wait for a blocking stream";
  CK(cudaDeviceSynchronize());

  flag = 0;
  CK(cudaLaunchHostFunc(free, set, &flag));
  CK(cudaLaunchHostFunc(cudaStreamLegacy, look, &seen));
  CK(cudaStreamSynchronize(cudaStreamLegacy));
  EXPECT_EQ(0, seen.seen) << "the legacy stream waited for a non-blocking stream";
  CK(cudaDeviceSynchronize());

  // Later work of a blocking stream waits for the legacy stream.
  flag = 0;
  CK(fakecudaStreamSetDelay(nullptr, 3000));
  CK(cudaLaunchHostFunc(nullptr, set, &flag));
  CK(cudaLaunchHostFunc(blocking, look, &seen));
  CK(cudaStreamSynchronize(blocking));
  EXPECT_EQ(1, seen.seen);
  CK(fakecudaStreamSetDelay(nullptr, 0));
  CK(cudaDeviceSynchronize());
  CK(cudaStreamDestroy(blocking));
  CK(cudaStreamDestroy(free));
}

TEST(FakeCudaStreams, EventsQueriesAndCapture) {
  cudaEvent_t e, t;
  CK(cudaEventCreate(&e));
  CK(cudaEventCreateWithFlags(&t, cudaEventDisableTiming));
  EXPECT_EQ(cudaSuccess, cudaEventQuery(e));  // never recorded
  cudaStream_t s;
  CK(cudaStreamCreate(&s));
  CK(cudaStreamWaitEvent(s, e, 0));  // never recorded: no-op
  CK(fakecudaStreamSetDelay(s, 20000));
  CK(cudaEventRecord(e, s));
  EXPECT_EQ(cudaErrorNotReady, cudaEventQuery(e));
  EXPECT_EQ(cudaErrorNotReady, cudaStreamQuery(s));
  CK(cudaEventSynchronize(e));
  EXPECT_EQ(cudaSuccess, cudaStreamQuery(s));
  float ms;
  CK(cudaEventRecord(t, s));
  CK(cudaEventSynchronize(t));
  EXPECT_EQ(cudaErrorInvalidResourceHandle, cudaEventElapsedTime(&ms, e, t));
  cudaStreamCaptureStatus st;
  CK(cudaStreamIsCapturing(s, &st));
  EXPECT_EQ(cudaStreamCaptureStatusNone, st);
  EXPECT_EQ(cudaErrorNotSupported, cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  (void)cudaGetLastError();
  CK(cudaStreamDestroy(s));
  EXPECT_EQ(cudaErrorInvalidResourceHandle, cudaStreamSynchronize(s));
  (void)cudaGetLastError();
  CK(cudaEventDestroy(e));
  CK(cudaEventDestroy(t));
}

TEST(FakeCudaFaults, InjectedStreamErrorIsStickyOnItsStream) {
  cudaStream_t s, other;
  CK(cudaStreamCreate(&s));
  CK(cudaStreamCreate(&other));
  void* d;
  CK(cudaMalloc(&d, 64));
  CK(fakecudaInjectStreamError(s, cudaErrorLaunchFailure));
  CK(cudaMemsetAsync(d, 0, 64, s));  // the operation that fails
  EXPECT_EQ(cudaErrorLaunchFailure, cudaStreamSynchronize(s));
  EXPECT_EQ(cudaErrorLaunchFailure, cudaGetLastError());
  EXPECT_EQ(cudaSuccess, cudaGetLastError());
  EXPECT_EQ(cudaErrorLaunchFailure, cudaStreamQuery(s));  // sticky
  CK(cudaMemsetAsync(d, 0, 64, other));
  CK(cudaStreamSynchronize(other));  // other streams are unaffected
  (void)cudaGetLastError();
  EXPECT_STREQ("cudaErrorLaunchFailure", cudaGetErrorName(cudaErrorLaunchFailure));
  EXPECT_STREQ("unspecified launch failure", cudaGetErrorString(cudaErrorLaunchFailure));
  CK(cudaStreamDestroy(s));
  CK(cudaStreamDestroy(other));
  CK(cudaFree(d));
}

TEST(FakeCudaFaults, UseAfterFreeAsyncIsAnIllegalAddress) {
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  void* d;
  CK(cudaMallocAsync(&d, 64, s));
  CK(cudaFreeAsync(d, s));
  std::vector<char> h(64);
  // Issued while d is still live, but runs after the free on the stream.
  CK(cudaMemcpyAsync(h.data(), d, 64, cudaMemcpyDeviceToHost, s));
  EXPECT_EQ(cudaErrorIllegalAddress, cudaStreamSynchronize(s));
  (void)cudaGetLastError();
  CK(cudaStreamDestroy(s));
}

TEST(FakeNccl, SingleProcessBasics) {
  int v;
  NK(ncclGetVersion(&v));
  EXPECT_EQ(22809, v);
  // Two ranks as two threads of one process (ncclCommInitAll).
  ncclComm_t comms[2];
  int devs[2] = {0, 1};
  NK(ncclCommInitAll(comms, 2, devs));
  int n, r, d;
  NK(ncclCommCount(comms[1], &n));
  NK(ncclCommUserRank(comms[1], &r));
  NK(ncclCommCuDevice(comms[1], &d));
  EXPECT_EQ(2, n);
  EXPECT_EQ(1, r);
  EXPECT_EQ(1, d);
  // A host buffer is refused, as NCCL refuses it.
  std::vector<char> host(16);
  EXPECT_EQ(ncclInvalidArgument, ncclSend(host.data(), 16, ncclInt8, 1, comms[0], nullptr));
  // A buffer of another device too.
  void* d1;
  CK(cudaSetDevice(1));
  CK(cudaMalloc(&d1, 16));
  CK(cudaSetDevice(0));
  EXPECT_EQ(ncclInvalidArgument, ncclSend(d1, 16, ncclInt8, 1, comms[0], nullptr));
  // Grouped exchange between the two threads' ranks.
  void *a0, *b0;
  NK(ncclMemAlloc(&a0, 1 << 16));
  NK(ncclMemAlloc(&b0, 1 << 16));
  CK(cudaMemset(a0, 7, 1 << 16));
  CK(cudaSetDevice(1));
  void* b1;
  CK(cudaMalloc(&b1, 1 << 16));
  CK(cudaMemset(d1, 9, 16));
  CK(cudaSetDevice(0));
  // Each rank on a stream of its own device (one stream for both would
  // serialise rank 1's part behind rank 0's: a deadlock, as on a GPU).
  cudaStream_t s0, s1;
  CK(cudaStreamCreate(&s0));
  CK(cudaSetDevice(1));
  CK(cudaStreamCreate(&s1));
  CK(cudaSetDevice(0));
  NK(ncclGroupStart());
  NK(ncclSend(a0, 1 << 16, ncclInt8, 1, comms[0], s0));
  NK(ncclRecv(b0, 16, ncclInt8, 1, comms[0], s0));
  NK(ncclRecv(b1, 1 << 16, ncclInt8, 0, comms[1], s1));
  NK(ncclGroupStart());  // nested
  NK(ncclSend(d1, 16, ncclInt8, 0, comms[1], s1));
  NK(ncclGroupEnd());
  NK(ncclGroupEnd());
  CK(cudaStreamSynchronize(s1));
  CK(cudaStreamSynchronize(s0));
  std::vector<char> h(1 << 16);
  CK(cudaMemcpy(h.data(), b1, 1 << 16, cudaMemcpyDeviceToHost));
  EXPECT_EQ(7, h[0]);
  EXPECT_EQ(7, h[65535]);
  CK(cudaMemcpy(h.data(), b0, 16, cudaMemcpyDeviceToHost));
  EXPECT_EQ(9, h[15]);
  EXPECT_EQ(ncclInvalidArgument, ncclMemFree(host.data()));
  NK(ncclMemFree(a0));
  NK(ncclMemFree(b0));
  NK(ncclCommDestroy(comms[0]));
  NK(ncclCommDestroy(comms[1]));
  CK(cudaStreamDestroy(s0));
  CK(cudaStreamDestroy(s1));
  CK(cudaFree(d1));
  CK(cudaFree(b1));
  (void)cudaGetLastError();
}

// A group spanning two communicators on one stream progresses as one (as
// NCCL's group launch does): rank 0 sends on A and receives on B, rank 1 the
// other way round. Run one after the other, each rank would wait for an op
// queued behind its own.
TEST(FakeNccl, GroupAcrossCommunicatorsDoesNotDeadlock) {
  ncclComm_t a[2], b[2];
  int devs[2] = {0, 1};
  NK(ncclCommInitAll(a, 2, devs));
  NK(ncclCommInitAll(b, 2, devs));
  cudaStream_t s[2];
  void *x[2], *y[2];
  for (int r = 0; r < 2; r++) {
    CK(cudaSetDevice(r));
    CK(cudaStreamCreateWithFlags(&s[r], cudaStreamNonBlocking));
    CK(cudaMalloc(&x[r], 1024));
    CK(cudaMalloc(&y[r], 1024));
    // On the stream itself: cudaMemset goes to the legacy stream, which a
    // non-blocking stream does not wait for (the double caught exactly that
    // in this test's first version).
    CK(cudaMemsetAsync(x[r], 10 + r, 1024, s[r]));
  }
  for (int r = 0; r < 2; r++) {
    CK(cudaSetDevice(r));
    NK(ncclGroupStart());
    if (r == 0) {
      NK(ncclSend(x[0], 1024, ncclInt8, 1, a[0], s[0]));
      NK(ncclRecv(y[0], 1024, ncclInt8, 1, b[0], s[0]));
    } else {
      NK(ncclSend(x[1], 1024, ncclInt8, 0, b[1], s[1]));
      NK(ncclRecv(y[1], 1024, ncclInt8, 0, a[1], s[1]));
    }
    NK(ncclGroupEnd());
  }
  // Polled with a deadline, so that a regression fails instead of hanging.
  for (int r = 0; r < 2; r++) {
    auto t0 = Clock::now();
    while (cudaStreamQuery(s[r]) == cudaErrorNotReady && Clock::now() - t0 < std::chrono::seconds(20))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (cudaStreamQuery(s[r]) != cudaSuccess) {
      ADD_FAILURE() << "the group across two communicators did not complete within 20 s";
      for (int q = 0; q < 2; q++) {
        ncclCommAbort(a[q]);
        ncclCommAbort(b[q]);
      }
      return;
    }
  }
  for (int r = 0; r < 2; r++) {
    CK(cudaSetDevice(r));
    char h[1024];
    CK(cudaMemcpy(h, y[r], 1024, cudaMemcpyDeviceToHost));
    EXPECT_EQ(10 + (1 - r), h[1023]);
  }
  for (int r = 0; r < 2; r++) {
    NK(ncclCommDestroy(a[r]));
    NK(ncclCommDestroy(b[r]));
    CK(cudaSetDevice(r));
    CK(cudaFree(x[r]));
    CK(cudaFree(y[r]));
    CK(cudaStreamDestroy(s[r]));
  }
  CK(cudaSetDevice(0));
}

// ncclCommDestroy waits for the communicator's queued work (slow streams
// here): when it returns, the exchange is done without any synchronise.
TEST(FakeNccl, DestroyWaitsForQueuedWork) {
  ncclComm_t c[2];
  int devs[2] = {0, 1};
  NK(ncclCommInitAll(c, 2, devs));
  cudaStream_t s[2];
  void* x[2];
  for (int r = 0; r < 2; r++) {
    CK(cudaSetDevice(r));
    CK(cudaStreamCreateWithFlags(&s[r], cudaStreamNonBlocking));
    CK(fakecudaStreamSetDelay(s[r], 50000));
    CK(cudaMalloc(&x[r], 64));
  }
  for (int r = 0; r < 2; r++) {
    CK(cudaSetDevice(r));
    NK(ncclGroupStart());
    NK(ncclSend(x[r], 64, ncclInt8, 1 - r, c[r], s[r]));
    NK(ncclRecv(x[r], 64, ncclInt8, 1 - r, c[r], s[r]));
    NK(ncclGroupEnd());
  }
  EXPECT_EQ(cudaErrorNotReady, cudaStreamQuery(s[0]));
  std::thread other([&] { EXPECT_EQ(ncclSuccess, ncclCommDestroy(c[1])); });
  NK(ncclCommDestroy(c[0]));
  other.join();
  if (cudaStreamQuery(s[0]) != cudaSuccess || cudaStreamQuery(s[1]) != cudaSuccess) {
    // Without its communicator the work may never finish: leave it (a
    // cudaFree would wait for it forever).
    ADD_FAILURE() << "ncclCommDestroy returned before its queued work was done";
    return;
  }
  for (int r = 0; r < 2; r++) {
    CK(cudaStreamDestroy(s[r]));
    CK(cudaFree(x[r]));
  }
  CK(cudaSetDevice(0));
}

// ---- multi-process scenarios (fakecuda_rank) ----

struct RankRun {
  std::vector<int> status;          // wait status per rank, -1 if killed on timeout
  std::vector<std::string> stderr_;  // each rank's stderr
  double seconds = 0;
};

std::string idHex() {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return "";
  std::string s;
  char b[3];
  for (char c : id.internal) {
    snprintf(b, sizeof b, "%02x", (unsigned char)c);
    s += b;
  }
  return s;
}

// Starts nranks processes of one scenario (fork+exec), waits up to timeout.
RankRun runRanks(const std::string& scenario, int nranks, const std::vector<std::vector<std::string>>& envPerRank = {},
             double timeout = 120, uint64_t seed = 1) {
  RankRun run;
  char dirTemplate[] = "/tmp/fakecuda_test.XXXXXX";
  std::string dir = mkdtemp(dirTemplate);
  std::string id = idHex();
  std::vector<pid_t> pids(nranks);
  auto t0 = Clock::now();
  for (int r = 0; r < nranks; r++) {
    std::vector<std::string> args{FAKECUDA_RANK_PATH, scenario, std::to_string(nranks), std::to_string(r), id,
                                  std::to_string(seed)};
    std::vector<std::string> env;
    for (char** e = environ; *e; e++) env.push_back(*e);
    env.push_back("FAKECUDA_TEST_DIR=" + dir);
    if ((size_t)r < envPerRank.size())
      for (auto& e : envPerRank[r]) env.push_back(e);
    std::vector<char*> argv, envp;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    std::string err = dir + "/stderr." + std::to_string(r);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (posix_spawn(&pids[r], argv[0], &fa, nullptr, argv.data(), envp.data()) != 0) pids[r] = -1;
    posix_spawn_file_actions_destroy(&fa);
  }
  run.status.assign(nranks, -1);
  int left = nranks;
  for (int r = 0; r < nranks; r++)
    if (pids[r] < 0) left--;
  while (left > 0) {
    for (int r = 0; r < nranks; r++) {
      if (pids[r] <= 0) continue;
      int st;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        run.status[r] = st;
        pids[r] = 0;
        left--;
      }
    }
    if (std::chrono::duration<double>(Clock::now() - t0).count() > timeout) {
      for (int r = 0; r < nranks; r++)
        if (pids[r] > 0) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  run.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  for (int r = 0; r < nranks; r++) {
    std::ifstream f(dir + "/stderr." + std::to_string(r));
    std::stringstream ss;
    ss << f.rdbuf();
    run.stderr_.push_back(ss.str());
  }
  std::string cmd = "rm -rf '" + dir + "'";
  if (system(cmd.c_str()) != 0) {
  }
  return run;
}

void expectAllPassed(const RankRun& run) {
  for (size_t r = 0; r < run.status.size(); r++) {
    EXPECT_TRUE(run.status[r] != -1 && WIFEXITED(run.status[r]) && WEXITSTATUS(run.status[r]) == 0)
        << "rank " << r << " status " << run.status[r] << ", stderr:\n"
        << run.stderr_[r];
  }
}

// Shows the timings the ranks measured ("... after N s", "... took N s").
void printTimings(const RankRun& run) {
  for (size_t r = 0; r < run.stderr_.size(); r++) {
    std::istringstream in(run.stderr_[r]);
    std::string line;
    while (std::getline(in, line))
      if (line.rfind("rank ", 0) == 0) printf("  [rank %zu] %s\n", r, line.c_str());
  }
}

TEST(FakeNcclProcesses, GroupedExchangeOfRandomSizes) {
  for (int n : {2, 3, 4}) {
    for (uint64_t seed : {1u, 2u}) {
      RankRun run = runRanks("exchange", n, {}, 120, seed * 1000 + n);
      SCOPED_TRACE("nranks " + std::to_string(n) + " seed " + std::to_string(seed));
      expectAllPassed(run);
    }
  }
}

TEST(FakeNcclProcesses, NonblockingCommunicator) { expectAllPassed(runRanks("exchange-nonblocking", 3)); }

TEST(FakeNcclProcesses, UngroupedSendSendDeadlockIsReported) {
  std::vector<std::vector<std::string>> env(2, {"FAKENCCL_DEADLOCK_SECONDS=2"});
  RankRun run = runRanks("deadlock", 2, env, 60);
  expectAllPassed(run);
  printTimings(run);
  for (int r = 0; r < 2; r++) {
    EXPECT_NE(std::string::npos, run.stderr_[r].find("DEADLOCK")) << run.stderr_[r];
    // The report names both ranks and both operations.
    std::string peerOp = "rank " + std::to_string(1 - r) + " is blocked in: ncclSend #1";
    EXPECT_NE(std::string::npos, run.stderr_[r].find(peerOp)) << run.stderr_[r];
  }
  EXPECT_LT(run.seconds, 30);
}

TEST(FakeNcclProcesses, ReceiveSmallerThanSendIsInvalidUsage) {
  RankRun run = runRanks("size-mismatch", 2, {}, 60);
  expectAllPassed(run);
  EXPECT_NE(std::string::npos, run.stderr_[0].find("receives 2048 bytes")) << run.stderr_[0];
}

TEST(FakeNcclProcesses, DeadPeerIsAnAsyncErrorAndAbortUnblocks) {
  RankRun run = runRanks("deadpeer", 2, {}, 60);
  expectAllPassed(run);
  printTimings(run);
  EXPECT_LT(run.seconds, 10);
}

TEST(FakeNcclProcesses, InjectedErrorsArrive) {
  expectAllPassed(runRanks("inject-api", 2, {}, 60));
  std::vector<std::vector<std::string>> env{{"FAKENCCL_FAIL_AFTER_OPS=2"}, {}};
  RankRun run = runRanks("inject-env", 2, env, 60);
  expectAllPassed(run);
  EXPECT_NE(std::string::npos, run.stderr_[0].find("FAKENCCL_FAIL_AFTER_OPS=2 reached")) << run.stderr_[0];
}

TEST(FakeNcclProcesses, CollectivesAreExact) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE("nranks " + std::to_string(n));
    expectAllPassed(runRanks("collectives", n, {}, 180));
  }
}

}  // namespace
