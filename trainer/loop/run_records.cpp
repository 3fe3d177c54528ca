// One rank's records of a run: metrics files, rounds, live metrics, status, progress (run_records.hpp).
#include "trainer/loop/run_records.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "core/fd.hpp"

namespace fs = std::filesystem;

namespace geoloco::trainer {

RunRecords::RunRecords(const RunConfig& cfg, int site, int rank, bool append, bool progress, int status_fd)
    : cfg_(cfg), site_(cfg.sites.at(static_cast<size_t>(site))), rank_(rank), append_(append), status_fd_(status_fd) {
  const fs::path out = cfg.run.output_dir, site_dir = out / "sites" / site_.name;
  fs::create_directories(site_dir);
  rounds_path_ = site_dir / fmt::format("rounds.r{}.jsonl", rank);
  const int global_rank = cfg.global_rank(site, rank);
  if (rank == 0) metrics_ = std::make_unique<MetricsWriter>((site_dir / "metrics.jsonl").string(), append);
  if (global_rank == 0) run_metrics_ = std::make_unique<MetricsWriter>((out / "metrics.jsonl").string(), append);
  if (cfg.run.metrics_port > 0) {
    live_ = std::make_unique<LiveMetrics>(cfg.run.metrics_host, cfg.run.metrics_port + global_rank,
                                          LiveMetrics::Labels{cfg.run.name, site_.name, rank}, cfg.train.steps,
                                          static_cast<int>(cfg.sites.size()));
    spdlog::info("metrics: http://{}:{}/metrics", cfg.run.metrics_host, cfg.run.metrics_port + global_rank);
  }
  // A fresh run removes an earlier run's rounds now, so none of them survive.
  if (!append) fs::remove(rounds_path_);
  if (global_rank == 0 || cfg.world_size() == 1) progress_ = std::make_unique<ProgressLine>(progress, cfg.train.steps);
}

void RunRecords::log(const std::string& msg) {
  if (progress_) progress_->clear();
  if (rank_ == 0) spdlog::info("{}", msg);
}

void RunRecords::rounds(std::vector<nlohmann::json> finished) {
  for (auto& r : finished) {
    if (!rounds_) rounds_ = std::make_unique<MetricsWriter>(rounds_path_.string(), append_);
    r["site"] = site_.name;
    r["rank"] = rank_;
    rounds_->write(r);
    if (live_) live_->on_round(r);
    if (r.contains("peers")) status_["members"] = 1 + r["peers"].size();
  }
}

void RunRecords::line(const nlohmann::json& line) {
  if (metrics_) metrics_->write(line);
  if (run_metrics_) run_metrics_->write(line);
  if (live_) live_->on_line(line);
  report_status(line, false);
  if (progress_)
    progress_->update(line.value("step", int64_t{0}), line.value("loss", NAN), line.value("tokens_per_s", 0.0),
                      line.value("elapsed_s", 0.0), line.contains("val_loss") ? line.value("val_loss", NAN) : NAN);
}

void RunRecords::end(int64_t step, bool completed) {
  if (progress_) progress_->finish();
  if (live_) live_->on_end(completed);
  if (completed) report_status({{"step", step}}, true);
}

// One JSON line to the launcher's status view: the latest value of every field so far.
void RunRecords::report_status(const nlohmann::json& line, bool done) {
  if (status_fd_ < 0) return;
  for (const char* k :
       {"step", "loss", "val_loss", "tokens_per_s", "elapsed_s", "sync_s", "exposed_wait_s", "compute_utilization"})
    if (line.contains(k)) status_[k] = line[k];
  status_["site"] = site_.name;
  status_["steps"] = cfg_.train.steps;
  status_["sites"] = cfg_.sites.size();
  status_["done"] = done;
  const std::string text = status_.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  (void)write_all(status_fd_, text.data(), text.size());  // a pipe: a failure only loses the view
}

}  // namespace geoloco::trainer
