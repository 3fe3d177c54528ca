// The outer loop's per-step decisions (schedule.hpp), a pure function: the step, the plan in
// force and the rounds in flight in, the actions out -- checked step by step against what the
// schedule must do, without a transport, a thread or a clock.
#include <gtest/gtest.h>

#include "outer_optimizer/schedule.hpp"

using namespace geoloco::outer;

namespace {

StepState state(int64_t step, int64_t H, int fragments, bool overlapped = false) {
  StepState s;
  s.step = step;
  s.total_steps = 100;
  s.interval = H;
  s.overlapped = overlapped;
  for (int f = 0; f < fragments; ++f) {
    FragmentClock c;
    c.offset = (static_cast<int64_t>(f + 1) * H / fragments) % H;
    s.fragments.push_back(c);
  }
  return s;
}

std::string rest(const StepState& s) { return describe(decide_step(s).rest); }

}  // namespace

// One fragment, blocking: a sync at every multiple of H and nothing in between.
TEST(Schedule, BlockingSyncsAtEveryMultipleOfH) {
  for (int64_t step = 1; step <= 12; ++step) {
    const auto p = decide_step(state(step, 4, 1));
    EXPECT_TRUE(p.merges.empty());
    EXPECT_EQ(describe(p.rest), step % 4 == 0 ? "Sync 0" : "") << "step " << step;
  }
}

// Streaming fragments at offsets (f + 1) H / F mod H: F = 2, H = 4 syncs fragment 0 at 2, 6,
// 10 and fragment 1 at 4, 8, 12; a plan's epoch shifts them by its start.
TEST(Schedule, FragmentsSyncAtStaggeredOffsetsFromTheEpochStart) {
  EXPECT_EQ(rest(state(2, 4, 2)), "Sync 0");
  EXPECT_EQ(rest(state(4, 4, 2)), "Sync 1");
  EXPECT_EQ(rest(state(5, 4, 2)), "");
  EXPECT_EQ(rest(state(6, 4, 2)), "Sync 0");
  auto s = state(7, 4, 2);
  s.epoch_start = 5;  // a plan applied at step 5: its offsets count from there
  EXPECT_EQ(rest(s), "Sync 0");
  s.step = 9;
  EXPECT_EQ(rest(s), "Sync 1");
}

// Overlap: a round launched at its step merges tau steps later and votes halfway; with a
// delayed update (tau = H) a merge and the next launch share a step, merge first.
TEST(Schedule, OverlapLaunchesVotesHalfwayAndMergesFirst) {
  auto s = state(4, 4, 1, /*overlapped=*/true);
  EXPECT_EQ(rest(s), "Launch 0");
  // Launched at 4 with tau 4: votes at 6, merges at 8 (when it also launches the next).
  s.fragments[0].pending_merge = s.fragments[0].awaiting_decision = true;
  s.fragments[0].merge_step = 8;
  s.fragments[0].vote_step = 6;
  s.step = 5;
  EXPECT_EQ(rest(s), "");
  s.step = 6;
  EXPECT_EQ(rest(s), "Vote 0");
  s.fragments[0].voted = true;
  s.step = 7;
  EXPECT_EQ(rest(s), "");
  s.step = 8;
  const auto p = decide_step(s);
  EXPECT_EQ(describe(p.merges), "Merge 0");
  EXPECT_EQ(describe(p.rest), "Launch 0");
}

// The last step syncs every fragment blocking, whatever the schedule; a checkpoint step with
// rounds in flight decides them too.
TEST(Schedule, TheLastStepSyncsAllAndACheckpointDecidesTheRoundsInFlight) {
  auto s = state(100, 8, 2, /*overlapped=*/true);
  EXPECT_EQ(rest(s), "FinalSync");
  s.step = 30;
  s.checkpoint_every = 10;
  EXPECT_EQ(rest(s), "DecideInFlight");
  s.step = 32;
  s.checkpoint_every = 16;
  EXPECT_EQ(rest(s), "Launch 1, DecideInFlight");
  s.overlapped = false;  // blocking rounds are decided when they run
  EXPECT_EQ(rest(s), "Sync 1");
}

// outer.plan: auto: no sync before the start-up plan; the probe runs while the first steps
// are timed, the plan is made once they are; then each boundary comes before the syncs.
TEST(Schedule, AutoPlanProbesThenPlansThenChecksEachBoundary) {
  auto s = state(3, 10, 1);
  s.auto_plan = true;
  s.planned = false;
  s.plan_at = 5;
  EXPECT_EQ(rest(s), "Probe");
  s.step = 5;
  EXPECT_EQ(rest(s), "Probe, InitialPlan");
  s.planned = true;
  s.epoch_start = 5;
  s.step = 15;
  EXPECT_EQ(rest(s), "Boundary, Sync 0");
  s.step = 14;
  EXPECT_EQ(rest(s), "");
  s.auto_plan = false;  // plan: manual (or one site): no boundaries
  s.step = 15;
  EXPECT_EQ(rest(s), "Sync 0");
}
