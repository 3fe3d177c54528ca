// UcxTransport: frames in and out over UCX active messages (ucx_link.hpp).
#include "transport/ucx/ucx_link.hpp"

#include <fmt/format.h>

namespace geoloco::transport::ucx {

bool UcxTransport::PeerLink::lane_up(int lane) const {
  if (t_.conns_[static_cast<size_t>(peer_)].gen != gen_) return false;  // replaced by a rejoin
  const auto& eps = t_.conns_[static_cast<size_t>(peer_)].lane_ep;
  return lane >= 0 && static_cast<size_t>(lane) < eps.size() && eps[static_cast<size_t>(lane)] != nullptr;
}

namespace {
struct SendCtx {
  Link::SendDone done;
};
struct FetchCtx {
  Link::FetchDone done;
};
}  // namespace

std::optional<std::string> UcxTransport::PeerLink::send_frame(int lane, std::span<const uint8_t> header,
                                                              std::span<const uint8_t> payload, bool eager,
                                                              SendDone done) {
  ucp_ep_h ep = t_.conns_[static_cast<size_t>(peer_)].lane_ep[static_cast<size_t>(lane)];
  auto ctx = std::make_unique<SendCtx>(SendCtx{std::move(done)});
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FIELD_FLAGS;
  prm.flags = UCP_AM_SEND_FLAG_REPLY;
  if (eager) prm.flags |= UCP_AM_SEND_FLAG_EAGER;
  prm.cb.send = [](void* request, ucs_status_t status, void* user) {
    std::unique_ptr<SendCtx> c(static_cast<SendCtx*>(user));
    ucp_request_free(request);
    c->done(status == UCS_OK ? std::string() : std::string(ucs_status_string(status)));
  };
  prm.user_data = ctx.get();
  void* r = ucp_am_send_nbx(ep, kAmFrame, header.data(), header.size(), payload.data(), payload.size(), &prm);
  if (UCS_PTR_IS_PTR(r)) {
    ctx.release();  // the callback owns it
    return std::nullopt;
  }
  const ucs_status_t st = UCS_PTR_STATUS(r);
  return st == UCS_OK ? std::string() : std::string(ucs_status_string(st));
}

std::optional<Link::Fetched> UcxTransport::PeerLink::fetch(const HeldData& data, std::span<uint8_t> dst,
                                                           FetchDone done) {
  auto ctx = std::make_unique<FetchCtx>(FetchCtx{std::move(done)});
  ucp_request_param_t prm{};
  prm.op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA;
  prm.cb.recv_am = [](void* request, ucs_status_t status, size_t length, void* user) {
    std::unique_ptr<FetchCtx> c(static_cast<FetchCtx*>(user));
    ucp_request_free(request);
    c->done(Fetched{status == UCS_OK ? std::string() : std::string(ucs_status_string(status)), length});
  };
  prm.user_data = ctx.get();
  void* r = ucp_am_recv_data_nbx(t_.worker_->get(), data.token, dst.data(), dst.size(), &prm);
  if (UCS_PTR_IS_PTR(r)) {
    ctx.release();
    return std::nullopt;
  }
  if (UCS_PTR_IS_ERR(r)) return Fetched{ucs_status_string(UCS_PTR_STATUS(r)), 0};
  return Fetched{"", dst.size()};
}

void UcxTransport::PeerLink::release(const HeldData& data) {
  if (data.token != nullptr) ucp_am_data_release(t_.worker_->get(), data.token);
}

void UcxTransport::PeerLink::abort() {
  for (auto& [h, rec] : t_.eps_)
    if (rec->peer == peer_ && rec->gen == gen_ && !rec->dead) t_.kill_ep(*rec, true);
}

ucs_status_t UcxTransport::on_frame_am(void* arg, const void* header, size_t header_length, void* data, size_t length,
                                       const ucp_am_recv_param_t* param) {
  auto* self = static_cast<UcxTransport*>(arg);
  if (!(param->recv_attr & UCP_AM_RECV_ATTR_FIELD_REPLY_EP)) {
    self->count_unauthenticated_frame("frame without a sender endpoint");
    return UCS_OK;
  }
  auto it = self->eps_.find(param->reply_ep);
  if (it == self->eps_.end() || !it->second->ready || it->second->dead || it->second->peer < 0 ||
      it->second->gen != self->conns_[static_cast<size_t>(it->second->peer)].gen) {
    self->count_unauthenticated_frame(fmt::format("frame on an unauthenticated connection from {}",
                                                  it == self->eps_.end() ? std::string("?") : it->second->remote));
    return UCS_OK;
  }
  const bool rndv = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_RNDV) != 0;
  const bool persistent = (param->recv_attr & UCP_AM_RECV_ATTR_FLAG_DATA) != 0;
  HeldData held;
  held.token = (rndv || (persistent && length > 0)) ? data : nullptr;
  held.bytes = rndv ? nullptr : static_cast<const uint8_t*>(data);
  held.length = length;
  held.needs_fetch = rndv;
  held.keepable = rndv || persistent;
  // An unconsumed descriptor returned with UCS_OK is freed (or, for rendezvous, dropped) by UCX.
  const auto d = self->channel(it->second->peer)
                     .on_frame(std::span<const uint8_t>(static_cast<const uint8_t*>(header), header_length), held);
  return d == Disposition::kKept ? UCS_INPROGRESS : UCS_OK;
}

}  // namespace geoloco::transport::ucx
