// Trainer: one rank's inner loop (trainer.hpp). Setup, the steps (CPU, device, rehearsal),
// evaluation, the hand-off to the outer loop after every step, and the summary; checkpoints
// (rank_checkpoints.hpp), records (run_records.hpp) and the trace (trace_files.hpp) are units
// of their own, so run() reads top to bottom.
#include "trainer/loop/trainer.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "core/atomic_file.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"
#include "core/trace.hpp"
#include "outer_optimizer/diloco.hpp"
#include "trainer/checkpoint/model_checkpoint.hpp"
#include "trainer/data/open_data.hpp"
#include "trainer/data/sampler.hpp"
#include "trainer/loop/device_site.hpp"
#include "trainer/loop/native_site.hpp"
#include "trainer/loop/rank_checkpoints.hpp"
#include "trainer/loop/rehearsal.hpp"
#include "trainer/loop/run_records.hpp"
#include "trainer/loop/trace_files.hpp"
#include "trainer/model/gpt.hpp"
#include "trainer/optim/schedule.hpp"

namespace fs = std::filesystem;

namespace geoloco::trainer {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The loss and tokens of the steps since the last logged line.
struct Window {
  Clock::time_point t0 = Clock::now();
  double loss = 0;
  int n = 0;
  int64_t tokens = 0;
  void add(double l, int64_t t) {
    loss += l;
    ++n;
    tokens += t;
  }
  void restart() { *this = Window{}; }
};

}  // namespace

struct Trainer::Impl {
  const RunConfig& cfg;
  TrainerOptions opt;
  const SiteConfig& site;
  const int global_rank;
  const int T;
  const int64_t tokens_per_step_rank;
  const int64_t tokens_per_step_run;  // every rank of every site (sites may differ in ranks and grad_accum)
  Gpt model;
  DataSplits data;
  std::unique_ptr<DistributedSampler> sampler;
  std::unique_ptr<SiteStrategy> cpu_strategy;  // site.device: cpu
  std::unique_ptr<DeviceSite> device;          // site.device: cuda (it is the strategy too)
  SiteStrategy* strategy = nullptr;
  std::unique_ptr<Rehearsal> rehearsal;  // train.rehearsal: the stand-in inner loop
  TraceRecorder trace;
  std::unique_ptr<NativeSite> native_site;  // the outer loop's seam over `strategy`
  std::unique_ptr<RunRecords> records;
  std::unique_ptr<RankCheckpoints> checkpoints;
  std::vector<int32_t> inputs, targets;

  LoopCounters counts;  // step, compute and exposed wait (earlier segments' included), join step
  double wall_before = 0;
  Clock::time_point start = Clock::now();
  // This process's steps trained and skipped (outer.pace: time: a slower site skips some).
  int64_t trained_steps = 0, skipped_steps = 0;
  // The current outer period (since the last outer step): utilization = compute / wall.
  Clock::time_point period_t0 = Clock::now();
  double period_compute = 0, period_wait = 0;
  double last_loss = NAN, last_val_loss = NAN, last_lr = 0, last_grad_norm = 0;

  Impl(const RunConfig& c, const TrainerOptions& o)
      : cfg(c),
        opt(o),
        site(c.sites.at(static_cast<size_t>(o.site))),
        global_rank(c.global_rank(o.site, o.rank)),
        T(c.seq_len()),
        tokens_per_step_rank(int64_t(c.train.micro_batch) * site.grad_accum * T),
        tokens_per_step_run(c.global_batch() * T),
        model(c.model) {
    Gpt::set_num_threads(cfg.train.threads);
    open_sampler();
    std::vector<float> init(static_cast<size_t>(model.layout().total()));
    if (cfg.train.init_from.empty())
      Gpt::init_params(model.layout(), init, cfg.run.seed);
    else
      load_model(cfg.train.init_from, model.layout(), init);  // checked at config load; read again here
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
    native_site = std::make_unique<NativeSite>(*strategy, &trace, cfg.run.output_dir);
    if (cfg.train.rehearsal.enabled)
      rehearsal = std::make_unique<Rehearsal>(cfg.train.rehearsal,
                                              cfg.run.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(o.site));
    records = std::make_unique<RunRecords>(cfg, o.site, o.rank, opt.resume || opt.join, opt.progress, opt.status_fd);
    checkpoints = std::make_unique<RankCheckpoints>(cfg, o.site, o.rank, model.layout(), *strategy, *sampler,
                                                    [this](const std::string& m) { records->log(m); });
    // The config as it ran (after --set overrides), for `geoloco report` and for the record.
    if (global_rank == 0)
      write_text_atomically((fs::path(cfg.run.output_dir) / "config.yaml").string(),
                            fmt::format("# {}: the config of run '{}' as it ran (overrides applied), hash {}\n{}\n",
                                        cfg.path, cfg.run.name, hex64(cfg.hash), cfg.canonical_yaml));
  }

  void open_sampler() {
    data = open_data(cfg.data, cfg.dir, cfg.model.vocab_size);
    SamplerOptions so;
    so.seed = cfg.run.seed;
    const bool identical = cfg.data.across_sites == "identical";
    so.world = identical ? site.ranks : cfg.world_size();
    so.rank = identical ? opt.rank : global_rank;
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
  }

  void log(const std::string& msg) { records->log(msg); }

  LoopCounters counters() const {
    LoopCounters c = counts;
    c.wall_s = wall_before + seconds_since(start);
    return c;
  }

  void checkpoint() {
    // A rehearsal drifts only each rank's own shard: make the replicas whole first (collective).
    if (rehearsal) strategy->shard_updated();
    checkpoints->save(counters(), opt.outer);
  }

  // ---- the steps ----------------------------------------------------------------------

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

  // train.rehearsal: one stand-in inner step (rehearsal.hpp): this rank's shard drifts, the
  // step takes step_seconds of wall time, all of it counted as compute. No loss (NaN).
  double rehearse_step() {
    const auto t0 = Clock::now();
    const auto sh = strategy->shard();
    const double d = rehearsal->drift(strategy->shard_params(), sh.offset, counts.step + 1, cfg.outer.interval);
    const double want = cfg.train.rehearsal.step_seconds * site.slowdown;
    const double left = want - seconds_since(t0);
    if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
    rehearsal->count_step(d, want);
    count_compute(seconds_since(t0));
    ++counts.step;
    last_lr = scheduled_lr(cfg.train.schedule, cfg.peak_lr(), counts.step, cfg.train.steps);
    last_grad_norm = 0;
    return NAN;
  }

  // The end of every inner step, host or device: scheduled lr, the strategy's reduction and
  // AdamW (an "optimizer" span), and the step's compute time.
  template <class Strategy>
  void finish_inner_step(Strategy& s, Clock::time_point t0) {
    // A joiner's fresh AdamW ramps up again from its join step (outer.join_warmup_steps).
    const int64_t step = counts.step;
    const double rewarm =
        counts.join_step >= 0 ? rewarm_factor(step, counts.join_step, cfg.outer.join_warmup_steps) : 1.0;
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
    count_compute(seconds_since(t0));
    ++counts.step;
    last_lr = lr;
    last_grad_norm = r.grad_norm;
  }

  void count_compute(double dt) {
    counts.compute_s += dt;
    period_compute += dt;
  }

  // A step outer.pace: time has this site skip: no compute, no data.
  void skip_step() {
    if (rehearsal) rehearsal->skipped(counts.step + 1, cfg.outer.interval);
    ++counts.step;
    ++skipped_steps;
  }

  // ---- the outer loop, after every step --------------------------------------------------

  // Hands the step to the outer loop: true when an outer round completed. Everything the inner
  // loop spends there is exposed wait, time the compute could not hide (all of a sync without
  // overlap, only the tail with it). A failure the outer loop can carry on from checkpoints
  // first (--resume continues from it).
  bool outer_loop_step(bool last) {
    if (!opt.outer) return false;
    const auto w0 = Clock::now();
    bool synced = false;
    try {
      synced = opt.outer->after_inner_step(counts.step);
      if (last) opt.outer->finish(counts.step);
    } catch (const std::exception& e) {
      if (opt.outer->checkpoint_after_failure()) {
        if (rehearsal) strategy->shard_updated();  // (as checkpoint() does)
        checkpoints->save_after_failure(counters(), opt.outer, e);
      }
      throw;
    }
    const auto w1 = Clock::now();
    records->rounds(opt.outer->take_rounds());
    const double w = std::chrono::duration<double>(w1 - w0).count();
    counts.outer_wait_s += w;
    period_wait += w;
    // Sub-millisecond calls are the outer loop's bookkeeping on non-sync steps: not worth a span.
    if (synced || last || w >= 1e-3) trace.span("wait", TraceRecorder::kMainThread, w0, w1);
    return synced;
  }

  // Per outer period: wall time from the end of the previous one (evaluation, logging and
  // checkpoints included: they also keep the accelerator idle), and the compute in it.
  nlohmann::json close_period() {
    const double pw = seconds_since(period_t0);
    nlohmann::json p = {{"compute_utilization", pw > 0 ? period_compute / pw : 0.0},
                        {"exposed_wait_s", period_wait},
                        {"period_wall_s", pw},
                        {"period_compute_s", period_compute}};
    period_t0 = Clock::now();
    period_compute = 0;
    period_wait = 0;
    return p;
  }

  // ---- joins, resume, evaluation -------------------------------------------------------

  // A site joining the running job: the committed state from the other sites, this site's data
  // stream at the step they committed it (the windows of the steps it missed are skipped, none
  // is trained twice), a fresh inner optimizer.
  void join_running_job() {
    if (!opt.outer) throw ConfigError("--join needs the outer loop (a multi-site run)");
    const int64_t at = opt.outer->join();
    const int64_t draws = at * site.grad_accum;
    for (int64_t i = 0; i < draws; ++i) sampler->next_indices(cfg.train.micro_batch);
    counts.step = at;
    counts.join_step = at;
    const int64_t w = cfg.outer.join_warmup_steps;
    log(fmt::format("site {}: joined the running job at step {}{}", site.name, at,
                    w > 1 ? fmt::format("; its fresh inner optimizer's lr ramps up over {} steps "
                                        "(outer.join_warmup_steps)",
                                        w)
                          : std::string()));
  }

  void resume() {
    if (const auto c = checkpoints->restore(opt.outer)) {
      counts = *c;
      wall_before = c->wall_s;
    }
    if (opt.outer) opt.outer->resumed(counts.step);
  }

  // Mean validation loss of the current local model. Every rank evaluates a disjoint, fixed set
  // of windows spread over the validation split; the site averages.
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

  // ---- the loop -----------------------------------------------------------------------

  void log_start() {
    if (opt.rank != 0 || counts.step != 0) return;
    log(fmt::format("site {}: {} rank(s), strategy {}, model {:.2f}M params, {} steps, {} tokens/step/rank, data {}",
                    site.name, site.ranks, site.strategy, model.layout().total() / 1e6, cfg.train.steps,
                    tokens_per_step_rank, data.train->describe()));
    if (site.group_size > 0)
      log(fmt::format("site {}: hybrid: {} group(s) of {} ranks (sharded inside a group, replicated across)", site.name,
                      site.ranks / site.group_size, site.group_size));
    if (site.strategy_auto)
      log(fmt::format("site {}: strategy: auto chose {} from {}: {}", site.name, site.strategy, site.topology.file,
                      site.strategy_reason));
    if (!cfg.train.init_from.empty())
      log(fmt::format("site {}: parameters from {} (train.init_from)", site.name, cfg.train.init_from));
  }

  // The metrics line of a logged step: the window's loss and throughput, the validation loss
  // when evaluated, the outer loop's fields, the period's when one closed.
  nlohmann::json metrics_line(Window& w, bool evaluated, const nlohmann::json& period) {
    last_loss = strategy->site_mean(w.n > 0 ? w.loss / w.n : NAN);
    const double dt = seconds_since(w.t0);
    nlohmann::json line = {{"step", counts.step},
                           {"loss", last_loss},
                           {"lr", last_lr},
                           {"grad_norm", last_grad_norm},
                           {"tokens", counts.step * tokens_per_step_run},
                           {"tokens_per_s", dt > 0 ? double(w.tokens) / dt : 0},  // whole run: all ranks
                           {"elapsed_s", wall_before + seconds_since(start)},
                           {"site", site.name}};
    if (evaluated) {
      last_val_loss = evaluate();
      line["val_loss"] = last_val_loss;
    }
    if (opt.outer) line.update(opt.outer->metrics());
    if (!period.is_null()) line.update(period);
    return line;
  }

  nlohmann::json run() {
    if (opt.resume && opt.join) throw ConfigError("--resume and --join exclude each other");
    if (opt.resume) resume();
    if (opt.join) join_running_job();
    const int64_t end_step = opt.stop_at_step > 0 ? std::min(opt.stop_at_step, cfg.train.steps) : cfg.train.steps;
    log_start();
    if (opt.rank == 0 && device) log(fmt::format("site {}: on the GPU: {}", site.name, device->describe().dump()));
    start = period_t0 = Clock::now();
    Window window;
    while (counts.step < end_step) {
      // outer.pace: time: a slower site skips some steps of each period (no compute, no data).
      if (!opt.outer || opt.outer->trains_step(counts.step + 1)) {
        window.add(train_step(), tokens_per_step_run);
        ++trained_steps;
      } else {
        skip_step();
      }
      const int64_t step = counts.step;
      const bool last = step == cfg.train.steps;
      const bool outer_step = outer_loop_step(last);
      const nlohmann::json period = opt.outer && (outer_step || last) ? close_period() : nlohmann::json();
      const bool evaluate_now = !rehearsal && (last || (cfg.train.eval_every > 0 && step % cfg.train.eval_every == 0));
      // A joiner also logs its first step: its loss and re-warmed lr, at once.
      if (evaluate_now || outer_step || step % cfg.train.log_every == 0 || step == end_step ||
          (counts.join_step >= 0 && step == counts.join_step + 1)) {
        records->line(metrics_line(window, evaluate_now, period));
        window.restart();
      }
      if ((cfg.train.checkpoint_every > 0 && step % cfg.train.checkpoint_every == 0) || step == end_step) checkpoint();
    }
    records->end(counts.step, counts.step == cfg.train.steps);
    return summary();
  }

  // ---- the summary ----------------------------------------------------------------------

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

  // Bytes the site's collectives moved per step (hybrid: inside the rank's group and across groups).
  void collective_json(nlohmann::json& s) const {
    const int64_t step = counts.step;
    const auto per_step = [&](uint64_t bytes) { return step > 0 ? double(bytes) / double(step) : 0.0; };
    auto* c = strategy->collective();
    if (!c || strategy->ranks() <= 1) {
      s["site_bytes_per_step"] = 0;
      return;
    }
    s["site_collectives"] = c->stats().to_json();
    uint64_t total = c->stats().total_bytes_sent();
    if (strategy->hybrid()) {
      // What stays inside the rank's group (an NVLink island) and what crosses groups (the
      // replica set's collectives and the site's own: norms, metrics).
      const uint64_t inside =
          strategy->group_collective() ? strategy->group_collective()->stats().total_bytes_sent() : 0;
      const uint64_t across =
          (strategy->replica_collective() ? strategy->replica_collective()->stats().total_bytes_sent() : 0) + total;
      s["group_bytes_per_step"] = per_step(inside);
      s["cross_group_bytes_per_step"] = per_step(across);
      total = inside + across;
    }
    s["site_bytes_per_step"] = per_step(total);
  }

  nlohmann::json summary() {
    const int64_t step = counts.step;
    const double wall = wall_before + seconds_since(start);
    nlohmann::json s;
    s["run"] = cfg.run.name;
    s["site"] = site.name;
    s["rank"] = opt.rank;
    s["global_rank"] = global_rank;
    s["steps"] = step;
    s["completed"] = step == cfg.train.steps;
    s["final_loss"] = last_loss;
    s["val_loss"] = last_val_loss;
    s["tokens"] = step * tokens_per_step_run;
    s["tokens_per_rank"] = (step - skipped_steps) * tokens_per_step_rank;
    s["steps_skipped"] = skipped_steps;  // this process's (outer.pace: time)
    s["wall_s"] = wall;
    s["compute_s"] = counts.compute_s;
    s["compute_utilization"] = wall > 0 ? counts.compute_s / wall : 0.0;
    s["exposed_wait_s"] = counts.outer_wait_s;
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
    collective_json(s);
    if (opt.outer) s.update(opt.outer->summary());
    if (rehearsal) s["rehearsal"] = rehearsal_json(s);
    auto full = strategy->full_params();
    s["params_hash"] = hex64(hash64(full.data(), full.size_bytes()));
    strategy->release_full_params();
    s["checkpoint"] = checkpoints->model_path(step);
    return s;
  }
};

Trainer::Trainer(const RunConfig& cfg, const TrainerOptions& opts) : impl_(std::make_unique<Impl>(cfg, opts)) {}
Trainer::~Trainer() = default;

nlohmann::json Trainer::run() {
  auto s = impl_->run();
  // Per-rank summary; the run-level summary.json is written by the caller (global rank 0).
  const auto& cfg = impl_->cfg;
  write_text_atomically(
      (fs::path(cfg.run.output_dir) / "sites" / impl_->site.name / fmt::format("rank{}.json", impl_->opt.rank))
          .string(),
      s.dump(2) + "\n");
  write_trace_files(cfg, impl_->opt.site, impl_->opt.rank, impl_->counts.step, impl_->trace,
                    impl_->opt.outer ? impl_->opt.outer->members() : ~uint64_t{0});
  return s;
}

SiteStrategy& Trainer::strategy() { return *impl_->strategy; }
outer::Site& Trainer::site() { return *impl_->native_site; }
void Trainer::set_outer(outer::Diloco* outer) { impl_->opt.outer = outer; }

std::vector<float> Trainer::parameters() {
  auto p = impl_->strategy->full_params();
  return std::vector<float>(p.begin(), p.end());
}

}  // namespace geoloco::trainer
