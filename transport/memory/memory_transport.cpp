// MemoryTransport: connection set-up on the fabric (pairing by site/rank, the real
// handshake over direct calls, the connect deadline) and its Link (memory_link.hpp).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/log.hpp"
#include "transport/handshake_session.hpp"
#include "transport/memory/memory_fabric.hpp"
#include "transport/memory/memory_link.hpp"

namespace geoloco::transport::memory {

// ---- MemoryLink -----------------------------------------------------------------------------

std::optional<std::string> MemoryLink::send_frame(int lane, std::span<const uint8_t> header,
                                                  std::span<const uint8_t> payload, bool eager, SendDone done) {
  if (!lane_up(lane)) return std::string("connection closed");
  return fabric_.transmit(self_, peer_, lane, header, payload, eager, std::move(done), conn_);
}

std::optional<Link::Fetched> MemoryLink::fetch(const HeldData& data, std::span<uint8_t> dst, FetchDone) {
  const auto id = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(data.token));
  auto it = fabric_.held_.find(id);
  if (it == fabric_.held_.end()) return Fetched{"the frame's data is gone", 0};
  auto m = it->second;
  fabric_.held_.erase(it);
  const uint64_t n = std::min<uint64_t>(dst.size(), m->payload.size());
  std::copy(m->payload.begin(), m->payload.begin() + static_cast<std::ptrdiff_t>(n), dst.begin());
  if (m->sender_done) {
    auto done = std::move(m->sender_done);
    fabric_.schedule(Clock::now(), m->from, [done] { done(""); });
  }
  return Fetched{"", n};
}

void MemoryLink::release(const HeldData& data) {
  if (data.token == nullptr) return;
  const auto id = static_cast<uint64_t>(reinterpret_cast<uintptr_t>(data.token));
  auto it = fabric_.held_.find(id);
  if (it == fabric_.held_.end()) return;
  auto m = it->second;
  fabric_.held_.erase(it);
  if (m->sender_done) {
    auto done = std::move(m->sender_done);
    fabric_.schedule(Clock::now(), m->from, [done] { done(""); });
  }
}

void MemoryLink::abort() {
  aborted_ = true;
  // Our rendezvous sends parked at the peer complete now (as a force-closed endpoint's would).
  for (auto& [id, m] : fabric_.held_)
    if (m->from == self_ && m->to == peer_ && m->sender_done) {
      auto done = std::move(m->sender_done);
      m->sender_done = nullptr;
      fabric_.schedule(Clock::now(), self_, [done] { done("connection closed"); });
    }
}

// ---- MemoryTransport ------------------------------------------------------------------------

MemoryTransport::MemoryTransport(MemoryFabric& fabric, TransportConfig cfg, Identity self, TestHooks hooks)
    : EngineTransport(std::move(cfg), std::move(self), std::move(hooks)), fabric_(fabric) {
  version_ = hooks_.protocol_version != 0 ? hooks_.protocol_version : kProtocolVersion;
}

MemoryTransport::~MemoryTransport() {
  detach_handles();
  if (id_ < 0) return;
  fabric_.run_sync([this] {
    const std::string name = fmt::format("{}/{}", self_.site, self_.rank);
    // Peers see a clean shutdown (as the UCX backend's BYE on every lane tells them) once the
    // frames sent before it have arrived.
    const int id = id_;
    MemoryFabric& fabric = fabric_;
    fabric_.schedule(fabric_.after_frames_of(id_), -1, [&fabric, id] {
      fabric.disconnect_peers(
          id, [](const PeerInfo& p) { return fmt::format("peer {} shut down", p.name()); }, /*quiet=*/true,
          /*clean=*/true);
    });
    fail_all(FailKind::kTransport, fmt::format("transport {} shut down", name), /*quiet=*/true);
    if (connect_done_) finish_connect(FailKind::kTransport, "transport shut down during connect");
    abandon_requests();
    fabric_.unregister_endpoint(id_);
  });
}

void MemoryTransport::post(std::function<void()> fn) { fabric_.schedule(Clock::now(), id_, std::move(fn)); }

void MemoryTransport::connect(std::vector<PeerInfo> peers, ConnectMode mode) {
  check_peer_list(peers);
  auto st = std::make_shared<detail::OpState>();
  post([this, peers = std::move(peers), st, mode]() mutable {
    if (connect_done_ || connected_) return st->finish(FailKind::kTransport, "transport: connect() called twice", 0);
    want_ = std::move(peers);
    joining_ = mode == ConnectMode::kJoin;
    peer_ids_.assign(want_.size(), -1);
    last_error_.assign(want_.size(), "");
    connect_done_ = st;
    connect_deadline_ = Clock::now() + seconds_d(cfg_.connect_timeout_s);
    // As over UCX: a joiner gives up on a peer that has no live process (no gate to reach)
    // after kJoinUnreachableS, at most half the connect timeout.
    unreachable_at_ = Clock::now() + seconds_d(std::min(kJoinUnreachableS, cfg_.connect_timeout_s / 2));
    // Channels exist from now on, so frames of peers that finished connecting first are held
    // until their receives are posted; the API opens once every peer is connected.
    std::vector<Link*> links;
    for (size_t i = 0; i < want_.size(); ++i) {
      links_.push_back(std::make_unique<MemoryLink>(fabric_, id_, cfg_.lanes));
      links.push_back(links_.back().get());
    }
    open_channels(want_, links);
    try_connect();
    // Peers already waiting for us pair now too.
    for (auto& other : fabric_.endpoints_)
      if (other.t != nullptr && other.t != this && other.t->connect_done_) other.t->try_connect();
  });
  OpHandle(st).wait();
}

// Pairs with every wanted peer that has called connect() and wants us, running the handshake
// (the smaller site/rank dials, as over UCX).
void MemoryTransport::try_connect() {
  if (!connect_done_) return;
  for (size_t i = 0; i < want_.size(); ++i) {
    if (peer_ids_[i] >= 0) continue;
    const int pid = fabric_.find(want_[i].site, want_[i].rank);
    if (pid < 0) {
      last_error_[i] = "no such endpoint on the fabric yet";
      continue;
    }
    MemoryTransport* peer = fabric_.endpoints_[static_cast<size_t>(pid)].t;
    if (fabric_.endpoints_[static_cast<size_t>(pid)].dead) continue;
    int back = -1;
    for (size_t j = 0; j < peer->want_.size(); ++j)
      if (peer->want_[j].site == self_.site && peer->want_[j].rank == self_.rank) back = static_cast<int>(j);
    if (back < 0) {
      if (peer->connect_done_ || peer->connected_)
        last_error_[i] = fmt::format("{}/{} does not list us as a peer", want_[i].site, want_[i].rank);
      continue;
    }
    // A peer in its own connect() pairs with us once; a running peer takes a joiner in place
    // of the process whose connection failed.
    const bool rejoin = joining_ && peer->takes_rejoin(static_cast<size_t>(back));
    if (!rejoin && (!peer->connect_done_ || peer->peer_ids_[static_cast<size_t>(back)] >= 0)) {
      if (joining_ && peer->connected_)
        last_error_[i] = fmt::format("{}/{} still has a live connection to {}/{}", want_[i].site, want_[i].rank,
                                     self_.site, self_.rank);
      continue;
    }
    // A joiner dials (the running peer does not know it is back); else the smaller dials.
    const bool we_dial = joining_ != peer->joining_ ? joining_ : dials(self_, want_[i]);
    if (we_dial)
      pair(this, i, peer, static_cast<size_t>(back));
    else
      pair(peer, static_cast<size_t>(back), this, i);
  }
}

// The real handshake between dialer d (its peer di) and listener l (its peer li), then the
// pairing; a side already running takes a fresh channel over a fresh link (the old ones drain).
bool MemoryTransport::pair(MemoryTransport* d, size_t di, MemoryTransport* l, size_t li) {
  auto local = [](const MemoryTransport* t) {
    return HsLocal{t->self_, t->cfg_.chunk_bytes, static_cast<uint16_t>(t->cfg_.lanes), t->version_, t->cfg_.psk};
  };
  auto ds = HandshakeSession::dialer(local(d), l->self_.site, l->self_.rank, 0, false);
  auto admit = [l, d](const HsMessage& h) -> std::string {
    for (const auto& p : l->want_)
      if (p.site == h.site && p.rank == h.rank)
        return dials(l->self_, p) && !d->joining_ ? "we dial this peer, it must not dial us" : "";
    return fmt::format("{}/{} is not one of our peers", h.site, h.rank);
  };
  auto ls = HandshakeSession::listener(local(l), admit, 0);
  std::vector<uint8_t> msg = ds.hello();
  bool to_listener = true;
  std::string refused;  // why, if a side refused
  bool dialer_refused = false;
  while (!(ls.done() && ds.done())) {
    auto& who = to_listener ? ls : ds;
    auto step = who.on_message(msg);
    if (step.outcome == HandshakeSession::Outcome::kRefused || !step.reply) {
      if (step.outcome == HandshakeSession::Outcome::kRefused) refused = step.error;
      dialer_refused = !to_listener;
      break;
    }
    msg = std::move(*step.reply);
    to_listener = !to_listener;
  }
  if (!(ls.done() && ds.done())) {
    if (refused.empty()) refused = "the handshake did not complete";
    const std::string dname = d->want_[di].name(), lname = l->want_[li].name();
    count_refused_handshake();
    if (dialer_refused) {
      spdlog::warn("transport: refusing {}: {}", dname, refused);
      d->fatal_ = fmt::format("handshake with {} failed: {}", dname, refused);
      l->last_error_[li] = fmt::format("{} refused us: {}", lname, refused);
    } else {
      spdlog::warn("transport: refused connection with {}: {}", lname, refused);
      d->fatal_ = fmt::format("refused by {}: {}", dname, refused);
      l->last_error_[li] = fmt::format("refused {}: {}", lname, refused);
    }
    if (d->connect_done_) d->finish_connect(FailKind::kHandshake, d->fatal_);
    return false;
  }
  // The running side of a rejoin (both sides of a redial): a fresh channel over a fresh link.
  for (auto [t, ti] : {std::pair{d, di}, std::pair{l, li}})
    if (t->connected_) {
      t->links_.push_back(std::make_unique<MemoryLink>(fabric_, t->id_, t->cfg_.lanes));
      std::swap(t->links_[ti], t->links_.back());
      t->reopen_channel(static_cast<int>(ti), *t->links_[ti]);
      spdlog::info("transport: {}/{} {}", t->want_[ti].site, t->want_[ti].rank,
                   d->connected_ && l->connected_ ? "reconnected" : "rejoined");
    }
  d->peer_ids_[di] = l->id_;
  l->peer_ids_[li] = d->id_;
  const uint64_t conn = ++fabric_.next_conn_;
  static_cast<MemoryLink&>(*d->links_[di]).set_peer(l->id_, conn);
  static_cast<MemoryLink&>(*l->links_[li]).set_peer(d->id_, conn);
  spdlog::info("transport: connected to {} ({} lane(s), memory)", d->want_[di].name(), d->cfg_.lanes);
  for (MemoryTransport* t : {d, l}) {
    bool all = true;
    for (int p : t->peer_ids_) all = all && p >= 0;
    if (all && t->connect_done_) {
      t->connected_ = true;
      t->open_api();
      t->finish_connect(FailKind::kNone, "");
    }
  }
  return true;
}

void MemoryTransport::redial(int peer) {
  post([this, peer] {
    if (!connected_ || peer < 0 || static_cast<size_t>(peer) >= want_.size()) return;
    const size_t i = static_cast<size_t>(peer);
    // Only a failed connection, and only the side that dials it at connect (the other accepts).
    if (!channel(peer).failed() || !dials(self_, want_[i])) return;
    const int pid = fabric_.find(want_[i].site, want_[i].rank);
    if (pid < 0 || fabric_.endpoints_[static_cast<size_t>(pid)].dead) return;
    MemoryTransport* other = fabric_.endpoints_[static_cast<size_t>(pid)].t;
    int back = -1;
    for (size_t j = 0; j < other->want_.size(); ++j)
      if (other->want_[j].site == self_.site && other->want_[j].rank == self_.rank) back = static_cast<int>(j);
    // Its side must have failed too (else it still counts on the old connection: later).
    if (back < 0 || !other->connected_ || !other->channel(back).failed()) return;
    pair(this, i, other, static_cast<size_t>(back));
  });
}

void MemoryTransport::finish_connect(FailKind kind, const std::string& msg) {
  auto st = std::move(connect_done_);
  connect_done_.reset();
  if (kind != FailKind::kNone) {
    // Nothing half-connected survives a failed connect.
    fabric_.disconnect_peers(
        id_,
        [&](const PeerInfo& p) {
          return fmt::format("connection to peer {} lost (lane 0): its connect failed", p.name());
        },
        true);
    fail_all(FailKind::kTransport, msg, true);
  }
  if (st) st->finish(kind, msg, 0);
}

void MemoryTransport::check_connect_deadline(Clock::time_point now, Clock::time_point& next) {
  if (!connect_done_) return;
  auto book = [&](Clock::time_point t) {
    if (next == Clock::time_point{} || t < next) next = t;
  };
  if (joining_) {
    // A running peer takes us once it has noticed that the process it knew is gone: retry.
    try_connect();
    if (!connect_done_) return;
    book(std::min(connect_deadline_, now + std::chrono::milliseconds(10)));
  }
  bool only_gone_missing = joining_;  // every peer not paired has no live endpoint
  for (size_t i = 0; i < want_.size() && only_gone_missing; ++i) {
    if (peer_ids_[i] >= 0) continue;
    const int pid = fabric_.find(want_[i].site, want_[i].rank);
    only_gone_missing = pid < 0 || fabric_.endpoints_[static_cast<size_t>(pid)].dead;
  }
  const bool give_up_early = only_gone_missing && now >= unreachable_at_;
  if (only_gone_missing && !give_up_early) book(unreachable_at_);
  if (now < connect_deadline_ && !give_up_early) {
    book(connect_deadline_);
    return;
  }
  if (joining_) {
    // The peers we reached are ours; the others fail, naming why.
    for (size_t i = 0; i < want_.size(); ++i)
      if (peer_ids_[i] < 0)
        channel(static_cast<int>(i))
            .fail(FailKind::kTimeout,
                  fmt::format("peer {} not reachable when joining (connect_timeout_s {}){}{}", want_[i].name(),
                              cfg_.connect_timeout_s, last_error_[i].empty() ? "" : ": ",
                              give_up_early ? "no live process" : last_error_[i]),
                  /*quiet=*/true);
    connected_ = true;
    open_api();
    return finish_connect(FailKind::kNone, "");
  }
  std::vector<std::string> missing;
  for (size_t i = 0; i < want_.size(); ++i)
    if (peer_ids_[i] < 0)
      missing.push_back(fmt::format("{} (0/{} lanes{}{})", want_[i].name(), cfg_.lanes,
                                    last_error_[i].empty() ? "" : "; last error: ", last_error_[i]));
  finish_connect(FailKind::kTimeout,
                 fmt::format("transport {}/{}: connect timed out after {} s; not connected: {}", self_.site, self_.rank,
                             cfg_.connect_timeout_s, fmt::join(missing, "; ")));
}

bool MemoryTransport::pass(Clock::time_point now, Clock::time_point& next) {
  check_connect_deadline(now, next);
  if (channel_count() == 0) return false;
  return run_protocol(now, next);
}

}  // namespace geoloco::transport::memory
