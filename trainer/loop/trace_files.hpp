// A run's timeline on disk: every rank writes its spans (core/trace.hpp) to
// sites/<site>/trace.r<rank>.json ({"geoloco_trace": 1, "end_step", "global_rank",
// "config_hash", "events"}), and the first site still in the run's rank 0 merges every rank's
// file that ended at the same step into <output_dir>/trace.json: one Chrome trace-event array
// with process and thread names (Perfetto, chrome://tracing). The files share one directory
// tree when all ranks run on one machine; elsewhere the wait is bounded and the merge keeps the
// ranks it found and says which are missing.
#pragma once

#include <cstdint>

#include "core/trace.hpp"
#include "trainer/loop/run_config.hpp"

namespace geoloco::trainer {

// `members`: the sites still in the run (bit s: config site s); only theirs are merged.
void write_trace_files(const RunConfig& cfg, int site, int rank, int64_t end_step, const TraceRecorder& trace,
                       uint64_t members);

}  // namespace geoloco::trainer
