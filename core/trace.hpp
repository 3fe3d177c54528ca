// TraceRecorder: one rank's timeline, the spans every area records into (the inner loop, the
// outer loop's worker and its transport callbacks), written by the trainer as Chrome trace
// events (trainer/loop/trace_files.hpp). Thread-safe and bounded.
#pragma once

#include <chrono>
#include <cstdint>
#include <mutex>
#include <nlohmann/json.hpp>
#include <vector>

namespace geoloco {

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

}  // namespace geoloco
