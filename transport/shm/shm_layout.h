// The layout of a shared-memory segment and its message records, shared
// by the transport's setup (shm_segment.cc) and its data path
// (shm_transport.cc). Internal to the shared-memory transport.
#pragma once

#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "transport/shm/shm_transport.h"

namespace zp {

constexpr uint64_t kSegMagic = 0x5a50534547000001ull;
constexpr uint64_t kProbeValue = 0x70726f6265a5a5a5ull;
constexpr int kMaxLocal = 256;
constexpr uint64_t kCtrlRingBytes = 64 << 10;
constexpr uint64_t kRecord = 64;  // records are multiples of this


struct alignas(64) RingCtl {
  alignas(64) std::atomic<uint64_t> head;  // written by the producer
  alignas(64) std::atomic<uint64_t> tail;  // written by the consumer
  alignas(64) std::atomic<uint32_t> producerWaiting;
};

struct SegHeader {
  uint64_t magic;
  uint32_t nlocal;
  std::atomic<uint32_t> ready;
  uint64_t ringBytes;
  uint64_t ownerBase;  // where the owner mapped this segment (for the cma probe)
  uint64_t probe;
  alignas(64) std::atomic<uint32_t> doorbell;
  alignas(64) std::atomic<uint32_t> sleeping;  // threads of the owner asleep on the doorbell
  alignas(64) std::atomic<uint64_t> netQueued;
  alignas(64) std::atomic<uint8_t> mappedBy[kMaxLocal];  // local rank i has mapped this segment
  uint8_t cmaOkFrom[kMaxLocal];  // the owner can read local rank i's memory
  // What the owner sends to local rank i by single copy (an RTS): messages
  // from eagerBytes on when cmaTo[i] (its protocol choice, made at init).
  uint64_t eagerBytes;
  std::atomic<uint8_t> cmaTo[kMaxLocal];
  // The owner's init failed after it made this segment: why (failedWhy
  // first, then failed), for the peers waiting for it to map theirs.
  std::atomic<uint32_t> failed;
  char failedWhy[512];
};

enum MsgType : uint32_t { kPad = 1, kData, kRts, kMeta, kFin, kStatus, kBye, kAbort };

struct MsgHdr {
  uint32_t type;
  uint32_t len;     // payload bytes after the header (pad: bytes to skip, header included)
  uint64_t seq;     // the op's position among this pair's messages
  uint64_t total;   // the whole message's bytes
  uint64_t offset;  // data: where this fragment goes
  uint64_t addr;    // rts: the sender's buffer
  int32_t status;   // fin / status: a zpResult_t
  uint32_t kind;    // OpKind
  uint64_t collSeq;
  uint32_t lane;    // fin: the lane of the send it completes
};
static_assert(sizeof(MsgHdr) <= kRecord, "header must fit one record");

inline uint64_t roundRecord(uint64_t n) { return (n + kRecord - 1) & ~(kRecord - 1); }

inline size_t segmentBytes(uint32_t nlocal, uint64_t ringBytes) {
  size_t hdr = roundRecord(sizeof(SegHeader));
  return hdr + nlocal * ((kLanes + 1) * sizeof(RingCtl) + kLanes * ringBytes + kCtrlRingBytes);
}

// Rings for writer slot `slot` inside a segment mapped at base: one per lane,
// then the control ring. in: the reader's side of the lanes, else the writer's.
inline void locateRings(void* base, uint32_t nlocal, uint64_t ringBytes, int slot, Lane* lanes, bool in, Ring* ctrl) {
  char* p = (char*)base + roundRecord(sizeof(SegHeader));
  RingCtl* ctls = (RingCtl*)p + slot * (kLanes + 1);
  char* buf = p + nlocal * (kLanes + 1) * sizeof(RingCtl) + slot * (kLanes * ringBytes + kCtrlRingBytes);
  for (int l = 0; l < kLanes; l++) {
    Ring& r = in ? lanes[l].in : lanes[l].out;
    r.ctl = &ctls[l];
    r.buf = buf + l * ringBytes;
    r.cap = ringBytes;
  }
  ctrl->ctl = &ctls[kLanes];
  ctrl->buf = buf + kLanes * ringBytes;
  ctrl->cap = kCtrlRingBytes;
}

// Producer: room for a record of `bytes` (a multiple of kRecord, at most
// cap/2), contiguous; records never wrap, a pad fills the end instead.
inline MsgHdr* ringClaim(Ring& r, uint64_t bytes) {
  uint64_t head = r.ctl->head.load(std::memory_order_relaxed);
  uint64_t tail = r.ctl->tail.load(std::memory_order_acquire);
  uint64_t pos = head & (r.cap - 1);
  uint64_t pad = (r.cap - pos < bytes) ? r.cap - pos : 0;
  if (pad + bytes > r.cap - (head - tail)) return nullptr;
  if (pad) {
    MsgHdr* h = (MsgHdr*)(r.buf + pos);
    h->type = kPad;
    h->len = (uint32_t)pad;
    head += pad;
    pos = 0;
  }
  r.pendingHead = head + bytes;
  return (MsgHdr*)(r.buf + pos);
}

inline void ringPublish(Ring& r) { r.ctl->head.store(r.pendingHead, std::memory_order_release); }

// Claims a record of `bytes` and fills the header fields every op's record has.
inline MsgHdr* claimOpRecord(Ring& r, uint64_t bytes, uint32_t type, const Op* op) {
  MsgHdr* h = ringClaim(r, bytes);
  if (!h) return nullptr;
  memset(h, 0, sizeof(MsgHdr));
  h->type = type;
  h->seq = op->seq;
  h->total = op->bytes;
  h->kind = (uint32_t)op->kind;
  return h;
}

// Consumer: the next record, or null.
inline MsgHdr* ringPeek(Ring& r) {
  for (;;) {
    uint64_t tail = r.ctl->tail.load(std::memory_order_relaxed);
    uint64_t head = r.ctl->head.load(std::memory_order_acquire);
    if (head == tail) return nullptr;
    MsgHdr* h = (MsgHdr*)(r.buf + (tail & (r.cap - 1)));
    if (h->type != kPad) return h;
    r.ctl->tail.store(tail + h->len, std::memory_order_release);
  }
}

// Consumer: frees the record; true if the producer is waiting for room.
inline bool ringPop(Ring& r, const MsgHdr* h) {
  uint64_t tail = r.ctl->tail.load(std::memory_order_relaxed);
  r.ctl->tail.store(tail + kRecord + roundRecord(h->len), std::memory_order_release);
  if (r.ctl->producerWaiting.load(std::memory_order_acquire)) {
    r.ctl->producerWaiting.store(0, std::memory_order_relaxed);
    return true;
  }
  return false;
}

inline long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, (uint32_t*)addr, op, val, ts, nullptr, 0);
}

inline int pidfdOpen(pid_t pid) { return (int)syscall(SYS_pidfd_open, pid, 0); }

// Whether a peer process has exited: its pidfd is readable, or (no pidfd:
// it was gone, and reaped, before this rank could open one, or the kernel
// has no pidfd_open) no process has its pid any more.
inline bool processExited(pid_t pid, int pidfd) {
  if (pidfd >= 0) {
    pollfd pf = {pidfd, POLLIN, 0};
    return poll(&pf, 1, 0) > 0;
  }
  return kill(pid, 0) != 0 && errno == ESRCH;
}

inline std::vector<char> makeRecord(uint32_t type, uint64_t seq, int32_t status, uint64_t collSeq,
                             const std::string& text = {}, uint32_t lane = 0) {
  size_t len = std::min<size_t>(text.size(), 512);
  std::vector<char> rec(kRecord + roundRecord(len), 0);
  MsgHdr* h = (MsgHdr*)rec.data();
  h->type = type;
  h->len = (uint32_t)len;
  h->seq = seq;
  h->status = status;
  h->collSeq = collSeq;
  h->lane = lane;
  memcpy(rec.data() + kRecord, text.data(), len);
  return rec;
}

// Single copy: len bytes at address `from` of process pid into to, over
// short reads; 0 or the errno.
inline int readPeer(pid_t pid, void* to, uint64_t from, size_t len) {
  for (size_t got = 0; got < len;) {
    iovec liov = {(char*)to + got, len - got};
    iovec riov = {(void*)(uintptr_t)(from + got), len - got};
    const ssize_t n = process_vm_readv(pid, &liov, 1, &riov, 1, 0);
    if (n <= 0) return n < 0 ? errno : EIO;
    got += (size_t)n;
  }
  return 0;
}

}  // namespace zp
