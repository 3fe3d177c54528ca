// WAN scenarios: which sites exist and what each site pair's link looks like (delay, jitter,
// loss, rate). Parsed once from YAML (configs/wan/*.yaml) and turned into a `Plan`: the
// namespace names, addresses, NFQUEUE numbers and tc parameters the shell scripts in
// tools/wan/ apply. Keeping the arithmetic here (not in bash) makes it testable and exact.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/config_node.hpp"

namespace geoloco::wan {

// One site pair's link, symmetric (each direction gets the same profile).
struct LinkProfile {
  double km = 0.0;            // fibre route length
  double us_per_km = 5.0;     // propagation in fibre (~c/1.47)
  double overhead_ms = 0.0;   // equipment (routers, amplifiers, DWDM) per direction
  double delay_ms = -1.0;     // explicit one-way delay; < 0 means "derive from km"
  double jitter_ms = 0.0;     // uniform in [-jitter, +jitter] around the delay
  double loss_pct = 0.0;      // independent per-packet loss, per direction
  double rate_mbit = 1000.0;  // bottleneck rate per direction
  bool reorder = false;       // let jitter reorder packets (netem's default); off keeps FIFO

  // One-way delay in milliseconds: delay_ms when given, else km * us_per_km / 1000 + overhead.
  double one_way_delay_ms() const;
  void validate(const config::Node& where) const;
};

struct Link {
  std::size_t a = 0, b = 0;  // site indices, a < b
  LinkProfile profile;
};

struct Scenario {
  static constexpr const char* kFormat = "geoloco-wan-scenario";
  static constexpr int kVersion = 1;
  static constexpr std::size_t kMaxSites = 16;

  std::string name;
  std::string description;
  std::vector<std::string> sites;
  std::vector<Link> links;  // every unordered pair exactly once, (0,1), (0,2), ..., (n-2,n-1)

  // YAML schema: see tools/wan/README.md. Rejects unknown keys, bad ranges, duplicate sites,
  // links naming unknown sites and pairs given twice.
  static Scenario from_yaml(const config::Node& node);
  static Scenario load(const std::string& path, const std::vector<std::string>& overrides = {});

  const LinkProfile& profile(std::size_t i, std::size_t j) const;
  std::size_t site_index(const std::string& name) const;  // InputError when unknown
};

// Everything the scripts need, derived deterministically from a scenario.
struct DirectedLink {
  std::size_t src = 0, dst = 0;
  int queue = 0;         // NFQUEUE number in the router namespace
  int64_t delay_us = 0;  // one-way
  int64_t jitter_us = 0;
  double loss_pct = 0.0;
  int64_t rate_kbit = 0;
  bool reorder = false;
  uint32_t queue_maxlen = 0;  // NFQUEUE length: holds a full delay's worth of packets
};

struct SitePlan {
  std::string name;
  std::string netns;        // "<prefix>-<name>"
  std::string addr;         // 198.18.<i+1>.2
  std::string router_addr;  // 198.18.<i+1>.1 (router side of the site's veth)
  std::string router_if;    // router-side veth name "s<i>"
};

struct Plan {
  std::string scenario;
  std::string prefix;
  std::string router_netns;
  std::vector<SitePlan> sites;
  std::vector<DirectedLink> links;  // n*(n-1) entries, src-major
  int64_t tcp_mem_max = 0;          // bytes: tcp_rmem/tcp_wmem max inside the namespaces
};

// prefix: namespace name prefix (letters/digits, <= 6 chars) so stale runs are recognisable.
Plan make_plan(const Scenario& s, const std::string& prefix);

// `eval`-able bash: scalars and arrays (WAN_SITES, WAN_NETNS, WAN_ADDR, WAN_LINKS, ...).
std::string plan_to_shell(const Plan& p);
std::string plan_to_json(const Plan& p);

}  // namespace geoloco::wan
