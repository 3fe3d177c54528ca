// The delay line's decision logic, separated from netfilter so it can be tested without root:
// for the k-th packet arriving at time t, decide drop or release time, deterministically from
// (seed, k). Same seed and same arrival sequence -> same decisions, bit for bit.
#pragma once

#include <cstdint>
#include <queue>
#include <vector>

namespace geoloco::wan {

struct ScheduleParams {
  int64_t delay_ns = 0;
  int64_t jitter_ns = 0;   // uniform in [-jitter, +jitter]
  double loss = 0.0;       // probability in [0, 1)
  uint64_t seed = 0;
  bool reorder = false;    // false: a packet is never released before an earlier one (FIFO)
};

struct Decision {
  bool drop = false;
  int64_t due_ns = 0;  // meaningful when !drop
};

class DelaySchedule {
 public:
  explicit DelaySchedule(const ScheduleParams& p);
  // arrival_ns must be non-decreasing across calls (monotonic clock).
  Decision admit(int64_t arrival_ns);
  uint64_t admitted() const { return index_; }
  // Suspends the loss draw (the pre-run check measures capacity this way). Packet k's jitter
  // stays the same either way: every packet consumes its draws regardless.
  void set_loss_enabled(bool on) { loss_enabled_ = on; }
  bool loss_enabled() const { return loss_enabled_; }

 private:
  ScheduleParams p_;
  uint64_t index_ = 0;
  int64_t last_due_ = INT64_MIN;
  bool loss_enabled_ = true;
};

// Packets waiting for their due time, released in due order (ties by packet id, so the
// release order is deterministic).
class ReleaseQueue {
 public:
  struct Entry {
    int64_t due_ns;
    uint32_t id;
  };
  void push(uint32_t id, int64_t due_ns) { heap_.push({due_ns, id}); }
  bool empty() const { return heap_.empty(); }
  std::size_t size() const { return heap_.size(); }
  int64_t next_due() const { return heap_.top().due_ns; }
  // Appends every entry with due_ns <= now to out, in release order.
  void pop_due(int64_t now_ns, std::vector<Entry>& out);
  void pop_all(std::vector<Entry>& out) { pop_due(INT64_MAX, out); }

 private:
  struct Later {
    bool operator()(const Entry& a, const Entry& b) const {
      return a.due_ns != b.due_ns ? a.due_ns > b.due_ns : a.id > b.id;
    }
  };
  std::priority_queue<Entry, std::vector<Entry>, Later> heap_;
};

}  // namespace geoloco::wan
