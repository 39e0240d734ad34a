// The process's heap, for programs that plan batch after batch (zpplan,
// the planner's benchmarks). Not for the library: the setting is the whole
// process's, which belongs to whoever owns the process.
#pragma once

namespace zp {

// Keeps freed heap memory in the process instead of handing it back to the
// kernel. glibc returns the top of the heap once more than M_TRIM_THRESHOLD
// of it is free (128 KiB, until a freed mapped block raises it) and maps
// blocks above M_MMAP_THRESHOLD of their own; a plan for thousands of ranks
// allocates and frees tens of MB, so every plan would fault its pages in
// afresh (docs/simulator.md, "Where the time goes"). Blocks up to 32 MiB
// come from the heap, and the heap is never trimmed: the process keeps
// its largest plan's memory. No effect outside glibc.
void keepFreedHeap();

}  // namespace zp
