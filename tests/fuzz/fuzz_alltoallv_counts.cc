// alltoallv's count exchange: the matrix every rank assembles from its
// peers' rows. Whatever the rows say, the check either refuses them or
// passes a matrix the router can plan (no overflow on the way: UBSan).
#include <cstdlib>
#include <vector>

#include "collectives/collectives.h"
#include "src/route/router.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  zpfuzz::Input in(data, size);
  const int nodes = 1 + (int)in.below(3), perNode = 1 + (int)in.below(3), n = nodes * perNode;
  const size_t rowLen = zp::countRowLen(n);
  std::vector<uint64_t> rows((size_t)n * rowLen);
  // Mostly consistent rows (sends of i to j equal j's receives from i), with
  // hostile values mixed in.
  const uint64_t ts = (uint64_t)1 << in.below(4);
  for (int i = 0; i < n; i++) {
    rows[(size_t)i * rowLen + 2 * n] = ts;
    for (int j = 0; j < n; j++) {
      uint64_t c = in.below(4) == 0 ? in.take<uint64_t>() : in.below(1 << 20);
      rows[(size_t)i * rowLen + j] = c;
      rows[(size_t)j * rowLen + n + i] = c;
    }
  }
  for (int k = in.below(3); k > 0; k--) rows[in.below((uint32_t)rows.size())] = in.take<uint64_t>();
  if (zp::checkCountMatrix(in.below(n), n, rows) != zpSuccess) return 0;
  // Passed: the routed path's byte matrix and plan.
  zp::ClusterTopology topo;
  topo.node.resize(nodes);
  for (int d = 0; d < nodes; d++) {
    topo.nodeRanks.push_back({});
    for (int k = 0; k < 2; k++) {
      zp::Nic nic;
      nic.name = "nic" + std::to_string(k);
      nic.bitsPerSec = 100e9;
      topo.node[d].nics.push_back(nic);
    }
  }
  for (int r = 0; r < n; r++) {
    topo.rankNode.push_back(r / perNode);
    topo.rankLocal.push_back(r % perNode);
    topo.rankNic.push_back(r % 2);
    topo.nodeRanks[r / perNode].push_back(r);
  }
  std::vector<std::vector<uint64_t>> bytes(n, std::vector<uint64_t>(n, 0));
  for (int s = 0; s < n; s++)
    for (int d = 0; d < n; d++)
      if (s / perNode != d / perNode) bytes[s][d] = rows[(size_t)s * rowLen + d] * ts;
  zp::RoutePlan plan;
  std::string why;
  zp::RouteParams params;
  if (zp::planRoutes(topo, bytes, params, &plan, &why) != zpSuccess && why.empty()) abort();
  return 0;
}
