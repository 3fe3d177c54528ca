// A rank's Prometheus endpoint: the metrics lines and outer rounds as gauges (live_metrics.hpp).
#include "trainer/loop/live_metrics.hpp"

#include <fmt/format.h>
#include <httplib.h>
#include <prometheus/metric_family.h>
#include <prometheus/text_serializer.h>

#include <chrono>
#include <cmath>
#include <map>
#include <mutex>

#include "core/error.hpp"

namespace geoloco::trainer {

class LiveMetrics::Collector {
 public:
  Collector(Labels l, int64_t total_steps, int sites)
      : labels_(std::move(l)), total_steps_(total_steps), sites_(sites) {}

  void on_line(const nlohmann::json& j) {
    std::lock_guard lk(mu_);
    auto take = [&](const char* key, double& out) {
      if (j.contains(key) && j[key].is_number()) out = j[key].get<double>();
    };
    take("step", step_);
    take("loss", loss_);
    take("val_loss", val_loss_);
    take("tokens_per_s", tokens_per_s_);
    take("tokens", tokens_);
    take("compute_utilization", utilization_);
    take("exposed_wait_s", exposed_wait_);
    take("sync_s", last_sync_);
    take("elapsed_s", elapsed_);
  }

  void on_round(const nlohmann::json& r) {
    std::lock_guard lk(mu_);
    ++rounds_;
    if (r.contains("compression_ratio") && r["compression_ratio"].is_number())
      compression_ratio_ = r["compression_ratio"].get<double>();
    if (r.contains("sync_s") && r["sync_s"].is_number()) last_sync_ = r["sync_s"].get<double>();
    if (r.contains("plan_epoch") && r["plan_epoch"].is_number()) plan_epoch_ = r["plan_epoch"].get<double>();
    if (r.contains("peers") && r["peers"].is_array()) {
      members_ = 1;  // this site
      for (const auto& p : r["peers"]) {
        const std::string peer = fmt::format("{}/{}", p.value("site", "?"), p.value("rank", 0));
        sent_[peer] = double(p.value("bytes_sent", uint64_t{0}));
        received_[peer] = double(p.value("bytes_received", uint64_t{0}));
        ++members_;
      }
    }
  }

  void on_end(bool completed) {
    std::lock_guard lk(mu_);
    running_ = 0;
    completed_ = completed ? 1 : 0;
  }

  std::vector<prometheus::MetricFamily> Collect() const {
    std::lock_guard lk(mu_);
    std::vector<prometheus::MetricFamily> out;
    const std::vector<prometheus::ClientMetric::Label> base = {
        {"run", labels_.run}, {"site", labels_.site}, {"rank", std::to_string(labels_.rank)}};
    auto gauge = [&](const char* name, const char* help, double v) {
      if (std::isnan(v)) return;  // not measured yet: absent, not a made-up 0
      prometheus::MetricFamily f{name, help, prometheus::MetricType::Gauge, {}};
      prometheus::ClientMetric m;
      m.label = base;
      m.gauge.value = v;
      f.metric.push_back(m);
      out.push_back(std::move(f));
    };
    auto counter = [&](const char* name, const char* help, double v) {
      prometheus::MetricFamily f{name, help, prometheus::MetricType::Counter, {}};
      prometheus::ClientMetric m;
      m.label = base;
      m.counter.value = v;
      f.metric.push_back(m);
      out.push_back(std::move(f));
    };
    auto per_peer = [&](const char* name, const char* help, const std::map<std::string, double>& values) {
      if (values.empty()) return;
      prometheus::MetricFamily f{name, help, prometheus::MetricType::Counter, {}};
      for (const auto& [peer, v] : values) {
        prometheus::ClientMetric m;
        m.label = base;
        m.label.push_back({"peer", peer});
        m.counter.value = v;
        f.metric.push_back(m);
      }
      out.push_back(std::move(f));
    };
    gauge("geoloco_step", "Inner steps done by this rank (last logged step).", step_);
    gauge("geoloco_steps", "Inner steps the run trains in all (train.steps).", double(total_steps_));
    gauge("geoloco_loss", "Training loss over the last logging window, nats per token.", loss_);
    gauge("geoloco_validation_loss", "Validation loss at the last evaluation, nats per token.", val_loss_);
    gauge("geoloco_tokens_per_second", "Tokens per second of the whole run over the last logging window.",
          tokens_per_s_);
    counter("geoloco_tokens_total", "Tokens trained by the whole run so far.", std::isnan(tokens_) ? 0 : tokens_);
    gauge("geoloco_elapsed_seconds", "Wall-clock seconds since the run started (resumes included).", elapsed_);
    gauge("geoloco_compute_utilization_ratio", "Share of the last outer period spent in inner steps (0-1).",
          utilization_);
    gauge("geoloco_exposed_wait_seconds", "Seconds the inner loop waited for the outer loop in the last period.",
          exposed_wait_);
    gauge("geoloco_last_sync_seconds", "Wall time of the last outer round (fragment sync), seconds.", last_sync_);
    counter("geoloco_outer_rounds_total", "Outer rounds this rank finished.", double(rounds_));
    gauge("geoloco_compression_ratio", "fp32 bytes over frame bytes of the last round's pseudo-gradient.",
          compression_ratio_);
    gauge("geoloco_plan_epoch", "Plan in force (0: the config's schedule; 1: the start-up plan; then re-plans).",
          plan_epoch_);
    gauge("geoloco_sites", "Sites in the run's config.", double(sites_));
    gauge("geoloco_round_members", "Sites whose contributions were in the last round (this one included).", members_);
    gauge("geoloco_running", "1 while the run trains, 0 once it ended.", running_);
    gauge("geoloco_completed", "1 once the run trained every step.", completed_);
    per_peer("geoloco_wan_bytes_sent_total", "Payload bytes this rank sent to a peer over the WAN.", sent_);
    per_peer("geoloco_wan_bytes_received_total", "Payload bytes this rank received from a peer over the WAN.",
             received_);
    return out;
  }

 private:
  mutable std::mutex mu_;
  const Labels labels_;
  const int64_t total_steps_;
  const int sites_;
  double step_ = 0, loss_ = NAN, val_loss_ = NAN, tokens_per_s_ = NAN, tokens_ = NAN, utilization_ = NAN,
         exposed_wait_ = NAN, last_sync_ = NAN, elapsed_ = NAN, compression_ratio_ = NAN, plan_epoch_ = NAN,
         members_ = NAN, running_ = 1, completed_ = 0;
  uint64_t rounds_ = 0;
  std::map<std::string, double> sent_, received_;
};

LiveMetrics::LiveMetrics(const std::string& host, int port, Labels labels, int64_t total_steps, int sites)
    : collector_(std::make_shared<Collector>(std::move(labels), total_steps, sites)),
      server_(std::make_unique<httplib::Server>()) {
  // One worker: a scrape is a few kilobytes, and the rank's cores belong to training.
  server_->new_task_queue = [] { return new httplib::ThreadPool(1); };
  server_->Get("/metrics", [c = collector_](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus::TextSerializer().Serialize(c->Collect()), "text/plain; version=0.0.4");
  });
  if (!server_->bind_to_port(host, port))
    throw InputError(
        fmt::format("run.metrics_port: cannot serve metrics on {}:{}: the port is in use, or the host "
                    "is not an address of this machine (run.metrics_host)",
                    host, port));
  thread_ = std::thread([s = server_.get()] { s->listen_after_bind(); });
  // stop() only stops a server that runs: wait until it does, so that a LiveMetrics destroyed
  // right away does not leave listen_after_bind() serving forever (and the join hanging).
  for (int i = 0; i < 5000 && !server_->is_running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

LiveMetrics::~LiveMetrics() {
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

void LiveMetrics::on_line(const nlohmann::json& line) { collector_->on_line(line); }
void LiveMetrics::on_round(const nlohmann::json& round) { collector_->on_round(round); }
void LiveMetrics::on_end(bool completed) { collector_->on_end(completed); }

std::string LiveMetrics::scrape_text() const { return prometheus::TextSerializer().Serialize(collector_->Collect()); }

}  // namespace geoloco::trainer
