// State transfer for a join (docs/elastic.md, "Rejoin and join"): the donor side (JoinDonor,
// one per joining rank, on its own thread) and the joiner side (fetch_join_state), over the
// messages of join_wire.hpp. Rank r of the joiner fetches its shard's state from its partner at
// every donor site (rank r when the sites have one rank count; exchange_layout.hpp), which
// serves the state of exactly that shard, at once, in checksummed chunks: each chunk is checked against the
// manifest's hash, a donor that dies or sends a bad chunk is replaced by another for the
// chunks still missing, and the assembled state must hash to the manifest's state hash.
// Donors whose manifests disagree with the others' are not used.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "outer_optimizer/join_wire.hpp"
#include "outer_optimizer/outer_hooks.hpp"
#include "outer_optimizer/site_peers.hpp"

namespace geoloco::outer {

// What a donor serves: a committed state and its manifest (shared by its donor threads).
struct JoinSnapshot {
  std::vector<uint8_t> state;
  JoinManifest manifest;
};

class JoinDonor {
 public:
  // Serves rank `joiner_rank` of site `joiner` (-1: this rank's partner there) from `snap`:
  // sends the manifest, then the chunks the joiner asks for, until it says done, its connection
  // fails, or it asks for nothing for `idle_s`. Never throws: a failure is logged and ends the
  // service.
  JoinDonor(const SitePeers& peers, int joiner, std::shared_ptr<const JoinSnapshot> snap, double idle_s,
            const OuterHooks& hooks, int joiner_rank = -1);
  ~JoinDonor();  // stops the service and joins its thread
  JoinDonor(const JoinDonor&) = delete;
  JoinDonor& operator=(const JoinDonor&) = delete;

  int joiner() const { return joiner_; }
  bool finished() const { return finished_.load(); }
  uint64_t bytes_served() const { return bytes_.load(); }

 private:
  void run();

  const SitePeers& peers_;
  const int joiner_, joiner_rank_;
  const std::shared_ptr<const JoinSnapshot> snap_;
  const double idle_s_;
  const OuterHooks& hooks_;
  std::atomic<bool> stop_{false}, finished_{false};
  std::atomic<uint64_t> bytes_{0};
  std::thread thread_;
};

struct JoinResult {
  JoinManifest manifest;
  std::vector<uint8_t> state;
  SiteMask donors = 0;             // sites whose manifests agreed (the state came from them)
  uint64_t bytes = 0;              // chunk bytes received, refetches included
  uint32_t refetched = 0;          // chunks fetched again (a donor lost, a bad checksum)
  double seconds = 0;              // from the request to the verified state
  std::vector<std::string> notes;  // donors left out or replaced, and why
};

// Asks every other site to take this rank's site in, waits up to `wait_s` for their manifests
// (after the first, up to 1 s more for the others), and fetches the state from the donors
// that agree. Throws JoinError naming what failed: nobody answered within `wait_s`, every
// donor was lost, a chunk kept failing its checksum. `abort`, when set, ends the wait.
JoinResult fetch_join_state(const SitePeers& peers, double wait_s, const std::atomic<bool>* abort = nullptr);

}  // namespace geoloco::outer
