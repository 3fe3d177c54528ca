// OuterHook: how the inner loop hands control to the outer (cross-site) loop without
// depending on it. The DiLoCo outer loop (outer_optimizer/) implements it.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "trainer/checkpoint/safetensors.hpp"
#include "trainer/core/error.hpp"
#include "trainer/loop/site_strategy.hpp"

namespace geoloco::trainer {

// TraceRecorder: complete-event spans ("ph":"X") of one rank for the Chrome trace-event
// format (Perfetto, chrome://tracing). Thread-safe: the inner loop, the outer loop's
// worker and transport callbacks record into the same rank's buffer. Timestamps are
// steady_clock microseconds, so ranks on one machine share a time base (ranks on other
// machines do not: their spans are only comparable within themselves). A cap bounds the
// memory of long runs; spans past it are counted, not kept.
class TraceRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  // Thread ids of the spans: the inner loop, the outer loop's worker, the transport.
  // Outer-loop fragment f > 0 (outer.fragments) records on kFragmentThreadBase + f.
  static constexpr int kMainThread = 0, kOuterThread = 1, kTransportThread = 2, kFragmentThreadBase = 10;
  static constexpr size_t kDefaultCap = 500000;

  explicit TraceRecorder(size_t cap = kDefaultCap) : cap_(cap) {}

  void span(const char* name, int tid, Clock::time_point t0, Clock::time_point t1) {
    const auto us = [](Clock::time_point t) {
      return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
    };
    std::lock_guard lk(mu_);
    if (events_.size() >= cap_) {
      ++dropped_;
      return;
    }
    events_.push_back({name, tid, us(t0), us(t1) - us(t0)});
  }

  // The events as trace-event objects with pid `pid` (the global rank).
  nlohmann::json to_json(int pid) const {
    std::lock_guard lk(mu_);
    nlohmann::json a = nlohmann::json::array();
    for (const auto& e : events_)
      a.push_back({{"name", e.name}, {"ph", "X"}, {"ts", e.ts}, {"dur", e.dur}, {"pid", pid}, {"tid", e.tid}});
    return a;
  }
  size_t size() const {
    std::lock_guard lk(mu_);
    return events_.size();
  }
  uint64_t dropped() const {
    std::lock_guard lk(mu_);
    return dropped_;
  }

 private:
  struct Event {
    const char* name;  // string literals only: spans are recorded on hot paths
    int tid;
    int64_t ts, dur;
  };
  mutable std::mutex mu_;
  std::vector<Event> events_;
  size_t cap_;
  uint64_t dropped_ = 0;
};

// Records [construction, destruction) as one span; null recorder = no-op.
class TraceSpan {
 public:
  TraceSpan(TraceRecorder* rec, const char* name, int tid)
      : rec_(rec), name_(name), tid_(tid), t0_(TraceRecorder::Clock::now()) {}
  ~TraceSpan() {
    if (rec_) rec_->span(name_, tid_, t0_, TraceRecorder::Clock::now());
  }
  TraceSpan(const TraceSpan&) = delete;
  TraceSpan& operator=(const TraceSpan&) = delete;

 private:
  TraceRecorder* rec_;
  const char* name_;
  int tid_;
  TraceRecorder::Clock::time_point t0_;
};

class OuterHook {
 public:
  virtual ~OuterHook() = default;
  // Called after inner step `step` (1-based) on every rank of every site. May overwrite
  // strategy.shard_params() and must then call strategy.shard_updated(). Returns true when
  // an outer step completed at this inner step (the trainer then logs/evaluates).
  virtual bool after_inner_step(int64_t step, SiteStrategy& strategy) = 0;
  // Called before inner step `step` (1-based), once per step in order, on every rank of the
  // site: false when the site skips it (outer.pace: time, a slower site training fewer steps
  // per period). A skipped step trains nothing and takes no time; after_inner_step still runs.
  virtual bool trains_step(int64_t /*step*/) { return true; }
  // Called once after the last inner step (flushes in-flight syncs).
  virtual void finish(int64_t step, SiteStrategy& strategy) = 0;
  // Fields merged into each metrics line and into summary.json.
  virtual nlohmann::json metrics() = 0;
  virtual nlohmann::json summary() = 0;
  // One object per outer round finished since the last call (the trainer writes them to
  // sites/<site>/rounds.r<rank>.jsonl; docs/report.md lists the fields).
  virtual std::vector<nlohmann::json> take_rounds() { return {}; }
  // Checkpoint: this rank's outer state as extra tensors/metadata (owned buffers).
  struct State {
    std::map<std::string, std::vector<float>> tensors;
    // f32 tensors as parts of the hook's own buffers, in order (no copy at real size); valid
    // until the next call into the hook. A name is in `tensors` or here, not both.
    std::map<std::string, std::vector<std::span<const float>>> views;
    std::map<std::string, std::vector<uint8_t>> bytes;
    std::map<std::string, std::string> metadata;
  };
  virtual State save_state() = 0;
  virtual void restore_state(const SafetensorsFile& file) = 0;
  // After a failure of after_inner_step/finish: whether the trainer should write a checkpoint
  // at this step before the error ends the rank (the hook's save_state then holds what
  // `resumed` needs to carry on, e.g. an outer round to exchange again). Default: no.
  virtual bool checkpoint_after_failure() const { return false; }
  // --resume, before anything is restored, on every rank: `steps` are the checkpoint steps
  // this rank's site holds on every rank (ascending, up to its `latest`); returns the step every
  // rank of every site restores (-1: none, start fresh), the same everywhere. Default: the
  // newest of `steps`.
  virtual int64_t agree_resume_step(const std::vector<int64_t>& steps, SiteStrategy& /*strategy*/) {
    return steps.empty() ? -1 : steps.back();
  }
  // Called on every rank right after a checkpoint was restored (--resume), before the next
  // inner step; `step` is the checkpoint's. Default: nothing to do.
  virtual void resumed(int64_t /*step*/, SiteStrategy& /*strategy*/) {}
  // Join: this rank's site joins a running job (a restarted or new site). Called on every
  // rank before the first inner step: fetches the state the running sites committed, sets
  // strategy.shard_params() to its global weights, and returns the inner step it was committed
  // at (the trainer continues from there). Throws when the site cannot join.
  virtual int64_t join(SiteStrategy& /*strategy*/) { throw Error("this outer loop cannot join a running job"); }
  // The rank's trace (owned by the trainer, outlives the run); spans of the outer loop's
  // phases go there. Default: the hook records nothing.
  virtual void set_trace(TraceRecorder* /*trace*/) {}
  // The sites still in the run (bit s: config site s): the trace and summary merges wait
  // only for these. Default: every site.
  virtual uint64_t member_sites() const { return ~uint64_t{0}; }
};

}  // namespace geoloco::trainer
