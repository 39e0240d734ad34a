// What the simulator's tests share: the project's length files and the
// presets' machines.
#pragma once

#include <string>
#include <vector>

#include "src/sim/calibration.h"
#include "src/sim/simulator.h"

namespace zptest {

// The lengths of a file of tests/data.
inline std::vector<int64_t> lengthsOf(const char* file) {
  return zp::sim::readLengths(std::string(ZP_TEST_DATA_DIR) + "/" + file);
}

// A step on a preset's machine (a800, h800, h200) of nranks ranks, Llama-8B.
inline zp::sim::StepConfig presetStep(const char* preset, zp::plan::ClusterModel* c, int nranks) {
  zp::sim::Calibration cal;
  zp::sim::calibrationPreset(preset, &cal);
  *c = cal.cluster;
  c->nodes = nranks / c->ranksPerNode;
  zp::sim::StepConfig cfg;
  zp::sim::modelPreset("llama-8b", &cfg.model);
  cfg.linearEfficiency = cal.linearEfficiency;
  cfg.memoryBytes = cal.memoryGiB * double(1 << 30);
  return cfg;
}

}  // namespace zptest
