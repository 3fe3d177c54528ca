#include "tools/report/report_html.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <vector>

namespace geoloco::report {
namespace {

const char* kStyle = R"(
body { font-family: system-ui, sans-serif; margin: 24px auto; max-width: 1040px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.15em; margin-top: 1.6em; } h3 { font-size: 1em; }
.status { padding: 6px 10px; border-radius: 4px; margin: 4px 0; }
.status.ok { background: #e6f4ea; } .status.incomplete { background: #fdecea; border: 1px solid #e8524c; }
.figure { border-top: 1px solid #eee; } .figure p { color: #555; font-size: 0.9em; }
.plot svg { width: 100%; height: auto; }
table { border-collapse: collapse; font-size: 0.85em; margin: 6px 0; }
td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }
pre { background: #f6f6f6; padding: 10px; overflow-x: auto; font-size: 0.8em; }
nav a { margin-right: 10px; font-size: 0.9em; }
)";

// gnuplot's SVG without the XML prolog, its ids prefixed so that several figures can share
// one page without sharing ids.
std::string inline_svg(const std::string& svg, const std::string& prefix) {
  std::string s = svg.substr(std::min(svg.size(), svg.find("<svg")));
  for (const char* id :
       {"gpPt", "gpDot", "gpBkgnd", "gnuplot_plot_", "gnuplot_canvas", "gpPat", "textbox", "greybox"}) {
    const std::string from = id, to = prefix + id;
    for (size_t pos = s.find(from); pos != std::string::npos; pos = s.find(from, pos + to.size()))
      s.replace(pos, from.size(), to);
  }
  return s;
}

std::string scalar_text(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) return fmt::format("{:.6g}", v.get<double>());
  std::string d = v.dump();
  if (d.size() > 240) d = d.substr(0, 237) + "...";
  return d;
}

}  // namespace

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += c;
    }
  }
  return out;
}

namespace {

// Each site's intra-site strategy from the per-rank summaries: ranks, the addresses they
// listened at (a site across nodes: one per node), strategy (hybrid's group size), the bytes a
// rank sends over the site's collectives per step (hybrid: how much of it leaves the rank's
// group), and why (strategy: auto's reason, or the config).
std::string sites_table(const nlohmann::json& summary) {
  if (!summary.contains("ranks") || !summary["ranks"].is_array() || summary["ranks"].empty()) return "";
  std::vector<std::string> order;
  std::map<std::string, std::pair<int, nlohmann::json>> by_site;  // first rank's summary, rank count
  // By site: its ranks' addresses in order of first appearance, with how many ranks each.
  std::map<std::string, std::vector<std::pair<std::string, int>>> addresses;
  for (const auto& r : summary["ranks"]) {
    if (!r.is_object()) continue;
    const std::string site = r.value("site", std::string("?"));
    auto [it, fresh] = by_site.try_emplace(site, 0, r);
    if (fresh) order.push_back(site);
    ++it->second.first;
    if (!r.contains("address") || !r["address"].is_string()) continue;
    auto& list = addresses[site];
    const std::string a = r["address"].get<std::string>();
    auto at = std::find_if(list.begin(), list.end(), [&](const auto& e) { return e.first == a; });
    if (at == list.end())
      list.emplace_back(a, 1);
    else
      ++at->second;
  }
  std::string h =
      "<h3>Sites</h3><table><tr><th>site</th><th>ranks</th><th>addresses (ranks)</th><th>strategy</th>"
      "<th>site bytes / step / rank</th>"
      "<th>of which out of the group</th><th>why</th></tr>";
  for (const auto& site : order) {
    const auto& [ranks, r] = by_site.at(site);
    const nlohmann::json mem = r.value("memory", nlohmann::json::object());
    std::string strategy = mem.value("strategy", std::string("?"));
    if (mem.contains("group_size")) strategy += fmt::format(" (groups of {})", mem["group_size"].get<int>());
    const auto choice = r.value("strategy_choice", nlohmann::json::object());
    const std::string why =
        choice.is_object() && choice.contains("reason")
            ? "strategy: auto (" + choice.value("topology", std::string()) + "): " + choice["reason"].get<std::string>()
            : std::string("as configured");
    const std::string across =
        r.contains("cross_group_bytes_per_step") ? scalar_text(r["cross_group_bytes_per_step"]) : std::string("");
    std::string where;
    for (const auto& [a, n] : addresses[site]) where += fmt::format("{}{} ({})", where.empty() ? "" : ", ", a, n);
    h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                     html_escape(site), ranks, html_escape(where), html_escape(strategy),
                     html_escape(scalar_text(r.value("site_bytes_per_step", nlohmann::json(0)))), html_escape(across),
                     html_escape(why));
  }
  return h + "</table>\n";
}

}  // namespace

std::string report_html(const std::vector<RunData>& runs, const FigureSet& figs) {
  std::string names;
  for (size_t i = 0; i < runs.size(); ++i) names += (i ? ", " : "") + runs[i].name;
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n";
  h += fmt::format("<title>geoloco report: {}</title>\n<style>{}</style></head><body>\n", html_escape(names), kStyle);
  h += fmt::format("<h1>geoloco report: {}</h1>\n", html_escape(names));
  for (const auto& r : runs)
    h += fmt::format("<div class=\"status {}\" data-run=\"{}\"><b>{}</b> ({}): {}</div>\n",
                     r.complete ? "ok" : "incomplete", html_escape(r.name), html_escape(r.name), html_escape(r.dir),
                     html_escape(r.status));
  h += "<nav>";
  for (const auto& f : figs.figures) h += fmt::format("<a href=\"#{}\">{}</a>", f.id, html_escape(f.title));
  h += "<a href=\"#events\">Events</a><a href=\"#summary\">Summary</a><a href=\"#config\">Config</a></nav>\n";

  for (size_t i = 0; i < figs.figures.size(); ++i) {
    const auto& f = figs.figures[i];
    size_t points = 0;
    for (const auto& s : f.series) points += s.points.size();
    h += fmt::format(
        "<section class=\"figure\" id=\"{}\" data-figure=\"{}\" data-series=\"{}\" data-points=\"{}\">\n"
        "<h2>{}</h2><p>{}</p><div class=\"plot\">{}</div></section>\n",
        f.id, f.id, f.series.size(), points, html_escape(f.title), html_escape(f.caption),
        inline_svg(f.svg, fmt::format("f{}_", i)));
  }
  if (!figs.missing.empty()) {
    h += "<h2>Figures without data</h2><ul>";
    for (const auto& m : figs.missing) h += "<li>" + html_escape(m) + "</li>";
    h += "</ul>\n";
  }

  h += "<h2 id=\"events\">Events</h2>\n";
  for (const auto& r : runs) {
    if (runs.size() > 1) h += "<h3>" + html_escape(r.name) + "</h3>";
    if (r.events.empty()) {
      h += "<p>No events (checkpoints, resumes, plan changes) recorded.</p>\n";
      continue;
    }
    h += "<table><tr><th>step</th><th>site</th><th>event</th></tr>";
    for (const auto& e : r.events)
      h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>", e.step,
                       html_escape(e.site.empty() ? "all" : e.site), html_escape(e.what));
    h += "</table>\n";
  }

  h += "<h2 id=\"summary\">Summary</h2>\n";
  for (const auto& r : runs) {
    if (runs.size() > 1) h += "<h3>" + html_escape(r.name) + "</h3>";
    if (!r.summary.is_object()) {
      h += "<p>No summary.json: the run has not finished (or failed before writing it).</p>\n";
      continue;
    }
    h += "<table>";
    for (const auto& [k, v] : r.summary.items()) {
      if (k == "ranks" || k == "plans") continue;  // per-rank detail and plans: below / in the file
      h += fmt::format("<tr><th>{}</th><td>{}</td></tr>", html_escape(k), html_escape(scalar_text(v)));
    }
    h += "</table>\n";
    h += sites_table(r.summary);
    if (r.plans.is_array() && !r.plans.empty()) {
      h += "<h3>Plans (outer.plan: auto)</h3><table><tr><th>epoch</th><th>H</th><th>fragments</th><th>codec</th>"
           "<th>lanes</th><th>exchange</th><th>predicted sync, s</th><th>predicted utilization</th><th>why</th></tr>";
      for (const auto& p : r.plans)
        h += fmt::format(
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.4g}</td><td>{:.1f}%</"
            "td><td>{}"
            "</td></tr>",
            p.value("epoch", 0), p.value("interval", 0), p.value("fragments", 1), html_escape(p.value("codec", "")),
            p.value("lanes", 1), html_escape(p.value("exchange", std::string("all_to_all"))),
            p.value("predicted_fragment_sync_s", 0.0), 100.0 * p.value("predicted_utilization", 0.0),
            html_escape(p.value("reason", "")));
      h += "</table>\n";
    }
    // Bytes per lane at the last round, per (rank -> peer).
    std::map<std::string, nlohmann::json> last;
    for (const auto& rr : r.rounds)
      if (rr.j.contains("peers"))
        for (const auto& p : rr.j["peers"])
          last[fmt::format("{} r{} -> {} r{}", rr.site, rr.rank, p.value("site", "?"), p.value("rank", 0))] = p;
    if (!last.empty()) {
      h += "<h3>Bytes sent per lane (whole run)</h3><table><tr><th>from -> to</th><th>bytes</th><th>per lane</th></tr>";
      for (const auto& [k, p] : last)
        h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td></tr>", html_escape(k),
                         p.value("bytes_sent", uint64_t{0}),
                         html_escape(p.contains("lane_bytes_sent") ? p["lane_bytes_sent"].dump() : "[]"));
      h += "</table>\n";
    }
  }
  bool any_notes = false;
  for (const auto& r : runs) any_notes |= !r.notes.empty();
  if (any_notes) {
    h += "<h2>Notes</h2><ul>";
    for (const auto& r : runs)
      for (const auto& n : r.notes) h += "<li>" + html_escape((runs.size() > 1 ? r.name + ": " : "") + n) + "</li>";
    h += "</ul>\n";
  }
  h += "<h2 id=\"config\">Config</h2>\n";
  for (const auto& r : runs) {
    if (runs.size() > 1) h += "<h3>" + html_escape(r.name) + "</h3>";
    h += r.config_text.empty() ? "<p>No config.yaml in the run directory.</p>\n"
                               : "<pre>" + html_escape(r.config_text) + "</pre>\n";
  }
  h += "</body></html>\n";
  return h;
}

}  // namespace geoloco::report
