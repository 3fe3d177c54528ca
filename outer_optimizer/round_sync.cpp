// One fragment's round in two halves around its membership (collect: pseudo-gradient, compress, exchange until the
// deadline; apply: the members' average, outer step) and its worker (round_sync.hpp).
#include "outer_optimizer/round_sync.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "outer_optimizer/round_wait.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/safetensors.hpp"
#include "core/trace.hpp"
#include "transport/transport_error.hpp"

namespace geoloco::outer {

namespace {

using Clock = std::chrono::steady_clock;

// Runs one round's exchange; a failure (peer lost, timeout, bad frame) names the round.
template <class F>
auto in_outer_step(uint64_t round, int64_t step, F&& run) {
  try {
    return run();
  } catch (Error& e) {
    e.add_context(fmt::format("outer step {} (inner step {})", round, step));
    throw;
  }
}

}  // namespace

std::vector<Segment> cut_segments(const std::vector<Range>& local, ShardRange shard, const ExchangeLayout& layout,
                                  int site, int rank) {
  std::vector<Segment> out;
  const auto& pieces = layout.pieces();
  for (uint32_t pi : layout.pieces_of(site, rank)) {
    // `local` is sorted and relative to the shard: the elements inside the piece are one run
    // of the gathered vector.
    const int64_t b = pieces[pi].begin - shard.offset, e = pieces[pi].end - shard.offset;
    Segment sg;
    sg.piece = pi;
    sg.begin = sg.end = out.empty() ? 0 : out.back().end;  // where it starts even when empty
    size_t k = 0;                                          // gathered elements before range r
    for (const auto& r : local) {
      const int64_t lo = std::max(r.begin, b), hi = std::min(r.end, e);
      if (lo < hi) {
        if (sg.size() == 0) sg.begin = k + static_cast<size_t>(lo - r.begin);
        sg.end = k + static_cast<size_t>(hi - r.begin);
      }
      k += static_cast<size_t>(r.size());
    }
    out.push_back(sg);
  }
  return out;
}

std::vector<uint64_t> segment_hashes(const std::vector<Segment>& segments, std::span<const float> values) {
  std::vector<uint64_t> out;
  for (const auto& sg : segments) out.push_back(hash64(values.data() + sg.begin, sg.size() * sizeof(float)));
  return out;
}

std::vector<PieceHash> piece_hashes(const std::vector<Segment>& segments, const std::vector<uint64_t>& hashes) {
  std::vector<PieceHash> out;
  for (size_t k = 0; k < segments.size(); ++k) out.push_back({segments[k].piece, hashes.at(k)});
  return out;
}

void collect_round(FragmentState& f, Round& r, const Exchange& ex, const ExchangeContext& ctx, int64_t step,
                   uint64_t round, uint64_t tokens, std::span<const float> local, SiteMask active, double deadline_s,
                   int tid, const OwnContribution* again) {
  in_outer_step(round, step, [&] {
    const size_t n = f.n;
    const SitePeers& peers = ctx.peers;
    const int S = peers.sites(), self = peers.site(), rank = peers.rank();
    const auto& pieces = peers.layout().pieces();
    const size_t K = f.segments.size();
    RoundInbox& in = r.inbox;
    in = RoundInbox{};
    in.round = round;
    in.step = step;
    in.bytes.assign(static_cast<size_t>(S), {});
    in.missing.assign(static_cast<size_t>(S), {});

    // 1. Pseudo-gradient of this shard (quantized on the device: there, by the snapshot).
    const bool staged = r.staged && !again;
    if (!staged)
      for (size_t i = 0; i < n; ++i) r.delta[i] = f.global[i] - local[i];
    if (const auto& dir = ctx.opt.hooks.capture_dir; !dir.empty() && !again && !staged) {
      const std::string path =
          fmt::format("{}/pseudograd.{}.r{}.round{}.safetensors", dir, ctx.opt.name(), rank, round);
      TensorWrite t = f32_tensor("delta", {static_cast<int64_t>(n)}, r.delta);
      write_safetensors(path, std::span<const TensorWrite>(&t, 1),
                        {{"round", std::to_string(round)}, {"step", std::to_string(step)}});
    }

    // 2. Compress each frame, wrap it, and exchange: each segment's frames with the piece's
    // owner rank at every active site, as the exchange routes them.
    std::optional<TraceSpan> compress_span(std::in_place, ctx.trace, "compress", tid);
    const std::vector<Slice> frames = ex.frames(f);
    if (again) {
      GEOLOCO_CHECK_EQ(again->envelopes.size(), frames.size(), "round {}: saved envelopes against frames", round);
      in.infos = again->infos;
      in.mine = again->envelopes;
    } else {
      GEOLOCO_CHECK(!staged || r.staged->slices.size() == frames.size(),
                    "round {}: {} slices quantized on the device for {} frames", round, r.staged->slices.size(),
                    frames.size());
      for (size_t i = 0; i < frames.size(); ++i) {
        const Slice sl = frames[i];
        // The attachment rides once per round and site: with the first segment (rank 0's:
        // piece 0, which rank 0 of every site owns).
        const auto attachment =
            i < ex.frames_per_segment() ? std::span<const uint8_t>(r.attachment) : std::span<const uint8_t>();
        // The frame is encoded in place after the envelope's header (not copied into it), in a
        // buffer reserved for the largest frame (untouched reserved pages cost nothing).
        std::vector<uint8_t> mine_bytes;
        mine_bytes.reserve(kEnvelopeBytes + f.pipeline->max_frame_bytes(sl.size()) + attachment.size());
        if (staged) {
          // Quantized on the device: the frame of its scales and codes (the same bytes).
          const auto& st = r.staged->slices[i];
          GEOLOCO_CHECK_EQ(st.elements, sl.size(), "round {}: a device slice's elements", round);
          in.infos.push_back(f.pipeline->encode_staged(st.scales, st.codes, st.elements, mine_bytes, kEnvelopeBytes));
        } else {
          const std::span<const float> part(r.delta.data() + sl.begin, sl.size());
          in.infos.push_back(f.ef ? f.pipeline->encode_with_residual(
                                        part, std::span<float>(f.ef->residual().data() + sl.begin, sl.size()),
                                        mine_bytes, kEnvelopeBytes)
                                  : f.pipeline->encode(part, nullptr, mine_bytes, kEnvelopeBytes));
        }
        Envelope e{EnvelopeKind::kPseudoGradient,
                   round,
                   static_cast<uint32_t>(self),
                   static_cast<uint32_t>(rank),
                   tokens,
                   {},
                   attachment};
        e.step_us = r.step_us;
        seal_envelope(e, mine_bytes);
        in.mine.push_back(transport::make_payload(std::move(mine_bytes)));
      }
    }
    if (staged) {
      in.err2 = r.staged->err2;
      in.ref2 = r.staged->ref2;
      in.err_known = true;
    }
    r.staged.reset();
    for (const auto& i : in.infos) {
      in.info.codec = i.codec;
      in.info.topk = i.topk;
      in.info.zstd = in.info.zstd || i.zstd;
      in.info.elements += i.elements;
      in.info.raw_bytes += i.raw_bytes;
      in.info.frame_bytes += i.frame_bytes;
      // Every site encodes with the same pipeline config, so a peer's frame is at most our
      // raw size plus framing (zstd is only kept when it shrinks the payload).
      in.max_frame.push_back(compression::kHeaderBytes + i.raw_bytes + compression::kTrailerBytes);
    }
    compress_span.reset();
    const auto exchange_t0 = Clock::now();
    // The round's deadline: no site, alive but stuck included, holds this one longer, neither
    // in the exchange nor in the previous round's hash check below.
    const auto deadline =
        exchange_t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(deadline_s));
    std::vector<int> others;
    for (int s = 0; s < S; ++s)
      if (s != self && ((active >> s) & 1)) others.push_back(s);
    // By (other site, segment): the segment's owner there.
    auto owner = [&](int s, size_t k) { return pieces[f.segments[k].piece].owner[static_cast<size_t>(s)]; };
    std::vector<transport::OpHandle> recvs, sends;
    CancelOnExit cancel_recvs{recvs}, cancel_sends{sends};
    for (int s : others)
      for (size_t k = 0; k < K; ++k)
        recvs.push_back(peers.transport()->recv(peers.peer_of(s, owner(s, k)), transport::FrameKind::kPseudoGradient,
                                                round, f.segments[k].piece,
                                                kEnvelopeBytes + in.max_frame[ex.received(k)] + kMaxAttachment));
    for (int s : others)
      for (size_t k = 0; k < K; ++k) {
        const auto& payload = in.mine[ex.sent_to(k, s)];
        sends.push_back(peers.transport()->send(peers.peer_of(s, owner(s, k)), transport::FrameKind::kPseudoGradient,
                                                round, f.segments[k].piece, payload));
        in.sent_bytes += payload->size();
      }
    // The moment a sync goes on the wire, seen from outside the process (a test that kills a
    // site mid-transfer waits for this line instead of guessing with a sleep).
    if (!others.empty())
      spdlog::debug("outer round {} (inner step {}) on the wire: {} bytes to {} site(s)", round, step, in.sent_bytes,
                    others.size());
    ex.own_error(ctx, f, r);  // (the owner exchange: while the frames travel)
    auto await = [&](transport::OpHandle& op) { return await_op(op, deadline, deadline_s); };
    std::vector<std::string> send_error(static_cast<size_t>(S));
    for (size_t j = 0; j < others.size(); ++j)
      for (size_t k = 0; k < K; ++k) {
        std::string why = await(sends[j * K + k]);
        auto& e = send_error[static_cast<size_t>(others[j])];
        if (e.empty()) e = std::move(why);
      }
    if (ctx.trace && !sends.empty()) ctx.trace->span("send", tid, exchange_t0, Clock::now());
    in.holds = SiteMask{1} << self;
    for (size_t j = 0; j < others.size(); ++j) {
      const int s = others[j];
      auto& got = in.bytes[static_cast<size_t>(s)];
      got.assign(K, {});
      std::string why;
      for (size_t k = 0; k < K && why.empty(); ++k) {
        auto& op = recvs[j * K + k];
        why = await(op);
        if (!why.empty()) break;
        auto& b = got[k];
        b = op.take();
        b.resize(op.bytes());
        try {
          read_envelope(b, EnvelopeKind::kPseudoGradient, round, static_cast<uint32_t>(s),
                        static_cast<uint32_t>(owner(s, k)), in.max_frame[ex.received(k)],
                        peers.name_of(s, owner(s, k)));
        } catch (const EnvelopeError& e) {
          why = e.what();
          spdlog::error("outer round {}: {}", round, why);
        }
      }
      // A site we could not send to cannot average our contribution: it is not held either.
      if (why.empty() && !send_error[static_cast<size_t>(s)].empty()) why = send_error[static_cast<size_t>(s)];
      if (why.empty()) {
        in.holds |= SiteMask{1} << s;
      } else {
        in.missing[static_cast<size_t>(s)] = why;
        got.clear();
      }
    }
    if (ctx.trace && !recvs.empty()) ctx.trace->span("receive", tid, exchange_t0, Clock::now());
    ex.after_contributions(ctx, f, r, active, deadline, deadline_s, tid);  // (the owner exchange's averages)
    in.wait_s = std::chrono::duration<double>(Clock::now() - exchange_t0).count();
    // The check of this fragment's previous round, before anything of this round is applied.
    // Its replies were sent right after that round's outer step, before these contributions,
    // so they are in by now; a site late with it is late with its contribution too, and its
    // check waits at most until the deadline (or an instant after a punctual exchange).
    if (f.check) {
      TraceSpan sp(ctx.trace, "hash_check", tid);
      verify_hash_check(peers, ctx.opt, *f.check, /*tolerate_lost=*/true,
                        std::max(deadline, Clock::now() + std::chrono::milliseconds(100)));
      f.check.reset();
    }
    return 0;
  });
}

ExchangeResult apply_round(FragmentState& f, Round& r, const Exchange& ex, const ExchangeContext& ctx,
                           SiteMask all_members, SiteMask joiners, int tid) {
  RoundInbox& in = r.inbox;
  const uint64_t round = in.round;
  const SiteMask members = all_members & ~joiners;  // the contributors
  return in_outer_step(round, in.step, [&] {
    const SitePeers& peers = ctx.peers;
    const int S = peers.sites(), self = peers.site(), rank = peers.rank();
    const auto& pieces = peers.layout().pieces();
    const size_t K = f.segments.size();
    GEOLOCO_CHECK((members & ~in.holds) == 0 && ((members >> self) & 1), "round {}: members {} not all held ({})",
                  round, mask_string(members), mask_string(in.holds));
    GEOLOCO_CHECK(joiners == 0 || ex.kind() != ExchangeKind::Owner,
                  "round {}: outer.exchange: owner takes in no joiner (min_sites is every site)", round);
    std::optional<TraceSpan> decode_span(std::in_place, ctx.trace, "decode", tid);

    // 3. Every member's envelopes (its tokens, step time and attachment ride in the first),
    // each segment's from the piece's owner there, then their average.
    std::vector<std::vector<Envelope>> env(static_cast<size_t>(S));
    std::vector<int> m;
    for (int s = 0; s < S; ++s) {
      if (!((members >> s) & 1)) continue;
      m.push_back(s);
      auto& es = env[static_cast<size_t>(s)];
      for (size_t k = 0; k < K; ++k) {
        const int sender = s == self ? rank : pieces[f.segments[k].piece].owner[static_cast<size_t>(s)];
        const std::span<const uint8_t> bytes = s == self
                                                   ? std::span<const uint8_t>(*in.mine[ex.received(k)])
                                                   : std::span<const uint8_t>(in.bytes[static_cast<size_t>(s)][k]);
        es.push_back(read_envelope(bytes, EnvelopeKind::kPseudoGradient, round, static_cast<uint32_t>(s),
                                   static_cast<uint32_t>(sender), in.max_frame[ex.received(k)],
                                   s == self ? std::string("self") : peers.name_of(s, sender)));
      }
    }
    // A rank with no segment has no envelope to read (its tokens count as 0).
    std::vector<uint64_t> tokens(static_cast<size_t>(S), 0);
    for (int s : m)
      if (const auto& es = env[static_cast<size_t>(s)]; !es.empty()) tokens[static_cast<size_t>(s)] = es.front().value;
    double err2 = 0, ref2 = 0;
    ex.average(ctx, f, r, members, env, tokens, err2, ref2);
    decode_span.reset();

    // 4. Outer step on this shard of the global weights.
    {
      TraceSpan sp(ctx.trace, "outer_optimizer", tid);
      f.opt->step(f.global, r.avg);
    }
    const OuterHooks& hooks = ctx.opt.hooks;
    if (const auto& p = hooks.perturb_global; p && p->site == self && p->round == round && f.n > 0)
      f.global[0] = std::nextafter(f.global[0], INFINITY);
    if (const auto& p = hooks.pace; p && (p->site == self || p->site < 0))
      std::this_thread::sleep_for(std::chrono::duration<double>(p->seconds));
    ExchangeResult res;
    res.hash = hash64(f.global.data(), f.global.size() * sizeof(float));
    res.segment_hash = segment_hashes(f.segments, f.global);
    // Posted now, verified at this fragment's next round (or a checkpoint, re-plan, the end).
    if (ctx.opt.outer.check_hash && peers.transport())
      f.check = post_hash_check(peers, piece_hashes(f.segments, res.segment_hash), round, members);
    // Bytes per peer site: what an all-to-all rank sends each site; the owner exchange's
    // average over the sites it sent to.
    for (const auto& p : in.mine) res.envelope_bytes += p->size();
    res.sent_bytes = in.sent_bytes;
    if (ex.kind() == ExchangeKind::Owner) res.envelope_bytes = m.size() > 1 ? in.sent_bytes / (m.size() - 1) : 0;
    res.frame_bytes = in.info.frame_bytes;
    res.elements = in.info.elements;
    res.ratio = in.info.ratio();
    res.err2 = err2;
    res.ref2 = ref2;
    res.members = all_members;
    res.joiners = joiners;
    res.tokens = tokens;
    res.step_us.assign(static_cast<size_t>(S), 0);
    res.attachments.assign(static_cast<size_t>(S), {});
    for (int s : m) {
      const auto& es = env[static_cast<size_t>(s)];
      if (es.empty()) continue;
      res.step_us[static_cast<size_t>(s)] = es.front().step_us;
      res.attachments[static_cast<size_t>(s)].assign(es.front().attachment.begin(), es.front().attachment.end());
    }
    res.wait_s = in.wait_s;
    in.bytes.clear();  // the contributions are in f.global now
    return res;
  });
}

void launch_worker(FragmentState& f, Round& r, const Exchange& ex, const ExchangeContext& ctx, int64_t step,
                   uint64_t round, uint64_t tokens, SiteMask active, double deadline_s, int tid) {
  r.in_flight = true;
  r.error = nullptr;
  r.t0 = Clock::now();
  FragmentState* fp = &f;
  Round* rp = &r;
  const Exchange* exp = &ex;
  const ExchangeContext* c = &ctx;
  r.worker = std::thread([fp, rp, exp, c, step, round, tokens, active, deadline_s, tid] {
    try {
      collect_round(*fp, *rp, *exp, *c, step, round, tokens, rp->delta, active, deadline_s, tid);
    } catch (...) {
      rp->error = std::current_exception();  // rethrown by the inner loop at the join
    }
    rp->t1 = Clock::now();
  });
}

void join_worker(Round& r) {
  if (!r.in_flight) return;
  r.worker.join();
  r.in_flight = false;
  if (r.error) {
    auto e = r.error;
    r.error = nullptr;
    r.pending_merge = false;
    std::rethrow_exception(e);
  }
  r.joined_seconds = std::chrono::duration<double>(r.t1 - r.t0).count();
  r.joined = true;
}

}  // namespace geoloco::outer
