// One rank's checkpoints: write, prune, agree, restore (rank_checkpoints.hpp).
#include "trainer/loop/rank_checkpoints.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/safetensors.hpp"
#include "outer_optimizer/diloco.hpp"
#include "trainer/checkpoint/model_checkpoint.hpp"
#include "trainer/loop/checkpoint_dirs.hpp"

namespace fs = std::filesystem;

namespace geoloco::trainer {

namespace {

std::string first_line(const std::string& s) {
  const auto cut = s.find_first_of(";\n");
  return cut == std::string::npos ? s : s.substr(0, cut);
}

}  // namespace

RankCheckpoints::RankCheckpoints(const RunConfig& cfg, int site, int rank, const ParamLayout& layout,
                                 SiteStrategy& strategy, DistributedSampler& sampler,
                                 std::function<void(const std::string&)> log)
    : cfg_(cfg),
      site_(cfg.sites.at(static_cast<size_t>(site))),
      rank_(rank),
      layout_(layout),
      strategy_(strategy),
      sampler_(sampler),
      log_(std::move(log)),
      dir_(fs::path(cfg.run.output_dir) / "checkpoints" / site_.name) {
  fs::create_directories(dir_);
}

std::string RankCheckpoints::state_file(const fs::path& dir) const {
  return (dir / fmt::format("state.r{}.safetensors", rank_)).string();
}

std::string RankCheckpoints::model_path(int64_t step) const {
  return (dir_ / step_dir_name(step) / "model.safetensors").string();
}

void RankCheckpoints::barrier() {
  if (strategy_.collective() && strategy_.ranks() > 1) strategy_.collective()->barrier();
}

void RankCheckpoints::save(const LoopCounters& c, outer::Diloco* outer) {
  const fs::path dir = dir_ / step_dir_name(c.step);
  fs::create_directories(dir);
  auto full = strategy_.full_params();  // collective under fsdp: every rank calls it
  std::map<std::string, std::string> meta = {
      {"geoloco_step", std::to_string(c.step)},
      {"geoloco_run", cfg_.run.name},
      {"geoloco_site", site_.name},
      {"geoloco_config_hash", hex64(cfg_.hash)},
  };
  if (rank_ == 0) save_model_directory(dir.string(), layout_, full, meta);  // + config.json (HF)
  strategy_.release_full_params();

  // This rank's state: optimizer moments of its range, sampler, counters, outer state.
  // (On a device: moments and shard are downloaded into host copies first.)
  const OptimizerHostState adam = strategy_.optimizer_state();
  // Views, not copies: at real size each is the size of the shard (written as they stand).
  const auto shard = strategy_.shard_params();
  auto sampler_bytes = sampler_.state().to_bytes();
  std::vector<TensorWrite> tensors = {
      f32_tensor("adamw.m", {static_cast<int64_t>(adam.m.size())}, adam.m),
      f32_tensor("adamw.v", {static_cast<int64_t>(adam.v.size())}, adam.v),
      f32_tensor("params.shard", {static_cast<int64_t>(shard.size())}, shard),
      u8_tensor("sampler", {static_cast<int64_t>(sampler_bytes.size())}, sampler_bytes),
  };
  std::map<std::string, std::string> smeta = meta;
  smeta["adamw_steps"] = std::to_string(adam.steps);
  smeta["adamw_begin"] = std::to_string(adam.begin);
  smeta["adamw_end"] = std::to_string(adam.end);
  smeta["optimizer"] = optimizer_kind_name(cfg_.train.optimizer.kind);  // what adamw.m holds
  smeta["strategy"] = site_.strategy;
  smeta["ranks"] = std::to_string(site_.ranks);
  smeta["rank"] = std::to_string(rank_);
  smeta["wall_s"] = fmt::format("{:.17g}", c.wall_s);
  smeta["compute_s"] = fmt::format("{:.17g}", c.compute_s);
  smeta["outer_wait_s"] = fmt::format("{:.17g}", c.outer_wait_s);
  if (c.join_step >= 0) smeta["join_step"] = std::to_string(c.join_step);  // its re-warmup goes on after --resume
  outer::OuterState outer_state;
  if (outer) {
    outer_state = outer->save_state();
    for (auto& [k, v] : outer_state.metadata) smeta["outer." + k] = v;
    for (auto& [k, v] : outer_state.tensors)
      tensors.push_back(f32_tensor("outer." + k, {static_cast<int64_t>(v.size())}, v));
    for (auto& [k, parts] : outer_state.views) tensors.push_back(f32_parts_tensor("outer." + k, parts));
    for (auto& [k, v] : outer_state.bytes)
      tensors.push_back(u8_tensor("outer." + k, {static_cast<int64_t>(v.size())}, v));
  }
  write_safetensors(state_file(dir), tensors, smeta);
  barrier();  // every rank's state is on disk before `latest` names the checkpoint
  if (rank_ == 0) {
    write_text_atomically((dir_ / "latest").string(), step_dir_name(c.step) + "\n");
    prune();
  }
  log_(fmt::format("checkpoint {} written", dir.string()));
}

void RankCheckpoints::save_after_failure(const LoopCounters& c, outer::Diloco* outer, const std::exception& why) {
  try {
    save(c, outer);
    log_(fmt::format("site {}: the outer loop stopped at step {} ({}); checkpoint written: --resume carries on from it",
                     site_.name, c.step, first_line(why.what())));
  } catch (const std::exception& e) {
    spdlog::error("site {}: no checkpoint at step {} after the failure: {}", site_.name, c.step, e.what());
  }
}

void RankCheckpoints::prune() { prune_step_dirs(dir_, cfg_.train.keep_checkpoints); }

// The steps of this site's checkpoints that every rank of the site holds its state of (a
// checkpoint cut short by a crash is complete on some ranks only), ascending.
std::vector<int64_t> RankCheckpoints::site_steps() {
  std::vector<int64_t> mine = local_steps(dir_, fs::path(state_file(dir_)).filename().string());
  auto* coll = strategy_.collective();
  if (!coll || strategy_.ranks() == 1) return mine;
  return common_steps(mine, coll->all_gather_bytes(std::as_bytes(std::span<const int64_t>(mine))));
}

// The checkpoint --resume restores: this site's `latest`, or with other sites the newest step
// every site holds (outer::Diloco::agree_resume_step): after a site died, the others may hold
// later checkpoints (written at a lost quorum) than it. Newer checkpoints of this site are
// moved aside into checkpoints/<site>/discarded/ (their rounds were never committed by every
// site), and `latest` names the one restored. Empty: nothing to restore.
fs::path RankCheckpoints::resume_directory(outer::Diloco* outer) {
  ResumeChoice c;
  c.several_sites = outer && cfg_.sites.size() > 1;
  c.rank = rank_;
  c.site_steps = [this] { return site_steps(); };
  c.agree = [outer](const std::vector<int64_t>& steps) { return outer->agree_resume_step(steps); };
  c.barrier = [this] { barrier(); };
  c.log = log_;
  return trainer::resume_directory(dir_, c);
}

std::optional<LoopCounters> RankCheckpoints::restore(outer::Diloco* outer) {
  const fs::path dir = resume_directory(outer);
  if (dir.empty()) {
    log_(fmt::format("--resume: no checkpoint under {}, starting fresh", dir_.string()));
    return std::nullopt;
  }
  auto st = SafetensorsFile::read(state_file(dir));
  auto need = [&](const std::string& key) -> const std::string& { return st.meta(key); };
  if (need("strategy") != site_.strategy || need("ranks") != std::to_string(site_.ranks))
    throw FileError(st.path(),
                    fmt::format("was written by a site with strategy {} and {} ranks; this run has {} and {}",
                                need("strategy"), need("ranks"), site_.strategy, site_.ranks));
  const OptimizerHostState cur = strategy_.optimizer_state();
  if (need("adamw_begin") != std::to_string(cur.begin) || need("adamw_end") != std::to_string(cur.end))
    throw FileError(st.path(), "optimizer shard range differs from this run's (model or rank count changed?)");
  // Checkpoints written before Muon existed hold AdamW's moments.
  const std::string kind = st.metadata().count("optimizer") ? need("optimizer") : "adamw";
  if (kind != optimizer_kind_name(cfg_.train.optimizer.kind))
    throw FileError(st.path(),
                    fmt::format("holds the state of a {} inner optimizer; this run's train.optimizer.kind is {}", kind,
                                optimizer_kind_name(cfg_.train.optimizer.kind)));
  const std::vector<int64_t> mshape = {cur.end - cur.begin};
  std::vector<float> m(static_cast<size_t>(cur.end - cur.begin)), v(m.size());
  st.copy_f32("adamw.m", mshape, m);
  st.copy_f32("adamw.v", mshape, v);
  auto shard = strategy_.shard_params();
  st.copy_f32("params.shard", std::vector<int64_t>{static_cast<int64_t>(shard.size())}, shard);
  // Counters: whole decimal values in range, else a FileError naming the file and key.
  constexpr int64_t kMaxCount = std::numeric_limits<int64_t>::max();
  constexpr double kMaxSeconds = std::numeric_limits<double>::max();
  strategy_.load_optimizer(m, v, st.meta_int("adamw_steps", 0, kMaxCount));
  sampler_.restore(SamplerState::from_bytes(st.u8("sampler"), st.path()));
  LoopCounters c;
  c.step = st.meta_int("geoloco_step", 0, kMaxCount);
  c.wall_s = st.meta_double("wall_s", 0, kMaxSeconds);
  c.compute_s = st.meta_double("compute_s", 0, kMaxSeconds);
  // Checkpoints written before the overlap metrics existed lack it: count from zero.
  if (st.metadata().count("outer_wait_s")) c.outer_wait_s = st.meta_double("outer_wait_s", 0, kMaxSeconds);
  c.join_step = st.metadata().count("join_step") ? st.meta_int("join_step", 0, c.step) : -1;
  if (outer) outer->restore_state(st);
  strategy_.shard_updated();
  log_(fmt::format("resumed from {} at step {}", dir.string(), c.step));
  return c;
}

}  // namespace geoloco::trainer
