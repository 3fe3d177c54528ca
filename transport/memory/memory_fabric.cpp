// MemoryFabric: the fabric thread, frame delivery in order per lane, and the faults
// (memory_fabric.hpp). The endpoints' connection logic is in memory_transport.cpp.
#include "transport/memory/memory_fabric.hpp"

#include <fmt/format.h>

#include <future>

#include "core/log.hpp"
#include "transport/memory/memory_link.hpp"

namespace geoloco::transport::memory {

MemoryFabric::MemoryFabric(FabricOptions options) : opt_(options) {
  thread_ = std::thread([this] { loop(); });
}

MemoryFabric::~MemoryFabric() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void MemoryFabric::schedule(Clock::time_point due, int owner, std::function<void()> fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push(Event{due, seq_++, owner, std::move(fn)});
  }
  cv_.notify_all();
}

void MemoryFabric::run_sync(std::function<void()> fn) {
  std::promise<void> done;
  auto f = done.get_future();
  schedule(Clock::now(), -1, [&] {
    fn();
    done.set_value();
  });
  f.wait();
}

void MemoryFabric::run_event(Event& e) {
  if (e.owner >= 0) {
    Endpoint& ep = endpoints_.at(static_cast<size_t>(e.owner));
    if (ep.t == nullptr) return;  // destroyed: its events die with it
    if (ep.frozen) {
      ep.backlog.push_back(std::move(e));
      return;
    }
  }
  e.fn();
}

void MemoryFabric::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    const auto now = Clock::now();
    if (!queue_.empty() && queue_.top().due <= now) {
      Event e = std::move(const_cast<Event&>(queue_.top()));
      queue_.pop();
      lock.unlock();
      run_event(e);
      lock.lock();
      continue;
    }
    lock.unlock();
    // Every endpoint's protocol pass: sends within their windows, deadlines, teardowns.
    Clock::time_point next{};
    bool busy = false;
    for (auto& ep : endpoints_)
      if (ep.t != nullptr && !ep.frozen && !ep.dead) busy |= ep.t->pass(now, next);
    lock.lock();
    if (busy || stopping_) continue;
    if (!queue_.empty() && (next == Clock::time_point{} || queue_.top().due < next)) next = queue_.top().due;
    if (next == Clock::time_point{})
      cv_.wait_for(lock, std::chrono::milliseconds(50));
    else
      cv_.wait_until(lock, std::min(next, Clock::now() + std::chrono::milliseconds(50)));
  }
}

int MemoryFabric::register_endpoint(MemoryTransport* t) {
  int id = -1;
  run_sync([&] {
    if (find(t->self().site, t->self().rank) >= 0) return;
    endpoints_.push_back(Endpoint{t, false, false, {}});
    id = static_cast<int>(endpoints_.size()) - 1;
  });
  return id;
}

void MemoryFabric::unregister_endpoint(int id) {
  // Fabric thread. Frames it sent that a peer holds stay the peer's (their data lives in the
  // message); frames held for it go, and rendezvous sends to it complete now, as a closed
  // connection's would.
  for (auto it = held_.begin(); it != held_.end();) {
    auto m = it->second;
    if (m->from == id) {
      m->sender_done = nullptr;  // its sender is gone
      ++it;
    } else if (m->to == id) {
      if (m->sender_done) {
        auto done = std::move(m->sender_done);
        schedule(Clock::now(), m->from, [done] { done("connection closed by the peer"); });
      }
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  endpoints_.at(static_cast<size_t>(id)) = Endpoint{};
  endpoints_.at(static_cast<size_t>(id)).dead = true;
}

// After the frames `id` sent before now have arrived (each lane delivers in order), as over
// a TCP connection whose peer closed it.
Clock::time_point MemoryFabric::after_frames_of(int id) const {
  auto due = Clock::now();
  for (const auto& [k, t] : lane_free_)
    if (k.first == id && t > due) due = t;
  return due;
}

int MemoryFabric::find(const std::string& site, int rank) const {
  for (size_t i = 0; i < endpoints_.size(); ++i)
    if (endpoints_[i].t != nullptr && !endpoints_[i].dead && endpoints_[i].t->self().site == site &&
        endpoints_[i].t->self().rank == rank)
      return static_cast<int>(i);
  return -1;
}

std::unique_ptr<MemoryTransport> MemoryFabric::endpoint(TransportConfig cfg, Identity self, TestHooks hooks) {
  std::unique_ptr<MemoryTransport> t(new MemoryTransport(*this, std::move(cfg), std::move(self), std::move(hooks)));
  t->id_ = register_endpoint(t.get());
  if (t->id_ < 0)
    throw TransportError(fmt::format("memory fabric: {}/{} already has an endpoint", t->self().site, t->self().rank));
  return t;
}

void MemoryFabric::add_fault(Fault f) {
  std::lock_guard<std::mutex> lock(mu_);
  faults_.emplace_back(std::move(f), 0);
}

uint64_t MemoryFabric::faults_applied() const {
  std::lock_guard<std::mutex> lock(mu_);
  return faults_applied_;
}

std::vector<Clock::time_point> MemoryFabric::cut_heals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cut_heals_;
}

uint64_t MemoryFabric::frames_from(const std::string& site, int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = frames_from_.find({site, rank});
  return it == frames_from_.end() ? 0 : it->second;
}

void MemoryFabric::kill(const std::string& site, int rank) {
  run_sync([&] {
    if (int id = find(site, rank); id >= 0) do_kill(id, "killed (memory fabric)");
  });
}

void MemoryFabric::stall(const std::string& site, int rank) {
  run_sync([&] {
    if (int id = find(site, rank); id >= 0) do_stall(id);
  });
}

void MemoryFabric::resume(const std::string& site, int rank) {
  run_sync([&] {
    if (int id = find(site, rank); id >= 0) do_resume(id);
  });
}

void MemoryFabric::do_stall(int id) {
  spdlog::warn("memory fabric: {}/{} stalled", endpoints_[static_cast<size_t>(id)].t->self().site,
               endpoints_[static_cast<size_t>(id)].t->self().rank);
  endpoints_[static_cast<size_t>(id)].frozen = true;
}

void MemoryFabric::do_resume(int id) {
  Endpoint& ep = endpoints_[static_cast<size_t>(id)];
  if (!ep.frozen) return;
  ep.frozen = false;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& e : ep.backlog) {  // in the order they queued up
    e.due = Clock::now();
    e.seq = seq_++;
    queue_.push(std::move(e));
  }
  ep.backlog.clear();
}

// Dies now (sends nothing more, its own operations fail); its peers learn it once the frames
// it sent before dying have arrived, as they would over a TCP connection.
void MemoryFabric::do_kill(int id, const std::string& why) {
  Endpoint& ep = endpoints_[static_cast<size_t>(id)];
  if (ep.dead || ep.t == nullptr) return;
  MemoryTransport* dead = ep.t;
  ep.dead = true;
  ep.frozen = false;
  ep.backlog.clear();
  const std::string name = fmt::format("{}/{}", dead->self().site, dead->self().rank);
  spdlog::warn("memory fabric: {} {}", name, why);
  dead->fail_all(FailKind::kTransport, fmt::format("transport {} {}", name, why), /*quiet=*/true);
  if (dead->connect_done_) dead->finish_connect(FailKind::kTransport, fmt::format("transport {} {}", name, why));
  schedule(after_frames_of(id), -1, [this, id, why] { announce_death(id, why); });
}

void MemoryFabric::disconnect_peers(int id, const std::function<std::string(const PeerInfo&)>& message, bool quiet,
                                    bool clean) {
  for (auto& other : endpoints_) {
    if (other.t == nullptr || other.dead || other.t->id_ == id) continue;
    for (size_t i = 0; i < other.t->peer_ids_.size(); ++i) {
      if (other.t->peer_ids_[i] != id) continue;
      MemoryTransport* t = other.t;
      const int idx = static_cast<int>(i);
      const std::string msg = message(t->peers()[i]);
      auto tell = [t, idx, msg, quiet, clean] {
        if (clean)
          t->channel(idx).peer_closed(msg);
        else
          t->channel(idx).fail(FailKind::kTransport, msg, quiet);
      };
      // A frozen endpoint learns it when it resumes, as a stopped process would.
      if (other.frozen)
        other.backlog.push_back(Event{Clock::now(), 0, t->id_, tell});
      else
        tell();
    }
  }
}

void MemoryFabric::announce_death(int id, const std::string& why) {
  disconnect_peers(
      id, [&](const PeerInfo& p) { return fmt::format("connection to peer {} lost (lane 0): {}", p.name(), why); },
      false);
  for (auto& [mid, m] : held_) {
    if (m->from == id) m->sender_done = nullptr;  // its sender is gone
    if (m->to == id && m->sender_done) {
      auto done = std::move(m->sender_done);
      m->sender_done = nullptr;
      schedule(Clock::now(), m->from, [done] { done("connection lost: the peer died"); });
    }
  }
}

namespace {
// Whether the link from -> to is one `fault` names (empty site / rank -1: any).
bool names_link(const Fault& fault, const Identity& f, const Identity& t) {
  return (fault.from_site.empty() || fault.from_site == f.site) && (fault.from_rank < 0 || fault.from_rank == f.rank) &&
         (fault.to_site.empty() || fault.to_site == t.site) && (fault.to_rank < 0 || fault.to_rank == t.rank);
}

uint64_t xorshift(uint64_t& s) {
  s ^= s << 13;
  s ^= s >> 7;
  s ^= s << 17;
  return s;
}
}  // namespace

std::optional<Fault> MemoryFabric::match_fault(int from, int to, const FrameHeader& h) {
  const Identity& f = endpoints_[static_cast<size_t>(from)].t->self();
  const Identity& t = endpoints_[static_cast<size_t>(to)].t->self();
  std::lock_guard<std::mutex> lock(mu_);
  ++frames_from_[{f.site, f.rank}];
  for (auto& [fault, seen] : faults_) {
    if (!names_link(fault, f, t)) continue;
    const bool credit = h.kind == static_cast<uint16_t>(FrameKind::kCredit);
    if (fault.kind ? static_cast<uint16_t>(*fault.kind) != h.kind : credit) continue;
    const uint64_t n = ++seen;
    if (n < fault.nth || (fault.count != 0 && n >= fault.nth + fault.count)) continue;
    ++faults_applied_;
    return fault;
  }
  return std::nullopt;
}

std::optional<std::string> MemoryFabric::transmit(int from, int to, int lane, std::span<const uint8_t> header,
                                                  std::span<const uint8_t> payload, bool eager, Link::SendDone done,
                                                  uint64_t conn) {
  if (endpoints_[static_cast<size_t>(from)].dead || endpoints_[static_cast<size_t>(to)].t == nullptr)
    return std::string("connection lost");
  auto m = std::make_shared<Message>();
  m->id = next_msg_++;
  m->from = from, m->to = to, m->lane = lane;
  m->conn = conn;
  m->header.assign(header.begin(), header.end());
  m->payload.assign(payload.begin(), payload.end());
  m->rndv = !eager && opt_.rendezvous_bytes > 0 && payload.size() > opt_.rendezvous_bytes;
  double extra = 0;
  bool frozen_sender = endpoints_[static_cast<size_t>(from)].frozen;
  if (auto h = FrameHeader::decode(header)) {
    if (auto fault = match_fault(from, to, *h)) {
      const std::string what =
          fmt::format("{} round {} offset {}", to_string(static_cast<FrameKind>(h->kind)), h->round, h->offset);
      switch (fault->action) {
        case FaultAction::kKill:
          do_kill(from, fmt::format("killed (memory fabric fault, before sending {})", what));
          return std::string("connection lost: this transport was killed");
        case FaultAction::kStall:
          do_stall(from);
          frozen_sender = true;
          if (fault->delay_s > 0)
            schedule(Clock::now() + seconds_d(fault->delay_s), -1, [this, from] { do_resume(from); });
          break;
        case FaultAction::kCut:  // held below, with every later frame on the links it names
          cuts_.emplace_back(*fault, Clock::now() + seconds_d(fault->delay_s));
          {
            std::lock_guard<std::mutex> lock(mu_);
            cut_heals_.push_back(cuts_.back().second);
          }
          break;
        case FaultAction::kDrop: return std::string();
        case FaultAction::kDelay: extra = fault->delay_s; break;
        case FaultAction::kCorrupt: {
          uint64_t s = fault->seed * 0x9E3779B97F4A7C15ull + 1;
          if (!m->payload.empty()) {
            const uint64_t bit = xorshift(s) % (m->payload.size() * 8);
            m->payload[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
          } else {
            m->header[48] ^= 1;  // the checksum field
          }
          break;
        }
        case FaultAction::kGarbage: {
          uint64_t s = fault->seed * 0x9E3779B97F4A7C15ull + 1;
          for (auto& b : m->payload) b = static_cast<uint8_t>(xorshift(s) >> 56);
          FrameHeader g = *h;
          g.checksum = chunk_checksum(m->payload);
          g.encode(m->header.data());
          break;
        }
      }
    }
  }
  if (m->rndv) m->sender_done = std::move(done);
  const auto now = Clock::now();
  // A cut link: the frame waits for the heal (frames after it queue behind it on the lane).
  if (!cuts_.empty()) {
    const Identity& fi = endpoints_[static_cast<size_t>(from)].t->self();
    const Identity& ti = endpoints_[static_cast<size_t>(to)].t->self();
    for (const auto& [c, healed_at] : cuts_)
      if (now < healed_at && names_link(c, fi, ti))
        extra = std::max(extra, std::chrono::duration<double>(healed_at - now).count());
  }
  auto& free_at = lane_free_[{from, to * 64 + lane}];
  auto due = now + seconds_d(opt_.latency_s + extra);
  if (due < free_at) due = free_at;
  free_at = due;
  if (frozen_sender) {
    // Alive but stuck from here on: the frame leaves (and its send completes) when the sender
    // resumes.
    Link::SendDone eager_done = m->rndv ? nullptr : std::move(done);
    endpoints_[static_cast<size_t>(from)].backlog.push_back(Event{due, 0, from, [this, m, eager_done] {
                                                                    if (eager_done) eager_done("");
                                                                    schedule(Clock::now(), m->to,
                                                                             [this, m] { deliver(m); });
                                                                  }});
    return std::nullopt;
  }
  schedule(due, to, [this, m] { deliver(m); });
  if (m->rndv) return std::nullopt;
  return std::string();
}

void MemoryFabric::deliver(std::shared_ptr<Message> m) {
  auto complete_sender = [&](const std::string& error) {
    if (!m->sender_done) return;
    auto done = std::move(m->sender_done);
    m->sender_done = nullptr;
    schedule(Clock::now(), m->from, [done, error] { done(error); });
  };
  // Frames from a sender that died since are delivered: they were on the wire before.
  Endpoint& to = endpoints_[static_cast<size_t>(m->to)];
  if (to.dead || to.t == nullptr) return complete_sender("connection lost");
  int idx = -1;
  for (size_t i = 0; i < to.t->peer_ids_.size(); ++i)
    if (to.t->peer_ids_[i] == m->from) idx = static_cast<int>(i);
  if (idx < 0) return complete_sender("");  // not connected to the sender: dropped
  // Sent on an earlier connection of this pair (before a redial): that connection is gone.
  if (static_cast<MemoryLink&>(*to.t->links_[static_cast<size_t>(idx)]).conn() != m->conn)
    return complete_sender("connection lost");
  HeldData d;
  d.token = reinterpret_cast<void*>(static_cast<uintptr_t>(m->id));
  d.bytes = m->rndv ? nullptr : m->payload.data();
  d.length = m->payload.size();
  d.needs_fetch = m->rndv;
  d.keepable = true;
  held_[m->id] = m;
  if (to.t->channel(idx).on_frame(m->header, d) == Disposition::kRelease && held_.erase(m->id)) complete_sender("");
}

}  // namespace geoloco::transport::memory
