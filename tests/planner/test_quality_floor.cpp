// The planner's quality floor (planner/quality_floor.hpp): H below 25 only with
// an outer lr the quality grid found safe there.
#include <gtest/gtest.h>

#include "planner/quality_floor.hpp"
#include "tools/planner/cli.hpp"

using namespace geoloco::planner;

TEST(QualityFloor, ALargeOuterLrRaisesTheFloorToTwentyFive) {
  EXPECT_EQ(quality_h_floor(10, "nesterov", 0.7), 10);
  EXPECT_EQ(quality_h_floor(10, "nesterov", 1.0), 25);
  EXPECT_EQ(quality_h_floor(10, "sgd", 0.9), 25);
  EXPECT_EQ(quality_h_floor(40, "nesterov", 1.0), 40);    // a higher configured floor stands
  EXPECT_EQ(quality_h_floor(10, "sparseloco", 1.0), 10);  // not what the grid measured
  EXPECT_EQ(quality_h_floor(10, "adam", 1.0), 10);
}

TEST(QualityFloor, TheNoteNamesTheRiskOnlyWhereTheGridSawIt) {
  const auto n = outer_lr_note("nesterov", 1.0, 10);
  ASSERT_TRUE(n.has_value());
  EXPECT_NE(n->find("2.92 against 2.01"), std::string::npos) << *n;
  EXPECT_FALSE(outer_lr_note("nesterov", 0.7, 10).has_value());
  EXPECT_FALSE(outer_lr_note("nesterov", 1.0, 25).has_value());
  EXPECT_FALSE(outer_lr_note("sparseloco", 1.0, 10).has_value());
}

// geoloco budget --outer-lr applies the same floor as outer.plan: auto.
TEST(QualityFloor, BudgetTakesTheOuterLr) {
  geoloco::planner::BudgetFlags f;
  f.params = "124M";
  f.rtt_ms = "1";
  f.rate_gbps = "100";
  f.step_time = "0.3";
  f.h_floor = "5";
  EXPECT_NE(run_budget(f).find("(H >= 5)"), std::string::npos);
  f.outer_lr = 0.7;
  EXPECT_NE(run_budget(f).find("(H >= 5)"), std::string::npos);
  f.outer_lr = 1.0;
  EXPECT_NE(run_budget(f).find("(H >= 25)"), std::string::npos) << run_budget(f);
}
