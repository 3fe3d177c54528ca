// The outer loop's failure paths on the in-memory fabric: a peer that dies, stalls or sends
// garbage in the middle of a round, each landing at a chosen frame. The survivors stop with
// one error naming the outer step, the inner step and the peer; every rank's thread ends (no
// hang); each test takes well under a second.
#include <gtest/gtest.h>

#include <chrono>

#include "tests/trainer/loop/test_util.hpp"
#include "tests/outer_optimizer/memory_sites.hpp"
#include "trainer/loop/run_config.hpp"

using namespace geoloco;
using geoloco::test::TempDir;
using transport::memory::Fault;
using transport::memory::FaultAction;
using Clock = std::chrono::steady_clock;

namespace {

// Two sites of one rank, a sync every 2 steps; sites on ports nobody uses (the fabric needs none).
trainer::RunConfig two_sites(const TempDir& d, const std::string& extra_outer = "") {
  d.file("k.psk", "0123456789abcdef-test-key");
  return trainer::load_run_config(d.file(
      "c.yaml", "run: {name: f, seed: 3, output_dir: " + (d.path() / "out").string() +
                    "}\n"
                    "model: {n_layer: 2, n_head: 2, n_embd: 32, block_size: 16, vocab_size: 32}\n"
                    "data:\n  train: {kind: synthetic, vocab: 32, branching: 3, seed: 5, tokens: 100000}\n"
                    "train: {steps: 12, micro_batch: 2, log_every: 100, eval_every: 0, checkpoint_every: 0}\n"
                    "outer: {interval: 2, compression: {codec: fp32}, quorum_wait_s: 0.5, consensus_retry_s: 0.05" +
                    extra_outer +
                    "}\n"
                    "sites:\n  - {name: paris, port: 61000}\n  - {name: lyon, port: 62000}\n"
                    "transport: {psk_file: k.psk, connect_timeout_s: 5, transfer_timeout_s: 0.25}\n"));
}

Fault from_lyon(FaultAction a, uint64_t nth) {
  Fault f;
  f.action = a;
  f.from_site = "lyon";
  f.kind = transport::FrameKind::kPseudoGradient;
  f.nth = nth;
  return f;
}

// Runs both sites on a fresh fabric with `fault`; returns paris's error ("" if none) and
// checks the run ended (every rank's thread) within `limit_s`.
std::string run_with(const Fault& fault, const std::string& extra_outer = "", double limit_s = 1.0) {
  TempDir d;
  const auto cfg = two_sites(d, extra_outer);
  geoloco::testing::MemorySites m;
  m.fabric.add_fault(fault);
  const auto t0 = Clock::now();
  std::string err;
  try {
    geoloco::testing::run_ranks(cfg, 0, false, m.setup(cfg));
  } catch (const std::exception& e) {
    err = e.what();
  }
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_LT(took, limit_s) << err;
  return err;
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

// The fault-free run on the fabric: both sites end with one global hash (the baseline the
// faults below depart from).
TEST(OuterFaults, CleanRunOnTheFabricAgrees) {
  TempDir d;
  auto cfg = two_sites(d);
  geoloco::testing::MemorySites m;
  auto out = geoloco::testing::run_ranks(cfg, 0, false, m.setup(cfg));
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0]["outer_steps"].get<int>(), 6);
  EXPECT_EQ(out[0]["global_weights_hash"], out[1]["global_weights_hash"]);
}

// lyon dies just before its 3rd pseudo-gradient frame (round 3, at inner step 6): two sites
// need both for a quorum (min_sites defaults to a majority), so paris waits quorum_wait_s
// (0.5 s here) for a membership and stops naming the round, the step, the site it waited for
// and why it lost it; lyon's own rank stops too.
TEST(OuterFaults, PeerKilledMidRoundStopsTheOthersNamingIt) {
  const std::string e = run_with(from_lyon(FaultAction::kKill, 3));
  EXPECT_TRUE(has(e, "outer step 3 (inner step 6): outer round 3: no membership agreed within 0.5 s")) << e;
  EXPECT_TRUE(has(e, "(min_sites 2) (site paris waited for lyon)")) << e;
  EXPECT_TRUE(has(e, "lyon: connection to peer lyon/0")) << e;
  EXPECT_TRUE(has(e, "lost")) << e;
}

// lyon is alive but stuck from its 2nd frame on (for 0.5 s, then it resumes): paris's receive
// gives up after transfer_timeout_s (0.25 s), and without lyon there is no quorum: paris stops
// naming the round and lyon; lyon, resumed, finds paris gone and stops too.
TEST(OuterFaults, StalledPeerTimesOutNamingIt) {
  auto f = from_lyon(FaultAction::kStall, 2);
  f.delay_s = 0.5;
  const std::string e = run_with(f, "", 1.5);
  EXPECT_TRUE(has(e, "outer step 2 (inner step 4)")) << e;
  EXPECT_TRUE(has(e, "from peer lyon/0")) << e;
  EXPECT_TRUE(has(e, "timed out")) << e;
}

// lyon's 2nd pseudo-gradient arrives well framed but full of garbage (a valid transport
// checksum): the outer loop refuses it naming the round and lyon (and, lyon's contribution
// being out, the round has no quorum of two).
TEST(OuterFaults, GarbageFromAPeerIsRefusedNamingIt) {
  const std::string e = run_with(from_lyon(FaultAction::kGarbage, 2));
  EXPECT_TRUE(has(e, "outer step 2 (inner step 4)")) << e;
  EXPECT_TRUE(has(e, "outer round 2: message from lyon/0")) << e;
  EXPECT_TRUE(has(e, "rejected")) << e;
}

// A bit flipped in flight is the transport's to catch (checksum), naming the peer.
TEST(OuterFaults, CorruptedFrameIsCaughtByTheChecksum) {
  const std::string e = run_with(from_lyon(FaultAction::kCorrupt, 2));
  EXPECT_TRUE(has(e, "outer step 2 (inner step 4): outer round 2: no membership agreed")) << e;
  EXPECT_TRUE(has(e, "lyon: frame from peer lyon/0")) << e;
  EXPECT_TRUE(has(e, "checksum: mismatch")) << e;
}

// With overlap the round runs on the fragment's worker: a kill mid-round surfaces at the
// join, with the same naming, and the worker thread is not left behind.
TEST(OuterFaults, PeerKilledDuringAnOverlappedRound) {
  const std::string e = run_with(from_lyon(FaultAction::kKill, 3), ", overlap_steps: 1");
  EXPECT_TRUE(has(e, "outer step 3 (inner step 6): outer round 3: no membership agreed")) << e;
  EXPECT_TRUE(has(e, "lyon: connection to peer lyon/0")) << e;
}

// A checkpoint whose outer-loop counters were damaged (same length, checksums intact) is a
// FileError on resume naming the file and the key (exit 2 through the CLI), not "stoll".
TEST(OuterFaults, DamagedOuterStateOnResumeNamesTheKey) {
  TempDir d;
  auto cfg = two_sites(d);
  cfg.train.checkpoint_every = 6;
  {
    geoloco::testing::MemorySites m;
    geoloco::testing::run_ranks(cfg, /*stop_at=*/6, false, m.setup(cfg));
  }
  const auto state = d.path() / "out" / "checkpoints" / "paris" / "step_00000006" / "state.r0.safetensors";
  ASSERT_TRUE(std::filesystem::exists(state)) << state;
  std::string damaged;
  geoloco::testing::damage_metadata(state, "outer.round", [&](size_t n) { return damaged = std::string(n, '?'); });
  geoloco::testing::MemorySites m;
  try {
    geoloco::testing::run_ranks(cfg, 0, /*resume=*/true, m.setup(cfg));
    FAIL() << "resumed from a damaged checkpoint";
  } catch (const FileError& e) {
    EXPECT_EQ(std::string(e.what()),
              state.string() + ": __metadata__ 'outer.round': got '" + damaged + "', expected an integer >= 0");
  }
}
