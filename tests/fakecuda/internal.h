// What the double's CUDA runtime (runtime.cc) and NCCL (nccl.cc) share:
// streams with a thread each, the work items they run, and device memory.
#pragma once

#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace fakecuda {

struct Stream;
struct Capture;

// What an item runs: a fresh function for each run. A stream item builds it
// once; a graph node keeps the maker and builds it again at every launch (so
// NCCL operations get new sequence numbers at each launch, as a graph's NCCL
// kernels match their peers' at every launch). Called with lock() held.
using RunFn = std::function<cudaError_t()>;
using MakeRun = std::function<RunFn()>;

// A point in a stream's order: done once `ticket` items of it have completed.
struct Dep {
  std::shared_ptr<Stream> stream;
  uint64_t ticket;
};

// One piece of work on a stream: it runs on the stream's thread, after every
// earlier item of the stream and after its deps.
struct Item {
  std::vector<Dep> deps;
  std::function<cudaError_t()> run;
};

struct Stream {
  int device = 0;
  bool legacy = false;    // the NULL stream / cudaStreamLegacy of its device
  bool blocking = true;   // synchronises with the legacy stream (no cudaStreamNonBlocking)
  std::deque<Item> queue;
  uint64_t enqueued = 0, completed = 0;  // items so far
  cudaError_t error = cudaSuccess;      // the first failure, reported once by a synchronisation
  cudaError_t injected = cudaSuccess;   // the next item fails with this
  bool stop = false;
  std::thread thread;
  // Stream capture (cudaStreamBeginCapture, or joined by waiting on an event
  // recorded in a capture): work goes into the capture's graph, not onto the
  // queue; `tail` is the nodes the next captured node depends on.
  std::shared_ptr<Capture> capture;
  std::vector<size_t> tail;
};

// One lock and one condition for all streams, events and completions: the
// double is about order, not speed.
std::mutex& lock();
std::condition_variable& changed();

// The stream behind a handle (0, cudaStreamLegacy, cudaStreamPerThread or
// one made by cudaStreamCreate); null if the handle is not a live stream.
std::shared_ptr<Stream> streamOf(cudaStream_t handle);
// Appends an item, with CUDA's implicit order between the legacy stream and
// blocking streams; returns the item's ticket. Call with lock() held.
uint64_t enqueueLocked(const std::shared_ptr<Stream>& s, Item item);
uint64_t enqueue(const std::shared_ptr<Stream>& s, Item item);
// Work for a stream as the CUDA API sees it: enqueued (make() is called at
// once), or recorded as a node of the graph the stream is capturing. Fails as
// CUDA does: cudaErrorStreamCaptureInvalidated on a capture that an earlier
// error invalidated, cudaErrorStreamCaptureImplicit for the legacy stream
// while a blocking stream of its device is capturing (which invalidates that
// capture). On a stream that is not capturing, the item also waits for
// `after`, and `*done` (if given) gets the point where it has completed; on a
// capturing stream `after` is not used and done->stream is left null. Call
// with lock() held.
cudaError_t submitLocked(const std::shared_ptr<Stream>& s, MakeRun make, std::vector<Dep> after = {},
                         Dep* done = nullptr);
// True once every dep has completed. Call with lock() held.
bool depsDone(const std::vector<Dep>& deps);

// Device memory: the alias (read-write) of [p, p + bytes) if that range lies
// inside one device allocation, else null. *device gets its device.
void* deviceAlias(const void* p, size_t bytes, int* device = nullptr);
bool isDevicePointer(const void* p, int* device = nullptr);
void* allocDevice(size_t bytes, int device);
bool freeDevice(void* p);

// Whether a "potentially unsafe" call (an allocation, a synchronisation)
// may be made now, by CUDA's capture rules; if not, the captures it breaks
// are invalidated and the error is cudaErrorStreamCaptureUnsupported.
cudaError_t captureUnsafe(const char* what);

// The calling thread's device and its sticky-until-read error.
int currentDevice();
cudaError_t setError(cudaError_t e);
// Every runtime entry point first: cudaErrorInitializationError in a child
// of fork() whose parent had used CUDA, else cudaSuccess.
cudaError_t enterRuntime();

// Environment knobs, read once.
int envInt(const char* name, int dflt);

// Counts one wait of a host thread for device work (fakecudaHostWaits): the
// runtime's synchronisations, and NCCL's enqueue calls that block on a full
// work queue (nccl.cc).
void countHostWait();

}  // namespace fakecuda
