// parallel_for: the codec's work split over a few threads (compression.threads). Tasks are
// independent pieces of one frame (element chunks, zstd chunks) whose outputs land in
// disjoint places, so the frame's bytes do not depend on how many threads ran them.
#pragma once

#include <cstddef>
#include <functional>

namespace geoloco::compression {

// Runs body(i, worker) for every i in [0, n) on up to `threads` threads, the caller's
// included (worker in [0, threads): an index for per-thread scratch). Task i runs on worker
// i % threads. Waits for all; rethrows the exception of the lowest failing task.
void parallel_for(size_t n, int threads, const std::function<void(size_t, int)>& body);

}  // namespace geoloco::compression
