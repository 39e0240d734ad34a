// Scheduling a candidate placement as the executor will run it (the
// planner's idle-aware list scheduling, src/plan/planner.cc's candidates):
// which ranks each sequence's ring takes, the order attention runs in, and
// the modelled makespans of its passes. Internal to the planner.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <utility>
#include <vector>

#include "src/plan/cost_model.h"
#include "src/plan/planner.h"

namespace zp::plan {

// Ranks of a planned cluster (as many as a topology file may describe).
constexpr int64_t kMaxPlanRanks = int64_t(1) << 22;
// Throws std::invalid_argument naming `fn` and the first bad length unless
// every length is from 1 to 2^40 and their sum at most 2^48
// (plan_rings.cc).
void validateLengths(const std::vector<int64_t>& lens, const char* fn);

struct Split {
  int G = 1;
  SeqClass cls = SeqClass::Local;
  bool operator==(const Split& o) const { return G == o.G && cls == o.cls; }
};

// Sorts `order` (some order of 0..m-1) as std::stable_sort of 0..m-1 by
// `before` would: the planner sorts thousands of sequences for every
// candidate, and a guess of that order made once is usually right, so it is
// checked first (the order is unique: equivalent sequences in index order).
template <class Before>
void stableSortFromGuess(std::vector<size_t>& order, Before before) {
  for (size_t k = 1; k < order.size(); ++k) {
    const size_t a = order[k - 1], b = order[k];
    if (before(a, b) || (!before(b, a) && a < b)) continue;
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(), before);
    return;
  }
}

// One candidate placement, scheduled: the ranks of each sequence, the order
// attention runs in (by planned forward start) and the modelled makespans of
// attention's forward and backward passes.
struct Schedule {
  // Sequence i runs on ranks[first[i]] .. ranks[first[i + 1] - 1]: flat, as
  // every candidate has thousands of sequences and most are never built
  // into a plan.
  std::vector<size_t> first;
  std::vector<int> ranks;
  const int* ringBegin(size_t i) const { return ranks.data() + first[i]; }
  const int* ringEnd(size_t i) const { return ranks.data() + first[i + 1]; }
  // Every sequence's ranks as planFromRings takes them.
  std::vector<std::vector<int>> rings() const {
    std::vector<std::vector<int>> out(first.size() - 1);
    for (size_t i = 0; i < out.size(); ++i) out[i].assign(ringBegin(i), ringEnd(i));
    return out;
  }
  std::vector<int64_t> order;
  double forward = 0, backward = 0;
  // Seconds the busiest rank's linear layers take beyond the mean per step,
  // for a placement that keeps them on the attention layout.
  double linearExcess = 0;
};

// The rings of a cap's splits placed largest first, each starting when the
// last of its ranks is free (see schedule.cc). byLength: the sequences
// longest first, ties in index order.
Schedule schedule(const std::vector<int64_t>& lens, const ClusterModel& c, const PlanOptions& opt,
                  const std::vector<Split>& splits, const std::vector<double>& piece, const std::vector<double>& back,
                  const std::vector<size_t>& byLength);
// A ring size a sequence may take and the time one rank spends on it under
// that size, forward and backward (planner.cc's split options, cheap to
// costly links).
struct SplitOption {
  Split split;
  double seconds, backward;
};
// The options of a sequence past those the planner stores: it stores each
// sequence's list only up to where no cap can pick a later option (each
// later one is slower than the fastest stored, see planner.cc), but
// scheduleToTarget may still take one, as a ring over more nodes may start
// sooner; it makes them here, while its bound says one could be taken.
struct OptionTail {
  // more[i]: sequence i's full list goes on past the stored one.
  std::vector<char> more;
  // Sequence i's option on a ring of G ranks across nodes, if its full
  // list has one (false: the list ends before it).
  std::function<bool(size_t i, int G, SplitOption* out)> option;
  // A lower bound of sequence i's seconds on any ring of G or more ranks
  // across nodes: non-decreasing in G.
  std::function<double(size_t i, int G)> floor;
};
// A sequence on a ring of this split, with the times the executor runs it in.
SplitOption splitOption(int64_t len, bool causal, Split split, const AttnShape& shape, const ClusterModel& c);
// A lower bound of the seconds one rank spends on a sequence (ringSeconds)
// on any ring of G or more ranks across nodes, on Zeppelin's inter-node
// link; non-decreasing in G.
double acrossFloor(int64_t len, int G, const AttnShape& shape, const ClusterModel& c);
// The rings a sequence may run on, from cheap to costly links (see
// split_options.cc); with `more`, stored only up to where no cap can pick a
// later one, *more saying whether the full list goes on.
std::vector<SplitOption> splitOptions(int64_t len, bool causal, const AttnShape& shape, const ClusterModel& c,
                                      double minCap = 0, bool* more = nullptr);
// Every sequence's options, stored as splitOptions(..., more) stores them,
// into *options, and the tail that makes the rest. The tail refers to lens,
// shape and c: they must outlive it.
OptionTail optionTail(const std::vector<int64_t>& lens, bool causal, const AttnShape& shape, const ClusterModel& c,
                      double minCap, std::vector<std::vector<SplitOption>>* options);
// The rings sized to meet a target makespan (moldable list scheduling): the
// sequences, most work first, each where it can start soonest on the
// cheapest ring size that still ends by `target`, else on the size that ends
// soonest. Unlike schedule(), a ring's size follows the time left where it
// lands, so rings fill the schedule instead of all taking a cap's pieces.
// options[i]: sequence i's split options (rings no wider than
// opt.maxRingNodes nodes), stored up to where `tail` goes on (null: the
// full lists). byWork: the sequences by their whole time, most first.
Schedule scheduleToTarget(const std::vector<int64_t>& lens, const ClusterModel& c, const PlanOptions& opt,
                          const std::vector<std::vector<SplitOption>>& options, double target,
                          const std::vector<size_t>& byWork, const OptionTail* tail = nullptr);
// Sets a schedule's makespans to those of its order run forward (and
// reversed, backward) with these seconds per sequence: a ring starts when
// the last of its ranks is free.
void retime(Schedule* s, const std::vector<double>& forward, const std::vector<double>& backward, int n);
// Candidates for a plan that keeps the linear layers on its attention
// layout: rings sized to targets as scheduleToTarget does, with each
// option's time including the linear layers of the tokens it leaves on its
// ranks; each with its screening score (quick) into *fits (schedule.cc).
void jointFits(const std::vector<int64_t>& lens, const ClusterModel& c, const PlanOptions& opt,
               const std::vector<std::vector<SplitOption>>& options, const std::vector<size_t>& byWork,
               const OptionTail& tail, bool thorough, const std::function<double(const Schedule&)>& quick,
               std::vector<std::pair<double, Schedule>>* fits);
// Fixed groups of g ranks, sequences whole in a group (DP x CP placement):
// the makespans, and each sequence's group into *groupOf; the ranks and
// order only by groupRanks.
Schedule groupSchedule(const std::vector<int64_t>& lens, bool causal, const AttnShape& shape, const ClusterModel& c,
                       const PlanOptions& opt, int g, const std::vector<size_t>& byLength, std::vector<int>* groupOf);
// The ring a sequence takes in a group of g ranks: the group's first
// groupRing ranks (a sequence too short for the whole ring runs on its
// first ranks; its ring crosses nodes only if they do).
int groupRing(int64_t len, bool causal, int g);
// A group schedule's ranks and order from each sequence's group: the
// planner screens group sizes without them and adds them to the few it
// scores in full.
void groupRanks(Schedule* s, const std::vector<int64_t>& lens, bool causal, int g, const std::vector<int>& groupOf);

}  // namespace zp::plan
