// A grouped set of sends and receives run by a worker thread, so that the
// caller computes while the bytes move (rings, the attention driver).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "include/zeppelin.h"

namespace zpx {

struct P2POp {
  bool send = false;
  void* buf = nullptr;
  size_t bytes = 0;
  int peer = -1;
};

class AsyncP2P {
 public:
  explicit AsyncP2P(zpComm_t comm);
  ~AsyncP2P();  // the group in flight finishes first
  AsyncP2P(const AsyncP2P&) = delete;
  AsyncP2P& operator=(const AsyncP2P&) = delete;

  // Hands the ops to the worker, which runs them as one zpGroupStart/End;
  // with a stream (device buffers), enqueues the group on it at once.
  // zpInvalidUsage if the previous group was not waited for.
  zpResult_t start(std::vector<P2POp> ops, const char* fn, zpStream_t stream = nullptr);
  bool finished();   // the group started has finished (wait returns at once)
  zpResult_t wait(const char* fn);
  // Waits for the group in flight, if any, leaving the thread's last error
  // alone (on an error path whose own error matters more).
  void drain();

 private:
  void loop();
  zpResult_t runGroup(const std::vector<P2POp>& ops, zpStream_t stream);

  zpComm_t comm_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false, started_ = false, stop_ = false;
  std::vector<P2POp> ops_;
  zpResult_t result_ = zpSuccess;
  std::string error_;
  std::thread worker_;
};

}  // namespace zpx
