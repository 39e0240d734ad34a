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
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "transport/shm/shm_transport.h"

namespace zp {

// The record format's version is in the low bits: ranks of one node must run
// the same format (3: a data record may carry its send's meta, MsgHdr::metaLen;
// 4: SegHeader::owner; 6: kWhole records; 7: SegHeader::cpus; 8: SegHeader::waitCpu).
constexpr uint64_t kSegMagic = 0x5a50534547000008ull;
constexpr uint64_t kProbeValue = 0x70726f6265a5a5a5ull;
constexpr int kMaxLocal = 256;
constexpr uint64_t kCtrlRingBytes = 64 << 10;
// The smallest data ring init shrinks to when /dev/shm is small (ZP_SHM_RING_BYTES' minimum).
constexpr uint64_t kMinShmRingBytes = 64 << 10;
constexpr uint64_t kRecord = 64;  // records are multiples of this

// Copies a message's bytes into or out of a ring record. glibc's memcpy
// (2.36) copies from 2,112 bytes on with `rep movsb` where the CPU reports
// fast strings (`ld.so --list-tunables`: x86_rep_movsb_threshold), and on
// AMD EPYC that copies a ring record slower than memcpy's own vector loop,
// by how the record's payload sits in its lines (docs/benchmarks.md, "Ring
// copies"). So a record of up to kRingCopyPiecesMax bytes is copied in
// pieces of kRingCopyPiece, each below every default threshold of glibc's;
// larger fragments (the copy protocol's, up to 256 KiB) keep memcpy's
// choice, which was as fast or faster there.
constexpr size_t kRingCopyPiece = 2048;
constexpr size_t kRingCopyPiecesMax = 32 << 10;
inline void ringCopy(void* to, const void* from, size_t n) {
  char* d = (char*)to;
  const char* s = (const char*)from;
  if (n <= kRingCopyPiecesMax)
    for (; n > kRingCopyPiece; n -= kRingCopyPiece, d += kRingCopyPiece, s += kRingCopyPiece)
      memcpy(d, s, kRingCopyPiece);
  if (n) memcpy(d, s, n);  // d may be NULL when n is 0
}


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
  uint64_t owner;  // ShmTransport::ownerKey: whose segment of which communicator
  alignas(64) std::atomic<uint32_t> doorbell;
  alignas(64) std::atomic<uint32_t> sleeping;  // threads of the owner asleep on the doorbell
  // Threads of the owner asleep in poll() on its bell socket and another
  // file descriptor (ShmTransport::sleepWith): a writer sends the bell a byte.
  std::atomic<uint32_t> pollers;
  // The CPU the owner last began a wait on among other tasks filling the
  // cores, plus 1 (0: none yet): a peer that waits for it polls only while
  // it is not on that CPU (ShmTransport::peerOnMyCore).
  std::atomic<int32_t> waitCpu;
  uint64_t netns;  // the owner's network namespace (inode) if its bell socket is bound, else 0
  alignas(64) std::atomic<uint64_t> sharedWords[CarrierTransport::kSharedWords];  // ShmTransport::sharedWord
  alignas(64) std::atomic<uint8_t> mappedBy[kMaxLocal];  // local rank i has mapped this segment
  uint8_t cmaOkFrom[kMaxLocal];  // the owner can read local rank i's memory
  // The CPUs the owner may run on (its affinity mask, CPU i at bit i % 64
  // of word i / 64): the node's ranks share the cores of their masks together.
  uint64_t cpus[kCpuMaskWords];
  // What the owner sends to local rank i by single copy (an RTS): messages
  // from eagerBytes on when cmaTo[i] (its protocol choice, made at init).
  uint64_t eagerBytes;
  std::atomic<uint8_t> cmaTo[kMaxLocal];
  // Messages its receiver reduces (Op::reducedByPeer) go through the ring
  // from this size on even where cmaTo[i] (ZP_SHM_REDUCE_COPY), so no
  // reduce group waits for an RTS of them.
  uint64_t reduceCopyFrom;
  // The owner's init failed after it made this segment: why (failedWhy
  // first, then failed), for the peers waiting for it to map theirs.
  std::atomic<uint32_t> failed;
  char failedWhy[512];
};

// kWhole: a data record that carries a whole message (its meta and all its
// data, from offset 0), without the total and offset words a fragment needs:
// its payload starts at kWholePayload.
enum MsgType : uint32_t { kPad = 1, kData, kRts, kMeta, kFin, kStatus, kBye, kAbort, kWhole };

// A record's header; its payload follows at kPayload (kWholePayload for a
// kWhole record), so a whole message of up to 32 bytes is one cache line,
// the line the receiver polls (as Open MPI's fastboxes): a small message
// costs the receiver one line from the sender's cache, and nothing else
// moves between them. A second line cost a 2-rank 24-byte send/recv about a
// third of its latency.
struct MsgHdr {
  // The record's position in the ring plus one, stored last (release): the
  // reader knows a record is complete from it, without reading the ring's
  // head, a second line. No stale word can match: a record's first line
  // held either an older record's header, whose stamp is a lap or more
  // behind, or payload, whose first words the reader zeroes when it frees
  // a record (ringFree).
  std::atomic<uint64_t> stamp;
  uint32_t type;
  uint32_t len;  // payload bytes after the header (pad: bytes to skip, header included)
  uint64_t seq;  // the op's position among this pair's messages
  union {
    uint32_t kind;  // data, whole, rts, meta: OpKind
    uint32_t lane;  // fin: the lane of the send it completes
  };
  union {
    int32_t status;    // fin / status / bye / abort: a zpResult_t
    uint32_t metaLen;  // data, whole: the send's meta ahead of the data in the payload (a first fragment)
  };
  // A kWhole record's payload starts here.
  union {
    uint64_t total;    // data, rts, meta: the whole message's bytes
    uint64_t collSeq;  // status
  };
  union {
    uint64_t offset;  // data: where this fragment goes
    uint64_t addr;    // rts: the sender's buffer
  };
};
constexpr uint64_t kPayload = sizeof(MsgHdr);
constexpr uint64_t kWholePayload = offsetof(MsgHdr, total);
static_assert(kPayload == 48 && kWholePayload == 32, "a record's first line holds its header and 16 bytes of "
              "payload, a whole message's 32");

inline bool isData(uint32_t type) { return type == kData || type == kWhole; }
// A data record's meta bytes, its message's bytes and where its data goes.
inline uint32_t recordMetaLen(const MsgHdr* h) { return isData(h->type) ? h->metaLen : 0; }
inline uint64_t recordTotal(const MsgHdr* h) { return h->type == kWhole ? h->len - h->metaLen : h->total; }
inline uint64_t recordOffset(const MsgHdr* h) { return h->type == kWhole ? 0 : h->offset; }

inline uint64_t roundRecord(uint64_t n) { return (n + kRecord - 1) & ~(kRecord - 1); }
// A record's bytes in the ring, header included (a kWhole record: wholeRecordBytes).
inline uint64_t recordBytes(uint64_t payload) { return roundRecord(kPayload + payload); }
inline uint64_t wholeRecordBytes(uint64_t payload) { return roundRecord(kWholePayload + payload); }
inline uint64_t recordBytesOf(const MsgHdr* h) {
  return h->type == kWhole ? wholeRecordBytes(h->len) : recordBytes(h->len);
}
// The bytes a send's meta takes ahead of its data in its first fragment:
// padded to 8, so the data stays aligned and a fragment holds whole elements.
inline uint32_t metaLenOf(const Op* op) { return (op->metaBytes + 7) & ~7u; }
inline char* payloadOf(MsgHdr* h) { return (char*)h + (h->type == kWhole ? kWholePayload : kPayload); }
inline const char* payloadOf(const MsgHdr* h) {
  return (const char*)h + (h->type == kWhole ? kWholePayload : kPayload);
}

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

inline MsgHdr* recordAt(const Ring& r, uint64_t pos) { return (MsgHdr*)(r.buf + (pos & (r.cap - 1))); }

// Producer: room for a record of `bytes` (a multiple of kRecord, at most
// cap/2), contiguous; records never wrap, a pad fills the end instead. The
// reader's tail is read only when the tail last seen leaves too little
// room: it is the reader's line, and reading it per message would move it.
// Nothing is visible to the reader until ringPublish, and a claim not
// published is simply forgotten.
inline MsgHdr* ringClaim(Ring& r, uint64_t bytes) {
  uint64_t head = r.ctl->head.load(std::memory_order_relaxed);
  uint64_t pos = head & (r.cap - 1);
  uint64_t pad = (r.cap - pos < bytes) ? r.cap - pos : 0;
  if (pad + bytes > r.cap - (head - r.tailSeen)) {
    r.tailSeen = r.ctl->tail.load(std::memory_order_acquire);
    if (pad + bytes > r.cap - (head - r.tailSeen)) return nullptr;
  }
  r.pendingPad = pad;
  r.pendingPos = head + pad;
  return recordAt(r, head + pad);
}

// Producer: the claimed record is complete: its pad, if any, then it.
inline void ringPublish(Ring& r) {
  const uint64_t at = r.pendingPos;
  if (r.pendingPad) {
    MsgHdr* pad = recordAt(r, at - r.pendingPad);
    pad->type = kPad;
    pad->len = (uint32_t)r.pendingPad;
    pad->stamp.store(at - r.pendingPad + 1, std::memory_order_release);
  }
  MsgHdr* h = recordAt(r, at);
  r.ctl->head.store(at + recordBytesOf(h), std::memory_order_relaxed);
  h->stamp.store(at + 1, std::memory_order_release);
}

// Producer: claims and publishes a whole record made by makeRecord; false
// if the ring has no room.
inline bool ringPush(Ring& r, const std::vector<char>& rec) {
  MsgHdr* h = ringClaim(r, rec.size());
  if (!h) return false;
  memcpy((char*)h + sizeof(h->stamp), rec.data() + sizeof(h->stamp), rec.size() - sizeof(h->stamp));
  ringPublish(r);
  return true;
}

// Claims a record of `bytes` and fills the header fields every op's record has.
inline MsgHdr* claimOpRecord(Ring& r, uint64_t bytes, uint32_t type, const Op* op) {
  MsgHdr* h = ringClaim(r, bytes);
  if (!h) return nullptr;
  h->type = type;
  h->len = 0;
  h->seq = op->seq;
  if (type != kWhole) {  // a kWhole record's payload starts where these would be
    h->total = op->bytes;
    h->offset = 0;
  }
  h->kind = (uint32_t)op->kind;
  h->status = 0;
  return h;
}

// Consumer: frees the `bytes` at the tail. The first word of every line
// after the first is zeroed: a later record may start there, and its stamp
// must not be matched by stale payload.
inline void ringFree(Ring& r, uint64_t tail, uint64_t bytes) {
  for (uint64_t off = kRecord; off < bytes; off += kRecord)
    recordAt(r, tail + off)->stamp.store(0, std::memory_order_relaxed);
  r.ctl->tail.store(tail + bytes, std::memory_order_release);
}

// Consumer: the record at the tail if it is complete (pads skipped), else null.
inline MsgHdr* ringPeek(Ring& r) {
  for (;;) {
    uint64_t tail = r.ctl->tail.load(std::memory_order_relaxed);
    MsgHdr* h = recordAt(r, tail);
    if (h->stamp.load(std::memory_order_acquire) != tail + 1) return nullptr;
    if (h->type != kPad) return h;
    ringFree(r, tail, h->len);  // a pad is published with the record after it, which ringPop frees
  }
}

// Consumer: frees the record at the tail; true if the producer is waiting
// for room (then it must be woken, asleep or not). The fence orders the
// tail's store before the flag's load, as the producer orders the flag's
// store before its last look at the tail (progressSend): one of the two
// sees the other's.
inline bool ringPop(Ring& r, const MsgHdr* h) {
  ringFree(r, r.ctl->tail.load(std::memory_order_relaxed), recordBytesOf(h));
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (r.ctl->producerWaiting.load(std::memory_order_relaxed)) {
    r.ctl->producerWaiting.store(0, std::memory_order_relaxed);
    return true;
  }
  return false;
}

// A record has arrived that the consumer has not looked at yet (read
// without the consumer's lock: every field read is atomic).
inline bool ringFresh(const Ring& r) {
  const uint64_t tail = r.ctl->tail.load(std::memory_order_relaxed);
  const uint64_t stamp = recordAt(r, tail)->stamp.load(std::memory_order_acquire);
  return stamp == tail + 1 && stamp != __atomic_load_n(&r.parked, __ATOMIC_RELAXED);
}

// The consumer has looked at the record at the tail and leaves it there
// (nothing asked for it yet): it is no news to a waiter any more.
inline void ringPark(Ring& r) {
  const uint64_t tail = r.ctl->tail.load(std::memory_order_relaxed);
  __atomic_store_n(&r.parked, tail + 1, __ATOMIC_RELAXED);
}

inline long futex(std::atomic<uint32_t>* addr, int op, uint32_t val, const timespec* ts) {
  return syscall(SYS_futex, (uint32_t*)addr, op, val, ts, nullptr, 0);
}

// A spinning core's hint to the CPU (x86's pause: less power, and the
// sibling hyperthread gets the pipeline).
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
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

// A control record's text is cut to this many bytes.
constexpr size_t kCtrlTextMax = 512;
inline size_t ctrlTextLen(const std::string& text) { return std::min(text.size(), kCtrlTextMax); }
// Fills a control record (a fin, status, goodbye or abort) at h, its header
// zeroed first; its stamp is left to ringPublish.
inline void fillCtrlRecord(MsgHdr* h, uint32_t type, uint64_t seq, int32_t status, uint64_t collSeq,
                           const std::string& text, uint32_t lane) {
  memset((char*)h + sizeof(h->stamp), 0, kPayload - sizeof(h->stamp));
  const size_t len = ctrlTextLen(text);
  h->type = type;
  h->len = (uint32_t)len;
  h->seq = seq;
  h->status = status;
  h->collSeq = collSeq;
  h->lane = lane;
  if (len) memcpy(payloadOf(h), text.data(), len);
}

inline std::vector<char> makeRecord(uint32_t type, uint64_t seq, int32_t status, uint64_t collSeq,
                                    const std::string& text = {}, uint32_t lane = 0) {
  std::vector<char> rec(recordBytes(ctrlTextLen(text)), 0);
  fillCtrlRecord((MsgHdr*)rec.data(), type, seq, status, collSeq, text, lane);
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
