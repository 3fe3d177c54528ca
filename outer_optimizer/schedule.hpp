// The outer loop's decisions at an inner step, as a pure function: the step, the plan in
// force and the rounds in flight in; the actions due, in order, out. Diloco (diloco.cpp) runs
// them; tests/outer_optimizer/test_schedule.cpp pins them, as test_membership.cpp pins the
// membership protocol.
//
// At step s, in this order:
//   1. Merge f     every round in flight whose merge step has come (overlap: tau steps after
//                  its launch; with delayed_update a round's merge and the next launch share a
//                  step, so merges come first);
//   2. Vote f      every round in flight halfway to its merge (the site votes on its
//                  membership, the leader's consensus runs behind the remaining steps);
//   3. one of
//      FinalSync   at the run's last step: every fragment synced blocking (the sites end equal);
//      Probe [+ InitialPlan]   outer.plan: auto before its first plan: the probe runs meanwhile,
//                  and once the first steps were timed the start-up plan is made and applied;
//      [Boundary +] Sync f / Launch f   a plan boundary (outer.plan: auto, every H steps of the
//                  plan's epoch: it may apply a new plan, and then nothing more syncs at this
//                  step), then every fragment whose offset falls on this step syncs (blocking)
//                  or launches (overlap);
//   4. DecideInFlight   with overlap, at a checkpoint step: the rounds in flight are decided now
//                  so the checkpoint holds committed state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace geoloco::outer {

struct FragmentClock {
  int64_t offset = 0;  // syncs at the steps s > epoch start with (s - start) % H == offset
  bool pending_merge = false;
  int64_t merge_step = 0;
  bool awaiting_decision = false;
  bool voted = false;
  int64_t vote_step = 0;
};

struct StepState {
  int64_t step = 0;         // the inner step just trained (1-based)
  int64_t total_steps = 0;  // the run's last step
  int64_t interval = 1;     // H in force
  int64_t epoch_start = 0;  // the step the plan in force started at
  int64_t checkpoint_every = 0;
  bool overlapped = false;
  bool auto_plan = false;  // outer.plan: auto with more than one site
  bool planned = true;     // a plan is in force (always, under plan: manual)
  int64_t plan_at = 0;     // unplanned: the step from which the start-up plan is made
  std::vector<FragmentClock> fragments;
};

enum class Act : uint8_t { Merge, Vote, FinalSync, Probe, InitialPlan, Boundary, Sync, Launch, DecideInFlight };
const char* act_name(Act a);

struct Action {
  Act act;
  int fragment = -1;  // Merge, Vote, Sync, Launch
  bool operator==(const Action&) const = default;
};

struct StepPlan {
  std::vector<Action> merges;  // 1.
  std::vector<Action> rest;    // 2.-4. (Sync and Launch after a Boundary: only if it applied no new plan)
};

StepPlan decide_step(const StepState& s);

std::string describe(const std::vector<Action>& actions);  // "Merge 0, Vote 1, Launch 1"

}  // namespace geoloco::outer
