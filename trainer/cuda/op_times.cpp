#include "trainer/cuda/op_times.hpp"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "core/error.hpp"

namespace geoloco::cuda {

void OpTimes::add(const std::string& op, double ms) {
  if (!(ms >= 0) || !std::isfinite(ms)) throw Error(fmt::format("op profile: '{}' took {} ms", op, ms));
  Row& r = by_op_[op];
  r.op = op;
  r.ms += ms;
  ++r.calls;
  total_ms_ += ms;
}

std::vector<OpTimes::Row> OpTimes::rows() const {
  std::vector<Row> out;
  out.reserve(by_op_.size());
  for (const auto& [op, r] : by_op_) out.push_back(r);
  std::stable_sort(out.begin(), out.end(), [](const Row& a, const Row& b) { return a.ms > b.ms; });
  return out;
}

const OpTimes::Row* OpTimes::find(const std::string& op) const {
  auto it = by_op_.find(op);
  return it == by_op_.end() ? nullptr : &it->second;
}

nlohmann::json OpTimes::to_json() const {
  nlohmann::json ops = nlohmann::json::array();
  for (const Row& r : rows())
    ops.push_back({{"op", r.op}, {"ms", r.ms}, {"calls", r.calls}, {"share", total_ms_ > 0 ? r.ms / total_ms_ : 0.0}});
  return {{"total_ms", total_ms_}, {"ops", ops}};
}

OpTimes op_times_from_marks(std::span<const std::string> labels, std::span<const double> times_ms) {
  if (times_ms.size() != labels.size() + 1)
    throw Error(
        fmt::format("op profile: {} marks need {} times, got {}", labels.size(), labels.size() + 1, times_ms.size()));
  OpTimes t;
  for (size_t i = 0; i < labels.size(); ++i) {
    const double ms = times_ms[i + 1] - times_ms[i];
    if (!(ms >= 0))
      throw Error(fmt::format("op profile: time goes backwards at mark {} ('{}'): {} ms then {} ms", i + 1, labels[i],
                              times_ms[i], times_ms[i + 1]));
    t.add(labels[i], ms);
  }
  return t;
}

}  // namespace geoloco::cuda
