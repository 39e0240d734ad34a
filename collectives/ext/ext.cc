#include "collectives/ext/ext.h"

#include <exception>
#include <new>

namespace zpx {

zpResult_t viewLayout(zpLayout_t layout, LayoutView* out) {
  int nranks = 0, nseqs = 0;
  const int64_t* lens = nullptr;
  ZPX_CHECK(zpLayoutGetInfo(layout, &nranks, &nseqs, &lens));
  out->seqLens.assign(lens, lens + nseqs);
  out->ranks.assign(nranks, {});
  for (int r = 0; r < nranks; r++) {
    const zpSegment_t* segs = nullptr;
    size_t n = 0;
    ZPX_CHECK(zpLayoutRankSegments(layout, r, &segs, &n));
    out->ranks[r].assign(segs, segs + n);
  }
  return zpSuccess;
}

zpResult_t failFromException(const char* fn) {
  try {
    throw;
  } catch (const std::bad_alloc&) {
    return zpSetLastError(nullptr, zpSystemError, "%s: out of memory", fn);
  } catch (const std::exception& e) {
    return zpSetLastError(nullptr, zpInternalError, "%s: unexpected exception: %s", fn, e.what());
  } catch (...) {
    return zpSetLastError(nullptr, zpInternalError, "%s: unexpected exception", fn);
  }
}

}  // namespace zpx
