// Topology discovery (hwloc + /sys/class/net) and NIC affinity; the topology
// file is read and written in topo_file.cc. See topology.h.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include "src/core/topology.h"

#include <dirent.h>
#include <fcntl.h>
#include <hwloc.h>
#include <limits.h>
#include <net/if.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <utility>

#include "src/core/config.h"
#include "src/core/log.h"
#include "src/core/params.h"

namespace zp {
namespace {


// Names with digits compared as numbers: zpnic2 < zpnic10, eth0 < eth1.
bool naturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (isdigit((unsigned char)a[i]) && isdigit((unsigned char)b[j])) {
      size_t i0 = i, j0 = j;
      while (i < a.size() && isdigit((unsigned char)a[i])) i++;
      while (j < b.size() && isdigit((unsigned char)b[j])) j++;
      std::string da = a.substr(i0, i - i0), db = b.substr(j0, j - j0);
      da.erase(0, std::min(da.find_first_not_of('0'), da.size()));
      db.erase(0, std::min(db.find_first_not_of('0'), db.size()));
      if (da.size() != db.size()) return da.size() < db.size();
      if (da != db) return da < db;
    } else {
      if (a[i] != b[j]) return (unsigned char)a[i] < (unsigned char)b[j];
      i++;
      j++;
    }
  }
  if ((a.size() - i) != (b.size() - j)) return (a.size() - i) < (b.size() - j);
  return a < b;  // equal up to leading zeros: any fixed order
}

}  // namespace

bool isPciBusId(const std::string& s) {
  // dddd:bb:dd.f, the domain 4 to 8 hex digits.
  size_t colon = s.find(':');
  if (colon < 4 || colon > 8 || s.size() != colon + 8) return false;
  for (size_t i = 0; i < s.size(); i++) {
    if (i == colon || i == colon + 3) {
      if (s[i] != ':') return false;
    } else if (i == colon + 6) {
      if (s[i] != '.') return false;
    } else if (!isxdigit((unsigned char)s[i])) {
      return false;
    }
  }
  return true;
}


int ClusterTopology::ranksPerNode() const {
  if (nodeRanks.empty()) return -1;
  size_t n = nodeRanks[0].size();
  for (const auto& r : nodeRanks)
    if (r.size() != n) return -1;
  return (int)n;
}

// ---------------------------------------------------------------------------
// Discovery

namespace {

bool readFile(const std::string& path, std::string* out, size_t limit = 4096) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::string s;
  char buf[4096];
  bool ok = true;
  while (s.size() <= limit) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      ok = false;
      break;
    }
    if (n == 0) break;
    s.append(buf, (size_t)n);
  }
  close(fd);
  if (!ok) return false;
  *out = std::move(s);
  return true;
}

// An integer in a sysfs file ("1000\n", "0x1003\n"); false if unreadable.
bool readSysInt(const std::string& path, long* out) {
  std::string s;
  if (!readFile(path, &s)) return false;
  s = trim(s);
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long v = strtol(s.c_str(), &end, 0);
  if (errno || *end) return false;
  *out = v;
  return true;
}

// Where sysfs is: /sys, or ZP_SYSFS_ROOT (a test fixture).
std::string sysRoot() { return envString("ZP_SYSFS_ROOT", "/sys"); }

// The canonical path of a sysfs entry (its symlinks followed); empty if none.
std::string realPath(const std::string& path) {
  char real[PATH_MAX];
  return realpath(path.c_str(), real) ? std::string(real) : std::string();
}

std::vector<std::string> listDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (!d) return names;
  while (struct dirent* e = readdir(d))
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end(), naturalLess);
  return names;
}

struct SysNic {
  Nic nic;
  bool physical = false;
};

// Interfaces of /sys/class/net that may carry traffic: not the loopback, and
// administratively up.
zpResult_t listSysNics(std::vector<SysNic>* out) {
  const std::string root = sysRoot(), dir = root + "/class/net";
  const char* kDir = dir.c_str();
  DIR* d = opendir(kDir);
  if (!d) return fail(zpSystemError, "topology: cannot list %s: %s", kDir, strerror(errno));
  std::vector<std::string> names;
  while (struct dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    names.push_back(e->d_name);
  }
  closedir(d);
  for (const std::string& name : names) {
    std::string base = std::string(kDir) + "/" + name;
    long flags = 0, type = 0;
    if (!readSysInt(base + "/flags", &flags)) continue;  // vanished, or not an interface
    if (readSysInt(base + "/type", &type) && type == 772 /* ARPHRD_LOOPBACK */) continue;
    if (flags & IFF_LOOPBACK) continue;
    if (!(flags & IFF_UP)) {
      ZP_TRACE(kSubInit, "topology: skipping %s: it is down", name.c_str());
      continue;
    }
    SysNic s;
    s.nic.name = name;
    struct stat st;
    s.physical = (stat((base + "/device").c_str(), &st) == 0);
    s.nic.isVirtual = !s.physical;
    long mbps = 0;
    if (readSysInt(base + "/speed", &mbps) && mbps > 0) s.nic.bitsPerSec = (double)mbps * 1e6;
    if (s.physical) {
      // The PCI function the device sits on, if any: the last path component
      // that looks like a bus id (virtio devices hang below theirs).
      char real[PATH_MAX];
      if (realpath((base + "/device").c_str(), real)) {
        std::string p = real;
        size_t pos = p.size();
        while (pos > 0) {
          size_t slash = p.rfind('/', pos - 1);
          std::string comp = p.substr(slash == std::string::npos ? 0 : slash + 1,
                                      pos - (slash == std::string::npos ? 0 : slash + 1));
          if (isPciBusId(comp)) {
            s.nic.pciBusId = comp;
            break;
          }
          if (slash == std::string::npos || slash == 0) break;
          pos = slash;
        }
      }
      long numa = -1;
      if (!s.nic.pciBusId.empty() &&
          readSysInt(root + "/bus/pci/devices/" + s.nic.pciBusId + "/numa_node", &numa) && numa >= 0)
        s.nic.numa = (int)numa;
    }
    out->push_back(std::move(s));
  }
  return zpSuccess;
}

int sysNumaNodes() {
  DIR* d = opendir((sysRoot() + "/devices/system/node").c_str());
  if (!d) return 1;
  int n = 0;
  while (struct dirent* e = readdir(d)) {
    if (strncmp(e->d_name, "node", 4) == 0 && isdigit((unsigned char)e->d_name[4])) n++;
  }
  closedir(d);
  return n > 0 ? n : 1;
}

struct HwlocTopo {
  hwloc_topology_t topo = nullptr;
  ~HwlocTopo() {
    if (topo) hwloc_topology_destroy(topo);
  }
  bool load() {
    if (hwloc_topology_init(&topo) != 0) {
      topo = nullptr;
      return false;
    }
    // Components we do not need: GPU runtimes (CUDA, NVML, OpenCL, ROCm,
    // Level Zero: slow to start, and GPUs are found by PCI class anyway), GL
    // (opens X displays), and libpciaccess, whose work Linux's own sysfs I/O
    // discovery does (and which leaks on every load). Unknown names are fine.
    for (const char* c : {"cuda", "nvml", "opencl", "rsmi", "levelzero", "gl", "pci"})
      hwloc_topology_set_components(topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, c);
    if (hwloc_topology_set_io_types_filter(topo, HWLOC_TYPE_FILTER_KEEP_ALL) != 0 ||
        hwloc_topology_load(topo) != 0) {
      hwloc_topology_destroy(topo);
      topo = nullptr;
      return false;
    }
    return true;
  }
};

std::string pciBusIdOf(hwloc_obj_t pci) {
  return strprintf("%04x:%02x:%02x.%x", (unsigned)pci->attr->pcidev.domain, (unsigned)pci->attr->pcidev.bus,
                   (unsigned)pci->attr->pcidev.dev, (unsigned)pci->attr->pcidev.func);
}

hwloc_obj_t pciAncestor(hwloc_obj_t o) {
  for (; o; o = o->parent)
    if (o->type == HWLOC_OBJ_PCI_DEVICE) return o;
  return nullptr;
}

// The NUMA node (logical index) local to an object, -1 if it is local to
// several or none.
int numaOf(hwloc_topology_t topo, hwloc_obj_t o) {
  hwloc_obj_t a = hwloc_get_non_io_ancestor_obj(topo, o);
  if (!a || !a->nodeset || hwloc_bitmap_weight(a->nodeset) != 1) return -1;
  hwloc_obj_t n = hwloc_get_numanode_obj_by_os_index(topo, (unsigned)hwloc_bitmap_first(a->nodeset));
  return n ? (int)n->logical_index : -1;
}

// Edges between two objects of the tree (through their closest common
// ancestor); -1 if they are not in one tree.
int treeHops(hwloc_obj_t a, hwloc_obj_t b) {
  std::vector<hwloc_obj_t> up;
  for (hwloc_obj_t o = a; o; o = o->parent) up.push_back(o);
  int nb = 0;
  for (hwloc_obj_t o = b; o; o = o->parent, nb++) {
    auto it = std::find(up.begin(), up.end(), o);
    if (it != up.end()) return (int)(it - up.begin()) + nb;
  }
  return -1;
}

bool isGpuClass(unsigned cls, unsigned vendor) {
  if (cls == 0x0302) return true;  // 3D controller
  bool gpuVendor = (vendor == 0x10de /* NVIDIA */ || vendor == 0x1002 /* AMD */);
  return gpuVendor && (cls == 0x0300 || cls == 0x0380);
}

bool isGpu(hwloc_obj_t pci) { return isGpuClass(pci->attr->pcidev.class_id, pci->attr->pcidev.vendor_id); }

// Edges between two devices along their sysfs paths (devices/pci0000:00/
// 0000:00:01.0/0000:01:00.0: each bridge is a level), through their closest
// common ancestor (devices/ itself for two root complexes, as hwloc's tree
// meets at the machine); -1 if either path is unknown.
int pathHops(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return -1;
  auto split = [](const std::string& p) {
    std::vector<std::string> v;
    size_t i = 0;
    while (i < p.size()) {
      size_t j = p.find('/', i);
      if (j == std::string::npos) j = p.size();
      if (j > i) v.push_back(p.substr(i, j - i));
      i = j + 1;
    }
    return v;
  };
  std::vector<std::string> x = split(a), y = split(b);
  size_t common = 0;
  while (common < x.size() && common < y.size() && x[common] == y[common]) common++;
  if (common == 0) return -1;
  return (int)(x.size() - common + y.size() - common);
}

// GPUs from sysfs alone (where hwloc is not used): bus/pci/devices/*.
void sysGpus(const std::string& root, NodeTopology* node) {
  const std::string dir = root + "/bus/pci/devices";
  std::vector<std::string> nicPath;
  for (const Nic& n : node->nics)
    nicPath.push_back(n.pciBusId.empty() ? std::string() : realPath(dir + "/" + n.pciBusId));
  for (const std::string& id : listDir(dir)) {
    long cls = 0, vendor = 0, numa = -1;
    if (!isPciBusId(id) || !readSysInt(dir + "/" + id + "/class", &cls)) continue;
    readSysInt(dir + "/" + id + "/vendor", &vendor);
    if (!isGpuClass((unsigned)cls >> 8, (unsigned)vendor)) continue;
    Gpu g;
    g.pciBusId = id;
    if (readSysInt(dir + "/" + id + "/numa_node", &numa) && numa >= 0) g.numa = (int)numa;
    const std::string path = realPath(dir + "/" + id);
    for (const std::string& np : nicPath) g.nicHops.push_back(pathHops(path, np));
    node->gpus.push_back(std::move(g));
  }
}

// InfiniBand HCA ports behind the node's NICs, and their rates.
void sysIbPorts(const std::string& root, NodeTopology* node) {
  const std::string dir = root + "/class/infiniband";
  for (const std::string& hca : listDir(dir)) {
    const std::string ports = dir + "/" + hca + "/ports";
    std::vector<std::string> portList = listDir(ports);
    for (const std::string& ifname : listDir(dir + "/" + hca + "/device/net")) {
      auto nic = std::find_if(node->nics.begin(), node->nics.end(), [&](const Nic& n) { return n.name == ifname; });
      if (nic == node->nics.end()) continue;
      // Its port: dev_port (0-based) + 1, else the HCA's first port.
      long devPort = -1;
      std::string port;
      if (readSysInt(dir + "/" + hca + "/device/net/" + ifname + "/dev_port", &devPort) && devPort >= 0)
        port = std::to_string(devPort + 1);
      if (std::find(portList.begin(), portList.end(), port) == portList.end())
        port = portList.empty() ? std::string() : portList[0];
      if (port.empty()) continue;
      nic->hca = hca + ":" + port;
      const std::string rateFile = ports + "/" + port + "/rate";
      std::string text;
      double bps = 0;
      if (!readFile(rateFile, &text)) {
        ZP_WARN(kSubInit, "topology: %s cannot be read: the rate of %s stays %s", rateFile.c_str(), ifname.c_str(),
                formatBitsPerSec(nic->bitsPerSec).c_str());
      } else if (!parseIbRate(text, &bps)) {
        ZP_WARN(kSubInit, "topology: %s holds '%s', not a rate such as '200 Gb/sec (4X HDR)': ignored (the rate of "
                "%s stays %s)", rateFile.c_str(), trim(text).substr(0, 80).c_str(), ifname.c_str(),
                formatBitsPerSec(nic->bitsPerSec).c_str());
      } else {
        nic->bitsPerSec = bps;
      }
    }
  }
}

}  // namespace

zpResult_t discoverNode(NodeTopology* out) {
  if (!out) return fail(zpInvalidArgument, "discoverNode: out is NULL");
  double rate = 0;
  ZP_CHECK(paramRate("ZP_NIC_RATE_BPS", &rate));

  NodeTopology node;
  char host[256] = {0};
  gethostname(host, sizeof(host) - 1);
  node.name = host;

  std::vector<SysNic> sys;
  ZP_CHECK(listSysNics(&sys));
  bool anyPhysical = std::any_of(sys.begin(), sys.end(), [](const SysNic& s) { return s.physical; });
  for (SysNic& s : sys) {
    if (anyPhysical && !s.physical) {
      ZP_TRACE(kSubInit, "topology: skipping virtual %s: the node has physical NICs", s.nic.name.c_str());
      continue;
    }
    node.nics.push_back(std::move(s.nic));
  }
  std::sort(node.nics.begin(), node.nics.end(),
            [](const Nic& a, const Nic& b) { return naturalLess(a.name, b.name); });

  const std::string root = sysRoot();
  sysIbPorts(root, &node);
  HwlocTopo hw;
  // hwloc reads the machine's own /sys: not with another root.
  if (root == "/sys" && hw.load()) {
    node.numaNodes = std::max(1, hwloc_get_nbobjs_by_type(hw.topo, HWLOC_OBJ_NUMANODE));
    // hwloc's view of the NICs: PCI device and NUMA node, by interface name.
    std::vector<hwloc_obj_t> nicPci(node.nics.size(), nullptr);
    for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_osdev(hw.topo, o));) {
      if (o->attr->osdev.type != HWLOC_OBJ_OSDEV_NETWORK || !o->name) continue;
      for (size_t k = 0; k < node.nics.size(); k++) {
        if (node.nics[k].name != o->name) continue;
        hwloc_obj_t pci = pciAncestor(o);
        nicPci[k] = pci;
        if (pci) node.nics[k].pciBusId = pciBusIdOf(pci);
        int numa = numaOf(hw.topo, o);
        if (numa >= 0) node.nics[k].numa = numa;
      }
    }
    for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_pcidev(hw.topo, o));) {
      if (!isGpu(o)) continue;
      Gpu g;
      g.pciBusId = pciBusIdOf(o);
      g.numa = numaOf(hw.topo, o);
      g.nicHops.assign(node.nics.size(), -1);
      for (size_t k = 0; k < node.nics.size(); k++)
        if (nicPci[k]) g.nicHops[k] = treeHops(o, nicPci[k]);
      node.gpus.push_back(std::move(g));
    }
  } else {
    if (root == "/sys") ZP_INFO(kSubInit, "topology: hwloc could not load this machine's topology; using /sys only");
    node.numaNodes = sysNumaNodes();
    sysGpus(root, &node);
    // With one NUMA node, every device is on it.
    if (node.numaNodes == 1)
      for (Nic& n : node.nics)
        if (!n.isVirtual && n.numa < 0) n.numa = 0;
  }

  if (rate > 0) {
    for (Nic& n : node.nics) n.bitsPerSec = n.bitsPerSec > 0 ? std::min(n.bitsPerSec, rate) : rate;
  }
  for (size_t g = 0; g < node.gpus.size(); g++) node.gpus[g].nic = nearestNic(node, g);
  for (const Nic& n : node.nics)
    ZP_INFO(kSubInit, "topology: NIC %s %s numa %d%s%s%s", n.name.c_str(),
            formatBitsPerSec(n.bitsPerSec).c_str(), n.numa, n.pciBusId.empty() ? "" : " pci ",
            n.pciBusId.c_str(), n.isVirtual ? " (virtual)" : "");
  for (const Gpu& g : node.gpus)
    ZP_INFO(kSubInit, "topology: GPU %s numa %d nearest NIC %s", g.pciBusId.c_str(), g.numa,
            g.nic >= 0 ? node.nics[(size_t)g.nic].name.c_str() : "unknown");
  *out = std::move(node);
  return zpSuccess;
}

// ---------------------------------------------------------------------------
// Affinity


namespace {

// How far NIC c is from GPU g, as (NUMA penalty, hops); numa is the place's.
std::pair<int, int> gpuNicDistance(const NodeTopology& node, int gpu, int numa, int c) {
  const Nic& nic = node.nics[(size_t)c];
  int pen = (numa >= 0 && nic.numa >= 0 && nic.numa != numa) ? 1 : 0;
  int hops = 0;
  if (gpu >= 0) {
    const Gpu& g = node.gpus[(size_t)gpu];
    const auto& h = g.nicHops;
    const int unknown = 1 << 20;
    if ((size_t)c < h.size() && h[(size_t)c] >= 0) hops = h[(size_t)c];
    else if (g.nic >= 0 && std::all_of(h.begin(), h.end(), [](int x) { return x < 0; }))
      hops = c == g.nic ? 0 : unknown;  // a file's GPU names its nearest NIC only
    else hops = unknown;
  }
  return {pen, hops};
}

}  // namespace

int nearestNic(const NodeTopology& node, size_t g) {
  if (g >= node.gpus.size() || node.nics.empty()) return -1;
  const Gpu& gpu = node.gpus[g];
  if (gpu.nic >= 0 && gpu.nic < (int)node.nics.size()) return gpu.nic;
  int best = -1;
  std::pair<int, int> bestD;
  bool differ = false;
  for (int c = 0; c < (int)node.nics.size(); c++) {
    auto d = gpuNicDistance(node, (int)g, gpu.numa, c);
    if (best >= 0 && d != bestD) differ = true;
    if (best < 0 || d < bestD) best = c, bestD = d;
  }
  return differ || node.nics.size() == 1 ? best : -1;
}

bool parseIbRate(const std::string& text, double* bitsPerSec) {
  // "<number> Gb/sec", then optionally " (<width> <speed>)".
  std::string t = trim(text);
  size_t sp = t.find(' ');
  if (sp == std::string::npos) return false;
  std::string num = t.substr(0, sp), rest = t.substr(sp + 1);
  if (rest.compare(0, 6, "Gb/sec") != 0) return false;
  rest = trim(rest.substr(6));
  if (!rest.empty() && (rest.front() != '(' || rest.back() != ')')) return false;
  double v = 0;
  auto r = std::from_chars(num.data(), num.data() + num.size(), v);
  if (r.ec != std::errc() || r.ptr != num.data() + num.size() || !(v > 0) || !std::isfinite(v) || v > 1e6)
    return false;
  *bitsPerSec = v * 1e9;
  return true;
}

// Every local rank's NIC among cand (indexes into node.nics); -1 for all if
// cand is empty.
std::vector<int> assignNics(const NodeTopology& node, int localRanks, const std::vector<int>& cand) {
  std::vector<int> pick((size_t)localRanks, -1);
  if (cand.empty()) return pick;
  const int gpus = (int)node.gpus.size();
  const int numas = std::max(1, node.numaNodes);
  // The closest candidates of each place, computed once per place.
  std::map<std::pair<int, int>, std::vector<int>> closestOf;  // (gpu, numa) -> set
  std::map<std::vector<int>, int> used;                       // set -> ranks so far
  for (int i = 0; i < localRanks; i++) {
    int gpu = -1, numa = -1;
    if (gpus > 0) {
      gpu = i % gpus;
      numa = node.gpus[(size_t)gpu].numa;
    } else if (numas > 1) {
      numa = (int)((long long)i * numas / localRanks);
    }
    auto key = std::make_pair(gpu, numa);
    auto it = closestOf.find(key);
    if (it == closestOf.end()) {
      std::vector<std::pair<std::pair<int, int>, int>> dist;  // ((numa penalty, hops), nic)
      for (int c : cand) dist.push_back({gpuNicDistance(node, gpu, numa, c), c});
      auto best = std::min_element(dist.begin(), dist.end(), [](const auto& a, const auto& b) {
                    return a.first < b.first;
                  })->first;
      std::vector<int> set;
      for (const auto& d : dist)
        if (d.first == best) set.push_back(d.second);
      it = closestOf.emplace(key, std::move(set)).first;
    }
    const std::vector<int>& set = it->second;
    int j = used[set]++;
    pick[(size_t)i] = set[(size_t)j % set.size()];
  }
  return pick;
}

std::string nicList(const NodeTopology& node) {
  std::string s;
  for (const Nic& n : node.nics) s += (s.empty() ? "" : ", ") + n.name;
  return s.empty() ? "none" : s;
}


std::vector<int> pickNics(const NodeTopology& node, int localRanks, const std::string& netDevices,
                          std::string* why) {
  auto no = [&](const std::string& reason) {
    if (why) *why = reason;
    return std::vector<int>();
  };
  if (localRanks < 1) return no(strprintf("%d local ranks: there must be at least one", localRanks));
  if (node.nics.empty()) return no("the node has no NICs");
  std::vector<int> cand;
  if (!trim(netDevices).empty()) {
    size_t pos = 0;
    while (pos <= netDevices.size()) {
      size_t end = netDevices.find(',', pos);
      if (end == std::string::npos) end = netDevices.size();
      std::string name = trim(netDevices.substr(pos, end - pos));
      pos = end + 1;
      if (name.empty()) continue;
      int found = -1;
      for (size_t k = 0; k < node.nics.size(); k++)
        if (node.nics[k].name == name) found = (int)k;
      if (found < 0)
        return no(strprintf("ZP_NET_DEVICES names '%s', which is not a NIC of this node (its NICs: %s)",
                            name.c_str(), nicList(node).c_str()));
      if (std::find(cand.begin(), cand.end(), found) == cand.end()) cand.push_back(found);
    }
    if (cand.empty()) return no(strprintf("ZP_NET_DEVICES='%s' names no NIC", netDevices.c_str()));
  } else {
    for (size_t k = 0; k < node.nics.size(); k++) cand.push_back((int)k);
  }
  if (why) why->clear();
  return assignNics(node, localRanks, cand);
}

int pickNic(const NodeTopology& node, int localRank, int localRanks, const std::string& netDevices,
            std::string* why) {
  if (localRanks < 1 || localRank < 0 || localRank >= localRanks) {
    if (why) *why = strprintf("local rank %d of %d ranks is out of range", localRank, localRanks);
    return -1;
  }
  std::vector<int> all = pickNics(node, localRanks, netDevices, why);
  return all.empty() ? -1 : all[(size_t)localRank];
}

std::string describe(const NodeTopology& node) {
  auto plural = [](size_t k, const char* one, const char* many) {
    return std::to_string(k) + " " + (k == 1 ? one : many);
  };
  std::string s = "node " + (node.name.empty() ? std::string("?") : node.name) + ": " +
                  plural((size_t)node.numaNodes, "NUMA node", "NUMA nodes") + ", " +
                  plural(node.gpus.size(), "GPU", "GPUs") + ", " + plural(node.nics.size(), "NIC", "NICs") +
                  "\n";
  size_t w = 4;
  for (const Nic& n : node.nics) w = std::max(w, n.name.size());
  for (size_t k = 0; k < node.nics.size(); k++) {
    const Nic& n = node.nics[k];
    s +=
        strprintf("  nic %zu: %-*s  %-12s  numa %s", k, (int)w, n.name.c_str(),
                  formatBitsPerSec(n.bitsPerSec).c_str(), n.numa >= 0 ? std::to_string(n.numa).c_str() : "?");
    if (!n.pciBusId.empty()) s += "  pci " + n.pciBusId;
    if (!n.hca.empty()) s += "  hca " + n.hca;
    if (n.isVirtual) s += "  (virtual)";
    s += "\n";
  }
  for (size_t g = 0; g < node.gpus.size(); g++) {
    const Gpu& gpu = node.gpus[g];
    s += strprintf("  gpu %zu: pci %s  numa %s", g, gpu.pciBusId.empty() ? "?" : gpu.pciBusId.c_str(),
                   gpu.numa >= 0 ? std::to_string(gpu.numa).c_str() : "?");
    bool anyHops = false;
    for (int h : gpu.nicHops) anyHops = anyHops || h >= 0;
    if (gpu.nic >= 0 && gpu.nic < (int)node.nics.size()) s += "  nearest NIC " + node.nics[(size_t)gpu.nic].name;
    if (anyHops) {
      s += "  PCI hops to NICs:";
      for (int h : gpu.nicHops) s += h >= 0 ? " " + std::to_string(h) : std::string(" ?");
    }
    s += "\n";
  }
  return s;
}

std::string describe(const ClusterTopology& topo) {
  int rpn = topo.ranksPerNode();
  std::string s = strprintf("cluster: %d node%s, %d rank%s", topo.nodes(), topo.nodes() == 1 ? "" : "s",
                            topo.nranks(), topo.nranks() == 1 ? "" : "s");
  if (rpn > 0) s += strprintf(" (%d per node)", rpn);
  s += "\n";
  for (int i = 0; i < topo.nodes(); i++) {
    s += strprintf("[%d] ", i) + describe(topo.node[(size_t)i]);
    for (size_t l = 0; l < topo.nodeRanks[(size_t)i].size(); l++) {
      int g = topo.nodeRanks[(size_t)i][l];
      int k = topo.rankNic[(size_t)g];
      s += strprintf("  rank %d (local %zu): nic %s\n", g, l,
                     k >= 0 ? topo.node[(size_t)i].nics[(size_t)k].name.c_str() : "none");
    }
  }
  return s;
}

}  // namespace zp
