// One fragment's round of the outer loop (steps 1-4 of diloco.hpp), and the worker thread it
// runs on when the sync overlaps compute. Touches no collective: the site's all-gather and the
// merge stay on the inner loop's thread (diloco.cpp), so every rank calls them at the same step.
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "compression/error_feedback.hpp"
#include "compression/pipeline.hpp"
#include "outer_optimizer/fragments.hpp"
#include "outer_optimizer/hash_check.hpp"
#include "outer_optimizer/outer_hooks.hpp"
#include "outer_optimizer/outer_optimizer.hpp"
#include "outer_optimizer/site_peers.hpp"
#include "trainer/loop/outer_hook.hpp"

namespace geoloco::outer {

struct ExchangeResult {
  uint64_t envelope_bytes = 0, frame_bytes = 0, elements = 0;
  double ratio = 0;
  uint64_t hash = 0;  // of the fragment's new global weights
  // This rank's own contribution as every site decoded it against the pseudo-gradient it
  // encoded: sum of squared errors and of squared values (relative error = sqrt(err2/ref2)).
  double err2 = 0, ref2 = 0;
};

// One fragment's part of this rank's shard and its outer-loop state.
struct Fragment {
  int index = 0;
  std::vector<Range> local;   // ranges within this rank's shard
  size_t n = 0;               // elements on this rank (may be 0)
  std::vector<float> global;  // the fragment's global weights, gathered in range order
  std::vector<float> delta, decoded, avg, snapshot;
  std::unique_ptr<compression::Pipeline> pipeline;
  std::unique_ptr<compression::ErrorFeedback> ef;
  std::unique_ptr<OuterOptimizer> opt;
  int64_t last_sync_step = 0;  // launch step of its latest round
  int64_t blocking_step = -1;  // step of its latest blocking sync
  uint64_t hash = 0;           // hash of `global`
  // The cross-site check of this fragment's latest round, posted and not yet verified
  // (verified before the fragment's next round, a checkpoint, a re-plan and the run's end).
  std::optional<HashCheck> check;
  // Overlap: the worker owns global/delta/decoded/avg/snapshot/pipeline/ef/opt while
  // in_flight; the inner loop touches them only after join().
  std::thread worker;
  bool in_flight = false, pending_merge = false, joined = false;
  int64_t merge_step = 0, launch_step = 0;
  uint64_t round = 0;
  ExchangeResult result;
  std::exception_ptr error;
  std::chrono::steady_clock::time_point t0, t1;
  double joined_seconds = 0;
};

// What every round of every fragment of this rank needs.
struct ExchangeContext {
  const trainer::RunConfig& cfg;
  const SitePeers& peers;
  const OuterHooks& hooks;
  trainer::TraceRecorder* trace = nullptr;
};

// Steps 1-4 of one round on `local` (the fragment's values, gathered): pseudo-gradient,
// compress, exchange with every other site, decode every contribution (own included) and
// average in site order, outer step on f.global; then post the hash check of the new global
// weights (verified at the fragment's next round). A failure names the round and step.
ExchangeResult exchange(Fragment& f, const ExchangeContext& ctx, int64_t step, uint64_t round, uint64_t tokens,
                        std::span<const float> local, int tid);

// Overlap: runs exchange() on the fragment's worker thread from f.snapshot; join_worker()
// rethrows its error on the inner loop's thread.
void launch_worker(Fragment& f, const ExchangeContext& ctx, int64_t step, uint64_t round, uint64_t tokens, int tid);
void join_worker(Fragment& f);

}  // namespace geoloco::outer
