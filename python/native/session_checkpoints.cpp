// One rank's checkpoints under another program's inner loop (session_checkpoints.hpp).
#include "python/native/session_checkpoints.hpp"

#include <fmt/format.h>

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
#include "trainer/loop/checkpoint_dirs.hpp"
#include "trainer/loop/run_config.hpp"

namespace fs = std::filesystem;

namespace geoloco::python {

using trainer::step_dir_name;

SessionCheckpoints::SessionCheckpoints(const trainer::RunConfig& cfg, int site, int rank, HostSite& host,
                                       uint64_t layout, std::function<void(const std::string&)> log)
    : cfg_(cfg),
      site_(cfg.sites.at(static_cast<size_t>(site))),
      rank_(rank),
      host_(host),
      layout_(layout),
      log_(std::move(log)),
      dir_(fs::path(cfg.run.output_dir) / "checkpoints" / site_.name) {
  fs::create_directories(dir_);
}

std::string SessionCheckpoints::state_file(const fs::path& dir) const {
  return (dir / fmt::format("state.r{}.safetensors", rank_)).string();
}

void SessionCheckpoints::barrier() { (void)host_.all_gather({}); }

void SessionCheckpoints::save(int64_t step, std::span<const uint8_t> inner, outer::Diloco& outer) {
  const fs::path dir = dir_ / step_dir_name(step);
  fs::create_directories(dir);
  const auto shard = host_.shard_params();
  std::vector<TensorWrite> tensors = {
      f32_tensor("params.shard", {static_cast<int64_t>(shard.size())}, shard),
      u8_tensor("inner", {static_cast<int64_t>(inner.size())}, inner),
  };
  std::map<std::string, std::string> meta = {
      {"geoloco_step", std::to_string(step)},
      {"geoloco_run", cfg_.run.name},
      {"geoloco_site", site_.name},
      {"geoloco_config_hash", hex64(cfg_.hash)},
      {"inner_loop", "run.command"},
      {"layout_hash", hex64(layout_)},
      {"params_total", std::to_string(host_.total())},
      {"ranks", std::to_string(site_.ranks)},
      {"rank", std::to_string(rank_)},
  };
  outer::OuterState st = outer.save_state();
  for (auto& [k, v] : st.metadata) meta["outer." + k] = v;
  for (auto& [k, v] : st.tensors) tensors.push_back(f32_tensor("outer." + k, {static_cast<int64_t>(v.size())}, v));
  for (auto& [k, parts] : st.views) tensors.push_back(f32_parts_tensor("outer." + k, parts));
  for (auto& [k, v] : st.bytes) tensors.push_back(u8_tensor("outer." + k, {static_cast<int64_t>(v.size())}, v));
  write_safetensors(state_file(dir), tensors, meta);
  barrier();  // every rank's state is on disk before `latest` names the checkpoint
  if (rank_ == 0) {
    write_text_atomically((dir_ / "latest").string(), step_dir_name(step) + "\n");
    prune();
  }
  log_(fmt::format("checkpoint {} written", dir.string()));
}

void SessionCheckpoints::prune() { trainer::prune_step_dirs(dir_, cfg_.train.keep_checkpoints); }

std::vector<int64_t> SessionCheckpoints::site_steps() {
  const std::vector<int64_t> mine = trainer::local_steps(dir_, fs::path(state_file(dir_)).filename().string());
  return trainer::common_steps(mine, host_.all_gather(std::as_bytes(std::span<const int64_t>(mine))));
}

fs::path SessionCheckpoints::resume_directory(outer::Diloco& outer) {
  trainer::ResumeChoice c;
  c.several_sites = cfg_.sites.size() > 1;
  c.rank = rank_;
  c.site_steps = [this] { return site_steps(); };
  c.agree = [&outer](const std::vector<int64_t>& steps) { return outer.agree_resume_step(steps); };
  c.barrier = [this] { barrier(); };
  c.log = log_;
  return trainer::resume_directory(dir_, c);
}

std::optional<SessionCheckpoints::Restored> SessionCheckpoints::restore(outer::Diloco& outer) {
  const fs::path dir = resume_directory(outer);
  if (dir.empty()) {
    log_(fmt::format("--resume: no checkpoint under {}, starting fresh", dir_.string()));
    return std::nullopt;
  }
  auto st = SafetensorsFile::read(state_file(dir));
  if (st.meta("inner_loop") != "run.command")
    throw FileError(st.path(), "was written by geoloco's own inner loop, not by a run.command program");
  if (st.meta("ranks") != std::to_string(site_.ranks))
    throw FileError(st.path(),
                    fmt::format("was written by a site of {} ranks; this run's has {}", st.meta("ranks"), site_.ranks));
  if (st.meta("layout_hash") != hex64(layout_) || st.meta("params_total") != std::to_string(host_.total()))
    throw FileError(st.path(),
                    fmt::format("holds other parameters ({} values, layout {}) than this program's ({} "
                                "values, layout {})",
                                st.meta("params_total"), st.meta("layout_hash"), host_.total(), hex64(layout_)));
  Restored r;
  r.step = st.meta_int("geoloco_step", 0, std::numeric_limits<int64_t>::max());
  r.inner = st.u8("inner");
  auto shard = host_.shard_params();
  st.copy_f32("params.shard", std::vector<int64_t>{static_cast<int64_t>(shard.size())}, shard);
  host_.shard_updated();  // this rank's shard written, every rank's gathered
  outer.restore_state(st);
  log_(fmt::format("resumed from {} at step {}", dir.string(), r.step));
  return r;
}

}  // namespace geoloco::python
