// Data checks shared by the gtest suite and by standalone test programs
// (zp_env_rank, started by launchers): no GoogleTest in here. Every check
// returns a description of what went wrong, or "" when all is well.
//
// Messages carry a pattern that depends on (seed, source, destination, byte
// index), so a byte that lands in the wrong place, from the wrong peer or from
// an earlier call is caught. Receive buffers are poisoned before each call and
// surrounded by guard regions; bytes outside the receive ranges must keep the
// poison.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "include/zeppelin.h"

namespace zptest {

constexpr uint8_t kPoison = 0xA5;
constexpr size_t kGuardBytes = 256;

// The byte that element byte `i` of the message from src to dst carries.
inline uint8_t patternByte(uint64_t seed, int src, int dst, size_t i) {
  uint64_t x = seed ^ ((uint64_t)src << 48) ^ ((uint64_t)dst << 32) ^ (i * 0x9E3779B97F4A7C15ull);
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return (uint8_t)x;
}

inline void fillPattern(uint8_t* p, size_t bytes, uint64_t seed, int src, int dst) {
  for (size_t i = 0; i < bytes; i++) p[i] = patternByte(seed, src, dst, i);
}

// Bytes of p[0, bytes) that differ from the pattern.
inline size_t wrongPatternBytes(const uint8_t* p, size_t bytes, uint64_t seed, int src, int dst) {
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; i++) wrong += p[i] != patternByte(seed, src, dst, i);
  return wrong;
}

// Bytes of p[0, bytes) that are not the poison.
inline size_t unpoisonedBytes(const uint8_t* p, size_t bytes) {
  size_t n = 0;
  for (size_t i = 0; i < bytes; i++) n += p[i] != kPoison;
  return n;
}

// A buffer of `bytes` (possibly 0) poisoned throughout, with guard regions on
// both sides and its start `misalign` bytes past an aligned address.
class GuardedBuffer {
 public:
  explicit GuardedBuffer(size_t bytes, size_t misalign = 0)
      : bytes_(bytes), offset_(kGuardBytes + misalign), storage_(bytes + 2 * kGuardBytes + misalign, kPoison) {}
  uint8_t* data() { return storage_.data() + offset_; }
  const uint8_t* data() const { return storage_.data() + offset_; }
  size_t size() const { return bytes_; }
  void poison() { memset(storage_.data(), kPoison, storage_.size()); }
  // The whole storage (guards included) and where the buffer starts in it:
  // to mirror it into device memory and back.
  std::vector<uint8_t>& storage() { return storage_; }
  size_t offset() const { return offset_; }
  void fill(uint64_t seed, int src, int dst) { fillPattern(data(), bytes_, seed, src, dst); }
  size_t wrongBytes(uint64_t seed, int src, int dst) const { return wrongPatternBytes(data(), bytes_, seed, src, dst); }
  // Bytes of the buffer itself that were written (it must still be all poison).
  size_t writtenBytes() const { return unpoisonedBytes(data(), bytes_); }
  // Bytes of the guard regions (and the misalignment gap) that were written.
  size_t guardBytesWritten() const {
    return unpoisonedBytes(storage_.data(), offset_) +
           unpoisonedBytes(storage_.data() + offset_ + bytes_, storage_.size() - offset_ - bytes_);
  }

 private:
  size_t bytes_, offset_;
  std::vector<uint8_t> storage_;
};

using CountMatrix = std::vector<std::vector<size_t>>;  // [src][dst], in elements

// A counts matrix from one seed: every rank computes the same one.
inline CountMatrix randomCounts(int n, uint64_t seed, size_t maxCount, double zeroFraction) {
  std::mt19937_64 rng(seed);
  CountMatrix c(n, std::vector<size_t>(n));
  for (auto& row : c)
    for (auto& v : row) v = (std::uniform_real_distribution<>(0, 1)(rng) < zeroFraction) ? 0 : rng() % (maxCount + 1);
  return c;
}

inline CountMatrix uniformCounts(int n, size_t count) { return CountMatrix(n, std::vector<size_t>(n, count)); }

// One rank's side of one zpAlltoallv: buffers laid out with random gaps
// between the ranges (so ranges start at odd element offsets), both buffers
// starting at odd addresses, the send data filled with the pattern, the
// receive buffer poisoned with guard regions around it. sendCounts and
// recvCounts need not agree with the peers' (for mismatch tests).
class AlltoallvRun {
 public:
  AlltoallvRun(int rank, int n, const std::vector<size_t>& sendCounts, const std::vector<size_t>& recvCounts,
               zpDataType_t dt, uint64_t seed)
      : rank_(rank), n_(n), ts_(zpTypeSize(dt)), dt_(dt), seed_(seed), sc_(sendCounts), rc_(recvCounts),
        sd_(n), rd_(n) {
    std::mt19937_64 rng(seed * 7919 + rank);
    size_t sendTotal = 0, recvTotal = 0;
    for (int p = 0; p < n; p++) {
      sd_[p] = sendTotal + rng() % 3;
      sendTotal = sd_[p] + sc_[p];
      rd_[p] = recvTotal + rng() % 3;
      recvTotal = rd_[p] + rc_[p];
    }
    send_.reset(new GuardedBuffer(sendTotal * ts_, 1 + rng() % 7));
    recv_.reset(new GuardedBuffer(recvTotal * ts_, 1 + rng() % 7));
    for (int p = 0; p < n; p++) fillPattern(send_->data() + sd_[p] * ts_, sc_[p] * ts_, seed_, rank_, p);
    sendCopy_.assign(send_->data(), send_->data() + send_->size());
  }
  // From a matrix: this rank sends row `rank` and receives column `rank`.
  AlltoallvRun(int rank, const CountMatrix& m, zpDataType_t dt, uint64_t seed)
      : AlltoallvRun(rank, (int)m.size(), m[rank], column(m, rank), dt, seed) {}

  zpResult_t run(zpComm_t comm) {
    recv_->poison();
    return zpAlltoallv(send_->data(), sc_.data(), sd_.data(), recv_->data(), rc_.data(), rd_.data(), dt_, comm,
                       nullptr);
  }

  // New send data from another seed, in the same layout (counts and
  // displacements unchanged), and the receive buffer poisoned: a call
  // captured once and replayed moves fresh bytes.
  void refill(uint64_t seed) {
    seed_ = seed;
    for (int p = 0; p < n_; p++) fillPattern(send_->data() + sd_[p] * ts_, sc_[p] * ts_, seed_, rank_, p);
    sendCopy_.assign(send_->data(), send_->data() + send_->size());
    recv_->poison();
  }

  // The buffers and arguments, for a caller that runs the call itself (on device memory).
  GuardedBuffer& sendBuffer() { return *send_; }
  GuardedBuffer& recvBuffer() { return *recv_; }
  const size_t* sendCounts() const { return sc_.data(); }
  const size_t* sendDispls() const { return sd_.data(); }
  const size_t* recvCounts() const { return rc_.data(); }
  const size_t* recvDispls() const { return rd_.data(); }
  zpDataType_t dtype() const { return dt_; }

  // Bytes of the receive range for peer p that differ from what p sends.
  size_t wrongBytesFrom(int p) const {
    return wrongPatternBytes(recv_->data() + rd_[p] * ts_, rc_[p] * ts_, seed_, p, rank_);
  }
  // Bytes outside every receive range (the gaps and the guards) that were written.
  size_t bytesWrittenOutsideRanges() const {
    std::vector<bool> inRange(recv_->size(), false);
    for (int p = 0; p < n_; p++)
      for (size_t i = 0; i < rc_[p] * ts_; i++) inRange[rd_[p] * ts_ + i] = true;
    size_t n = recv_->guardBytesWritten();
    for (size_t i = 0; i < inRange.size(); i++) n += !inRange[i] && recv_->data()[i] != kPoison;
    return n;
  }
  bool sendBufferUnchanged() const {
    // (memcmp of an empty copy: its data() may be NULL, which memcmp may not take)
    return (sendCopy_.empty() || memcmp(sendCopy_.data(), send_->data(), sendCopy_.size()) == 0) &&
           send_->guardBytesWritten() == 0;
  }

  // After a successful call: everything received right, nothing else touched.
  std::string check() const {
    std::string err;
    for (int p = 0; p < n_; p++)
      if (size_t w = wrongBytesFrom(p))
        err += "rank " + std::to_string(rank_) + ": " + std::to_string(w) + " of " + std::to_string(rc_[p] * ts_) +
               " bytes from rank " + std::to_string(p) + " are wrong; ";
    if (size_t w = bytesWrittenOutsideRanges())
      err += "rank " + std::to_string(rank_) + ": " + std::to_string(w) + " bytes outside the receive ranges written; ";
    if (!sendBufferUnchanged()) err += "rank " + std::to_string(rank_) + ": the send buffer changed; ";
    return err;
  }

 private:
  static std::vector<size_t> column(const CountMatrix& m, int c) {
    std::vector<size_t> v;
    for (auto& row : m) v.push_back(row[c]);
    return v;
  }
  int rank_, n_;
  size_t ts_;
  zpDataType_t dt_;
  uint64_t seed_;
  std::vector<size_t> sc_, rc_, sd_, rd_;
  std::unique_ptr<GuardedBuffer> send_, recv_;
  std::vector<uint8_t> sendCopy_;
};

// Runs one checked alltoallv; "" if it succeeded and every byte is right.
inline std::string alltoallvError(zpComm_t comm, int rank, const CountMatrix& counts, zpDataType_t dt, uint64_t seed) {
  AlltoallvRun run(rank, counts, dt, seed);
  zpResult_t r = run.run(comm);
  if (r != zpSuccess)
    return "rank " + std::to_string(rank) + ": zpAlltoallv returned " + zpGetErrorString(r) + ": " +
           zpGetLastError(comm);
  return run.check();
}

}  // namespace zptest
