#include "tools/planner/budget_plot.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "planner/physics.hpp"

namespace geoloco::planner {
namespace {

struct Codec {
  std::string label;
  int bits;  // 0: the given bytes per value
  double bytes_per_value;
};

std::string bits_label(int bits) {
  switch (bits) {
    case 32: return "fp32";
    case 16: return "16-bit";
    default: return fmt::format("int{}", bits);
  }
}

std::vector<Codec> codecs(const BudgetInput& in) {
  std::vector<Codec> out;
  for (int b : {32, 16, 8, 4, 2}) out.push_back({bits_label(b), b, in.bytes_per_value_for_bits(b)});
  if (in.bytes_per_value_override)
    out.push_back({fmt::format("given {:.3g} B/value", *in.bytes_per_value_override), 0, *in.bytes_per_value_override});
  return out;
}

// n points from lo to hi, evenly spaced on a log scale.
std::vector<double> log_grid(double lo, double hi, int n) {
  std::vector<double> out;
  for (int i = 0; i < n; ++i) out.push_back(lo * std::pow(hi / lo, double(i) / double(n - 1)));
  return out;
}

std::string plan_label(const Evaluation& e) {
  const std::string codec = e.bits > 0 ? bits_label(e.bits) : fmt::format("{:.3g} B/value", e.bytes_per_value);
  return fmt::format("H={}, {}, F={}, {} lane{}: {:.1f}%", e.H, codec, e.fragments, e.lanes, e.lanes == 1 ? "" : "s",
                     100.0 * e.utilization);
}

}  // namespace

BudgetCurves budget_curves(const BudgetReport& r) {
  const BudgetInput& in = r.input;
  BudgetCurves c;
  const int64_t h_lo = std::max<int64_t>({1, in.fragments, in.overlap_steps});
  int64_t h_hi = std::max<int64_t>({1000, 4 * in.H, r.search.found ? 4 * r.search.best.H : 0});
  h_hi = std::max(h_hi, 2 * h_lo);
  // A log grid, plus the H as given and the chosen H so that their markers sit on the curves.
  std::vector<int64_t> hs;
  for (double h : log_grid(double(h_lo), double(h_hi), 120)) hs.push_back(static_cast<int64_t>(std::llround(h)));
  if (in.H >= h_lo) hs.push_back(in.H);
  if (r.search.found && r.search.best.H >= h_lo) hs.push_back(r.search.best.H);
  std::sort(hs.begin(), hs.end());
  hs.erase(std::unique(hs.begin(), hs.end()), hs.end());
  c.given_km = in.rtt_s / fiber_rtt_s(1.0);
  BudgetInput far = in;
  far.measured_per_connection_Bps.reset();
  const double p99_ratio = in.rtt_s > 0 && in.rtt_p99_s > 0 ? in.rtt_p99_s / in.rtt_s : 0;
  const auto kms = log_grid(1.0, 20000.0, 120);
  for (const auto& k : codecs(in)) {
    plot::Series by_h{k.label, {}}, by_km{k.label, {}};
    for (int64_t h : hs)
      by_h.points.emplace_back(double(h),
                               evaluate(in, h, k.bits, k.bytes_per_value, in.fragments, in.lanes).utilization);
    for (double km : kms) {
      far.rtt_s = fiber_rtt_s(km);
      far.rtt_p99_s = far.rtt_s * p99_ratio;
      by_km.points.emplace_back(km, evaluate(far, in.H, k.bits, k.bytes_per_value, in.fragments, in.lanes).utilization);
    }
    c.vs_h.push_back(std::move(by_h));
    c.vs_km.push_back(std::move(by_km));
  }
  return c;
}

std::string budget_plot_script(const BudgetReport& r) {
  const BudgetInput& in = r.input;
  const BudgetCurves c = budget_curves(r);
  std::string s;
  s += plot::datablock("byh", c.vs_h);
  s += plot::datablock("bykm", c.vs_km);
  const double target = 100.0 * in.target_utilization;
  s += fmt::format(
      "set multiplot layout 1,2 title {}\n"
      "set grid\nset logscale x\nset yrange [0:105]\nset ylabel 'compute utilization, %'\n"
      "set key bottom right box opaque font ',9'\n",
      plot::quote(fmt::format("{:.3g} parameters, {} sites, RTT {:.3g} ms ({}), step {:.3g} s", in.params, in.sites,
                              in.rtt_s * 1e3, in.rtt_source, in.step_time_s)));
  // Panel 1: against H.
  s += "set xlabel 'H: inner steps between syncs'\n";
  s += fmt::format("set title {}\n", plot::quote(fmt::format("against H ({} fragment{}, {} lane{}, overlap {})",
                                                             in.fragments, in.fragments == 1 ? "" : "s", in.lanes,
                                                             in.lanes == 1 ? "" : "s", in.overlap_steps)));
  s += fmt::format("set arrow 1 from graph 0, first {0} to graph 1, first {0} nohead dashtype 2 lc rgb 'gray40'\n",
                   target);
  s += fmt::format("set label 1 {} at graph 0.02, first {} offset 0,0.7 font ',9' tc rgb 'gray30'\n",
                   plot::quote(fmt::format("target {:.0f}%", target)), target);
  std::string plot_cmd = "plot ";
  for (size_t i = 0; i < c.vs_h.size(); ++i)
    plot_cmd +=
        fmt::format("$byh index {} using 1:($2*100) with lines lw 2 title {}, ", i, plot::quote(c.vs_h[i].title));
  plot_cmd += fmt::format("'+' using ({}):({}) every ::0::0 with points pt 7 ps 1.6 lc rgb 'black' title {}", in.H,
                          100.0 * r.current.utilization, plot::quote("as given: " + plan_label(r.current)));
  if (r.search.found)
    plot_cmd += fmt::format(", '+' using ({}):({}) every ::0::0 with points pt 9 ps 2 lc rgb 'red' title {}",
                            r.search.best.H, 100.0 * r.search.best.utilization,
                            plot::quote("smallest H for the target: " + plan_label(r.search.best)));
  s += plot_cmd + "\n";
  s += "unset arrow 1\nunset label 1\n";
  // Panel 2: against distance.
  s += "set xlabel 'fiber distance, km (round trip 10 us per km)'\n";
  s += fmt::format("set title {}\n", plot::quote(fmt::format("against distance (H={}, {} fragment{})", in.H,
                                                             in.fragments, in.fragments == 1 ? "" : "s")));
  s += fmt::format("set arrow 2 from graph 0, first {0} to graph 1, first {0} nohead dashtype 2 lc rgb 'gray40'\n",
                   target);
  plot_cmd = "plot ";
  for (size_t i = 0; i < c.vs_km.size(); ++i)
    plot_cmd +=
        fmt::format("$bykm index {} using 1:($2*100) with lines lw 2 title {}, ", i, plot::quote(c.vs_km[i].title));
  if (c.given_km >= 1.0 && c.given_km <= 20000.0)
    plot_cmd +=
        fmt::format("'+' using ({}):({}) every ::0::0 with points pt 7 ps 1.6 lc rgb 'black' title {}", c.given_km,
                    100.0 * r.current.utilization, plot::quote(fmt::format("this path: {:.0f} km", c.given_km)));
  else
    plot_cmd.resize(plot_cmd.size() - 2);
  s += plot_cmd + "\n";
  s += "unset multiplot\n";
  return s;
}

void write_budget_plot(const BudgetReport& report, const std::string& path) {
  (void)plot::format_for(path, "--plot");
  plot::render_to_file(budget_plot_script(report), path, "budget --plot " + path, 1400, 560);
}

}  // namespace geoloco::planner
