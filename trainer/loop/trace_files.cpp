// Every rank's trace file and their merge into trace.json (trace_files.hpp).
#include "trainer/loop/trace_files.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "core/atomic_file.hpp"
#include "core/hash.hpp"

namespace fs = std::filesystem;

namespace geoloco::trainer {

namespace {

constexpr int kTraceVersion = 1;
using Clock = std::chrono::steady_clock;

fs::path rank_trace_path(const RunConfig& cfg, int s, int r) {
  return fs::path(cfg.run.output_dir) / "sites" / cfg.sites.at(static_cast<size_t>(s)).name /
         fmt::format("trace.r{}.json", r);
}

// A rank's trace file if it is complete and belongs to this run segment, else null.
nlohmann::json read_rank_trace(const RunConfig& cfg, const fs::path& p, int64_t end_step) {
  std::ifstream in(p);
  if (!in) return nullptr;
  auto doc = nlohmann::json::parse(in, nullptr, false);
  if (doc.is_discarded() || !doc.is_object() || doc.value("geoloco_trace", 0) != kTraceVersion ||
      doc.value("end_step", int64_t{-1}) != end_step || doc.value("config_hash", std::string()) != hex64(cfg.hash) ||
      !doc.contains("events") || !doc["events"].is_array())
    return nullptr;
  return doc;
}

}  // namespace

void write_trace_files(const RunConfig& cfg, int site, int rank, int64_t end_step, const TraceRecorder& trace,
                       uint64_t members) {
  const int global_rank = cfg.global_rank(site, rank);
  nlohmann::json mine = {{"geoloco_trace", kTraceVersion},
                         {"end_step", end_step},
                         {"global_rank", global_rank},
                         {"config_hash", hex64(cfg.hash)},
                         {"events", trace.to_json(global_rank)}};
  write_text_atomically(rank_trace_path(cfg, site, rank).string(), mine.dump() + "\n");
  // The first site still in the run merges the traces of the sites still in it.
  int first = 0;
  while (first < static_cast<int>(cfg.sites.size()) && !((members >> first) & 1)) ++first;
  if (site != first || rank != 0) return;

  nlohmann::json merged = nlohmann::json::array();
  std::vector<std::string> missing;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  for (int s = 0; s < static_cast<int>(cfg.sites.size()); ++s)
    for (int r = 0; r < cfg.sites[static_cast<size_t>(s)].ranks && ((members >> s) & 1); ++r) {
      const int g = cfg.global_rank(s, r);
      nlohmann::json doc;
      for (;;) {
        doc = read_rank_trace(cfg, rank_trace_path(cfg, s, r), end_step);
        if (!doc.is_null() || Clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (doc.is_null()) {
        missing.push_back(fmt::format("{}/r{}", cfg.sites[static_cast<size_t>(s)].name, r));
        continue;
      }
      const std::string pname = fmt::format("{} rank {}", cfg.sites[static_cast<size_t>(s)].name, r);
      merged.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", g}, {"args", {{"name", pname}}}});
      merged.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", g}, {"args", {{"sort_index", g}}}});
      const char* tnames[] = {"inner loop", "outer loop", "transport"};
      for (int t = 0; t < 3; ++t)
        merged.push_back(
            {{"name", "thread_name"}, {"ph", "M"}, {"pid", g}, {"tid", t}, {"args", {{"name", tnames[t]}}}});
      // Fragment workers (outer.fragments, or whatever count outer.plan: auto chose).
      std::set<int> fragment_tids;
      for (const auto& e : doc["events"])
        if (e["tid"].get<int>() > TraceRecorder::kFragmentThreadBase) fragment_tids.insert(e["tid"].get<int>());
      for (int t : fragment_tids)
        merged.push_back(
            {{"name", "thread_name"},
             {"ph", "M"},
             {"pid", g},
             {"tid", t},
             {"args", {{"name", fmt::format("outer loop, fragment {}", t - TraceRecorder::kFragmentThreadBase)}}}});
      for (auto& e : doc["events"]) merged.push_back(std::move(e));
    }
  if (!missing.empty())
    spdlog::warn("trace.json: no trace ending at step {} from {} after 30 s; merged the others", end_step,
                 fmt::join(missing, ", "));
  write_text_atomically((fs::path(cfg.run.output_dir) / "trace.json").string(), merged.dump() + "\n");
}

}  // namespace geoloco::trainer
