// NCCL backend (CUDA device buffers). Compiled only when GEOLOCO_HAVE_CUDA; in other builds
// make_nccl throws CollectiveError saying so. Runs where a GPU is.
//
// Setup: the site's Rendezvous (TcpStore) passes the ncclUniqueId from rank 0 to the others;
// the communicator is created non-blocking and polled against the rendezvous timeout, so a
// peer that never joins is an error, not a hang. Each collective is enqueued on the
// communicator's own stream and waited for with the same deadline (ncclCommGetAsyncError
// polled meanwhile); on failure or timeout the communicator is aborted and the object is
// broken.
//
// Every element span is device memory (cudaMalloc'd, on this rank's device). Uneven n: NCCL's
// ReduceScatter/AllGather need equal shards, so for n % size != 0 the backend issues one
// grouped ncclReduce / ncclBroadcast per shard of shard_of(). all_gather_bytes takes host memory.
//
// stats(): NCCL picks its own algorithms, so bytes_sent is the ring-equivalent count (the same
// formulas as the Gloo backend; broadcast: n per rank except the ring's last), not a
// measurement.
#pragma once

#include <memory>

#include "trainer/parallel/collective.hpp"
#include "trainer/parallel/rendezvous.hpp"

namespace geoloco::parallel {

// Uses opts.cuda_device (or rank % device count when -1). Throws CollectiveError when no GPU
// is usable or NCCL fails, RendezvousTimeout/RendezvousError from the rendezvous.
std::unique_ptr<Collective> make_nccl(const RendezvousOptions& opts);

}  // namespace geoloco::parallel
