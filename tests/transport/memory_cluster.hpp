// N MemoryTransports on one fabric, for the backend-generic tests (backend_tests.hpp).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tests/transport/test_util.hpp"
#include "transport/memory/memory_fabric.hpp"

namespace geoloco::transport::test {

struct MemoryCluster : ClusterOps<MemoryCluster> {
  static constexpr bool kUcx = false;
  // Frames above 64 KiB come by rendezvous, so both receive paths are exercised.
  memory::MemoryFabric fabric{memory::FabricOptions{0.0, 64 * 1024}};
  std::vector<std::unique_ptr<memory::MemoryTransport>> t;
  std::vector<PeerInfo> infos;
  std::vector<TransportConfig> cfgs_;
  std::vector<Identity> ids_;

  MemoryCluster(const std::vector<TransportConfig>& cfgs, const std::vector<Identity>& ids,
                const std::vector<TestHooks>& hooks = {}) {
    cfgs_ = cfgs;
    ids_ = ids;
    for (size_t i = 0; i < cfgs.size(); ++i) {
      t.push_back(fabric.endpoint(cfgs[i], ids[i], i < hooks.size() ? hooks[i] : TestHooks{}));
      infos.push_back(PeerInfo{ids[i].site, ids[i].rank, "memory", static_cast<int>(i)});
    }
  }
  ~MemoryCluster() { t.clear(); }  // endpoints before the fabric
  void connect(size_t i) { t[i]->connect(peers_of(i)); }
  // Kills endpoint i as a crash would (its peers see the connection drop).
  void kill(size_t i) { fabric.kill(ids_[i].site, ids_[i].rank); }
  // A new process in i's place (the old one gone), not yet connected.
  void restart(size_t i, double connect_timeout_s) {
    t[i].reset();
    TransportConfig c = cfgs_[i];
    c.connect_timeout_s = connect_timeout_s;
    t[i] = fabric.endpoint(c, ids_[i]);
  }
  void join(size_t i) { t[i]->connect(peers_of(i), ConnectMode::kJoin); }
};

}  // namespace geoloco::transport::test
