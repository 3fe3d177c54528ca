// Streaming fragments (outer.fragments): the partition of the parameters, the schedule, and
// multi-site runs with F > 1 (ranks as threads: UCX over loopback, Gloo inside a site).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <set>

#include "tests/trainer/loop/test_util.hpp"
#include "tests/support/ports.hpp"
#include "multisite_util.hpp"
#include "outer_optimizer/fragment_plan.hpp"
#include "core/safetensors.hpp"
#include "core/error.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/loop/native_site.hpp"
#include "trainer/model/param_layout.hpp"

using namespace geoloco;
using geoloco::test::fresh_port;
using geoloco::test::TempDir;

namespace {

trainer::ModelConfig model(int L, int C = 32, int V = 50, int T = 16) {
  trainer::ModelConfig m;
  m.n_layer = L;
  m.n_head = 2;
  m.n_embd = C;
  m.vocab_size = V;
  m.block_size = T;
  return m;
}

// Every parameter index in exactly one fragment.
void expect_exact_partition(const trainer::ParamLayout& layout, const std::vector<outer::FragmentPlan>& plans) {
  std::vector<int> owner(static_cast<size_t>(layout.total()), -1);
  for (const auto& p : plans)
    for (const auto& r : p.ranges) {
      ASSERT_LT(r.begin, r.end);
      ASSERT_GE(r.begin, 0);
      ASSERT_LE(r.end, layout.total());
      for (int64_t i = r.begin; i < r.end; ++i) {
        ASSERT_EQ(owner[static_cast<size_t>(i)], -1)
            << "index " << i << " in fragments " << owner[size_t(i)] << " and " << p.index;
        owner[static_cast<size_t>(i)] = p.index;
      }
    }
  for (size_t i = 0; i < owner.size(); ++i) ASSERT_NE(owner[i], -1) << "index " << i << " in no fragment";
}

std::string base(const std::filesystem::path& out, int steps, int layers = 4) {
  return "run: {name: fr, seed: 3, output_dir: " + out.string() +
         "}\n"
         "model: {n_layer: " +
         std::to_string(layers) +
         ", n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
         "data:\n  train: {kind: synthetic, vocab: 32, branching: 3, seed: 5, tokens: 400000}\n"
         "train: {steps: " +
         std::to_string(steps) + ", micro_batch: 4, log_every: 5, optimizer: {lr: 3.0e-3}}\n";
}

trainer::RunConfig load(TempDir& d, const std::string& yaml) {
  d.file("k.psk", "0123456789abcdef-test-key");
  return trainer::load_run_config(d.file("c.yaml", yaml));
}

std::string sites(int count, int ranks, const std::string& strategy = "ddp") {
  return geoloco::testing::sites_yaml(count, ranks, fresh_port(), strategy);
}

const std::string kTransport = "transport: {psk_file: k.psk, timeout_s: 30}\n";

std::set<std::string> distinct(const nlohmann::json& summary, const char* key) {
  std::set<std::string> v;
  for (auto& r : summary["ranks"]) v.insert(r[key].get<std::string>());
  return v;
}

}  // namespace

TEST(FragmentPlan, PartitionIsExactForEveryCount) {
  for (int L : {1, 2, 3, 4, 7, 12})
    for (int V : {50, 257}) {
      trainer::ParamLayout layout(model(L, 32, V));
      for (int F = 1; F <= L; ++F) {
        SCOPED_TRACE("L=" + std::to_string(L) + " V=" + std::to_string(V) + " F=" + std::to_string(F));
        auto plans = outer::plan_fragments(trainer::model_params(layout), F, 100);
        ASSERT_EQ(plans.size(), static_cast<size_t>(F));
        expect_exact_partition(layout, plans);
        // Blocks strided over depth: block l in fragment l mod F, whole.
        for (int l = 0; l < L; ++l) {
          const auto& p = plans[static_cast<size_t>(l % F)];
          EXPECT_TRUE(std::count(p.blocks.begin(), p.blocks.end(), l)) << "block " << l;
          const auto& b = layout.block(l);
          EXPECT_TRUE(std::any_of(p.ranges.begin(), p.ranges.end(),
                                  [&](const outer::Range& r) { return r.begin <= b.begin && b.end <= r.end; }));
        }
        // Ranges sorted, disjoint and merged.
        for (const auto& p : plans)
          for (size_t i = 1; i < p.ranges.size(); ++i) EXPECT_LT(p.ranges[i - 1].end, p.ranges[i].begin);
      }
    }
}

TEST(FragmentPlan, OffsetsAreStaggeredAndOneFragmentIsThePlainSchedule) {
  trainer::ParamLayout layout(model(4));
  auto one = outer::plan_fragments(trainer::model_params(layout), 1, 50);
  EXPECT_EQ(one[0].offset, 0);
  for (int64_t s = 1; s <= 200; ++s) EXPECT_EQ(outer::syncs_at(one[0], s, 50), s % 50 == 0) << s;
  EXPECT_FALSE(outer::syncs_at(one[0], 0, 50));
  auto four = outer::plan_fragments(trainer::model_params(layout), 4, 50);
  std::vector<int64_t> offs;
  for (auto& p : four) offs.push_back(p.offset);
  EXPECT_EQ(offs, (std::vector<int64_t>{12, 25, 37, 0}));
  // Every step of a period syncs at most one fragment; each fragment once per period.
  for (int64_t s = 1; s <= 100; ++s) {
    int n = 0;
    for (auto& p : four) n += outer::syncs_at(p, s, 50);
    EXPECT_LE(n, 1) << s;
  }
  for (auto& p : four) {
    int n = 0;
    for (int64_t s = 1; s <= 100; ++s) n += outer::syncs_at(p, s, 50);
    EXPECT_EQ(n, 2) << p.index;
  }
}

TEST(FragmentPlan, Gpt2SmallFragmentsAreBalanced) {
  // GPT-2 124M: wte is 5x a block; cutting it by rows keeps 4 fragments within 0.1%.
  trainer::ParamLayout layout(model(12, 768, 50257, 1024));
  for (int F : {2, 3, 4, 6, 12}) {
    auto plans = outer::plan_fragments(trainer::model_params(layout), F, 100);
    int64_t lo = INT64_MAX, hi = 0;
    for (auto& p : plans) {
      lo = std::min(lo, p.elements());
      hi = std::max(hi, p.elements());
    }
    EXPECT_LT(double(hi) / double(lo), 1.001) << "F=" << F << " min " << lo << " max " << hi;
  }
}

TEST(FragmentPlan, ShardIntersectionsReassembleTheFragment) {
  trainer::ParamLayout layout(model(3, 32, 50));
  auto plans = outer::plan_fragments(trainer::model_params(layout), 3, 30);
  for (int ranks : {1, 2, 3, 5}) {
    for (const auto& p : plans) {
      std::vector<outer::Range> back;
      for (int r = 0; r < ranks; ++r) {
        auto sh = geoloco::shard_of(layout.total(), r, ranks);
        for (auto x : outer::intersect(p.ranges, sh)) {
          EXPECT_GE(x.begin, 0);
          EXPECT_LE(x.end, sh.count);
          back.push_back({x.begin + sh.offset, x.end + sh.offset});
        }
      }
      // Concatenating the ranks' pieces in rank order gives the fragment's ranges, split only
      // at shard boundaries.
      int64_t covered = 0;
      for (auto& x : back) covered += x.size();
      EXPECT_EQ(covered, p.elements());
      for (size_t i = 1; i < back.size(); ++i) EXPECT_LE(back[i - 1].end, back[i].begin);
    }
  }
}

TEST(FragmentPlan, RejectsImpossibleCounts) {
  trainer::ParamLayout layout(model(2));
  EXPECT_THROW(outer::plan_fragments(trainer::model_params(layout), 0, 10), ConfigError);
  EXPECT_THROW(outer::plan_fragments(trainer::model_params(layout), 3, 10), ConfigError);  // more than n_layer
  EXPECT_THROW(outer::plan_fragments(trainer::model_params(layout), 2, 1), ConfigError);   // more than interval
  TempDir d;
  try {
    load(d, base(d.path() / "out", 4, 2) + "outer: {interval: 4, fragments: 3}\n" + sites(2, 1) + kTransport);
    FAIL() << "fragments > n_layer accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("c.yaml:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("fragments"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("2 transformer blocks"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load(d, base(d.path() / "out", 4, 2) + "outer: {interval: 4, fragments: 2, inner_state: reset}\n" +
                           sites(2, 1) + kTransport),
               ConfigError);
}

// F = 2 over 2 sites x 2 ranks under zero2 (shards cut fragments at rank boundaries):
// every fragment round is hash-checked across sites, every replica ends identical, the
// schedule has the expected number of rounds, and each round carries about half the model.
TEST(Fragments, TwoFragmentsStayBitIdenticalBlockingAndOverlapped) {
  std::map<std::string, std::string> hashes;
  for (const char* mode : {"", ", overlap_steps: 3", ", delayed_update: true"}) {
    SCOPED_TRACE(mode);
    TempDir d;
    // H 4, F 2: fragment 0 syncs at 2, 6, 10; fragment 1 at 4, 8, 12 = the last step.
    auto s = geoloco::testing::run_ranks(load(d, base(d.path() / "out", 12) + "outer: {interval: 4, fragments: 2" +
                                                     mode + ", compression: {codec: int8, error_feedback: true}}\n" +
                                                     sites(2, 2, "zero2") + kTransport))[0];
    EXPECT_EQ(distinct(s, "params_hash").size(), 1u);
    EXPECT_EQ(distinct(s, "global_weights_hash").size(), 1u);
    EXPECT_EQ(s["outer_fragments"].get<int>(), 2);
    // Blocking: 3 + 3 rounds, plus fragment 0 again at the last step (last synced at 10).
    // Overlapped: launches 2, 6, 10 and 4, 8, then both blocking at 12.
    EXPECT_EQ(s["outer_steps"].get<int>(), 7);
    int64_t shard_total = 0;
    for (auto& f : s["fragments"]) shard_total += f["shard_elements"].get<int64_t>();
    EXPECT_GT(shard_total, 0);
    hashes[mode] = s["params_hash"].get<std::string>();
  }
  EXPECT_NE(hashes[""], hashes[", overlap_steps: 3"]);
  EXPECT_NE(hashes[""], hashes[", delayed_update: true"]);
}

// More than one fragment in flight (tau 3 > H / F = 2) and a checkpoint taken then: the
// resumed run equals the uninterrupted one bit for bit.
TEST(Fragments, ResumeWithTwoFragmentsInFlightIsExact) {
  TempDir a, b;
  const std::string body =
      "outer: {interval: 4, fragments: 2, overlap_steps: 3, compression: {codec: int4, block: 64, error_feedback: "
      "true}}\n";
  auto ref = geoloco::testing::run_ranks(load(a, base(a.path() / "out", 14) + body + sites(2, 1) + kTransport))[0];
  auto cfg = load(b, base(b.path() / "out", 14) + body + sites(2, 1) + kTransport);
  // H 4, F 2, tau 3: fragment 0 launches at 2, 6, 10 (merges 5, 9, 13), fragment 1 at 4, 8
  // (merges 7, 11). Stopped after step 6, both are in flight.
  geoloco::testing::run_ranks(cfg, 6);
  int states = 0;
  for (auto& e : std::filesystem::recursive_directory_iterator(b.path() / "out" / "checkpoints" / "paris"))
    if (e.path().filename() == "state.r0.safetensors") {
      auto f = geoloco::SafetensorsFile::read(e.path().string());
      EXPECT_EQ(f.meta("outer.f0.pending_merge_step"), "9");
      EXPECT_EQ(f.meta("outer.f1.pending_merge_step"), "7");
      ++states;
    }
  EXPECT_EQ(states, 1);
  auto res = geoloco::testing::run_ranks(cfg, 0, true)[0];
  EXPECT_EQ(res["params_hash"], ref["params_hash"]);
  EXPECT_EQ(res["global_weights_hash"], ref["global_weights_hash"]);
}

// A fragment round moves only its share: with F = 4 each round's frame is about a quarter
// of the F = 1 frame (same codec), and the trace has one worker thread per fragment.
TEST(Fragments, EachRoundCarriesItsFragmentOnly) {
  auto run = [](int F, nlohmann::json& trace) {
    TempDir d;
    auto s = geoloco::testing::run_ranks(
        load(d, base(d.path() / "out", 8) + "outer: {interval: 4, fragments: " + std::to_string(F) +
                    ", overlap_steps: 1, compression: {codec: fp16}}\n" + sites(2, 1) + kTransport))[0];
    trace = nlohmann::json::parse(std::ifstream(d.path() / "out" / "trace.json"));
    return s;
  };
  nlohmann::json t1, t4;
  auto one = run(1, t1);
  auto four = run(4, t4);
  // Per period of H steps both move one model's worth (fp16: 2 bytes per parameter).
  const double w1 = one["wire_bytes_per_outer_step"].get<double>(),
               w4 = four["wire_bytes_per_outer_step"].get<double>();
  EXPECT_NEAR(w4 / w1, 1.0, 0.02) << w1 << " vs " << w4;
  int64_t params = 0;
  for (auto& f : four["fragments"]) {
    params += f["params"].get<int64_t>();
    EXPECT_NEAR(double(f["params"].get<int64_t>()) / double(one["fragments"][0]["params"].get<int64_t>()), 0.25, 0.06);
  }
  EXPECT_EQ(params, one["fragments"][0]["params"].get<int64_t>());
  std::set<int> tids;
  for (auto& e : t4)
    if (e["ph"] == "X" && e["name"] == "compress" && e["pid"] == 0) tids.insert(e["tid"].get<int>());
  EXPECT_TRUE(tids.count(1) && tids.count(11) && tids.count(12) && tids.count(13)) << t4.dump().substr(0, 200);
}

// Fragments are cut from the model's named tensors, whatever the model: here an embedding, six
// blocks of two tensors, an untied output head and two norm vectors (a Llama-shaped layout).
// Every element is in one fragment; blocks go whole to fragment l mod F; both matrices outside
// the blocks are cut into F chunks of whole rows; the vectors outside the blocks go together to
// the smallest fragment.
TEST(FragmentPlan, CutsAnyModelByItsNamedTensors) {
  outer::ModelParams m;
  auto add = [&](std::string name, int64_t rows, int64_t cols, int block) {
    m.tensors.push_back({std::move(name), m.total, rows, cols, block});
    m.total += rows * cols;
  };
  add("embed", 40, 8, -1);
  for (int b = 0; b < 6; ++b) {
    add("layers." + std::to_string(b) + ".w", 8, 24, b);
    add("layers." + std::to_string(b) + ".norm", 1, 8, b);
  }
  add("final_norm", 1, 8, -1);
  add("head", 40, 8, -1);
  add("head_norm", 1, 8, -1);
  m.validate();
  auto plans = outer::plan_fragments(m, 4, 20);
  ASSERT_EQ(plans.size(), 4u);
  std::vector<int> owner(static_cast<size_t>(m.total), -1);
  for (const auto& p : plans)
    for (const auto& r : p.ranges)
      for (int64_t i = r.begin; i < r.end; ++i) {
        ASSERT_EQ(owner[static_cast<size_t>(i)], -1) << i;
        owner[static_cast<size_t>(i)] = p.index;
      }
  for (size_t i = 0; i < owner.size(); ++i) ASSERT_NE(owner[i], -1) << i;
  auto at = [&](const std::string& name, int64_t row) {
    for (const auto& t : m.tensors)
      if (t.name == name) return owner[static_cast<size_t>(t.offset + row * t.cols)];
    return -2;
  };
  for (int b = 0; b < 6; ++b) {
    EXPECT_EQ(at("layers." + std::to_string(b) + ".w", 0), b % 4);
    EXPECT_EQ(at("layers." + std::to_string(b) + ".norm", 0), b % 4);
    EXPECT_EQ(plans[static_cast<size_t>(b % 4)].blocks.size(), b % 4 < 2 ? 2u : 1u);
  }
  for (const char* table : {"embed", "head"})
    for (int f = 0; f < 4; ++f) EXPECT_EQ(at(table, 10 * f), f) << table << " row " << 10 * f;
  // Fragments 2 and 3 hold one block each, 0 and 1 two: the vectors go to 2, the lowest smallest.
  EXPECT_EQ(at("final_norm", 0), 2);
  EXPECT_EQ(at("head_norm", 0), 2);
  // A layout that does not tile its total is refused, naming the tensor.
  m.tensors[1].offset += 1;
  EXPECT_THROW(m.validate(), Error);
}

// The GPT-2 layout through its named tensors cuts exactly as the layout-specific rule did
// before the outer loop became a library: wte and wpe rows [f R/F, (f+1) R/F) and blocks
// l = f mod F to fragment f, ln_f (weight and bias) to the smallest -- so fragments, frames and
// weights of every run stay what they were.
TEST(FragmentPlan, Gpt2CutIsTheLayoutSpecificOne) {
  for (int L : {2, 5, 12})
    for (int F = 1; F <= std::min(L, 4); ++F) {
      trainer::ParamLayout layout(model(L, 32, 257, 64));
      const auto& mc = layout.config();
      const int64_t C = mc.n_embd;
      std::vector<std::vector<outer::Range>> want(static_cast<size_t>(F));
      auto rows = [&](int64_t at, int64_t R, int f) {
        return outer::Range{at + R * f / F * C, at + R * (f + 1) / F * C};
      };
      std::vector<int64_t> size(static_cast<size_t>(F), 0);
      for (int f = 0; f < F; ++f) {
        for (auto r : {rows(layout.wte(), mc.vocab_size, f), rows(layout.wpe(), mc.block_size, f)}) {
          want[static_cast<size_t>(f)].push_back(r);
          size[static_cast<size_t>(f)] += r.size();
        }
      }
      for (int l = 0; l < L; ++l) {
        want[static_cast<size_t>(l % F)].push_back({layout.block(l).begin, layout.block(l).end});
        size[static_cast<size_t>(l % F)] += layout.block(l).end - layout.block(l).begin;
      }
      const auto smallest = std::min_element(size.begin(), size.end()) - size.begin();
      want[static_cast<size_t>(smallest)].push_back({layout.lnf_w(), layout.lnf_b() + C});
      const auto plans = outer::plan_fragments(trainer::model_params(layout), F, 100);
      for (int f = 0; f < F; ++f) {
        auto w = want[static_cast<size_t>(f)];
        std::sort(w.begin(), w.end(), [](const outer::Range& a, const outer::Range& b) { return a.begin < b.begin; });
        std::vector<outer::Range> merged;
        for (const auto& r : w)
          if (!merged.empty() && merged.back().end == r.begin)
            merged.back().end = r.end;
          else
            merged.push_back(r);
        EXPECT_EQ(plans[static_cast<size_t>(f)].ranges, merged) << "L=" << L << " F=" << F << " fragment " << f;
      }
    }
}
