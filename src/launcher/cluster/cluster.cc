// The emulated cluster of zprun --nodes: see cluster.h for the layout and
// the names.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/launcher/cluster/cluster.h"

#include "src/util/strings.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mount.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace zprun {
namespace {

constexpr const char* kNetnsDir = "/run/netns";  // where `ip netns` keeps its names
constexpr const char* kStateRoot = "/run/zprun";
constexpr const char* kBootIdFile = "/proc/sys/kernel/random/boot_id";
constexpr const char* kHostsFile = "/etc/hosts";
constexpr double kCommandTimeoutSec = 60;  // one ip / tc command; they take milliseconds

constexpr int kExitFailure = 1;

double nowSec() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

std::string hexBytes(const unsigned char* p, size_t n) {
  static const char* kHex = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += kHex[p[i] >> 4];
    s += kHex[p[i] & 15];
  }
  return s;
}

bool randomBytes(void* buf, size_t n) {
  auto* p = static_cast<unsigned char*>(buf);
  while (n > 0) {
    ssize_t got = getrandom(p, n, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

// A random (version 4) UUID in the form of /proc/sys/kernel/random/boot_id.
bool randomUuid(std::string* out) {
  unsigned char b[16];
  if (!randomBytes(b, sizeof b)) return false;
  b[6] = static_cast<unsigned char>((b[6] & 0x0f) | 0x40);
  b[8] = static_cast<unsigned char>((b[8] & 0x3f) | 0x80);
  std::string h = hexBytes(b, sizeof b);
  *out = h.substr(0, 8) + "-" + h.substr(8, 4) + "-" + h.substr(12, 4) + "-" + h.substr(16, 4) +
         "-" + h.substr(20, 12);
  return true;
}

std::string trimmed(std::string s) {
  while (!s.empty() && isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t start = 0;
  while (start < s.size() && isspace(static_cast<unsigned char>(s[start]))) ++start;
  return s.substr(start);
}

std::string joinCommand(const std::vector<std::string>& argv) {
  std::string s;
  for (const std::string& a : argv) {
    if (!s.empty()) s += ' ';
    s += quoteArg(a);
  }
  return s;
}

// Finds a program of iproute2. Also looks in the sbin directories, which the
// PATH of a non-login root shell (sudo -E, su) may lack.
std::string findTool(const std::string& name) {
  std::vector<std::string> dirs;
  const char* path = getenv("PATH");
  std::stringstream in(path != nullptr ? path : "");
  for (std::string d; std::getline(in, d, ':');)
    if (!d.empty()) dirs.push_back(d);
  for (const char* d : {"/usr/sbin", "/sbin", "/usr/bin", "/bin"}) dirs.push_back(d);
  for (const std::string& d : dirs) {
    std::string p = d + "/" + name;
    struct stat st;
    if (stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(p.c_str(), X_OK) == 0) return p;
  }
  return "";
}

const std::string& toolPath(const std::string& name) {
  static std::map<std::string, std::string> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, findTool(name)).first;
  return it->second;
}

struct CommandResult {
  bool started = false;  // false: fork or exec failed (see output)
  int status = 0;        // from waitpid
  std::string output;    // stdout and stderr together
  bool ok() const { return started && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
  std::string describe() const {
    std::string what;
    if (!started) what = "could not run";
    else if (WIFEXITED(status)) what = "exited with code " + std::to_string(WEXITSTATUS(status));
    else what = "killed by signal " + std::to_string(WTERMSIG(status));
    std::string out = trimmed(output);
    return out.empty() ? what : what + ": " + out;
  }
};

// Runs argv (argv[0] a tool name: ip or tc) and collects its output. The
// command gets a process group of its own, so a Ctrl-C at the terminal reaches
// only zprun, which then finishes (or undoes) the step in order.
CommandResult runCommand(const std::vector<std::string>& argv) {
  CommandResult res;
  const std::string& file = toolPath(argv[0]);
  if (file.empty()) {
    res.output = argv[0] + ": command not found";
    return res;
  }
  int pipeFds[2];
  if (pipe2(pipeFds, O_CLOEXEC) != 0) {
    res.output = std::string("pipe: ") + strerror(errno);
    return res;
  }
  std::vector<std::string> args = argv;
  std::vector<char*> cargv;
  for (std::string& a : args) cargv.push_back(&a[0]);
  cargv.push_back(nullptr);
  int devNull = open("/dev/null", O_RDONLY | O_CLOEXEC);

  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGPIPE, SIGTTIN, SIGINT, SIGTERM, SIGHUP, SIGCHLD}) sigaction(sig, &dfl, nullptr);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    if (devNull >= 0) dup2(devNull, 0);
    dup2(pipeFds[1], 1);
    dup2(pipeFds[1], 2);
    execv(file.c_str(), cargv.data());
    static const char kMsg[] = "exec failed\n";
    ssize_t ignored = write(2, kMsg, sizeof kMsg - 1);
    (void)ignored;
    _exit(127);
  }
  int forkErrno = errno;
  close(pipeFds[1]);
  if (devNull >= 0) close(devNull);
  if (pid < 0) {
    close(pipeFds[0]);
    res.output = std::string("fork: ") + strerror(forkErrno);
    return res;
  }
  setpgid(pid, pid);
  res.started = true;

  double deadline = nowSec() + kCommandTimeoutSec;
  for (;;) {
    pollfd p{pipeFds[0], POLLIN, 0};
    int left = static_cast<int>((deadline - nowSec()) * 1000);
    if (left <= 0) {
      kill(-pid, SIGKILL);
      kill(pid, SIGKILL);
      res.output += "\n(zprun killed it after " + std::to_string(static_cast<int>(kCommandTimeoutSec)) +
                    " s)";
      break;
    }
    int n = poll(&p, 1, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[4096];
    ssize_t got = read(pipeFds[0], buf, sizeof buf);
    if (got > 0) {
      if (res.output.size() < 64 * 1024) res.output.append(buf, static_cast<size_t>(got));
      continue;
    }
    if (got < 0 && errno == EINTR) continue;
    break;  // EOF
  }
  close(pipeFds[0]);
  while (waitpid(pid, &res.status, 0) < 0 && errno == EINTR) {
  }
  return res;
}

bool pathExists(const std::string& p) {
  struct stat st;
  return lstat(p.c_str(), &st) == 0;
}

// SIGKILLs every process whose network namespace is the one bound at nsPath,
// until none is left (or a few seconds passed). Returns how many it signalled.
int killNamespaceMembers(const std::string& nsPath) {
  struct stat ns;
  if (stat(nsPath.c_str(), &ns) != 0) return 0;
  int signalled = 0;
  double deadline = nowSec() + 5;
  for (;;) {
    bool found = false;
    DIR* proc = opendir("/proc");
    if (proc == nullptr) return signalled;
    while (dirent* e = readdir(proc)) {
      if (!isdigit(static_cast<unsigned char>(e->d_name[0]))) continue;
      pid_t pid = static_cast<pid_t>(atol(e->d_name));
      if (pid == getpid()) continue;
      struct stat st;
      std::string p = std::string("/proc/") + e->d_name + "/ns/net";
      if (stat(p.c_str(), &st) != 0) continue;  // gone, or a zombie
      if (st.st_ino != ns.st_ino || st.st_dev != ns.st_dev) continue;
      found = true;
      if (kill(pid, SIGKILL) == 0) ++signalled;
    }
    closedir(proc);
    if (!found || nowSec() > deadline) return signalled;
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, nullptr);
  }
}

// Deletes one network namespace of ours (after ending what runs inside).
bool deleteNamespace(const std::string& name, std::string* error) {
  std::string path = std::string(kNetnsDir) + "/" + name;
  if (!pathExists(path)) return true;
  killNamespaceMembers(path);
  CommandResult r = runCommand({"ip", "netns", "delete", name});
  if (r.ok() && !pathExists(path)) return true;
  *error = "ip netns delete " + name + " " + r.describe();
  return false;
}

// Removes a state directory: its files and directories (Open MPI's session
// directories under zprun --mpirun), then itself.
bool removeStateDir(const std::string& dir, std::string* error) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return true;
    *error = dir + ": " + strerror(errno);
    return false;
  }
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  for (const std::string& n : names) {
    const std::string path = dir + "/" + n;
    struct stat st;
    if (lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      std::string ignored;  // the rmdir below reports what is left
      removeStateDir(path, &ignored);
    } else {
      unlink(path.c_str());
    }
  }
  if (rmdir(dir.c_str()) != 0 && errno != ENOENT) {
    *error = "cannot remove " + dir + ": " + strerror(errno);
    return false;
  }
  return true;
}

bool writeFile(const std::string& path, const std::string& text, mode_t mode) {
  int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return false;
  bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  ok = close(fd) == 0 && ok;
  return ok;
}

// The effective capability set of this process, from /proc/self/status.
uint64_t effectiveCapabilities() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, 7, "CapEff:") == 0) return strtoull(line.c_str() + 7, nullptr, 16);
  }
  return 0;
}

constexpr int kCapNetAdmin = 12;
constexpr int kCapSysAdmin = 21;

bool isPrivilegeError(int err) { return err == EACCES || err == EPERM || err == EROFS; }

// Writes n as decimal into buf (async-signal-safe); returns buf.
char* formatInt(long n, char* buf, size_t size) {
  char tmp[24];
  int len = 0;
  bool neg = n < 0;
  unsigned long v = neg ? static_cast<unsigned long>(-n) : static_cast<unsigned long>(n);
  do {
    tmp[len++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0 && len < 22);
  size_t pos = 0;
  if (neg && pos + 1 < size) buf[pos++] = '-';
  while (len > 0 && pos + 1 < size) buf[pos++] = tmp[--len];
  buf[pos] = '\0';
  return buf;
}

}  // namespace

// ---------------------------------------------------------------------------

std::string quoteArg(const std::string& arg) {
  bool plain = !arg.empty();
  for (char c : arg)
    plain = plain && (isalnum(static_cast<unsigned char>(c)) || strchr("-_./=:,+@%", c) != nullptr);
  if (plain) return arg;
  std::string q = "'";
  for (char c : arg) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

bool parseRate(const std::string& text, uint64_t* bitsPerSec) {
  // tc's notation (zp::parseBitsPerSec); the flag's text is taken as it is,
  // so no spaces around it, and a whole number of bits/s from 1 to 1e15.
  double bits = 0;
  if (text.empty() || isspace((unsigned char)text.front()) || isspace((unsigned char)text.back()) ||
      !zp::parseBitsPerSec(text, &bits))
    return false;
  bits = std::round(bits);
  if (bits < 1 || bits > 1e15) return false;
  *bitsPerSec = static_cast<uint64_t>(bits);
  return true;
}

TbfParams tbfParams(uint64_t rateBps, int mtu) {
  uint64_t bytesPerSec = rateBps / 8;
  uint64_t burst = std::max<uint64_t>(bytesPerSec / 1000, 65536 + 2 * static_cast<uint64_t>(mtu));
  uint64_t limit = burst + std::max<uint64_t>(bytesPerSec / 100, 3 * 65536);
  return {burst, limit};
}

std::string nicName(int nic) { return "zpnic" + std::to_string(nic); }

std::string nicAddress(int node, int nic) {
  return "10.77." + std::to_string(nic) + "." + std::to_string(node + 1);
}

int nicPrefixLength() { return 24; }

bool enterNode(const NodeEntry& e, const char** step) {
  *step = "join the node's network namespace (setns)";
  if (setns(e.nsFd, CLONE_NEWNET) != 0) return false;
  *step = "unshare the UTS and mount namespaces";
  if (unshare(CLONE_NEWUTS | CLONE_NEWNS) != 0) return false;
  *step = "make the mounts private";
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return false;
  *step = "set the hostname";
  if (sethostname(e.hostname, strlen(e.hostname)) != 0) return false;
  *step = "bind-mount the node's boot id over /proc/sys/kernel/random/boot_id";
  if (mount(e.bootIdPath, kBootIdFile, nullptr, MS_BIND, nullptr) != 0) return false;
  // Read-only, as the real one; best effort.
  mount(nullptr, kBootIdFile, nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr);
  if (e.hostsPath != nullptr && e.hostsPath[0] != '\0') {
    *step = "bind-mount the cluster's hosts file over /etc/hosts";
    if (mount(e.hostsPath, kHostsFile, nullptr, MS_BIND, nullptr) != 0) return false;
  }

  // A sysfs mounted from inside the node's namespace shows the node's network
  // devices. It goes on top of the old /sys; the cgroup tree under it is
  // bound back (tools like hwloc read cgroup limits there).
  int cgroupFd = open("/sys/fs/cgroup", O_PATH | O_DIRECTORY | O_CLOEXEC);
  struct statvfs sys;
  unsigned long flags = MS_NOSUID | MS_NODEV | MS_NOEXEC;
  if (statvfs("/sys", &sys) == 0 && (sys.f_flag & ST_RDONLY)) flags |= MS_RDONLY;
  *step = "mount the node's sysfs on /sys";
  if (mount("sysfs", "/sys", "sysfs", flags, nullptr) != 0) {
    int saved = errno;
    if (cgroupFd >= 0) close(cgroupFd);
    errno = saved;
    return false;
  }
  if (cgroupFd >= 0) {
    char path[64] = "/proc/self/fd/";
    formatInt(cgroupFd, path + strlen(path), sizeof path - strlen(path));
    mount(path, "/sys/fs/cgroup", nullptr, MS_BIND | MS_REC, nullptr);
    close(cgroupFd);
  }
  return true;
}

// ---------------------------------------------------------------------------
// Cluster

Cluster::Cluster(const ClusterSpec& spec, pid_t owner) : spec_(spec) {
  unsigned char r[2] = {0, 0};
  if (!randomBytes(r, sizeof r)) {
    // Uniqueness comes from the pid already; the random part only guards
    // against a leftover of a dead process with the same pid.
    r[0] = static_cast<unsigned char>(time(nullptr));
    r[1] = static_cast<unsigned char>(time(nullptr) >> 8);
  }
  tag_ = "zp" + std::to_string(owner) + "-" + hexBytes(r, sizeof r);
  for (int i = 0; i < spec_.nodes; ++i) {
    hostnames_.push_back(hostname(i));
    bootIdPaths_.push_back(stateDir() + "/node" + std::to_string(i) + ".boot_id");
  }
  hostsPath_ = stateDir() + "/hosts";
  nodeFds_.assign(static_cast<size_t>(spec_.nodes), -1);
}

Cluster::~Cluster() { destroy(); }

std::string Cluster::nodeNamespace(int node) const { return tag_ + "-node" + std::to_string(node); }
std::string Cluster::railsNamespace() const { return tag_ + "-rails"; }
std::string Cluster::stateDir() const { return std::string(kStateRoot) + "/" + tag_; }

std::vector<std::vector<std::string>> Cluster::setupCommands() const {
  std::vector<std::vector<std::string>> cmds;
  const std::string rails = railsNamespace();
  const std::string mtu = std::to_string(spec_.mtu);
  cmds.push_back({"ip", "netns", "add", rails});
  for (int i = 0; i < spec_.nodes; ++i) cmds.push_back({"ip", "netns", "add", nodeNamespace(i)});
  cmds.push_back({"ip", "-n", rails, "link", "set", "lo", "up"});
  for (int i = 0; i < spec_.nodes; ++i)
    cmds.push_back({"ip", "-n", nodeNamespace(i), "link", "set", "lo", "up"});
  for (int k = 0; k < spec_.nicsPerNode; ++k) {
    std::string bridge = "rail" + std::to_string(k);
    cmds.push_back({"ip", "-n", rails, "link", "add", bridge, "mtu", mtu, "type", "bridge"});
  }
  std::vector<std::string> tbf;
  if (spec_.rateBps > 0) {
    TbfParams p = tbfParams(spec_.rateBps, spec_.mtu);
    tbf = {"root", "tbf", "rate", std::to_string(spec_.rateBps) + "bit", "burst",
           std::to_string(p.burstBytes), "limit", std::to_string(p.limitBytes)};
  }
  for (int i = 0; i < spec_.nodes; ++i) {
    const std::string node = nodeNamespace(i);
    for (int k = 0; k < spec_.nicsPerNode; ++k) {
      const std::string nic = nicName(k);
      const std::string port = "node" + std::to_string(i) + "nic" + std::to_string(k);
      const std::string bridge = "rail" + std::to_string(k);
      // Both ends are created directly in their namespaces: nothing ever
      // appears in the machine's own.
      cmds.push_back({"ip", "link", "add", nic, "netns", node, "mtu", mtu, "type", "veth", "peer",
                      "name", port, "netns", rails, "mtu", mtu});
      cmds.push_back({"ip", "-n", rails, "link", "set", port, "master", bridge, "up"});
      cmds.push_back({"ip", "-n", node, "addr", "add",
                      nicAddress(i, k) + "/" + std::to_string(nicPrefixLength()), "dev", nic});
      cmds.push_back({"ip", "-n", node, "link", "set", nic, "up"});
      if (!tbf.empty()) {
        std::vector<std::string> c = {"tc", "-n", node, "qdisc", "replace", "dev", nic};
        c.insert(c.end(), tbf.begin(), tbf.end());
        cmds.push_back(c);
        c = {"tc", "-n", rails, "qdisc", "replace", "dev", port};
        c.insert(c.end(), tbf.begin(), tbf.end());
        cmds.push_back(c);
      }
    }
  }
  for (int k = 0; k < spec_.nicsPerNode; ++k)
    cmds.push_back({"ip", "-n", rails, "link", "set", "rail" + std::to_string(k), "up"});
  return cmds;
}

std::vector<std::vector<std::string>> Cluster::teardownCommands() const {
  std::vector<std::vector<std::string>> cmds;
  for (int i = 0; i < spec_.nodes; ++i) cmds.push_back({"ip", "netns", "delete", nodeNamespace(i)});
  cmds.push_back({"ip", "netns", "delete", railsNamespace()});
  return cmds;
}

int Cluster::create(const volatile sig_atomic_t* stop) {
  auto stopped = [&]() { return stop != nullptr && *stop != 0; };
  auto failWith = [&](int code, const std::string& message) {
    fprintf(stderr, "zprun: %s\n", message.c_str());
    destroy();
    return code;
  };
  const char* kNeedRoot =
      " (building a cluster needs root: CAP_SYS_ADMIN and CAP_NET_ADMIN over the machine's own "
      "namespaces, not those of a user namespace)";

  // The state directory first: the lock in it tells --cleanup that this run
  // is alive before any namespace of it exists.
  if (mkdir(kStateRoot, 0755) != 0 && errno != EEXIST) {
    int e = errno;
    fprintf(stderr, "zprun: cannot create %s: %s%s\n", kStateRoot, strerror(e),
            isPrivilegeError(e) ? kNeedRoot : "");
    return isPrivilegeError(e) ? kExitNoPrivilege : kExitFailure;
  }
  if (mkdir(stateDir().c_str(), 0755) != 0) {
    int e = errno;
    fprintf(stderr, "zprun: cannot create %s: %s%s\n", stateDir().c_str(), strerror(e),
            isPrivilegeError(e) ? kNeedRoot : "");
    return isPrivilegeError(e) ? kExitNoPrivilege : kExitFailure;
  }
  created_ = true;
  // The lock file appears under its final name already locked, so --cleanup
  // never sees it unlocked while we live.
  std::string lockTmp = stateDir() + "/lock.tmp", lockPath = stateDir() + "/lock";
  lockFd_ = open(lockTmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (lockFd_ < 0 || flock(lockFd_, LOCK_EX | LOCK_NB) != 0 || rename(lockTmp.c_str(), lockPath.c_str()) != 0)
    return failWith(kExitFailure, "cannot create the lock " + lockPath + ": " + strerror(errno));
  for (int i = 0; i < spec_.nodes; ++i) {
    std::string uuid;
    if (!randomUuid(&uuid)) return failWith(kExitFailure, std::string("getrandom: ") + strerror(errno));
    if (!writeFile(bootIdPaths_[i], uuid + "\n", 0644))
      return failWith(kExitFailure, "cannot write " + bootIdPaths_[i] + ": " + strerror(errno));
  }
  // Names resolve inside the cluster from this file alone (never through the
  // machine's resolver), for the processes that get it over /etc/hosts.
  std::string hosts = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";
  for (int i = 0; i < spec_.nodes; ++i) hosts += nicAddress(i, 0) + "\t" + hostnames_[i] + "\n";
  if (!writeFile(hostsPath(), hosts, 0644))
    return failWith(kExitFailure, "cannot write " + hostsPath() + ": " + strerror(errno));

  auto cmds = setupCommands();
  for (size_t c = 0; c < cmds.size(); ++c) {
    if (stopped()) return failWith(kExitFailure, "interrupted while creating the cluster; removed it");
    CommandResult r = runCommand(cmds[c]);
    if (r.ok()) continue;
    std::string message = "cannot create the cluster: `" + joinCommand(cmds[c]) + "` " + r.describe();
    // The first namespace is where a machine that does not let us build
    // clusters says so.
    if (c == 0) {
      bool denied = r.output.find("not permitted") != std::string::npos ||
                    r.output.find("ermission denied") != std::string::npos ||
                    r.output.find("Read-only") != std::string::npos;
      return failWith(kExitNoPrivilege, message + (denied ? kNeedRoot : ""));
    }
    if (cmds[c][0] == "tc" && r.output.find("tbf") != std::string::npos)
      message += " (is the sch_tbf kernel module available?)";
    return failWith(kExitFailure, message);
  }
  for (int i = 0; i < spec_.nodes; ++i) {
    std::string path = std::string(kNetnsDir) + "/" + nodeNamespace(i);
    nodeFds_[i] = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (nodeFds_[i] < 0) return failWith(kExitFailure, "cannot open " + path + ": " + strerror(errno));
  }
  if (stopped()) return failWith(kExitFailure, "interrupted while creating the cluster; removed it");
  return 0;
}

bool Cluster::destroy() {
  if (!created_) return true;
  for (int& fd : nodeFds_) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  bool ok = true;
  std::string error;
  std::vector<std::string> names;
  for (int i = 0; i < spec_.nodes; ++i) names.push_back(nodeNamespace(i));
  names.push_back(railsNamespace());
  for (const std::string& n : names) {
    if (!deleteNamespace(n, &error)) {
      fprintf(stderr, "zprun: cannot remove the cluster: %s\n", error.c_str());
      ok = false;
    }
  }
  if (ok) {
    // The lock goes last: while a namespace of ours might remain, --cleanup
    // must be able to tell that it is ours.
    if (!removeStateDir(stateDir(), &error)) {
      fprintf(stderr, "zprun: %s\n", error.c_str());
      ok = false;
    }
  } else {
    fprintf(stderr, "zprun: run `zprun --cleanup` to remove what is left of %s\n", tag_.c_str());
  }
  if (lockFd_ >= 0) close(lockFd_);
  lockFd_ = -1;
  created_ = false;
  return ok;
}

NodeEntry Cluster::nodeEntry(int node, bool withHosts) const {
  NodeEntry e;
  e.nsFd = nodeFds_[node];
  e.hostname = hostnames_[node].c_str();
  e.bootIdPath = bootIdPaths_[node].c_str();
  if (withHosts) e.hostsPath = hostsPath_.c_str();
  return e;
}

// ---------------------------------------------------------------------------

bool checkClusterPrerequisites(bool needTc, bool forCleanup) {
  uint64_t caps = effectiveCapabilities();
  std::string missing;
  if (!(caps & (1ull << kCapSysAdmin))) missing += "CAP_SYS_ADMIN";
  if (!(caps & (1ull << kCapNetAdmin))) missing += std::string(missing.empty() ? "" : " and ") + "CAP_NET_ADMIN";
  if (!missing.empty()) {
    fprintf(stderr,
            "zprun: %s network namespaces, which needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN); "
            "this process lacks %s. %s\n",
            forCleanup ? "--cleanup removes" : "--nodes builds", missing.c_str(),
            forCleanup ? "Run it as root." : "Run zprun as root, or without --nodes.");
    return false;
  }
  std::vector<std::string> tools = {"ip"};
  if (needTc) tools.push_back("tc");
  for (const std::string& t : tools) {
    if (toolPath(t).empty()) {
      fprintf(stderr, "zprun: --nodes needs the '%s' command (iproute2), which is not installed%s\n",
              t.c_str(), t == "tc" ? " (tc shapes the NIC rate)" : "");
      return false;
    }
  }
  return true;
}

namespace {

// A namespace or state directory name of a zprun run: "zp<pid>-<hex4>[-...]".
bool parseTag(const std::string& name, std::string* tag, pid_t* pid) {
  if (name.compare(0, 2, "zp") != 0) return false;
  size_t p = 2;
  while (p < name.size() && isdigit(static_cast<unsigned char>(name[p]))) ++p;
  if (p == 2 || p - 2 > 9 || p >= name.size() || name[p] != '-') return false;
  long v = atol(name.substr(2, p - 2).c_str());
  if (name.size() < p + 5) return false;
  for (size_t k = p + 1; k < p + 5; ++k)
    if (!isxdigit(static_cast<unsigned char>(name[k]))) return false;
  std::string rest = name.substr(p + 5);
  if (!(rest.empty() || rest == "-rails" ||
        (rest.compare(0, 5, "-node") == 0 && rest.size() > 5 &&
         rest.find_first_not_of("0123456789", 5) == std::string::npos)))
    return false;
  *tag = name.substr(0, p + 5);
  *pid = static_cast<pid_t>(v);
  return true;
}

// Whether the zprun that made tag still runs.
bool runIsAlive(const std::string& tag, pid_t pid) {
  std::string lock = std::string(kStateRoot) + "/" + tag + "/lock";
  int fd = open(lock.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    bool held = flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK;
    close(fd);  // releases the lock if we got it
    return held;
  }
  // No lock (removed by hand, or the run is just being created): the pid decides.
  return kill(pid, 0) == 0 || errno == EPERM;
}

std::vector<std::string> listDir(const char* dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir);
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    std::string n = e->d_name;
    if (n != "." && n != "..") names.push_back(n);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

bool openLiveNode(const std::string& tag, const std::string& host, LiveNode* node, std::string* error) {
  std::string hostTag;
  pid_t pid;
  if (!parseTag(host, &hostTag, &pid) || hostTag != tag || host.compare(tag.size(), 5, "-node") != 0) {
    *error = "'" + host + "' is not a node of cluster " + tag;
    return false;
  }
  if (!runIsAlive(tag, pid)) {
    *error = "cluster " + tag + " is not running";
    return false;
  }
  const std::string dir = std::string(kStateRoot) + "/" + tag;
  node->hostname = host;
  node->bootIdPath = dir + "/" + host.substr(tag.size() + 1) + ".boot_id";
  node->hostsPath = dir + "/hosts";
  for (const std::string& p : {node->bootIdPath, node->hostsPath}) {
    if (!pathExists(p)) {
      *error = "'" + host + "' is not a node of cluster " + tag + " (no " + p + ")";
      return false;
    }
  }
  const std::string ns = std::string(kNetnsDir) + "/" + host;
  node->nsFd = open(ns.c_str(), O_RDONLY | O_CLOEXEC);
  if (node->nsFd < 0) {
    *error = "cannot open " + ns + ": " + strerror(errno);
    return false;
  }
  return true;
}

int cleanupStale() {
  if (!checkClusterPrerequisites(false, true)) return kExitNoPrivilege;
  std::map<std::string, std::vector<std::string>> namespaces;  // tag -> its namespaces
  std::map<std::string, pid_t> pids;
  for (const std::string& n : listDir(kNetnsDir)) {
    std::string tag;
    pid_t pid;
    if (parseTag(n, &tag, &pid) && n != tag) {
      namespaces[tag].push_back(n);
      pids[tag] = pid;
    }
  }
  for (const std::string& n : listDir(kStateRoot)) {
    std::string tag;
    pid_t pid;
    if (parseTag(n, &tag, &pid) && n == tag) pids[tag] = pid;
  }
  int removed = 0, live = 0;
  bool ok = true;
  for (const auto& entry : pids) {
    const std::string& tag = entry.first;
    if (runIsAlive(tag, entry.second)) {
      ++live;
      continue;
    }
    std::string error;
    bool tagOk = true;
    for (const std::string& ns : namespaces[tag]) {
      if (deleteNamespace(ns, &error)) {
        printf("zprun: removed network namespace %s (its zprun, pid %d, is gone)\n", ns.c_str(),
               static_cast<int>(entry.second));
        ++removed;
      } else {
        fprintf(stderr, "zprun: cannot remove %s: %s\n", ns.c_str(), error.c_str());
        tagOk = false;
      }
    }
    if (tagOk) {
      std::string dir = std::string(kStateRoot) + "/" + tag;
      if (pathExists(dir)) {
        if (removeStateDir(dir, &error)) {
          printf("zprun: removed %s\n", dir.c_str());
        } else {
          fprintf(stderr, "zprun: %s\n", error.c_str());
          tagOk = false;
        }
      }
    }
    ok = ok && tagOk;
  }
  if (removed == 0 && ok) printf("zprun: no stale cluster found\n");
  if (live > 0)
    printf("zprun: left %d cluster%s of running zprun processes alone\n", live, live == 1 ? "" : "s");
  return ok ? 0 : kExitFailure;
}

}  // namespace zprun
