// The double's CUDA runtime: devices, device memory the host cannot touch,
// streams that each run their work on a thread of their own after a random
// delay, events, copies, host functions and host-compiled kernels.
#include <pthread.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <set>

#include "tests/fakecuda/fakecuda.h"
#include "tests/fakecuda/internal.h"

namespace fakecuda {

namespace {

// ---- Device memory: a PROT_NONE mapping the caller gets, a read-write alias the double uses ----
struct Alloc {
  size_t bytes = 0;    // as asked for
  size_t mapped = 0;   // rounded up to pages
  char* alias = nullptr;
  int device = 0;
};
// Everything global lives on the heap and is never destroyed: stream threads
// may still wait on the lock when the process exits.
std::mutex& gMemMu = *new std::mutex;
std::map<uintptr_t, Alloc>& gAllocs = *new std::map<uintptr_t, Alloc>;  // by device address

// The allocation containing p, or end().
std::map<uintptr_t, Alloc>::iterator findAlloc(const void* p) {
  auto it = gAllocs.upper_bound((uintptr_t)p);
  if (it == gAllocs.begin()) return gAllocs.end();
  --it;
  if ((uintptr_t)p >= it->first + std::max<size_t>(it->second.bytes, 1)) return gAllocs.end();
  return it;
}

std::set<void*>& gPinned = *new std::set<void*>;  // cudaMallocHost memory (under gMemMu)
// Graph memory (cudaMallocAsync in a capture) whose graph has not been
// launched yet, base -> bytes (under gMemMu): CUDA's pointer attributes call
// it unregistered memory of device -2 until the first launch, as an H200
// showed (a capture's own staging looked like host memory).
std::map<uintptr_t, size_t>& gUnlaunched = *new std::map<uintptr_t, size_t>;

bool unlaunchedGraphMemory(const void* p) {
  std::lock_guard<std::mutex> l(gMemMu);
  auto it = gUnlaunched.upper_bound((uintptr_t)p);
  if (it == gUnlaunched.begin()) return false;
  --it;
  return (uintptr_t)p < it->first + std::max<size_t>(it->second, 1);
}
void graphMemoryLaunched(const std::vector<void*>& ptrs) {
  std::lock_guard<std::mutex> l(gMemMu);
  for (void* p : ptrs) gUnlaunched.erase((uintptr_t)p);
}

thread_local int tlsDevice = 0;
thread_local cudaError_t tlsError = cudaSuccess;
thread_local bool tlsInKernel = false;  // running a fakecudaLaunch function

std::mutex& gMu = *new std::mutex;
// A pointer: a child of fork() gets a new one (a condition variable copied
// with the parent's waiters in it is broken).
std::condition_variable* gCv = new std::condition_variable;
#define gChanged (*gCv)

// ---- Streams ----
// Streams made by cudaStreamCreate and not destroyed; every stream ever
// started (for the legacy stream's implicit order); the legacy stream of each
// device. All under gMu.
auto& gOwned = *new std::map<Stream*, std::shared_ptr<Stream>>;
auto& gAllStreams = *new std::vector<std::shared_ptr<Stream>>;
auto& gLegacy = *new std::vector<std::shared_ptr<Stream>>;

int deviceCount() {
  static int n = envInt("FAKECUDA_DEVICE_COUNT", 8);
  return n;
}

void runStream(std::shared_ptr<Stream> s) {
  std::mt19937_64 rng(std::random_device{}() ^ (uintptr_t)s.get());
  const int maxDelayUs = envInt("FAKECUDA_DELAY_US", 200);
  std::unique_lock<std::mutex> l(gMu);
  for (;;) {
    gChanged.wait(l, [&] { return s->stop || (!s->queue.empty() && depsDone(s->queue.front().deps)); });
    if (s->queue.empty()) return;  // stopped and drained
    Item item = std::move(s->queue.front());
    s->queue.pop_front();
    cudaError_t fail = s->injected;
    s->injected = cudaSuccess;
    l.unlock();
    // Completion later than the call, by a different amount each time: a
    // missing synchronisation shows as a wrong result, not as luck.
    if (maxDelayUs > 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % (maxDelayUs + 1)));
    cudaError_t e = fail != cudaSuccess ? fail : item.run ? item.run() : cudaSuccess;
    l.lock();
    if (e != cudaSuccess && s->error == cudaSuccess) s->error = e;
    s->completed++;
    gChanged.notify_all();
  }
}

std::shared_ptr<Stream> startStream(int device, bool legacy, bool blocking) {
  auto s = std::make_shared<Stream>();
  s->device = device;
  s->legacy = legacy;
  s->blocking = blocking;
  s->thread = std::thread(runStream, s);
  s->thread.detach();  // it ends when stopped and drained; the shared_ptr keeps the object
  gAllStreams.push_back(s);
  return s;
}

std::shared_ptr<Stream> legacyStream(int device) {
  if (gLegacy.empty()) gLegacy.resize(deviceCount());
  if (!gLegacy[device]) gLegacy[device] = startStream(device, true, true);
  return gLegacy[device];
}

thread_local std::map<int, std::shared_ptr<Stream>> tlsPerThread;

std::atomic<unsigned long long> gHostWaits{0};  // fakecudaHostWaits

// ---- Lazy loading ----
// What CUDA documents (programming guide, "Lazy Loading"; the default on
// Linux since CUDA 12.2, CUDA_MODULE_LOADING=LAZY|EAGER): the runtime loads
// a module at the first use of one of its kernels, and a kernel when it is
// first used or referenced (it resolves it with cuModuleGetFunction then),
// not at init. "Potential Hazards": loading a kernel may need a context
// synchronization, which waits for all work of the device; so a first
// launch behind work that waits for the launching host (a stream it holds)
// never returns, and programs that need kernels to run concurrently are
// told to load them first or to run with CUDA_MODULE_LOADING=EAGER. A call
// that references a kernel without launching it (cudaFuncGetAttributes, as
// NCCL's ncclInitKernelsForDevice calls on each of its kernels at
// ncclCommInitRank) loads it, so its later launches need nothing.
// Where the double chooses:
// - CUDA says "may"; the double always synchronises: the first use of each
//   kernel on each device waits until every stream of the device has done
//   the work enqueued before it, and counts as a host wait
//   (fakecudaHostWaits), even when they are idle.
// - Per kernel (a host-compiled kernel is its function), not per module:
//   CUDA loads kernels one by one even within a loaded module, and the
//   double cannot tell Zeppelin's module from another anyway. So a preload
//   must reference every kernel, as NCCL's does.
// - Per device (a context's modules are its own), and anew in a child of
//   fork (a new context).
// - A first launch into a capture loads the same way (nothing in CUDA's
//   documentation exempts it), without breaking the capture.
// Under gMu: the (kernel, device) pairs loaded so far.
std::set<std::pair<const void*, int>>& gLoadedKernels = *new std::set<std::pair<const void*, int>>;

bool lazyLoading() {
  static const bool lazy = [] {
    const char* v = getenv("CUDA_MODULE_LOADING");
    return !(v && strcmp(v, "EAGER") == 0);
  }();
  return lazy;
}

// Loads the kernel on the device if it is not yet (lock held through l): a
// context synchronization. Names the rule on stderr when the device's
// streams are still busy after 2 s (a stream held by this very host never
// drains: on a GPU the call hangs).
void loadKernelLocked(std::unique_lock<std::mutex>& l, const void* kernel, int device) {
  if (!lazyLoading() || gLoadedKernels.count({kernel, device})) return;
  gHostWaits++;
  std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> all;
  for (auto& s : gAllStreams)
    if (s->device == device) all.push_back({s, s->enqueued});
  auto idle = [&] {
    for (auto& p : all)
      if (p.first->completed < p.second) return false;
    return true;
  };
  if (!gChanged.wait_for(l, std::chrono::seconds(2), idle)) {
    fprintf(stderr,
            "fakecuda: the first use of kernel %p on device %d loads it (CUDA_MODULE_LOADING is not EAGER), a "
            "context synchronization: it has waited 2 s for a busy stream of the device and goes on waiting (the "
            "lazy loading rule; load kernels before holding a stream, e.g. with cudaFuncGetAttributes)\n",
            kernel, device);
    gChanged.wait(l, idle);
  }
  gLoadedKernels.insert({kernel, device});
}

// Waits (lock held) until the stream has completed `ticket` items.
void waitTicket(std::unique_lock<std::mutex>& l, const std::shared_ptr<Stream>& s, uint64_t ticket) {
  gChanged.wait(l, [&] { return s->completed >= ticket; });
}

// Reports the stream's first failure once (as a synchronisation does).
cudaError_t takeError(const std::shared_ptr<Stream>& s) {
  cudaError_t e = s->error;
  s->error = cudaSuccess;
  return e;
}

void gCapturesForkReset();

// CUDA does not survive fork(): in a child of a process that had used the
// runtime, every call fails with cudaErrorInitializationError, as a GPU's
// driver makes it (a test parent that probed for a device before forking
// its ranks left every rank without CUDA on a real GPU).
std::atomic<bool> gUsed{false};
bool gForkedAfterUse = false;

// fork(): the child has none of the parent's stream threads, so it starts
// with no streams (the parent's device memory stays mapped, as it would not
// on a GPU, but nothing in the child can reach it through a stream).
void beforeFork() {
  gMu.lock();
  gMemMu.lock();
}
void afterForkParent() {
  gMemMu.unlock();
  gMu.unlock();
}
void afterForkChild() {
  if (gUsed.load()) gForkedAfterUse = true;
  gCv = new std::condition_variable;
  gOwned.clear();
  gAllStreams.clear();
  gLegacy.clear();
  tlsPerThread.clear();
  gLoadedKernels.clear();
  gCapturesForkReset();
  gMemMu.unlock();
  gMu.unlock();
}
const int gAtFork = pthread_atfork(beforeFork, afterForkParent, afterForkChild);

}  // namespace

// ---- Stream capture: a capture sequence and the graph it records ----
// Memory that cudaMallocAsync gave a capture: the graph's (a graph memory
// node), kept at one address for every launch and freed with the last graph
// or executable graph that holds it.
struct GraphMem {
  std::vector<void*> ptrs;
  ~GraphMem() {
    graphMemoryLaunched(ptrs);  // gone: no longer a graph's unlaunched memory either
    for (void* p : ptrs) freeDevice(p);
  }
};
// One node: its dependencies (earlier nodes), the stream it was captured on
// (its lane when launched), and the maker of its work.
struct Node {
  std::vector<size_t> deps;
  size_t lane = 0;
  MakeRun make;
};
struct GraphData {
  int device = 0;
  size_t lanes = 1;
  std::vector<Node> nodes;
  std::shared_ptr<GraphMem> mem = std::make_shared<GraphMem>();
};
struct Capture {
  unsigned long long id = 0;
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;  // the thread that began it
  std::shared_ptr<Stream> origin;
  std::vector<std::shared_ptr<Stream>> streams;  // origin first, then joined ones: the lanes
  std::shared_ptr<GraphData> graph = std::make_shared<GraphData>();
  cudaError_t invalid = cudaSuccess;  // why it was invalidated
  bool ended = false;
};

namespace {

std::vector<std::shared_ptr<Capture>>& gCaptures = *new std::vector<std::shared_ptr<Capture>>;  // active, under gMu
unsigned long long gCaptureIds = 0;
thread_local cudaStreamCaptureMode tlsCaptureMode = cudaStreamCaptureModeGlobal;

void invalidate(const std::shared_ptr<Capture>& c, cudaError_t why, const char* what) {
  if (c->invalid != cudaSuccess) return;
  c->invalid = why;
  fprintf(stderr, "fakecuda: %s invalidates the stream capture %llu (%s)\n", what, c->id, cudaGetErrorName(why));
}

// A "potentially unsafe" call (cudaMalloc, a synchronisation, an event
// query...) during capture, by CUDA's rules: the calling thread may not make
// one while it has a capture of its own not begun in relaxed mode, nor, in
// global mode, while another thread has a capture begun in global mode.
// Such a call fails with cudaErrorStreamCaptureUnsupported and invalidates
// those captures. Lock held.
cudaError_t checkUnsafeLocked(const char* what) {
  if (tlsCaptureMode == cudaStreamCaptureModeRelaxed) return cudaSuccess;
  const auto me = std::this_thread::get_id();
  cudaError_t r = cudaSuccess;
  for (auto& c : gCaptures) {
    const bool mine = c->thread == me && c->mode != cudaStreamCaptureModeRelaxed;
    const bool global = tlsCaptureMode == cudaStreamCaptureModeGlobal && c->thread != me &&
                        c->mode == cudaStreamCaptureModeGlobal;
    if (!mine && !global) continue;
    invalidate(c, cudaErrorStreamCaptureInvalidated, what);
    r = cudaErrorStreamCaptureUnsupported;
  }
  if (r != cudaSuccess)
    fprintf(stderr, "fakecuda: %s is not permitted while a stream is capturing (cudaErrorStreamCaptureUnsupported)\n",
            what);
  return r;
}
cudaError_t checkUnsafe(const char* what) {
  std::lock_guard<std::mutex> l(gMu);
  return checkUnsafeLocked(what);
}

// The legacy stream cannot take part in a capture: work on it (or waiting
// for it) while a blocking stream of its device is capturing would make it
// depend on that capture. cudaErrorStreamCaptureImplicit, and the capture
// is invalidated. Lock held.
cudaError_t checkLegacyLocked(const std::shared_ptr<Stream>& s, const char* what) {
  if (!s->legacy) return cudaSuccess;
  cudaError_t r = cudaSuccess;
  for (auto& c : gCaptures)
    for (auto& b : c->streams)
      if (b->blocking && b->device == s->device && b->capture == c) {
        invalidate(c, cudaErrorStreamCaptureInvalidated, what);
        r = cudaErrorStreamCaptureImplicit;
      }
  if (r != cudaSuccess)
    fprintf(stderr, "fakecuda: %s on the legacy stream while a blocking stream is capturing "
            "(cudaErrorStreamCaptureImplicit)\n", what);
  return r;
}

// A capturing stream cannot be waited for or queried: the call fails with
// cudaErrorStreamCaptureUnsupported and invalidates the capture. Lock held.
cudaError_t checkNotCapturingLocked(const std::shared_ptr<Stream>& s, const char* what) {
  if (!s->capture) return cudaSuccess;
  invalidate(s->capture, cudaErrorStreamCaptureInvalidated, what);
  fprintf(stderr, "fakecuda: %s of a capturing stream (cudaErrorStreamCaptureUnsupported)\n", what);
  return cudaErrorStreamCaptureUnsupported;
}

size_t laneOf(const std::shared_ptr<Capture>& c, const std::shared_ptr<Stream>& s) {
  auto it = std::find(c->streams.begin(), c->streams.end(), s);
  if (it != c->streams.end()) return (size_t)(it - c->streams.begin());
  c->streams.push_back(s);
  return c->streams.size() - 1;
}

// Ends a capture: its streams stop capturing.
void endCaptureLocked(const std::shared_ptr<Capture>& c) {
  c->ended = true;
  for (auto& s : c->streams)
    if (s->capture == c) {
      s->capture = nullptr;
      s->tail.clear();
    }
  gCaptures.erase(std::remove(gCaptures.begin(), gCaptures.end(), c), gCaptures.end());
}

}  // namespace

// For the double's NCCL: its allocation calls are unsafe during capture too.
cudaError_t captureUnsafe(const char* what) { return checkUnsafe(what); }

cudaError_t submitLocked(const std::shared_ptr<Stream>& s, MakeRun make, std::vector<Dep> after, Dep* done) {
  if (auto c = s->capture) {
    if (c->invalid != cudaSuccess) return cudaErrorStreamCaptureInvalidated;
    Node n;
    n.deps = s->tail;
    n.lane = laneOf(c, s);
    n.make = std::move(make);
    c->graph->nodes.push_back(std::move(n));
    s->tail = {c->graph->nodes.size() - 1};
    return cudaSuccess;
  }
  cudaError_t e = checkLegacyLocked(s, "work");
  if (e != cudaSuccess) return e;
  const uint64_t ticket = enqueueLocked(s, Item{std::move(after), make()});
  if (done) *done = Dep{s, ticket};
  return cudaSuccess;
}

std::mutex& lock() { return gMu; }

namespace {
void gCapturesForkReset() { gCaptures.clear(); }
}  // namespace
std::condition_variable& changed() { return gChanged; }

int envInt(const char* name, int dflt) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

int currentDevice() { return tlsDevice; }

void countHostWait() { gHostWaits++; }

cudaError_t setError(cudaError_t e) {
  if (e != cudaSuccess) tlsError = e;
  return e;
}

cudaError_t enterRuntime() {
  if (gForkedAfterUse) return setError(cudaErrorInitializationError);
  gUsed.store(true, std::memory_order_relaxed);
  return cudaSuccess;
}

bool depsDone(const std::vector<Dep>& deps) {
  for (const Dep& d : deps)
    if (d.stream->completed < d.ticket) return false;
  return true;
}

std::shared_ptr<Stream> streamOf(cudaStream_t handle) {
  std::lock_guard<std::mutex> l(gMu);
  if (handle == nullptr || handle == cudaStreamLegacy) return legacyStream(tlsDevice);
  if (handle == cudaStreamPerThread) {
    auto& s = tlsPerThread[tlsDevice];
    if (!s) s = startStream(tlsDevice, false, true);
    return s;
  }
  auto it = gOwned.find((Stream*)handle);
  return it == gOwned.end() ? nullptr : it->second;
}

uint64_t enqueueLocked(const std::shared_ptr<Stream>& s, Item item) {
  // CUDA's legacy default stream: its work waits for all earlier work of the
  // blocking streams of its device, and theirs for its earlier work.
  if (s->legacy) {
    for (auto& b : gAllStreams)
      if (b != s && b->blocking && b->device == s->device && !b->stop) item.deps.push_back({b, b->enqueued});
  } else if (s->blocking) {
    auto l = legacyStream(s->device);
    item.deps.push_back({l, l->enqueued});
  }
  s->queue.push_back(std::move(item));
  gChanged.notify_all();
  return ++s->enqueued;
}

uint64_t enqueue(const std::shared_ptr<Stream>& s, Item item) {
  std::lock_guard<std::mutex> l(gMu);
  return enqueueLocked(s, std::move(item));
}

void* allocDevice(size_t bytes, int device) {
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  const size_t mapped = (std::max<size_t>(bytes, 1) + page - 1) / page * page;
  int fd = memfd_create("fakecuda", MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  if (ftruncate(fd, (off_t)mapped) != 0) {
    close(fd);
    return nullptr;
  }
  // The address handed out: no access at all, so a host read or write of
  // device memory faults as it would (or worse) on a real GPU.
  void* dev = mmap(nullptr, mapped, PROT_NONE, MAP_SHARED, fd, 0);
  void* alias = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (dev == MAP_FAILED || alias == MAP_FAILED) {
    if (dev != MAP_FAILED) munmap(dev, mapped);
    if (alias != MAP_FAILED) munmap(alias, mapped);
    return nullptr;
  }
  // Fresh device memory is not zero on a GPU: neither is it here.
  memset(alias, 0xCD, mapped);
  std::lock_guard<std::mutex> l(gMemMu);
  gAllocs[(uintptr_t)dev] = Alloc{bytes, mapped, (char*)alias, device};
  return dev;
}

bool freeDevice(void* p) {
  Alloc a;
  {
    std::lock_guard<std::mutex> l(gMemMu);
    auto it = gAllocs.find((uintptr_t)p);
    if (it == gAllocs.end()) return false;
    a = it->second;
    gAllocs.erase(it);
  }
  munmap(p, a.mapped);
  munmap(a.alias, a.mapped);
  return true;
}

void* deviceAlias(const void* p, size_t bytes, int* device) {
  std::lock_guard<std::mutex> l(gMemMu);
  auto it = findAlloc(p);
  if (it == gAllocs.end()) return nullptr;
  const size_t off = (uintptr_t)p - it->first;
  if (off + bytes > it->second.bytes && !(bytes == 0 && off <= it->second.bytes)) return nullptr;
  if (device) *device = it->second.device;
  return it->second.alias + off;
}

bool isDevicePointer(const void* p, int* device) {
  std::lock_guard<std::mutex> l(gMemMu);
  auto it = findAlloc(p);
  if (it == gAllocs.end()) return false;
  if (device) *device = it->second.device;
  return true;
}

namespace {

// Where a copy's side is, checked against the kind the caller named; its
// host-accessible address (the alias for device memory) in *at.
cudaError_t resolveSide(const void* p, size_t bytes, bool wantDevice, bool anyKind, char** at) {
  int dev = 0;
  const bool onDevice = isDevicePointer(p, &dev);
  if (!anyKind && onDevice != wantDevice) {
    fprintf(stderr, "fakecuda: a copy names %s memory at %p, but it is %s memory\n",
            wantDevice ? "device" : "host", p, onDevice ? "device" : "host");
    return cudaErrorInvalidValue;
  }
  if (!onDevice) {
    *at = (char*)p;
    return cudaSuccess;
  }
  char* alias = (char*)deviceAlias(p, bytes);
  if (!alias) {
    fprintf(stderr, "fakecuda: a copy of %zu bytes at %p runs past the end of its allocation\n", bytes, p);
    return cudaErrorInvalidValue;
  }
  *at = alias;
  return cudaSuccess;
}

cudaError_t copyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream,
                      size_t rows = 1, size_t dpitch = 0, size_t spitch = 0) {
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  if (bytes == 0 || rows == 0) return cudaSuccess;
  const bool any = kind == cudaMemcpyDefault;
  const bool dstDev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool srcDev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  char *d = nullptr, *sp = nullptr;
  const size_t dspan = (rows - 1) * dpitch + bytes, sspan = (rows - 1) * spitch + bytes;
  cudaError_t e = resolveSide(dst, dspan, dstDev, any, &d);
  if (e == cudaSuccess) e = resolveSide(src, sspan, srcDev, any, &sp);
  if (e != cudaSuccess) return setError(e);
  RunFn run = [=] {
    for (size_t r = 0; r < rows; r++) memmove(d + r * dpitch, sp + r * spitch, bytes);
    return cudaSuccess;
  };
  std::lock_guard<std::mutex> l(gMu);
  return setError(submitLocked(s, [run] { return run; }));
}

cudaError_t setAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  char* d = (char*)deviceAlias(dst, bytes);
  if (!d) return setError(cudaErrorInvalidValue);
  RunFn run = [=] {
    memset(d, value, bytes);
    return cudaSuccess;
  };
  std::lock_guard<std::mutex> l(gMu);
  return setError(submitLocked(s, [run] { return run; }));
}

// A synchronous call on the legacy stream: enqueue there, then wait for it.
cudaError_t syncLegacy(const char* what, const std::function<cudaError_t(cudaStream_t)>& call) {
  cudaError_t e = checkUnsafe(what);
  if (e != cudaSuccess) return setError(e);
  e = call(nullptr);
  if (e != cudaSuccess) return e;
  return cudaStreamSynchronize(nullptr);
}

}  // namespace

}  // namespace fakecuda

using namespace fakecuda;

struct CUevent_st {
  std::shared_ptr<Stream> stream;  // null until recorded
  uint64_t ticket = 0;
  bool timing = true;
  // Recorded in a capture: that capture and the nodes it stands for.
  std::shared_ptr<Capture> capture;
  std::vector<size_t> nodes;
  std::shared_ptr<std::chrono::steady_clock::time_point> when = std::make_shared<std::chrono::steady_clock::time_point>();
};

namespace {
// An event last recorded in a capture that is still going on cannot be
// queried or waited for by the host: cudaErrorCapturedEvent, and the capture
// is invalidated. Lock held.
cudaError_t capturedEventLocked(cudaEvent_t e, const char* what) {
  if (!e->capture || e->capture->ended) return cudaSuccess;
  invalidate(e->capture, cudaErrorStreamCaptureInvalidated, what);
  fprintf(stderr, "fakecuda: %s of an event recorded in a capture (cudaErrorCapturedEvent)\n", what);
  return cudaErrorCapturedEvent;
}
}  // namespace

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!count) return setError(cudaErrorInvalidValue);
  *count = deviceCount();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (device < 0 || device >= deviceCount()) return setError(cudaErrorInvalidDevice);
  tlsDevice = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!device) return setError(cudaErrorInvalidValue);
  *device = tlsDevice;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = tlsError;
  tlsError = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return tlsError; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorInitializationError: return "cudaErrorInitializationError";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorIllegalState: return "cudaErrorIllegalState";
    case cudaErrorStreamCaptureUnsupported: return "cudaErrorStreamCaptureUnsupported";
    case cudaErrorStreamCaptureInvalidated: return "cudaErrorStreamCaptureInvalidated";
    case cudaErrorStreamCaptureUnmatched: return "cudaErrorStreamCaptureUnmatched";
    case cudaErrorStreamCaptureUnjoined: return "cudaErrorStreamCaptureUnjoined";
    case cudaErrorStreamCaptureIsolation: return "cudaErrorStreamCaptureIsolation";
    case cudaErrorStreamCaptureImplicit: return "cudaErrorStreamCaptureImplicit";
    case cudaErrorCapturedEvent: return "cudaErrorCapturedEvent";
    case cudaErrorStreamCaptureWrongThread: return "cudaErrorStreamCaptureWrongThread";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorInitializationError: return "initialization error";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorIllegalState: return "the operation cannot be performed in the present state";
    case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
    case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
    case cudaErrorStreamCaptureUnmatched: return "the capture was not initiated in this stream";
    case cudaErrorStreamCaptureUnjoined: return "the capture sequence contains a fork that was not joined to the primary stream";
    case cudaErrorStreamCaptureIsolation: return "a dependency would cross the capture sequence boundary";
    case cudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    case cudaErrorCapturedEvent: return "operation not permitted on an event last recorded in a capturing stream";
    case cudaErrorStreamCaptureWrongThread: return "attempt to terminate a thread-local capture sequence from another thread";
    default: return "unknown error (fakecuda)";
  }
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!p) return setError(cudaErrorInvalidValue);
  cudaError_t e = checkUnsafe("cudaMalloc");
  if (e != cudaSuccess) return setError(e);
  *p = allocDevice(bytes, tlsDevice);
  return *p ? cudaSuccess : setError(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void* p) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!p) return cudaSuccess;
  cudaError_t e = checkUnsafe("cudaFree");
  if (e != cudaSuccess) return setError(e);
  // As on a GPU, freeing waits for the device to be idle.
  cudaDeviceSynchronize();
  return freeDevice(p) ? cudaSuccess : setError(cudaErrorInvalidValue);
}

// Stream-ordered allocation: the memory is there at once (no earlier work
// can touch it), and freed when the stream reaches the free.
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!p) return setError(cudaErrorInvalidValue);
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(gMu);
  if (auto c = s->capture) {
    // A graph memory node: the memory is the graph's, at one address for
    // every launch, and fresh at each (its bytes are 0xCD again: nothing
    // carries over from one launch to the next).
    if (c->invalid != cudaSuccess) return setError(cudaErrorStreamCaptureInvalidated);
    void* mem = allocDevice(bytes, tlsDevice);
    if (!mem) return setError(cudaErrorMemoryAllocation);
    c->graph->mem->ptrs.push_back(mem);
    {
      std::lock_guard<std::mutex> lm(gMemMu);
      gUnlaunched[(uintptr_t)mem] = bytes;
    }
    char* alias = (char*)deviceAlias(mem, bytes);
    *p = mem;
    return setError(submitLocked(s, [alias, bytes] {
      return [alias, bytes] {
        if (bytes) memset(alias, 0xCD, bytes);
        return cudaSuccess;
      };
    }));
  }
  cudaError_t e = checkLegacyLocked(s, "cudaMallocAsync");
  if (e != cudaSuccess) return setError(e);
  *p = allocDevice(bytes, tlsDevice);
  return *p ? cudaSuccess : setError(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  if (!p) return cudaSuccess;
  if (!isDevicePointer(p)) return setError(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> l(gMu);
  if (auto c = s->capture) {
    // A graph free node: only of the graph's own memory here (the memory is
    // freed with the graph); its bytes are poisoned at each launch.
    auto& mine = c->graph->mem->ptrs;
    if (std::find(mine.begin(), mine.end(), p) == mine.end()) {
      fprintf(stderr, "fakecuda: cudaFreeAsync during capture of memory not allocated in that capture\n");
      return setError(cudaErrorNotSupported);
    }
    int dev = 0;
    size_t bytes = 0;
    {
      std::lock_guard<std::mutex> m(gMemMu);
      auto it = gAllocs.find((uintptr_t)p);
      bytes = it->second.bytes;
      dev = it->second.device;
    }
    (void)dev;
    char* alias = (char*)deviceAlias(p, bytes);
    return setError(submitLocked(s, [alias, bytes] {
      return [alias, bytes] {
        if (bytes) memset(alias, 0xCD, bytes);
        return cudaSuccess;
      };
    }));
  }
  return setError(submitLocked(s, [p] { return [p] { return freeDevice(p) ? cudaSuccess : cudaErrorInvalidValue; }; }));
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!p) return setError(cudaErrorInvalidValue);
  *p = malloc(std::max<size_t>(bytes, 1));
  if (!*p) return setError(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> l(gMemMu);
  gPinned.insert(*p);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) { return cudaMallocHost(p, bytes); }

cudaError_t cudaFreeHost(void* p) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  {
    std::lock_guard<std::mutex> l(gMemMu);
    if (!gPinned.erase(p)) return setError(cudaErrorInvalidValue);
  }
  free(p);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* a, const void* p) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!a) return setError(cudaErrorInvalidValue);
  memset(a, 0, sizeof(*a));
  int dev = 0;
  if (unlaunchedGraphMemory(p)) {
    a->type = cudaMemoryTypeUnregistered;
    a->device = -2;
    return cudaSuccess;
  }
  if (isDevicePointer(p, &dev)) {
    a->type = cudaMemoryTypeDevice;
    a->device = dev;
    a->devicePointer = (void*)p;
    return cudaSuccess;
  }
  bool pinned;
  {
    std::lock_guard<std::mutex> l(gMemMu);
    pinned = gPinned.count((void*)p) > 0;
  }
  a->type = pinned ? cudaMemoryTypeHost : cudaMemoryTypeUnregistered;
  a->device = pinned ? tlsDevice : -2;
  a->hostPointer = (void*)p;
  a->devicePointer = pinned ? (void*)p : nullptr;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* out, unsigned int flags) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!out) return setError(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> l(gMu);
  auto s = startStream(tlsDevice, false, !(flags & cudaStreamNonBlocking));
  gOwned[s.get()] = s;
  *out = (cudaStream_t)s.get();
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* out) { return cudaStreamCreateWithFlags(out, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  std::unique_lock<std::mutex> l(gMu);
  auto it = gOwned.find((Stream*)stream);
  if (it == gOwned.end()) return setError(cudaErrorInvalidResourceHandle);
  // As CUDA: returns at once; the work already enqueued still runs.
  it->second->stop = true;
  gOwned.erase(it);
  gChanged.notify_all();
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  gHostWaits++;
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  std::unique_lock<std::mutex> l(gMu);
  cudaError_t c = checkNotCapturingLocked(s, "cudaStreamSynchronize");
  if (c == cudaSuccess) c = checkLegacyLocked(s, "cudaStreamSynchronize");
  if (c == cudaSuccess) c = checkUnsafeLocked("cudaStreamSynchronize");
  if (c != cudaSuccess) return setError(c);
  uint64_t ticket = s->enqueued;
  if (s->legacy) ticket = enqueueLocked(s, Item{});  // picks up the implicit order with blocking streams
  waitTicket(l, s, ticket);
  return setError(takeError(s));
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(gMu);
  cudaError_t c = checkNotCapturingLocked(s, "cudaStreamQuery");
  if (c == cudaSuccess) c = checkLegacyLocked(s, "cudaStreamQuery");
  if (c == cudaSuccess) c = checkUnsafeLocked("cudaStreamQuery");
  if (c != cudaSuccess) return setError(c);
  if (s->completed < s->enqueued) return cudaErrorNotReady;
  return setError(takeError(s));
}

cudaError_t cudaDeviceSynchronize(void) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  gHostWaits++;
  std::unique_lock<std::mutex> l(gMu);
  cudaError_t c = checkUnsafeLocked("cudaDeviceSynchronize");
  if (c != cudaSuccess) return setError(c);
  std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> all;
  for (auto& s : gAllStreams)
    if (s->device == tlsDevice) all.push_back({s, s->enqueued});
  for (auto& p : all) waitTicket(l, p.first, p.second);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!e) return setError(cudaErrorInvalidValue);
  *e = new CUevent_st;
  (*e)->timing = !(flags & cudaEventDisableTiming);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!e) return setError(cudaErrorInvalidResourceHandle);
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!e) return setError(cudaErrorInvalidResourceHandle);
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  auto when = e->when;
  std::lock_guard<std::mutex> l(gMu);
  if (auto c = s->capture) {
    // In a capture the event stands for the stream's current nodes: a
    // stream that waits for it joins the capture after them.
    if (c->invalid != cudaSuccess) return setError(cudaErrorStreamCaptureInvalidated);
    e->capture = c;
    e->nodes = s->tail;
    e->stream = nullptr;
    return cudaSuccess;
  }
  cudaError_t c = checkLegacyLocked(s, "cudaEventRecord");
  if (c != cudaSuccess) return setError(c);
  e->capture = nullptr;
  e->nodes.clear();
  e->stream = s;
  e->ticket = enqueueLocked(s, Item{{}, [when] {
                                      *when = std::chrono::steady_clock::now();
                                      return cudaSuccess;
                                    }});
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!e) return setError(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(gMu);
  cudaError_t c = capturedEventLocked(e, "cudaEventQuery");
  if (c == cudaSuccess) c = checkUnsafeLocked("cudaEventQuery");
  if (c != cudaSuccess) return setError(c);
  return !e->stream || e->stream->completed >= e->ticket ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  gHostWaits++;
  if (!e) return setError(cudaErrorInvalidResourceHandle);
  std::unique_lock<std::mutex> l(gMu);
  cudaError_t c = capturedEventLocked(e, "cudaEventSynchronize");
  if (c == cudaSuccess) c = checkUnsafeLocked("cudaEventSynchronize");
  if (c != cudaSuccess) return setError(c);
  if (e->stream) waitTicket(l, e->stream, e->ticket);
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!ms || !a || !b) return setError(cudaErrorInvalidValue);
  if (!a->timing || !b->timing) return setError(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(gMu);
  if (!a->stream || !b->stream) return setError(cudaErrorInvalidResourceHandle);
  if (a->stream->completed < a->ticket || b->stream->completed < b->ticket) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(*b->when - *a->when).count();
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!e) return setError(cudaErrorInvalidResourceHandle);
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(gMu);
  if (auto c = e->capture; c && !c->ended) {
    if (s->capture && s->capture != c) {
      // Two capture sequences would be joined.
      invalidate(c, cudaErrorStreamCaptureInvalidated, "cudaStreamWaitEvent");
      invalidate(s->capture, cudaErrorStreamCaptureInvalidated, "cudaStreamWaitEvent");
      return setError(cudaErrorStreamCaptureIsolation);
    }
    if (c->invalid != cudaSuccess) return setError(cudaErrorStreamCaptureInvalidated);
    if (!s->capture) {
      // A fork: the stream joins the capture, after the event's nodes.
      if (s->legacy) {
        invalidate(c, cudaErrorStreamCaptureInvalidated, "cudaStreamWaitEvent");
        return setError(cudaErrorStreamCaptureImplicit);
      }
      s->capture = c;
      s->tail = e->nodes;
      laneOf(c, s);
      return cudaSuccess;
    }
    for (size_t n : e->nodes)
      if (std::find(s->tail.begin(), s->tail.end(), n) == s->tail.end()) s->tail.push_back(n);
    return cudaSuccess;
  }
  if (s->capture) {
    if (!e->stream || e->capture) return cudaSuccess;  // never recorded, or in a capture now over: nothing
    // An event recorded outside the capture: a dependency across its boundary.
    invalidate(s->capture, cudaErrorStreamCaptureInvalidated, "cudaStreamWaitEvent");
    fprintf(stderr, "fakecuda: a capturing stream waits for an event recorded outside the capture "
            "(cudaErrorStreamCaptureIsolation)\n");
    return setError(cudaErrorStreamCaptureIsolation);
  }
  if (!e->stream) return cudaSuccess;  // never recorded: nothing to wait for (CUDA)
  cudaError_t c = checkLegacyLocked(s, "cudaStreamWaitEvent");
  if (c != cudaSuccess) return setError(c);
  enqueueLocked(s, Item{{{e->stream, e->ticket}}, nullptr});
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  return copyAsync(dst, src, bytes, kind, stream);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  return syncLegacy("cudaMemcpy", [&](cudaStream_t s) { return copyAsync(dst, src, bytes, kind, s); });
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (width > dpitch || width > spitch) return setError(cudaErrorInvalidValue);
  return copyAsync(dst, src, width, kind, stream, height, dpitch, spitch);
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  return setAsync(dst, value, bytes, stream);
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  return syncLegacy("cudaMemset", [&](cudaStream_t s) { return setAsync(dst, value, bytes, s); });
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  auto s = streamOf(stream);
  if (!s || !fn) return setError(!s ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
  RunFn run = [=] {
    fn(userData);
    return cudaSuccess;
  };
  std::lock_guard<std::mutex> l(gMu);
  return setError(submitLocked(s, [run] { return run; }));
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed)
    return setError(cudaErrorInvalidValue);
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(gMu);
  if (s->legacy) return setError(cudaErrorStreamCaptureUnsupported);  // not the legacy stream (CUDA)
  if (s->capture) return setError(cudaErrorIllegalState);              // already capturing
  auto c = std::make_shared<Capture>();
  c->id = ++gCaptureIds;
  c->mode = mode;
  c->thread = std::this_thread::get_id();
  c->origin = s;
  c->streams.push_back(s);
  c->graph->device = s->device;
  s->capture = c;
  s->tail.clear();
  gCaptures.push_back(c);
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!graph) return setError(cudaErrorInvalidValue);
  *graph = nullptr;
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(gMu);
  auto c = s->capture;
  if (!c) return setError(cudaErrorIllegalState);
  if (c->origin != s) return setError(cudaErrorStreamCaptureUnmatched);  // not where it began
  if (c->mode != cudaStreamCaptureModeRelaxed && c->thread != std::this_thread::get_id())
    return setError(cudaErrorStreamCaptureWrongThread);
  // Every stream that joined must have been joined back: its last nodes are
  // the origin's last nodes or their ancestors.
  const auto& nodes = c->graph->nodes;
  std::vector<bool> reached(nodes.size(), false);
  std::vector<size_t> todo = s->tail;
  while (!todo.empty()) {
    size_t n = todo.back();
    todo.pop_back();
    if (reached[n]) continue;
    reached[n] = true;
    for (size_t d : nodes[n].deps) todo.push_back(d);
  }
  bool unjoined = false;
  for (auto& o : c->streams)
    if (o->capture == c)
      for (size_t n : o->tail) unjoined |= !reached[n];
  endCaptureLocked(c);
  if (c->invalid != cudaSuccess) return setError(cudaErrorStreamCaptureInvalidated);
  if (unjoined) {
    fprintf(stderr, "fakecuda: cudaStreamEndCapture: a stream forked into the capture was not joined back "
            "(cudaErrorStreamCaptureUnjoined)\n");
    return setError(cudaErrorStreamCaptureUnjoined);
  }
  c->graph->lanes = c->streams.size();
  *graph = (cudaGraph_t) new std::shared_ptr<GraphData>(c->graph);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* status) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  return cudaStreamGetCaptureInfo(stream, status, nullptr, nullptr, nullptr, nullptr, nullptr);
}

cudaError_t cudaStreamGetCaptureInfo(cudaStream_t stream, enum cudaStreamCaptureStatus* status,
                                     unsigned long long* id, cudaGraph_t* graph, const cudaGraphNode_t** deps,
                                     const cudaGraphEdgeData** edges, size_t* numDeps) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!status) return setError(cudaErrorInvalidValue);
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(gMu);
  if (s->legacy)
    for (auto& c : gCaptures)
      for (auto& b : c->streams)
        if (b->blocking && b->device == s->device && b->capture == c) return setError(cudaErrorStreamCaptureImplicit);
  // The graph and its nodes are not handed out: the double has no graph API
  // beyond instantiate, launch and destroy.
  if (graph) *graph = nullptr;
  if (deps) *deps = nullptr;
  if (edges) *edges = nullptr;
  if (numDeps) *numDeps = 0;
  if (!s->capture) {
    *status = cudaStreamCaptureStatusNone;
    return cudaSuccess;
  }
  *status = s->capture->invalid != cudaSuccess ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
  if (id) *id = s->capture->id;
  if (numDeps) *numDeps = s->tail.size();
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode* mode) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!mode) return setError(cudaErrorInvalidValue);
  std::swap(*mode, tlsCaptureMode);
  return cudaSuccess;
}

}  // extern "C"

// An executable graph: the graph's nodes, and a stream of the double's per
// lane (a stream the capture recorded on), on which each launch enqueues
// them with the graph's edges as dependencies, so branches of the graph run
// concurrently (with their random delays) and only edges order them.
struct CUgraphExec_st {
  std::shared_ptr<GraphData> graph;
  std::vector<std::shared_ptr<Stream>> lanes;
};

extern "C" {

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!graph) return setError(cudaErrorInvalidValue);
  delete (std::shared_ptr<GraphData>*)graph;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!exec || !graph) return setError(cudaErrorInvalidValue);
  auto g = *(std::shared_ptr<GraphData>*)graph;
  auto x = new CUgraphExec_st;
  x->graph = g;
  std::lock_guard<std::mutex> l(gMu);
  for (size_t i = 0; i < g->lanes; i++) x->lanes.push_back(startStream(g->device, false, false));
  *exec = x;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiateWithFlags(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long flags) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  return cudaGraphInstantiate(exec, graph, flags);
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!exec) return setError(cudaErrorInvalidValue);
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(gMu);
  if (s->capture) {
    fprintf(stderr, "fakecuda: cudaGraphLaunch into a capturing stream (a child graph) is not modelled\n");
    return setError(cudaErrorNotSupported);
  }
  cudaError_t c = checkLegacyLocked(s, "cudaGraphLaunch");
  if (c != cudaSuccess) return setError(c);
  const GraphData& g = *exec->graph;
  graphMemoryLaunched(g.mem->ptrs);
  // The launch starts where the stream is (with the legacy stream's implicit
  // order), and the stream goes on once every node is done.
  const uint64_t start = enqueueLocked(s, Item{});
  std::vector<uint64_t> ticket(g.nodes.size());
  for (size_t i = 0; i < g.nodes.size(); i++) {
    const Node& n = g.nodes[i];
    Item item;
    item.deps.push_back({s, start});
    for (size_t d : n.deps) item.deps.push_back({exec->lanes[g.nodes[d].lane], ticket[d]});
    item.run = n.make();
    ticket[i] = enqueueLocked(exec->lanes[n.lane], std::move(item));
  }
  Item join;
  std::vector<std::shared_ptr<Stream>> lanes = exec->lanes;
  for (auto& lane : lanes) join.deps.push_back({lane, lane->enqueued});
  // A failure inside the graph is the launching stream's. The join holds the
  // graph (and its memory) until the launch is over, whatever is destroyed.
  join.run = [lanes, graph = exec->graph] {
    std::lock_guard<std::mutex> l2(gMu);
    cudaError_t e = cudaSuccess;
    for (auto& lane : lanes) {
      cudaError_t f = takeError(lane);
      if (e == cudaSuccess) e = f;
    }
    return e;
  };
  enqueueLocked(s, std::move(join));
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!exec) return setError(cudaErrorInvalidValue);
  {
    // As CUDA: returns at once; launches already enqueued still run (their
    // lanes stop once drained, and the graph's memory lives while they do).
    std::lock_guard<std::mutex> l(gMu);
    for (auto& lane : exec->lanes) lane->stop = true;
    gChanged.notify_all();
  }
  delete exec;
  return cudaSuccess;
}

// A host-compiled kernel (a function given to fakecudaLaunch) is its own
// symbol: this loads it on the current device (lazy loading, above). Any
// non-null pointer is taken for a kernel (the double cannot tell); the
// attributes are nominal.
cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes* attr, const void* func) {
  if (cudaError_t e_ = enterRuntime()) return e_;
  if (!attr) return setError(cudaErrorInvalidValue);
  if (!func) return setError(cudaErrorInvalidDeviceFunction);
  {
    std::unique_lock<std::mutex> l(gMu);
    loadKernelLocked(l, func, tlsDevice);
  }
  *attr = cudaFuncAttributes{};
  attr->maxThreadsPerBlock = 1024;
  attr->numRegs = 32;
  attr->ptxVersion = attr->binaryVersion = 90;
  return cudaSuccess;
}

// ---- The double's own calls (fakecuda.h) ----

cudaError_t fakecudaLaunch(cudaStream_t stream, void (*fn)(void*), const void* arg, size_t argBytes) {
  auto s = streamOf(stream);
  if (!s || !fn) return setError(!s ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
  // The arguments are copied at the call (a captured kernel keeps them for
  // every launch of its graph).
  auto copy = std::make_shared<std::vector<char>>((const char*)arg, (const char*)arg + argBytes);
  RunFn run = [=] {
    tlsInKernel = true;
    fn(copy->data());
    tlsInKernel = false;
    return cudaSuccess;
  };
  std::unique_lock<std::mutex> l(gMu);
  loadKernelLocked(l, reinterpret_cast<const void*>(fn), s->device);
  return setError(submitLocked(s, [run] { return run; }));
}

void* fakecudaAlias(const void* devPtr, size_t bytes) {
  if (!tlsInKernel) {
    fprintf(stderr, "fakecuda: host code touched device memory (%p): only a function run by fakecudaLaunch may\n",
            devPtr);
    abort();
  }
  void* a = deviceAlias(devPtr, bytes);
  if (!a) {
    fprintf(stderr, "fakecuda: a kernel touched [%p, +%zu), which is not inside one device allocation\n", devPtr,
            bytes);
    abort();
  }
  return a;
}

unsigned long long fakecudaHostWaits(void) { return gHostWaits.load(); }

cudaError_t fakecudaInjectStreamError(cudaStream_t stream, cudaError_t error) {
  auto s = streamOf(stream);
  if (!s) return cudaErrorInvalidResourceHandle;
  std::lock_guard<std::mutex> l(gMu);
  s->injected = error;
  return cudaSuccess;
}

}  // extern "C"
