#include "transport/transport.hpp"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "trainer/core/hash.hpp"
#include "trainer/core/log.hpp"
#include "transport/gate.hpp"
#include "transport/handshake.hpp"
#include "transport/ucx_env.hpp"
#include "transport/ucx_handles.hpp"

namespace geoloco::transport {

namespace detail {
// Shared by the progress thread and the handle. The error is kept as (type, message) and
// each waiter throws its own exception object: exception objects are never shared between
// threads (their refcount lives in uninstrumented libstdc++, which TSan cannot follow).
struct OpState {
  enum class Err { kNone, kTransport, kHandshake, kFrame, kTimeout };
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Err err = Err::kNone;
  std::string message;
  uint64_t bytes = 0;

  void finish(const std::exception_ptr& e, uint64_t b) {
    Err kind = Err::kNone;
    std::string msg;
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const FrameError& x) {
        kind = Err::kFrame, msg = x.what();
      } catch (const TimeoutError& x) {
        kind = Err::kTimeout, msg = x.what();
      } catch (const HandshakeError& x) {
        kind = Err::kHandshake, msg = x.what();
      } catch (const std::exception& x) {
        kind = Err::kTransport, msg = x.what();
      }
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      if (done) return;
      done = true;
      err = kind;
      message = std::move(msg);
      bytes = b;
    }
    cv.notify_all();
  }

  [[noreturn]] void throw_error() const {
    switch (err) {
      case Err::kFrame: throw FrameError(message);
      case Err::kTimeout: throw TimeoutError(message);
      case Err::kHandshake: throw HandshakeError(message);
      default: throw TransportError(message);
    }
  }
};
}  // namespace detail

// ---------------------------------------------------------------------------------------
// Handles

void OpHandle::wait() const {
  GEOLOCO_CHECK(s_ != nullptr, "wait() on an empty handle");
  std::unique_lock<std::mutex> lock(s_->mu);
  s_->cv.wait(lock, [&] { return s_->done; });
  if (s_->err != detail::OpState::Err::kNone) s_->throw_error();
}

bool OpHandle::wait_for(std::chrono::duration<double> timeout) const {
  GEOLOCO_CHECK(s_ != nullptr, "wait_for() on an empty handle");
  std::unique_lock<std::mutex> lock(s_->mu);
  if (!s_->cv.wait_for(lock, timeout, [&] { return s_->done; })) return false;
  if (s_->err != detail::OpState::Err::kNone) s_->throw_error();
  return true;
}

bool OpHandle::ready() const {
  if (!s_) return false;
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->done;
}

uint64_t OpHandle::bytes() const {
  GEOLOCO_CHECK(s_ != nullptr, "bytes() on an empty handle");
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->bytes;
}

std::string PeerInfo::name() const { return fmt::format("{}/{} ({}:{})", site, rank, host, port); }

nlohmann::json TransportStats::to_json() const {
  nlohmann::json j;
  j["handshakes_refused"] = handshakes_refused;
  j["gate_refused"] = gate_refused;
  j["frames_rejected_unauthenticated"] = frames_rejected_unauthenticated;
  j["peers"] = nlohmann::json::array();
  for (const auto& p : peers) {
    j["peers"].push_back({{"site", p.site},
                          {"rank", p.rank},
                          {"bytes_sent", p.bytes_sent},
                          {"bytes_received", p.bytes_received},
                          {"frames_sent", p.frames_sent},
                          {"frames_received", p.frames_received},
                          {"frames_rejected", p.frames_rejected},
                          {"frames_received_rndv", p.frames_received_rndv},
                          {"messages_sent_eager", p.messages_sent_eager},
                          {"eager_bytes_outstanding", p.eager_bytes_outstanding},
                          {"lane_bytes_sent", p.lane_bytes_sent},
                          {"failure", p.failure}});
  }
  return j;
}

// ---------------------------------------------------------------------------------------
// Impl: everything below runs on the progress thread unless marked otherwise.

namespace {

using Clock = std::chrono::steady_clock;
using Key = std::tuple<uint16_t, uint64_t, uint32_t>;  // kind, round, shard

constexpr unsigned kAmHandshake = 7;
constexpr unsigned kAmFrame = 8;
// Handshakes in progress at once; more connection requests are rejected (a flood of
// half-open connections must not exhaust memory).
constexpr size_t kMaxPendingHandshakes = 64;
// Unexpected (not yet posted) frames held per peer; each holds a UCX descriptor only.
constexpr size_t kMaxUnexpectedFrames = 4096;
// Eager bytes held for not-yet-posted recvs per peer (rendezvous frames hold no payload);
// bounds what a peer forcing eager sends can make us keep.
constexpr uint64_t kMaxUnexpectedEagerBytes = 256ull << 20;
// A sender's eager window per peer: this many times transport.eager_bytes sent eagerly and not
// yet credited back. The cap above catches a peer that ignores it.
constexpr uint64_t kEagerWindowFactor = 4;
static_assert(kEagerWindowFactor * kMaxEagerBytes <= kMaxUnexpectedEagerBytes);
// After a failure, how long a recv may wait for UCX to cancel its in-flight receives.
constexpr double kCancelGraceS = 10;

enum class FailKind { kTransport, kHandshake, kFrame, kTimeout };

std::exception_ptr make_error(FailKind kind, const std::string& msg) {
  switch (kind) {
    case FailKind::kHandshake: return std::make_exception_ptr(HandshakeError(msg));
    case FailKind::kFrame: return std::make_exception_ptr(FrameError(msg));
    case FailKind::kTimeout: return std::make_exception_ptr(TimeoutError(msg));
    case FailKind::kTransport: break;
  }
  return std::make_exception_ptr(TransportError(msg));
}

std::string key_str(const Key& k) {
  return fmt::format("{} round {} shard {}", to_string(static_cast<FrameKind>(std::get<0>(k))), std::get<1>(k),
                     std::get<2>(k));
}

Clock::duration seconds(double s) { return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)); }

enum class EpState { kAwaitAck, kAwaitAuthOk, kAwaitHello, kAwaitAuth, kReady, kDead };

struct EpRec {
  std::unique_ptr<ucx::Endpoint> ep;
  bool dialer = false;
  int peer = -1;
  int lane = -1;
  EpState state = EpState::kAwaitHello;
  Nonce my_nonce{};
  Nonce peer_nonce{};
  Clock::time_point hs_deadline{};
  std::string remote;
  std::optional<HsMessage> pending_hello;  // arrived before connect() named the peers
  bool close_requested = false;
};

struct SendOp {
  int peer = -1;
  Key key;
  std::span<const uint8_t> payload;
  uint64_t nchunks = 0;
  uint64_t next_chunk = 0;
  uint64_t done_chunks = 0;
  int inflight = 0;
  int lane = -1;  // -1: round-robin over the peer's lanes; else this lane only
  bool eager = false;  // decided when its first chunk goes out: counted in the eager window
  Clock::time_point enqueued{};
  std::optional<Clock::time_point> next_release;  // emulation: when the next chunk may go
  bool failed = false;
  std::shared_ptr<detail::OpState> state;
};

struct RecvOp {
  int peer = -1;
  Key key;
  std::span<uint8_t> dest;
  bool have_total = false;
  uint64_t total = 0;
  uint64_t nchunks = 0;
  uint64_t got = 0;  // chunks accepted (copied or receive started)
  uint64_t verified = 0;
  std::vector<bool> seen;
  uint64_t credit_bytes = 0;  // bytes of eager-window frames: returned to the sender at the end
  int inflight = 0;
  Clock::time_point last_progress{};
  bool failed = false;
  Clock::time_point failed_at{};
  std::exception_ptr error;
  std::shared_ptr<detail::OpState> state;
};

struct Unexpected {
  FrameHeader h;
  void* data = nullptr;  // UCX descriptor (persistent eager data or rendezvous), or null
  uint64_t length = 0;
  bool rndv = false;
};

struct Peer {
  PeerInfo info;
  bool we_dial = false;
  int ucx_port = 0;  // learned from the peer's gate (peers we dial)
  std::vector<ucp_ep_h> lane_ep;
  std::vector<Clock::time_point> redial_at;
  std::vector<bool> dial_active;
  std::string last_error;
  std::string fatal;  // handshake failure that retrying cannot fix
  bool failed = false;
  FailKind fail_kind = FailKind::kTransport;
  std::string failure;
  bool failure_processed = false;
  std::deque<std::shared_ptr<SendOp>> sendq;
  std::set<Key> active_sends;
  int inflight = 0;
  size_t rr = 0;
  Clock::time_point send_progress{};
  Clock::time_point link_free{};
  std::map<Key, std::shared_ptr<RecvOp>> recvs;
  std::set<Key> completed;
  std::map<Key, std::deque<Unexpected>> unexpected;
  size_t unexpected_count = 0;
  uint64_t unexpected_eager_bytes = 0;
  PeerStats stats;

  size_t ready_lanes() const {
    return static_cast<size_t>(std::count_if(lane_ep.begin(), lane_ep.end(), [](ucp_ep_h e) { return e != nullptr; }));
  }
};

}  // namespace

class Transport::Impl {
 public:
  Impl(TransportConfig cfg, Identity self, TestHooks hooks)
      : cfg_(std::move(cfg)), self_(std::move(self)), hooks_(std::move(hooks)) {
    cfg_.validate();
    active_lanes_.store(cfg_.lanes);
    if (self_.site.empty() || self_.site.size() > kMaxSiteBytes)
      throw ConfigError(fmt::format("transport: site name '{}' must have 1..{} bytes", self_.site, kMaxSiteBytes));
    if (self_.run_id.size() > kMaxRunIdBytes)
      throw ConfigError(fmt::format("transport: run id longer than {} bytes", kMaxRunIdBytes));
    version_ = hooks_.protocol_version != 0 ? hooks_.protocol_version : kProtocolVersion;
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wake_fd_ < 0) throw TransportError(fmt::format("eventfd: {}", std::strerror(errno)));
    thread_ = std::thread([this] { run(); });
  }

  ~Impl() {
    post([this] { stopping_ = true; });
    thread_.join();
    ::close(wake_fd_);
  }

  // ---- API side (any thread) --------------------------------------------------------

  // API calls that need an answer from the progress thread wait on an OpState (not a
  // std::future: no exception object crosses threads).
  int listen(const std::string& host, int port) {
    auto st = std::make_shared<detail::OpState>();
    post([this, host, port, st] {
      try {
        int p = do_listen(host, port);
        st->finish(nullptr, static_cast<uint64_t>(p));
      } catch (...) {
        st->finish(std::current_exception(), 0);
      }
    });
    OpHandle h(st);
    h.wait();
    return static_cast<int>(h.bytes());
  }

  void connect(std::vector<PeerInfo> peers) {
    std::set<std::pair<std::string, int>> seen;
    for (const auto& p : peers) {
      if (p.site == self_.site && p.rank == self_.rank)
        throw ConfigError(fmt::format("transport: peer list contains ourselves ({})", p.name()));
      if (!seen.insert({p.site, p.rank}).second) throw ConfigError(fmt::format("transport: duplicate peer {}", p.name()));
      if (p.site.empty() || p.site.size() > kMaxSiteBytes)
        throw ConfigError(fmt::format("transport: peer site name '{}' must have 1..{} bytes", p.site, kMaxSiteBytes));
    }
    Gate* gate;
    {
      std::lock_guard<std::mutex> lock(info_mu_);
      gate = gate_.get();
      if (gate == nullptr) throw TransportError("transport: connect() before listen()");
      if (connect_called_) throw TransportError("transport: connect() called twice");
      connect_called_ = true;
    }
    auto deadline = Clock::now() + seconds(cfg_.connect_timeout_s);
    gate->set_peers(peers);
    // Authenticate with the gates of the peers we dial (in parallel) to learn their UCX ports.
    // Each dial thread reports (port, error kind, message): no exception crosses threads.
    struct DialResult {
      int port = 0;
      bool handshake_error = false;
      std::string error;
    };
    std::vector<std::future<DialResult>> dials_f(peers.size());
    for (size_t i = 0; i < peers.size(); ++i)
      if (dials(self_, peers[i]))
        dials_f[i] = std::async(std::launch::async, [&, i] {
          DialResult r;
          try {
            r.port = gate_dial(peers[i], self_, cfg_, version_, deadline);
          } catch (const HandshakeError& e) {
            r.handshake_error = true;
            r.error = e.what();
          } catch (const std::exception& e) {
            r.error = e.what();
          }
          return r;
        });
    std::vector<int> ucx_ports(peers.size(), 0);
    std::vector<std::string> gate_errors(peers.size());
    std::string fatal;
    for (size_t i = 0; i < peers.size(); ++i) {
      if (!dials_f[i].valid()) continue;
      DialResult r = dials_f[i].get();
      ucx_ports[i] = r.port;
      if (r.handshake_error && fatal.empty()) fatal = r.error;
      if (!r.handshake_error) gate_errors[i] = r.error;
    }
    if (!fatal.empty()) throw HandshakeError(fatal);
    auto st = std::make_shared<detail::OpState>();
    post([this, peers = std::move(peers), ucx_ports, gate_errors, deadline, st]() mutable {
      try {
        do_connect(std::move(peers), ucx_ports, gate_errors, deadline, st);
      } catch (...) {
        st->finish(std::current_exception(), 0);
      }
    });
    OpHandle(st).wait();
    std::lock_guard<std::mutex> lock(info_mu_);
    info_ready_ = true;
  }

  OpHandle send(int peer, FrameKind kind, uint64_t round, uint32_t shard, std::span<const uint8_t> payload,
                int lane = -1) {
    auto op = std::make_shared<SendOp>();
    op->peer = peer;
    op->key = Key{static_cast<uint16_t>(kind), round, shard};
    op->payload = payload;
    op->lane = lane;
    op->state = std::make_shared<detail::OpState>();
    OpHandle h(op->state);
    check_api(peer, static_cast<uint16_t>(kind), op->state);
    if (!h.ready() && lane != -1 && (lane < 0 || lane >= cfg_.lanes))
      op->state->finish(make_error(FailKind::kTransport, fmt::format("transport: no lane {} (lanes {})", lane, cfg_.lanes)),
                        0);
    if (!h.ready()) post([this, op] { enqueue_send(op); });
    return h;
  }

  OpHandle recv(int peer, FrameKind kind, uint64_t round, uint32_t shard, std::span<uint8_t> dest) {
    auto op = std::make_shared<RecvOp>();
    op->peer = peer;
    op->key = Key{static_cast<uint16_t>(kind), round, shard};
    op->dest = dest;
    op->state = std::make_shared<detail::OpState>();
    OpHandle h(op->state);
    check_api(peer, static_cast<uint16_t>(kind), op->state);
    if (!h.ready()) post([this, op] { post_recv(op); });
    return h;
  }

  TransportStats stats() const {
    std::lock_guard<std::mutex> lock(stats_mu_);
    return stats_;
  }

  std::vector<std::string> ucx_settings() const {
    std::lock_guard<std::mutex> lock(info_mu_);
    return ucx_notes_;
  }

  const Identity& self() const { return self_; }
  int lanes() const { return cfg_.lanes; }
  void set_active_lanes(int n) {
    if (n < 1 || n > cfg_.lanes)
      throw TransportError(fmt::format("transport: {} active lanes requested, expected 1..{}", n, cfg_.lanes));
    active_lanes_.store(n);
  }
  int active_lanes() const { return active_lanes_.load(); }
  const std::vector<PeerInfo>& peers() const { return peer_infos_; }
  int peer_index(const std::string& site, int rank) const {
    for (size_t i = 0; i < peer_infos_.size(); ++i)
      if (peer_infos_[i].site == site && peer_infos_[i].rank == rank) return static_cast<int>(i);
    return -1;
  }

 private:
  void post(std::function<void()> fn) {
    {
      std::lock_guard<std::mutex> lock(cmd_mu_);
      cmds_.push_back(std::move(fn));
    }
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_fd_, &one, sizeof(one));
  }

  void check_api(int peer, uint16_t kind, const std::shared_ptr<detail::OpState>& st) {
    bool ok;
    {
      std::lock_guard<std::mutex> lock(info_mu_);
      ok = info_ready_;
    }
    if (!ok) {
      st->finish(make_error(FailKind::kTransport, "transport: send/recv before connect() succeeded"), 0);
    } else if (peer < 0 || static_cast<size_t>(peer) >= peer_infos_.size()) {
      st->finish(make_error(FailKind::kTransport, fmt::format("transport: no peer with index {}", peer)), 0);
    } else if (!is_valid_kind(kind)) {
      st->finish(make_error(FailKind::kTransport, fmt::format("transport: invalid frame kind {}", kind)), 0);
    }
  }

  // ---- progress thread ----------------------------------------------------------------

  void run() {
    int idle_spins = 0;
    while (true) {
      bool busy = false;
      if (worker_) {
        while (ucp_worker_progress(worker_->get()) != 0) busy = true;
      }
      busy |= run_commands();
      if (stopping_) break;
      process_failures();
      // pump_sends() books the emulator's next release with next_timer(); check_timers()
      // starts its own list, so keep the release and sleep until whichever comes first
      // (otherwise emulated delays were rounded up to the 50 ms poll interval).
      next_timer_ = {};
      busy |= pump_all_sends();
      const Clock::time_point release = next_timer_;
      Clock::time_point next = check_timers();
      if (release != Clock::time_point{} && (next == Clock::time_point{} || release < next)) next = release;
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

  bool has_active_ops() const {
    for (const auto& p : peers_)
      if (!p.sendq.empty() || !p.recvs.empty() || p.inflight > 0) return true;
    return false;
  }

  void wait_for_events(Clock::time_point next) {
    auto now = Clock::now();
    int timeout_ms = 50;
    if (next != Clock::time_point{}) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(next - now).count();
      timeout_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, 50));
    }
    if (worker_) {
      ucs_status_t st = ucp_worker_arm(worker_->get());
      if (st == UCS_ERR_BUSY) return;  // events pending: progress again
    }
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

  bool run_commands() {
    std::deque<std::function<void()>> cmds;
    {
      std::lock_guard<std::mutex> lock(cmd_mu_);
      cmds.swap(cmds_);
    }
    for (auto& c : cmds) c();
    return !cmds.empty();
  }

  // ---- setup ----------------------------------------------------------------------------

  int do_listen(const std::string& host, int port) {
    if (listener_) throw TransportError("transport: listen() called twice");
    ucx::Config config;
    auto notes = apply_ucx_defaults(config, host);
    context_ = std::make_unique<ucx::Context>(config);
    worker_ = std::make_unique<ucx::Worker>(*context_);
    set_am_handler(kAmHandshake, &Impl::on_handshake_am, UCP_AM_FLAG_WHOLE_MSG);
    set_am_handler(kAmFrame, &Impl::on_frame_am, UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA);
    // UCX listens on an ephemeral port; the configured port is the gate's (gate.hpp says why).
    listener_ = std::make_unique<ucx::Listener>(*worker_, host, 0, &Impl::on_conn_request, this);
    auto gate = std::make_unique<Gate>(host, port, self_, cfg_, version_, listener_->port());
    int gate_port = gate->port();
    {
      std::lock_guard<std::mutex> lock(info_mu_);
      gate_ = std::move(gate);
    }
    listen_host_ = host;
    for (const auto& n : notes) spdlog::debug("transport: ucx {}", n);
    {
      std::lock_guard<std::mutex> lock(info_mu_);
      ucx_notes_ = notes;
    }
    spdlog::info("transport: {}/{} listening on {}:{} (ucx {})", self_.site, self_.rank, host, gate_port,
                 listener_->port());
    return gate_port;
  }

  void set_am_handler(unsigned id, ucp_am_recv_callback_t cb, uint32_t flags) {
    ucp_am_handler_param_t p{};
    p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                   UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
    p.id = id;
    p.cb = cb;
    p.arg = this;
    p.flags = flags;
    check_ucs(ucp_worker_set_am_recv_handler(worker_->get(), &p), fmt::format("set active message handler {}", id));
  }

  void do_connect(std::vector<PeerInfo> peers, const std::vector<int>& ucx_ports,
                  const std::vector<std::string>& gate_errors, Clock::time_point deadline,
                  std::shared_ptr<detail::OpState> pr) {
    if (!worker_) throw TransportError("transport: connect() before listen()");
    connect_started_ = true;
    peer_infos_ = peers;  // read by API threads only after connect() returns
    auto now = Clock::now();
    connect_deadline_ = deadline;
    connect_promise_ = std::move(pr);
    for (size_t i = 0; i < peers.size(); ++i) {
      const PeerInfo& info = peers[i];
      Peer p;
      p.info = info;
      p.we_dial = dials(self_, info);
      p.ucx_port = ucx_ports[i];
      p.last_error = gate_errors[i];
      p.lane_ep.assign(cfg_.lanes, nullptr);
      p.redial_at.assign(cfg_.lanes, now);
      p.dial_active.assign(cfg_.lanes, false);
      p.stats.site = info.site;
      p.stats.rank = info.rank;
      p.stats.lane_bytes_sent.assign(static_cast<size_t>(cfg_.lanes), 0);
      peers_.push_back(std::move(p));
    }
    publish_stats();
    // Hellos that arrived before we knew our peers.
    for (auto& [h, rec] : eps_) {
      if (rec->pending_hello) {
        HsMessage m = std::move(*rec->pending_hello);
        rec->pending_hello.reset();
        on_hello(*rec, m);
      }
    }
    check_connect_done();
  }

  int find_peer(const std::string& site, int rank) const {
    for (size_t i = 0; i < peers_.size(); ++i)
      if (peers_[i].info.site == site && peers_[i].info.rank == rank) return static_cast<int>(i);
    return -1;
  }

  void dial(int pi, int lane) {
    Peer& p = peers_[pi];
    p.dial_active[lane] = true;
    struct sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(p.ucx_port));
    if (inet_pton(AF_INET, p.info.host.c_str(), &sa.sin_addr) != 1) {
      p.fatal = fmt::format("peer {}: host '{}' is not an IPv4 address", p.info.name(), p.info.host);
      return;
    }
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const struct sockaddr*>(&sa);
    ep.sockaddr.addrlen = sizeof(sa);
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &Impl::on_ep_error;
    ep.err_handler.arg = this;
    ucp_ep_h h = nullptr;
    ucs_status_t st = ucp_ep_create(worker_->get(), &ep, &h);
    if (st != UCS_OK) {
      p.last_error = fmt::format("dial lane {}: {}", lane, ucs_status_string(st));
      p.dial_active[lane] = false;
      p.redial_at[lane] = Clock::now() + std::chrono::milliseconds(200);
      return;
    }
    auto rec = std::make_unique<EpRec>();
    rec->ep = std::make_unique<ucx::Endpoint>(worker_->get(), h);
    rec->dialer = true;
    rec->peer = pi;
    rec->lane = lane;
    rec->state = EpState::kAwaitAck;
    rec->my_nonce = random_nonce();
    rec->hs_deadline = Clock::now() + seconds(cfg_.handshake_timeout_s);
    rec->remote = fmt::format("{}:{}", p.info.host, p.ucx_port);
    EpRec& r = *rec;
    eps_[h] = std::move(rec);
    HsMessage hello = my_hello(HsType::kHello, lane, r.my_nonce);
    send_hs(r, hello, false);
  }

  HsMessage my_hello(HsType type, int lane, const Nonce& nonce) const {
    HsMessage m;
    m.version = version_;
    m.type = type;
    m.run_id = self_.run_id;
    m.config_hash = self_.config_hash;
    m.chunk_bytes = cfg_.chunk_bytes;
    m.lanes = static_cast<uint16_t>(cfg_.lanes);
    m.lane = static_cast<uint16_t>(lane);
    m.site = self_.site;
    m.rank = self_.rank;
    m.nonce = nonce;
    return m;
  }

  // ---- handshake --------------------------------------------------------------------------

  struct HsSend {
    Impl* impl;
    std::vector<uint8_t> buf;
  };

  void send_hs(EpRec& rec, const HsMessage& m, bool close_after) {
    auto ctx = std::make_unique<HsSend>(HsSend{this, m.encode()});
    ucp_request_param_t p{};
    p.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    p.flags = UCP_AM_SEND_FLAG_REPLY;
    p.cb.send = [](void* req, ucs_status_t, void* user) {
      delete static_cast<HsSend*>(user);
      ucp_request_free(req);
    };
    p.user_data = ctx.get();
    void* r = ucp_am_send_nbx(rec.ep->get(), kAmHandshake, nullptr, 0, ctx->buf.data(), ctx->buf.size(), &p);
    if (UCS_PTR_IS_PTR(r)) ctx.release();  // freed by the callback
    if (close_after) kill_ep(rec, /*force=*/false);
  }

  // Refuse a connection: log the reason, tell the other side, close after the reject flushed.
  void refuse(EpRec& rec, const std::string& reason) {
    std::string who = rec.peer >= 0 ? peers_[rec.peer].info.name() : rec.remote;
    spdlog::warn("transport: refused connection with {}: {}", who, reason);
    {
      std::lock_guard<std::mutex> lock(stats_mu_);
      ++stats_.handshakes_refused;
    }
    HsMessage rej;
    rej.version = version_;
    rej.type = HsType::kReject;
    rej.reason = reason;
    send_hs(rec, rej, true);
  }

  static ucs_status_t on_handshake_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                      const ucp_am_recv_param_t* param) {
    auto* self = static_cast<Impl*>(arg);
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return UCS_OK;
    auto it = self->eps_.find(param->reply_ep);
    if (it == self->eps_.end() || it->second->state == EpState::kDead) return UCS_OK;
    EpRec& rec = *it->second;
    if (header_length != 0 || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length > kMaxHandshakeBytes) {
      self->refuse(rec, fmt::format("oversized or malformed handshake message ({} bytes)", length));
      return UCS_OK;
    }
    self->on_hs_message(rec, std::span<const uint8_t>(static_cast<const uint8_t*>(data), length));
    return UCS_OK;
  }

  void on_hs_message(EpRec& rec, std::span<const uint8_t> bytes) {
    HsDecoded d = decode_handshake(bytes, version_);
    if (!d.msg) {
      if (rec.dialer) note_fatal(rec, d.error);
      refuse(rec, d.error);
      return;
    }
    HsMessage& m = *d.msg;
    if (m.type == HsType::kReject) {
      std::string who = rec.peer >= 0 ? peers_[rec.peer].info.name() : rec.remote;
      std::string msg = fmt::format("refused by {}: {}", who, m.reason);
      spdlog::warn("transport: {}", msg);
      {
        std::lock_guard<std::mutex> lock(stats_mu_);
        ++stats_.handshakes_refused;
      }
      if (rec.peer >= 0) {
        if (rec.dialer && !connected_)
          peers_[rec.peer].fatal = msg;
        else
          peers_[rec.peer].last_error = msg;
      }
      kill_ep(rec, true);
      return;
    }
    switch (rec.state) {
      case EpState::kAwaitHello:
        if (m.type != HsType::kHello) return refuse(rec, "expected hello");
        if (!connect_started_) {
          rec.pending_hello = std::move(m);
          return;
        }
        on_hello(rec, m);
        return;
      case EpState::kAwaitAck:
        if (m.type != HsType::kHelloAck) return refuse_fatal(rec, "expected hello-ack");
        on_hello_ack(rec, m);
        return;
      case EpState::kAwaitAuth:
        if (m.type != HsType::kAuth) return refuse(rec, "expected auth");
        on_auth(rec, m);
        return;
      case EpState::kAwaitAuthOk:
        if (m.type != HsType::kAuthOk) return refuse_fatal(rec, "expected auth-ok");
        lane_ready(rec);
        return;
      case EpState::kReady:
        if (m.type == HsType::kBye && rec.peer >= 0) {
          spdlog::info("transport: peer {} shut down", peers_[rec.peer].info.name());
          fail_peer(rec.peer, FailKind::kTransport, fmt::format("peer {} shut down", peers_[rec.peer].info.name()),
                    /*quiet=*/true);
          return;
        }
        return refuse(rec, "unexpected handshake message on an established connection");
      case EpState::kDead:
        return;
    }
  }

  void note_fatal(EpRec& rec, const std::string& reason) {
    if (rec.peer >= 0 && !connected_)
      peers_[rec.peer].fatal = fmt::format("handshake with {} failed: {}", peers_[rec.peer].info.name(), reason);
  }
  void refuse_fatal(EpRec& rec, const std::string& reason) {
    note_fatal(rec, reason);
    refuse(rec, reason);
  }

  HsTranscript transcript(const EpRec& rec, const std::string& peer_site, int peer_rank) const {
    HsTranscript t;
    t.run_id = self_.run_id;
    t.config_hash = self_.config_hash;
    t.lane = static_cast<uint16_t>(rec.lane);
    if (rec.dialer) {
      t.dialer_site = self_.site, t.dialer_rank = self_.rank;
      t.listener_site = peer_site, t.listener_rank = peer_rank;
      t.dialer_nonce = rec.my_nonce, t.listener_nonce = rec.peer_nonce;
    } else {
      t.dialer_site = peer_site, t.dialer_rank = peer_rank;
      t.listener_site = self_.site, t.listener_rank = self_.rank;
      t.dialer_nonce = rec.peer_nonce, t.listener_nonce = rec.my_nonce;
    }
    return t;
  }

  // Listener side: a dialer introduced itself.
  void on_hello(EpRec& rec, const HsMessage& m) {
    int pi = find_peer(m.site, m.rank);
    std::string claimed = fmt::format("{}/{} from {}", m.site, m.rank, rec.remote);
    if (pi < 0) return refuse(rec, fmt::format("{} is not one of our peers", claimed));
    Peer& p = peers_[pi];
    auto bad = [&](const std::string& why) {
      p.last_error = fmt::format("refused {}: {}", claimed, why);
      refuse(rec, why);
    };
    if (p.we_dial) return bad("we dial this peer, it must not dial us");
    if (p.failed) return bad("peer already failed: " + p.failure);
    if (std::string e = hello_mismatch(m, self_, cfg_); !e.empty()) return bad(e);
    // hello_mismatch lets the gate's lane through; a UCX lane must index lane_ep.
    if (m.lane >= cfg_.lanes) return bad(fmt::format("lane {} out of range (lanes {})", m.lane, cfg_.lanes));
    if (p.lane_ep[m.lane] != nullptr) return bad(fmt::format("lane {} is already connected", m.lane));
    rec.peer = pi;
    rec.lane = m.lane;
    rec.peer_nonce = m.nonce;
    rec.my_nonce = random_nonce();
    HsMessage ack = my_hello(HsType::kHelloAck, m.lane, rec.my_nonce);
    ack.mac = compute_mac(cfg_.psk, transcript(rec, m.site, m.rank), "listener");
    rec.state = EpState::kAwaitAuth;
    send_hs(rec, ack, false);
  }

  // Dialer side: the listener answered; check it is who we dialed and that it knows the key.
  void on_hello_ack(EpRec& rec, const HsMessage& m) {
    Peer& p = peers_[rec.peer];
    if (m.site != p.info.site || m.rank != p.info.rank)
      return refuse_fatal(rec, fmt::format("dialed {} but {}/{} answered", p.info.name(), m.site, m.rank));
    if (std::string e = hello_mismatch(m, self_, cfg_); !e.empty()) return refuse_fatal(rec, e);
    if (m.lane != rec.lane) return refuse_fatal(rec, fmt::format("lane mismatch: asked {}, got {}", rec.lane, m.lane));
    rec.peer_nonce = m.nonce;
    HsTranscript t = transcript(rec, m.site, m.rank);
    if (!mac_equal(m.mac, compute_mac(cfg_.psk, t, "listener")))
      return refuse_fatal(rec, "authentication failed: the listener's HMAC does not verify (different pre-shared key?)");
    HsMessage auth;
    auth.version = version_;
    auth.type = HsType::kAuth;
    auth.mac = compute_mac(cfg_.psk, t, "dialer");
    rec.state = EpState::kAwaitAuthOk;
    send_hs(rec, auth, false);
  }

  // Listener side: the dialer proved it knows the key.
  void on_auth(EpRec& rec, const HsMessage& m) {
    Peer& p = peers_[rec.peer];
    if (!mac_equal(m.mac, compute_mac(cfg_.psk, transcript(rec, p.info.site, p.info.rank), "dialer"))) {
      p.last_error = fmt::format("refused {} from {}: authentication failed", p.info.name(), rec.remote);
      return refuse(rec, "authentication failed: the dialer's HMAC does not verify (different pre-shared key?)");
    }
    if (p.lane_ep[rec.lane] != nullptr) return refuse(rec, fmt::format("lane {} is already connected", rec.lane));
    HsMessage ok;
    ok.version = version_;
    ok.type = HsType::kAuthOk;
    send_hs(rec, ok, false);
    lane_ready(rec);
  }

  void lane_ready(EpRec& rec) {
    Peer& p = peers_[rec.peer];
    rec.state = EpState::kReady;
    p.lane_ep[rec.lane] = rec.ep->get();
    p.dial_active[rec.lane] = false;
    spdlog::info("transport: connected to {} lane {} ({})", p.info.name(), rec.lane, rec.dialer ? "dialed" : "accepted");
    check_connect_done();
  }

  void check_connect_done() {
    if (!connect_promise_) return;
    std::vector<std::string> missing;
    for (auto& p : peers_) {
      if (!p.fatal.empty()) return finish_connect(make_error(FailKind::kHandshake, p.fatal));
      if (p.failed) return finish_connect(make_error(p.fail_kind, p.failure));
      if (p.ready_lanes() != p.lane_ep.size()) {
        std::string last = p.last_error.empty() ? gate_->refusal_for(p.info.site, p.info.rank) : p.last_error;
        missing.push_back(fmt::format("{} ({}/{} lanes{}{})", p.info.name(), p.ready_lanes(), p.lane_ep.size(),
                                      last.empty() ? "" : "; last error: ", last));
      }
    }
    if (missing.empty()) {
      connected_ = true;
      return finish_connect(nullptr);
    }
    if (Clock::now() >= connect_deadline_)
      finish_connect(make_error(FailKind::kTimeout,
                                fmt::format("transport {}/{}: connect timed out after {} s; not connected: {}", self_.site,
                                            self_.rank, cfg_.connect_timeout_s, fmt::join(missing, "; "))));
  }

  void finish_connect(std::exception_ptr e) {
    auto pr = std::move(connect_promise_);
    connect_promise_.reset();
    if (e) {
      // Nothing half-connected survives a failed connect.
      std::string what = "connect failed";
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& x) {
        what = x.what();
      }
      for (size_t i = 0; i < peers_.size(); ++i) fail_peer(static_cast<int>(i), FailKind::kTransport, what, /*quiet=*/true);
      for (auto& [h, rec] : eps_) kill_ep(*rec, true);
      pr->finish(e, 0);
    } else {
      pr->finish(nullptr, 0);
    }
  }

  static void on_conn_request(ucp_conn_request_h req, void* arg) {
    auto* self = static_cast<Impl*>(arg);
    ucp_conn_request_attr_t attr{};
    attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
    std::string remote = "?";
    if (ucp_conn_request_query(req, &attr) == UCS_OK) remote = ucx::sockaddr_to_string(attr.client_address);
    size_t pending = 0;
    for (auto& [h, rec] : self->eps_)
      if (rec->state != EpState::kReady && rec->state != EpState::kDead) ++pending;
    if (self->connected_ || self->stopping_ || pending >= kMaxPendingHandshakes) {
      spdlog::warn("transport: rejected connection request from {} ({})", remote,
                   self->connected_ ? "all peers already connected" : "too many pending handshakes");
      ucp_listener_reject(self->listener_->get(), req);
      return;
    }
    ucp_ep_params_t ep{};
    ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    ep.conn_request = req;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = &Impl::on_ep_error;
    ep.err_handler.arg = self;
    ucp_ep_h h = nullptr;
    ucs_status_t st = ucp_ep_create(self->worker_->get(), &ep, &h);
    if (st != UCS_OK) {
      spdlog::warn("transport: accepting connection from {} failed: {}", remote, ucs_status_string(st));
      return;
    }
    auto rec = std::make_unique<EpRec>();
    rec->ep = std::make_unique<ucx::Endpoint>(self->worker_->get(), h);
    rec->state = EpState::kAwaitHello;
    rec->hs_deadline = Clock::now() + seconds(self->cfg_.handshake_timeout_s);
    rec->remote = remote;
    self->eps_[h] = std::move(rec);
  }

  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
    auto* self = static_cast<Impl*>(arg);
    auto it = self->eps_.find(ep);
    if (it == self->eps_.end()) return;
    EpRec& rec = *it->second;
    if (rec.state == EpState::kDead) return;
    if (rec.peer >= 0) {
      Peer& p = self->peers_[rec.peer];
      if (rec.state == EpState::kReady) {
        self->fail_peer(rec.peer, FailKind::kTransport,
                        fmt::format("connection to peer {} lost (lane {}): {}", p.info.name(), rec.lane,
                                    ucs_status_string(status)));
      } else {
        p.last_error = fmt::format("lane {} {}: {}", rec.lane, rec.dialer ? "dial" : "handshake", ucs_status_string(status));
      }
    } else {
      spdlog::debug("transport: connection from {} failed before the handshake: {}", rec.remote,
                    ucs_status_string(status));
    }
    self->kill_ep(rec, true);
  }

  // Marks an endpoint dead; the close itself happens in reap_endpoints (never inside a
  // UCX callback of that endpoint).
  void kill_ep(EpRec& rec, bool force) {
    if (rec.state == EpState::kReady && rec.peer >= 0) {
      Peer& p = peers_[rec.peer];
      if (p.lane_ep[rec.lane] == rec.ep->get()) p.lane_ep[rec.lane] = nullptr;
    }
    if (rec.dialer && rec.peer >= 0 && rec.state != EpState::kReady && rec.state != EpState::kDead) {
      Peer& p = peers_[rec.peer];
      p.dial_active[rec.lane] = false;
      p.redial_at[rec.lane] = Clock::now() + std::chrono::milliseconds(200);
    }
    rec.state = EpState::kDead;
    rec.close_requested = true;
    close_force_.insert({rec.ep->get(), force});
  }

  void reap_endpoints() {
    for (auto [h, force] : close_force_) {
      auto it = eps_.find(h);
      if (it != eps_.end()) it->second->ep->close(force);
    }
    close_force_.clear();
    for (auto it = eps_.begin(); it != eps_.end();) {
      if (it->second->close_requested && it->second->ep->closed())
        it = eps_.erase(it);
      else
        ++it;
    }
  }

  // ---- frames: receive side -------------------------------------------------------------

  static ucs_status_t on_frame_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                  const ucp_am_recv_param_t* param) {
    return static_cast<Impl*>(arg)->on_frame(header, header_length, data, length, param);
  }

  void count_unauthenticated(const std::string& why) {
    std::lock_guard<std::mutex> lock(stats_mu_);
    if (stats_.frames_rejected_unauthenticated++ < 10) spdlog::warn("transport: dropped frame: {}", why);
  }

  ucs_status_t on_frame(const void* header, size_t header_length, void* data, size_t length,
                        const ucp_am_recv_param_t* param) {
    if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
      count_unauthenticated("frame without a sender endpoint");
      return UCS_OK;
    }
    auto it = eps_.find(param->reply_ep);
    if (it == eps_.end() || it->second->state != EpState::kReady || it->second->peer < 0) {
      count_unauthenticated(fmt::format("frame on an unauthenticated connection from {}",
                                        it == eps_.end() ? std::string("?") : it->second->remote));
      return UCS_OK;
    }
    int pi = it->second->peer;
    Peer& p = peers_[pi];
    if (p.failed) return UCS_OK;
    bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
    bool persistent = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0;
    auto hdr = FrameHeader::decode(std::span<const uint8_t>(static_cast<const uint8_t*>(header), header_length));
    if (!hdr) {
      reject_frame(pi, fmt::format("header: {} bytes, expected {}", header_length, kFrameHeaderBytes));
      return UCS_OK;
    }
    const FrameHeader& h = *hdr;
    Key key{h.kind, h.round, h.shard};
    if (std::string e = validate_header(h, length, cfg_.chunk_bytes, cfg_.max_message_bytes); !e.empty()) {
      reject_frame(pi, fmt::format("{} ({}, offset {})", e, key_str(key), h.offset));
      return UCS_OK;
    }
    if (h.kind == static_cast<uint16_t>(FrameKind::kCredit)) {
      on_credit(pi, h.round);
      return UCS_OK;
    }
    if (p.completed.count(key)) {
      reject_frame(pi, fmt::format("replayed frame: {} already completed (offset {})", key_str(key), h.offset));
      return UCS_OK;
    }
    if (auto r = p.recvs.find(key); r != p.recvs.end()) {
      auto op = r->second;  // keep alive: accept_chunk may complete and erase it
      accept_chunk(op, h, data, rndv);
      return UCS_OK;  // an unconsumed rendezvous descriptor is dropped by UCX
    }
    if (!rndv && p.unexpected_eager_bytes + length > kMaxUnexpectedEagerBytes) {
      reject_frame(pi, fmt::format("more than {} bytes of eager frames arrived before their recv was posted ({})",
                                   kMaxUnexpectedEagerBytes, key_str(key)));
      return UCS_OK;
    }
    if (p.unexpected_count >= kMaxUnexpectedFrames) {
      reject_frame(pi, fmt::format("more than {} frames arrived before their recv was posted ({})",
                                   kMaxUnexpectedFrames, key_str(key)));
      return UCS_OK;
    }
    // Not posted yet: keep UCX's descriptor (no copy, no allocation sized by the peer).
    Unexpected u{h, nullptr, length, rndv};
    ucs_status_t ret = UCS_OK;
    if (length > 0) {
      if (!rndv && !persistent) {
        reject_frame(pi, "internal: non-persistent eager data");  // PERSISTENT_DATA is requested
        return UCS_OK;
      }
      u.data = data;
      ret = UCS_INPROGRESS;
    } else if (rndv) {
      u.data = data;
      ret = UCS_INPROGRESS;
    }
    p.unexpected[key].push_back(u);
    ++p.unexpected_count;
    if (!rndv) p.unexpected_eager_bytes += length;
    return ret;
  }

  void reject_frame(int pi, const std::string& why) {
    Peer& p = peers_[pi];
    ++p.stats.frames_rejected;
    fail_peer(pi, FailKind::kFrame, fmt::format("frame from peer {} rejected: {}", p.info.name(), why));
  }

  // Validates a frame against its posted recv and starts the copy/receive. `data` is eager
  // bytes (copied now) or a rendezvous descriptor. Returns true when a rendezvous
  // descriptor was handed to ucp_am_recv_data_nbx (UCX owns it then).
  bool accept_chunk(const std::shared_ptr<RecvOp>& opp, const FrameHeader& h, void* data, bool rndv) {
    RecvOp& op = *opp;
    Peer& p = peers_[op.peer];
    if (h.total_length > op.dest.size())
      return reject_frame_false(op.peer, fmt::format("total_length: {} exceeds the receive buffer of {} bytes ({})",
                                               h.total_length, op.dest.size(), key_str(op.key)));
    if (!op.have_total) {
      op.have_total = true;
      op.total = h.total_length;
      op.nchunks = chunk_count(op.total, cfg_.chunk_bytes);
      op.seen.assign(op.nchunks, false);  // bounded by dest.size() / chunk_bytes + 1
    } else if (h.total_length != op.total) {
      return reject_frame_false(op.peer, fmt::format("total_length: changed from {} to {} ({})", op.total, h.total_length,
                                               key_str(op.key)));
    }
    uint64_t idx = h.offset / cfg_.chunk_bytes;
    if (op.seen[idx])
      return reject_frame_false(op.peer, fmt::format("offset: duplicate chunk at offset {} (replay) ({})", h.offset,
                                               key_str(op.key)));
    op.seen[idx] = true;
    ++op.got;
    if (h.flags & kFrameFlagEagerCredit) op.credit_bytes += h.length;
    op.last_progress = Clock::now();
    uint8_t* dst = op.dest.data() + h.offset;
    if (rndv) {
      ++p.stats.frames_received_rndv;
      auto* ctx = new RecvChunk{this, opp, h};
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
      prm.cb.recv_am = &Impl::on_chunk_received;
      prm.user_data = ctx;
      ++op.inflight;
      void* r = ucp_am_recv_data_nbx(worker_->get(), data, dst, h.length, &prm);
      if (UCS_PTR_IS_ERR(r)) {
        --op.inflight;
        delete ctx;
        fail_peer(op.peer, FailKind::kTransport,
                  fmt::format("receiving from peer {} failed: {}", p.info.name(), ucs_status_string(UCS_PTR_STATUS(r))));
        return true;
      }
      if (r == nullptr) {
        --op.inflight;
        delete ctx;
        chunk_done(op, h);
      }
      return true;
    }
    if (h.length > 0) std::memcpy(dst, data, h.length);
    chunk_done(op, h);
    return false;
  }

  bool reject_frame_false(int pi, const std::string& why) {
    reject_frame(pi, why);
    return false;
  }


  struct RecvChunk {
    Impl* impl;
    std::shared_ptr<RecvOp> op;
    FrameHeader h;
  };

  static void on_chunk_received(void* request, ucs_status_t status, size_t length, void* user) {
    auto* ctx = static_cast<RecvChunk*>(user);
    Impl* self = ctx->impl;
    if (ctx->op) {
      RecvOp& op = *ctx->op;
      --op.inflight;
      if (status != UCS_OK) {
        self->fail_peer(op.peer, FailKind::kTransport,
                        fmt::format("receiving {} from peer {} failed: {}", key_str(op.key),
                                    self->peers_[op.peer].info.name(), ucs_status_string(status)));
        self->maybe_finish_recv(op);
      } else if (length != ctx->h.length) {
        self->reject_frame(op.peer, fmt::format("length: received {} bytes, header said {}", length, ctx->h.length));
        self->maybe_finish_recv(op);
      } else {
        self->chunk_done(op, ctx->h);
      }
    }
    delete ctx;
    ucp_request_free(request);
  }

  void chunk_done(RecvOp& op, const FrameHeader& h) {
    Peer& p = peers_[op.peer];
    if (!op.failed) {
      uint64_t sum = chunk_checksum(std::span<const uint8_t>(op.dest.data() + h.offset, h.length));
      if (sum != h.checksum) {
        reject_frame(op.peer, fmt::format("checksum: mismatch at offset {} length {} ({}): header {}, data {}", h.offset,
                                          h.length, key_str(op.key), hex64(h.checksum), hex64(sum)));
      } else {
        ++op.verified;
        op.last_progress = Clock::now();
        p.stats.bytes_received += h.length;
        ++p.stats.frames_received;
      }
    }
    maybe_finish_recv(op);
  }

  void maybe_finish_recv(RecvOp& op) {
    if (op.inflight > 0) return;
    Peer& p = peers_[op.peer];
    if (op.failed) {
      op.state->finish(op.error, 0);
    } else if (op.have_total && op.verified == op.nchunks) {
      p.completed.insert(op.key);
      send_credit(op.peer, op.credit_bytes);  // the eager bytes are ours now, not parked
      op.credit_bytes = 0;
      publish_stats();
      op.state->finish(nullptr, op.total);
    } else {
      return;
    }
    auto it = p.recvs.find(op.key);
    if (it != p.recvs.end() && it->second.get() == &op) p.recvs.erase(it);
    failed_recvs_.erase(std::remove_if(failed_recvs_.begin(), failed_recvs_.end(),
                                       [&](const std::shared_ptr<RecvOp>& o) { return o.get() == &op; }),
                        failed_recvs_.end());
  }

  void post_recv(std::shared_ptr<RecvOp> op) {
    Peer& p = peers_[op->peer];
    if (p.failed) return op->state->finish(make_error(p.fail_kind, p.failure), 0);
    if (p.recvs.count(op->key) || p.completed.count(op->key))
      return op->state->finish(make_error(FailKind::kTransport,
                                          fmt::format("recv {} from peer {}: already posted or completed",
                                                      key_str(op->key), p.info.name())),
                               0);
    op->last_progress = Clock::now();
    p.recvs[op->key] = op;
    auto u = p.unexpected.find(op->key);
    if (u == p.unexpected.end()) return;
    std::deque<Unexpected> held = std::move(u->second);
    p.unexpected.erase(u);
    p.unexpected_count -= held.size();
    for (const auto& e : held)
      if (!e.rndv) p.unexpected_eager_bytes -= e.length;
    while (!held.empty()) {
      Unexpected e = held.front();
      held.pop_front();
      if (p.failed) {
        release(e);
        continue;
      }
      // Eager descriptors were copied (or rejected) and must be released; rendezvous ones
      // belong to ucp_am_recv_data_nbx once handed over.
      if (!accept_chunk(op, e.h, e.data, e.rndv)) release(e);
    }
    for (auto& e : held) release(e);
  }

  void release(const Unexpected& e) {
    if (e.data != nullptr) ucp_am_data_release(worker_->get(), e.data);
  }

  // ---- frames: send side ------------------------------------------------------------------

  void enqueue_send(std::shared_ptr<SendOp> op) {
    Peer& p = peers_[op->peer];
    if (p.failed) return op->state->finish(make_error(p.fail_kind, p.failure), 0);
    if (p.active_sends.count(op->key))
      return op->state->finish(make_error(FailKind::kTransport, fmt::format("send {} to peer {}: already in progress",
                                                                            key_str(op->key), p.info.name())),
                               0);
    op->nchunks = chunk_count(op->payload.size(), cfg_.chunk_bytes);
    op->enqueued = Clock::now();
    if (p.sendq.empty()) p.send_progress = op->enqueued;
    p.active_sends.insert(op->key);
    p.sendq.push_back(std::move(op));
  }

  struct ChunkGroup {
    int left = 1;  // frames of this chunk still in flight
    ucs_status_t status = UCS_OK;
    uint64_t length = 0;
    int lane = -1;  // the lane its (last) frame went out on
  };

  struct SendChunk {
    Impl* impl;
    std::shared_ptr<SendOp> op;
    uint8_t header[kFrameHeaderBytes];
    std::vector<uint8_t> hdr_override;
    std::vector<uint8_t> payload_override;
    std::shared_ptr<ChunkGroup> group;
  };

  // A message of at most eager_bytes goes eagerly when the peer's eager window has room: no
  // rendezvous handshake (request to send, ready to receive, data, acknowledgement: about two
  // round trips over TCP where eager takes half of one), so it arrives half a round trip
  // after it leaves. The window (kEagerWindowFactor x eager_bytes per peer) bounds what a
  // receiver may have to park for us before it posts the recv: it returns the bytes in a
  // credit frame once the message is received. A full window, or a longer message, is left
  // to UCX (rendezvous above its threshold), which moves data only once the receiver is
  // ready, so a sender that runs far ahead slows to the rendezvous instead of flooding the
  // peer. (An eager prefix of a long message measured worse than none: the tail's rendezvous
  // requests queue behind it on the connection.)
  void decide_eager(Peer& p, SendOp& op) {
    const uint64_t n = op.payload.size();
    const uint64_t window = kEagerWindowFactor * cfg_.eager_bytes;
    uint64_t& outstanding = p.stats.eager_bytes_outstanding;  // not yet credited back
    op.eager = n > 0 && n <= cfg_.eager_bytes && outstanding + n <= window;
    if (!op.eager) return;
    outstanding += n;
    ++p.stats.messages_sent_eager;
  }

  // Returns `bytes` of the peer's eager window (a header-only frame on its first ready lane).
  void send_credit(int pi, uint64_t bytes) {
    Peer& p = peers_[pi];
    if (p.failed || bytes == 0) return;
    ucp_ep_h ep = nullptr;
    for (ucp_ep_h e : p.lane_ep)
      if (e != nullptr) {
        ep = e;
        break;
      }
    if (ep == nullptr) return;  // the connection is going away; so is the window
    FrameHeader h;
    h.kind = static_cast<uint16_t>(FrameKind::kCredit);
    h.round = bytes;
    h.checksum = chunk_checksum({});
    auto hdr = std::make_unique<std::array<uint8_t, kFrameHeaderBytes>>();
    h.encode(hdr->data());
    ucp_request_param_t prm{};
    prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
    prm.flags = UCP_AM_SEND_FLAG_REPLY | UCP_AM_SEND_FLAG_EAGER;
    prm.cb.send = [](void* request, ucs_status_t, void* user) {
      delete static_cast<std::array<uint8_t, kFrameHeaderBytes>*>(user);
      ucp_request_free(request);
    };
    prm.user_data = hdr.get();
    void* r = ucp_am_send_nbx(ep, kAmFrame, hdr->data(), kFrameHeaderBytes, nullptr, 0, &prm);
    if (UCS_PTR_IS_PTR(r)) hdr.release();  // freed by the callback
    // An immediate error means the endpoint is failing: its error callback fails the peer.
  }

  void on_credit(int pi, uint64_t bytes) {
    Peer& p = peers_[pi];
    uint64_t& outstanding = p.stats.eager_bytes_outstanding;
    if (bytes > outstanding) {
      reject_frame(pi, fmt::format("credit frame returns {} eager bytes, only {} are outstanding", bytes, outstanding));
      return;
    }
    outstanding -= bytes;
  }

  bool pump_all_sends() {
    bool any = false;
    for (size_t i = 0; i < peers_.size(); ++i) any |= pump_sends(static_cast<int>(i));
    return any;
  }

  bool pump_sends(int pi) {
    Peer& p = peers_[pi];
    bool any = false;
    auto now = Clock::now();
    while (!p.failed && !p.sendq.empty() && p.inflight < cfg_.inflight_chunks) {
      auto op = p.sendq.front();
      if (op->next_chunk == op->nchunks) {
        p.sendq.pop_front();  // fully issued; completes in the callbacks
        continue;
      }
      uint64_t off = op->next_chunk * cfg_.chunk_bytes;
      uint64_t len = std::min<uint64_t>(cfg_.chunk_bytes, op->payload.size() - std::min<uint64_t>(off, op->payload.size()));
      if (cfg_.emulate.enabled()) {
        if (!op->next_release) {
          // Sender-side link model: chunks serialize at rate_mbit from when the data was
          // handed to us, then arrive delay_ms later.
          auto start = std::max(op->enqueued, p.link_free);
          if (cfg_.emulate.rate_mbit > 0) start += seconds(static_cast<double>(len) * 8.0 / (cfg_.emulate.rate_mbit * 1e6));
          p.link_free = start;
          op->next_release = start + seconds(cfg_.emulate.delay_ms / 1000.0);
        }
        if (*op->next_release > now) {
          p.send_progress = now;  // held back by the emulated link, not stalled
          next_timer(*op->next_release);
          break;
        }
        op->next_release.reset();
      }
      if (op->next_chunk == 0) decide_eager(p, *op);
      issue_chunk(pi, op, off, len);
      ++op->next_chunk;
      any = true;
    }
    return any;
  }

  void issue_chunk(int pi, const std::shared_ptr<SendOp>& op, uint64_t off, uint64_t len) {
    Peer& p = peers_[pi];
    FrameHeader h;
    h.kind = std::get<0>(op->key);
    h.round = std::get<1>(op->key);
    h.shard = std::get<2>(op->key);
    h.offset = off;
    h.length = len;
    h.total_length = op->payload.size();
    auto chunk = std::span<const uint8_t>(op->payload.data() + off, len);
    h.checksum = chunk_checksum(chunk);
    if (op->eager) h.flags |= kFrameFlagEagerCredit;
    std::vector<TamperedFrame> frames;
    if (hooks_.tamper) {
      frames = hooks_.tamper(h, chunk);
    }
    int parts = hooks_.tamper ? static_cast<int>(frames.size()) : 1;
    ++op->inflight;
    ++p.inflight;
    if (parts == 0) {  // the hook dropped the chunk
      chunk_sent(op, UCS_OK, 0, -1);
      return;
    }
    auto group = std::make_shared<ChunkGroup>();
    group->left = parts;
    group->length = len;
    for (int i = 0; i < parts; ++i) {
      auto ctx = std::make_unique<SendChunk>();
      ctx->impl = this;
      ctx->op = op;
      ctx->group = group;
      const void* hdr = ctx->header;
      size_t hdr_len = kFrameHeaderBytes;
      const void* buf = chunk.data();
      size_t buf_len = len;
      if (hooks_.tamper) {
        ctx->hdr_override = frames[i].header;
        ctx->payload_override = frames[i].payload;
        hdr = ctx->hdr_override.data();
        hdr_len = ctx->hdr_override.size();
        buf = ctx->payload_override.data();
        buf_len = ctx->payload_override.size();
      } else {
        h.encode(ctx->header);
      }
      const size_t active = std::min(p.lane_ep.size(), static_cast<size_t>(std::max(1, active_lanes_.load())));
      const size_t lane = op->lane >= 0 ? static_cast<size_t>(op->lane) : p.rr++ % active;
      group->lane = static_cast<int>(lane);
      ucp_ep_h ep = p.lane_ep[lane];
      if (ep == nullptr) {
        finish_part(ctx.get(), UCS_ERR_NOT_CONNECTED);
        continue;
      }
      ucp_request_param_t prm{};
      prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
      prm.flags = UCP_AM_SEND_FLAG_REPLY;
      // decide_eager() says why and when a message goes eagerly.
      if (op->eager) prm.flags |= UCP_AM_SEND_FLAG_EAGER;
      prm.cb.send = &Impl::on_chunk_sent;
      prm.user_data = ctx.get();
      void* r = ucp_am_send_nbx(ep, kAmFrame, hdr, hdr_len, buf, buf_len, &prm);
      if (UCS_PTR_IS_PTR(r)) {
        ctx.release();
      } else {
        SendChunk* c = ctx.get();
        finish_part(c, UCS_PTR_STATUS(r));
      }
    }
  }

  // A chunk that became several frames (tamper hook) completes when its last frame does.
  void finish_part(SendChunk* c, ucs_status_t status) {
    ChunkGroup& g = *c->group;
    if (status != UCS_OK) g.status = status;
    if (--g.left == 0) chunk_sent(c->op, g.status, g.length, g.lane);
  }

  static void on_chunk_sent(void* request, ucs_status_t status, void* user) {
    auto* ctx = static_cast<SendChunk*>(user);
    ctx->impl->finish_part(ctx, status);
    delete ctx;
    ucp_request_free(request);
  }

  void chunk_sent(const std::shared_ptr<SendOp>& op, ucs_status_t status, uint64_t length, int lane) {
    Peer& p = peers_[op->peer];
    --op->inflight;
    --p.inflight;
    if (status != UCS_OK) {
      fail_peer(op->peer, FailKind::kTransport,
                fmt::format("sending {} to peer {} failed: {}", key_str(op->key), p.info.name(), ucs_status_string(status)));
    } else {
      ++op->done_chunks;
      p.stats.bytes_sent += length;
      if (lane >= 0 && static_cast<size_t>(lane) < p.stats.lane_bytes_sent.size())
        p.stats.lane_bytes_sent[static_cast<size_t>(lane)] += length;
      ++p.stats.frames_sent;
      p.send_progress = Clock::now();
    }
    maybe_finish_send(*op);
  }

  void maybe_finish_send(SendOp& op) {
    if (op.inflight > 0) return;
    Peer& p = peers_[op.peer];
    if (op.failed || p.failed) {
      op.state->finish(make_error(p.fail_kind, p.failure), 0);
    } else if (op.done_chunks == op.nchunks) {
      publish_stats();
      op.state->finish(nullptr, op.payload.size());
    } else {
      return;
    }
    p.active_sends.erase(op.key);
  }

  // ---- failures and timers --------------------------------------------------------------

  // Records the first failure of a peer; the teardown runs in process_failures (outside
  // UCX callbacks).
  void fail_peer(int pi, FailKind kind, const std::string& msg, bool quiet = false) {
    Peer& p = peers_[pi];
    if (p.failed) return;
    p.failed = true;
    p.fail_kind = kind;
    p.failure = msg;
    p.stats.failure = msg;
    if (!stopping_ && !quiet) spdlog::error("transport: {}", msg);
    for (auto& [k, op] : p.recvs) {
      if (!op->failed) {
        op->failed = true;
        op->failed_at = Clock::now();
        op->error = make_error(kind, msg);
        failed_recvs_.push_back(op);
      }
    }
    for (auto& op : p.sendq) op->failed = true;
    failures_pending_ = true;
  }

  void process_failures() {
    if (!failures_pending_) return;
    failures_pending_ = false;
    for (size_t i = 0; i < peers_.size(); ++i) {
      Peer& p = peers_[i];
      if (!p.failed || p.failure_processed) continue;
      p.failure_processed = true;
      for (auto& [h, rec] : eps_)
        if (rec->peer == static_cast<int>(i) && rec->state != EpState::kDead) kill_ep(*rec, true);
      for (auto& [k, q] : p.unexpected)
        for (auto& e : q) release(e);
      p.unexpected.clear();
      p.unexpected_count = 0;
      p.unexpected_eager_bytes = 0;
      // Sends not yet issued finish now; issued ones when UCX returns their requests.
      for (auto& op : p.sendq) {
        op->failed = true;
        maybe_finish_send(*op);
      }
      p.sendq.clear();
      auto recvs = p.recvs;
      for (auto& [k, op] : recvs) maybe_finish_recv(*op);
      check_connect_done();
    }
    publish_stats();
  }

  void next_timer(Clock::time_point t) {
    if (next_timer_ == Clock::time_point{} || t < next_timer_) next_timer_ = t;
  }

  Clock::time_point check_timers() {
    auto now = Clock::now();
    next_timer_ = {};
    if (connect_promise_) {
      for (size_t i = 0; i < peers_.size(); ++i) {
        Peer& p = peers_[i];
        if (!p.we_dial || p.ucx_port == 0 || p.failed || !p.fatal.empty()) continue;
        for (int l = 0; l < cfg_.lanes; ++l) {
          if (p.lane_ep[l] != nullptr || p.dial_active[l]) continue;
          if (now >= p.redial_at[l]) dial(static_cast<int>(i), l);
          else next_timer(p.redial_at[l]);
        }
      }
      check_connect_done();
      next_timer(connect_deadline_);
    }
    for (auto& [h, rec] : eps_) {
      if (rec->state == EpState::kReady || rec->state == EpState::kDead) continue;
      if (now >= rec->hs_deadline) {
        if (rec->peer >= 0) peers_[rec->peer].last_error = fmt::format("lane {} handshake timed out", rec->lane);
        refuse(*rec, fmt::format("handshake timed out after {} s", cfg_.handshake_timeout_s));
      } else {
        next_timer(rec->hs_deadline);
      }
    }
    auto timeout = seconds(cfg_.transfer_timeout_s);
    for (size_t i = 0; i < peers_.size(); ++i) {
      Peer& p = peers_[i];
      if (p.failed) continue;
      if (!p.sendq.empty() || p.inflight > 0) {
        if (now - p.send_progress > timeout)
          fail_peer(static_cast<int>(i), FailKind::kTimeout,
                    fmt::format("send to peer {} made no progress for {} s", p.info.name(), cfg_.transfer_timeout_s));
        else
          next_timer(p.send_progress + timeout);
      }
      for (auto& [k, op] : p.recvs) {
        if (now - op->last_progress > timeout) {
          fail_peer(static_cast<int>(i), FailKind::kTimeout,
                    fmt::format("recv {} from peer {} timed out: no data for {} s ({} of {} chunks)", key_str(k),
                                p.info.name(), cfg_.transfer_timeout_s, op->verified,
                                op->have_total ? std::to_string(op->nchunks) : std::string("?")));
          break;
        }
        next_timer(op->last_progress + timeout);
      }
    }
    // Recvs whose failure waits on UCX to give back in-flight receives.
    for (auto& op : std::vector<std::shared_ptr<RecvOp>>(failed_recvs_)) {
      if (op->inflight > 0 && now - op->failed_at > seconds(kCancelGraceS)) {
        spdlog::error("transport: UCX did not cancel {} receive(s) of {} within {} s; failing the handle anyway",
                      op->inflight, key_str(op->key), kCancelGraceS);
        op->inflight = 0;
        maybe_finish_recv(*op);
      }
    }
    publish_stats_throttled(now);
    return next_timer_;
  }

  void publish_stats() {
    uint64_t gate_refused = 0;
    {
      std::lock_guard<std::mutex> lock(info_mu_);
      if (gate_) gate_refused = gate_->refused();
    }
    std::lock_guard<std::mutex> lock(stats_mu_);
    stats_.gate_refused = gate_refused;
    stats_.peers.clear();
    for (auto& p : peers_) stats_.peers.push_back(p.stats);
  }
  void publish_stats_throttled(Clock::time_point now) {
    if (now - last_stats_ < std::chrono::milliseconds(20)) return;
    last_stats_ = now;
    publish_stats();
  }

  void shutdown() {
    // Say goodbye on every healthy lane; the flush-close below delivers it.
    std::set<int> busy;
    for (size_t i = 0; i < peers_.size(); ++i)
      if (peers_[i].inflight > 0 || !peers_[i].recvs.empty()) busy.insert(static_cast<int>(i));
    for (auto& [h, rec] : eps_) {
      if (rec->state != EpState::kReady || rec->peer < 0 || peers_[rec->peer].failed) continue;
      HsMessage bye;
      bye.version = version_;
      bye.type = HsType::kBye;
      send_hs(*rec, bye, false);
      // Flush-close when nothing of ours is in flight; otherwise force (rendezvous
      // transfers could keep a flush waiting on the peer).
      kill_ep(*rec, busy.count(rec->peer) > 0);
    }
    for (size_t i = 0; i < peers_.size(); ++i)
      fail_peer(static_cast<int>(i), FailKind::kTransport,
                fmt::format("transport {}/{} shut down", self_.site, self_.rank));
    process_failures();
    if (connect_promise_) finish_connect(make_error(FailKind::kTransport, "transport shut down during connect"));
    {
      std::unique_ptr<Gate> gate;
      {
        std::lock_guard<std::mutex> lock(info_mu_);
        gate = std::move(gate_);
      }
      gate.reset();  // joins its threads (each bounded by the handshake timeout)
    }
    for (auto& [h, rec] : eps_)
      if (rec->state != EpState::kDead) kill_ep(*rec, true);
    auto deadline = Clock::now() + std::chrono::seconds(5);
    while (Clock::now() < deadline && worker_) {
      ucp_worker_progress(worker_->get());
      reap_endpoints();
      if (eps_.empty() && failed_recvs_.empty()) break;
    }
    for (auto& op : std::vector<std::shared_ptr<RecvOp>>(failed_recvs_)) {
      op->inflight = 0;
      maybe_finish_recv(*op);
    }
    eps_.clear();
    listener_.reset();
    worker_.reset();
    context_.reset();
    publish_stats();
  }

  TransportConfig cfg_;
  std::atomic<int> active_lanes_{0};  // 0 until the constructor sets cfg_.lanes
  Identity self_;
  TestHooks hooks_;
  uint16_t version_ = kProtocolVersion;

  int wake_fd_ = -1;
  std::thread thread_;
  std::mutex cmd_mu_;
  std::deque<std::function<void()>> cmds_;

  mutable std::mutex info_mu_;
  bool info_ready_ = false;
  bool connect_called_ = false;
  std::unique_ptr<Gate> gate_;
  std::vector<std::string> ucx_notes_;
  std::vector<PeerInfo> peer_infos_;

  mutable std::mutex stats_mu_;
  TransportStats stats_;
  Clock::time_point last_stats_{};

  // Progress-thread state.
  bool stopping_ = false;
  std::unique_ptr<ucx::Context> context_;
  std::unique_ptr<ucx::Worker> worker_;
  std::unique_ptr<ucx::Listener> listener_;
  std::string listen_host_;
  std::unordered_map<ucp_ep_h, std::unique_ptr<EpRec>> eps_;
  std::map<ucp_ep_h, bool> close_force_;
  std::vector<Peer> peers_;
  bool connect_started_ = false;
  bool connected_ = false;
  Clock::time_point connect_deadline_{};
  std::shared_ptr<detail::OpState> connect_promise_;
  bool failures_pending_ = false;
  std::vector<std::shared_ptr<RecvOp>> failed_recvs_;
  Clock::time_point next_timer_{};
};

// ---------------------------------------------------------------------------------------

Transport::Transport(TransportConfig config, Identity self, TestHooks hooks)
    : impl_(std::make_unique<Impl>(std::move(config), std::move(self), std::move(hooks))) {}
Transport::~Transport() = default;

int Transport::listen(const std::string& host, int port) { return impl_->listen(host, port); }
void Transport::connect(std::vector<PeerInfo> peers) { impl_->connect(std::move(peers)); }
void Transport::start(const std::string& host, int port, std::vector<PeerInfo> peers) {
  listen(host, port);
  connect(std::move(peers));
}
const Identity& Transport::self() const { return impl_->self(); }
const std::vector<PeerInfo>& Transport::peers() const { return impl_->peers(); }
int Transport::peer_index(const std::string& site, int rank) const { return impl_->peer_index(site, rank); }
SendHandle Transport::send(int peer, FrameKind kind, uint64_t round, uint32_t shard, std::span<const uint8_t> payload) {
  return impl_->send(peer, kind, round, shard, payload);
}
RecvHandle Transport::recv(int peer, FrameKind kind, uint64_t round, uint32_t shard, std::span<uint8_t> dest) {
  return impl_->recv(peer, kind, round, shard, dest);
}
SendHandle Transport::send_on_lane(int peer, int lane, FrameKind kind, uint64_t round, uint32_t shard,
                                   std::span<const uint8_t> payload) {
  return impl_->send(peer, kind, round, shard, payload, lane < 0 ? -2 : lane);
}
int Transport::lanes() const { return impl_->lanes(); }
void Transport::set_active_lanes(int n) { impl_->set_active_lanes(n); }
int Transport::active_lanes() const { return impl_->active_lanes(); }
TransportStats Transport::stats() const { return impl_->stats(); }
std::vector<std::string> Transport::ucx_settings() const { return impl_->ucx_settings(); }

}  // namespace geoloco::transport
