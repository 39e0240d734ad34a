// Shared helpers of the benchmark programs: option parsing, the size sweep,
// traffic patterns, buffer layouts, data fill / check and the result table.
//
// Nothing here calls into a communication library, so the same code serves
// the Zeppelin programs and the MPI build of alltoallv_perf. The PRNG, the
// patterns and the data values are also implemented in gloo_alltoallv.py;
// any change here must be made there too (they must agree bit for bit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "include/zeppelin.h"

namespace CLI {
class App;
}

namespace zpbench {

// ---- PRNG: splitmix64 (tiny, and easy to port exactly to Python) ----
constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
struct SplitMix64 {
  uint64_t state;
  explicit SplitMix64(uint64_t seed) : state(seed) {}
  uint64_t next() {
    state += kGolden;
    return mix64(state);
  }
};

// ---- Datatypes ----
struct TypeInfo {
  const char* name;  // canonical name, printed in the table
  int zpType;        // zpDataType_t value
  size_t size;       // bytes per element
  bool isFloat;      // floating point: data values avoid NaN / Inf bit patterns
};
// Accepts the canonical names and aliases (half, float, double, ...); nullptr if unknown.
const TypeInfo* findType(const std::string& name);

// ---- Options (nccl-tests flags) ----
struct Options {
  size_t minBytes = 32u << 20;      // -b
  size_t maxBytes = 32u << 20;      // -e
  size_t stepBytes = 1u << 20;      // -i: used when the step factor is 1 / not given
  double stepFactor = 1.0;          // -f
  int iters = 20;                   // -n
  int warmup = 5;                   // -w
  int check = 1;                    // -c
  const TypeInfo* type = nullptr;   // -d (default float)
  std::string pattern = "uniform";  // -P uniform|random|zipf|matrix (alltoallv only)
  std::string matrixFile;           // the FILE of -P matrix:FILE
  uint64_t seed = 1;                // -s
  int shift = 1;                    // -S: sendrecv partner distance (rank+S, rank-S)
  int gpu = 0;                      // -G 1: device buffers on a CUDA stream (bench/device.h)
};
// Parses argv (see parseCommandLine). withPattern enables -P / -s, else -S.
Options parseOptions(int argc, char** argv, const char* prog, bool withPattern);
// The rank a launcher (zprun, mpirun, torchrun) gave this process, or 0:
// lets code that runs before the communicator exists print only once.
int launcherRank();
// A ZP_* setting as the library reads it (zpGetParam: the environment's
// value, else the library's default), so no program keeps its own copy of a
// default; "" for a setting without one. settingInt: as a number, or
// `otherwise` where it is empty. Inline: only programs that link Zeppelin
// call them (the MPI and copy-limit programs share this header).
inline std::string setting(const char* name) {
  const char* v = nullptr;
  if (zpGetParam(name, &v) != zpSuccess || v == nullptr) return "";
  return v;
}
inline int settingInt(const char* name, int otherwise) {
  const std::string v = setting(name);
  return v.empty() ? otherwise : atoi(v.c_str());
}

// ---- The command line: CLI11, through src/util/cli.h ----
// Every benchmark reads its flags this way: -h prints the help (on the
// launcher's rank 0 only) and exits 0; a bad command line prints
// "<prog>: <what>" and the help there and exits 2. check, if given, holds the
// rules between flags (it throws zp::cli::UsageError).
void parseCommandLine(CLI::App& app, int argc, char** argv, const std::function<void()>& check = nullptr);
// Readers of one flag's value, for zp::cli::addValue, in the benchmarks'
// words: a byte count with K/M/G suffixes ("bad -b 'x'"),
std::function<void(const std::string&)> bytesFlag(const char* flag, size_t* out);
// a whole number in [lo, hi] ("bad -n 'x': expected an integer >= 1"),
long long readInteger(const char* flag, const std::string& text, long long lo, long long hi);
template <typename T>
std::function<void(const std::string&)> intFlag(const char* flag, T* out, long long lo,
                                                long long hi = std::numeric_limits<T>::max()) {
  return [=](const std::string& text) { *out = static_cast<T>(readInteger(flag, text, lo, hi)); };
}
// a number >= lo ("bad -f 'x': expected a number >= 1").
std::function<void(const std::string&)> numberFlag(const char* flag, double lo, double* out);
// The sizes of the sweep, in bytes per rank.
std::vector<size_t> sizeSweep(const Options& opt);

// ---- Traffic patterns ----
// counts[src * n + dst]: elements rank src sends to rank dst.
struct Matrix {
  int n = 0;
  std::vector<size_t> counts;
  size_t at(int src, int dst) const { return counts[size_t(src) * size_t(n) + size_t(dst)]; }
};
// Elements each rank sends for a nominal size: rounded down to a multiple of
// n so that the uniform pattern divides evenly (as nccl-tests does).
size_t rowElems(size_t sizeBytes, int n, size_t typeSize);
// Reads the weights of -P matrix:FILE: n rows of n non-negative numbers.
bool readMatrixFile(const std::string& path, int n, std::vector<double>* weights, std::string* err);
// The pattern's matrix for one size. fileWeights is used only for "matrix".
Matrix buildMatrix(const Options& opt, int n, size_t sizeBytes,
                   const std::vector<double>& fileWeights);
// max over ranks of max(bytes sent, bytes received): the alltoallv algbw numerator.
size_t maxRankBytes(const Matrix& m, size_t typeSize);

// ---- Buffer layouts ----
// Where each peer's block lies in one rank's send or receive buffer, in
// elements. Blocks follow each other in peer order, separated by gaps of 0-2
// elements, so displacements are not all aligned and the gaps let the check
// catch writes outside the receive ranges.
struct Layout {
  std::vector<size_t> counts, displs;
  size_t totalElems = 0;  // end of the last block
};
Layout sendLayout(const Matrix& m, int rank);
Layout recvLayout(const Matrix& m, int rank);
// A buffer holding one block of count elements for (or from) peer, no gaps:
// lets point-to-point benchmarks use the same fill and check.
Layout singlePeerLayout(int n, int peer, size_t count);

// ---- Data fill and check ----
constexpr unsigned char kPoison = 0xA5;  // receive buffers before a checked run
constexpr size_t kGuardBytes = 4096;     // poisoned bytes after the last receive range
// A seed for one size's check data, different from any other size's.
uint64_t sizeSeed(uint64_t seed, size_t sizeBytes);
// Writes the value of elements [0, count) of the block src sends to dst.
void fillBlock(unsigned char* p, size_t count, const TypeInfo& t, uint64_t seed, int src, int dst);
// Number of bytes of the block that differ from what fillBlock writes.
size_t checkBlock(const unsigned char* p, size_t count, const TypeInfo& t, uint64_t seed, int src,
                  int dst);
// Number of bytes in [p, p + bytes) that are not equal to value.
size_t countNotEqual(const unsigned char* p, size_t bytes, unsigned char value);

// Fills a whole send buffer for a checked run (every block).
void fillSend(unsigned char* buf, const Layout& s, const TypeInfo& t, uint64_t seed, int rank);
// Poisons a receive buffer of totalElems elements plus kGuardBytes.
void poisonRecv(unsigned char* buf, const Layout& r, const TypeInfo& t);
// Wrong bytes after a checked run: each received block against its expected
// values, the gaps and guard against the poison, and the send buffer against
// what was sent (the library must not modify it). *firstError describes the
// first wrong byte found (left empty if none).
size_t checkRun(const unsigned char* sendBuf, const Layout& s, const unsigned char* recvBuf,
                const Layout& r, const TypeInfo& t, uint64_t seed, int rank,
                std::string* firstError);

// ---- Page-aligned buffer (at least one byte, so pointers are never NULL) ----
class Buffer {
 public:
  explicit Buffer(size_t bytes);
  ~Buffer();
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  unsigned char* data() const { return p_; }
  size_t size() const { return n_; }

 private:
  unsigned char* p_ = nullptr;
  size_t n_ = 0;
};

// ---- The emulated cluster's NICs (zprun --nodes ... sets these) ----
struct NicInfo {
  double bitsPerSec = 0;  // ZP_NIC_RATE_BPS; 0: not known, no NIC column
  int ranksPerNode = 1;   // ZP_LOCAL_NRANKS; ranks are laid out node by node
  int ranksPerNic = 1;    // ranks per node / ZP_NICS_PER_NODE, at least 1
  int nodeOf(int rank) const { return rank / ranksPerNode; }
};
NicInfo nicInfo();
// Percent of one NIC's rate that a rank moving `bytes` across nodes in
// `timeUs` uses, counting the ranks that share its NIC.
double nicPercent(const NicInfo& nic, double bytes, double timeUs);
// This node's NICs' transmitted bytes (the tx counters of zpnic0, zpnic1,
// ...; TCP/IP headers and retransmissions included; 0 where there is none).
std::vector<uint64_t> nicTxBytes(int nics);

// The lines every benchmark prints before its table: the library, the run's
// parameters (`params`), the shared-memory protocol, the %nic legend.
void printRunHeader(const char* prog, const std::string& library, const std::string& params, const NicInfo& nic);

// ---- Timing and the result table ----
double nowSeconds();  // CLOCK_MONOTONIC
// The calling thread's /proc/thread-self/schedstat: time on a core, time
// runnable but waiting for one, time slices run (zeros where unreadable).
struct SchedStat {
  double onCpuNs = 0, queuedNs = 0, slices = 0;
  SchedStat operator-(const SchedStat& o) const { return {onCpuNs - o.onCpuNs, queuedNs - o.queuedNs, slices - o.slices}; }
};
SchedStat schedStat();
// The same summed over the process's threads of the moment.
SchedStat processSchedStat();
// The machine's cores from /proc/stat (every core, every process; network
// namespaces do not separate it), in seconds of core time: what a run on
// an oversubscribed machine spent, and on what.
struct MachineCpu {
  double user = 0, sys = 0, softirq = 0, idle = 0, other = 0;  // other: nice, irq, iowait, steal
  MachineCpu operator-(const MachineCpu& o) const {
    return {user - o.user, sys - o.sys, softirq - o.softirq, idle - o.idle, other - o.other};
  }
};
MachineCpu machineCpu();
// This process's user and system CPU seconds and minor page faults (getrusage).
struct ProcessCpu {
  double user = 0, sys = 0, faults = 0;
  ProcessCpu operator-(const ProcessCpu& o) const { return {user - o.user, sys - o.sys, faults - o.faults}; }
};
ProcessCpu processCpu();
// The median of v (of an even count, the mean of the middle two).
double median(std::vector<double> v);
// nicColumn: add "%nic" (percent of a NIC's rate, see nicPercent).
void printTableHeader(bool nicColumn = false);
// wrong < 0 prints "N/A" (check disabled); nicPct < 0 prints no NIC column.
void printTableRow(size_t bytes, size_t count, const char* type, double timeUs, double algbw,
                   double busbw, long long wrong, double nicPct = -1);
void printTableFooter(unsigned long long totalWrong, bool checked, double busbwSum, int rows);

}  // namespace zpbench
