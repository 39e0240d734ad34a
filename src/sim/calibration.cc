#include "src/sim/calibration.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace zp::sim {
namespace {

using json = nlohmann::json;

// FlashAttention forward, causal, head dimension 128, bf16, by sequence
// length: the fraction of the dense peak, read off the published figures
// (FlashAttention-2, Dao 2023, Fig. 5 for A100; FlashAttention-3, Shah et al.
// 2024, Fig. 5 for H100). Approximate to a few percent; a calibration file
// measured on the real machine replaces them.
const std::vector<std::pair<double, double>> kAmpereCurve = {
    {512, 0.35}, {1024, 0.48}, {2048, 0.58}, {4096, 0.63}, {8192, 0.65}, {16384, 0.66}};
const std::vector<std::pair<double, double>> kHopperCurve = {
    {512, 0.20}, {1024, 0.33}, {2048, 0.47}, {4096, 0.57}, {8192, 0.62}, {16384, 0.65}};

// The presets: one row per machine, from its datasheet; the NIC builds and
// everything the datasheets do not give are assumptions, and say so.
struct Preset {
  const char* name;
  int nicsPerNode;
  double nicGbps, intraNodeGBps, tflops;
  const std::vector<std::pair<double, double>>* attnEfficiency;
  double memoryGiB;
  const char* source;
};
const Preset kPresets[] = {
    // NVIDIA A100/A800 SXM datasheet: 312 TFLOPS dense bf16, NVLink 400 GB/s
    // both directions on the A800 (200 each way), 80 GB; 4 x 200 Gbit/s HDR
    // NICs per node is a common A800 cluster build (assumed).
    {"a800", 4, 200, 200, 312, &kAmpereCurve, 80,
     "A100/A800 SXM datasheet (312 TFLOPS bf16, NVLink 200 GB/s each way, 80 GB); 4 x 200 Gbit/s NICs assumed; "
     "attention efficiency read off FlashAttention-2 Fig. 5 (A100, causal, d=128); latencies and routing assumed"},
    // H100/H800 SXM datasheet: 989 TFLOPS dense bf16; the H800's NVLink is
    // cut to 400 GB/s both directions; 80 GB; 8 x 400 Gbit/s NDR per node.
    {"h800", 8, 400, 200, 989, &kHopperCurve, 80,
     "H100/H800 SXM datasheet (989 TFLOPS bf16, NVLink 200 GB/s each way on the H800, 80 GB); 8 x 400 Gbit/s "
     "NICs; attention efficiency read off FlashAttention-3 Fig. 5 (H100, causal, d=128); latencies and routing assumed"},
    // H200 SXM datasheet: the H100's compute, NVLink 900 GB/s both
    // directions (450 each way), 141 GB; 8 x 400 Gbit/s per node.
    {"h200", 8, 400, 450, 989, &kHopperCurve, 141,
     "H200 SXM datasheet (989 TFLOPS bf16, NVLink 450 GB/s each way, 141 GB); 8 x 400 Gbit/s NICs; attention "
     "efficiency as H100 (FlashAttention-3 Fig. 5); latencies and routing assumed"},
};

}  // namespace

const char* calibrationPresetNames() { return "a800, h800, h200"; }

bool calibrationPreset(const std::string& name, Calibration* out) {
  Calibration c;
  c.name = name;
  ClusterModel& m = c.cluster;
  m.ranksPerNode = 8;
  // Per message: NCCL-style point-to-point latency within a node and across
  // InfiniBand, as nccl-tests report for small messages (order of 10 and 20
  // microseconds including the launch); an assumption until measured.
  m.intraLatency = 10e-6;
  m.interLatency = 20e-6;
  // The routing layer's share of a node's NICs for one ring hop: an
  // assumption until bench/calibrate.py measures it with route_perf.
  m.routeEfficiency = 0.8;
  const Preset* p = nullptr;
  for (const Preset& row : kPresets)
    if (name == row.name) p = &row;
  if (!p) return false;
  m.nicsPerNode = p->nicsPerNode;
  m.nicGbps = p->nicGbps;
  m.intraNodeGBps = p->intraNodeGBps;
  m.tflops = p->tflops;
  m.attnEfficiency = *p->attnEfficiency;
  c.memoryGiB = p->memoryGiB;
  c.source = p->source;
  m.efficiency = m.attnEfficiency.back().second;
  *out = c;
  return true;
}

Calibration parseCalibration(const std::string& text, const std::string& what) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {
    throw std::runtime_error(what + ": " + e.what());
  }
  if (!j.is_object()) throw std::runtime_error(what + ": the calibration must be a JSON object");
  Calibration c;
  std::string base = "a800";
  if (j.contains("base")) {
    if (!j["base"].is_string()) throw std::runtime_error(what + ": /base must be a string");
    base = j["base"].get<std::string>();
  }
  if (!calibrationPreset(base, &c))
    throw std::runtime_error(what + ": /base names no preset ('" + base + "'; " + calibrationPresetNames() + ")");
  c.source.clear();
  ClusterModel& m = c.cluster;
  auto number = [&](const std::string& key, double lo, double hi, bool openLow) {
    const json& v = j[key];
    if (!v.is_number()) throw std::runtime_error(what + ": /" + key + " must be a number");
    double x = v.get<double>();
    if (!std::isfinite(x) || x < lo || x > hi || (openLow && x <= lo))
      throw std::runtime_error(what + ": /" + key + " = " + v.dump() + " is out of range");
    return x;
  };
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& k = it.key();
    if (k == "base") continue;
    if (k == "name" || k == "source") {
      if (!it->is_string()) throw std::runtime_error(what + ": /" + k + " must be a string");
      (k == "name" ? c.name : c.source) = it->get<std::string>();
    } else if (k == "ranks_per_node") {
      m.ranksPerNode = int(number(k, 1, 1 << 16, false));
    } else if (k == "nics_per_node") {
      m.nicsPerNode = int(number(k, 1, 1 << 10, false));
    } else if (k == "nic_gbps") {
      m.nicGbps = number(k, 0, 1e9, true);
    } else if (k == "intra_gbytes_per_s") {
      m.intraNodeGBps = number(k, 0, 1e9, true);
    } else if (k == "tflops") {
      m.tflops = number(k, 0, 1e9, true);
    } else if (k == "linear_efficiency") {
      c.linearEfficiency = number(k, 0, 1, true);
    } else if (k == "memory_gib") {
      c.memoryGiB = number(k, 0, 1e9, true);
    } else if (k == "intra_latency_us") {
      m.intraLatency = number(k, 0, 1e9, false) * 1e-6;
    } else if (k == "inter_latency_us") {
      m.interLatency = number(k, 0, 1e9, false) * 1e-6;
    } else if (k == "route_efficiency") {
      m.routeEfficiency = number(k, 0, 1, false);
    } else if (k == "attention_efficiency") {
      if (!it->is_array() || it->empty())
        throw std::runtime_error(what + ": /attention_efficiency must be a non-empty list of [chunk tokens, efficiency]");
      std::vector<std::pair<double, double>> pts;
      for (size_t i = 0; i < it->size(); ++i) {
        const json& p = (*it)[i];
        const std::string at = what + ": /attention_efficiency/" + std::to_string(i);
        if (!p.is_array() || p.size() != 2 || !p[0].is_number() || !p[1].is_number())
          throw std::runtime_error(at + " must be [chunk tokens, efficiency]");
        double len = p[0].get<double>(), eff = p[1].get<double>();
        if (!(len >= 1) || (!pts.empty() && !(len > pts.back().first)))
          throw std::runtime_error(at + ": chunk lengths must be >= 1 and increasing");
        if (!(eff > 0 && eff <= 1)) throw std::runtime_error(at + ": efficiency must be in (0, 1]");
        pts.push_back({len, eff});
      }
      m.attnEfficiency = pts;
      m.efficiency = pts.back().second;
    } else {
      throw std::runtime_error(what + ": unknown key /" + k);
    }
  }
  return c;
}

Calibration readCalibration(const std::string& path) {
  // A calibration is a few hundred bytes: anything much larger is the wrong
  // file, and parsing it whole could take gigabytes. A FIFO would block the
  // read forever: only regular files are read.
  constexpr size_t kMaxBytes = 1 << 20;
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(path + ": cannot open: " + strerror(errno));
  struct stat st;
  std::string text;
  const bool regular = fstat(fd, &st) == 0 && S_ISREG(st.st_mode);
  if (regular && (size_t)st.st_size <= kMaxBytes) {
    text.resize((size_t)st.st_size);
    size_t got = 0;
    for (ssize_t n; got < text.size() && (n = read(fd, &text[got], text.size() - got)) > 0;) got += (size_t)n;
    text.resize(got);
  }
  close(fd);
  if (!regular) throw std::runtime_error(path + ": not a regular file (a FIFO, a device or a directory?)");
  if ((size_t)st.st_size > kMaxBytes)
    throw std::runtime_error(path + ": " + std::to_string(st.st_size) + " bytes; a calibration file is at most 1 MiB");
  return parseCalibration(text, path);
}

std::string calibrationJson(const Calibration& c) {
  const ClusterModel& m = c.cluster;
  json j;
  j["name"] = c.name;
  j["source"] = c.source;
  j["ranks_per_node"] = m.ranksPerNode;
  j["nics_per_node"] = m.nicsPerNode;
  j["nic_gbps"] = m.nicGbps;
  j["intra_gbytes_per_s"] = m.intraNodeGBps;
  j["tflops"] = m.tflops;
  j["linear_efficiency"] = c.linearEfficiency;
  j["memory_gib"] = c.memoryGiB;
  j["intra_latency_us"] = m.intraLatency * 1e6;
  j["inter_latency_us"] = m.interLatency * 1e6;
  j["route_efficiency"] = m.routeEfficiency;
  json pts = json::array();
  for (const auto& [len, eff] : m.attnEfficiency) pts.push_back({len, eff});
  if (pts.empty()) pts.push_back({1, m.efficiency});
  j["attention_efficiency"] = pts;
  return j.dump(2) + "\n";
}

}  // namespace zp::sim
