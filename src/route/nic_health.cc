#include "src/route/nic_health.h"

#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "src/core/log.h"
#include "src/util/clock.h"

namespace zp {

NicHealth::NicHealth(const Comm& comm) : comm_(comm), topo_(comm.cluster()) {}

NicHealth::~NicHealth() {
  if (probeFd_ >= 0) close(probeFd_);
}

bool NicHealth::nicUp(int node, int k) const {
  const std::vector<Nic>& nics = topo_.node[node].nics;
  return k < 0 || k >= (int)nics.size() || !nics[k].down;
}

bool NicHealth::pathUp(int a, int b) const {
  const std::vector<int>& node = comm_.nodeOf();
  const std::vector<int>& rail = comm_.rail();
  return nicUp(node[a], rail[a]) && nicUp(node[b], rail[b]) && nicUp(node[a], rail[b]) && nicUp(node[b], rail[a]);
}

bool NicHealth::reliesOnProxies(int r) const {
  // Asked for each rank of the node at every pass of a destroy and for
  // every routed send after a rank left: worked out once per rank and set of NICs.
  const std::vector<int>& node = comm_.nodeOf();
  if (relies_.empty()) relies_.assign(node.size(), -1);
  if (relies_[r] < 0) {
    relies_[r] = 0;
    for (int p = 0; p < (int)node.size() && !relies_[r]; p++) relies_[r] = node[p] != node[r] && !pathUp(r, p);
  }
  return relies_[r] > 0;
}

bool NicHealth::directAlive(int peer) const {
  if (comm_.isLocal(peer)) return true;
  return pathUp(comm_.rank(), peer);
}

void NicHealth::check() {
  const int me = comm_.rank();
  const int node = comm_.nodeOf()[me], rail = comm_.rail()[me];
  const std::string& name = comm_.nicName();
  if (name.empty() || !nicUp(node, rail)) return;
  uint64_t now = nowMs();
  if (now - checkedMs_ < 5) return;
  checkedMs_ = now;
  if (probeFd_ < 0) probeFd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  ifreq ifr;
  memset(&ifr, 0, sizeof(ifr));
  snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", name.c_str());
  if (probeFd_ < 0 || ioctl(probeFd_, SIOCGIFFLAGS, &ifr) != 0) return;  // cannot tell: assume it works
  if ((ifr.ifr_flags & IFF_UP) && (ifr.ifr_flags & IFF_RUNNING)) return;
  ZP_WARN(kSubNet, "rank %d: NIC %s (rail %d of node %d) is down; its traffic moves to the node's other NICs", me,
          name.c_str(), rail, node);
  news_.push_back({node, rail, name});
}

void NicHealth::heard(const std::string& text) {
  Down d;
  char name[64] = "";
  if (sscanf(text.c_str(), "%d %d %63s", &d.node, &d.rail, name) >= 2 && d.node >= 0 &&
      d.node < (int)topo_.node.size() && d.rail >= 0) {
    d.name = name;
    news_.push_back(d);
  }
}

std::vector<NicHealth::Down> NicHealth::apply() {
  std::vector<Down> news;
  news.swap(news_);
  std::vector<Down> fresh;
  for (Down& d : news) {
    std::vector<Nic>& nics = topo_.node[d.node].nics;
    if (d.rail >= (int)nics.size() || nics[d.rail].down) continue;
    nics[d.rail].down = true;
    relies_.clear();
    fresh.push_back(std::move(d));
  }
  return fresh;
}

std::string NicHealth::encode(const Down& d) {
  return std::to_string(d.node) + " " + std::to_string(d.rail) + " " + d.name;
}

bool NicHealth::nodeCut(int node) const {
  for (const Nic& n : topo_.node[node].nics)
    if (!n.down) return false;
  return true;
}

}  // namespace zp
