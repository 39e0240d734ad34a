// zpCommInitFromEnv: a communicator from the environment a launcher gives
// its ranks (zprun, torchrun, mpirun, srun), through zpCommInitRankConfig.
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "include/zeppelin.h"
#include "src/core/bootstrap.h"
#include "src/core/config.h"
#include "src/core/log.h"
#include "src/core/params.h"
#include "src/util/clock.h"
#include "src/util/nvtx.h"
#include "src/util/strings.h"

// Single-node mpirun without an address: rank 0 makes an id and leaves it in
// a file named after the job, the others read it.
static zpResult_t mpirunFileId(int rank, const std::string& job, int timeoutMs, zpUniqueId* id, std::string* path) {
  *path = "/dev/shm/zeppelin-mpirun-" + job + ".id";
  if (rank == 0) {
    ZP_CHECK(zpGetUniqueId(id));
    std::string tmp = *path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "w");
    if (!f) return zp::fail(zpSystemError, "cannot write %s: %s", tmp.c_str(), strerror(errno));
    fprintf(f, "%s\n", zp::idToHex(*id).c_str());
    fclose(f);
    if (rename(tmp.c_str(), path->c_str()) != 0)
      return zp::fail(zpSystemError, "cannot rename %s: %s", tmp.c_str(), strerror(errno));
    return zpSuccess;
  }
  uint64_t deadline = zp::nowMs() + timeoutMs;
  for (;;) {
    std::ifstream in(*path);
    std::string hex;
    if (in >> hex && zp::idFromHex(hex, id)) return zpSuccess;
    if (zp::nowMs() > deadline)
      return zp::fail(zpRemoteError, "mpirun rank %d: rank 0 never wrote %s (for several nodes set MASTER_ADDR "
                      "and MASTER_PORT)", rank, path->c_str());
    usleep(2000);
  }
}

zpResult_t zpCommInitFromEnv(zpComm_t* comm, zpConfig_t* config) try {
  ZP_NVTX_RANGE("zpCommInitFromEnv");
  if (!comm) return zp::fail(zpInvalidArgument, "zpCommInitFromEnv: comm is NULL");
  *comm = nullptr;
  auto env = [](const char* n) { return zp::envString(n); };
  long long rank = -1, nranks = -1;
  zpUniqueId id;
  std::string idFile;
  const char* how = nullptr;
  // Rank 0 hosts the rendezvous at addr. The port: ZP_MASTER_PORT, else the
  // one after MASTER_PORT, else (srun) defaultPort.
  auto fromMaster = [&](const char* launcher, const std::string& addr, long long defaultPort = 0) -> zpResult_t {
    long long port = 0;
    std::string zpPort = env("ZP_MASTER_PORT");
    if (!zpPort.empty()) {
      if (!zp::parseInt(zpPort, 1LL, 65535LL, &port)) return zp::fail(zpInvalidArgument, "ZP_MASTER_PORT='%s' is not a port", zpPort.c_str());
    } else if (defaultPort > 0 && env("MASTER_PORT").empty()) {
      port = defaultPort;
    } else {
      // MASTER_PORT itself belongs to the launcher's own store (torchrun), so use the next one.
      if (!zp::parseInt(env("MASTER_PORT"), 1LL, 65534LL, &port))
        return zp::fail(zpInvalidArgument, "MASTER_PORT='%s' is not a port", env("MASTER_PORT").c_str());
      port += 1;
    }
    how = launcher;
    // Without ZP_SECRET the secret comes from public values only: anyone who
    // can read them (or guess them: torchrun's run id is "none" by default)
    // can join.
    std::string secret = env("ZP_SECRET");
    if (!secret.empty() && secret.size() < 16)
      return zp::fail(zpInvalidArgument, "ZP_SECRET has %zu characters; it needs 16 or more", secret.size());
    std::string seed = addr + ":" + std::to_string(port) + ":" + std::to_string(nranks) + ":" +
                       env("TORCHELASTIC_RUN_ID") + env("OMPI_MCA_ess_base_jobid") + env("SLURM_JOB_ID") + "." +
                       env("SLURM_STEP_ID") + ":" + secret;
    return zp::makeRank0Id(addr, (int)port, seed, &id);
  };
  zp::Config cfg;
  ZP_CHECK(zp::resolveConfig(config, &cfg));

  if (!env("ZP_UNIQUE_ID").empty()) {
    how = "zprun";
    if (!zp::parseInt(env("ZP_RANK"), 0LL, 1LL << 24, &rank) || !zp::parseInt(env("ZP_NRANKS"), 1LL, 1LL << 24, &nranks))
      return zp::fail(zpInvalidArgument, "ZP_RANK='%s' / ZP_NRANKS='%s' are not valid", env("ZP_RANK").c_str(),
                      env("ZP_NRANKS").c_str());
    if (!zp::idFromHex(env("ZP_UNIQUE_ID"), &id))
      return zp::fail(zpInvalidArgument, "ZP_UNIQUE_ID is not a hex-encoded zpUniqueId");
  } else if (!env("OMPI_COMM_WORLD_RANK").empty()) {
    if (!zp::parseInt(env("OMPI_COMM_WORLD_RANK"), 0LL, 1LL << 24, &rank) ||
        !zp::parseInt(env("OMPI_COMM_WORLD_SIZE"), 1LL, 1LL << 24, &nranks))
      return zp::fail(zpInvalidArgument, "OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE are not valid");
    if (!env("MASTER_ADDR").empty() && !env("MASTER_PORT").empty()) {
      ZP_CHECK(fromMaster("mpirun", env("MASTER_ADDR")));
    } else {
      std::string job = env("OMPI_MCA_ess_base_jobid");
      if (job.empty()) job = env("PMIX_NAMESPACE");
      if (job.empty()) return zp::fail(zpInvalidUsage, "mpirun: no job id in the environment; set MASTER_ADDR and MASTER_PORT");
      for (char& ch : job)
        if (!isalnum((unsigned char)ch)) ch = '_';
      how = "mpirun";
      ZP_CHECK(mpirunFileId((int)rank, job, cfg.timeoutMs, &id, &idFile));
    }
  } else if (!env("RANK").empty() && !env("WORLD_SIZE").empty()) {
    if (!zp::parseInt(env("RANK"), 0LL, 1LL << 24, &rank) || !zp::parseInt(env("WORLD_SIZE"), 1LL, 1LL << 24, &nranks))
      return zp::fail(zpInvalidArgument, "RANK='%s' / WORLD_SIZE='%s' are not valid", env("RANK").c_str(),
                      env("WORLD_SIZE").c_str());
    if (env("MASTER_ADDR").empty() || env("MASTER_PORT").empty())
      return zp::fail(zpInvalidUsage, "RANK and WORLD_SIZE are set but MASTER_ADDR / MASTER_PORT are not");
    ZP_CHECK(fromMaster("torchrun", env("MASTER_ADDR")));
  } else if (!env("SLURM_PROCID").empty() && !env("SLURM_NTASKS").empty()) {
    // srun: one task per rank; rank 0 (the first task, on the first node of
    // the step) hosts the rendezvous.
    long long localId = 0;
    if (!zp::parseInt(env("SLURM_PROCID"), 0LL, 1LL << 24, &rank) || !zp::parseInt(env("SLURM_NTASKS"), 1LL, 1LL << 24, &nranks))
      return zp::fail(zpInvalidArgument, "SLURM_PROCID='%s' / SLURM_NTASKS='%s' are not valid", env("SLURM_PROCID").c_str(),
                      env("SLURM_NTASKS").c_str());
    if (!env("SLURM_LOCALID").empty() && !zp::parseInt(env("SLURM_LOCALID"), 0LL, nranks - 1, &localId))
      return zp::fail(zpInvalidArgument, "SLURM_LOCALID='%s' is not a task index below %lld", env("SLURM_LOCALID").c_str(), nranks);
    std::string master = env("MASTER_ADDR"), list = env("SLURM_STEP_NODELIST");
    if (list.empty()) list = env("SLURM_JOB_NODELIST");
    if (master.empty() && !zp::firstHostOfList(list, &master))
      return zp::fail(zpInvalidUsage, "srun: no MASTER_ADDR, and SLURM_STEP_NODELIST / SLURM_JOB_NODELIST ('%s') names no first host",
                      list.c_str());
    // Without a port given, one every task derives from the job and step ids
    // (in [20000, 40000): below the usual ephemeral range).
    long long job = 0, step = 0;
    zp::parseInt(env("SLURM_JOB_ID"), 0LL, 1LL << 40, &job);
    zp::parseInt(env("SLURM_STEP_ID"), 0LL, 1LL << 40, &step);
    ZP_CHECK(fromMaster("srun", master, 20000 + (job * 97 + step) % 20000));
  } else {
    return zp::fail(zpInvalidUsage,
                    "zpCommInitFromEnv: no launcher environment: start the program with zprun, torchrun, mpirun or srun "
                    "(or set ZP_RANK, ZP_NRANKS and ZP_UNIQUE_ID)");
  }
  if (rank >= nranks) return zp::fail(zpInvalidArgument, "%s: rank %lld is not below the world size %lld", how, rank, nranks);
  ZP_INFO(zp::kSubInit, "rank %lld of %lld from the %s environment", rank, nranks, how);
  zpResult_t r = zpCommInitRankConfig(comm, (int)nranks, id, (int)rank, config);
  if (rank == 0 && !idFile.empty()) unlink(idFile.c_str());
  return r;
} catch (...) {
  return zp::failFromException("zpCommInitFromEnv");
}
