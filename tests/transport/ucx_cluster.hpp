// N UcxTransports in this process, all listening on 127.0.0.1 with ports picked by the kernel,
// for the backend-generic tests (backend_tests.hpp) and the UCX-only ones.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tests/transport/test_util.hpp"
#include "transport/ucx/ucx_transport.hpp"

namespace geoloco::transport::test {

struct UcxCluster : ClusterOps<UcxCluster> {
  static constexpr bool kUcx = true;
  std::vector<std::unique_ptr<ucx::UcxTransport>> t;
  std::vector<PeerInfo> infos;
  std::vector<TransportConfig> cfgs_;
  std::vector<Identity> ids_;

  UcxCluster(const std::vector<TransportConfig>& cfgs, const std::vector<Identity>& ids,
             const std::vector<TestHooks>& hooks = {}) {
    cfgs_ = cfgs;
    ids_ = ids;
    for (size_t i = 0; i < cfgs.size(); ++i) {
      t.push_back(std::make_unique<ucx::UcxTransport>(cfgs[i], ids[i], i < hooks.size() ? hooks[i] : TestHooks{}));
      int port = t.back()->listen("127.0.0.1", 0);
      infos.push_back(PeerInfo{ids[i].site, ids[i].rank, "127.0.0.1", port});
    }
  }
  void connect(size_t i) { t[i]->connect(peers_of(i)); }
  // In one process a crash is the transport going away (its peers see it shut down).
  void kill(size_t i) { t[i].reset(); }
  // A new process in i's place, listening on the same port, not yet connected.
  void restart(size_t i, double connect_timeout_s) {
    t[i].reset();
    TransportConfig c = cfgs_[i];
    c.connect_timeout_s = connect_timeout_s;
    t[i] = std::make_unique<ucx::UcxTransport>(c, ids_[i]);
    t[i]->listen("127.0.0.1", infos[i].port);
  }
  void join(size_t i) { t[i]->connect(peers_of(i), ConnectMode::kJoin); }
};

}  // namespace geoloco::transport::test
