// geoloco::probe::probe_peer: measures the path to one peer over an already-connected
// transport::Transport -- round trip (ping-pong of small frames), the throughput of one
// connection (every chunk on lane 0) and of all the transport's lanes together, and the
// sender's TCP retransmissions. Both ends call it with the same session number: the
// initiator drives (and sends the streams), the responder echoes pings, measures what
// arrives and reports it back; at the end the initiator sends the whole result so both
// return the same numbers. The protocol is in probe_wire.hpp; the method in docs/planning.md.
//
//   probe::ProbeOptions o;           // defaults: 50 pings, 5 s per stream, 4 MiB messages
//   auto r = probe::probe_peer(transport, peer, probe::Role::kInitiator, o);
//   // peer side: probe::probe_peer(transport, peer_index, probe::Role::kResponder, o)
//
// Errors: geoloco::InputError for bad options; ProbeError (geoloco::Error, exit 1) when the
// peer breaks the protocol, a stream is too short to measure, or the transport fails (the
// message names the peer and the phase). Buffers stay alive until the transport has let go
// of them, also on error (waits are bounded by the transport's transfer timeout).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>

#include "transport/probe/probe_result.hpp"
#include "core/error.hpp"
#include "transport/transport.hpp"

namespace geoloco::probe {

class ProbeError : public geoloco::Error {
 public:
  using geoloco::Error::Error;
};

enum class Role { kInitiator, kResponder };

struct ProbeOptions {
  uint32_t session = 0;  // distinct for every probe_peer call on one Transport (< 2^24)
  // Round trip: `ping_count` counted ping-pongs after `ping_warmup` uncounted ones.
  uint32_t ping_count = 50;
  uint32_t ping_warmup = 5;
  uint32_t ping_bytes = 64;  // whole message, >= 24 (the probe header)
  // Streams: each runs for omit + seconds, or until `bytes` were sent, whichever is first
  // (0 disables that limit; at least one must be set).
  double seconds = 5;
  uint64_t bytes = 0;
  // Start of each stream left out of its figure (TCP slow start). Default: 0.2 s + 10 x the
  // median RTT just measured.
  std::optional<double> omit_s;
  // Data messages: message_bytes each, `window` of them in flight (the receiver posts as
  // many); a time-limited stream also runs until 3 x window of them completed after the omit
  // (at most omit + 4 x seconds). window x message_bytes must exceed the
  // path's bandwidth-delay product, or the probe's own pipeline limits the figure (flagged).
  uint64_t message_bytes = 1ull << 20;
  uint32_t window = 16;
  bool single = true;  // stream on lane 0 only: one connection
  bool multi = true;   // stream over every lane (skipped when lanes == 1)
  // Called with a one-line note after each phase (for human output); may be empty.
  std::function<void(const std::string&)> progress;

  void validate() const;  // InputError naming the option
};

ProbeResult probe_peer(transport::Transport& t, int peer, Role role, const ProbeOptions& opt);

// The default omit for a measured median RTT.
double default_omit_s(double rtt_median_ms);

// The receiver's throughput estimate from the completion times `t` (seconds, ascending) and
// sizes of the full data messages of a stream that kept `window` messages in flight. Over
// TCP, UCX completes a connection's concurrent rendezvous transfers together, in bursts of
// a whole window, so a count between two single completions is off by up to a window. The
// estimate compares centroids instead: the mean (time, bytes completed) of the first
// `window` completions at or after `omit_s` against that of the last `window` before the
// final window drains (no successors in flight; the last burst may be partial). Rate = bytes
// between the centroids / time between them: exact for evenly spaced completions and for
// bursts of a whole window at any phase. Gives up the omit when fewer than 3 x window
// messages follow it; with fewer than 3 x window in all, counts first to last completion and
// sets `coarse` (off by up to a window's bytes).
StreamReport estimate_stream(std::span<const double> t, std::span<const uint64_t> sizes, uint32_t window,
                             double omit_s);

}  // namespace geoloco::probe
