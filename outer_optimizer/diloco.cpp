#include "outer_optimizer/diloco.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <optional>

#include "outer_optimizer/envelope.hpp"
#include "trainer/core/error.hpp"
#include "trainer/core/hash.hpp"

namespace geoloco::outer {

namespace {
using Clock = std::chrono::steady_clock;

std::span<const uint8_t> as_bytes(const uint64_t& v) { return {reinterpret_cast<const uint8_t*>(&v), sizeof v}; }
}  // namespace

Diloco::Diloco(const trainer::RunConfig& cfg, int site, int rank, transport::Transport* transport,
               trainer::SiteStrategy& strategy, const trainer::ParamLayout& layout)
    : cfg_(cfg),
      ocfg_(cfg.outer),
      site_(site),
      rank_(rank),
      transport_(transport),
      n_(strategy.shard_params().size()),
      plans_(plan_fragments(layout, ocfg_.fragments, ocfg_.interval)) {
  const int S = static_cast<int>(cfg.sites.size());
  peer_of_site_.assign(static_cast<size_t>(S), -1);
  for (int s = 0; s < S; ++s) {
    if (s == site) continue;
    if (!transport_) throw Error("outer loop: a multi-site run needs a transport");
    int p = transport_->peer_index(cfg.sites[static_cast<size_t>(s)].name, rank);
    if (p < 0) throw Error(fmt::format("outer loop: no connection to site {} rank {}", cfg.sites[static_cast<size_t>(s)].name, rank));
    peer_of_site_[static_cast<size_t>(s)] = p;
  }
  auto shard = strategy.shard_params();
  // Every site starts from the same initial weights (same seed): check it before training.
  const uint64_t h0 = hash64(shard.data(), shard.size() * sizeof(float));
  check_hashes(h0, 0);
  for (const auto& plan : plans_) {
    auto f = std::make_unique<Fragment>();
    f->index = plan.index;
    f->local = intersect(plan.ranges, strategy.shard());
    for (const auto& r : f->local) f->n += static_cast<size_t>(r.size());
    f->global.resize(f->n);
    gather_local(*f, shard, f->global);
    f->delta.resize(f->n);
    f->decoded.resize(f->n);
    f->avg.resize(f->n);
    f->pipeline = std::make_unique<compression::Pipeline>(ocfg_.compression);
    if (ocfg_.compression.error_feedback) f->ef = std::make_unique<compression::ErrorFeedback>(f->n);
    f->opt = std::make_unique<OuterOptimizer>(ocfg_.optimizer, f->n);
    f->hash = hash64(f->global.data(), f->global.size() * sizeof(float));
    frags_.push_back(std::move(f));
  }
  site_hash_ = combine_site_hash(strategy, combined_hash());
  if (rank_ == 0 && plans_.size() > 1)
    for (const auto& p : plans_) spdlog::info("outer loop: {}", p.describe());
}

std::string Diloco::peer_name(int s) const {
  int p = peer_of_site_[static_cast<size_t>(s)];
  return p < 0 ? "self" : transport_->peers()[static_cast<size_t>(p)].name();
}

Diloco::~Diloco() {
  // A run that failed with syncs in flight: the workers' transport waits are bounded by
  // the transport's timeouts, so these joins are too.
  for (auto& f : frags_)
    if (f->worker.joinable()) f->worker.join();
}

bool Diloco::overlapped() const { return ocfg_.overlap_steps > 0 || ocfg_.delayed_update; }

int64_t Diloco::tau() const { return ocfg_.delayed_update ? ocfg_.interval : ocfg_.overlap_steps; }

int Diloco::trace_tid(const Fragment& f) const {
  return f.index == 0 ? trainer::TraceRecorder::kOuterThread : trainer::TraceRecorder::kFragmentThreadBase + f.index;
}

// The fragment's values, gathered from the shard in range order.
void Diloco::gather_local(const Fragment& f, std::span<const float> shard, std::span<float> out) const {
  size_t k = 0;
  for (const auto& r : f.local) {
    std::copy(shard.begin() + r.begin, shard.begin() + r.end, out.begin() + static_cast<std::ptrdiff_t>(k));
    k += static_cast<size_t>(r.size());
  }
}

uint64_t Diloco::combined_hash() const {
  // One fragment: its hash (the whole shard's). Several: a hash of the fragments' hashes.
  if (frags_.size() == 1) return frags_[0]->hash;
  Hasher hs;
  for (const auto& f : frags_) hs.update(&f->hash, sizeof f->hash);
  return hs.digest();
}

bool Diloco::after_inner_step(int64_t step, trainer::SiteStrategy& strategy) {
  bool any = false;
  // Merges first: with delayed_update the merge of round t and the launch of round t+1 of
  // a fragment fall on the same step.
  for (auto& f : frags_)
    if (f->pending_merge && step >= f->merge_step) {
      complete(*f, strategy);
      any = true;
    }
  if (step == cfg_.train.steps) {
    // The last step: blocking syncs, so that every site ends with the same weights.
    final_sync(step, strategy);
    return true;
  }
  for (auto& f : frags_) {
    if (!syncs_at(plans_[static_cast<size_t>(f->index)], step, ocfg_.interval)) continue;
    if (overlapped())
      launch(*f, step, strategy);
    else
      sync(*f, step, strategy);
    any = any || !overlapped();
  }
  return any;
}

void Diloco::finish(int64_t step, trainer::SiteStrategy& strategy) { final_sync(step, strategy); }

void Diloco::final_sync(int64_t step, trainer::SiteStrategy& strategy) {
  for (auto& f : frags_)
    if (f->pending_merge) complete(*f, strategy);
  for (auto& f : frags_)
    if (f->blocking_step != step) sync(*f, step, strategy);
}

uint64_t Diloco::tokens_since(int64_t step, int64_t since) const {
  return static_cast<uint64_t>(step - since) * static_cast<uint64_t>(cfg_.site_batch(site_)) *
         static_cast<uint64_t>(cfg_.seq_len());
}

void Diloco::sync(Fragment& f, int64_t step, trainer::SiteStrategy& strategy) {
  const auto t0 = Clock::now();
  const uint64_t round = static_cast<uint64_t>(++round_);
  auto shard = strategy.shard_params();
  f.snapshot.resize(f.n);
  gather_local(f, shard, f.snapshot);
  const ExchangeResult r =
      exchange(f, step, round, tokens_since(step, f.last_sync_step), f.snapshot, trainer::TraceRecorder::kMainThread);
  f.last_sync_step = step;
  f.blocking_step = step;

  // 5. local <- global; the site re-assembles its replica.
  {
    trainer::TraceSpan sp(trace_, "outer_step", trainer::TraceRecorder::kMainThread);
    size_t k = 0;
    for (const auto& rg : f.local) {
      std::copy(f.global.begin() + static_cast<std::ptrdiff_t>(k), f.global.begin() + static_cast<std::ptrdiff_t>(k + size_t(rg.size())),
                shard.begin() + rg.begin);
      k += static_cast<size_t>(rg.size());
    }
    strategy.shard_updated();
    if (ocfg_.inner_state == "reset") strategy.optimizer().reset();
  }
  finish_round(f, strategy, step, round, std::chrono::duration<double>(Clock::now() - t0).count(), r);
}

void Diloco::launch(Fragment& f, int64_t step, trainer::SiteStrategy& strategy) {
  const uint64_t round = static_cast<uint64_t>(++round_);
  const uint64_t tokens = tokens_since(step, f.last_sync_step);
  // The worker reads a snapshot: the inner loop keeps training the live shard meanwhile.
  f.snapshot.resize(f.n);
  gather_local(f, strategy.shard_params(), f.snapshot);
  f.last_sync_step = step;
  f.launch_step = step;
  f.round = round;
  f.merge_step = step + tau();
  f.pending_merge = true;
  f.in_flight = true;
  f.error = nullptr;
  f.t0 = Clock::now();
  Fragment* fp = &f;
  f.worker = std::thread([this, fp, step, round, tokens] {
    try {
      fp->result = exchange(*fp, step, round, tokens, fp->snapshot, trace_tid(*fp));
    } catch (...) {
      fp->error = std::current_exception();  // rethrown by the inner loop at the join
    }
    fp->t1 = Clock::now();
  });
}

void Diloco::join(Fragment& f) {
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

void Diloco::complete(Fragment& f, trainer::SiteStrategy& strategy) {
  join(f);
  // local <- alpha * local + (1 - alpha) * global: keeps part of the inner progress made
  // while the sync was in flight. Elementwise and contraction-free: bit-identical on every
  // rank that holds the same local values.
  {
    trainer::TraceSpan sp(trace_, "merge", trainer::TraceRecorder::kMainThread);
    auto shard = strategy.shard_params();
    const float a = static_cast<float>(ocfg_.merge_alpha), b = 1.0f - a;
    size_t k = 0;
    for (const auto& rg : f.local)
      for (int64_t i = rg.begin; i < rg.end; ++i, ++k) {
        float& x = shard[static_cast<size_t>(i)];
        x = a * x + b * f.global[k];
      }
    strategy.shard_updated();
    if (ocfg_.inner_state == "reset") strategy.optimizer().reset();
  }
  f.pending_merge = false;
  // A restored checkpoint has no worker timing: count the round with its joined time only.
  const double secs = f.joined ? f.joined_seconds : 0.0;
  f.joined = false;
  finish_round(f, strategy, f.launch_step, f.round, secs, f.result);
}

void Diloco::finish_round(Fragment& f, trainer::SiteStrategy& strategy, int64_t step, uint64_t round, double seconds,
                          const ExchangeResult& r) {
  f.hash = r.hash;
  site_hash_ = combine_site_hash(strategy, combined_hash());
  last_sync_s_ = seconds;
  sync_seconds_.push_back(last_sync_s_);
  frame_bytes_total_ += r.frame_bytes;
  elements_total_ += r.elements;
  if (rank_ == 0) {
    const std::string frag = frags_.size() > 1 ? fmt::format(" fragment {}/{}", f.index, frags_.size()) : "";
    spdlog::info("outer step {}{} at inner step {}: sync {:.3f} s, {} bytes/rank/peer (x{:.1f} vs fp32), global weights {}",
                 round, frag, step, last_sync_s_, r.envelope_bytes, r.ratio, hex64(site_hash_));
  }
}

Diloco::ExchangeResult Diloco::exchange(Fragment& f, int64_t step, uint64_t round, uint64_t tokens, std::span<const float> local,
                                        int tid) {
  const size_t n = f.n;
  const int S = static_cast<int>(cfg_.sites.size());

  // 1. Pseudo-gradient of this shard.
  for (size_t i = 0; i < n; ++i) f.delta[i] = f.global[i] - local[i];

  // Benchmarks capture real pseudo-gradients: GEOLOCO_CAPTURE_PSEUDOGRAD=<dir> writes this
  // shard's delta of every round as safetensors (tensor "delta").
  if (const char* dir = std::getenv("GEOLOCO_CAPTURE_PSEUDOGRAD"); dir && *dir) {
    const std::string path = fmt::format("{}/pseudograd.{}.r{}.round{}.safetensors", dir,
                                         cfg_.sites[static_cast<size_t>(site_)].name, rank_, round);
    trainer::TensorWrite t = trainer::f32_tensor("delta", {static_cast<int64_t>(n)}, f.delta);
    trainer::write_safetensors(path, std::span<const trainer::TensorWrite>(&t, 1),
                               {{"round", std::to_string(round)}, {"step", std::to_string(step)}});
  }

  // 2. Compress, wrap, exchange.
  std::optional<trainer::TraceSpan> compress_span(std::in_place, trace_, "compress", tid);
  std::vector<uint8_t> frame;
  auto info = f.pipeline->encode(f.delta, f.ef.get(), frame);
  std::vector<uint8_t> mine;
  write_envelope({EnvelopeKind::kPseudoGradient, round, static_cast<uint32_t>(site_), static_cast<uint32_t>(rank_), tokens, frame}, mine);
  // Every site encodes with the same pipeline config, so a peer's frame is at most our raw
  // size plus framing (zstd is only kept when it shrinks the payload).
  const uint64_t max_frame = compression::kHeaderBytes + info.raw_bytes + compression::kTrailerBytes;
  compress_span.reset();
  const auto exchange_t0 = Clock::now();
  std::vector<std::vector<uint8_t>> inbox(static_cast<size_t>(S));
  std::vector<transport::OpHandle> ops;
  for (int s = 0; s < S; ++s) {
    if (s == site_) continue;
    auto& buf = inbox[static_cast<size_t>(s)];
    buf.resize(kEnvelopeBytes + max_frame);
    const int p = peer_of_site_[static_cast<size_t>(s)];
    ops.push_back(transport_->recv(p, transport::FrameKind::kPseudoGradient, round, static_cast<uint32_t>(rank_), buf));
  }
  std::vector<transport::OpHandle> sends;
  for (int s = 0; s < S; ++s) {
    if (s == site_) continue;
    sends.push_back(transport_->send(peer_of_site_[static_cast<size_t>(s)], transport::FrameKind::kPseudoGradient, round,
                                     static_cast<uint32_t>(rank_), mine));
  }
  for (auto& op : sends) op.wait();
  // Spans from posting to completion as seen by this thread (the transport's own progress
  // thread does the work).
  if (trace_ && !sends.empty()) trace_->span("send", tid, exchange_t0, Clock::now());
  {
    size_t k = 0;
    for (int s = 0; s < S; ++s) {
      if (s == site_) continue;
      ops[k].wait();
      inbox[static_cast<size_t>(s)].resize(ops[k].bytes());
      ++k;
    }
  }
  if (trace_ && !ops.empty()) trace_->span("receive", tid, exchange_t0, Clock::now());
  std::optional<trainer::TraceSpan> decode_span(std::in_place, trace_, "decode", tid);

  // 3. Decode every site's contribution, own included, and average in site order.
  std::vector<Envelope> env(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) {
    std::span<const uint8_t> bytes = s == site_ ? std::span<const uint8_t>(mine) : std::span<const uint8_t>(inbox[static_cast<size_t>(s)]);
    env[static_cast<size_t>(s)] = read_envelope(bytes, EnvelopeKind::kPseudoGradient, round, static_cast<uint32_t>(s),
                                                static_cast<uint32_t>(rank_), max_frame, peer_name(s));
  }
  std::vector<float> weight(static_cast<size_t>(S), 1.0f / static_cast<float>(S));
  if (ocfg_.weighting == "tokens") {
    double total = 0;
    for (auto& e : env) total += static_cast<double>(e.value);
    if (total <= 0) throw Error(fmt::format("outer round {}: no site reported any tokens", round));
    for (int s = 0; s < S; ++s) weight[static_cast<size_t>(s)] = static_cast<float>(double(env[static_cast<size_t>(s)].value) / total);
  }
  std::fill(f.avg.begin(), f.avg.end(), 0.0f);
  for (int s = 0; s < S; ++s) {
    try {
      f.pipeline->decode(env[static_cast<size_t>(s)].body, n, f.decoded);
    } catch (const compression::FrameError& e) {
      throw Error(fmt::format("outer round {}: pseudo-gradient from {} rejected: {}", round, peer_name(s), e.what()));
    }
    const float w = weight[static_cast<size_t>(s)];
    for (size_t i = 0; i < n; ++i) f.avg[i] += w * f.decoded[i];
  }

  decode_span.reset();

  // 4. Outer step on this shard of the global weights.
  {
    trainer::TraceSpan sp(trace_, "outer_optimizer", tid);
    f.opt->step(f.global, f.avg);
  }
  ExchangeResult r;
  r.hash = hash64(f.global.data(), f.global.size() * sizeof(float));
  if (ocfg_.check_hash) {
    trainer::TraceSpan sp(trace_, "hash_check", tid);
    check_hashes(r.hash, round);
  }
  r.envelope_bytes = mine.size();
  r.frame_bytes = info.frame_bytes;
  r.elements = info.elements;
  r.ratio = info.ratio();
  return r;
}

void Diloco::check_hashes(uint64_t h, uint64_t round) {
  if (!transport_) return;
  const int S = static_cast<int>(cfg_.sites.size());
  std::vector<uint8_t> mine;
  write_envelope({EnvelopeKind::kWeightsHash, round, static_cast<uint32_t>(site_), static_cast<uint32_t>(rank_), h, {}}, mine);
  std::vector<std::vector<uint8_t>> inbox(static_cast<size_t>(S));
  std::vector<std::pair<int, transport::OpHandle>> recvs;
  std::vector<transport::OpHandle> sends;
  for (int s = 0; s < S; ++s) {
    if (s == site_) continue;
    inbox[static_cast<size_t>(s)].resize(kEnvelopeBytes);
    const int p = peer_of_site_[static_cast<size_t>(s)];
    recvs.emplace_back(s, transport_->recv(p, transport::FrameKind::kControl, round, static_cast<uint32_t>(rank_), inbox[static_cast<size_t>(s)]));
    sends.push_back(transport_->send(p, transport::FrameKind::kControl, round, static_cast<uint32_t>(rank_), mine));
  }
  for (auto& op : sends) op.wait();
  for (auto& [s, op] : recvs) {
    op.wait();
    auto& buf = inbox[static_cast<size_t>(s)];
    buf.resize(op.bytes());
    auto e = read_envelope(buf, EnvelopeKind::kWeightsHash, round, static_cast<uint32_t>(s), static_cast<uint32_t>(rank_), 0, peer_name(s));
    if (e.value != h)
      throw Error(fmt::format("outer round {}: global weights diverged: shard {} hash {} here (site {}) but {} at site {} ({}); "
                              "stopping",
                              round, rank_, hex64(h), cfg_.sites[static_cast<size_t>(site_)].name, hex64(e.value),
                              cfg_.sites[static_cast<size_t>(s)].name, peer_name(s)));
  }
}

uint64_t Diloco::combine_site_hash(trainer::SiteStrategy& strategy, uint64_t shard_hash) {
  auto* coll = strategy.collective();
  if (!coll || strategy.ranks() == 1) return hash64(as_bytes(shard_hash).data(), sizeof shard_hash);
  auto all = coll->all_gather_bytes(std::as_bytes(std::span<const uint64_t>(&shard_hash, 1)));
  Hasher hs;
  for (auto& b : all) hs.update(b.data(), b.size());
  return hs.digest();
}

nlohmann::json Diloco::metrics() {
  nlohmann::json j;
  j["outer_step"] = round_;
  j["sync_s"] = last_sync_s_;
  j["global_hash"] = hex64(site_hash_);
  if (transport_) {
    auto st = transport_->stats();
    uint64_t sent = 0;
    for (auto& p : st.peers) sent += p.bytes_sent;
    j["wan_bytes_sent"] = sent;
  }
  return j;
}

nlohmann::json Diloco::summary() {
  nlohmann::json j;
  j["outer_steps"] = round_;
  j["outer_interval"] = ocfg_.interval;
  j["outer_fragments"] = frags_.size();
  j["outer_overlap_steps"] = tau();
  j["outer_delayed_update"] = ocfg_.delayed_update;
  j["outer_optimizer"] = ocfg_.optimizer.kind;
  j["compression"] = ocfg_.compression.describe();
  j["sync_seconds"] = sync_seconds_;
  j["sync_seconds_mean"] =
      sync_seconds_.empty() ? 0.0 : std::accumulate(sync_seconds_.begin(), sync_seconds_.end(), 0.0) / double(sync_seconds_.size());
  // Per period of `interval` steps: F fragment rounds together carry one model's worth.
  const double periods = double(round_) / double(frags_.size());
  j["wire_bytes_per_outer_step"] = periods > 0 ? double(frame_bytes_total_) / periods : 0.0;
  j["compression_ratio"] = frame_bytes_total_ ? 4.0 * double(elements_total_) / double(frame_bytes_total_) : 0.0;
  nlohmann::json fr = nlohmann::json::array();
  for (size_t i = 0; i < plans_.size(); ++i)
    fr.push_back({{"index", plans_[i].index},
                  {"offset", plans_[i].offset},
                  {"blocks", plans_[i].blocks},
                  {"params", plans_[i].elements()},
                  {"shard_elements", frags_[i]->n}});
  j["fragments"] = fr;
  uint64_t sent = 0, recv = 0;
  if (transport_) {
    auto st = transport_->stats();
    for (auto& p : st.peers) {
      sent += p.bytes_sent;
      recv += p.bytes_received;
    }
    j["transport"] = st.to_json();
  }
  j["wan_bytes_sent"] = sent;
  j["wan_bytes_received"] = recv;
  j["global_weights_hash"] = hex64(site_hash_);
  return j;
}

namespace {
// Fragment-ordered values (each fragment's vector in turn) <-> one shard-sized tensor laid
// out like the shard, so a checkpoint's outer state reads like the parameters.
template <class Get>
std::vector<float> to_shard_layout(size_t n, const std::vector<std::vector<Range>>& ranges, Get get) {
  std::vector<float> out(n, 0.0f);
  for (size_t f = 0; f < ranges.size(); ++f) {
    std::span<const float> v = get(f);
    size_t k = 0;
    for (const auto& r : ranges[f])
      for (int64_t i = r.begin; i < r.end; ++i) out[static_cast<size_t>(i)] = v[k++];
  }
  return out;
}
}  // namespace

Diloco::State Diloco::save_state() {
  // Syncs in flight: wait for their results (global weights, outer optimizer and error
  // feedback state all advance in the worker) and checkpoint the merges still due, so a
  // resumed run merges at the same steps as an uninterrupted one.
  for (auto& f : frags_) join(*f);
  std::vector<std::vector<Range>> ranges;
  for (auto& f : frags_) ranges.push_back(f->local);
  auto layout = [&](auto get) { return to_shard_layout(n_, ranges, get); };
  State s;
  s.tensors["global"] = layout([&](size_t i) { return std::span<const float>(frags_[i]->global); });
  if (!frags_[0]->opt->state_a().empty())
    s.tensors["opt_a"] = layout([&](size_t i) { return std::span<const float>(frags_[i]->opt->state_a()); });
  if (!frags_[0]->opt->state_b().empty())
    s.tensors["opt_b"] = layout([&](size_t i) { return std::span<const float>(frags_[i]->opt->state_b()); });
  if (frags_[0]->ef)
    s.tensors["ef_residual"] = layout([&](size_t i) { return std::span<const float>(frags_[i]->ef->residual()); });
  s.metadata["round"] = std::to_string(round_);
  s.metadata["fragments"] = std::to_string(frags_.size());
  for (auto& f : frags_) {
    const std::string p = "f" + std::to_string(f->index) + ".";
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
    }
  }
  return s;
}

void Diloco::restore_state(const trainer::SafetensorsFile& file) {
  const std::vector<int64_t> shape = {static_cast<int64_t>(n_)};
  const std::string saved_f = file.meta("outer.fragments");
  if (saved_f != std::to_string(frags_.size()))
    throw FileError(file.path(), fmt::format("holds outer state for {} fragment(s), but this run has outer.fragments: {}",
                                             saved_f, frags_.size()));
  // Shard-laid-out tensors back into each fragment's gathered order.
  std::vector<float> buf(n_);
  auto scatter = [&](const char* name, auto dest) {
    file.copy_f32(name, shape, buf);
    for (auto& f : frags_) gather_local(*f, buf, dest(*f));
  };
  scatter("outer.global", [](Fragment& f) { return std::span<float>(f.global); });
  if (!frags_[0]->opt->state_a().empty()) scatter("outer.opt_a", [](Fragment& f) { return f.opt->state_a(); });
  if (!frags_[0]->opt->state_b().empty()) scatter("outer.opt_b", [](Fragment& f) { return f.opt->state_b(); });
  if (frags_[0]->ef) scatter("outer.ef_residual", [](Fragment& f) { return f.ef->residual(); });
  round_ = std::stoll(file.meta("outer.round"));
  for (auto& f : frags_) {
    const std::string p = "outer.f" + std::to_string(f->index) + ".";
    f->last_sync_step = std::stoll(file.meta(p + "last_sync_step"));
    f->blocking_step = std::stoll(file.meta(p + "blocking_step"));
    f->opt->set_steps(std::stoll(file.meta(p + "opt_steps")));
    f->hash = hash64(f->global.data(), f->global.size() * sizeof(float));
    f->pending_merge = file.metadata().count(p + "pending_merge_step") > 0;
    if (f->pending_merge) {
      f->merge_step = std::stoll(file.meta(p + "pending_merge_step"));
      f->launch_step = std::stoll(file.meta(p + "pending_launch_step"));
      f->round = std::stoull(file.meta(p + "pending_round"));
      f->result = {};
      f->result.hash = f->hash;
      f->result.frame_bytes = std::stoull(file.meta(p + "pending_frame_bytes"));
      f->result.envelope_bytes = std::stoull(file.meta(p + "pending_envelope_bytes"));
      f->result.elements = std::stoull(file.meta(p + "pending_elements"));
      if (!overlapped())
        throw FileError(file.path(), "holds an outer sync still in flight, but this run has no overlap "
                                     "(outer.overlap_steps or outer.delayed_update changed?)");
    }
  }
}

}  // namespace geoloco::outer
