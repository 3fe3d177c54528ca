// RunRecords: where one rank's records of a run go -- metrics.jsonl (the site's rank 0 under
// sites/<site>/, global rank 0 at the top), the outer rounds (sites/<site>/rounds.r<rank>.jsonl),
// the Prometheus endpoint (run.metrics_port), the launcher's status view (one JSON line per
// logged step on a pipe) and the progress line on a terminal. The training loop hands it each
// line; it owns every sink.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainer/loop/live_metrics.hpp"
#include "trainer/loop/metrics.hpp"
#include "trainer/loop/run_config.hpp"

namespace geoloco::trainer {

class RunRecords {
 public:
  // `append`: a resumed or joining process continues the files; a fresh one starts them (an
  // earlier run's rounds are removed). `status_fd`: the launcher's status pipe (-1: none).
  RunRecords(const RunConfig& cfg, int site, int rank, bool append, bool progress, int status_fd);

  // A line of the site's log (the site's rank 0 prints it, above the progress line).
  void log(const std::string& msg);
  // The outer loop's finished rounds.
  void rounds(std::vector<nlohmann::json> finished);
  // A metrics line at `step` (loss, tokens/s, elapsed; val_loss NaN when not evaluated).
  void line(const nlohmann::json& line);
  // The end of this process's run (completed: the run's last step).
  void end(int64_t step, bool completed);

 private:
  void report_status(const nlohmann::json& line, bool done);

  const RunConfig& cfg_;
  const SiteConfig& site_;
  int rank_;
  bool append_;
  int status_fd_;
  std::filesystem::path rounds_path_;
  std::unique_ptr<MetricsWriter> metrics_;      // sites/<site>/metrics.jsonl (site rank 0)
  std::unique_ptr<MetricsWriter> run_metrics_;  // metrics.jsonl (global rank 0)
  std::unique_ptr<MetricsWriter> rounds_;       // opened at the first finished round
  std::unique_ptr<LiveMetrics> live_;           // this rank's Prometheus endpoint
  std::unique_ptr<ProgressLine> progress_;
  nlohmann::json status_;  // what the launcher's status view shows
};

}  // namespace geoloco::trainer
