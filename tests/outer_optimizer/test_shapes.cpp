// Sites of different sizes (docs/shapes.md): the exchange layout's arithmetic, and runs whose
// sites have 1, 2 and 3 ranks under every strategy, ranks as threads in this process.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "tests/trainer/loop/test_util.hpp"
#include "multisite_util.hpp"
#include "outer_optimizer/exchange_layout.hpp"
#include "outer_optimizer/owner_exchange.hpp"
#include "outer_optimizer/round_sync.hpp"
#include "outer_optimizer/owner_exchange.hpp"
#include "outer_optimizer/site_peers.hpp"
#include "tests/support/ports.hpp"
#include "trainer/checkpoint/model_checkpoint.hpp"
#include "core/error.hpp"
#include "trainer/loop/run_config.hpp"

using namespace geoloco;
using geoloco::test::fresh_port;
using geoloco::test::TempDir;
using geoloco::testing::expect_one_hash;
using geoloco::testing::load_params;
using outer::ExchangeLayout;

namespace {

std::string base(const std::filesystem::path& out, int steps) {
  return "run: {name: shapes, seed: 3, output_dir: " + out.string() +
         "}\n"
         "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
         "data:\n  train: {kind: synthetic, vocab: 32, branching: 3, seed: 5, tokens: 400000}\n"
         "train: {steps: " +
         std::to_string(steps) + ", micro_batch: 4, log_every: 5, optimizer: {lr: 3.0e-3}}\n";
}

// Sites named paris, lyon, milan with the given ranks (and per-site extras), site i on port + 10 i.
std::string sites(const std::vector<std::pair<int, std::string>>& shape) {
  static const char* names[] = {"paris", "lyon", "milan", "oslo"};
  const int port = fresh_port();
  std::string s = "sites:\n";
  for (size_t i = 0; i < shape.size(); ++i)
    s += "  - {name: " + std::string(names[i]) + ", ranks: " + std::to_string(shape[i].first) +
         ", port: " + std::to_string(port + 10 * static_cast<int>(i)) +
         (shape[i].second.empty() ? "" : ", " + shape[i].second) + "}\n";
  return s;
}

std::string psk(const TempDir& d) { return d.file("k.psk", "0123456789abcdef-test-key"); }
const char* kTransport = "transport: {psk_file: k.psk, timeout_s: 30}\n";

}  // namespace

TEST(ExchangeLayout, SitesOfOneRankCountArePiecesOfOneShardEach) {
  const ExchangeLayout l(10, {3, 3, 3});
  EXPECT_TRUE(l.uniform());
  ASSERT_EQ(l.pieces().size(), 3u);
  for (int r = 0; r < 3; ++r) {
    const auto& p = l.pieces()[static_cast<size_t>(r)];
    EXPECT_EQ(p.begin, l.shard(0, r).offset);
    EXPECT_EQ(p.end, l.shard(0, r).end());
    EXPECT_EQ(p.owner, std::vector<int>({r, r, r}));
    EXPECT_EQ(l.pieces_of(1, r), std::vector<uint32_t>({static_cast<uint32_t>(r)}));
    EXPECT_EQ(l.partner(0, r, 2), r);
    EXPECT_TRUE(l.mutual(0, r, 2));
    EXPECT_EQ(outer::SitePeers::connected_ranks(l, 0, r, 1), std::vector<int>({r}));
  }
}

TEST(ExchangeLayout, DifferentRankCountsCutTheCommonRefinement) {
  // 12 elements over 1, 2 and 3 ranks: shard boundaries 6 and 4, 8.
  const ExchangeLayout l(12, {1, 2, 3});
  EXPECT_FALSE(l.uniform());
  ASSERT_EQ(l.pieces().size(), 4u);
  const std::vector<std::pair<int64_t, int64_t>> bounds = {{0, 4}, {4, 6}, {6, 8}, {8, 12}};
  const std::vector<std::vector<int>> owners = {{0, 0, 0}, {0, 0, 1}, {0, 1, 1}, {0, 1, 2}};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(l.pieces()[i].begin, bounds[i].first) << i;
    EXPECT_EQ(l.pieces()[i].end, bounds[i].second) << i;
    EXPECT_EQ(l.pieces()[i].owner, owners[i]) << i;
  }
  EXPECT_EQ(l.pieces_of(0, 0), std::vector<uint32_t>({0, 1, 2, 3}));
  EXPECT_EQ(l.pieces_of(1, 1), std::vector<uint32_t>({2, 3}));
  EXPECT_EQ(l.pieces_of(2, 1), std::vector<uint32_t>({1, 2}));
  EXPECT_EQ(l.linked_ranks(2, 1, 1), std::vector<int>({0, 1}));
  EXPECT_EQ(l.linked_ranks(0, 0, 2), std::vector<int>({0, 1, 2}));
  // Partners: the owner of the shard's first element. milan/1 starts at 4, inside lyon/0;
  // lyon/0's partner at milan is milan/0: not mutual. Rank 0 always is.
  EXPECT_EQ(l.partner(2, 1, 1), 0);
  EXPECT_FALSE(l.mutual(2, 1, 1));
  EXPECT_EQ(l.partner(1, 1, 2), 1);  // lyon/1 starts at 6, inside milan/1, which starts inside lyon/0
  EXPECT_FALSE(l.mutual(1, 1, 2));
  EXPECT_TRUE(l.mutual(1, 0, 2));
  for (int s = 0; s < 3; ++s)
    for (int t = 0; t < 3; ++t)
      if (s != t) {
        EXPECT_TRUE(l.mutual(s, 0, t));
      }
  // Fewer elements than ranks: empty shards own no piece; their partner is the last element's owner.
  const ExchangeLayout tiny(2, {3, 1});
  ASSERT_EQ(tiny.pieces().size(), 2u);
  EXPECT_TRUE(tiny.pieces_of(0, 2).empty());
  EXPECT_EQ(tiny.partner(0, 2, 1), 0);
  EXPECT_EQ(tiny.pieces()[1].owner, std::vector<int>({1, 0}));
  EXPECT_THROW(ExchangeLayout(10, {2, 0}), Error);
  EXPECT_THROW(ExchangeLayout(10, {}), Error);
}

// Every element lies in exactly one piece, each piece in one shard per site, and the
// connections are symmetric (a rank dials only ranks that expect it), for random shapes.
TEST(ExchangeLayout, PiecesTileAndConnectionsAreSymmetricForRandomShapes) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int S = 2 + static_cast<int>(rng() % 4);
    std::vector<int> ranks;
    for (int s = 0; s < S; ++s) ranks.push_back(1 + static_cast<int>(rng() % 6));
    const int64_t n = static_cast<int64_t>(rng() % 40);
    const ExchangeLayout l(n, ranks);
    int64_t at = 0;
    for (const auto& p : l.pieces()) {
      EXPECT_EQ(p.begin, at);
      EXPECT_LT(p.begin, p.end);
      at = p.end;
      for (int s = 0; s < S; ++s) {
        const auto sh = l.shard(s, p.owner[static_cast<size_t>(s)]);
        EXPECT_GE(p.begin, sh.offset);
        EXPECT_LE(p.end, sh.end());
      }
    }
    EXPECT_EQ(at, n);
    for (int s = 0; s < S; ++s)
      for (int t = 0; t < S; ++t) {
        if (s == t) continue;
        for (int r = 0; r < ranks[static_cast<size_t>(s)]; ++r)
          for (int q : outer::SitePeers::connected_ranks(l, s, r, t)) {
            const auto back = outer::SitePeers::connected_ranks(l, t, q, s);
            EXPECT_TRUE(std::find(back.begin(), back.end(), r) != back.end())
                << "n " << n << " site " << s << "/" << r << " -> " << t << "/" << q;
          }
      }
  }
}

// A fragment's elements on a rank, cut by the pieces of its shard: contiguous runs of the
// gathered vector in piece order, empty where the fragment has nothing in a piece.
TEST(ExchangeLayout, FragmentSegmentsFollowThePieces) {
  const ExchangeLayout l(12, {1, 2, 3});
  const geoloco::ShardRange shard = l.shard(0, 0);  // paris holds all 12: pieces 0..3
  // A fragment of elements [2, 5) and [9, 11).
  const std::vector<outer::Range> local = {{2, 5}, {9, 11}};
  const auto seg = outer::cut_segments(local, shard, l, 0, 0);
  ASSERT_EQ(seg.size(), 4u);
  EXPECT_EQ(seg[0].begin, 0u);  // piece [0,4): elements 2, 3
  EXPECT_EQ(seg[0].end, 2u);
  EXPECT_EQ(seg[1].begin, 2u);  // piece [4,6): element 4
  EXPECT_EQ(seg[1].end, 3u);
  EXPECT_EQ(seg[2].size(), 0u);  // piece [6,8): nothing
  EXPECT_EQ(seg[2].begin, 3u);
  EXPECT_EQ(seg[3].begin, 3u);  // piece [8,12): elements 9, 10
  EXPECT_EQ(seg[3].end, 5u);
  // milan/2 holds [8, 12), piece 3 only; relative ranges into its shard.
  const auto m = outer::cut_segments({{1, 3}}, l.shard(2, 2), l, 2, 2);
  ASSERT_EQ(m.size(), 1u);
  EXPECT_EQ(m[0].piece, 3u);
  EXPECT_EQ(m[0].size(), 2u);
}

// The test: sites of 1, 2 and 3 ranks under every strategy (and the three mixed in one
// run, with two fragments overlapped and a lossy codec with error feedback) end with one global
// hash and one parameter vector on every rank of every site.
TEST(Shapes, SitesOfOneTwoAndThreeRanksAgreeUnderEveryStrategy) {
  const std::string codec = "compression: {codec: int4, block: 64, error_feedback: true, zstd_level: 1}";
  for (const std::string strategy : {"ddp", "zero1", "zero2", "fsdp"}) {
    TempDir d;
    psk(d);
    const std::string st = "strategy: " + strategy;
    auto cfg = trainer::load_run_config(d.file("c.yaml", base(d.path() / "out", 12) + "outer: {interval: 3, " + codec +
                                                             "}\n" + sites({{1, st}, {2, st}, {3, st}}) + kTransport));
    const auto out = geoloco::testing::run_ranks(cfg);
    expect_one_hash(out[0], 6, strategy);
    EXPECT_EQ(out[0]["outer_steps"].get<int>(), 4) << strategy;
    EXPECT_TRUE(std::isfinite(out[0]["val_loss"].get<double>())) << strategy;
  }
  TempDir d;
  psk(d);
  auto cfg = trainer::load_run_config(d.file(
      "c.yaml", base(d.path() / "out", 16) + "outer: {interval: 4, fragments: 2, overlap_steps: 1, " + codec + "}\n" +
                    sites({{3, "strategy: fsdp"}, {1, "strategy: ddp"}, {2, "strategy: zero2"}}) + kTransport));
  const auto out = geoloco::testing::run_ranks(cfg);
  expect_one_hash(out[0], 6, "mixed, fragments and overlap");
  // 8 staggered rounds, and the last step's blocking sync of the fragment overlapped at step 14.
  EXPECT_EQ(out[0]["outer_steps"].get<int>(), 9);
}

// A hybrid site (4 ranks as 2 groups of 2) beside an fsdp site of 2 ranks and a ddp site of
// 1, with two fragments overlapped and int4 + error feedback: a hybrid rank's site shard is
// shard_of(n, r, 4) as under every strategy, so the exchange is unchanged and every rank of
// every site ends with one hash and one parameter vector.
TEST(Shapes, AHybridSiteAgreesWithTheOtherStrategies) {
  TempDir d;
  psk(d);
  auto cfg = trainer::load_run_config(d.file(
      "c.yaml", base(d.path() / "out", 16) +
                    "outer: {interval: 4, fragments: 2, overlap_steps: 1, compression: {codec: int4, block: "
                    "64, error_feedback: true, zstd_level: 1}}\n" +
                    sites({{4, "strategy: hybrid, group_size: 2"}, {2, "strategy: fsdp"}, {1, ""}}) + kTransport));
  const auto out = geoloco::testing::run_ranks(cfg);
  expect_one_hash(out[0], 7, "hybrid beside fsdp and ddp");
  EXPECT_EQ(out[0]["outer_steps"].get<int>(), 9);
  int hybrid_ranks = 0;
  for (const auto& r : out[0]["ranks"])
    if (r["memory"]["strategy"] == "hybrid") {
      EXPECT_EQ(r["memory"]["group_size"], 2) << r.dump();
      ++hybrid_ranks;
    }
  EXPECT_EQ(hybrid_ranks, 4);
}

// The equivalence the math guarantees: with every site replaying identical data
// (data.across_sites: identical), a 2-rank site with micro-batch B and a 1-rank site
// accumulating 2 micro-batches of B draw the same 2B windows per step and compute the same mean
// gradient, up to the order of the float sums. So a run of {2 ranks, 1 rank x grad_accum 2}
// ends within float tolerance of {2, 2} and of {1 x 2, 1 x 2}: only rounding differs.
// (The validation loss is compared where the first site has 2 ranks in both runs: a site
// evaluates train.eval_batches micro-batches per rank, so a 1-rank site scores fewer windows.)
TEST(Shapes, ATwoRankSiteAndAOneRankSiteAccumulatingTwiceAreEquivalent) {
  const std::string outer = "outer: {interval: 4, compression: {codec: fp32}}\n";
  std::vector<std::vector<float>> params;
  std::vector<double> losses;
  for (const auto& shape : std::vector<std::vector<std::pair<int, std::string>>>{
           {{2, ""}, {2, ""}}, {{2, ""}, {1, "grad_accum: 2"}}, {{1, "grad_accum: 2"}, {1, "grad_accum: 2"}}}) {
    TempDir d;
    psk(d);
    auto cfg =
        trainer::load_run_config(d.file("c.yaml", base(d.path() / "out", 16) + outer + sites(shape) + kTransport),
                                 {"data.across_sites=identical"});
    const auto out = geoloco::testing::run_ranks(cfg);
    expect_one_hash(out[0], cfg.world_size(), "shape");
    // Every site trains 8 sequences per step here (4 x 2 ranks, or 4 x 2 micro-batches).
    EXPECT_EQ(cfg.global_batch(), 16);
    EXPECT_EQ(out[0]["tokens"].get<int64_t>(), 16 * cfg.global_batch() * cfg.seq_len());
    params.push_back(load_params(out[0]["checkpoint"]));
    losses.push_back(out[0]["val_loss"].get<double>());
  }
  for (size_t k = 1; k < params.size(); ++k) {
    double max_diff = 0;
    for (size_t i = 0; i < params[0].size(); ++i)
      max_diff = std::max(max_diff, double(std::fabs(params[0][i] - params[k][i])));
    // Rounding of differently ordered sums, compounded through 16 AdamW steps: a stated tolerance.
    EXPECT_LT(max_diff, 1e-4) << "shape " << k;
    EXPECT_GT(max_diff, 0.0) << "shape " << k << ": the sums are ordered differently, so some bit should differ";
    if (k == 1) {
      EXPECT_NEAR(losses[k], losses[0], 1e-4) << "shape " << k;
    }
  }
}

// The hash check covers every piece: a site of 3 ranks whose weights diverge from sites of 1
// and 2 ranks is stopped, naming the piece and both sites.
TEST(Shapes, DivergedWeightsAreCaughtPieceByPiece) {
  geoloco::testing::RankSetup perturb;
  perturb.hooks.perturb_global = outer::OuterHooks::Perturb{2, 2};
  TempDir d;
  psk(d);
  auto cfg = trainer::load_run_config(d.file("c.yaml", base(d.path() / "out", 12) + "outer: {interval: 3}\n" +
                                                           sites({{1, ""}, {2, ""}, {3, ""}}) + kTransport));
  try {
    geoloco::testing::run_ranks(cfg, 0, false, perturb);
    ADD_FAILURE() << "the run did not stop";
  } catch (const std::exception& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("outer round 2: global weights diverged: piece"), std::string::npos) << m;
    EXPECT_NE(m.find("milan"), std::string::npos) << m;
  }
}

// outer.exchange: owner (owner_exchange.hpp): a segment's S slices tile it in order, balanced,
// and every element of a fragment is owned by exactly one site (the owner residual's layout).
TEST(OwnerExchange, SlicesTileEverySegmentAndEveryElementHasOneOwner) {
  for (size_t n : {0, 1, 2, 5, 7, 100, 1001})
    for (int S = 1; S <= 8; ++S) {
      outer::Segment sg{0, 3, 3 + n};
      size_t at = sg.begin, lo = n, hi = 0;
      for (int j = 0; j < S; ++j) {
        const outer::Slice sl = outer::owner_slice(sg, j, S);
        EXPECT_EQ(sl.begin, at) << n << " " << S << " " << j;
        at = sl.end;
        lo = std::min(lo, sl.size());
        hi = std::max(hi, sl.size());
      }
      EXPECT_EQ(at, sg.end) << n << " " << S;
      EXPECT_LE(hi - lo, 1u) << n << " " << S;
    }
  outer::FragmentState f;
  f.n = 23;
  f.segments = {{0, 0, 10}, {1, 10, 10}, {2, 10, 23}};
  // The owner residual holds each site's slices in segment order; expanded, the three sites'
  // cover every element once, and gathering gives back what was expanded.
  std::vector<float> sum(f.n, 0.0f);
  size_t total = 0;
  for (int s = 0; s < 3; ++s) {
    const size_t n = outer::owned_count(f, s, 3);
    total += n;
    std::vector<float> owned(n, 1.0f), gathered(f.n), back(n);
    for (size_t i = 0; i < n; ++i) owned[i] = float(i + 1);
    outer::expand_owned(f, s, 3, owned, gathered);
    for (size_t i = 0; i < f.n; ++i) sum[i] += gathered[i] != 0.0f ? 1.0f : 0.0f;
    outer::gather_owned(f, s, 3, gathered, back);
    EXPECT_EQ(back, owned) << s;
  }
  EXPECT_EQ(total, f.n);
  for (size_t i = 0; i < f.n; ++i) EXPECT_EQ(sum[i], 1.0f) << i;
  std::vector<float> wrong(3), g(f.n);
  EXPECT_THROW(outer::expand_owned(f, 0, 3, wrong, g), Error);
  EXPECT_THROW(outer::owner_slice(f.segments[0], 3, 3), Error);
}

namespace {
// Each site's bytes sent over the run (the sum of its ranks' transport counters).
std::map<std::string, double> bytes_by_site(const nlohmann::json& summary) {
  std::map<std::string, double> out;
  for (const auto& r : summary["ranks"]) out[r["site"].get<std::string>()] += r["wan_bytes_sent"].get<double>();
  return out;
}
}  // namespace

// The exchange's figure: with fp32 the first phase's slices and the second phase's averages are
// exact, and an owner sums its slice in site order with the weights every site uses, so the
// run ends on all-to-all's global hash bit for bit -- on sites of 1, 2 and 3 ranks, two
// fragments overlapped -- while each site sends about 2(S-1)/S of its shard per round instead of
// S-1: two thirds of all-to-all's bytes for three sites (plus the same handshakes and checks).
TEST(OwnerExchange, Fp32EndsOnTheAllToAllBitsWithTwoThirdsOfTheBytesOnThreeSites) {
  std::map<std::string, nlohmann::json> out;
  for (const std::string exchange : {"all_to_all", "owner"}) {
    TempDir d;
    psk(d);
    auto cfg = trainer::load_run_config(d.file(
        "c.yaml", base(d.path() / "out", 16) + "outer: {interval: 4, fragments: 2, overlap_steps: 1, exchange: " +
                      exchange + ", min_sites: 3, compression: {codec: fp32}}\n" +
                      sites({{1, "strategy: ddp"}, {2, "strategy: fsdp"}, {3, "strategy: zero1"}}) + kTransport));
    out[exchange] = geoloco::testing::run_ranks(cfg)[0];
    expect_one_hash(out[exchange], 6, exchange);
    EXPECT_EQ(out[exchange]["outer_exchange"], exchange);
  }
  EXPECT_EQ(out["owner"]["global_weights_hash"], out["all_to_all"]["global_weights_hash"]);
  EXPECT_EQ(out["owner"]["params_hash"], out["all_to_all"]["params_hash"]);
  const auto a2a = bytes_by_site(out["all_to_all"]), owner = bytes_by_site(out["owner"]);
  for (const auto& [site, bytes] : a2a) {
    const double ratio = owner.at(site) / bytes;
    EXPECT_GT(ratio, 0.60) << site;
    EXPECT_LT(ratio, 0.72) << site;
  }
}

// A lossy codec with error feedback on both phases (int4: the owners' averages quantized once
// more, their error fed back by the owner): sites of 1, 2 and 3 ranks under three strategies,
// fragments overlapped, end on one hash, and the loss stays by all-to-all's.
TEST(OwnerExchange, ALossyCodecKeepsSitesOfEveryShapeOnOneHash) {
  std::map<std::string, nlohmann::json> out;
  for (const std::string exchange : {"all_to_all", "owner"}) {
    TempDir d;
    psk(d);
    auto cfg = trainer::load_run_config(d.file(
        "c.yaml", base(d.path() / "out", 16) +
                      "outer: {interval: 4, fragments: 2, overlap_steps: 1, exchange: " + exchange +
                      ", min_sites: 3, compression: {codec: int4, block: 64, error_feedback: true, "
                      "zstd_level: 1}}\n" +
                      sites({{3, "strategy: fsdp"}, {1, "strategy: ddp"}, {2, "strategy: zero2"}}) + kTransport));
    out[exchange] = geoloco::testing::run_ranks(cfg)[0];
    expect_one_hash(out[exchange], 6, exchange);
    EXPECT_EQ(out[exchange]["outer_steps"].get<int>(), 9) << exchange;
  }
  EXPECT_NE(out["owner"]["global_weights_hash"], out["all_to_all"]["global_weights_hash"])
      << "the averages are quantized once more: some bit should differ";
  const double a = out["all_to_all"]["val_loss"].get<double>(), o = out["owner"]["val_loss"].get<double>();
  EXPECT_NEAR(o, a, 0.02 * a);
  // The owner residual (and the round's) hold this site's slices only: about 4/S bytes per
  // element of the shard each, beside the 4 of the rank's own residual.
  for (const auto& r : out["owner"]["ranks"]) {
    const double ef = r["outer_memory"]["error_feedback_bytes"].get<double>(),
                 n = r["outer_memory"]["shard_elements"].get<double>();
    EXPECT_GT(ef, 4.0 * n * 1.5) << "the owner residual is not counted";
    EXPECT_LT(ef, 4.0 * n * (1 + 2.0 / 3) * 1.01) << "the owner residual is larger than the slices owned";
  }
}

// The owner exchange needs every site in every round: a config whose quorum is below that is
// refused, naming the key and the value to set; two sites (majority 2) need nothing more.
TEST(OwnerExchange, TheConfigRefusesAQuorumBelowEverySite) {
  TempDir d;
  psk(d);
  for (const std::string quorum : {"", ", min_sites: 2"}) {
    try {
      trainer::load_run_config(d.file("c.yaml", base(d.path() / "out", 4) + "outer: {interval: 2, exchange: owner" +
                                                    quorum + "}\n" + sites({{1, ""}, {1, ""}, {1, ""}}) + kTransport));
      ADD_FAILURE() << "accepted with quorum '" << quorum << "'";
    } catch (const std::exception& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("exchange"), std::string::npos) << m;
      EXPECT_NE(m.find("set outer.min_sites: 3 (now 2)"), std::string::npos) << m;
    }
  }
  EXPECT_NO_THROW(
      trainer::load_run_config(d.file("c.yaml", base(d.path() / "out", 4) + "outer: {interval: 2, exchange: owner}\n" +
                                                    sites({{1, ""}, {1, ""}}) + kTransport)));
  EXPECT_THROW(
      trainer::load_run_config(d.file("c.yaml", base(d.path() / "out", 4) + "outer: {interval: 2, exchange: ring}\n" +
                                                    sites({{1, ""}, {1, ""}}) + kTransport)),
      Error);
}
