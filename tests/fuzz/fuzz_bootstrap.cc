// The bootstrap root's parser of what a connection sends (the join header):
// any bytes, arriving in any pieces, against a root that already has some
// ranks. Checks that a stranger is never admitted and that an admitted
// header is one the root can index its tables with.
#include <cstdlib>
#include <string>
#include <vector>

#include "src/core/bootstrap.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zpfuzz::Input in(data, size);
  uint8_t secret[16];
  for (uint8_t& b : secret) b = in.take<uint8_t>();
  // The root's state: no rank yet (nranks -1), or some of nranks joined.
  int nranks = (int)in.below(10) - 1;
  std::vector<int> rankFd(nranks > 0 ? nranks : 0, -1);
  for (int& fd : rankFd) fd = in.take<uint8_t>() & 1 ? 7 : -1;
  // The first rank's header: its job, "" or one from the input.
  zp::JoinHeader first;
  memset(&first, 0, sizeof(first));
  for (size_t i = 0, n = in.below(4); i < n; i++) first.job[i] = (char)in.take<uint8_t>();
  zp::JoinHeader h;
  memset(&h, 0, sizeof(h));
  size_t got = 0;
  // The header's bytes, in pieces as recv would hand them over.
  while (in.left() > 0 && got < sizeof(h)) {
    size_t piece = 1 + in.below(sizeof(h));
    if (piece > sizeof(h) - got) piece = sizeof(h) - got;
    if (piece > in.left()) piece = in.left();
    memcpy((char*)&h + got, in.rest(), piece);
    in.take<uint8_t>();  // at least one byte consumed
    for (size_t i = 1; i < piece; i++) in.take<uint8_t>();
    got += piece;
    std::string why;
    zp::JoinCheck c = zp::checkJoinHeader(h, got, secret, nranks, rankFd, &why, nranks >= 0 ? &first : nullptr);
    bool knowsSecret = got >= offsetof(zp::JoinHeader, nranks) && memcmp(h.secret, secret, 16) == 0;
    bool rightMagic = got < sizeof(uint32_t) || h.magic == zp::kIdMagic;
    if (c == zp::JoinCheck::kStranger && why.empty()) abort();
    if (c != zp::JoinCheck::kStranger && (!rightMagic || (got >= offsetof(zp::JoinHeader, nranks) && !knowsSecret)))
      abort();  // a stranger let through
    if (c == zp::JoinCheck::kComplete) {
      if (got != sizeof(h) || h.nranks <= 0 || h.info.rank < 0 || h.info.rank >= h.nranks || h.timeoutMs <= 0) abort();
      if (nranks >= 0 && (h.nranks != nranks || rankFd[h.info.rank] >= 0)) abort();
      if (strnlen(h.job, sizeof(h.job)) == sizeof(h.job)) abort();
      if (nranks >= 0 && strcmp(h.job, first.job) != 0) abort();  // a rank of another job let in
    }
    if ((c == zp::JoinCheck::kInvalid || c == zp::JoinCheck::kConflict) && why.empty()) abort();
    if (c != zp::JoinCheck::kIncomplete) break;
  }
  return 0;
}
