// The outer loop's decisions at an inner step (schedule.hpp).
#include "outer_optimizer/schedule.hpp"

#include <fmt/format.h>

namespace geoloco::outer {

const char* act_name(Act a) {
  switch (a) {
    case Act::Merge: return "Merge";
    case Act::Vote: return "Vote";
    case Act::FinalSync: return "FinalSync";
    case Act::Probe: return "Probe";
    case Act::InitialPlan: return "InitialPlan";
    case Act::Boundary: return "Boundary";
    case Act::Sync: return "Sync";
    case Act::Launch: return "Launch";
    case Act::DecideInFlight: return "DecideInFlight";
  }
  return "?";
}

StepPlan decide_step(const StepState& s) {
  StepPlan p;
  const int F = static_cast<int>(s.fragments.size());
  for (int f = 0; f < F; ++f)
    if (s.fragments[static_cast<size_t>(f)].pending_merge && s.step >= s.fragments[static_cast<size_t>(f)].merge_step)
      p.merges.push_back({Act::Merge, f});
  for (int f = 0; f < F; ++f) {
    const FragmentClock& c = s.fragments[static_cast<size_t>(f)];
    if (c.awaiting_decision && !c.voted && s.step >= c.vote_step && s.step < c.merge_step)
      p.rest.push_back({Act::Vote, f});
  }
  if (s.step == s.total_steps) {
    p.rest.push_back({Act::FinalSync});
  } else if (!s.planned) {
    p.rest.push_back({Act::Probe});
    if (s.step >= s.plan_at) p.rest.push_back({Act::InitialPlan});
  } else {
    const int64_t rel = s.step - s.epoch_start;
    if (s.auto_plan && rel > 0 && rel % s.interval == 0) p.rest.push_back({Act::Boundary});
    for (int f = 0; f < F; ++f)
      if (rel > 0 && rel % s.interval == s.fragments[static_cast<size_t>(f)].offset)
        p.rest.push_back({s.overlapped ? Act::Launch : Act::Sync, f});
  }
  if (s.overlapped && s.checkpoint_every > 0 && s.step % s.checkpoint_every == 0)
    p.rest.push_back({Act::DecideInFlight});
  return p;
}

std::string describe(const std::vector<Action>& actions) {
  std::string out;
  for (const auto& a : actions)
    out += fmt::format("{}{}{}", out.empty() ? "" : ", ", act_name(a.act),
                       a.fragment >= 0 ? fmt::format(" {}", a.fragment) : std::string());
  return out;
}

}  // namespace geoloco::outer
