// OuterHooks: what a test or a benchmark injects into the outer loop (app::RankOptions carries
// them to every rank it runs). Product code never sets the test hooks; nothing here is read
// from the environment.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace geoloco::outer {

struct OuterHooks {
  // Test: the sync times measured after inner step `after_step` are multiplied by `factor`
  // (a link that got slower), so the re-plan protocol runs deterministically.
  struct Drift {
    int64_t after_step = 0;
    double factor = 1;
  };
  std::optional<Drift> drift;
  // Test: after round `round`'s outer step at site index `site`, one global weight is nudged
  // by one ulp (the sites diverge), so the cross-site hash check must stop the run.
  struct Perturb {
    int site = 0;
    uint64_t round = 0;
  };
  std::optional<Perturb> perturb_global;
  // Test: site index `site` is left out of round `from_round` and every later one, as if it
  // had died just before it (the reference a run with a real loss is compared with). That
  // site stops at that round (SiteLeftOut); the others never exchange with it again.
  struct LeaveOut {
    int site = 0;
    uint64_t from_round = 0;
  };
  std::optional<LeaveOut> leave_out;
  // Test: no round is decided on the consensus's fast path (ConsensusConfig::expected): every
  // round runs a ballot, which below a majority first waits degrade_s for one, so a cut that
  // heals finds both sides inside the same round's consensus (the heal race of docs/elastic.md).
  bool no_fast_path = false;
  // Test: a site leader reports each round's membership consensus that it decided, so a test
  // can prove where a fault landed (a cut that heals inside a ballot, not before or after it)
  // instead of counting on timing. Called on the thread that ran the consensus (with overlap,
  // not the inner loop's): it must be thread-safe.
  struct Consensus {
    int site = 0;
    uint64_t round = 0;
    std::chrono::steady_clock::time_point began;                        // the leader's consensus call
    std::optional<std::chrono::steady_clock::time_point> first_ballot;  // none: it started no ballot
    std::chrono::steady_clock::time_point decided;
    int ballots = 0;  // ballots this site started
  };
  std::function<void(const Consensus&)> on_consensus;
  // Test: a donor at site index `site` flips one bit of join chunk `chunk` after hashing it,
  // the first `times` times it sends it (memory gone bad between the snapshot and the wire),
  // so the joiner must detect it and fetch the chunk again.
  struct CorruptJoinChunk {
    int site = 0;
    uint32_t chunk = 0;
    int times = 1;
  };
  std::optional<CorruptJoinChunk> corrupt_join_chunk;
  // Test: site index `site` (every site: -1) sleeps `seconds` after each of its outer steps
  // (a slow site; a lone survivor slow enough that a restarted site still finds it training).
  struct Pace {
    int site = 0;
    double seconds = 0;
  };
  std::optional<Pace> pace;
  // Benchmarks: every round's pseudo-gradient of this rank's shard is written to
  // <dir>/pseudograd.<site>.r<rank>.round<N>.safetensors (tensor "delta"); `geoloco launch
  // --capture-pseudograd DIR` sets it (bench/compression/capture.sh).
  std::string capture_dir;
};

}  // namespace geoloco::outer
