// outer.exchange: owner: slices, the second phase (averages) and its decoding (owner_exchange.hpp).
#include "outer_optimizer/owner_exchange.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>

#include "outer_optimizer/round_wait.hpp"
#include "core/error.hpp"
#include "core/trace.hpp"

namespace geoloco::outer {

Slice owner_slice(const Segment& sg, int site, int sites) {
  GEOLOCO_CHECK(sites > 0 && site >= 0 && site < sites, "slice {} of {}", site, sites);
  const size_t n = sg.size(), S = static_cast<size_t>(sites), j = static_cast<size_t>(site);
  return {sg.begin + n * j / S, sg.begin + n * (j + 1) / S};
}

Slice OwnerExchange::frame(const Segment& sg, size_t j) const { return owner_slice(sg, static_cast<int>(j), sites_); }

size_t owned_count(const FragmentState& f, int site, int sites) {
  size_t n = 0;
  for (const auto& sg : f.segments) n += owner_slice(sg, site, sites).size();
  return n;
}

void expand_owned(const FragmentState& f, int site, int sites, std::span<const float> owned,
                  std::span<float> gathered) {
  GEOLOCO_CHECK(owned.size() == owned_count(f, site, sites) && gathered.size() == f.n,
                "fragment {}: {} owned values for {} into {} for {}", f.index, owned.size(),
                owned_count(f, site, sites), gathered.size(), f.n);
  std::fill(gathered.begin(), gathered.end(), 0.0f);
  size_t at = 0;
  for (const auto& sg : f.segments) {
    const Slice sl = owner_slice(sg, site, sites);
    std::copy_n(owned.begin() + static_cast<std::ptrdiff_t>(at), sl.size(),
                gathered.begin() + static_cast<std::ptrdiff_t>(sl.begin));
    at += sl.size();
  }
}

void gather_owned(const FragmentState& f, int site, int sites, std::span<const float> gathered,
                  std::span<float> owned) {
  GEOLOCO_CHECK(owned.size() == owned_count(f, site, sites) && gathered.size() == f.n,
                "fragment {}: {} owned values for {} from {} for {}", f.index, owned.size(),
                owned_count(f, site, sites), gathered.size(), f.n);
  size_t at = 0;
  for (const auto& sg : f.segments) {
    const Slice sl = owner_slice(sg, site, sites);
    std::copy_n(gathered.begin() + static_cast<std::ptrdiff_t>(sl.begin), sl.size(),
                owned.begin() + static_cast<std::ptrdiff_t>(at));
    at += sl.size();
  }
}

void OwnerExchange::own_error(const ExchangeContext& ctx, FragmentState& f, Round& r) const {
  RoundInbox& in = r.inbox;
  if (in.err_known) return;  // (quantized on the device: the device computed them)
  const int S = sites_, self = self_, rank = ctx.peers.rank();
  for (size_t k = 0; k < f.segments.size(); ++k)
    for (int j = 0; j < S; ++j) {
      const Slice sl = owner_slice(f.segments[k], j, S);
      const auto& mine = *in.mine[sent_to(k, j)];
      const Envelope e = read_envelope(mine, EnvelopeKind::kPseudoGradient, in.round, static_cast<uint32_t>(self),
                                       static_cast<uint32_t>(rank), mine.size(), "self");
      f.pipeline->decode(e.body, sl.size(), std::span<float>(r.decoded.data() + sl.begin, sl.size()));
    }
  add_own_error(f, r, in.err2, in.ref2);
  in.err_known = true;
}

void OwnerExchange::after_contributions(const ExchangeContext& ctx, FragmentState& f, Round& r, SiteMask active,
                                        std::chrono::steady_clock::time_point deadline, double deadline_s,
                                        int tid) const {
  RoundInbox& in = r.inbox;
  const SitePeers& peers = ctx.peers;
  const int S = peers.sites(), self = peers.site(), rank = peers.rank();
  const auto& pieces = peers.layout().pieces();
  const size_t K = f.segments.size(), Su = static_cast<size_t>(S), me = static_cast<size_t>(self);
  const uint64_t round = in.round;
  const SiteMask all = S >= 64 ? ~SiteMask{0} : (SiteMask{1} << S) - 1;
  in.avg_bytes.assign(Su, {});
  GEOLOCO_CHECK(!f.owner_ef || f.owner_ef->size() == owned_count(f, self, S),
                "fragment {}: an owner residual of {} elements, but this site owns {}", f.index, f.owner_ef->size(),
                owned_count(f, self, S));
  if (active != all || (active & ~in.holds) != 0) {
    // Without every site's slice there is no average to send: the round cannot be decided
    // with every site, which the owner exchange needs (outer.min_sites = S).
    spdlog::warn("outer round {}: no averages sent: {}", round,
                 active != all ? fmt::format("sites {} of {} are active", mask_string(active), mask_string(all))
                               : fmt::format("the slices of sites {} did not arrive", mask_string(active & ~in.holds)));
    return;
  }
  auto owner = [&](int s, size_t k) { return pieces[f.segments[k].piece].owner[static_cast<size_t>(s)]; };
  auto contribution = [&](int s, size_t k) -> std::span<const uint8_t> {
    return s == self ? std::span<const uint8_t>(*in.mine[k * Su + me])
                     : std::span<const uint8_t>(in.bytes[static_cast<size_t>(s)][k]);
  };
  auto who = [&](int s, size_t k) { return s == self ? std::string("self") : peers.name_of(s, owner(s, k)); };
  auto envelope = [&](int s, size_t k) {
    return read_envelope(contribution(s, k), EnvelopeKind::kPseudoGradient, round, static_cast<uint32_t>(s),
                         static_cast<uint32_t>(s == self ? rank : owner(s, k)), in.max_frame[k * Su + me], who(s, k));
  };
  {
    TraceSpan sp(ctx.trace, "average", tid);
    // Every envelope of a site's round carries its tokens.
    std::vector<uint64_t> tokens(Su, 0);
    if (K > 0)
      for (int s = 0; s < S; ++s) tokens[static_cast<size_t>(s)] = envelope(s, 0).value;
    const std::vector<float> weight = member_weights(ctx.opt.outer.weighting, round, active, S, tokens, K > 0);
    if (f.owner_ef) r.owner_next.assign(f.owner_ef->size(), 0.0f);
    size_t owned_at = 0;  // this segment's slice in the owner residual
    for (size_t k = 0; k < K; ++k) {
      const Slice sl = owner_slice(f.segments[k], self, S);
      const std::span<float> avg(r.avg.data() + sl.begin, sl.size()), dec(r.decoded.data() + sl.begin, sl.size());
      std::fill(avg.begin(), avg.end(), 0.0f);
      for (int s = 0; s < S; ++s) {
        try {
          f.pipeline->decode(envelope(s, k).body, sl.size(), dec);
        } catch (const compression::FrameError& e) {
          throw Error(fmt::format("outer round {}: pseudo-gradient from {} rejected: {}", round, who(s, k), e.what()));
        }
        const float w = weight[static_cast<size_t>(s)];
        for (size_t i = 0; i < sl.size(); ++i) avg[i] += w * dec[i];
      }
      // Encoded in place after the envelope's header (round_sync.cpp does the same).
      std::vector<uint8_t> bytes;
      bytes.reserve(kEnvelopeBytes + f.pipeline->max_frame_bytes(sl.size()));
      if (f.owner_ef) {
        const std::span<float> next(r.owner_next.data() + owned_at, sl.size());
        const auto residual = f.owner_ef->residual().subspan(owned_at, sl.size());
        std::copy(residual.begin(), residual.end(), next.begin());
        f.pipeline->encode_with_residual(avg, next, bytes, kEnvelopeBytes);
      } else {
        f.pipeline->encode(avg, nullptr, bytes, kEnvelopeBytes);
      }
      owned_at += sl.size();
      seal_envelope(
          Envelope{
              EnvelopeKind::kAverage, round, static_cast<uint32_t>(self), static_cast<uint32_t>(rank), active, {}, {}},
          bytes);
      in.mine_avg.push_back(transport::make_payload(std::move(bytes)));
    }
  }
  in.averaged = active;

  std::vector<int> others;
  for (int s = 0; s < S; ++s)
    if (s != self) others.push_back(s);
  // A site's average of its slice of segment k is at most the raw size of that slice, framed.
  auto max_body = [&](int s, size_t k) {
    return compression::kHeaderBytes + in.infos[k * Su + static_cast<size_t>(s)].raw_bytes + compression::kTrailerBytes;
  };
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<transport::OpHandle> recvs, sends;
  CancelOnExit cancel_recvs{recvs}, cancel_sends{sends};
  for (int s : others)
    for (size_t k = 0; k < K; ++k)
      recvs.push_back(peers.transport()->recv(peers.peer_of(s, owner(s, k)), transport::FrameKind::kAverage, round,
                                              f.segments[k].piece, kEnvelopeBytes + max_body(s, k)));
  for (int s : others)
    for (size_t k = 0; k < K; ++k) {
      sends.push_back(peers.transport()->send(peers.peer_of(s, owner(s, k)), transport::FrameKind::kAverage, round,
                                              f.segments[k].piece, in.mine_avg[k]));
      in.sent_bytes += in.mine_avg[k]->size();
    }
  std::vector<std::string> why(Su);
  for (size_t j = 0; j < others.size(); ++j)
    for (size_t k = 0; k < K; ++k)
      if (std::string e = await_op(sends[j * K + k], deadline, deadline_s); why[others[j]].empty()) why[others[j]] = e;
  if (ctx.trace && !sends.empty()) ctx.trace->span("send_average", tid, t0, std::chrono::steady_clock::now());
  for (size_t j = 0; j < others.size(); ++j) {
    const int s = others[j];
    auto& got = in.avg_bytes[static_cast<size_t>(s)];
    got.assign(K, {});
    for (size_t k = 0; k < K && why[static_cast<size_t>(s)].empty(); ++k) {
      auto& op = recvs[j * K + k];
      if (std::string e = await_op(op, deadline, deadline_s); !e.empty()) {
        why[static_cast<size_t>(s)] = "its average: " + e;
        break;
      }
      auto& b = got[k];
      b = op.take();
      b.resize(op.bytes());
      try {
        const Envelope e = read_envelope(b, EnvelopeKind::kAverage, round, static_cast<uint32_t>(s),
                                         static_cast<uint32_t>(owner(s, k)), max_body(s, k), who(s, k));
        if (e.value != active)
          throw EnvelopeError(fmt::format("outer round {}: the average from {} is over sites {}, this round's are {}",
                                          round, who(s, k), mask_string(e.value), mask_string(active)));
      } catch (const EnvelopeError& e) {
        why[static_cast<size_t>(s)] = e.what();
        spdlog::error("outer round {}: {}", round, e.what());
      }
    }
    if (!why[static_cast<size_t>(s)].empty()) {
      in.holds &= ~(SiteMask{1} << s);
      if (in.missing[static_cast<size_t>(s)].empty()) in.missing[static_cast<size_t>(s)] = why[static_cast<size_t>(s)];
      got.clear();
    }
  }
  if (ctx.trace && !recvs.empty()) ctx.trace->span("receive_average", tid, t0, std::chrono::steady_clock::now());
}

void OwnerExchange::average(const ExchangeContext& ctx, FragmentState& f, Round& r, SiteMask members,
                            const std::vector<std::vector<Envelope>>&, const std::vector<uint64_t>&, double& err2,
                            double& ref2) const {
  const RoundInbox& in = r.inbox;
  const SitePeers& peers = ctx.peers;
  const int S = peers.sites(), self = peers.site(), rank = peers.rank();
  const auto& pieces = peers.layout().pieces();
  if (members != in.averaged)
    throw Error(fmt::format("outer round {}: decided with sites {}, but the owners averaged over {}", in.round,
                            mask_string(members), mask_string(in.averaged)));
  for (size_t k = 0; k < f.segments.size(); ++k)
    for (int j = 0; j < S; ++j) {
      const Slice sl = owner_slice(f.segments[k], j, S);
      const int sender = j == self ? rank : pieces[f.segments[k].piece].owner[static_cast<size_t>(j)];
      const std::string who = j == self ? std::string("self") : peers.name_of(j, sender);
      const std::span<const uint8_t> bytes =
          j == self ? std::span<const uint8_t>(*in.mine_avg.at(k))
                    : std::span<const uint8_t>(in.avg_bytes.at(static_cast<size_t>(j)).at(k));
      const Envelope e = read_envelope(bytes, EnvelopeKind::kAverage, in.round, static_cast<uint32_t>(j),
                                       static_cast<uint32_t>(sender), bytes.size(), who);
      try {
        f.pipeline->decode(e.body, sl.size(), std::span<float>(r.avg.data() + sl.begin, sl.size()));
      } catch (const compression::FrameError& err) {
        throw Error(fmt::format("outer round {}: the average from {} rejected: {}", in.round, who, err.what()));
      }
    }
  err2 = in.err2;  // (computed while the frames travelled: own_error)
  ref2 = in.ref2;
  // The round is applied: its owner residual becomes the fragment's.
  if (f.owner_ef) {
    GEOLOCO_CHECK(r.owner_next.size() == f.owner_ef->size(), "fragment {}: an owner residual of {} elements for {}",
                  f.index, r.owner_next.size(), f.owner_ef->size());
    std::copy(r.owner_next.begin(), r.owner_next.end(), f.owner_ef->residual().begin());
  }
}

}  // namespace geoloco::outer
