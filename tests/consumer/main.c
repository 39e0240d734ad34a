/* Uses an installed Zeppelin: one rank, an alltoallv to itself. */
#include <stdio.h>
#include <string.h>
#include <zeppelin.h>

int main(void) {
  zpUniqueId id;
  zpComm_t comm;
  int version = 0;
  size_t one = 4, zero = 0;
  float in[4] = {1, 2, 3, 4}, out[4];
  zpGetVersion(&version);
  if (zpGetUniqueId(&id) != zpSuccess || zpCommInitRank(&comm, 1, id, 0) != zpSuccess) {
    fprintf(stderr, "init failed: %s\n", zpGetLastError(NULL));
    return 1;
  }
  memset(out, 0, sizeof(out));
  if (zpAlltoallv(in, &one, &zero, out, &one, &zero, zpFloat32, comm, NULL) != zpSuccess) {
    fprintf(stderr, "alltoallv failed: %s\n", zpGetLastError(comm));
    return 1;
  }
  zpCommDestroy(comm);
  if (memcmp(in, out, sizeof(in)) != 0) return 1;
  printf("zeppelin %d ok\n", version);
  return 0;
}
