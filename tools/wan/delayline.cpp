#include "tools/wan/delayline.hpp"

// Order matters: <linux/netfilter.h> needs the in_addr definitions from <arpa/inet.h>.
#include <arpa/inet.h>
#include <linux/netfilter.h>
#include <libnetfilter_queue/libnetfilter_queue.h>
#include <libnfnetlink/libnfnetlink.h>

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cerrno>
#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <memory>
#include <vector>

#include "tools/wan/delay_schedule.hpp"
#include "core/error.hpp"
#include "core/fd.hpp"

namespace geoloco::wan {
namespace {

int64_t mono_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000LL + ts.tv_nsec;
}

std::string errno_text(int e) { return std::strerror(e); }

struct NfqCloser {
  void operator()(nfq_handle* h) const { nfq_close(h); }
};
struct QueueDestroyer {
  void operator()(nfq_q_handle* q) const { nfq_destroy_queue(q); }
};

// Blocks SIGTERM/SIGINT/SIGHUP/SIGUSR1/SIGUSR2 for the lifetime of the object (they are read
// from a signalfd instead, so a signal can never interrupt a half-sent verdict) and restores
// the old mask and handlers. In a process that already has other threads (the full geoloco
// binary: OpenBLAS starts its pool before main), a process-directed signal goes to a thread
// that does not block it, where the default action would kill the process without stats (or,
// for SIGUSR1, kill it instead of suspending the loss). So a handler forwards any such signal
// to this thread, where it is blocked and hence lands in the signalfd.
std::atomic<pid_t> g_signal_tid{0};

void forward_signal(int sig) {
  const int saved = errno;
  const pid_t tid = g_signal_tid.load(std::memory_order_relaxed);
  if (tid != 0 && tid != static_cast<pid_t>(syscall(SYS_gettid))) syscall(SYS_tgkill, getpid(), tid, sig);
  errno = saved;
}

class SignalBlock {
 public:
  SignalBlock() {
    sigemptyset(&set_);
    for (int s : kSignals) sigaddset(&set_, s);
    if (sigprocmask(SIG_BLOCK, &set_, &old_) != 0) throw Error("delayline: sigprocmask: " + errno_text(errno));
    g_signal_tid.store(static_cast<pid_t>(syscall(SYS_gettid)));
    struct sigaction sa {};
    sa.sa_handler = forward_signal;
    sa.sa_flags = SA_RESTART;
    sigfillset(&sa.sa_mask);
    for (std::size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &sa, &old_actions_[i]);
  }
  ~SignalBlock() {
    for (std::size_t i = 0; i < kSignals.size(); ++i) sigaction(kSignals[i], &old_actions_[i], nullptr);
    g_signal_tid.store(0);
    sigprocmask(SIG_SETMASK, &old_, nullptr);
  }
  SignalBlock(const SignalBlock&) = delete;
  SignalBlock& operator=(const SignalBlock&) = delete;
  const sigset_t& set() const { return set_; }

 private:
  static constexpr std::array<int, 5> kSignals = {SIGTERM, SIGINT, SIGHUP, SIGUSR1, SIGUSR2};
  sigset_t set_{}, old_{};
  std::array<struct sigaction, 5> old_actions_{};
};

struct Stats {
  uint64_t received = 0;          // packets handed to us by the kernel
  uint64_t delayed = 0;           // accepted after their delay
  uint64_t dropped = 0;           // dropped by the loss draw
  uint64_t received_loss_on = 0;  // packets that arrived while the loss draw was enabled
  uint64_t flushed = 0;           // accepted early at shutdown
  uint64_t verdict_msgs = 0;      // verdict messages sent (batches count once)
  uint64_t max_held = 0;
  double lateness_sum_ns = 0;  // release time - due time, over delayed packets
  int64_t lateness_max_ns = 0;
  uint64_t kernel_stamped = 0;  // arrivals timed by the kernel's packet timestamp
  double stamp_age_sum_ns = 0;  // how long those waited before this process read them
  double abs_lateness_sum_ns = 0;
  int64_t recv_errors = 0;  // ENOBUFS: the kernel dropped notifications (batch verdicts recover)
};

class Delayline {
 public:
  explicit Delayline(const DelaylineOptions& opt)
      : opt_(opt),
        schedule_({std::llround(opt.delay_ms * 1e6), std::llround(opt.jitter_ms * 1e6), opt.loss_pct / 100.0, opt.seed,
                   opt.reorder}) {}

  static int on_packet(nfq_q_handle*, nfgenmsg*, nfq_data* nfa, void* self) {
    auto* me = static_cast<Delayline*>(self);
    const nfqnl_msg_packet_hdr* ph = nfq_get_msg_packet_hdr(nfa);
    if (ph == nullptr) return 0;
    me->admit(ntohl(ph->packet_id), me->arrival_ns(nfa));
    return 0;
  }

  void run() {
    handle_.reset(nfq_open());
    if (!handle_) throw Error("delayline: nfq_open failed (need root / CAP_NET_ADMIN): " + errno_text(errno));
    qh_.reset(nfq_create_queue(handle_.get(), static_cast<uint16_t>(opt_.queue), &Delayline::on_packet, this));
    if (!qh_)
      throw Error(fmt::format("delayline: cannot bind NFQUEUE {} (another listener? no nfnetlink_queue?): {}",
                              opt_.queue, errno_text(errno)));
    // Metadata only: the verdict needs the packet id, never the payload, so do not copy it.
    if (nfq_set_mode(qh_.get(), NFQNL_COPY_META, 0) < 0)
      throw Error(fmt::format("delayline: queue {}: nfq_set_mode: {}", opt_.queue, errno_text(errno)));
    if (nfq_set_queue_maxlen(qh_.get(), opt_.queue_maxlen) < 0)
      throw Error(fmt::format("delayline: queue {}: nfq_set_queue_maxlen {}: {}", opt_.queue, opt_.queue_maxlen,
                              errno_text(errno)));
    if (opt_.gso && nfq_set_queue_flags(qh_.get(), NFQA_CFG_F_GSO, NFQA_CFG_F_GSO) < 0)
      spdlog::warn("delayline: queue {}: kernel refused NFQA_CFG_F_GSO; packets will be segmented", opt_.queue);

    const int fd = nfq_fd(handle_.get());
    // A big receive buffer and no ENOBUFS: at 1 Gbit/s thousands of notifications can arrive
    // between two wake-ups. If some are lost anyway, the next batch verdict (which covers every
    // id up to the one given) still releases those packets.
    nfnl_rcvbufsiz(nfq_nfnlh(handle_.get()), 64u << 20);
    int one = 1;
    setsockopt(fd, SOL_NETLINK, NETLINK_NO_ENOBUFS, &one, sizeof one);
    prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);  // wake-ups on time, not 50 us late
    // The kernel stamps received packets only while some socket asks for timestamps; this
    // otherwise unused socket asks, so queued packets carry their arrival time (see arrival_ns).
    stamp_sock_.reset(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (stamp_sock_) setsockopt(stamp_sock_.get(), SOL_SOCKET, SO_TIMESTAMPNS, &one, sizeof one);

    SignalBlock sigs;
    const Fd sfd(signalfd(-1, &sigs.set(), SFD_NONBLOCK | SFD_CLOEXEC));
    if (!sfd) throw Error("delayline: signalfd: " + errno_text(errno));

    if (!opt_.ready_file.empty()) {
      std::ofstream(opt_.ready_file) << getpid() << "\n";
    }
    spdlog::info("delayline: queue {} bound: delay {} ms jitter {} ms loss {}% seed {} reorder {} gso {}", opt_.queue,
                 opt_.delay_ms, opt_.jitter_ms, opt_.loss_pct, opt_.seed, opt_.reorder, opt_.gso);

    const int64_t start = mono_ns();
    const int64_t stop_at = opt_.duration_s > 0 ? start + std::llround(opt_.duration_s * 1e9) : INT64_MAX;
    std::vector<char> buf(kBatch * kMsgBytes);
    bool stop = false;
    while (!stop) {
      int64_t now = mono_ns();
      release(now);
      if (now >= stop_at) break;
      int64_t wait_ns = stop_at - now;
      // Wake `lead_ns_` before the next due time: the measured wake-up latency of this host.
      const int64_t target = pending_.empty() ? INT64_MAX : pending_.next_due() - lead_ns_;
      // Only a real sleep on the release timer measures the timer's latency.
      const bool timer_sleep = target != INT64_MAX && target > now && target <= stop_at;
      if (target != INT64_MAX) wait_ns = std::min(wait_ns, std::max<int64_t>(0, target - now));
      timespec ts{};
      const timespec* tsp = nullptr;
      if (wait_ns != INT64_MAX) {
        ts.tv_sec = wait_ns / 1000000000LL;
        ts.tv_nsec = wait_ns % 1000000000LL;
        tsp = &ts;
      }
      pollfd pfd[2] = {{fd, POLLIN, 0}, {sfd.get(), POLLIN, 0}};
      const int r = ppoll(pfd, 2, tsp, nullptr);
      if (r < 0) {
        if (errno == EINTR) continue;
        throw Error("delayline: ppoll: " + errno_text(errno));
      }
      if (r == 0 && timer_sleep && opt_.compensate) adapt_lead(mono_ns() - target);
      if (pfd[1].revents & POLLIN) {
        signalfd_siginfo si{};
        while (read(sfd.get(), &si, sizeof si) == static_cast<ssize_t>(sizeof si)) {
          if (si.ssi_signo == SIGUSR1 || si.ssi_signo == SIGUSR2) {
            // SIGUSR1: loss off, SIGUSR2: loss on (tools/wan/check measures capacity loss-free).
            schedule_.set_loss_enabled(si.ssi_signo == SIGUSR2);
            spdlog::info("delayline: queue {}: loss {}", opt_.queue, si.ssi_signo == SIGUSR2 ? "on" : "off");
            continue;
          }
          spdlog::info("delayline: queue {}: signal {}, stopping", opt_.queue, si.ssi_signo);
          stop = true;
        }
      }
      if (pfd[0].revents & POLLIN) drain(fd, buf);
    }
    flush();
  }

  nlohmann::json stats_json() const {
    nlohmann::json j;
    j["format"] = "geoloco-wan-delayline-stats";
    j["version"] = 1;
    j["queue"] = opt_.queue;
    j["delay_ms"] = opt_.delay_ms;
    j["jitter_ms"] = opt_.jitter_ms;
    j["loss_pct"] = opt_.loss_pct;
    j["seed"] = opt_.seed;
    j["reorder"] = opt_.reorder;
    j["gso"] = opt_.gso;
    j["received"] = st_.received;
    j["delayed"] = st_.delayed;
    j["dropped"] = st_.dropped;
    j["received_loss_on"] = st_.received_loss_on;
    j["flushed"] = st_.flushed;
    j["verdict_msgs"] = st_.verdict_msgs;
    j["max_held"] = st_.max_held;
    j["lateness_mean_ms"] = st_.delayed ? st_.lateness_sum_ns / static_cast<double>(st_.delayed) / 1e6 : 0.0;
    j["lateness_max_ms"] = static_cast<double>(st_.lateness_max_ns) / 1e6;
    j["lateness_abs_mean_ms"] = st_.delayed ? st_.abs_lateness_sum_ns / static_cast<double>(st_.delayed) / 1e6 : 0.0;
    j["compensate"] = opt_.compensate;
    j["kernel_stamped"] = st_.kernel_stamped;
    j["stamp_age_mean_ms"] =
        st_.kernel_stamped ? st_.stamp_age_sum_ns / static_cast<double>(st_.kernel_stamped) / 1e6 : 0.0;
    j["lead_ms"] = static_cast<double>(lead_ns_) / 1e6;
    j["recv_errors"] = st_.recv_errors;
    timespec cpu{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
    j["cpu_s"] = static_cast<double>(cpu.tv_sec) + static_cast<double>(cpu.tv_nsec) / 1e9;
    return j;
  }

 private:
  // When the kernel stamped the packet (skb->tstamp, wall clock), the delay counts from that
  // moment rather than from when this process got to read it: the wake-up latency of the
  // daemon would otherwise be added to every packet. Converted to CLOCK_MONOTONIC via the
  // current offset; ages outside [0, 20 ms] (clock steps, no stamp) fall back to "now".
  int64_t arrival_ns(nfq_data* nfa) {
    const int64_t now = mono_ns();
    timeval tv{};
    if (nfq_get_timestamp(nfa, &tv) != 0 || tv.tv_sec == 0) return now;
    timespec rt{};
    clock_gettime(CLOCK_REALTIME, &rt);
    const int64_t age = (static_cast<int64_t>(rt.tv_sec) - tv.tv_sec) * 1000000000LL + rt.tv_nsec -
                        static_cast<int64_t>(tv.tv_usec) * 1000;
    if (age < 0 || age > 20'000'000) return now;
    ++st_.kernel_stamped;
    st_.stamp_age_sum_ns += static_cast<double>(age);
    return std::max(now - age, last_arrival_);
  }

  void admit(uint32_t id, int64_t arrival) {
    last_arrival_ = arrival;
    ++st_.received;
    if (schedule_.loss_enabled()) ++st_.received_loss_on;
    const Decision d = schedule_.admit(arrival);
    if (d.drop) {
      ++st_.dropped;
      verdict_one(id, NF_DROP);
      return;
    }
    pending_.push(id, d.due_ns);
    st_.max_held = std::max<uint64_t>(st_.max_held, pending_.size());
  }

  // Reads queued-packet notifications in batches (recvmmsg: one system call for up to kBatch
  // packets), then releases whatever became due. Bounded per wake-up so due packets are not
  // starved by a flood of arrivals.
  static constexpr int kBatch = 64;
  static constexpr std::size_t kMsgBytes = 8192;  // metadata-only messages are ~200 bytes

  void drain(int fd, std::vector<char>& buf) {
    mmsghdr msgs[kBatch];
    iovec iov[kBatch];
    for (int k = 0; k < kBatch; ++k) {
      iov[k] = {buf.data() + k * kMsgBytes, kMsgBytes};
      msgs[k] = {};
      msgs[k].msg_hdr.msg_iov = &iov[k];
      msgs[k].msg_hdr.msg_iovlen = 1;
    }
    for (int round = 0; round < 16; ++round) {
      const int n = recvmmsg(fd, msgs, kBatch, MSG_DONTWAIT, nullptr);
      if (n < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        if (errno == ENOBUFS) {
          ++st_.recv_errors;
          continue;
        }
        throw Error(fmt::format("delayline: queue {}: recvmmsg: {}", opt_.queue, errno_text(errno)));
      }
      for (int k = 0; k < n; ++k)
        nfq_handle_packet(handle_.get(), static_cast<char*>(iov[k].iov_base), static_cast<int>(msgs[k].msg_len));
      release(mono_ns());
      if (n < kBatch) return;
    }
  }

  // Timer wake-ups arrive late by the scheduler's latency (~0.1 ms idle, more on a busy host);
  // waking that much earlier centres release times on the due times. EWMA (1/16) of the
  // observed latency, capped so a long stall cannot make the line release far too early.
  void adapt_lead(int64_t late_ns) {
    const int64_t cap = std::min<int64_t>(500'000, std::llround(opt_.delay_ms * 1e6 / 2));
    const int64_t observed = std::clamp<int64_t>(late_ns, 0, cap);
    lead_ns_ += (observed - lead_ns_) / 16;
  }

  void release(int64_t now) {
    due_.clear();
    pending_.pop_due(now + lead_ns_, due_);
    if (due_.empty()) return;
    for (const auto& e : due_) {
      const int64_t late = now - e.due_ns;
      st_.lateness_sum_ns += static_cast<double>(late);  // signed: early releases count negative
      st_.lateness_max_ns = std::max(st_.lateness_max_ns, late);
      st_.abs_lateness_sum_ns += static_cast<double>(late < 0 ? -late : late);
    }
    st_.delayed += due_.size();
    accept(due_);
  }

  void flush() {
    due_.clear();
    pending_.pop_all(due_);
    if (due_.empty()) return;
    st_.flushed += due_.size();
    accept(due_);
  }

  // FIFO mode releases in id order, and every earlier id has been released or dropped
  // already, so one batch verdict ("accept all ids <= last") covers the whole run. With
  // reordering an earlier id may still be held: verdict each packet on its own.
  void accept(const std::vector<ReleaseQueue::Entry>& es) {
    if (!opt_.reorder) {
      if (nfq_set_verdict_batch(qh_.get(), es.back().id, NF_ACCEPT) < 0)
        throw Error(fmt::format("delayline: queue {}: batch verdict: {}", opt_.queue, errno_text(errno)));
      ++st_.verdict_msgs;
      return;
    }
    for (const auto& e : es) verdict_one(e.id, NF_ACCEPT);
  }

  void verdict_one(uint32_t id, uint32_t verdict) {
    if (nfq_set_verdict(qh_.get(), id, verdict, 0, nullptr) < 0)
      throw Error(fmt::format("delayline: queue {}: verdict for packet {}: {}", opt_.queue, id, errno_text(errno)));
    ++st_.verdict_msgs;
  }

  DelaylineOptions opt_;
  DelaySchedule schedule_;
  ReleaseQueue pending_;
  std::vector<ReleaseQueue::Entry> due_;
  Stats st_;
  int64_t lead_ns_ = 0;
  int64_t last_arrival_ = INT64_MIN;
  Fd stamp_sock_;  // arrivals handed to the schedule stay non-decreasing
  // Destruction order: queue before handle.
  std::unique_ptr<nfq_handle, NfqCloser> handle_;
  std::unique_ptr<nfq_q_handle, QueueDestroyer> qh_;
};

}  // namespace

void DelaylineOptions::validate() const {
  if (queue < 0 || queue > 65535) throw InputError(fmt::format("--queue {} out of range 0..65535", queue));
  if (!(delay_ms >= 0.0 && delay_ms <= 60000.0))
    throw InputError(fmt::format("--delay-ms {} out of range 0..60000", delay_ms));
  if (!(jitter_ms >= 0.0 && jitter_ms <= delay_ms))
    throw InputError(fmt::format("--jitter-ms {} must be in 0..delay ({})", jitter_ms, delay_ms));
  if (!(loss_pct >= 0.0 && loss_pct < 100.0))
    throw InputError(fmt::format("--loss {} out of range [0, 100)", loss_pct));
  if (queue_maxlen < 1) throw InputError("--queue-maxlen must be >= 1");
  if (duration_s < 0.0) throw InputError("--duration-s must be >= 0");
}

int run_delayline(const DelaylineOptions& opt) {
  opt.validate();
  Delayline dl(opt);
  auto write_stats = [&] {
    if (opt.stats_file.empty()) return;
    const std::string tmp = opt.stats_file + ".tmp";
    {
      std::ofstream f(tmp);
      f << dl.stats_json().dump(2) << "\n";
      if (!f) {
        spdlog::error("delayline: cannot write stats to {}", tmp);
        return;
      }
    }
    std::rename(tmp.c_str(), opt.stats_file.c_str());
  };
  try {
    dl.run();
  } catch (...) {
    write_stats();  // partial stats still help diagnose the failure
    throw;
  }
  write_stats();
  const auto j = dl.stats_json();
  spdlog::info("delayline: queue {} done: received {} delayed {} dropped {} flushed {} lateness mean {:.3f} ms",
               opt.queue, j["received"].get<uint64_t>(), j["delayed"].get<uint64_t>(), j["dropped"].get<uint64_t>(),
               j["flushed"].get<uint64_t>(), j["lateness_mean_ms"].get<double>());
  return 0;
}

}  // namespace geoloco::wan
