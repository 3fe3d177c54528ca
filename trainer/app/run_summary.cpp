// The run's summary.json and the closing lines the launch prints (run_summary.hpp).
#include "trainer/app/run_summary.hpp"

#include <fmt/format.h>

#include <cmath>
#include <filesystem>

#include "core/atomic_file.hpp"
#include "trainer/loop/metrics.hpp"

namespace geoloco::app {

namespace {
std::string bytes_text(double b) {
  if (b >= 1e9) return fmt::format("{:.2f} GB", b / 1e9);
  if (b >= 1e6) return fmt::format("{:.2f} MB", b / 1e6);
  if (b >= 1e3) return fmt::format("{:.1f} kB", b / 1e3);
  return fmt::format("{:.0f} B", b);
}
double num(const nlohmann::json& j, const char* k) {
  return j.contains(k) && j[k].is_number() ? j[k].get<double>() : NAN;
}
}  // namespace

nlohmann::json write_run_summary(const trainer::RunConfig& cfg, const std::vector<nlohmann::json>& ranks,
                                 const nlohmann::json& totals) {
  nlohmann::json s = ranks.at(0);
  if (totals.is_object()) s.update(totals);
  s.erase("rank");
  s.erase("global_rank");
  s["sites"] = cfg.sites.size();
  s["world_size"] = cfg.world_size();
  if (ranks.size() > 1) s["ranks"] = ranks;
  const auto path = std::filesystem::path(cfg.run.output_dir) / "summary.json";
  write_text_atomically(path.string(), s.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n");
  return s;
}

void print_human_summary(const trainer::RunConfig& cfg, const nlohmann::json& s) {
  fmt::print("\ngeoloco: run '{}' {} in {}\n", cfg.run.name, s.value("completed", false) ? "finished" : "stopped",
             trainer::format_duration(num(s, "wall_s")));
  // A run stopped before its first evaluation has no validation loss yet.
  const double val = num(s, "val_loss");
  const std::string val_text = std::isnan(val) ? "no validation yet" : fmt::format("validation {:.4f}", val);
  if (s.contains("rehearsal") && s["rehearsal"].is_object()) {
    const auto& r = s["rehearsal"];
    fmt::print("  rehearsal: {} stand-in steps of {} s over {} parameters (no model compute, no loss){}\n",
               s.value("steps", 0), r.value("step_seconds", 0.0), trainer::format_rate(num(s, "params")),
               r.value("overrun_steps", 0) > 0
                   ? fmt::format("; {} steps overran (the drift took longer than a step)", r.value("overrun_steps", 0))
                   : std::string());
    if (r.contains("predicted"))
      fmt::print("  plan predicted {:.1f}% compute utilization and {:.3f} s per fragment sync\n",
                 100.0 * r["predicted"].value("compute_utilization", 0.0),
                 r["predicted"].value("fragment_sync_s", 0.0));
  } else {
    fmt::print("  loss {:.4f} ({}) after {} steps; {} tokens at {} tokens/s\n", num(s, "final_loss"), val_text,
               s.value("steps", 0), trainer::format_rate(num(s, "tokens")),
               trainer::format_rate(num(s, "tokens_per_s")));
  }
  if (s.contains("init_from") && s["init_from"].is_string())
    fmt::print("  started from {} (train.init_from)\n", s["init_from"].get<std::string>());
  if (s.contains("outer_steps")) {
    const double wan = num(s, "wan_bytes_sent_total"), ddp = num(s, "ddp_equivalent_wan_bytes");
    const int frags = s.value("outer_fragments", 1);
    if (frags > 1)
      fmt::print("  {} outer rounds ({} streaming fragments) across {} sites; WAN {} sent", s.value("outer_steps", 0),
                 frags, cfg.sites.size(), bytes_text(wan));
    else
      fmt::print("  {} outer steps across {} sites; WAN {} sent", s.value("outer_steps", 0), cfg.sites.size(),
                 bytes_text(wan));
    if (wan > 0 && std::isfinite(ddp))
      fmt::print(", {:.0f}x fewer bytes than per-step data parallelism ({})", ddp / wan, bytes_text(ddp));
    fmt::print("\n");
    if (s.value("outer_exchange", std::string()) == "owner")
      fmt::print(
          "  exchange: owner (outer.exchange): each site sent about 2(S-1)/S = {:.3g} of its shard per round "
          "instead of {}\n",
          2.0 * double(cfg.sites.size() - 1) / double(cfg.sites.size()), cfg.sites.size() - 1);
  }
  if (s.contains("membership") && s["membership"].is_object() && s["membership"].contains("evictions")) {
    const auto& m = s["membership"];
    for (const auto& e : m["evictions"])
      fmt::print("  site {} left the run at outer round {} (inner step {}): {}\n", e.value("site", "?"),
                 e.value("round", 0), e.value("step", 0), e.value("why", ""));
    if (!m["evictions"].empty()) {
      std::string names;
      for (const auto& n : m["members"]) names += (names.empty() ? "" : ", ") + n.get<std::string>();
      fmt::print("  finished with {} (min_sites {})\n", names, m.value("min_sites", 0));
    }
  }
  if (s.contains("compute_utilization"))
    fmt::print("  compute utilization {:.1f}% (exposed wait {:.1f} s; timeline in trace.json)\n",
               100.0 * num(s, "compute_utilization"), num(s, "exposed_wait_s"));
  fmt::print("  outputs: {}/ (summary.json, metrics.jsonl, checkpoints/); plots: geoloco report {}\n",
             cfg.run.output_dir, cfg.run.output_dir);
}

}  // namespace geoloco::app
