// Userspace delay line: the WAN emulator's fallback where the kernel has no netem qdisc.
// Binds an NFQUEUE (fed by an iptables `-j NFQUEUE --queue-num N --queue-bypass` rule in the
// router namespace), holds every packet until arrival + delay (+ seeded uniform jitter),
// drops a seeded fraction, and accepts due packets with batched verdicts. Runs until SIGTERM
// / SIGINT (or `duration_s`), then accepts whatever is still held and writes its stats.
// SIGUSR1 suspends the loss draw, SIGUSR2 resumes it (capacity checks on lossy profiles).
#pragma once

#include <cstdint>
#include <string>

namespace geoloco::wan {

struct DelaylineOptions {
  int queue = 0;              // NFQUEUE number, 0..65535
  double delay_ms = 0.0;      // one-way delay added to every packet
  double jitter_ms = 0.0;     // uniform in [-jitter, +jitter], <= delay_ms
  double loss_pct = 0.0;      // per-packet drop probability in percent, [0, 100)
  uint64_t seed = 1;
  bool reorder = false;       // allow jitter to reorder packets (individual verdicts)
  uint32_t queue_maxlen = 65536;  // kernel queue length (packets); overflow drops
  bool gso = true;            // let GSO super-packets through whole (cheap); false makes the
                              // kernel segment them first so loss applies per wire packet
  bool compensate = true;     // wake early by the measured timer latency (see adapt_lead)
  std::string stats_file;     // JSON stats written on exit ("" = none)
  std::string ready_file;     // created once the queue is bound ("" = none)
  double duration_s = 0.0;    // > 0: exit after this long (tests)

  void validate() const;      // InputError on out-of-range values
};

// Returns 0 after a clean stop. Throws Error when netfilter cannot be set up (not root, no
// nfnetlink_queue) or a verdict fails.
int run_delayline(const DelaylineOptions& opt);

}  // namespace geoloco::wan
