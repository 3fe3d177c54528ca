// The in-memory backend: a MemoryFabric connects MemoryTransports living in one process,
// for tests. The protocol above it is the real one (channel.hpp: frames, reassembly,
// credits, deadlines; handshake_session.hpp at connect); only the wire is memory.
//
// Deterministic delivery: one fabric thread runs every endpoint's protocol and delivers
// frames in the order they were sent, per lane (a delayed frame holds back those behind it,
// as on a TCP connection). So given the same calls, the same frames arrive in the same order
// and a fault aimed at "the 3rd pseudo-gradient frame from lyon/0" lands at that frame.
//
// Faults (add_fault, or at once with kill/stall/resume):
//   drop     the frame is lost (its sender sees it sent)
//   delay    the frame (and its lane behind it) arrives delay_s later
//   corrupt  one payload bit flips in flight: the receiver's checksum catches it
//   garbage  the payload is replaced by random bytes with a valid checksum: a peer sending
//            well-framed nonsense, which the layer above must refuse
//   stall    from this frame on the sender is frozen, alive but stuck (as SIGSTOP): it sends,
//            receives and times out nothing until resume() (or delay_s later, as SIGCONT)
//   kill     the sender dies just before this frame: its connections drop, every peer's
//            operations with it fail as on a lost TCP connection, its own fail too
// Frames larger than `rendezvous_bytes` arrive as rendezvous (the receiver fetches the data;
// the send completes then), exercising the same paths as UCX's rendezvous.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "transport/engine.hpp"

namespace geoloco::transport::memory {

// kCut: a link cut that heals. From the matching frame on, every frame (any kind, credits
// included) on the links the fault names waits until delay_s after that frame, then they
// arrive in order: a partition of delay_s seconds (its own nth/count only pick the trigger).
enum class FaultAction { kDrop, kDelay, kCorrupt, kGarbage, kStall, kKill, kCut };

// Which frames a fault applies to, and what it does. Empty site / rank -1 / no kind: any.
struct Fault {
  FaultAction action = FaultAction::kDrop;
  std::string from_site;
  int from_rank = -1;
  std::string to_site;
  int to_rank = -1;
  std::optional<FrameKind> kind;  // credit frames match only when named
  uint64_t nth = 1;               // the first matching frame it applies to (1-based)
  uint64_t count = 1;             // matching frames from the nth on it applies to (0: all)
  double delay_s = 0;             // kDelay: how late; kStall: resumes after this long (0: at resume());
                                  // kCut: how long the link stays cut
  uint64_t seed = 1;              // kCorrupt (which bit), kGarbage (which bytes)
};

struct FabricOptions {
  double latency_s = 0;           // one-way delay of every frame
  uint64_t rendezvous_bytes = 0;  // payloads above this many bytes are fetched (0: never)
};

class MemoryTransport;

class MemoryFabric {
 public:
  explicit MemoryFabric(FabricOptions options = {});
  // Every endpoint must be destroyed before its fabric.
  ~MemoryFabric();
  MemoryFabric(const MemoryFabric&) = delete;
  MemoryFabric& operator=(const MemoryFabric&) = delete;

  // A transport on this fabric (then connect() it). The site/rank must be unique among the
  // live endpoints (a killed one may be replaced: a restarted process).
  std::unique_ptr<MemoryTransport> endpoint(TransportConfig cfg, Identity self, TestHooks hooks = {});

  // Takes effect for frames sent after the call (thread-safe).
  void add_fault(Fault f);
  // Now, whatever is in flight: kill drops the endpoint's connections; stall freezes it;
  // resume unfreezes it (what queued up for it is processed in order).
  void kill(const std::string& site, int rank);
  void stall(const std::string& site, int rank);
  void resume(const std::string& site, int rank);
  // Frames the fabric delivered so far from site/rank (any kind), and faults applied.
  uint64_t frames_from(const std::string& site, int rank) const;
  uint64_t faults_applied() const;
  // When each cut that fired heals (its held frames arrive from then on), in the order they
  // fired: a test checks against it where its cut ended, instead of assuming it.
  std::vector<Clock::time_point> cut_heals() const;

  // Runs `fn` on the fabric thread and waits for it.
  void run_sync(std::function<void()> fn);

 private:
  friend class MemoryTransport;
  friend class MemoryLink;
  // A frame on the fabric.
  struct Message {
    uint64_t id = 0;
    int from = -1, to = -1, lane = 0;
    uint64_t conn = 0;  // the connection (MemoryLink::conn) it was sent on
    std::vector<uint8_t> header, payload;
    bool rndv = false;
    Link::SendDone sender_done;  // rendezvous: the send completes when the data is fetched
  };
  struct Event {
    Clock::time_point due;
    uint64_t seq;
    int owner;  // endpoint id, or -1
    std::function<void()> fn;
    bool operator>(const Event& o) const { return due != o.due ? due > o.due : seq > o.seq; }
  };
  struct Endpoint {
    MemoryTransport* t = nullptr;
    bool dead = false;
    bool frozen = false;
    std::vector<Event> backlog;  // events that reached it while frozen
  };

  void schedule(Clock::time_point due, int owner, std::function<void()> fn);
  void loop();
  void run_event(Event& e);
  int register_endpoint(MemoryTransport* t);
  void unregister_endpoint(int id);
  int find(const std::string& site, int rank) const;  // fabric thread
  // Fabric thread: a frame leaves `from` (its channel to `to`) on `lane`.
  std::optional<std::string> transmit(int from, int to, int lane, std::span<const uint8_t> header,
                                      std::span<const uint8_t> payload, bool eager, Link::SendDone done, uint64_t conn);
  void deliver(std::shared_ptr<Message> m);
  void do_kill(int id, const std::string& why);
  void announce_death(int id, const std::string& why);
  Clock::time_point after_frames_of(int id) const;
  // Fails every peer's channel to endpoint `id` with message(peer as that endpoint names it);
  // `clean`: a shutdown after everything it sent arrived (Channel::peer_closed).
  void disconnect_peers(int id, const std::function<std::string(const PeerInfo&)>& message, bool quiet,
                        bool clean = false);
  void do_stall(int id);
  void do_resume(int id);
  // Fabric thread: the first matching fault's action for a frame (and counts it).
  std::optional<Fault> match_fault(int from, int to, const FrameHeader& h);

  const FabricOptions opt_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> queue_;
  uint64_t seq_ = 0;
  bool stopping_ = false;
  std::vector<std::pair<Fault, uint64_t>> faults_;  // (fault, matching frames seen)
  uint64_t faults_applied_ = 0;
  std::vector<Clock::time_point> cut_heals_;  // cuts_'s heal times, for cut_heals()
  std::map<std::pair<std::string, int>, uint64_t> frames_from_;

  // fabric thread
  std::vector<Endpoint> endpoints_;
  std::map<std::pair<int, int>, Clock::time_point> lane_free_;  // (from, to*64 + lane) -> last delivery
  std::map<uint64_t, std::shared_ptr<Message>> held_;           // frames a channel kept
  std::vector<std::pair<Fault, Clock::time_point>> cuts_;       // kCut faults fired: (links, healed at)
  uint64_t next_msg_ = 1;
  uint64_t next_conn_ = 0;  // connections paired so far (MemoryLink::conn)
  std::thread thread_;
};

// A transport on a MemoryFabric: the same Transport API, peers found by (site, rank).
class MemoryTransport : public EngineTransport {
 public:
  ~MemoryTransport() override;
  // Connects to every peer (host and port are not used) and runs the handshake with each, so
  // wrong keys, versions and configs are refused as they are over UCX; within
  // connect_timeout_s. Throws HandshakeError / TimeoutError as UcxTransport::connect does.
  // ConnectMode::kJoin: as over UCX (peer.hpp), a process that joins a running job.
  void connect(std::vector<PeerInfo> peers, ConnectMode mode = ConnectMode::kAll);
  void post(std::function<void()> fn) override;
  void redial(int peer) override;

 private:
  friend class MemoryFabric;
  friend class MemoryLink;
  MemoryTransport(MemoryFabric& fabric, TransportConfig cfg, Identity self, TestHooks hooks);
  // Fabric thread.
  void try_connect();
  bool pair(MemoryTransport* d, size_t di, MemoryTransport* l, size_t li);
  void check_connect_deadline(Clock::time_point now, Clock::time_point& next);
  void finish_connect(FailKind kind, const std::string& msg);
  bool pass(Clock::time_point now, Clock::time_point& next);

  MemoryFabric& fabric_;
  int id_ = -1;
  uint16_t version_;
  // Fabric thread state.
  // Whether `peer` (a connected peer of ours, index i) takes this joiner in: its channel to us
  // failed or closed (the process it knew is gone).
  bool takes_rejoin(size_t i) { return connected_ && channel(static_cast<int>(i)).failed(); }
  std::vector<PeerInfo> want_;  // the peers connect() named
  bool joining_ = false;
  std::vector<int> peer_ids_;  // fabric endpoint id per peer, -1 until paired
  std::vector<std::string> last_error_;
  std::string fatal_;
  std::shared_ptr<detail::OpState> connect_done_;
  Clock::time_point connect_deadline_{};
  Clock::time_point unreachable_at_{};  // kJoin: a peer with no live endpoint by then is given up
  bool connected_ = false;
  std::vector<std::unique_ptr<Link>> links_;
};

}  // namespace geoloco::transport::memory
