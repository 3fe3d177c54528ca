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

  UcxCluster(const std::vector<TransportConfig>& cfgs, const std::vector<Identity>& ids,
             const std::vector<TestHooks>& hooks = {}) {
    for (size_t i = 0; i < cfgs.size(); ++i) {
      t.push_back(std::make_unique<ucx::UcxTransport>(cfgs[i], ids[i], i < hooks.size() ? hooks[i] : TestHooks{}));
      int port = t.back()->listen("127.0.0.1", 0);
      infos.push_back(PeerInfo{ids[i].site, ids[i].rank, "127.0.0.1", port});
    }
  }
  void connect(size_t i) { t[i]->connect(peers_of(i)); }
};

}  // namespace geoloco::transport::test
