// UcxTransport: connection set-up -- listen (gate + UCX listener), connect (gate dials, then
// `lanes` UCX endpoints per peer, each authenticated by a HandshakeSession over active
// messages), endpoint errors and closing (ucx_transport.hpp; README.md "Connection setup").
#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netinet/in.h>

#include <algorithm>
#include <future>

#include "core/log.hpp"
#include "transport/ucx/ucx_env.hpp"
#include "transport/ucx/ucx_link.hpp"
#include "transport/ucx/ucx_transport.hpp"

namespace geoloco::transport::ucx {

namespace {
constexpr unsigned kAmHandshake = 7;
// Handshakes in progress at once; more connection requests are rejected (a flood of
// half-open connections must not exhaust memory).
constexpr size_t kMaxPendingHandshakes = 64;
}  // namespace

HsLocal UcxTransport::local() const {
  return HsLocal{self_, cfg_.chunk_bytes, static_cast<uint16_t>(cfg_.lanes), version_, cfg_.psk};
}

void UcxTransport::set_directory(std::vector<std::string> addresses) {
  std::lock_guard<std::mutex> lock(info_mu_);
  if (gate_ == nullptr) throw TransportError("transport: set_directory() before listen()");
  gate_->set_directory(std::move(addresses));
}

std::vector<std::string> UcxTransport::site_directory(const PeerInfo& rank0, int ranks, double timeout_s) const {
  return gate_directory(rank0, ranks, local(), cfg_.handshake_timeout_s,
                        Clock::now() + seconds_d(timeout_s > 0 ? timeout_s : cfg_.connect_timeout_s));
}

void UcxTransport::connect(std::vector<PeerInfo> peers, ConnectMode mode) {
  check_peer_list(peers);
  const bool join = mode == ConnectMode::kJoin;
  Gate* gate;
  {
    std::lock_guard<std::mutex> lock(info_mu_);
    gate = gate_.get();
    if (gate == nullptr) throw TransportError("transport: connect() before listen()");
    if (connect_called_) throw TransportError("transport: connect() called twice");
    connect_called_ = true;
  }
  joining_ = join;  // before the loop sees the connect (post() orders it)
  const auto deadline = Clock::now() + seconds_d(cfg_.connect_timeout_s);
  gate->set_peers(peers);
  // Authenticate with the gates of the peers we dial (in parallel) to learn their UCX ports.
  // Each dial thread reports (port, error kind, message): no exception crosses threads.
  struct DialResult {
    int port = 0;
    bool handshake_error = false;
    std::string error;
  };
  std::vector<std::future<DialResult>> dials_f(peers.size());
  const HsLocal me = local();
  for (size_t i = 0; i < peers.size(); ++i)
    if (join || dials(self_, peers[i]))
      dials_f[i] = std::async(std::launch::async, [&, i] {
        DialResult r;
        try {
          // A joiner leaves the lanes at least half of its connect time.
          const double unreachable = join ? std::min(kJoinUnreachableS, cfg_.connect_timeout_s / 2) : 0;
          r.port = gate_dial(peers[i], me, cfg_.handshake_timeout_s, deadline, unreachable);
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
    } catch (const std::exception& e) {
      st->finish(FailKind::kTransport, e.what(), 0);
    }
  });
  OpHandle(st).wait();
}

int UcxTransport::do_listen(const std::string& host, int port) {
  if (listener_) throw TransportError("transport: listen() called twice");
  Config config;
  auto notes = apply_ucx_defaults(config, host);
  context_ = std::make_unique<Context>(config);
  worker_ = std::make_unique<Worker>(*context_);
  set_am_handler(kAmHandshake, &UcxTransport::on_handshake_am, UCP_AM_FLAG_WHOLE_MSG);
  set_am_handler(kAmFrame, &UcxTransport::on_frame_am, UCP_AM_FLAG_WHOLE_MSG | UCP_AM_FLAG_PERSISTENT_DATA);
  // UCX listens on an ephemeral port; the configured port is the gate's (gate.hpp says why).
  listener_ = std::make_unique<Listener>(*worker_, host, 0, &UcxTransport::on_conn_request, this);
  auto gate = std::make_unique<Gate>(host, port, local(), cfg_.handshake_timeout_s, listener_->port());
  const int gate_port = gate->port();
  for (const auto& n : notes) spdlog::debug("transport: ucx {}", n);
  {
    std::lock_guard<std::mutex> lock(info_mu_);
    gate_ = std::move(gate);
    ucx_notes_ = notes;
  }
  spdlog::info("transport: {}/{} listening on {}:{} (ucx {})", self_.site, self_.rank, host, gate_port,
               listener_->port());
  return gate_port;
}

void UcxTransport::set_am_handler(unsigned id, ucp_am_recv_callback_t cb, uint32_t flags) {
  ucp_am_handler_param_t p{};
  p.field_mask = UCP_AM_HANDLER_PARAM_FIELD_ID | UCP_AM_HANDLER_PARAM_FIELD_CB | UCP_AM_HANDLER_PARAM_FIELD_ARG |
                 UCP_AM_HANDLER_PARAM_FIELD_FLAGS;
  p.id = id;
  p.cb = cb;
  p.arg = this;
  p.flags = flags;
  check_ucs(ucp_worker_set_am_recv_handler(worker_->get(), &p), fmt::format("set active message handler {}", id));
}

void UcxTransport::do_connect(std::vector<PeerInfo> peers, const std::vector<int>& ucx_ports,
                              const std::vector<std::string>& gate_errors, Clock::time_point deadline,
                              std::shared_ptr<detail::OpState> done) {
  if (!worker_) throw TransportError("transport: connect() before listen()");
  connect_started_ = true;
  connect_deadline_ = deadline;
  connect_done_ = std::move(done);
  const auto now = Clock::now();
  std::vector<Link*> links;
  for (size_t i = 0; i < peers.size(); ++i) {
    PeerConn c;
    c.we_dial = joining_ || dials(self_, peers[i]);
    c.ucx_port = ucx_ports[i];
    c.last_error = gate_errors[i];
    c.lane_ep.assign(static_cast<size_t>(cfg_.lanes), nullptr);
    c.redial_at.assign(static_cast<size_t>(cfg_.lanes), now);
    c.dial_active.assign(static_cast<size_t>(cfg_.lanes), false);
    c.bye.assign(static_cast<size_t>(cfg_.lanes), false);
    c.link = std::make_unique<PeerLink>(*this, static_cast<int>(i), 0);
    links.push_back(c.link.get());
    conns_.push_back(std::move(c));
  }
  open_channels(std::move(peers), links);
  // Handshakes that arrived before we knew our peers.
  for (auto& [h, rec] : eps_) {
    auto early = std::move(rec->early);
    rec->early.clear();
    for (auto& m : early)
      if (!rec->dead) on_hs_message(*rec, m);
  }
  check_connect_done();
}

int UcxTransport::find_peer(const std::string& site, int rank) const {
  const auto& p = peers();
  for (size_t i = 0; i < p.size(); ++i)
    if (p[i].site == site && p[i].rank == rank) return static_cast<int>(i);
  return -1;
}

void UcxTransport::dial(int pi, int lane) {
  PeerConn& c = conns_[static_cast<size_t>(pi)];
  const PeerInfo& info = peers()[static_cast<size_t>(pi)];
  c.dial_active[static_cast<size_t>(lane)] = true;
  struct sockaddr_in sa {};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(static_cast<uint16_t>(c.ucx_port));
  if (inet_pton(AF_INET, info.host.c_str(), &sa.sin_addr) != 1) {
    c.fatal = fmt::format("peer {}: host '{}' is not an IPv4 address", info.name(), info.host);
    return;
  }
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  ep.sockaddr.addr = reinterpret_cast<const struct sockaddr*>(&sa);
  ep.sockaddr.addrlen = sizeof(sa);
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxTransport::on_ep_error;
  ep.err_handler.arg = this;
  ucp_ep_h h = nullptr;
  if (ucs_status_t st = ucp_ep_create(worker_->get(), &ep, &h); st != UCS_OK) {
    c.last_error = fmt::format("dial lane {}: {}", lane, ucs_status_string(st));
    c.dial_active[static_cast<size_t>(lane)] = false;
    c.redial_at[static_cast<size_t>(lane)] = Clock::now() + std::chrono::milliseconds(200);
    return;
  }
  auto rec = std::make_unique<EpRec>();
  rec->ep = std::make_unique<Endpoint>(worker_->get(), h);
  rec->dialer = true;
  rec->peer = pi;
  rec->lane = lane;
  rec->gen = c.gen;  // a redial's lanes belong to the new connection
  rec->hs = HandshakeSession::dialer(local(), info.site, info.rank, static_cast<uint16_t>(lane), false);
  rec->hs_deadline = Clock::now() + seconds_d(cfg_.handshake_timeout_s);
  rec->remote = fmt::format("{}:{}", info.host, c.ucx_port);
  EpRec& r = *rec;
  eps_[h] = std::move(rec);
  send_hs(r, r.hs->hello(), false);
}

namespace {
struct HsSend {
  std::vector<uint8_t> buf;
};
}  // namespace

void UcxTransport::send_hs(EpRec& rec, const std::vector<uint8_t>& msg, bool close_after) {
  auto ctx = std::make_unique<HsSend>(HsSend{msg});
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

ucs_status_t UcxTransport::on_handshake_am(void* arg, const void* header, size_t header_length, void* data,
                                           size_t length, const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) return UCS_OK;
  auto it = self->eps_.find(param->reply_ep);
  if (it == self->eps_.end() || it->second->dead) return UCS_OK;
  EpRec& rec = *it->second;
  (void)header;
  if (header_length != 0 || (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) || length > kMaxHandshakeBytes) {
    self->send_hs(rec,
                  HandshakeSession::reject(self->version_,
                                           fmt::format("oversized or malformed handshake message ({} bytes)", length)),
                  true);
    return UCS_OK;
  }
  self->on_hs_message(rec, std::span<const uint8_t>(static_cast<const uint8_t*>(data), length));
  return UCS_OK;
}

void UcxTransport::on_hs_message(EpRec& rec, std::span<const uint8_t> bytes) {
  if (rec.ready) {
    // An established lane carries one handshake message: the peer's goodbye.
    // It comes on every lane, after what the peer sent there; the lanes are separate TCP
    // connections, so the peer has shut down once it came on all of them (frames on a lane
    // still open may still be on their way).
    HsDecoded d = decode_handshake(bytes, version_);
    if (d.msg && d.msg->type == HsType::kBye && rec.peer >= 0) {
      if (rec.gen != conns_[static_cast<size_t>(rec.peer)].gen) return kill_ep(rec, true);
      PeerConn& c = conns_[static_cast<size_t>(rec.peer)];
      c.bye[static_cast<size_t>(rec.lane)] = true;
      if (c.lane_ep[static_cast<size_t>(rec.lane)] == rec.ep->get()) c.lane_ep[static_cast<size_t>(rec.lane)] = nullptr;
      for (size_t l = 0; l < c.bye.size(); ++l)
        if (!c.bye[l] && c.lane_ep[l] != nullptr) return;
      const std::string name = peers()[static_cast<size_t>(rec.peer)].name();
      spdlog::info("transport: peer {} shut down", name);
      channel(rec.peer).peer_closed(fmt::format("peer {} shut down", name));
      return;
    }
    return send_hs(rec, HandshakeSession::reject(version_, "unexpected handshake message on an established connection"),
                   true);
  }
  if (!rec.dialer && !connect_started_) {  // the peers are not known yet: answer once they are
    rec.early.emplace_back(bytes.begin(), bytes.end());
    return;
  }
  if (!rec.hs) {
    // Listener: whoever dials must be a peer that dials us, on a free lane.
    EpRec* r = &rec;
    auto admit = [this, r](const HsMessage& hello) -> std::string {
      const int pi = find_peer(hello.site, hello.rank);
      if (pi < 0) return fmt::format("{}/{} from {} is not one of our peers", hello.site, hello.rank, r->remote);
      r->peer = pi;
      PeerConn& c = conns_[static_cast<size_t>(pi)];
      if (hello.lane >= cfg_.lanes) return fmt::format("lane {} out of range (lanes {})", hello.lane, cfg_.lanes);
      // A running transport takes in a new process of a peer whose connection failed or closed.
      if (connected_ && channel(pi).failed()) {
        r->gen = c.gen + 1;
        r->lane = hello.lane;
        return {};
      }
      if (c.we_dial) return "we dial this peer, it must not dial us";
      if (channel(pi).failed()) return "peer already failed: " + channel(pi).failure();
      if (c.lane_ep[hello.lane] != nullptr) return fmt::format("lane {} is already connected", hello.lane);
      r->gen = c.gen;
      r->lane = hello.lane;
      return {};
    };
    rec.hs = HandshakeSession::listener(local(), admit, 0);
  }
  auto step = rec.hs->on_message(bytes);
  using O = HandshakeSession::Outcome;
  const std::string who = rec.peer >= 0 ? peers()[static_cast<size_t>(rec.peer)].name() : rec.remote;
  switch (step.outcome) {
    case O::kPending:
      if (step.reply) send_hs(rec, *step.reply, false);
      return;
    case O::kRefused: {
      spdlog::warn("transport: refused connection with {}: {}", who, step.error);
      count_refused_handshake();
      if (rec.peer >= 0) {
        PeerConn& c = conns_[static_cast<size_t>(rec.peer)];
        if (rec.dialer && !connected_ && !joining_)
          c.fatal = fmt::format("handshake with {} failed: {}", who, step.error);
        else
          c.last_error = fmt::format("refused {}/{} from {}: {}", rec.hs->peer_site(), rec.hs->peer_rank(), rec.remote,
                                     step.error);
      }
      return send_hs(rec, *step.reply, true);
    }
    case O::kRejected: {
      const std::string msg = fmt::format("refused by {}: {}", who, step.error);
      spdlog::warn("transport: {}", msg);
      count_refused_handshake();
      if (rec.peer >= 0) {
        PeerConn& c = conns_[static_cast<size_t>(rec.peer)];
        // A joiner retries: the running peer may not have noticed yet that the old process is gone.
        (rec.dialer && !connected_ && !joining_ ? c.fatal : c.last_error) = msg;
      }
      return kill_ep(rec, true);
    }
    case O::kAuthenticated:
      if (step.reply) send_hs(rec, *step.reply, false);
      if (rec.gen != conns_[static_cast<size_t>(rec.peer)].gen) {
        // A rejoin's lane: the first takes the peer's place unless a newer one already did.
        if (rec.gen < conns_[static_cast<size_t>(rec.peer)].gen || !channel(rec.peer).failed())
          return send_hs(rec, HandshakeSession::reject(version_, "a newer connection of this peer is in place"), true);
        take_rejoin(rec.peer);
      }
      if (conns_[static_cast<size_t>(rec.peer)].lane_ep[static_cast<size_t>(rec.lane)] != nullptr)
        return send_hs(rec, HandshakeSession::reject(version_, fmt::format("lane {} is already connected", rec.lane)),
                       true);
      return lane_ready(rec);
  }
}

void UcxTransport::renew_connection(int pi, bool we_dial) {
  PeerConn& c = conns_[static_cast<size_t>(pi)];
  channel(pi).process_failure();  // the old link's abort closes the old endpoints
  ++c.gen;
  c.we_dial = we_dial;
  std::fill(c.lane_ep.begin(), c.lane_ep.end(), nullptr);
  std::fill(c.dial_active.begin(), c.dial_active.end(), false);
  std::fill(c.bye.begin(), c.bye.end(), false);
  std::fill(c.redial_at.begin(), c.redial_at.end(), Clock::now());
  c.last_error.clear();
  c.fatal.clear();
  retired_links_.push_back(std::move(c.link));
  c.link = std::make_unique<PeerLink>(*this, pi, c.gen);
  reopen_channel(pi, *c.link);
}

void UcxTransport::take_rejoin(int pi) {
  renew_connection(pi, /*we_dial=*/false);  // the joiner dials its other lanes too
  spdlog::info("transport: {} rejoined (connection {})", peers()[static_cast<size_t>(pi)].name(),
               conns_[static_cast<size_t>(pi)].gen + 1);
}

void UcxTransport::redial(int pi) {
  post([this, pi] {
    if (!connected_ || stopping_ || pi < 0 || static_cast<size_t>(pi) >= conns_.size()) return;
    PeerConn& c = conns_[static_cast<size_t>(pi)];
    // Only a failed connection, once at a time, and only from the side that dials this peer.
    if (c.redialing || !channel(pi).failed() || !dials(self_, peers()[static_cast<size_t>(pi)])) return;
    c.redialing = true;
    const PeerInfo info = peers()[static_cast<size_t>(pi)];
    const HsLocal me = local();
    const double hs_timeout = cfg_.handshake_timeout_s;
    const auto deadline = Clock::now() + seconds_d(std::min(cfg_.connect_timeout_s, 2 * hs_timeout));
    std::lock_guard<std::mutex> lock(info_mu_);
    redial_threads_.emplace_back([this, pi, info, me, hs_timeout, deadline] {
      int port = 0;
      std::string error;
      try {
        port = gate_dial(info, me, hs_timeout, deadline, /*unreachable_s=*/hs_timeout);
      } catch (const std::exception& e) {
        error = e.what();
      }
      post([this, pi, port, error] { finish_redial(pi, port, error); });
    });
  });
}

void UcxTransport::finish_redial(int pi, int ucx_port, const std::string& error) {
  PeerConn& c = conns_[static_cast<size_t>(pi)];
  if (stopping_ || !channel(pi).failed() || !error.empty()) {
    // Taken in meanwhile (the peer dialed us: a new process of it), or not reachable: a
    // later redial() tries again.
    c.redialing = false;
    if (!error.empty()) c.last_error = fmt::format("redial: {}", error);
    return;
  }
  // As take_rejoin, but this side dials: a fresh channel and link, the lanes dialed anew.
  renew_connection(pi, /*we_dial=*/true);
  c.ucx_port = ucx_port;
  spdlog::info("transport: redialing {} (connection {})", peers()[static_cast<size_t>(pi)].name(), c.gen + 1);
  c.redial_lanes = true;
  for (int l = 0; l < cfg_.lanes; ++l) dial(pi, l);
}

bool UcxTransport::any_peer_failed() {
  for (size_t i = 0; i < conns_.size(); ++i)
    if (channel(static_cast<int>(i)).failed()) return true;
  return false;
}

void UcxTransport::lane_ready(EpRec& rec) {
  PeerConn& c = conns_[static_cast<size_t>(rec.peer)];
  rec.ready = true;
  c.lane_ep[static_cast<size_t>(rec.lane)] = rec.ep->get();
  c.dial_active[static_cast<size_t>(rec.lane)] = false;
  spdlog::info("transport: connected to {} lane {} ({})", peers()[static_cast<size_t>(rec.peer)].name(), rec.lane,
               rec.dialer ? "dialed" : "accepted");
  if (c.redial_lanes && std::all_of(c.lane_ep.begin(), c.lane_ep.end(), [](ucp_ep_h e) { return e != nullptr; }))
    c.redialing = c.redial_lanes = false;
  check_connect_done();
}

void UcxTransport::check_connect_done() {
  if (!connect_done_) return;
  std::vector<std::string> missing;
  std::vector<size_t> missing_peers;
  bool waiting = false;  // a joiner: for a peer that may still answer
  for (size_t i = 0; i < conns_.size(); ++i) {
    const PeerConn& c = conns_[i];
    const Channel& ch = channel(static_cast<int>(i));
    if (!c.fatal.empty()) return finish_connect(FailKind::kHandshake, c.fatal);
    if (ch.failed() && !joining_) return finish_connect(ch.fail_kind(), ch.failure());
    const size_t ready =
        static_cast<size_t>(std::count_if(c.lane_ep.begin(), c.lane_ep.end(), [](ucp_ep_h e) { return e != nullptr; }));
    if (ready != c.lane_ep.size()) {
      const PeerInfo& p = peers()[i];
      std::string last = c.last_error;
      if (last.empty()) {
        std::lock_guard<std::mutex> lock(info_mu_);
        if (gate_) last = gate_->refusal_for(p.site, p.rank);
      }
      missing.push_back(fmt::format("{} ({}/{} lanes{}{})", p.name(), ready, c.lane_ep.size(),
                                    last.empty() ? "" : "; last error: ", last));
      missing_peers.push_back(i);
      // A joiner stops waiting for a peer whose gate it could not reach or that failed.
      waiting = waiting || (c.ucx_port != 0 && !ch.failed());
    }
  }
  if (joining_ && !missing.empty() && (!waiting || Clock::now() >= connect_deadline_)) {
    // The peers we reached are ours; the others fail, naming why.
    for (size_t k = 0; k < missing_peers.size(); ++k) {
      const int pi = static_cast<int>(missing_peers[k]);
      if (!channel(pi).failed())
        channel(pi).fail(FailKind::kTimeout, fmt::format("peer {} not reachable when joining", missing[k]),
                         /*quiet=*/true);
      channel(pi).process_failure();
    }
    missing.clear();
  }
  if (missing.empty()) {
    connected_ = true;
    open_api();
    {
      std::lock_guard<std::mutex> lock(info_mu_);
      if (gate_) gate_->open_to_joiners();
    }
    return finish_connect(FailKind::kNone, "");
  }
  if (Clock::now() >= connect_deadline_)
    finish_connect(FailKind::kTimeout,
                   fmt::format("transport {}/{}: connect timed out after {} s; not connected: {}", self_.site,
                               self_.rank, cfg_.connect_timeout_s, fmt::join(missing, "; ")));
}

void UcxTransport::finish_connect(FailKind kind, const std::string& msg) {
  auto done = std::move(connect_done_);
  connect_done_.reset();
  if (kind != FailKind::kNone) {
    // Nothing half-connected survives a failed connect.
    fail_all(FailKind::kTransport, msg, /*quiet=*/true);
    for (auto& [h, rec] : eps_) kill_ep(*rec, true);
  }
  if (done) done->finish(kind, msg, 0);
}

void UcxTransport::connection_timers(Clock::time_point now, Clock::time_point& next) {
  auto book = [&](Clock::time_point t) {
    if (next == Clock::time_point{} || t < next) next = t;
  };
  // Lanes still to dial: at connect, and after a redial (whose other lanes may be up).
  for (size_t i = 0; i < conns_.size(); ++i) {
    PeerConn& c = conns_[i];
    if (!connect_done_ && !c.redial_lanes) continue;
    if (!c.we_dial || c.ucx_port == 0 || channel(static_cast<int>(i)).failed() || !c.fatal.empty()) {
      if (!connect_done_) c.redialing = c.redial_lanes = false;  // the new connection failed too: a later redial()
      continue;
    }
    for (int l = 0; l < cfg_.lanes; ++l) {
      if (c.lane_ep[static_cast<size_t>(l)] != nullptr || c.dial_active[static_cast<size_t>(l)]) continue;
      if (now >= c.redial_at[static_cast<size_t>(l)])
        dial(static_cast<int>(i), l);
      else
        book(c.redial_at[static_cast<size_t>(l)]);
    }
  }
  if (connect_done_) {
    check_connect_done();
    book(connect_deadline_);
  }
  for (auto& [h, rec] : eps_) {
    if (rec->ready || rec->dead) continue;
    if (now >= rec->hs_deadline) {
      if (rec->peer >= 0)
        conns_[static_cast<size_t>(rec->peer)].last_error = fmt::format("lane {} handshake timed out", rec->lane);
      spdlog::warn("transport: refused connection with {}: handshake timed out after {} s", rec->remote,
                   cfg_.handshake_timeout_s);
      count_refused_handshake();
      send_hs(
          *rec,
          HandshakeSession::reject(version_, fmt::format("handshake timed out after {} s", cfg_.handshake_timeout_s)),
          true);
    } else {
      book(rec->hs_deadline);
    }
  }
}

void UcxTransport::on_conn_request(ucp_conn_request_h req, void* arg) {
  auto* self = static_cast<UcxTransport*>(arg);
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  std::string remote = "?";
  if (ucp_conn_request_query(req, &attr) == UCS_OK) remote = sockaddr_to_string(attr.client_address);
  size_t pending = 0;
  for (auto& [h, rec] : self->eps_)
    if (!rec->ready && !rec->dead) ++pending;
  const bool full = self->connected_ && !self->any_peer_failed();
  if (full || self->stopping_ || pending >= kMaxPendingHandshakes) {
    spdlog::warn("transport: rejected connection request from {} ({})", remote,
                 full ? "all peers already connected" : "too many pending handshakes");
    ucp_listener_reject(self->listener_->get(), req);
    return;
  }
  ucp_ep_params_t ep{};
  ep.field_mask =
      UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.conn_request = req;
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = &UcxTransport::on_ep_error;
  ep.err_handler.arg = self;
  ucp_ep_h h = nullptr;
  if (ucs_status_t st = ucp_ep_create(self->worker_->get(), &ep, &h); st != UCS_OK) {
    spdlog::warn("transport: accepting connection from {} failed: {}", remote, ucs_status_string(st));
    return;
  }
  auto rec = std::make_unique<EpRec>();
  rec->ep = std::make_unique<Endpoint>(self->worker_->get(), h);
  rec->hs_deadline = Clock::now() + seconds_d(self->cfg_.handshake_timeout_s);
  rec->remote = remote;
  self->eps_[h] = std::move(rec);
}

void UcxTransport::on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status) {
  auto* self = static_cast<UcxTransport*>(arg);
  auto it = self->eps_.find(ep);
  if (it == self->eps_.end() || it->second->dead) return;
  EpRec& rec = *it->second;
  if (rec.peer >= 0 && rec.ready && self->conns_[static_cast<size_t>(rec.peer)].bye[static_cast<size_t>(rec.lane)]) {
    self->kill_ep(rec, true);  // the peer closing a lane it said goodbye on
    return;
  }
  if (rec.peer >= 0 && rec.gen != self->conns_[static_cast<size_t>(rec.peer)].gen) {
    self->kill_ep(rec, true);  // an older connection of a peer that rejoined, or a newer one not yet in place
    return;
  }
  if (rec.peer >= 0) {
    const std::string name = self->peers()[static_cast<size_t>(rec.peer)].name();
    if (rec.ready)
      self->channel(rec.peer).fail(FailKind::kTransport, fmt::format("connection to peer {} lost (lane {}): {}", name,
                                                                     rec.lane, ucs_status_string(status)));
    else
      self->conns_[static_cast<size_t>(rec.peer)].last_error =
          fmt::format("lane {} {}: {}", rec.lane, rec.dialer ? "dial" : "handshake", ucs_status_string(status));
  } else {
    spdlog::debug("transport: connection from {} failed before the handshake: {}", rec.remote,
                  ucs_status_string(status));
  }
  self->kill_ep(rec, true);
}

// Marks an endpoint dead; the close itself happens in reap_endpoints (never inside a UCX
// callback of that endpoint).
void UcxTransport::kill_ep(EpRec& rec, bool force) {
  if (rec.dead) return;
  if (rec.peer >= 0 && rec.lane >= 0 && static_cast<size_t>(rec.peer) < conns_.size()) {
    PeerConn& c = conns_[static_cast<size_t>(rec.peer)];
    if (rec.ready && c.lane_ep[static_cast<size_t>(rec.lane)] == rec.ep->get())
      c.lane_ep[static_cast<size_t>(rec.lane)] = nullptr;
    if (rec.dialer && !rec.ready) {
      c.dial_active[static_cast<size_t>(rec.lane)] = false;
      c.redial_at[static_cast<size_t>(rec.lane)] = Clock::now() + std::chrono::milliseconds(200);
    }
  }
  rec.dead = true;
  close_force_.insert({rec.ep->get(), force});
}

void UcxTransport::reap_endpoints() {
  for (auto [h, force] : close_force_)
    if (auto it = eps_.find(h); it != eps_.end()) it->second->ep->close(force);
  close_force_.clear();
  for (auto it = eps_.begin(); it != eps_.end();) {
    if (it->second->dead && it->second->ep->closed())
      it = eps_.erase(it);
    else
      ++it;
  }
}

}  // namespace geoloco::transport::ucx
