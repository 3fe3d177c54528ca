// geoloco report: reads a run directory (finished, running, resumed, failed, or not a run),
// draws every figure from the data it holds, and writes one self-contained page.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "tests/support/ports.hpp"
#include "tests/support/temp_dir.hpp"
#include "tools/report/cli.hpp"
#include "tools/report/report_figures.hpp"
#include "tools/report/report_html.hpp"
#include "tools/report/run_data.hpp"
#include "core/error.hpp"

using namespace geoloco::report;
using geoloco::test::TempDir;
namespace fs = std::filesystem;

namespace {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A two-site run as the trainer writes it: 4 logged steps per site, 2 rounds per rank.
void write_run(const TempDir& d, bool finished = true) {
  d.file("run/config.yaml",
         "# c.yaml: the config of run 'synthetic' as it ran\nrun:\n  name: synthetic\nsites:\n  - {name: paris}\n"
         "  - {name: lyon}\n");
  for (const char* site : {"paris", "lyon"}) {
    std::string m;
    for (int s = 1; s <= 4; ++s) {
      m += "{\"step\":" + std::to_string(s * 10) + ",\"loss\":" + std::to_string(3.0 - 0.1 * s) +
           ",\"elapsed_s\":" + std::to_string(s * 1.5) + ",\"tokens_per_s\":1000,\"site\":\"" + site + "\"";
      if (s % 2 == 0)
        m += ",\"val_loss\":" + std::to_string(3.2 - 0.1 * s) + ",\"compute_utilization\":0.9" +
             ",\"exposed_wait_s\":0.2";
      m += "}\n";
    }
    d.file(std::string("run/sites/") + site + "/metrics.jsonl", m);
    const std::string peer = std::string(site) == "paris" ? "lyon" : "paris";
    d.file(std::string("run/sites/") + site + "/rounds.r0.jsonl",
           "{\"round\":1,\"fragment\":0,\"step\":20,\"sync_s\":0.5,\"frame_bytes\":1000,\"elements\":1000,"
           "\"err2\":1,\"ref2\":100,\"plan_epoch\":0,\"peers\":[{\"site\":\"" +
               peer +
               "\",\"rank\":0,\"bytes_sent\":1000000,\"bytes_received\":1000000,\"lane_bytes_sent\":[1000000]}]}\n"
               "{\"round\":2,\"fragment\":0,\"step\":40,\"sync_s\":0.25,\"frame_bytes\":500,\"elements\":1000,"
               "\"err2\":4,\"ref2\":100,\"plan_epoch\":0,\"peers\":[{\"site\":\"" +
               peer +
               "\",\"rank\":0,\"bytes_sent\":1500000,\"bytes_received\":1500000,\"lane_bytes_sent\":[1500000]}]}\n");
  }
  d.file("run/trace.json", R"([{"name":"process_name","ph":"M","pid":0,"args":{"name":"paris rank 0"}},)"
                           R"({"name":"forward_backward","ph":"X","ts":1000000,"dur":500000,"pid":0,"tid":0},)"
                           R"({"name":"wait","ph":"X","ts":1500000,"dur":200000,"pid":0,"tid":0},)"
                           R"({"name":"send","ph":"X","ts":1500000,"dur":150000,"pid":0,"tid":0}])");
  fs::create_directories(d.path() / "run/checkpoints/paris/step_20");
  if (finished) d.file("run/summary.json", R"({"run":"synthetic","completed":true,"steps":40,"final_loss":2.6})");
}

const Figure* find(const FigureSet& s, const std::string& id) {
  for (const auto& f : s.figures)
    if (f.id == id) return &f;
  return nullptr;
}

// Point markers gnuplot drew for the data of plot number `n` (1-based) of an SVG figure: its
// group's markers less the one sample it draws in the key.
size_t markers_of_plot(const std::string& svg, int n) {
  const std::string open = "gnuplot_plot_" + std::to_string(n) + "\"";
  size_t a = svg.find(open);
  if (a == std::string::npos) return 0;
  size_t b = svg.find("gnuplot_plot_" + std::to_string(n + 1) + "\"", a);
  if (b == std::string::npos) b = svg.find("</svg>", a);
  size_t count = 0;
  for (size_t p = svg.find("<use", a); p != std::string::npos && p < b; p = svg.find("<use", p + 4)) ++count;
  return count == 0 ? 0 : count - 1;
}

}  // namespace

// The saved config is read as YAML, whatever its style: block mappings whose `name` is not
// the first key set the site order, and `run.name` names a run that has no summary yet.
TEST(ReportData, SiteOrderAndNameFromBlockStyleConfig) {
  TempDir d("report");
  write_run(d, /*finished=*/false);
  d.file("run/config.yaml",
         "run: {seed: 3,\n  name: blocky}\nsites:\n  - host: 127.0.0.1\n    name: paris\n"
         "  - ranks: 1\n    # lyon second, not alphabetical\n    name: lyon\n");
  const RunData run = load_run(d.file("run"));
  EXPECT_EQ(run.name, "blocky");
  ASSERT_EQ(run.sites.size(), 2u);
  EXPECT_EQ(run.sites[0].site, "paris");
  EXPECT_EQ(run.sites[1].site, "lyon");
}

// A damaged config.yaml is a note, and the report still reads the metrics.
TEST(ReportData, DamagedConfigIsANote) {
  TempDir d("report");
  write_run(d);
  d.file("run/config.yaml", "sites: [ {name: paris\n");
  const RunData run = load_run(d.file("run"));
  ASSERT_EQ(run.sites.size(), 2u);
  bool noted = false;
  for (const auto& n : run.notes) noted |= n.find("config.yaml is not valid YAML") != std::string::npos;
  EXPECT_TRUE(noted);
}

TEST(ReportData, ReadsEveryFileOfARun) {
  TempDir d("report");
  write_run(d);
  const RunData run = load_run(d.file("run"));
  EXPECT_EQ(run.name, "synthetic");
  EXPECT_TRUE(run.complete);
  ASSERT_EQ(run.sites.size(), 2u);
  EXPECT_EQ(run.sites[0].site, "paris");  // config order, not alphabetical
  EXPECT_EQ(run.sites[1].site, "lyon");
  EXPECT_EQ(run.sites[0].lines.size(), 4u);
  EXPECT_EQ(run.rounds.size(), 4u);
  EXPECT_EQ(run.spans.size(), 3u);
  EXPECT_EQ(run.process_names.at(0), "paris rank 0");
  ASSERT_EQ(run.events.size(), 1u);
  EXPECT_EQ(run.events[0].what, "checkpoint");
  EXPECT_EQ(run.events[0].step, 20);
}

TEST(ReportData, ADirectoryThatIsNotARunIsRefusedClearly) {
  TempDir d("report");
  d.file("notarun/readme.txt", "x");
  try {
    load_run(d.file("notarun"));
    FAIL() << "expected InputError";
  } catch (const geoloco::InputError& e) {
    EXPECT_NE(std::string(e.what()).find("is not a geoloco run directory"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_run(d.file("missing")), geoloco::InputError);
}

TEST(ReportData, ARunStillWritingIsReportedIncompleteWithWhatExists) {
  TempDir d("report");
  write_run(d, /*finished=*/false);
  // The trainer is in the middle of a line; a damaged line earlier is skipped and named.
  std::ofstream(d.file("run/sites/paris/metrics.jsonl"), std::ios::app) << "garbage\n{\"step\":50,\"loss\":2.";
  const RunData run = load_run(d.file("run"));
  EXPECT_FALSE(run.complete);
  EXPECT_NE(run.status.find("incomplete"), std::string::npos) << run.status;
  EXPECT_EQ(run.sites[0].lines.size(), 4u);
  bool incomplete_note = false, garbage_note = false;
  for (const auto& n : run.notes) {
    incomplete_note |= n.find("metrics.jsonl:6: incomplete last line") != std::string::npos;
    garbage_note |= n.find("metrics.jsonl:5: not a JSON object") != std::string::npos;
  }
  EXPECT_TRUE(incomplete_note && garbage_note);
  TempDir out("report-out");
  ReportFlags f;
  f.runs = {d.file("run")};
  f.output = out.file("r.html");
  EXPECT_NE(run_report(f).find("1 run(s) incomplete"), std::string::npos);
  const std::string html = slurp(f.output);
  EXPECT_NE(html.find("class=\"status incomplete\""), std::string::npos);
  EXPECT_NE(html.find("No summary.json"), std::string::npos);
}

TEST(ReportData, AResumedRunKeepsTheLatestLineOfEachStep) {
  TempDir d("report");
  write_run(d);
  // Resumed from step 20: steps 30 and 40 logged again with other values.
  std::ofstream(d.file("run/sites/lyon/metrics.jsonl"), std::ios::app)
      << "{\"step\":30,\"loss\":1.5,\"site\":\"lyon\"}\n{\"step\":40,\"loss\":1.25,\"site\":\"lyon\"}\n";
  const RunData run = load_run(d.file("run"));
  ASSERT_EQ(run.sites[1].lines.size(), 4u);
  EXPECT_EQ(run.sites[1].lines[3]["loss"], 1.25);
  bool resumed = false;
  for (const auto& e : run.events) resumed |= e.site == "lyon" && e.what.find("resumed") != std::string::npos;
  EXPECT_TRUE(resumed);
}

TEST(ReportFigures, EachFigureCarriesTheDataOfTheRun) {
  TempDir d("report");
  write_run(d);
  const auto set = build_figures({load_run(d.file("run"))});
  const Figure* loss = find(set, "loss_step");
  ASSERT_NE(loss, nullptr);
  ASSERT_EQ(loss->series.size(), 4u);  // train and validation of both sites
  EXPECT_EQ(loss->series[0].title, "paris");
  EXPECT_EQ(loss->series[0].points.size(), 4u);
  EXPECT_EQ(loss->series[2].title, "paris validation");
  EXPECT_EQ(loss->series[2].points.size(), 2u);
  const Figure* wan = find(set, "wan_bytes");
  ASSERT_NE(wan, nullptr);
  EXPECT_DOUBLE_EQ(wan->series[0].points[0].second, 1.0);  // 1e6 bytes in round 1
  EXPECT_DOUBLE_EQ(wan->series[0].points[1].second, 0.5);  // 0.5e6 more in round 2
  const Figure* goodput = find(set, "goodput");
  ASSERT_NE(goodput, nullptr);
  EXPECT_DOUBLE_EQ(goodput->series[0].points[1].second, 0.5e6 / 0.25 / 1e6);
  const Figure* err = find(set, "compression_error");
  ASSERT_NE(err, nullptr);
  EXPECT_DOUBLE_EQ(err->series[0].points[0].second, 0.1);
  EXPECT_DOUBLE_EQ(err->series[0].points[1].second, 0.2);
  const Figure* ratio = find(set, "compression_ratio");
  ASSERT_NE(ratio, nullptr);
  EXPECT_DOUBLE_EQ(ratio->series[0].points[1].second, 8.0);
  ASSERT_NE(find(set, "timeline"), nullptr);
  ASSERT_NE(find(set, "utilization"), nullptr);
  // No plan: the predicted series is absent, not zero.
  EXPECT_EQ(find(set, "sync")->series.size(), 2u);
}

TEST(ReportFigures, SeveralRunsAreOverlaidAndLabelled) {
  TempDir a("report"), b("report");
  write_run(a);
  write_run(b);
  auto ra = load_run(a.file("run")), rb = load_run(b.file("run"));
  rb.name = "other";
  const auto set = build_figures({ra, rb});
  const Figure* loss = find(set, "loss_step");
  ASSERT_NE(loss, nullptr);
  ASSERT_EQ(loss->series.size(), 8u);
  EXPECT_EQ(loss->series[0].title, "synthetic/paris");
  EXPECT_EQ(loss->series[2].title, "other/paris");
}

TEST(ReportPage, RendersEveryFigureAsInlineSvgWithOneMarkerPerLoggedStep) {
  TempDir d("report");
  write_run(d);
  ReportFlags f;
  f.runs = {d.file("run")};
  const std::string line = run_report(f);
  EXPECT_NE(line.find("report written to"), std::string::npos);
  const std::string html = slurp(d.file("run/report.html"));
  EXPECT_EQ(html.find("<script"), std::string::npos);  // nothing runs, nothing is fetched
  EXPECT_EQ(html.find("http://"), html.find("http://www.w3.org"));
  EXPECT_EQ(html.find("<?xml"), std::string::npos);
  // The loss figure: series 1 (paris, train) has one marker per logged step.
  const size_t at = html.find("data-figure=\"loss_step\"");
  ASSERT_NE(at, std::string::npos);
  const std::string fig = html.substr(at, html.find("</section>", at) - at);
  EXPECT_NE(fig.find("<svg"), std::string::npos);
  EXPECT_EQ(markers_of_plot(fig, 1), 4u);
  EXPECT_EQ(markers_of_plot(fig, 3), 2u);  // paris validation
  for (const char* id : {"loss_time", "tokens", "utilization", "exposed_wait", "sync", "wan_bytes", "goodput",
                         "compression_ratio", "compression_error", "timeline"})
    EXPECT_NE(html.find(std::string("data-figure=\"") + id + "\""), std::string::npos) << id;
  EXPECT_NE(html.find("name: synthetic"), std::string::npos);  // the config
  EXPECT_NE(html.find("final_loss"), std::string::npos);       // the summary
}

// The per-site strategy table: each site once, with its rank count, strategy (hybrid's group
// size), collective bytes and why (strategy: auto's reason, or the config).
TEST(ReportPage, EachSitesStrategyAndWhy) {
  TempDir d("report");
  write_run(d);
  d.file("run/summary.json",
         R"({"run":"synthetic","completed":true,"steps":40,"ranks":[)"
         R"({"site":"paris","memory":{"strategy":"hybrid","group_size":2},"site_bytes_per_step":5.0e6,)"
         R"("cross_group_bytes_per_step":1.7e6,"strategy_choice":{"strategy":"hybrid","group_size":2,)"
         R"("topology":"links/topo_bridged_pairs.yaml","reason":"hybrid is the fastest strategy"},)"
         R"("address":"198.19.1.2"},)"
         R"({"site":"paris","memory":{"strategy":"hybrid","group_size":2},"address":"198.19.1.3"},)"
         R"({"site":"lyon","memory":{"strategy":"fsdp"},"site_bytes_per_step":5.05e6}]})");
  ReportFlags f;
  f.runs = {d.file("run")};
  run_report(f);
  const std::string html = slurp(d.file("run/report.html"));
  const size_t at = html.find("<h3>Sites</h3>");
  ASSERT_NE(at, std::string::npos);
  const std::string table = html.substr(at, html.find("</table>", at) - at);
  EXPECT_NE(table.find("<td>paris</td><td>2</td><td>198.19.1.2 (1), 198.19.1.3 (1)</td><td>hybrid (groups of 2)</td>"
                       "<td>5e+06</td><td>1.7e+06</td>"
                       "<td>strategy: auto (links/topo_bridged_pairs.yaml): hybrid is the fastest strategy</td>"),
            std::string::npos)
      << table;
  EXPECT_NE(table.find("<td>lyon</td><td>1</td><td></td><td>fsdp</td><td>5.05e+06</td><td></td><td>as configured</td>"),
            std::string::npos)
      << table;
}

// outer.plan: auto's plans table says each plan's exchange (outer.exchange: auto); a plan
// written before the owner exchange reads as all_to_all.
TEST(ReportPage, ThePlansTableSaysEachPlansExchange) {
  TempDir d("report");
  write_run(d);
  d.file("run/plan.json",
         R"({"format":"geoloco-plan","plans":[)"
         R"({"epoch":1,"interval":30,"fragments":1,"codec":"fp16","lanes":1,"predicted_fragment_sync_s":0.01,)"
         R"("predicted_utilization":0.9,"reason":"first"},)"
         R"({"epoch":2,"interval":40,"fragments":2,"codec":"int8","lanes":2,"exchange":"owner",)"
         R"("predicted_fragment_sync_s":0.02,"predicted_utilization":0.95,"reason":"second"}]})");
  ReportFlags f;
  f.runs = {d.file("run")};
  run_report(f);
  const std::string html = slurp(d.file("run/report.html"));
  const size_t at = html.find("<h3>Plans (outer.plan: auto)</h3>");
  ASSERT_NE(at, std::string::npos);
  const std::string table = html.substr(at, html.find("</table>", at) - at);
  EXPECT_NE(table.find("<th>exchange</th>"), std::string::npos) << table;
  EXPECT_NE(table.find("<td>1</td><td>all_to_all</td>"), std::string::npos) << table;
  EXPECT_NE(table.find("<td>2</td><td>owner</td>"), std::string::npos) << table;
}

TEST(ReportPage, BadOutputFolderIsAnInputError) {
  TempDir d("report");
  write_run(d);
  ReportFlags f;
  f.runs = {d.file("run")};
  f.output = d.file("no/such/folder/r.html");
  EXPECT_THROW(run_report(f), geoloco::InputError);
}

// The binary end to end: a two-site run writes config.yaml and one rounds line per round
// per rank; `geoloco report` draws them; a directory that is not a run exits 2.
TEST(ReportCommand, TwoSiteRunEndToEnd) {
  TempDir d("report-run");
  const int port = geoloco::test::fresh_port();
  d.file("k.psk", "0123456789abcdef-test-key");
  const std::string out = (d.path() / "out").string();
  const std::string cfg =
      d.file("c.yaml", "run: {name: e2e, seed: 3, output_dir: " + out +
                           "}\nmodel: {n_layer: 1, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 64}\n"
                           "data:\n  train: {kind: synthetic, vocab: 64, branching: 3, seed: 5}\n"
                           "train: {steps: 20, micro_batch: 2, log_every: 2, eval_every: 10}\n"
                           "outer: {interval: 5, compression: {codec: int8, error_feedback: true}}\n"
                           "sites:\n  - {name: paris, port: " +
                           std::to_string(port) + "}\n  - {name: lyon, port: " + std::to_string(port + 10) +
                           "}\ntransport: {psk_file: k.psk, connect_timeout_s: 20}\n");
  const std::string bin = std::string(GEOLOCO_BINARY_DIR) + "/geoloco";
  ASSERT_EQ(std::system((bin + " launch " + cfg + " > " + d.file("launch.log") + " 2>&1").c_str()), 0)
      << slurp(d.file("launch.log"));
  EXPECT_NE(slurp(out + "/config.yaml").find("name: e2e"), std::string::npos);
  for (const char* site : {"paris", "lyon"}) {
    std::ifstream in(out + "/sites/" + site + "/rounds.r0.jsonl");
    int n = 0;
    for (std::string l; std::getline(in, l);) ++n;
    EXPECT_EQ(n, 4) << site;  // 20 steps / H 5
  }
  ASSERT_EQ(std::system((bin + " report " + out + " > " + d.file("report.log") + " 2>&1").c_str()), 0)
      << slurp(d.file("report.log"));
  const std::string html = slurp(out + "/report.html");
  const auto run = load_run(out);
  const auto figs = build_figures({run});
  const Figure* err = find(figs, "compression_error");
  ASSERT_NE(err, nullptr);
  for (const auto& [x, y] : err->series[0].points) {
    EXPECT_GT(y, 0.0);  // int8 loses something
    EXPECT_LT(y, 0.1);  // and not much
  }
  EXPECT_NEAR(find(figs, "compression_ratio")->series[0].points[0].second, 3.9, 0.2);
  // Markers of paris's training loss = its logged steps.
  const size_t at = html.find("data-figure=\"loss_step\"");
  ASSERT_NE(at, std::string::npos);
  EXPECT_EQ(markers_of_plot(html.substr(at, html.find("</section>", at) - at), 1), run.sites[0].lines.size());
  const int rc = std::system((bin + " report " + d.str() + " > " + d.file("bad.log") + " 2>&1").c_str());
  EXPECT_EQ(WEXITSTATUS(rc), 2);
  EXPECT_NE(slurp(d.file("bad.log")).find("is not a geoloco run directory"), std::string::npos);
}
