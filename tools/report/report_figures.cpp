#include "tools/report/report_figures.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <set>

namespace geoloco::report {
namespace {

using plot::Series;

std::string label(const RunData& run, const std::string& site, size_t runs) {
  return runs > 1 ? run.name + "/" + site : site;
}

double num(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number() ? j[key].get<double>() : NAN;
}

// One series per site of every run: (x_key, y_key) of the metrics lines that have both.
std::vector<Series> metric_series(const std::vector<RunData>& runs, const char* x_key, const char* y_key,
                                  double y_scale = 1.0) {
  std::vector<Series> out;
  for (const auto& run : runs)
    for (const auto& s : run.sites) {
      Series ser{label(run, s.site, runs.size()), {}};
      for (const auto& l : s.lines) {
        const double x = num(l, x_key), y = num(l, y_key);
        if (std::isfinite(x) && std::isfinite(y)) ser.points.emplace_back(x, y * y_scale);
      }
      if (!ser.points.empty()) out.push_back(std::move(ser));
    }
  return out;
}

// Per (run, site, round): the site's ranks' records of that round.
struct SiteRound {
  int64_t round = 0, step = 0;
  std::vector<const RoundRecord*> ranks;
};
std::map<std::string, std::map<int64_t, SiteRound>> rounds_by_site(const RunData& run) {
  std::map<std::string, std::map<int64_t, SiteRound>> out;
  for (const auto& r : run.rounds) {
    auto& sr = out[r.site][r.round()];
    sr.round = r.round();
    sr.step = r.j.value("step", int64_t{0});
    sr.ranks.push_back(&r);
  }
  return out;
}

uint64_t peer_bytes(const nlohmann::json& j, const char* key) {
  uint64_t total = 0;
  if (j.contains("peers") && j["peers"].is_array())
    for (const auto& p : j["peers"]) total += p.value(key, uint64_t{0});
  return total;
}

// Series from every site's rounds: f(site round, previous site round or null) -> y (NaN: none).
template <class F>
std::vector<Series> round_series(const std::vector<RunData>& runs, F&& f) {
  std::vector<Series> out;
  for (const auto& run : runs)
    for (const auto& [site, rounds] : rounds_by_site(run)) {
      Series ser{label(run, site, runs.size()), {}};
      const SiteRound* prev = nullptr;
      for (const auto& [r, sr] : rounds) {
        const double y = f(sr, prev);
        if (std::isfinite(y)) ser.points.emplace_back(double(r), y);
        prev = &sr;
      }
      if (!ser.points.empty()) out.push_back(std::move(ser));
    }
  return out;
}

std::string common_style() {
  return "set grid lc rgb '#dddddd'\nset border lc rgb '#555555'\n"
         "set key outside right top font ',9' noautotitle\nset tics font ',9'\n"
         "set style data linespoints\nset pointsize 0.35\n";
}

// A line plot of `series`: each drawn with points, so the SVG has one marker per point.
std::string line_script(const std::vector<Series>& series, const std::string& xlabel, const std::string& ylabel,
                        const std::string& extra = "") {
  std::string s = common_style() + plot::datablock("d", series);
  s += fmt::format("set xlabel {}\nset ylabel {}\n{}", plot::quote(xlabel), plot::quote(ylabel), extra);
  s += "plot ";
  for (size_t i = 0; i < series.size(); ++i)
    s += fmt::format("{}$d index {} using 1:2 with linespoints lw 1.5 pt 7 title {}", i ? ", " : "", i,
                     plot::quote(series[i].title));
  return s + "\n";
}

void add(FigureSet& set, std::string id, std::string title, std::string caption, std::vector<Series> series,
         const std::string& xlabel, const std::string& ylabel, const std::string& extra = "") {
  if (series.empty()) {
    set.missing.push_back(title + ": " + caption.substr(0, caption.find('.')) + " -- no data in these runs");
    return;
  }
  Figure f{std::move(id), std::move(title), std::move(caption), std::move(series), "", ""};
  f.script = line_script(f.series, xlabel, ylabel, extra);
  set.figures.push_back(std::move(f));
}

// The category of a trace span, and its colour.
const char* category(const std::string& name) {
  if (name == "forward" || name == "backward" || name == "forward_backward" || name == "optimizer") return "compute";
  if (name == "wait") return "exposed wait";
  if (name == "compress") return "compress";
  if (name == "send" || name == "receive") return "send/receive";
  if (name == "decode") return "decode";
  if (name == "hash_check") return "hash check";
  return "outer step";  // outer_step, outer_optimizer, merge
}
const std::vector<std::pair<std::string, std::string>>& categories() {
  static const std::vector<std::pair<std::string, std::string>> c = {
      {"compute", "#4c9be8"}, {"exposed wait", "#e8524c"}, {"compress", "#f0a030"},  {"send/receive", "#7a4ce8"},
      {"decode", "#30b070"},  {"outer step", "#8c6d31"},   {"hash check", "#999999"}};
  return c;
}

void add_timeline(FigureSet& set, const RunData& run, size_t nruns) {
  if (run.spans.empty()) {
    set.missing.push_back(fmt::format("sync timeline{}: no trace.json spans", nruns > 1 ? " of " + run.name : ""));
    return;
  }
  std::set<std::pair<int, int>> rows_set;
  double t_end = 0;
  for (const auto& s : run.spans) {
    rows_set.insert({s.pid, s.tid});
    t_end = std::max(t_end, s.t0 + s.dur);
  }
  std::vector<std::pair<int, int>> rows(rows_set.begin(), rows_set.end());
  std::map<std::pair<int, int>, size_t> row_of;
  for (size_t i = 0; i < rows.size(); ++i) row_of[rows[i]] = i;
  // Merge spans of one category on one row that nearly touch: a readable figure of a long run.
  const double gap = t_end * 1e-3;
  std::map<std::string, std::vector<std::array<double, 3>>> boxes;  // category -> (row, t0, t1)
  std::map<std::pair<size_t, std::string>, size_t> open;            // (row, category) -> index in boxes
  std::vector<const Span*> sorted;
  for (const auto& s : run.spans) sorted.push_back(&s);
  std::sort(sorted.begin(), sorted.end(), [](const Span* a, const Span* b) { return a->t0 < b->t0; });
  for (const Span* s : sorted) {
    const size_t row = row_of[{s->pid, s->tid}];
    const std::string cat = category(s->name);
    auto& v = boxes[cat];
    auto it = open.find({row, cat});
    if (it != open.end() && s->t0 - v[it->second][2] <= gap) {
      v[it->second][2] = std::max(v[it->second][2], s->t0 + s->dur);
      continue;
    }
    v.push_back({double(row), s->t0, s->t0 + s->dur});
    open[{row, cat}] = v.size() - 1;
  }
  std::string script = "set grid x lc rgb '#dddddd'\nset key outside right top font ',9'\nset tics font ',9'\n";
  script += "set xlabel 'seconds since the first traced span'\nset yrange [-0.6:" + fmt::format("{}", rows.size()) +
            "-0.4] reverse\nset ytics (";
  for (size_t i = 0; i < rows.size(); ++i) {
    auto name = run.process_names.count(rows[i].first) ? run.process_names.at(rows[i].first)
                                                       : fmt::format("rank {}", rows[i].first);
    if (rows[i].second == 1) name += " outer";
    if (rows[i].second == 2) name += " transport";
    if (rows[i].second >= 10) name += fmt::format(" fragment {}", rows[i].second - 10);
    script += fmt::format("{}{} {}", i ? ", " : "", plot::quote(name), i);
  }
  script += ")\n";
  std::vector<Series> series;
  std::string plot_cmd = "plot ";
  bool first = true;
  for (const auto& [cat, colour] : categories()) {
    auto it = boxes.find(cat);
    if (it == boxes.end()) continue;
    const size_t idx = series.size();
    Series ser{cat, {}};
    std::string block = fmt::format("$tl{} << EOD\n", idx);
    for (const auto& b : it->second) {
      block +=
          fmt::format("{:.6f} {} {:.6f} {:.6f} {} {}\n", (b[1] + b[2]) / 2, b[0], b[1], b[2], b[0] - 0.35, b[0] + 0.35);
      ser.points.emplace_back(b[1], b[0]);
    }
    script += block + "EOD\n";
    plot_cmd += fmt::format("{}$tl{} using 1:2:3:4:5:6 with boxxyerror fs solid 1.0 noborder lc rgb {} title {}",
                            first ? "" : ", ", idx, plot::quote(colour), plot::quote(cat));
    first = false;
    series.push_back(std::move(ser));
  }
  script += plot_cmd + "\n";
  Figure f{nruns > 1 ? "timeline_" + std::to_string(set.figures.size()) : "timeline",
           nruns > 1 ? "Timeline of " + run.name : "Timeline",
           "Every rank's spans from trace.json: compute, exposed wait (the inner loop blocked on the outer loop), "
           "compress, send/receive, decode, outer step, hash check. Spans of one kind closer than 0.1% of the run "
           "are drawn as one. Open trace.json in Perfetto (ui.perfetto.dev) for every span.",
           std::move(series),
           std::move(script),
           ""};
  set.figures.push_back(std::move(f));
}

}  // namespace

FigureSet build_figures(const std::vector<RunData>& runs) {
  FigureSet set;
  const size_t n = runs.size();
  // Loss: train (every logged step) and validation (where evaluated).
  {
    auto train = metric_series(runs, "step", "loss");
    auto val = metric_series(runs, "step", "val_loss");
    for (auto& v : val) v.title += " validation";
    std::vector<Series> all = train;
    all.insert(all.end(), val.begin(), val.end());
    add(set, "loss_step", "Loss against steps",
        "Training loss (mean over the logging window, nats per token) and validation loss on the held-out data, "
        "per site, against the inner step.",
        all, "inner step", "loss, nats/token");
  }
  add(set, "loss_time", "Loss against wall time",
      "Training loss against the run's wall-clock seconds (elapsed_s): what DiLoCo trades against synchronous "
      "training is time, not steps.",
      metric_series(runs, "elapsed_s", "loss"), "wall time, s", "loss, nats/token");
  add(set, "tokens", "Throughput",
      "Tokens per second of the whole run over each logging window, as each site's rank 0 measured it.",
      metric_series(runs, "step", "tokens_per_s"), "inner step", "tokens/s");
  add(set, "utilization", "Compute utilization per outer period",
      "Share of each outer period's wall time spent in inner steps (compute), in percent; the rest is exposed "
      "wait, evaluation, logging and checkpoints.",
      metric_series(runs, "step", "compute_utilization", 100.0), "inner step", "compute utilization, %",
      "set yrange [0:105]\n");
  add(set, "exposed_wait", "Exposed wait per outer period",
      "Seconds per outer period the inner loop waited for the outer loop (a blocking sync, or the tail of an "
      "overlapped one).",
      metric_series(runs, "step", "exposed_wait_s"), "inner step", "exposed wait, s");
  // Per round.
  add(
      set, "sync", "Sync time per round, measured and planned",
      "Wall time of each outer round (fragment sync) at the slowest rank of the site; with outer.plan: auto the "
      "plan's prediction for the same round is the dashed series.",
      [&] {
        auto measured = round_series(runs, [](const SiteRound& sr, const SiteRound*) {
          double m = NAN;
          for (auto* r : sr.ranks) m = std::isnan(m) ? num(r->j, "sync_s") : std::max(m, num(r->j, "sync_s"));
          return m;
        });
        auto predicted = round_series(runs, [](const SiteRound& sr, const SiteRound*) {
          return sr.ranks.empty() ? NAN : num(sr.ranks.front()->j, "predicted_sync_s");
        });
        for (auto& p : predicted) p.title += " predicted";
        measured.insert(measured.end(), predicted.begin(), predicted.end());
        return measured;
      }(),
      "outer round", "sync time, s");
  add(set, "wan_bytes", "WAN bytes per round",
      "Payload bytes each site sent to the other sites in each round (all its ranks, every peer), in MB "
      "(1e6 bytes).",
      round_series(runs,
                   [](const SiteRound& sr, const SiteRound* prev) {
                     double now = 0, before = 0;
                     for (auto* r : sr.ranks) now += double(peer_bytes(r->j, "bytes_sent"));
                     if (prev)
                       for (auto* r : prev->ranks) before += double(peer_bytes(r->j, "bytes_sent"));
                     return (now - before) / 1e6;
                   }),
      "outer round", "MB sent");
  {
    // Goodput per (rank -> peer): the round's bytes to that peer over the round's time.
    std::vector<Series> goodput;
    for (const auto& run : runs) {
      std::map<std::string, Series> by_pair;
      std::map<std::pair<std::string, int>, const RoundRecord*> prev_of;
      for (const auto& r : run.rounds) {
        const double secs = num(r.j, "sync_s");
        const RoundRecord* prev = prev_of[{r.site, r.rank}];
        prev_of[{r.site, r.rank}] = &r;
        if (!(secs > 0) || !r.j.contains("peers")) continue;
        for (const auto& p : r.j["peers"]) {
          uint64_t before = 0;
          if (prev && prev->j.contains("peers"))
            for (const auto& q : prev->j["peers"])
              if (q.value("site", "") == p.value("site", "") && q.value("rank", 0) == p.value("rank", 0))
                before = q.value("bytes_sent", uint64_t{0});
          const std::string key = fmt::format("{} r{} -> {} r{}", label(run, r.site, runs.size()), r.rank,
                                              p.value("site", "?"), p.value("rank", 0));
          auto& ser = by_pair[key];
          ser.title = key;
          ser.points.emplace_back(double(r.round()), double(p.value("bytes_sent", uint64_t{0}) - before) / secs / 1e6);
        }
      }
      for (auto& [k, s] : by_pair) goodput.push_back(std::move(s));
    }
    add(set, "goodput", "Goodput per peer",
        "Payload bytes a rank sent to one peer in a round divided by the round's sync time, MB/s: the rate the "
        "exchange achieved, latency included.",
        goodput, "outer round", "MB/s");
  }
  add(set, "compression_ratio", "Compression ratio per round",
      "fp32 bytes of the pseudo-gradient over the bytes of its frame on the wire, per site (all ranks).",
      round_series(runs,
                   [](const SiteRound& sr, const SiteRound*) {
                     double el = 0, fb = 0;
                     for (auto* r : sr.ranks) {
                       el += num(r->j, "elements");
                       fb += num(r->j, "frame_bytes");
                     }
                     return fb > 0 ? 4.0 * el / fb : NAN;
                   }),
      "outer round", "x vs fp32");
  add(set, "compression_error", "Compression error per round",
      "Relative error of each site's pseudo-gradient as every site decoded it: ||decoded - sent|| / ||sent|| over "
      "the whole model (before error feedback carries the rest to the next round).",
      round_series(runs,
                   [](const SiteRound& sr, const SiteRound*) {
                     double e = 0, r2 = 0;
                     for (auto* r : sr.ranks) {
                       e += num(r->j, "err2");
                       r2 += num(r->j, "ref2");
                     }
                     return r2 > 0 ? std::sqrt(e / r2) : NAN;
                   }),
      "outer round", "relative error");
  for (const auto& run : runs) add_timeline(set, run, n);
  return set;
}

void render_figures(FigureSet& set) {
  for (auto& f : set.figures)
    f.svg =
        plot::render_svg(f.script, "report: figure '" + f.title + "'", 980, f.id.rfind("timeline", 0) == 0 ? 380 : 400);
}

}  // namespace geoloco::report
