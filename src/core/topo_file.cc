// The topology file (ZP_TOPO_FILE, zptopo's output): its JSON through
// nlohmann::json, and its schema. A syntax error names its line and column;
// a schema error names the value it is about by its JSON pointer
// (/nodes/1/nics/0/bandwidth). See topology.h for the format.
//
// Copyright 2026 The Zeppelin authors. SPDX-License-Identifier: Apache-2.0
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdarg>
#include <cstring>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "src/core/log.h"
#include "src/core/topology.h"
#include "src/util/strings.h"

namespace zp {
namespace {

using Json = nlohmann::ordered_json;  // keeps members in document order, for messages

// Limits of the topology file (also documented in topology.h).
constexpr long kMaxNodes = 1 << 16;
constexpr long kMaxRanks = 1 << 22;
constexpr long kMaxRanksPerNode = 1 << 16;
constexpr long kMaxNicsPerNode = 1024;
constexpr long kMaxNicsTotal = 1 << 20;
constexpr long kMaxNuma = 1024;
constexpr long kMaxGpus = 1024;
// The parse keeps two trees of the document (the library's and the schema's
// view, about 200 bytes a value): a 16 MB file of small numbers cost 1.6 GB,
// a 63 MB one 3.5 GB, on every rank. Both the file and its values are bounded.
constexpr size_t kMaxFileBytes = 16u << 20;
constexpr long kMaxValues = 1 << 20;
constexpr int kMaxDepth = 64;

// The schema's view of a parsed document: each value with its JSON pointer.
struct JMember;
struct JValue {
  enum Kind { kNull, kBool, kNumber, kString, kArray, kObject };
  Kind kind = kNull;
  bool boolean = false;
  double number = 0;
  std::string str;
  std::vector<JValue> items;
  std::vector<JMember> members;
  std::string at;  // JSON pointer ("" for the document)

  const JValue* get(const char* key) const;
};

struct JMember {
  std::string key;
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

// Errors of one document: "<source>: at <pointer>: <what>", or for syntax
// errors "<source>: line L, column C: <what>".
struct Errors {
  const std::string& source;
  const std::string& text;
  std::string message;

  bool at(const std::string& pointer, const char* fmt, ...) __attribute__((format(printf, 3, 4))) {
    va_list ap;
    va_start(ap, fmt);
    message = source + ": at " + (pointer.empty() ? std::string("the top level") : pointer) + ": " +
              vstrprintf(fmt, ap);
    va_end(ap);
    return false;
  }
  bool atOffset(size_t offset, const std::string& what) {
    int line, col;
    locate(text, offset, &line, &col);
    message = strprintf("%s: line %d, column %d: ", source.c_str(), line, col) + what;
    return false;
  }
};

// One step of a JSON pointer (RFC 6901: ~ and / escaped).
std::string pointerStep(const std::string& key) {
  std::string s = "/";
  for (char c : key) s += c == '~' ? "~0" : c == '/' ? "~1" : std::string(1, c);
  return s;
}

bool build(const Json& j, const std::string& at, int depth, JValue* v, Errors* err) {
  if (depth >= kMaxDepth) return err->at(at, "nesting deeper than %d levels", kMaxDepth);
  v->at = at;
  switch (j.type()) {
    case Json::value_t::null: v->kind = JValue::kNull; return true;
    case Json::value_t::boolean:
      v->kind = JValue::kBool;
      v->boolean = j.get<bool>();
      return true;
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
    case Json::value_t::number_float:
      v->kind = JValue::kNumber;
      v->number = j.get<double>();
      if (!std::isfinite(v->number)) return err->at(at, "number %s is out of range", j.dump().c_str());
      return true;
    case Json::value_t::string:
      v->kind = JValue::kString;
      v->str = j.get<std::string>();
      return true;
    case Json::value_t::array:
      v->kind = JValue::kArray;
      v->items.resize(j.size());
      for (size_t i = 0; i < j.size(); i++)
        if (!build(j[i], at + "/" + std::to_string(i), depth + 1, &v->items[i], err)) return false;
      return true;
    case Json::value_t::object:
      v->kind = JValue::kObject;
      for (auto it = j.begin(); it != j.end(); ++it) {
        v->members.push_back({it.key(), {}});
        if (!build(it.value(), at + pointerStep(it.key()), depth + 1, &v->members.back().value, err)) return false;
      }
      return true;
    default: return err->at(at, "unsupported value");
  }
}

// Parses text (strict RFC 8259: no comments, no trailing commas; a UTF-8
// byte order mark is skipped) into the schema's view. Duplicate keys, which
// the library would keep the last of, are an error.
bool parseJson(const std::string& text, Errors* err, JValue* out) {
  size_t first = text.compare(0, 3, "\xEF\xBB\xBF") == 0 ? 3 : 0;
  first = text.find_first_not_of(" \t\r\n", first);
  if (first == std::string::npos) return err->atOffset(text.size(), "the document is empty: expected a JSON object");
  std::vector<std::set<std::string>> keys;  // of each open object
  std::string duplicate;
  struct TooManyValues {};
  long values = 0;
  auto watch = [&](int, Json::parse_event_t ev, Json& parsed) {
    if ((ev == Json::parse_event_t::value || ev == Json::parse_event_t::object_start ||
         ev == Json::parse_event_t::array_start) &&
        ++values > kMaxValues)
      throw TooManyValues();  // stops the parse before it holds more
    if (ev == Json::parse_event_t::object_start) keys.emplace_back();
    else if (ev == Json::parse_event_t::object_end) keys.pop_back();
    else if (ev == Json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second &&
             duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  Json j;
  try {
    j = Json::parse(text, watch, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const Json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error ...": keep the words
    // after the library's own position, and name the position as the rest of Zeppelin does.
    std::string what = e.what();
    size_t colon = what.find(": ", what.find("parse error"));
    what = colon == std::string::npos ? what : what.substr(colon + 2);
    // The library quotes what it last read: bytes that are not printable
    // ASCII (bad UTF-8 among them) are shown as \xNN.
    std::string shown;
    for (unsigned char c : what) shown += c >= 0x20 && c < 0x7f ? std::string(1, (char)c) : strprintf("\\x%02x", c);
    return err->atOffset(e.byte > 0 ? e.byte - 1 : 0, shown);
  } catch (const Json::exception& e) {
    std::string what = e.what();
    size_t close = what.find("] ");
    return err->atOffset(0, close == std::string::npos ? what : what.substr(close + 2));
  } catch (const TooManyValues&) {
    return err->at("", "more than %ld values (numbers, strings, arrays, objects): not a topology", kMaxValues);
  }
  if (!duplicate.empty()) return err->at("", "duplicate key \"%s\"", duplicate.c_str());
  return build(j, "", 0, out, err);
}

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
    std::vector<std::vector<std::string>> listAt;
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
      const std::string nodeAt = obj ? obj->at : nodes->at;  // where to point at for this node
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
      std::vector<std::string> at;
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

      long numa = 1;
      if (const JValue* v = pick(obj, "numaNodes"))
        if (!integer(*v, ("\"numaNodes\" of " + where).c_str(), 1, kMaxNuma, &numa)) return false;
      node.numaNodes = (int)numa;

      const JValue* nics = pick(obj, "nics");
      if (!nics)
        return err_->at(obj ? obj->at : root.at,
                        "%s has no \"nics\" (give them in the node or at the top level; [] for none)",
                        where.c_str());
      if (!readNics(*nics, where, &node)) return false;
      totalNics += (long)node.nics.size();
      if (totalNics > kMaxNicsTotal)
        return err_->at(nics->at, "the cluster has more than %ld NICs", kMaxNicsTotal);
      // GPUs after NICs: a GPU names its nearest NIC.
      if (const JValue* v = pick(obj, "gpus"))
        if (!readGpus(*v, where, &node)) return false;

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

    if (!numberRanks(listForm, totalRanks, lists, listAt, &topo)) return false;
    // (Counts cannot leave a hole; N distinct ranks in 0..N-1 cannot either.)
    *out = std::move(topo);
    return true;
  }

 private:
  // Global ranks: every rank's node, index there and NIC, the ranks listed
  // by the nodes (listForm 1) or numbered in node order (counts).
  bool numberRanks(int listForm, long totalRanks, const std::vector<std::vector<long>>& lists,
                   const std::vector<std::vector<std::string>>& listAt, ClusterTopology* out) {
    ClusterTopology& topo = *out;
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
    return true;
  }

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
        return err_->at(m.value.at, "unknown key \"%s\" in %s (known keys: %s)", m.key.c_str(), what,
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
      if (!keysOk(o, what.c_str(), {"comment", "name", "bandwidth", "numa", "pci", "hca"})) return false;
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
      if (const JValue* v = o.get("hca")) {
        if (v->kind != JValue::kString || v->str.empty())
          return err_->at(v->at, "\"hca\" of NIC '%s' must be a non-empty string such as \"mlx5_0:1\"",
                          nic.name.c_str());
        nic.hca = v->str;
      }
      node->nics.push_back(std::move(nic));
    }
    return true;
  }

  // "gpus": a count, or GPU objects (pci, numa, nic: its nearest NIC).
  bool readGpus(const JValue& v, const std::string& where, NodeTopology* node) {
    if (v.kind != JValue::kArray) {
      long gpus = 0;
      if (!integer(v, ("\"gpus\" of " + where).c_str(), 0, kMaxGpus, &gpus)) return false;
      node->gpus.resize((size_t)gpus);
      return true;
    }
    if ((long)v.items.size() > kMaxGpus)
      return err_->at(v.at, "\"gpus\" of %s has more than %ld GPUs", where.c_str(), kMaxGpus);
    for (size_t g = 0; g < v.items.size(); g++) {
      const JValue& o = v.items[g];
      std::string what = "GPU " + std::to_string(g) + " of " + where;
      if (o.kind != JValue::kObject)
        return err_->at(o.at, "%s must be an object (keys \"pci\", \"numa\", \"nic\"), not %s", what.c_str(),
                        kindName(o.kind));
      if (!keysOk(o, what.c_str(), {"comment", "pci", "numa", "nic"})) return false;
      Gpu gpu;
      if (const JValue* p = o.get("pci")) {
        if (p->kind != JValue::kString || !isPciBusId(p->str))
          return err_->at(p->at, "\"pci\" of %s must be a PCI bus id such as \"0000:17:00.0\"", what.c_str());
        gpu.pciBusId = p->str;
      }
      if (const JValue* n = o.get("numa")) {
        long numa = -1;
        if (!integer(*n, ("\"numa\" of " + what).c_str(), -1, node->numaNodes - 1, &numa)) return false;
        gpu.numa = (int)numa;
      }
      if (const JValue* e = o.get("nic"))
        if (!nicRef(*e, "\"nic\" of " + what, *node, &gpu.nic)) return false;
      node->gpus.push_back(std::move(gpu));
    }
    return true;
  }

  // A NIC of node named by a string (its name) or a number (its index), in
  // `in` (what names it, for messages).
  bool nicRef(const JValue& e, const std::string& in, const NodeTopology& node, int* nic) {
    if (e.kind == JValue::kString) {
      for (size_t k = 0; k < node.nics.size(); k++)
        if (node.nics[k].name == e.str) *nic = (int)k;
      if (*nic < 0)
        return err_->at(e.at, "unknown NIC '%s' in %s (its NICs: %s)", e.str.c_str(), in.c_str(),
                        nicList(node).c_str());
      return true;
    }
    if (node.nics.empty()) return err_->at(e.at, "%s names a NIC, but the node has none", in.c_str());
    long k = 0;
    if (!integer(e, ("a NIC index in " + in).c_str(), 0, (long)node.nics.size() - 1, &k)) return false;
    *nic = (int)k;
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
      if (e.kind != JValue::kString && e.kind != JValue::kNumber)
        return err_->at(e.at, "each entry of \"affinity\" must be a NIC name or index, not %s",
                        kindName(e.kind));
      if (!nicRef(e, "\"affinity\" of " + where, node, &nic)) return false;
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
  if (!parseJson(text, &err, &root)) return fail(zpInvalidArgument, "%s", err.message.c_str());
  TopoReader topo(&err);
  ClusterTopology t;
  if (!topo.read(root, &t)) return fail(zpInvalidArgument, "%s", err.message.c_str());
  *out = std::move(t);
  return zpSuccess;
}

zpResult_t loadTopoFile(const std::string& path, ClusterTopology* out) {
  if (!out) return fail(zpInvalidArgument, "loadTopoFile: out is NULL");
  if (path.empty()) return fail(zpInvalidArgument, "topology file: the path is empty");
  // O_NONBLOCK: opening a FIFO would wait for a writer, maybe for ever.
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0)
    return fail(zpInvalidArgument, "topology file '%s': cannot open it: %s", path.c_str(), strerror(errno));
  struct stat st;
  if (fstat(fd, &st) == 0 && !S_ISREG(st.st_mode)) {
    close(fd);
    return fail(zpInvalidArgument, "topology file '%s' %s", path.c_str(),
                S_ISDIR(st.st_mode) ? "is a directory" : "is not a regular file (a FIFO, a device or a socket)");
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

Json nicJson(const Nic& n) {
  Json o;
  o["name"] = n.name;
  if (n.bitsPerSec > 0) o["bandwidth"] = n.bitsPerSec;
  else o["bandwidth"] = nullptr;
  if (n.numa >= 0) o["numa"] = n.numa;
  if (!n.pciBusId.empty()) o["pci"] = n.pciBusId;
  if (!n.hca.empty()) o["hca"] = n.hca;
  return o;
}

// A node's "numaNodes", "gpus", "nics" and "affinity" members.
void nodeMembers(const NodeTopology& node, const std::vector<int>& nicOfRank, Json* o) {
  if (node.numaNodes != 1) (*o)["numaNodes"] = node.numaNodes;
  Json nics = Json::array();
  for (const Nic& n : node.nics) nics.push_back(nicJson(n));
  (*o)["nics"] = nics;
  // GPUs: a count, unless one of them is known beyond that.
  bool detailed = false;
  for (const Gpu& g : node.gpus) detailed = detailed || !g.pciBusId.empty() || g.numa >= 0 || g.nic >= 0;
  if (detailed) {
    Json gpus = Json::array();
    for (const Gpu& g : node.gpus) {
      Json j = Json::object();
      if (!g.pciBusId.empty()) j["pci"] = g.pciBusId;
      if (g.numa >= 0) j["numa"] = g.numa;
      if (g.nic >= 0 && g.nic < (int)node.nics.size()) j["nic"] = node.nics[(size_t)g.nic].name;
      gpus.push_back(j);
    }
    (*o)["gpus"] = gpus;
  } else if (!node.gpus.empty()) {
    (*o)["gpus"] = node.gpus.size();
  }
  bool affinityOk = !nicOfRank.empty() && !node.nics.empty();
  for (int k : nicOfRank) affinityOk = affinityOk && k >= 0 && k < (int)node.nics.size();
  if (affinityOk) {
    Json a = Json::array();
    for (int k : nicOfRank) a.push_back(node.nics[(size_t)k].name);
    (*o)["affinity"] = a;
  }
}

std::string dump(const Json& j) { return j.dump(2) + "\n"; }

}  // namespace

std::string toJson(const NodeTopology& node, int localRanks, const std::vector<int>& nicOfRank) {
  Json o;
  o["name"] = node.name;
  o["ranks"] = std::max(1, localRanks);
  nodeMembers(node, (int)nicOfRank.size() == localRanks ? nicOfRank : std::vector<int>(), &o);
  return dump(o);
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
              a.gpus == b.gpus && nicsOf(i) == nicsOf(0);
  }
  Json o;
  o["version"] = 1;
  if (uniform) {
    o["nodes"] = n;
    o["ranksPerNode"] = topo.ranksPerNode();
    nodeMembers(topo.node[0], nicsOf(0), &o);
    return dump(o);
  }
  Json nodes = Json::array();
  for (int i = 0; i < n; i++) {
    Json node;
    node["name"] = topo.node[(size_t)i].name;
    if (consecutive) node["ranks"] = topo.nodeRanks[(size_t)i].size();
    else node["ranks"] = topo.nodeRanks[(size_t)i];
    nodeMembers(topo.node[(size_t)i], nicsOf(i), &node);
    nodes.push_back(node);
  }
  o["nodes"] = nodes;
  return dump(o);
}

}  // namespace zp
