// UcxTransport: the Transport over UCX (ucp) active messages on TCP -- the WAN path. One per
// rank. Owns one UCX worker driven by one internal loop thread (all UCX calls happen there,
// UCS_THREAD_MODE_SINGLE), the gate on the configured port (gate.hpp), and `lanes`
// authenticated endpoints per peer. The protocol on top is the shared one (channel.hpp);
// this binding only sets up connections and moves frames (README.md, "Connection setup").
//
// Life cycle:  UcxTransport t(cfg, self);  int port = t.listen(host, port);
//              t.connect(peers);   // all peers connected + authenticated, or throws
//              then the Transport API (transport.hpp).
//
// Files: ucx_transport.cpp (the loop, life cycle, shutdown), ucx_connect.cpp (listen,
// dial, lane handshakes, endpoint errors), ucx_link.cpp (frames in and out).
#pragma once

#include <ucp/api/ucp.h>

#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "transport/engine.hpp"
#include "transport/handshake_session.hpp"
#include "transport/ucx/gate.hpp"
#include "transport/ucx/ucx_handles.hpp"

namespace geoloco::transport::ucx {

class UcxTransport final : public EngineTransport {
 public:
  UcxTransport(TransportConfig config, Identity self, TestHooks hooks = {});
  ~UcxTransport() override;
  UcxTransport(const UcxTransport&) = delete;
  UcxTransport& operator=(const UcxTransport&) = delete;

  // Starts listening on host:port (IPv4; port 0 picks a free port). Returns the bound port.
  // That port is served by geoloco's gate (gate.hpp); UCX itself listens on an ephemeral
  // port of the same address, revealed only to authenticated peers.
  int listen(const std::string& host, int port);
  // Connects to and authenticates with every peer (lanes endpoints each) within
  // connect_timeout_s. The smaller (site, rank) dials, the other accepts; dials are retried
  // until the deadline. Throws HandshakeError when a peer refused us or we refused it for a
  // reason that retrying cannot fix, TimeoutError naming every missing peer at the deadline.
  // ConnectMode::kJoin (peer.hpp): a process joining a running job dials every peer, gives up
  // on a peer whose gate cannot be reached for kJoinUnreachableS (at most half of
  // connect_timeout_s), and returns with the peers
  // it reached. Once connected, this transport takes in a rejoining peer in place of one
  // whose connection failed or closed.
  void connect(std::vector<PeerInfo> peers, ConnectMode mode = ConnectMode::kAll);
  static constexpr double kJoinUnreachableS = transport::kJoinUnreachableS;
  // listen() then connect().
  void start(const std::string& host, int port, std::vector<PeerInfo> peers);
  // Rank 0 of a site whose ranks found their own addresses, after listen(): its gate serves
  // `addresses` (one per rank of this site) to the other sites (gate.hpp).
  void set_directory(std::vector<std::string> addresses);
  // The addresses of the `ranks` ranks of another site, asked of its rank 0 (`rank0`: that
  // site, rank 0, its configured host and port) within `timeout_s` (<= 0: connect_timeout_s).
  std::vector<std::string> site_directory(const PeerInfo& rank0, int ranks, double timeout_s = 0) const;

  // UCX settings applied at startup ("NAME=value").
  std::vector<std::string> settings() const override;
  // A peer whose connection failed while both live on: this side dials it again if it is
  // the side that dials it (transport.hpp). The gate handshake runs on a thread of its own.
  void redial(int peer) override;

  class PeerLink;

 protected:
  void post(std::function<void()> fn) override;

 private:
  // One UCX endpoint: a lane of a peer once authenticated.
  struct EpRec {
    std::unique_ptr<Endpoint> ep;
    bool dialer = false;
    int peer = -1;
    int lane = -1;
    std::optional<HandshakeSession> hs;
    bool ready = false, dead = false;
    uint64_t gen = 0;  // the peer's connection it belongs to (PeerConn::gen; +1: a rejoin)
    Clock::time_point hs_deadline{};
    std::string remote;
    std::vector<std::vector<uint8_t>> early;  // messages that arrived before connect() named the peers
  };
  struct PeerConn {
    bool we_dial = false;
    int ucx_port = 0;  // learned from the peer's gate (peers we dial)
    std::vector<ucp_ep_h> lane_ep;
    std::vector<Clock::time_point> redial_at;
    std::vector<bool> dial_active;
    std::vector<bool> bye;  // the peer said goodbye on this lane (everything it sent there came first)
    std::string last_error;
    std::string fatal;  // handshake failure that retrying cannot fix
    uint64_t gen = 0;   // +1 per rejoin: endpoints of an older connection carry nothing
    std::unique_ptr<PeerLink> link;
    bool redialing = false;     // redial(): the gate handshake runs, or the lanes are being dialed
    bool redial_lanes = false;  // redial(): the new connection's lanes are being dialed
  };

  // ---- loop (ucx_transport.cpp) ----
  void run();
  bool run_commands();
  void wait_for_events(Clock::time_point next);
  void shutdown();
  // ---- connections (ucx_connect.cpp) ----
  int do_listen(const std::string& host, int port);
  void set_am_handler(unsigned id, ucp_am_recv_callback_t cb, uint32_t flags);
  void do_connect(std::vector<PeerInfo> peers, const std::vector<int>& ucx_ports,
                  const std::vector<std::string>& gate_errors, Clock::time_point deadline,
                  std::shared_ptr<detail::OpState> done);
  int find_peer(const std::string& site, int rank) const;
  HsLocal local() const;
  void dial(int pi, int lane);
  void send_hs(EpRec& rec, const std::vector<uint8_t>& msg, bool close_after);
  void on_hs_message(EpRec& rec, std::span<const uint8_t> bytes);
  void lane_ready(EpRec& rec);
  // A rejoining peer's first lane authenticated: the old connection's endpoints go, a fresh
  // channel and link take the peer's place (EngineTransport::reopen_channel).
  void take_rejoin(int pi);
  // A fresh channel, link and connection generation for peer `pi` (its old one failed);
  // `we_dial`: this side dials its lanes.
  void renew_connection(int pi, bool we_dial);
  // redial(): the gate answered with the peer's UCX port (or failed: `error`); on the loop.
  void finish_redial(int pi, int ucx_port, const std::string& error);
  bool any_peer_failed();
  void check_connect_done();
  void finish_connect(FailKind kind, const std::string& msg);
  void connection_timers(Clock::time_point now, Clock::time_point& next);
  void kill_ep(EpRec& rec, bool force);
  void reap_endpoints();
  static ucs_status_t on_handshake_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                      const ucp_am_recv_param_t* param);
  static void on_conn_request(ucp_conn_request_h req, void* arg);
  static void on_ep_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  // ---- frames (ucx_link.cpp) ----
  static ucs_status_t on_frame_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                  const ucp_am_recv_param_t* param);

  uint16_t version_;
  int wake_fd_ = -1;
  std::thread thread_;
  std::mutex cmd_mu_;
  std::deque<std::function<void()>> cmds_;

  mutable std::mutex info_mu_;
  bool connect_called_ = false;
  std::vector<std::thread> redial_threads_;  // gate handshakes of redial(), joined at destruction (info_mu_)
  std::unique_ptr<Gate> gate_;
  std::vector<std::string> ucx_notes_;

  // loop-thread state
  bool stopping_ = false;
  std::unique_ptr<Context> context_;
  std::unique_ptr<Worker> worker_;
  std::unique_ptr<Listener> listener_;
  std::unordered_map<ucp_ep_h, std::unique_ptr<EpRec>> eps_;
  std::map<ucp_ep_h, bool> close_force_;
  std::vector<PeerConn> conns_;
  bool connect_started_ = false;
  bool connected_ = false;
  bool joining_ = false;                                  // connect(kJoin); set before the loop sees the connect
  std::vector<std::unique_ptr<PeerLink>> retired_links_;  // of replaced channels (they may still drain)
  Clock::time_point connect_deadline_{};
  std::shared_ptr<detail::OpState> connect_done_;
};

}  // namespace geoloco::transport::ucx
