// One fragment's round in two halves around its membership (collect: pseudo-gradient, compress, exchange until the
// deadline; apply: decode and average the members, outer step) and its worker (fragment_sync.hpp).
#include "outer_optimizer/fragment_sync.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <thread>

#include "outer_optimizer/owner_exchange.hpp"
#include "outer_optimizer/round_wait.hpp"
#include "trainer/checkpoint/safetensors.hpp"
#include "trainer/core/error.hpp"
#include "trainer/core/hash.hpp"
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

// The squared error of this rank's contribution as the sites decode it (in f.decoded), and the
// squared values (f.delta): the round's err2 and ref2.
void add_own_error(const Fragment& f, double& err2, double& ref2) {
  for (size_t i = 0; i < f.n; ++i) {
    const double d = double(f.decoded[i]) - double(f.delta[i]);
    err2 += d * d;
    ref2 += double(f.delta[i]) * double(f.delta[i]);
  }
}

}  // namespace

std::vector<Slice> round_slices(const Fragment& f, bool owner, int sites) {
  std::vector<Slice> out;
  for (const Segment& sg : f.segments)
    for (int j = 0; j < (owner ? sites : 1); ++j)
      out.push_back(owner ? owner_slice(sg, j, sites) : Slice{sg.begin, sg.end});
  return out;
}

std::vector<Segment> cut_segments(const std::vector<Range>& local, parallel::ShardRange shard,
                                  const ExchangeLayout& layout, int site, int rank) {
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

void collect_round(Fragment& f, const ExchangeContext& ctx, int64_t step, uint64_t round, uint64_t tokens,
                   std::span<const float> local, SiteMask active, double deadline_s, int tid,
                   const OwnContribution* again) {
  in_outer_step(round, step, [&] {
    const size_t n = f.n;
    const SitePeers& peers = ctx.peers;
    const int S = peers.sites(), self = peers.site(), rank = peers.rank();
    const auto& pieces = peers.layout().pieces();
    const size_t K = f.segments.size();
    RoundInbox& in = f.inbox;
    in = RoundInbox{};
    in.round = round;
    in.step = step;
    in.bytes.assign(static_cast<size_t>(S), {});
    in.missing.assign(static_cast<size_t>(S), {});

    // 1. Pseudo-gradient of this shard (quantized on the device: there, by the snapshot).
    // `local` may be f.delta itself (the snapshot: computed in place).
    const bool staged = f.staged && !again;
    if (!staged)
      for (size_t i = 0; i < n; ++i) f.delta[i] = f.global[i] - local[i];
    if (!ctx.hooks.capture_dir.empty() && !again && !staged) {
      const std::string path = fmt::format("{}/pseudograd.{}.r{}.round{}.safetensors", ctx.hooks.capture_dir,
                                           ctx.cfg.sites[static_cast<size_t>(self)].name, rank, round);
      trainer::TensorWrite t = trainer::f32_tensor("delta", {static_cast<int64_t>(n)}, f.delta);
      trainer::write_safetensors(path, std::span<const trainer::TensorWrite>(&t, 1),
                                 {{"round", std::to_string(round)}, {"step", std::to_string(step)}});
    }

    // 2. Compress each segment, wrap, exchange with the piece's owner at every active site
    // (outer.exchange: owner: each slice of a segment to the site that owns it only).
    const bool owner_mode = ctx.owner;
    const size_t per_segment = owner_mode ? static_cast<size_t>(S) : 1;  // frames per segment
    std::optional<trainer::TraceSpan> compress_span(std::in_place, ctx.trace, "compress", tid);
    if (again) {
      GEOLOCO_CHECK(again->envelopes.size() == K * per_segment, "round {}: {} saved envelopes for {} segments", round,
                    again->envelopes.size(), K);
      in.infos = again->infos;
      in.mine = again->envelopes;
    } else {
      const std::vector<Slice> slices = round_slices(f, owner_mode, S);  // by (segment, owner site)
      GEOLOCO_CHECK(!staged || f.staged->slices.size() == slices.size(),
                    "round {}: {} slices quantized on the device for {} frames", round, f.staged->slices.size(),
                    slices.size());
      for (size_t k = 0; k < K; ++k)
        for (size_t j = 0; j < per_segment; ++j) {
          const Slice sl = slices[k * per_segment + j];
          // The attachment rides once per round and site: with the first segment (rank 0's:
          // piece 0, which rank 0 of every site owns).
          const auto attachment = k == 0 ? std::span<const uint8_t>(f.attachment) : std::span<const uint8_t>();
          // The frame is encoded in place after the envelope's header (not copied into it), in
          // a buffer reserved for the largest frame (untouched reserved pages cost nothing).
          std::vector<uint8_t> mine_bytes;
          mine_bytes.reserve(kEnvelopeBytes + f.pipeline->max_frame_bytes(sl.size()) + attachment.size());
          if (staged) {
            // Quantized on the device: the frame of its scales and codes (the same bytes).
            const auto& st = f.staged->slices[k * per_segment + j];
            GEOLOCO_CHECK(st.elements == sl.size(), "round {}: a device slice of {} elements for {}", round,
                          st.elements, sl.size());
            in.infos.push_back(f.pipeline->encode_staged(st.scales, st.codes, st.elements, mine_bytes, kEnvelopeBytes));
          } else {
            const std::span<const float> part(f.delta.data() + sl.begin, sl.size());
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
          e.step_us = f.step_us;
          seal_envelope(e, mine_bytes);
          in.mine.push_back(transport::make_payload(std::move(mine_bytes)));
        }
    }
    if (staged) {
      in.err2 = f.staged->err2;
      in.ref2 = f.staged->ref2;
      in.err_known = true;
    }
    f.staged.reset();
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
    // What this rank sends site s of segment k, and the index of the frame a site sends it.
    auto sent = [&](int s, size_t k) { return k * per_segment + (owner_mode ? static_cast<size_t>(s) : 0); };
    const size_t got_index = owner_mode ? static_cast<size_t>(self) : 0;
    std::vector<transport::OpHandle> recvs, sends;
    CancelOnExit cancel_recvs{recvs}, cancel_sends{sends};
    for (int s : others)
      for (size_t k = 0; k < K; ++k)
        recvs.push_back(peers.transport()->recv(
            peers.peer_of(s, owner(s, k)), transport::FrameKind::kPseudoGradient, round, f.segments[k].piece,
            kEnvelopeBytes + in.max_frame[k * per_segment + got_index] + kMaxAttachment));
    for (int s : others)
      for (size_t k = 0; k < K; ++k) {
        sends.push_back(peers.transport()->send(peers.peer_of(s, owner(s, k)), transport::FrameKind::kPseudoGradient,
                                                round, f.segments[k].piece, in.mine[sent(s, k)]));
        in.sent_bytes += in.mine[sent(s, k)]->size();
      }
    // outer.exchange: owner: this rank's contribution as the owners decode it, slice by slice,
    // for the round's error figures (here, while the frames travel; all-to-all gets them from
    // the average's decode of its own frame).
    if (owner_mode && !in.err_known) {
      for (size_t k = 0; k < K; ++k)
        for (int j = 0; j < S; ++j) {
          const Slice sl = owner_slice(f.segments[k], j, S);
          const auto& mine = *in.mine[k * per_segment + static_cast<size_t>(j)];
          const Envelope e = read_envelope(mine, EnvelopeKind::kPseudoGradient, round, static_cast<uint32_t>(self),
                                           static_cast<uint32_t>(rank), mine.size(), "self");
          f.pipeline->decode(e.body, sl.size(), std::span<float>(f.decoded.data() + sl.begin, sl.size()));
        }
      add_own_error(f, in.err2, in.ref2);
      in.err_known = true;
    }
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
                        static_cast<uint32_t>(owner(s, k)), in.max_frame[k * per_segment + got_index],
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
    // outer.exchange: owner: the second phase, the averages of the slices.
    if (owner_mode) exchange_averages(f, ctx, active, deadline, deadline_s, tid);
    in.wait_s = std::chrono::duration<double>(Clock::now() - exchange_t0).count();
    // The check of this fragment's previous round, before anything of this round is applied.
    // Its replies were sent right after that round's outer step, before these contributions,
    // so they are in by now; a site late with it is late with its contribution too, and its
    // check waits at most until the deadline (or an instant after a punctual exchange).
    if (f.check) {
      trainer::TraceSpan sp(ctx.trace, "hash_check", tid);
      verify_hash_check(peers, ctx.cfg, *f.check, /*tolerate_lost=*/true,
                        std::max(deadline, Clock::now() + std::chrono::milliseconds(100)));
      f.check.reset();
    }
    return 0;
  });
}

ExchangeResult apply_round(Fragment& f, const ExchangeContext& ctx, SiteMask all_members, SiteMask joiners, int tid) {
  RoundInbox& in = f.inbox;
  const uint64_t round = in.round;
  const SiteMask members = all_members & ~joiners;  // the contributors
  return in_outer_step(round, in.step, [&] {
    const SitePeers& peers = ctx.peers;
    const int S = peers.sites(), self = peers.site(), rank = peers.rank();
    const auto& pieces = peers.layout().pieces();
    const size_t K = f.segments.size();
    const OuterConfig& ocfg = ctx.cfg.outer;
    GEOLOCO_CHECK((members & ~in.holds) == 0 && ((members >> self) & 1), "round {}: members {} not all held ({})",
                  round, mask_string(members), mask_string(in.holds));
    std::optional<trainer::TraceSpan> decode_span(std::in_place, ctx.trace, "decode", tid);

    // 3. Decode every member's contribution, own included, and average in site order (each
    // segment from the piece's owner there; every element sums its sites in site order).
    // outer.exchange: owner: the envelopes of this site's slices (tokens, attachments), and
    // the average of every slice from its owner's second-phase frame.
    const bool owner_mode = ctx.owner;
    const size_t per_segment = owner_mode ? static_cast<size_t>(S) : 1;
    const size_t own_index = owner_mode ? static_cast<size_t>(self) : 0;
    std::vector<std::vector<Envelope>> env(static_cast<size_t>(S));
    std::vector<int> m;
    for (int s = 0; s < S; ++s) {
      if (!((members >> s) & 1)) continue;
      m.push_back(s);
      auto& es = env[static_cast<size_t>(s)];
      for (size_t k = 0; k < K; ++k) {
        const int sender = s == self ? rank : pieces[f.segments[k].piece].owner[static_cast<size_t>(s)];
        const std::span<const uint8_t> bytes = s == self
                                                   ? std::span<const uint8_t>(*in.mine[k * per_segment + own_index])
                                                   : std::span<const uint8_t>(in.bytes[static_cast<size_t>(s)][k]);
        es.push_back(read_envelope(bytes, EnvelopeKind::kPseudoGradient, round, static_cast<uint32_t>(s),
                                   static_cast<uint32_t>(sender), in.max_frame[k * per_segment + own_index],
                                   s == self ? std::string("self") : peers.name_of(s, sender)));
      }
    }
    // A site's tokens and attachment ride in its first segment's envelope (every envelope of a
    // site's round carries the same tokens). A rank with no segment has none to read.
    auto tokens_of = [&](int s) -> uint64_t {
      const auto& es = env[static_cast<size_t>(s)];
      return es.empty() ? 0 : es.front().value;
    };
    std::vector<uint64_t> tokens(static_cast<size_t>(S), 0);
    for (int s : m) tokens[static_cast<size_t>(s)] = tokens_of(s);
    double err2 = 0, ref2 = 0;
    if (owner_mode) {
      GEOLOCO_CHECK(joiners == 0, "round {}: outer.exchange: owner takes in no joiner (min_sites is every site)",
                    round);
      decode_averages(f, ctx, members);
      err2 = in.err2;  // (computed by collect_round)
      ref2 = in.ref2;
      commit_owner_residual(f);
    } else {
      const std::vector<float> weight = member_weights(ocfg, round, members, S, tokens, /*require_tokens=*/K > 0);
      std::fill(f.avg.begin(), f.avg.end(), 0.0f);
      for (int s : m) {
        const float w = weight[static_cast<size_t>(s)];
        for (size_t k = 0; k < K; ++k) {
          const Segment& sg = f.segments[k];
          const std::span<float> out(f.decoded.data() + sg.begin, sg.size());
          try {
            f.pipeline->decode(env[static_cast<size_t>(s)][k].body, sg.size(), out);
          } catch (const compression::FrameError& e) {
            const int sender = s == self ? rank : pieces[sg.piece].owner[static_cast<size_t>(s)];
            throw Error(fmt::format("outer round {}: pseudo-gradient from {} rejected: {}", round,
                                    s == self ? std::string("self") : peers.name_of(s, sender), e.what()));
          }
          for (size_t i = sg.begin; i < sg.end; ++i) f.avg[i] += w * f.decoded[i];
        }
        if (s == self && !in.err_known) add_own_error(f, err2, ref2);
      }
      if (in.err_known) {
        err2 = in.err2;
        ref2 = in.ref2;
      }
    }
    decode_span.reset();

    // 4. Outer step on this shard of the global weights.
    {
      trainer::TraceSpan sp(ctx.trace, "outer_optimizer", tid);
      f.opt->step(f.global, f.avg);
    }
    if (const auto& p = ctx.hooks.perturb_global; p && p->site == self && p->round == round && f.n > 0)
      f.global[0] = std::nextafter(f.global[0], INFINITY);
    if (const auto& p = ctx.hooks.pace; p && (p->site == self || p->site < 0))
      std::this_thread::sleep_for(std::chrono::duration<double>(p->seconds));
    ExchangeResult r;
    r.hash = hash64(f.global.data(), f.global.size() * sizeof(float));
    r.segment_hash = segment_hashes(f.segments, f.global);
    // Posted now, verified at this fragment's next round (or a checkpoint, re-plan, the end).
    if (ocfg.check_hash && peers.transport())
      f.check = post_hash_check(peers, piece_hashes(f.segments, r.segment_hash), round, members);
    // Bytes per peer site: what an all-to-all rank sends each site; the owner exchange's
    // average over the sites it sent to.
    for (const auto& p : in.mine) r.envelope_bytes += p->size();
    r.sent_bytes = in.sent_bytes;
    if (owner_mode) r.envelope_bytes = m.size() > 1 ? in.sent_bytes / (m.size() - 1) : 0;
    r.frame_bytes = in.info.frame_bytes;
    r.elements = in.info.elements;
    r.ratio = in.info.ratio();
    r.err2 = err2;
    r.ref2 = ref2;
    r.members = all_members;
    r.joiners = joiners;
    r.tokens = tokens;
    r.step_us.assign(static_cast<size_t>(S), 0);
    for (int s : m)
      if (const auto& es = env[static_cast<size_t>(s)]; !es.empty())
        r.step_us[static_cast<size_t>(s)] = es.front().step_us;
    r.attachments.assign(static_cast<size_t>(S), {});
    for (int s : m) {
      if (env[static_cast<size_t>(s)].empty()) continue;
      const auto a = env[static_cast<size_t>(s)].front().attachment;
      r.attachments[static_cast<size_t>(s)].assign(a.begin(), a.end());
    }
    r.wait_s = in.wait_s;
    in.bytes.clear();  // the contributions are in f.global now
    return r;
  });
}

void launch_worker(Fragment& f, const ExchangeContext& ctx, int64_t step, uint64_t round, uint64_t tokens,
                   SiteMask active, double deadline_s, int tid) {
  f.in_flight = true;
  f.error = nullptr;
  f.t0 = Clock::now();
  Fragment* fp = &f;
  const ExchangeContext* c = &ctx;
  f.worker = std::thread([fp, c, step, round, tokens, active, deadline_s, tid] {
    try {
      collect_round(*fp, *c, step, round, tokens, fp->delta, active, deadline_s, tid);
    } catch (...) {
      fp->error = std::current_exception();  // rethrown by the inner loop at the join
    }
    fp->t1 = Clock::now();
  });
}

void join_worker(Fragment& f) {
  if (!f.in_flight) return;
  f.worker.join();
  f.in_flight = false;
  if (f.error) {
    auto e = f.error;
    f.error = nullptr;
    f.pending_merge = false;
    std::rethrow_exception(e);
  }
  f.joined_seconds = std::chrono::duration<double>(f.t1 - f.t0).count();
  f.joined = true;
}

}  // namespace geoloco::outer
