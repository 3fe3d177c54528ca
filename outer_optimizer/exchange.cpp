// The all-to-all exchange's average, the members' weights, and what both exchanges share
// (exchange.hpp).
#include "outer_optimizer/exchange.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"
#include "outer_optimizer/owner_exchange.hpp"

namespace geoloco::outer {

std::vector<Slice> Exchange::frames(const FragmentState& f) const {
  std::vector<Slice> out;
  for (const Segment& sg : f.segments)
    for (size_t j = 0; j < frames_per_segment(); ++j) out.push_back(frame(sg, j));
  return out;
}

std::unique_ptr<Exchange> make_exchange(ExchangeKind kind, int sites, int self) {
  GEOLOCO_CHECK(kind != ExchangeKind::Auto, "the exchange in force is all_to_all or owner, not auto");
  if (kind == ExchangeKind::Owner) return std::make_unique<OwnerExchange>(sites, self);
  return std::make_unique<AllToAllExchange>();
}

std::vector<float> member_weights(Weighting weighting, uint64_t round, SiteMask members, int sites,
                                  const std::vector<uint64_t>& tokens, bool require_tokens) {
  std::vector<int> m;
  for (int s = 0; s < sites; ++s)
    if ((members >> s) & 1) m.push_back(s);
  std::vector<float> weight(static_cast<size_t>(sites), m.empty() ? 0.0f : 1.0f / static_cast<float>(m.size()));
  if (weighting == Weighting::Tokens) {
    double total = 0;
    for (int s : m) total += static_cast<double>(tokens.at(static_cast<size_t>(s)));
    if (total <= 0 && require_tokens)
      throw Error(fmt::format("outer round {}: no member site reported any tokens", round));
    if (total > 0)
      for (int s : m)
        weight[static_cast<size_t>(s)] = static_cast<float>(double(tokens[static_cast<size_t>(s)]) / total);
  }
  return weight;
}

void add_own_error(const FragmentState& f, const Round& r, double& err2, double& ref2) {
  for (size_t i = 0; i < f.n; ++i) {
    const double d = double(r.decoded[i]) - double(r.delta[i]);
    err2 += d * d;
    ref2 += double(r.delta[i]) * double(r.delta[i]);
  }
}

void AllToAllExchange::average(const ExchangeContext& ctx, FragmentState& f, Round& r, SiteMask members,
                               const std::vector<std::vector<Envelope>>& env, const std::vector<uint64_t>& tokens,
                               double& err2, double& ref2) const {
  const SitePeers& peers = ctx.peers;
  const int S = peers.sites(), self = peers.site(), rank = peers.rank();
  const auto& pieces = peers.layout().pieces();
  const size_t K = f.segments.size();
  const uint64_t round = r.inbox.round;
  // Every element sums its sites in site order, each segment from the piece's owner there.
  const std::vector<float> weight =
      member_weights(ctx.opt.outer.weighting, round, members, S, tokens, /*require_tokens=*/K > 0);
  std::fill(r.avg.begin(), r.avg.end(), 0.0f);
  for (int s = 0; s < S; ++s) {
    if (!((members >> s) & 1)) continue;
    const float w = weight[static_cast<size_t>(s)];
    for (size_t k = 0; k < K; ++k) {
      const Segment& sg = f.segments[k];
      const std::span<float> out(r.decoded.data() + sg.begin, sg.size());
      try {
        f.pipeline->decode(env[static_cast<size_t>(s)][k].body, sg.size(), out);
      } catch (const compression::FrameError& e) {
        const int sender = s == self ? rank : pieces[sg.piece].owner[static_cast<size_t>(s)];
        throw Error(fmt::format("outer round {}: pseudo-gradient from {} rejected: {}", round,
                                s == self ? std::string("self") : peers.name_of(s, sender), e.what()));
      }
      for (size_t i = sg.begin; i < sg.end; ++i) r.avg[i] += w * r.decoded[i];
    }
    // This rank's own frame, as every member decodes it: the round's error figures.
    if (s == self && !r.inbox.err_known) add_own_error(f, r, err2, ref2);
  }
  if (r.inbox.err_known) {
    err2 = r.inbox.err2;
    ref2 = r.inbox.ref2;
  }
}

}  // namespace geoloco::outer
