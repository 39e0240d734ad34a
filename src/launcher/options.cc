// zprun's command line (options.h).
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/launcher/options.h"

#include <cctype>
#include <cstdlib>
#include <cstring>

#include "src/util/strings.h"

namespace zprun {

namespace {
bool parseRankCount(const std::string& text, int* out) { return zp::parseInt(text, 1, kMaxRanks, out); }

// A positive count up to max.
bool parseCount(const std::string& text, int max, int* out) { return zp::parseInt(text, 1, max, out); }

// A year is far longer than any job; the bound keeps deadline arithmetic sane.
bool parseSeconds(const std::string& text, double* out) { return zp::parseDouble(text, 0, 365.0 * 86400, out); }

bool isValidVarName(const std::string& name) {
  if (name.empty() || (name[0] >= '0' && name[0] <= '9')) return false;
  for (char c : name)
    if (!(c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')))
      return false;
  return true;
}

}  // namespace

void printUsage(FILE* out) {
  fprintf(out,
          "Usage: zprun -n N [options] [--] PROGRAM [ARGS...]\n"
          "       zprun --nodes N [--ranks-per-node R] [--nics-per-node K] [--nic-rate RATE]\n"
          "             [--mtu BYTES] [options] [--] PROGRAM [ARGS...]\n"
          "       zprun --nodes N [cluster options] [options] --mpirun [MPIRUN-ARGS...] --\n"
          "             PROGRAM [ARGS...]\n"
          "       zprun --cleanup\n"
          "\n"
          "Starts N ranks of PROGRAM on this machine and hosts the rendezvous they\n"
          "meet at. Each rank finds its place in the environment, where\n"
          "zpCommInitFromEnv reads it: ZP_RANK, ZP_NRANKS, ZP_LOCAL_RANK,\n"
          "ZP_LOCAL_NRANKS, ZP_UNIQUE_ID, ZP_LAUNCHER=zprun.\n"
          "\n"
          "Options:\n"
          "  -n, -np N        number of ranks, 1..%d (required without --nodes)\n"
          "  -p, --prefix     prefix every line of output with \"[RANK] \"\n"
          "  -x VAR=VALUE     set VAR in the ranks' environment (repeatable);\n"
          "                   -x VAR passes zprun's own value of VAR\n"
          "  --timeout SEC    terminate the job after SEC seconds (exit code %d)\n"
          "  --grace SEC      when a rank fails, how long the others may take to\n"
          "                   exit on their own before SIGTERM (default %g);\n"
          "                   SIGKILL follows %g s after SIGTERM\n"
          "  -h, --help       show this help\n"
          "  --               end of options\n"
          "\n"
          "Emulated cluster (needs root: CAP_SYS_ADMIN and CAP_NET_ADMIN):\n"
          "  --nodes N           build N nodes on this machine (network namespaces,\n"
          "                      1..%d) and run R ranks in each; rank = node*R + local\n"
          "  --ranks-per-node R  ranks per node (default 1); -n, if given, must be N*R\n"
          "  --nics-per-node K   NICs per node, zpnic0..zpnic{K-1} (default 1, at most %d)\n"
          "  --nic-rate RATE     rate of every NIC in each direction, in tc's syntax\n"
          "                      (1gbit, 500mbit, 100mbps; default: not limited)\n"
          "  --mtu BYTES         MTU of the NICs (default %d)\n"
          "  --dry-run           print the commands that would build and remove the\n"
          "                      cluster and where each rank would run; run nothing\n"
          "  --cleanup           remove the namespaces left by zprun processes that\n"
          "                      died (SIGKILL) before removing their cluster, then exit\n"
          "  --mpirun [ARGS] --  run PROGRAM with Open MPI's mpirun (from PATH) instead:\n"
          "                      mpirun runs in node 0, its daemons in the other nodes\n"
          "                      (zprun is its remote shell), N*R ranks, node by node;\n"
          "                      the runtime and the tcp BTL use the zpnic interfaces\n"
          "                      only; the ranks get ZP_LOCAL_NRANKS, ZP_NNODES,\n"
          "                      ZP_NICS_PER_NODE, ZP_NIC_RATE_BPS and zprun's -x\n"
          "                      variables; with more ranks than cores, Open MPI yields\n"
          "                      when idle. ARGS up to -- are added to mpirun's options\n"
          "                      (e.g. --mca btl_tcp_links 2; not an --mca that zprun\n"
          "                      sets, see --dry-run). -p is not available (mpirun's\n"
          "                      --tag-output is). SIGKILL follows SIGTERM after 10 s.\n"
          "                      Exit status: mpirun's.\n"
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
          "cannot be built for lack of privileges or tools, %d for other launch failures.\n",
          kMaxRanks, kExitTimeout, kDefaultGraceSec, kTermToKillSec, kMaxNodes,
          kMaxNicsPerNode, kDefaultMtu, kExitTimeout, kExitCannotExec, kExitUsage,
          kExitNoPrivilege, kExitLaunchError);
}

ParseResult parseOptions(int argc, char** argv, Options* opts, std::string* error) {
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // PROGRAM

    // "--name=value" carries its value inline; everything else takes the next argument.
    std::string name = arg, value;
    bool inlineValue = false;
    if (arg.compare(0, 2, "--") == 0 && arg.find('=') != std::string::npos) {
      name = arg.substr(0, arg.find('='));
      value = arg.substr(arg.find('=') + 1);
      inlineValue = true;
    }
    auto takeValue = [&]() {
      if (inlineValue) return true;
      if (i + 1 >= argc) {
        *error = name + " needs a value";
        return false;
      }
      value = argv[++i];
      return true;
    };

    if (name == "-h" || name == "--help") {
      return ParseResult::kHelp;
    } else if (name == "-n" || name == "-np" || name == "--np" ||
               (name.compare(0, 2, "-n") == 0 && name.size() > 2 &&
                isdigit(static_cast<unsigned char>(name[2])))) {
      if (name.size() > 2 && isdigit(static_cast<unsigned char>(name[2]))) {
        value = name.substr(2);  // "-n4"
      } else if (!takeValue()) {
        return ParseResult::kError;
      }
      if (!parseRankCount(value, &opts->nranks)) {
        *error = "bad rank count '" + value + "' (expected 1.." + std::to_string(kMaxRanks) + ")";
        return ParseResult::kError;
      }
    } else if (name == "-p" || name == "--prefix") {
      if (inlineValue) {
        *error = name + " takes no value";
        return ParseResult::kError;
      }
      opts->prefix = true;
    } else if (name == "-x") {
      if (!takeValue()) return ParseResult::kError;
      size_t eq = value.find('=');
      std::string var = value.substr(0, eq);
      if (!isValidVarName(var)) {
        *error = "-x " + value + ": '" + var + "' is not a variable name";
        return ParseResult::kError;
      }
      for (const char* reserved : kReservedVars) {
        if (var == reserved) {
          *error = "-x " + value + ": " + var + " is set by zprun for each rank";
          return ParseResult::kError;
        }
      }
      if (eq == std::string::npos) {
        // mpirun's "-x VAR": export our own value.
        const char* own = getenv(var.c_str());
        if (own == nullptr) {
          *error = "-x " + var + ": " + var + " is not set";
          return ParseResult::kError;
        }
        value = var + "=" + own;
      }
      opts->extraEnv.push_back(value);
    } else if (name == "--timeout") {
      if (!takeValue()) return ParseResult::kError;
      if (!parseSeconds(value, &opts->timeoutSec) || opts->timeoutSec <= 0) {
        *error = "bad --timeout '" + value + "' (expected seconds > 0)";
        return ParseResult::kError;
      }
    } else if (name == "--grace") {
      if (!takeValue()) return ParseResult::kError;
      if (!parseSeconds(value, &opts->graceSec)) {
        *error = "bad --grace '" + value + "' (expected seconds >= 0)";
        return ParseResult::kError;
      }
    } else if (name == "--nodes") {
      if (!takeValue()) return ParseResult::kError;
      if (!parseCount(value, kMaxNodes, &opts->cluster.nodes)) {
        *error = "bad --nodes '" + value + "' (expected 1.." + std::to_string(kMaxNodes) + ")";
        return ParseResult::kError;
      }
    } else if (name == "--ranks-per-node") {
      opts->clusterOptionSeen = true;
      if (!takeValue()) return ParseResult::kError;
      if (!parseCount(value, kMaxRanks, &opts->cluster.ranksPerNode)) {
        *error = "bad --ranks-per-node '" + value + "' (expected 1.." + std::to_string(kMaxRanks) + ")";
        return ParseResult::kError;
      }
    } else if (name == "--nics-per-node") {
      opts->clusterOptionSeen = true;
      if (!takeValue()) return ParseResult::kError;
      if (!parseCount(value, kMaxNicsPerNode, &opts->cluster.nicsPerNode)) {
        *error = "bad --nics-per-node '" + value + "' (expected 1.." +
                 std::to_string(kMaxNicsPerNode) + ")";
        return ParseResult::kError;
      }
    } else if (name == "--nic-rate") {
      opts->clusterOptionSeen = true;
      if (!takeValue()) return ParseResult::kError;
      // At least 100kbit: below that, tc cannot express the bucket zprun uses.
      if (!parseRate(value, &opts->cluster.rateBps) || opts->cluster.rateBps < 100000 ||
          opts->cluster.rateBps > 1000000000000000ull) {
        *error = "bad --nic-rate '" + value +
                 "' (expected a rate in tc's syntax from 100kbit to 1000tbit, e.g. 1gbit, 500mbit)";
        return ParseResult::kError;
      }
      opts->rateText = value;
    } else if (name == "--mtu") {
      opts->clusterOptionSeen = true;
      if (!takeValue()) return ParseResult::kError;
      if (!parseCount(value, 65535, &opts->cluster.mtu) || opts->cluster.mtu < 576) {
        *error = "bad --mtu '" + value + "' (expected 576..65535)";
        return ParseResult::kError;
      }
    } else if (name == "--dry-run") {
      opts->clusterOptionSeen = true;
      if (inlineValue) {
        *error = name + " takes no value";
        return ParseResult::kError;
      }
      opts->dryRun = true;
    } else if (name == "--cleanup") {
      if (inlineValue) {
        *error = name + " takes no value";
        return ParseResult::kError;
      }
      opts->cleanup = true;
    } else if (name == "--mpirun") {
      if (inlineValue) {
        *error = name + " takes no value";
        return ParseResult::kError;
      }
      // Everything up to "--" is mpirun's; the program follows.
      opts->mpirun = true;
      int k = i + 1;
      while (k < argc && strcmp(argv[k], "--") != 0) opts->mpirunArgs.push_back(argv[k++]);
      if (k >= argc) {
        *error = "--mpirun: end mpirun's arguments (if any) with --, then give the program";
        return ParseResult::kError;
      }
      i = k + 1;
      break;
    } else {
      *error = "unknown option " + arg;
      return ParseResult::kError;
    }
  }

  for (; i < argc; ++i) opts->command.push_back(argv[i]);
  if (opts->cleanup) {
    if (argc != 2) {
      *error = "--cleanup takes no other options and no program";
      return ParseResult::kError;
    }
    return ParseResult::kRun;
  }
  const ClusterSpec& cl = opts->cluster;
  if (opts->mpirun && cl.nodes == 0) {
    *error = "--mpirun needs --nodes";
    return ParseResult::kError;
  }
  if (opts->mpirun && opts->prefix) {
    *error = "-p does not apply to --mpirun; mpirun's --tag-output does (--mpirun --tag-output --)";
    return ParseResult::kError;
  }
  if (cl.nodes == 0 && opts->clusterOptionSeen) {
    *error = "--ranks-per-node, --nics-per-node, --nic-rate, --mtu and --dry-run need --nodes";
    return ParseResult::kError;
  }
  if (cl.nodes > 0) {
    long total = static_cast<long>(cl.nodes) * cl.ranksPerNode;
    if (total > kMaxRanks) {
      *error = std::to_string(cl.nodes) + " nodes of " + std::to_string(cl.ranksPerNode) +
               " ranks make " + std::to_string(total) + " ranks, more than " +
               std::to_string(kMaxRanks);
      return ParseResult::kError;
    }
    if (opts->nranks != 0 && opts->nranks != total) {
      *error = "-n " + std::to_string(opts->nranks) + " does not match --nodes " +
               std::to_string(cl.nodes) + " x --ranks-per-node " + std::to_string(cl.ranksPerNode);
      return ParseResult::kError;
    }
    opts->nranks = static_cast<int>(total);
    for (const std::string& entry : opts->extraEnv) {
      std::string var = entry.substr(0, entry.find('='));
      for (const char* reserved : kReservedClusterVars) {
        if (var == reserved) {
          *error = "-x " + entry + ": " + var + " is set by zprun for each rank of a cluster";
          return ParseResult::kError;
        }
      }
    }
  }
  if (opts->nranks == 0) {
    *error = "the number of ranks is required (-n N, or --nodes N)";
    return ParseResult::kError;
  }
  if (opts->command.empty()) {
    *error = "no program given";
    return ParseResult::kError;
  }
  return ParseResult::kRun;
}

}  // namespace zprun
