// UcxTransport::PeerLink: the Link (link.hpp) of one peer over its UCX lanes -- frames out as
// active messages (eager when the protocol asks), rendezvous data pulled with
// ucp_am_recv_data_nbx, held descriptors released with ucp_am_data_release.
#pragma once

#include "transport/ucx/ucx_transport.hpp"

namespace geoloco::transport::ucx {

inline constexpr unsigned kAmFrame = 8;

class UcxTransport::PeerLink final : public transport::Link {
 public:
  PeerLink(UcxTransport& t, int peer, uint64_t gen) : t_(t), peer_(peer), gen_(gen) {}
  bool lane_up(int lane) const override;
  std::optional<std::string> send_frame(int lane, std::span<const uint8_t> header, std::span<const uint8_t> payload,
                                        bool eager, SendDone done) override;
  std::optional<Fetched> fetch(const HeldData& data, std::span<uint8_t> dst, FetchDone done) override;
  void release(const HeldData& data) override;
  void abort() override;

 private:
  UcxTransport& t_;
  int peer_;
  uint64_t gen_;  // the connection of the peer this link carries (abort closes only its endpoints)
};

}  // namespace geoloco::transport::ucx
