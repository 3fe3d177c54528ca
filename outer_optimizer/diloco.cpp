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
               trainer::SiteStrategy& strategy)
    : cfg_(cfg),
      ocfg_(cfg.outer),
      site_(site),
      rank_(rank),
      transport_(transport),
      n_(strategy.shard_params().size()),
      opt_(cfg.outer.optimizer, strategy.shard_params().size()) {
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
  global_.assign(shard.begin(), shard.end());
  delta_.resize(n_);
  decoded_.resize(n_);
  avg_.resize(n_);
  pipeline_ = std::make_unique<compression::Pipeline>(ocfg_.compression);
  if (ocfg_.compression.error_feedback) ef_ = std::make_unique<compression::ErrorFeedback>(n_);
  // Every site starts from the same initial weights (same seed): check it before training.
  check_hashes(hash64(global_.data(), global_.size() * sizeof(float)), 0);
  site_hash_ = combine_site_hash(strategy, hash64(global_.data(), global_.size() * sizeof(float)));
}

std::string Diloco::peer_name(int s) const {
  int p = peer_of_site_[static_cast<size_t>(s)];
  return p < 0 ? "self" : transport_->peers()[static_cast<size_t>(p)].name();
}

Diloco::~Diloco() {
  // A run that failed with a sync in flight: the worker's transport waits are bounded by
  // the transport's timeouts, so this join is too.
  if (worker_.joinable()) worker_.join();
}

bool Diloco::overlapped() const { return ocfg_.overlap_steps > 0 || ocfg_.delayed_update; }

int64_t Diloco::tau() const { return ocfg_.delayed_update ? ocfg_.interval : ocfg_.overlap_steps; }

bool Diloco::after_inner_step(int64_t step, trainer::SiteStrategy& strategy) {
  if (!overlapped()) {
    if (step % ocfg_.interval != 0) return false;
    sync(step, strategy);
    return true;
  }
  bool completed = false;
  // Merge first: with delayed_update the merge of round t and the launch of round t+1 fall
  // on the same step.
  if (pending_merge_ && step >= merge_step_) {
    complete(strategy);
    completed = true;
  }
  if (step % ocfg_.interval == 0) {
    if (step == cfg_.train.steps) {
      // The last step: a blocking sync, so that every site ends with the same weights.
      sync(step, strategy);
      return true;
    }
    launch(step, strategy);
  }
  return completed;
}

void Diloco::finish(int64_t step, trainer::SiteStrategy& strategy) {
  if (pending_merge_) complete(strategy);
  // A last partial period: sync so that every site ends with the same global weights.
  if (step != last_sync_step_) sync(step, strategy);
}

uint64_t Diloco::period_tokens(int64_t step) const {
  return static_cast<uint64_t>(step - last_sync_step_) * static_cast<uint64_t>(cfg_.site_batch(site_)) *
         static_cast<uint64_t>(cfg_.seq_len());
}

void Diloco::sync(int64_t step, trainer::SiteStrategy& strategy) {
  const auto t0 = Clock::now();
  const uint64_t round = static_cast<uint64_t>(++round_);
  auto local = strategy.shard_params();
  const ExchangeResult r = exchange(step, round, period_tokens(step), local, trainer::TraceRecorder::kMainThread);

  // 5. local <- global; the site re-assembles its replica.
  {
    trainer::TraceSpan sp(trace_, "outer_step", trainer::TraceRecorder::kMainThread);
    std::copy(global_.begin(), global_.end(), local.begin());
    strategy.shard_updated();
    if (ocfg_.inner_state == "reset") strategy.optimizer().reset();
  }
  finish_round(strategy, step, round, std::chrono::duration<double>(Clock::now() - t0).count(), r);
}

void Diloco::launch(int64_t step, trainer::SiteStrategy& strategy) {
  const uint64_t round = static_cast<uint64_t>(++round_);
  const uint64_t tokens = period_tokens(step);
  auto local = strategy.shard_params();
  // The worker reads a snapshot: the inner loop keeps training the live shard meanwhile.
  snapshot_.assign(local.begin(), local.end());
  last_sync_step_ = step;
  launch_step_ = step;
  launch_round_ = round;
  merge_step_ = step + tau();
  pending_merge_ = true;
  in_flight_ = true;
  worker_error_ = nullptr;
  launch_t0_ = Clock::now();
  worker_ = std::thread([this, step, round, tokens] {
    try {
      worker_result_ = exchange(step, round, tokens, snapshot_, trainer::TraceRecorder::kOuterThread);
    } catch (...) {
      worker_error_ = std::current_exception();  // rethrown by the inner loop at the join
    }
    worker_t1_ = Clock::now();
  });
}

void Diloco::join_worker() {
  if (!in_flight_) return;
  worker_.join();
  in_flight_ = false;
  if (worker_error_) {
    auto e = worker_error_;
    worker_error_ = nullptr;
    pending_merge_ = false;
    std::rethrow_exception(e);
  }
  joined_seconds_ = std::chrono::duration<double>(worker_t1_ - launch_t0_).count();
  joined_ = true;
}

void Diloco::complete(trainer::SiteStrategy& strategy) {
  join_worker();
  // local <- alpha * local + (1 - alpha) * global: keeps part of the inner progress made
  // while the sync was in flight. Elementwise and contraction-free: bit-identical on every
  // rank that holds the same local values.
  {
    trainer::TraceSpan sp(trace_, "merge", trainer::TraceRecorder::kMainThread);
    auto local = strategy.shard_params();
    const float a = static_cast<float>(ocfg_.merge_alpha), b = 1.0f - a;
    for (size_t i = 0; i < n_; ++i) local[i] = a * local[i] + b * global_[i];
    strategy.shard_updated();
    if (ocfg_.inner_state == "reset") strategy.optimizer().reset();
  }
  pending_merge_ = false;
  // A restored checkpoint has no worker timing: count the round with its joined time only.
  const double secs = joined_ ? joined_seconds_ : 0.0;
  joined_ = false;
  finish_round(strategy, launch_step_, launch_round_, secs, worker_result_);
}

void Diloco::finish_round(trainer::SiteStrategy& strategy, int64_t step, uint64_t round, double seconds,
                          const ExchangeResult& r) {
  {
    trainer::TraceSpan sp(trace_, "hash_check", trainer::TraceRecorder::kMainThread);
    const uint64_t h = hash64(global_.data(), global_.size() * sizeof(float));
    if (ocfg_.check_hash) check_hashes(h, round);
    site_hash_ = combine_site_hash(strategy, h);
  }
  last_sync_step_ = std::max(last_sync_step_, step);
  last_sync_s_ = seconds;
  sync_seconds_.push_back(last_sync_s_);
  last_frame_bytes_ = r.envelope_bytes;
  frame_bytes_total_ += r.frame_bytes;
  elements_total_ += r.elements;
  if (rank_ == 0)
    spdlog::info("outer step {} at inner step {}: sync {:.3f} s, {} bytes/rank/peer (x{:.1f} vs fp32), global weights {}",
                 round, step, last_sync_s_, r.envelope_bytes, r.ratio, hex64(site_hash_));
}

Diloco::ExchangeResult Diloco::exchange(int64_t step, uint64_t round, uint64_t tokens, std::span<const float> local,
                                        int tid) {
  const int S = static_cast<int>(cfg_.sites.size());

  // 1. Pseudo-gradient of this shard.
  for (size_t i = 0; i < n_; ++i) delta_[i] = global_[i] - local[i];

  // Benchmarks capture real pseudo-gradients: GEOLOCO_CAPTURE_PSEUDOGRAD=<dir> writes this
  // shard's delta of every round as safetensors (tensor "delta").
  if (const char* dir = std::getenv("GEOLOCO_CAPTURE_PSEUDOGRAD"); dir && *dir) {
    const std::string path = fmt::format("{}/pseudograd.{}.r{}.round{}.safetensors", dir,
                                         cfg_.sites[static_cast<size_t>(site_)].name, rank_, round);
    trainer::TensorWrite t = trainer::f32_tensor("delta", {static_cast<int64_t>(n_)}, delta_);
    trainer::write_safetensors(path, std::span<const trainer::TensorWrite>(&t, 1),
                               {{"round", std::to_string(round)}, {"step", std::to_string(step)}});
  }

  // 2. Compress, wrap, exchange.
  std::optional<trainer::TraceSpan> compress_span(std::in_place, trace_, "compress", tid);
  std::vector<uint8_t> frame;
  auto info = pipeline_->encode(delta_, ef_.get(), frame);
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
  std::fill(avg_.begin(), avg_.end(), 0.0f);
  for (int s = 0; s < S; ++s) {
    try {
      pipeline_->decode(env[static_cast<size_t>(s)].body, n_, decoded_);
    } catch (const compression::FrameError& e) {
      throw Error(fmt::format("outer round {}: pseudo-gradient from {} rejected: {}", round, peer_name(s), e.what()));
    }
    const float w = weight[static_cast<size_t>(s)];
    for (size_t i = 0; i < n_; ++i) avg_[i] += w * decoded_[i];
  }

  decode_span.reset();

  // 4. Outer step on this shard of the global weights.
  {
    trainer::TraceSpan sp(trace_, "outer_optimizer", tid);
    opt_.step(global_, avg_);
  }
  ExchangeResult r;
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
  j["outer_overlap_steps"] = tau();
  j["outer_delayed_update"] = ocfg_.delayed_update;
  j["outer_optimizer"] = ocfg_.optimizer.kind;
  j["compression"] = ocfg_.compression.describe();
  j["sync_seconds"] = sync_seconds_;
  j["sync_seconds_mean"] =
      sync_seconds_.empty() ? 0.0 : std::accumulate(sync_seconds_.begin(), sync_seconds_.end(), 0.0) / double(sync_seconds_.size());
  j["wire_bytes_per_outer_step"] = round_ > 0 ? double(frame_bytes_total_) / double(round_) : 0.0;
  j["compression_ratio"] = frame_bytes_total_ ? 4.0 * double(elements_total_) / double(frame_bytes_total_) : 0.0;
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

Diloco::State Diloco::save_state() {
  // A sync in flight: wait for its result (global weights, outer optimizer and error
  // feedback state all advance in the worker) and checkpoint the merge still due, so a
  // resumed run merges at the same step as an uninterrupted one.
  join_worker();
  State s;
  s.tensors["global"] = global_;
  if (!opt_.state_a().empty()) s.tensors["opt_a"] = std::vector<float>(opt_.state_a().begin(), opt_.state_a().end());
  if (!opt_.state_b().empty()) s.tensors["opt_b"] = std::vector<float>(opt_.state_b().begin(), opt_.state_b().end());
  if (ef_) s.tensors["ef_residual"] = std::vector<float>(ef_->residual().begin(), ef_->residual().end());
  s.metadata["round"] = std::to_string(round_);
  s.metadata["last_sync_step"] = std::to_string(last_sync_step_);
  s.metadata["opt_steps"] = std::to_string(opt_.steps());
  if (pending_merge_) {
    s.metadata["pending_merge_step"] = std::to_string(merge_step_);
    s.metadata["pending_launch_step"] = std::to_string(launch_step_);
    s.metadata["pending_round"] = std::to_string(launch_round_);
    s.metadata["pending_frame_bytes"] = std::to_string(worker_result_.frame_bytes);
    s.metadata["pending_envelope_bytes"] = std::to_string(worker_result_.envelope_bytes);
    s.metadata["pending_elements"] = std::to_string(worker_result_.elements);
  }
  return s;
}

void Diloco::restore_state(const trainer::SafetensorsFile& f) {
  const std::vector<int64_t> shape = {static_cast<int64_t>(n_)};
  f.copy_f32("outer.global", shape, global_);
  if (!opt_.state_a().empty()) f.copy_f32("outer.opt_a", shape, opt_.state_a());
  if (!opt_.state_b().empty()) f.copy_f32("outer.opt_b", shape, opt_.state_b());
  if (ef_) f.copy_f32("outer.ef_residual", shape, ef_->residual());
  round_ = std::stoll(f.meta("outer.round"));
  last_sync_step_ = std::stoll(f.meta("outer.last_sync_step"));
  opt_.set_steps(std::stoll(f.meta("outer.opt_steps")));
  pending_merge_ = f.metadata().count("outer.pending_merge_step") > 0;
  if (pending_merge_) {
    merge_step_ = std::stoll(f.meta("outer.pending_merge_step"));
    launch_step_ = std::stoll(f.meta("outer.pending_launch_step"));
    launch_round_ = std::stoull(f.meta("outer.pending_round"));
    worker_result_ = {};
    worker_result_.frame_bytes = std::stoull(f.meta("outer.pending_frame_bytes"));
    worker_result_.envelope_bytes = std::stoull(f.meta("outer.pending_envelope_bytes"));
    worker_result_.elements = std::stoull(f.meta("outer.pending_elements"));
    if (!overlapped())
      throw FileError(f.path(), "holds an outer sync still in flight, but this run has no overlap (outer.overlap_steps "
                                "or outer.delayed_update changed?)");
  }
}

}  // namespace geoloco::outer
