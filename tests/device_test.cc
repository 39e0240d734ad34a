// The device path: data calls on CUDA streams with device buffers, NCCL as the
// data plane. Built twice from this file: against the real CUDA runtime and
// NCCL (device_tests: without a GPU every test skips, saying why) and against
// the test double of tests/fakecuda (device_tests_double), which enforces
// what a GPU would: device memory the host cannot touch, completion later
// than the call on the stream's own thread, rendezvous sends, and separate
// processes whose bytes move by the double's own mechanism. Every byte is
// checked after a stream synchronisation, against buffers poisoned before.
#include <cuda_runtime_api.h>
#include <nccl.h>
#include <signal.h>

#include <atomic>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <mutex>
#include <vector>

#include "collectives/ext/ext.h"
#include "src/core/comm.h"  // zp::hostPeerWaits
#include "tests/attention_check.h"
#include "tests/device_checks.h"
#include "tests/harness.h"

namespace {

using zptest::AlltoallvRun;
using zptest::DeviceMirror;
using zptest::deviceAlltoallvError;
using zptest::GuardedBuffer;

// Skips the test (in the parent, before any rank starts) when there is no
// CUDA device: with the real runtime on a machine without a GPU. The parent
// asks a child (zptest::cudaDeviceMissing), never CUDA itself, which would
// leave the ranks it forks without CUDA. The double always has devices: there
// a missing one is a failure, not a skip.
#ifdef ZP_TEST_DOUBLE
#define SKIP_WITHOUT_DEVICE()                                                   \
  do {                                                                          \
    const std::string missing_ = zptest::cudaDeviceMissing();                   \
    ASSERT_TRUE(missing_.empty()) << "the double has no device: " << missing_;  \
  } while (0)
#else
#define SKIP_WITHOUT_DEVICE()                                                   \
  do {                                                                          \
    const std::string missing_ = zptest::cudaDeviceMissing();                   \
    if (!missing_.empty()) GTEST_SKIP() << "needs a CUDA device: " << missing_; \
  } while (0)
#endif

#define CUDA_OK(call)                                                                     \
  do {                                                                                    \
    cudaError_t e_ = (call);                                                              \
    ASSERT_EQ(e_, cudaSuccess) << #call << ": " << cudaGetErrorString(e_);                \
  } while (0)

// As a trainer does: the rank's GPU (its local rank: one node here) is made
// current before the communicator, so that its buffers and the
// communicator's device (ZP_CUDA_DEVICE=local, the default) agree. The tests
// run with checks on (zpCheckFull) unless they are about the unchecked path.
zpComm_t initDeviceComm(int rank, int nranks, const zpUniqueId& id, zpCheckMode_t checks = zpCheckFull) {
  int count = 1;
  cudaGetDeviceCount(&count);
  cudaSetDevice(rank % count);
  // NCCL refuses two ranks of one communicator on one GPU ("Duplicate GPU
  // detected") unless they look like different hosts: with fewer GPUs than
  // ranks, each rank gets a host id of its own (so the tests ran on one H200).
  if (count < nranks) setenv("NCCL_HOSTID", ("zptest-rank-" + std::to_string(rank)).c_str(), 1);
  zpConfig_t config = ZP_CONFIG_INITIALIZER;
  config.checkMode = checks;
  zpComm_t comm = nullptr;
  zpResult_t r = zpCommInitRankConfig(&comm, nranks, id, rank, &config);
  if (r != zpSuccess) {
    ADD_FAILURE() << "rank " << rank << ": zpCommInitRankConfig: " << zpGetErrorString(r) << ": "
                  << zpGetLastError(nullptr);
    fflush(stdout);
    _exit(1);
  }
  return comm;
}

zpDataType_t randomType(std::mt19937_64& rng) {
  const zpDataType_t types[] = {zpUint8, zpFloat16, zpFloat32, zpInt64, zpBfloat16, zpFloat64};
  return types[rng() % 6];
}

// The data calls at a number of ranks, with the peers' arguments checked
// first (zpCheckFull) and without (zpCheckLocal, the default): both must
// move every byte right.
struct RanksAndChecks {
  int ranks;
  zpCheckMode_t checks;
};
void PrintTo(const RanksAndChecks& p, std::ostream* os) {
  *os << p.ranks << " ranks, " << (p.checks == zpCheckFull ? "full" : "local") << " checks";
}
class DeviceRanks : public ::testing::TestWithParam<RanksAndChecks> {};

TEST_P(DeviceRanks, AlltoallvRandomCountsEveryByte) {
  SKIP_WITHOUT_DEVICE();
  const int n = GetParam().ranks;
  const zpCheckMode_t checks = GetParam().checks;
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id, checks);
    std::mt19937_64 rng(seed);
    for (int round = 0; round < 4; round++) {
      zpDataType_t dt = randomType(rng);
      auto counts = zptest::randomCounts(nranks, rng(), 3000, 0.25);
      EXPECT_EQ(deviceAlltoallvError(comm, rank, counts, dt, rng()), "") << "round " << round;
    }
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

TEST_P(DeviceRanks, SendRecvRingInAGroup) {
  SKIP_WITHOUT_DEVICE();
  const int n = GetParam().ranks;
  const zpCheckMode_t checks = GetParam().checks;
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id, checks);
    const int next = (rank + 1) % nranks, prev = (rank - 1 + nranks) % nranks;
    auto bytesFrom = [&](int src) { return (size_t)1 + (seed + src * 7919) % 100000; };
    GuardedBuffer sendHost(bytesFrom(rank)), recvHost(bytesFrom(prev));
    sendHost.fill(seed, rank, next);
    DeviceMirror send(sendHost), recv(recvHost);
    ASSERT_TRUE(send.ok() && recv.ok());
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ZP_ASSERT_OK(zpGroupStart());
    ZP_EXPECT_OK(zpSend(send.data(), sendHost.size(), zpUint8, next, comm, stream));
    ZP_EXPECT_OK(zpRecv(recv.data(), recvHost.size(), zpUint8, prev, comm, stream));
    ZP_ASSERT_OK(zpGroupEnd());
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(recv.copyBack());
    EXPECT_EQ(recvHost.wrongBytes(seed, prev, rank), 0u);
    EXPECT_EQ(recvHost.guardBytesWritten(), 0u);
    CUDA_OK(cudaStreamDestroy(stream));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// The plan of a random batch for comm's ranks (rng draws the same on every
// rank): up to 20 sequences, a quarter of them up to longest tokens, the
// others up to 300; causal or not. *tokens gets the batch's size if given.
zpBatchPlan_t randomPlan(zpComm_t comm, std::mt19937_64& rng, int64_t longest, int64_t* tokens) {
  std::vector<int64_t> lens(1 + rng() % 20);
  for (auto& l : lens) l = 1 + (rng() % 4 == 0 ? rng() % longest : rng() % 300);
  zpAttnShape_t shape = {8, 8, 64, 2, (int)(rng() % 2)};
  zpBatchPlan_t plan = nullptr;
  if (zpPlanBatch(&plan, (int)lens.size(), lens.data(), &shape, nullptr, comm) != zpSuccess) {
    ADD_FAILURE() << "zpPlanBatch: " << zpGetLastError(comm);
    return nullptr;
  }
  if (tokens) {
    *tokens = 0;
    for (int64_t l : lens) *tokens += l;
  }
  return plan;
}

// A rank's buffer under a layout: its segments' tokens in order, each token
// tb bytes that depend on (seed, sequence, token, byte).
std::vector<uint8_t> layoutBuffer(zpLayout_t layout, int rank, size_t tb, uint64_t seed) {
  const zpSegment_t* segs = nullptr;
  size_t count = 0;
  EXPECT_EQ(zpLayoutRankSegments(layout, rank, &segs, &count), zpSuccess);
  std::vector<uint8_t> v;
  for (size_t i = 0; i < count; i++)
    for (int64_t t = segs[i].start; t < segs[i].start + segs[i].count; t++)
      for (size_t b = 0; b < tb; b++) {
        uint64_t h = seed ^ (uint64_t)segs[i].seq * 0x9E3779B97F4A7C15ull ^ (uint64_t)t * 0xC2B2AE3D27D4EB4Full ^ b;
        h *= 0xBF58476D1CE4E5B9ull;
        v.push_back((uint8_t)(h >> 56));
      }
  return v;
}

// Linear layout to attention layout and back, on device buffers: every byte
// where the destination layout puts it, nothing written past the buffers.
TEST_P(DeviceRanks, RemapRoundTripsEveryByte) {
  SKIP_WITHOUT_DEVICE();
  const int n = GetParam().ranks;
  const zpCheckMode_t checks = GetParam().checks;
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id, checks);
    std::mt19937_64 rng(seed);
    zpBatchPlan_t plan = randomPlan(comm, rng, 5000, nullptr);
    ASSERT_NE(plan, nullptr);
    zpLayout_t linear = nullptr, attention = nullptr;
    ZP_ASSERT_OK(zpPlanGetLayout(plan, zpLinearLayout, &linear));
    ZP_ASSERT_OK(zpPlanGetLayout(plan, zpAttentionLayout, &attention));
    zpRemap_t remap = nullptr;
    ZP_ASSERT_OK(zpRemapCreate(&remap, linear, attention, comm));
    const size_t ept = 1 + rng() % 7, tb = ept * 2;
    std::vector<uint8_t> in = layoutBuffer(linear, rank, tb, seed), want = layoutBuffer(attention, rank, tb, seed);
    GuardedBuffer inHost(in.size()), outHost(want.size()), backHost(in.size());
    memcpy(inHost.data(), in.data(), in.size());
    DeviceMirror dIn(inHost), dOut(outHost), dBack(backHost);
    ASSERT_TRUE(dIn.ok() && dOut.ok() && dBack.ok());
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ZP_ASSERT_OK(zpRemapExecute(remap, dIn.data(), dOut.data(), ept, zpBfloat16, 0, comm, stream));
    ZP_ASSERT_OK(zpRemapExecute(remap, dOut.data(), dBack.data(), ept, zpBfloat16, 1, comm, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(dOut.copyBack());
    CUDA_OK(dBack.copyBack());
    size_t wrongOut = 0, wrongBack = 0;
    for (size_t i = 0; i < want.size(); i++) wrongOut += outHost.data()[i] != want[i];
    for (size_t i = 0; i < in.size(); i++) wrongBack += backHost.data()[i] != in[i];
    EXPECT_EQ(wrongOut, 0u) << "forward, of " << want.size();
    EXPECT_EQ(wrongBack, 0u) << "inverse, of " << in.size();
    EXPECT_EQ(outHost.guardBytesWritten() + backHost.guardBytesWritten(), 0u);
    CUDA_OK(cudaStreamDestroy(stream));
    zpRemapDestroy(remap);
    zpPlanDestroy(plan);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// The Ulysses exchange on device buffers gives the host path's result, byte
// for byte (the whole poisoned buffer compared), both ways and with GQA
// (going back, the parts of a head held by several ranks are summed by a
// kernel, in the same order as on the host: the sums are equal).
TEST_P(DeviceRanks, UlyssesMatchesTheHostPath) {
  SKIP_WITHOUT_DEVICE();
  const int n = GetParam().ranks;
  const zpCheckMode_t checks = GetParam().checks;
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id, checks);
    std::mt19937_64 rng(seed);
    int64_t total = 0, mine = 0;
    zpBatchPlan_t plan = randomPlan(comm, rng, 300, &total);
    ASSERT_NE(plan, nullptr);
    zpLayout_t layout = nullptr;
    ZP_ASSERT_OK(zpPlanGetLayout(plan, zpLinearLayout, &layout));
    ZP_ASSERT_OK(zpLayoutRankTokens(layout, rank, &mine));
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const int shapes[][2] = {{8, 8}, {8, 2}, {6, 3}, {4, 1}};
    for (const auto& qh : shapes)
      for (int direction : {0, 1}) {
        const int qHeads = qh[0], heads = qh[1], headDim = 1 + rng() % 16;
        const size_t inElems = (size_t)(direction == 0 ? mine : total) * heads * headDim;
        const size_t outElems = (size_t)(direction == 0 ? total : mine) * heads * headDim;
        GuardedBuffer in(inElems * 4), hostOut(outElems * 4), devOut(outElems * 4);
        std::vector<float> values(inElems);
        std::mt19937_64 mineRng(rng() + rank);  // this rank's data; rng stays the same on every rank
        for (float& v : values) v = (float)(mineRng() % 2001) / 8 - 125;
        memcpy(in.data(), values.data(), in.size());
        zpResult_t hr = zpUlyssesAlltoall(in.data(), hostOut.data(), layout, qHeads, heads, headDim, zpFloat32,
                                          direction, comm, nullptr);
        ASSERT_EQ(hr, zpSuccess) << zpGetLastError(comm);
        DeviceMirror dIn(in), dOut(devOut);
        ASSERT_TRUE(dIn.ok() && dOut.ok());
        zpResult_t dr = zpUlyssesAlltoall(dIn.data(), dOut.data(), layout, qHeads, heads, headDim, zpFloat32,
                                          direction, comm, stream);
        CUDA_OK(cudaStreamSynchronize(stream));
        ASSERT_EQ(dr, zpSuccess) << zpGetLastError(comm);
        CUDA_OK(dOut.copyBack());
        EXPECT_EQ(memcmp(hostOut.storage().data(), devOut.storage().data(), devOut.storage().size()), 0)
            << qHeads << "/" << heads << " heads, direction " << direction;
      }
    CUDA_OK(cudaStreamDestroy(stream));
    zpPlanDestroy(plan);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// A block goes all the way round the ring on device buffers, its size
// different for every origin, every exchange enqueued on the stream without
// a host synchronisation in between; every block checked at the end.
TEST_P(DeviceRanks, RingPassesEveryBlockRound) {
  SKIP_WITHOUT_DEVICE();
  const int n = GetParam().ranks;
  const zpCheckMode_t checks = GetParam().checks;
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id, checks);
    std::vector<int> order(nranks);
    for (int i = 0; i < nranks; i++) order[i] = i;
    zpRing_t ring = nullptr;
    ZP_ASSERT_OK(zpRingCreate(&ring, comm, nranks, order.data(), 0));
    auto bytesOf = [&](int origin) { return (size_t)1 + (seed + origin * 977) % 70000; };
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // blocks[k]: the block that started k ranks back.
    std::vector<void*> blocks(nranks);
    for (int k = 0; k < nranks; k++) CUDA_OK(cudaMalloc(&blocks[k], bytesOf((rank - k + nranks) % nranks)));
    std::vector<uint8_t> own(bytesOf(rank));
    zptest::fillPattern(own.data(), own.size(), seed, rank, 0);
    CUDA_OK(cudaMemcpyAsync(blocks[0], own.data(), own.size(), cudaMemcpyHostToDevice, stream));
    for (int k = 0; k + 1 < nranks; k++) {
      ZP_ASSERT_OK(zpRingExchangeStart(ring, blocks[k], bytesOf((rank - k + nranks) % nranks), blocks[k + 1],
                                       bytesOf((rank - k - 1 + nranks) % nranks), stream));
      ZP_ASSERT_OK(zpRingExchangeWait(ring));
    }
    CUDA_OK(cudaStreamSynchronize(stream));
    for (int k = 0; k < nranks; k++) {
      const int origin = (rank - k + nranks) % nranks;
      std::vector<uint8_t> got(bytesOf(origin));
      CUDA_OK(cudaMemcpy(got.data(), blocks[k], got.size(), cudaMemcpyDeviceToHost));
      EXPECT_EQ(zptest::wrongPatternBytes(got.data(), got.size(), seed, origin, 0), 0u) << "the block of rank " << origin;
      CUDA_OK(cudaFree(blocks[k]));
    }
    CUDA_OK(cudaStreamDestroy(stream));
    ZP_EXPECT_OK(zpRingDestroy(ring));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// The standard collectives on device buffers (NCCL's own) give what the host
// path gives, element for element: inputs are small integers, exact in every
// order of addition. The exception is zpAvg of a floating type: NCCL
// multiplies each input by 1/n in the type and then sums (16-bit types
// rounded at every hop), the host path sums and divides once. There the
// device's element may differ from the host's by at most
// 2 (n + 1) u max|x| (u: the type's unit roundoff, 2^-24, 2^-53, 2^-11 or
// 2^-8; max|x| = 4 here): n products and n - 1 sums rounded on the device,
// one division on the host, each off by at most u times a value of at most
// max|x|, with a factor of 2 to spare. Every other byte (the guards, a
// non-root's untouched output) must be equal.
TEST_P(DeviceRanks, CollectivesMatchTheHostPath) {
  SKIP_WITHOUT_DEVICE();
  const int n = GetParam().ranks;
  const zpCheckMode_t checks = GetParam().checks;
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id, checks);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const zpDataType_t types[] = {zpInt32, zpFloat32, zpBfloat16, zpFloat64, zpUint8};
    const zpRedOp_t ops[] = {zpSum, zpMax, zpMin, zpAvg, zpProd};
    int k = 0;
    for (zpDataType_t t : types)
      for (zpRedOp_t op : ops) {
        const size_t count = 1 + (seed + k++) % 999, ts = zpTypeSize(t);
        const int root = k % nranks;
        // Inputs: small integers as the type holds them (bfloat16: the top half of a float).
        auto fill = [&](GuardedBuffer& b, size_t elems) {
          std::mt19937_64 r(seed + k * 131 + rank);
          for (size_t i = 0; i < elems; i++) {
            const int v = op == zpProd ? 1 + (int)(r() % 2) : (int)(r() % 5);
            float f = (float)v;
            uint32_t bits;
            memcpy(&bits, &f, 4);
            switch (t) {
              case zpInt32: ((int32_t*)b.data())[i] = v; break;
              case zpFloat32: ((float*)b.data())[i] = f; break;
              case zpBfloat16: ((uint16_t*)b.data())[i] = (uint16_t)(bits >> 16); break;
              case zpFloat64: ((double*)b.data())[i] = v; break;
              default: b.data()[i] = (uint8_t)v;
            }
          }
        };
        // The v calls: rank p's block has count + p elements (p % 3 == 2: none), packed in rank order.
        std::vector<size_t> counts(nranks), displs(nranks);
        size_t total = 0;
        for (int p = 0; p < nranks; p++) {
          counts[p] = p % 3 == 2 ? 0 : count + (size_t)p;
          displs[p] = total;
          total += counts[p];
        }
        struct Case {
          const char* name;
          size_t inElems, outElems;
          std::function<zpResult_t(const void*, void*, zpStream_t)> call;
        } cases[] = {
            {"allreduce", count, count,
             [&](const void* s, void* r, zpStream_t st) { return zpAllReduce(s, r, count, t, op, comm, st); }},
            {"reducescatter", count * nranks, count,
             [&](const void* s, void* r, zpStream_t st) { return zpReduceScatter(s, r, count, t, op, comm, st); }},
            {"allgather", count, count * nranks,
             [&](const void* s, void* r, zpStream_t st) { return zpAllGather(s, r, count, t, comm, st); }},
            {"broadcast", count, count,
             [&](const void* s, void* r, zpStream_t st) { return zpBroadcast(s, r, count, t, root, comm, st); }},
            {"reduce", count, count,
             [&](const void* s, void* r, zpStream_t st) { return zpReduce(s, r, count, t, op, root, comm, st); }},
            {"allgatherv", counts[rank], total,
             [&](const void* s, void* r, zpStream_t st) {
               return zpAllGatherv(s, counts[rank], r, counts.data(), displs.data(), t, comm, st);
             }},
            {"reducescatterv", total, counts[rank],
             [&](const void* s, void* r, zpStream_t st) {
               return zpReduceScatterv(s, r, counts.data(), t, op, comm, st);
             }},
        };
        for (Case& c : cases) {
          GuardedBuffer in(c.inElems * ts), hostOut(c.outElems * ts), devOut(c.outElems * ts);
          fill(in, c.inElems);
          ASSERT_EQ(c.call(in.data(), hostOut.data(), nullptr), zpSuccess) << c.name << ": " << zpGetLastError(comm);
          DeviceMirror dIn(in), dOut(devOut);
          ASSERT_TRUE(dIn.ok() && dOut.ok());
          ASSERT_EQ(c.call(dIn.data(), dOut.data(), stream), zpSuccess) << c.name << ": " << zpGetLastError(comm);
          CUDA_OK(cudaStreamSynchronize(stream));
          CUDA_OK(dOut.copyBack());
          const bool floating = t == zpFloat32 || t == zpFloat64 || t == zpBfloat16 || t == zpFloat16;
          if (op != zpAvg || !floating) {
            EXPECT_EQ(memcmp(hostOut.storage().data(), devOut.storage().data(), devOut.storage().size()), 0)
                << c.name << " type " << t << " op " << op << " count " << count;
            continue;
          }
          const double u = t == zpFloat32 ? 0x1p-24 : t == zpFloat64 ? 0x1p-53 : t == zpFloat16 ? 0x1p-11 : 0x1p-8;
          const double bound = 2 * (nranks + 1) * u * 4;
          size_t outside = 0, bytesDiffer = 0;
          for (size_t i = 0; i < c.outElems; i++) {
            const double h = zptest::widen(hostOut.data(), i, t), d = zptest::widen(devOut.data(), i, t);
            outside += !(std::fabs(h - d) <= bound);
          }
          const size_t off = hostOut.offset(), used = c.outElems * ts;  // the guards and what lies around the output
          for (size_t b = 0; b < devOut.storage().size(); b++)
            if (b < off || b >= off + used) bytesDiffer += hostOut.storage()[b] != devOut.storage()[b];
          EXPECT_EQ(outside, 0u) << c.name << " avg type " << t << " count " << count << ": beyond " << bound;
          EXPECT_EQ(bytesDiffer, 0u) << c.name << " avg type " << t << ": bytes outside the output differ";
        }
      }
    CUDA_OK(cudaStreamDestroy(stream));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

std::string ranksName(const ::testing::TestParamInfo<RanksAndChecks>& p) { return std::to_string(p.param.ranks); }
INSTANTIATE_TEST_SUITE_P(Ranks, DeviceRanks,
                         ::testing::Values(RanksAndChecks{1, zpCheckFull}, RanksAndChecks{2, zpCheckFull},
                                           RanksAndChecks{3, zpCheckFull},
                                           RanksAndChecks{4, zpCheckFull}, RanksAndChecks{8, zpCheckFull}),
                         ranksName);
INSTANTIATE_TEST_SUITE_P(LocalChecks, DeviceRanks,
                         ::testing::Values(RanksAndChecks{2, zpCheckLocal}, RanksAndChecks{3, zpCheckLocal},
                                           RanksAndChecks{4, zpCheckLocal}, RanksAndChecks{8, zpCheckLocal}),
                         ranksName);

// Checks off (zpCheckLocal, the default): every kind of device call only
// enqueues. Each is issued behind a host function that holds the stream,
// and must return without waiting on a peer over the host transports
// (zp::hostPeerWaits) or on the device (the held stream; on the double also
// fakecudaHostWaits). Correct bytes in this mode are DeviceRanks'
// (LocalChecks/...). zpBarrier is left out: it is a host barrier by
// definition. Then the stream is let go and every call must have succeeded.
class DeviceEnqueueOnly : public ::testing::TestWithParam<int> {};

TEST_P(DeviceEnqueueOnly, NoCallWaitsOnPeersOrTheDevice) {
  SKIP_WITHOUT_DEVICE();
  const int n = GetParam();
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id, zpCheckLocal);
    std::mt19937_64 rng(seed);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // What the calls need, made before the stream is held (creating a
    // remap, ring or driver talks to the peers; that is not a call's cost).
    int64_t total = 0, mine = 0, attnTokens = 0;
    zpBatchPlan_t plan = randomPlan(comm, rng, 2000, &total);
    ASSERT_NE(plan, nullptr);
    zpLayout_t linear = nullptr, attention = nullptr;
    ZP_ASSERT_OK(zpPlanGetLayout(plan, zpLinearLayout, &linear));
    ZP_ASSERT_OK(zpPlanGetLayout(plan, zpAttentionLayout, &attention));
    ZP_ASSERT_OK(zpLayoutRankTokens(linear, rank, &mine));
    zpRemap_t remap = nullptr;
    ZP_ASSERT_OK(zpRemapCreate(&remap, linear, attention, comm));
    std::vector<int> order(nranks);
    for (int i = 0; i < nranks; i++) order[i] = i;
    zpRing_t ring = nullptr;
    ZP_ASSERT_OK(zpRingCreate(&ring, comm, nranks, order.data(), 0));
    zpBatchPlan_t attnPlan = zptest::deviceAttentionPlan(nranks, 1, 0, rng);
    ASSERT_NE(attnPlan, nullptr);
    zpLayout_t attnLayout = nullptr;
    ZP_ASSERT_OK(zpPlanGetLayout(attnPlan, zpAttentionLayout, &attnLayout));
    ZP_ASSERT_OK(zpLayoutRankTokens(attnLayout, rank, &attnTokens));
    const int H = 4, Hk = 2, D = 16;
    zpAttnConfig_t cfg = {H, Hk, D, 0.0f, zpAttnRefForward, zpAttnRefBackward, nullptr, 0, zpFloat32};
    zpAttention_t attn = nullptr;
    ZP_ASSERT_OK(zpAttentionCreate(&attn, attnPlan, &cfg, comm));

    const size_t count = 1 + seed % 1000, heads = 4, headDim = 8;
    const size_t elems = std::max({count * nranks, (size_t)total * heads * headDim, (size_t)attnTokens * H * D,
                                   (size_t)mine * 8});
    std::vector<void*> bufs(11);
    for (void*& b : bufs) {
      CUDA_OK(cudaMalloc(&b, elems * 8));
      CUDA_OK(cudaMemset(b, 0, elems * 8));  // defined numbers: the reference kernels read them
    }
    std::vector<size_t> counts(nranks, count), displs(nranks);
    for (int p = 0; p < nranks; p++) displs[p] = p * count;
    const int next = (rank + 1) % nranks, prev = (rank - 1 + nranks) % nranks;
    char *a = (char*)bufs[0], *b = (char*)bufs[1];
    struct Call {
      const char* name;
      std::function<zpResult_t()> run;
    } calls[] = {
        {"zpAllReduce", [&] { return zpAllReduce(a, b, count, zpFloat32, zpSum, comm, stream); }},
        {"zpBroadcast", [&] { return zpBroadcast(a, b, count, zpFloat32, nranks - 1, comm, stream); }},
        {"zpReduce", [&] { return zpReduce(a, b, count, zpBfloat16, zpMax, 0, comm, stream); }},
        {"zpAllGather", [&] { return zpAllGather(a, b, count, zpInt32, comm, stream); }},
        {"zpReduceScatter", [&] { return zpReduceScatter(a, b, count, zpFloat32, zpSum, comm, stream); }},
        {"zpAllGatherv",
         [&] { return zpAllGatherv(a, count, b, counts.data(), displs.data(), zpFloat32, comm, stream); }},
        {"zpReduceScatterv", [&] { return zpReduceScatterv(a, b, counts.data(), zpFloat32, zpSum, comm, stream); }},
        {"zpAlltoallv",
         [&] { return zpAlltoallv(a, counts.data(), displs.data(), b, counts.data(), displs.data(), zpFloat32, comm, stream); }},
        {"zpSend/zpRecv",
         [&] {
           ZPX_CHECK(zpGroupStart());
           zpResult_t r = zpSend(a, count, zpFloat32, next, comm, stream);
           if (r == zpSuccess) r = zpRecv(b, count, zpFloat32, prev, comm, stream);
           zpResult_t end = zpGroupEnd();
           return r != zpSuccess ? r : end;
         }},
        {"zpRemapExecute", [&] { return zpRemapExecute(remap, a, b, 8, zpUint8, 0, comm, stream); }},
        {"zpUlyssesAlltoall",
         [&] { return zpUlyssesAlltoall(a, b, linear, (int)heads, (int)heads, (int)headDim, zpFloat32, 0, comm, stream); }},
        {"zpRingExchangeStart",
         [&] {
           ZPX_CHECK(zpRingExchangeStart(ring, a, count * 4, b, count * 4, stream));
           return zpRingExchangeWait(ring);
         }},
        {"zpAttentionForward",
         [&] { return zpAttentionForward(attn, bufs[2], bufs[3], bufs[4], bufs[5], (float*)bufs[6], stream); }},
        {"zpAttentionBackward",
         [&] {
           return zpAttentionBackward(attn, bufs[2], bufs[3], bufs[4], bufs[5], (const float*)bufs[6], bufs[7], bufs[8],
                                      bufs[9], bufs[10], stream);
         }},
    };
    zptest::StreamGate gate;
    CUDA_OK(cudaLaunchHostFunc(stream, zptest::StreamGate::hold, &gate));
    for (Call& c : calls) {
      const uint64_t peerWaits = zp::hostPeerWaits();
#ifdef ZP_TEST_DOUBLE
      const unsigned long long deviceWaits = fakecudaHostWaits();
#endif
      EXPECT_EQ(c.run(), zpSuccess) << c.name << ": " << zpGetLastError(comm);
      EXPECT_EQ(zp::hostPeerWaits() - peerWaits, 0u) << c.name << " waited on its peers";
#ifdef ZP_TEST_DOUBLE
      EXPECT_EQ(fakecudaHostWaits() - deviceWaits, 0u) << c.name << " waited for the device";
#endif
    }
    gate.open = true;
    CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_FALSE(gate.timedOut.load()) << "a call waited for the held stream";
    zpResult_t async = zpSuccess;
    ZP_EXPECT_OK(zpCommGetAsyncError(comm, &async));
    EXPECT_EQ(async, zpSuccess);
    for (void* p : bufs) CUDA_OK(cudaFree(p));
    zpAttentionDestroy(attn);
    ZP_EXPECT_OK(zpRingDestroy(ring));
    zpRemapDestroy(remap);
    zpPlanDestroy(attnPlan);
    zpPlanDestroy(plan);
    CUDA_OK(cudaStreamDestroy(stream));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceEnqueueOnly, ::testing::Values(2, 3, 4),
                         [](const ::testing::TestParamInfo<int>& p) { return std::to_string(p.param); });

// zpBarrier with a stream is a host barrier in either check mode: it
// returns only once every rank has called it. (Were the stream passed on,
// local mode would skip the header exchange, which is the barrier.)
TEST(Device, BarrierWithAStreamWaitsForEveryRankInEitherCheckMode) {
  SKIP_WITHOUT_DEVICE();
  for (zpCheckMode_t mode : {zpCheckLocal, zpCheckFull}) {
    zptest::expectAllOk(zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
      zpComm_t comm = initDeviceComm(rank, nranks, id, mode);
      cudaStream_t stream;
      CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      if (rank == 1) usleep(400 * 1000);
      auto start = std::chrono::steady_clock::now();
      ZP_EXPECT_OK(zpBarrier(comm, (zpStream_t)stream));
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      if (rank == 0) EXPECT_GE(ms, 300) << "check mode " << mode << ": the barrier returned before rank 1 called it";
      CUDA_OK(cudaStreamDestroy(stream));
      ZP_EXPECT_OK(zpCommDestroy(comm));
    }));
  }
}

TEST(Device, AlltoallvOf64MiBPerRank) {
  SKIP_WITHOUT_DEVICE();
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id);
    // 32 MiB to each rank (this one included): 64 MiB sent and received.
    auto counts = zptest::uniformCounts(nranks, (32u << 20) / 4 + 3);
    EXPECT_EQ(deviceAlltoallvError(comm, rank, counts, zpFloat32, seed), "");
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// The ordering the user sees: a kernel-like write before the call (an async
// copy on the same stream) is what gets sent, and a read after the call on
// the same stream sees what was received, without any host synchronisation
// in between.
TEST(Device, CallsAreOrderedOnTheUsersStream) {
  SKIP_WITHOUT_DEVICE();
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id);
    const int peer = 1 - rank;
    const size_t bytes = 1 << 20;
    std::vector<uint8_t> mine(bytes), got(bytes, 0);
    zptest::fillPattern(mine.data(), bytes, seed, rank, peer);
    void *send, *recv;
    CUDA_OK(cudaMalloc(&send, bytes));
    CUDA_OK(cudaMalloc(&recv, bytes));
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    CUDA_OK(cudaMemcpyAsync(send, mine.data(), bytes, cudaMemcpyHostToDevice, stream));
    ZP_ASSERT_OK(zpGroupStart());
    ZP_EXPECT_OK(zpSend(send, bytes, zpUint8, peer, comm, stream));
    ZP_EXPECT_OK(zpRecv(recv, bytes, zpUint8, peer, comm, stream));
    ZP_ASSERT_OK(zpGroupEnd());
    CUDA_OK(cudaMemcpyAsync(got.data(), recv, bytes, cudaMemcpyDeviceToHost, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    EXPECT_EQ(zptest::wrongPatternBytes(got.data(), bytes, seed, peer, rank), 0u);
    CUDA_OK(cudaStreamDestroy(stream));
    CUDA_OK(cudaFree(send));
    CUDA_OK(cudaFree(recv));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// A split communicator gets an NCCL communicator of its own: device calls on
// two children at once (a 2 x 2 grid of 4 ranks) move the right bytes.
TEST(Device, SplitCommunicatorsCarryDeviceCalls) {
  SKIP_WITHOUT_DEVICE();
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(4, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t world = initDeviceComm(rank, nranks, id);
    zpComm_t row = nullptr;
    ZP_ASSERT_OK(zpCommSplit(world, rank / 2, rank, &row, nullptr));
    ncclComm_t nccl = nullptr;
    ZP_ASSERT_OK(zpCommGetNcclComm(row, &nccl));
    int count = 0;
    EXPECT_EQ(ncclCommCount(nccl, &count), ncclSuccess);
    EXPECT_EQ(count, 2);
    const int me = rank % 2;
    EXPECT_EQ(deviceAlltoallvError(row, me, zptest::randomCounts(2, seed + rank / 2, 5000, 0.1), zpFloat32,
                                   seed + rank / 2),
              "");
    ZP_EXPECT_OK(zpCommDestroy(row));
    ZP_EXPECT_OK(zpCommDestroy(world));
  }));
}

// Two ranks on one GPU (ZP_CUDA_DEVICE=0): NCCL 2.28 refuses them on every
// rank ("Duplicate GPU detected") unless each has a host id of its own
// (NCCL_HOSTID), which lets them share it, as the tests did on one H200.
TEST(Device, RanksShareOneGpuOnlyWithHostIdsOfTheirOwn) {
  SKIP_WITHOUT_DEVICE();
  const uint64_t seed = zptest::testCaseSeed();
  for (bool hostIds : {false, true}) {
    zptest::expectAllOk(zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
      setenv("ZP_CUDA_DEVICE", "0", 1);
      if (hostIds)
        setenv("NCCL_HOSTID", ("zptest-shared-gpu-" + std::to_string(rank)).c_str(), 1);
      else
        unsetenv("NCCL_HOSTID");
      CUDA_OK(cudaSetDevice(0));
      zpConfig_t config = ZP_CONFIG_INITIALIZER;
      config.checkMode = zpCheckFull;
      zpComm_t comm = nullptr;
      const zpResult_t r = zpCommInitRankConfig(&comm, nranks, id, rank, &config);
      if (!hostIds) {
        EXPECT_NE(r, zpSuccess) << "rank " << rank << ": two ranks on GPU 0 of one host were accepted";
        EXPECT_NE(std::string(zpGetLastError(nullptr)).find("Duplicate GPU detected"), std::string::npos)
            << zpGetLastError(nullptr);
        if (r == zpSuccess) zpCommDestroy(comm);
        return;
      }
      ZP_ASSERT_OK(r);
      EXPECT_EQ(deviceAlltoallvError(comm, rank, zptest::randomCounts(2, seed, 5000, 0.1), zpFloat32, seed), "");
      ZP_EXPECT_OK(zpCommDestroy(comm));
    }));
  }
}

TEST(Device, NcclCommunicatorIsHandedOut) {
  SKIP_WITHOUT_DEVICE();
  zptest::expectAllOk(zptest::runRanks(3, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id);
    ncclComm_t nccl = nullptr;
    ZP_ASSERT_OK(zpCommGetNcclComm(comm, &nccl));
    ASSERT_NE(nccl, nullptr);
    int count = 0, me = -1;
    EXPECT_EQ(ncclCommCount(nccl, &count), ncclSuccess);
    EXPECT_EQ(ncclCommUserRank(nccl, &me), ncclSuccess);
    EXPECT_EQ(count, nranks);
    EXPECT_EQ(me, rank);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// Two host threads calling on one communicator at once: each call is either
// enqueued or refused by the library (its twin on the host path is
// Errors.SecondThreadCallingWhileACallRunsIsRefused), never two NCCL calls
// on one NCCL communicator at once, which NCCL leaves undefined (and the
// double refuses: its one-thread rule). One rank, so that a refused call
// cannot leave a peer waiting.
TEST(DeviceErrors, TwoThreadsCallingAtOnceNeverMeetInNccl) {
  SKIP_WITHOUT_DEVICE();
  zptest::expectAllOk(zptest::runRanks(1, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id, zpCheckLocal);
    constexpr int kCalls = 2000;
    std::atomic<int> refused{0}, failed{0};
    std::string firstFailure;
    std::mutex mu;
    auto calls = [&] {
      float *in = nullptr, *out = nullptr;
      cudaStream_t s = nullptr;
      if (cudaMalloc(&in, 64) != cudaSuccess || cudaMalloc(&out, 64) != cudaSuccess ||
          cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
        failed++;
        return;
      }
      for (int i = 0; i < kCalls; i++) {
        const zpResult_t r = zpAllReduce(in, out, 16, zpFloat32, zpSum, comm, s);
        if (r == zpSuccess) continue;
        const std::string why = zpGetLastError(nullptr);
        if (r == zpInvalidUsage && why.find("another thread is running a call") != std::string::npos) {
          refused++;
          continue;
        }
        std::lock_guard<std::mutex> l(mu);
        if (failed++ == 0) firstFailure = std::string(zpGetErrorString(r)) + ": " + why;
      }
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
      cudaFree(in);
      cudaFree(out);
    };
    std::thread a(calls), b(calls);
    a.join();
    b.join();
    EXPECT_EQ(failed.load(), 0) << firstFailure;
    zpResult_t async = zpSuccess;
    ZP_EXPECT_OK(zpCommGetAsyncError(comm, &async));
    EXPECT_EQ(async, zpSuccess) << zpGetLastError(comm);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// ---- Errors: each has a twin on the host path (errors_test.cc) ----

TEST(DeviceErrors, HostAndDeviceBuffersMustMatchTheStream) {
  SKIP_WITHOUT_DEVICE();
  zptest::expectAllOk(zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id);
    void* dev;
    CUDA_OK(cudaMalloc(&dev, 64));
    std::vector<uint8_t> host(64);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpSend(dev, 64, zpUint8, 1 - rank, comm, nullptr));
    EXPECT_NE(std::string(zpGetLastError(comm)).find("is device memory"), std::string::npos) << zpGetLastError(comm);
    ZP_EXPECT_ERROR(zpInvalidArgument, zpRecv(host.data(), 64, zpUint8, 1 - rank, comm, stream));
    EXPECT_NE(std::string(zpGetLastError(comm)).find("is host memory"), std::string::npos) << zpGetLastError(comm);
    size_t counts[2] = {8, 8}, displs[2] = {0, 8};
    ZP_EXPECT_ERROR(zpInvalidArgument,
                    zpAlltoallv(dev, counts, displs, host.data(), counts, displs, zpUint8, comm, stream));
    EXPECT_NE(std::string(zpGetLastError(comm)).find("recvbuff"), std::string::npos) << zpGetLastError(comm);
    // In a capture too: host memory is refused, while the capture's own
    // memory (cudaMallocAsync, which CUDA calls unregistered until the
    // graph's first launch) is taken for device memory.
    CUDA_OK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
    void* graphMem = nullptr;
    CUDA_OK(cudaMallocAsync(&graphMem, 64, stream));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpCommCheckBuffer(comm, host.data(), stream));
    EXPECT_NE(std::string(zpGetLastError(comm)).find("is host memory"), std::string::npos) << zpGetLastError(comm);
    ZP_EXPECT_OK(zpCommCheckBuffer(comm, graphMem, stream));
    CUDA_OK(cudaFreeAsync(graphMem, stream));
    cudaGraph_t graph = nullptr;
    CUDA_OK(cudaStreamEndCapture(stream, &graph));
    CUDA_OK(cudaGraphDestroy(graph));
    // Nothing was enqueued by the refused calls: the ranks are still in step.
    zptest::barrier(comm, nranks);
    CUDA_OK(cudaStreamDestroy(stream));
    CUDA_OK(cudaFree(dev));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

TEST(DeviceErrors, MismatchedCountsAreInvalidUsageOnEveryRank) {
  SKIP_WITHOUT_DEVICE();
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(3, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id);
    auto counts = zptest::uniformCounts(nranks, 100);
    std::vector<size_t> send = counts[rank], recv(nranks, 100);
    if (rank == 2) recv[0] = 99;  // rank 0 sends 100 elements to rank 2, which expects 99
    AlltoallvRun run(rank, nranks, send, recv, zpFloat32, seed);
    DeviceMirror s(run.sendBuffer()), r(run.recvBuffer());
    ASSERT_TRUE(s.ok() && r.ok());
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ZP_EXPECT_ERROR(zpInvalidUsage, zpAlltoallv(s.data(), run.sendCounts(), run.sendDispls(), r.data(),
                                                run.recvCounts(), run.recvDispls(), zpFloat32, comm, stream));
    EXPECT_NE(std::string(zpGetLastError(comm)).find("rank 0 sends 100 elements to rank 2 but rank 2 expects 99"),
              std::string::npos)
        << zpGetLastError(comm);
    // Nothing was enqueued: the receive buffer is untouched.
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(r.copyBack());
    EXPECT_EQ(run.recvBuffer().writtenBytes(), 0u);
    // And the communicator still works.
    EXPECT_EQ(deviceAlltoallvError(comm, rank, counts, zpFloat32, seed + 1), "");
    CUDA_OK(cudaStreamDestroy(stream));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// Under ZP_CHECK_MODE=full a device call that one rank refuses (host memory
// with a stream) takes part in the host's header round: that rank returns
// zpInvalidArgument, the others zpInvalidUsage naming it and its reason,
// nothing is enqueued, and the next device call runs on every rank.
TEST(DeviceErrors, ARefusedCallFailsOnEveryRankUnderFullChecks) {
  SKIP_WITHOUT_DEVICE();
  zptest::expectAllOk(zptest::runRanks(3, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id);
    const size_t count = 1000;
    float* dev = nullptr;
    CUDA_OK(cudaMalloc((void**)&dev, count * sizeof(float)));
    std::vector<float> host(count, float(rank + 1));
    CUDA_OK(cudaMemcpy(dev, host.data(), count * sizeof(float), cudaMemcpyHostToDevice));
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    zp::clearLastError();
    const zpResult_t r =
        zpAllReduce(dev, rank == 1 ? (void*)host.data() : (void*)dev, count, zpFloat32, zpSum, comm, stream);
    const std::string msg = zpGetLastError(comm);
    EXPECT_EQ(r, rank == 1 ? zpInvalidArgument : zpInvalidUsage) << msg;
    EXPECT_NE(msg.find("is host memory"), std::string::npos) << msg;
    if (rank != 1) EXPECT_NE(msg.find("rank 1 refused zpAllReduce: "), std::string::npos) << msg;
    ZP_EXPECT_OK(zpAllReduce(dev, dev, count, zpFloat32, zpSum, comm, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaMemcpy(host.data(), dev, count * sizeof(float), cudaMemcpyDeviceToHost));
    EXPECT_EQ(host[count - 1], float(nranks * (nranks + 1) / 2)) << "the refused call moved data, or the next did not";
    CUDA_OK(cudaStreamDestroy(stream));
    CUDA_OK(cudaFree(dev));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

// A rank dies with device work of its peers enqueued on it: the peers learn
// of it from zpCommGetAsyncError within the timeout, and zpCommAbort ends
// the device work that waits for the dead rank (the stream drains).
TEST(DeviceErrors, KilledRankIsAnAsyncErrorAndAbortEndsTheDeviceWork) {
  SKIP_WITHOUT_DEVICE();
  zptest::Shared<std::atomic<int>> initialized;
  zptest::expectAllOk(zptest::runRanks(3, [&](int rank, int nranks, const zpUniqueId& id) {
    zptest::setTimeoutSeconds(20);
    zpComm_t comm = initDeviceComm(rank, nranks, id);
    // Every rank is past init (NCCL's included) before rank 2 dies.
    (*initialized)++;
    ASSERT_TRUE(zptest::waitFor([&] { return initialized->load() == nranks; }, 60));
    if (rank == 2) _exit(0);  // dies without a word (its peers must not depend on an exit message)
    void* buf;
    CUDA_OK(cudaMalloc(&buf, 4096));
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // Enqueued: it returns at once, and waits on the device for rank 2; or,
    // if rank 2's death is already known, it is refused with zpRemoteError.
    zpResult_t r = zpRecv(buf, 4096, zpUint8, 2, comm, stream);
    EXPECT_TRUE(r == zpSuccess || r == zpRemoteError) << zpGetErrorString(r) << ": " << zpGetLastError(comm);
    auto start = std::chrono::steady_clock::now();
    zpResult_t async = zpSuccess;
    ASSERT_TRUE(zptest::waitFor(
        [&] { return zpCommGetAsyncError(comm, &async) == zpSuccess && async != zpSuccess; }, 30))
        << "rank " << rank << ": no async error within 30 s";
    EXPECT_EQ(async, zpRemoteError);
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(25));
    ZP_EXPECT_OK(zpCommAbort(comm));
    // The aborted NCCL communicator lets the stream move on.
    cudaStreamSynchronize(stream);
    cudaStreamDestroy(stream);
    cudaFree(buf);
  }));
}

TEST(DeviceErrors, CallsAfterAbortAreRefused) {
  SKIP_WITHOUT_DEVICE();
  zptest::Shared<std::atomic<int>> initialized;
  zptest::expectAllOk(zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id);
    void* buf;
    CUDA_OK(cudaMalloc(&buf, 64));
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    // Every rank's NCCL init is over before any rank aborts (an abort during
    // a peer's init fails that init, which is not this test); the ranks meet
    // outside the communicator, which is what this test aborts.
    (*initialized)++;
    ASSERT_TRUE(zptest::waitFor([&] { return initialized->load() == nranks; }, 60));
    ZP_EXPECT_OK(zpCommAbort(comm));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpSend(buf, 64, zpUint8, 1 - rank, comm, stream));
    ncclComm_t nccl = nullptr;
    ZP_EXPECT_ERROR(zpInvalidArgument, zpCommGetNcclComm(comm, &nccl));
    CUDA_OK(cudaStreamDestroy(stream));
    CUDA_OK(cudaFree(buf));
  }));
}

// ---- The attention driver on devices (tests/device_checks.h) ----

// Forward and backward against the host driver, in float32, bfloat16 and
// float16, GQA, causal or not, the kernel folding blocks in itself or not
// (both of each among the first two types), enqueued behind a held stream.
class DeviceAttention : public ::testing::TestWithParam<int> {};

TEST_P(DeviceAttention, ForwardAndBackwardMatchTheHostDriver) {
  SKIP_WITHOUT_DEVICE();
  const int n = GetParam();
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id);
    std::mt19937_64 rng(seed);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    const int causal0 = (int)(rng() % 2), accumulate0 = (int)(rng() % 2);
    int round = 0;
    for (zpDataType_t dt : {zpFloat32, zpBfloat16, zpFloat16}) {
      const int causal = round == 2 ? (int)(rng() % 2) : causal0 ^ round;
      const int accumulate = round == 2 ? (int)(rng() % 2) : accumulate0 ^ round;
      round++;
      zpBatchPlan_t plan = zptest::deviceAttentionPlan(nranks, causal, 0, rng);
      ASSERT_NE(plan, nullptr) << zpGetLastError(nullptr);
      EXPECT_EQ(zptest::deviceAttentionError(comm, rank, plan, dt, accumulate, stream, rng()), "")
          << (causal ? "causal" : "not causal");
      zpPlanDestroy(plan);
    }
    CUDA_OK(cudaStreamDestroy(stream));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceAttention, ::testing::Values(2, 4),
                         [](const ::testing::TestParamInfo<int>& p) { return std::to_string(p.param); });

// A plan whose order interleaves rings and local sequences and is not the
// default (tests/attention_check.h, shuffledOrderPlan): the device driver
// matches the host driver (which runs the same order), and every rank's run
// log of the device passes has its rings and locals in the plan's order
// forward and reversed backward.
class DeviceAttentionOrder : public ::testing::TestWithParam<int> {};

TEST_P(DeviceAttentionOrder, RunsThePlansOrderForwardAndReversedBackward) {
  SKIP_WITHOUT_DEVICE();
  const int n = GetParam();
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id);
    std::mt19937_64 rng(seed);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    auto checkRun = [&](zpBatchPlan_t plan) {
      return [plan, rank](zpAttention_t attn) -> std::string {
        const zpx::AttentionRunLog* log = zpx::attentionRunLog(attn);
        if (!log) return "no run log";
        std::string f = zptest::runOrderError(plan, rank, log->forward, false),
                    b = zptest::runOrderError(plan, rank, log->backward, true);
        return f + (f.empty() || b.empty() ? "" : "; ") + b;
      };
    };
    int round = 0;
    for (zpDataType_t dt : {zpFloat32, zpBfloat16, zpFloat32}) {
      const int causal = round % 2 == 0, accumulate = round == 1;
      round++;
      zpBatchPlan_t plan = zptest::shuffledOrderPlan(nranks, causal, 0, rng);
      ASSERT_NE(plan, nullptr) << zpGetLastError(nullptr);
      EXPECT_EQ(zptest::deviceAttentionError(comm, rank, plan, dt, accumulate, stream, rng(), checkRun(plan)), "")
          << (causal ? "causal" : "not causal");
      zpPlanDestroy(plan);
    }
    CUDA_OK(cudaStreamDestroy(stream));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceAttentionOrder, ::testing::Values(4, 8),
                         [](const ::testing::TestParamInfo<int>& p) { return std::to_string(p.param); });

// Buffers must suit the stream: a host buffer with a stream, or a device
// buffer without one, is refused by name before anything is enqueued; the
// ranks then still run a pass together.
TEST(DeviceErrors, AttentionBuffersMustMatchTheStream) {
  SKIP_WITHOUT_DEVICE();
  zptest::expectAllOk(zptest::runRanks(2, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id);
    std::mt19937_64 rng(7);
    zpBatchPlan_t plan = zptest::deviceAttentionPlan(nranks, 1, 0, rng);
    ASSERT_NE(plan, nullptr);
    zpLayout_t layout = nullptr;
    int64_t T = 0;
    ZP_ASSERT_OK(zpPlanGetLayout(plan, zpAttentionLayout, &layout));
    ZP_ASSERT_OK(zpLayoutRankTokens(layout, rank, &T));
    zpAttnConfig_t cfg = {2, 1, 8, 0.0f, zpAttnRefForward, zpAttnRefBackward, nullptr, 0, zpBfloat16};
    zpAttention_t attn = nullptr;
    ZP_ASSERT_OK(zpAttentionCreate(&attn, plan, &cfg, comm));
    zptest::DeviceBuffer q(T * 16 * 2, 0), kv(T * 8 * 2, 0), out(T * 16 * 2, 0), lse(T * 2 * 4, 0);
    std::vector<float> hostLse(T * 2);
    cudaStream_t stream;
    CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    ZP_EXPECT_ERROR(zpInvalidArgument,
                    zpAttentionForward(attn, q.dev, kv.dev, kv.dev, out.dev, hostLse.data(), stream));
    EXPECT_NE(std::string(zpGetLastError(comm)).find("lse: "), std::string::npos) << zpGetLastError(comm);
    EXPECT_NE(std::string(zpGetLastError(comm)).find("is host memory"), std::string::npos) << zpGetLastError(comm);
    ZP_EXPECT_ERROR(zpInvalidArgument,
                    zpAttentionForward(attn, q.dev, kv.dev, kv.dev, out.dev, (float*)lse.dev, nullptr));
    EXPECT_NE(std::string(zpGetLastError(comm)).find("q: "), std::string::npos) << zpGetLastError(comm);
    EXPECT_NE(std::string(zpGetLastError(comm)).find("is device memory"), std::string::npos) << zpGetLastError(comm);
    // Nothing was enqueued: a right call still meets the peer's.
    ZP_EXPECT_OK(zpAttentionForward(attn, q.dev, kv.dev, kv.dev, out.dev, (float*)lse.dev, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    ZP_EXPECT_OK(zpAttentionDestroy(attn));
    CUDA_OK(cudaStreamDestroy(stream));
    zpPlanDestroy(plan);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}


// ---- CUDA graphs: a whole pass captured once and replayed ----

// One rank's pass on device buffers, all on one stream: zpAlltoallv, a
// grouped send/recv ring, a ring exchange (zpRing_t), an all-reduce, a remap,
// the Ulysses exchange both ways (GQA), and the attention driver forward and
// backward in float32. Captured once
// (global mode, the strictest), then launched three times with fresh inputs
// (same counts: they are fixed at capture), every output poisoned before each
// launch and checked byte for byte after it, against the pattern or the host
// path on the same numbers. Nothing runs at capture time: the outputs are
// still poison after it. "" when all is right.
std::string capturedPassError(zpComm_t comm, int rank, int nranks, uint64_t seed) {
  const std::string where = "rank " + std::to_string(rank) + ": ";
  auto zpFailed = [&](const char* what) { return where + what + ": " + zpGetLastError(comm); };
  std::mt19937_64 rng(seed);  // draws alike on every rank
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return where + "cudaStreamCreate";

  // Alltoallv: random counts (zeros included), odd displacements.
  AlltoallvRun a2a(rank, zptest::randomCounts(nranks, rng(), 2000, 0.2), zpFloat32, seed);
  DeviceMirror a2aSend(a2a.sendBuffer()), a2aRecv(a2a.recvBuffer());
  // A ring of send/recv in a group.
  const int next = (rank + 1) % nranks, prev = (rank - 1 + nranks) % nranks;
  auto ringBytes = [&](int src) { return (size_t)1 + (seed + src * 7919) % 30000; };
  GuardedBuffer ringSend(ringBytes(rank)), ringRecv(ringBytes(prev));
  DeviceMirror dRingSend(ringSend), dRingRecv(ringRecv);
  // A ring exchange (zpRing_t) over all ranks, and an all-reduce.
  std::vector<int> order(nranks);
  for (int r = 0; r < nranks; r++) order[r] = r;
  zpRing_t zring = nullptr;
  if (zpRingCreate(&zring, comm, nranks, order.data(), 0) != zpSuccess) return zpFailed("zpRingCreate");
  GuardedBuffer zringSend(ringBytes(rank) + 5), zringRecv(ringBytes(prev) + 5);
  DeviceMirror dZringSend(zringSend), dZringRecv(zringRecv);
  const size_t arCount = 1000 + seed % 100;
  GuardedBuffer arIn(arCount * 4), arOut(arCount * 4);
  DeviceMirror dArIn(arIn), dArOut(arOut);
  auto arValue = [&](uint64_t ls, int r, size_t i) { return (int32_t)((ls * 31 + (uint64_t)r * 977 + i * 7) % 2001) - 1000; };
  // A remap, linear to attention layout.
  zpBatchPlan_t plan = randomPlan(comm, rng, 600, nullptr);
  if (!plan) return where + "zpPlanBatch";
  zpLayout_t linear = nullptr, attention = nullptr;
  zpRemap_t remap = nullptr;
  if (zpPlanGetLayout(plan, zpLinearLayout, &linear) != zpSuccess ||
      zpPlanGetLayout(plan, zpAttentionLayout, &attention) != zpSuccess ||
      zpRemapCreate(&remap, linear, attention, comm) != zpSuccess)
    return zpFailed("the remap");
  const size_t ept = 3, tb = ept * 2;
  GuardedBuffer remapIn(layoutBuffer(linear, rank, tb, 0).size()), remapOut(layoutBuffer(attention, rank, tb, 0).size());
  DeviceMirror dRemapIn(remapIn), dRemapOut(remapOut);
  // Ulysses both ways, 8 query heads over 2 key/value heads.
  int64_t mine = 0, total = 0;
  zpLayoutRankTokens(linear, rank, &mine);
  for (int r = 0; r < nranks; r++) {
    int64_t t = 0;
    zpLayoutRankTokens(linear, r, &t);
    total += t;
  }
  const int qHeads = 8, heads = 2, headDim = 5;
  const size_t ulyElems[2][2] = {{(size_t)mine * heads * headDim, (size_t)total * heads * headDim},
                                 {(size_t)total * heads * headDim, (size_t)mine * heads * headDim}};
  GuardedBuffer ulyIn0(ulyElems[0][0] * 4), ulyOut0(ulyElems[0][1] * 4), ulyIn1(ulyElems[1][0] * 4),
      ulyOut1(ulyElems[1][1] * 4);
  GuardedBuffer* ulyIn[2] = {&ulyIn0, &ulyIn1};
  GuardedBuffer* ulyOut[2] = {&ulyOut0, &ulyOut1};
  DeviceMirror dUlyIn0(ulyIn0), dUlyOut0(ulyOut0), dUlyIn1(ulyIn1), dUlyOut1(ulyOut1);
  DeviceMirror* dUlyIn[2] = {&dUlyIn0, &dUlyIn1};
  DeviceMirror* dUlyOut[2] = {&dUlyOut0, &dUlyOut1};
  // Attention, float32, forward and backward, twice: on a plan with rings over
  // every rank (the driver forks its exchange stream), and on one with only
  // a local sequence per rank (it never does).
  const int H = 4, Hk = 2, D = 16;
  zpAttnConfig_t cfg = {H, Hk, D, 0.0f, zpAttnRefForward, zpAttnRefBackward, nullptr, 0, zpFloat32};
  struct AttnCase {
    zpBatchPlan_t plan = nullptr;
    zpAttention_t dev = nullptr, host = nullptr;
    size_t T = 0, qn = 0, kn = 0;
    std::unique_ptr<zptest::DeviceBuffer> q, k, v, dout, out, lse, dq, dk, dv;
    std::vector<float> qf, kf, vf, doutf;
  } cases[2];
  cases[0].plan = zptest::deviceAttentionPlan(nranks, (int)(rng() % 2), 0, rng);
  {
    std::vector<int64_t> lens;
    std::vector<size_t> offs = {0};
    std::vector<int> ranks;
    for (int r = 0; r < nranks; r++) {
      lens.push_back(1 + (int64_t)(rng() % 100));
      ranks.push_back(r);
      offs.push_back(ranks.size());
    }
    zpPlanCreate(&cases[1].plan, nranks, lens.data(), 1, nranks, 0, offs.data(), ranks.data());
  }
  for (AttnCase& c : cases) {
    zpLayout_t layout = nullptr;
    int64_t T = 0;
    if (!c.plan || zpPlanGetLayout(c.plan, zpAttentionLayout, &layout) != zpSuccess ||
        zpLayoutRankTokens(layout, rank, &T) != zpSuccess)
      return where + "an attention plan";
    c.T = (size_t)T;
    c.qn = c.T * H * D;
    c.kn = c.T * Hk * D;
    auto buf = [](size_t bytes, uint8_t fill) { return std::make_unique<zptest::DeviceBuffer>(bytes, fill); };
    c.q = buf(c.qn * 4, 0), c.k = buf(c.kn * 4, 0), c.v = buf(c.kn * 4, 0), c.dout = buf(c.qn * 4, 0);
    c.out = buf(c.qn * 4, 0xFF), c.lse = buf(H * c.T * 4, 0xFF), c.dq = buf(c.qn * 4, 0xFF);
    c.dk = buf(c.kn * 4, 0xFF), c.dv = buf(c.kn * 4, 0xFF);
    if (zpAttentionCreate(&c.dev, c.plan, &cfg, comm) != zpSuccess ||
        zpAttentionCreate(&c.host, c.plan, &cfg, comm) != zpSuccess)
      return zpFailed("zpAttentionCreate");
  }
  AttnCase& rings = cases[0];
  for (const DeviceMirror* m : {&a2aSend, &a2aRecv, &dRingSend, &dRingRecv, &dRemapIn, &dRemapOut, &dUlyIn0,
                                &dUlyOut0, &dUlyIn1, &dUlyOut1, &dZringSend, &dZringRecv, &dArIn, &dArOut})
    if (!m->ok()) return where + "cudaMalloc";

  // A driver that made its exchange stream outside the capture (an eager pass).
  zpAttention_t idle = nullptr;
  if (zpAttentionCreate(&idle, rings.plan, &cfg, comm) != zpSuccess ||
      zpAttentionForward(idle, rings.q->dev, rings.k->dev, rings.v->dev, rings.out->dev, (float*)rings.lse->dev,
                         stream) != zpSuccess)
    return zpFailed("an eager pass");
  if (cudaStreamSynchronize(stream) != cudaSuccess || rings.out->toDevice() != cudaSuccess ||
      rings.lse->toDevice() != cudaSuccess)
    return where + "after the eager pass";

  // The capture: every call enqueues, nothing runs.
  std::string err;
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal) != cudaSuccess) return where + "BeginCapture";
  if (zpAlltoallv(a2aSend.data(), a2a.sendCounts(), a2a.sendDispls(), a2aRecv.data(), a2a.recvCounts(),
                  a2a.recvDispls(), zpFloat32, comm, stream) != zpSuccess)
    err += zpFailed("zpAlltoallv") + "; ";
  if (zpGroupStart() != zpSuccess || zpSend(dRingSend.data(), ringSend.size(), zpUint8, next, comm, stream) ||
      zpRecv(dRingRecv.data(), ringRecv.size(), zpUint8, prev, comm, stream) || zpGroupEnd() != zpSuccess)
    err += zpFailed("the send/recv group") + "; ";
  if (zpRingExchangeStart(zring, dZringSend.data(), zringSend.size(), dZringRecv.data(), zringRecv.size(), stream) !=
          zpSuccess ||
      zpRingExchangeWait(zring) != zpSuccess)
    err += zpFailed("the ring exchange") + "; ";
  if (zpAllReduce(dArIn.data(), dArOut.data(), arCount, zpInt32, zpSum, comm, stream) != zpSuccess)
    err += zpFailed("zpAllReduce") + "; ";
  if (zpRemapExecute(remap, dRemapIn.data(), dRemapOut.data(), ept, zpBfloat16, 0, comm, stream) != zpSuccess)
    err += zpFailed("zpRemapExecute") + "; ";
  for (int dir : {0, 1})
    if (zpUlyssesAlltoall(dUlyIn[dir]->data(), dUlyOut[dir]->data(), linear, qHeads, heads, headDim, zpFloat32, dir,
                          comm, stream) != zpSuccess)
      err += zpFailed("zpUlyssesAlltoall") + "; ";
  for (AttnCase& c : cases) {
    if (zpAttentionForward(c.dev, c.q->dev, c.k->dev, c.v->dev, c.out->dev, (float*)c.lse->dev, stream) != zpSuccess)
      err += zpFailed("zpAttentionForward") + "; ";
    if (zpAttentionBackward(c.dev, c.q->dev, c.k->dev, c.v->dev, c.out->dev, (float*)c.lse->dev, c.dout->dev,
                            c.dq->dev, c.dk->dev, c.dv->dev, stream) != zpSuccess)
      err += zpFailed("zpAttentionBackward") + "; ";
  }
  // Destroying the driver would wait for its exchange stream, which is in the
  // capture: refused, and the capture goes on.
  if (zpAttentionDestroy(rings.dev) != zpInvalidUsage ||
      std::string(zpGetLastError(comm)).find("zpAttentionDestroy cannot be captured") == std::string::npos)
    err += where + "zpAttentionDestroy during the capture: " + zpGetLastError(comm) + "; ";
  // A driver whose exchange stream is not in the capture may be destroyed:
  // its wait does not break the capture.
  if (zpAttentionDestroy(idle) != zpSuccess) err += zpFailed("zpAttentionDestroy of an idle driver") + "; ";
  cudaGraph_t graph = nullptr;
  cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  if (ended != cudaSuccess) err += where + "cudaStreamEndCapture: " + cudaGetErrorString(ended) + "; ";
  if (!err.empty()) return err;
  if (a2aRecv.copyBack() != cudaSuccess || rings.out->toHost() != cudaSuccess) return where + "copying back";
  if (a2a.recvBuffer().writtenBytes() != 0) return where + "the capture ran the alltoallv";
  for (uint8_t b : rings.out->host)
    if (b != 0xFF) return where + "the capture ran the attention forward";
  cudaGraphExec_t exec = nullptr;
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return where + "cudaGraphInstantiate";

  for (int launch = 0; launch < 3 && err.empty(); launch++) {
    const uint64_t ls = seed * 31 + launch + 1;  // this launch's data, alike on every rank
    const std::string at = where + "launch " + std::to_string(launch) + ": ";
    // Fresh inputs, poisoned outputs.
    a2a.refill(ls);
    ringSend.fill(ls, rank, next);
    ringRecv.poison();
    zringSend.fill(ls + 1, rank, next);
    zringRecv.poison();
    for (size_t i = 0; i < arCount; i++) ((int32_t*)arIn.data())[i] = arValue(ls, rank, i);
    arOut.poison();
    std::vector<uint8_t> rIn = layoutBuffer(linear, rank, tb, ls), rWant = layoutBuffer(attention, rank, tb, ls);
    memcpy(remapIn.data(), rIn.data(), rIn.size());
    remapOut.poison();
    std::mt19937_64 data(ls + rank);
    for (int dir : {0, 1}) {
      for (size_t i = 0; i < ulyElems[dir][0]; i++) ((float*)ulyIn[dir]->data())[i] = (float)(data() % 2001) / 8 - 125;
      ulyOut[dir]->poison();
    }
    bool up = true;
    for (AttnCase& c : cases) {
      c.qf.resize(c.qn), c.kf.resize(c.kn), c.vf.resize(c.kn), c.doutf.resize(c.qn);
      for (auto* f : {&c.qf, &c.kf, &c.vf, &c.doutf})
        for (float& x : *f) x = (float)((int)(data() % 257) - 128) / 64;
      memcpy(c.q->host.data(), c.qf.data(), c.qn * 4);
      memcpy(c.k->host.data(), c.kf.data(), c.kn * 4);
      memcpy(c.v->host.data(), c.vf.data(), c.kn * 4);
      memcpy(c.dout->host.data(), c.doutf.data(), c.qn * 4);
      for (auto* b : {&c.out, &c.lse, &c.dq, &c.dk, &c.dv}) memset((*b)->host.data(), 0xFF, (*b)->host.size());
      for (auto* b : {&c.q, &c.k, &c.v, &c.dout, &c.out, &c.lse, &c.dq, &c.dk, &c.dv})
        up &= (*b)->toDevice() == cudaSuccess;
    }
    for (DeviceMirror* m : {&a2aSend, &a2aRecv, &dRingSend, &dRingRecv, &dRemapIn, &dRemapOut, &dUlyIn0, &dUlyOut0,
                            &dUlyIn1, &dUlyOut1, &dZringSend, &dZringRecv, &dArIn, &dArOut})
      up &= m->upload() == cudaSuccess;
    if (!up) return at + "uploading the inputs";

    cudaError_t e = cudaGraphLaunch(exec, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) return at + "the launch: " + cudaGetErrorString(e);

    // Every output, every byte.
    if (a2aRecv.copyBack() != cudaSuccess || a2aSend.copyBack() != cudaSuccess) return at + "copying back";
    err += a2a.check();
    if (dRingRecv.copyBack() != cudaSuccess) return at + "copying back";
    if (size_t w = ringRecv.wrongBytes(ls, prev, rank) + ringRecv.guardBytesWritten())
      err += at + "ring: " + std::to_string(w) + " bytes wrong; ";
    if (dZringRecv.copyBack() != cudaSuccess || dArOut.copyBack() != cudaSuccess) return at + "copying back";
    if (size_t w = zringRecv.wrongBytes(ls + 1, prev, rank) + zringRecv.guardBytesWritten())
      err += at + "ring exchange: " + std::to_string(w) + " bytes wrong; ";
    size_t arWrong = arOut.guardBytesWritten();
    for (size_t i = 0; i < arCount; i++) {
      int32_t want = 0;
      for (int r = 0; r < nranks; r++) want += arValue(ls, r, i);
      arWrong += ((const int32_t*)arOut.data())[i] != want;
    }
    if (arWrong) err += at + "all-reduce: " + std::to_string(arWrong) + " wrong; ";
    if (dRemapOut.copyBack() != cudaSuccess) return at + "copying back";
    if (memcmp(remapOut.data(), rWant.data(), rWant.size()) != 0 || remapOut.guardBytesWritten())
      err += at + "remap: wrong bytes; ";
    for (int dir : {0, 1}) {
      GuardedBuffer want(ulyOut[dir]->size());
      if (zpUlyssesAlltoall(ulyIn[dir]->data(), want.data(), linear, qHeads, heads, headDim, zpFloat32, dir, comm,
                            nullptr) != zpSuccess)
        return zpFailed("zpUlyssesAlltoall (host)");
      if (dUlyOut[dir]->copyBack() != cudaSuccess) return at + "copying back";
      if (memcmp(want.storage().data(), ulyOut[dir]->storage().data(), want.storage().size()) != 0)
        err += at + "Ulysses direction " + std::to_string(dir) + " differs from the host path; ";
    }
    for (AttnCase& c : cases) {
      for (auto* b : {&c.out, &c.lse, &c.dq, &c.dk, &c.dv})
        if ((*b)->toHost() != cudaSuccess) return at + "copying back";
      std::vector<float> outH(c.qn), lseH(H * c.T), dqH(c.qn), dkH(c.kn), dvH(c.kn);
      if (zpAttentionForward(c.host, c.qf.data(), c.kf.data(), c.vf.data(), outH.data(), lseH.data(), nullptr) !=
              zpSuccess ||
          zpAttentionBackward(c.host, c.qf.data(), c.kf.data(), c.vf.data(), outH.data(), lseH.data(),
                              c.doutf.data(), dqH.data(), dkH.data(), dvH.data(), nullptr) != zpSuccess)
        return zpFailed("the host attention driver");
      // float32: the same kernels in the same order, equal bit for bit (on the double).
      const std::string name = &c == &rings ? "attention (rings) " : "attention (local) ";
      auto same = [&](const char* what, const std::vector<float>& want, const zptest::DeviceBuffer& got) {
#ifdef ZP_TEST_DOUBLE
        if (memcmp(want.data(), got.host.data(), want.size() * 4) != 0) err += at + name + what + " differs; ";
#else
        for (size_t i = 0; i < want.size(); i++) {
          const float g = ((const float*)got.host.data())[i];
          if (!(std::fabs(g - want[i]) <= 1e-5f * std::fabs(want[i]) + 1e-6f)) {
            err += at + name + what + " differs; ";
            break;
          }
        }
#endif
      };
      same("out", outH, *c.out);
      same("lse", lseH, *c.lse);
      same("dq", dqH, *c.dq);
      same("dk", dkH, *c.dk);
      same("dv", dvH, *c.dv);
    }
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  for (AttnCase& c : cases) {
    zpAttentionDestroy(c.dev);
    zpAttentionDestroy(c.host);
    zpPlanDestroy(c.plan);
  }
  zpRemapDestroy(remap);
  zpRingDestroy(zring);
  zpPlanDestroy(plan);
  cudaStreamDestroy(stream);
  return err;
}

class DeviceGraph : public ::testing::TestWithParam<int> {};

TEST_P(DeviceGraph, APassCapturedOnceReplaysWithFreshInputs) {
  SKIP_WITHOUT_DEVICE();
  const int n = GetParam();
  const uint64_t seed = zptest::testCaseSeed();
  zptest::expectAllOk(zptest::runRanks(n, [&](int rank, int nranks, const zpUniqueId& id) {
    zpComm_t comm = initDeviceComm(rank, nranks, id);
    EXPECT_EQ(capturedPassError(comm, rank, nranks, seed), "");
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }));
}

INSTANTIATE_TEST_SUITE_P(Ranks, DeviceGraph, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& p) { return std::to_string(p.param); });

}  // namespace
