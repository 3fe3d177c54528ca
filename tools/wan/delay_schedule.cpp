#include "tools/wan/delay_schedule.hpp"

#include <algorithm>
#include <cmath>

#include "core/error.hpp"
#include "core/rng.hpp"

namespace geoloco::wan {

DelaySchedule::DelaySchedule(const ScheduleParams& p) : p_(p) {
  GEOLOCO_CHECK(p.delay_ns >= 0 && p.jitter_ns >= 0 && p.jitter_ns <= p.delay_ns, "delay {} jitter {}", p.delay_ns,
                p.jitter_ns);
  GEOLOCO_CHECK(p.loss >= 0.0 && p.loss < 1.0, "loss {}", p.loss);
}

Decision DelaySchedule::admit(int64_t arrival_ns) {
  // One independent stream per packet index: the k-th packet's fate does not depend on how
  // many random numbers earlier packets consumed.
  Rng rng(mix_seed(p_.seed, index_++));
  const double u_loss = rng.uniform();
  const double u_jitter = rng.uniform();
  Decision d;
  if (loss_enabled_ && u_loss < p_.loss) {
    d.drop = true;
    return d;
  }
  int64_t offset = 0;
  if (p_.jitter_ns > 0) offset = std::llround((2.0 * u_jitter - 1.0) * static_cast<double>(p_.jitter_ns));
  d.due_ns = arrival_ns + p_.delay_ns + offset;
  if (!p_.reorder) d.due_ns = std::max(d.due_ns, last_due_);
  last_due_ = std::max(last_due_, d.due_ns);
  return d;
}

void ReleaseQueue::pop_due(int64_t now_ns, std::vector<Entry>& out) {
  while (!heap_.empty() && heap_.top().due_ns <= now_ns) {
    out.push_back(heap_.top());
    heap_.pop();
  }
}

}  // namespace geoloco::wan
