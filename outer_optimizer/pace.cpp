// outer.pace: time: the share of each period a site trains (pace.hpp).
#include "outer_optimizer/pace.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>

#include "core/error.hpp"

namespace geoloco::outer {

bool Pace::trained_at(int64_t j, int64_t d, int64_t interval) {
  if (d >= interval) return true;
  return (j + 1) * d / interval > j * d / interval;
}

int64_t Pace::duty(uint32_t ratio_ppm, int64_t interval) {
  const int64_t d = (interval * int64_t(ratio_ppm) + kWhole / 2) / kWhole;
  return std::clamp<int64_t>(d, 1, interval);
}

std::optional<uint32_t> Pace::ratio_from(const std::vector<uint32_t>& step_us, int self, double tolerance) {
  if (self < 0 || static_cast<size_t>(self) >= step_us.size() || step_us[static_cast<size_t>(self)] == 0)
    return std::nullopt;
  uint32_t fastest = 0;
  for (uint32_t t : step_us)
    if (t > 0 && (fastest == 0 || t < fastest)) fastest = t;
  const uint32_t own = step_us[static_cast<size_t>(self)];
  if (double(own) <= double(fastest) * (1.0 + tolerance)) return kWhole;
  // Integers only: every rank of every site computes the same ratio from the same reports.
  const uint64_t r = (uint64_t(fastest) * kWhole + own / 2) / own;
  return static_cast<uint32_t>(std::clamp<uint64_t>(r, 1, kWhole));
}

bool Pace::trains(int64_t step, int64_t epoch_start, int64_t interval) {
  if (step <= epoch_start || interval <= 0) return true;
  const int64_t rel = step - 1 - epoch_start;
  const int64_t start = epoch_start + rel / interval * interval;
  if (start != period_start_) {
    period_start_ = start;
    ratio_ppm_ = next_ppm_;
  }
  return trained_at(rel % interval, duty(ratio_ppm_, interval), interval);
}

void Pace::sample(double seconds) {
  if (std::isfinite(seconds) && seconds >= 0) samples_.push_back(seconds);
}

uint32_t Pace::take_step_us() {
  if (!samples_.empty()) {
    const auto mid = samples_.begin() + static_cast<std::ptrdiff_t>(samples_.size() / 2);
    std::nth_element(samples_.begin(), mid, samples_.end());
    const double us = std::round(*mid * 1e6);
    last_us_ = static_cast<uint32_t>(std::clamp(us, 1.0, 4.0e9));
    samples_.clear();
  }
  return last_us_;
}

std::string Pace::save() const { return fmt::format("{},{},{}", ratio_ppm_, next_ppm_, period_start_); }

void Pace::restore(const std::string& text, const std::string& what) {
  unsigned long long a = 0, b = 0;
  long long p = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%llu,%llu,%lld%c", &a, &b, &p, &tail) != 3 || a < 1 || a > kWhole || b < 1 ||
      b > kWhole || p < -1)
    throw Error(fmt::format("{}: pace '{}' is not 'ratio,next,period_start' (ratios 1..{})", what, text, kWhole));
  ratio_ppm_ = static_cast<uint32_t>(a);
  next_ppm_ = static_cast<uint32_t>(b);
  period_start_ = p;
}

namespace {
// The site's one value of a per-rank integer some ranks may lack: the floor of the mean over
// the ranks that have one (integers summed as doubles: exact, so the same on every rank);
// none when no rank has one.
std::optional<uint32_t> site_agreed(Site& site, std::optional<uint32_t> mine) {
  std::array<double, 2> v{mine ? double(*mine) : 0.0, mine ? 1.0 : 0.0};
  site.sum(v);
  if (v[1] <= 0) return std::nullopt;
  return static_cast<uint32_t>(std::llround(std::floor(v[0] / v[1])));
}
}  // namespace

SitePace::SitePace(const OuterOptions& o) : opt_(o), enabled_(o.outer.pace_by_time()) {}

bool SitePace::trains(int64_t step, int64_t epoch_start, int64_t interval, bool planned, int sites) {
  if (!enabled_ || !planned || sites < 2) return true;
  const bool t = pace_.trains(step, epoch_start, interval);
  if (!t) skipped_ = step;
  return t;
}

uint32_t SitePace::agreed_step_us(Site& site) {
  const uint32_t mine = pace_.take_step_us();
  return site_agreed(site, mine > 0 ? std::optional<uint32_t>(mine) : std::nullopt).value_or(0);
}

void SitePace::decide(Site& site, uint64_t round, int64_t step, int64_t interval,
                      const std::vector<uint32_t>& step_us) {
  // Every rank holding a contribution computes the same ratio from the same reports; a rank
  // with no segment holds none and takes its site's.
  const auto agreed = site_agreed(site, Pace::ratio_from(step_us, opt_.site, opt_.outer.pace_tolerance));
  if (!agreed) return;
  const uint32_t ratio = *agreed;
  if (Pace::duty(ratio, interval) != Pace::duty(pace_.next_ppm(), interval)) {
    history_.push_back({{"round", round}, {"step", step}, {"ratio", double(ratio) / Pace::kWhole}});
    if (opt_.rank == 0)
      spdlog::info(
          "site {}: outer.pace: time: trains {} of every {} inner steps from the next period "
          "(step times by site, us: {})",
          opt_.name(), Pace::duty(ratio, interval), interval, fmt::join(step_us, ", "));
  }
  pace_.decide(ratio);
}

nlohmann::json SitePace::json(int64_t interval) const {
  return {{"ratio", double(pace_.next_ppm()) / Pace::kWhole},
          {"trains_of_interval", Pace::duty(pace_.next_ppm(), interval)}};
}

}  // namespace geoloco::outer
