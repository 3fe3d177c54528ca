// Site leaders on the in-memory fabric: one-rank sites, each with its SitePeers, all connected,
// for tests of the outer loop's protocols between sites (membership, state transfer) without
// an outer loop around them.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "outer_optimizer/outer_options.hpp"
#include "outer_optimizer/site_peers.hpp"
#include "tests/transport/memory_cluster.hpp"

namespace geoloco::testing {

struct MemoryLeaders {
  std::vector<outer::SiteSpec> sites;  // the run's sites, in order
  std::unique_ptr<transport::test::MemoryCluster> cluster;
  std::vector<std::unique_ptr<outer::SitePeers>> peers;

  MemoryLeaders(const std::vector<std::string>& names, double transfer_timeout_s) {
    std::vector<transport::TransportConfig> cfgs;
    std::vector<transport::Identity> ids;
    for (const auto& n : names) {
      sites.push_back({n, 1});
      auto tc = transport::test::small_config();
      tc.transfer_timeout_s = transfer_timeout_s;
      cfgs.push_back(tc);
      ids.push_back(transport::test::ident(n));
    }
    cluster = std::make_unique<transport::test::MemoryCluster>(cfgs, ids);
    for (const auto& e : cluster->connect_all()) EXPECT_EQ(e, "");
    for (size_t s = 0; s < names.size(); ++s)
      peers.push_back(std::make_unique<outer::SitePeers>(leader(static_cast<int>(s)), cluster->t[s].get()));
  }
  ~MemoryLeaders() {
    peers.clear();  // before the transports they use
    cluster.reset();
  }
  // Site s's leader (rank 0) as the outer loop's options name it.
  outer::OuterOptions leader(int s) const {
    outer::OuterOptions o;
    o.sites = sites;
    o.site = s;
    o.params.total = 1000;
    return o;
  }
};

}  // namespace geoloco::testing
