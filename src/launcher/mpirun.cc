// zprun --mpirun: Open MPI's mpirun in node 0 of an emulated cluster. See
// mpirun.h.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/launcher/mpirun.h"

#include <errno.h>
#include <pwd.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "src/launcher/layout.h"
#include "src/launcher/zprun.h"

namespace zprun {

namespace {

std::string hostfilePath(const zpcluster::Cluster& cluster) { return cluster.stateDir() + "/hostfile"; }

}  // namespace

// The mpirun command line of zprun --mpirun: every node of the cluster with R
// slots, ranks node by node (as zprun places them), daemons started through
// zprun --mpirun-agent, the runtime on zpnic0 and the tcp BTL on all the
// node's NICs, the cluster's variables exported to the ranks; then the
// user's mpirun arguments and the program. False (after saying why) if
// mpirun could not call zprun back.
bool mpirunCommand(const Options& opts, const zpcluster::Cluster& cluster, std::vector<std::string>* cmd) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) {
    fprintf(stderr, "zprun: cannot find zprun's own path for mpirun: %s\n", strerror(errno));
    return false;
  }
  self[n] = '\0';
  // mpirun splits its agent at spaces, and a list of agents at ':'.
  if (strpbrk(self, " \t\n:") != nullptr) {
    fprintf(stderr, "zprun: --mpirun: zprun's path '%s' has a space or ':', which mpirun's "
            "plm_rsh_agent cannot take\n", self);
    return false;
  }
  const zpcluster::ClusterSpec& spec = cluster.spec();
  std::string nics;
  for (int k = 0; k < spec.nicsPerNode; ++k) nics += (k ? "," : "") + zpcluster::nicName(k);
  *cmd = {"mpirun", "--allow-run-as-root", "--oversubscribe",
          "-np", std::to_string(spec.nodes * spec.ranksPerNode),
          "--hostfile", hostfilePath(cluster),
          "--map-by", "slot", "--rank-by", "slot", "--bind-to", "none",
          "--mca", "plm", "rsh",
          "--mca", "plm_rsh_agent", std::string(self) + " --mpirun-agent " + cluster.tag(),
          "--mca", "plm_rsh_no_tree_spawn", "1",
          // Session directories in the state directory go with the cluster.
          "--mca", "orte_tmpdir_base", cluster.stateDir(),
          "--mca", "oob_tcp_if_include", zpcluster::nicName(0),
          "--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp",
          "--mca", "btl_tcp_if_include", nics};
  for (const std::string& v : mpirunVariables(spec)) cmd->insert(cmd->end(), {"-x", v});
  for (const std::string& v : opts.extraEnv) cmd->insert(cmd->end(), {"-x", v});
  cmd->insert(cmd->end(), opts.mpirunArgs.begin(), opts.mpirunArgs.end());
  cmd->insert(cmd->end(), opts.command.begin(), opts.command.end());
  return true;
}

bool writeHostfile(const zpcluster::Cluster& cluster) {
  const std::string path = hostfilePath(cluster);
  FILE* f = fopen(path.c_str(), "we");
  bool ok = f != nullptr;
  for (int i = 0; ok && i < cluster.spec().nodes; ++i)
    ok = fprintf(f, "%s slots=%d\n", cluster.hostname(i).c_str(), cluster.spec().ranksPerNode) > 0;
  if (f != nullptr) ok = fclose(f) == 0 && ok;
  if (!ok) fprintf(stderr, "zprun: cannot write %s: %s\n", path.c_str(), strerror(errno));
  return ok;
}

// zprun --mpirun-agent TAG HOST COMMAND...: mpirun's remote shell. Like ssh,
// runs COMMAND (its words joined by spaces) with the user's login shell, but
// in node HOST of the running cluster TAG, entered as zprun's ranks enter it.
// Exit status: the shell's, or 255 if the node cannot be entered (as ssh).
int runMpirunAgent(int argc, char** argv) {
  if (argc < 5) {
    fprintf(stderr, "zprun: usage: zprun --mpirun-agent TAG HOST COMMAND... (used by zprun --mpirun)\n");
    return kExitUsage;
  }
  zpcluster::LiveNode node;
  std::string error;
  if (!zpcluster::openLiveNode(argv[2], argv[3], &node, &error)) {
    fprintf(stderr, "zprun --mpirun-agent: %s\n", error.c_str());
    return 255;
  }
  std::string command;
  for (int i = 4; i < argc; ++i) command += (i > 4 ? " " : "") + std::string(argv[i]);
  const passwd* pw = getpwuid(getuid());
  std::string shell = "/bin/sh";
  if (pw != nullptr && pw->pw_shell != nullptr && pw->pw_shell[0] == '/') shell = pw->pw_shell;
  const char* step = nullptr;
  if (!zpcluster::enterNode(node.entry(), &step)) {
    fprintf(stderr, "zprun --mpirun-agent: cannot enter %s: %s: %s\n", argv[3], step, strerror(errno));
    return 255;
  }
  execl(shell.c_str(), shell.c_str(), "-c", command.c_str(), static_cast<char*>(nullptr));
  fprintf(stderr, "zprun --mpirun-agent: cannot execute %s: %s\n", shell.c_str(), strerror(errno));
  return kExitCannotExec;
}

}  // namespace zprun
