// Shared helpers of the benchmark programs; see common.h.
#include "common.h"

#include <dirent.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <unistd.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "src/util/cli.h"
#include "src/util/strings.h"
#include "zeppelin.h"

namespace zpbench {

// ---------------------------------------------------------------- datatypes

namespace {
const TypeInfo kTypes[] = {
    {"int8", zpInt8, 1, false},     {"uint8", zpUint8, 1, false},
    {"int32", zpInt32, 4, false},   {"uint32", zpUint32, 4, false},
    {"int64", zpInt64, 8, false},   {"uint64", zpUint64, 8, false},
    {"half", zpFloat16, 2, true},   {"float", zpFloat32, 4, true},
    {"double", zpFloat64, 8, true}, {"bfloat16", zpBfloat16, 2, true},
};
struct Alias {
  const char* alias;
  const char* name;
};
const Alias kAliases[] = {{"float16", "half"},  {"float32", "float"}, {"float64", "double"},
                          {"bf16", "bfloat16"}, {"char", "int8"},     {"int", "int32"}};
}  // namespace

const TypeInfo* findType(const std::string& name) {
  std::string canon = name;
  for (const Alias& a : kAliases)
    if (name == a.alias) canon = a.name;
  for (const TypeInfo& t : kTypes)
    if (canon == t.name) return &t;
  return nullptr;
}

// ------------------------------------------------------------------ options

int launcherRank() {
  for (const char* name : {"ZP_RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "RANK"}) {
    const char* v = getenv(name);
    if (v != nullptr && *v != '\0') return atoi(v);
  }
  return 0;
}

void parseCommandLine(CLI::App& app, int argc, char** argv, const std::function<void()>& check) {
  const std::string prog = app.get_name();
  try {
    zp::cli::parse(app, std::vector<std::string>(argv + 1, argv + argc));
    zp::cli::rejectUnknownOptions(app);
    std::vector<std::string> extra = zp::cli::extras(app);
    if (!extra.empty()) throw zp::cli::UsageError("unexpected argument '" + extra[0] + "'");
    if (check) check();
  } catch (const CLI::CallForHelp&) {
    if (launcherRank() == 0) fputs(app.help().c_str(), stdout);
    exit(0);
  } catch (const zp::cli::UsageError& e) {
    // Every rank of a launcher's job gets the same flags: one says so.
    if (launcherRank() == 0) fprintf(stderr, "%s: %s\n%s", prog.c_str(), e.what(), app.help().c_str());
    exit(zp::cli::kExitUsage);
  }
}

std::function<void(const std::string&)> bytesFlag(const char* flag, size_t* out) {
  return [=](const std::string& text) {
    if (!zp::parseSize(text, out)) throw zp::cli::UsageError(std::string("bad ") + flag + " '" + text + "'");
  };
}

long long readInteger(const char* flag, const std::string& text, long long lo, long long hi) {
  long long v = 0;
  if (zp::parseInt(text, lo, hi, &v)) return v;
  std::string expected = lo == 0 && hi == 1 ? "0 or 1"
                         : hi == std::numeric_limits<int>::max() || hi == std::numeric_limits<long>::max()
                             ? "an integer >= " + std::to_string(lo)
                             : "an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]";
  throw zp::cli::UsageError(std::string("bad ") + flag + " '" + text + "': expected " + expected);
}

std::function<void(const std::string&)> numberFlag(const char* flag, double lo, double* out) {
  return [=](const std::string& text) {
    if (!zp::parseDouble(text, lo, std::numeric_limits<double>::max(), out))
      throw zp::cli::UsageError(std::string("bad ") + flag + " '" + text + "': expected a number >= " +
                                zp::strprintf("%g", lo));
  };
}

Options parseOptions(int argc, char** argv, const char* prog, bool withPattern) {
  Options o;
  o.type = findType("float");
  bool factorGiven = false;
  CLI::App app("", prog);
  zp::cli::configure(app, std::string("usage: ") + prog + " [options]\n", 16);
  using zp::cli::addValue;
  addValue(app, "-b", "minbytes", "smallest size, bytes per rank (K/M/G suffixes; default 32M)",
           bytesFlag("-b", &o.minBytes));
  addValue(app, "-e", "maxbytes", "largest size (default 32M)", bytesFlag("-e", &o.maxBytes));
  addValue(app, "-f", "factor", "multiply the size by this each step (> 1)", [&](const std::string& v) {
    numberFlag("-f", 1.0, &o.stepFactor)(v);
    factorGiven = true;
  });
  addValue(app, "-i", "stepbytes", "add this to the size each step when -f is 1 or not given (default 1M)",
           bytesFlag("-i", &o.stepBytes));
  addValue(app, "-n", "iters", "timed iterations per size (default 20)", intFlag("-n", &o.iters, 1));
  addValue(app, "-w", "warmup", "untimed iterations per size (default 5)", intFlag("-w", &o.warmup, 0));
  addValue(app, "-c", "0|1", "check every received byte after the timed loop (default 1)",
           intFlag("-c", &o.check, 0, 1));
  addValue(app, "-G", "0|1", "1: device buffers, calls on a CUDA stream (a build with CUDA; default 0)",
           intFlag("-G", &o.gpu, 0, 1));
  addValue(app, "-d", "type",
           "int8 uint8 int32 uint32 int64 uint64 half|float16 float|float32\n"
           "double|float64 bfloat16 (default float)",
           [&](const std::string& v) {
             o.type = findType(v);
             if (o.type == nullptr) throw zp::cli::UsageError("unknown datatype '" + v + "'");
           });
  if (withPattern) {
    auto pattern = [&](const std::string& p) {
      if (p.compare(0, 7, "matrix:") == 0) {
        o.pattern = "matrix";
        o.matrixFile = p.substr(7);
        if (o.matrixFile.empty()) throw zp::cli::UsageError("-P '" + p + "': no file name");
      } else if (p == "uniform" || p == "random" || p == "zipf") {
        o.pattern = p;
      } else {
        throw zp::cli::UsageError("unknown pattern '" + p + "'");
      }
    };
    addValue(app, "-P", "pattern", "uniform | random | zipf | matrix:FILE (default uniform)", pattern);
    addValue(app, "-s", "seed", "seed of the random and zipf patterns (default 1)", [&](const std::string& v) {
      // Any base, as gloo_alltoallv.py's int(x, 0) reads it: 0x10 is 16.
      char* end = nullptr;
      errno = 0;
      unsigned long long s = strtoull(v.c_str(), &end, 0);
      if (errno != 0 || end == v.c_str() || *end != '\0' || v[0] == '-')
        throw zp::cli::UsageError("bad -s '" + v + "': expected a non-negative integer");
      o.seed = s;
    });
  } else {
    addValue(app, "-S", "shift", "send to rank+shift, receive from rank-shift (default 1)",
             intFlag("-S", &o.shift, 1));
  }
  parseCommandLine(app, argc, argv, [&] {
    if (o.minBytes > o.maxBytes) throw zp::cli::UsageError("-b is larger than -e");
    // nccl-tests: a factor > 1 multiplies, otherwise -i adds.
    if (!factorGiven) o.stepFactor = 1.0;
    if (o.minBytes < o.maxBytes) {
      if (o.stepFactor > 1.0 && o.minBytes == 0)
        throw zp::cli::UsageError("-f needs -b > 0 (0 times a factor stays 0)");
      if (o.stepFactor == 1.0 && o.stepBytes == 0)
        throw zp::cli::UsageError("-i 0 with no -f > 1 never reaches -e");
    }
  });
  return o;
}

std::vector<size_t> sizeSweep(const Options& o) {
  std::vector<size_t> sizes;
  size_t s = o.minBytes;
  while (true) {
    sizes.push_back(s);
    if (s >= o.maxBytes) break;
    // As nccl-tests: the sweep stops before the first size past -e.
    double next = o.stepFactor > 1.0 ? double(s) * o.stepFactor : double(s) + double(o.stepBytes);
    if (next > double(o.maxBytes)) break;
    size_t n = size_t(next);
    if (n <= s) n = s + 1;  // a factor close to 1 could round back to s
    s = n;
  }
  return sizes;
}

// ----------------------------------------------------------------- patterns

size_t rowElems(size_t sizeBytes, int n, size_t typeSize) {
  return sizeBytes / (size_t(n) * typeSize) * size_t(n);
}

bool readMatrixFile(const std::string& path, int n, std::vector<double>* weights,
                    std::string* err) {
  std::ifstream in(path);
  if (!in) {
    *err = "cannot open matrix file '" + path + "': " + strerror(errno);
    return false;
  }
  weights->clear();
  std::string line;
  int row = 0, lineNo = 0;
  while (std::getline(in, line)) {
    ++lineNo;
    size_t hash = line.find('#');  // comments
    if (hash != std::string::npos) line.resize(hash);
    std::istringstream ls(line);
    std::string tok;
    int col = 0;
    while (ls >> tok) {
      double v = 0;
      if (!zp::parseDouble(tok, 0, std::numeric_limits<double>::max(), &v)) {
        *err = path + ":" + std::to_string(lineNo) + ": '" + tok + "' is not a non-negative number";
        return false;
      }
      weights->push_back(v);
      ++col;
    }
    if (col == 0) continue;  // blank or comment line
    if (col != n) {
      *err = path + ":" + std::to_string(lineNo) + ": " + std::to_string(col) +
             " numbers, expected " + std::to_string(n) + " (one per rank)";
      return false;
    }
    ++row;
  }
  if (row != n) {
    *err = path + ": " + std::to_string(row) + " rows, expected " + std::to_string(n) +
           " (one per rank)";
    return false;
  }
  return true;
}

namespace {

// Splits total over a row in proportion to the weights w[0..n), exactly
// summing to total. Plain IEEE double steps in a fixed order, so Python's
// floats give the same counts.
void scaleRow(const double* w, int n, size_t total, size_t* out) {
  double sum = 0;
  for (int j = 0; j < n; ++j) sum += w[j];
  for (int j = 0; j < n; ++j) out[j] = 0;
  if (!(sum > 0) || total == 0) return;
  size_t assigned = 0;
  for (int j = 0; j < n; ++j) {
    out[j] = size_t(std::floor(double(total) * (w[j] / sum)));
    assigned += out[j];
  }
  // Rounding leaves a few elements over or under: settle them deterministically.
  while (assigned > total) {
    int big = 0;
    for (int j = 1; j < n; ++j)
      if (out[j] > out[big]) big = j;
    --out[big];
    --assigned;
  }
  for (int j = 0; assigned < total; j = (j + 1) % n)
    if (w[j] > 0) {
      ++out[j];
      ++assigned;
    }
}

}  // namespace

Matrix buildMatrix(const Options& o, int n, size_t sizeBytes,
                   const std::vector<double>& fileWeights) {
  Matrix m;
  m.n = n;
  m.counts.assign(size_t(n) * size_t(n), 0);
  const size_t total = rowElems(sizeBytes, n, o.type->size);
  const size_t mean = total / size_t(n);
  SplitMix64 rng(o.seed);
  std::vector<double> w(static_cast<size_t>(n));
  for (int src = 0; src < n; ++src) {
    size_t* row = &m.counts[size_t(src) * size_t(n)];
    if (o.pattern == "uniform") {
      for (int dst = 0; dst < n; ++dst) row[dst] = mean;
    } else if (o.pattern == "random") {
      for (int dst = 0; dst < n; ++dst) row[dst] = size_t(rng.next() % (2 * uint64_t(mean) + 1));
    } else if (o.pattern == "zipf") {
      // Destination perm[k] gets weight 1/(k+1)^1.2; the permutation is a
      // Fisher-Yates shuffle driven by the seeded PRNG.
      std::vector<int> perm(static_cast<size_t>(n));
      for (int i = 0; i < n; ++i) perm[size_t(i)] = i;
      for (int i = n - 1; i > 0; --i) {
        int j = int(rng.next() % uint64_t(i + 1));
        std::swap(perm[size_t(i)], perm[size_t(j)]);
      }
      for (int k = 0; k < n; ++k) w[size_t(perm[size_t(k)])] = 1.0 / std::pow(double(k + 1), 1.2);
      scaleRow(w.data(), n, total, row);
    } else {  // matrix
      scaleRow(&fileWeights[size_t(src) * size_t(n)], n, total, row);
    }
  }
  return m;
}

size_t maxRankBytes(const Matrix& m, size_t typeSize) {
  size_t best = 0;
  for (int r = 0; r < m.n; ++r) {
    size_t sent = 0, recvd = 0;
    for (int p = 0; p < m.n; ++p) {
      sent += m.at(r, p);
      recvd += m.at(p, r);
    }
    best = std::max(best, std::max(sent, recvd) * typeSize);
  }
  return best;
}

// ------------------------------------------------------------------ layouts

namespace {
size_t gapElems(int rank, int peer) { return size_t(rank + 2 * peer + 1) % 3; }

Layout makeLayout(const Matrix& m, int rank, bool send) {
  Layout l;
  l.counts.resize(size_t(m.n));
  l.displs.resize(size_t(m.n));
  size_t pos = 0;
  for (int p = 0; p < m.n; ++p) {
    pos += gapElems(rank, p);
    l.counts[size_t(p)] = send ? m.at(rank, p) : m.at(p, rank);
    l.displs[size_t(p)] = pos;
    pos += l.counts[size_t(p)];
  }
  l.totalElems = pos;
  return l;
}
}  // namespace

Layout sendLayout(const Matrix& m, int rank) { return makeLayout(m, rank, true); }
Layout recvLayout(const Matrix& m, int rank) { return makeLayout(m, rank, false); }

Layout singlePeerLayout(int n, int peer, size_t count) {
  Layout l;
  l.counts.assign(size_t(n), 0);
  l.displs.assign(size_t(n), 0);
  l.counts[size_t(peer)] = count;
  // Empty blocks after the peer's start where it ends, keeping displs in order.
  for (int p = peer + 1; p < n; ++p) l.displs[size_t(p)] = count;
  l.totalElems = count;
  return l;
}

// --------------------------------------------------------------------- data

uint64_t sizeSeed(uint64_t seed, size_t sizeBytes) {
  return mix64(seed + kGolden * (uint64_t(sizeBytes) + 1));
}

namespace {
inline uint64_t blockBase(uint64_t seed, int src, int dst) {
  return mix64(mix64(seed + uint64_t(src)) + uint64_t(dst));
}
// The bytes of element idx, little-endian low bytes of a hash. Float types
// get the top exponent bit cleared, so no value is NaN or Inf: a backend that
// moves floats through FP registers must still deliver the same bits.
inline void elementBytes(uint64_t base, size_t idx, const TypeInfo& t, unsigned char* out) {
  uint64_t v = mix64(base + (uint64_t(idx) + 1) * kGolden);
  if (t.isFloat) v &= ~(uint64_t(1) << (8 * t.size - 2));  // the exponent's top bit
  for (size_t b = 0; b < t.size; ++b) out[b] = (unsigned char)(v >> (8 * b));
}
}  // namespace

void fillBlock(unsigned char* p, size_t count, const TypeInfo& t, uint64_t seed, int src, int dst) {
  const uint64_t base = blockBase(seed, src, dst);
  for (size_t i = 0; i < count; ++i) elementBytes(base, i, t, p + i * t.size);
}

size_t checkBlock(const unsigned char* p, size_t count, const TypeInfo& t, uint64_t seed, int src,
                  int dst) {
  const uint64_t base = blockBase(seed, src, dst);
  size_t wrong = 0;
  unsigned char want[8];
  for (size_t i = 0; i < count; ++i) {
    elementBytes(base, i, t, want);
    const unsigned char* got = p + i * t.size;
    if (memcmp(got, want, t.size) == 0) continue;
    for (size_t b = 0; b < t.size; ++b) wrong += got[b] != want[b];
  }
  return wrong;
}

size_t countNotEqual(const unsigned char* p, size_t bytes, unsigned char value) {
  size_t wrong = 0;
  for (size_t i = 0; i < bytes; ++i) wrong += p[i] != value;
  return wrong;
}

void fillSend(unsigned char* buf, const Layout& s, const TypeInfo& t, uint64_t seed, int rank) {
  // Gaps of the send buffer get the poison too; nobody reads them.
  memset(buf, kPoison, s.totalElems * t.size);
  for (size_t p = 0; p < s.counts.size(); ++p)
    fillBlock(buf + s.displs[p] * t.size, s.counts[p], t, seed, rank, int(p));
}

void poisonRecv(unsigned char* buf, const Layout& r, const TypeInfo& t) {
  memset(buf, kPoison, r.totalElems * t.size + kGuardBytes);
}

namespace {
// Where the first wrong byte of a block is, for the error message.
std::string firstBlockError(const unsigned char* p, size_t count, const TypeInfo& t, uint64_t seed,
                            int src, int dst, const char* what) {
  const uint64_t base = blockBase(seed, src, dst);
  unsigned char want[8];
  for (size_t i = 0; i < count; ++i) {
    elementBytes(base, i, t, want);
    for (size_t b = 0; b < t.size; ++b)
      if (p[i * t.size + b] != want[b]) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "%s %d -> %d: element %zu of %zu, byte %zu is 0x%02x, expected 0x%02x", what, src,
                 dst, i, count, b, p[i * t.size + b], want[b]);
        return msg;
      }
  }
  return "";
}
std::string firstPoisonError(const unsigned char* p, size_t bytes, size_t offset,
                             const char* what) {
  for (size_t i = 0; i < bytes; ++i)
    if (p[i] != kPoison) {
      char msg[160];
      snprintf(msg, sizeof msg, "%s: byte %zu of the receive buffer changed to 0x%02x", what,
               offset + i, p[i]);
      return msg;
    }
  return "";
}
}  // namespace

size_t checkRun(const unsigned char* sendBuf, const Layout& s, const unsigned char* recvBuf,
                const Layout& r, const TypeInfo& t, uint64_t seed, int rank,
                std::string* firstError) {
  size_t wrong = 0;
  // Adds w wrong bytes; the first time any are found, describe() says where.
  auto note = [&](size_t w, auto describe) {
    if (w != 0 && firstError->empty()) *firstError = describe();
    wrong += w;
  };
  size_t pos = 0;  // bytes of recvBuf checked so far
  for (size_t p = 0; p < r.counts.size(); ++p) {
    const size_t start = r.displs[p] * t.size;
    const unsigned char* gap = recvBuf + pos;
    const size_t gapBytes = start - pos, gapPos = pos;
    note(countNotEqual(gap, gapBytes, kPoison), [&] {
      return firstPoisonError(gap, gapBytes, gapPos, "write outside the receive ranges");
    });
    const unsigned char* blk = recvBuf + start;
    note(checkBlock(blk, r.counts[p], t, seed, int(p), rank), [&] {
      return firstBlockError(blk, r.counts[p], t, seed, int(p), rank, "received block");
    });
    pos = start + r.counts[p] * t.size;
  }
  const size_t tail = r.totalElems * t.size + kGuardBytes - pos;
  note(countNotEqual(recvBuf + pos, tail, kPoison), [&] {
    return firstPoisonError(recvBuf + pos, tail, pos, "write into the guard after the last range");
  });
  for (size_t p = 0; p < s.counts.size(); ++p) {
    const unsigned char* blk = sendBuf + s.displs[p] * t.size;
    note(checkBlock(blk, s.counts[p], t, seed, rank, int(p)), [&] {
      return firstBlockError(blk, s.counts[p], t, seed, rank, int(p), "send buffer changed, block");
    });
  }
  return wrong;
}

// ------------------------------------------------------------------- buffer

Buffer::Buffer(size_t bytes) : n_(bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes == 0 ? 1 : bytes) != 0) {
    fprintf(stderr, "out of memory allocating %zu bytes\n", bytes);
    exit(1);
  }
  p_ = static_cast<unsigned char*>(p);
  // Fresh pages wait in the kernel's per-CPU LRU batch until it fills or
  // is drained, and until then every read of them by another process
  // (process_vm_readv: single-copy shared memory) activates each page again.
  // That lasts the first tens of milliseconds of a run, and when it ends
  // varies from run to run and from build to build of one library, so
  // calls timed that early differ by chance. A training job's buffers
  // are long settled: mlock drains the batch and munlock puts the pages on
  // the LRU, so that every call is timed in that state (docs/benchmarks.md).
  // Where mlock is not allowed (RLIMIT_MEMLOCK) the pages settle later by
  // themselves.
  if (mlock(p, bytes == 0 ? 1 : bytes) == 0) munlock(p, bytes == 0 ? 1 : bytes);
}
Buffer::~Buffer() { free(p_); }

// ------------------------------------------------------------ time and table

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t h = v.size() / 2;
  return v.size() % 2 ? v[h] : (v[h - 1] + v[h]) / 2;
}

double nowSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

static SchedStat readSchedStat(const char* path) {
  SchedStat s;
  FILE* f = fopen(path, "r");
  if (!f) return s;
  unsigned long long run = 0, wait = 0, n = 0;
  if (fscanf(f, "%llu %llu %llu", &run, &wait, &n) == 3) s = {double(run), double(wait), double(n)};
  fclose(f);
  return s;
}

SchedStat schedStat() { return readSchedStat("/proc/thread-self/schedstat"); }

SchedStat processSchedStat() {
  SchedStat sum;
  DIR* d = opendir("/proc/self/task");
  if (!d) return sum;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const SchedStat s = readSchedStat(("/proc/self/task/" + std::string(e->d_name) + "/schedstat").c_str());
    sum.onCpuNs += s.onCpuNs;
    sum.queuedNs += s.queuedNs;
    sum.slices += s.slices;
  }
  closedir(d);
  return sum;
}

MachineCpu machineCpu() {
  MachineCpu c;
  FILE* f = fopen("/proc/stat", "r");
  if (!f) return c;
  unsigned long long v[8] = {};
  if (fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
             &v[7]) == 8) {
    const double tick = 1.0 / (double)sysconf(_SC_CLK_TCK);
    c = {v[0] * tick, v[2] * tick, v[6] * tick, v[3] * tick, (v[1] + v[4] + v[5] + v[7]) * tick};
  }
  fclose(f);
  return c;
}

ProcessCpu processCpu() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return {u.ru_utime.tv_sec + u.ru_utime.tv_usec * 1e-6, u.ru_stime.tv_sec + u.ru_stime.tv_usec * 1e-6,
          (double)u.ru_minflt};
}

NicInfo nicInfo() {
  NicInfo n;
  auto env = [](const char* name) { const char* v = getenv(name); return v ? atof(v) : 0.0; };
  n.bitsPerSec = env("ZP_NIC_RATE_BPS");
  n.ranksPerNode = std::max(1, (int)env("ZP_LOCAL_NRANKS"));
  int nics = std::max(1, (int)env("ZP_NICS_PER_NODE"));
  n.ranksPerNic = std::max(1, n.ranksPerNode / nics);
  return n;
}

std::vector<uint64_t> nicTxBytes(int nics) {
  std::vector<uint64_t> out(nics, 0);
  for (int k = 0; k < nics; k++) {
    std::string path = "/sys/class/net/zpnic" + std::to_string(k) + "/statistics/tx_bytes";
    if (FILE* f = fopen(path.c_str(), "r")) {
      unsigned long long v = 0;
      if (fscanf(f, "%llu", &v) == 1) out[k] = v;
      fclose(f);
    }
  }
  return out;
}

double nicPercent(const NicInfo& nic, double bytes, double timeUs) {
  if (nic.bitsPerSec <= 0 || timeUs <= 0) return -1;
  return 100.0 * bytes * 8 * nic.ranksPerNic / (timeUs * 1e-6) / nic.bitsPerSec;
}

void printRunHeader(const char* prog, const std::string& library, const std::string& params, const NicInfo& nic) {
  // The environment as the run was given it, whichever library runs (the
  // MPI programs print this header too and link no Zeppelin).
  const char* proto = getenv("ZP_SHM_PROTO");
  printf("# %s: %s\n", prog, library.c_str());
  printf("# %s  ZP_SHM_PROTO %s\n#\n", params.c_str(), proto ? proto : "(unset)");
  if (nic.bitsPerSec > 0)
    printf("# %%nic: the busiest rank's cross-node bytes per second over its NIC's rate (%.3g bit/s),\n"
           "# times the %d rank(s) sharing each NIC\n", nic.bitsPerSec, nic.ranksPerNic);
  printTableHeader(nic.bitsPerSec > 0);
}

void printTableHeader(bool nicColumn) {
  printf("#%11s%14s%10s%12s%8s%8s%8s%s\n", "size", "count", "type", "time", "algbw", "busbw",
         "#wrong", nicColumn ? "    %nic" : "");
  printf("#%11s%14s%10s%12s%8s%8s%8s\n", "(B)", "(elements)", "", "(us)", "(GB/s)", "(GB/s)", "");
  fflush(stdout);
}

void printTableRow(size_t bytes, size_t count, const char* type, double timeUs, double algbw,
                   double busbw, long long wrong, double nicPct) {
  char w[32], nic[32] = "";
  if (wrong < 0)
    snprintf(w, sizeof w, "N/A");
  else
    snprintf(w, sizeof w, "%lld", wrong);
  if (nicPct >= 0) snprintf(nic, sizeof nic, "%8.1f", nicPct);
  // A third decimal below 10 us: a host call of a fifth of a microsecond
  // printed to two moves in steps of 5%.
  printf(timeUs < 10 ? " %11zu%14zu%10s%12.3f%8.2f%8.2f%8s%s\n" : " %11zu%14zu%10s%12.2f%8.2f%8.2f%8s%s\n", bytes,
         count, type, timeUs, algbw, busbw, w, nic);
  fflush(stdout);
}

void printTableFooter(unsigned long long totalWrong, bool checked, double busbwSum, int rows) {
  if (checked)
    printf("# Out of bounds values : %llu %s\n", totalWrong, totalWrong == 0 ? "OK" : "FAILED");
  else
    printf("# Out of bounds values : N/A (check disabled)\n");
  printf("# Avg bus bandwidth    : %g\n", rows > 0 ? busbwSum / rows : 0.0);
  printf("#\n");
  fflush(stdout);
}

}  // namespace zpbench
