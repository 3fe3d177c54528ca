// The outer loop's accounting (outer_books.hpp).
#include "outer_optimizer/outer_books.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "core/error.hpp"

namespace geoloco::outer {

OuterBooks::OuterBooks(const OuterOptions& o) : opt_(o), committed_(static_cast<size_t>(o.site_count()), 0.0) {}

uint64_t OuterBooks::tokens_of(int64_t steps) const { return static_cast<uint64_t>(steps) * opt_.tokens_per_step; }

void OuterBooks::count_snapshot(uint64_t fp32_bytes, uint64_t host_bytes) {
  snapshot_fp32_bytes_ += fp32_bytes;
  snapshot_host_bytes_ += host_bytes;
}

void OuterBooks::count_round(double seconds, const ExchangeResult& r, double share) {
  last_sync_s_ = seconds;
  sync_seconds_.push_back(seconds);
  frame_bytes_ += r.frame_bytes;
  elements_ += r.elements;
  for (size_t s = 0; s < r.tokens.size() && s < committed_.size(); ++s) committed_[s] += share * double(r.tokens[s]);
}

std::vector<nlohmann::json> OuterBooks::take_records() { return std::exchange(records_, {}); }

nlohmann::json OuterBooks::member_names(SiteMask m) const {
  nlohmann::json a = nlohmann::json::array();
  for (int s = 0; s < opt_.site_count(); ++s)
    if ((m >> s) & 1) a.push_back(opt_.site_name(s));
  return a;
}

nlohmann::json OuterBooks::sync_json(int64_t rounds, size_t fragments) const {
  nlohmann::json j;
  j["sync_seconds"] = sync_seconds_;
  j["sync_seconds_mean"] = sync_seconds_.empty() ? 0.0
                                                 : std::accumulate(sync_seconds_.begin(), sync_seconds_.end(), 0.0) /
                                                       double(sync_seconds_.size());
  // Per period of `interval` steps: F fragment rounds together carry one model's worth.
  const double periods = double(rounds) / double(fragments);
  j["wire_bytes_per_outer_step"] = periods > 0 ? double(frame_bytes_) / periods : 0.0;
  j["compression_ratio"] = frame_bytes_ ? 4.0 * double(elements_) / double(frame_bytes_) : 0.0;
  return j;
}

nlohmann::json OuterBooks::snapshot_json() const {
  return {{"snapshot_host_bytes", snapshot_host_bytes_}, {"snapshot_fp32_bytes", snapshot_fp32_bytes_}};
}

nlohmann::json OuterBooks::tokens_json() const {
  const uint64_t trained = tokens_of(trained_steps_);
  nlohmann::json by_site = nlohmann::json::object();
  for (int s = 0; s < opt_.site_count(); ++s)
    by_site[opt_.site_name(s)] = static_cast<uint64_t>(std::llround(committed_[static_cast<size_t>(s)]));
  const uint64_t mine = static_cast<uint64_t>(std::llround(committed_[static_cast<size_t>(opt_.site)]));
  return {{"site", opt_.name()},
          {"trained", trained},
          {"committed", mine},
          {"not_committed", trained > mine ? trained - mine : 0},
          {"committed_by_site", by_site},
          {"counted_after_round", first_round_}};
}

void OuterBooks::save(std::map<std::string, std::string>& metadata) const {
  metadata["tokens.trained_steps"] = std::to_string(trained_steps_);
  metadata["tokens.after_round"] = std::to_string(first_round_);
  std::string committed;
  for (size_t i = 0; i < committed_.size(); ++i) committed += fmt::format("{}{:.17g}", i ? "," : "", committed_[i]);
  metadata["tokens.committed"] = committed;
}

void OuterBooks::restore(const SafetensorsFile& file, int64_t round) {
  if (!file.metadata().count("outer.tokens.committed")) {
    first_round_ = round;  // a checkpoint from before the counts: they start here
    return;
  }
  trained_steps_ = file.meta_int("outer.tokens.trained_steps", 0, opt_.total_steps);
  first_round_ = file.meta_int("outer.tokens.after_round", 0, round);
  const std::string& text = file.meta("outer.tokens.committed");
  std::vector<double> v;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    char* stop = nullptr;
    const double x = std::strtod(item.c_str(), &stop);
    if (item.empty() || stop != item.c_str() + item.size() || !std::isfinite(x) || x < 0)
      throw FileError(file.path(), fmt::format("outer.tokens.committed: '{}' is not a token count", item));
    v.push_back(x);
    at = end + 1;
  }
  if (v.size() != committed_.size())
    throw FileError(file.path(), fmt::format("outer.tokens.committed holds {} site(s), the config has {}", v.size(),
                                             committed_.size()));
  committed_ = std::move(v);
}

}  // namespace geoloco::outer
