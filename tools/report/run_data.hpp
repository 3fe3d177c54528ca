// geoloco::report run data: everything `geoloco report` reads from one run directory --
// summary.json, config.yaml, sites/<site>/metrics.jsonl, sites/<site>/rounds.r<rank>.jsonl,
// plan.json, trace.json, the checkpoint folders -- tolerant of a run that is still going or
// that failed (it keeps what exists and says what is missing), strict about a directory that
// is not a run at all (InputError).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace geoloco::report {

// One site's metrics.jsonl lines, one per logged step (the latest when a resume logged a
// step twice), in step order.
struct SiteMetrics {
  std::string site;
  std::vector<nlohmann::json> lines;
};

// One rank's line of rounds.r<rank>.jsonl (the outer loop's per-round record).
struct RoundRecord {
  std::string site;
  int rank = 0;
  nlohmann::json j;
  int64_t round() const { return j.value("round", int64_t{0}); }
};

// A span of trace.json, seconds from the trace's first span.
struct Span {
  int pid = 0, tid = 0;
  std::string name;
  double t0 = 0, dur = 0;
};

struct Event {
  int64_t step = 0;
  std::string site;  // empty: the whole run
  std::string what;
};

struct RunData {
  std::string dir;
  std::string name;  // run.name from the summary or config, else the directory's name
  bool complete = false;
  std::string status;       // one line: "finished", "stopped at step 120 (--stop-at-step)", "incomplete: ..."
  nlohmann::json summary;   // null when absent
  std::string config_text;  // config.yaml as written at start; empty when absent
  std::vector<SiteMetrics> sites;
  std::vector<RoundRecord> rounds;  // every rank, by (site, rank, round)
  nlohmann::json plans;             // plan.json's "plans" array, or null
  std::vector<Span> spans;
  std::map<int, std::string> process_names;  // trace pid -> "paris rank 0"
  std::vector<Event> events;
  std::vector<std::string> notes;  // what was missing, skipped or repaired, for the report
};

// Reads `dir`. InputError when it does not exist or holds no metrics.jsonl (a run writes one
// at its first logged step).
RunData load_run(const std::string& dir);

// The lines of a JSON-lines file that parse as objects, with a note per skipped line (an
// incomplete last line -- a run still writing -- is expected and noted as such).
std::vector<nlohmann::json> read_json_lines(const std::string& path, std::vector<std::string>& notes);

}  // namespace geoloco::report
