// `geoloco report RUN_DIR... [-o FILE]`: the command-line front-end of the report.
#pragma once

#include <CLI/CLI.hpp>

#include <string>
#include <vector>

namespace geoloco::report {

struct ReportFlags {
  std::vector<std::string> runs;
  std::string output;  // default: RUN_DIR/report.html for one run, ./report.html for several
};

// Writes the report and returns the line to print. InputError for a directory that is not a
// run or a bad output name; Error when gnuplot fails.
std::string run_report(const ReportFlags& f);

void add_report_command(CLI::App& app);

}  // namespace geoloco::report
