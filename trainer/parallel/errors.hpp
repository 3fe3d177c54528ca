// geoloco::parallel errors. All derive from geoloco::Error (CLI exit 1): a rank that never
// shows up or a peer that dies mid-collective is a run-time failure, not bad input.
//
// Recoverable I/O errors are exceptions: after one, the caller must assume the group is
// broken (peers may be half way through a collective) and tear it down.
#pragma once

#include <string>
#include <vector>

#include "core/error.hpp"

namespace geoloco::parallel {

// The rendezvous could not complete: the store is unreachable, a message was malformed, or
// a rank answered something inconsistent.
class RendezvousError : public Error {
 public:
  using Error::Error;
};

// Some ranks never showed up before the deadline. `missing()` lists them (ascending);
// the message names the site, the ranks, the timeout and the store address.
class RendezvousTimeout : public RendezvousError {
 public:
  RendezvousTimeout(const std::string& message, std::string site, std::vector<int> missing)
      : RendezvousError(message), site_(std::move(site)), missing_(std::move(missing)) {}
  const std::string& site() const { return site_; }
  const std::vector<int>& missing() const { return missing_; }

 private:
  std::string site_;
  std::vector<int> missing_;
};

// The TCP key-value store failed: connection lost, timeout on a key, malformed reply.
class StoreError : public Error {
 public:
  using Error::Error;
};

// A collective failed (peer died, timed out, backend error). The message names the site,
// rank, operation and element count, then the backend's own text.
class CollectiveError : public Error {
 public:
  using Error::Error;
};

}  // namespace geoloco::parallel
