// LiveMetrics: a rank's Prometheus endpoint (run.metrics_port): what the rank logs, as gauges
// and counters a Prometheus server scrapes and a Grafana dashboard draws while the run goes
// (docs/report.md lists every metric; docs/grafana/geoloco.json is the dashboard). Global rank
// g serves http://<run.metrics_host>:<run.metrics_port + g>/metrics. The values come from the
// same JSON the rank writes to metrics.jsonl and rounds.r<rank>.jsonl, and a scrape sees one
// consistent snapshot (all values of the same update). The text format is prometheus-cpp's;
// the HTTP server is cpp-httplib's (prometheus-cpp's own civetweb server cannot start its
// threads in a process that loaded OpenBLAS on this CPU: pthread_create EINVAL).
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

namespace httplib {
class Server;
}

namespace geoloco::trainer {

class LiveMetrics {
 public:
  struct Labels {
    std::string run, site;
    int rank = 0;
  };
  // Serves at host:port now. InputError naming run.metrics_port when the address cannot be
  // bound (in use, not this machine's, no permission): a bad port fails the start, never
  // silently serves nothing.
  LiveMetrics(const std::string& host, int port, Labels labels, int64_t total_steps, int sites);
  ~LiveMetrics();
  LiveMetrics(const LiveMetrics&) = delete;
  LiveMetrics& operator=(const LiveMetrics&) = delete;

  // A metrics.jsonl line: step, loss, val_loss, tokens_per_s, compute_utilization, sync_s, ...
  void on_line(const nlohmann::json& line);
  // A rounds.r<rank>.jsonl line: per-peer bytes, compression ratio, plan epoch.
  void on_round(const nlohmann::json& round);
  // The run ended (completed = true) or stopped.
  void on_end(bool completed);

  // The text a scrape returns (for tests without HTTP).
  std::string scrape_text() const;

 private:
  class Collector;
  std::shared_ptr<Collector> collector_;
  std::unique_ptr<httplib::Server> server_;  // cpp-httplib: serves GET /metrics on thread_
  std::thread thread_;
};

}  // namespace geoloco::trainer
