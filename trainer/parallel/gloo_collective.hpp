// Gloo backend (CPU): rendezvous over TcpStore, gloo's TCP transport for the bytes, and
// our own ring algorithms on top of gloo's unbound buffers -- so the sharding is exactly
// shard_of(), the byte counts in stats() are exact, and results are bit-identical on every
// rank (each element is summed once, in ring order, by the rank that owns its shard, then
// copied to the others).
//
// Algorithms (P ranks, n elements, c_i = shard_of(n, i, P).count):
//   all_reduce_sum      ring reduce-scatter + ring all-gather; sends (2n - c_r - c_{r+1}) elements
//   reduce_scatter_sum  ring; sends n - c_r elements
//   all_gather          ring; sends n - c_{r+1} elements
//   broadcast           root sends n elements to each other rank ((P-1) n on root, 0 elsewhere)
//   barrier             dissemination, ceil(log2 P) rounds of 1 byte
//   all_gather_bytes    ring all-gather of the lengths (8 bytes each), then of the blobs
// Element sums for chunk i run ((x_{i+1} + x_{i+2}) + ...) + x_i over ranks mod P.
//
// The destructor runs a barrier (unless the group is already broken or an exception is in
// flight) so no rank closes its sockets while a peer still reads: without it the last rank
// sees "Connection closed by peer".
#pragma once

#include <memory>

#include "trainer/parallel/collective.hpp"
#include "trainer/parallel/rendezvous.hpp"

namespace geoloco::parallel {

// Runs the rendezvous (may throw RendezvousTimeout / RendezvousError) and connects the full
// mesh. Throws CollectiveError when gloo cannot set up its device or pairs.
// Side effect: sets SIGPIPE to SIG_IGN if it was SIG_DFL (gloo writes to sockets without
// MSG_NOSIGNAL; a dead peer must be an error, not a silent process death).
std::unique_ptr<Collective> make_gloo(const RendezvousOptions& opts);

}  // namespace geoloco::parallel
