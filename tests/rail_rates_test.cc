// Measured rails (src/route/rail_rates.h), fed counters as the node's ranks
// would write them: when a rail is named slow, when it recovers, how often
// a flapping rail can change state, and what is heard from another node.
#include <gtest/gtest.h>

#include <cstdint>

#include "src/route/rail_rates.h"

namespace zp {
namespace {

// A node whose rails move bytes at given rates: every tick, each busy rail
// gets its bytes acknowledged, as the node's shared counters would show.
struct Feed {
  RailRates rates;
  uint64_t now = 1000000;
  uint64_t acked[RailRates::kRails] = {};
  explicit Feed(double slowFraction = 0.5) : rates(slowFraction) {}
  // Runs `ms` of busy time with rail k at mbps[k] Mbit/s (0: idle).
  void run(const double* mbps, int rails, int ms) {
    for (int t = 0; t < ms; t += 10) {
      now += RailRates::kTickUs;
      for (int k = 0; k < rails; k++) {
        if (mbps[k] > 0) acked[k] += (uint64_t)(mbps[k] * 1e6 / 8 * 0.01);
        rates.observe(k, mbps[k] > 0 ? 1 : 0, acked[k], now);
      }
    }
  }
};

TEST(RailRates, ASlowRailIsNamedAfterConfirmingSamplesAndScaled) {
  Feed f;
  const double mbps[4] = {1000, 1000, 100, 1000};
  f.run(mbps, 4, 400);  // one sample each: not yet confirmed
  EXPECT_EQ(f.rates.factor(2), 1.0);
  f.run(mbps, 4, 2000);
  EXPECT_NEAR(f.rates.factor(2), 0.1, 0.01);
  for (int k : {0, 1, 3}) EXPECT_EQ(f.rates.factor(k), 1.0) << k;
  std::vector<RailRates::Change> changes = f.rates.takeChanges();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].rail, 2);
  EXPECT_TRUE(changes[0].slow);
  EXPECT_NEAR(changes[0].bitsPerSec, 100e6, 5e6);
  EXPECT_NEAR(changes[0].othersBitsPerSec, 1000e6, 50e6);
  EXPECT_TRUE(f.rates.takeNews());
  EXPECT_FALSE(f.rates.takeNews());
  EXPECT_NEAR(RailRates::reportFactor(f.rates.report(), 2), 0.1, 0.01);
  EXPECT_EQ(RailRates::reportFactor(f.rates.report(), 0), 1.0);
  EXPECT_TRUE(f.rates.railState(2).slow);
}

TEST(RailRates, EvenRailsAreNeverNamed) {
  Feed f;
  // Uneven but within the fraction, and one rail idle.
  const double mbps[4] = {900, 1000, 700, 0};
  f.run(mbps, 4, 10000);
  EXPECT_TRUE(f.rates.takeChanges().empty());
  for (int k = 0; k < 4; k++) EXPECT_EQ(f.rates.factor(k), 1.0) << k;
}

// Named back on its first two fast samples (one sample every 200 ms here,
// the first after the change still part slow): judged on the smoothed rate,
// halfway from its slow rate, the first fast one would not count.
TEST(RailRates, ARecoveredRailGetsItsShareBackOnItsFirstTwoFastSamples) {
  Feed f;
  const double slow[4] = {1000, 1000, 100, 1000}, healthy[4] = {1000, 1000, 1000, 1000};
  f.run(slow, 4, 3000);
  ASSERT_LT(f.rates.factor(2), 0.2);
  f.rates.takeChanges();
  f.run(healthy, 4, 300);  // the mixed sample and one fast one
  EXPECT_LT(f.rates.factor(2), 1.0);
  f.run(healthy, 4, 150);  // the second fast one
  EXPECT_EQ(f.rates.factor(2), 1.0);
  f.run(healthy, 4, 2000);
  EXPECT_EQ(f.rates.factor(2), 1.0);
  std::vector<RailRates::Change> changes = f.rates.takeChanges();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_FALSE(changes[0].slow);
}

// Its peers' samples fall while it still moves its slow rate (a skewed or
// CPU-bound call: rails measured at 200 Mbit/s): compared with them alone it
// would be named back (100 of 200 is above 1.4 x 0.3), and its share would
// become 100/200 of its nominal rate.
TEST(RailRates, ASlowRailIsNotNamedBackNorGivenMoreWhilePeersLookSlower) {
  Feed f(0.3);  // ZP_RAIL_SLOW's default
  const double slow[4] = {1000, 1000, 100, 1000}, peersLower[4] = {200, 200, 100, 200};
  f.run(slow, 4, 3000);
  ASSERT_NEAR(f.rates.factor(2), 0.1, 0.02);
  f.rates.takeChanges();
  f.run(peersLower, 4, 5000);
  EXPECT_NEAR(f.rates.factor(2), 0.1, 0.02);
  EXPECT_TRUE(f.rates.takeChanges().empty());
  // It recovers: named back (peers still lower), its full share.
  const double recovered[4] = {200, 200, 1000, 200};
  f.run(recovered, 4, 1000);
  EXPECT_EQ(f.rates.factor(2), 1.0);
  std::vector<RailRates::Change> changes = f.rates.takeChanges();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_FALSE(changes[0].slow);
}

TEST(RailRates, AFlappingRailIsNamedABoundedNumberOfTimes) {
  Feed f;
  const double slow[4] = {1000, 1000, 100, 1000}, healthy[4] = {1000, 1000, 1000, 1000};
  // A tenth of its rate and back every 500 ms for 30 s (the confirming
  // samples and the dwell together bound the changes; judged on every
  // sample, it would change about every phase).
  int changes = 0;
  const int seconds = 30;
  for (int i = 0; i < 2 * seconds; i++) {
    f.run(i % 2 ? healthy : slow, 4, 500);
    changes += (int)f.rates.takeChanges().size();
  }
  EXPECT_LE(changes, (int)(seconds * 1000000 / RailRates::kDwellUs) / 2);
}

TEST(RailRates, AStuckRailIsSlow) {
  Feed f;
  const double mbps[4] = {1000, 1000, 1000, 1000};
  f.run(mbps, 4, 1000);
  // Rail 1 has bytes on it but nothing is acknowledged.
  for (int t = 0; t < 10000; t += 10) {
    f.now += RailRates::kTickUs;
    for (int k = 0; k < 4; k++) {
      if (k != 1) f.acked[k] += 1250000;
      f.rates.observe(k, 1, f.acked[k], f.now);
    }
  }
  EXPECT_LT(f.rates.factor(1), 0.5);
}

TEST(RailRates, OffMeansNominal) {
  Feed f(0);
  const double mbps[4] = {1000, 1000, 100, 1000};
  f.run(mbps, 4, 5000);
  EXPECT_EQ(f.rates.factor(2), 1.0);
  EXPECT_TRUE(f.rates.takeChanges().empty());
  EXPECT_TRUE(f.rates.ownView().empty());
}

TEST(RailRates, AViewHeardIsFollowedOnlyWithoutOwnEvidence) {
  Feed measuring;
  const double mbps[4] = {1000, 1000, 100, 1000};
  measuring.run(mbps, 4, 3000);
  RailView view = measuring.rates.ownView();
  ASSERT_FALSE(view.empty());
  EXPECT_EQ(view.slowMask, 1u << 2);

  RailRates quiet(0.5);  // sends nothing itself
  quiet.heard(0, view, 5000000);
  EXPECT_NEAR(quiet.factor(2), 0.1, 0.02);
  std::vector<RailRates::Change> changes = quiet.takeChanges();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].farNode, 0);
  EXPECT_FALSE(quiet.takeNews());  // only own verdicts are passed on

  Feed busy;  // measures its rails itself, all healthy
  const double even[4] = {1000, 1000, 1000, 1000};
  busy.run(even, 4, 1000);
  busy.rates.heard(0, view, busy.now);
  EXPECT_EQ(busy.rates.factor(2), 1.0);
}

TEST(RailRates, OneRailAloneIsNotJudged) {
  Feed f;
  const double mbps[1] = {10};
  f.run(mbps, 1, 5000);
  EXPECT_EQ(f.rates.factor(0), 1.0);
  EXPECT_TRUE(f.rates.ownView().empty());
}

}  // namespace
}  // namespace zp
