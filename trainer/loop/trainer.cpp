#include "trainer/loop/trainer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <set>
#include <thread>

#include "trainer/checkpoint/atomic_file.hpp"
#include "trainer/checkpoint/model_checkpoint.hpp"
#include "trainer/core/error.hpp"
#include "trainer/core/hash.hpp"
#include "trainer/core/log.hpp"
#include "trainer/data/open_data.hpp"
#include "trainer/data/sampler.hpp"
#include "trainer/loop/device_site.hpp"
#include "trainer/loop/live_metrics.hpp"
#include "trainer/loop/metrics.hpp"
#include "trainer/model/gpt.hpp"
#include "trainer/optim/schedule.hpp"

namespace fs = std::filesystem;

namespace geoloco::trainer {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }
// The step a checkpoint directory is named for (step_dir_name's inverse), or nothing.
std::optional<int64_t> step_of_dir_name(const std::string& n) {
  if (n.size() < 6 || n.size() > 23 || n.rfind("step_", 0) != 0 ||
      n.find_first_not_of("0123456789", 5) != std::string::npos)
    return std::nullopt;
  return std::stoll(n.substr(5));
}

}  // namespace

struct Trainer::Impl {
  const RunConfig& cfg;
  TrainerOptions opt;
  const SiteConfig& site;
  int global_rank;
  int world;
  int T;
  Gpt model;
  DataSplits data;
  std::unique_ptr<DistributedSampler> sampler;
  std::unique_ptr<SiteStrategy> cpu_strategy;  // site.device: cpu
  std::unique_ptr<Rehearsal> rehearsal;        // train.rehearsal: the stand-in inner loop
  std::unique_ptr<DeviceSite> device;          // site.device: cuda (it is the strategy too)
  SiteStrategy* strategy = nullptr;
  std::vector<int32_t> inputs, targets;

  fs::path out_dir, site_dir, ckpt_dir;
  std::unique_ptr<MetricsWriter> metrics;      // sites/<site>/metrics.jsonl (site rank 0)
  std::unique_ptr<MetricsWriter> run_metrics;  // metrics.jsonl (global rank 0)
  std::unique_ptr<LiveMetrics> live;           // run.metrics_port: this rank's Prometheus endpoint
  nlohmann::json status;                       // what the launcher's status view shows (status_fd)
  std::unique_ptr<MetricsWriter> rounds;       // sites/<site>/rounds.r<rank>.jsonl (every rank with an outer loop)
  std::unique_ptr<ProgressLine> progress;

  int64_t step = 0;  // completed inner steps
  // This process's steps trained and skipped (outer.pace: time: a slower site skips some).
  int64_t trained_steps = 0, skipped_steps = 0;
  double wall_before = 0;         // wall seconds of earlier segments (resume)
  double compute_seconds = 0;     // time in forward/backward/optimizer
  double outer_wait_seconds = 0;  // inner loop blocked in the outer loop (exposed WAN/sync time)
  // The current outer period (since the last outer step): utilization = compute / wall.
  Clock::time_point period_t0 = Clock::now();
  double period_compute = 0, period_wait = 0;
  TraceRecorder trace;
  double last_loss = NAN, last_val_loss = NAN;
  int64_t tokens_per_step_rank;
  int64_t tokens_per_step_run;  // every rank of every site (sites may differ in ranks and grad_accum)

  Impl(const RunConfig& c, const TrainerOptions& o)
      : cfg(c),
        opt(o),
        site(c.sites.at(static_cast<size_t>(o.site))),
        global_rank(c.global_rank(o.site, o.rank)),
        world(c.world_size()),
        T(c.seq_len()),
        model(c.model) {
    Gpt::set_num_threads(cfg.train.threads);
    data = open_data(cfg.data, cfg.dir, cfg.model.vocab_size);
    SamplerOptions so;
    so.seed = cfg.run.seed;
    const bool identical = cfg.data.across_sites == "identical";
    so.world = identical ? site.ranks : world;
    so.rank = identical ? o.rank : global_rank;
    so.seq_len = T;
    so.random_offsets = cfg.data.windows == "random";
    sampler = std::make_unique<DistributedSampler>(data.train, so);
    if (sampler->steps_per_epoch(cfg.train.micro_batch) == 0)
      throw InputError(
          fmt::format("training data too small: {} has {} windows of {} tokens, fewer than one "
                      "global micro-batch ({} ranks x {} sequences)",
                      data.train->describe(), sampler->num_windows(), T + 1, so.world, cfg.train.micro_batch));
    inputs.resize(static_cast<size_t>(cfg.train.micro_batch) * T);
    targets.resize(inputs.size());
    tokens_per_step_rank = int64_t(cfg.train.micro_batch) * site.grad_accum * T;
    tokens_per_step_run = cfg.global_batch() * T;

    std::vector<float> init(static_cast<size_t>(model.layout().total()));
    if (cfg.train.init_from.empty()) {
      Gpt::init_params(model.layout(), init, cfg.run.seed);
    } else {
      load_model(cfg.train.init_from, model.layout(), init);  // checked at config load; read again here
    }
    if (site.device == "cuda") {
      DeviceSiteOptions dso;
      dso.device = select_rank_device(cfg, o.site, o.rank, o.cuda_device);
      dso.keep_one_rank_collective = opt.keep_one_rank_collective;
      device = make_device_site(cfg, o.site, model.layout(), opt.collective, init, dso);
      strategy = &device->strategy();
    } else {
      cpu_strategy =
          std::make_unique<SiteStrategy>(parse_strategy(site.strategy), model.layout(), opt.collective,
                                         cfg.train.optimizer, init, !cfg.train.rehearsal.enabled, site.group_size);
      strategy = cpu_strategy.get();
    }

    if (cfg.train.rehearsal.enabled)
      rehearsal = std::make_unique<Rehearsal>(cfg.train.rehearsal,
                                              cfg.run.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(o.site));
    out_dir = cfg.run.output_dir;
    site_dir = out_dir / "sites" / site.name;
    ckpt_dir = out_dir / "checkpoints" / site.name;
    fs::create_directories(site_dir);
    fs::create_directories(ckpt_dir);
    const bool append = opt.resume || opt.join;
    if (opt.rank == 0) metrics = std::make_unique<MetricsWriter>((site_dir / "metrics.jsonl").string(), append);
    if (global_rank == 0) run_metrics = std::make_unique<MetricsWriter>((out_dir / "metrics.jsonl").string(), append);
    if (cfg.run.metrics_port > 0) {
      live = std::make_unique<LiveMetrics>(cfg.run.metrics_host, cfg.run.metrics_port + global_rank,
                                           LiveMetrics::Labels{cfg.run.name, site.name, opt.rank}, cfg.train.steps,
                                           static_cast<int>(cfg.sites.size()));
      spdlog::info("metrics: http://{}:{}/metrics", cfg.run.metrics_host, cfg.run.metrics_port + global_rank);
    }
    // Opened at the first finished outer round (the outer loop is set after construction);
    // a fresh run removes an earlier run's file now, so none of its rounds survive.
    if (!append) fs::remove(rounds_path());
    // The config as it ran (after --set overrides), for `geoloco report` and for the record.
    if (global_rank == 0)
      write_text_atomically((out_dir / "config.yaml").string(),
                            fmt::format("# {}: the config of run '{}' as it ran (overrides applied), hash {}\n{}\n",
                                        cfg.path, cfg.run.name, hex64(cfg.hash), cfg.canonical_yaml));
    if (global_rank == 0 || (world == 1)) progress = std::make_unique<ProgressLine>(opt.progress, cfg.train.steps);
  }

  // One JSON line to the launcher's status view: the latest value of every field so far.
  void report_status(const nlohmann::json& line, bool done) {
    if (opt.status_fd < 0) return;
    for (const char* k :
         {"step", "loss", "val_loss", "tokens_per_s", "elapsed_s", "sync_s", "exposed_wait_s", "compute_utilization"})
      if (line.contains(k)) status[k] = line[k];
    status["site"] = site.name;
    status["steps"] = cfg.train.steps;
    status["sites"] = cfg.sites.size();
    status["done"] = done;
    const std::string text = status.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    const char* p = text.data();
    size_t left = text.size();
    while (left > 0) {  // a pipe: small writes are whole; a failure only loses the view
      const ssize_t n = ::write(opt.status_fd, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      p += n;
      left -= static_cast<size_t>(n);
    }
  }

  fs::path rounds_path() const { return site_dir / fmt::format("rounds.r{}.jsonl", opt.rank); }

  // ---- checkpoints -------------------------------------------------------------------

  std::string state_file(const fs::path& dir) const {
    return (dir / fmt::format("state.r{}.safetensors", opt.rank)).string();
  }

  void barrier() {
    if (strategy->collective() && strategy->ranks() > 1) strategy->collective()->barrier();
  }

  void save_checkpoint() {
    // A rehearsal drifts only each rank's own shard: make the replicas whole first (collective).
    if (rehearsal) strategy->shard_updated();
    const fs::path dir = ckpt_dir / step_dir_name(step);
    fs::create_directories(dir);
    auto full = strategy->full_params();  // collective under fsdp: every rank calls it
    std::map<std::string, std::string> meta = {
        {"geoloco_step", std::to_string(step)},
        {"geoloco_run", cfg.run.name},
        {"geoloco_site", site.name},
        {"geoloco_config_hash", hex64(cfg.hash)},
    };
    if (opt.rank == 0) save_model_directory(dir.string(), model.layout(), full, meta);  // + config.json (HF)
    strategy->release_full_params();

    // This rank's state: optimizer moments of its range, sampler, counters, outer state.
    // (On a device: moments and shard are downloaded into host copies first.)
    const OptimizerHostState adam = strategy->optimizer_state();
    // Views, not copies: at real size each is the size of the shard (written as they stand).
    const auto shard = strategy->shard_params();
    auto sampler_bytes = sampler->state().to_bytes();
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
    smeta["optimizer"] = optimizer_kind_name(cfg.train.optimizer.kind);  // what adamw.m holds
    smeta["strategy"] = site.strategy;
    smeta["ranks"] = std::to_string(site.ranks);
    smeta["rank"] = std::to_string(opt.rank);
    smeta["wall_s"] = fmt::format("{:.17g}", wall_before + seconds_since(start));
    smeta["compute_s"] = fmt::format("{:.17g}", compute_seconds);
    smeta["outer_wait_s"] = fmt::format("{:.17g}", outer_wait_seconds);
    if (join_step >= 0) smeta["join_step"] = std::to_string(join_step);  // its re-warmup goes on after --resume
    OuterHook::State outer_state;
    if (opt.outer) {
      outer_state = opt.outer->save_state();
      for (auto& [k, v] : outer_state.metadata) smeta["outer." + k] = v;
      for (auto& [k, v] : outer_state.tensors)
        tensors.push_back(f32_tensor("outer." + k, {static_cast<int64_t>(v.size())}, v));
      for (auto& [k, parts] : outer_state.views) tensors.push_back(f32_parts_tensor("outer." + k, parts));
      for (auto& [k, v] : outer_state.bytes)
        tensors.push_back(u8_tensor("outer." + k, {static_cast<int64_t>(v.size())}, v));
    }
    write_safetensors(state_file(dir), tensors, smeta);
    barrier();  // every rank's state is on disk before `latest` names the checkpoint
    if (opt.rank == 0) {
      write_text_atomically((ckpt_dir / "latest").string(), step_dir_name(step) + "\n");
      prune_checkpoints();
    }
    log_info(fmt::format("checkpoint {} written", (dir).string()));
  }

  // The outer loop failed in a way it can carry on from (outer_hook.hpp): a checkpoint at
  // this step, so --resume continues from here. Best effort: the original error still ends
  // the rank, and a checkpoint that cannot be written is said, not thrown.
  static std::string first_line(const std::string& s) {
    const auto cut = s.find_first_of(";\n");
    return cut == std::string::npos ? s : s.substr(0, cut);
  }
  void save_checkpoint_after_failure(const std::exception& why) {
    try {
      save_checkpoint();
      log_info(
          fmt::format("site {}: the outer loop stopped at step {} ({}); checkpoint written: --resume carries "
                      "on from it",
                      site.name, step, first_line(why.what())));
    } catch (const std::exception& e) {
      spdlog::error("site {}: no checkpoint at step {} after the failure: {}", site.name, step, e.what());
    }
  }

  void prune_checkpoints() {
    std::vector<fs::path> dirs;
    for (const auto& e : fs::directory_iterator(ckpt_dir))
      if (e.is_directory() && e.path().filename().string().rfind("step_", 0) == 0) dirs.push_back(e.path());
    std::sort(dirs.begin(), dirs.end());
    while (static_cast<int>(dirs.size()) > cfg.train.keep_checkpoints) {
      fs::remove_all(dirs.front());
      dirs.erase(dirs.begin());
    }
  }

  // The steps of this site's checkpoints that every rank of the site holds its state of
  // (a checkpoint cut short by a crash is complete on some ranks only), ascending.
  std::vector<int64_t> site_checkpoint_steps() {
    std::vector<int64_t> mine;
    for (const auto& e : fs::directory_iterator(ckpt_dir))
      if (const auto at = step_of_dir_name(e.path().filename().string());
          at && e.is_directory() && fs::exists(state_file(e.path())))
        mine.push_back(*at);
    std::sort(mine.begin(), mine.end());
    auto* coll = strategy->collective();
    if (!coll || strategy->ranks() == 1) return mine;
    std::vector<int64_t> common = mine;
    for (const auto& b : coll->all_gather_bytes(std::as_bytes(std::span<const int64_t>(mine)))) {
      std::vector<int64_t> theirs(b.size() / sizeof(int64_t));
      std::memcpy(theirs.data(), b.data(), theirs.size() * sizeof(int64_t));
      std::vector<int64_t> both;
      std::set_intersection(common.begin(), common.end(), theirs.begin(), theirs.end(), std::back_inserter(both));
      common = std::move(both);
    }
    return common;
  }

  // The checkpoint --resume restores: this site's `latest`, or with other sites the newest step
  // every site holds (OuterHook::agree_resume_step): after a site died, the others may hold
  // later checkpoints (written at a lost quorum) than it. Newer checkpoints of this site are
  // moved aside into checkpoints/<site>/discarded/ (their rounds were never committed by
  // every site), and `latest` names the one restored. Empty: nothing to restore.
  fs::path resume_directory() {
    const fs::path latest = ckpt_dir / "latest";
    std::string name;
    if (fs::exists(latest)) {
      std::ifstream in(latest);
      std::getline(in, name);
      if (name.rfind("step_", 0) != 0 || !fs::is_directory(ckpt_dir / name))
        throw FileError(latest.string(), fmt::format("names '{}', which is not a checkpoint directory", name));
    }
    if (!opt.outer || cfg.sites.size() < 2) return name.empty() ? fs::path() : ckpt_dir / name;
    std::vector<int64_t> steps = site_checkpoint_steps();
    // Nothing past `latest` counts: a directory written after it is a checkpoint cut short.
    const std::optional<int64_t> latest_step = step_of_dir_name(name);
    std::erase_if(steps, [&](int64_t s) { return !latest_step || s > *latest_step; });
    const int64_t chosen = opt.outer->agree_resume_step(steps, *strategy);
    if (chosen < 0) return {};
    const std::string chosen_name = step_dir_name(chosen);
    if (chosen_name != name) {
      log_info(fmt::format(
          "--resume: step {} is the newest checkpoint every site holds; this site's newer ones ({}) are moved "
          "to {}",
          chosen, name, (ckpt_dir / "discarded").string()));
      barrier();
      if (opt.rank == 0) {
        fs::create_directories(ckpt_dir / "discarded");
        for (const auto& e : fs::directory_iterator(ckpt_dir))
          if (const auto at = step_of_dir_name(e.path().filename().string()); at && *at > chosen && e.is_directory())
            fs::rename(e.path(), ckpt_dir / "discarded" / e.path().filename());
        write_text_atomically(latest.string(), chosen_name + "\n");
      }
      barrier();
    }
    return ckpt_dir / chosen_name;
  }

  void restore_latest() {
    const fs::path dir = resume_directory();
    if (dir.empty()) {
      log_info(fmt::format("--resume: no checkpoint under {}, starting fresh", ckpt_dir.string()));
      return;
    }
    auto st = SafetensorsFile::read(state_file(dir));
    auto need = [&](const std::string& key) -> const std::string& { return st.meta(key); };
    if (need("strategy") != site.strategy || need("ranks") != std::to_string(site.ranks))
      throw FileError(st.path(),
                      fmt::format("was written by a site with strategy {} and {} ranks; this run has {} and {}",
                                  need("strategy"), need("ranks"), site.strategy, site.ranks));
    const OptimizerHostState cur = strategy->optimizer_state();
    if (need("adamw_begin") != std::to_string(cur.begin) || need("adamw_end") != std::to_string(cur.end))
      throw FileError(st.path(), "optimizer shard range differs from this run's (model or rank count changed?)");
    // Checkpoints written before Muon existed hold AdamW's moments.
    const std::string kind = st.metadata().count("optimizer") ? need("optimizer") : "adamw";
    if (kind != optimizer_kind_name(cfg.train.optimizer.kind))
      throw FileError(
          st.path(), fmt::format("holds the state of a {} inner optimizer; this run's train.optimizer.kind is {}", kind,
                                 optimizer_kind_name(cfg.train.optimizer.kind)));
    const std::vector<int64_t> mshape = {cur.end - cur.begin};
    std::vector<float> m(static_cast<size_t>(cur.end - cur.begin)), v(m.size());
    st.copy_f32("adamw.m", mshape, m);
    st.copy_f32("adamw.v", mshape, v);
    auto shard = strategy->shard_params();
    st.copy_f32("params.shard", std::vector<int64_t>{static_cast<int64_t>(shard.size())}, shard);
    // Counters: whole decimal values in range, else a FileError naming the file and key.
    constexpr int64_t kMaxCount = std::numeric_limits<int64_t>::max();
    constexpr double kMaxSeconds = std::numeric_limits<double>::max();
    strategy->load_optimizer(m, v, st.meta_int("adamw_steps", 0, kMaxCount));
    sampler->restore(SamplerState::from_bytes(st.u8("sampler"), st.path()));
    step = st.meta_int("geoloco_step", 0, kMaxCount);
    wall_before = st.meta_double("wall_s", 0, kMaxSeconds);
    compute_seconds = st.meta_double("compute_s", 0, kMaxSeconds);
    // Checkpoints written before the overlap metrics existed lack it: count from zero.
    if (st.metadata().count("outer_wait_s")) outer_wait_seconds = st.meta_double("outer_wait_s", 0, kMaxSeconds);
    join_step = st.metadata().count("join_step") ? st.meta_int("join_step", 0, step) : -1;
    if (opt.outer) opt.outer->restore_state(st);
    strategy->shard_updated();
    log_info(fmt::format("resumed from {} at step {}", dir.string(), step));
  }

  // ---- evaluation --------------------------------------------------------------------

  // Mean validation loss of the current local model. Every rank evaluates a disjoint,
  // fixed set of windows spread over the validation split; the site averages.
  double evaluate() {
    const size_t n = data.val->num_windows(T);
    if (n == 0) return NAN;
    std::span<const float> params;
    if (device)
      device->begin_eval();
    else
      params = strategy->full_params();
    const int B = cfg.train.micro_batch;
    const int ranks = strategy->ranks();
    const int64_t total = std::min<int64_t>(static_cast<int64_t>(n), int64_t(cfg.train.eval_batches) * B * ranks);
    std::vector<int32_t> win(static_cast<size_t>(T + 1));
    double sum = 0;
    int64_t count = 0;
    for (int64_t j0 = int64_t(strategy->rank()) * B; j0 < total; j0 += int64_t(B) * ranks) {
      const int rows = static_cast<int>(std::min<int64_t>(B, total - j0));
      for (int r = 0; r < rows; ++r) {
        // Evenly spaced windows, the same set at every evaluation.
        const size_t idx = static_cast<size_t>((j0 + r) * static_cast<int64_t>(n) / total);
        data.val->window(idx, T, win.data());
        std::copy(win.begin(), win.begin() + T, inputs.begin() + int64_t(r) * T);
        std::copy(win.begin() + 1, win.end(), targets.begin() + int64_t(r) * T);
      }
      const float l = device ? static_cast<float>(device->eval_batch(inputs.data(), targets.data(), rows, T))
                             : model.evaluate(params, inputs.data(), targets.data(), rows, T);
      sum += double(l) * rows;
      count += rows;
    }
    if (device) device->end_eval();
    double buf[2] = {sum, double(count)};
    strategy->site_sum(std::span<double>(buf, 2));
    return buf[1] > 0 ? buf[0] / buf[1] : NAN;
  }

  // ---- the loop ----------------------------------------------------------------------

  Clock::time_point start = Clock::now();

  void log_info(const std::string& msg) {
    if (progress) progress->clear();
    if (opt.rank == 0) spdlog::info("{}", msg);
  }

  // train.rehearsal: one stand-in inner step (rehearsal.hpp): this rank's shard drifts, the
  // step takes step_seconds of wall time, all of it counted as compute. No loss (NaN).
  double rehearse_step() {
    const auto t0 = Clock::now();
    const auto sh = strategy->shard();
    const double d = rehearsal->drift(strategy->shard_params(), sh.offset, step + 1, cfg.outer.interval);
    const double want = cfg.train.rehearsal.step_seconds * site.slowdown;
    const double left = want - seconds_since(t0);
    if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
    rehearsal->count_step(d, want);
    const double dt = seconds_since(t0);
    compute_seconds += dt;
    period_compute += dt;
    ++step;
    last_lr = scheduled_lr(cfg.train.schedule, cfg.peak_lr(), step, cfg.train.steps);
    last_grad_norm = 0;
    return NAN;
  }

  double train_step() {
    if (rehearsal) return rehearse_step();
    if (device) return train_step_device();
    auto t0 = Clock::now();
    auto params = strategy->begin_step();
    auto grads = strategy->grads();
    const int B = cfg.train.micro_batch, K = site.grad_accum;
    double loss = 0;
    for (int k = 0; k < K; ++k) {
      sampler->next_batch(B, T, inputs.data(), targets.data());
      {
        TraceSpan sp(&trace, "forward", TraceRecorder::kMainThread);
        loss += model.forward(params, inputs.data(), targets.data(), B, T);
      }
      TraceSpan sp(&trace, "backward", TraceRecorder::kMainThread);
      model.backward(params, grads, 1.0f / static_cast<float>(K));
    }
    finish_inner_step(*strategy, t0);
    return loss / K;
  }

  // site.device: cuda: batches from the host sampler, copied per micro-batch (pinned) into
  // the device model; reduction, clipping and AdamW on the device.
  double train_step_device() {
    auto t0 = Clock::now();
    const int B = cfg.train.micro_batch, K = site.grad_accum;
    double loss = 0;
    {
      TraceSpan sp(&trace, "forward_backward", TraceRecorder::kMainThread);
      loss = device->forward_backward([&](int32_t* x, int32_t* y) { sampler->next_batch(B, T, x, y); }, B, T, K);
    }
    finish_inner_step(*device, t0);
    return loss;
  }

  // The end of every inner step, host or device: scheduled lr, the strategy's reduction and
  // AdamW (an "optimizer" span), and the step's compute time.
  template <class Strategy>
  void finish_inner_step(Strategy& s, Clock::time_point t0) {
    // A joiner's fresh AdamW ramps up again from its join step (outer.join_warmup_steps).
    const double rewarm = join_step >= 0 ? rewarm_factor(step, join_step, cfg.outer.join_warmup_steps) : 1.0;
    const double lr = scheduled_lr(cfg.train.schedule, cfg.peak_lr(), step, cfg.train.steps) * rewarm;
    // sites[].slowdown: rehearsing slower hardware, the forward/backward takes slowdown x its
    // time (measured before the site's collectives, so a wait for another rank is not scaled).
    const double forward_backward = seconds_since(t0);
    StepResult r;
    {
      TraceSpan sp(&trace, "optimizer", TraceRecorder::kMainThread);
      r = s.finish_step(lr, cfg.train.grad_clip);
    }
    if (site.slowdown > 1) {
      TraceSpan sp(&trace, "slowdown", TraceRecorder::kMainThread);
      std::this_thread::sleep_for(std::chrono::duration<double>((site.slowdown - 1) * forward_backward));
    }
    const double dt = seconds_since(t0);
    compute_seconds += dt;
    period_compute += dt;
    ++step;
    last_lr = lr;
    last_grad_norm = r.grad_norm;
  }

  double last_lr = 0, last_grad_norm = 0;
  int64_t join_step = -1;  // the step this site joined the running job at (-1: it started with the run)

  // A site joining the running job: the committed state from the other sites, this site's
  // data stream at the step they committed it (the windows of the steps it missed are
  // skipped, none is trained twice), a fresh inner optimizer.
  void join_running_job() {
    if (!opt.outer) throw ConfigError("--join needs the outer loop (a multi-site run)");
    const int64_t at = opt.outer->join(*strategy);
    const int64_t draws = at * site.grad_accum;
    for (int64_t i = 0; i < draws; ++i) sampler->next_indices(cfg.train.micro_batch);
    step = at;
    join_step = at;
    const int64_t w = cfg.outer.join_warmup_steps;
    log_info(fmt::format("site {}: joined the running job at step {}{}", site.name, step,
                         w > 1 ? fmt::format("; its fresh inner optimizer's lr ramps up over {} steps "
                                             "(outer.join_warmup_steps)",
                                             w)
                               : std::string()));
  }

  nlohmann::json run() {
    if (opt.resume && opt.join) throw ConfigError("--resume and --join exclude each other");
    if (opt.resume) {
      restore_latest();
      if (opt.outer) opt.outer->resumed(step, *strategy);
    }
    if (opt.join) join_running_job();
    const int64_t end_step = opt.stop_at_step > 0 ? std::min(opt.stop_at_step, cfg.train.steps) : cfg.train.steps;
    if (opt.rank == 0 && step == 0)
      log_info(
          fmt::format("site {}: {} rank(s), strategy {}, model {:.2f}M params, {} steps, {} tokens/step/rank, data {}",
                      site.name, site.ranks, site.strategy, model.layout().total() / 1e6, cfg.train.steps,
                      tokens_per_step_rank, data.train->describe()));
    if (opt.rank == 0 && step == 0 && site.group_size > 0)
      log_info(fmt::format("site {}: hybrid: {} group(s) of {} ranks (sharded inside a group, replicated across)",
                           site.name, site.ranks / site.group_size, site.group_size));
    if (opt.rank == 0 && step == 0 && site.strategy_auto)
      log_info(fmt::format("site {}: strategy: auto chose {} from {}: {}", site.name, site.strategy, site.topology.file,
                           site.strategy_reason));
    if (opt.rank == 0 && step == 0 && !cfg.train.init_from.empty())
      log_info(fmt::format("site {}: parameters from {} (train.init_from)", site.name, cfg.train.init_from));
    if (opt.rank == 0 && device) log_info(fmt::format("site {}: on the GPU: {}", site.name, device->describe().dump()));
    if (opt.outer) opt.outer->set_trace(&trace);
    start = Clock::now();
    period_t0 = start;
    auto window_t0 = Clock::now();
    int64_t window_tokens = 0;
    double loss_acc = 0;
    int loss_n = 0;
    while (step < end_step) {
      // outer.pace: time: a slower site skips some steps of each period (no compute, no data).
      if (!opt.outer || opt.outer->trains_step(step + 1)) {
        const double loss = train_step();
        loss_acc += loss;
        ++loss_n;
        ++trained_steps;
        window_tokens += tokens_per_step_run;
      } else {
        if (rehearsal) rehearsal->skipped(step + 1, cfg.outer.interval);
        ++step;
        ++skipped_steps;
      }
      const bool last = step == cfg.train.steps;
      bool outer_step = false;
      if (opt.outer) {
        // Everything the inner loop spends inside the outer hook is exposed wait: time the
        // compute could not hide (all of a sync without overlap, only the tail with it).
        const auto w0 = Clock::now();
        try {
          outer_step = opt.outer->after_inner_step(step, *strategy);
          if (last) opt.outer->finish(step, *strategy);
        } catch (const std::exception& e) {
          if (opt.outer->checkpoint_after_failure()) save_checkpoint_after_failure(e);
          throw;
        }
        const auto w1 = Clock::now();
        for (auto& r : opt.outer->take_rounds()) {
          if (!rounds) rounds = std::make_unique<MetricsWriter>(rounds_path().string(), opt.resume || opt.join);
          r["site"] = site.name;
          r["rank"] = opt.rank;
          rounds->write(r);
          if (live) live->on_round(r);
          if (r.contains("peers")) status["members"] = 1 + r["peers"].size();
        }
        const double w = std::chrono::duration<double>(w1 - w0).count();
        outer_wait_seconds += w;
        period_wait += w;
        // Sub-millisecond calls are the hook's bookkeeping on non-sync steps: not worth a span.
        if (outer_step || last || w >= 1e-3) trace.span("wait", TraceRecorder::kMainThread, w0, w1);
      }
      const bool do_eval = !rehearsal && (last || (cfg.train.eval_every > 0 && step % cfg.train.eval_every == 0));
      // A joiner also logs its first step: its loss and re-warmed lr, at once.
      const bool do_log = do_eval || outer_step || step % cfg.train.log_every == 0 || step == end_step ||
                          (join_step >= 0 && step == join_step + 1);
      nlohmann::json period;
      if (opt.outer && (outer_step || last)) {
        // Per outer period: wall time from the end of the previous period (eval, logging
        // and checkpoints included: they also keep the accelerator idle).
        const double pw = seconds_since(period_t0);
        period = {{"compute_utilization", pw > 0 ? period_compute / pw : 0.0},
                  {"exposed_wait_s", period_wait},
                  {"period_wall_s", pw},
                  {"period_compute_s", period_compute}};
        period_t0 = Clock::now();
        period_compute = 0;
        period_wait = 0;
      }
      if (do_log) {
        const double mean_loss = strategy->site_mean(loss_n > 0 ? loss_acc / loss_n : NAN);
        last_loss = mean_loss;
        const double dt = seconds_since(window_t0);
        const double tps = dt > 0 ? double(window_tokens) / dt : 0;  // whole run: all ranks
        nlohmann::json line = {{"step", step},
                               {"loss", mean_loss},
                               {"lr", last_lr},
                               {"grad_norm", last_grad_norm},
                               {"tokens", step * tokens_per_step_run},
                               {"tokens_per_s", tps},
                               {"elapsed_s", wall_before + seconds_since(start)},
                               {"site", site.name}};
        if (do_eval) {
          last_val_loss = evaluate();
          line["val_loss"] = last_val_loss;
        }
        if (opt.outer) line.update(opt.outer->metrics());
        if (!period.is_null()) line.update(period);
        if (metrics) metrics->write(line);
        if (run_metrics) run_metrics->write(line);
        if (live) live->on_line(line);
        report_status(line, false);
        if (progress)
          progress->update(step, mean_loss, tps, wall_before + seconds_since(start), do_eval ? last_val_loss : NAN);
        loss_acc = 0;
        loss_n = 0;
        window_tokens = 0;
        window_t0 = Clock::now();
      }
      const bool ckpt = cfg.train.checkpoint_every > 0 && step % cfg.train.checkpoint_every == 0;
      if (ckpt || step == end_step) save_checkpoint();
    }
    if (progress) progress->finish();
    return summary();
  }

  // ---- trace -------------------------------------------------------------------------

  // Every rank writes sites/<site>/trace.r<rank>.json: {"geoloco_trace": 1, "end_step",
  // "global_rank", "events"}. Global rank 0 then merges every rank's file that ended at the
  // same step into <output_dir>/trace.json (a trace-event array with process and thread
  // names). The files share one directory tree when all ranks run on one machine; elsewhere
  // the wait is bounded and the merge keeps the ranks it found (and says which are missing).
  static constexpr int kTraceVersion = 1;

  fs::path rank_trace_path(int s, int r) const {
    return out_dir / "sites" / cfg.sites.at(static_cast<size_t>(s)).name / fmt::format("trace.r{}.json", r);
  }

  void write_trace() {
    nlohmann::json mine = {{"geoloco_trace", kTraceVersion},
                           {"end_step", step},
                           {"global_rank", global_rank},
                           {"config_hash", hex64(cfg.hash)},
                           {"events", trace.to_json(global_rank)}};
    write_text_atomically(rank_trace_path(opt.site, opt.rank).string(), mine.dump() + "\n");
    // The first site still in the run merges the traces of the sites still in it.
    const uint64_t members = opt.outer ? opt.outer->member_sites() : ~uint64_t{0};
    int first = 0;
    while (first < static_cast<int>(cfg.sites.size()) && !((members >> first) & 1)) ++first;
    if (opt.site != first || opt.rank != 0) return;

    nlohmann::json merged = nlohmann::json::array();
    std::vector<std::string> missing;
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    for (int s = 0; s < static_cast<int>(cfg.sites.size()); ++s)
      for (int r = 0; r < cfg.sites[static_cast<size_t>(s)].ranks && ((members >> s) & 1); ++r) {
        const int g = cfg.global_rank(s, r);
        nlohmann::json doc;
        for (;;) {
          doc = read_rank_trace(rank_trace_path(s, r));
          if (!doc.is_null() || Clock::now() >= deadline) break;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        if (doc.is_null()) {
          missing.push_back(fmt::format("{}/r{}", cfg.sites[static_cast<size_t>(s)].name, r));
          continue;
        }
        const std::string pname = fmt::format("{} rank {}", cfg.sites[static_cast<size_t>(s)].name, r);
        merged.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", g}, {"args", {{"name", pname}}}});
        merged.push_back({{"name", "process_sort_index"}, {"ph", "M"}, {"pid", g}, {"args", {{"sort_index", g}}}});
        const char* tnames[] = {"inner loop", "outer loop", "transport"};
        for (int t = 0; t < 3; ++t)
          merged.push_back(
              {{"name", "thread_name"}, {"ph", "M"}, {"pid", g}, {"tid", t}, {"args", {{"name", tnames[t]}}}});
        // Fragment workers (outer.fragments, or whatever count outer.plan: auto chose).
        std::set<int> fragment_tids;
        for (const auto& e : doc["events"])
          if (e["tid"].get<int>() > TraceRecorder::kFragmentThreadBase) fragment_tids.insert(e["tid"].get<int>());
        for (int t : fragment_tids)
          merged.push_back(
              {{"name", "thread_name"},
               {"ph", "M"},
               {"pid", g},
               {"tid", t},
               {"args", {{"name", fmt::format("outer loop, fragment {}", t - TraceRecorder::kFragmentThreadBase)}}}});
        for (auto& e : doc["events"]) merged.push_back(std::move(e));
      }
    if (!missing.empty())
      spdlog::warn("trace.json: no trace ending at step {} from {} after 30 s; merged the others", step,
                   fmt::join(missing, ", "));
    write_text_atomically((out_dir / "trace.json").string(), merged.dump() + "\n");
  }

  // A rank's trace file if it is complete and belongs to this run segment, else null.
  nlohmann::json read_rank_trace(const fs::path& p) const {
    std::ifstream in(p);
    if (!in) return nullptr;
    auto doc = nlohmann::json::parse(in, nullptr, false);
    if (doc.is_discarded() || !doc.is_object() || doc.value("geoloco_trace", 0) != kTraceVersion ||
        doc.value("end_step", int64_t{-1}) != step || doc.value("config_hash", std::string()) != hex64(cfg.hash) ||
        !doc.contains("events") || !doc["events"].is_array())
      return nullptr;
    return doc;
  }

  // The rehearsal's settings and counters, what it measured (utilization, sync time) and,
  // under outer.plan: auto, what the plan predicted for the same inputs.
  nlohmann::json rehearsal_json(const nlohmann::json& s) const {
    nlohmann::json j = rehearsal->to_json();
    j["measured"] = {{"compute_utilization", s["compute_utilization"]},
                     {"sync_seconds_mean", s.value("sync_seconds_mean", 0.0)},
                     {"wan_bytes_sent", s.value("wan_bytes_sent", uint64_t{0})}};
    if (s.contains("plans") && !s["plans"].empty()) {
      const auto& p = s["plans"].back();
      j["predicted"] = {{"compute_utilization", p.value("predicted_utilization", 0.0)},
                        {"fragment_sync_s", p.value("predicted_fragment_sync_s", 0.0)},
                        {"plan_epoch", p.value("epoch", 0)}};
    }
    return j;
  }

  nlohmann::json summary() {
    const double wall = wall_before + seconds_since(start);
    nlohmann::json s;
    s["run"] = cfg.run.name;
    s["site"] = site.name;
    s["rank"] = opt.rank;
    s["global_rank"] = global_rank;
    s["steps"] = step;
    s["completed"] = step == cfg.train.steps;
    if (live) live->on_end(step == cfg.train.steps);
    if (step == cfg.train.steps) report_status({{"step", step}}, true);
    s["final_loss"] = last_loss;
    s["val_loss"] = last_val_loss;
    s["tokens"] = step * tokens_per_step_run;
    s["tokens_per_rank"] = (step - skipped_steps) * tokens_per_step_rank;
    s["steps_skipped"] = skipped_steps;  // this process's (outer.pace: time)
    s["wall_s"] = wall;
    s["compute_s"] = compute_seconds;
    s["compute_utilization"] = wall > 0 ? compute_seconds / wall : 0.0;
    s["exposed_wait_s"] = outer_wait_seconds;
    s["trace_events"] = trace.size();
    s["trace_events_dropped"] = trace.dropped();
    s["tokens_per_s"] = wall > 0 ? double(step * tokens_per_step_run) / wall : 0;
    s["params"] = model.layout().total();
    s["config_hash"] = hex64(cfg.hash);
    s["init_from"] = cfg.train.init_from.empty() ? nlohmann::json(nullptr) : nlohmann::json(cfg.train.init_from);
    s["memory"] = strategy->memory_json();
    if (site.strategy_auto)
      s["strategy_choice"] = {{"strategy", site.strategy},
                              {"group_size", site.group_size},
                              {"topology", site.topology.file},
                              {"reason", site.strategy_reason}};
    s["device"] = device ? device->describe() : nlohmann::json("cpu");
    const auto per_step = [&](uint64_t bytes) { return step > 0 ? double(bytes) / double(step) : 0.0; };
    if (auto* c = strategy->collective(); c && strategy->ranks() > 1) {
      s["site_collectives"] = c->stats().to_json();
      uint64_t total = c->stats().total_bytes_sent();
      if (strategy->hybrid()) {
        // hybrid: what stays inside the rank's group (an NVLink island) and what crosses groups
        // (the replica set's collectives and the site's own: norms, metrics).
        const uint64_t inside =
            strategy->group_collective() ? strategy->group_collective()->stats().total_bytes_sent() : 0;
        const uint64_t across =
            (strategy->replica_collective() ? strategy->replica_collective()->stats().total_bytes_sent() : 0) + total;
        s["group_bytes_per_step"] = per_step(inside);
        s["cross_group_bytes_per_step"] = per_step(across);
        total = inside + across;
      }
      s["site_bytes_per_step"] = per_step(total);
    } else {
      s["site_bytes_per_step"] = 0;
    }
    if (opt.outer) s.update(opt.outer->summary());
    if (rehearsal) s["rehearsal"] = rehearsal_json(s);
    auto full = strategy->full_params();
    s["params_hash"] = hex64(hash64(full.data(), full.size_bytes()));
    strategy->release_full_params();
    s["checkpoint"] = (ckpt_dir / step_dir_name(step) / "model.safetensors").string();
    return s;
  }
};

Trainer::Trainer(const RunConfig& cfg, const TrainerOptions& opts) : impl_(std::make_unique<Impl>(cfg, opts)) {}
Trainer::~Trainer() = default;

nlohmann::json Trainer::run() {
  auto s = impl_->run();
  // Per-rank summary; the run-level summary.json is written by the caller (global rank 0).
  write_text_atomically((impl_->site_dir / fmt::format("rank{}.json", impl_->opt.rank)).string(), s.dump(2) + "\n");
  impl_->write_trace();
  return s;
}

SiteStrategy& Trainer::strategy() { return *impl_->strategy; }
void Trainer::set_outer(OuterHook* outer) { impl_->opt.outer = outer; }

std::vector<float> Trainer::parameters() {
  auto p = impl_->strategy->full_params();
  return std::vector<float>(p.begin(), p.end());
}

}  // namespace geoloco::trainer
