// Stragglers located: the per-peer wait statistics (src/core/wait_stats.h)
// on their own, and through zpCommGetWaitReport on real ranks, one of which
// lags; the WARN lines that name a lagging rank and a call that waits long.
#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "src/core/wait_stats.h"
#include "tests/checks.h"
#include "tests/harness.h"

namespace {

// ---- WaitStats alone ----

// Arrivals of one call on rank 0 of 4: peer `late` comes lateUs after the
// others, which come at 1000 + their rank (microseconds).
std::vector<uint64_t> arrivals(int late, uint64_t lateUs) {
  std::vector<uint64_t> a = {0, 1001, 1002, 1003};
  if (late > 0) a[late] += lateUs;
  return a;
}

TEST(WaitStats, ALaggingPeerIsChargedAndNamedOnce) {
  zp::WaitStats s(4, 0, 10 * 1000);
  int named = -1, namings = 0;
  for (int call = 0; call < 100; call++) {
    int r = s.record(arrivals(2, 50 * 1000));
    if (r >= 0) {
      named = r;
      namings++;
    }
  }
  EXPECT_EQ(named, 2);
  EXPECT_EQ(namings, 1);
  int calls = 0;
  auto report = s.report(&calls);
  EXPECT_EQ(calls, 100);
  ASSERT_FALSE(report.empty());
  EXPECT_EQ(report[0].rank, 2);
  EXPECT_EQ(report[0].callsLast, 100);
  EXPECT_EQ(report[0].maxUs, 50 * 1000u - 1);  // 51002 us, after rank 3's 1003 us
  EXPECT_EQ(report[0].totalUs, 100 * (50 * 1000u - 1));
}

TEST(WaitStats, BalancedArrivalsNameNobody) {
  zp::WaitStats s(4, 0, 10 * 1000);
  for (int call = 0; call < 300; call++) {
    // Who comes last changes from call to call, by a few microseconds.
    std::vector<uint64_t> a = {0, 1000, 1000, 1000};
    a[1 + call % 3] += 5;
    EXPECT_EQ(s.record(a), -1) << call;
  }
  int calls = 0;
  for (const auto& e : s.report(&calls)) EXPECT_LE(e.maxUs, 5u) << e.rank;
}

TEST(WaitStats, ARecoveredPeerLeavesTheWindowAndIsNamedAgainIfItLagsAgain) {
  zp::WaitStats s(4, 0, 10 * 1000);
  int namings = 0;
  for (int call = 0; call < 100; call++) namings += s.record(arrivals(3, 20 * 1000)) == 3;
  EXPECT_EQ(namings, 1);
  for (int call = 0; call < 100; call++) EXPECT_EQ(s.record(arrivals(0, 0)), -1);
  int calls = 0;
  auto report = s.report(&calls);
  ASSERT_FALSE(report.empty());
  EXPECT_EQ(report[0].rank, 3);
  EXPECT_LT(report[0].maxUs, 10u);  // 1003 - 1002: the lag has left the window
  for (int call = 0; call < 100; call++) namings += s.record(arrivals(3, 20 * 1000)) == 3;
  EXPECT_EQ(namings, 2);
}

// A call in which this rank never waited is only counted (noteClean, the
// common small send/recv) and enters the window at the next record or
// report: the window, the namings and the recovery are those of recording
// each such call as one that charges nobody, over more than a window too.
TEST(WaitStats, CleanCallsCountedAtOnceActLikeRecordedOnes) {
  zp::WaitStats recorded(4, 0, 10 * 1000), counted(4, 0, 10 * 1000);
  const std::vector<uint64_t> nobodyLate = {5000, 1000, 1000, 1000};  // this rank came last
  int namings[2] = {0, 0};
  auto lag = [&](int calls) {
    for (int call = 0; call < calls; call++) {
      namings[0] += recorded.record(arrivals(3, 20 * 1000)) == 3;
      namings[1] += counted.record(arrivals(3, 20 * 1000)) == 3;
    }
  };
  auto same = [&](const char* when) {
    int calls[2] = {0, 0};
    auto a = recorded.report(&calls[0]), b = counted.report(&calls[1]);
    EXPECT_EQ(calls[0], calls[1]) << when;
    ASSERT_EQ(a.size(), b.size()) << when;
    for (size_t i = 0; i < a.size(); i++) {
      EXPECT_EQ(a[i].rank, b[i].rank) << when;
      EXPECT_EQ(a[i].callsLast, b[i].callsLast) << when;
      EXPECT_EQ(a[i].totalUs, b[i].totalUs) << when;
    }
    EXPECT_EQ(namings[0], namings[1]) << when;
  };
  lag(60);
  same("after the lag");
  for (int k : {30, 250}) {
    for (int call = 0; call < k; call++) {
      EXPECT_EQ(recorded.record(nobodyLate), -1);
      counted.noteClean();
    }
    same(k == 30 ? "after 30 clean calls" : "after 250 clean calls");
    lag(60);  // named again only after it recovered: after the 250, not the 30
    same("after the second lag");
  }
  EXPECT_EQ(namings[1], 2);
}

// With one peer, the wait is charged against this rank's own entry; a peer
// that came before it is charged nothing.
TEST(WaitStats, OnePeerIsChargedForWhatItCameAfterThisRank) {
  zp::WaitStats s(2, 0, 10 * 1000);
  int namings = 0;
  for (int call = 0; call < 100; call++) namings += s.record({1000, 1000 + 30 * 1000}) == 1;
  EXPECT_EQ(namings, 1);
  int calls = 0;
  auto report = s.report(&calls);
  ASSERT_EQ(report.size(), 1u);
  EXPECT_EQ(report[0].rank, 1);
  EXPECT_EQ(report[0].totalUs, 100 * 30 * 1000u);
  zp::WaitStats first(2, 0, 10 * 1000);  // the peer came first: this rank lags, not it
  for (int call = 0; call < 100; call++) EXPECT_EQ(first.record({1000 + 30 * 1000, 1000}), -1);
  EXPECT_TRUE(first.report(&calls).empty());
}

// A peer that came last because its previous call ran longer (more bytes
// to move in a skewed alltoallv) was busy in the library: it is charged no
// more than the time it spent outside before the call beyond the peer
// before it (whatever the ranks did between the calls). A peer that slept
// outside is charged in full.
TEST(WaitStats, APeerIsChargedNoMoreThanItsTimeOutsideBeyondThePeerBeforeIt) {
  const uint64_t unknown = zp::WaitStats::kUnknown;
  int calls = 0;
  // Back to back, or 5 ms of compute between the calls: rank 3 came 50 ms
  // after rank 2 but spent 10 or 20 us more outside.
  for (const std::vector<uint64_t>& outside :
       {std::vector<uint64_t>{0, 20, 30, 40}, std::vector<uint64_t>{5000, 5000, 5000, 5020}}) {
    zp::WaitStats busy(4, 0, 10 * 1000);
    for (int call = 0; call < 100; call++) EXPECT_EQ(busy.record(arrivals(3, 50 * 1000), &outside), -1) << call;
    auto report = busy.report(&calls);
    ASSERT_FALSE(report.empty());
    EXPECT_EQ(report[0].rank, 3);
    EXPECT_EQ(report[0].maxUs, outside[3] - outside[2]);
  }
  // It slept 50 ms more than the others: charged what it came after rank 2.
  zp::WaitStats sleeper(4, 0, 10 * 1000);
  const std::vector<uint64_t> slept = {5000, 5000, 5000, 55000};
  int namings = 0;
  for (int call = 0; call < 100; call++) namings += sleeper.record(arrivals(3, 50 * 1000), &slept) == 3;
  EXPECT_EQ(namings, 1);
  EXPECT_EQ(sleeper.report(&calls)[0].maxUs, 50 * 1000u);  // its 50 ms outside beyond rank 2's
  // Not said (the first call): charged in full.
  zp::WaitStats unsaid(4, 0, 10 * 1000);
  const std::vector<uint64_t> none(4, unknown);
  namings = 0;
  for (int call = 0; call < 100; call++) namings += unsaid.record(arrivals(3, 50 * 1000), &none) == 3;
  EXPECT_EQ(namings, 1);
  EXPECT_EQ(unsaid.report(&calls)[0].maxUs, 50 * 1000u + 1);  // 51003 us, after rank 2's 1002 us
}

// One long wait (the first call, whose time outside nobody knows, after
// a longer setup) and then calls in which the peer comes last by
// microseconds: it is not named, however the long wait lifts its average.
TEST(WaitStats, OneLongWaitDoesNotNameAPeerThatComesLastByMicroseconds) {
  zp::WaitStats s(4, 0, 10 * 1000);
  EXPECT_EQ(s.record(arrivals(3, 800 * 1000)), -1);
  for (int call = 0; call < 40; call++) EXPECT_EQ(s.record(arrivals(3, 5)), -1) << call;
  int calls = 0;
  EXPECT_EQ(s.report(&calls)[0].callsLast, 41);
}

// This rank's own time outside: from the end of its last recorded call.
TEST(WaitStats, TimeOutsideRunsFromTheLastCallsEnd) {
  zp::WaitStats s(2, 0, 10 * 1000);
  EXPECT_EQ(s.outsideBefore(5000), zp::WaitStats::kUnknown);
  s.callEnded(5000);
  EXPECT_EQ(s.outsideBefore(5000), 0u);
  EXPECT_EQ(s.outsideBefore(7500), 2500u);
}

TEST(WaitStats, ThresholdZeroNamesNobodyButStillReports) {
  zp::WaitStats s(4, 0, 0);
  for (int call = 0; call < 100; call++) EXPECT_EQ(s.record(arrivals(1, 50 * 1000)), -1);
  int calls = 0;
  auto report = s.report(&calls);
  ASSERT_FALSE(report.empty());
  EXPECT_EQ(report[0].rank, 1);
}

// Two statistics that saw the same calls: the same window, the same
// peers charged, the same tallies.
void expectSameReports(zp::WaitStats& x, zp::WaitStats& y) {
  int callsX = 0, callsY = 0;
  auto a = x.report(&callsX), b = y.report(&callsY);
  EXPECT_EQ(callsX, callsY);
  ASSERT_EQ(a.size(), b.size());
  ASSERT_FALSE(a.empty());
  for (size_t i = 0; i < a.size(); i++) {
    EXPECT_EQ(a[i].rank, b[i].rank);
    EXPECT_EQ(a[i].callsLast, b[i].callsLast);
    EXPECT_EQ(a[i].totalUs, b[i].totalUs);
    EXPECT_EQ(a[i].maxUs, b[i].maxUs);
  }
}

// A call that heard from some peers only (a receive's sources), listed,
// as the same call with every other peer's arrival 0: the same charges,
// the same names. A peer listed twice (two receives from it) is one arrival.
TEST(WaitStats, AListedCallIsTheFullCallWithTheOthersFirst) {
  const int n = 8;
  zp::WaitStats full(n, 3, 10 * 1000), listed(n, 3, 10 * 1000);
  std::mt19937_64 rng(std::random_device{}());
  for (int call = 0; call < 400; call++) {
    std::vector<uint64_t> at(n, 0);
    std::vector<int> peers;
    const int k = 1 + (int)(rng() % 4);
    for (int i = 0; i < k; i++) {
      int p = (int)(rng() % n);
      if (p == 3) continue;
      peers.push_back(p);
      if (rng() % 2) peers.push_back(p);  // listed twice
      at[p] = 1000 + rng() % (call < 200 ? 100 : 100 * 1000);
    }
    at[3] = 1000 + rng() % 200;  // this rank's entry
    if (peers.empty()) continue;
    std::vector<uint64_t> others0 = at;
    ASSERT_EQ(full.record(others0), listed.record(at, peers)) << call;
  }
  expectSameReports(full, listed);
}

// A call that heard from one peer, recorded without a vector of every
// rank (recordOne, most receives), as the same call listed: the same
// charges, names and report, with and without the time outside; and
// recorded later (recordLater), the same report.
TEST(WaitStats, AOnePeerCallIsTheListedCall) {
  const int n = 6, self = 2;
  // later: the same calls through recordLater, its batch entered at
  // random (recordPending), when full, or before the next call or report.
  zp::WaitStats listed(n, self, 10 * 1000), one(n, self, 10 * 1000), later(n, self, 10 * 1000);
  std::mt19937_64 rng(std::random_device{}());
  int named = 0;
  for (int call = 0; call < 600; call++) {
    // In the second half rank 4 lags in most calls: it is named.
    const int p = call >= 300 && rng() % 4 ? 4 : (int)(rng() % n);
    if (p == self) {  // a call that heard from nobody (the listed form has no peer)
      EXPECT_EQ(listed.record(std::vector<uint64_t>(n, 0), std::vector<int>{}), one.recordOne(p, 0, 1000));
      later.recordOne(p, 0, 1000);
      continue;
    }
    std::vector<uint64_t> at(n, 0), outside(n, zp::WaitStats::kUnknown);
    at[p] = rng() % 8 ? 1000 + rng() % 100 + (p == 4 && call >= 300 ? 20 * 1000 : 0) : 0;  // 0: its start not seen
    at[self] = 1000 + rng() % 200;
    const bool withOutside = rng() % 2;
    if (withOutside) {
      outside[p] = rng() % (40 * 1000);
      if (rng() % 2) outside[self] = rng() % (20 * 1000);
    }
    const int a = listed.record(at, std::vector<int>{p}, withOutside ? &outside : nullptr);
    const int b = one.recordOne(p, at[p], at[self], withOutside ? &outside : nullptr);
    ASSERT_EQ(a, b) << call;
    named += a >= 0;
    if (withOutside)
      later.recordOne(p, at[p], at[self], &outside);
    else
      later.recordLater(p, at[p], at[self]);
    if (rng() % 3 == 0) later.recordPending();
    if (rng() % 4 == 0) {
      listed.noteClean();
      one.noteClean();
      later.noteClean();
    }
  }
  expectSameReports(listed, one);
  expectSameReports(listed, later);
  EXPECT_GT(named, 0);  // the late half names someone: the names were compared, not only -1s
}

// A call recorded later keeps its place: the clean calls after it come
// after it in the window, so a window's worth of them pushes it out.
TEST(WaitStats, ACallRecordedLaterKeepsItsPlaceBeforeLaterCalls) {
  zp::WaitStats s(2, 0, 10 * 1000);
  s.recordLater(1, 5000, 1000);  // rank 1 came 4 ms after this rank entered
  for (int call = 0; call < zp::WaitStats::kWindow - 1; call++) s.noteClean();
  int calls = 0;
  auto report = s.report(&calls);
  ASSERT_EQ(report.size(), 1u);  // still in the window: it is the oldest call
  EXPECT_EQ(report[0].rank, 1);
  EXPECT_EQ(report[0].totalUs, 4000u);
  s.noteClean();
  EXPECT_TRUE(s.report(&calls).empty());  // a window of calls after it
  EXPECT_EQ(calls, zp::WaitStats::kWindow);
}

// A report, and a call recorded at once, see the calls waiting in a batch
// first: nothing recorded is left out of what the report counts.
TEST(WaitStats, ABatchedCallIsInTheNextReport) {
  zp::WaitStats s(3, 0, 10 * 1000);
  s.recordLater(1, 5000, 1000);  // rank 1 came 4 ms after this rank entered
  int calls = 0;
  auto report = s.report(&calls);
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(report.size(), 1u);
  EXPECT_EQ(report[0].rank, 1);
  EXPECT_EQ(report[0].totalUs, 4000u);
  s.recordLater(1, 3000, 1000);
  s.recordOne(2, 4000, 1000);  // after the batched call: both are in the window
  report = s.report(&calls);
  EXPECT_EQ(calls, 3);
  ASSERT_EQ(report.size(), 2u);
  EXPECT_EQ(report[0].rank, 1);
  EXPECT_EQ(report[0].totalUs, 6000u);
  EXPECT_EQ(report[1].rank, 2);
  EXPECT_EQ(report[1].totalUs, 3000u);
}

// A late call (by half the threshold or more) waits for no batch: its
// peer is named (the WARN line) at the call that names it, as recordOne
// says at once.
TEST(WaitStats, ALateCallRecordedLaterNamesItsPeerAtOnce) {
  zp::WaitStats one(2, 0, 10 * 1000), later(2, 0, 10 * 1000);
  int namings = 0;
  for (int call = 0; call < 60; call++) {
    const uint64_t entry = 1000 + 100 * 1000 * (uint64_t)call, arrival = entry + 20 * 1000;  // rank 1: 20 ms late
    const bool named = one.recordOne(1, arrival, entry) == 1;
    testing::internal::CaptureStderr();
    later.recordLater(1, arrival, entry);
    const std::string log = testing::internal::GetCapturedStderr();
    EXPECT_EQ(named, log.find("rank 1 came last") != std::string::npos) << call << ": " << log;
    namings += named;
  }
  EXPECT_EQ(namings, 1);
}

// ---- Real ranks ----

// In a rank: its stderr, where the log goes, into a file of dir.
void logTo(const std::string& dir, int rank) {
  int fd = open((dir + "/rank" + std::to_string(rank) + ".log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(dup2(fd, 2), 2);
  close(fd);
}

// The text of every rank's log in dir (logTo).
std::string logsIn(const std::string& dir) {
  std::string all;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream f(dir + "/" + e->d_name);
      std::stringstream ss;
      ss << f.rdbuf();
      all += ss.str();
    }
    closedir(d);
  }
  return all;
}

struct LagRun {
  std::string logs;
  std::vector<zptest::RankExit> exits;
};

// The call every rank makes 100 times: what a lagging rank lags before.
enum class Calls { kAllReduce, kAlltoallv, kSendRecvGroup };

// One call of `kind` on `count` floats per peer, its results checked.
void oneCall(Calls kind, zpComm_t comm, int rank, int n, int call, size_t count) {
  if (kind == Calls::kAllReduce) {
    std::vector<float> send(count), recv(count, -1.0f);
    for (size_t i = 0; i < count; i++) send[i] = (float)(rank + call + i % 7);
    ZP_ASSERT_OK(zpAllReduce(send.data(), recv.data(), count, zpFloat32, zpSum, comm, nullptr));
    for (size_t i = 0; i < count; i++)
      ASSERT_EQ(recv[i], (float)(n * (n - 1) / 2 + n * (call + i % 7))) << "call " << call << " element " << i;
    return;
  }
  // Every rank sends `count` floats to every rank (itself too for the
  // alltoallv): element i for rank p is rank * 1000 + p + call + i % 5.
  std::vector<float> send(count * n), recv(count * n, -1.0f);
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < count; i++) send[p * count + i] = (float)(rank * 1000 + p + call + i % 5);
  if (kind == Calls::kAlltoallv) {
    std::vector<size_t> counts(n, count), displs(n);
    for (int p = 0; p < n; p++) displs[p] = p * count;
    ZP_ASSERT_OK(zpAlltoallv(send.data(), counts.data(), displs.data(), recv.data(), counts.data(), displs.data(),
                             zpFloat32, comm, nullptr));
  } else {
    ZP_ASSERT_OK(zpGroupStart());
    for (int p = 0; p < n; p++) {
      if (p == rank) continue;
      ZP_ASSERT_OK(zpSend(send.data() + p * count, count, zpFloat32, p, comm, nullptr));
      ZP_ASSERT_OK(zpRecv(recv.data() + p * count, count, zpFloat32, p, comm, nullptr));
    }
    ZP_ASSERT_OK(zpGroupEnd());
  }
  for (int p = 0; p < n; p++)
    for (size_t i = 0; i < count && (p != rank || kind == Calls::kAlltoallv); i++)
      ASSERT_EQ(recv[p * count + i], (float)(p * 1000 + rank + call + i % 5)) << "call " << call << " from " << p;
}

// `nranks` ranks run 100 calls of `kind` on `count` floats, rank `laggard`
// (if >= 0) sleeping 50 ms before each; every rank then checks its wait report.
LagRun runWithLaggard(int laggard, size_t count, int nranks = 4, Calls kind = Calls::kAllReduce) {
  char dir[] = "/tmp/zp_wait_report_XXXXXX";
  EXPECT_NE(mkdtemp(dir), nullptr);
  LagRun out;
  out.exits = zptest::runRanks(nranks, [&](int rank, int n, const zpUniqueId& id) {
    logTo(dir, rank);
    zpComm_t comm;
    ZP_ASSERT_OK(zpCommInitRank(&comm, n, id, rank));
    for (int call = 0; call < 100; call++) {
      if (rank == laggard) usleep(50 * 1000);
      oneCall(kind, comm, rank, n, call, count);
      if (testing::Test::HasFatalFailure()) return;
    }
    zpWaitEntry_t entries[4];
    int nEntries = -1, nCalls = -1;
    ZP_ASSERT_OK(zpCommGetWaitReport(comm, entries, 4, &nEntries, &nCalls));
    EXPECT_EQ(nCalls, 100);
    if (laggard >= 0 && rank != laggard) {
      ASSERT_GE(nEntries, 1);
      EXPECT_EQ(entries[0].rank, laggard);
      EXPECT_GE(entries[0].callsLast, 90);
      EXPECT_GE(entries[0].totalWaitSec / entries[0].callsLast, 0.030);
    } else {
      // Nobody (or, on the laggard, nobody it waits for) stands out as the
      // WARN line's rule asks: last in most calls, late on average. A rank
      // preempted now and then on this 2-core machine may come last in a
      // few calls by much more.
      for (int i = 0; i < nEntries && i < 4; i++)
        EXPECT_FALSE(2 * entries[i].callsLast > nCalls && entries[i].totalWaitSec / entries[i].callsLast > 0.010)
            << "rank " << entries[i].rank << ": last in " << entries[i].callsLast << " calls, "
            << entries[i].totalWaitSec << " s";
    }
    // Only the count asked.
    int again = -1;
    ZP_EXPECT_OK(zpCommGetWaitReport(comm, nullptr, 0, &again, &nCalls));
    EXPECT_EQ(again, nEntries);
    ZP_EXPECT_ERROR(zpInvalidArgument, zpCommGetWaitReport(comm, nullptr, 1, &again, &nCalls));
    ZP_EXPECT_ERROR(zpInvalidArgument, zpCommGetWaitReport(comm, entries, 4, nullptr, &nCalls));
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  out.logs = logsIn(dir);
  std::string cmd = std::string("rm -rf ") + dir;
  EXPECT_EQ(system(cmd.c_str()), 0);
  return out;
}

int countOf(const std::string& text, const std::string& part) {
  int n = 0;
  for (size_t at = text.find(part); at != std::string::npos; at = text.find(part, at + 1)) n++;
  return n;
}

// Small all-reduces (their header check fused into their one round) and
// large ones (a header round of their own) both count.
TEST(WaitReport, ALaggingRankIsNamedByEveryRankThatWaitsForIt) {
  for (size_t count : {16u, 64u * 1024u}) {
    LagRun r = runWithLaggard(2, count);
    zptest::expectAllOk(r.exits);
    // One WARN line on each of the three ranks that wait for rank 2.
    EXPECT_EQ(countOf(r.logs, "rank 2 came last in"), 3) << count << " floats:\n" << r.logs;
  }
}

// zpAlltoallv (routing off: its messages' first bytes, or the counts ahead
// of them; small and large) and a group of sends and receives with every
// peer: every rank that waits for the lagging one names it, as for an
// all-reduce. (The routed zpAlltoallv, which gathers its count rows first,
// is Multinode.ARankThatLagsBeforeRoutedAlltoallvsIsNamed.)
TEST(WaitReport, ALaggingRankIsNamedForAlltoallvAndSendRecv) {
  for (Calls kind : {Calls::kAlltoallv, Calls::kSendRecvGroup})
    for (size_t count : {16u, 32u * 1024u}) {
      LagRun r = runWithLaggard(1, count, 4, kind);
      zptest::expectAllOk(r.exits);
      EXPECT_EQ(countOf(r.logs, "rank 1 came last in"), 3) << (int)kind << ", " << count << " floats:\n" << r.logs;
      EXPECT_EQ(countOf(r.logs, "came last in"), 3) << r.logs;
    }
}

TEST(WaitReport, NobodyIsNamedWithoutALaggardInAlltoallvOrSendRecv) {
  for (Calls kind : {Calls::kAlltoallv, Calls::kSendRecvGroup}) {
    LagRun r = runWithLaggard(-1, 32u * 1024u, 4, kind);
    zptest::expectAllOk(r.exits);
    EXPECT_EQ(countOf(r.logs, "came last in"), 0) << (int)kind << ":\n" << r.logs;
  }
}

// A single receive outside a group: the rank that waits names the sender.
TEST(WaitReport, AReceiveNamesTheSenderThatLags) {
  char dir[] = "/tmp/zp_wait_recv_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  auto exits = zptest::runRanks(2, [&](int rank, int n, const zpUniqueId& id) {
    logTo(dir, rank);
    zpComm_t comm;
    ZP_ASSERT_OK(zpCommInitRank(&comm, n, id, rank));
    std::vector<float> buf(1024);
    for (int call = 0; call < 100; call++) {
      if (rank == 1) {
        usleep(30 * 1000);
        for (size_t i = 0; i < buf.size(); i++) buf[i] = (float)(call + i);
        ZP_ASSERT_OK(zpSend(buf.data(), buf.size(), zpFloat32, 0, comm, nullptr));
      } else {
        ZP_ASSERT_OK(zpRecv(buf.data(), buf.size(), zpFloat32, 1, comm, nullptr));
        for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], (float)(call + i));
      }
    }
    zpWaitEntry_t e[2];
    int nEntries = -1, nCalls = -1;
    ZP_ASSERT_OK(zpCommGetWaitReport(comm, e, 2, &nEntries, &nCalls));
    if (rank == 0) {  // its 100 receives; the sender, whose sends heard nothing, none
      EXPECT_EQ(nCalls, 100);
      ASSERT_EQ(nEntries, 1);
      EXPECT_EQ(e[0].rank, 1);
      EXPECT_GE(e[0].callsLast, 90);
      EXPECT_GE(e[0].totalWaitSec / e[0].callsLast, 0.020);
    } else {
      EXPECT_EQ(nCalls, 0);
      EXPECT_EQ(nEntries, 0);
    }
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
  std::string logs = logsIn(dir);
  EXPECT_EQ(countOf(logs, "rank 0: rank 1 came last in"), 1) << logs;
  EXPECT_EQ(countOf(logs, "came last in"), 1) << logs;
  std::string cmd = std::string("rm -rf ") + dir;
  EXPECT_EQ(system(cmd.c_str()), 0);
}

// A receive's stamps are the call's own: after 40 receives that waited
// 30 ms for their sender, 100 receives whose message was there first
// (the receiver comes 3 ms late) charge the sender nothing. Stamps left
// from an earlier call would charge it that call's wait again.
TEST(WaitReport, AReceiveAfterOnesThatWaitedChargesOnlyItsOwnWait) {
  auto exits = zptest::runRanks(2, [&](int rank, int n, const zpUniqueId& id) {
    zpComm_t comm;
    ZP_ASSERT_OK(zpCommInitRank(&comm, n, id, rank));
    std::vector<float> buf(1024);
    for (int call = 0; call < 140; call++) {
      const bool senderLate = call < 40;
      if (rank == 1) {
        if (senderLate) usleep(30 * 1000);
        for (size_t i = 0; i < buf.size(); i++) buf[i] = (float)(call + i);
        ZP_ASSERT_OK(zpSend(buf.data(), buf.size(), zpFloat32, 0, comm, nullptr));
        if (!senderLate) ZP_ASSERT_OK(zpRecv(buf.data(), 1, zpFloat32, 0, comm, nullptr));  // in step
      } else {
        if (!senderLate) usleep(3 * 1000);
        ZP_ASSERT_OK(zpRecv(buf.data(), buf.size(), zpFloat32, 1, comm, nullptr));
        for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], (float)(call + i));
        if (!senderLate) ZP_ASSERT_OK(zpSend(buf.data(), 1, zpFloat32, 1, comm, nullptr));
      }
    }
    if (rank == 0) {
      zpWaitEntry_t e[2];
      int nEntries = -1, nCalls = -1;
      ZP_ASSERT_OK(zpCommGetWaitReport(comm, e, 2, &nEntries, &nCalls));
      EXPECT_EQ(nCalls, 100);
      for (int i = 0; i < nEntries; i++) EXPECT_LT(e[i].totalWaitSec, 0.005) << "rank " << e[i].rank;
    }
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

// A receive's entry is stamped where it first waits, and only for its own
// call: rank 1's receives find their 1 MiB there (it comes 5 ms late) and
// never wait, and its sends then wait 10 ms for rank 0's receive. Those
// waits record nothing; had one stamped the entry the last receive left
// unstamped, the next receive would charge rank 0 about 15 ms.
TEST(WaitReport, AWaitThatRecordsNothingLeavesNoEntryForTheNextReceive) {
  auto exits = zptest::runRanks(2, [&](int rank, int n, const zpUniqueId& id) {
    zpComm_t comm;
    ZP_ASSERT_OK(zpCommInitRank(&comm, n, id, rank));
    std::vector<float> buf(256 * 1024);
    const int kCalls = 30;
    for (int call = 0; call < kCalls; call++) {
      const int peer = 1 - rank;
      auto fill = [&](int tag) {
        for (size_t i = 0; i < buf.size(); i++) buf[i] = (float)(tag * 7 + i % 1000);
      };
      auto check = [&](int tag) {
        for (size_t i = 0; i < buf.size(); i++) ASSERT_EQ(buf[i], (float)(tag * 7 + i % 1000)) << i;
      };
      if (rank == 0) {
        fill(call);
        ZP_ASSERT_OK(zpSend(buf.data(), buf.size(), zpFloat32, peer, comm, nullptr));
        usleep(10 * 1000);
        std::fill(buf.begin(), buf.end(), -1.0f);
        ZP_ASSERT_OK(zpRecv(buf.data(), buf.size(), zpFloat32, peer, comm, nullptr));
        check(call + 1);
      } else {
        usleep(5 * 1000);
        std::fill(buf.begin(), buf.end(), -1.0f);
        ZP_ASSERT_OK(zpRecv(buf.data(), buf.size(), zpFloat32, peer, comm, nullptr));
        check(call);
        fill(call + 1);
        ZP_ASSERT_OK(zpSend(buf.data(), buf.size(), zpFloat32, peer, comm, nullptr));
      }
    }
    if (rank == 1) {
      zpWaitEntry_t e[2];
      int nEntries = -1, nCalls = -1;
      ZP_ASSERT_OK(zpCommGetWaitReport(comm, e, 2, &nEntries, &nCalls));
      EXPECT_EQ(nCalls, kCalls);
      // The stale entry charged about 15 ms a call (0.45 s in all); a rank
      // descheduled on a loaded machine a few ms in all.
      for (int i = 0; i < nEntries; i++) EXPECT_LT(e[i].totalWaitSec, 0.1) << "rank " << e[i].rank;
    }
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
}

// Two ranks: the one that waits names the other.
TEST(WaitReport, OfTwoRanksTheOneThatWaitsNamesTheOther) {
  LagRun r = runWithLaggard(1, 16, 2);
  zptest::expectAllOk(r.exits);
  EXPECT_EQ(countOf(r.logs, "rank 0: rank 1 came last in"), 1) << r.logs;
  EXPECT_EQ(countOf(r.logs, "came last in"), 1) << r.logs;
}

TEST(WaitReport, NobodyIsNamedWithoutALaggard) {
  LagRun r = runWithLaggard(-1, 16);
  zptest::expectAllOk(r.exits);
  EXPECT_EQ(countOf(r.logs, "came last in"), 0) << r.logs;
}

// A call that waits longer than ZP_WAIT_WARN says so, naming itself, its
// opCount (the same on every rank) and the rank it waits for, long before
// ZP_TIMEOUT: an all-reduce, an alltoallv, a receive, each the second call
// (opCount 1) after a barrier.
// A skewed zpAlltoallv, calls back to back: rank 3 exchanges 24 MiB with
// every peer, the others 4 KiB among themselves, so rank 3 finishes each
// call last and enters the next one last. It was busy in the library, not
// lagging: nobody names it (its count rows say it spent no more time
// outside than the others). The last call's every byte is checked.
TEST(WaitReport, ARankWithMoreBytesToMoveIsNotNamed) {
  char dir[] = "/tmp/zp_wait_report_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const int calls = 60;
  auto exits = zptest::runRanks(4, [&](int rank, int n, const zpUniqueId& id) {
    logTo(dir, rank);
    zpComm_t comm;
    ZP_ASSERT_OK(zpCommInitRank(&comm, n, id, rank));
    zptest::CountMatrix m(n, std::vector<size_t>(n, 4096));
    for (int p = 0; p < n; p++) m[3][p] = m[p][3] = 24u << 20;
    zptest::AlltoallvRun a(rank, m, zpUint8, 11);
    for (int call = 0; call + 1 < calls; call++)
      ZP_ASSERT_OK(zpAlltoallv(a.sendBuffer().data(), a.sendCounts(), a.sendDispls(), a.recvBuffer().data(),
                               a.recvCounts(), a.recvDispls(), zpUint8, comm, nullptr));
    ZP_ASSERT_OK(a.run(comm));
    EXPECT_EQ(a.check(), "");
    zpWaitEntry_t entries[4];
    int nEntries = -1, nCalls = -1;
    ZP_ASSERT_OK(zpCommGetWaitReport(comm, entries, 4, &nEntries, &nCalls));
    EXPECT_EQ(nCalls, calls);
    ZP_EXPECT_OK(zpCommDestroy(comm));
  });
  zptest::expectAllOk(exits);
  const std::string logs = logsIn(dir);
  EXPECT_EQ(countOf(logs, "came last in"), 0) << logs;
  EXPECT_EQ(system((std::string("rm -rf ") + dir).c_str()), 0);
}

TEST(WaitReport, ALongWaitIsNamedBeforeTheTimeout) {
  for (const char* fn : {"zpAllReduce", "zpAlltoallv", "zpRecv"}) {
    char dir[] = "/tmp/zp_wait_warn_XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    const std::string which = fn;
    auto exits = zptest::runRanks(2, [&](int rank, int n, const zpUniqueId& id) {
      logTo(dir, rank);
      setenv("ZP_WAIT_WARN", "0.3", 1);
      zpComm_t comm;
      ZP_ASSERT_OK(zpCommInitRank(&comm, n, id, rank));
      ZP_ASSERT_OK(zpBarrier(comm, nullptr));
      if (rank == 1) usleep(1200 * 1000);
      float x[2] = {1.0f + rank, 3.0f + rank}, y[2] = {0, 0};
      const size_t counts[2] = {1, 1}, displs[2] = {0, 1};
      if (which == "zpAllReduce") {
        ZP_ASSERT_OK(zpAllReduce(x, y, 1, zpFloat32, zpSum, comm, nullptr));
        EXPECT_EQ(y[0], 3.0f);
      } else if (which == "zpAlltoallv") {
        ZP_ASSERT_OK(zpAlltoallv(x, counts, displs, y, counts, displs, zpFloat32, comm, nullptr));
        EXPECT_EQ(y[0], rank == 0 ? 1.0f : 3.0f);
        EXPECT_EQ(y[1], rank == 0 ? 2.0f : 4.0f);
      } else if (rank == 0) {
        ZP_ASSERT_OK(zpRecv(y, 1, zpFloat32, 1, comm, nullptr));
        EXPECT_EQ(y[0], 2.0f);
      } else {
        ZP_ASSERT_OK(zpSend(x, 1, zpFloat32, 0, comm, nullptr));
      }
      ZP_EXPECT_OK(zpCommDestroy(comm));
    });
    zptest::expectAllOk(exits);
    std::string logs = logsIn(dir);
    EXPECT_EQ(countOf(logs, "rank 0: " + which + " (opCount 1) has waited 0.3 s for rank(s) 1 (ZP_WAIT_WARN)"), 1)
        << logs;
    EXPECT_EQ(countOf(logs, "has waited"), 1) << logs;
    std::string cmd = std::string("rm -rf ") + dir;
    EXPECT_EQ(system(cmd.c_str()), 0);
  }
}

}  // namespace
