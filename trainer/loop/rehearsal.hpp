// Rehearsal (`train.rehearsal`): the real outer loop -- transport, compression, fragments,
// overlap, plan: auto, checkpoints of the outer state -- driven by a stand-in inner loop, so a
// run at the size a team plans for (hundreds of millions to billions of parameters, the model
// config's real layout and sharding) can be rehearsed on machines that could never train it.
//
// Each inner step of a rehearsal takes `step_seconds` of wall time (what the config says one
// real step costs) and, instead of forward, backward and the optimizer, this rank's shard drifts
// by `drift` per step along a heavy-tailed direction with the statistics of real
// pseudo-gradients: a Student-t (nu 3) value per element, picked by hashing (element, period) so
// no compressor finds a period, times a log-normal scale per row of 1024 elements. The
// direction is redrawn every `outer.interval` steps and differs per site (an element moves
// alike whatever the site's sharding). The period's whole move, interval x drift x direction,
// is applied at its first step: one pass over the shard per period, leaving the host's cores to
// the outer loop as a GPU's inner loop would. A round's pseudo-gradient is that move: what the
// codecs, error feedback and the outer optimizer see at real size. There is no loss.
// A step whose drift takes longer than step_seconds overruns (counted in the summary).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <span>
#include <vector>

#include "core/config_node.hpp"

namespace geoloco::trainer {

struct RehearsalConfig {
  bool enabled = false;       // the key `train.rehearsal` is present
  double step_seconds = 0.1;  // wall time of one stand-in inner step
  double drift = 1.0e-4;      // scale of the per-step move (the direction's mean magnitude is about 1.65)

  static RehearsalConfig from_yaml(const config::Node& node);
};

class Rehearsal {
 public:
  // `seed` differs per site (the run's seed mixed with the site's index).
  Rehearsal(const RehearsalConfig& cfg, uint64_t seed);

  // Inner step `step` (1-based, the step being taken) of `shard` (this rank's, starting at flat
  // element `offset`): at the first step of a period of `interval` steps, the period's move
  // along its direction; nothing at the other steps. Returns the seconds it took.
  double drift(std::span<float> shard, int64_t offset, int64_t step, int64_t interval);
  // Step `step` was skipped (outer.pace: time): if it was a period's first, that period's move
  // goes to its next step taken (a slower site still drifts once per period).
  void skipped(int64_t step, int64_t interval);

  // What the summary says: the settings, the steps taken, the overruns, the drift's mean cost.
  void count_step(double drift_s, double step_s);
  nlohmann::json to_json() const;

 private:
  RehearsalConfig cfg_;
  uint64_t seed_;
  std::vector<float> values_;  // Student-t (nu 3), unit mean magnitude
  std::vector<float> scales_;  // log-normal row scales
  int64_t steps_ = 0, overruns_ = 0;
  int64_t pending_period_ = -1;  // a period whose first step was skipped: its move is still due
  double drift_seconds_ = 0;
};

}  // namespace geoloco::trainer
