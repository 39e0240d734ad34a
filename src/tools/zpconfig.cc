// zpconfig: prints the table of Zeppelin's ZP_* environment variables (one
// declaration each, src/core/params.cc), as text or as the markdown of
// docs/configuration.md, and the value each has in this environment.
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include <net/if.h>

#include <string>

#include "src/core/log.h"
#include "src/core/params.h"
#include "src/core/topology.h"

// What init checks of the settings that name a NIC or where to find one
// (Comm::chooseNic): "" if the value passes.
static std::string nicSettingError(const std::string& name, const std::string& value) {
  std::string why;
  if (name == "ZP_TOPO_FILE") {
    zp::ClusterTopology topo;
    if (zp::loadTopoFile(value, &topo) != zpSuccess) why = zp::lastError();
  } else if (name == "ZP_SYSFS_ROOT" || name == "ZP_NET_DEVICES") {
    zp::NodeTopology node;
    if (zp::discoverNode(&node) != zpSuccess) {
      why = zp::lastError();
    } else if (name == "ZP_NET_DEVICES" && zp::pickNic(node, 0, 1, value, &why) < 0 &&
               !(value.find(',') == std::string::npos && if_nametoindex(value.c_str()))) {
      // (as init: a single name that discovery passes over but the system knows is taken)
    } else {
      why.clear();
    }
  }
  zp::clearLastError();
  return why;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "--list";
  if (argc > 2 || (strcmp(mode, "--list") && strcmp(mode, "--markdown") && strcmp(mode, "--env"))) {
    fprintf(stderr,
            "usage: zpconfig [--list | --markdown | --env]\n"
            "  --list      every ZP_* variable: role, kind, default, valid values, meaning (default)\n"
            "  --markdown  the same as the markdown table of docs/configuration.md\n"
            "  --env       the ZP_* variables set in this environment, checked against the table\n");
    return strcmp(mode, "-h") && strcmp(mode, "--help") ? 2 : 0;
  }
  if (!strcmp(mode, "--markdown")) {
    fputs(zp::paramsMarkdown().c_str(), stdout);
    return 0;
  }
  if (!strcmp(mode, "--list")) {
    fputs(zp::paramsText().c_str(), stdout);
    return 0;
  }
  int bad = 0;
  extern char** environ;
  for (char** e = environ; *e; e++) {
    if (strncmp(*e, "ZP_", 3)) continue;
    const char* eq = strchr(*e, '=');
    std::string name(*e, eq ? (size_t)(eq - *e) : strlen(*e));
    const zp::Param* p = zp::findParam(name);
    std::string why;
    if (!p) {
      why = "not a Zeppelin variable (a typo?)";
    } else if (eq && eq[1] && zp::checkParamValue(*p, eq + 1, nullptr, nullptr) != zpSuccess) {
      why = zp::lastError();
      zp::clearLastError();
    } else if (eq && eq[1]) {
      why = nicSettingError(name, eq + 1);
    }
    bad += !why.empty();
    printf("%s%s%s\n", *e, why.empty() ? "" : "   <- ", why.c_str());
  }
  return bad ? 1 : 0;
}
