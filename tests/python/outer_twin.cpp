// outer_twin: the native side of tests/python/test_exactness.py. Every site of a run's YAML
// (run.command's: sites and outer: are read) runs geoloco's outer loop as a thread over the
// in-memory fabric, driven through the native test double of the seam (tests/outer_optimizer/
// fake_site.hpp: its toy model and deterministic drift). Prints {"hash", "params"} of site 0's
// end as JSON: the Python package, given the same model, drift and YAML, must end on the same bits.
#include <cstdio>
#include <exception>
#include <nlohmann/json.hpp>
#include <thread>

#include "core/hash.hpp"
#include "outer_optimizer/diloco.hpp"
#include "tests/outer_optimizer/fake_site.hpp"
#include "tests/transport/test_util.hpp"
#include "trainer/loop/run_config.hpp"
#include "transport/memory/memory_fabric.hpp"

using namespace geoloco;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: outer_twin <run.yaml>\n");
    return 2;
  }
  try {
    const auto cfg = trainer::load_run_config(argv[1]);
    const int S = static_cast<int>(cfg.sites.size());
    transport::memory::MemoryFabric fabric;
    std::vector<std::unique_ptr<transport::memory::MemoryTransport>> tps(static_cast<size_t>(S));
    std::vector<std::thread> connecting;
    for (int s = 0; s < S; ++s)
      connecting.emplace_back([&, s] {
        auto t = fabric.endpoint(transport::test::small_config(), transport::test::ident(cfg.sites[size_t(s)].name));
        std::vector<transport::PeerInfo> peers;
        for (int q = 0; q < S; ++q)
          if (q != s) peers.push_back({cfg.sites[size_t(q)].name, 0, "memory", q});
        t->connect(peers, transport::ConnectMode::kAll);
        tps[size_t(s)] = std::move(t);
      });
    for (auto& t : connecting) t.join();
    const auto model = geoloco::testing::toy_model();
    std::vector<uint64_t> hashes(static_cast<size_t>(S));
    std::vector<float> site0;
    std::vector<std::exception_ptr> errors(static_cast<size_t>(S));
    std::vector<std::thread> sites;
    for (int s = 0; s < S; ++s)
      sites.emplace_back([&, s] {
        try {
          outer::OuterOptions o;
          for (const auto& sc : cfg.sites) o.sites.push_back({sc.name, 1});
          o.site = s;
          o.outer = cfg.outer;
          o.params = model;
          o.total_steps = cfg.train.steps;
          o.tokens_per_step = 1000;
          geoloco::testing::FakeSite site(s, geoloco::testing::toy_init(model.total));
          outer::Diloco d(o, tps[size_t(s)].get(), site);
          for (int64_t step = 1; step <= o.total_steps; ++step) {
            if (d.trains_step(step)) site.train(step);
            d.after_inner_step(step);
          }
          d.finish(o.total_steps);
          hashes[size_t(s)] = d.site_hash();
          if (s == 0) site0 = site.params();
        } catch (...) {
          errors[size_t(s)] = std::current_exception();
        }
      });
    for (auto& t : sites) t.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    for (int s = 1; s < S; ++s)
      if (hashes[size_t(s)] != hashes[0]) throw Error("the native sites ended on different hashes");
    std::printf("%s\n", nlohmann::json({{"hash", hex64(hashes[0])}, {"params", site0}}).dump().c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "outer_twin: %s\n", e.what());
    return 1;
  }
}
