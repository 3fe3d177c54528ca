// Pace: outer.pace: time -- how many of each period's inner steps a site trains, so that a
// slower site (fewer or older GPUs) does not idle the others at every sync.
//
// Every site keeps the same step clock: a period is `interval` (H) steps of it and every
// sync, merge, checkpoint and evaluation stays where pace: steps puts it. A site trains only
// D of its period's H steps, spread evenly (step j of the period, 0-based, is trained when
// floor((j + 1) D / H) > floor(j D / H): the period's last step always is); a step it does
// not train costs it no time, so a site at half speed with D = H / 2 reaches each sync when
// the others do. D = H * ratio, the ratio (in millionths) decided from a committed round:
// every member reported its median trained-step time with its contribution (the envelope's
// step time), and a site's ratio is the fastest member's time over its own (1 within
// `pace_tolerance` of the fastest). Every rank of a site agrees on it (the caller's
// collective) and it applies from the next period on. The pseudo-gradients are weighed by
// the tokens each site trained (outer.weighting: tokens), so a slower site counts for what
// it trained. The decisions depend on measured times: two runs of one config may train
// different steps; every site still computes the same bits in each run, and a checkpoint
// carries the ratio in force (docs/shapes.md, "Sites of different speeds").
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "outer_optimizer/outer_options.hpp"
#include "outer_optimizer/site.hpp"

namespace geoloco::outer {

class Pace {
 public:
  static constexpr uint32_t kWhole = 1000000;  // a ratio of 1, in millionths

  // Whether the period's step j (0-based, j < interval) is trained at duty `d` of `interval`.
  static bool trained_at(int64_t j, int64_t d, int64_t interval);
  // The steps of a period of `interval` trained at `ratio_ppm` (at least 1).
  static int64_t duty(uint32_t ratio_ppm, int64_t interval);
  // A site's ratio from a committed round's step times by site (0: no report), `self` its
  // index: the fastest reported time over its own, 1 when within `tolerance` of it; none
  // when `self` reported nothing.
  static std::optional<uint32_t> ratio_from(const std::vector<uint32_t>& step_us, int self, double tolerance);

  // Whether step `step` (1-based) of the epoch starting after `epoch_start` at period length
  // `interval` is trained; the first step of a period takes the ratio decided by then.
  bool trains(int64_t step, int64_t epoch_start, int64_t interval);
  // A trained step's seconds (from the end of the outer loop's previous call to this one).
  void sample(double seconds);
  // This rank's median trained-step time since the previous call, in microseconds (at least
  // 1); the previous value when no step was trained since (0 before any).
  uint32_t take_step_us();
  // The site's agreed ratio from a committed round: due from the next period.
  void decide(uint32_t ratio_ppm) { next_ppm_ = ratio_ppm; }

  uint32_t ratio_ppm() const { return ratio_ppm_; }
  uint32_t next_ppm() const { return next_ppm_; }
  int64_t period_start() const { return period_start_; }
  // Checkpoint: "ratio,next,period_start" (throws Error naming `what` on a malformed text).
  std::string save() const;
  void restore(const std::string& text, const std::string& what);

 private:
  uint32_t ratio_ppm_ = kWhole;  // the current period's
  uint32_t next_ppm_ = kWhole;   // decided, applies from the next period
  int64_t period_start_ = -1;    // the step the current period started after
  std::vector<double> samples_;
  uint32_t last_us_ = 0;
};

// SitePace: outer.pace: time as one rank of a site runs it -- which steps it trains, the
// site's agreed step time for its contributions, the ratio decided from each committed round
// (every rank of the site agrees: Site::sum), and the decisions' history for the summary.
class SitePace {
 public:
  explicit SitePace(const OuterOptions& options);
  bool enabled() const { return enabled_; }
  // Whether this site trains inner step `step` (1-based) under the plan in force; always under
  // pace: steps, before a plan (outer.plan: auto) or alone.
  bool trains(int64_t step, int64_t epoch_start, int64_t interval, bool planned, int sites);
  // Whether trains() said this site skips `step`.
  bool skipped(int64_t step) const { return skipped_ == step; }
  void sample(double seconds) { pace_.sample(seconds); }
  // The site's step time for its next contribution: the mean of its ranks' medians (ranks with
  // no sample yet count for none). Collective.
  uint32_t agreed_step_us(Site& site);
  // After a committed round: the site's ratio for the next period from its members' step
  // times (by site). Collective.
  void decide(Site& site, uint64_t round, int64_t step, int64_t interval, const std::vector<uint32_t>& step_us);
  // The share in force (rounds.jsonl, the summary), and the decisions so far.
  nlohmann::json json(int64_t interval) const;
  const nlohmann::json& history() const { return history_; }
  std::string save() const { return pace_.save(); }
  void restore(const std::string& text, const std::string& what) { pace_.restore(text, what); }

 private:
  const OuterOptions& opt_;
  bool enabled_;
  Pace pace_;
  int64_t skipped_ = -1;
  nlohmann::json history_ = nlohmann::json::array();  // {round, step, ratio} as decided
};

}  // namespace geoloco::outer
