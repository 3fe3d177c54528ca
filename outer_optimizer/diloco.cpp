#include "outer_optimizer/diloco.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>
#include <numeric>

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
  check_hashes(hash64(global_.data(), global_.size() * sizeof(float)));
  site_hash_ = combine_site_hash(strategy, hash64(global_.data(), global_.size() * sizeof(float)));
}

std::string Diloco::peer_name(int s) const {
  int p = peer_of_site_[static_cast<size_t>(s)];
  return p < 0 ? "self" : transport_->peers()[static_cast<size_t>(p)].name();
}

bool Diloco::after_inner_step(int64_t step, trainer::SiteStrategy& strategy) {
  if (step % ocfg_.interval != 0) return false;
  sync(step, strategy);
  return true;
}

void Diloco::finish(int64_t step, trainer::SiteStrategy& strategy) {
  // A last partial period: sync so that every site ends with the same global weights.
  if (step != last_sync_step_) sync(step, strategy);
}

void Diloco::sync(int64_t step, trainer::SiteStrategy& strategy) {
  const auto t0 = Clock::now();
  const int S = static_cast<int>(cfg_.sites.size());
  const uint64_t round = static_cast<uint64_t>(++round_);
  auto local = strategy.shard_params();

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
  std::vector<uint8_t> frame;
  auto info = pipeline_->encode(delta_, ef_.get(), frame);
  const uint64_t tokens = static_cast<uint64_t>(step - last_sync_step_) * static_cast<uint64_t>(cfg_.site_batch(site_)) *
                          static_cast<uint64_t>(cfg_.seq_len());
  std::vector<uint8_t> mine;
  write_envelope({EnvelopeKind::kPseudoGradient, round, static_cast<uint32_t>(site_), static_cast<uint32_t>(rank_), tokens, frame}, mine);
  // Every site encodes with the same pipeline config, so a peer's frame is at most our raw
  // size plus framing (zstd is only kept when it shrinks the payload).
  const uint64_t max_frame = compression::kHeaderBytes + info.raw_bytes + compression::kTrailerBytes;
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
  {
    size_t k = 0;
    for (int s = 0; s < S; ++s) {
      if (s == site_) continue;
      ops[k].wait();
      inbox[static_cast<size_t>(s)].resize(ops[k].bytes());
      ++k;
    }
  }

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

  // 4-5. Outer step on the shard; local <- global; the site re-assembles its replica.
  opt_.step(global_, avg_);
  std::copy(global_.begin(), global_.end(), local.begin());
  strategy.shard_updated();
  if (ocfg_.inner_state == "reset") strategy.optimizer().reset();

  const uint64_t h = hash64(global_.data(), global_.size() * sizeof(float));
  if (ocfg_.check_hash) check_hashes(h);
  site_hash_ = combine_site_hash(strategy, h);

  last_sync_step_ = step;
  last_sync_s_ = std::chrono::duration<double>(Clock::now() - t0).count();
  sync_seconds_.push_back(last_sync_s_);
  last_frame_bytes_ = mine.size();
  frame_bytes_total_ += info.frame_bytes;
  elements_total_ += info.elements;
  if (rank_ == 0)
    spdlog::info("outer step {} at inner step {}: sync {:.3f} s, {} bytes/rank/peer (x{:.1f} vs fp32), global weights {}",
                 round, step, last_sync_s_, mine.size(), info.ratio(), hex64(site_hash_));
}

void Diloco::check_hashes(uint64_t h) {
  if (!transport_) return;
  const int S = static_cast<int>(cfg_.sites.size());
  const uint64_t round = static_cast<uint64_t>(round_);
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
  State s;
  s.tensors["global"] = global_;
  if (!opt_.state_a().empty()) s.tensors["opt_a"] = std::vector<float>(opt_.state_a().begin(), opt_.state_a().end());
  if (!opt_.state_b().empty()) s.tensors["opt_b"] = std::vector<float>(opt_.state_b().begin(), opt_.state_b().end());
  if (ef_) s.tensors["ef_residual"] = std::vector<float>(ef_->residual().begin(), ef_->residual().end());
  s.metadata["round"] = std::to_string(round_);
  s.metadata["last_sync_step"] = std::to_string(last_sync_step_);
  s.metadata["opt_steps"] = std::to_string(opt_.steps());
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
}

}  // namespace geoloco::outer
