// The double's own tests: that it catches the wrong code a GPU would catch
// (or punish), and that right code gets right results from it.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <random>
#include <thread>
#include <vector>

#include "tests/fakecuda/fakecuda.h"

namespace {

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call
#define NCCL_OK(call) ASSERT_EQ((call), ncclSuccess) << #call << ": " << ncclGetLastError(nullptr)

void sleepOnStream(cudaStream_t s, int ms) {
  static int msArg;
  msArg = ms;
  ASSERT_EQ(cudaLaunchHostFunc(s, [](void* p) { std::this_thread::sleep_for(std::chrono::milliseconds(*(int*)p)); },
                               &msArg),
            cudaSuccess);
}

TEST(FakeCudaDeathTest, HostReadOfDeviceMemoryCrashes) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 4096), cudaSuccess);
  EXPECT_DEATH({ volatile char c = *(volatile char*)p; (void)c; }, "");
  EXPECT_DEATH({ memset(p, 0, 16); }, "");
  EXPECT_DEATH({ fakecudaAlias(p, 16); }, "host code touched device memory");
  cudaFree(p);
}

TEST(FakeCuda, CopiesPastAnAllocationAreRefused) {
  void* p = nullptr;
  ASSERT_EQ(cudaMalloc(&p, 100), cudaSuccess);
  std::vector<char> host(200);
  EXPECT_EQ(cudaMemcpy(host.data(), p, 101, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), (char*)p + 50, 51, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(host.data(), (char*)p + 50, 50, cudaMemcpyDeviceToHost), cudaSuccess);
  // The kind must say where the memory is.
  EXPECT_EQ(cudaMemcpy(p, host.data(), 10, cudaMemcpyDeviceToHost), cudaErrorInvalidValue);
  cudaGetLastError();
  cudaFree(p);
}

TEST(FakeCuda, PointerAttributesTellDeviceFromHost) {
  void *d = nullptr, *pinned = nullptr;
  ASSERT_EQ(cudaSetDevice(3), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d, 64), cudaSuccess);
  ASSERT_EQ(cudaMallocHost(&pinned, 64), cudaSuccess);
  int onStack = 0;
  cudaPointerAttributes a;
  ASSERT_EQ(cudaPointerGetAttributes(&a, (char*)d + 10), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeDevice);
  EXPECT_EQ(a.device, 3);
  ASSERT_EQ(cudaPointerGetAttributes(&a, pinned), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeHost);
  ASSERT_EQ(cudaPointerGetAttributes(&a, &onStack), cudaSuccess);
  EXPECT_EQ(a.type, cudaMemoryTypeUnregistered);
  cudaFree(d);
  cudaFreeHost(pinned);
  cudaSetDevice(0);
}

// Stream B reads what stream A writes. Without an event B runs ahead (A is
// held back); with one, never.
TEST(FakeCuda, StreamsAreOrderedOnlyThroughEvents) {
  for (bool withEvent : {false, true}) {
    cudaStream_t a, b;
    ASSERT_EQ(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking), cudaSuccess);
    void* d;
    ASSERT_EQ(cudaMalloc(&d, 4), cudaSuccess);
    ASSERT_EQ(cudaMemset(d, 0, 4), cudaSuccess);
    sleepOnStream(a, 100);
    ASSERT_EQ(cudaMemsetAsync(d, 7, 4, a), cudaSuccess);
    cudaEvent_t e;
    ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
    ASSERT_EQ(cudaEventRecord(e, a), cudaSuccess);
    if (withEvent) ASSERT_EQ(cudaStreamWaitEvent(b, e, 0), cudaSuccess);
    unsigned char got[4] = {};
    ASSERT_EQ(cudaMemcpyAsync(got, d, 4, cudaMemcpyDeviceToHost, b), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(b), cudaSuccess);
    EXPECT_EQ(got[0] == 7, withEvent) << (withEvent ? "the event did not order the streams"
                                                    : "stream b waited for stream a without an event");
    ASSERT_EQ(cudaStreamSynchronize(a), cudaSuccess);
    cudaEventDestroy(e);
    cudaFree(d);
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
  }
}

TEST(FakeCuda, AResultReadBeforeTheStreamIsSynchronisedIsNotThereYet) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  void* d;
  ASSERT_EQ(cudaMalloc(&d, 1024), cudaSuccess);
  std::vector<unsigned char> host(1024, 0);
  sleepOnStream(s, 50);
  ASSERT_EQ(cudaMemsetAsync(d, 9, 1024, s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), d, 1024, cudaMemcpyDeviceToHost, s), cudaSuccess);
  EXPECT_EQ(host[0], 0) << "the copy completed within the call";
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(host[0], 9);
  EXPECT_EQ(host[1023], 9);
  cudaFree(d);
  cudaStreamDestroy(s);
}

TEST(FakeCuda, TheLegacyStreamWaitsForBlockingStreamsButNotForNonBlockingOnes) {
  for (bool blocking : {true, false}) {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, blocking ? cudaStreamDefault : cudaStreamNonBlocking), cudaSuccess);
    void* d;
    ASSERT_EQ(cudaMalloc(&d, 4), cudaSuccess);
    ASSERT_EQ(cudaMemset(d, 0, 4), cudaSuccess);
    sleepOnStream(s, 100);
    ASSERT_EQ(cudaMemsetAsync(d, 5, 4, s), cudaSuccess);
    unsigned char got[4] = {};
    ASSERT_EQ(cudaMemcpy(got, d, 4, cudaMemcpyDeviceToHost), cudaSuccess);  // the legacy stream
    EXPECT_EQ(got[0] == 5, blocking);
    ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaFree(d);
    cudaStreamDestroy(s);
  }
}

TEST(FakeCuda, InjectedStreamErrorsArriveOnce) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ASSERT_EQ(fakecudaInjectStreamError(s, cudaErrorLaunchFailure), cudaSuccess);
  ASSERT_EQ(cudaLaunchHostFunc(s, [](void*) {}, nullptr), cudaSuccess);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  cudaGetLastError();
  cudaStreamDestroy(s);
}

TEST(FakeCuda, KernelsSeeDeviceMemoryThroughTheAlias) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  int* d;
  ASSERT_EQ(cudaMalloc((void**)&d, 16 * sizeof(int)), cudaSuccess);
  struct Args {
    int* d;
    int n;
  } args{d, 16};
  ASSERT_EQ(fakecudaLaunch(
                s,
                [](void* p) {
                  Args* a = (Args*)p;
                  int* x = (int*)fakecudaAlias(a->d, a->n * sizeof(int));
                  for (int i = 0; i < a->n; i++) x[i] = i * i;
                },
                &args, sizeof args),
            cudaSuccess);
  int host[16];
  ASSERT_EQ(cudaMemcpyAsync(host, d, sizeof host, cudaMemcpyDeviceToHost, s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  for (int i = 0; i < 16; i++) EXPECT_EQ(host[i], i * i);
  cudaFree(d);
  cudaStreamDestroy(s);
}

// ---- NCCL: ranks are processes ----

// Runs body(rank, id) in n forked processes; true if all exited 0.
bool runRanks(int n, const std::function<int(int, const ncclUniqueId&)>& body) {
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; r++) {
    pid_t p = fork();
    if (p == 0) _exit(body(r, id));
    pids.push_back(p);
  }
  bool ok = true;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    ok &= WIFEXITED(st) && WEXITSTATUS(st) == 0;
  }
  return ok;
}

ncclComm_t initComm(int n, int rank, const ncclUniqueId& id) {
  ncclComm_t c = nullptr;
  if (ncclCommInitRank(&c, n, id, rank) != ncclSuccess) _exit(90);
  return c;
}

uint8_t byteOf(int src, int dst, size_t i) { return (uint8_t)(src * 31 + dst * 7 + i * 13); }

TEST(FakeNccl, GroupedExchangeOfRandomSizesMovesEveryByte) {
  for (int n : {2, 3, 4}) {
    const unsigned seed = std::random_device{}();
    EXPECT_TRUE(runRanks(n, [&](int rank, const ncclUniqueId& id) {
      ncclComm_t c = initComm(n, rank, id);
      auto bytes = [&](int s, int d) { return (size_t)((seed + s * 131 + d * 17) % 50000); };
      cudaStream_t st;
      cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
      std::vector<void*> sendBuf(n), recvBuf(n);
      ncclGroupStart();
      for (int p = 0; p < n; p++) {
        cudaMalloc(&sendBuf[p], bytes(rank, p) + 1);
        cudaMalloc(&recvBuf[p], bytes(p, rank) + 1);
        std::vector<uint8_t> h(bytes(rank, p));
        for (size_t i = 0; i < h.size(); i++) h[i] = byteOf(rank, p, i);
        cudaMemcpy(sendBuf[p], h.data(), h.size(), cudaMemcpyHostToDevice);
        ncclSend(sendBuf[p], bytes(rank, p), ncclUint8, p, c, st);
        ncclRecv(recvBuf[p], bytes(p, rank), ncclUint8, p, c, st);
      }
      if (ncclGroupEnd() != ncclSuccess) return 2;
      if (cudaStreamSynchronize(st) != cudaSuccess) return 3;
      for (int p = 0; p < n; p++) {
        std::vector<uint8_t> h(bytes(p, rank));
        cudaMemcpy(h.data(), recvBuf[p], h.size(), cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < h.size(); i++)
          if (h[i] != byteOf(p, rank, i)) return 4;
      }
      return ncclCommDestroy(c) == ncclSuccess ? 0 : 5;
    })) << n << " ranks";
  }
}

// Both ranks send first, each outside a group: on a GPU that can hang; here
// it is reported and the stream fails.
TEST(FakeNccl, UngroupedSendBeforeReceiveOnBothRanksIsADeadlockReported) {
  setenv("FAKENCCL_DEADLOCK_SECONDS", "2", 1);
  // The ranks meet (outside the communicator) before either aborts: an abort
  // would make the other's state a remote error instead.
  auto* checked = (std::atomic<int>*)mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  new (checked) std::atomic<int>(0);
  EXPECT_TRUE(runRanks(2, [&](int rank, const ncclUniqueId& id) {
    ncclComm_t c = initComm(2, rank, id);
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    void *s, *r;
    cudaMalloc(&s, 64);
    cudaMalloc(&r, 64);
    ncclSend(s, 64, ncclUint8, 1 - rank, c, st);
    ncclRecv(r, 64, ncclUint8, 1 - rank, c, st);
    if (cudaStreamSynchronize(st) != cudaErrorLaunchFailure) return 2;
    ncclResult_t state;
    ncclCommGetAsyncError(c, &state);
    if (state != ncclInvalidUsage) return 3;
    (*checked)++;
    while (checked->load() < 2) usleep(1000);
    ncclCommAbort(c);
    return 0;
  }));
  munmap(checked, 4096);
  unsetenv("FAKENCCL_DEADLOCK_SECONDS");
}

TEST(FakeNccl, ADeadPeerIsARemoteErrorAndAbortEndsTheWaitingWork) {
  EXPECT_TRUE(runRanks(2, [&](int rank, const ncclUniqueId& id) {
    ncclComm_t c = initComm(2, rank, id);
    if (rank == 1) _exit(0);  // dies without finalizing
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    void* r;
    cudaMalloc(&r, 64);
    // Enqueued (it then waits for the dead peer), or, if the death is known
    // already, refused with the communicator's error.
    const ncclResult_t posted = ncclRecv(r, 64, ncclUint8, 1, c, st);
    if (posted != ncclSuccess && posted != ncclRemoteError) return 5;
    ncclResult_t state = ncclSuccess;
    for (int i = 0; i < 100 && state == ncclSuccess; i++) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      ncclCommGetAsyncError(c, &state);
    }
    if (state != ncclRemoteError) return 2;
    if (posted == ncclSuccess && cudaStreamQuery(st) != cudaErrorNotReady) return 3;  // still waiting, as a kernel would
    ncclCommAbort(c);
    return cudaStreamSynchronize(st) == cudaSuccess ? 0 : 4;
  }));
}

TEST(FakeNccl, HostBuffersAreRefused) {
  EXPECT_TRUE(runRanks(1, [&](int rank, const ncclUniqueId& id) {
    ncclComm_t c = initComm(1, rank, id);
    char host[64];
    if (ncclSend(host, 64, ncclUint8, 0, c, nullptr) != ncclInvalidArgument) return 2;
    return ncclCommDestroy(c) == ncclSuccess ? 0 : 3;
  }));
}

}  // namespace
