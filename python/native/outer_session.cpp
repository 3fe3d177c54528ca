// OuterSession (outer_session.hpp): one rank's outer loop under another program's inner loop.
#include "python/native/outer_session.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <array>
#include <cmath>
#include <cstdlib>

#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/log.hpp"
#include "outer_optimizer/diloco.hpp"
#include "trainer/app/rank_address.hpp"
#include "trainer/app/rank_runner.hpp"
#include "trainer/loop/outer_edge.hpp"
#include "trainer/loop/run_config.hpp"
#include "trainer/loop/run_records.hpp"
#include "transport/transport.hpp"

namespace geoloco::python {

namespace {

// The first integer component of a dotted name, or -1.
int block_of(const std::string& name) {
  size_t i = 0;
  while (i <= name.size()) {
    const size_t j = std::min(name.find('.', i), name.size());
    const std::string part = name.substr(i, j - i);
    if (!part.empty() && part.size() < 9 && part.find_first_not_of("0123456789") == std::string::npos)
      return std::atoi(part.c_str());
    i = j + 1;
  }
  return -1;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

outer::ModelParams model_params_of(const std::vector<HostTensor>& tensors) {
  outer::ModelParams p;
  for (const auto& t : tensors) {
    outer::ParamTensor pt;
    pt.name = t.name;
    pt.offset = p.total;
    pt.rows = t.shape.size() >= 2 ? t.shape[0] : 1;
    if (pt.rows <= 0 || t.numel % pt.rows != 0)
      throw InputError(fmt::format("parameter '{}': {} elements do not make rows of its first dimension {}", t.name,
                                   t.numel, pt.rows));
    pt.cols = t.numel / pt.rows;
    pt.block = block_of(t.name);
    p.tensors.push_back(pt);
    p.total += t.numel;
  }
  p.validate();
  return p;
}

uint64_t layout_hash(const std::vector<HostTensor>& tensors) {
  std::string text;
  for (const auto& t : tensors) {
    text += t.name + "[";
    for (auto d : t.shape) text += std::to_string(d) + ",";
    text += "]" + std::to_string(t.numel) + ";";
  }
  return hash64(text);
}

OuterSession::OuterSession(const SessionOptions& o, std::vector<HostTensor> tensors, HostSiteCallbacks callbacks)
    : cfg_(std::make_unique<trainer::RunConfig>(trainer::load_run_config(o.config, o.sets))),
      rank_(o.rank),
      tokens_per_step_(o.tokens_per_step),
      host_(
          tensors, o.rank,
          [&] {
            const int s = cfg_->site_index(o.site);
            if (s < 0) {
              std::string names;
              for (const auto& sc : cfg_->sites) names += (names.empty() ? "" : ", ") + sc.name;
              throw ConfigError(fmt::format("{}: no site '{}' (sites: {})", o.config, o.site, names));
            }
            return cfg_->sites[static_cast<size_t>(s)].ranks;
          }(),
          std::move(callbacks)) {
  auto& cfg = *cfg_;
  site_ = cfg.site_index(o.site);
  const auto& sc = cfg.sites[static_cast<size_t>(site_)];
  total_steps_ = o.total_steps > 0 ? o.total_steps : cfg.train.steps;
  if (total_steps_ != cfg.train.steps) cfg.train.steps = total_steps_;
  if (!cfg.outer.enabled)
    throw ConfigError(
        fmt::format("{}: the outer loop is off (one site and no outer: section): nothing to sync", o.config));
  const outer::ModelParams params = model_params_of(tensors);
  if (cfg.outer.fragments > std::max(1, params.blocks()))
    throw ConfigError(
        fmt::format("{}: outer.fragments is {}, but the parameters name {} block(s) (a tensor's block is "
                    "the first number in its name, as in 'layers.3.mlp.weight'; a fragment holds at least "
                    "one)",
                    o.config, cfg.outer.fragments, params.blocks()));
  if (cfg.outer.weighting == outer::Weighting::Tokens && tokens_per_step_ == 0)
    throw InputError("outer.weighting: tokens needs tokens_per_step (the site's tokens per inner step) > 0");
  // Sites whose parameters differ (count, shapes, order) refuse each other when they connect:
  // the layout is part of the hash the handshake compares.
  cfg.hash = hash64(fmt::format("{:016x}", layout_hash(tensors)), cfg.hash);
  const bool launched = std::getenv("GEOLOCO_LAUNCHED") != nullptr;
  log::init(launched ? "" : fmt::format("{}/{}", sc.name, rank_), cfg.run.log_level);

  outer::OuterOptions oo = trainer::outer_options(cfg, site_, rank_, {}, o.join);
  oo.params = params;
  oo.tokens_per_step = tokens_per_step_;
  oo.init_from.clear();
  const std::string address = app::rank_address(sc, rank_, "");
  tp_ = app::connect_site_transport(cfg, site_, rank_, params.total, address, {}, o.join);
  outer_ = std::make_unique<outer::Diloco>(std::move(oo), tp_.get(), host_);
  int status_fd = -1;
  if (const char* fd = std::getenv("GEOLOCO_STATUS_FD"); launched && fd != nullptr && rank_ == 0)
    status_fd = std::atoi(fd);
  records_ = std::make_unique<trainer::RunRecords>(cfg, site_, rank_, o.join, false, status_fd);
  if (rank_ == 0)
    records_->log(
        fmt::format("site {}: {} rank(s), {:.2f}M parameters in {} tensors ({} blocks), {} steps, outer every "
                    "{} steps",
                    sc.name, sc.ranks, double(params.total) / 1e6, params.tensors.size(), params.blocks(), total_steps_,
                    outer_->interval()));
  start_ = window_t0_ = std::chrono::steady_clock::now();
}

OuterSession::~OuterSession() { close(); }

void OuterSession::close() {
  records_.reset();
  outer_.reset();
  tp_.reset();
}

int64_t OuterSession::join() {
  if (!outer_) throw InputError("the outer loop is closed");
  const int64_t step = outer_->join();
  last_step_ = step;
  return step;
}

bool OuterSession::trains_step(int64_t step) {
  if (!outer_) throw InputError("the outer loop is closed");
  return outer_->trains_step(step);
}

int64_t OuterSession::log_every() const { return cfg_->train.log_every; }

nlohmann::json OuterSession::metrics() { return outer_ ? outer_->metrics() : nlohmann::json::object(); }

std::string OuterSession::output_dir() const { return cfg_->run.output_dir; }

uint64_t OuterSession::global_weights_hash() const { return outer_ ? outer_->site_hash() : final_hash_; }

bool OuterSession::after_step(int64_t step, double loss) {
  if (finished_) throw InputError(fmt::format("step {} after the outer loop finished", step));
  if (!outer_) throw InputError("the outer loop is closed");
  if (step != last_step_ + 1)
    throw InputError(fmt::format("step {} after step {}: call once per inner step, in order", step, last_step_));
  last_step_ = step;
  ++window_steps_;
  ++trained_steps_;
  if (!std::isnan(loss)) {
    window_loss_ += loss;
    ++window_losses_;
    last_loss_ = loss;
  }
  const bool round = outer_->after_inner_step(step);
  records_->rounds(outer_->take_rounds());
  if (step % cfg_->train.log_every == 0 || step == total_steps_) {
    // The site's mean loss over the window (every rank logs at the same steps).
    std::array<double, 2> mean = {window_loss_, double(window_losses_)};
    host_.sum(mean);
    const double dt = seconds_since(window_t0_);
    const uint64_t run_tokens_per_step = tokens_per_step_ * cfg_->sites.size();
    nlohmann::json line = {{"step", step},
                           {"loss", mean[1] > 0 ? mean[0] / mean[1] : NAN},
                           {"tokens", uint64_t(step) * run_tokens_per_step},
                           {"tokens_per_s", dt > 0 ? double(window_steps_ * run_tokens_per_step) / dt : 0.0},
                           {"elapsed_s", seconds_since(start_)},
                           {"site", cfg_->sites[static_cast<size_t>(site_)].name}};
    line.update(outer_->metrics());
    records_->line(line);
    window_t0_ = std::chrono::steady_clock::now();
    window_steps_ = 0;
    window_loss_ = 0;
    window_losses_ = 0;
  }
  return round;
}

nlohmann::json OuterSession::finish(int64_t step) {
  if (finished_) throw InputError("finish() called twice");
  if (!outer_) throw InputError("the outer loop is closed");
  if (step != total_steps_)
    throw InputError(fmt::format("finish at step {}: the run ends at step {} (train.steps), where every site syncs",
                                 step, total_steps_));
  outer_->finish(step);
  records_->rounds(outer_->take_rounds());
  finished_ = true;
  records_->end(step, true);
  const auto& sc = cfg_->sites[static_cast<size_t>(site_)];
  const double wall = seconds_since(start_);
  nlohmann::json mine = outer_->summary();
  mine["site"] = sc.name;
  mine["rank"] = rank_;
  mine["steps"] = step;
  mine["trained_steps"] = trained_steps_;
  mine["completed"] = true;
  mine["final_loss"] = last_loss_;
  mine["val_loss"] = NAN;
  mine["params"] = host_.total();
  mine["tokens"] = uint64_t(step) * tokens_per_step_ * cfg_->sites.size();
  mine["tokens_per_s"] = wall > 0 ? double(trained_steps_ * tokens_per_step_) / wall : 0.0;
  mine["wall_s"] = wall;
  mine["inner_loop"] = "run.command";
  app::SiteGather in_site;
  if (sc.ranks > 1) in_site = [this](std::span<const std::byte> b) { return host_.all_gather(b); };
  auto summary = app::finish_run_summary(*cfg_, site_, rank_, in_site, tp_.get(), outer_->members(), mine);
  final_hash_ = outer_->site_hash();
  close();
  return summary;
}

}  // namespace geoloco::python
