#include "tools/probe/probe_runner.hpp"

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <map>

#include "core/fd.hpp"
#include "core/hash.hpp"
#include "transport/ucx/ucx_transport.hpp"

namespace geoloco::probe {

using transport::Identity;
using transport::PeerInfo;
using transport::TransportConfig;
using transport::ucx::UcxTransport;

namespace {

constexpr const char* kRunId = "geoloco-probe";

void note(const RunnerOptions& o, const std::string& s) {
  if (o.probe.progress) o.probe.progress(s);
}

// Chunks in flight per peer: enough for a whole window of messages.
int inflight_for(const RunnerOptions& o, uint64_t chunk_bytes) {
  const uint64_t per_msg = (o.probe.message_bytes + chunk_bytes - 1) / chunk_bytes;
  return static_cast<int>(std::clamp<uint64_t>(per_msg * o.probe.window, 8, 1024));
}

// A posted recv fails after this long without progress. The longest legitimate waits: a
// responder waiting for its next command while the initiator probes other sites (config
// mode), and the data message posted `window` messages ahead on a slow link.
double transfer_timeout_for(const RunnerOptions& o, int pairs_before) {
  const double per_pair = 2 * (o.probe.seconds + 5) + 30;
  return std::max({60.0, o.timeout_s, per_pair * (pairs_before + 1)});
}

TransportConfig standalone_config(const RunnerOptions& o) {
  TransportConfig c;
  if (o.psk_file.empty()) {
    c.psk_file = "(the default probe key)";
    c.psk.assign(kDefaultProbeKey, kDefaultProbeKey + std::strlen(kDefaultProbeKey));
  } else {
    c.psk_file = o.psk_file;
    c.psk = transport::read_psk_file(o.psk_file);
  }
  c.connect_timeout_s = o.timeout_s;
  c.handshake_timeout_s = std::min(10.0, o.timeout_s);
  c.transfer_timeout_s = transfer_timeout_for(o, 0);
  c.lanes = o.connections;
  c.chunk_bytes = o.chunk_bytes;
  c.inflight_chunks = inflight_for(o, c.chunk_bytes);
  if (o.emulate) c.emulate = *o.emulate;
  try {
    c.validate();
  } catch (const Error& e) {
    throw InputError(fmt::format("probe: {}", e.what()));
  }
  return c;
}

uint64_t standalone_hash() { return hash64(std::string_view("geoloco-probe-standalone/1")); }

std::string lanes_hint(const std::string& msg) {
  return msg.find("lanes") != std::string::npos ? " (give both sides the same --connections)" : "";
}

ProbeRun base_run(const std::string& mode, const std::string& self, const std::string& endpoint,
                  const TransportConfig& c) {
  ProbeRun r;
  r.mode = mode;
  r.self = self;
  r.endpoint = endpoint;
  r.lanes = c.lanes;
  r.chunk_bytes = c.chunk_bytes;
  r.emulate = c.emulate;
  return r;
}

}  // namespace

std::string Endpoint::str() const { return fmt::format("{}:{}", host, port); }

Endpoint parse_endpoint(const std::string& text, const std::string& flag, bool allow_port_zero) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    throw InputError(fmt::format("{} '{}': expected ADDR:PORT, e.g. 198.18.1.2:7000", flag, text));
  Endpoint e;
  e.host = text.substr(0, colon);
  const std::string port = text.substr(colon + 1);
  int p = -1;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (ec != std::errc() || end != port.data() + port.size() || p < (allow_port_zero ? 0 : 1) || p > 65535)
    throw InputError(fmt::format("{} '{}': port '{}' is not in {}..65535", flag, text, port, allow_port_zero ? 0 : 1));
  e.port = p;
  struct in_addr a {};
  if (inet_pton(AF_INET, e.host.c_str(), &a) == 1) return e;
  struct addrinfo hints {};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  struct addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(e.host.c_str(), nullptr, &hints, &res);
  if (rc != 0 || res == nullptr)
    throw InputError(fmt::format("{} '{}': '{}' is not an IPv4 address and does not resolve to one ({})", flag, text,
                                 e.host, rc != 0 ? gai_strerror(rc) : "no address"));
  char buf[INET_ADDRSTRLEN] = "";
  inet_ntop(AF_INET, &reinterpret_cast<struct sockaddr_in*>(res->ai_addr)->sin_addr, buf, sizeof(buf));
  ::freeaddrinfo(res);
  e.host = buf;
  return e;
}

std::string local_address_towards(const std::string& peer_host) {
  const Fd s(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  if (!s) throw Error(fmt::format("probe: socket: {}", std::strerror(errno)));
  struct sockaddr_in sa {};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(9);  // any port: a UDP connect only picks the route
  if (inet_pton(AF_INET, peer_host.c_str(), &sa.sin_addr) != 1)
    throw InputError(fmt::format("probe: '{}' is not an IPv4 address", peer_host));
  if (::connect(s.get(), reinterpret_cast<struct sockaddr*>(&sa), sizeof(sa)) != 0)
    throw Error(fmt::format("probe: no route to {}: {}", peer_host, std::strerror(errno)));
  struct sockaddr_in me {};
  socklen_t len = sizeof(me);
  if (::getsockname(s.get(), reinterpret_cast<struct sockaddr*>(&me), &len) != 0)
    throw Error(fmt::format("probe: getsockname: {}", std::strerror(errno)));
  char buf[INET_ADDRSTRLEN] = "";
  inet_ntop(AF_INET, &me.sin_addr, buf, sizeof(buf));
  return buf;
}

void RunnerOptions::validate() const {
  probe.validate();
  if (connections < 1 || connections > 256)
    throw InputError(fmt::format("probe: --connections {} outside [1, 256]", connections));
  if (!std::isfinite(timeout_s) || timeout_s <= 0 || timeout_s > 86400)
    throw InputError(fmt::format("probe: --timeout {} outside (0, 86400]", timeout_s));
}

ProbeRun run_listen(const Endpoint& at, const RunnerOptions& o) {
  o.validate();
  const TransportConfig c = standalone_config(o);
  UcxTransport t(c, Identity{kResponderSite, 0, kRunId, standalone_hash()});
  int port = 0;
  try {
    port = t.listen(at.host, at.port);
  } catch (const transport::TransportError& e) {
    throw ProbeError(fmt::format("probe: cannot listen on {}: {}", at.str(), e.what()));
  }
  const std::string where = fmt::format("{}:{}", at.host, port);
  note(o, fmt::format("listening on {} ({} connection(s)); waiting up to {} s for `geoloco probe --connect {}`", where,
                      c.lanes, o.timeout_s, where));
  try {
    t.connect({PeerInfo{kInitiatorSite, 0, "any", 0}});
  } catch (const transport::TimeoutError& e) {
    throw ProbeError(fmt::format("probe: no initiator connected to {} within {} s: {}", where, o.timeout_s, e.what()));
  } catch (const transport::TransportError& e) {
    throw ProbeError(
        fmt::format("probe: initiator on {} failed to connect: {}{}", where, e.what(), lanes_hint(e.what())));
  }
  ProbeRun run = base_run("listen", kResponderSite, where, c);
  run.sites = {kInitiatorSite, kResponderSite};
  run.pairs.push_back(probe_peer(t, 0, Role::kResponder, o.probe));
  return run;
}

ProbeRun run_connect(const Endpoint& peer, const RunnerOptions& o) {
  o.validate();
  const TransportConfig c = standalone_config(o);
  const std::string local = local_address_towards(peer.host);
  UcxTransport t(c, Identity{kInitiatorSite, 0, kRunId, standalone_hash()});
  try {
    t.listen(local, 0);
  } catch (const transport::TransportError& e) {
    throw ProbeError(
        fmt::format("probe: cannot listen on {} (the address towards {}): {}", local, peer.host, e.what()));
  }
  try {
    t.connect({PeerInfo{kResponderSite, 0, peer.host, peer.port}});
  } catch (const transport::TimeoutError& e) {
    throw ProbeError(
        fmt::format("probe: no probe responder answered at {} within {} s: {}", peer.str(), o.timeout_s, e.what()));
  } catch (const transport::TransportError& e) {
    throw ProbeError(fmt::format("probe: connecting to {} failed: {}{}", peer.str(), e.what(), lanes_hint(e.what())));
  }
  note(o, fmt::format("connected to {} with {} connection(s)", peer.str(), c.lanes));
  ProbeRun run = base_run("connect", kInitiatorSite, peer.str(), c);
  run.sites = {kInitiatorSite, kResponderSite};
  run.pairs.push_back(probe_peer(t, 0, Role::kInitiator, o.probe));
  return run;
}

ProbeRun run_sites(const std::vector<SiteSpec>& sites, const std::string& self, const TransportConfig& tc,
                   const std::string& run_id, const RunnerOptions& o) {
  o.validate();
  std::string names;
  int me = -1;
  for (size_t i = 0; i < sites.size(); ++i) {
    names += (names.empty() ? "" : ", ") + sites[i].name;
    if (sites[i].name == self) me = static_cast<int>(i);
  }
  if (sites.size() < 2) throw InputError(fmt::format("probe: the config has one site ({}); nothing to probe", names));
  if (me < 0) throw InputError(fmt::format("probe: --site '{}' is not a site of the config (sites: {})", self, names));
  const int S = static_cast<int>(sites.size());

  // Pairs in one global order; each site walks the pairs it belongs to in that order, so
  // every pair's two ends reach it (induction over the order) and nobody waits forever.
  std::vector<std::pair<int, int>> pairs;
  for (int i = 0; i < S; ++i)
    for (int j = i + 1; j < S; ++j) pairs.emplace_back(i, j);

  TransportConfig c = tc;
  c.lanes = o.connections;
  c.connect_timeout_s = o.timeout_s;
  c.inflight_chunks = std::max(c.inflight_chunks, inflight_for(o, c.chunk_bytes));
  c.transfer_timeout_s = std::max(c.transfer_timeout_s, transfer_timeout_for(o, static_cast<int>(pairs.size())));
  try {
    c.validate();
  } catch (const Error& e) {
    throw InputError(fmt::format("probe: {}", e.what()));
  }
  std::string layout = "geoloco-probe-sites/1";
  for (const auto& s : sites) layout += fmt::format("|{}@{}:{}", s.name, s.host, s.port);
  UcxTransport t(c, Identity{self, 0, run_id, hash64(layout)});
  const SiteSpec& mine = sites[static_cast<size_t>(me)];
  try {
    t.listen(mine.host, mine.port);
  } catch (const transport::TransportError& e) {
    throw ProbeError(fmt::format("probe: site {} cannot listen on {}:{}: {}", self, mine.host, mine.port, e.what()));
  }
  std::vector<PeerInfo> peers;
  for (const auto& s : sites)
    if (s.name != self) peers.push_back(PeerInfo{s.name, 0, s.host, s.port});
  note(o, fmt::format("site {} listening on {}:{}; connecting to {} other site(s) (up to {} s)", self, mine.host,
                      mine.port, peers.size(), o.timeout_s));
  try {
    t.connect(peers);
  } catch (const transport::TimeoutError& e) {
    throw ProbeError(fmt::format("probe: not every site connected to {} within {} s: {}", self, o.timeout_s, e.what()));
  } catch (const transport::TransportError& e) {
    throw ProbeError(fmt::format("probe: connecting site {} failed: {}{}", self, e.what(), lanes_hint(e.what())));
  }

  ProbeRun run = base_run("config", self, "", c);
  for (const auto& s : sites) run.sites.push_back(s.name);
  std::vector<ProbeResult> held;
  for (size_t k = 0; k < pairs.size(); ++k) {
    auto [i, j] = pairs[k];
    if (i != me && j != me) continue;
    const bool initiator = i == me;
    const std::string& other = sites[static_cast<size_t>(initiator ? j : i)].name;
    ProbeOptions po = o.probe;
    po.session = static_cast<uint32_t>(k);
    note(o, fmt::format("probing {} -> {}", sites[static_cast<size_t>(i)].name, sites[static_cast<size_t>(j)].name));
    held.push_back(probe_peer(t, t.peer_index(other, 0), initiator ? Role::kInitiator : Role::kResponder, po));
  }

  // Share: every site sends the pairs it took part in to every other site, so every site
  // ends with every pair (each pair is held by both of its ends).
  std::map<std::pair<std::string, std::string>, ProbeResult> all;
  for (const auto& r : held) all.emplace(std::make_pair(r.initiator, r.responder), r);
  if (S > 2) {
    constexpr size_t kShareBytes = 1 << 20;
    const uint64_t round = round_of(kMaxSession, 0, 0);
    const auto shard = static_cast<uint32_t>(MsgType::kShare);
    const auto out = transport::make_payload(encode_results(Header{MsgType::kShare, kMaxSession, 0, 0}, held));
    std::vector<transport::OpHandle> recvs, sends;
    for (size_t p = 0; p < peers.size(); ++p)
      recvs.push_back(t.recv(static_cast<int>(p), transport::FrameKind::kProbe, round, shard, kShareBytes));
    for (size_t p = 0; p < peers.size(); ++p)
      sends.push_back(t.send(static_cast<int>(p), transport::FrameKind::kProbe, round, shard, out));
    std::string failure;
    for (auto* list : {&sends, &recvs})
      for (auto& h : *list) {
        try {
          h.wait();
        } catch (const std::exception& e) {
          if (failure.empty()) failure = e.what();
        }
      }
    if (!failure.empty()) throw ProbeError(fmt::format("probe: sharing the results failed: {}", failure));
    for (size_t p = 0; p < peers.size(); ++p) {
      const std::vector<uint8_t> in = recvs[p].take();
      const std::span<const uint8_t> msg(in.data(), recvs[p].bytes());
      std::string err;
      auto h = decode_header(msg, err);
      if (h && (h->type != MsgType::kShare || h->session != kMaxSession)) err = "not a share message";
      std::optional<std::vector<ProbeResult>> rs;
      if (err.empty()) rs = decode_results(body_of(msg), err);
      if (!rs) throw ProbeError(fmt::format("probe: results from {}: protocol violation: {}", peers[p].name(), err));
      for (auto& r : *rs) {
        const bool known = std::count(run.sites.begin(), run.sites.end(), r.initiator) &&
                           std::count(run.sites.begin(), run.sites.end(), r.responder);
        if (!known)
          throw ProbeError(fmt::format("probe: results from {} name an unknown pair {} -> {}", peers[p].name(),
                                       r.initiator, r.responder));
        all.emplace(std::make_pair(r.initiator, r.responder), r);
      }
    }
  }
  for (const auto& [i, j] : pairs) {
    auto it = all.find({sites[static_cast<size_t>(i)].name, sites[static_cast<size_t>(j)].name});
    if (it != all.end()) run.pairs.push_back(it->second);
  }
  return run;
}

}  // namespace geoloco::probe
