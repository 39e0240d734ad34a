// The device data plane on NCCL. The communicator is nonblocking (NCCL's
// config.blocking = 0) so that no call here can wait forever: init, group
// ends and finalize return ncclInProgress and are polled up to the
// communicator's timeout, then aborted. Work on the callers' streams is only
// enqueued: its failures arrive later through ncclCommGetAsyncError.
#include "transport/nccl/nccl_transport.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "src/core/log.h"
#include "src/core/params.h"
#include "src/util/clock.h"
#include "src/util/strings.h"

namespace zp {

namespace {

zpResult_t fromNccl(ncclResult_t r) {
  switch (r) {
    case ncclSuccess: return zpSuccess;
    case ncclUnhandledCudaError: return zpUnhandledCudaError;
    case ncclSystemError: return zpSystemError;
    case ncclInvalidArgument: return zpInvalidArgument;
    case ncclInvalidUsage: return zpInvalidUsage;
    case ncclRemoteError: return zpRemoteError;
    case ncclInProgress: return zpInProgress;
    default: return zpInternalError;
  }
}

// The calling thread's device is the communicator's for a scope (NCCL and
// the runtime act on the current device), then what it was.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device && cudaSetDevice(device) == cudaSuccess)
      restore_ = true;
  }
  ~DeviceScope() {
    if (restore_) cudaSetDevice(previous_);
  }

 private:
  int previous_ = -1;
  bool restore_ = false;
};

// Waits while a nonblocking communicator reports ncclInProgress, up to deadline.
ncclResult_t settle(ncclComm_t comm, uint64_t deadlineMs) {
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess) return r;
    if (state != ncclInProgress) return state;
    if (nowMs() > deadlineMs) return ncclInProgress;
    usleep(200);
  }
}

bool capturing(void* stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing((cudaStream_t)stream, &status) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return status == cudaStreamCaptureStatusActive;
}

// Whether this process can read a byte at p: a syscall that copies from p
// fails with EFAULT instead of faulting (process_vm_readv on ourselves).
bool hostReadable(const void* p) {
  char byte;
  struct iovec local = {&byte, 1}, remote = {const_cast<void*>(p), 1};
  return process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == 1;
}

zpResult_t ncclFailure(const char* what, ncclResult_t r, ncclComm_t comm) {
  if (r == ncclInProgress) return fail(zpRemoteError, "%s did not complete within the timeout (a peer is missing?)", what);
  return fail(fromNccl(r), "%s: %s: %s", what, ncclGetErrorString(r), ncclGetLastError(comm));
}

class NcclTransport : public StreamTransport {
 public:
  NcclTransport(ncclComm_t comm, int device, int timeoutMs) : comm_(comm), device_(device), timeoutMs_(timeoutMs) {}
  ~NcclTransport() override { close(true); }

  zpResult_t memoryOf(const void* buf, void* stream, Memory* where, int* device) override {
    cudaPointerAttributes a;
    memset(&a, 0, sizeof(a));
    cudaError_t e = cudaPointerGetAttributes(&a, buf);
    if (e != cudaSuccess) {
      cudaGetLastError();  // not sticky: leave the thread's CUDA error state as it was
      return fail(zpUnhandledCudaError, "cudaPointerGetAttributes(%p): %s", buf, cudaGetErrorString(e));
    }
    // Managed memory is usable from the device: it counts as device memory.
    bool onDevice = a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
    *device = onDevice ? a.device : -1;
    // Memory from cudaMallocAsync in a capture (a graph's, as Ulysses' and the
    // attention driver's staging are) is "unregistered" to CUDA until the
    // graph's first launch. On a capturing stream, such a pointer that the
    // host cannot read is taken for the capture's own device memory: host
    // memory (malloc'd, mapped) is readable and is still refused.
    if (a.type == cudaMemoryTypeUnregistered && stream && capturing(stream) && !hostReadable(buf)) {
      onDevice = true;
      *device = device_;
    }
    *where = onDevice ? Memory::kDevice : Memory::kHost;
    return zpSuccess;
  }

  zpResult_t enqueue(const std::vector<Op*>& ops) override {
    if (!comm_) return fail(zpInvalidUsage, "the device communicator was closed");
    DeviceScope scope(device_);
    ncclResult_t first = ncclGroupStart();
    for (Op* op : ops) {
      if (first != ncclSuccess) break;
      cudaStream_t stream = (cudaStream_t)op->stream;
      first = op->isSend ? ncclSend(op->buf, op->bytes, ncclUint8, op->peer, comm_, stream)
                         : ncclRecv(op->buf, op->bytes, ncclUint8, op->peer, comm_, stream);
    }
    // The group is closed whatever happened inside it.
    ncclResult_t end = ncclGroupEnd();
    if (end == ncclInProgress) end = settle(comm_, nowMs() + timeoutMs_);
    if (first != ncclSuccess) return ncclFailure("ncclSend/ncclRecv", first, comm_);
    if (end != ncclSuccess) return ncclFailure("ncclGroupEnd", end, comm_);
    return zpSuccess;
  }

  // NCCL's own collective: zpDataType_t and zpRedOp_t have NCCL's values.
  zpResult_t enqueueCollective(const CollArgs& a, void* streamHandle) override {
    if (!comm_) return fail(zpInvalidUsage, "the device communicator was closed");
    DeviceScope scope(device_);
    cudaStream_t stream = (cudaStream_t)streamHandle;
    const ncclDataType_t dt = (ncclDataType_t)a.dtype;
    const ncclRedOp_t op = (ncclRedOp_t)a.op;
    ncclResult_t r = ncclSuccess;
    const char* what = "";
    switch (a.kind) {
      case CollKind::kAllReduce: what = "ncclAllReduce"; r = ncclAllReduce(a.send, a.recv, a.count, dt, op, comm_, stream); break;
      case CollKind::kBroadcast: what = "ncclBroadcast"; r = ncclBroadcast(a.send, a.recv, a.count, dt, a.root, comm_, stream); break;
      case CollKind::kReduce: what = "ncclReduce"; r = ncclReduce(a.send, a.recv, a.count, dt, op, a.root, comm_, stream); break;
      case CollKind::kAllGather: what = "ncclAllGather"; r = ncclAllGather(a.send, a.recv, a.count, dt, comm_, stream); break;
      case CollKind::kReduceScatter: what = "ncclReduceScatter"; r = ncclReduceScatter(a.send, a.recv, a.count, dt, op, comm_, stream); break;
      case CollKind::kAllGatherv:
      case CollKind::kReduceScatterv: {
        // NCCL has no v calls: one broadcast (or reduce) per rank's block,
        // grouped so that NCCL runs them together.
        const size_t es = zpTypeSize(a.dtype);
        int n = 0, me = 0;
        ncclCommCount(comm_, &n);
        ncclCommUserRank(comm_, &me);
        what = a.kind == CollKind::kAllGatherv ? "ncclBroadcast (all-gatherv)" : "ncclReduce (reduce-scatterv)";
        r = ncclGroupStart();
        size_t off = 0;
        for (int p = 0; p < n && r == ncclSuccess; p++) {
          if (a.counts[p] == 0) continue;
          if (a.kind == CollKind::kAllGatherv) {
            char* block = (char*)a.recv + a.displs[p] * es;
            r = ncclBroadcast(p == me ? a.send : block, block, a.counts[p], dt, p, comm_, stream);
          } else {
            r = ncclReduce((const char*)a.send + off * es, p == me ? a.recv : nullptr, a.counts[p], dt, op, p,
                           comm_, stream);
          }
          off += a.counts[p];
        }
        ncclResult_t end = ncclGroupEnd();  // closed whatever happened inside it
        if (r == ncclSuccess) r = end;
        break;
      }
      case CollKind::kBarrier: return zpSuccess;
    }
    if (r == ncclInProgress) r = settle(comm_, nowMs() + timeoutMs_);
    return r == ncclSuccess ? zpSuccess : ncclFailure(what, r, comm_);
  }

  // Eager calls share one staging buffer from ncclMemAlloc (memory NCCL can
  // register for its transports), grown by doubling; a call waits for the
  // previous user's event, on the device. A smaller buffer it replaces may
  // still be in use by work queued earlier: it is freed at close, after that
  // work. A call captured in a CUDA graph cannot allocate with ncclMemAlloc
  // nor wait for an event recorded outside the capture: it gets stream-
  // ordered memory of its own instead (cudaMallocAsync, graph memory), freed
  // in stream order at its end.
  zpResult_t acquireStaging(size_t bytes, void* streamHandle, void** buf) override {
    if (!comm_) return fail(zpInvalidUsage, "the device communicator was closed");
    DeviceScope scope(device_);
    cudaStream_t stream = (cudaStream_t)streamHandle;
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cudaError_t e = cudaStreamIsCapturing(stream, &capture);
    if (e != cudaSuccess) return fail(zpUnhandledCudaError, "cudaStreamIsCapturing: %s", cudaGetErrorString(e));
    if (capture != cudaStreamCaptureStatusNone) {
      if ((e = cudaMallocAsync(buf, bytes, stream)) != cudaSuccess)
        return fail(zpUnhandledCudaError, "cudaMallocAsync(%zu bytes of staging): %s", bytes, cudaGetErrorString(e));
      return zpSuccess;
    }
    if (!stagingFree_) {
      e = cudaEventCreateWithFlags(&stagingFree_, cudaEventDisableTiming);
      if (e != cudaSuccess) {
        stagingFree_ = nullptr;
        return fail(zpUnhandledCudaError, "cudaEventCreate (staging): %s", cudaGetErrorString(e));
      }
    }
    if (bytes > stagingBytes_) {
      size_t want = std::max(bytes, 2 * stagingBytes_);
      void* p = nullptr;
      ncclResult_t r = ncclMemAlloc(&p, want);
      if (r != ncclSuccess) return ncclFailure(strprintf("ncclMemAlloc(%zu bytes of staging)", want).c_str(), r, comm_);
      if (staging_) retired_.push_back(staging_);
      staging_ = p;
      stagingBytes_ = want;
    }
    // After the previous user (perhaps on another stream) is done with it.
    if (stagingUsed_ && (e = cudaStreamWaitEvent(stream, stagingFree_, 0)) != cudaSuccess)
      return fail(zpUnhandledCudaError, "cudaStreamWaitEvent (staging): %s", cudaGetErrorString(e));
    *buf = staging_;
    return zpSuccess;
  }

  zpResult_t releaseStaging(void* streamHandle, void* buf) override {
    DeviceScope scope(device_);
    cudaStream_t stream = (cudaStream_t)streamHandle;
    if (buf != staging_) {  // a captured call's own
      cudaError_t e = cudaFreeAsync(buf, stream);
      return e == cudaSuccess ? zpSuccess : fail(zpUnhandledCudaError, "cudaFreeAsync (staging): %s", cudaGetErrorString(e));
    }
    cudaError_t e = cudaEventRecord(stagingFree_, stream);
    if (e != cudaSuccess) return fail(zpUnhandledCudaError, "cudaEventRecord (staging): %s", cudaGetErrorString(e));
    stagingUsed_ = true;
    return zpSuccess;
  }

  zpResult_t asyncError(std::string* why) override {
    if (!comm_) return zpSuccess;
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
    if (r == ncclSuccess) r = state;
    if (r == ncclSuccess || r == ncclInProgress) return zpSuccess;
    *why = strprintf("NCCL: %s: %s", ncclGetErrorString(r), ncclGetLastError(comm_));
    return fromNccl(r);
  }

  void close(bool abort) override {
    if (!comm_) return;
    DeviceScope scope(device_);
    if (!abort) {
      // Finalize waits for the queued work; a peer that never comes makes it
      // time out, and then the communicator is aborted instead.
      ncclResult_t r = ncclCommFinalize(comm_);
      if (r == ncclInProgress || r == ncclSuccess) r = settle(comm_, nowMs() + timeoutMs_);
      if (r != ncclSuccess) {
        ZP_WARN(kSubInit, "NCCL finalize: %s (%s): aborting the NCCL communicator", ncclGetErrorString(r),
                ncclGetLastError(comm_));
        abort = true;
      }
    }
    ncclResult_t r = abort ? ncclCommAbort(comm_) : ncclCommDestroy(comm_);
    if (r != ncclSuccess && r != ncclInProgress)
      ZP_WARN(kSubInit, "%s: %s", abort ? "ncclCommAbort" : "ncclCommDestroy", ncclGetErrorString(r));
    comm_ = nullptr;
    // The staging's users were this communicator's ops: done or aborted now.
    if (staging_) retired_.push_back(staging_);
    for (void* p : retired_) ncclMemFree(p);
    retired_.clear();
    staging_ = nullptr;
    stagingBytes_ = 0;
    if (stagingFree_) cudaEventDestroy(stagingFree_);
    stagingFree_ = nullptr;
  }

  void* native() override { return comm_; }
  int device() const override { return device_; }
  std::string describe() const override {
    int v = 0;
    ncclGetVersion(&v);
    return strprintf("NCCL %d.%d.%d on device %d", v / 10000, v / 100 % 100, v % 100, device_);
  }

 private:
  ncclComm_t comm_;
  int device_;
  int timeoutMs_;
  void* staging_ = nullptr;  // acquireStaging's buffer
  size_t stagingBytes_ = 0;
  std::vector<void*> retired_;         // replaced staging buffers, freed at close
  cudaEvent_t stagingFree_ = nullptr;  // recorded where the staging's last user is done
  bool stagingUsed_ = false;
};

// addDeviceInitHook: the hooks, and the devices whose first communicator in
// this process has run them. The lock is held while hooks run, so that a
// second communicator on a device waits until its first one's hooks are done.
// Made at first use: hooks are added from other files' static initializers.
struct DeviceInit {
  std::mutex mu;
  std::vector<void (*)(int)> hooks;
  std::set<int> devices;
};
DeviceInit& deviceInit() {
  static DeviceInit& d = *new DeviceInit;  // never destroyed: comms may be made during exit
  return d;
}

// Runs the hooks if this is the device's first communicator (device current).
void runDeviceInitHooks(int device) {
  DeviceInit& d = deviceInit();
  std::lock_guard<std::mutex> l(d.mu);
  if (!d.devices.insert(device).second) return;
  for (auto hook : d.hooks) hook(device);
}

}  // namespace

zpResult_t addDeviceInitHook(void (*hook)(int)) {
  if (!hook) return fail(zpInvalidArgument, "zpAddDeviceInitHook: hook is NULL");
  DeviceInit& d = deviceInit();
  std::lock_guard<std::mutex> l(d.mu);
  d.hooks.push_back(hook);
  for (int device : d.devices) {
    DeviceScope scope(device);
    hook(device);
  }
  return zpSuccess;
}

bool deviceUsable(std::string* why) {
  if (envString("ZP_CUDA_DEVICE", "local") == "none") {
    *why = "ZP_CUDA_DEVICE=none";
    return false;
  }
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) {
    cudaGetLastError();
    *why = strprintf("cudaGetDeviceCount: %s", cudaGetErrorString(e));
    return false;
  }
  if (count == 0) {
    *why = "no CUDA device is visible";
    return false;
  }
  return true;
}

zpResult_t chooseDevice(int localRank, int* device) {
  const std::string choice = envString("ZP_CUDA_DEVICE", "local");
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return fail(zpUnhandledCudaError, "cudaGetDeviceCount: %s", cudaGetErrorString(e));
  long long ordinal = 0;
  if (choice == "local") {
    ordinal = localRank % count;
  } else if (choice == "current") {
    int current = 0;
    if ((e = cudaGetDevice(&current)) != cudaSuccess)
      return fail(zpUnhandledCudaError, "cudaGetDevice: %s", cudaGetErrorString(e));
    ordinal = current;
  } else if (!parseInt(choice, 0LL, (long long)count - 1, &ordinal)) {
    return fail(zpInvalidArgument, "ZP_CUDA_DEVICE='%s': expected local, current, none or a device in 0..%d",
                choice.c_str(), count - 1);
  }
  *device = (int)ordinal;
  return zpSuccess;
}

zpResult_t makeNcclId(std::string* id) {
  ncclUniqueId u;
  ncclResult_t r = ncclGetUniqueId(&u);
  if (r != ncclSuccess) return ncclFailure("ncclGetUniqueId", r, nullptr);
  id->assign(u.internal, sizeof(u.internal));
  return zpSuccess;
}

zpResult_t createNcclTransport(const std::string& id, int nranks, int rank, int device, int timeoutMs,
                               std::unique_ptr<StreamTransport>* out) {
  ncclUniqueId u;
  if (id.size() != sizeof(u.internal)) return fail(zpInternalError, "an NCCL id of %zu bytes", id.size());
  memcpy(u.internal, id.data(), sizeof(u.internal));
  DeviceScope scope(device);
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device) {
    cudaGetLastError();
    return fail(zpUnhandledCudaError, "rank %d: cannot use CUDA device %d", rank, device);
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, nranks, u, rank, &config);
  if ((r == ncclSuccess || r == ncclInProgress) && comm) r = settle(comm, nowMs() + timeoutMs);
  if (r != ncclSuccess) {
    zpResult_t res = ncclFailure(strprintf("rank %d: ncclCommInitRank on device %d", rank, device).c_str(), r, comm);
    if (comm) ncclCommAbort(comm);
    return res;
  }
  runDeviceInitHooks(device);
  out->reset(new NcclTransport(comm, device, timeoutMs));
  ZP_INFO(kSubInit, "rank %d: device data plane: %s", rank, (*out)->describe().c_str());
  return zpSuccess;
}

}  // namespace zp
