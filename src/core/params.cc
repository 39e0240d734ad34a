#include "src/core/params.h"

#include <strings.h>
#include <unistd.h>  // environ

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "src/core/log.h"
#include "src/util/strings.h"

namespace zp {

namespace {

using K = ParamKind;
using R = ParamRole;

// clang-format off
const std::vector<Param> kParams = {
  // Logging.
  {"ZP_DEBUG", K::kEnum, R::kSetting, "WARN", "NONE|VERSION|WARN|INFO|TRACE",
   "log level; INFO prints, per peer pair, the transport used"},
  {"ZP_DEBUG_SUBSYS", K::kList, R::kSetting, "ALL", "INIT,BOOTSTRAP,SHM,COLL,P2P,NET,ALL",
   "subsystems to log; a leading ^ excludes the ones named"},
  {"ZP_DEBUG_FILE", K::kPath, R::kSetting, "", "",
   "log to this file instead of stderr (%h: host name, %p: pid)"},
  {"ZP_DEBUG_ERRORS", K::kEnum, R::kSetting, "WARN", "WARN|INFO",
   "the level at which the error a call returns is logged (its text is zpGetLastError's too); Python's package "
   "sets INFO unless set, since its exceptions carry the text"},
  // Communicators.
  {"ZP_TIMEOUT", K::kSeconds, R::kSetting, "300", "0.001..2147483",
   "seconds a call waits for a silent peer before zpRemoteError (zpConfig_t.timeoutMs)"},
  {"ZP_WAIT_WARN", K::kSeconds, R::kSetting, "5", "0..2147483",
   "a call that has waited this long for its peers says so once in a WARN line (which call, which ranks); 0: never"},
  {"ZP_STRAGGLER_MS", K::kInt, R::kSetting, "10", "0..3600000",
   "a rank whose first messages of a call come last in most of the last 100 calls, this many milliseconds late on average, "
   "is named in one WARN line (zpCommGetWaitReport); 0: never named"},
  {"ZP_NODE_ID", K::kString, R::kSetting, "", "",
   "ranks with the same id share memory (default: host name and boot id; zpConfig_t.nodeId)"},
  {"ZP_SOCKET_IFNAME", K::kString, R::kSetting, "", "",
   "interface for the bootstrap sockets, and the NIC when none is found (default: loopback)"},
  {"ZP_NET_DEVICES", K::kList, R::kSetting, "", "",
   "the NICs ranks may use, by name, comma-separated (default: all the node's; zpConfig_t.netDevices)"},
  {"ZP_TOPO_FILE", K::kPath, R::kSetting, "", "",
   "a JSON description of the cluster (zptopo writes one), used instead of discovery"},
  {"ZP_SYSFS_ROOT", K::kPath, R::kSetting, "/sys", "",
   "where discovery reads sysfs (NICs, InfiniBand port rates, PCI GPUs); another root (a test fixture) also "
   "leaves hwloc out"},
  {"ZP_NIC_RATE_BPS", K::kRate, R::kCluster, "", "",
   "the rate of this rank's NIC where discovery cannot read it (tc notation: 1gbit, 500mbit; 0: unknown)"},
  {"ZP_CHECK_MODE", K::kEnum, R::kSetting, "local", "local|full",
   "device calls (a stream): local checks only this rank's arguments and enqueues, as NCCL does; full also compares "
   "every call's arguments with the peers' on the host first, so a mismatch is zpInvalidUsage on every rank instead "
   "of a hang or garbage on the device (host calls always compare; zpConfig_t.checkMode)"},
  // Routing.
  {"ZP_ROUTING", K::kEnum, R::kSetting, "balanced", "off|rail|balanced",
   "how inter-node traffic uses the node's NICs (zpConfig_t.routing)"},
  {"ZP_ROUTE_CHUNK", K::kSize, R::kSetting, "512K", "4K..256M",
   "routed transfers move in chunks of this size"},
  {"ZP_ROUTE_DIRECT_BELOW", K::kSize, R::kSetting, "512K", "0..1P",
   "transfers smaller than this are not relayed (measured with bench/route_perf)"},
  {"ZP_RAIL_SLOW", K::kInt, R::kSetting, "30", "0..99",
   "a rail whose measured rate falls below this percentage of the median of its node's other rails is slow: "
   "named in one WARN line and given bytes by its measured rate until it recovers (zpCommGetRailReport); 0: rails "
   "are planned by their nominal rates only"},
  // Shared memory.
  {"ZP_SHM_PROTO", K::kEnum, R::kSetting, "auto", "auto|cma|copy",
   "large messages: cma (one copy, process_vm_readv) when allowed, or copy (pipelined through the ring)"},
  {"ZP_SHM_REDUCE_COPY", K::kSize, R::kSetting, "0", "0..1P",
   "messages their receiver reduces (a reduce-scatter's blocks, recursive doubling's, a reduce's) go through the "
   "ring from this size on, pipelined (the sender copies while the receiver reduces), rather than read by the "
   "receiver by single copy; 0: at every size (measured: docs/collectives.md)"},
  {"ZP_SHM_EAGER", K::kSize, R::kSetting, "32K", "0..1P",
   "messages below this go through the ring even with single copy"},
  {"ZP_SHM_RING_BYTES", K::kSize, R::kSetting, "2M", "64K..1G pow2",
   "the data ring of each peer pair, a power of two"},
  {"ZP_SHM_SPIN_US", K::kInt, R::kSetting, "1000", "0..10000000",
   "microseconds a waiting rank polls before it sleeps while every runnable task has a core, or while the node "
   "has more ranks than cores and fewer runnable tasks than cores are not its ranks (yielding the core at each "
   "poll then); none while a single-copy transfer is under way, this node has more ranks than cores and more "
   "tasks are runnable than it has ranks (polling would delay the peer doing the copy), nor while at least one "
   "runnable task per core is not one of the job's ranks on this machine (ZP_SHM_SPIN_BUSY_US then; measured: "
   "docs/reliability.md, \"Under a busy CPU\")"},
  {"ZP_SHM_SPIN_BUSY_US", K::kInt, R::kSetting, "50", "0..10000000",
   "microseconds a waiting rank polls (without yielding) before it sleeps when more tasks are runnable than "
   "there are cores, the node has no more ranks than cores and fewer runnable tasks than cores are not its ranks "
   "(ZP_SHM_SPIN_US is the poll while a core is free), or as long as its recent waits took (twice their mean) "
   "where that is at most 16 times this: long enough for a peer running on another core to answer, short enough "
   "not to take the cores from the ones that must answer; 0: sleep at once. With at least one runnable task per "
   "core that is not one of the job's ranks on this machine a waiter polls this long (no longer) or sleeps at "
   "once, whichever its own recent waits have shown to leave it more time (tried anew now and then), where the "
   "job's ranks on this machine do not outnumber the cores; where they do, it sleeps at once "
   "(measured: docs/reliability.md, \"Under a busy CPU\")"},
  // The standard collectives.
  {"ZP_COLL_ALGO", K::kEnum, R::kSetting, "auto", "auto|ring|tree|direct",
   "the standard collectives' algorithms: by size and shape (auto); always rings; always the latency ones "
   "(recursive doubling, binomial trees, direct exchange); or always the one-node bandwidth ones (all-gather and "
   "reduce-scatter by direct exchange, all-reduce as the two)"},
  {"ZP_COLL_RING_ABOVE", K::kSize, R::kSetting, "256K", "0..1P",
   "with ZP_COLL_ALGO=auto, rings from this many bytes per rank on (measured: docs/collectives.md)"},
  {"ZP_COLL_SLICE", K::kSize, R::kSetting, "1M", "0..1P",
   "the hierarchical all-reduce across nodes pipelines slices of at most this many bytes of each node-local shard "
   "(the node's reduce-scatter of one, the network's all-reduce of the next, the node's all-gather of a third at "
   "once); 0: no slicing, one phase after another (measured: docs/collectives.md)"},
  // Device path (builds with CUDA).
  {"ZP_CUDA_DEVICE", K::kString, R::kSetting, "local", "local|current|none|0..",
   "the GPU of this rank's device data plane: local (the local rank modulo the visible devices), current (the "
   "calling thread's), an ordinal, or none (host buffers only, no NCCL communicator)"},
  // Launchers: zprun sets these, zpCommInitFromEnv and the tools read them.
  {"ZP_RANK", K::kInt, R::kLauncher, "", "0..16777216", "this process's rank"},
  {"ZP_NRANKS", K::kInt, R::kLauncher, "", "1..16777216", "the number of ranks"},
  {"ZP_LOCAL_RANK", K::kInt, R::kLauncher, "", "0..65535", "this process's rank among its node's"},
  {"ZP_LOCAL_NRANKS", K::kInt, R::kLauncher, "", "1..65536", "the number of ranks on this node"},
  {"ZP_HOST_RANKS", K::kInt, R::kLauncher, "", "1..16777216",
   "the job's ranks zprun runs on this machine (an emulated cluster's nodes share its cores): shared memory's "
   "waiting counts them as the job's own tasks, not as other load (default: this node's ranks)"},
  {"ZP_UNIQUE_ID", K::kString, R::kLauncher, "", "", "the zpUniqueId, hex-encoded"},
  {"ZP_LAUNCHER", K::kString, R::kLauncher, "", "", "the launcher that started the rank (zprun)"},
  {"ZP_MASTER_PORT", K::kInt, R::kLauncher, "", "1..65535",
   "under torchrun, srun, or mpirun with MASTER_ADDR: the port of rank 0's rendezvous (default: MASTER_PORT + 1; "
   "under srun without MASTER_PORT, one derived from SLURM_JOB_ID and SLURM_STEP_ID)"},
  {"ZP_SECRET", K::kString, R::kLauncher, "", "",
   "under torchrun, srun, or mpirun with MASTER_ADDR: a secret of 16 characters or more that every rank of the "
   "job shares, mixed into the rendezvous secret, so that a process that knows only the launcher's public "
   "variables cannot join; without it that secret is derived from those variables. zprun needs none (its "
   "ZP_UNIQUE_ID holds a random secret); Python's zeppelin.init() under torchrun draws one and hands it out "
   "through torchrun's store"},
  {"ZP_JOB_ID", K::kString, R::kLauncher, "", "",
   "what tells this rank's job from another started with the same unique id (default: the launcher's job "
   "variables: zprun's id, SLURM_JOB_ID and SLURM_STEP_ID, PMIX_NAMESPACE, OMPI_MCA_ess_base_jobid, "
   "TORCHELASTIC_RUN_ID, LSB_JOBID, PBS_JOBID); the bootstrap root refuses ranks of two jobs. Set it alike on "
   "every rank when the ranks of one communicator come from separate launches"},
  {"ZP_NODE_RANK", K::kInt, R::kCluster, "", "0..65535", "zprun's emulated cluster: this rank's node"},
  {"ZP_NNODES", K::kInt, R::kCluster, "", "1..65536", "zprun's emulated cluster: the number of nodes"},
  {"ZP_NICS_PER_NODE", K::kInt, R::kCluster, "", "1..1024", "zprun's emulated cluster: NICs of each node"},
};
// clang-format on

[[noreturn]] void undeclared(const char* name) {
  fprintf(stderr, "zeppelin: internal error: %s is read but not declared in src/core/params.cc\n", name);
  abort();
}

const Param& declared(const char* name) {
  const Param* p = findParam(name);
  if (!p) undeclared(name);
  return *p;
}

// "lo..hi" (with a " pow2" suffix for powers of two).
void splitRange(const Param& p, std::string* lo, std::string* hi, bool* pow2) {
  std::string r = p.range;
  *pow2 = false;
  size_t sp = r.find(' ');
  if (sp != std::string::npos) {
    *pow2 = r.substr(sp + 1) == "pow2";
    r = r.substr(0, sp);
  }
  size_t dots = r.find("..");
  *lo = dots == std::string::npos ? "" : r.substr(0, dots);
  *hi = dots == std::string::npos ? "" : r.substr(dots + 2);
}

bool parseBound(const std::string& text, ParamKind kind, double* out) {
  if (kind == K::kSize) {
    if (text.size() > 1 && (text.back() == 'P' || text.back() == 'p')) {  // 1P: no bound worth naming
      *out = 1125899906842624.0 * atof(text.c_str());
      return true;
    }
    size_t v = 0;
    if (!parseSize(text, &v)) return false;
    *out = (double)v;
    return true;
  }
  return parseDouble(text, -1e300, 1e300, out);
}

std::string rangeText(const Param& p) {
  std::string lo, hi;
  bool pow2 = false;
  splitRange(p, &lo, &hi, &pow2);
  std::string s = "from " + lo + " to " + hi;
  return pow2 ? s + ", a power of two" : s;
}

// The value checked against the declared range.
zpResult_t inRange(const Param& p, const std::string& value, double v) {
  std::string lo, hi;
  bool pow2 = false;
  splitRange(p, &lo, &hi, &pow2);
  double l = 0, h = 0;
  if (!parseBound(lo, p.kind, &l) || !parseBound(hi, p.kind, &h)) undeclared(p.name);
  bool ok = v >= l && v <= h;
  if (pow2) ok = ok && v >= 1 && ((unsigned long long)v & ((unsigned long long)v - 1)) == 0;
  if (!ok) return fail(zpInvalidArgument, "%s='%s': expected a %s %s", p.name, value.c_str(), paramKindName(p.kind),
                       rangeText(p).c_str());
  return zpSuccess;
}

}  // namespace

const std::vector<Param>& paramTable() { return kParams; }

const Param* findParam(const std::string& name) {
  for (const Param& p : kParams)
    if (name == p.name) return &p;
  return nullptr;
}

const char* paramKindName(ParamKind kind) {
  switch (kind) {
    case K::kEnum: return "enum";
    case K::kList: return "list";
    case K::kString: return "string";
    case K::kPath: return "path";
    case K::kSeconds: return "seconds";
    case K::kSize: return "size";
    case K::kInt: return "integer";
    case K::kRate: return "rate";
  }
  return "?";
}

const char* paramRoleName(ParamRole role) {
  switch (role) {
    case R::kSetting: return "setting";
    case R::kLauncher: return "launcher";
    case R::kCluster: return "emulated cluster";
  }
  return "?";
}

std::string envString(const char* name, const std::string& dflt) {
  if (!strncmp(name, "ZP_", 3)) declared(name);
  const char* v = getenv(name);
  return (v && *v) ? std::string(v) : dflt;
}

// The enum value's index among p's values, or -1.
int enumIndex(const Param& p, const std::string& v) {
  const std::string values = p.range;
  int i = 0;
  for (size_t b = 0;; i++) {
    size_t e = values.find('|', b);
    std::string one = values.substr(b, e == std::string::npos ? std::string::npos : e - b);
    if (!strcasecmp(one.c_str(), v.c_str())) return i;
    if (e == std::string::npos) return -1;
    b = e + 1;
  }
}

std::string commaSeparated(const char* values) {
  std::string s = values;
  for (char& c : s)
    if (c == '|') c = ',';
  return s;
}

zpResult_t checkParamValue(const Param& p, const std::string& v, double* num, int* index) {
  const char* name = p.name;
  double n = 0;
  switch (p.kind) {
    case K::kEnum: {
      const int i = enumIndex(p, v);
      if (i < 0) return fail(zpInvalidArgument, "%s='%s': expected one of %s", name, v.c_str(), commaSeparated(p.range).c_str());
      if (index) *index = i;
      return zpSuccess;
    }
    case K::kList: {  // comma-separated; with declared values, each (after an optional leading ^) one of them
      if (!*p.range) return zpSuccess;
      const std::string allowed = std::string(",") + p.range + ",";
      size_t b = v[0] == '^' ? 1 : 0;
      for (;;) {
        size_t e = v.find(',', b);
        std::string item = v.substr(b, e == std::string::npos ? std::string::npos : e - b);
        std::string upper = item;
        for (char& c : upper) c = (char)toupper((unsigned char)c);
        if (item.empty() || allowed.find("," + upper + ",") == std::string::npos)
          return fail(zpInvalidArgument, "%s='%s': '%s' is not one of %s", name, v.c_str(), item.c_str(), p.range);
        if (e == std::string::npos) return zpSuccess;
        b = e + 1;
      }
    }
    case K::kString:
    case K::kPath:
      return zpSuccess;
    case K::kSize: {
      size_t bytes = 0;
      if (!parseSize(v, &bytes)) return fail(zpInvalidArgument, "%s='%s' is not a size (%s)", name, v.c_str(), rangeText(p).c_str());
      n = (double)bytes;
      break;
    }
    case K::kInt: {
      long long i = 0;
      if (!parseInt(v, (long long)-1e18, (long long)1e18, &i))
        return fail(zpInvalidArgument, "%s='%s' is not an integer (%s)", name, v.c_str(), rangeText(p).c_str());
      n = (double)i;
      break;
    }
    case K::kSeconds:
      if (!parseDouble(v, -1e300, 1e300, &n))
        return fail(zpInvalidArgument, "%s='%s' is not a number of seconds (%s)", name, v.c_str(), rangeText(p).c_str());
      break;
    case K::kRate:
      if (!parseBitsPerSec(v, &n))
        return fail(zpInvalidArgument, "%s='%s' is not a rate: expected bits/s, e.g. 1000000000 or 1gbit", name, v.c_str());
      if (num) *num = n;
      return zpSuccess;
  }
  if (*p.range) ZP_CHECK(inRange(p, v, n));
  if (num) *num = n;
  return zpSuccess;
}

zpResult_t paramSize(const char* name, size_t* out) {
  std::string v = envString(name);
  double n = 0;
  if (v.empty()) return zpSuccess;
  ZP_CHECK(checkParamValue(declared(name), v, &n, nullptr));
  *out = (size_t)n;
  return zpSuccess;
}

zpResult_t paramInt(const char* name, long long* out) {
  std::string v = envString(name);
  double n = 0;
  if (v.empty()) return zpSuccess;
  ZP_CHECK(checkParamValue(declared(name), v, &n, nullptr));
  *out = (long long)n;
  return zpSuccess;
}

zpResult_t paramSeconds(const char* name, double* out) {
  std::string v = envString(name);
  if (v.empty()) return zpSuccess;
  return checkParamValue(declared(name), v, out, nullptr);
}

zpResult_t paramRate(const char* name, double* bitsPerSec) {
  std::string v = envString(name);
  if (v.empty()) return zpSuccess;
  return checkParamValue(declared(name), v, bitsPerSec, nullptr);
}

zpResult_t paramEnum(const char* name, int* out) {
  std::string v = envString(name);
  if (v.empty()) return zpSuccess;
  return checkParamValue(declared(name), v, nullptr, out);
}

zpResult_t checkEnvironment() {
  for (char** e = environ; *e; e++) {
    if (strncmp(*e, "ZP_", 3)) continue;
    const char* eq = strchr(*e, '=');
    if (!eq || !eq[1]) continue;
    const Param* p = findParam(std::string(*e, (size_t)(eq - *e)));
    if (p && p->role == R::kSetting) ZP_CHECK(checkParamValue(*p, eq + 1, nullptr, nullptr));
  }
  return zpSuccess;
}

std::string paramsMarkdown() {
  std::string s = "| variable | role | kind | default | valid | meaning |\n| --- | --- | --- | --- | --- | --- |\n";
  for (const Param& p : kParams) {
    std::string range = p.range;
    for (char& c : range)
      if (c == '|') c = ',';
    s += strprintf("| `%s` | %s | %s | %s | %s | %s |\n", p.name, paramRoleName(p.role), paramKindName(p.kind),
                   *p.dflt ? (std::string("`") + p.dflt + "`").c_str() : "", range.c_str(), p.doc);
  }
  return s;
}

std::string paramsText() {
  std::string s;
  for (const Param& p : kParams) {
    std::string range = p.range;
    s += strprintf("%-22s %-16s %-8s default %-9s %s\n%-22s %s\n", p.name, paramRoleName(p.role),
                   paramKindName(p.kind), *p.dflt ? p.dflt : "-", range.c_str(), "", p.doc);
  }
  return s;
}

}  // namespace zp
