// The CUDA runtime half of the test double: devices, device memory the host
// cannot touch, streams that run their work on their own threads after random
// delays, events, copies, host functions and host-compiled kernels.
//
// Compiled against the real cuda_runtime_api.h: every API function below is
// a definition of the header's own prototype, so a signature that drifts in a
// new CUDA fails to compile here.
#include "internal.h"

#include "fakecuda.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <map>

namespace fakecuda {

namespace {

constexpr size_t kPage = 4096;

struct Alloc {
  char* base;
  char* alias;     // == base for pinned host memory
  size_t size;     // what the caller asked for: the bounds every check uses
  size_t mapSize;  // what is mapped at base (page-rounded, plus a guard page)
  size_t aliasMap;
  int device;
  MemKind kind;
};

// One event record: the stream position it marks and, once the stream
// reaches it, the time it did.
struct Record {
  StreamPtr s;
  uint64_t seq = 0;
  std::atomic<bool> timed{false};
  double tUs = 0;
};

struct Event {
  unsigned flags = 0;
  std::mutex mu;
  std::shared_ptr<Record> rec;  // the last cudaEventRecord, nullptr if none
};

// Never destroyed: stream threads are detached and may still run while the
// process exits, so nothing they touch may have a static destructor.
struct Globals {
  int deviceCount = 8;
  unsigned delayUs = 200;
  uint64_t seed = 0;
  long failAfterOps = -1;
  bool poison = true;
  std::atomic<long> itemsRun{0};
  std::atomic<uint64_t> streamCounter{0};

  std::mutex allocMu;
  std::map<uintptr_t, Alloc> allocs;

  // Held while enqueueing, so that the legacy stream's snapshot of the other
  // streams and the other streams' snapshot of it are consistent.
  std::mutex streamMu;
  std::map<const void*, StreamPtr> handles;  // streams made by cudaStreamCreate*
  std::vector<std::weak_ptr<Stream>> all;    // every stream with a live thread
  std::vector<StreamPtr> legacy;             // per device, made on first use

  std::mutex eventMu;
  std::map<const void*, std::shared_ptr<Event>> events;

  Globals() {
    deviceCount = (int)envLong("FAKECUDA_DEVICE_COUNT", 8);
    if (deviceCount < 0 || deviceCount > 1024)
      die("FAKECUDA_DEVICE_COUNT=%d is outside 0..1024", deviceCount);
    long d = envLong("FAKECUDA_DELAY_US", 200);
    if (d < 0 || d > 10000000) die("FAKECUDA_DELAY_US=%ld is outside 0..10000000", d);
    delayUs = (unsigned)d;
    const char* seedEnv = getenv("FAKECUDA_SEED");
    if (seedEnv && *seedEnv) {
      seed = strtoull(seedEnv, nullptr, 0);
    } else {
      std::random_device rd;
      seed = ((uint64_t)rd() << 32) ^ rd();
    }
    failAfterOps = envLong("FAKECUDA_FAIL_AFTER_OPS", -1);
    poison = envLong("FAKECUDA_POISON", 1) != 0;
    legacy.resize(deviceCount);
  }
};

Globals& G() {
  static Globals* g = new Globals();
  return *g;
}

thread_local int tlDevice = 0;
thread_local cudaError_t tlLastError = cudaSuccess;
thread_local bool tlInKernel = false;
thread_local int tlKernelDevice = -1;

double nowUs() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void worker(StreamPtr s) {
  tlDevice = s->device;
  for (;;) {
    Work w;
    {
      std::unique_lock<std::mutex> lk(s->mu);
      s->cv.wait(lk, [&] { return !s->queue.empty() || s->stopping; });
      if (s->queue.empty()) break;  // stopping, and everything done
      w = std::move(s->queue.front());
      s->queue.pop_front();
    }
    for (const Dep& d : w.deps) waitFor(d.s, d.seq);
    // The delay stands for the time the work takes on a GPU: it is what
    // makes an unsynchronised reader see the old bytes.
    unsigned delay = s->fixedDelayUs;
    if (G().delayUs) delay += (unsigned)(s->rng() % (G().delayUs + 1));
    if (delay) std::this_thread::sleep_for(std::chrono::microseconds(delay));

    cudaError_t err = cudaSuccess;
    bool run = true;
    {
      std::lock_guard<std::mutex> lk(s->mu);
      if (!w.noFail) {
        if (s->error != cudaSuccess) {
          run = false;  // a failed stream runs nothing more (sticky)
        } else if (s->inject != cudaSuccess) {
          err = s->inject;
          s->inject = cudaSuccess;
          run = false;
          complain("injected error %s on stream %p", cudaGetErrorName(err), (void*)s.get());
        }
      }
    }
    if (run && !w.noFail && G().failAfterOps >= 0 && ++G().itemsRun > G().failAfterOps) {
      err = cudaErrorLaunchFailure;
      run = false;
      complain("FAKECUDA_FAIL_AFTER_OPS=%ld reached: an operation fails with cudaErrorLaunchFailure",
               G().failAfterOps);
    }
    if (run) {
      tlInKernel = w.kernel;
      tlKernelDevice = s->device;
      err = w.fn();
      tlInKernel = false;
    }
    w.fn = nullptr;  // drop captured buffers and communicators before reporting completion
    w.deps.clear();
    std::lock_guard<std::mutex> lk(s->mu);
    if (err != cudaSuccess && s->error == cudaSuccess) s->error = err;
    s->completed++;
    s->cv.notify_all();
  }
}

StreamPtr makeStream(int device, unsigned flags, bool legacy) {
  auto s = std::make_shared<Stream>();
  s->device = device;
  s->flags = flags;
  s->legacy = legacy;
  s->rng.seed(G().seed + 0x9e3779b97f4a7c15ULL * (++G().streamCounter));
  // Caller holds streamMu.
  auto& all = G().all;
  all.erase(std::remove_if(all.begin(), all.end(), [](const std::weak_ptr<Stream>& w) { return w.expired(); }),
            all.end());
  all.push_back(s);
  std::thread(worker, s).detach();
  return s;
}

// Streams of cudaStreamPerThread; stopped when their thread exits.
struct PerThreadStreams {
  std::vector<StreamPtr> byDevice;
  ~PerThreadStreams() {
    for (auto& s : byDevice) {
      if (!s) continue;
      std::lock_guard<std::mutex> lk(s->mu);
      s->stopping = true;
      s->cv.notify_all();
    }
  }
};
thread_local PerThreadStreams tlPerThread;

StreamPtr legacyStream(int device) {
  std::lock_guard<std::mutex> lk(G().streamMu);
  auto& l = G().legacy[device];
  if (!l) l = makeStream(device, 0, true);
  return l;
}

cudaError_t checkDevice(int device) {
  if (device < 0 || device >= G().deviceCount) return cudaErrorInvalidDevice;
  return cudaSuccess;
}

bool findAlloc(const void* p, Alloc* out) {
  std::lock_guard<std::mutex> lk(G().allocMu);
  auto& m = G().allocs;
  auto it = m.upper_bound((uintptr_t)p);
  if (it == m.begin()) return false;
  --it;
  if ((uintptr_t)p >= it->first + it->second.size) return false;
  *out = it->second;
  return true;
}

std::vector<StreamPtr> streamsOfDevice(int device) {
  std::lock_guard<std::mutex> lk(G().streamMu);
  std::vector<StreamPtr> out;
  for (auto& w : G().all)
    if (auto s = w.lock())
      if (s->device == device) out.push_back(s);
  return out;
}

// cudaDeviceSynchronize for one device: everything enqueued so far.
cudaError_t syncDevice(int device) {
  cudaError_t first = cudaSuccess;
  for (auto& s : streamsOfDevice(device)) {
    uint64_t seq;
    {
      std::lock_guard<std::mutex> lk(s->mu);
      seq = s->enqueued;
    }
    waitFor(s, seq);
    std::lock_guard<std::mutex> lk(s->mu);
    if (first == cudaSuccess) first = s->error;
  }
  return first;
}

void unmapAlloc(const Alloc& a) {
  if (a.kind == MemKind::Device) {
    munmap(a.alias, a.aliasMap);
    munmap(a.base, a.mapSize);
  } else {
    munmap(a.base, a.mapSize);
  }
}

// ---- copies ----

enum class Role { Host, Device, Any };

// Checks one side of a copy at the call: its kind against what the memcpy
// kind says, and that [p, p+extent) stays inside its allocation.
cudaError_t checkSide(const char* api, const char* name, const void* p, size_t extent, Role role,
                      PtrInfo* out) {
  *out = lookup(p);
  if (extent == 0) return cudaSuccess;
  if (!p) {
    complain("%s: %s is NULL", api, name);
    return cudaErrorInvalidValue;
  }
  if (role == Role::Device && out->kind == MemKind::Unregistered) {
    complain("%s: %s %p is host memory, not device memory (the copy kind says device)", api, name, p);
    return cudaErrorInvalidValue;
  }
  if (role == Role::Host && out->kind == MemKind::Device) {
    complain("%s: %s %p is device memory, but the copy kind says host", api, name, p);
    return cudaErrorInvalidValue;
  }
  if (out->kind != MemKind::Unregistered) {
    size_t off = (size_t)((const char*)p - out->base);
    if (extent > out->size - off) {
      complain("%s: %s range [%p, +%zu) runs %zu bytes past the end of its allocation of %zu bytes at %p",
               api, name, p, extent, extent - (out->size - off), out->size, (void*)out->base);
      return cudaErrorInvalidValue;
    }
  }
  return cudaSuccess;
}

cudaError_t rolesOf(cudaMemcpyKind kind, Role* src, Role* dst) {
  switch (kind) {
    case cudaMemcpyHostToHost: *src = Role::Host; *dst = Role::Host; return cudaSuccess;
    case cudaMemcpyHostToDevice: *src = Role::Host; *dst = Role::Device; return cudaSuccess;
    case cudaMemcpyDeviceToHost: *src = Role::Device; *dst = Role::Host; return cudaSuccess;
    case cudaMemcpyDeviceToDevice: *src = Role::Device; *dst = Role::Device; return cudaSuccess;
    case cudaMemcpyDefault: *src = Role::Any; *dst = Role::Any; return cudaSuccess;
  }
  return cudaErrorInvalidMemcpyDirection;
}

// Where the bytes of one side are when the copy runs: pageable host memory
// is read/written in place at that moment; device memory through its alias,
// looked up again (it may have been freed by then).
char* resolveAtRun(const void* p, size_t extent, MemKind kindAtCall, const char* api, const char* name) {
  if (kindAtCall == MemKind::Unregistered || extent == 0) return (char*)p;
  std::string why;
  char* a = aliasOf(p, extent, &why);
  if (!a) complain("%s: when it ran, %s %p: %s (freed before the stream reached the copy?)", api, name, p,
                   why.c_str());
  return a;
}

// One 2D (or, with height 1, 1D) copy, validated at the call and run on s.
cudaError_t copy2D(const char* api, void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                   size_t height, cudaMemcpyKind kind, cudaStream_t stream, bool sync) {
  Role rs, rd;
  if (rolesOf(kind, &rs, &rd) != cudaSuccess) {
    complain("%s: invalid cudaMemcpyKind %d", api, (int)kind);
    return record(cudaErrorInvalidMemcpyDirection);
  }
  if (height > 1 && (width > dpitch || width > spitch)) {
    complain("%s: width %zu exceeds a pitch (dpitch %zu, spitch %zu)", api, width, dpitch, spitch);
    return record(cudaErrorInvalidPitchValue);
  }
  if (width == 0 || height == 0) return cudaSuccess;
  size_t dExtent = (height - 1) * dpitch + width, sExtent = (height - 1) * spitch + width;
  PtrInfo di, si;
  cudaError_t err = checkSide(api, "src", src, sExtent, rs, &si);
  if (!err) err = checkSide(api, "dst", dst, dExtent, rd, &di);
  if (err) return record(err);
  cudaError_t serr;
  StreamPtr s = resolveStream(stream, &serr);
  if (!s) return record(serr);
  MemKind dk = di.kind, sk = si.kind;
  Work w;
  w.fn = [=]() -> cudaError_t {
    char* d = resolveAtRun(dst, dExtent, dk, api, "dst");
    const char* sp = resolveAtRun(src, sExtent, sk, api, "src");
    if (!d || !sp) return cudaErrorIllegalAddress;
    for (size_t r = 0; r < height; r++) memmove(d + r * dpitch, sp + r * spitch, width);
    return cudaSuccess;
  };
  uint64_t seq = enqueue(s, std::move(w));
  if (sync) {
    waitFor(s, seq);
    std::lock_guard<std::mutex> lk(s->mu);
    return record(s->error);
  }
  return cudaSuccess;
}

cudaError_t memset1D(const char* api, void* p, int value, size_t count, cudaStream_t stream, bool syncCall) {
  PtrInfo info;
  cudaError_t err = checkSide(api, "devPtr", p, count, Role::Device, &info);
  if (err) return record(err);
  if (count == 0) return cudaSuccess;
  cudaError_t serr;
  StreamPtr s = resolveStream(stream, &serr);
  if (!s) return record(serr);
  MemKind k = info.kind;
  Work w;
  w.fn = [=]() -> cudaError_t {
    char* d = resolveAtRun(p, count, k, api, "devPtr");
    if (!d) return cudaErrorIllegalAddress;
    memset(d, value, count);
    return cudaSuccess;
  };
  uint64_t seq = enqueue(s, std::move(w));
  // CUDA: cudaMemset is asynchronous to the host except on pinned host memory.
  if (syncCall && k == MemKind::Pinned) {
    waitFor(s, seq);
    std::lock_guard<std::mutex> lk(s->mu);
    return record(s->error);
  }
  return cudaSuccess;
}

std::shared_ptr<Event> findEvent(cudaEvent_t e) {
  std::lock_guard<std::mutex> lk(G().eventMu);
  auto it = G().events.find(e);
  if (it == G().events.end()) return nullptr;
  return it->second;
}

}  // namespace

// ---- shared internals ----

void complain(const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "fakecuda[pid %d]: %s\n", (int)getpid(), buf);
}

void die(const char* fmt, ...) {
  char buf[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  fprintf(stderr, "fakecuda[pid %d]: FATAL: %s\n", (int)getpid(), buf);
  fflush(stderr);
  abort();
}

long envLong(const char* name, long dflt) {
  const char* v = getenv(name);
  if (!v || !*v) return dflt;
  char* end = nullptr;
  long x = strtol(v, &end, 0);
  if (*end) die("%s=%s is not an integer", name, v);
  return x;
}

int currentDevice() { return tlDevice; }

cudaError_t record(cudaError_t err) {
  if (err != cudaSuccess) tlLastError = err;
  return err;
}

StreamPtr resolveStream(cudaStream_t h, cudaError_t* err) {
  if (h == nullptr || h == cudaStreamLegacy) return legacyStream(tlDevice);
  if (h == cudaStreamPerThread) {
    auto& v = tlPerThread.byDevice;
    if (v.size() < (size_t)G().deviceCount) v.resize(G().deviceCount);
    if (!v[tlDevice]) {
      std::lock_guard<std::mutex> lk(G().streamMu);
      v[tlDevice] = makeStream(tlDevice, 0, false);
    }
    return v[tlDevice];
  }
  std::lock_guard<std::mutex> lk(G().streamMu);
  auto it = G().handles.find(h);
  if (it == G().handles.end()) {
    complain("unknown stream handle %p (destroyed, or never created)", (void*)h);
    *err = cudaErrorInvalidResourceHandle;
    return nullptr;
  }
  return it->second;
}

uint64_t enqueue(const StreamPtr& s, Work w) {
  std::lock_guard<std::mutex> g(G().streamMu);
  // CUDA's legacy default stream: its work waits for all earlier work of the
  // device's blocking streams, and their later work waits for it.
  if (s->legacy) {
    for (auto& wk : G().all) {
      auto o = wk.lock();
      if (!o || o == s || o->legacy || o->device != s->device || (o->flags & cudaStreamNonBlocking)) continue;
      std::lock_guard<std::mutex> lk(o->mu);
      if (o->enqueued > o->completed) w.deps.push_back({o, o->enqueued});
    }
  } else if (!(s->flags & cudaStreamNonBlocking)) {
    auto& l = G().legacy[s->device];
    if (l) {
      std::lock_guard<std::mutex> lk(l->mu);
      if (l->enqueued > l->completed) w.deps.push_back({l, l->enqueued});
    }
  }
  std::lock_guard<std::mutex> lk(s->mu);
  s->queue.push_back(std::move(w));
  s->cv.notify_all();
  return ++s->enqueued;
}

void waitFor(const StreamPtr& s, uint64_t seq) {
  std::unique_lock<std::mutex> lk(s->mu);
  s->cv.wait(lk, [&] { return s->completed >= seq; });
}

PtrInfo lookup(const void* p) {
  PtrInfo info;
  Alloc a;
  if (!p || !findAlloc(p, &a)) return info;
  info.kind = a.kind;
  info.device = a.device;
  info.base = a.base;
  info.size = a.size;
  info.alias = a.alias;
  return info;
}

char* aliasOf(const void* p, size_t n, std::string* why) {
  Alloc a;
  if (!p || !findAlloc(p, &a)) {
    *why = "not in any live device allocation";
    return nullptr;
  }
  size_t off = (size_t)((const char*)p - a.base);
  if (n > a.size - off) {
    char buf[256];
    snprintf(buf, sizeof buf, "range of %zu bytes runs %zu bytes past the end of its allocation of %zu bytes at %p",
             n, n - (a.size - off), a.size, (void*)a.base);
    *why = buf;
    return nullptr;
  }
  return a.alias + off;
}

cudaError_t deviceMalloc(void** p, size_t size, const char* who) {
  if (!p) return cudaErrorInvalidValue;
  *p = nullptr;
  if (size == 0) return cudaSuccess;  // as CUDA: success and a NULL pointer
  if (size > ((size_t)1 << 40)) {
    complain("%s: %zu bytes is more than the double will map", who, size);
    return cudaErrorMemoryAllocation;
  }
  size_t mapped = (size + kPage - 1) / kPage * kPage;
  int fd = memfd_create("fakecuda-device", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, (off_t)mapped) != 0) {
    if (fd >= 0) close(fd);
    complain("%s: memfd for %zu bytes: %s", who, size, strerror(errno));
    return cudaErrorMemoryAllocation;
  }
  // The device address: a PROT_NONE reservation one guard page longer than
  // the bytes, so that no other allocation starts right at its end; the
  // memfd is mapped over its start, still PROT_NONE.
  size_t reserve = mapped + kPage;
  void* dev = mmap(nullptr, reserve, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  void* alias = MAP_FAILED;
  if (dev != MAP_FAILED) {
    if (mmap(dev, mapped, PROT_NONE, MAP_SHARED | MAP_FIXED, fd, 0) == MAP_FAILED) {
      munmap(dev, reserve);
      dev = MAP_FAILED;
    } else {
      alias = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
  }
  close(fd);
  if (dev == MAP_FAILED || alias == MAP_FAILED) {
    if (dev != MAP_FAILED) munmap(dev, reserve);
    complain("%s: mapping %zu bytes: %s", who, size, strerror(errno));
    return cudaErrorMemoryAllocation;
  }
  // cudaMalloc's memory is not zeroed: code that assumes it is must not pass.
  if (G().poison) memset(alias, 0xa5, size);
  Alloc a{(char*)dev, (char*)alias, size, reserve, mapped, tlDevice, MemKind::Device};
  {
    std::lock_guard<std::mutex> lk(G().allocMu);
    G().allocs[(uintptr_t)dev] = a;
  }
  *p = dev;
  return cudaSuccess;
}

// Unregisters and unmaps a device allocation; sync first like cudaFree.
static cudaError_t takeAlloc(void* p, MemKind kind, const char* who, Alloc* out) {
  std::lock_guard<std::mutex> lk(G().allocMu);
  auto it = G().allocs.find((uintptr_t)p);
  if (it == G().allocs.end() || it->second.kind != kind) {
    Alloc inside;
    bool interior = false;
    auto& m = G().allocs;
    auto ub = m.upper_bound((uintptr_t)p);
    if (ub != m.begin()) {
      --ub;
      interior = (uintptr_t)p < ub->first + ub->second.size;
      inside = ub->second;
    }
    if (interior && inside.kind == kind)
      complain("%s(%p): not the start of its allocation (%p)", who, p, (void*)inside.base);
    else if (interior)
      complain("%s(%p): wrong kind of memory for this call", who, p);
    else
      complain("%s(%p): not an allocation of this process (freed twice?)", who, p);
    return cudaErrorInvalidValue;
  }
  *out = it->second;
  G().allocs.erase(it);
  return cudaSuccess;
}

cudaError_t deviceFree(void* p, const char* who) {
  if (!p) return cudaSuccess;
  PtrInfo info = lookup(p);
  // cudaFree synchronises the device first, so work queued on the memory
  // still runs on live bytes.
  if (info.kind == MemKind::Device) syncDevice(info.device);
  Alloc a;
  cudaError_t err = takeAlloc(p, MemKind::Device, who, &a);
  if (err) return err;
  unmapAlloc(a);
  return cudaSuccess;
}

}  // namespace fakecuda

using namespace fakecuda;

// ================= the CUDA runtime API =================

FAKECUDA_API cudaError_t cudaGetDeviceCount(int* count) {
  if (!count) return record(cudaErrorInvalidValue);
  *count = G().deviceCount;
  if (G().deviceCount == 0) return record(cudaErrorNoDevice);
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaSetDevice(int device) {
  if (checkDevice(device)) {
    complain("cudaSetDevice(%d): there are %d devices (FAKECUDA_DEVICE_COUNT)", device, G().deviceCount);
    return record(cudaErrorInvalidDevice);
  }
  tlDevice = device;
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaGetDevice(int* device) {
  if (!device) return record(cudaErrorInvalidValue);
  *device = tlDevice;
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaDeviceSynchronize(void) { return record(syncDevice(tlDevice)); }

FAKECUDA_API cudaError_t cudaGetDeviceProperties(struct cudaDeviceProp* prop, int device) {
  if (!prop) return record(cudaErrorInvalidValue);
  if (checkDevice(device)) return record(cudaErrorInvalidDevice);
  memset(prop, 0, sizeof *prop);
  snprintf(prop->name, sizeof prop->name, "fakecuda");
  for (int i = 0; i < 16; i++) prop->uuid.bytes[i] = (char)(0xfa + device * 16 + i);
  prop->totalGlobalMem = (size_t)80 << 30;
  prop->sharedMemPerBlock = 48 << 10;
  prop->sharedMemPerBlockOptin = 227 << 10;
  prop->sharedMemPerMultiprocessor = 228 << 10;
  prop->regsPerBlock = 65536;
  prop->regsPerMultiprocessor = 65536;
  prop->warpSize = 32;
  prop->memPitch = (size_t)INT32_MAX;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = 1024;
  prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = INT32_MAX;
  prop->maxGridSize[1] = 65535;
  prop->maxGridSize[2] = 65535;
  prop->totalConstMem = 64 << 10;
  prop->major = 9;
  prop->minor = 0;
  prop->textureAlignment = 512;
  prop->texturePitchAlignment = 32;
  prop->multiProcessorCount = 132;
  prop->canMapHostMemory = 1;
  prop->concurrentKernels = 1;
  prop->pciBusID = device + 1;
  prop->pciDeviceID = 0;
  prop->pciDomainID = 0;
  prop->asyncEngineCount = 2;
  prop->unifiedAddressing = 1;
  prop->memoryBusWidth = 5120;
  prop->l2CacheSize = 50 << 20;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->maxBlocksPerMultiProcessor = 32;
  prop->streamPrioritiesSupported = 1;
  prop->memoryPoolsSupported = 1;
  prop->hostNumaId = -1;
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaDeviceGetPCIBusId(char* pciBusId, int len, int device) {
  if (!pciBusId || len <= 0) return record(cudaErrorInvalidValue);
  if (checkDevice(device)) return record(cudaErrorInvalidDevice);
  snprintf(pciBusId, (size_t)len, "0000:%02x:00.0", device + 1);
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaDriverGetVersion(int* v) {
  if (!v) return record(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaRuntimeGetVersion(int* v) {
  if (!v) return record(cudaErrorInvalidValue);
  *v = CUDART_VERSION;
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaGetLastError(void) {
  cudaError_t e = tlLastError;
  tlLastError = cudaSuccess;
  return e;
}

FAKECUDA_API cudaError_t cudaPeekAtLastError(void) { return tlLastError; }

namespace {
#define FAKECUDA_ERRORS(X)                                                         \
  X(cudaSuccess, "no error")                                                       \
  X(cudaErrorInvalidValue, "invalid argument")                                     \
  X(cudaErrorMemoryAllocation, "out of memory")                                    \
  X(cudaErrorInitializationError, "initialization error")                          \
  X(cudaErrorInvalidPitchValue, "invalid pitch argument")                          \
  X(cudaErrorInvalidDevicePointer, "invalid device pointer")                       \
  X(cudaErrorInvalidMemcpyDirection, "invalid copy direction for memcpy")          \
  X(cudaErrorInsufficientDriver, "CUDA driver version is insufficient for CUDA runtime version") \
  X(cudaErrorNoDevice, "no CUDA-capable device is detected")                       \
  X(cudaErrorInvalidDevice, "invalid device ordinal")                              \
  X(cudaErrorInvalidResourceHandle, "invalid resource handle")                     \
  X(cudaErrorNotReady, "device not ready")                                         \
  X(cudaErrorIllegalAddress, "an illegal memory access was encountered")           \
  X(cudaErrorLaunchFailure, "unspecified launch failure")                          \
  X(cudaErrorNotPermitted, "operation not permitted")                              \
  X(cudaErrorNotSupported, "operation not supported")                              \
  X(cudaErrorStreamCaptureUnsupported, "operation not permitted when stream is capturing") \
  X(cudaErrorECCUncorrectable, "uncorrectable ECC error encountered")              \
  X(cudaErrorHardwareStackError, "an illegal instruction was encountered")         \
  X(cudaErrorUnknown, "unknown error")
}  // namespace

FAKECUDA_API const char* cudaGetErrorString(cudaError_t error) {
#define X(code, text) \
  if (error == code) return text;
  FAKECUDA_ERRORS(X)
#undef X
  return "unrecognized error code";
}

FAKECUDA_API const char* cudaGetErrorName(cudaError_t error) {
#define X(code, text) \
  if (error == code) return #code;
  FAKECUDA_ERRORS(X)
#undef X
  return "cudaErrorUnrecognized";
}

// ---- memory ----

FAKECUDA_API cudaError_t cudaMalloc(void** devPtr, size_t size) { return record(deviceMalloc(devPtr, size, "cudaMalloc")); }

FAKECUDA_API cudaError_t cudaFree(void* devPtr) { return record(deviceFree(devPtr, "cudaFree")); }

FAKECUDA_API cudaError_t cudaMallocAsync(void** devPtr, size_t size, cudaStream_t stream) {
  cudaError_t err;
  StreamPtr s = resolveStream(stream, &err);
  if (!s) return record(err);
  int saved = tlDevice;
  tlDevice = s->device;  // the memory belongs to the stream's device
  err = deviceMalloc(devPtr, size, "cudaMallocAsync");
  tlDevice = saved;
  return record(err);
}

FAKECUDA_API cudaError_t cudaFreeAsync(void* devPtr, cudaStream_t stream) {
  if (!devPtr) return cudaSuccess;
  cudaError_t err;
  StreamPtr s = resolveStream(stream, &err);
  if (!s) return record(err);
  PtrInfo info = lookup(devPtr);
  if (info.kind != MemKind::Device || info.base != devPtr) {
    complain("cudaFreeAsync(%p): not the start of a device allocation", devPtr);
    return record(cudaErrorInvalidValue);
  }
  // Freed when the stream gets there: work ordered after it on other streams
  // finds the memory gone (cudaErrorIllegalAddress), as a GPU may.
  Work w;
  w.fn = [devPtr]() -> cudaError_t {
    Alloc a;
    if (takeAlloc(devPtr, MemKind::Device, "cudaFreeAsync", &a)) return cudaErrorInvalidValue;
    unmapAlloc(a);
    return cudaSuccess;
  };
  enqueue(s, std::move(w));
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaHostAlloc(void** pHost, size_t size, unsigned int flags) {
  if (!pHost) return record(cudaErrorInvalidValue);
  *pHost = nullptr;
  if (flags & ~0xfu) {
    complain("cudaHostAlloc: unknown flags 0x%x", flags);
    return record(cudaErrorInvalidValue);
  }
  if (size == 0) return cudaSuccess;
  size_t mapped = (size + kPage - 1) / kPage * kPage;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return record(cudaErrorMemoryAllocation);
  Alloc a{(char*)p, (char*)p, size, mapped, mapped, tlDevice, MemKind::Pinned};
  std::lock_guard<std::mutex> lk(G().allocMu);
  G().allocs[(uintptr_t)p] = a;
  *pHost = p;
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaMallocHost(void** ptr, size_t size) { return cudaHostAlloc(ptr, size, 0); }

FAKECUDA_API cudaError_t cudaFreeHost(void* ptr) {
  if (!ptr) return cudaSuccess;
  PtrInfo info = lookup(ptr);
  if (info.kind == MemKind::Pinned) syncDevice(info.device);
  Alloc a;
  cudaError_t err = takeAlloc(ptr, MemKind::Pinned, "cudaFreeHost", &a);
  if (err) return record(err);
  unmapAlloc(a);
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr) {
  if (!attributes) return record(cudaErrorInvalidValue);
  PtrInfo info = lookup(ptr);
  memset(attributes, 0, sizeof *attributes);
  switch (info.kind) {
    case MemKind::Device:
      attributes->type = cudaMemoryTypeDevice;
      attributes->device = info.device;
      attributes->devicePointer = const_cast<void*>(ptr);
      attributes->hostPointer = nullptr;
      break;
    case MemKind::Pinned:
      // Unified addressing: the same address on host and device.
      attributes->type = cudaMemoryTypeHost;
      attributes->device = info.device;
      attributes->devicePointer = const_cast<void*>(ptr);
      attributes->hostPointer = const_cast<void*>(ptr);
      break;
    case MemKind::Unregistered:
      // CUDA >= 11: success, unregistered, no device, no device pointer.
      attributes->type = cudaMemoryTypeUnregistered;
      attributes->device = -2;
      attributes->devicePointer = nullptr;
      attributes->hostPointer = const_cast<void*>(ptr);
      break;
  }
  return cudaSuccess;
}

// ---- streams ----

FAKECUDA_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t* pStream, unsigned int flags) {
  if (!pStream) return record(cudaErrorInvalidValue);
  if (flags & ~(unsigned)cudaStreamNonBlocking) {
    complain("cudaStreamCreateWithFlags: unknown flags 0x%x", flags);
    return record(cudaErrorInvalidValue);
  }
  std::lock_guard<std::mutex> lk(G().streamMu);
  StreamPtr s = makeStream(tlDevice, flags, false);
  G().handles[s.get()] = s;
  *pStream = reinterpret_cast<cudaStream_t>(s.get());
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaStreamCreate(cudaStream_t* pStream) { return cudaStreamCreateWithFlags(pStream, 0); }

FAKECUDA_API cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  StreamPtr s;
  {
    std::lock_guard<std::mutex> lk(G().streamMu);
    auto it = G().handles.find(stream);
    if (it == G().handles.end()) {
      complain("cudaStreamDestroy(%p): not a stream made by cudaStreamCreate* (destroyed twice? a default stream?)",
               (void*)stream);
      return record(cudaErrorInvalidResourceHandle);
    }
    s = it->second;
    G().handles.erase(it);
  }
  // As CUDA: returns at once; queued work still runs, then the thread ends.
  std::lock_guard<std::mutex> lk(s->mu);
  s->stopping = true;
  s->cv.notify_all();
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  cudaError_t err;
  StreamPtr s = resolveStream(stream, &err);
  if (!s) return record(err);
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lk(s->mu);
    seq = s->enqueued;
  }
  waitFor(s, seq);
  std::lock_guard<std::mutex> lk(s->mu);
  return record(s->error);
}

FAKECUDA_API cudaError_t cudaStreamQuery(cudaStream_t stream) {
  cudaError_t err;
  StreamPtr s = resolveStream(stream, &err);
  if (!s) return record(err);
  std::lock_guard<std::mutex> lk(s->mu);
  if (s->error) return record(s->error);
  return s->completed == s->enqueued ? cudaSuccess : cudaErrorNotReady;
}

FAKECUDA_API cudaError_t cudaStreamGetFlags(cudaStream_t hStream, unsigned int* flags) {
  if (!flags) return record(cudaErrorInvalidValue);
  cudaError_t err;
  StreamPtr s = resolveStream(hStream, &err);
  if (!s) return record(err);
  *flags = s->flags;
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaStreamGetDevice(cudaStream_t hStream, int* device) {
  if (!device) return record(cudaErrorInvalidValue);
  cudaError_t err;
  StreamPtr s = resolveStream(hStream, &err);
  if (!s) return record(err);
  *device = s->device;
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int flags) {
  cudaError_t err;
  StreamPtr s = resolveStream(stream, &err);
  if (!s) return record(err);
  auto e = findEvent(event);
  if (!e) {
    complain("cudaStreamWaitEvent: unknown event %p", (void*)event);
    return record(cudaErrorInvalidResourceHandle);
  }
  if (flags & ~1u) return record(cudaErrorInvalidValue);
  std::shared_ptr<Record> rec;
  {
    std::lock_guard<std::mutex> lk(e->mu);
    rec = e->rec;
  }
  if (!rec) return cudaSuccess;  // never recorded: nothing to wait for (CUDA)
  Work w;
  w.fn = [] { return cudaSuccess; };
  w.deps.push_back({rec->s, rec->seq});
  w.noFail = true;
  enqueue(s, std::move(w));
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  if (!fn) return record(cudaErrorInvalidValue);
  cudaError_t err;
  StreamPtr s = resolveStream(stream, &err);
  if (!s) return record(err);
  Work w;
  w.fn = [fn, userData] {
    fn(userData);
    return cudaSuccess;
  };
  enqueue(s, std::move(w));
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaStreamBeginCapture(cudaStream_t stream, enum cudaStreamCaptureMode mode) {
  (void)stream;
  (void)mode;
  complain("cudaStreamBeginCapture: the test double does not implement CUDA graphs");
  return record(cudaErrorNotSupported);
}

FAKECUDA_API cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* pGraph) {
  (void)stream;
  if (pGraph) *pGraph = nullptr;
  complain("cudaStreamEndCapture: the test double does not implement CUDA graphs");
  return record(cudaErrorNotSupported);
}

FAKECUDA_API cudaError_t cudaStreamIsCapturing(cudaStream_t stream, enum cudaStreamCaptureStatus* pCaptureStatus) {
  if (!pCaptureStatus) return record(cudaErrorInvalidValue);
  cudaError_t err;
  if (!resolveStream(stream, &err)) return record(err);
  *pCaptureStatus = cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

// ---- events ----

FAKECUDA_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int flags) {
  if (!event) return record(cudaErrorInvalidValue);
  unsigned known = cudaEventBlockingSync | cudaEventDisableTiming | cudaEventInterprocess;
  if ((flags & ~known) || ((flags & cudaEventInterprocess) && !(flags & cudaEventDisableTiming))) {
    complain("cudaEventCreateWithFlags: invalid flags 0x%x", flags);
    return record(cudaErrorInvalidValue);
  }
  auto e = std::make_shared<Event>();
  e->flags = flags;
  std::lock_guard<std::mutex> lk(G().eventMu);
  G().events[e.get()] = e;
  *event = reinterpret_cast<cudaEvent_t>(e.get());
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }

FAKECUDA_API cudaError_t cudaEventDestroy(cudaEvent_t event) {
  std::lock_guard<std::mutex> lk(G().eventMu);
  if (!G().events.erase(event)) {
    complain("cudaEventDestroy(%p): unknown event (destroyed twice?)", (void*)event);
    return record(cudaErrorInvalidResourceHandle);
  }
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  auto e = findEvent(event);
  if (!e) {
    complain("cudaEventRecord: unknown event %p", (void*)event);
    return record(cudaErrorInvalidResourceHandle);
  }
  cudaError_t err;
  StreamPtr s = resolveStream(stream, &err);
  if (!s) return record(err);
  auto rec = std::make_shared<Record>();
  rec->s = s;
  Work w;
  w.fn = [rec] {
    rec->tUs = nowUs();
    rec->timed = true;
    return cudaSuccess;
  };
  w.noFail = true;
  // The record is what later waits and queries see, so it is published
  // under the event's lock together with its position.
  std::lock_guard<std::mutex> lk(e->mu);
  rec->seq = enqueue(s, std::move(w));
  e->rec = rec;
  return cudaSuccess;
}

FAKECUDA_API cudaError_t cudaEventQuery(cudaEvent_t event) {
  auto e = findEvent(event);
  if (!e) return record(cudaErrorInvalidResourceHandle);
  std::shared_ptr<Record> rec;
  {
    std::lock_guard<std::mutex> lk(e->mu);
    rec = e->rec;
  }
  if (!rec) return cudaSuccess;
  std::lock_guard<std::mutex> lk(rec->s->mu);
  return rec->s->completed >= rec->seq ? cudaSuccess : cudaErrorNotReady;
}

FAKECUDA_API cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  auto e = findEvent(event);
  if (!e) return record(cudaErrorInvalidResourceHandle);
  std::shared_ptr<Record> rec;
  {
    std::lock_guard<std::mutex> lk(e->mu);
    rec = e->rec;
  }
  if (!rec) return cudaSuccess;
  waitFor(rec->s, rec->seq);
  std::lock_guard<std::mutex> lk(rec->s->mu);
  return record(rec->s->error);
}

FAKECUDA_API cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  if (!ms) return record(cudaErrorInvalidValue);
  auto a = findEvent(start), b = findEvent(end);
  if (!a || !b) return record(cudaErrorInvalidResourceHandle);
  if ((a->flags | b->flags) & cudaEventDisableTiming) return record(cudaErrorInvalidResourceHandle);
  std::shared_ptr<Record> ra, rb;
  {
    std::lock_guard<std::mutex> lk(a->mu);
    ra = a->rec;
  }
  {
    std::lock_guard<std::mutex> lk(b->mu);
    rb = b->rec;
  }
  if (!ra || !rb) return record(cudaErrorInvalidResourceHandle);
  if (!ra->timed || !rb->timed) return cudaErrorNotReady;
  *ms = (float)((rb->tUs - ra->tUs) / 1000.0);
  return cudaSuccess;
}

// ---- copies ----

FAKECUDA_API cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                                         cudaStream_t stream) {
  return copy2D("cudaMemcpyAsync", dst, count, src, count, count, 1, kind, stream, false);
}

FAKECUDA_API cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  // CUDA: on the legacy stream; the host waits except for device-to-device.
  bool d2d = lookup(dst).kind == MemKind::Device && lookup(src).kind == MemKind::Device;
  return copy2D("cudaMemcpy", dst, count, src, count, count, 1, kind, cudaStreamLegacy, !d2d);
}

FAKECUDA_API cudaError_t cudaMemcpy2DAsync(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                                           size_t height, enum cudaMemcpyKind kind, cudaStream_t stream) {
  return copy2D("cudaMemcpy2DAsync", dst, dpitch, src, spitch, width, height, kind, stream, false);
}

FAKECUDA_API cudaError_t cudaMemset(void* devPtr, int value, size_t count) {
  return memset1D("cudaMemset", devPtr, value, count, cudaStreamLegacy, true);
}

FAKECUDA_API cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  return memset1D("cudaMemsetAsync", devPtr, value, count, stream, false);
}

// ================= the extension API (fakecuda.h) =================

FAKECUDA_API cudaError_t fakecudaLaunch(cudaStream_t stream, void (*fn)(void* arg), void* arg, size_t argBytes) {
  if (!fn || (argBytes && !arg)) return record(cudaErrorInvalidValue);
  cudaError_t err;
  StreamPtr s = resolveStream(stream, &err);
  if (!s) return record(err);
  // Arguments are captured at launch, as a kernel's are.
  auto copy = std::make_shared<std::vector<std::max_align_t>>((argBytes + sizeof(std::max_align_t) - 1) /
                                                              sizeof(std::max_align_t) + 1);
  if (argBytes) memcpy(copy->data(), arg, argBytes);
  Work w;
  w.fn = [fn, copy] {
    fn(copy->data());
    return cudaSuccess;
  };
  w.kernel = true;
  enqueue(s, std::move(w));
  return cudaSuccess;
}

FAKECUDA_API void* fakecudaAlias(const void* devPtr, size_t bytes) {
  if (!tlInKernel)
    die("host code touched device memory: fakecudaAlias(%p, %zu) called outside a function run by fakecudaLaunch",
        devPtr, bytes);
  PtrInfo info = lookup(devPtr);
  if (info.kind == MemKind::Unregistered)
    die("a kernel touched %p, which is not device memory (pageable host memory or freed)", devPtr);
  if (info.kind == MemKind::Device && info.device != tlKernelDevice)
    die("a kernel on device %d touched %p, memory of device %d (no peer access in the double)", tlKernelDevice,
        devPtr, info.device);
  std::string why;
  char* a = aliasOf(devPtr, bytes, &why);
  if (!a) die("a kernel touched [%p, +%zu): %s", devPtr, bytes, why.c_str());
  return a;
}

FAKECUDA_API cudaError_t fakecudaInjectStreamError(cudaStream_t stream, cudaError_t err) {
  if (err == cudaSuccess) return record(cudaErrorInvalidValue);
  cudaError_t e;
  StreamPtr s = resolveStream(stream, &e);
  if (!s) return record(e);
  std::lock_guard<std::mutex> lk(s->mu);
  s->inject = err;
  return cudaSuccess;
}

FAKECUDA_API cudaError_t fakecudaStreamSetDelay(cudaStream_t stream, unsigned int delayUs) {
  cudaError_t e;
  StreamPtr s = resolveStream(stream, &e);
  if (!s) return record(e);
  std::lock_guard<std::mutex> lk(s->mu);
  s->fixedDelayUs = delayUs;
  return cudaSuccess;
}

FAKECUDA_API unsigned long long fakecudaSeed(void) { return G().seed; }
