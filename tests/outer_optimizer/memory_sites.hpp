// Sites connected by the in-memory fabric (transport/memory/) instead of UCX: for outer-loop
// tests where a fault must land at an exact frame (a peer killed, stalled or sending garbage
// mid-round), fast and without sockets.
#pragma once

#include <memory>

#include "tests/outer_optimizer/multisite_util.hpp"
#include "transport/memory/memory_fabric.hpp"

namespace geoloco::testing {

struct MemorySites {
  transport::memory::MemoryFabric fabric;
  // run_ranks' setup: every rank's transport an endpoint of `fabric`, with the config's
  // transport section (key, timeouts, lanes).
  RankSetup setup(const trainer::RunConfig& cfg, outer::OuterHooks hooks = {}) {
    RankSetup s;
    s.hooks = std::move(hooks);
    const transport::TransportConfig tc = *cfg.transport;
    s.connect_transport = [this, tc](const transport::Identity& self, const std::vector<transport::PeerInfo>& peers,
                                     transport::ConnectMode mode) {
      auto t = fabric.endpoint(tc, self);
      t->connect(peers, mode);
      return std::unique_ptr<transport::Transport>(std::move(t));
    };
    return s;
  }
};

}  // namespace geoloco::testing
