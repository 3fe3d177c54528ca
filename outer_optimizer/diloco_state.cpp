// Diloco's checkpoint: the outer state of this rank's shard (global weights, outer-optimizer
// moments, error-feedback residual, in shard layout whatever the fragments), the round
// counters, the plan in force and the merges still due (diloco.hpp). A resumed run continues
// bit for bit: it merges at the same steps as an uninterrupted one.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
#include <limits>

#include "outer_optimizer/diloco.hpp"
#include "outer_optimizer/round_sync.hpp"
#include "outer_optimizer/join_wire.hpp"
#include "outer_optimizer/membership_driver.hpp"
#include "core/error.hpp"

namespace geoloco::outer {

OuterState Diloco::save_state() {
  // Syncs in flight: wait for their results (global weights, outer optimizer and error
  // feedback state all advance in the worker) and checkpoint the merges still due, so a
  // resumed run merges at the same steps as an uninterrupted one.
  // (After a lost quorum the rounds in flight are undecided and stay so: `retries_` has them.)
  const bool lost = !retries_.empty();
  auto retried = [&](int fragment) {
    return std::any_of(retries_.begin(), retries_.end(), [&](const Retry& r) { return r.fragment == fragment; });
  };
  // Collected, not applied yet: decided and applied now (after_inner_step did already at a
  // periodic checkpoint's step).
  if (!lost) decide_in_flight();
  // A checkpoint holds weights every site agreed on. (After a lost quorum the other sites
  // may be out of reach: the rounds exchanged again on resume post checks that cover them.)
  if (!lost) verify_pending_checks();
  // Sites the rounds decided here took in are served what this checkpoint holds.
  if (!lost) serve_admitted(step_);
  // The outer state in shard layout, as views of the fragments' own vectors (no copy: at real
  // size each is the size of the shard).
  OuterState s;
  for (auto& f : frags_) store_->residual_to_host(f->state);  // (quantized on the device: the residual lives there)
  const FragmentState& first = frags_[0]->state;
  s.views["global"] = shard_views([](FragmentState& f) { return std::span<const float>(f.global); });
  if (!first.opt->state_a().empty())
    s.views["opt_a"] = shard_views([](FragmentState& f) { return std::span<const float>(f.opt->state_a()); });
  if (!first.opt->state_b().empty())
    s.views["opt_b"] = shard_views([](FragmentState& f) { return std::span<const float>(f.opt->state_b()); });
  if (first.ef)
    s.views["ef_residual"] = shard_views([](FragmentState& f) { return std::span<const float>(f.ef->residual()); });
  // Kept for the owned elements only: expanded to shard layout for the checkpoint (a copy).
  if (first.owner_ef) s.tensors["owner_ef_residual"] = pack_owner_residual();
  s.metadata["round"] = std::to_string(round_);
  if (lost) {
    // The rounds the quorum was lost in (with overlap: every round then in flight), to
    // exchange again: counters as before the first, this rank's contributions as sent.
    s.metadata["round"] = std::to_string(retries_.front().round - 1);
    s.metadata["retry.count"] = std::to_string(retries_.size());
    s.metadata["retry.rest_of_step"] = retry_rest_ ? "1" : "0";
    for (size_t i = 0; i < retries_.size(); ++i) {
      const Retry& r = retries_[i];
      const std::string p = fmt::format("retry.{}.", i);
      s.metadata[p + "fragment"] = std::to_string(r.fragment);
      s.metadata[p + "round"] = std::to_string(r.round);
      s.metadata[p + "step"] = std::to_string(r.step);
      s.metadata[p + "merge_step"] = std::to_string(r.merge_step);
      // One envelope per segment: the first as "envelope" (what a checkpoint with one
      // segment always held), the others as "envelope.<k>".
      s.metadata[p + "segments"] = std::to_string(r.mine.envelopes.size());
      for (size_t k = 0; k < r.mine.envelopes.size(); ++k)
        s.bytes[k == 0 ? p + "envelope" : fmt::format("{}envelope.{}", p, k)] = *r.mine.envelopes[k];
    }
  }
  s.metadata["fragments"] = std::to_string(frags_.size());
  if (ocfg_.pace_by_time()) s.metadata["pace"] = pace_.save();
  // Tokens trained and committed (the summary's membership.tokens), carried across --resume.
  books_.save(s.metadata);
  if (ocfg_.auto_plan()) {
    // The plan in effect and where its schedule starts; the protocol restarts after a
    // checkpoint (drained above, in the uninterrupted run as in the resumed one).
    s.metadata["planned"] = std::to_string(planned_ ? 1 : 0);
    s.metadata["plan"] = plan_.to_json().dump();
    s.metadata["epoch_start"] = std::to_string(epoch_start_);
    s.metadata["replans"] = std::to_string(planner_.replans());
    s.metadata["plan_protocol"] = planner_.save();
  }
  for (auto& frag : frags_) {
    const FragmentState& f = frag->state;
    const Round& r = frag->round;
    const std::string p = fmt::format("f{}.", f.index);
    s.metadata[p + "last_sync_step"] = std::to_string(f.last_sync_step);
    if (ocfg_.pace_by_time()) s.metadata[p + "last_sync_trained"] = std::to_string(f.last_sync_trained);
    s.metadata[p + "blocking_step"] = std::to_string(f.blocking_step);
    s.metadata[p + "opt_steps"] = std::to_string(f.opt->steps());
    if (r.pending_merge && !(lost && retried(f.index))) {
      s.metadata[p + "pending_merge_step"] = std::to_string(r.merge_step);
      s.metadata[p + "pending_launch_step"] = std::to_string(r.launch_step);
      s.metadata[p + "pending_round"] = std::to_string(r.number);
      s.metadata[p + "pending_frame_bytes"] = std::to_string(r.result.frame_bytes);
      s.metadata[p + "pending_envelope_bytes"] = std::to_string(r.result.envelope_bytes);
      s.metadata[p + "pending_elements"] = std::to_string(r.result.elements);
      std::string tokens;  // the round's contributions, counted when it merges
      for (size_t i = 0; i < r.result.tokens.size(); ++i)
        tokens += fmt::format("{}{}", i ? "," : "", r.result.tokens[i]);
      s.metadata[p + "pending_tokens"] = tokens;
    }
  }
  return s;
}

void Diloco::restore_state(const SafetensorsFile& file) {
  restore_outer(file, /*joining=*/false);
  books_.restore(file, round_);
  if (ocfg_.pace_by_time()) {
    if (!file.metadata().count("outer.pace"))
      throw FileError(file.path(), "has no outer.pace: it was written by a run with outer.pace: steps");
    pace_.restore(file.meta("outer.pace"), file.path());
  }
  resume_retries_.clear();
  resume_retry_rest_ = false;
  const auto& meta = file.metadata();
  const bool listed = meta.count("outer.retry.count") > 0;
  if (!listed && !meta.count("outer.retry.round")) return;
  // Written when rounds lost their quorum: resumed() exchanges them again. (A checkpoint of
  // an earlier version names one blocking round without an index.)
  constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t n = listed ? file.meta_int("outer.retry.count", 1, static_cast<int64_t>(frags_.size())) : 1;
  const int64_t at = file.meta_int("geoloco_step", 0);
  if (listed && meta.count("outer.retry.rest_of_step"))
    resume_retry_rest_ = file.meta_int("outer.retry.rest_of_step", 0, 1) == 1;
  for (int64_t i = 0; i < n; ++i) {
    const std::string p = listed ? fmt::format("outer.retry.{}.", i) : std::string("outer.retry.");
    Retry r;
    r.fragment = static_cast<int>(file.meta_int(p + "fragment", 0, static_cast<int64_t>(frags_.size()) - 1));
    r.round = file.meta_uint(p + "round", 1, kMax);
    r.step = file.meta_int(p + "step", 1, opt_.total_steps);
    r.merge_step = listed ? file.meta_int(p + "merge_step", r.step, opt_.total_steps) : r.step;
    const FragmentState& frag = frags_[static_cast<size_t>(r.fragment)]->state;
    // One envelope per frame: per segment, or with outer.exchange: owner per segment and site.
    const size_t per_segment = exchange_->frames_per_segment();
    const size_t K = exchange_->frame_count(frag);
    const int64_t segments = meta.count(p + "segments") ? file.meta_int(p + "segments", 0, 1 << 24) : 1;
    if (static_cast<size_t>(segments) != K)
      throw FileError(file.path(),
                      fmt::format("{}segments: {} saved contributions, but fragment {} takes {} here ({} segments{}: "
                                  "did a site's rank count or outer.exchange change?)",
                                  p, segments, r.fragment, K, frag.segments.size(),
                                  per_segment > 1 ? fmt::format(" x {} slices", per_segment) : std::string()));
    for (size_t k = 0; k < K; ++k) {
      const auto env = file.u8(k == 0 ? p + "envelope" : fmt::format("{}envelope.{}", p, k));
      r.mine.envelopes.push_back(transport::make_payload(std::vector<uint8_t>(env.begin(), env.end())));
    }
    const bool blocking = r.merge_step == r.step;
    if (blocking && overlapped() && r.step != opt_.total_steps)
      throw FileError(file.path(),
                      "holds an outer round to exchange again, but this run overlaps its syncs "
                      "(outer.overlap_steps or outer.delayed_update changed?)");
    if (!blocking && !overlapped())
      throw FileError(file.path(),
                      "holds overlapped outer rounds to exchange again, but this run has no overlap "
                      "(outer.overlap_steps or outer.delayed_update changed?)");
    const uint64_t expect =
        resume_retries_.empty() ? static_cast<uint64_t>(round_) + 1 : resume_retries_.back().round + 1;
    if (r.round != expect)
      throw FileError(file.path(), fmt::format("{}round {} does not follow round {}", p, r.round, expect - 1));
    // The round the quorum was lost in merges at the checkpoint's step; the others were
    // launched before it and merge later.
    if (r.step > at || r.merge_step < at || (blocking && r.step != at) ||
        std::any_of(resume_retries_.begin(), resume_retries_.end(),
                    [&](const Retry& o) { return o.fragment == r.fragment; }))
      throw FileError(file.path(), fmt::format("{}: launched at step {}, merged at {}, fragment {}: not a round "
                                               "undecided at the checkpoint's step {}",
                                               p, r.step, r.merge_step, r.fragment, at));
    // The contribution's frame info comes from the envelope itself, checked as a peer's would be.
    for (size_t k = 0; k < K; ++k) {
      try {
        const auto& env = *r.mine.envelopes[k];
        const Envelope e =
            read_envelope(env, EnvelopeKind::kPseudoGradient, r.round, static_cast<uint32_t>(opt_.site),
                          static_cast<uint32_t>(opt_.rank), env.size(), "this rank's saved contribution");
        const size_t elements = exchange_->frame(frag.segments[k / per_segment], k % per_segment).size();
        r.mine.infos.push_back(compression::Pipeline::inspect(e.body, elements));
      } catch (const Error& e) {
        throw FileError(file.path(), fmt::format("{}envelope{}: {}", p, k ? fmt::format(".{}", k) : "", e.what()));
      }
    }
    resume_retries_.push_back(std::move(r));
  }
}

void Diloco::resumed(int64_t step) {
  if (resume_retries_.empty()) return;
  const std::vector<Retry> rs = std::exchange(resume_retries_, {});
  GEOLOCO_CHECK(rs.front().step <= step && rs.front().merge_step >= step,
                "outer round {} (launched at step {}, merged at {}) to exchange again, resumed at step {}",
                rs.front().round, rs.front().step, rs.front().merge_step, step);
  if (rs.front().merge_step == rs.front().step) {
    // A blocking round (the only one): the rest of its step had run before it.
    const Retry& r = rs.front();
    if (opt_.rank == 0)
      spdlog::info("outer round {} (inner step {}): its quorum was lost; exchanged again after --resume", r.round,
                   r.step);
    sync(*frags_[static_cast<size_t>(r.fragment)], step, &r);
    // The last step's blocking syncs of the fragments after it, as the uninterrupted run does.
    if (step == opt_.total_steps) final_sync(step);
    serve_admitted(step);
    return;
  }
  // Overlapped rounds: every one's contribution exchanged again first (so a quorum lost
  // again finds them all undecided, as the first time), then decided in round order and
  // applied (their global weights are read at their merges only), each merged at its step.
  for (const Retry& r : rs) {
    if (opt_.rank == 0)
      spdlog::info("outer round {} (launched at inner step {}): {}; exchanged again after --resume", r.round, r.step,
                   &r == &rs.front() ? "its quorum was lost" : "in flight when the quorum was lost");
    Fragment& f = *frags_[static_cast<size_t>(r.fragment)];
    Round& rd = f.round;
    round_ = static_cast<int64_t>(r.round);
    rd.launch_step = r.step;
    rd.number = r.round;
    rd.merge_step = r.merge_step;
    rd.vote_step = step;
    rd.voted = false;
    rd.awaiting_decision = true;
    rd.pending_merge = true;
    snapshot(f, /*quantize=*/false);  // (the round's error stats: against these)
    collect_round(f.state, rd, *exchange_, ctx_, r.step, r.round, 0, rd.delta, membership_.active(r.round),
                  membership_.deadline_s(), trace_tid(f), &r.mine);
  }
  // (A quorum lost again keeps them as the first time did, in the step's merges or not.)
  const bool rest = std::exchange(resume_retry_rest_, false);
  {
    const FlagScope merging{in_merges_, rest};
    for (const Retry& r : rs) {
      Fragment& f = *frags_[static_cast<size_t>(r.fragment)];
      if (r.merge_step <= step)
        complete(f);
      else
        f.round.result = decide_or_keep(f);
    }
  }
  // The rest of the step the quorum was lost at, when it failed in its merges: votes, the
  // last step's syncs, a plan boundary, the launches due, as the uninterrupted run does them.
  if (rest) {
    StepPlan plan = decide_step(step_state(step));
    std::erase_if(plan.rest, [](const Action& a) { return a.act == Act::DecideInFlight; });  // (checkpointed already)
    run_rest(step, plan.rest, true);
  } else if (step == opt_.total_steps) {
    final_sync(step);
  }
  serve_admitted(step);
}

namespace {

// A site's checkpoint steps on the wire (kResumeSteps, kControl (0, kResumeShard)): u32 count,
// then the steps as u64 little-endian, ascending; at most kMaxResumeSteps.
constexpr size_t kMaxResumeSteps = 4096;

std::vector<uint8_t> encode_steps(const std::vector<int64_t>& steps) {
  std::vector<uint8_t> b(4 + 8 * steps.size());
  const uint32_t n = static_cast<uint32_t>(steps.size());
  std::memcpy(b.data(), &n, 4);
  for (size_t i = 0; i < steps.size(); ++i) {
    const uint64_t v = static_cast<uint64_t>(steps[i]);
    std::memcpy(b.data() + 4 + 8 * i, &v, 8);
  }
  return b;
}

std::vector<int64_t> decode_steps(std::span<const uint8_t> b, const std::string& who) {
  auto fail = [&](const std::string& why) -> std::vector<int64_t> {
    throw EnvelopeError(fmt::format("--resume: the checkpoint steps from {} rejected: {}", who, why));
  };
  if (b.size() < 4) return fail(fmt::format("{} bytes, fewer than the 4-byte count", b.size()));
  uint32_t n = 0;
  std::memcpy(&n, b.data(), 4);
  if (n > kMaxResumeSteps) return fail(fmt::format("{} steps (at most {})", n, kMaxResumeSteps));
  if (b.size() != 4 + 8 * size_t{n}) return fail(fmt::format("{} steps in {} bytes", n, b.size()));
  std::vector<int64_t> steps(n);
  for (size_t i = 0; i < n; ++i) {
    uint64_t v = 0;
    std::memcpy(&v, b.data() + 4 + 8 * i, 8);
    if (v > uint64_t(std::numeric_limits<int64_t>::max()) || (i > 0 && int64_t(v) <= steps[i - 1]))
      return fail("steps not ascending");
    steps[i] = static_cast<int64_t>(v);
  }
  return steps;
}

std::string steps_text(const std::vector<int64_t>& steps) {
  if (steps.empty()) return "none";
  std::string t;
  const size_t from = steps.size() > 4 ? steps.size() - 4 : 0;  // the newest few
  if (from) t = "..., ";
  for (size_t i = from; i < steps.size(); ++i) t += fmt::format("{}{}", i > from ? ", " : "", steps[i]);
  return t;
}

}  // namespace

int64_t Diloco::agree_resume_step(const std::vector<int64_t>& steps) {
  if (!peers_.transport() || peers_.sites() < 2) return steps.empty() ? -1 : steps.back();
  GEOLOCO_CHECK_LE(steps.size(), kMaxResumeSteps, "checkpoints to offer");
  constexpr int64_t kNoCommonStep = -2;
  int64_t chosen = -1;
  std::string why;
  if (opt_.rank == 0) {
    const int S = peers_.sites();
    std::vector<transport::SendHandle> sends;
    std::vector<std::pair<int, transport::RecvHandle>> recvs;
    const auto mine = encode_steps(steps);
    for (int s = 0; s < S; ++s) {
      if (s == opt_.site) continue;
      recvs.emplace_back(s, peers_.post_recv(s, 0, kResumeShard, 4 + 8 * kMaxResumeSteps));
      sends.push_back(peers_.send(s, EnvelopeKind::kResumeSteps, 0, kResumeShard, 0, mine));
    }
    std::vector<int64_t> common = steps;
    std::string listing = fmt::format("{}: {}", opt_.name(), steps_text(steps));
    bool any = !steps.empty();
    for (auto& [s, h] : recvs) {
      std::vector<uint8_t> bytes;
      const Envelope e = peers_.read(h, s, EnvelopeKind::kResumeSteps, 0, bytes, 4 + 8 * kMaxResumeSteps);
      const auto theirs = decode_steps(e.body, peers_.name(s));
      any = any || !theirs.empty();
      listing += fmt::format("; {}: {}", opt_.site_name(s), steps_text(theirs));
      std::vector<int64_t> both;
      std::set_intersection(common.begin(), common.end(), theirs.begin(), theirs.end(), std::back_inserter(both));
      common = std::move(both);
    }
    for (auto& op : sends) op.wait();
    chosen = common.empty() ? (any ? kNoCommonStep : -1) : common.back();
    if (chosen == kNoCommonStep)
      why = fmt::format(
          "--resume: no checkpoint step is held by every site ({}); resume needs one every site holds "
          "(train.keep_checkpoints keeps more)",
          listing);
    else if (chosen >= 0 && (steps.empty() || chosen != steps.back()))
      spdlog::info("--resume: the sites hold {}; every site resumes from step {}", listing, chosen);
  }
  // Every rank of the site restores the step its leader agreed on (or stops as it does).
  if (site_.ranks() > 1) {
    const auto all = site_.all_gather(std::as_bytes(std::span<const int64_t>(&chosen, 1)));
    GEOLOCO_CHECK_EQ(all.at(0).size(), sizeof chosen, "resume step bytes");
    std::memcpy(&chosen, all.at(0).data(), sizeof chosen);
  }
  if (chosen == kNoCommonStep)
    throw InputError(opt_.rank == 0 ? why : "--resume: no checkpoint step is held by every site (rank 0 names them)");
  return chosen;
}

void Diloco::restore_outer(const SafetensorsFile& file, bool joining) {
  const std::vector<int64_t> shape = {static_cast<int64_t>(n_)};
  if (ocfg_.auto_plan() && file.metadata().count("outer.planned") && file.meta("outer.planned") == "1") {
    // Rebuild the fragments of the saved plan before reading their state.
    PlanDecision d =
        PlanDecision::from_json(nlohmann::json::parse(file.meta("outer.plan"), nullptr, false), file.path());
    set_schedule(d, std::vector<float>(n_, 0.0f));
    epoch_start_ = file.meta_int("outer.epoch_start", 0);
    planner_.set_replans(static_cast<int>(file.meta_int("outer.replans", 0, std::numeric_limits<int>::max())));
    plan_ = d;
    plan_history_ = {d};
    planned_ = true;
    if (file.metadata().count("outer.plan_protocol"))
      planner_.restore(file.meta("outer.plan_protocol"), file.path(), joining);
  }
  const std::string saved_f = file.meta("outer.fragments");
  if (saved_f != std::to_string(frags_.size()))
    throw FileError(file.path(),
                    fmt::format("holds outer state for {} fragment(s), but this run has outer.fragments: {}", saved_f,
                                frags_.size()));
  // Shard-laid-out tensors back into each fragment's gathered order.
  auto read = [&](const char* name) {
    std::vector<float> v(n_);
    file.copy_f32(name, shape, v);
    return v;
  };
  const FragmentState& first = frags_[0]->state;
  ShardState st;
  st.global = read("outer.global");
  if (!first.opt->state_a().empty()) st.opt_a = read("outer.opt_a");
  if (!first.opt->state_b().empty()) st.opt_b = read("outer.opt_b");
  if (first.ef && !joining) st.ef = read("outer.ef_residual");  // a joiner's residual starts at zero
  // outer.exchange: owner: the owner residual (a checkpoint of an all-to-all run has none:
  // the owners' error feedback starts at zero, as it does at a run's start).
  if (first.owner_ef && !joining) {
    if (file.has("outer.owner_ef_residual"))
      st.owner_ef = read("outer.owner_ef_residual");
    else
      spdlog::info("{}: no owner residual (written with outer.exchange: all_to_all); the owners' starts at zero",
                   file.path());
  }
  unpack_state(st);
  round_ = file.meta_int("outer.round", 0);
  step_ = file.meta_int("geoloco_step", 0);
  for (auto& frag : frags_) {
    FragmentState& f = frag->state;
    Round& r = frag->round;
    const std::string p = fmt::format("outer.f{}.", f.index);
    f.last_sync_step = file.meta_int(p + "last_sync_step", 0);
    if (ocfg_.pace_by_time() && !joining) f.last_sync_trained = file.meta_int(p + "last_sync_trained", 0);
    f.blocking_step = file.meta_int(p + "blocking_step", -1);
    f.opt->set_steps(file.meta_int(p + "opt_steps", 0));
    r.pending_merge = file.metadata().count(p + "pending_merge_step") > 0;
    if (r.pending_merge) {
      r.merge_step = file.meta_int(p + "pending_merge_step", 0);
      r.launch_step = file.meta_int(p + "pending_launch_step", 0);
      r.number = file.meta_uint(p + "pending_round", 1);
      r.result = {};
      r.result.hash = f.hash;
      r.result.segment_hash = f.segment_hash;
      r.result.frame_bytes = file.meta_uint(p + "pending_frame_bytes", 0);
      r.result.envelope_bytes = file.meta_uint(p + "pending_envelope_bytes", 0);
      r.result.elements = file.meta_uint(p + "pending_elements", 0);
      if (file.metadata().count(p + "pending_tokens")) {
        const std::string& text = file.meta(p + "pending_tokens");
        for (size_t at = 0; at < text.size();) {
          const size_t end = std::min(text.find(',', at), text.size());
          const std::string item = text.substr(at, end - at);
          char* stop = nullptr;
          const unsigned long long x = std::strtoull(item.c_str(), &stop, 10);
          if (item.empty() || stop != item.c_str() + item.size())
            throw FileError(file.path(), fmt::format("{}pending_tokens: '{}' is not a token count", p, item));
          r.result.tokens.push_back(x);
          at = end + 1;
        }
      }
      if (!overlapped())
        throw FileError(file.path(),
                        "holds an outer sync still in flight, but this run has no overlap "
                        "(outer.overlap_steps or outer.delayed_update changed?)");
    }
  }
}

}  // namespace geoloco::outer
