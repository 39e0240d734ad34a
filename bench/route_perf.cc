// route_perf: what the router does for inter-node traffic, on an emulated
// cluster (zprun --nodes N --ranks-per-node R --nics-per-node K --nic-rate X).
//
// Patterns (S = the size of the row, in bytes):
//   single   rank 0 sends S to the rank with local index 0 on node 1;
//   ring     the first rank of every node sends S to the first rank of the
//            next node (one ring hop across nodes, as ring attention's
//            inter-node ring makes);
//   zipf     alltoallv, n*S bytes in all; pair (s, d) gets a share
//            proportional to z(s) z(d), z(k) = 1 / (1 + pi(k))^1.2 for a
//            seeded permutation pi: a few ranks send and receive most;
//   uniform  alltoallv, S to every rank.
// single and ring use zpSend / zpRecv (the sender picks the path alone);
// zipf and uniform use zpAlltoallv (the router plans the whole call).
//
// Each pattern and size runs once per routing mode (-m, default
// off,rail,balanced), each mode on a communicator of its own, in one run.
// Columns: time per call (the slowest rank's mean), GB/s = the busiest
// node's inter-node bytes in one direction per second, %nics = the fraction
// of that node's summed NIC rate (K x ZP_NIC_RATE_BPS) this is, x_off = the
// speedup over routing off, and the bytes each NIC of node 0 and node 1 sent
// (tx counters of the interfaces zpnic*, MiB per call, TCP/IP headers
// and any retransmissions included). -c 1 checks every received byte of one
// more call per row.
//
// Under each row, over the timed calls, per call: "sched", each rank's time
// on a core and runnable without one; "cpu", where the machine's cores went
// (/proc/stat: every process, namespaces do not separate it; an idle share
// near 0 says the cores, not the NICs, set the time), the ranks' own user
// and system time and page faults, and the window's CLOCK_MONOTONIC times,
// to cut a `perf record -a -k CLOCK_MONOTONIC` profile to the timed calls
// (`perf report --time FROM,TO`).
//
// Built against MPI as mpi_route_perf (one mode, "mpi": the same traffic
// with MPI_Isend/Irecv and MPI_Alltoallv) for comparison.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "src/util/cli.h"
#include "src/util/strings.h"
#ifdef ZP_BENCH_MPI
#include "mpi_comm.h"
#else
#include "zp_comm.h"
#endif

namespace {

using zpbench::nowSeconds;

int gRank = 0, gN = 1;

std::vector<std::string> splitList(const std::string& list) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= list.size()) {
    size_t comma = list.find(',', at);
    if (comma == std::string::npos) comma = list.size();
    out.push_back(list.substr(at, comma - at));
    at = comma + 1;
  }
  return out;
}

using zpbench::BenchComm;

[[noreturn]] void die(const char* what, const std::string& why) {
  fprintf(stderr, "route_perf: rank %d: %s: %s\n", gRank, what, why.c_str());
  exit(1);
}

#ifndef ZP_BENCH_MPI
int routingOf(const std::string& mode) {
  if (mode == "off") return zpRoutingOff;
  if (mode == "rail") return zpRoutingRail;
  if (mode == "balanced") return zpRoutingBalanced;
  die("-m", "unknown routing mode '" + mode + "' (off, rail, balanced)");
}
#endif

uint8_t expected(int src, int dst, size_t i, uint64_t seed) {
  uint64_t x = seed ^ (uint64_t)src * 0x9E3779B97F4A7C15ull ^ (uint64_t)dst * 0xC2B2AE3D27D4EB4Full ^ i;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return (uint8_t)x;
}

struct Traffic {
  std::vector<std::vector<size_t>> bytes;  // [src][dst]
  bool pointToPoint = false;
};

Traffic makeTraffic(const std::string& pattern, size_t S, int rpn, uint64_t seed) {
  Traffic t;
  t.bytes.assign(gN, std::vector<size_t>(gN, 0));
  int nodes = gN / rpn;
  if (pattern == "single") {
    t.pointToPoint = true;
    t.bytes[0][rpn] = S;
  } else if (pattern == "ring") {
    t.pointToPoint = true;
    for (int i = 0; i < nodes; i++) t.bytes[i * rpn][((i + 1) % nodes) * rpn] = S;
  } else if (pattern == "uniform") {
    for (auto& row : t.bytes) std::fill(row.begin(), row.end(), S);
  } else if (pattern == "zipf") {
    std::vector<int> perm(gN);
    for (int i = 0; i < gN; i++) perm[i] = i;
    std::mt19937_64 rng(seed);
    std::shuffle(perm.begin(), perm.end(), rng);
    std::vector<double> z(gN);
    double sum = 0;
    for (int i = 0; i < gN; i++) sum += z[i] = 1.0 / std::pow(1.0 + perm[i], 1.2);
    for (int s = 0; s < gN; s++)
      for (int d = 0; d < gN; d++) t.bytes[s][d] = (size_t)((double)S * gN * gN * z[s] / sum * z[d] / sum);
  } else {
    die("-p", "unknown pattern '" + pattern + "' (single, ring, zipf, uniform)");
  }
  return t;
}

// Runs the traffic once; check: with fresh bytes, every received byte checked.
long long runOnce(BenchComm& comm, const Traffic& t, std::vector<uint8_t>& sbuf, std::vector<uint8_t>& rbuf, bool check,
                  uint64_t seed) {
  const auto& B = t.bytes;
  zpbench::Layout sl, rl;  // blocks packed in peer order
  sl.counts.resize(gN);
  sl.displs.resize(gN);
  rl.counts.resize(gN);
  rl.displs.resize(gN);
  for (int p = 0; p < gN; p++) {
    sl.counts[p] = B[gRank][p];
    sl.displs[p] = sl.totalElems;
    sl.totalElems += sl.counts[p];
    rl.counts[p] = B[p][gRank];
    rl.displs[p] = rl.totalElems;
    rl.totalElems += rl.counts[p];
  }
  const std::vector<size_t>&sc = sl.counts, &sd = sl.displs, &rc = rl.counts, &rd = rl.displs;
  const size_t ro = rl.totalElems;
  if (check) {
    for (int p = 0; p < gN; p++)
      for (size_t i = 0; i < sc[p]; i++) sbuf[sd[p] + i] = expected(gRank, p, i, seed);
    std::fill(rbuf.begin(), rbuf.end(), 0xA5);
  }
  if (t.pointToPoint) {
    int to = -1, from = -1;
    for (int p = 0; p < gN; p++) {
      if (sc[p]) to = p;
      if (rc[p]) from = p;
    }
    if (to >= 0 || from >= 0)
      comm.sendrecvBytes(sbuf.data() + (to >= 0 ? sd[to] : 0), to >= 0 ? sc[to] : 0, to,
                         rbuf.data() + (from >= 0 ? rd[from] : 0), from >= 0 ? rc[from] : 0, from);
  } else {
    comm.alltoallv(sbuf.data(), sl, rbuf.data(), rl, *zpbench::findType("uint8"));
  }
  if (!check) return 0;
  long long wrong = 0;
  for (int p = 0; p < gN; p++)
    for (size_t i = 0; i < rc[p]; i++) wrong += rbuf[rd[p] + i] != expected(p, gRank, i, seed);
  for (size_t i = ro; i < rbuf.size(); i++) wrong += rbuf[i] != 0xA5;
  return wrong;
}

}  // namespace

int main(int argc, char** argv) {
  size_t minB = 64u << 20, maxB = 64u << 20;
  double factor = 2;
  int iters = 3, warmup = 1, check = 1;
  uint64_t seed = 1;
  std::string patterns = "single,ring,zipf,uniform", modes = "off,rail,balanced";
  CLI::App app("", "route_perf");
  zp::cli::configure(app,
                     "usage: route_perf [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-c 0|1]\n"
                     "                  [-p single,ring,zipf,uniform] [-m off,rail,balanced] [-s SEED]\n",
                     14);
  app.description("What the router does for inter-node traffic (see the top of route_perf.cc).\n"
                  "Run under zprun --nodes N --ranks-per-node R --nics-per-node K --nic-rate X.");
  using zp::cli::addValue;
  addValue(app, "-b", "MIN", "smallest size, bytes (K/M/G suffixes; default 64M)", zpbench::bytesFlag("-b", &minB));
  addValue(app, "-e", "MAX", "largest size (default 64M)", zpbench::bytesFlag("-e", &maxB));
  addValue(app, "-f", "FACTOR", "multiply the size by this each step (> 1; default 2)", [&](const std::string& v) {
    if (!zp::parseDouble(v, 1, DBL_MAX, &factor) || factor <= 1)
      throw zp::cli::UsageError("bad -f '" + v + "': expected a number > 1");
  });
  addValue(app, "-n", "ITERS", "timed calls per row (default 3)", zpbench::intFlag("-n", &iters, 1));
  addValue(app, "-w", "WARMUP", "untimed calls per row (default 1)", zpbench::intFlag("-w", &warmup, 0));
  addValue(app, "-c", "0|1", "check every received byte of one more call (default 1)",
           zpbench::intFlag("-c", &check, 0, 1));
  addValue(app, "-p", "LIST", "patterns (default single,ring,zipf,uniform)",
           [&](const std::string& v) { patterns = v; });
  addValue(app, "-m", "LIST", "routing modes (default off,rail,balanced)", [&](const std::string& v) { modes = v; });
  addValue(app, "-s", "SEED", "seed of the zipf pattern and the data (default 1)",
           [&](const std::string& v) { seed = (uint64_t)zpbench::readInteger("-s", v, 0, LLONG_MAX); });
  zpbench::parseCommandLine(app, argc, argv, [&] {
    if (minB == 0 || maxB < minB) throw zp::cli::UsageError("-b must be at least 1 and at most -e");
  });
  // One communicator per routing mode (over MPI: one, "mpi").
#ifdef ZP_BENCH_MPI
  std::vector<std::string> modeList = {"mpi"};
  std::vector<BenchComm> comms(1);
  comms[0].init(&argc, &argv);
#else
  std::vector<std::string> modeList = splitList(modes);
  std::vector<BenchComm> comms(modeList.size());
  comms[0].init(&argc, &argv, routingOf(modeList[0]));
  for (size_t m = 1; m < modeList.size(); m++) comms[m].initLike(comms[0], routingOf(modeList[m]));
#endif
  gRank = comms[0].rank();
  gN = comms[0].nranks();
  zpbench::NicInfo nic = zpbench::nicInfo();
  const int rpn = nic.ranksPerNode, nodes = gN / rpn;
  // zprun's description of the emulated cluster, from the environment:
  // this source is built against MPI too (mpi_route_perf), which links no Zeppelin.
  const int nics = std::max(1, atoi(getenv("ZP_NICS_PER_NODE") ? getenv("ZP_NICS_PER_NODE") : "1"));
  if (nodes < 2 || gN % rpn) die("setup", "needs at least 2 nodes of equal size (zprun --nodes)");
  const bool reportsNics = gRank % rpn == 0;  // one rank per node reads its node's counters

  if (gRank == 0) {
    printf("# route_perf: %s, zpSend/zpRecv or MPI_Isend/Irecv for single and ring; %d nodes x %d ranks, %d NICs per node at %.3g bit/s\n", comms[0].describe().c_str(), nodes, rpn, nics,
           nic.bitsPerSec);
    printf("# GB/s: the busiest node's inter-node bytes (one direction) per second; %%nics: of its %d NICs' summed "
           "rate\n# tx MiB: per call, sent by each NIC of node 0 | node 1\n",
           nics);
    printf("%-8s %11s %-8s %11s %7s %6s %6s %7s  %s\n", "pattern", "size", "mode", "time(us)", "GB/s", "%nics",
           "x_off", "#wrong", "tx MiB");
  }
  std::vector<std::string> patternList = splitList(patterns);
  int failed = 0;
  for (const std::string& pattern : patternList)
    for (size_t S = minB; S <= maxB; S = (size_t)(S * factor)) {
      Traffic t = makeTraffic(pattern, S, rpn, seed);
      size_t sTot = 0, rTot = 0;
      double nodeMax = 0;  // the busiest node direction's inter-node bytes
      for (int a = 0; a < nodes; a++) {
        double out = 0, in = 0;
        for (int s = 0; s < gN; s++)
          for (int d = 0; d < gN; d++) {
            if (s / rpn == d / rpn) continue;
            if (s / rpn == a) out += t.bytes[s][d];
            if (d / rpn == a) in += t.bytes[s][d];
          }
        nodeMax = std::max(nodeMax, std::max(out, in));
      }
      for (int p = 0; p < gN; p++) {
        sTot += t.bytes[gRank][p];
        rTot += t.bytes[p][gRank];
      }
      std::vector<uint8_t> sbuf(std::max<size_t>(sTot, 1)), rbuf(rTot + 4096);
      double offTime = 0;
      for (size_t m = 0; m < modeList.size(); m++) {
        BenchComm& comm = comms[m];
        for (int w = 0; w < warmup; w++) runOnce(comm, t, sbuf, rbuf, false, seed);
        comm.barrier();
        std::vector<uint64_t> tx0 = reportsNics ? zpbench::nicTxBytes(nics) : std::vector<uint64_t>(nics, 0);
        const zpbench::SchedStat sched0 = zpbench::processSchedStat();
        const zpbench::MachineCpu machine0 = zpbench::machineCpu();
        const zpbench::ProcessCpu cpu0 = zpbench::processCpu();
        double t0 = nowSeconds();
        for (int it = 0; it < iters; it++) runOnce(comm, t, sbuf, rbuf, false, seed);
        double mine = (nowSeconds() - t0) / iters;
        comm.barrier();  // every rank done: every byte of the loop has left its NIC
        // (after the barrier: a proxy relays while it waits in it)
        const zpbench::SchedStat sched = zpbench::processSchedStat() - sched0;
        const zpbench::ProcessCpu cpu = zpbench::processCpu() - cpu0;
        const zpbench::MachineCpu machine = zpbench::machineCpu() - machine0;
        const double span = nowSeconds() - t0;
        std::vector<uint64_t> tx1 = reportsNics ? zpbench::nicTxBytes(nics) : std::vector<uint64_t>(nics, 0);
        // Counters of the interval, and the time of the slowest rank (in ns).
        std::vector<uint64_t> row(nics + 1);
        for (int k = 0; k < nics; k++) row[k] = (tx1[k] - tx0[k]) / iters;
        row[nics] = (uint64_t)(mine * 1e9);
        long long wrong = check ? runOnce(comm, t, sbuf, rbuf, true, seed + 1 + S) : -1;
        std::vector<uint64_t> all = comm.allgatherU64(row);
        std::vector<uint64_t> wrongs = comm.allgatherU64({(uint64_t)std::max(0LL, wrong)});
        // Each rank's threads' time on a core and waiting for one over the
        // timed calls: on a busy machine, whether the ranks got the cores.
        std::vector<uint64_t> scheds =
            comm.allgatherU64({(uint64_t)(sched.onCpuNs / iters), (uint64_t)(sched.queuedNs / iters)});
        std::vector<uint64_t> cpus = comm.allgatherU64({(uint64_t)(cpu.user * 1e6 / iters), (uint64_t)(cpu.sys * 1e6 / iters), (uint64_t)(cpu.faults / iters)});
        if (gRank != 0) continue;
        double time = 0;
        long long wrongSum = 0;
        for (int r = 0; r < gN; r++) {
          time = std::max(time, all[r * (nics + 1) + nics] * 1e-9);
          wrongSum += (long long)wrongs[r];
        }
        if (modeList[m] == "off") offTime = time;
        double gbps = nodeMax / time / 1e9;
        double pct = nic.bitsPerSec > 0 ? 100.0 * nodeMax * 8 / time / (nic.bitsPerSec * nics) : -1;
        char xoff[16] = "-";
        if (offTime > 0) snprintf(xoff, sizeof xoff, "%.2f", offTime / time);
        std::string tx;
        for (int node = 0; node < 2; node++) {
          for (int k = 0; k < nics; k++) {
            char b[24];
            snprintf(b, sizeof b, "%s%.0f", k ? " " : "", all[node * rpn * (nics + 1) + k] / 1048576.0);
            tx += b;
          }
          if (node == 0) tx += " | ";
        }
        char wrongText[24];
        if (check) snprintf(wrongText, sizeof wrongText, "%lld", wrongSum);
        else snprintf(wrongText, sizeof wrongText, "N/A");
        printf("%-8s %11zu %-8s %11.0f %7.3f %6.1f %6s %7s  %s\n", pattern.c_str(), S, modeList[m].c_str(),
               time * 1e6, gbps, pct, xoff, wrongText, tx.c_str());
        fflush(stdout);
        if (wrongSum) failed = 1;
        std::string ranks;
        for (int r = 0; r < gN; r++) {
          char b[48];
          snprintf(b, sizeof b, " %d:%.0f/%.0f", r, scheds[2 * r] * 1e-6, scheds[2 * r + 1] * 1e-6);
          ranks += b;
        }
        printf("#  sched %s: per call, each rank's ms on a core / ms waiting for one:%s\n", modeList[m].c_str(),
               ranks.c_str());
        // Where the machine's core time went over the timed calls (and the
        // barrier after them: span), per call: on an oversubscribed machine
        // an idle share near 0 says the cores, not the NICs, set the time.
        double rankUser = 0, rankSys = 0, rankFaults = 0;
        for (int r = 0; r < gN; r++) {
          rankUser += cpus[3 * r] * 1e-3;
          rankSys += cpus[3 * r + 1] * 1e-3;
          rankFaults += (double)cpus[3 * r + 2];
        }
        printf("#  cpu %s: per call, the machine's %ld cores over %.0f ms: user %.0f sys %.0f softirq %.0f idle %.0f "
               "other %.0f ms; the ranks' own user %.0f sys %.0f ms, %.0f page faults (CLOCK_MONOTONIC %.3f-%.3f s: a window for perf record "
               "-k CLOCK_MONOTONIC)\n",
               modeList[m].c_str(), sysconf(_SC_NPROCESSORS_ONLN), span * 1e3 / iters, machine.user * 1e3 / iters,
               machine.sys * 1e3 / iters, machine.softirq * 1e3 / iters, machine.idle * 1e3 / iters,
               machine.other * 1e3 / iters, rankUser, rankSys, rankFaults, t0, t0 + span);
        fflush(stdout);
      }
    }
  for (BenchComm& comm : comms) comm.finalize();
  return failed;
}
