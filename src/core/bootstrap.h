// Bootstrap: the rendezvous that turns a zpUniqueId into a table of every
// rank's identity. The root (started by zpGetUniqueId, or by rank 0 for
// torchrun-style ids) accepts one TCP connection per rank, checks each
// connection's secret, and once all nranks have joined sends every rank the
// whole table.
//
// One id given to two jobs (a file of ids shared by mistake) must not make
// one communicator of ranks of both. Each rank presents its job (jobIdentity:
// what its launcher says about the job); a rank of another job than the
// first rank's, a rank number that joins twice, or another nranks fails the
// rendezvous for every rank that joined, and the root then refuses the
// id's latecomers for a while with the same message, so that every rank of
// both jobs fails saying why. Connections that present a wrong secret, a wrong header or
// garbage are dropped (logged at most once a second); they never block or
// join the exchange, and while they wait for their header they are bounded
// and evicted oldest first, so they cannot crowd out a rank (an evicted rank
// is told to retry, and does, within its timeout).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <vector>

#include "include/zeppelin.h"

namespace zp {

constexpr uint32_t kIdMagic = 0x5a504944;  // "ZPID"
constexpr uint8_t kIdVersion = 1;
constexpr uint8_t kIdFlagRootAtRank0 = 1;  // rank 0 hosts the root (torchrun / MASTER_ADDR ids)

// The layout inside zpUniqueId.internal. Plain bytes so it can travel through
// any channel (MPI_Bcast, environment as hex, a file).
struct IdLayout {
  uint32_t magic;
  uint8_t version;
  uint8_t flags;
  uint16_t reserved;
  sockaddr_in6 addr;      // where the root listens (IPv4 kept as sockaddr_in in the same bytes)
  uint8_t secret[16];     // random; every joining rank must present it
};
static_assert(sizeof(IdLayout) <= sizeof(zpUniqueId), "id layout too large");

// What each rank tells the others at init. Fixed size so the wire format is
// trivial to validate.
struct RankInfo {
  int32_t rank;
  int32_t pid;
  char nodeId[128];    // ranks with equal nodeId share memory
  char hostname[64];
};

sockaddr_storage idAddress(const IdLayout& id);
void setIdAddress(IdLayout* id, const sockaddr_storage& addr);

// Decodes an id; false if it is not a valid zpUniqueId.
bool decodeId(const zpUniqueId& id, IdLayout* out);
zpUniqueId encodeId(const IdLayout& layout);
std::string idToHex(const zpUniqueId& id);
bool idFromHex(const std::string& hex, zpUniqueId* id);

// Opens a listening socket and starts the root service thread for one
// communicator. Fills *id. Used by zpGetUniqueId.
zpResult_t startRoot(zpUniqueId* id);
// Starts the root on an address given by the id (kIdFlagRootAtRank0).
zpResult_t startRootAt(const IdLayout& layout);
// Builds an id whose root rank 0 hosts at host:port, with a secret derived
// from seedText (every rank derives the same one).
zpResult_t makeRank0Id(const std::string& host, int port, const std::string& seedText,
                       zpUniqueId* id);

// Joins: sends this rank's info to the root, waits for all ranks' infos.
// The connection to the root stays open (*rootFd) for bootstrapAllgather.
zpResult_t bootstrapExchange(const IdLayout& id, int nranks, const RankInfo& mine,
                             int timeoutMs, std::vector<RankInfo>* all, int* rootFd);
// Second and last round: every rank gives a blob (a transport address, or
// nothing) and gets every rank's; all->size() must be nranks.
zpResult_t bootstrapAllgather(int rootFd, int rank, const std::string& mine, int timeoutMs,
                              std::vector<std::string>* all);

// Wire header a rank sends to the root.
struct JoinHeader {
  uint32_t magic;  // kIdMagic
  uint8_t secret[16];
  int32_t nranks;
  int32_t timeoutMs;
  RankInfo info;
  char job[96];  // jobIdentity(), NUL-terminated
};

// This process's job as its launcher describes it, alike for every rank of
// one launch and different between launches: ZP_JOB_ID if set (ranks of one
// communicator started by separate launches set it alike), else the
// launcher's job variables (zprun's own id, Slurm's job and step, PMIx's
// namespace, Open MPI's job, torchrun's run id, LSF's and PBS's job ids).
// "" when started without a launcher: then only a rank number joining twice
// tells two jobs apart.
std::string jobIdentity();

// What the root makes of the first `got` bytes of a connection's header: a
// stranger (bad magic or secret: dropped), not complete yet, a header that is
// invalid for this communicator (refused, *why says why), a rank that cannot
// be of the same job as those that joined (another job, a rank number
// joining twice, another nranks: the rendezvous fails for all, *why says
// why), or a rank's valid join. nranks is -1 until the first rank joined;
// rankFd[r] >= 0 once rank r has; job: the first rank's header's (null
// before).
enum class JoinCheck { kIncomplete, kStranger, kInvalid, kConflict, kComplete };
JoinCheck checkJoinHeader(const JoinHeader& h, size_t got, const uint8_t secret[16], int nranks,
                          const std::vector<int>& rankFd, std::string* why, const JoinHeader* first = nullptr);

}  // namespace zp
