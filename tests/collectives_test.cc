// The standard collectives (zpAllReduce, zpBroadcast, zpReduce, zpAllGather,
// zpReduceScatter, zpBarrier, zpAllGatherv, zpReduceScatterv) across real
// processes: every datatype and op, in place and out of place, counts 0, 1,
// primes and large ones, both algorithm families (ZP_COLL_ALGO=ring / tree)
// and the size-based choice, inside groups with send/recv; every element is
// compared with a reference computed here (not with the library's kernels),
// and the bytes around and between the receive ranges must keep their
// poison. Errors: mismatched arguments fail every rank alike, writing
// nothing; a killed rank gives zpRemoteError everywhere.
#include <signal.h>

#include <array>
#include <cmath>
#include <cstring>
#include <map>

#include "tests/harness.h"

namespace {

using zptest::GuardedBuffer;

enum class Coll { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kAllGatherv, kReduceScatterv };
const char* collName(Coll c) {
  static const char* names[] = {"AllReduce", "Broadcast", "Reduce", "AllGather", "ReduceScatter", "AllGatherv",
                                "ReduceScatterv"};
  return names[(int)c];
}
bool reducing(Coll c) {
  return c == Coll::kAllReduce || c == Coll::kReduce || c == Coll::kReduceScatter || c == Coll::kReduceScatterv;
}
const Coll kAllColls[] = {Coll::kAllReduce,     Coll::kBroadcast,  Coll::kReduce,         Coll::kAllGather,
                          Coll::kReduceScatter, Coll::kAllGatherv, Coll::kReduceScatterv};

// ---- The reference: values and their reduction, independent of the library ----

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

bool isFloat(zpDataType_t t) { return t == zpFloat16 || t == zpBfloat16 || t == zpFloat32 || t == zpFloat64; }
bool isSigned(zpDataType_t t) { return t == zpInt8 || t == zpInt32 || t == zpInt64 || isFloat(t); }

// Element i of rank r's data: small integers, so that every float type holds
// them, and their sums and products, exactly whatever the order (products:
// 1, 2 or -1; min and max: up to +-100).
int64_t value(uint64_t seed, int r, size_t i, zpRedOp_t op, zpDataType_t t) {
  uint64_t h = mix(seed ^ mix((uint64_t)r * 0x10001 + i * 0x9E3779B97F4A7C15ull));
  bool sgn = isSigned(t);
  switch (op) {
    case zpProd: {
      static const int64_t prods[] = {1, 2, -1, 1};
      return sgn ? prods[h % 4] : 1 + (int64_t)(h % 2);
    }
    case zpMax:
    case zpMin: return sgn ? (int64_t)(h % 201) - 100 : (int64_t)(h % 201);
    default: return sgn ? (int64_t)(h % 17) - 8 : (int64_t)(h % 17);
  }
}

uint16_t bf16Round(float f) {  // round to nearest even (no NaN here)
  uint32_t x;
  memcpy(&x, &f, 4);
  x += 0x7fff + ((x >> 16) & 1);
  return (uint16_t)(x >> 16);
}

// Stores v (an exact small integer, or for avg a quotient) as type t.
void store(void* p, size_t i, zpDataType_t t, double v) {
  switch (t) {
    case zpInt8: ((int8_t*)p)[i] = (int8_t)(int64_t)v; break;
    case zpUint8: ((uint8_t*)p)[i] = (uint8_t)(int64_t)v; break;
    case zpInt32: ((int32_t*)p)[i] = (int32_t)(int64_t)v; break;
    case zpUint32: ((uint32_t*)p)[i] = (uint32_t)(int64_t)v; break;
    case zpInt64: ((int64_t*)p)[i] = (int64_t)v; break;
    case zpUint64: ((uint64_t*)p)[i] = (uint64_t)(int64_t)v; break;
    case zpFloat16: ((_Float16*)p)[i] = (_Float16)(float)v; break;
    case zpBfloat16: ((uint16_t*)p)[i] = bf16Round((float)v); break;
    case zpFloat32: ((float*)p)[i] = (float)v; break;
    case zpFloat64: ((double*)p)[i] = v; break;
    default: break;
  }
}

// The reduction of element i over every rank, stored at out[j], as the
// header defines it: integers wrap in their own width (computed here in 64
// bits, then truncated, which is the same modulo 2^width), avg divides the
// (wrapped) sum by n truncating; floats: the exact sum, divided in the work
// precision (float32 for the 16-bit types) and rounded once.
void reference(void* out, size_t j, zpDataType_t t, zpRedOp_t op, int n, const std::function<int64_t(int)>& x) {
  int64_t acc = x(0);
  for (int r = 1; r < n; r++) {
    int64_t v = x(r);
    switch (op) {
      case zpSum:
      case zpAvg: acc = (int64_t)((uint64_t)acc + (uint64_t)v); break;
      case zpProd: acc = (int64_t)((uint64_t)acc * (uint64_t)v); break;
      case zpMax: acc = std::max(acc, v); break;
      case zpMin: acc = std::min(acc, v); break;
      default: break;
    }
  }
  if (op != zpAvg) return store(out, j, t, (double)acc);
  switch (t) {
    case zpInt8: return store(out, j, t, (double)((int8_t)acc / n));
    case zpUint8: return store(out, j, t, (double)((uint8_t)acc / n));
    case zpInt32: return store(out, j, t, (double)((int32_t)acc / n));
    case zpUint32: return store(out, j, t, (double)((uint32_t)acc / (uint32_t)n));
    case zpInt64: return store(out, j, t, (double)(acc / n));
    case zpUint64: return store(out, j, t, (double)((uint64_t)acc / (uint64_t)n));
    case zpFloat64: return store(out, j, t, (double)acc / n);
    default: return store(out, j, t, (double)((float)acc / (float)n));  // float32 work type
  }
}

// ---- One checked call ----

struct Case {
  Coll coll;
  zpDataType_t type;
  zpRedOp_t op;
  size_t count;
  bool inPlace;
  int root;
};

std::string describe(const Case& c) {
  char buf[160];
  snprintf(buf, sizeof(buf), "%s %s type %d op %d count %zu root %d", collName(c.coll),
           c.inPlace ? "in place" : "out of place", (int)c.type, (int)c.op, c.count, c.root);
  return buf;
}

// Per-rank counts of the v calls: uneven, some zero, from the case's count.
std::vector<size_t> vCounts(size_t count, int n) {
  std::vector<size_t> v(n);
  for (int p = 0; p < n; p++) v[p] = count == 0 ? 0 : (p % 3 == 1 ? 0 : count + (size_t)p * 7 % 11);
  return v;
}

// Runs one collective on every rank (in a group with send/recv around it if
// `group`) and checks the result; "" when every byte is right.
class CollRun {
 public:
  CollRun(int rank, int n, const Case& c, uint64_t seed) : me_(rank), n_(n), c_(c), seed_(seed) {
    ts_ = zpTypeSize(c.type);
    const size_t cnt = c.count;
    counts_ = vCounts(cnt, n);
    size_t sendElems = 0, recvElems = 0;
    switch (c.coll) {
      case Coll::kAllReduce: case Coll::kBroadcast: case Coll::kReduce: sendElems = recvElems = cnt; break;
      case Coll::kAllGather: sendElems = cnt; recvElems = cnt * n; break;
      case Coll::kReduceScatter: sendElems = cnt * n; recvElems = cnt; break;
      case Coll::kAllGatherv: {
        // Ranges in reverse rank order with gaps (which must stay poisoned).
        displs_.assign(n, 0);
        size_t at = 3;
        for (int p = n - 1; p >= 0; p--) {
          displs_[p] = at;
          at += counts_[p] + 2;
        }
        sendElems = counts_[me_];
        recvElems = at;
        break;
      }
      case Coll::kReduceScatterv:
        for (int p = 0; p < n; p++) {
          if (p < me_) off_ += counts_[p];
          sendElems += counts_[p];
        }
        recvElems = counts_[me_];
        break;
    }
    sendElems_ = sendElems;
    recvElems_ = recvElems;
    if (c.inPlace) {
      // One buffer; the in-place offsets are NCCL's.
      buf_.reset(new GuardedBuffer(std::max(sendElems, recvElems) * ts_, 1));
      uint8_t* b = buf_->data();
      switch (c.coll) {
        case Coll::kAllGather: recv_ = b; send_ = b + (size_t)me_ * cnt * ts_; break;
        case Coll::kAllGatherv: recv_ = b; send_ = b + displs_[me_] * ts_; break;
        case Coll::kReduceScatter: send_ = b; recv_ = b + (size_t)me_ * cnt * ts_; break;
        case Coll::kReduceScatterv: send_ = b; recv_ = b + off_ * ts_; break;
        default: send_ = recv_ = b; break;
      }
    } else {
      sbuf_.reset(new GuardedBuffer(sendElems * ts_, 3));
      rbuf_.reset(new GuardedBuffer(recvElems * ts_, 5));
      send_ = sbuf_->data();
      recv_ = rbuf_->data();
    }
    // The input: element i of this rank's send data.
    for (size_t i = 0; i < sendElems; i++) store(send_, i, c.type, (double)x(me_, i));
    sendCopy_.assign(send_, send_ + sendElems * ts_);
  }

  int64_t x(int r, size_t i) const { return value(seed_, r, i, c_.op, c_.type); }

  zpResult_t call(zpComm_t comm) {
    const Case& c = c_;
    switch (c.coll) {
      case Coll::kAllReduce: return zpAllReduce(send_, recv_, c.count, c.type, c.op, comm, nullptr);
      case Coll::kBroadcast: return zpBroadcast(send_, recv_, c.count, c.type, c.root, comm, nullptr);
      case Coll::kReduce: return zpReduce(send_, recv_, c.count, c.type, c.op, c.root, comm, nullptr);
      case Coll::kAllGather: return zpAllGather(send_, recv_, c.count, c.type, comm, nullptr);
      case Coll::kReduceScatter: return zpReduceScatter(send_, recv_, c.count, c.type, c.op, comm, nullptr);
      case Coll::kAllGatherv:
        return zpAllGatherv(send_, counts_[me_], recv_, counts_.data(), displs_.data(), c.type, comm, nullptr);
      case Coll::kReduceScatterv: return zpReduceScatterv(send_, recv_, counts_.data(), c.type, c.op, comm, nullptr);
    }
    return zpInternalError;
  }

  // The expected receive buffer (recvElems elements; gaps: poison).
  std::vector<uint8_t> expected() const {
    std::vector<uint8_t> e(recvElems_ * ts_, zptest::kPoison);
    const Case& c = c_;
    const size_t cnt = c.count;
    auto red = [&](size_t j, size_t srcIdx) {
      reference(e.data(), j, c.type, c.op, n_, [&](int r) { return x(r, srcIdx); });
    };
    switch (c.coll) {
      case Coll::kAllReduce: for (size_t i = 0; i < cnt; i++) red(i, i); break;
      case Coll::kReduce: if (me_ == c.root) for (size_t i = 0; i < cnt; i++) red(i, i); break;
      case Coll::kBroadcast: for (size_t i = 0; i < cnt; i++) store(e.data(), i, c.type, (double)x(c.root, i)); break;
      case Coll::kAllGather:
        for (int r = 0; r < n_; r++)
          for (size_t i = 0; i < cnt; i++) store(e.data(), r * cnt + i, c.type, (double)x(r, i));
        break;
      case Coll::kAllGatherv:
        for (int r = 0; r < n_; r++)
          for (size_t i = 0; i < counts_[r]; i++) store(e.data(), displs_[r] + i, c.type, (double)x(r, i));
        break;
      case Coll::kReduceScatter: for (size_t i = 0; i < cnt; i++) red(i, me_ * cnt + i); break;
      case Coll::kReduceScatterv: for (size_t i = 0; i < counts_[me_]; i++) red(i, off_ + i); break;
    }
    return e;
  }

  std::string check() const {
    std::string where = "rank " + std::to_string(me_) + ", " + describe(c_) + ": ";
    bool recvDefined = c_.coll != Coll::kReduce || me_ == c_.root;
    std::vector<uint8_t> e = expected();
    if (recvDefined) {
      for (size_t b = 0; b < e.size(); b++)
        if (recv_[b] != e[b]) {
          char buf[200];
          snprintf(buf, sizeof(buf), "byte %zu (element %zu) is 0x%02x, expected 0x%02x", b, b / ts_, recv_[b], e[b]);
          return where + buf;
        }
    }
    if (c_.inPlace) {
      if (buf_->guardBytesWritten()) return where + "bytes outside the buffer were written";
      return "";
    }
    if (sbuf_->guardBytesWritten() || rbuf_->guardBytesWritten()) return where + "bytes outside the buffers were written";
    if (memcmp(send_, sendCopy_.data(), sendCopy_.size())) return where + "the send buffer was modified";
    if (!recvDefined && rbuf_->writtenBytes()) return where + "a non-root's receive buffer was written";
    return "";
  }

  // Nothing in the receive buffer was written (after a failed call).
  bool recvUntouched() const {
    if (c_.inPlace) return buf_->guardBytesWritten() == 0;
    return rbuf_->writtenBytes() == 0 && rbuf_->guardBytesWritten() == 0;
  }

 private:
  int me_, n_;
  Case c_;
  uint64_t seed_;
  size_t ts_ = 0, off_ = 0, sendElems_ = 0, recvElems_ = 0;
  std::vector<size_t> counts_, displs_;
  std::unique_ptr<GuardedBuffer> buf_, sbuf_, rbuf_;
  uint8_t* send_ = nullptr;
  uint8_t* recv_ = nullptr;
  std::vector<uint8_t> sendCopy_;
};

std::string runChecked(zpComm_t comm, int rank, int n, const Case& c, uint64_t seed) {
  CollRun run(rank, n, c, seed);
  zpResult_t r = run.call(comm);
  if (r != zpSuccess)
    return "rank " + std::to_string(rank) + ", " + describe(c) + ": " + zpGetErrorString(r) + ": " +
           zpGetLastError(comm);
  return run.check();
}

// ---- Every collective, datatype and op ----

struct Sweep {
  int nranks;
  const char* algo;  // ZP_COLL_ALGO
};
class CollSweep : public ::testing::TestWithParam<Sweep> {};

TEST_P(CollSweep, EveryCollectiveTypeOpAndCountExact) {
  Sweep s = GetParam();
  uint64_t seed = zptest::testCaseSeed();
  auto exits = zptest::runRanks(s.nranks, [&](int rank, int n, const zpUniqueId& id) {
    setenv("ZP_COLL_ALGO", s.algo, 1);
    zpComm_t comm = zptest::initComm(rank, n, id);
    int iter = 0, failures = 0;
    for (Coll coll : kAllColls)
      for (int t = 0; t < zpNumTypes; t++)
        for (int op = 0; op < (reducing(coll) ? (int)zpNumOps : 1); op++)
          for (size_t count : {0, 1, 13, 1009})
            for (bool inPlace : {false, true}) {
              Case c{coll, (zpDataType_t)t, (zpRedOp_t)op, count, inPlace, iter % n};
              std::string err = runChecked(comm, rank, n, c, seed + iter++);
              if (!err.empty() && failures++ < 5) ADD_FAILURE() << err;
            }
    // A prime count past the ring threshold (for ZP_COLL_ALGO=auto), for
    // every type, with sum and max.
    for (Coll coll : kAllColls)
      for (int t = 0; t < zpNumTypes; t++)
        for (zpRedOp_t op : {zpSum, zpMax}) {
          if (!reducing(coll) && op != zpSum) continue;
          Case c{coll, (zpDataType_t)t, op, 65537, iter % 2 == 0, iter % n};
          std::string err = runChecked(comm, rank, n, c, seed + iter++);
          if (!err.empty() && failures++ < 5) ADD_FAILURE() << err;
        }
    EXPECT_EQ(failures, 0);
    ZP_EXPECT_OK(zpBarrier(comm, nullptr));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }, 600);
  zptest::expectAllOk(exits);
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollSweep,
                         ::testing::Values(Sweep{2, "auto"}, Sweep{3, "auto"}, Sweep{4, "auto"}, Sweep{5, "auto"},
                                           Sweep{8, "auto"}, Sweep{2, "ring"}, Sweep{3, "ring"}, Sweep{5, "ring"},
                                           Sweep{8, "ring"}, Sweep{3, "tree"}, Sweep{5, "tree"}, Sweep{8, "tree"}),
                         [](const ::testing::TestParamInfo<Sweep>& i) {
                           return std::to_string(i.param.nranks) + "ranks_" + i.param.algo;
                         });

// ---- Large buffers: 64 MiB per rank ----

class CollLarge : public ::testing::TestWithParam<int> {};

TEST_P(CollLarge, SixtyFourMiBPerRank) {
  int nranks = GetParam();
  uint64_t seed = zptest::testCaseSeed();
  auto exits = zptest::runRanks(nranks, [&](int rank, int n, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, n, id);
    const size_t elems = (64u << 20) / sizeof(float);
    for (Case c : {Case{Coll::kAllReduce, zpFloat32, zpSum, elems, false, 0},
                   Case{Coll::kAllReduce, zpBfloat16, zpAvg, elems, true, 0},
                   Case{Coll::kReduceScatter, zpInt32, zpSum, elems / n, false, 0},
                   Case{Coll::kAllGather, zpFloat32, zpSum, elems / n, true, 0},
                   Case{Coll::kBroadcast, zpFloat64, zpSum, elems / 2, false, n - 1},
                   Case{Coll::kReduce, zpFloat32, zpMax, elems, false, n / 2}})
      EXPECT_EQ(runChecked(comm, rank, n, c, seed), "");
    ZP_EXPECT_OK(zpCommDestroy(comm));
  }, 600);
  zptest::expectAllOk(exits);
}
INSTANTIATE_TEST_SUITE_P(Ranks, CollLarge, ::testing::Values(2, 4, 5),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param) + "ranks"; });

// Through the shared-memory ring only (ZP_SHM_PROTO=copy): receives reduce
// fragment by fragment as they are copied out of the ring.
TEST(Collectives, CopyProtocolReducesFromTheRing) {
  uint64_t seed = zptest::testCaseSeed();
  auto exits = zptest::runRanks(4, [&](int rank, int n, const zpUniqueId& id) {
    zptest::setShmProto("copy");
    zpComm_t comm = zptest::initComm(rank, n, id);
    for (size_t count : {1u, 1009u, 1000003u})
      for (int t = 0; t < zpNumTypes; t++) {
        Case c{Coll::kAllReduce, (zpDataType_t)t, t % 2 ? zpSum : zpProd, count, t % 3 == 0, 0};
        EXPECT_EQ(runChecked(comm, rank, n, c, seed + t), "");
        Case r{Coll::kReduceScatter, (zpDataType_t)t, zpMin, count / 4 + 1, t % 2 == 0, 0};
        EXPECT_EQ(runChecked(comm, rank, n, r, seed + t), "");
      }
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

// Random floats, where the order of additions matters: the result must lie
// within the bound of any summation order, |err| <= (n-1) * eps * sum|x|
// (plus one rounding), and every rank must hold the same bits.
TEST(Collectives, RandomFloatSumsWithinTheBoundAndEqualOnEveryRank) {
  uint64_t seed = zptest::testCaseSeed();
  zptest::Shared<std::array<uint32_t, 8 * 4>> digests;
  auto exits = zptest::runRanks(5, [&](int rank, int n, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, n, id);
    int k = 0;
    for (size_t count : {7u, 100003u, 3000017u}) {
      std::vector<float> in(count), out(count);
      auto x = [&](int r, size_t i) { return (float)((double)(mix(seed + r * 977 + i) >> 11) / 9007199254740992.0 * 2 - 1); };
      for (size_t i = 0; i < count; i++) in[i] = x(rank, i);
      ZP_EXPECT_OK(zpAllReduce(in.data(), out.data(), count, zpFloat32, zpSum, comm, nullptr));
      double worst = 0;
      uint32_t h = 2166136261u;
      for (size_t i = 0; i < count; i++) {
        double exact = 0, mag = 0;
        for (int r = 0; r < n; r++) {
          exact += x(r, i);
          mag += std::fabs(x(r, i));
        }
        double bound = (n - 1) * 0x1p-24 * mag + 0x1p-24 * std::fabs(exact) + 1e-45;
        worst = std::max(worst, std::fabs(out[i] - exact) / bound);
        uint32_t bits;
        memcpy(&bits, &out[i], 4);
        h = (h ^ bits) * 16777619u;
      }
      EXPECT_LE(worst, 1.0) << "count " << count;
      (*digests)[rank * 4 + k++] = h;
      if (rank == 0) printf("[ info ] count %zu: largest error %.3f of the bound\n", count, worst);
    }
    ZP_EXPECT_OK(zpBarrier(comm, nullptr));
    for (int r = 0; r < n; r++)
      for (int j = 0; j < k; j++) EXPECT_EQ((*digests)[r * 4 + j], (*digests)[j]) << "rank " << r << " differs";
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

// ---- Groups ----

// Sends, receives and collectives in one group, on every rank: the
// point-to-point calls run first, then the collectives in call order.
TEST(Collectives, InsideGroupsWithSendRecv) {
  uint64_t seed = zptest::testCaseSeed();
  for (int nranks : {2, 3, 5}) {
    auto exits = zptest::runRanks(nranks, [&](int rank, int n, const zpUniqueId& id) {
      zpComm_t comm = zptest::initComm(rank, n, id);
      for (int it = 0; it < 4; it++) {
        CollRun ar(rank, n, Case{Coll::kAllReduce, zpFloat32, zpSum, 1009u + it * 100000u, it % 2 == 1, 0}, seed + it);
        CollRun ag(rank, n, Case{Coll::kAllGatherv, zpInt64, zpSum, 77, false, 0}, seed + it + 7);
        CollRun bc(rank, n, Case{Coll::kBroadcast, zpUint8, zpSum, 300000, false, it % n}, seed + it + 9);
        std::vector<int> out(1000, rank * 1000 + it), in(1000, -1);
        ZP_ASSERT_OK(zpGroupStart());
        ZP_EXPECT_OK(zpSend(out.data(), out.size(), zpInt32, (rank + 1) % n, comm, nullptr));
        ZP_EXPECT_OK(ar.call(comm));
        ZP_EXPECT_OK(ag.call(comm));
        ZP_EXPECT_OK(zpRecv(in.data(), in.size(), zpInt32, (rank + n - 1) % n, comm, nullptr));
        ZP_EXPECT_OK(bc.call(comm));
        ZP_EXPECT_OK(zpBarrier(comm, nullptr));
        ZP_EXPECT_OK(zpGroupEnd());
        EXPECT_EQ(ar.check(), "");
        EXPECT_EQ(ag.check(), "");
        EXPECT_EQ(bc.check(), "");
        EXPECT_EQ(in[999], ((rank + n - 1) % n) * 1000 + it);
      }
      ZP_EXPECT_OK(zpCommDestroy(comm));
    });
    zptest::expectAllOk(exits);
  }
}

// ---- Errors ----

// Every rank must return `code` (the odd rank out may return `ownCode`),
// with a message naming the ranks, and write nothing; then the communicator
// still works.
struct Mismatch {
  const char* name;
  std::function<zpResult_t(zpComm_t, int rank, int n, CollRun*)> call;  // a mismatched call
  const char* mentions;  // the message names this (besides the ranks)
  int oddRank;           // the rank whose call differs
  zpResult_t oddCode;    // what it returns
};

TEST(CollectiveErrors, MismatchesFailEveryRankAlikeWritingNothing) {
  uint64_t seed = zptest::testCaseSeed();
  const int n = 4;
  std::vector<Mismatch> cases = {
      {"count", [](zpComm_t c, int r, int, CollRun*) {
         std::vector<float> s(100, 1), d(100, 0);
         return zpAllReduce(s.data(), d.data(), r == 2 ? 99 : 100, zpFloat32, zpSum, c, nullptr);
       }, "count", 2, zpInvalidUsage},
      {"datatype", [](zpComm_t c, int r, int, CollRun*) {
         std::vector<float> s(100, 1), d(100, 0);
         return zpAllReduce(s.data(), d.data(), 100, r == 3 ? zpInt32 : zpFloat32, zpSum, c, nullptr);
       }, "datatype", 3, zpInvalidUsage},
      {"op", [](zpComm_t c, int r, int, CollRun*) {
         std::vector<float> s(100, 1), d(100, 0);
         return zpReduceScatter(s.data(), d.data(), 25, zpFloat32, r == 1 ? zpMax : zpSum, c, nullptr);
       }, "op", 1, zpInvalidUsage},
      {"root", [](zpComm_t c, int r, int, CollRun*) {
         std::vector<float> s(100, 1);
         return zpBroadcast(s.data(), s.data(), 100, zpFloat32, r == 2 ? 1 : 0, c, nullptr);
       }, "root", 2, zpInvalidUsage},
      {"collective", [](zpComm_t c, int r, int, CollRun*) {
         std::vector<float> s(400, 1), d(400, 0);
         if (r == 1) return zpAllGather(s.data(), d.data(), 100, zpFloat32, c, nullptr);
         return zpAllReduce(s.data(), d.data(), 100, zpFloat32, zpSum, c, nullptr);
       }, "called", 1, zpInvalidUsage},
      {"recvcounts", [](zpComm_t c, int r, int n, CollRun*) {
         std::vector<size_t> counts(n, 10);
         if (r == 3) counts[0] = 11;
         std::vector<float> s(100, 1), d(100, 0);
         return zpReduceScatterv(s.data(), d.data(), counts.data(), zpFloat32, zpSum, c, nullptr);
       }, "recvcounts", 3, zpInvalidUsage},
      {"NULL recvbuff on one rank", [](zpComm_t c, int r, int, CollRun*) {
         std::vector<float> s(100, 1), d(100, 0);
         return zpAllReduce(s.data(), r == 2 ? nullptr : d.data(), 100, zpFloat32, zpSum, c, nullptr);
       }, "invalid argument", 2, zpInvalidArgument},
      {"root out of range on one rank", [](zpComm_t c, int r, int n, CollRun*) {
         std::vector<float> s(100, 1), d(100, 0);
         return zpReduce(s.data(), d.data(), 100, zpFloat32, zpSum, r == 0 ? n : 0, c, nullptr);
       }, "invalid argument", 0, zpInvalidArgument},
      {"overlap that is not in place", [](zpComm_t c, int r, int, CollRun*) {
         std::vector<float> s(200, 1);
         return zpAllReduce(s.data(), r == 1 ? s.data() + 1 : s.data() + 100, 100, zpFloat32, zpSum, c, nullptr);
       }, "invalid argument", 1, zpInvalidArgument},
  };
  auto exits = zptest::runRanks(n, [&](int rank, int nr, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, nr, id);
    for (size_t i = 0; i < cases.size(); i++) {
      const Mismatch& m = cases[i];
      // The calls above write into their own vectors; a guarded buffer shows
      // that nothing is written for the count case's pattern too.
      CollRun guard(rank, nr, Case{Coll::kAllReduce, zpFloat32, zpSum, 100, false, 0}, seed);
      zp::clearLastError();
      zpResult_t r = m.call(comm, rank, nr, &guard);
      zpResult_t want = rank == m.oddRank ? m.oddCode : zpInvalidUsage;
      EXPECT_EQ(r, want) << m.name << " on rank " << rank << ": " << zpGetLastError(comm);
      std::string msg = zpGetLastError(comm);
      if (rank != m.oddRank || m.oddCode == zpInvalidUsage) {
        EXPECT_NE(msg.find("rank " + std::to_string(m.oddRank)), std::string::npos) << m.name << ": " << msg;
        EXPECT_NE(msg.find(m.mentions), std::string::npos) << m.name << ": " << msg;
      }
      if (rank == 0) printf("[ info ] %s: rank 0 says: %s\n", m.name, msg.c_str());
      // The communicator still works.
      EXPECT_EQ(runChecked(comm, rank, nr, Case{Coll::kAllReduce, zpInt32, zpSum, 1000, false, 0}, seed + i), "");
    }
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

// A mismatched count writes nothing, not even on the ranks that agree:
// every receive buffer keeps its poison.
TEST(CollectiveErrors, MismatchedCountWritesNoReceiveBuffer) {
  uint64_t seed = zptest::testCaseSeed();
  auto exits = zptest::runRanks(5, [&](int rank, int n, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, n, id);
    for (Coll coll : kAllColls) {
      size_t count = rank == 4 ? 300001 : 300000;
      if (coll == Coll::kAllGatherv || coll == Coll::kReduceScatterv) continue;  // their counts: below
      CollRun run(rank, n, Case{coll, zpFloat32, zpSum, count, false, 1}, seed);
      zpResult_t r = run.call(comm);
      EXPECT_EQ(r, zpInvalidUsage) << collName(coll) << ": " << zpGetLastError(comm);
      EXPECT_TRUE(run.recvUntouched()) << collName(coll) << ": rank " << rank << " wrote into its receive buffer";
    }
    // All-gatherv: rank 2 sends 1001 elements (and says so in its own
    // recvcounts), the others expect 1000 from it.
    std::vector<size_t> counts(n, 1000), displs(n);
    for (int p = 0; p < n; p++) displs[p] = p * 1100;
    GuardedBuffer recv(n * 1100 * 4);
    std::vector<float> send(1001, 1);
    if (rank == 2) counts[2] = 1001;
    zpResult_t r = zpAllGatherv(send.data(), counts[rank], recv.data(), counts.data(), displs.data(), zpFloat32, comm,
                                nullptr);
    EXPECT_EQ(r, zpInvalidUsage) << zpGetLastError(comm);
    EXPECT_EQ(recv.writtenBytes() + recv.guardBytesWritten(), 0u);
    ZP_EXPECT_OK(zpBarrier(comm, nullptr));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

TEST(CollectiveErrors, InvalidArgumentsOnEveryRank) {
  auto exits = zptest::runRanks(2, [&](int rank, int n, const zpUniqueId& id) {
    zpComm_t comm = zptest::initComm(rank, n, id);
    float a[8] = {0}, b[8] = {0};
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllReduce(a, b, 8, (zpDataType_t)42, zpSum, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllReduce(a, b, 8, zpFloat32, (zpRedOp_t)9, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllReduce(a, b, (size_t)-8, zpFloat32, zpSum, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpBroadcast(a, b, 8, zpFloat32, -1, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllGather(a, a + 1, 4, zpFloat32, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllGatherv(a, 4, b, nullptr, nullptr, zpFloat32, comm, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllReduce(a, b, 8, zpFloat32, zpSum, nullptr, nullptr));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpAllReduce(a, b, 8, zpFloat32, zpSum, comm, (zpStream_t)0x1));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpBarrier(nullptr, nullptr));
    // Reduce's recvbuff and broadcast's sendbuff matter on the root only.
    ZP_EXPECT_OK(zpReduce(a, rank == 0 ? b : nullptr, 8, zpFloat32, zpSum, 0, comm, nullptr));
    ZP_EXPECT_OK(zpBroadcast(rank == 1 ? a : nullptr, b, 8, zpFloat32, 1, comm, nullptr));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

// A rank killed before or during a collective: the others get zpRemoteError
// well before the timeout.
class CollKilled : public ::testing::TestWithParam<int> {};
TEST_P(CollKilled, SurvivorsGetRemoteErrorBeforeTheTimeout) {
  const int nranks = GetParam();
  uint64_t seed = zptest::testCaseSeed();
  const int victim = 1 + (int)(seed % (nranks - 1));
  auto exits = zptest::runRanks(nranks, [&](int rank, int n, const zpUniqueId& id) {
    zptest::setTimeoutSeconds(30);
    zpComm_t comm = zptest::initComm(rank, n, id);
    std::vector<float> s(8 << 20, 1.0f), d(8 << 20);
    for (int it = 0;; it++) {
      if (rank == victim && it == 3) {
        std::thread([] {
          usleep(2000);
          kill(getpid(), SIGKILL);
        }).detach();
      }
      auto start = std::chrono::steady_clock::now();
      size_t count = it % 2 ? s.size() : 100;
      zpResult_t r = it % 3 == 0 ? zpAllReduce(s.data(), d.data(), count, zpFloat32, zpSum, comm, nullptr)
                                 : zpAllGather(s.data(), d.data(), count / n, zpFloat32, comm, nullptr);
      if (r == zpSuccess) continue;
      EXPECT_NE(rank, victim);
      EXPECT_EQ(r, zpRemoteError) << zpGetLastError(comm);
      EXPECT_LT(zptest::secondsSince(start), 20.0);
      EXPECT_EQ(zpBarrier(comm, nullptr), zpRemoteError);
      break;
    }
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  for (int r = 0; r < nranks; r++)
    if (r != victim) EXPECT_TRUE(exits[r].ok()) << "rank " << r;
}
INSTANTIATE_TEST_SUITE_P(Ranks, CollKilled, ::testing::Values(3, 5),
                         [](const ::testing::TestParamInfo<int>& i) { return std::to_string(i.param) + "ranks"; });

}  // namespace
