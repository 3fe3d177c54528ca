// OpTimes: device time per op kind over one step, for finding where a step's time goes.
// Host logic of OpProfile (op_profile.hpp): a stream's timeline is cut by events recorded
// before each op; the interval from one mark to the next is the op's that the first names.
// Tested on CPU (test_cuda_host).
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

namespace geoloco::cuda {

class OpTimes {
 public:
  struct Row {
    std::string op;
    double ms = 0;
    int64_t calls = 0;
  };

  // Adds one call of `op` that took `ms` (>= 0; geoloco::Error otherwise).
  void add(const std::string& op, double ms);
  // Every op, the most expensive first (ties by name).
  std::vector<Row> rows() const;
  const Row* find(const std::string& op) const;  // nullptr when absent
  double total_ms() const { return total_ms_; }
  // {"total_ms": t, "ops": [{"op", "ms", "calls", "share"}, ...]} in rows() order.
  nlohmann::json to_json() const;

 private:
  std::map<std::string, Row> by_op_;
  double total_ms_ = 0;
};

// labels[i] started at times_ms[i]; times_ms has one more entry than labels (the end of the
// last op). geoloco::Error when the counts disagree or the times go backwards (events
// recorded out of order).
OpTimes op_times_from_marks(std::span<const std::string> labels, std::span<const double> times_ms);

}  // namespace geoloco::cuda
