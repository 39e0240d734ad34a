// The topology file's reader (ZP_TOPO_FILE, zptopo): any text is either a
// cluster whose tables agree with each other or an error with a message.
#include <cstdlib>
#include <string>

#include "src/core/log.h"
#include "src/core/topology.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text((const char*)data, size);
  zp::ClusterTopology t;
  zpResult_t r = zp::parseTopo(text, "fuzz", &t);
  if (r != zpSuccess) {
    if (zp::lastError()[0] == 0) abort();  // an error must say why
    return 0;
  }
  int n = t.nranks();
  if (n < 0 || (int)t.rankNode.size() != n || (int)t.rankNic.size() != n || (int)t.rankLocal.size() != n) abort();
  for (int r2 = 0; r2 < n; r2++) {
    int node = t.rankNode[r2];
    if (node < 0 || node >= (int)t.node.size()) abort();
    if (t.rankNic[r2] >= (int)t.node[node].nics.size()) abort();
  }
  return 0;
}
