// Every ZP_* environment variable, declared once (in the manner of NCCL's
// NCCL_PARAM): its kind, default, valid range and what it does. The library
// reads them only through this table, so a name that is not declared cannot
// be read (envString aborts on one: a programming error the tests catch), and
// `zpconfig --list` / `--markdown` print it (docs/configuration.md is
// generated from it; tests/params_test.cc checks both).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "include/zeppelin.h"

namespace zp {

enum class ParamKind { kEnum, kList, kString, kPath, kSeconds, kSize, kInt, kRate };
enum class ParamRole {
  kSetting,   // tunes the library (also in zpConfig_t where it says so)
  kLauncher,  // set by zprun (or the user) for zpCommInitFromEnv to read
  kCluster,   // set by zprun's emulated cluster for each rank
};

struct Param {
  const char* name;
  ParamKind kind;
  ParamRole role;
  const char* dflt;   // as text; "" when there is none
  const char* range;  // kEnum: "a|b|c"; numbers: "lo..hi" (sizes with K/M/G); "" when any
  const char* doc;    // one line
};

const std::vector<Param>& paramTable();
// The declared parameter of that name, or null.
const Param* findParam(const std::string& name);
const char* paramKindName(ParamKind kind);
const char* paramRoleName(ParamRole role);

// A parameter's value (the default, if given, when unset or empty). Aborts
// on a ZP_* name that is not in the table. Other names (MASTER_ADDR, RANK)
// are read as they are.
std::string envString(const char* name, const std::string& dflt = "");

// A parameter checked against the table: unset leaves *out alone; set, it
// must parse and lie in the declared range, else zpInvalidArgument with a
// message naming the variable, its value and what is expected.
zpResult_t paramSize(const char* name, size_t* out);
zpResult_t paramInt(const char* name, long long* out);
zpResult_t paramSeconds(const char* name, double* out);
zpResult_t paramRate(const char* name, double* bitsPerSec);
// The index of the value among the kEnum's values (case-insensitive).
zpResult_t paramEnum(const char* name, int* out);
// Any parameter's value checked against the table as the functions above
// check it (lists: each item one of the declared values); *num gets a
// number's value, *index an enum's index (either may be null).
zpResult_t checkParamValue(const Param& p, const std::string& value, double* num, int* index);
// Every ZP_* setting in the environment checked (communicator init calls it:
// nothing set is silently ignored, the log level included).
zpResult_t checkEnvironment();

// The table in markdown (docs/configuration.md) and as plain text.
std::string paramsMarkdown();
std::string paramsText();

}  // namespace zp
