/* The public header from C: compiled as C99 with -pedantic -Wall -Werror and
 * linked against the shared library, as a C user would. Runs a single-rank
 * communicator: version, config initializer, init, alltoallv and a grouped
 * send/receive to itself, an error, the attention driver on host buffers
 * (the reference kernels, bfloat16 inputs), destroy. Exits 0 when all is
 * well. */
#include "zeppelin.h"

#include <stdio.h>
#include <string.h>

static int failures = 0;

#define CHECK(cond)                                                 \
  do {                                                              \
    if (!(cond)) {                                                  \
      fprintf(stderr, "c_api_check: %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                   \
    }                                                               \
  } while (0)

#define CHECK_OK(call)                                              \
  do {                                                              \
    zpResult_t res_ = (call);                                       \
    if (res_ != zpSuccess) {                                        \
      fprintf(stderr, "c_api_check: %s:%d: %s: %s: %s\n", __FILE__, __LINE__, #call, \
              zpGetErrorString(res_), zpGetLastError(NULL));        \
      failures++;                                                   \
    }                                                               \
  } while (0)

static int neverInterrupted(void* arg) {
  (void)arg;
  return 0;
}

int main(void) {
  zpConfig_t cfg = ZP_CONFIG_INITIALIZER;
  zpUniqueId id;
  zpComm_t comm = NULL;
  zpResult_t async = zpInternalError;
  int version = 0, count = 0, rank = -1, i;
  double send[5] = {1.5, -2.25, 3.0, 1e300, -0.0};
  double recv[7];
  double self[5];
  size_t sendcounts[1] = {5}, sdispls[1] = {0}, recvcounts[1] = {5}, rdispls[1] = {1};
  unsigned char poison[sizeof(double)];
  /* Attention: one local sequence of 3 tokens, 1 head of dim 2; bfloat16
   * inputs of 1.0 (0x3F80), so out is 1.0 and lse log(3) (every score 0). */
  int64_t attnLen[1] = {3};
  size_t attnOffs[2] = {0, 1};
  int attnRanks[1] = {0};
  unsigned short ones[6] = {0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80, 0x3F80}, zeros[6] = {0, 0, 0, 0, 0, 0};
  unsigned short attnOut[6];
  float attnLse[3];
  zpBatchPlan_t plan = NULL;
  zpAttention_t attn = NULL;
  zpAttnConfig_t attnCfg;

  CHECK(sizeof(zpUniqueId) == ZP_UNIQUE_ID_BYTES);
  CHECK(cfg.size == sizeof(zpConfig_t) && cfg.magic == ZP_CONFIG_MAGIC && cfg.version == ZP_VERSION_CODE);
  CHECK(cfg.timeoutMs == ZP_CONFIG_UNDEF_INT && cfg.nodeId == NULL && cfg.netDevices == NULL);
  CHECK_OK(zpGetVersion(&version));
  CHECK(version == ZP_VERSION_CODE);
  CHECK(zpTypeSize(zpBfloat16) == 2 && zpTypeSize(zpFloat64) == 8);
  for (i = 0; i < zpNumResults; i++) CHECK(zpGetErrorString((zpResult_t)i) != NULL);

  cfg.timeoutMs = 60000;
  CHECK_OK(zpGetUniqueId(&id));
  CHECK_OK(zpCommInitRankConfig(&comm, 1, id, 0, &cfg));
  if (!comm) {
    fprintf(stderr, "c_api_check: no communicator\n");
    return 1;
  }
  CHECK_OK(zpCommCount(comm, &count));
  CHECK_OK(zpCommUserRank(comm, &rank));
  CHECK(count == 1 && rank == 0);

  memset(recv, 0xA5, sizeof(recv));
  memset(poison, 0xA5, sizeof(poison));
  CHECK_OK(zpAlltoallv(send, sendcounts, sdispls, recv, recvcounts, rdispls, zpFloat64, comm, NULL));
  CHECK(memcmp(recv + 1, send, sizeof(send)) == 0);
  CHECK(memcmp(&recv[0], poison, sizeof(double)) == 0 && memcmp(&recv[6], poison, sizeof(double)) == 0);

  memset(self, 0, sizeof(self));
  CHECK_OK(zpGroupStart());
  CHECK_OK(zpSend(send, 5, zpFloat64, 0, comm, NULL));
  CHECK_OK(zpRecv(self, 5, zpFloat64, 0, comm, NULL));
  CHECK_OK(zpGroupEnd());
  CHECK(memcmp(self, send, sizeof(send)) == 0);

  memset(self, 0, sizeof(self));
  CHECK_OK(zpAllReduce(send, self, 3, zpFloat64, zpMax, comm, NULL)); /* one rank: a copy */
  CHECK(memcmp(self, send, 3 * sizeof(double)) == 0 && self[3] == 0);

  memset(&attnCfg, 0, sizeof(attnCfg));
  attnCfg.qHeads = attnCfg.kvHeads = 1;
  attnCfg.headDim = 2;
  attnCfg.forward = zpAttnRefForward;
  attnCfg.datatype = zpBfloat16;
  CHECK_OK(zpPlanCreate(&plan, 1, attnLen, 0, 1, 0, attnOffs, attnRanks));
  CHECK_OK(zpAttentionCreate(&attn, plan, &attnCfg, comm));
  CHECK_OK(zpAttentionForward(attn, zeros, zeros, ones, attnOut, attnLse, NULL));
  for (i = 0; i < 6; i++) CHECK(attnOut[i] == 0x3F80);
  for (i = 0; i < 3; i++) CHECK(attnLse[i] > 1.0986f && attnLse[i] < 1.0987f);
  CHECK_OK(zpAttentionDestroy(attn));
  CHECK_OK(zpPlanDestroy(plan));

  CHECK(zpSend(send, 5, (zpDataType_t)42, 0, comm, NULL) == zpInvalidArgument);
  CHECK(strlen(zpGetLastError(comm)) > 0);
  CHECK_OK(zpCommGetAsyncError(comm, &async));
  CHECK(async == zpSuccess);
  CHECK_OK(zpSetInterruptCheck(neverInterrupted, NULL));
  CHECK_OK(zpSetInterruptCheck(NULL, NULL));
  CHECK_OK(zpCommDestroy(comm));
  CHECK(zpCommDestroy(comm) == zpInvalidArgument);

  if (failures) {
    fprintf(stderr, "c_api_check: %d check(s) failed\n", failures);
    return 1;
  }
  printf("c_api_check: ok\n");
  return 0;
}
