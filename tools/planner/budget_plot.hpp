// `geoloco budget --plot FILE`: the budget as a picture -- compute utilization against H and
// against fiber distance for each codec bit width, with the configuration as given and the
// plan the smallest-H search chose marked. The curves come from the same model the table
// reports (planner/budget.hpp); gnuplot draws them (tools/plot).
#pragma once

#include <string>
#include <vector>

#include "planner/budget.hpp"
#include "tools/plot/gnuplot.hpp"

namespace geoloco::planner {

struct BudgetCurves {
  // One series per codec (fp32, 16, 8, 4, 2 bits, and the given bytes/value when set):
  // x = H, y = utilization (0-1), at the given fragments, lanes, overlap and path.
  std::vector<plot::Series> vs_h;
  // Same codecs: x = fiber distance in km (round trip 10 us/km), y = utilization at the given
  // H, fragments and lanes. A probe's per-connection figure does not carry to other
  // distances: the window/RTT cap is used instead; a measured p99 scales with the median.
  std::vector<plot::Series> vs_km;
  double given_km = 0;  // the path as given, in km of fiber (RTT / 10 us)
};

BudgetCurves budget_curves(const BudgetReport& report);

// The gnuplot commands for both panels (no terminal, no output).
std::string budget_plot_script(const BudgetReport& report);

// Renders the figure into `path` (.svg or .png). InputError for another extension.
void write_budget_plot(const BudgetReport& report, const std::string& path);

}  // namespace geoloco::planner
