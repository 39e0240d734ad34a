// zp_env_rank: one rank of a job started by a launcher (zprun, mpirun,
// torchrun). Creates its communicator with zpCommInitFromEnv, runs checked
// alltoallv calls with random counts (every byte checked, nothing outside
// the receive ranges written), and exits 0 if all is well, 1 otherwise.
// Rank 0 draws the seed and sends it to the others, so every run differs.
#include <random>

#include "include/zeppelin.h"
#include "tests/checks.h"

int main() {
  zpComm_t comm = nullptr;
  zpResult_t r = zpCommInitFromEnv(&comm, nullptr);
  if (r != zpSuccess) {
    fprintf(stderr, "zp_env_rank: zpCommInitFromEnv: %s: %s\n", zpGetErrorString(r), zpGetLastError(nullptr));
    return 1;
  }
  int rank = -1, n = 0;
  zpCommUserRank(comm, &rank);
  zpCommCount(comm, &n);
  uint64_t seed = 0;
  if (rank == 0) seed = std::random_device{}() * 0x9E3779B97F4A7C15ull ^ std::random_device{}();
  zpGroupStart();
  for (int p = 1; p < n && rank == 0; p++) zpSend(&seed, 1, zpUint64, p, comm, nullptr);
  if (rank != 0) zpRecv(&seed, 1, zpUint64, 0, comm, nullptr);
  r = zpGroupEnd();
  if (r != zpSuccess) {
    fprintf(stderr, "zp_env_rank %d: sharing the seed: %s\n", rank, zpGetLastError(comm));
    return 1;
  }
  int failures = 0;
  const size_t maxCounts[] = {20, 5000, 200000};
  for (int it = 0; it < 6; it++) {
    zpDataType_t dt = (zpDataType_t)((seed + it) % zpNumTypes);
    std::string err = zptest::alltoallvError(
        comm, rank, zptest::randomCounts(n, seed + it, maxCounts[it % 3], 0.2), dt, seed * 31 + it);
    if (!err.empty()) {
      fprintf(stderr, "zp_env_rank %d of %d, iteration %d (seed %llu): %s\n", rank, n, it, (unsigned long long)seed,
              err.c_str());
      failures++;
    }
  }
  r = zpCommDestroy(comm);
  if (r != zpSuccess) {
    fprintf(stderr, "zp_env_rank %d: zpCommDestroy: %s\n", rank, zpGetLastError(nullptr));
    failures++;
  }
  if (failures) return 1;
  printf("zp_env_rank %d of %d: ok\n", rank, n);
  return 0;
}
