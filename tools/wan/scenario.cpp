#include "tools/wan/scenario.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>

namespace geoloco::wan {
namespace {

bool valid_site_name(const std::string& s) {
  // Site names become namespace names ("gl-<site>") and appear in shell arrays: keep them to
  // characters that need no quoting anywhere.
  if (s.empty() || s.size() > 12 || !(s[0] >= 'a' && s[0] <= 'z')) return false;
  return std::all_of(s.begin(), s.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); });
}

LinkProfile read_profile(const config::Node& n, const LinkProfile& d) {
  LinkProfile p;
  p.km = n.get_double("km", d.km, 0.0, 40000.0);
  p.us_per_km = n.get_double("us_per_km", d.us_per_km, 3.0, 10.0);
  p.overhead_ms = n.get_double("overhead_ms", d.overhead_ms, 0.0, 1000.0);
  p.delay_ms = n.has("delay_ms") ? n.get_double("delay_ms", 0.0, 0.0, 5000.0) : d.delay_ms;
  p.jitter_ms = n.get_double("jitter_ms", d.jitter_ms, 0.0, 1000.0);
  p.loss_pct = n.get_double("loss_pct", d.loss_pct, 0.0, 50.0);
  p.rate_mbit = n.get_double("rate_mbit", d.rate_mbit, 1.0, 400000.0);
  p.reorder = n.get<bool>("reorder", d.reorder);
  p.validate(n);
  return p;
}

}  // namespace

double LinkProfile::one_way_delay_ms() const {
  if (delay_ms >= 0.0) return delay_ms;
  return km * us_per_km / 1000.0 + overhead_ms;
}

void LinkProfile::validate(const config::Node& where) const {
  if (delay_ms >= 0.0 && km > 0.0)
    where.fail("delay_ms", "give either km (+ overhead_ms) or delay_ms, not both");
  if (jitter_ms > one_way_delay_ms())
    where.fail("jitter_ms", fmt::format("jitter {} ms exceeds the one-way delay {} ms (delays would go negative)",
                                        jitter_ms, one_way_delay_ms()));
}

Scenario Scenario::from_yaml(const config::Node& node) {
  Scenario s;
  const std::string format = node.require<std::string>("format");
  if (format != kFormat) node.fail_value("format", kFormat);
  node.get_int("version", kVersion, kVersion, kVersion);
  s.name = node.require<std::string>("name");
  if (s.name.empty() || s.name.size() > 64 || !std::all_of(s.name.begin(), s.name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
      }))
    node.fail("name", fmt::format("scenario name '{}' must be 1-64 of [A-Za-z0-9._-]", s.name));
  s.description = node.get<std::string>("description", "");

  for (const auto& site : node.items("sites")) {
    std::string name = site.require<std::string>("name");
    if (!valid_site_name(name) || name == "router")
      site.fail("name", fmt::format("site name '{}' must be 1-12 of [a-z0-9], start with a letter, and not be 'router'", name));
    if (std::find(s.sites.begin(), s.sites.end(), name) != s.sites.end())
      site.fail("name", fmt::format("duplicate site '{}'", name));
    site.finish();
    s.sites.push_back(name);
  }
  if (s.sites.size() < 2) node.fail("sites", "a scenario needs at least 2 sites");
  if (s.sites.size() > kMaxSites) node.fail("sites", fmt::format("at most {} sites", kMaxSites));

  // Only ask for child("link") when present: core's Node::child() currently throws
  // YAML::InvalidNode for an absent key (it assigns into an invalid yaml-cpp node).
  LinkProfile defaults;
  if (node.has("link")) {
    const config::Node link_node = node.child("link");
    defaults = read_profile(link_node, LinkProfile{});
    link_node.finish();
  }
  for (std::size_t a = 0; a < s.sites.size(); ++a)
    for (std::size_t b = a + 1; b < s.sites.size(); ++b) s.links.push_back({a, b, defaults});

  std::vector<bool> overridden(s.links.size(), false);
  for (const auto& l : node.items("links")) {
    const std::string na = l.require<std::string>("a");
    const std::string nb = l.require<std::string>("b");
    auto find = [&](const std::string& n, const char* key) {
      auto it = std::find(s.sites.begin(), s.sites.end(), n);
      if (it == s.sites.end()) l.fail(key, fmt::format("unknown site '{}'", n));
      return static_cast<std::size_t>(it - s.sites.begin());
    };
    std::size_t a = find(na, "a"), b = find(nb, "b");
    if (a == b) l.fail("b", "a link needs two different sites");
    if (a > b) std::swap(a, b);
    auto it = std::find_if(s.links.begin(), s.links.end(), [&](const Link& x) { return x.a == a && x.b == b; });
    const auto idx = static_cast<std::size_t>(it - s.links.begin());
    if (overridden[idx]) l.fail("a", fmt::format("link {}-{} given twice", na, nb));
    overridden[idx] = true;
    it->profile = read_profile(l, defaults);
    l.finish();
  }
  node.finish();
  return s;
}

Scenario Scenario::load(const std::string& path, const std::vector<std::string>& overrides) {
  auto doc = config::load_file(path, overrides);
  return from_yaml(doc.node());
}

const LinkProfile& Scenario::profile(std::size_t i, std::size_t j) const {
  GEOLOCO_CHECK(i != j && i < sites.size() && j < sites.size(), "bad site pair {} {}", i, j);
  if (i > j) std::swap(i, j);
  for (const auto& l : links)
    if (l.a == i && l.b == j) return l.profile;
  GEOLOCO_CHECK(false, "no link {}-{}", i, j);
  __builtin_unreachable();
}

std::size_t Scenario::site_index(const std::string& n) const {
  auto it = std::find(sites.begin(), sites.end(), n);
  if (it == sites.end()) throw InputError(fmt::format("scenario '{}' has no site '{}'", name, n));
  return static_cast<std::size_t>(it - sites.begin());
}

Plan make_plan(const Scenario& s, const std::string& prefix) {
  if (prefix.empty() || prefix.size() > 6 ||
      !std::all_of(prefix.begin(), prefix.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }))
    throw InputError(fmt::format("namespace prefix '{}' must be 1-6 of [a-z0-9]", prefix));
  Plan p;
  p.scenario = s.name;
  p.prefix = prefix;
  p.router_netns = prefix + "-router";
  const auto n = s.sites.size();
  for (std::size_t i = 0; i < n; ++i) {
    // One /24 per site inside 198.18.0.0/15 (the benchmarking range): .2 is the site, .1 the
    // router's end of the veth.
    p.sites.push_back({s.sites[i], prefix + "-" + s.sites[i], fmt::format("198.18.{}.2", i + 1),
                       fmt::format("198.18.{}.1", i + 1), fmt::format("s{}", i)});
  }
  double max_bdp = 0.0;
  for (std::size_t i = 0; i < n; ++i)
    for (std::size_t j = 0; j < n; ++j) {
      if (i == j) continue;
      const LinkProfile& lp = s.profile(i, j);
      DirectedLink d;
      d.src = i;
      d.dst = j;
      d.queue = static_cast<int>(i * n + j);
      d.delay_us = std::llround(lp.one_way_delay_ms() * 1000.0);
      d.jitter_us = std::llround(lp.jitter_ms * 1000.0);
      d.loss_pct = lp.loss_pct;
      d.rate_kbit = std::llround(lp.rate_mbit * 1000.0);
      d.reorder = lp.reorder;
      // Packets resident in the delay line: rate x (delay + jitter) in MTU-sized packets, x2
      // headroom; an overflowing NFQUEUE drops, which would look like extra loss.
      const double in_flight = lp.rate_mbit * 1e6 * (lp.one_way_delay_ms() + lp.jitter_ms) / 1000.0 / (8.0 * 1500.0);
      d.queue_maxlen = static_cast<uint32_t>(std::clamp(2.0 * in_flight, 4096.0, 1048576.0));
      p.links.push_back(d);
      max_bdp = std::max(max_bdp, lp.rate_mbit * 1e6 / 8.0 * 2.0 * (lp.one_way_delay_ms() + lp.jitter_ms) / 1000.0);
    }
  // Socket buffers: 2 x the largest bandwidth-delay product, at least 32 MiB (the measured
  // need for 1 Gbit/s x 40 ms, see ENVIRONMENT.md), at most 512 MiB.
  p.tcp_mem_max = static_cast<int64_t>(std::clamp(2.0 * max_bdp, 32.0 * 1048576.0, 512.0 * 1048576.0));
  return p;
}

std::string plan_to_shell(const Plan& p) {
  // Every value is a validated name, address or number, so no quoting is needed beyond this.
  std::string out;
  out += fmt::format("WAN_SCENARIO={}\n", p.scenario);
  out += fmt::format("WAN_PREFIX={}\nWAN_ROUTER={}\nWAN_TCP_MEM_MAX={}\nWAN_NSITES={}\n", p.prefix, p.router_netns,
                     p.tcp_mem_max, p.sites.size());
  auto arr = [&](const char* name, auto field) {
    out += fmt::format("{}=(", name);
    for (std::size_t i = 0; i < p.sites.size(); ++i) out += (i ? " " : "") + field(p.sites[i]);
    out += ")\n";
  };
  arr("WAN_SITES", [](const SitePlan& s) { return s.name; });
  arr("WAN_NETNS", [](const SitePlan& s) { return s.netns; });
  arr("WAN_ADDR", [](const SitePlan& s) { return s.addr; });
  arr("WAN_GW", [](const SitePlan& s) { return s.router_addr; });
  arr("WAN_RIF", [](const SitePlan& s) { return s.router_if; });
  // One quoted word per directed link: "src dst queue delay_us jitter_us loss_pct rate_kbit reorder maxlen".
  out += "WAN_LINKS=(";
  for (std::size_t k = 0; k < p.links.size(); ++k) {
    const auto& l = p.links[k];
    out += fmt::format("{}\"{} {} {} {} {} {:.6f} {} {} {}\"", k ? " " : "", l.src, l.dst, l.queue, l.delay_us,
                       l.jitter_us, l.loss_pct, l.rate_kbit, l.reorder ? 1 : 0, l.queue_maxlen);
  }
  out += ")\n";
  return out;
}

std::string plan_to_json(const Plan& p) {
  nlohmann::json j;
  j["format"] = "geoloco-wan-plan";
  j["version"] = 1;
  j["scenario"] = p.scenario;
  j["prefix"] = p.prefix;
  j["router_netns"] = p.router_netns;
  j["tcp_mem_max"] = p.tcp_mem_max;
  for (const auto& s : p.sites)
    j["sites"].push_back({{"name", s.name}, {"netns", s.netns}, {"addr", s.addr}, {"router_addr", s.router_addr},
                          {"router_if", s.router_if}});
  for (const auto& l : p.links)
    j["links"].push_back({{"src", l.src}, {"dst", l.dst}, {"queue", l.queue}, {"delay_us", l.delay_us},
                          {"jitter_us", l.jitter_us}, {"loss_pct", l.loss_pct}, {"rate_kbit", l.rate_kbit},
                          {"reorder", l.reorder}, {"queue_maxlen", l.queue_maxlen}});
  return j.dump(2) + "\n";
}

}  // namespace geoloco::wan
