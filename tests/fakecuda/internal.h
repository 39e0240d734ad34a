// Internals shared by the runtime (runtime.cc) and NCCL (nccl.cc) halves of
// the double. Nothing here is exported.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#define FAKECUDA_API extern "C" __attribute__((visibility("default")))

namespace fakecuda {

// A message on stderr, prefixed so that a test's log says who spoke.
void complain(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
[[noreturn]] void die(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

long envLong(const char* name, long dflt);

struct Stream;
using StreamPtr = std::shared_ptr<Stream>;

// "This work may start only when stream s has completed its first seq items."
struct Dep {
  StreamPtr s;
  uint64_t seq;
};

struct Work {
  std::function<cudaError_t()> fn;
  std::vector<Dep> deps;
  bool kernel = false;  // fakecudaAlias is allowed while it runs
  bool noFail = false;  // bookkeeping (event records): never the target of an injected error
};

struct Stream {
  int device = 0;
  unsigned flags = 0;
  bool legacy = false;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Work> queue;
  uint64_t enqueued = 0;   // items ever enqueued
  uint64_t completed = 0;  // items finished (run, skipped or failed)
  cudaError_t error = cudaSuccess;   // sticky once set
  cudaError_t inject = cudaSuccess;  // fails the next item that runs
  unsigned fixedDelayUs = 0;
  bool stopping = false;
  std::mt19937_64 rng;
};

// The stream a handle names (0/cudaStreamLegacy/cudaStreamPerThread on the
// calling thread's current device), or nullptr with *err set.
StreamPtr resolveStream(cudaStream_t handle, cudaError_t* err);
// Appends work (adding the legacy stream's implicit dependencies); returns
// its sequence number.
uint64_t enqueue(const StreamPtr& s, Work w);
// Blocks until the stream has completed item seq.
void waitFor(const StreamPtr& s, uint64_t seq);

int currentDevice();

// What a pointer is, for copies and NCCL buffer checks.
enum class MemKind { Unregistered, Device, Pinned };
struct PtrInfo {
  MemKind kind = MemKind::Unregistered;
  int device = -1;
  char* base = nullptr;   // allocation start (device address)
  size_t size = 0;        // allocation size
  char* alias = nullptr;  // read-write alias of base (== base for pinned)
};
// Classifies p; for device/pinned memory also fills base/size/alias.
PtrInfo lookup(const void* p);
// The alias of [p, p+n) if it lies inside one live allocation, nullptr
// otherwise (with *why filled). For use when work runs.
char* aliasOf(const void* p, size_t n, std::string* why);

cudaError_t deviceMalloc(void** p, size_t size, const char* who);
cudaError_t deviceFree(void* p, const char* who);

// Sets the calling thread's last error when err is one; returns err.
cudaError_t record(cudaError_t err);

}  // namespace fakecuda
