// The process's heap: see heap.h.
#include "src/util/heap.h"

#include <climits>  // and, through it, glibc's __GLIBC__

#ifdef __GLIBC__
#include <malloc.h>
#endif

namespace zp {

void keepFreedHeap() {
#ifdef __GLIBC__
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest dynamic threshold
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
#endif
}

}  // namespace zp
