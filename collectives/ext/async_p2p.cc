#include "collectives/ext/async_p2p.h"

#include "collectives/ext/ext.h"

namespace zpx {

AsyncP2P::AsyncP2P(zpComm_t comm) : comm_(comm) { worker_ = std::thread([this] { loop(); }); }

AsyncP2P::~AsyncP2P() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return !pending_; });
    stop_ = true;
    cv_.notify_all();
  }
  worker_.join();
}

// The ops as one group: on the host (stream NULL), or enqueued on a stream.
zpResult_t AsyncP2P::runGroup(const std::vector<P2POp>& ops, zpStream_t stream) {
  zpGroupStart();
  for (const P2POp& op : ops) {
    if (op.send)
      zpSend(op.buf, op.bytes, zpUint8, op.peer, comm_, stream);
    else
      zpRecv(op.buf, op.bytes, zpUint8, op.peer, comm_, stream);
  }
  return zpGroupEnd();
}

void AsyncP2P::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return pending_ || stop_; });
    if (stop_) return;
    std::vector<P2POp> ops = ops_;
    lock.unlock();
    zpResult_t r = runGroup(ops, nullptr);
    std::string why = r == zpSuccess ? "" : zpGetLastError(comm_);
    lock.lock();
    result_ = r;
    error_ = why;
    pending_ = false;
    cv_.notify_all();
  }
}

zpResult_t AsyncP2P::start(std::vector<P2POp> ops, const char* fn, zpStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (started_) return zpSetLastError(comm_, zpInvalidUsage, "%s: the previous exchange was not waited for", fn);
  if (stream) {
    // Device buffers: the group is enqueued on the stream right here, and
    // the stream orders its completion; wait only reports the enqueueing.
    // Every buffer is checked first, so that no call of the group is refused
    // while the others run.
    for (const P2POp& op : ops)
      if (op.buf) ZPX_CHECK(zpCommCheckBuffer(comm_, op.buf, stream));
    result_ = runGroup(ops, stream);
    error_ = result_ == zpSuccess ? "" : zpGetLastError(comm_);
    started_ = true;
    return zpSuccess;
  }
  ops_ = std::move(ops);
  pending_ = started_ = true;
  cv_.notify_all();
  return zpSuccess;
}

bool AsyncP2P::finished() {
  std::lock_guard<std::mutex> lock(mu_);
  return started_ && !pending_;
}

zpResult_t AsyncP2P::wait(const char* fn) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!started_) return zpSetLastError(comm_, zpInvalidUsage, "%s: no exchange was started", fn);
  cv_.wait(lock, [&] { return !pending_; });
  started_ = false;
  if (result_ != zpSuccess) return zpSetLastError(comm_, result_, "%s: %s", fn, error_.c_str());
  return zpSuccess;
}

void AsyncP2P::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !pending_; });
  started_ = false;
}

}  // namespace zpx
