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
  gCv = new std::condition_variable;
  gOwned.clear();
  gAllStreams.clear();
  gLegacy.clear();
  tlsPerThread.clear();
  gMemMu.unlock();
  gMu.unlock();
}
const int gAtFork = pthread_atfork(beforeFork, afterForkParent, afterForkChild);

}  // namespace

std::mutex& lock() { return gMu; }
std::condition_variable& changed() { return gChanged; }

int envInt(const char* name, int dflt) {
  const char* v = getenv(name);
  return v && *v ? atoi(v) : dflt;
}

int currentDevice() { return tlsDevice; }

cudaError_t setError(cudaError_t e) {
  if (e != cudaSuccess) tlsError = e;
  return e;
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
  enqueue(s, Item{{}, [=] {
                    for (size_t r = 0; r < rows; r++) memmove(d + r * dpitch, sp + r * spitch, bytes);
                    return cudaSuccess;
                  }});
  return cudaSuccess;
}

cudaError_t setAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  if (bytes == 0) return cudaSuccess;
  char* d = (char*)deviceAlias(dst, bytes);
  if (!d) return setError(cudaErrorInvalidValue);
  enqueue(s, Item{{}, [=] {
                    memset(d, value, bytes);
                    return cudaSuccess;
                  }});
  return cudaSuccess;
}

// A synchronous call on the legacy stream: enqueue there, then wait for it.
cudaError_t syncLegacy(const std::function<cudaError_t(cudaStream_t)>& call) {
  cudaError_t e = call(nullptr);
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
  std::shared_ptr<std::chrono::steady_clock::time_point> when = std::make_shared<std::chrono::steady_clock::time_point>();
};

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return setError(cudaErrorInvalidValue);
  *count = deviceCount();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= deviceCount()) return setError(cudaErrorInvalidDevice);
  tlsDevice = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
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
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure";
    case cudaErrorNotSupported: return "operation not supported";
    default: return "unknown error (fakecuda)";
  }
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (!p) return setError(cudaErrorInvalidValue);
  *p = allocDevice(bytes, tlsDevice);
  return *p ? cudaSuccess : setError(cudaErrorMemoryAllocation);
}

cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  // As on a GPU, freeing waits for the device to be idle.
  cudaDeviceSynchronize();
  return freeDevice(p) ? cudaSuccess : setError(cudaErrorInvalidValue);
}

// Stream-ordered allocation: the memory is there at once (no earlier work
// can touch it), and freed when the stream reaches the free.
cudaError_t cudaMallocAsync(void** p, size_t bytes, cudaStream_t stream) {
  if (!p) return setError(cudaErrorInvalidValue);
  if (!streamOf(stream)) return setError(cudaErrorInvalidResourceHandle);
  *p = allocDevice(bytes, tlsDevice);
  return *p ? cudaSuccess : setError(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  if (!p) return cudaSuccess;
  if (!isDevicePointer(p)) return setError(cudaErrorInvalidValue);
  enqueue(s, Item{{}, [p] { return freeDevice(p) ? cudaSuccess : cudaErrorInvalidValue; }});
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) {
  if (!p) return setError(cudaErrorInvalidValue);
  *p = malloc(std::max<size_t>(bytes, 1));
  if (!*p) return setError(cudaErrorMemoryAllocation);
  std::lock_guard<std::mutex> l(gMemMu);
  gPinned.insert(*p);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) { return cudaMallocHost(p, bytes); }

cudaError_t cudaFreeHost(void* p) {
  {
    std::lock_guard<std::mutex> l(gMemMu);
    if (!gPinned.erase(p)) return setError(cudaErrorInvalidValue);
  }
  free(p);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* a, const void* p) {
  if (!a) return setError(cudaErrorInvalidValue);
  memset(a, 0, sizeof(*a));
  int dev = 0;
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
  if (!out) return setError(cudaErrorInvalidValue);
  std::lock_guard<std::mutex> l(gMu);
  auto s = startStream(tlsDevice, false, !(flags & cudaStreamNonBlocking));
  gOwned[s.get()] = s;
  *out = (cudaStream_t)s.get();
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* out) { return cudaStreamCreateWithFlags(out, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
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
  gHostWaits++;
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  std::unique_lock<std::mutex> l(gMu);
  uint64_t ticket = s->enqueued;
  if (s->legacy) ticket = enqueueLocked(s, Item{});  // picks up the implicit order with blocking streams
  waitTicket(l, s, ticket);
  return setError(takeError(s));
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(gMu);
  if (s->completed < s->enqueued) return cudaErrorNotReady;
  return setError(takeError(s));
}

cudaError_t cudaDeviceSynchronize(void) {
  gHostWaits++;
  std::unique_lock<std::mutex> l(gMu);
  std::vector<std::pair<std::shared_ptr<Stream>, uint64_t>> all;
  for (auto& s : gAllStreams)
    if (s->device == tlsDevice) all.push_back({s, s->enqueued});
  for (auto& p : all) waitTicket(l, p.first, p.second);
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  if (!e) return setError(cudaErrorInvalidValue);
  *e = new CUevent_st;
  (*e)->timing = !(flags & cudaEventDisableTiming);
  return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  if (!e) return setError(cudaErrorInvalidResourceHandle);
  delete e;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t stream) {
  if (!e) return setError(cudaErrorInvalidResourceHandle);
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  auto when = e->when;
  std::lock_guard<std::mutex> l(gMu);
  e->stream = s;
  e->ticket = enqueueLocked(s, Item{{}, [when] {
                                      *when = std::chrono::steady_clock::now();
                                      return cudaSuccess;
                                    }});
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!e) return setError(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(gMu);
  return !e->stream || e->stream->completed >= e->ticket ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  gHostWaits++;
  if (!e) return setError(cudaErrorInvalidResourceHandle);
  std::unique_lock<std::mutex> l(gMu);
  if (e->stream) waitTicket(l, e->stream, e->ticket);
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (!ms || !a || !b) return setError(cudaErrorInvalidValue);
  if (!a->timing || !b->timing) return setError(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(gMu);
  if (!a->stream || !b->stream) return setError(cudaErrorInvalidResourceHandle);
  if (a->stream->completed < a->ticket || b->stream->completed < b->ticket) return cudaErrorNotReady;
  *ms = std::chrono::duration<float, std::milli>(*b->when - *a->when).count();
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t e, unsigned int) {
  if (!e) return setError(cudaErrorInvalidResourceHandle);
  auto s = streamOf(stream);
  if (!s) return setError(cudaErrorInvalidResourceHandle);
  std::lock_guard<std::mutex> l(gMu);
  if (!e->stream) return cudaSuccess;  // never recorded: nothing to wait for (CUDA)
  enqueueLocked(s, Item{{{e->stream, e->ticket}}, nullptr});
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  return copyAsync(dst, src, bytes, kind, stream);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return syncLegacy([&](cudaStream_t s) { return copyAsync(dst, src, bytes, kind, s); });
}

cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height,
                              cudaMemcpyKind kind, cudaStream_t stream) {
  if (width > dpitch || width > spitch) return setError(cudaErrorInvalidValue);
  return copyAsync(dst, src, width, kind, stream, height, dpitch, spitch);
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  return setAsync(dst, value, bytes, stream);
}

cudaError_t cudaMemset(void* dst, int value, size_t bytes) {
  return syncLegacy([&](cudaStream_t s) { return setAsync(dst, value, bytes, s); });
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  auto s = streamOf(stream);
  if (!s || !fn) return setError(!s ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
  enqueue(s, Item{{}, [=] {
                    fn(userData);
                    return cudaSuccess;
                  }});
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t, enum cudaStreamCaptureStatus* status) {
  if (!status) return setError(cudaErrorInvalidValue);
  *status = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

// ---- The double's own calls (fakecuda.h) ----

cudaError_t fakecudaLaunch(cudaStream_t stream, void (*fn)(void*), const void* arg, size_t argBytes) {
  auto s = streamOf(stream);
  if (!s || !fn) return setError(!s ? cudaErrorInvalidResourceHandle : cudaErrorInvalidValue);
  auto copy = std::make_shared<std::vector<char>>((const char*)arg, (const char*)arg + argBytes);
  enqueue(s, Item{{}, [=] {
                    tlsInKernel = true;
                    fn(copy->data());
                    tlsInKernel = false;
                    return cudaSuccess;
                  }});
  return cudaSuccess;
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
