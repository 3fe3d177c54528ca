#include "trainer/parallel/tcp_store.hpp"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <memory>

#include "core/log.hpp"
#include "trainer/parallel/errors.hpp"
#include "trainer/parallel/store_protocol.hpp"

namespace geoloco::parallel {

namespace wire = store_wire;

// ---------------------------------------------------------------- server

namespace {

struct Conn {
  Fd fd;
  std::vector<uint8_t> in;
  std::vector<uint8_t> out;
  size_t out_pos = 0;
  bool close_after_flush = false;
  bool dead = false;
};

}  // namespace

TcpStoreServer::TcpStoreServer(const std::string& host, int port) : host_(host) {
  listen_fd_ = net::listen_tcp(host, port);
  net::set_nonblocking(listen_fd_.get(), true);
  port_ = net::local_port(listen_fd_.get());
  int p[2];
  if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error(fmt::format("store server {}:{}: pipe: {}", host, port_, std::strerror(errno)));
  wake_read_.reset(p[0]);
  wake_write_.reset(p[1]);
  thread_ = std::thread([this] { run(); });
}

TcpStoreServer::~TcpStoreServer() {
  char c = 1;
  // The pipe has room (nobody else writes to it); if the write failed the thread would
  // never stop, so there is nothing better to do than to try.
  [[maybe_unused]] ssize_t n = ::write(wake_write_.get(), &c, 1);
  if (thread_.joinable()) thread_.join();
}

void TcpStoreServer::run() {
  std::map<std::string, std::vector<char>> kv;
  std::vector<std::unique_ptr<Conn>> conns;

  auto reject = [&](Conn& c, const std::string& why, bool reply) {
    rejected_.fetch_add(1);
    spdlog::warn("store server {}:{}: dropping a connection: {}", host_, port_, why);
    if (reply) {
      wire::Message e;
      e.type = wire::Type::kError;
      e.error = why;
      auto f = wire::encode(e);
      c.out.insert(c.out.end(), f.begin(), f.end());
      c.close_after_flush = true;
    } else {
      c.dead = true;
    }
  };

  auto handle = [&](Conn& c, const wire::Message& req) {
    wire::Message rep;
    switch (req.type) {
      case wire::Type::kSet:
        kv[req.key] = req.value;
        rep.type = wire::Type::kOk;
        break;
      case wire::Type::kGet: {
        rep.type = wire::Type::kValue;
        auto it = kv.find(req.key);
        if (it != kv.end()) {
          rep.found = true;
          rep.value = it->second;
        }
        break;
      }
      case wire::Type::kCheck:
        rep.type = wire::Type::kPresence;
        rep.present.reserve(req.keys.size());
        for (const auto& k : req.keys) rep.present.push_back(kv.count(k) ? 1 : 0);
        break;
      case wire::Type::kAdd: {
        rep.type = wire::Type::kCounter;
        int64_t cur = 0;
        auto it = kv.find(req.key);
        if (it != kv.end() && it->second.size() == sizeof(int64_t)) std::memcpy(&cur, it->second.data(), sizeof(cur));
        // Wrap-around instead of signed overflow UB; counters never get near it in practice.
        cur = static_cast<int64_t>(static_cast<uint64_t>(cur) + static_cast<uint64_t>(req.counter));
        std::vector<char> v(sizeof(cur));
        std::memcpy(v.data(), &cur, sizeof(cur));
        kv[req.key] = std::move(v);
        rep.counter = cur;
        break;
      }
      default:
        reject(c, fmt::format("message type 0x{:04x} is a reply, not a request", static_cast<unsigned>(req.type)),
               true);
        return;
    }
    auto f = wire::encode(rep);
    c.out.insert(c.out.end(), f.begin(), f.end());
    served_.fetch_add(1);
  };

  auto parse = [&](Conn& c) {
    size_t pos = 0;
    while (!c.close_after_flush && !c.dead && c.in.size() - pos >= wire::kHeaderBytes) {
      wire::Header h;
      std::span<const uint8_t, wire::kHeaderBytes> hb(c.in.data() + pos, wire::kHeaderBytes);
      std::string bad = wire::decode_header(hb, &h);
      if (!bad.empty()) {
        reject(c, bad, false);  // not our protocol: no reply
        break;
      }
      if (c.in.size() - pos < wire::kHeaderBytes + h.payload_len) break;  // wait for the rest
      std::span<const uint8_t> payload(c.in.data() + pos + wire::kHeaderBytes, h.payload_len);
      pos += wire::kHeaderBytes + h.payload_len;
      try {
        handle(c, wire::decode(h.type, payload));
      } catch (const StoreError& e) {
        reject(c, e.what(), true);
      }
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(pos));
  };

  std::vector<pollfd> pfds;
  for (;;) {
    pfds.clear();
    pfds.push_back({wake_read_.get(), POLLIN, 0});
    pfds.push_back({listen_fd_.get(), POLLIN, 0});
    for (auto& c : conns) {
      short ev = c->close_after_flush ? 0 : POLLIN;
      if (c->out_pos < c->out.size()) ev |= POLLOUT;
      pfds.push_back({c->fd.get(), ev, 0});
    }
    int rc = ::poll(pfds.data(), pfds.size(), -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      spdlog::error("store server {}:{}: poll: {}", host_, port_, std::strerror(errno));
      return;
    }
    if (pfds[0].revents) return;  // asked to stop
    // Only connections that were polled have revents; ones accepted below wait for the next round.
    const size_t polled = conns.size();
    if (pfds[1].revents & POLLIN) {
      for (;;) {
        int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;  // EAGAIN (drained) or a transient error: poll again
        auto c = std::make_unique<Conn>();
        c->fd.reset(fd);
        conns.push_back(std::move(c));
      }
    }
    for (size_t i = 0; i < polled; ++i) {
      Conn& c = *conns[i];
      const short re = pfds[i + 2].revents;
      if (re & POLLIN) {
        uint8_t buf[65536];
        for (;;) {
          ssize_t n = ::recv(c.fd.get(), buf, sizeof(buf), 0);
          if (n > 0) {
            c.in.insert(c.in.end(), buf, buf + n);
            continue;
          }
          if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) c.dead = true;
          break;
        }
        parse(c);
      } else if (re & (POLLERR | POLLHUP | POLLNVAL)) {
        c.dead = true;
      }
      if (!c.dead && c.out_pos < c.out.size()) {
        ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_pos, c.out.size() - c.out_pos, MSG_NOSIGNAL);
        if (n > 0)
          c.out_pos += static_cast<size_t>(n);
        else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
          c.dead = true;
        if (c.out_pos == c.out.size()) {
          c.out.clear();
          c.out_pos = 0;
          if (c.close_after_flush) c.dead = true;
        }
      }
    }
    std::erase_if(conns, [](const std::unique_ptr<Conn>& c) { return c->dead; });
  }
}

// ---------------------------------------------------------------- client

TcpStore::TcpStore(StoreClientOptions opts, Clock::time_point connect_deadline) : opts_(std::move(opts)) {
  // Each attempt gets at most 1 s so a black-holed SYN does not eat the whole budget.
  net::ConnectResult r = net::connect_until(opts_.host, opts_.port, connect_deadline, std::chrono::seconds(1),
                                            std::chrono::milliseconds(50));
  if (r.fd) {
    fd_ = std::move(r.fd);
    return;
  }
  const std::string& last = r.error;
  throw StoreError(
      fmt::format("site {}: could not reach the rendezvous store at {}:{} before the deadline "
                  "(served by rank 0; last error: {})",
                  opts_.site, opts_.host, opts_.port, last));
}

std::vector<uint8_t> TcpStore::round_trip(const std::vector<uint8_t>& frame, const char* what, uint16_t* type) {
  std::lock_guard lock(mu_);
  if (!fd_.valid())
    throw StoreError(
        fmt::format("site {}: store {}:{}: connection already failed", opts_.site, opts_.host, opts_.port));
  auto deadline = Clock::now() + opts_.timeout;
  auto fail = [&](const std::string& why) -> StoreError {
    fd_.reset();  // the stream position is unknown now: never reuse it
    return StoreError(
        fmt::format("site {}: store {}:{}: {} failed: {}", opts_.site, opts_.host, opts_.port, what, why));
  };
  if (auto io = net::send_all(fd_.get(), frame.data(), frame.size(), deadline); !io.ok()) throw fail(io.message());
  std::array<uint8_t, wire::kHeaderBytes> hb{};
  if (auto io = net::recv_all(fd_.get(), hb.data(), hb.size(), deadline); !io.ok()) throw fail(io.message());
  wire::Header h;
  if (std::string err = wire::decode_header(hb, &h); !err.empty()) throw fail("malformed reply: " + err);
  std::vector<uint8_t> payload(h.payload_len);
  if (auto io = net::recv_all(fd_.get(), payload.data(), payload.size(), deadline); !io.ok()) throw fail(io.message());
  *type = static_cast<uint16_t>(h.type);
  return payload;
}

namespace {

wire::Message expect(uint16_t type, const std::vector<uint8_t>& payload, wire::Type want, const StoreClientOptions& o,
                     const char* what) {
  wire::Message m;
  try {
    m = wire::decode(static_cast<wire::Type>(type), payload);
  } catch (const StoreError& e) {
    throw StoreError(
        fmt::format("site {}: store {}:{}: {}: malformed reply: {}", o.site, o.host, o.port, what, e.what()));
  }
  if (m.type == wire::Type::kError)
    throw StoreError(
        fmt::format("site {}: store {}:{}: {}: server refused: {}", o.site, o.host, o.port, what, m.error));
  if (m.type != want)
    throw StoreError(
        fmt::format("site {}: store {}:{}: {}: unexpected reply type 0x{:04x}", o.site, o.host, o.port, what, type));
  return m;
}

}  // namespace

void TcpStore::set(const std::string& key, const std::vector<char>& data) {
  wire::Message m;
  m.type = wire::Type::kSet;
  m.key = key;
  m.value = data;
  uint16_t t = 0;
  auto p = round_trip(wire::encode(m), "set", &t);
  expect(t, p, wire::Type::kOk, opts_, "set");
}

std::optional<std::vector<char>> TcpStore::try_get(const std::string& key) {
  wire::Message m;
  m.type = wire::Type::kGet;
  m.key = key;
  uint16_t t = 0;
  auto p = round_trip(wire::encode(m), "get", &t);
  auto r = expect(t, p, wire::Type::kValue, opts_, "get");
  if (!r.found) return std::nullopt;
  return std::move(r.value);
}

std::vector<bool> TcpStore::check(const std::vector<std::string>& keys) {
  wire::Message m;
  m.type = wire::Type::kCheck;
  m.keys = keys;
  uint16_t t = 0;
  auto p = round_trip(wire::encode(m), "check", &t);
  auto r = expect(t, p, wire::Type::kPresence, opts_, "check");
  if (r.present.size() != keys.size())
    throw StoreError(fmt::format("site {}: store {}:{}: check: asked about {} keys, got {} answers", opts_.site,
                                 opts_.host, opts_.port, keys.size(), r.present.size()));
  std::vector<bool> out(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) out[i] = r.present[i] != 0;
  return out;
}

int64_t TcpStore::add(const std::string& key, int64_t delta) {
  wire::Message m;
  m.type = wire::Type::kAdd;
  m.key = key;
  m.counter = delta;
  uint16_t t = 0;
  auto p = round_trip(wire::encode(m), "add", &t);
  return expect(t, p, wire::Type::kCounter, opts_, "add").counter;
}

void TcpStore::wait(const std::vector<std::string>& keys) { wait(keys, opts_.timeout); }

void TcpStore::wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) {
  const auto deadline = Clock::now() + timeout;
  auto sleep = std::chrono::milliseconds(1);
  for (;;) {
    auto present = check(keys);
    std::vector<std::string> missing;
    for (size_t i = 0; i < keys.size(); ++i)
      if (!present[i]) missing.push_back(keys[i]);
    if (missing.empty()) return;
    if (Clock::now() >= deadline) {
      const size_t shown = std::min<size_t>(missing.size(), 8);
      std::string list = fmt::format("{}", fmt::join(missing.begin(), missing.begin() + shown, ", "));
      if (shown < missing.size()) list += fmt::format(" and {} more", missing.size() - shown);
      throw StoreError(fmt::format("site {}: store {}:{}: timed out after {} waiting for keys {}", opts_.site,
                                   opts_.host, opts_.port, net::seconds_text(timeout), list));
    }
    // Back off from 1 ms to 50 ms: fast when peers are close behind, cheap when they are not.
    std::this_thread::sleep_for(std::min(sleep, std::chrono::duration_cast<std::chrono::milliseconds>(
                                                    deadline - Clock::now() + std::chrono::milliseconds(1))));
    sleep = std::min(sleep * 2, std::chrono::milliseconds(50));
  }
}

std::vector<char> TcpStore::get(const std::string& key) {
  wait({key}, opts_.timeout);
  auto v = try_get(key);
  if (!v)
    throw StoreError(fmt::format("site {}: store {}:{}: key '{}' vanished", opts_.site, opts_.host, opts_.port, key));
  return std::move(*v);
}

}  // namespace geoloco::parallel
