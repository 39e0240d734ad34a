// The C API for batch plans (include/zeppelin.h, "Batch plans"): wraps
// zp::plan::planBatch and hands out its results as plain arrays; part of the
// C face, beside the handles it resolves (src/api/handles.h).
#include <algorithm>
#include <memory>
#include <thread>
#include <string>
#include <stdexcept>
#include <vector>

#include "include/zeppelin.h"
#include "src/api/handles.h"
#include "src/core/log.h"
#include "src/plan/layout.h"
#include "src/plan/planner.h"

struct zpBatchPlan {
  zp::plan::BatchPlan plan;
  int nranks = 0;
  // The layouts as C segments: [0] attention, [1] linear; per rank.
  std::vector<std::vector<zpSegment_t>> segs[2];
  zpLayout layouts[2];  // the same as layout objects, for remaps
};

namespace {

zpBatchPlan* wrap(zp::plan::BatchPlan plan, int nranks) {
  auto* p = new zpBatchPlan;
  p->plan = std::move(plan);
  p->nranks = nranks;
  const zp::plan::Layout* l[2] = {&p->plan.attention, &zp::plan::linearLayout(p->plan)};
  for (int w = 0; w < 2; ++w) {
    p->segs[w].resize(nranks);
    for (int r = 0; r < nranks; ++r)
      for (const auto& s : l[w]->ranks[r]) p->segs[w][r].push_back({s.seq, s.start, s.count});
  }
  return p;
}

// The cluster model of a communicator: its nodes, ranks and NICs, with the
// NIC rate it measured (if any) and the default rates of the model
// otherwise. The planner numbers ranks node by node, so the communicator's
// must be too.
zpResult_t clusterFromComm(zpComm_t comm, zp::plan::ClusterModel* c) {
  zp::CommShape shape;
  ZP_CHECK(zp::commShape(comm, "zpPlanBatch", &shape));
  const int n = (int)shape.nodeOf.size();
  int nodes = 0;
  for (int r = 0; r < n; r++) nodes = std::max(nodes, shape.nodeOf[r] + 1);
  const int rpn = n / nodes;
  for (int r = 0; r < n; r++)
    if (n % nodes || shape.nodeOf[r] != r / rpn)
      return zp::fail(zpInvalidArgument,
                      "zpPlanBatch: the communicator's ranks are not numbered node by node with the same count on "
                      "every node (rank %d is on node %d): pass a zpClusterModel_t",
                      r, shape.nodeOf[r]);
  c->nodes = nodes;
  c->ranksPerNode = rpn;
  c->nicsPerNode = std::max(1, shape.nicsPerNode);
  if (shape.nicBitsPerSec > 0) c->nicGbps = shape.nicBitsPerSec / 1e9;
  return zpSuccess;
}

// Runs one of the planner's calls for fn: the planner's refusal of its input
// (std::invalid_argument) is the caller's zpInvalidArgument with its reason,
// less a leading "strip"; anything else, out of memory included, goes on to
// the entry point's failFromException.
template <class Call>
zpResult_t planCall(const char* fn, const char* strip, Call call) {
  try {
    call();
    return zpSuccess;
  } catch (const std::invalid_argument& e) {
    const std::string why = e.what();
    const size_t n = std::string(strip).size();
    return zp::fail(zpInvalidArgument, "%s: %s", fn, why.compare(0, n, strip) == 0 ? why.c_str() + n : why.c_str());
  }
}

// zpPlanBatch's input, checked, as the planner takes it (fn names the
// entry point in messages).
zpResult_t planInput(const char* fn, int nseqs, const int64_t* seqLens, const zpAttnShape_t* shape,
                     const zpClusterModel_t* cluster, zpComm_t comm, zp::plan::AttnShape* sh,
                     zp::plan::ClusterModel* c) {
  if (nseqs < 1) return zp::fail(zpInvalidArgument, "%s: empty batch (nseqs %d)", fn, nseqs);
  if (!seqLens || !shape) return zp::fail(zpInvalidArgument, "%s: seqLens or shape is NULL", fn);
  if (!cluster && !comm) return zp::fail(zpInvalidArgument, "%s: give a cluster model or a communicator", fn);
  sh->qHeads = shape->qHeads;
  sh->kvHeads = shape->kvHeads;
  sh->headDim = shape->headDim;
  sh->elemBytes = shape->elemBytes;
  if (cluster) {
    c->nodes = cluster->nodes;
    c->ranksPerNode = cluster->ranksPerNode;
    c->nicsPerNode = cluster->nicsPerNode;
    c->nicGbps = cluster->nicGbps;
    c->intraNodeGBps = cluster->intraNodeGBps;
    c->tflops = cluster->tflops;
    c->efficiency = cluster->efficiency;
    return zpSuccess;
  }
  return clusterFromComm(comm, c);
}

}  // namespace

zpResult_t zpPlanBatch(zpBatchPlan_t* plan, int nseqs, const int64_t* seqLens,
                              const zpAttnShape_t* shape, const zpClusterModel_t* cluster,
                              zpComm_t comm) try {
  if (!plan) return zp::fail(zpInvalidArgument, "zpPlanBatch: plan is NULL");
  *plan = nullptr;
  zp::plan::AttnShape sh;
  zp::plan::ClusterModel c;
  ZP_CHECK(planInput("zpPlanBatch", nseqs, seqLens, shape, cluster, comm, &sh, &c));
  return planCall("zpPlanBatch", "planBatch: ", [&] {
    *plan = wrap(zp::plan::planBatch(std::vector<int64_t>(seqLens, seqLens + nseqs), shape->causal != 0, sh, c),
                 c.ranks());
  });
} catch (...) {
  return zp::failFromException("zpPlanBatch");
}

// A plan being made on a thread of its own (zpPlanBatchAhead): the thread
// writes the plan or the planner's refusal; zpPlanAheadWait reads them
// after joining it.
struct zpPlanAhead {
  std::thread thread;
  zp::plan::BatchPlan plan;
  int nranks = 0;
  bool refused = false, failed = false;
  std::string why;
};

zpResult_t zpPlanBatchAhead(zpPlanAhead_t* ahead, int nseqs, const int64_t* seqLens, const zpAttnShape_t* shape,
                            const zpClusterModel_t* cluster, zpComm_t comm) try {
  if (!ahead) return zp::fail(zpInvalidArgument, "zpPlanBatchAhead: ahead is NULL");
  *ahead = nullptr;
  zp::plan::AttnShape sh;
  zp::plan::ClusterModel c;
  ZP_CHECK(planInput("zpPlanBatchAhead", nseqs, seqLens, shape, cluster, comm, &sh, &c));
  auto a = std::make_unique<zpPlanAhead>();
  a->nranks = c.ranks();
  zpPlanAhead* raw = a.get();
  // The thread plans from copies: the caller's arrays may change once this
  // returns.
  a->thread = std::thread([raw, lens = std::vector<int64_t>(seqLens, seqLens + nseqs), causal = shape->causal != 0,
                           sh, c] {
    try {
      raw->plan = zp::plan::planBatch(lens, causal, sh, c);
    } catch (const std::invalid_argument& e) {
      raw->refused = true;
      raw->why = e.what();
    } catch (const std::exception& e) {
      raw->failed = true;
      raw->why = e.what();
    }
  });
  *ahead = a.release();
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpPlanBatchAhead");
}

zpResult_t zpPlanAheadWait(zpPlanAhead_t ahead, zpBatchPlan_t* plan) try {
  if (!ahead) return zp::fail(zpInvalidArgument, "zpPlanAheadWait: ahead is NULL");
  std::unique_ptr<zpPlanAhead> a(ahead);
  a->thread.join();
  if (!plan) return zp::fail(zpInvalidArgument, "zpPlanAheadWait: plan is NULL (the plan is dropped)");
  *plan = nullptr;
  const std::string strip = "planBatch: ";
  const char* why = a->why.compare(0, strip.size(), strip) == 0 ? a->why.c_str() + strip.size() : a->why.c_str();
  if (a->refused) return zp::fail(zpInvalidArgument, "zpPlanBatchAhead: %s", why);
  if (a->failed) return zp::fail(zpInternalError, "zpPlanBatchAhead: %s", why);
  *plan = wrap(std::move(a->plan), a->nranks);
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpPlanAheadWait");
}

zpResult_t zpPlanCreate(zpBatchPlan_t* plan, int nseqs, const int64_t* seqLens, int causal, int nranks,
                               int ranksPerNode, const size_t* ringOffsets, const int* ringRanks) try {
  if (!plan) return zp::fail(zpInvalidArgument, "zpPlanCreate: plan is NULL");
  *plan = nullptr;
  if (nseqs < 1) return zp::fail(zpInvalidArgument, "zpPlanCreate: empty batch (nseqs %d)", nseqs);
  if (!seqLens || !ringOffsets || !ringRanks)
    return zp::fail(zpInvalidArgument, "zpPlanCreate: seqLens, ringOffsets or ringRanks is NULL");
  if (nranks < 1 || ranksPerNode < 0)
    return zp::fail(zpInvalidArgument, "zpPlanCreate: %d ranks, %d per node", nranks, ranksPerNode);
  // Every offset is checked before any ring is read: ringRanks holds
  // ringOffsets[nseqs] entries, and a middle offset beyond that must be
  // refused, not read (fuzz_layout found the read).
  for (int s = 0; s < nseqs; ++s)
    if (ringOffsets[s + 1] < ringOffsets[s] || ringOffsets[s + 1] - ringOffsets[s] > size_t(nranks))
      return zp::fail(zpInvalidArgument, "zpPlanCreate: ringOffsets[%d..%d] = %zu..%zu is not a ring of at most %d ranks",
                      s, s + 1, ringOffsets[s], ringOffsets[s + 1], nranks);
  std::vector<std::vector<int>> rings(nseqs);
  for (int s = 0; s < nseqs; ++s) rings[s].assign(ringRanks + ringOffsets[s], ringRanks + ringOffsets[s + 1]);
  return planCall("zpPlanCreate", "", [&] {
    *plan = wrap(zp::plan::planFromRings(std::vector<int64_t>(seqLens, seqLens + nseqs), causal != 0, rings, nranks,
                                         ranksPerNode),
                 nranks);
  });
} catch (...) {
  return zp::failFromException("zpPlanCreate");
}

zpResult_t zpPlanDestroy(zpBatchPlan_t plan) try {
  delete plan;
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpPlanDestroy");
}

zpResult_t zpPlanSequence(zpBatchPlan_t plan, int64_t seq, int* cls, int* nranks, const int** ranks) try {
  if (!plan || !cls || !nranks || !ranks)
    return zp::fail(zpInvalidArgument, "zpPlanSequence: plan, cls, nranks or ranks is NULL");
  if (seq < 0 || seq >= int64_t(plan->plan.seqs.size()))
    return zp::fail(zpInvalidArgument, "zpPlanSequence: sequence %lld out of range [0, %zu)", (long long)seq,
                    plan->plan.seqs.size());
  const auto& s = plan->plan.seqs[seq];
  *cls = int(s.cls);
  *nranks = int(s.ranks.size());
  *ranks = s.ranks.data();
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpPlanSequence");
}

zpResult_t zpPlanRankSegments(zpBatchPlan_t plan, zpLayoutKind_t kind, int rank, const zpSegment_t** segs,
                              size_t* n) try {
  if (!plan || !segs || !n) return zp::fail(zpInvalidArgument, "zpPlanRankSegments: plan, segs or n is NULL");
  if (kind != zpAttentionLayout && kind != zpLinearLayout)
    return zp::fail(zpInvalidArgument, "zpPlanRankSegments: kind %d is not zpAttentionLayout or zpLinearLayout",
                    (int)kind);
  if (rank < 0 || rank >= plan->nranks)
    return zp::fail(zpInvalidArgument, "zpPlanRankSegments: rank %d out of range [0, %d)", rank, plan->nranks);
  *segs = plan->segs[kind][rank].data();
  *n = plan->segs[kind][rank].size();
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpPlanRankSegments");
}

zpResult_t zpPlanGetInfo(zpBatchPlan_t plan, int* nranks, int* nseqs, const int64_t** seqLens, int* causal) try {
  if (!plan) return zp::fail(zpInvalidArgument, "zpPlanGetInfo: plan is NULL");
  if (nranks) *nranks = plan->nranks;
  if (nseqs) *nseqs = (int)plan->plan.attention.seqLens.size();
  if (seqLens) *seqLens = plan->plan.attention.seqLens.data();
  if (causal) *causal = plan->plan.causal ? 1 : 0;
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpPlanGetInfo");
}

zpResult_t zpPlanGetLayout(zpBatchPlan_t plan, zpLayoutKind_t kind, zpLayout_t* layout) try {
  if (!plan || !layout) return zp::fail(zpInvalidArgument, "zpPlanGetLayout: NULL argument");
  if (kind != zpAttentionLayout && kind != zpLinearLayout)
    return zp::fail(zpInvalidArgument, "zpPlanGetLayout: kind %d is not zpAttentionLayout or zpLinearLayout", (int)kind);
  zpLayout& l = plan->layouts[kind];
  if (l.offsets.empty()) {  // made on first use
    zp::plan::fillLayout(&l, kind == zpAttentionLayout ? plan->plan.attention : zp::plan::linearLayout(plan->plan));
    l.ownedByPlan = true;
  }
  *layout = &l;
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpPlanGetLayout");
}

zpResult_t zpPlanRingOrder(zpBatchPlan_t plan, const int64_t** seqs, int* nseqs) try {
  if (!plan || !seqs || !nseqs) return zp::fail(zpInvalidArgument, "zpPlanRingOrder: plan, seqs or nseqs is NULL");
  *seqs = plan->plan.order.data();
  *nseqs = (int)plan->plan.order.size();
  return zpSuccess;
} catch (...) {
  return zp::failFromException("zpPlanRingOrder");
}

zpResult_t zpPlanSetRingOrder(zpBatchPlan_t plan, int nseqs, const int64_t* seqs) try {
  if (!plan) return zp::fail(zpInvalidArgument, "zpPlanSetRingOrder: plan is NULL");
  if (nseqs < 0) return zp::fail(zpInvalidArgument, "zpPlanSetRingOrder: nseqs %d is negative", nseqs);
  if (!seqs && nseqs > 0) return zp::fail(zpInvalidArgument, "zpPlanSetRingOrder: seqs is NULL");
  return planCall("zpPlanSetRingOrder", "", [&] {
    zp::plan::setOrder(&plan->plan, nseqs ? std::vector<int64_t>(seqs, seqs + nseqs) : std::vector<int64_t>());
  });
} catch (...) {
  return zp::failFromException("zpPlanSetRingOrder");
}
