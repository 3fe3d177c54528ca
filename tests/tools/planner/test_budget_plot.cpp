// geoloco budget --plot: the curves follow the budget model, the figure renders through
// gnuplot as SVG and PNG, and a bad file name is refused before any work.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "planner/budget.hpp"
#include "tests/support/temp_dir.hpp"
#include "tools/planner/budget_plot.hpp"
#include "tools/planner/cli.hpp"
#include "core/error.hpp"

using namespace geoloco::planner;

namespace {

// 7B parameters, two sites 1000 km apart on one 100 Gbit/s link, 2 s steps, H = 100.
BudgetFlags seven_b() {
  BudgetFlags f;
  f.params = "7B";
  f.sites = "2";
  f.km = "1000";
  f.rate_gbps = "100";
  f.step_time = "2";
  f.H = "100";
  f.bits = "8";
  f.ranks = "8";
  return f;
}

BudgetReport report_of(const BudgetFlags& f) {
  auto doc = geoloco::config::load_string("format: geoloco-budget\nversion: 1\n", "<flags>", budget_overrides(f));
  return plan_budget(BudgetInput::from_yaml(doc.node()));
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const geoloco::plot::Series& series(const std::vector<geoloco::plot::Series>& all, const std::string& title) {
  for (const auto& s : all)
    if (s.title == title) return s;
  throw std::runtime_error("no series " + title);
}

double at(const geoloco::plot::Series& s, double x) {
  for (const auto& [px, py] : s.points)
    if (px == x) return py;
  throw std::runtime_error("no point at x");
}

}  // namespace

TEST(BudgetPlot, CurvesAreTheModelsUtilization) {
  const auto r = report_of(seven_b());
  const auto c = budget_curves(r);
  ASSERT_EQ(c.vs_h.size(), 5u);  // fp32, 16-bit, int8, int4, int2
  ASSERT_EQ(c.vs_km.size(), 5u);
  // Every point is evaluate() of the same inputs.
  const auto& int8 = series(c.vs_h, "int8");
  for (const auto& [h, u] : int8.points) {
    const auto e = evaluate(r.input, int64_t(h), 8, r.input.bytes_per_value_for_bits(8), 1, 1);
    EXPECT_DOUBLE_EQ(u, e.utilization) << "H=" << h;
  }
  // The configuration as given sits on its curve.
  EXPECT_DOUBLE_EQ(at(int8, 100), r.current.utilization);
  // More H, more utilization; fewer bits, more utilization; farther, less.
  for (const auto& s : c.vs_h)
    for (size_t i = 1; i < s.points.size(); ++i) EXPECT_GE(s.points[i].second, s.points[i - 1].second) << s.title;
  for (const auto& s : c.vs_km)
    for (size_t i = 1; i < s.points.size(); ++i) EXPECT_LE(s.points[i].second, s.points[i - 1].second) << s.title;
  EXPECT_GT(at(series(c.vs_h, "int2"), 100), at(series(c.vs_h, "fp32"), 100));
  EXPECT_NEAR(c.given_km, 1000, 1e-6);
}

TEST(BudgetPlot, GivenBytesPerValueGetsItsOwnCurve) {
  auto f = seven_b();
  f.bytes_per_value = "0.3";
  const auto c = budget_curves(report_of(f));
  ASSERT_EQ(c.vs_h.size(), 6u);
  EXPECT_EQ(c.vs_h.back().title, "given 0.3 B/value");
}

TEST(BudgetPlot, WritesSvgAndPngWithThePlanMarked) {
  geoloco::test::TempDir dir("budget-plot");
  auto f = seven_b();
  f.plot = dir.file("budget.svg");
  f.json = true;
  const std::string out = run_budget(f);  // still prints the report
  EXPECT_NE(out.find("\"current\""), std::string::npos);
  const std::string svg = slurp(f.plot);
  ASSERT_NE(svg.find("<svg"), std::string::npos);
  EXPECT_NE(svg.find("against H"), std::string::npos);
  EXPECT_NE(svg.find("against distance"), std::string::npos);
  EXPECT_NE(svg.find("as given: H=100, int8"), std::string::npos);
  EXPECT_NE(svg.find("smallest H for the target"), std::string::npos);
  EXPECT_NE(svg.find("this path: 1000 km"), std::string::npos);
  f.plot = dir.file("budget.png");
  run_budget(f);
  const std::string png = slurp(f.plot);
  ASSERT_GT(png.size(), 1000u);
  EXPECT_EQ(png.substr(1, 3), "PNG");
  // No temporary file is left beside the figures.
  int files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) files += e.is_regular_file();
  EXPECT_EQ(files, 2);
}

TEST(BudgetPlot, BadFileNameIsInputErrorAndWritesNothing) {
  geoloco::test::TempDir dir("budget-plot");
  auto f = seven_b();
  f.plot = dir.file("budget.pdf");
  try {
    run_budget(f);
    FAIL() << "expected InputError";
  } catch (const geoloco::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("--plot"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(".svg or .png"), std::string::npos) << e.what();
  }
  f.plot = dir.file("missing-folder/budget.svg");
  EXPECT_THROW(run_budget(f), geoloco::Error);
  EXPECT_TRUE(std::filesystem::is_empty(dir.path()));
}
