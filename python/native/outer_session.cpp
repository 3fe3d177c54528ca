// OuterSession (outer_session.hpp): one rank's outer loop under another program's inner loop.
#include "python/native/outer_session.hpp"

#include "python/native/session_checkpoints.hpp"

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

// One line per tensor: its name and shape.
std::vector<std::string> layout_lines(const std::vector<HostTensor>& tensors) {
  std::vector<std::string> lines;
  for (const auto& t : tensors) {
    std::string shape;
    for (auto d : t.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
    lines.push_back(fmt::format("'{}' of shape ({})", t.name, shape));
  }
  return lines;
}

// Every rank of the other sites this rank exchanges with holds the same parameters (names,
// shapes, order): the layouts are exchanged once at the start (a control round of their own)
// and the first difference is named.
void check_layouts(transport::Transport& tp, const std::string& site, const std::vector<HostTensor>& tensors) {
  constexpr uint64_t kLayoutRound = UINT64_MAX - 2;
  const auto mine = layout_lines(tensors);
  std::string text;
  for (const auto& l : mine) text += l + "\n";
  const auto* b = reinterpret_cast<const uint8_t*>(text.data());
  std::vector<transport::RecvHandle> recvs;
  std::vector<transport::SendHandle> sends;
  const int P = static_cast<int>(tp.peers().size());
  for (int p = 0; p < P; ++p) {
    recvs.push_back(tp.recv(p, transport::FrameKind::kControl, kLayoutRound, 0, size_t{64} << 20));
    sends.push_back(tp.send(p, transport::FrameKind::kControl, kLayoutRound, 0,
                            transport::payload_of(std::span<const uint8_t>(b, text.size()))));
  }
  for (auto& h : sends) h.wait();
  for (int p = 0; p < P; ++p) {
    recvs[size_t(p)].wait();
    const size_t n = recvs[size_t(p)].bytes();
    const auto buf = recvs[size_t(p)].take();
    const std::string got(buf.begin(), buf.begin() + static_cast<int64_t>(n));
    if (got == text) continue;
    std::vector<std::string> theirs;
    for (size_t i = 0, j; i < got.size(); i = j + 1) {
      j = got.find('\n', i);
      if (j == std::string::npos) j = got.size();
      theirs.push_back(got.substr(i, j - i));
    }
    size_t i = 0;
    while (i < mine.size() && i < theirs.size() && mine[i] == theirs[i]) ++i;
    const auto& peer = tp.peers()[size_t(p)];
    throw InputError(fmt::format(
        "the parameters differ between site {} and site {} (rank {}): parameter {} is {} here and {} there ({} vs {} "
        "parameters); every rank of every site passes the same names, shapes and order",
        site, peer.site, peer.rank, i, i < mine.size() ? mine[i] : "absent", i < theirs.size() ? theirs[i] : "absent",
        mine.size(), theirs.size()));
  }
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

namespace {

int64_t total_of(const std::vector<HostTensor>& tensors) {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.numel;
  return n;
}

HostSite make_host_site(std::vector<HostTensor> held, const std::vector<HostTensor>& model, int rank, int ranks,
                        HostSiteCallbacks callbacks) {
  if (model.empty()) return HostSite(std::move(held), rank, ranks, std::move(callbacks));
  return HostSite(std::move(held), total_of(model), rank, ranks, std::move(callbacks));
}

}  // namespace

OuterSession::OuterSession(const SessionOptions& o, std::vector<HostTensor> held, std::vector<HostTensor> model,
                           HostSiteCallbacks callbacks)
    : cfg_(std::make_unique<trainer::RunConfig>(trainer::load_run_config(o.config, o.sets))),
      rank_(o.rank),
      tokens_per_step_(o.tokens_per_step),
      host_(make_host_site(
          held, model, o.rank,
          [&] {
            const int s = cfg_->site_index(o.site);
            if (s < 0) {
              std::string names;
              for (const auto& sc : cfg_->sites) names += (names.empty() ? "" : ", ") + sc.name;
              throw ConfigError(fmt::format("{}: no site '{}' (sites: {})", o.config, o.site, names));
            }
            return cfg_->sites[static_cast<size_t>(s)].ranks;
          }(),
          std::move(callbacks))) {
  // The model's tensors (what fragments are cut from and the sites compare): what this rank
  // holds, or the layout a sharded loop gave.
  const std::vector<HostTensor>& tensors = model.empty() ? held : model;
  auto& cfg = *cfg_;
  site_ = cfg.site_index(o.site);
  const auto& sc = cfg.sites[static_cast<size_t>(site_)];
  total_steps_ = o.total_steps > 0 ? o.total_steps : cfg.train.steps;
  cfg.train.steps = total_steps_;
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
  const uint64_t layout = layout_hash(tensors);
  const bool launched = std::getenv("GEOLOCO_LAUNCHED") != nullptr;
  log::init(launched ? "" : fmt::format("{}/{}", sc.name, rank_), cfg.run.log_level);

  outer::OuterOptions oo = trainer::outer_options(cfg, site_, rank_, {}, o.join);
  oo.params = params;
  oo.tokens_per_step = tokens_per_step_;
  oo.init_from.clear();
  const std::string address = app::rank_address(sc, rank_, "");
  tp_ = app::connect_site_transport(cfg, site_, rank_, params.total, address, {}, o.join);
  // (A joiner's state is checked by the join: sizes and the committed hash.)
  if (tp_ && !o.join) check_layouts(*tp_, sc.name, tensors);
  outer_ = std::make_unique<outer::Diloco>(std::move(oo), tp_.get(), host_);
  int status_fd = -1;
  if (const char* fd = std::getenv("GEOLOCO_STATUS_FD"); launched && fd != nullptr && rank_ == 0)
    status_fd = std::atoi(fd);
  records_ = std::make_unique<trainer::RunRecords>(cfg, site_, rank_, o.join || o.resume, false, status_fd);
  checkpoints_ = std::make_unique<SessionCheckpoints>(cfg, site_, rank_, host_, layout, [this](const std::string& m) {
    if (rank_ == 0) records_->log(m);
  });
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
  checkpoints_.reset();
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

std::optional<std::pair<int64_t, std::vector<uint8_t>>> OuterSession::resume() {
  if (!outer_) throw InputError("the outer loop is closed");
  if (last_step_ != 0) throw InputError(fmt::format("resume after step {}: resume before the first step", last_step_));
  auto r = checkpoints_->restore(*outer_);
  if (!r) return std::nullopt;
  outer_->resumed(r->step);
  last_step_ = r->step;
  return std::make_pair(r->step, std::move(r->inner));
}

void OuterSession::save_checkpoint(int64_t step, std::span<const uint8_t> inner) {
  if (!outer_) throw InputError("the outer loop is closed");
  if (step != last_step_)
    throw InputError(
        fmt::format("checkpoint of step {} after step {}: checkpoint the step just reported", step, last_step_));
  checkpoints_->save(step, inner, *outer_);
}

int64_t OuterSession::checkpoint_every() const { return cfg_->train.checkpoint_every; }

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
  const auto t0 = std::chrono::steady_clock::now();
  const bool round = outer_->after_inner_step(step);
  outer_wait_s_ += seconds_since(t0);
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
  const auto t0 = std::chrono::steady_clock::now();
  outer_->finish(step);
  outer_wait_s_ += seconds_since(t0);
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
  mine["exposed_wait_s"] = outer_wait_s_;  // as the native trainer's summary counts it
  mine["inner_loop"] = "run.command";
  app::SiteGather in_site;
  if (sc.ranks > 1) in_site = [this](std::span<const std::byte> b) { return host_.all_gather(b); };
  auto summary = app::finish_run_summary(*cfg_, site_, rank_, in_site, tp_.get(), outer_->members(), mine);
  final_hash_ = outer_->site_hash();
  close();
  return summary;
}

}  // namespace geoloco::python
