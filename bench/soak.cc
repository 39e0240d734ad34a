// Soak: many init/destroy cycles, then a long loop of checked collectives,
// on ranks this program forks itself (rank 0 hosts each communicator's
// bootstrap root, as with a torchrun-style id). Prints, per rank, the open
// file descriptors, threads and resident memory after a warm-up and at the
// end, and the /dev/shm entries, so that growth per cycle or per call shows.
// Every byte of every call is checked (fresh random counts and data each
// call, poisoned receive buffers). Exit status 1 on a wrong byte, a failed
// call, or descriptors, threads or /dev/shm entries that grew.
//
//   soak -r 4 -c 10000 -n 20000        (issue 16's soak)
#include <dirent.h>
#include <malloc.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "common.h"
#include "include/zeppelin.h"
#include "src/util/cli.h"
#include "src/util/strings.h"

namespace {

constexpr int kMaxRanks = 64;

struct Usage {
  long fds = 0, threads = 0, shm = 0;
  long rssBytes = 0;
  long heapBytes = 0;  // malloc's bytes in use (mallinfo2): exact, where RSS moves by pages
};

long countDir(const char* path) {
  DIR* d = opendir(path);
  if (!d) return -1;
  long n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

Usage usageNow() {
  Usage u;
  u.fds = countDir("/proc/self/fd") - 1;  // less the directory's own
  u.threads = countDir("/proc/self/task");
  u.shm = countDir("/dev/shm");
  FILE* f = fopen("/proc/self/statm", "r");
  long size = 0, resident = 0;
  if (f) {
    if (fscanf(f, "%ld %ld", &size, &resident) != 2) resident = 0;
    fclose(f);
  }
  u.rssBytes = resident * sysconf(_SC_PAGESIZE);
  struct mallinfo2 mi = mallinfo2();
  u.heapBytes = (long)(mi.uordblks + mi.hblkhd);
  return u;
}

// Memory shared by the ranks (mapped before the fork).
struct Board {
  std::atomic<long> idSeq{-1};  // the cycle whose id is in `id`
  zpUniqueId id;
  std::atomic<int> failures{0};
  std::atomic<long long> wrongBytes{0};
  Usage cyclesStart[kMaxRanks], cyclesEnd[kMaxRanks], callsStart[kMaxRanks], callsEnd[kMaxRanks];
  char firstError[512];
  std::atomic<int> errorClaimed{0};
};

void reportError(Board* b, const std::string& what) {
  b->failures++;
  if (b->errorClaimed.exchange(1) == 0) snprintf(b->firstError, sizeof(b->firstError), "%s", what.c_str());
}

// The id of cycle c: rank 0 makes it (its process hosts the root), the others wait for it.
bool idOfCycle(Board* b, int rank, long c, zpUniqueId* id) {
  if (rank == 0) {
    if (zpGetUniqueId(&b->id) != zpSuccess) return false;
    b->idSeq = c;
  } else {
    while (b->idSeq.load() != c) usleep(50);
  }
  *id = b->id;
  return true;
}

// Buffers made once (a call's sizes vary; allocating per call would make the
// benchmark's own heap grow, not the library's).
struct Buffers {
  explicit Buffers(size_t bytes) : send(bytes), recv(bytes + zpbench::kGuardBytes), in(kMaxReduce), out(kMaxReduce) {
    memset(send.data(), 0, send.size());  // every page resident from the start
    memset(recv.data(), 0, recv.size());
  }
  static constexpr size_t kMaxReduce = 4096;
  zpbench::Buffer send, recv;
  std::vector<int64_t> in, out;
};

// One checked alltoallv of a random matrix (up to maxBytes per rank) and
// one checked all-reduce; false after reporting if anything was wrong.
bool checkedCalls(Board* b, zpComm_t comm, int rank, int n, size_t maxBytes, uint64_t seed, Buffers& buf,
                  bool largest) {
  zpbench::Options o;
  o.type = zpbench::findType("int32");
  o.pattern = "random";
  o.seed = seed;
  // Warm-up calls are the largest, so that every page the library maps for
  // them is resident before the counts start.
  size_t bytes = largest ? maxBytes : 4 * n + zpbench::mix64(seed) % (maxBytes + 1);
  zpbench::Matrix m = zpbench::buildMatrix(o, n, bytes, {});
  zpbench::Layout s = zpbench::sendLayout(m, rank), r = zpbench::recvLayout(m, rank);
  if (s.totalElems * o.type->size > buf.send.size() ||
      r.totalElems * o.type->size + zpbench::kGuardBytes > buf.recv.size()) {
    reportError(b, zp::strprintf("rank %d: soak: a call larger than its buffers", rank));
    return false;
  }
  zpbench::Buffer& send = buf.send;
  zpbench::Buffer& recv = buf.recv;
  zpbench::fillSend(send.data(), s, *o.type, seed, rank);
  zpbench::poisonRecv(recv.data(), r, *o.type);
  zpResult_t res = zpAlltoallv(send.data(), s.counts.data(), s.displs.data(), recv.data(), r.counts.data(),
                               r.displs.data(), zpInt32, comm, nullptr);
  if (res != zpSuccess) {
    reportError(b, zp::strprintf("rank %d: zpAlltoallv: %s", rank, zpGetLastError(comm)));
    return false;
  }
  std::string first;
  size_t wrong = zpbench::checkRun(send.data(), s, recv.data(), r, *o.type, seed, rank, &first);
  if (wrong) {
    b->wrongBytes += (long long)wrong;
    reportError(b, zp::strprintf("rank %d: alltoallv: %zu wrong bytes: %s", rank, wrong, first.c_str()));
    return false;
  }
  // All-reduce: element i of rank q is a function of (seed, q, i); the sum is known.
  const size_t count = 1 + zpbench::mix64(seed ^ 0x5eed) % Buffers::kMaxReduce;
  auto value = [&](int q, size_t i) { return (int64_t)(zpbench::mix64(seed + 977 * q + i) % 1000003) - 500000; };
  std::vector<int64_t>& in = buf.in;
  std::vector<int64_t>& out = buf.out;
  for (size_t i = 0; i < count; i++) {
    in[i] = value(rank, i);
    out[i] = INT64_MIN;
  }
  if (zpAllReduce(in.data(), out.data(), count, zpInt64, zpSum, comm, nullptr) != zpSuccess) {
    reportError(b, zp::strprintf("rank %d: zpAllReduce: %s", rank, zpGetLastError(comm)));
    return false;
  }
  for (size_t i = 0; i < count; i++) {
    int64_t want = 0;
    for (int q = 0; q < n; q++) want += value(q, i);
    if (out[i] != want) {
      b->wrongBytes += 8;
      reportError(b, zp::strprintf("rank %d: all-reduce element %zu is %lld, not %lld", rank, i,
                                   (long long)out[i], (long long)want));
      return false;
    }
  }
  return true;
}

void rankMain(Board* b, int rank, int n, long cycles, long warmCycles, long calls, long warmCalls, size_t maxBytes,
              uint64_t seed) {
  // Init/destroy cycles; the first warmCycles settle caches and pools.
  for (long c = 0; c < cycles + warmCycles; c++) {
    if (c == warmCycles) b->cyclesStart[rank] = usageNow();
    zpUniqueId id;
    zpComm_t comm = nullptr;
    if (!idOfCycle(b, rank, c, &id) || zpCommInitRank(&comm, n, id, rank) != zpSuccess) {
      reportError(b, zp::strprintf("rank %d: cycle %ld: init: %s", rank, c, zpGetLastError(nullptr)));
      return;
    }
    if (zpCommDestroy(comm) != zpSuccess) {
      reportError(b, zp::strprintf("rank %d: cycle %ld: destroy: %s", rank, c, zpGetLastError(nullptr)));
      return;
    }
  }
  b->cyclesEnd[rank] = usageNow();
  // One communicator, many checked calls.
  zpUniqueId id;
  zpComm_t comm = nullptr;
  if (!idOfCycle(b, rank, cycles + warmCycles, &id) || zpCommInitRank(&comm, n, id, rank) != zpSuccess) {
    reportError(b, zp::strprintf("rank %d: init for the call loop: %s", rank, zpGetLastError(nullptr)));
    return;
  }
  // A random row or column is at most twice the mean block per peer, with gaps.
  Buffers buf(2 * (maxBytes + 4 * (size_t)n) + 64 * (size_t)n);
  for (long k = 0; k < calls + warmCalls; k++) {
    if (k == warmCalls) b->callsStart[rank] = usageNow();
    if (!checkedCalls(b, comm, rank, n, maxBytes, zpbench::mix64(seed + (uint64_t)k), buf, k < warmCalls)) break;
  }
  b->callsEnd[rank] = usageNow();
  zpCommDestroy(comm);
}

void printPhase(const char* name, long count, const char* unit, const Usage* start, const Usage* end, int n) {
  printf("# %s: %ld %s after warm-up\n", name, count, unit);
  printf("%5s %10s %8s %11s %12s %13s %11s %11s %11s\n", "rank", "fds st/end", "threads", "RSS st KB",
         "RSS end KB", "RSS B/step", "heap st KB", "heap end KB", "heap B/step");
  auto perStep = [&](long a, long b) { return count ? double(b - a) / double(count) : 0.0; };
  for (int r = 0; r < n; r++)
    printf("%5d %5ld/%-4ld %3ld/%-4ld %11ld %12ld %13.2f %11ld %11ld %11.2f\n", r, start[r].fds, end[r].fds,
           start[r].threads, end[r].threads, start[r].rssBytes >> 10, end[r].rssBytes >> 10,
           perStep(start[r].rssBytes, end[r].rssBytes), start[r].heapBytes >> 10, end[r].heapBytes >> 10,
           perStep(start[r].heapBytes, end[r].heapBytes));
  printf("# /dev/shm entries: %ld at the start, %ld at the end\n", start[0].shm, end[0].shm);
}

}  // namespace

int main(int argc, char** argv) {
  int nranks = 4;
  long cycles = 1000, calls = 2000, warmCycles = 50, warmCalls = 200;
  size_t maxBytes = 1 << 20;
  uint64_t seed = 1;
  CLI::App app("", "soak");
  zp::cli::configure(app, "usage: soak [-r ranks] [-c cycles] [-n calls] [-b maxbytes] [-W warmcycles] "
                          "[-w warmcalls] [-s seed]\n", 14);
  app.description("Init/destroy cycles, then checked alltoallv + all-reduce calls, on ranks forked here;\n"
                  "prints fds, threads, /dev/shm entries and RSS after warm-up and at the end.");
  zp::cli::addValue(app, "-r", "ranks", "ranks (default 4)", zpbench::intFlag("-r", &nranks, 1, kMaxRanks));
  zp::cli::addValue(app, "-c", "cycles", "init/destroy cycles after warm-up (default 1000)",
                    zpbench::intFlag("-c", &cycles, 0));
  zp::cli::addValue(app, "-n", "calls", "checked call pairs after warm-up (default 2000)",
                    zpbench::intFlag("-n", &calls, 0));
  zp::cli::addValue(app, "-b", "maxbytes", "largest alltoallv per rank, K/M/G suffixes (default 1M)",
                    zpbench::bytesFlag("-b", &maxBytes));
  zp::cli::addValue(app, "-W", "warmcycles", "warm-up cycles (default 50)", zpbench::intFlag("-W", &warmCycles, 0));
  zp::cli::addValue(app, "-w", "warmcalls", "warm-up call pairs (default 200)", zpbench::intFlag("-w", &warmCalls, 0));
  zp::cli::addValue(app, "-s", "seed", "seed of counts and data (default 1)", zpbench::intFlag("-s", &seed, 0, LLONG_MAX));
  zpbench::parseCommandLine(app, argc, argv);

  void* mem = mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    perror("soak: mmap");
    return 1;
  }
  Board* b = new (mem) Board();
  // A private /dev/shm (a mount namespace, as root), so that other programs'
  // segments do not enter the counts; else the machine's is counted.
  bool privateShm = unshare(CLONE_NEWNS) == 0 && mount("none", "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
                    mount("zpsoak", "/dev/shm", "tmpfs", 0, "mode=1777") == 0;
  printf("# /dev/shm: %s\n", privateShm ? "private to this run (a mount namespace)"
                                         : "the machine's (not root: other programs' entries count too)");
  long shmBefore = countDir("/dev/shm");
  fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < nranks; r++) {
    pid_t p = fork();
    if (p == 0) {
      rankMain(b, r, nranks, cycles, warmCycles, calls, warmCalls, maxBytes, seed);
      fflush(stdout);
      _exit(0);
    }
    pids.push_back(p);
  }
  bool crashed = false;
  for (pid_t p : pids) {
    int st = 0;
    waitpid(p, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) crashed = true;
  }
  long shmAfter = countDir("/dev/shm");

  printPhase("init/destroy cycles", cycles, "cycles", b->cyclesStart, b->cyclesEnd, nranks);
  printPhase("checked calls (alltoallv + all-reduce)", calls, "call pairs", b->callsStart, b->callsEnd, nranks);
  printf("# /dev/shm entries before the ranks started: %ld, after they exited: %ld\n", shmBefore, shmAfter);
  bool grew = false;
  for (int r = 0; r < nranks; r++) {
    grew |= b->cyclesEnd[r].fds > b->cyclesStart[r].fds || b->cyclesEnd[r].threads > b->cyclesStart[r].threads;
    grew |= b->callsEnd[r].fds > b->callsStart[r].fds || b->callsEnd[r].threads > b->callsStart[r].threads;
  }
  grew |= b->cyclesEnd[0].shm > b->cyclesStart[0].shm || shmAfter > shmBefore;
  printf("# wrong bytes: %lld; failed calls: %d%s%s\n", b->wrongBytes.load(), b->failures.load(),
         b->failures ? "; first: " : "", b->failures ? b->firstError : "");
  if (crashed) printf("# a rank crashed\n");
  if (grew) printf("# descriptors, threads or /dev/shm entries grew\n");
  return crashed || grew || b->failures || b->wrongBytes ? 1 : 0;
}
