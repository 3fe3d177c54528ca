// OuterBooks: the outer loop's accounting, behind its metrics, its rounds' records and its
// summary: sync times and bytes, the steps and tokens this site trained and the tokens of every
// site's contributions the rounds it applied committed (each fragment's round weighted by its
// share of the model, so a token counts once when every fragment committed it), what the
// snapshots copied from a GPU, and the records of finished rounds until the driver takes them.
// Its token counts are checkpointed (save/restore) and carried across --resume.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/safetensors.hpp"
#include "outer_optimizer/fragment.hpp"
#include "outer_optimizer/outer_options.hpp"

namespace geoloco::outer {

class OuterBooks {
 public:
  explicit OuterBooks(const OuterOptions& options);

  // An inner step of this process: trained, or skipped (outer.pace: time).
  void count_step(bool trained) { trained_steps_ += trained ? 1 : 0; }
  int64_t trained_steps() const { return trained_steps_; }
  // Tokens of `steps` inner steps at this site.
  uint64_t tokens_of(int64_t steps) const;

  // A round's snapshot: the bytes it copied from the site's parameters to the host, against
  // what fp32 staging copies.
  void count_snapshot(uint64_t fp32_bytes, uint64_t host_bytes);
  // A finished round of a fragment holding `share` of the model.
  void count_round(double seconds, const ExchangeResult& r, double share);
  double last_sync_s() const { return last_sync_s_; }

  // A finished round's line (rounds.r<rank>.jsonl); the driver takes them.
  void record(nlohmann::json line) { records_.push_back(std::move(line)); }
  std::vector<nlohmann::json> take_records();

  // A joiner's counts start at the round that took it in.
  void start_counts_at(int64_t round) { first_round_ = round; }
  int64_t counts_start() const { return first_round_; }

  // The names of the sites in `m` (config order).
  nlohmann::json member_names(SiteMask m) const;
  // Summary parts: sync times and bytes over `rounds` rounds of `fragments` fragments; the
  // snapshots' bytes; the tokens trained and committed.
  nlohmann::json sync_json(int64_t rounds, size_t fragments) const;
  nlohmann::json snapshot_json() const;
  nlohmann::json tokens_json() const;

  // Checkpoint: the token counts as "tokens.*" metadata, and their restore (a checkpoint from
  // before the counts: they start at `round`).
  void save(std::map<std::string, std::string>& metadata) const;
  void restore(const SafetensorsFile& file, int64_t round);

 private:
  const OuterOptions& opt_;
  std::vector<double> sync_seconds_;
  double last_sync_s_ = 0;
  uint64_t frame_bytes_ = 0, elements_ = 0;
  uint64_t snapshot_host_bytes_ = 0, snapshot_fp32_bytes_ = 0;
  std::vector<double> committed_;  // by site
  int64_t trained_steps_ = 0;      // this site's inner steps trained (this process and those before it)
  int64_t first_round_ = 0;        // the round the counts start after (a joiner's join round)
  std::vector<nlohmann::json> records_;
};

}  // namespace geoloco::outer
