// Diloco's checkpoint: the outer state of this rank's shard (global weights, outer-optimizer
// moments, error-feedback residual, in shard layout whatever the fragments), the round
// counters, the plan in force and the merges still due (diloco.hpp). A resumed run continues
// bit for bit: it merges at the same steps as an uninterrupted one.
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdlib>
#include <limits>

#include "outer_optimizer/diloco.hpp"
#include "trainer/core/error.hpp"

namespace geoloco::outer {

Diloco::State Diloco::save_state() {
  // Syncs in flight: wait for their results (global weights, outer optimizer and error
  // feedback state all advance in the worker) and checkpoint the merges still due, so a
  // resumed run merges at the same steps as an uninterrupted one.
  for (auto& f : frags_) {
    join_worker(*f);
    // Collected, not applied yet: decide and apply it now.
    if (f->awaiting_decision) f->result = decide_and_apply(*f, trace_tid(*f), *strategy_);
  }
  // A checkpoint holds weights every site agreed on. (After a lost quorum the other sites
  // may be out of reach: the round exchanged again on resume posts a check that covers them.)
  if (!retry_) verify_pending_checks();
  // Sites the rounds decided here took in are served what this checkpoint holds.
  if (!retry_) serve_admitted(step_, *strategy_);
  ShardState st = pack_state();
  State s;
  s.tensors["global"] = std::move(st.global);
  if (!st.opt_a.empty()) s.tensors["opt_a"] = std::move(st.opt_a);
  if (!st.opt_b.empty()) s.tensors["opt_b"] = std::move(st.opt_b);
  if (!st.ef.empty()) s.tensors["ef_residual"] = std::move(st.ef);
  s.metadata["round"] = std::to_string(round_);
  if (retry_) {
    // The round the quorum was lost in, to exchange again: counters as before it, this
    // rank's contribution as it was sent.
    s.metadata["round"] = std::to_string(retry_->round - 1);
    s.metadata["retry.fragment"] = std::to_string(retry_->fragment);
    s.metadata["retry.round"] = std::to_string(retry_->round);
    s.metadata["retry.step"] = std::to_string(retry_->step);
    s.bytes["retry.envelope"] = *retry_->mine.envelope;
  }
  s.metadata["fragments"] = std::to_string(frags_.size());
  // Tokens trained and committed (the summary's membership.tokens), carried across --resume.
  s.metadata["tokens.trained_steps"] = std::to_string(trained_steps_);
  s.metadata["tokens.after_round"] = std::to_string(tokens_first_round_);
  std::string committed;
  for (size_t i = 0; i < committed_tokens_.size(); ++i)
    committed += fmt::format("{}{:.17g}", i ? "," : "", committed_tokens_[i]);
  s.metadata["tokens.committed"] = committed;
  if (ocfg_.auto_plan()) {
    // The plan in effect and where its schedule starts; the protocol restarts after a
    // checkpoint (drained above, in the uninterrupted run as in the resumed one).
    s.metadata["planned"] = std::to_string(planned_ ? 1 : 0);
    s.metadata["plan"] = plan_.to_json().dump();
    s.metadata["epoch_start"] = std::to_string(epoch_start_);
    s.metadata["replans"] = std::to_string(planner_.replans());
    s.metadata["plan_protocol"] = planner_.save();
  }
  for (auto& f : frags_) {
    const std::string p = fmt::format("f{}.", f->index);
    s.metadata[p + "last_sync_step"] = std::to_string(f->last_sync_step);
    s.metadata[p + "blocking_step"] = std::to_string(f->blocking_step);
    s.metadata[p + "opt_steps"] = std::to_string(f->opt->steps());
    if (f->pending_merge) {
      s.metadata[p + "pending_merge_step"] = std::to_string(f->merge_step);
      s.metadata[p + "pending_launch_step"] = std::to_string(f->launch_step);
      s.metadata[p + "pending_round"] = std::to_string(f->round);
      s.metadata[p + "pending_frame_bytes"] = std::to_string(f->result.frame_bytes);
      s.metadata[p + "pending_envelope_bytes"] = std::to_string(f->result.envelope_bytes);
      s.metadata[p + "pending_elements"] = std::to_string(f->result.elements);
      std::string tokens;  // the round's contributions, counted when it merges
      for (size_t i = 0; i < f->result.tokens.size(); ++i)
        tokens += fmt::format("{}{}", i ? "," : "", f->result.tokens[i]);
      s.metadata[p + "pending_tokens"] = tokens;
    }
  }
  return s;
}

void Diloco::restore_state(const trainer::SafetensorsFile& file) {
  restore_outer(file, /*joining=*/false);
  restore_tokens(file);
  resume_retry_.reset();
  if (!file.metadata().count("outer.retry.round")) return;
  // Written when a blocking round lost its quorum: resumed() exchanges that round again.
  constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
  Retry r;
  r.fragment = static_cast<int>(file.meta_int("outer.retry.fragment", 0, static_cast<int64_t>(frags_.size()) - 1));
  r.round = file.meta_uint("outer.retry.round", 1, kMax);
  r.step = file.meta_int("outer.retry.step", 1, cfg_.train.steps);
  const auto env = file.u8("outer.retry.envelope");
  r.mine.envelope = transport::make_payload(std::vector<uint8_t>(env.begin(), env.end()));
  if (overlapped())
    throw FileError(file.path(),
                    "holds an outer round to exchange again, but this run overlaps its syncs "
                    "(outer.overlap_steps or outer.delayed_update changed?)");
  if (r.round != static_cast<uint64_t>(round_) + 1)
    throw FileError(file.path(), fmt::format("outer.retry.round {} does not follow outer.round {}", r.round, round_));
  if (r.step != file.meta_int("geoloco_step", 0))
    throw FileError(file.path(), fmt::format("outer.retry.step {} is not the checkpoint's step {}", r.step,
                                             file.meta("geoloco_step")));
  // The contribution's frame info comes from the envelope itself, checked as a peer's would be.
  try {
    const Envelope e =
        read_envelope(*r.mine.envelope, EnvelopeKind::kPseudoGradient, r.round, static_cast<uint32_t>(site_),
                      static_cast<uint32_t>(rank_), r.mine.envelope->size(), "this rank's saved contribution");
    r.mine.info = compression::Pipeline::inspect(e.body, frags_[static_cast<size_t>(r.fragment)]->n);
  } catch (const Error& e) {
    throw FileError(file.path(), fmt::format("outer.retry.envelope: {}", e.what()));
  }
  resume_retry_ = std::move(r);
}

void Diloco::restore_tokens(const trainer::SafetensorsFile& file) {
  if (!file.metadata().count("outer.tokens.committed")) {
    tokens_first_round_ = round_;  // a checkpoint from before the counts: they start here
    return;
  }
  trained_steps_ = file.meta_int("outer.tokens.trained_steps", 0, cfg_.train.steps);
  tokens_first_round_ = file.meta_int("outer.tokens.after_round", 0, round_);
  const std::string& text = file.meta("outer.tokens.committed");
  std::vector<double> v;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    char* stop = nullptr;
    const double x = std::strtod(item.c_str(), &stop);
    if (item.empty() || stop != item.c_str() + item.size() || !std::isfinite(x) || x < 0)
      throw FileError(file.path(), fmt::format("outer.tokens.committed: '{}' is not a token count", item));
    v.push_back(x);
    at = end + 1;
  }
  if (v.size() != committed_tokens_.size())
    throw FileError(file.path(), fmt::format("outer.tokens.committed holds {} site(s), the config has {}", v.size(),
                                             committed_tokens_.size()));
  committed_tokens_ = std::move(v);
}

void Diloco::resumed(int64_t step, trainer::SiteStrategy& strategy) {
  if (!resume_retry_) return;
  const Retry r = std::move(*resume_retry_);
  resume_retry_.reset();
  GEOLOCO_CHECK(r.step == step, "outer round {} to exchange again at step {}, resumed at {}", r.round, r.step, step);
  if (rank_ == 0)
    spdlog::info("outer round {} (inner step {}): its quorum was lost; exchanged again after --resume", r.round,
                 r.step);
  sync(*frags_[static_cast<size_t>(r.fragment)], step, strategy, &r);
  // The last step's blocking syncs of the fragments after it, as the uninterrupted run does.
  if (step == cfg_.train.steps) final_sync(step, strategy);
  serve_admitted(step, strategy);
}

void Diloco::restore_outer(const trainer::SafetensorsFile& file, bool joining) {
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
  ShardState st;
  st.global = read("outer.global");
  if (!frags_[0]->opt->state_a().empty()) st.opt_a = read("outer.opt_a");
  if (!frags_[0]->opt->state_b().empty()) st.opt_b = read("outer.opt_b");
  if (frags_[0]->ef && !joining) st.ef = read("outer.ef_residual");  // a joiner's residual starts at zero
  unpack_state(st);
  round_ = file.meta_int("outer.round", 0);
  step_ = file.meta_int("geoloco_step", 0);
  for (auto& f : frags_) {
    const std::string p = fmt::format("outer.f{}.", f->index);
    f->last_sync_step = file.meta_int(p + "last_sync_step", 0);
    f->blocking_step = file.meta_int(p + "blocking_step", -1);
    f->opt->set_steps(file.meta_int(p + "opt_steps", 0));
    f->pending_merge = file.metadata().count(p + "pending_merge_step") > 0;
    if (f->pending_merge) {
      f->merge_step = file.meta_int(p + "pending_merge_step", 0);
      f->launch_step = file.meta_int(p + "pending_launch_step", 0);
      f->round = file.meta_uint(p + "pending_round", 1);
      f->result = {};
      f->result.hash = f->hash;
      f->result.frame_bytes = file.meta_uint(p + "pending_frame_bytes", 0);
      f->result.envelope_bytes = file.meta_uint(p + "pending_envelope_bytes", 0);
      f->result.elements = file.meta_uint(p + "pending_elements", 0);
      if (file.metadata().count(p + "pending_tokens")) {
        const std::string& text = file.meta(p + "pending_tokens");
        for (size_t at = 0; at < text.size();) {
          const size_t end = std::min(text.find(',', at), text.size());
          const std::string item = text.substr(at, end - at);
          char* stop = nullptr;
          const unsigned long long x = std::strtoull(item.c_str(), &stop, 10);
          if (item.empty() || stop != item.c_str() + item.size())
            throw FileError(file.path(), fmt::format("{}pending_tokens: '{}' is not a token count", p, item));
          f->result.tokens.push_back(x);
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
