// Helpers shared by the loop tests: small configs (temporary directories, ports and rank
// threads are tests/support's).
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <string>

#include "tests/support/temp_dir.hpp"
#include "tests/support/threads.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/loop/trainer.hpp"
#include "trainer/parallel/gloo_collective.hpp"

namespace geoloco::testing {

// Every rank of a one-site config as a thread over Gloo on loopback, the site's rendezvous on
// `store_port` (none for one rank); `tweak` adjusts each rank's options. Each rank's summary
// and final parameters, by rank.
struct SiteRun {
  std::vector<nlohmann::json> summaries;
  std::vector<std::vector<float>> params;
};
inline SiteRun run_site_threads(const trainer::RunConfig& cfg, int store_port,
                                const std::function<void(trainer::TrainerOptions&)>& tweak = {}) {
  const int ranks = cfg.sites.at(0).ranks;
  SiteRun out;
  out.summaries.resize(static_cast<size_t>(ranks));
  out.params.resize(static_cast<size_t>(ranks));
  test::run_ranks(ranks, [&](int r) {
    std::unique_ptr<parallel::Collective> coll;
    if (ranks > 1) {
      parallel::RendezvousOptions ro;
      ro.site = cfg.sites.at(0).name;
      ro.rank = r;
      ro.size = ranks;
      ro.store_port = store_port;
      ro.timeout = std::chrono::milliseconds(20000);
      coll = parallel::make_gloo(ro);
    }
    trainer::TrainerOptions o;
    o.progress = false;
    o.rank = r;
    o.collective = coll.get();
    if (tweak) tweak(o);
    trainer::Trainer t(cfg, o);
    out.summaries[static_cast<size_t>(r)] = t.run();
    out.params[static_cast<size_t>(r)] = t.parameters();
  });
  return out;
}

// A small synthetic-data run: 2 layers, d 32, context 16.
inline std::string tiny_config(const std::filesystem::path& out, const std::string& extra_train = "",
                               const std::string& extra = "") {
  return "run: {name: t, seed: 11, output_dir: " + out.string() +
         "}\n"
         "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
         "data:\n  train: {kind: synthetic, vocab: 32, branching: 3, seed: 5, tokens: 200000}\n"
         "train:\n  steps: 20\n  micro_batch: 4\n  grad_accum: 2\n  log_every: 5\n"
         "  optimizer: {lr: 3.0e-3}\n  schedule: {kind: cosine, warmup_steps: 3}\n" +
         extra_train + extra;
}

// Rewrites the value of metadata `key` in a safetensors file's JSON header in place to
// `fill(old_length)` (same length: the file still parses and every tensor checksum holds),
// so a test can hand a damaged value to the reader.
inline void damage_metadata(const std::filesystem::path& file, const std::string& key,
                            const std::function<std::string(size_t)>& fill) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  std::string head(8192, '\0');
  f.read(head.data(), static_cast<std::streamsize>(head.size()));
  const std::string tag = "\"" + key + "\":\"";
  const size_t at = head.find(tag);
  ASSERT_NE(at, std::string::npos) << key;
  const size_t begin = at + tag.size(), end = head.find('"', begin);
  const std::string value = fill(end - begin);
  ASSERT_EQ(value.size(), end - begin);
  f.clear();
  f.seekp(static_cast<std::streamoff>(begin));
  f.write(value.data(), static_cast<std::streamsize>(value.size()));
}

}  // namespace geoloco::testing
