// What the simulator knows about a machine: a calibration (the cluster model
// of cost_model.h plus the linear layers' efficiency and the memory per
// rank), from a preset or from a JSON file that `bench/calibrate.py` writes
// from the project's own benchmarks. docs/simulator.md lists the keys and
// where each preset's numbers come from.
#pragma once

#include <string>

#include "src/plan/cost_model.h"

namespace zp::sim {

using plan::ClusterModel;

struct Calibration {
  std::string name = "a800";
  std::string source;         // where the numbers come from (free text)
  ClusterModel cluster;       // nodes is left at 1: the caller sets it
  double linearEfficiency = 0.65;
  double memoryGiB = 80;
};

// a800, h800, h200; false for another name.
bool calibrationPreset(const std::string& name, Calibration* out);
const char* calibrationPresetNames();

// Reads a calibration file: a JSON object whose keys (all optional) replace
// the a800 preset's values, or those of the preset its "base" key names.
// Throws std::runtime_error naming the file and the first problem (syntax
// with line and column, an unknown key, a value out of range by its JSON
// pointer).
Calibration readCalibration(const std::string& path);
// The same from text (`what` names it in messages).
Calibration parseCalibration(const std::string& text, const std::string& what);
// A calibration as the file's JSON, every key written.
std::string calibrationJson(const Calibration& cal);

}  // namespace zp::sim
