// zprun's command line: see options.h. CLI11 reads the options (src/util/cli.h);
// the values are checked by the parsers of src/util/strings.h, and the rules
// between options below.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/launcher/options.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "src/launcher/layout.h"
#include "src/util/cli.h"
#include "src/util/strings.h"

namespace zprun {
namespace {

using zp::cli::UsageError;

// A year is far longer than any job; the bound keeps deadline arithmetic sane.
constexpr double kMaxSeconds = 365.0 * 86400;
// At least 100kbit: below that, tc cannot express the bucket zprun uses.
constexpr double kMinRateBps = 1e5, kMaxRateBps = 1e15;
constexpr int kMinMtu = 576, kMaxMtu = 65535;

// Thrown by --mpirun as soon as CLI11 meets it: what follows is not zprun's
// (mpirun's arguments up to "--", then the program).
struct MpirunFound {};

const char* const kUsageLines =
    "Usage: zprun -n N [options] [--] PROGRAM [ARGS...]\n"
    "       zprun --nodes N [--ranks-per-node R] [--nics-per-node K] [--nic-rate RATE]\n"
    "             [--mtu BYTES] [options] [--] PROGRAM [ARGS...]\n"
    "       zprun --nodes N [cluster options] [options] --mpirun [MPIRUN-ARGS...] --\n"
    "             PROGRAM [ARGS...]\n"
    "       zprun --cleanup\n";

const char* const kDescription =
    "Starts N ranks of PROGRAM on this machine and hosts the rendezvous they\n"
    "meet at. Each rank finds its place in the environment, where\n"
    "zpCommInitFromEnv reads it: ZP_RANK, ZP_NRANKS, ZP_LOCAL_RANK,\n"
    "ZP_LOCAL_NRANKS, ZP_UNIQUE_ID, ZP_LAUNCHER=zprun; ZP_HOST_RANKS (every\n"
    "rank zprun starts here) tells shared memory's waiting which tasks are the\n"
    "job's. Options end at -- or at PROGRAM.";

bool isValidVarName(const std::string& name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  for (char c : name)
    if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
      return false;
  return true;
}

// -x VAR=VALUE, or -x VAR for zprun's own value (as mpirun's -x).
std::string extraVariable(const std::string& value) {
  size_t eq = value.find('=');
  std::string var = value.substr(0, eq);
  if (!isValidVarName(var)) throw UsageError("-x " + value + ": '" + var + "' is not a variable name");
  for (const char* reserved : kReservedVars)
    if (var == reserved) throw UsageError("-x " + value + ": " + var + " is set by zprun for each rank");
  if (eq != std::string::npos) return value;
  const char* own = getenv(var.c_str());
  if (own == nullptr) throw UsageError("-x " + var + ": " + var + " is not set");
  return var + "=" + own;
}

// A count in [1, max] into *out, or "bad <what> '<text>' (expected 1..<max>)".
std::function<void(const std::string&)> count(int* out, int max, const std::string& what) {
  return [=](const std::string& text) {
    if (!zp::parseInt(text, 1, max, out))
      throw UsageError("bad " + what + " '" + text + "' (expected 1.." + std::to_string(max) + ")");
  };
}

// A rate option's value in bits/s, in tc's syntax, as given (parseBitsPerSec
// would forgive spaces around it).
uint64_t rateOption(const std::string& option, const std::string& v) {
  double bps = 0;
  if (v != zp::trim(v) || !zp::parseBitsPerSec(v, &bps) || std::round(bps) < kMinRateBps ||
      std::round(bps) > kMaxRateBps)
    throw UsageError("bad " + option + " '" + v +
                     "' (expected a rate in tc's syntax from 100kbit to 1000tbit, e.g. 1gbit, 500mbit)");
  return static_cast<uint64_t>(std::round(bps));
}

// "I:K" into *id; the ranges are checked once --nodes and --nics-per-node are known.
bool parseNicId(const std::string& text, zpcluster::NicId* id) {
  size_t colon = text.find(':');
  return colon != std::string::npos && zp::parseInt(text.substr(0, colon), 0, zpcluster::kMaxNodes - 1, &id->node) &&
         zp::parseInt(text.substr(colon + 1), 0, zpcluster::kMaxNicsPerNode - 1, &id->nic);
}

// --nic-event I:K@T=WHAT: T in seconds (3, 3s, 500ms), WHAT a rate, down or up.
zpcluster::NicEvent nicEventOption(const std::string& v) {
  const std::string expected = "' (expected NODE:NIC@TIME=RATE|down|up, e.g. 1:2@3s=250mbit or 0:1@500ms=down)";
  size_t at = v.find('@'), eq = v.find('=');
  zpcluster::NicEvent e;
  if (at == std::string::npos || eq == std::string::npos || eq < at || !parseNicId(v.substr(0, at), &e.id))
    throw UsageError("bad --nic-event '" + v + expected);
  std::string when = v.substr(at + 1, eq - at - 1), what = v.substr(eq + 1);
  double scale = 1;
  if (when.size() > 2 && when.compare(when.size() - 2, 2, "ms") == 0) {
    scale = 1e-3;
    when.resize(when.size() - 2);
  } else if (!when.empty() && when.back() == 's') {
    when.pop_back();
  }
  if (!zp::parseDouble(when, 0, kMaxSeconds, &e.atSec)) throw UsageError("bad --nic-event '" + v + expected);
  e.atSec *= scale;
  if (what == "down") {
    e.kind = zpcluster::NicEvent::Kind::kDown;
  } else if (what == "up") {
    e.kind = zpcluster::NicEvent::Kind::kUp;
  } else {
    e.kind = zpcluster::NicEvent::Kind::kRate;
    e.rateBps = rateOption("--nic-event", what);
  }
  return e;
}

// Defines zprun's options on app, read into *o.
void defineOptions(CLI::App& app, Options* o) {
  zp::cli::configure(app, kUsageLines, 23);
  app.description(kDescription);
  // Options end at the program: its own options are never zprun's.
  app.prefix_command();

  zp::cli::addValue(app, "-n,--np", "N",
                    zp::strprintf("number of ranks, 1..%d (required without --nodes);\n"
                                  "also -np N, -nN",
                                  kMaxRanks),
                    count(&o->nranks, kMaxRanks, "rank count"));
  zp::cli::addFlag(app, "-p,--prefix", &o->prefix, "prefix every line of output with \"[RANK] \"");
  zp::cli::addValue(app, "-x", "VAR=VALUE",
                    "set VAR in the ranks' environment (repeatable);\n"
                    "-x VAR passes zprun's own value of VAR",
                    [o](const std::string& v) { o->extraEnv.push_back(extraVariable(v)); });
  zp::cli::addValue(app, "--timeout", "SEC",
                    zp::strprintf("terminate the job after SEC seconds (exit code %d)", kExitTimeout),
                    [o](const std::string& v) {
                      if (!zp::parseDouble(v, 0, kMaxSeconds, &o->timeoutSec) || o->timeoutSec <= 0)
                        throw UsageError("bad --timeout '" + v + "' (expected seconds > 0)");
                    });
  zp::cli::addFlag(app, "--stacks", &o->stacks,
                   "at the --timeout, print the threads' backtraces of every\n"
                   "rank still running (gdb, if installed) before ending them");
  zp::cli::addValue(app, "--grace", "SEC",
                    zp::strprintf("when a rank fails, how long the others may take to\n"
                                  "exit on their own before SIGTERM (default %g);\n"
                                  "SIGKILL follows %g s after SIGTERM",
                                  kDefaultGraceSec, kTermToKillSec),
                    [o](const std::string& v) {
                      if (!zp::parseDouble(v, 0, kMaxSeconds, &o->graceSec))
                        throw UsageError("bad --grace '" + v + "' (expected seconds >= 0)");
                    });

  const std::string cluster = "Emulated cluster (needs root: CAP_SYS_ADMIN and CAP_NET_ADMIN)";
  zp::cli::addValue(app, "--nodes", "N",
                    zp::strprintf("build N nodes on this machine (network namespaces,\n"
                                  "1..%d) and run R ranks in each; rank = node*R + local",
                                  zpcluster::kMaxNodes),
                    count(&o->cluster.nodes, zpcluster::kMaxNodes, "--nodes"))
      ->group(cluster);
  zp::cli::addValue(app, "--ranks-per-node", "R", "ranks per node (default 1); -n, if given, must be N*R",
                    count(&o->cluster.ranksPerNode, kMaxRanks, "--ranks-per-node"))
      ->group(cluster);
  zp::cli::addValue(app, "--nics-per-node", "K",
                    zp::strprintf("NICs per node, zpnic0..zpnic{K-1} (default 1, at most %d)",
                                  zpcluster::kMaxNicsPerNode),
                    count(&o->cluster.nicsPerNode, zpcluster::kMaxNicsPerNode, "--nics-per-node"))
      ->group(cluster);
  zp::cli::addValue(app, "--nic-rate", "RATE",
                    "rate of every NIC in each direction, in tc's syntax\n"
                    "(1gbit, 500mbit, 100mbps; default: not limited)",
                    [o](const std::string& v) {
                      o->cluster.rateBps = rateOption("--nic-rate", v);
                      o->rateText = v;
                    })
      ->group(cluster);
  zp::cli::addValue(app, "--nic-rate-of", "I:K=RATE",
                    "NIC K of node I runs at RATE from the start (repeatable),\n"
                    "a gray failure: the ranks are still told --nic-rate",
                    [o](const std::string& v) {
                      size_t eq = v.find('=');
                      zpcluster::NicRate r;
                      if (eq == std::string::npos || !parseNicId(v.substr(0, eq), &r.id))
                        throw UsageError("bad --nic-rate-of '" + v + "' (expected NODE:NIC=RATE, e.g. 1:2=100mbit)");
                      r.rateBps = rateOption("--nic-rate-of", v.substr(eq + 1));
                      o->cluster.nicRates.push_back(r);
                    })
      ->group(cluster);
  zp::cli::addValue(app, "--nic-event", "I:K@T=WHAT",
                    "at T after the ranks start (3s, 500ms), NIC K of node I\n"
                    "changes: WHAT is a rate, down or up (repeatable)",
                    [o](const std::string& v) { o->cluster.nicEvents.push_back(nicEventOption(v)); })
      ->group(cluster);
  zp::cli::addValue(app, "--mtu", "BYTES", zp::strprintf("MTU of the NICs (default %d)", zpcluster::kDefaultMtu),
                    [o](const std::string& v) {
                      if (!zp::parseInt(v, kMinMtu, kMaxMtu, &o->cluster.mtu))
                        throw UsageError("bad --mtu '" + v + "' (expected 576..65535)");
                    })
      ->group(cluster);
  zp::cli::addFlag(app, "--dry-run", &o->dryRun,
                   "print the commands that would build and remove the\n"
                   "cluster and where each rank would run; run nothing")
      ->group(cluster);
  zp::cli::addFlag(app, "--cleanup", &o->cleanup,
                   "remove the namespaces left by zprun processes that\n"
                   "died (SIGKILL) before removing their cluster, then exit")
      ->group(cluster);
  app.add_flag_callback(
         "--mpirun", [] { throw MpirunFound(); },
         zp::strprintf("run PROGRAM with Open MPI's mpirun (from PATH) instead:\n"
                       "mpirun runs in node 0, its daemons in the other nodes\n"
                       "(zprun is its remote shell), N*R ranks, node by node;\n"
                       "the runtime and the tcp BTL use the zpnic interfaces\n"
                       "only; the ranks get ZP_LOCAL_NRANKS, ZP_NNODES,\n"
                       "ZP_NICS_PER_NODE, ZP_NIC_RATE_BPS and zprun's -x\n"
                       "variables; with more ranks than cores, Open MPI yields\n"
                       "when idle. ARGS up to -- are added to mpirun's options\n"
                       "(e.g. --mca btl_tcp_links 2; not an --mca that zprun\n"
                       "sets, see --dry-run). -p is not available (mpirun's\n"
                       "--tag-output is). SIGKILL follows SIGTERM after %g s.\n"
                       "Exit status: mpirun's.",
                       kMpirunTermToKillSec))
      ->option_text("[ARGS] --")
      ->trigger_on_parse()
      ->disable_flag_override()
      ->group(cluster);

  app.footer(zp::strprintf(
      "NIC k of node i is 10.77.k.(i+1)/24; rail k (NIC k of every node) is one\n"
      "bridge. Each rank gets a hostname and boot id of its node, so ranks of a node\n"
      "share memory and other nodes are reached over the NICs, and also ZP_NODE_RANK,\n"
      "ZP_NNODES, ZP_NET_DEVICES and ZP_SOCKET_IFNAME (its NIC: zpnic<local rank %% K>),\n"
      "ZP_NIC_RATE_BPS (bits/s, 0: not limited) and ZP_NICS_PER_NODE; -x may set\n"
      "ZP_NET_DEVICES and ZP_SOCKET_IFNAME otherwise. Rank 0 hosts the rendezvous on\n"
      "10.77.0.1. The cluster is removed when the job ends.\n"
      "\n"
      "Rank 0 reads zprun's stdin; the other ranks read /dev/null. SIGINT,\n"
      "SIGTERM and SIGHUP are forwarded to every rank; a second one kills them.\n"
      "\n"
      "Exit status: 0 if every rank exited 0; otherwise the exit code of the\n"
      "first rank that failed (128+N for a rank killed by signal N), %d on\n"
      "timeout, %d if PROGRAM cannot be executed, %d for bad usage, %d if a cluster\n"
      "cannot be built for lack of privileges or tools, %d for other launch failures.",
      kExitTimeout, kExitCannotExec, kExitUsage, zpcluster::kExitNoPrivilege, kExitLaunchError));
}

// Reads zprun's options from args (the arguments without argv[0]) into *o.
// Returns how many of the last arguments are not zprun's options: the
// program and its arguments, or with *atMpirun, all that follows --mpirun.
size_t readOptions(const std::vector<std::string>& args, Options* o, bool* atMpirun) {
  CLI::App app("", "zprun");
  defineOptions(app, o);
  // CLI11's short options are one letter: mpirun's -np is zprun's --np. One
  // argument for one, so positions in args still hold.
  std::vector<std::string> spelled = args;
  std::replace(spelled.begin(), spelled.end(), std::string("-np"), std::string("--np"));
  *atMpirun = false;
  size_t unread = 0;
  try {
    zp::cli::parse(app, spelled, &unread);
  } catch (const MpirunFound&) {
    *atMpirun = true;
    return unread;
  }
  zp::cli::rejectUnknownOptions(app);
  o->clusterOptionSeen = app.count("--ranks-per-node") + app.count("--nics-per-node") + app.count("--nic-rate") +
                             app.count("--nic-rate-of") + app.count("--nic-event") + app.count("--mtu") +
                             app.count("--dry-run") >
                         0;
  return zp::cli::extras(app).size();
}

// The rules between options, once all are read.
void checkOptions(size_t nargs, Options* opts) {
  if (opts->cleanup) {
    if (nargs != 1) throw UsageError("--cleanup takes no other options and no program");
    return;
  }
  const zpcluster::ClusterSpec& cl = opts->cluster;
  if (opts->mpirun && cl.nodes == 0) throw UsageError("--mpirun needs --nodes");
  if (opts->mpirun && opts->prefix)
    throw UsageError("-p does not apply to --mpirun; mpirun's --tag-output does (--mpirun --tag-output --)");
  if (cl.nodes == 0 && opts->clusterOptionSeen)
    throw UsageError(
        "--ranks-per-node, --nics-per-node, --nic-rate, --nic-rate-of, --nic-event, --mtu and --dry-run need --nodes");
  if (cl.nodes > 0) {
    auto checkNic = [&](const zpcluster::NicId& id, const char* option) {
      if (id.node >= cl.nodes || id.nic >= cl.nicsPerNode)
        throw UsageError(zp::strprintf("%s: node %d NIC %d is not in the cluster (%d nodes of %d NICs, from 0)",
                                       option, id.node, id.nic, cl.nodes, cl.nicsPerNode));
    };
    for (const zpcluster::NicRate& r : cl.nicRates) checkNic(r.id, "--nic-rate-of");
    for (const zpcluster::NicEvent& e : cl.nicEvents) checkNic(e.id, "--nic-event");
    long total = static_cast<long>(cl.nodes) * cl.ranksPerNode;
    if (total > kMaxRanks)
      throw UsageError(zp::strprintf("%d nodes of %d ranks make %ld ranks, more than %d", cl.nodes,
                                     cl.ranksPerNode, total, kMaxRanks));
    if (opts->nranks != 0 && opts->nranks != total)
      throw UsageError(zp::strprintf("-n %d does not match --nodes %d x --ranks-per-node %d", opts->nranks,
                                     cl.nodes, cl.ranksPerNode));
    opts->nranks = static_cast<int>(total);
    for (const std::string& entry : opts->extraEnv) {
      std::string var = entry.substr(0, entry.find('='));
      for (const char* reserved : kReservedClusterVars)
        if (var == reserved)
          throw UsageError("-x " + entry + ": " + var + " is set by zprun for each rank of a cluster");
    }
  }
  if (opts->nranks == 0) throw UsageError("the number of ranks is required (-n N, or --nodes N)");
  if (opts->command.empty()) throw UsageError("no program given");
}

}  // namespace

ParseResult parseOptions(int argc, char** argv, Options* opts, std::string* error) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  try {
    bool atMpirun = false;
    size_t tail = readOptions(args, opts, &atMpirun);
    if (atMpirun) {
      // Everything up to "--" is mpirun's; the program follows. zprun's own
      // options are those before --mpirun, read again without it.
      auto end = args.end(), mpirunArgs = end - static_cast<long>(tail);
      auto mark = std::find(mpirunArgs, end, std::string("--"));
      if (mark == end) throw UsageError("--mpirun: end mpirun's arguments (if any) with --, then give the program");
      *opts = Options();
      bool again = false;  // stays false, and nothing is left: the program would have ended the options
      readOptions(std::vector<std::string>(args.begin(), mpirunArgs - 1), opts, &again);
      opts->mpirun = true;
      opts->mpirunArgs.assign(mpirunArgs, mark);
      opts->command.assign(mark + 1, end);
    } else {
      opts->command.assign(args.end() - static_cast<long>(tail), args.end());
    }
    checkOptions(args.size(), opts);
  } catch (const CLI::CallForHelp&) {
    return ParseResult::kHelp;
  } catch (const UsageError& e) {
    *error = e.what();
    return ParseResult::kError;
  }
  return ParseResult::kRun;
}

std::string usage() {
  Options unused;
  CLI::App app("", "zprun");
  defineOptions(app, &unused);
  return app.help();
}

}  // namespace zprun
