// Topology discovery (hwloc + /sys/class/net), NIC affinity, and the topology
// file: a strict JSON reader and the file's schema. See topology.h.
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

namespace zp {
namespace {

// Limits of the topology file (also documented in topology.h).
constexpr long kMaxNodes = 1 << 16;
constexpr long kMaxRanks = 1 << 22;
constexpr long kMaxRanksPerNode = 1 << 16;
constexpr long kMaxNicsPerNode = 1024;
constexpr long kMaxNicsTotal = 1 << 20;
constexpr long kMaxNuma = 1024;
constexpr long kMaxGpus = 1024;
constexpr size_t kMaxFileBytes = 64u << 20;
constexpr int kMaxDepth = 64;

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

}  // namespace

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

struct SysNic {
  Nic nic;
  bool physical = false;
};

// Interfaces of /sys/class/net that may carry traffic: not the loopback, and
// administratively up.
zpResult_t listSysNics(std::vector<SysNic>* out) {
  const char* kDir = "/sys/class/net";
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
          readSysInt("/sys/bus/pci/devices/" + s.nic.pciBusId + "/numa_node", &numa) && numa >= 0)
        s.nic.numa = (int)numa;
    }
    out->push_back(std::move(s));
  }
  return zpSuccess;
}

int sysNumaNodes() {
  DIR* d = opendir("/sys/devices/system/node");
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

bool isGpu(hwloc_obj_t pci) {
  unsigned cls = pci->attr->pcidev.class_id, vendor = pci->attr->pcidev.vendor_id;
  if (cls == 0x0302) return true;  // 3D controller
  bool gpuVendor = (vendor == 0x10de /* NVIDIA */ || vendor == 0x1002 /* AMD */);
  return gpuVendor && (cls == 0x0300 || cls == 0x0380);
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

  HwlocTopo hw;
  if (hw.load()) {
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
    ZP_INFO(kSubInit, "topology: hwloc could not load this machine's topology; using /sys only");
    node.numaNodes = sysNumaNodes();
    // With one NUMA node, every device is on it.
    if (node.numaNodes == 1)
      for (Nic& n : node.nics)
        if (!n.isVirtual && n.numa < 0) n.numa = 0;
  }

  if (rate > 0) {
    for (Nic& n : node.nics) n.bitsPerSec = n.bitsPerSec > 0 ? std::min(n.bitsPerSec, rate) : rate;
  }
  for (const Nic& n : node.nics)
    ZP_INFO(kSubInit, "topology: NIC %s %s numa %d%s%s%s", n.name.c_str(),
            formatBitsPerSec(n.bitsPerSec).c_str(), n.numa, n.pciBusId.empty() ? "" : " pci ",
            n.pciBusId.c_str(), n.isVirtual ? " (virtual)" : "");
  *out = std::move(node);
  return zpSuccess;
}

// ---------------------------------------------------------------------------
// Affinity

namespace {

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
      for (int c : cand) {
        const Nic& nic = node.nics[(size_t)c];
        int pen = (numa >= 0 && nic.numa >= 0 && nic.numa != numa) ? 1 : 0;
        int hops = 0;
        if (gpu >= 0) {
          const auto& h = node.gpus[(size_t)gpu].nicHops;
          hops = ((size_t)c < h.size() && h[(size_t)c] >= 0) ? h[(size_t)c] : (1 << 20);
        }
        dist.push_back({{pen, hops}, c});
      }
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

}  // namespace

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

// ---------------------------------------------------------------------------
// JSON reader: RFC 8259, strict. Values remember their byte offset so that
// errors found later (in the schema) can still name a line and column.

namespace {

struct JValue;
struct JMember;

struct JValue {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = kNull;
  bool boolean = false;
  double number = 0;
  std::string str;
  std::vector<JValue> items;
  std::vector<JMember> members;
  size_t at = 0;  // byte offset of the value's first character

  const JValue* get(const char* key) const;
};

struct JMember {
  std::string key;
  size_t keyAt;
  JValue value;
};

const JValue* JValue::get(const char* key) const {
  for (const JMember& m : members)
    if (m.key == key) return &m.value;
  return nullptr;
}

const char* kindName(JValue::Kind k) {
  switch (k) {
    case JValue::kNull: return "null";
    case JValue::kBool: return "a boolean";
    case JValue::kNumber: return "a number";
    case JValue::kString: return "a string";
    case JValue::kArray: return "an array";
    case JValue::kObject: return "an object";
  }
  return "?";
}

// Line and column (1-based; columns count characters, not bytes) of offset.
void locate(const std::string& text, size_t offset, int* line, int* col) {
  int l = 1, c = 1;
  for (size_t i = 0; i < offset && i < text.size(); i++) {
    unsigned char ch = (unsigned char)text[i];
    if (ch == '\n') {
      l++;
      c = 1;
    } else if ((ch & 0xC0) != 0x80) {
      c++;
    }
  }
  *line = l;
  *col = c;
}

// Errors of one document: "<source>: line L, column C: <what>".
struct Errors {
  const std::string& source;
  const std::string& text;
  std::string message;

  bool at(size_t offset, const char* fmt, ...) __attribute__((format(printf, 3, 4))) {
    int line, col;
    locate(text, offset, &line, &col);
    va_list ap;
    va_start(ap, fmt);
    message = strprintf("%s: line %d, column %d: ", source.c_str(), line, col) + vstrprintf(fmt, ap);
    va_end(ap);
    return false;
  }
};

class JsonReader {
 public:
  JsonReader(const std::string& text, Errors* err) : s_(text), err_(err) {}

  bool document(JValue* out) {
    // A UTF-8 byte order mark is allowed (editors write one) and skipped.
    if (s_.compare(0, 3, "\xEF\xBB\xBF") == 0) pos_ = 3;
    ws();
    if (pos_ >= s_.size()) return err_->at(pos_, "the document is empty: expected a JSON object");
    if (!value(out, 0)) return false;
    ws();
    if (pos_ < s_.size())
      return err_->at(pos_, "unexpected %s after the end of the document", found().c_str());
    return true;
  }

 private:
  const std::string& s_;
  Errors* err_;
  size_t pos_ = 0;

  void ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      pos_++;
  }

  // What is at pos_, for messages.
  std::string found() const {
    if (pos_ >= s_.size()) return "the end of the file";
    unsigned char c = (unsigned char)s_[pos_];
    if (isalpha(c) || c == '_') {
      size_t e = pos_;
      while (e < s_.size() && e - pos_ < 20 && (isalnum((unsigned char)s_[e]) || s_[e] == '_')) e++;
      return "'" + s_.substr(pos_, e - pos_) + "'";
    }
    if (c == '\'') return "''' (JSON strings take double quotes)";
    if (c >= 0x20 && c < 0x7f) return strprintf("'%c'", c);
    return strprintf("byte 0x%02x", c);
  }

  bool value(JValue* v, int depth) {
    if (depth >= kMaxDepth) return err_->at(pos_, "nesting deeper than %d levels", kMaxDepth);
    v->at = pos_;
    if (pos_ >= s_.size()) return err_->at(pos_, "expected a value, found the end of the file");
    char c = s_[pos_];
    switch (c) {
      case '{': return object(v, depth);
      case '[': return array(v, depth);
      case '"': {
        v->kind = JValue::kString;
        return string(&v->str);
      }
      case 't': return literal("true", v, JValue::kBool, true);
      case 'f': return literal("false", v, JValue::kBool, false);
      case 'n': return literal("null", v, JValue::kNull, false);
      default:
        if (c == '-' || (c >= '0' && c <= '9')) return number(v);
        if (isalpha((unsigned char)c))
          return err_->at(pos_,
                          "expected a value, found %s (JSON's words are true, false and null; strings take "
                          "double quotes)",
                          found().c_str());
        return err_->at(pos_,
                        "expected a value (object, array, string, number, true, false or null), found %s",
                        found().c_str());
    }
  }

  bool literal(const char* word, JValue* v, JValue::Kind kind, bool b) {
    size_t n = strlen(word);
    if (s_.compare(pos_, n, word) != 0 ||
        (pos_ + n < s_.size() && (isalnum((unsigned char)s_[pos_ + n]) || s_[pos_ + n] == '_')))
      return err_->at(
          pos_,
          "expected a value, found %s (JSON's words are true, false and null; strings take double quotes)",
          found().c_str());
    pos_ += n;
    v->kind = kind;
    v->boolean = b;
    return true;
  }

  bool number(JValue* v) {
    size_t start = pos_;
    if (s_[pos_] == '-') pos_++;
    if (pos_ >= s_.size() || !isdigit((unsigned char)s_[pos_]))
      return err_->at(pos_, "bad number: expected a digit after '-'");
    if (s_[pos_] == '0' && pos_ + 1 < s_.size() && isdigit((unsigned char)s_[pos_ + 1]))
      return err_->at(start, "bad number: leading zeros are not allowed");
    while (pos_ < s_.size() && isdigit((unsigned char)s_[pos_])) pos_++;
    if (pos_ < s_.size() && s_[pos_] == '.') {
      pos_++;
      if (pos_ >= s_.size() || !isdigit((unsigned char)s_[pos_]))
        return err_->at(pos_, "bad number: expected a digit after '.'");
      while (pos_ < s_.size() && isdigit((unsigned char)s_[pos_])) pos_++;
    }
    if (pos_ < s_.size() && (s_[pos_] == 'e' || s_[pos_] == 'E')) {
      pos_++;
      if (pos_ < s_.size() && (s_[pos_] == '+' || s_[pos_] == '-')) pos_++;
      if (pos_ >= s_.size() || !isdigit((unsigned char)s_[pos_]))
        return err_->at(pos_, "bad number: expected a digit in the exponent");
      while (pos_ < s_.size() && isdigit((unsigned char)s_[pos_])) pos_++;
    }
    double d = 0;
    auto r = std::from_chars(s_.data() + start, s_.data() + pos_, d);
    if (r.ec != std::errc() || r.ptr != s_.data() + pos_ || !std::isfinite(d))
      return err_->at(start, "number %s is out of range", s_.substr(start, pos_ - start).c_str());
    v->kind = JValue::kNumber;
    v->number = d;
    return true;
  }

  static void putUtf8(std::string* out, unsigned cp) {
    if (cp < 0x80) {
      *out += (char)cp;
    } else if (cp < 0x800) {
      *out += (char)(0xC0 | (cp >> 6));
      *out += (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
      *out += (char)(0xE0 | (cp >> 12));
      *out += (char)(0x80 | ((cp >> 6) & 0x3F));
      *out += (char)(0x80 | (cp & 0x3F));
    } else {
      *out += (char)(0xF0 | (cp >> 18));
      *out += (char)(0x80 | ((cp >> 12) & 0x3F));
      *out += (char)(0x80 | ((cp >> 6) & 0x3F));
      *out += (char)(0x80 | (cp & 0x3F));
    }
  }

  bool hex4(size_t at, unsigned* out) {
    if (at + 4 > s_.size()) return false;
    unsigned v = 0;
    for (size_t i = at; i < at + 4; i++) {
      char c = s_[i];
      v <<= 4;
      if (c >= '0' && c <= '9')
        v |= (unsigned)(c - '0');
      else if (c >= 'a' && c <= 'f')
        v |= (unsigned)(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        v |= (unsigned)(c - 'A' + 10);
      else
        return false;
    }
    *out = v;
    return true;
  }

  // Length of the valid UTF-8 sequence at i, 0 if invalid.
  size_t utf8Len(size_t i) const {
    unsigned char c = (unsigned char)s_[i];
    size_t n;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) {
      n = 2;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 3;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 4;
      cp = c & 0x07;
    } else {
      return 0;
    }
    if (i + n > s_.size()) return 0;
    for (size_t k = 1; k < n; k++) {
      unsigned char cc = (unsigned char)s_[i + k];
      if ((cc & 0xC0) != 0x80) return 0;
      cp = (cp << 6) | (cc & 0x3F);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return 0;
    return n;
  }

  bool string(std::string* out) {
    size_t start = pos_;
    pos_++;  // the opening quote
    out->clear();
    while (true) {
      if (pos_ >= s_.size()) return err_->at(start, "unterminated string");
      unsigned char c = (unsigned char)s_[pos_];
      if (c == '"') {
        pos_++;
        return true;
      }
      if (c < 0x20) {
        if (c == '\n') return err_->at(start, "unterminated string (a raw newline ends the line inside it)");
        return err_->at(pos_, "control character 0x%02x inside a string: escape it", c);
      }
      if (c == '\\') {
        if (pos_ + 1 >= s_.size()) return err_->at(start, "unterminated string");
        char e = s_[pos_ + 1];
        const char* simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
          static const char kOut[] = "\"\\/\b\f\n\r\t";
          *out += kOut[simple - "\"\\/bfnrt"];
          pos_ += 2;
          continue;
        }
        if (e != 'u') return err_->at(pos_, "bad escape '\\%c' in a string", e >= 0x20 && e < 0x7f ? e : '?');
        unsigned cp;
        if (!hex4(pos_ + 2, &cp)) return err_->at(pos_, "bad escape: \\u takes four hex digits");
        size_t escAt = pos_;
        pos_ += 6;
        if (cp >= 0xDC00 && cp <= 0xDFFF)
          return err_->at(escAt, "bad escape: a low surrogate \\u%04x without a high one before it", cp);
        if (cp >= 0xD800 && cp <= 0xDBFF) {
          unsigned lo;
          if (s_.compare(pos_, 2, "\\u") != 0 || !hex4(pos_ + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
            return err_->at(escAt, "bad escape: the high surrogate \\u%04x must be followed by a low one",
                            cp);
          pos_ += 6;
          cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        }
        putUtf8(out, cp);
        continue;
      }
      if (c < 0x80) {
        *out += (char)c;
        pos_++;
        continue;
      }
      size_t n = utf8Len(pos_);
      if (!n) return err_->at(pos_, "invalid UTF-8 (byte 0x%02x) inside a string", c);
      out->append(s_, pos_, n);
      pos_ += n;
    }
  }

  bool object(JValue* v, int depth) {
    v->kind = JValue::kObject;
    pos_++;
    ws();
    if (pos_ < s_.size() && s_[pos_] == '}') {
      pos_++;
      return true;
    }
    std::set<std::string> keys;
    while (true) {
      if (pos_ >= s_.size() || s_[pos_] != '"') {
        if (pos_ < s_.size() && s_[pos_] == '}' && !v->members.empty())
          return err_->at(pos_, "trailing comma before '}'");
        return err_->at(pos_, "expected a key in double quotes%s, found %s",
                        v->members.empty() ? " or '}'" : "", found().c_str());
      }
      JMember m;
      m.keyAt = pos_;
      if (!string(&m.key)) return false;
      if (!keys.insert(m.key).second) return err_->at(m.keyAt, "duplicate key \"%s\"", m.key.c_str());
      ws();
      if (pos_ >= s_.size() || s_[pos_] != ':')
        return err_->at(pos_, "expected ':' after the key \"%s\", found %s", m.key.c_str(), found().c_str());
      pos_++;
      ws();
      if (!value(&m.value, depth + 1)) return false;
      v->members.push_back(std::move(m));
      ws();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        pos_++;
        ws();
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == '}') {
        pos_++;
        return true;
      }
      return err_->at(pos_, "expected ',' or '}' after the value of \"%s\", found %s",
                      v->members.back().key.c_str(), found().c_str());
    }
  }

  bool array(JValue* v, int depth) {
    v->kind = JValue::kArray;
    pos_++;
    ws();
    if (pos_ < s_.size() && s_[pos_] == ']') {
      pos_++;
      return true;
    }
    while (true) {
      if (pos_ < s_.size() && s_[pos_] == ']') return err_->at(pos_, "trailing comma before ']'");
      JValue item;
      if (!value(&item, depth + 1)) return false;
      v->items.push_back(std::move(item));
      ws();
      if (pos_ < s_.size() && s_[pos_] == ',') {
        pos_++;
        ws();
        continue;
      }
      if (pos_ < s_.size() && s_[pos_] == ']') {
        pos_++;
        return true;
      }
      return err_->at(pos_, "expected ',' or ']' after an array element, found %s", found().c_str());
    }
  }
};

// ---------------------------------------------------------------------------
// The topology file's schema.

class TopoReader {
 public:
  explicit TopoReader(Errors* err) : err_(err) {}

  bool read(const JValue& root, ClusterTopology* out) {
    if (root.kind != JValue::kObject)
      return err_->at(root.at, "the document must be an object, not %s", kindName(root.kind));
    if (!keysOk(root, "the top level",
                {"version", "comment", "nodes", "ranksPerNode", "nics", "numaNodes", "gpus", "affinity"}))
      return false;
    top_ = &root;
    if (const JValue* v = root.get("version")) {
      if (v->kind != JValue::kNumber || v->number != 1)
        return err_->at(v->at, "\"version\" must be 1 (the only version of this format)");
    }
    const JValue* nodes = root.get("nodes");
    if (!nodes) return err_->at(root.at, "missing \"nodes\": a node count, or an array of node objects");
    if (const JValue* v = root.get("ranksPerNode")) {
      if (!integer(*v, "\"ranksPerNode\"", 1, kMaxRanksPerNode, &ranksPerNode_)) return false;
    }

    std::vector<const JValue*> nodeObjs;  // nullptr: a node made from the top level
    if (nodes->kind == JValue::kNumber) {
      long n = 0;
      if (!integer(*nodes, "\"nodes\"", 1, kMaxNodes, &n)) return false;
      nodeObjs.assign((size_t)n, nullptr);
    } else if (nodes->kind == JValue::kArray) {
      if (nodes->items.empty()) return err_->at(nodes->at, "\"nodes\" is empty: a cluster needs a node");
      if ((long)nodes->items.size() > kMaxNodes)
        return err_->at(nodes->at, "\"nodes\" has %zu nodes, more than %ld", nodes->items.size(), kMaxNodes);
      for (const JValue& n : nodes->items) {
        if (n.kind != JValue::kObject)
          return err_->at(n.at, "each element of \"nodes\" must be a node object, not %s", kindName(n.kind));
        nodeObjs.push_back(&n);
      }
    } else {
      return err_->at(nodes->at, "\"nodes\" must be a node count or an array of node objects, not %s",
                      kindName(nodes->kind));
    }

    ClusterTopology topo;
    long totalRanks = 0, totalNics = 0;
    int listForm = -1;  // 1: ranks given as lists, 0: as counts
    size_t formNode = 0;
    std::vector<std::vector<long>> lists;  // by node, when listForm
    std::vector<std::vector<size_t>> listAt;
    for (size_t i = 0; i < nodeObjs.size(); i++) {
      const JValue* obj = nodeObjs[i];
      NodeTopology node;
      node.name = "node" + std::to_string(i);
      std::string where = "node " + std::to_string(i);
      if (obj) {
        if (!keysOk(*obj, where.c_str(),
                    {"comment", "name", "ranks", "nics", "numaNodes", "gpus", "affinity"}))
          return false;
        if (const JValue* v = obj->get("name")) {
          if (v->kind != JValue::kString || v->str.empty())
            return err_->at(v->at, "\"name\" of %s must be a non-empty string", where.c_str());
          node.name = v->str;
          where += " ('" + node.name + "')";
        }
      }
      // Ranks: a count or a list.
      long count = 0;
      const JValue* ranks = obj ? obj->get("ranks") : nullptr;
      const size_t nodeAt = obj ? obj->at : nodes->at;  // where to point at for this node
      int form = (ranks && ranks->kind == JValue::kArray) ? 1 : 0;
      if (listForm < 0) {
        listForm = form;
        formNode = i;
      } else if (form != listForm) {
        return err_->at(ranks ? ranks->at : nodeAt,
                        "%s gives its ranks as %s but node %zu as %s: use one form for all nodes",
                        where.c_str(), form ? "a list" : "a count", formNode,
                        listForm ? "a list" : "a count");
      }
      std::vector<long> list;
      std::vector<size_t> at;
      if (ranks && ranks->kind == JValue::kArray) {
        if (ranks->items.empty()) return err_->at(ranks->at, "\"ranks\" of %s is empty", where.c_str());
        if ((long)ranks->items.size() > kMaxRanksPerNode)
          return err_->at(ranks->at, "\"ranks\" of %s lists more than %ld ranks", where.c_str(),
                          kMaxRanksPerNode);
        for (const JValue& r : ranks->items) {
          long g = 0;
          if (!integer(r, ("a rank in \"ranks\" of " + where).c_str(), 0, kMaxRanks - 1, &g)) return false;
          list.push_back(g);
          at.push_back(r.at);
        }
        count = (long)list.size();
      } else if (ranks) {
        if (!integer(*ranks, ("\"ranks\" of " + where).c_str(), 1, kMaxRanksPerNode, &count)) return false;
      } else if (ranksPerNode_ > 0) {
        count = ranksPerNode_;
      } else {
        return err_->at(nodeAt, "%s has no \"ranks\", and there is no top-level \"ranksPerNode\"",
                        where.c_str());
      }
      totalRanks += count;
      if (totalRanks > kMaxRanks) return err_->at(nodeAt, "the cluster has more than %ld ranks", kMaxRanks);

      long numa = 1, gpus = 0;
      if (const JValue* v = pick(obj, "numaNodes"))
        if (!integer(*v, ("\"numaNodes\" of " + where).c_str(), 1, kMaxNuma, &numa)) return false;
      node.numaNodes = (int)numa;
      if (const JValue* v = pick(obj, "gpus"))
        if (!integer(*v, ("\"gpus\" of " + where).c_str(), 0, kMaxGpus, &gpus)) return false;
      node.gpus.resize((size_t)gpus);

      const JValue* nics = pick(obj, "nics");
      if (!nics)
        return err_->at(obj ? obj->at : root.at,
                        "%s has no \"nics\" (give them in the node or at the top level; [] for none)",
                        where.c_str());
      if (!readNics(*nics, where, &node)) return false;
      totalNics += (long)node.nics.size();
      if (totalNics > kMaxNicsTotal)
        return err_->at(nics->at, "the cluster has more than %ld NICs", kMaxNicsTotal);

      std::vector<int> affinity;
      if (const JValue* a = pick(obj, "affinity")) {
        if (!readAffinity(*a, where, node, count, &affinity)) return false;
      } else {
        std::vector<int> all;
        for (size_t k = 0; k < node.nics.size(); k++) all.push_back((int)k);
        affinity = assignNics(node, (int)count, all);
      }
      topo.node.push_back(std::move(node));
      topo.nodeRanks.emplace_back();
      topo.nodeRanks.back().resize((size_t)count);
      lists.push_back(std::move(list));
      listAt.push_back(std::move(at));
      rankNicOfNode_.push_back(std::move(affinity));
    }

    // Global ranks.
    topo.rankNode.assign((size_t)totalRanks, -1);
    topo.rankLocal.assign((size_t)totalRanks, -1);
    topo.rankNic.assign((size_t)totalRanks, -1);
    long next = 0;
    for (size_t i = 0; i < topo.node.size(); i++) {
      for (size_t l = 0; l < topo.nodeRanks[i].size(); l++) {
        long g = listForm == 1 ? lists[i][l] : next++;
        if (g >= totalRanks)
          return err_->at(listAt[i][l],
                          "rank %ld in node %zu is out of range: the cluster has %ld ranks (0..%ld)", g, i,
                          totalRanks, totalRanks - 1);
        if (topo.rankNode[(size_t)g] >= 0)
          return err_->at(listAt[i][l], "rank %ld appears twice (also in node %d)", g,
                          topo.rankNode[(size_t)g]);
        topo.nodeRanks[i][l] = (int)g;
        topo.rankNode[(size_t)g] = (int)i;
        topo.rankLocal[(size_t)g] = (int)l;
        topo.rankNic[(size_t)g] = rankNicOfNode_[i][l];
      }
    }
    // (Counts cannot leave a hole; N distinct ranks in 0..N-1 cannot either.)
    *out = std::move(topo);
    return true;
  }

 private:
  Errors* err_;
  const JValue* top_ = nullptr;
  long ranksPerNode_ = 0;
  std::vector<std::vector<int>> rankNicOfNode_;

  // The node's own value of key, else the top level's.
  const JValue* pick(const JValue* obj, const char* key) const {
    if (obj)
      if (const JValue* v = obj->get(key)) return v;
    return top_->get(key);
  }

  bool keysOk(const JValue& obj, const char* what, std::initializer_list<const char*> known) {
    for (const JMember& m : obj.members) {
      bool ok = false;
      for (const char* k : known) ok = ok || m.key == k;
      if (!ok) {
        std::string list;
        for (const char* k : known) list += (list.empty() ? "" : ", ") + std::string(k);
        return err_->at(m.keyAt, "unknown key \"%s\" in %s (known keys: %s)", m.key.c_str(), what,
                        list.c_str());
      }
      if (m.key == "comment") {
        bool good = m.value.kind == JValue::kString;
        if (m.value.kind == JValue::kArray) {
          good = true;
          for (const JValue& c : m.value.items) good = good && c.kind == JValue::kString;
        }
        if (!good) return err_->at(m.value.at, "\"comment\" must be a string or an array of strings");
      }
    }
    return true;
  }

  bool integer(const JValue& v, const char* what, long lo, long hi, long* out) {
    if (v.kind != JValue::kNumber)
      return err_->at(v.at, "%s must be an integer in [%ld, %ld], not %s", what, lo, hi, kindName(v.kind));
    if (v.number != std::floor(v.number) || v.number < (double)lo || v.number > (double)hi)
      return err_->at(v.at, "%s must be an integer in [%ld, %ld], not %.17g", what, lo, hi, v.number);
    *out = (long)v.number;
    return true;
  }

  bool readNics(const JValue& nics, const std::string& where, NodeTopology* node) {
    if (nics.kind != JValue::kArray)
      return err_->at(nics.at, "\"nics\" of %s must be an array of NIC objects, not %s", where.c_str(),
                      kindName(nics.kind));
    if ((long)nics.items.size() > kMaxNicsPerNode)
      return err_->at(nics.at, "\"nics\" of %s has more than %ld NICs", where.c_str(), kMaxNicsPerNode);
    for (size_t k = 0; k < nics.items.size(); k++) {
      const JValue& o = nics.items[k];
      std::string what = "NIC " + std::to_string(k) + " of " + where;
      if (o.kind != JValue::kObject)
        return err_->at(o.at, "%s must be an object with \"name\" and \"bandwidth\", not %s", what.c_str(),
                        kindName(o.kind));
      if (!keysOk(o, what.c_str(), {"comment", "name", "bandwidth", "numa", "pci"})) return false;
      Nic nic;
      const JValue* name = o.get("name");
      if (!name) return err_->at(o.at, "%s has no \"name\"", what.c_str());
      if (name->kind != JValue::kString || name->str.empty())
        return err_->at(name->at, "\"name\" of %s must be a non-empty string", what.c_str());
      nic.name = name->str;
      for (const Nic& other : node->nics)
        if (other.name == nic.name)
          return err_->at(name->at, "%s has two NICs named '%s'", where.c_str(), nic.name.c_str());
      const JValue* bw = o.get("bandwidth");
      if (!bw)
        return err_->at(o.at,
                        "NIC '%s' of %s has no \"bandwidth\" (bits/s, e.g. 1e9 or \"1gbit\"; null: unknown)",
                        nic.name.c_str(), where.c_str());
      if (bw->kind == JValue::kNumber) {
        if (!(bw->number > 0))
          return err_->at(bw->at, "\"bandwidth\" of NIC '%s' must be positive, not %.17g", nic.name.c_str(),
                          bw->number);
        nic.bitsPerSec = bw->number;
      } else if (bw->kind == JValue::kString) {
        double b = 0;
        if (!parseBitsPerSec(bw->str, &b) || !(b > 0))
          return err_->at(bw->at,
                          "\"bandwidth\" of NIC '%s' is \"%s\": expected a positive rate such as 1e9, "
                          "\"100mbit\", \"1gbit\", \"2.5gbit\", \"25gbps\" (bytes/s)",
                          nic.name.c_str(), bw->str.c_str());
        nic.bitsPerSec = b;
      } else if (bw->kind != JValue::kNull) {
        return err_->at(bw->at, "\"bandwidth\" of NIC '%s' must be a number, a string or null, not %s",
                        nic.name.c_str(), kindName(bw->kind));
      }
      if (const JValue* v = o.get("numa")) {
        long numa = -1;
        if (!integer(*v, ("\"numa\" of NIC '" + nic.name + "' of " + where).c_str(), -1, node->numaNodes - 1,
                     &numa))
          return false;
        nic.numa = (int)numa;
      }
      if (const JValue* v = o.get("pci")) {
        if (v->kind != JValue::kString || !isPciBusId(v->str))
          return err_->at(v->at, "\"pci\" of NIC '%s' must be a PCI bus id such as \"0000:17:00.0\"",
                          nic.name.c_str());
        nic.pciBusId = v->str;
      }
      node->nics.push_back(std::move(nic));
    }
    return true;
  }

  bool readAffinity(const JValue& a, const std::string& where, const NodeTopology& node, long ranks,
                    std::vector<int>* out) {
    if (a.kind != JValue::kArray)
      return err_->at(a.at, "\"affinity\" of %s must be an array of NIC names or indexes, not %s",
                      where.c_str(), kindName(a.kind));
    if ((long)a.items.size() != ranks)
      return err_->at(a.at, "\"affinity\" of %s has %zu entries for %ld ranks: give one NIC per local rank",
                      where.c_str(), a.items.size(), ranks);
    for (const JValue& e : a.items) {
      int nic = -1;
      if (e.kind == JValue::kString) {
        for (size_t k = 0; k < node.nics.size(); k++)
          if (node.nics[k].name == e.str) nic = (int)k;
        if (nic < 0)
          return err_->at(e.at, "unknown NIC '%s' in \"affinity\" of %s (its NICs: %s)", e.str.c_str(),
                          where.c_str(), nicList(node).c_str());
      } else if (e.kind == JValue::kNumber) {
        if (node.nics.empty())
          return err_->at(e.at, "\"affinity\" of %s names a NIC, but the node has none", where.c_str());
        long k = 0;
        if (!integer(e, ("a NIC index in \"affinity\" of " + where).c_str(), 0, (long)node.nics.size() - 1,
                     &k))
          return false;
        nic = (int)k;
      } else {
        return err_->at(e.at, "each entry of \"affinity\" must be a NIC name or index, not %s",
                        kindName(e.kind));
      }
      out->push_back(nic);
    }
    return true;
  }
};

}  // namespace

zpResult_t parseTopo(const std::string& text, const std::string& source, ClusterTopology* out) {
  if (!out) return fail(zpInvalidArgument, "parseTopo: out is NULL");
  Errors err{source, text, {}};
  JValue root;
  JsonReader reader(text, &err);
  if (!reader.document(&root)) return fail(zpInvalidArgument, "%s", err.message.c_str());
  TopoReader topo(&err);
  ClusterTopology t;
  if (!topo.read(root, &t)) return fail(zpInvalidArgument, "%s", err.message.c_str());
  *out = std::move(t);
  return zpSuccess;
}

zpResult_t loadTopoFile(const std::string& path, ClusterTopology* out) {
  if (!out) return fail(zpInvalidArgument, "loadTopoFile: out is NULL");
  if (path.empty()) return fail(zpInvalidArgument, "topology file: the path is empty");
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return fail(zpInvalidArgument, "topology file '%s': cannot open it: %s", path.c_str(), strerror(errno));
  struct stat st;
  if (fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    close(fd);
    return fail(zpInvalidArgument, "topology file '%s' is a directory", path.c_str());
  }
  std::string text;
  char buf[65536];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int e = errno;
      close(fd);
      return fail(zpInvalidArgument, "topology file '%s': cannot read it: %s", path.c_str(), strerror(e));
    }
    if (n == 0) break;
    text.append(buf, (size_t)n);
    if (text.size() > kMaxFileBytes) {
      close(fd);
      return fail(zpInvalidArgument, "topology file '%s' is larger than %zu MiB", path.c_str(),
                  kMaxFileBytes >> 20);
    }
  }
  close(fd);
  return parseTopo(text, path, out);
}

// ---------------------------------------------------------------------------
// Output

namespace {

std::string jsonString(const std::string& s) {
  std::string o = "\"";
  for (unsigned char c : s) {
    if (c == '"')
      o += "\\\"";
    else if (c == '\\')
      o += "\\\\";
    else if (c == '\n')
      o += "\\n";
    else if (c == '\t')
      o += "\\t";
    else if (c < 0x20 || c == 0x7f)
      o += strprintf("\\u%04x", c);
    else
      o += (char)c;
  }
  return o + "\"";
}

std::string jsonNumber(double v) {
  if (v == std::floor(v) && std::fabs(v) < 9007199254740992.0) return strprintf("%.0f", v);
  return strprintf("%.17g", v);
}

std::string nicJson(const Nic& n) {
  std::string s = "{\"name\": " + jsonString(n.name) +
                  ", \"bandwidth\": " + (n.bitsPerSec > 0 ? jsonNumber(n.bitsPerSec) : std::string("null"));
  if (n.numa >= 0) s += ", \"numa\": " + std::to_string(n.numa);
  if (!n.pciBusId.empty()) s += ", \"pci\": " + jsonString(n.pciBusId);
  return s + "}";
}

// "nics", "numaNodes", "gpus" and "affinity" members at the given indent,
// each line ending in ",\n" except the last one's "\n".
std::string nodeMembers(const NodeTopology& node, const std::vector<int>& nicOfRank, const std::string& ind) {
  std::vector<std::string> m;
  if (node.numaNodes != 1) m.push_back("\"numaNodes\": " + std::to_string(node.numaNodes));
  if (!node.gpus.empty()) m.push_back("\"gpus\": " + std::to_string(node.gpus.size()));
  std::string nics = "\"nics\": [";
  for (size_t k = 0; k < node.nics.size(); k++)
    nics += (k ? ",\n" : "\n") + ind + "  " + nicJson(node.nics[k]);
  nics += node.nics.empty() ? "]" : "\n" + ind + "]";
  m.push_back(nics);
  bool affinityOk = !nicOfRank.empty() && !node.nics.empty();
  for (int k : nicOfRank) affinityOk = affinityOk && k >= 0 && k < (int)node.nics.size();
  if (affinityOk) {
    std::string a = "\"affinity\": [";
    for (size_t i = 0; i < nicOfRank.size(); i++)
      a += (i ? ", " : "") + jsonString(node.nics[(size_t)nicOfRank[i]].name);
    m.push_back(a + "]");
  }
  std::string s;
  for (size_t i = 0; i < m.size(); i++) s += ind + m[i] + (i + 1 < m.size() ? ",\n" : "\n");
  return s;
}

}  // namespace

std::string toJson(const NodeTopology& node, int localRanks, const std::vector<int>& nicOfRank) {
  std::string s = "{\n  \"name\": " + jsonString(node.name) +
                  ",\n  \"ranks\": " + std::to_string(std::max(1, localRanks)) + ",\n";
  std::vector<int> aff = (int)nicOfRank.size() == localRanks ? nicOfRank : std::vector<int>();
  return s + nodeMembers(node, aff, "  ") + "}\n";
}

std::string toJson(const ClusterTopology& topo) {
  const int n = topo.nodes();
  auto nicsOf = [&](int i) {
    std::vector<int> v;
    for (int g : topo.nodeRanks[(size_t)i]) v.push_back(topo.rankNic[(size_t)g]);
    return v;
  };
  // Ranks numbered node after node: counts suffice.
  bool consecutive = true;
  int next = 0;
  for (int i = 0; i < n; i++)
    for (int g : topo.nodeRanks[(size_t)i]) consecutive = consecutive && g == next++;
  // All nodes alike (default names too): the short form.
  bool uniform = consecutive && n > 0 && topo.ranksPerNode() > 0;
  for (int i = 0; uniform && i < n; i++) {
    const NodeTopology& a = topo.node[(size_t)i];
    const NodeTopology& b = topo.node[0];
    uniform = a.name == "node" + std::to_string(i) && a.nics == b.nics && a.numaNodes == b.numaNodes &&
              a.gpus.size() == b.gpus.size() && nicsOf(i) == nicsOf(0);
  }
  std::string s = "{\n  \"version\": 1,\n";
  if (uniform) {
    s += "  \"nodes\": " + std::to_string(n) +
         ",\n  \"ranksPerNode\": " + std::to_string(topo.ranksPerNode()) + ",\n";
    return s + nodeMembers(topo.node[0], nicsOf(0), "  ") + "}\n";
  }
  s += "  \"nodes\": [";
  for (int i = 0; i < n; i++) {
    const NodeTopology& node = topo.node[(size_t)i];
    s += std::string(i ? ",\n" : "\n") + "    {\n      \"name\": " + jsonString(node.name) +
         ",\n      \"ranks\": ";
    if (consecutive) {
      s += std::to_string(topo.nodeRanks[(size_t)i].size());
    } else {
      s += "[";
      for (size_t l = 0; l < topo.nodeRanks[(size_t)i].size(); l++)
        s += (l ? ", " : "") + std::to_string(topo.nodeRanks[(size_t)i][l]);
      s += "]";
    }
    s += ",\n" + nodeMembers(node, nicsOf(i), "      ") + "    }";
  }
  return s + "\n  ]\n}\n";
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
    if (n.isVirtual) s += "  (virtual)";
    s += "\n";
  }
  for (size_t g = 0; g < node.gpus.size(); g++) {
    const Gpu& gpu = node.gpus[g];
    s += strprintf("  gpu %zu: pci %s  numa %s", g, gpu.pciBusId.empty() ? "?" : gpu.pciBusId.c_str(),
                   gpu.numa >= 0 ? std::to_string(gpu.numa).c_str() : "?");
    bool anyHops = false;
    for (int h : gpu.nicHops) anyHops = anyHops || h >= 0;
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
