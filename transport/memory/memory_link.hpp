// MemoryLink: the Link (link.hpp) of one MemoryTransport to one peer on its fabric. Frames go
// through MemoryFabric::transmit; held frames are the fabric's messages, by id.
#pragma once

#include "transport/memory/memory_fabric.hpp"

namespace geoloco::transport::memory {

class MemoryLink : public Link {
 public:
  MemoryLink(MemoryFabric& fabric, int self, int lanes) : fabric_(fabric), self_(self), lanes_(lanes) {}
  // Paired with endpoint `peer` as connection `conn` (unique on the fabric): frames of an
  // earlier connection between the same two endpoints (a redial's) are not delivered to it.
  void set_peer(int peer, uint64_t conn) {
    peer_ = peer;
    conn_ = conn;
  }
  uint64_t conn() const { return conn_; }

  bool lane_up(int lane) const override { return !aborted_ && peer_ >= 0 && lane >= 0 && lane < lanes_; }
  std::optional<std::string> send_frame(int lane, std::span<const uint8_t> header, std::span<const uint8_t> payload,
                                        bool eager, SendDone done) override;
  std::optional<Fetched> fetch(const HeldData& data, std::span<uint8_t> dst, FetchDone done) override;
  void release(const HeldData& data) override;
  void abort() override;

 private:
  MemoryFabric& fabric_;
  int self_, peer_ = -1, lanes_;
  uint64_t conn_ = 0;
  bool aborted_ = false;
};

}  // namespace geoloco::transport::memory
