// Diloco's joins (docs/elastic.md, "Rejoin and join"): the live side watches for join requests
// of sites out of the run (voted for like contributions: round_membership.hpp) and serves the
// state a round that took a joiner in committed (state_transfer.hpp); the joining side fetches
// it, verifies it against the committed hash and continues from the step it was committed at.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "outer_optimizer/diloco.hpp"
#include "core/hash.hpp"
#include "transport/transport_error.hpp"

namespace geoloco::outer {

namespace {
// A donor serves a joiner that asks nothing for this long no more (it died or gave up).
constexpr double kDonorIdleS = 120;
}  // namespace

void Diloco::serve_admitted(int64_t step) {
  if (!joins_.admitted) return;
  // Rounds still in flight were launched before the joiners had any state: they are decided
  // and merged now, on every member at this same step, so the state served holds every round
  // launched so far and the joiners contribute from the next one. (complete() may admit more.)
  for (auto& f : frags_)
    if (f->round.pending_merge) complete(*f);
  const SiteMask joiners = std::exchange(joins_.admitted, 0);
  serve_joiners(joiners, step);
  membership_.activate(joiners, static_cast<uint64_t>(round_) + 1);
}

SiteMask Diloco::poll_join_requests(uint64_t round) {
  auto* t = peers_.transport();
  if (!t || !ocfg_.allow_join) return 0;
  SiteMask requested = 0;
  const SiteMask in_run = membership_.members();  // active ones and those admitted already: not asking
  for (int s = 0; s < peers_.sites(); ++s) {
    if (s == opt_.site || ((in_run >> s) & 1)) continue;
    // Held when every joiner rank this rank serves asked (the site ANDs its ranks' holdings).
    bool all = true;
    for (JoinWatch& w : joins_.watch[static_cast<size_t>(s)]) {
      // A new connection of that rank (its site was restarted): watch for its request.
      if (const uint64_t gen = t->generation(peers_.peer_of(s, w.rank)); gen != w.gen) {
        w.gen = gen;
        w.requested = false;
        w.recv = peers_.post_recv(s, 0, kJoinShard, 0, w.rank);
      }
      if (w.recv && w.recv->ready()) {
        try {
          std::vector<uint8_t> bytes;
          peers_.read(*w.recv, s, EnvelopeKind::kJoinRequest, 0, bytes, 0, w.rank);
          w.requested = true;
          if (opt_.rank == 0 && w.rank == 0)
            spdlog::info("outer round {}: site {} asks to join the run", round, opt_.site_name(s));
        } catch (const transport::TransportError&) {
          // The connection failed (the site is still gone): watch again once it is back.
        } catch (const EnvelopeError& e) {
          spdlog::warn("outer round {}: join request refused: {}", round, e.what());
        }
        w.recv.reset();
      }
      all = all && w.requested;
    }
    if (all) requested |= SiteMask{1} << s;
  }
  return requested;
}

namespace {

// [r.offset, r.end()) of a vector sharded over the site's ranks (shards tile the buffer in rank
// order; `mine` is this rank's, at `my_shard`), on every rank: each rank contributes the part
// of its shard inside each chunk of at most `chunk` elements, so the contributions in rank order
// are the chunk. Collective over the site.
std::vector<float> gather_range(Site& site, const std::vector<float>& mine, ShardRange my_shard, ShardRange r,
                                int64_t chunk) {
  std::vector<float> out(static_cast<size_t>(r.count));
  for (int64_t c0 = r.offset; c0 < r.end(); c0 += chunk) {
    const int64_t c1 = std::min(r.end(), c0 + chunk);
    const int64_t b = std::clamp(c0, my_shard.offset, my_shard.end()),
                  e = std::clamp(c1, my_shard.offset, my_shard.end());
    const auto part =
        std::span<const float>(mine).subspan(static_cast<size_t>(b - my_shard.offset), static_cast<size_t>(e - b));
    size_t at = static_cast<size_t>(c0 - r.offset);
    for (const auto& bytes : site.all_gather(std::as_bytes(part))) {
      const size_t k = bytes.size() / sizeof(float);
      GEOLOCO_CHECK(bytes.size() % sizeof(float) == 0 && at + k <= static_cast<size_t>(c1 - r.offset),
                    "join: the site's parts of [{}, {}) overflow it", c0, c1);
      if (!bytes.empty())
        std::memcpy(out.data() + at, bytes.data(), bytes.size());  // (an empty part's data() may be null)
      at += k;
    }
    GEOLOCO_CHECK(at == static_cast<size_t>(c1 - r.offset),
                  "join: the site's parts of [{}, {}) cover {} of {} elements", c0, c1,
                  at - static_cast<size_t>(c0 - r.offset), c1 - c0);
  }
  return out;
}

}  // namespace

void Diloco::serve_joiners(SiteMask joiners, int64_t step) {
  const uint64_t round = static_cast<uint64_t>(round_);  // every round launched so far is in the state
  // The state this round committed, as a joiner restores it (restore_outer): global weights,
  // outer-optimizer state, counters; no error-feedback residual (the joiner's starts at zero).
  // Each joiner rank is served the state of its own shard: this rank's, when the sites have one
  // rank count; else assembled from the site's ranks (every rank of the site is here at this
  // step), one joiner shard at a time and in chunks of outer.join_chunk_bytes per collective
  // call, so no rank ever holds more than the shard it serves (nor sends more than NCCL's 4 GiB
  // per call).
  const ShardState st = pack_state();
  const bool assemble = !peers_.layout().uniform() && site_.ranks() > 1;
  std::map<std::string, std::string> meta = {{"geoloco_step", std::to_string(step)},
                                             {"geoloco_config_hash", hex64(opt_.config_hash)},
                                             {"outer.round", std::to_string(round)},
                                             {"outer.fragments", std::to_string(frags_.size())}};
  if (ocfg_.auto_plan()) {
    // The plan in force, where its schedule starts, and the decision due (diloco_state.cpp).
    meta["outer.planned"] = planned_ ? "1" : "0";
    meta["outer.plan"] = plan_.to_json().dump();
    meta["outer.epoch_start"] = std::to_string(epoch_start_);
    meta["outer.replans"] = std::to_string(planner_.replans());
    meta["outer.plan_protocol"] = planner_.save(/*shared=*/true);
  }
  for (const auto& frag : frags_) {
    const FragmentState& f = frag->state;
    const std::string p = fmt::format("outer.f{}.", f.index);
    meta[p + "last_sync_step"] = std::to_string(f.last_sync_step);
    meta[p + "blocking_step"] = std::to_string(f.blocking_step);
    meta[p + "opt_steps"] = std::to_string(f.opt->steps());
  }
  // The image of [sh.offset, sh.end()) from `state`, which holds [have, have + its size), and its manifest.
  auto snapshot = [&](const ShardState& state, int64_t have, ShardRange sh) {
    GEOLOCO_CHECK(sh.offset >= have && sh.end() - have <= static_cast<int64_t>(state.global.size()),
                  "join: shard [{}, {}) outside the state held [{}, {})", sh.offset, sh.end(), have,
                  have + static_cast<int64_t>(state.global.size()));
    auto cut = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + (sh.offset - have), v.begin() + (sh.end() - have));
    };
    const std::vector<float> global = cut(state.global);
    std::vector<float> a, b;
    std::vector<TensorWrite> tensors;
    tensors.push_back(f32_tensor("outer.global", {sh.count}, global));
    if (!state.opt_a.empty()) {
      a = cut(state.opt_a);
      tensors.push_back(f32_tensor("outer.opt_a", {sh.count}, a));
    }
    if (!state.opt_b.empty()) {
      b = cut(state.opt_b);
      tensors.push_back(f32_tensor("outer.opt_b", {sh.count}, b));
    }
    auto snap = std::make_shared<JoinSnapshot>();
    snap->state = encode_safetensors(tensors, meta);
    snap->manifest = describe_state(snap->state, static_cast<uint32_t>(ocfg_.join_chunk_bytes), round, step,
                                    membership_.members(), hash64(global.data(), global.size() * sizeof(float)));
    return std::shared_ptr<const JoinSnapshot>(std::move(snap));
  };
  // A joiner rank's shard of the site's state, assembled on every rank of the site (collective).
  auto assembled = [&](ShardRange sh) {
    const int64_t chunk = std::max<int64_t>(1, ocfg_.join_chunk_bytes / static_cast<int64_t>(sizeof(float)));
    ShardState part;
    for (auto [mine, out] :
         {std::pair{&st.global, &part.global}, std::pair{&st.opt_a, &part.opt_a}, std::pair{&st.opt_b, &part.opt_b}})
      if (!mine->empty()) *out = gather_range(site_, *mine, shard_, sh, chunk);
    return part;
  };
  std::erase_if(joins_.donors, [&](const std::unique_ptr<JoinDonor>& d) {
    if (!d->finished()) return false;
    for (auto& s : joins_.served)
      if (s.donor == d.get()) {
        s.bytes = d->bytes_served();
        s.donor = nullptr;
      }
    return true;
  });
  for (int s = 0; s < peers_.sites(); ++s) {
    if (!((joiners >> s) & 1)) continue;
    uint64_t admitted_in = round;  // the round that took it in (the books key its service by it)
    for (const auto& a : membership_.admissions())
      if (a.site == s) admitted_in = a.round;
    const std::vector<int> mine = peers_.partnered_by(s);
    for (int q = 0; q < peers_.layout().ranks(s); ++q) {
      const ShardRange sh = peers_.layout().shard(s, q);
      const bool serves = std::find(mine.begin(), mine.end(), q) != mine.end();
      std::shared_ptr<const JoinSnapshot> snap;
      if (assemble) {
        const ShardState part = assembled(sh);  // every rank of the site, for every joiner rank
        if (serves) snap = snapshot(part, sh.offset, sh);
      } else if (serves) {
        snap = snapshot(st, shard_.offset, sh);
      }
      if (!serves) continue;
      joins_.donors.push_back(std::make_unique<JoinDonor>(peers_, s, std::move(snap), kDonorIdleS, opt_.hooks, q));
      joins_.served.push_back({admitted_in, step, s, joins_.donors.back().get(), 0});
    }
  }
}

nlohmann::json Diloco::joins_json() const {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& j : membership_.admissions()) {
    nlohmann::json e = {{"round", j.round}, {"step", j.step}, {"site", opt_.site_name(j.site)}};
    uint64_t bytes = 0;
    bool any = false;
    for (const auto& s : joins_.served)
      if (s.round == j.round && s.site == j.site) {
        bytes += s.donor ? s.donor->bytes_served() : s.bytes;
        any = true;
      }
    if (any) e["bytes_served"] = bytes;
    a.push_back(std::move(e));
  }
  return a;
}

int64_t Diloco::join() {
  const std::string& here = opt_.name();
  if (peers_.sites() < 2 || !peers_.transport()) throw ConfigError("--join needs a multi-site run");
  if (opt_.rank == 0) spdlog::info("site {}: joining the running job: asking the other sites to take it in", here);
  JoinResult res = fetch_join_state(peers_, ocfg_.join_wait_s);
  const JoinManifest& m = res.manifest;
  // Every rank of the site joins at the same round (the round's members serve all of them).
  if (site_.ranks() > 1) {
    const uint64_t mine[2] = {m.round, static_cast<uint64_t>(m.step)};
    for (const auto& b : site_.all_gather(std::as_bytes(std::span<const uint64_t>(mine, 2)))) {
      uint64_t theirs[2];
      GEOLOCO_CHECK_EQ(b.size(), sizeof theirs, "join: bytes from a rank");
      std::memcpy(theirs, b.data(), sizeof theirs);
      if (theirs[0] != mine[0] || theirs[1] != mine[1])
        throw JoinError(
            fmt::format("site {}: its ranks were given the state of different rounds ({} at step {} and {} "
                        "at step {})",
                        here, mine[0], mine[1], theirs[0], theirs[1]));
    }
  }
  std::string donors;
  for (int s = 0; s < peers_.sites(); ++s)
    if ((res.donors >> s) & 1) donors += (donors.empty() ? "" : ", ") + opt_.site_name(s);
  const std::string source = fmt::format("the join state from {} (round {})", donors, m.round);
  auto file = SafetensorsFile::parse(std::move(res.state), source);
  if (file.meta("geoloco_config_hash") != hex64(opt_.config_hash))
    throw JoinError(fmt::format("{} is of config {}, this site runs {}", source, file.meta("geoloco_config_hash"),
                                hex64(opt_.config_hash)));
  if (file.meta_int("geoloco_step", 0) != m.step || file.meta_uint("outer.round", 0) != m.round)
    throw JoinError(fmt::format("{} says step {} round {}, its manifest step {} round {}", source,
                                file.meta("geoloco_step"), file.meta("outer.round"), m.step, m.round));
  restore_outer(file, /*joining=*/true);
  // The state must be the committed one before a step is trained on it.
  const ShardState st = pack_state();
  if (const uint64_t h = hash64(st.global.data(), st.global.size() * sizeof(float)); h != m.weights_hash)
    throw JoinError(fmt::format("{}: the global weights hash to {}, the committed hash is {}", source, hex64(h),
                                hex64(m.weights_hash)));
  round_ = static_cast<int64_t>(m.round);
  books_.start_counts_at(round_);  // its counts start at the join (the steps and tokens at 0)
  membership_.set_members(m.members);
  auto shard = site_.shard_params();
  std::copy(st.global.begin(), st.global.end(), shard.begin());
  site_.shard_updated();
  for (auto& f : frags_) {  // tokens from here
    f->state.last_sync_step = std::max(f->state.last_sync_step, m.step);
    f->state.last_sync_trained = books_.trained_steps();
  }
  site_hash_ = combine_site_hash(piece_hashes());
  if (opt_.rank == 0)
    spdlog::info(
        "site {}: joined at outer round {} (inner step {}) from {}: {} bytes in {:.3f} s{}, global weights {} "
        "verified",
        here, m.round, m.step, donors, res.bytes, res.seconds,
        res.refetched ? fmt::format(", {} chunk(s) fetched again", res.refetched) : std::string(), hex64(site_hash_));
  for (const auto& n : res.notes) spdlog::warn("site {}: join: {}", here, n);
  joins_.own = {{"round", m.round},
                {"step", m.step},
                {"seconds", res.seconds},
                {"bytes_fetched", res.bytes},
                {"donors", books_.member_names(res.donors)},
                {"chunks", m.chunks()},
                {"refetched", res.refetched},
                {"warmup_steps", ocfg_.join_warmup_steps},
                {"notes", res.notes}};
  return m.step;
}

}  // namespace geoloco::outer
