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

// Runs a single-process check in a child of fork(): CUDA does not survive
// fork (the double fails every call in a child whose parent used it, as a GPU
// does), so this process never uses CUDA itself and the multi-process tests
// after it can still fork ranks that do.
void inChild(const std::function<void()>& body) {
  fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    body();
    fflush(stdout);
    _exit(::testing::Test::HasFailure() ? 1 : 0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "the check failed in its process (see above)";
}

void sleepOnStream(cudaStream_t s, int ms) {
  static int msArg;
  msArg = ms;
  ASSERT_EQ(cudaLaunchHostFunc(s, [](void* p) { std::this_thread::sleep_for(std::chrono::milliseconds(*(int*)p)); },
                               &msArg),
            cudaSuccess);
}

// Each statement allocates in the death test's own child: this process
// never uses CUDA (see inChild). A failed allocation exits 0, which is not
// the death expected.
void* deviceBytes() {
  void* p = nullptr;
  if (cudaMalloc(&p, 4096) != cudaSuccess) _exit(0);
  return p;
}

TEST(FakeCudaDeathTest, HostReadOfDeviceMemoryCrashes) {
  EXPECT_DEATH({ volatile char c = *(volatile char*)deviceBytes(); (void)c; }, "");
  EXPECT_DEATH({ memset(deviceBytes(), 0, 16); }, "");
  EXPECT_DEATH({ fakecudaAlias(deviceBytes(), 16); }, "host code touched device memory");
}

TEST(FakeCuda, CopiesPastAnAllocationAreRefused) {
  inChild([&] {
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
  });
}

TEST(FakeCuda, PointerAttributesTellDeviceFromHost) {
  inChild([&] {
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
  });
}

// Stream B reads what stream A writes. Without an event B runs ahead (A is
// held back); with one, never.
TEST(FakeCuda, StreamsAreOrderedOnlyThroughEvents) {
  inChild([&] {
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
  });
}

TEST(FakeCuda, AResultReadBeforeTheStreamIsSynchronisedIsNotThereYet) {
  inChild([&] {
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
  });
}

TEST(FakeCuda, TheLegacyStreamWaitsForBlockingStreamsButNotForNonBlockingOnes) {
  inChild([&] {
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
  });
}

TEST(FakeCuda, InjectedStreamErrorsArriveOnce) {
  inChild([&] {
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    ASSERT_EQ(fakecudaInjectStreamError(s, cudaErrorLaunchFailure), cudaSuccess);
    ASSERT_EQ(cudaLaunchHostFunc(s, [](void*) {}, nullptr), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorLaunchFailure);
    EXPECT_EQ(cudaStreamSynchronize(s), cudaSuccess);
    cudaGetLastError();
    cudaStreamDestroy(s);
  });
}

TEST(FakeCuda, KernelsSeeDeviceMemoryThroughTheAlias) {
  inChild([&] {
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
  });
}

// Lazy loading (runtime.cc): the first use of a kernel on a device loads it,
// a context synchronization that waits for every stream of the device and
// counts as a host wait; cudaFuncGetAttributes loads it without launching;
// CUDA_MODULE_LOADING=EAGER loads everything up front.
void countUp(void* p) {
  int* x = (int*)fakecudaAlias(*(int**)p, sizeof(int));
  ++*x;
}
void countUpToo(void* p) { countUp(p); }

// Launches fn on s while another stream of the device sleeps for 300 ms:
// how many host waits the launch counted and how long it took.
std::pair<unsigned long long, double> launchBesideABusyStream(void (*fn)(void*), int** counter) {
  cudaStream_t s, busy;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaStreamCreateWithFlags(&busy, cudaStreamNonBlocking);
  sleepOnStream(busy, 300);
  const unsigned long long waits = fakecudaHostWaits();
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(fakecudaLaunch(s, fn, counter, sizeof *counter), cudaSuccess);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  const unsigned long long counted = fakecudaHostWaits() - waits;
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaStreamDestroy(s);
  cudaStreamDestroy(busy);
  return {counted, ms};
}

TEST(FakeCuda, AKernelsFirstLaunchWaitsForEveryStreamOfTheDevice) {
  inChild([&] {
    int* counter;
    CUDA_OK(cudaMalloc((void**)&counter, sizeof(int)));
    CUDA_OK(cudaMemset(counter, 0, sizeof(int)));
    auto first = launchBesideABusyStream(countUp, &counter);
    EXPECT_EQ(first.first, 1u);
    EXPECT_GE(first.second, 250) << "the first launch did not wait for the other stream";
    auto again = launchBesideABusyStream(countUp, &counter);
    EXPECT_EQ(again.first, 0u);
    EXPECT_LT(again.second, 250);
    // Loaded without a launch: its first launch needs nothing.
    cudaFuncAttributes attr;
    CUDA_OK(cudaFuncGetAttributes(&attr, (const void*)countUpToo));
    auto preloaded = launchBesideABusyStream(countUpToo, &counter);
    EXPECT_EQ(preloaded.first, 0u);
    EXPECT_LT(preloaded.second, 250);
    // Loaded on one device is not loaded on another.
    CUDA_OK(cudaSetDevice(1));
    int* counter1;
    CUDA_OK(cudaMalloc((void**)&counter1, sizeof(int)));
    CUDA_OK(cudaMemset(counter1, 0, sizeof(int)));
    EXPECT_EQ(launchBesideABusyStream(countUp, &counter1).first, 1u);
    int got = 0;
    CUDA_OK(cudaMemcpy(&got, counter1, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, 1);
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaMemcpy(&got, counter, sizeof got, cudaMemcpyDeviceToHost));
    EXPECT_EQ(got, 3);
  });
  inChild([&] {
    setenv("CUDA_MODULE_LOADING", "EAGER", 1);
    int* counter;
    CUDA_OK(cudaMalloc((void**)&counter, sizeof(int)));
    auto eager = launchBesideABusyStream(countUp, &counter);
    EXPECT_EQ(eager.first, 0u);
    EXPECT_LT(eager.second, 250);
  });
}

// A first launch behind a stream this host holds waits for the host: on a GPU
// it never returns; here the hold gives up after 3 s, and the launch returns
// only then.
TEST(FakeCuda, AKernelsFirstLaunchBehindAHeldStreamWaitsForTheHost) {
  inChild([&] {
    struct Gate {
      std::atomic<bool> open{false}, timedOut{false};
    } gate;
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_OK(cudaLaunchHostFunc(
        s,
        [](void* p) {
          Gate* g = (Gate*)p;
          const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
          while (!g->open.load())
            if (std::chrono::steady_clock::now() > end) {
              g->timedOut = true;
              return;
            }
        },
        &gate));
    int* counter;
    CUDA_OK(cudaMalloc((void**)&counter, sizeof(int)));
    CUDA_OK(fakecudaLaunch(s, countUp, &counter, sizeof counter));
    gate.open = true;
    CUDA_OK(cudaStreamSynchronize(s));
    EXPECT_TRUE(gate.timedOut.load()) << "the first launch did not wait for the held stream";
    cudaFree(counter);
    cudaStreamDestroy(s);
  });
}

// CUDA does not survive fork: once a process has used the runtime (even only
// cudaGetDeviceCount), a child it forks gets cudaErrorInitializationError
// from every call and cannot make an NCCL communicator; a child forked
// before any use is fine (inChild's are).
TEST(FakeCuda, CudaFailsInAChildForkedAfterTheParentUsedIt) {
  inChild([&] {
    int count = 0;
    CUDA_OK(cudaGetDeviceCount(&count));
    fflush(stdout);
    const pid_t pid = fork();
    if (pid == 0) {
      void* p = nullptr;
      int code = 0;
      if (cudaMalloc(&p, 64) != cudaErrorInitializationError) code |= 1;
      if (cudaGetDeviceCount(&count) != cudaErrorInitializationError) code |= 2;
      ncclUniqueId id;
      ncclComm_t c = nullptr;
      if (ncclGetUniqueId(&id) != ncclSuccess || ncclCommInitRank(&c, 1, id, 0) != ncclUnhandledCudaError) code |= 4;
      _exit(code);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0) << "1: cudaMalloc, 2: cudaGetDeviceCount, 4: ncclCommInitRank did not fail as CUDA does";
    void* p = nullptr;
    CUDA_OK(cudaMalloc(&p, 64));  // the parent itself goes on
    CUDA_OK(cudaFree(p));
  });
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

// Each rank on a device of its own: NCCL (and the double) refuses two ranks
// of one communicator on one GPU of one host.
ncclComm_t initComm(int n, int rank, const ncclUniqueId& id) {
  ncclComm_t c = nullptr;
  if (cudaSetDevice(rank % 8) != cudaSuccess || ncclCommInitRank(&c, n, id, rank) != ncclSuccess) _exit(90);
  return c;
}

uint8_t byteOf(int src, int dst, size_t i) { return (uint8_t)(src * 31 + dst * 7 + i * 13); }

// Also checks the byte counters that tests read to see who carried what.
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
      // The per-peer byte counters (fakencclPeerBytes) saw each send once.
      for (int p = 0; p < n; p++) {
        unsigned long long sent = 0;
        if (fakencclPeerBytes(c, p, &sent) != ncclSuccess || sent != bytes(rank, p)) return 6;
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

// The call-order rule: NCCL runs one communicator's operations one after
// another in call order, whatever their streams (it orders each launch after
// the previous one with events), and a group over several streams is one
// launch that waits for all of them and that all of them wait for.
std::atomic<bool> gGateOpen{false};
void waitAtGate(void*) {
  while (!gGateOpen.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

TEST(FakeNccl, OneCommunicatorsOperationsRunInCallOrderWhateverTheirStreams) {
  EXPECT_TRUE(runRanks(2, [&](int rank, const ncclUniqueId& id) {
    ncclComm_t c = initComm(2, rank, id);
    cudaStream_t a, b;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    float *x, *y;
    cudaMalloc((void**)&x, sizeof(float));
    cudaMalloc((void**)&y, sizeof(float));
    const float one = 1.0f;
    cudaMemcpy(x, &one, sizeof one, cudaMemcpyHostToDevice);
    cudaMemcpy(y, &one, sizeof one, cudaMemcpyHostToDevice);
    auto heldFor = [](cudaStream_t s) {  // true if s is still busy after 300 ms
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      return cudaStreamQuery(s) == cudaErrorNotReady;
    };
    // An all-reduce on b, called after one on a held stream, waits for it.
    gGateOpen = false;
    cudaLaunchHostFunc(a, waitAtGate, nullptr);
    if (ncclAllReduce(x, x, 1, ncclFloat, ncclSum, c, a) != ncclSuccess) return 2;
    if (ncclAllReduce(y, y, 1, ncclFloat, ncclSum, c, b) != ncclSuccess) return 3;
    if (!heldFor(b)) return 4;
    gGateOpen = true;
    if (cudaStreamSynchronize(b) != cudaSuccess || cudaStreamQuery(a) != cudaSuccess) return 5;
    float hx = 0, hy = 0;
    cudaMemcpy(&hx, x, sizeof hx, cudaMemcpyDeviceToHost);
    cudaMemcpy(&hy, y, sizeof hy, cudaMemcpyDeviceToHost);
    if (hx != 2.0f || hy != 2.0f) return 6;
    // A group with a send on a and a receive on b waits for b's earlier
    // work, and b's later work waits for the whole group.
    gGateOpen = false;
    cudaLaunchHostFunc(b, waitAtGate, nullptr);
    ncclGroupStart();
    ncclSend(x, 1, ncclFloat, 1 - rank, c, a);
    ncclRecv(y, 1, ncclFloat, 1 - rank, c, b);
    if (ncclGroupEnd() != ncclSuccess) return 7;
    if (!heldFor(a)) return 8;
    gGateOpen = true;
    if (cudaStreamSynchronize(b) != cudaSuccess || cudaStreamQuery(a) != cudaSuccess) return 9;
    ncclResult_t state;
    ncclCommGetAsyncError(c, &state);
    return state == ncclSuccess && ncclCommDestroy(c) == ncclSuccess ? 0 : 10;
  }));
}

// A send on one stream and its receive on another, each outside a group, on
// both ranks: the receives wait behind the sends, which wait for them. On a
// GPU that hangs; here it is reported, naming the rule. Once one rank's send
// is reported, its receive runs and may let the other rank's send through:
// so at least one rank must report it, and no rank may fail otherwise.
TEST(FakeNccl, SendAndReceiveOnTwoStreamsWithoutAGroupIsADeadlockReported) {
  setenv("FAKENCCL_DEADLOCK_SECONDS", "2", 1);
  // Per rank: 1 the deadlock reported by the rule's name, 2 no error, else
  // what went wrong; the ranks meet before either aborts (an abort would make
  // the other's state a remote error).
  auto* shared = (std::atomic<int>*)mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  for (int i = 0; i < 3; i++) new (shared + i) std::atomic<int>(0);
  EXPECT_TRUE(runRanks(2, [&](int rank, const ncclUniqueId& id) {
    ncclComm_t c = initComm(2, rank, id);
    cudaStream_t a, b;
    cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking);
    cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking);
    void *s, *r;
    cudaMalloc(&s, 64);
    cudaMalloc(&r, 64);
    ncclSend(s, 64, ncclUint8, 1 - rank, c, a);
    ncclRecv(r, 64, ncclUint8, 1 - rank, c, b);
    const cudaError_t synced = cudaStreamSynchronize(a);
    ncclResult_t state;
    ncclCommGetAsyncError(c, &state);
    int outcome = 3;
    if (synced == cudaErrorLaunchFailure && state == ncclInvalidUsage && strstr(ncclGetLastError(c), "the call-order rule"))
      outcome = 1;
    else if (synced == cudaSuccess && state == ncclSuccess)
      outcome = 2;
    shared[rank] = outcome;
    shared[2]++;
    while (shared[2].load() < 2) usleep(1000);
    ncclCommAbort(c);
    return 0;
  }));
  EXPECT_TRUE(shared[0] == 1 || shared[1] == 1) << "no rank reported the deadlock: " << shared[0] << " " << shared[1];
  EXPECT_TRUE(shared[0] != 3 && shared[1] != 3) << "a rank failed otherwise: " << shared[0] << " " << shared[1];
  munmap(shared, 4096);
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

// The one-thread rule: a second host thread's call on a communicator that
// another thread is using (here, holding it in an open group) is refused and
// breaks the communicator, as concurrent use does on a GPU (undefined: the
// two threads' operations interleave differently on each rank). One thread
// after another, each with its calls done, is fine.
TEST(FakeNccl, TwoHostThreadsUsingOneCommunicatorAtOnceAreRefused) {
  EXPECT_TRUE(runRanks(1, [&](int rank, const ncclUniqueId& id) {
    ncclComm_t c = initComm(1, rank, id);
    void *a = nullptr, *b = nullptr;
    if (cudaMalloc(&a, 64) != cudaSuccess || cudaMalloc(&b, 64) != cudaSuccess) return 2;
    auto selfExchange = [&] {  // a group of a send to itself and its receive
      if (ncclGroupStart() != ncclSuccess || ncclSend(a, 64, ncclUint8, 0, c, nullptr) != ncclSuccess ||
          ncclRecv(b, 64, ncclUint8, 0, c, nullptr) != ncclSuccess)
        return false;
      return ncclGroupEnd() == ncclSuccess && cudaStreamSynchronize(nullptr) == cudaSuccess;
    };
    for (int t = 0; t < 2; t++) {  // one thread after another
      bool ok = false;
      std::thread([&] { ok = selfExchange(); }).join();
      if (!ok) return 3;
    }
    std::atomic<int> stage{0};
    ncclResult_t second = ncclSuccess;
    std::thread other([&] {
      while (stage.load() == 0) std::this_thread::yield();
      second = ncclAllReduce(a, b, 16, ncclFloat32, ncclSum, c, nullptr);
      stage = 2;
    });
    if (ncclGroupStart() != ncclSuccess || ncclRecv(b, 64, ncclUint8, 0, c, nullptr) != ncclSuccess) return 4;
    stage = 1;  // the group holds the communicator while the other thread calls
    while (stage.load() != 2) std::this_thread::yield();
    other.join();
    if (second != ncclInvalidUsage) return 5;
    ncclSend(a, 64, ncclUint8, 0, c, nullptr);
    if (ncclGroupEnd() != ncclInvalidUsage) return 6;  // the communicator is broken
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(c, &async) != ncclSuccess || async != ncclInvalidUsage) return 7;
    ncclCommAbort(c);
    return 0;
  }));
}

// Ranks on one GPU: NCCL refuses them ("Duplicate GPU detected") on every
// rank, unless each has a host id of its own (NCCL_HOSTID), which lets ranks
// share one GPU (as the device tests did on a single H200).
TEST(FakeNccl, TwoRanksOnOneGpuAreRefusedUnlessTheirHostIdsDiffer) {
  for (bool hostIds : {false, true}) {
    EXPECT_TRUE(runRanks(2, [&](int rank, const ncclUniqueId& id) {
      if (hostIds)
        setenv("NCCL_HOSTID", ("fakecuda-test-" + std::to_string(rank)).c_str(), 1);
      else
        unsetenv("NCCL_HOSTID");
      if (cudaSetDevice(0) != cudaSuccess) return 2;
      ncclComm_t c = nullptr;
      const ncclResult_t r = ncclCommInitRank(&c, 2, id, rank);
      if (!hostIds) {
        if (r != ncclInvalidUsage) return 3;
        return strstr(ncclGetLastError(nullptr), "Duplicate GPU detected") ? 0 : 4;
      }
      if (r != ncclSuccess) return 5;
      // And they work: a grouped exchange on the shared device.
      cudaStream_t st;
      cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
      void *sb, *rb;
      cudaMalloc(&sb, 64);
      cudaMalloc(&rb, 64);
      cudaMemset(sb, rank + 1, 64);
      ncclGroupStart();
      ncclSend(sb, 64, ncclUint8, 1 - rank, c, st);
      ncclRecv(rb, 64, ncclUint8, 1 - rank, c, st);
      if (ncclGroupEnd() != ncclSuccess || cudaStreamSynchronize(st) != cudaSuccess) return 6;
      char h[64];
      cudaMemcpy(h, rb, 64, cudaMemcpyDeviceToHost);
      for (char b : h)
        if (b != 2 - rank) return 7;
      return ncclCommDestroy(c) == ncclSuccess ? 0 : 8;
    })) << (hostIds ? "with distinct NCCL_HOSTIDs" : "without host ids");
  }
}

// The bounded work queue: with room for 8 operations, an exchange enqueued
// group after group behind a stream that sleeps blocks the host (counted as
// a host wait and by fakencclQueueStats) until the device drains, never
// holds more than 8, and moves every byte.
TEST(FakeNccl, AFullWorkQueueBlocksTheHostUntilTheDeviceDrains) {
  setenv("FAKENCCL_QUEUE_DEPTH", "8", 1);
  EXPECT_TRUE(runRanks(2, [&](int rank, const ncclUniqueId& id) {
    ncclComm_t c = initComm(2, rank, id);
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    const int groups = 20;
    std::vector<void*> sb(groups), rb(groups);
    for (int g = 0; g < groups; g++) {
      cudaMalloc(&sb[g], 16);
      cudaMalloc(&rb[g], 16);
      cudaMemset(sb[g], rank * 64 + g, 16);
    }
    sleepOnStream(st, 300);
    const unsigned long long waits = fakecudaHostWaits();
    const auto start = std::chrono::steady_clock::now();
    for (int g = 0; g < groups; g++) {
      ncclGroupStart();
      ncclSend(sb[g], 16, ncclUint8, 1 - rank, c, st);
      ncclRecv(rb[g], 16, ncclUint8, 1 - rank, c, st);
      if (ncclGroupEnd() != ncclSuccess) return 2;
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    unsigned long long blocks = 0, most = 0;
    if (fakencclQueueStats(c, &blocks, &most) != ncclSuccess) return 3;
    if (blocks == 0 || fakecudaHostWaits() == waits) return 4;  // it blocked, and said so
    if (most > 8) return 5;
    if (ms < 200) return 6;  // the host waited for the sleeping stream
    if (cudaStreamSynchronize(st) != cudaSuccess) return 7;
    for (int g = 0; g < groups; g++) {
      char h[16];
      cudaMemcpy(h, rb[g], 16, cudaMemcpyDeviceToHost);
      for (char b : h)
        if (b != (char)((1 - rank) * 64 + g)) return 8;
    }
    return ncclCommDestroy(c) == ncclSuccess ? 0 : 9;
  }));
  unsetenv("FAKENCCL_QUEUE_DEPTH");
}

// A host function that holds its stream until the host opens it.
std::atomic<bool> gHeldStreamOpen{false};
void holdStream(void*) {
  while (!gHeldStreamOpen.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// One rank, a queue of 4, FAKENCCL_DEADLOCK_SECONDS 1: the body enqueues
// behind a stream the host holds, or a receive whose send comes later.
void queueDeadlockBody(bool holdTheStream) {
  setenv("FAKENCCL_QUEUE_DEPTH", "4", 1);
  setenv("FAKENCCL_DEADLOCK_SECONDS", "1", 1);
  ncclUniqueId id;
  ncclGetUniqueId(&id);
  ncclComm_t c = nullptr;
  if (ncclCommInitRank(&c, 1, id, 0) != ncclSuccess) _exit(2);
  cudaStream_t st;
  cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
  void* b = nullptr;
  cudaMalloc(&b, 64);
  if (holdTheStream) cudaLaunchHostFunc(st, holdStream, nullptr);
  // A receive from itself whose send is enqueued only after the rest.
  else ncclRecv(b, 64, ncclUint8, 0, c, st);
  for (int i = 0; i < 8; i++) ncclAllReduce(b, b, 16, ncclFloat32, ncclSum, c, st);
  ncclSend(b, 64, ncclUint8, 0, c, st);
  gHeldStreamOpen = true;  // never reached: the host is blocked above
  cudaStreamSynchronize(st);
  _exit(3);
}

// On a GPU both hang forever: the enqueue spins on a full queue that only
// this host thread could drain. The double aborts, naming the rule.
TEST(FakeNcclDeathTest, ABlockOnAFullQueueThatOnlyThisHostCouldDrainAborts) {
  EXPECT_DEATH(queueDeadlockBody(true), "bounded work queue rule");
  EXPECT_DEATH(queueDeadlockBody(false), "bounded work queue rule");
}

}  // namespace

// ---- Stream capture and graphs ----

// A kernel: x[i] = x[i] * 3 + add, for n ints.
struct Affine {
  int* x;
  int n;
  int add;
};
void affine(void* p) {
  Affine* a = (Affine*)p;
  int* x = (int*)fakecudaAlias(a->x, a->n * sizeof(int));
  for (int i = 0; i < a->n; i++) x[i] = x[i] * 3 + a->add;
}

// Capture on s a pass that forks to a second stream and joins back: copy in,
// a kernel on each half (one per stream), copy out. Nothing runs until the
// graph is launched; each launch reads the host input as it is then and
// writes every byte of the output.
TEST(FakeCudaGraph, ACapturedPassRunsOnlyWhenLaunchedAndAgainAtEveryLaunch) {
  inChild([&] {
    cudaStream_t s, side;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    cudaEvent_t fork, join;
    CUDA_OK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
    CUDA_OK(cudaEventCreateWithFlags(&join, cudaEventDisableTiming));
    const int n = 4096, half = n / 2;
    int* d;
    CUDA_OK(cudaMalloc((void**)&d, n * sizeof(int)));
    std::vector<int> in(n), out(n, -1);

    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    cudaStreamCaptureStatus st;
    unsigned long long id = 0;
    CUDA_OK(cudaStreamGetCaptureInfo(s, &st, &id));
    EXPECT_EQ(st, cudaStreamCaptureStatusActive);
    CUDA_OK(cudaStreamIsCapturing(side, &st));
    EXPECT_EQ(st, cudaStreamCaptureStatusNone);
    CUDA_OK(cudaMemcpyAsync(d, in.data(), n * sizeof(int), cudaMemcpyHostToDevice, s));
    CUDA_OK(cudaEventRecord(fork, s));
    CUDA_OK(cudaStreamWaitEvent(side, fork, 0));  // side joins the capture
    CUDA_OK(cudaStreamIsCapturing(side, &st));
    EXPECT_EQ(st, cudaStreamCaptureStatusActive);
    Affine lo{d, half, 1}, hi{d + half, half, 2};
    CUDA_OK(fakecudaLaunch(s, affine, &lo, sizeof lo));
    CUDA_OK(fakecudaLaunch(side, affine, &hi, sizeof hi));
    CUDA_OK(cudaEventRecord(join, side));
    CUDA_OK(cudaStreamWaitEvent(s, join, 0));
    CUDA_OK(cudaMemcpyAsync(out.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost, s));
    cudaGraph_t g;
    CUDA_OK(cudaStreamEndCapture(s, &g));
    CUDA_OK(cudaStreamIsCapturing(side, &st));
    EXPECT_EQ(st, cudaStreamCaptureStatusNone);

    // Nothing ran: the device memory is still fresh, the output untouched.
    std::vector<int> now(n);
    CUDA_OK(cudaMemcpy(now.data(), d, n * sizeof(int), cudaMemcpyDeviceToHost));
    EXPECT_EQ(now[0], (int)0xCDCDCDCD);
    EXPECT_EQ(out[0], -1);

    cudaGraphExec_t x;
    CUDA_OK(cudaGraphInstantiate(&x, g, 0));
    CUDA_OK(cudaGraphDestroy(g));  // the executable graph stands alone
    std::mt19937 rng(std::random_device{}());
    for (int launch = 0; launch < 3; launch++) {
      for (int& v : in) v = (int)(rng() % 100000);
      std::fill(out.begin(), out.end(), -1);
      CUDA_OK(cudaGraphLaunch(x, s));
      CUDA_OK(cudaStreamSynchronize(s));
      int wrong = 0;
      for (int i = 0; i < n; i++) wrong += out[i] != in[i] * 3 + (i < half ? 1 : 2);
      EXPECT_EQ(wrong, 0) << "launch " << launch;
    }
    CUDA_OK(cudaGraphExecDestroy(x));
    cudaFree(d);
    cudaEventDestroy(fork);
    cudaEventDestroy(join);
    cudaStreamDestroy(s);
    cudaStreamDestroy(side);
  });
}

// Graph memory (cudaMallocAsync in a capture) is at one address for every
// launch and fresh at each: nothing carries over between launches.
TEST(FakeCudaGraph, MemoryAllocatedInACaptureIsFreshAtEveryLaunch) {
  inChild([&] {
    cudaStream_t s;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    int seen[2][4];
    CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    int* scratch = nullptr;
    CUDA_OK(cudaMallocAsync((void**)&scratch, 4 * sizeof(int), s));
    CUDA_OK(cudaMemcpyAsync(seen[0], scratch, sizeof seen[0], cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaMemsetAsync(scratch, 0, 4 * sizeof(int), s));
    CUDA_OK(cudaMemcpyAsync(seen[1], scratch, sizeof seen[1], cudaMemcpyDeviceToHost, s));
    CUDA_OK(cudaFreeAsync(scratch, s));
    cudaGraph_t g;
    CUDA_OK(cudaStreamEndCapture(s, &g));
    cudaGraphExec_t x;
    CUDA_OK(cudaGraphInstantiate(&x, g, 0));
    for (int launch = 0; launch < 2; launch++) {
      memset(seen, 0x11, sizeof seen);
      CUDA_OK(cudaGraphLaunch(x, s));
      CUDA_OK(cudaStreamSynchronize(s));
      EXPECT_EQ(seen[0][0], (int)0xCDCDCDCD) << "launch " << launch;
      EXPECT_EQ(seen[1][3], 0) << "launch " << launch;
    }
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
    cudaStreamDestroy(s);
  });
}

// Ends a capture expected to have been invalidated.
void expectInvalidated(cudaStream_t s) {
  cudaStreamCaptureStatus st;
  ASSERT_EQ(cudaStreamIsCapturing(s, &st), cudaSuccess);
  EXPECT_EQ(st, cudaStreamCaptureStatusInvalidated);
  cudaGraph_t g = (cudaGraph_t)1;
  EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(g, nullptr);
  cudaGetLastError();
}

TEST(FakeCudaGraph, CallsThatCannotBeCapturedFailAndInvalidateTheCapture) {
  inChild([&] {
    cudaStream_t s, other;
    CUDA_OK(cudaStreamCreate(&s));  // blocking: takes part in the legacy stream's order
    CUDA_OK(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
    void* d = nullptr;
    CUDA_OK(cudaMalloc(&d, 64));
    cudaEvent_t e;
    CUDA_OK(cudaEventCreate(&e));
    auto begin = [&](cudaStreamCaptureMode m = cudaStreamCaptureModeGlobal) {
      ASSERT_EQ(cudaStreamBeginCapture(s, m), cudaSuccess);
      ASSERT_EQ(cudaMemsetAsync(d, 0, 64, s), cudaSuccess);
    };
    // Waiting for the capturing stream: in every mode, relaxed included.
    for (auto mode : {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeRelaxed}) {
      begin(mode);
      EXPECT_EQ(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
      EXPECT_EQ(cudaMemsetAsync(d, 0, 64, s), cudaErrorStreamCaptureInvalidated);
      expectInvalidated(s);
      begin(mode);
      EXPECT_EQ(cudaStreamQuery(s), cudaErrorStreamCaptureUnsupported);
      expectInvalidated(s);
    }
    begin();
    EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorStreamCaptureUnsupported);
    expectInvalidated(s);
    // Potentially unsafe calls: refused in global and thread-local mode...
    void* p = nullptr;
    for (auto mode : {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal}) {
      begin(mode);
      EXPECT_EQ(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
      expectInvalidated(s);
      begin(mode);
      EXPECT_EQ(ncclMemAlloc(&p, 64), ncclUnhandledCudaError);
      expectInvalidated(s);
      begin(mode);
      EXPECT_EQ(cudaMemcpy(d, d, 8, cudaMemcpyDeviceToDevice), cudaErrorStreamCaptureUnsupported);
      expectInvalidated(s);
      begin(mode);
      EXPECT_EQ(cudaStreamSynchronize(other), cudaErrorStreamCaptureUnsupported);
      expectInvalidated(s);
    }
    // ... and from another thread only in global mode.
    for (auto mode : {cudaStreamCaptureModeGlobal, cudaStreamCaptureModeThreadLocal}) {
      begin(mode);
      cudaError_t there = cudaSuccess;
      std::thread([&] { there = cudaMalloc(&p, 64); }).join();
      if (mode == cudaStreamCaptureModeGlobal) {
        EXPECT_EQ(there, cudaErrorStreamCaptureUnsupported);
        expectInvalidated(s);
      } else {
        EXPECT_EQ(there, cudaSuccess);
        cudaGraph_t g;
        EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
        cudaGraphDestroy(g);
        cudaFree(p);
      }
    }
    // ... and allowed in relaxed mode.
    begin(cudaStreamCaptureModeRelaxed);
    EXPECT_EQ(cudaMalloc(&p, 64), cudaSuccess);
    EXPECT_EQ(cudaFree(p), cudaSuccess);
    {
      cudaGraph_t g;
      EXPECT_EQ(cudaStreamEndCapture(s, &g), cudaSuccess);
      cudaGraphDestroy(g);
    }
    // An event recorded in the capture cannot be queried or waited for by the host.
    begin(cudaStreamCaptureModeRelaxed);
    CUDA_OK(cudaEventRecord(e, s));
    EXPECT_EQ(cudaEventQuery(e), cudaErrorCapturedEvent);
    expectInvalidated(s);
    begin(cudaStreamCaptureModeRelaxed);
    CUDA_OK(cudaEventRecord(e, s));
    EXPECT_EQ(cudaEventSynchronize(e), cudaErrorCapturedEvent);
    expectInvalidated(s);
    // The legacy stream would depend on the capturing blocking stream.
    begin();
    EXPECT_EQ(cudaMemsetAsync(d, 0, 64, cudaStreamLegacy), cudaErrorStreamCaptureImplicit);
    expectInvalidated(s);
    EXPECT_EQ(cudaStreamBeginCapture(cudaStreamLegacy, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
    // A dependency on work outside the capture.
    CUDA_OK(cudaEventRecord(e, other));
    begin();
    EXPECT_EQ(cudaStreamWaitEvent(s, e, 0), cudaErrorStreamCaptureIsolation);
    expectInvalidated(s);
    cudaGetLastError();
    CUDA_OK(cudaStreamSynchronize(s));
    cudaEventDestroy(e);
    cudaFree(d);
    cudaStreamDestroy(s);
    cudaStreamDestroy(other);
  });
}

TEST(FakeCudaGraph, AForkNotJoinedBackFailsTheCapture) {
  inChild([&] {
    cudaStream_t s, side;
    CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    CUDA_OK(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    void* d = nullptr;
    CUDA_OK(cudaMalloc(&d, 64));
    cudaEvent_t fork, join;
    CUDA_OK(cudaEventCreate(&fork));
    CUDA_OK(cudaEventCreate(&join));
    for (bool joinBack : {false, true}) {
      CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      CUDA_OK(cudaEventRecord(fork, s));
      CUDA_OK(cudaStreamWaitEvent(side, fork, 0));
      CUDA_OK(cudaMemsetAsync(d, 1, 64, side));
      if (joinBack) {
        CUDA_OK(cudaEventRecord(join, side));
        CUDA_OK(cudaStreamWaitEvent(s, join, 0));
      }
      // Ending on the forked stream is not ending the capture.
      cudaGraph_t g = nullptr;
      EXPECT_EQ(cudaStreamEndCapture(side, &g), cudaErrorStreamCaptureUnmatched);
      EXPECT_EQ(cudaStreamEndCapture(s, &g), joinBack ? cudaSuccess : cudaErrorStreamCaptureUnjoined);
      EXPECT_EQ(g != nullptr, joinBack);
      if (g) cudaGraphDestroy(g);
      cudaStreamCaptureStatus st;
      CUDA_OK(cudaStreamIsCapturing(side, &st));
      EXPECT_EQ(st, cudaStreamCaptureStatusNone);
      cudaGetLastError();
    }
    cudaEventDestroy(fork);
    cudaEventDestroy(join);
    cudaFree(d);
    cudaStreamDestroy(s);
    cudaStreamDestroy(side);
  });
}

// NCCL calls in a capture run at every launch, matched with the peers'
// launches: a grouped exchange captured once and launched three times with
// fresh data moves every byte each time (and nothing at capture).
TEST(FakeNcclGraph, ACapturedExchangeMovesFreshBytesAtEveryLaunch) {
  const int n = 3;
  EXPECT_TRUE(runRanks(n, [&](int rank, const ncclUniqueId& id) {
    ncclComm_t c = initComm(n, rank, id);
    const size_t bytes = 10000 + rank;  // what this rank sends to each peer
    cudaStream_t st;
    cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking);
    std::vector<void*> sendBuf(n), recvBuf(n);
    for (int p = 0; p < n; p++) {
      cudaMalloc(&sendBuf[p], bytes);
      cudaMalloc(&recvBuf[p], 10000 + p);
    }
    if (cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal) != cudaSuccess) return 2;
    ncclGroupStart();
    for (int p = 0; p < n; p++) {
      ncclSend(sendBuf[p], bytes, ncclUint8, p, c, st);
      ncclRecv(recvBuf[p], 10000 + p, ncclUint8, p, c, st);
    }
    if (ncclGroupEnd() != ncclSuccess) return 3;
    cudaGraph_t g;
    if (cudaStreamEndCapture(st, &g) != cudaSuccess) return 4;
    cudaGraphExec_t x;
    if (cudaGraphInstantiate(&x, g, 0) != cudaSuccess) return 5;
    for (int launch = 0; launch < 3; launch++) {
      for (int p = 0; p < n; p++) {
        std::vector<uint8_t> h(bytes);
        for (size_t i = 0; i < h.size(); i++) h[i] = (uint8_t)(byteOf(rank, p, i) + launch * 41);
        cudaMemcpy(sendBuf[p], h.data(), h.size(), cudaMemcpyHostToDevice);
        cudaMemset(recvBuf[p], 0xEE, 10000 + p);
      }
      if (cudaGraphLaunch(x, st) != cudaSuccess || cudaStreamSynchronize(st) != cudaSuccess) return 6;
      for (int p = 0; p < n; p++) {
        std::vector<uint8_t> h(10000 + p);
        cudaMemcpy(h.data(), recvBuf[p], h.size(), cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < h.size(); i++)
          if (h[i] != (uint8_t)(byteOf(p, rank, i) + launch * 41)) return 7;
      }
    }
    cudaGraphExecDestroy(x);
    cudaGraphDestroy(g);
    return ncclCommDestroy(c) == ncclSuccess ? 0 : 8;
  }));
}
