// UcxTransport: the loop thread, the public life cycle, shutdown (ucx_transport.hpp).
#include "transport/ucx/ucx_transport.hpp"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cstring>

#include "core/log.hpp"
#include "transport/ucx/ucx_link.hpp"

namespace geoloco::transport::ucx {

UcxTransport::UcxTransport(TransportConfig cfg, Identity self, TestHooks hooks)
    : EngineTransport(std::move(cfg), std::move(self), std::move(hooks)) {
  version_ = hooks_.protocol_version != 0 ? hooks_.protocol_version : kProtocolVersion;
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throw TransportError(fmt::format("eventfd: {}", std::strerror(errno)));
  thread_ = std::thread([this] { run(); });
}

UcxTransport::~UcxTransport() {
  detach_handles();
  // Redials' gate handshakes post their outcome to the loop: done before it stops.
  std::vector<std::thread> redials;
  {
    std::lock_guard<std::mutex> lock(info_mu_);
    redials.swap(redial_threads_);
  }
  for (auto& t : redials) t.join();
  post([this] { stopping_ = true; });
  thread_.join();
  ::close(wake_fd_);
}

void UcxTransport::post(std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    cmds_.push_back(std::move(fn));
  }
  uint64_t one = 1;
  [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
}

int UcxTransport::listen(const std::string& host, int port) {
  auto st = std::make_shared<detail::OpState>();
  post([this, host, port, st] {
    try {
      st->finish_ok(static_cast<uint64_t>(do_listen(host, port)));
    } catch (const std::exception& e) {
      st->finish(FailKind::kTransport, e.what(), 0);
    }
  });
  OpHandle h(st);
  h.wait();
  return static_cast<int>(h.bytes());
}

void UcxTransport::start(const std::string& host, int port, std::vector<PeerInfo> peers) {
  listen(host, port);
  connect(std::move(peers));
}

std::vector<std::string> UcxTransport::settings() const {
  std::lock_guard<std::mutex> lock(info_mu_);
  return ucx_notes_;
}

bool UcxTransport::run_commands() {
  std::deque<std::function<void()>> cmds;
  {
    std::lock_guard<std::mutex> lock(cmd_mu_);
    cmds.swap(cmds_);
  }
  for (auto& c : cmds) c();
  return !cmds.empty();
}

void UcxTransport::run() {
  int idle_spins = 0;
  while (true) {
    bool busy = false;
    if (worker_)
      while (ucp_worker_progress(worker_->get()) != 0) busy = true;
    busy |= run_commands();
    if (stopping_) break;
    const auto now = Clock::now();
    Clock::time_point next{};
    {
      std::lock_guard<std::mutex> lock(info_mu_);
      if (gate_) set_gate_refused(gate_->refused());
    }
    // The protocol books the emulator's next release and the transfer deadlines in `next`,
    // the connections their dial and handshake deadlines: sleep until the first of them
    // (emulated delays were once rounded up to the 50 ms poll interval).
    busy |= run_protocol(now, next);
    connection_timers(now, next);  // also ends a connect whose peer failed meanwhile
    reap_endpoints();
    if (busy) {
      idle_spins = 0;
      continue;
    }
    // Spin a little while transfers are active (latency), then sleep in poll().
    if (has_active_ops() && ++idle_spins < 200) continue;
    idle_spins = 0;
    wait_for_events(next);
  }
  shutdown();
}

void UcxTransport::wait_for_events(Clock::time_point next) {
  int timeout_ms = 50;
  if (next != Clock::time_point{}) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - Clock::now()).count();
    timeout_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, 50));
  }
  if (worker_ && ucp_worker_arm(worker_->get()) == UCS_ERR_BUSY) return;  // events pending: progress again
  struct pollfd fds[2];
  int n = 0;
  fds[n++] = {wake_fd_, POLLIN, 0};
  if (worker_) fds[n++] = {worker_->event_fd(), POLLIN, 0};
  ::poll(fds, n, timeout_ms);
  if (fds[0].revents & POLLIN) {
    uint64_t v;
    [[maybe_unused]] auto r = ::read(wake_fd_, &v, sizeof(v));
  }
}

void UcxTransport::shutdown() {
  // Say goodbye on every healthy lane; the flush-close below delivers it. Flush-close when
  // nothing of ours is in flight; otherwise force (rendezvous transfers could keep a flush
  // waiting on the peer).
  HsMessage bye;
  bye.version = version_;
  bye.type = HsType::kBye;
  const auto bye_bytes = bye.encode();
  for (auto& [h, rec] : eps_) {
    if (!rec->ready || rec->dead || rec->peer < 0 || channel(rec->peer).failed()) continue;
    send_hs(*rec, bye_bytes, false);
    kill_ep(*rec, channel(rec->peer).active());
  }
  fail_all(FailKind::kTransport, fmt::format("transport {}/{} shut down", self_.site, self_.rank), /*quiet=*/true);
  if (connect_done_) finish_connect(FailKind::kTransport, "transport shut down during connect");
  {
    std::unique_ptr<Gate> gate;
    {
      std::lock_guard<std::mutex> lock(info_mu_);
      gate = std::move(gate_);
    }
    gate.reset();  // joins its threads (each bounded by the handshake timeout)
  }
  for (auto& [h, rec] : eps_)
    if (!rec->dead) kill_ep(*rec, true);
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (Clock::now() < deadline && worker_) {
    ucp_worker_progress(worker_->get());
    reap_endpoints();
    if (eps_.empty() && !requests_outstanding()) break;
  }
  // Whatever UCX did not return is given up here; buffers stay with their requests.
  abandon_requests();
  eps_.clear();
  listener_.reset();
  worker_.reset();
  context_.reset();
  publish_stats();
}

}  // namespace geoloco::transport::ucx
