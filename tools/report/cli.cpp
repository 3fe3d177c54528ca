#include "tools/report/cli.hpp"

#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "tools/report/report_figures.hpp"
#include "tools/report/report_html.hpp"
#include "tools/report/run_data.hpp"
#include "core/error.hpp"
#include "core/atomic_file.hpp"

namespace geoloco::report {
namespace fs = std::filesystem;

std::string run_report(const ReportFlags& f) {
  if (f.runs.empty()) throw InputError("report: give at least one run directory");
  std::string out = f.output;
  if (out.empty()) out = f.runs.size() == 1 ? (fs::path(f.runs[0]) / "report.html").string() : "report.html";
  const fs::path parent = fs::absolute(out).parent_path();
  if (!fs::is_directory(parent))
    throw InputError(fmt::format("report: -o {}: folder {} does not exist", out, parent.string()));
  std::vector<RunData> runs;
  for (const auto& d : f.runs) runs.push_back(load_run(d));
  auto figs = build_figures(runs);
  render_figures(figs);
  write_text_atomically(out, report_html(runs, figs));
  size_t incomplete = 0;
  for (const auto& r : runs) incomplete += !r.complete;
  return fmt::format("geoloco: report written to {} ({} figures{}); open it in a browser: file://{}\n", out,
                     figs.figures.size(), incomplete ? fmt::format(", {} run(s) incomplete", incomplete) : "",
                     fs::absolute(out).lexically_normal().string());
}

void add_report_command(CLI::App& app) {
  auto f = std::make_shared<ReportFlags>();
  auto* cmd = app.add_subcommand("report",
                                 "one self-contained HTML page of a run's curves, rounds, timeline and summary; "
                                 "several runs are overlaid (docs/report.md)");
  cmd->add_option("runs", f->runs, "run directories (a run's output_dir)")->required();
  cmd->add_option("-o,--output", f->output, "HTML file (default RUN_DIR/report.html, or ./report.html for several)");
  cmd->callback([f] { std::cout << run_report(*f) << std::flush; });
}

}  // namespace geoloco::report
