#include "tools/report/run_data.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "core/error.hpp"

namespace geoloco::report {
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The latest line per step, in step order; a step logged again (a resume replays the steps
// after its checkpoint) keeps the later line and is noted as a resume.
std::vector<nlohmann::json> by_step(std::vector<nlohmann::json> lines, const std::string& site,
                                    std::vector<Event>& events) {
  std::map<int64_t, nlohmann::json> latest;
  int64_t prev = -1;
  for (auto& l : lines) {
    if (!l.contains("step") || !l["step"].is_number_integer()) continue;
    const int64_t step = l["step"].get<int64_t>();
    if (step <= prev) events.push_back({step, site, fmt::format("resumed: steps from {} logged again", step)});
    prev = step;
    latest[step] = std::move(l);
  }
  std::vector<nlohmann::json> out;
  for (auto& [s, l] : latest) out.push_back(std::move(l));
  return out;
}

void load_trace(RunData& run) {
  const fs::path p = fs::path(run.dir) / "trace.json";
  if (!fs::exists(p)) {
    run.notes.push_back("no trace.json (written at the end of a run): no sync timeline");
    return;
  }
  auto doc = nlohmann::json::parse(slurp(p), nullptr, false);
  if (doc.is_discarded() || !doc.is_array()) {
    run.notes.push_back("trace.json is not a trace-event array: skipped");
    return;
  }
  double t_min = 1e300;
  for (const auto& e : doc) {
    if (!e.is_object()) continue;
    const std::string ph = e.value("ph", "");
    if (ph == "M" && e.value("name", "") == "process_name" && e.contains("args"))
      run.process_names[e.value("pid", 0)] = e["args"].value("name", "");
    if (ph != "X" || !e.contains("ts") || !e["ts"].is_number()) continue;
    Span s;
    s.pid = e.value("pid", 0);
    s.tid = e.value("tid", 0);
    s.name = e.value("name", "");
    s.t0 = e["ts"].get<double>() * 1e-6;
    s.dur = e.value("dur", 0.0) * 1e-6;
    t_min = std::min(t_min, s.t0);
    run.spans.push_back(std::move(s));
  }
  for (auto& s : run.spans) s.t0 -= t_min;
}

void load_rounds(RunData& run, const fs::path& site_dir, const std::string& site) {
  static const std::regex name_re(R"(rounds\.r(\d+)\.jsonl)");
  for (const auto& e : fs::directory_iterator(site_dir)) {
    std::smatch m;
    const std::string fname = e.path().filename().string();
    if (!std::regex_match(fname, m, name_re)) continue;
    const int rank = std::stoi(m[1]);
    std::map<int64_t, nlohmann::json> latest;  // a resume replays rounds: keep the later line
    for (auto& l : read_json_lines(e.path().string(), run.notes))
      if (l.contains("round") && l["round"].is_number_integer()) {
        const int64_t round = l["round"].get<int64_t>();  // before the move: json's operator= takes by value
        latest[round] = std::move(l);
      }
    for (auto& [r, l] : latest) run.rounds.push_back({site, rank, std::move(l)});
  }
}

}  // namespace

std::vector<nlohmann::json> read_json_lines(const std::string& path, std::vector<std::string>& notes) {
  std::vector<nlohmann::json> out;
  const std::string text = slurp(path);
  size_t pos = 0;
  int line_no = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    const bool last = nl == std::string::npos;
    const std::string line = text.substr(pos, last ? std::string::npos : nl - pos);
    ++line_no;
    pos = last ? text.size() : nl + 1;
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_discarded() && j.is_object()) {
      out.push_back(std::move(j));
    } else if (last) {
      notes.push_back(fmt::format("{}:{}: incomplete last line (the run was writing it): skipped", path, line_no));
    } else {
      notes.push_back(fmt::format("{}:{}: not a JSON object: skipped", path, line_no));
    }
  }
  return out;
}

RunData load_run(const std::string& dir) {
  RunData run;
  run.dir = dir;
  const fs::path root(dir);
  if (!fs::is_directory(root)) throw InputError(fmt::format("report: {}: no such run directory", dir));
  const fs::path sites_dir = root / "sites";
  std::vector<fs::path> site_metrics;
  if (fs::is_directory(sites_dir))
    for (const auto& e : fs::directory_iterator(sites_dir))
      if (fs::exists(e.path() / "metrics.jsonl")) site_metrics.push_back(e.path());
  std::sort(site_metrics.begin(), site_metrics.end());
  if (site_metrics.empty() && !fs::exists(root / "metrics.jsonl"))
    throw InputError(
        fmt::format("report: {} is not a geoloco run directory (no metrics.jsonl, no sites/*/metrics.jsonl; "
                    "give the run's output_dir)",
                    dir));

  if (fs::exists(root / "summary.json")) {
    auto s = nlohmann::json::parse(slurp(root / "summary.json"), nullptr, false);
    if (s.is_discarded() || !s.is_object())
      run.notes.push_back("summary.json is not a JSON object: skipped");
    else
      run.summary = std::move(s);
  }
  if (fs::exists(root / "config.yaml"))
    run.config_text = slurp(root / "config.yaml");
  else
    run.notes.push_back("no config.yaml (runs before 2026-12-02 did not write one)");

  // Site order and run name from the config the run saved (parsed as YAML; a damaged file
  // is a note, not a failure: the report still draws what the metrics hold).
  std::vector<std::string> order;
  std::string config_run_name;
  if (!run.config_text.empty()) {
    try {
      const YAML::Node cfg = YAML::Load(run.config_text);
      if (cfg.IsMap() && cfg["sites"] && cfg["sites"].IsSequence())
        for (const auto& site : cfg["sites"])
          if (site.IsMap() && site["name"] && site["name"].IsScalar()) order.push_back(site["name"].as<std::string>());
      if (cfg.IsMap() && cfg["run"] && cfg["run"].IsMap() && cfg["run"]["name"] && cfg["run"]["name"].IsScalar())
        config_run_name = cfg["run"]["name"].as<std::string>();
    } catch (const YAML::Exception& e) {
      run.notes.push_back(fmt::format("config.yaml is not valid YAML ({}): site order by name", e.what()));
    }
  }
  std::stable_sort(site_metrics.begin(), site_metrics.end(), [&](const fs::path& a, const fs::path& b) {
    auto idx = [&](const fs::path& p) {
      auto it = std::find(order.begin(), order.end(), p.filename().string());
      return it == order.end() ? order.size() : size_t(it - order.begin());
    };
    return idx(a) < idx(b);
  });

  if (!site_metrics.empty()) {
    for (const auto& sd : site_metrics) {
      const std::string site = sd.filename().string();
      run.sites.push_back(
          {site, by_step(read_json_lines((sd / "metrics.jsonl").string(), run.notes), site, run.events)});
      load_rounds(run, sd, site);
    }
  } else {
    // An older single-file layout: group the run's metrics.jsonl by its "site" field.
    std::map<std::string, std::vector<nlohmann::json>> by_site;
    for (auto& l : read_json_lines((root / "metrics.jsonl").string(), run.notes))
      by_site[l.value("site", std::string("site"))].push_back(std::move(l));
    for (auto& [site, lines] : by_site) run.sites.push_back({site, by_step(std::move(lines), site, run.events)});
  }

  if (fs::exists(root / "plan.json")) {
    auto p = nlohmann::json::parse(slurp(root / "plan.json"), nullptr, false);
    if (!p.is_discarded() && p.is_object() && p.contains("plans") && p["plans"].is_array())
      run.plans = p["plans"];
    else
      run.notes.push_back("plan.json is not a geoloco plan document: skipped");
  }
  // Plan changes: a round whose plan epoch differs from the site's previous round.
  std::map<std::pair<std::string, int>, int64_t> epoch_of;
  for (const auto& r : run.rounds) {
    if (r.rank != 0 || !r.j.contains("plan_epoch")) continue;
    const int64_t e = r.j.value("plan_epoch", int64_t{0});
    auto [it, fresh] = epoch_of.try_emplace({r.site, 0}, e);
    if ((fresh && e > 0) || it->second != e)
      run.events.push_back({r.j.value("step", int64_t{0}), r.site, fmt::format("plan epoch {} in force", e)});
    it->second = e;
  }
  load_trace(run);

  // Checkpoints: checkpoints/<site>/step_<N>/.
  static const std::regex step_re(R"(step_(\d+))");
  if (fs::is_directory(root / "checkpoints"))
    for (const auto& sd : fs::directory_iterator(root / "checkpoints")) {
      if (!sd.is_directory()) continue;
      for (const auto& c : fs::directory_iterator(sd.path())) {
        std::smatch m;
        const std::string n = c.path().filename().string();
        if (c.is_directory() && std::regex_match(n, m, step_re))
          run.events.push_back({std::stoll(m[1]), sd.path().filename().string(), "checkpoint"});
      }
    }
  std::stable_sort(run.events.begin(), run.events.end(),
                   [](const Event& a, const Event& b) { return a.step != b.step ? a.step < b.step : a.site < b.site; });

  run.name = run.summary.is_object() && run.summary.contains("run") && run.summary["run"].is_string()
                 ? run.summary["run"].get<std::string>()
                 : "";
  if (run.name.empty()) run.name = config_run_name;
  if (run.name.empty()) run.name = fs::absolute(root).lexically_normal().filename().string();
  if (run.name.empty()) run.name = dir;

  int64_t last_step = 0;
  for (const auto& s : run.sites)
    if (!s.lines.empty()) last_step = std::max(last_step, s.lines.back().value("step", int64_t{0}));
  if (!run.summary.is_object()) {
    run.status =
        fmt::format("incomplete: no summary.json (still running, or it failed); last logged step {}", last_step);
  } else if (run.summary.value("completed", false)) {
    run.complete = true;
    run.status = "finished";
  } else {
    run.status = fmt::format("stopped at step {} before the end (--stop-at-step, or a stop)",
                             run.summary.value("steps", last_step));
  }
  return run;
}

}  // namespace geoloco::report
