// Scenario parsing and plan derivation: exact numbers (delay = km x us_per_km + overhead),
// rejection of bad input, and every shipped configs/wan/*.yaml loading with the delay its
// comment promises.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "tools/wan/scenario.hpp"
#include "core/config_node.hpp"

namespace geoloco::wan {
namespace {

Scenario parse(const std::string& yaml) {
  auto doc = config::load_string(yaml, "test.yaml");
  return Scenario::from_yaml(doc.node());
}

const char* kTwoSites = R"(format: geoloco-wan-scenario
version: 1
name: t
sites: [{name: a}, {name: b}]
link: {km: 4000, overhead_ms: 1.0, rate_mbit: 1000}
)";

TEST(WanScenario, DelayFollowsKmAndOverhead) {
  const Scenario s = parse(kTwoSites);
  ASSERT_EQ(s.sites.size(), 2u);
  ASSERT_EQ(s.links.size(), 1u);
  // 4000 km x 5 us/km = 20 ms, + 1 ms equipment.
  EXPECT_DOUBLE_EQ(s.profile(0, 1).one_way_delay_ms(), 21.0);
  EXPECT_DOUBLE_EQ(s.profile(1, 0).one_way_delay_ms(), 21.0);
  const Plan p = make_plan(s, "gl");
  ASSERT_EQ(p.links.size(), 2u);
  EXPECT_EQ(p.links[0].src, 0u);
  EXPECT_EQ(p.links[0].dst, 1u);
  EXPECT_EQ(p.links[0].queue, 1);  // src * n + dst
  EXPECT_EQ(p.links[1].queue, 2);
  EXPECT_EQ(p.links[0].delay_us, 21000);
  EXPECT_EQ(p.links[0].rate_kbit, 1000000);
  EXPECT_EQ(p.sites[1].netns, "gl-b");
  EXPECT_EQ(p.sites[1].addr, "198.18.2.2");
  EXPECT_EQ(p.sites[1].router_addr, "198.18.2.1");
  EXPECT_EQ(p.router_netns, "gl-router");
  // 2 x BDP = 2 x 125e6 B/s x 42 ms = 10.5 MB < 32 MiB floor.
  EXPECT_EQ(p.tcp_mem_max, 32 * 1048576);
  // 2 x 1e9 x 21 ms / 12000 bit = 3500 < 4096 floor.
  EXPECT_EQ(p.links[0].queue_maxlen, 4096u);
}

TEST(WanScenario, PerLinkOverridesAndExplicitDelay) {
  const Scenario s = parse(R"(format: geoloco-wan-scenario
version: 1
name: tri
sites: [{name: a}, {name: b}, {name: c}]
link: {km: 1000, overhead_ms: 0.5, rate_mbit: 10000}
links:
  - {a: c, b: a, km: 0, delay_ms: 7.25, loss_pct: 1, jitter_ms: 0.5, reorder: true}
)");
  EXPECT_DOUBLE_EQ(s.profile(0, 1).one_way_delay_ms(), 5.5);
  EXPECT_DOUBLE_EQ(s.profile(2, 0).one_way_delay_ms(), 7.25);
  EXPECT_DOUBLE_EQ(s.profile(0, 2).loss_pct, 1.0);
  EXPECT_TRUE(s.profile(0, 2).reorder);
  EXPECT_DOUBLE_EQ(s.profile(1, 2).loss_pct, 0.0);
  const Plan p = make_plan(s, "x1");
  ASSERT_EQ(p.links.size(), 6u);
  // 10 Gbit/s x 5.5 ms: 2 x 1e10 x 0.0055 / 12000 = 9166.67 -> 9166 packets.
  EXPECT_EQ(p.links[0].queue_maxlen, 9166u);
  // 2 x BDP of the largest pair: 2 x 1.25e9 B/s x 2 x (7.25 + 0.5) ms = 38.75 MB.
  EXPECT_EQ(p.tcp_mem_max, 38750000);
  const std::string sh = plan_to_shell(p);
  EXPECT_NE(sh.find("WAN_SITES=(a b c)\n"), std::string::npos) << sh;
  EXPECT_NE(sh.find("\"2 0 6 7250 500 1.000000 10000000 1 "), std::string::npos) << sh;
  EXPECT_NE(sh.find("WAN_NETNS=(x1-a x1-b x1-c)\n"), std::string::npos) << sh;
}

void expect_rejected(const std::string& yaml, const std::string& needle) {
  try {
    parse(yaml);
    ADD_FAILURE() << "accepted: " << yaml;
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(WanScenario, RejectsBadInput) {
  const std::string head = "format: geoloco-wan-scenario\nversion: 1\nname: t\n";
  expect_rejected("format: other\nversion: 1\nname: t\nsites: [{name: a}, {name: b}]\n", "format");
  expect_rejected(head + "sites: [{name: a}]\n", "at least 2");
  expect_rejected(head + "sites: [{name: a}, {name: a}]\n", "duplicate");
  expect_rejected(head + "sites: [{name: a}, {name: Router}]\n", "[a-z0-9]");
  expect_rejected(head + "sites: [{name: a}, {name: router}]\n", "router");
  expect_rejected(head + "sites: [{name: a}, {name: b}]\nlink: {kms: 3}\n", "kms");
  expect_rejected(head + "sites: [{name: a}, {name: b}]\nlink: {km: 3, delay_ms: 1}\n", "not both");
  expect_rejected(head + "sites: [{name: a}, {name: b}]\nlink: {delay_ms: 1, jitter_ms: 2}\n", "jitter");
  expect_rejected(head + "sites: [{name: a}, {name: b}]\nlink: {loss_pct: 60}\n", "loss_pct");
  expect_rejected(head + "sites: [{name: a}, {name: b}]\nlinks: [{a: a, b: z}]\n", "unknown site");
  expect_rejected(head + "sites: [{name: a}, {name: b}]\nlinks: [{a: a, b: b}, {a: b, b: a}]\n", "twice");
  expect_rejected(head + "sites: [{name: a}, {name: b}]\nextra: 1\n", "extra");
  EXPECT_THROW(make_plan(parse(kTwoSites), "Bad-Prefix"), InputError);
}

TEST(WanScenario, ShippedScenariosLoadWithTheirDocumentedDelays) {
  struct Want {
    const char* stem;
    double owd_ms;
    double rate_mbit;
    double loss_pct;
  };
  // 5 us/km x km + overhead: 50 km + 0.05, 500 + 0.5, 4000 + 1.0, 10000 + 2.0.
  const Want wants[] = {
      {"metro-1g", 0.30, 1000, 0},
      {"metro-10g", 0.30, 10000, 0},
      {"metro-1g-loss0.1", 0.30, 1000, 0.1},
      {"metro-1g-loss1", 0.30, 1000, 1},
      {"regional-1g", 3.0, 1000, 0},
      {"regional-10g", 3.0, 10000, 0},
      {"regional-1g-loss0.1", 3.0, 1000, 0.1},
      {"regional-1g-loss1", 3.0, 1000, 1},
      {"continental-1g", 21.0, 1000, 0},
      {"continental-10g", 21.0, 10000, 0},
      {"continental-1g-loss0.1", 21.0, 1000, 0.1},
      {"continental-1g-loss1", 21.0, 1000, 1},
      {"intercontinental-1g", 52.0, 1000, 0},
      {"intercontinental-10g", 52.0, 10000, 0},
      {"intercontinental-1g-loss0.1", 52.0, 1000, 0.1},
      {"intercontinental-1g-loss1", 52.0, 1000, 1},
  };
  for (const auto& w : wants) {
    const std::string path = std::string(GEOLOCO_SOURCE_DIR) + "/configs/wan/" + w.stem + ".yaml";
    SCOPED_TRACE(path);
    const Scenario s = Scenario::load(path);
    EXPECT_EQ(s.name, w.stem);
    EXPECT_NEAR(s.profile(0, 1).one_way_delay_ms(), w.owd_ms, 1e-12);  // only FP rounding of km*us/1000
    EXPECT_DOUBLE_EQ(s.profile(0, 1).rate_mbit, w.rate_mbit);
    EXPECT_DOUBLE_EQ(s.profile(0, 1).loss_pct, w.loss_pct);
  }
  // Every file in the folder parses (none left out of the list above by accident).
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(std::string(GEOLOCO_SOURCE_DIR) + "/configs/wan")) {
    if (e.path().extension() != ".yaml") continue;
    SCOPED_TRACE(e.path().string());
    EXPECT_NO_THROW(Scenario::load(e.path().string()));
    ++n;
  }
  EXPECT_GE(n, 16);
}

}  // namespace
}  // namespace geoloco::wan
