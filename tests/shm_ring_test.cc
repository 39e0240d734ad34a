// The shared-memory ring's records, in one process: a record is seen only
// once published, never from stale bytes, and the writer's cached view of
// the reader's tail never lets it overwrite what the reader has not freed.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <random>
#include <vector>

#include "transport/shm/shm_layout.h"

namespace {

using namespace zp;

// A ring in plain memory, zeroed as a new segment is; the same Ring seen
// by both sides (the writer's fields and the reader's do not overlap).
struct TestRing {
  explicit TestRing(uint64_t cap) : mem(cap + 64, 0) {
    r.ctl = &ctl;
    r.buf = (char*)(((uintptr_t)mem.data() + 63) & ~uintptr_t(63));
    r.cap = cap;
  }
  RingCtl ctl{};
  std::vector<char> mem;
  Ring r;
};

// Writes one data record of `len` payload bytes, each 8-byte word of it
// `word(at)` where at is the word's position in the ring's stream.
template <class Word>
bool push(Ring& r, uint64_t len, Word word) {
  MsgHdr* h = ringClaim(r, recordBytes(len));
  if (!h) return false;
  h->type = kData;
  h->len = (uint32_t)len;
  const uint64_t at = r.pendingPos + kPayload;
  for (uint64_t o = 0; o + 8 <= len; o += 8) {
    const uint64_t w = word(at + o);
    memcpy(payloadOf(h) + o, &w, 8);
  }
  ringPublish(r);
  return true;
}

// Stale payload is never taken for a record. A record's first line may lie
// where a line of an older record's payload was; a payload word there equal
// to the stamp a record at that place would have (its position plus one) is
// what the reader zeroes away when it frees a record (ringFree). Here every
// word at a line's start is exactly that stamp one lap later.
TEST(ShmRing, StalePayloadIsNeverTakenForARecord) {
  constexpr uint64_t cap = 4096;
  TestRing t(cap);
  Ring& r = t.r;
  auto nextLapsStamp = [](uint64_t at) { return at % kRecord == 0 ? at + cap + 1 : 0x5a5a5a5a5a5a5a5aull; };
  // One lap of 256-byte records, whose payload covers three lines each.
  for (uint64_t i = 0; i < cap / 256; i++) {
    ASSERT_TRUE(push(r, 256 - kPayload, nextLapsStamp)) << "record " << i;
    MsgHdr* h = ringPeek(r);
    ASSERT_NE(h, nullptr);
    ASSERT_EQ(h->len, 256 - kPayload);
    ringPop(r, h);
  }
  // The next lap: one-line records, so their headers fall on the old payload.
  for (uint64_t i = 0; i < cap / kRecord; i++) {
    EXPECT_EQ(ringPeek(r), nullptr) << "a record seen at position " << r.ctl->tail.load() << " before any was written";
    ASSERT_TRUE(push(r, 8, [](uint64_t at) { return at; }));
    MsgHdr* h = ringPeek(r);
    ASSERT_NE(h, nullptr);
    uint64_t w;
    memcpy(&w, payloadOf(h), 8);
    EXPECT_EQ(w, r.ctl->tail.load() + kPayload);
    ringPop(r, h);
  }
}

// Until ringPublish nothing is visible, and a claim not published is
// forgotten (the writer claims once more after asking for room).
TEST(ShmRing, OnlyPublishedRecordsAreSeen) {
  TestRing t(4096);
  Ring& r = t.r;
  ASSERT_NE(ringClaim(r, recordBytes(8)), nullptr);
  EXPECT_EQ(ringPeek(r), nullptr);
  EXPECT_FALSE(ringFresh(r));
  ASSERT_TRUE(push(r, 8, [](uint64_t) { return 7ull; }));  // the same place again
  EXPECT_TRUE(ringFresh(r));
  MsgHdr* h = ringPeek(r);
  ASSERT_NE(h, nullptr);
  EXPECT_EQ(r.ctl->tail.load(), 0u);
  // Looked at and left (nothing asked for it): no news any more, until
  // another record is at the tail.
  ringPark(r);
  EXPECT_FALSE(ringFresh(r));
  ringPop(r, h);
  EXPECT_FALSE(ringFresh(r));
  ASSERT_TRUE(push(r, 8, [](uint64_t) { return 8ull; }));
  EXPECT_TRUE(ringFresh(r));
}

// The writer reads the reader's tail only when the tail it saw leaves too
// little room: it never claims room the reader has not freed, and finds the
// room the reader freed (pads included, records never wrap).
TEST(ShmRing, TheWriterNeverOverrunsTheReader) {
  constexpr uint64_t cap = 4096;
  TestRing t(cap);
  Ring& r = t.r;
  uint64_t written = 0, read = 0;
  std::deque<uint64_t> lens;  // of the records not read yet
  for (int round = 0; round < 200; round++) {
    const uint64_t len = 8 + (round * 376) % 1500;  // records of 64 to 1,600 bytes: pads at the end
    // Until full (a writer that overran would not stop by itself).
    for (uint64_t k = 0; k <= cap / kRecord && push(r, len, [&](uint64_t) { return written; }); k++) {
      lens.push_back(len);
      written++;
    }
    // Full: the stream's bytes in the ring stay within one lap.
    ASSERT_LE(r.ctl->head.load() - r.ctl->tail.load(), cap) << "round " << round;
    // The reader frees about half.
    for (size_t k = 0, half = lens.size() / 2 + 1; k < half && !lens.empty(); k++) {
      MsgHdr* h = ringPeek(r);
      ASSERT_NE(h, nullptr) << "record " << read;
      ASSERT_EQ(h->len, lens.front());
      lens.pop_front();
      uint64_t w;
      memcpy(&w, payloadOf(h), 8);
      ASSERT_EQ(w, read) << "record " << read << " was overwritten";
      ringPop(r, h);
      read++;
    }
  }
  EXPECT_GT(written, 1000u);
}

}  // namespace

// ringCopy copies a record's bytes in pieces up to kRingCopyPiecesMax and
// whole above it: every byte of every size around the pieces' edges and the
// limit, from and to every offset within a line, lands where it should and
// nothing past either end is written.
TEST(ShmRing, RingCopyWritesExactlyTheBytesAtEverySizeAndOffset) {
  std::vector<size_t> sizes = {0, 1, 63, 64, kRingCopyPiece - 1, kRingCopyPiece, kRingCopyPiece + 1,
                               2 * kRingCopyPiece + 17, kRingCopyPiecesMax - 1, kRingCopyPiecesMax,
                               kRingCopyPiecesMax + 1, kRingCopyPiecesMax + kRingCopyPiece + 5};
  std::mt19937_64 rng(std::random_device{}());
  for (size_t n : sizes)
    for (size_t from : {0, 8, 16, 33}) {
      const size_t to = (from * 7 + n) % 64;
      std::vector<unsigned char> src(n + 128), dst(n + 128, 0xA5);
      for (auto& b : src) b = (unsigned char)rng();
      ringCopy(dst.data() + to, src.data() + from, n);
      for (size_t i = 0; i < dst.size(); i++) {
        const bool inside = i >= to && i < to + n;
        ASSERT_EQ(dst[i], inside ? src[from + i - to] : 0xA5) << "size " << n << " from " << from << " to " << to
                                                               << ": byte " << i;
      }
    }
}
