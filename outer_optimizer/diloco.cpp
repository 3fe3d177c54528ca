#include "outer_optimizer/diloco.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <mutex>
#include <optional>

#include "outer_optimizer/envelope.hpp"
#include "tools/probe/probe.hpp"
#include "trainer/loop/metrics.hpp"
#include "trainer/core/error.hpp"
#include "trainer/core/hash.hpp"

namespace geoloco::outer {

namespace {
using Clock = std::chrono::steady_clock;

std::span<const uint8_t> as_bytes(const uint64_t& v) { return {reinterpret_cast<const uint8_t*>(&v), sizeof v}; }

// Keys of the plan protocol's control messages (FrameKind::kControl; the hash check uses
// shard = rank, far below these).
constexpr uint32_t kPlanReportShard = 0xFFFF0001u, kPlanDecisionShard = 0xFFFF0002u;
constexpr uint32_t kStartReportShard = 0xFFFF0003u, kStartPlanShard = 0xFFFF0004u;
constexpr uint64_t kMaxControlBody = 1 << 20;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}


// Buffers of control messages still owned by the transport when a failed run unwinds: kept
// until exit, so a late arrival never writes into freed memory.
std::vector<std::shared_ptr<std::vector<uint8_t>>>& orphaned_buffers() {
  static std::vector<std::shared_ptr<std::vector<uint8_t>>> v;
  return v;
}
std::mutex orphan_mu;
}  // namespace

Diloco::Diloco(const trainer::RunConfig& cfg, int site, int rank, transport::Transport* transport,
               trainer::SiteStrategy& strategy, const trainer::ParamLayout& layout)
    : cfg_(cfg),
      ocfg_(cfg.outer),
      site_(site),
      rank_(rank),
      transport_(transport),
      n_(strategy.shard_params().size()),
      layout_(layout),
      interval_(ocfg_.interval),
      pcfg_(ocfg_.compression) {
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
  if (transport_) {
    HashCheck c = post_hash_check(h0, 0);
    verify_hash_check(c);
  }
  shard_ = strategy.shard();
  build_fragments(ocfg_.fragments, shard);
  site_hash_ = combine_site_hash(strategy, combined_hash());
  // The config's own schedule is plan epoch 0.
  plan_.interval = interval_;
  plan_.fragments = ocfg_.fragments;
  plan_.codec = std::string(compression::codec_name(pcfg_.codec));
  plan_.lanes = transport_ ? transport_->lanes() : 1;
  plan_.reason = "the configured schedule (outer.plan: manual)";
  planned_ = !ocfg_.auto_plan() || S == 1;
  if (ocfg_.auto_plan() && S == 1 && rank_ == 0)
    spdlog::warn("outer.plan: auto needs more than one site; keeping the configured schedule");
  if (rank_ == 0 && plans_.size() > 1)
    for (const auto& p : plans_) spdlog::info("outer loop: {}", p.describe());
}

void Diloco::build_fragments(int fragments, std::span<const float> shard) {
  for (const auto& f : frags_) GEOLOCO_CHECK(!f->check, "fragments rebuilt with a hash check of round {} unverified", f->check->round);
  plans_ = plan_fragments(layout_, fragments, interval_);
  frags_.clear();
  for (const auto& plan : plans_) {
    auto f = std::make_unique<Fragment>();
    f->index = plan.index;
    f->local = intersect(plan.ranges, shard_);
    for (const auto& r : f->local) f->n += static_cast<size_t>(r.size());
    f->global.resize(f->n);
    gather_local(*f, shard, f->global);
    f->delta.resize(f->n);
    f->decoded.resize(f->n);
    f->avg.resize(f->n);
    f->pipeline = std::make_unique<compression::Pipeline>(pcfg_);
    if (pcfg_.error_feedback) f->ef = std::make_unique<compression::ErrorFeedback>(f->n);
    f->opt = std::make_unique<OuterOptimizer>(ocfg_.optimizer, f->n);
    f->hash = hash64(f->global.data(), f->global.size() * sizeof(float));
    frags_.push_back(std::move(f));
  }
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
  if (probe_thread_.joinable()) probe_thread_.join();
  {
    std::lock_guard lk(orphan_mu);
    for (auto* list : {&report_recvs_, &report_sends_, &decision_recvs_, &decision_sends_})
      for (auto& op : *list)
        if (!op.op.ready()) orphaned_buffers().push_back(op.buf);
  }
  // Unverified hash checks of a failed run.
  for (auto& f : frags_)
    if (f->check) keep_until_exit(*f->check);
}

// The transport may still write a check's replies, or read our hash, after a failed run has
// dropped it: its buffers live until exit.
void Diloco::keep_until_exit(const HashCheck& c) {
  std::lock_guard lk(orphan_mu);
  for (const auto& [site, op] : c.recvs)
    if (!op.op.ready()) orphaned_buffers().push_back(op.buf);
  orphaned_buffers().push_back(c.mine);
}

bool Diloco::overlapped() const { return ocfg_.overlap_steps > 0 || ocfg_.delayed_update; }

int64_t Diloco::tau() const { return ocfg_.delayed_update ? interval_ : ocfg_.overlap_steps; }

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

Diloco::ShardState Diloco::pack_state() const {
  // Each fragment's vectors scattered back to where their elements sit in the shard.
  auto pack = [&](auto get) {
    std::vector<float> out(n_, 0.0f);
    for (const auto& f : frags_) {
      std::span<const float> v = get(*f);
      size_t k = 0;
      for (const auto& r : f->local)
        for (int64_t i = r.begin; i < r.end; ++i) out[static_cast<size_t>(i)] = v[k++];
    }
    return out;
  };
  ShardState st;
  st.global = pack([](const Fragment& f) { return std::span<const float>(f.global); });
  if (!frags_[0]->opt->state_a().empty()) st.opt_a = pack([](const Fragment& f) { return std::span<const float>(f.opt->state_a()); });
  if (!frags_[0]->opt->state_b().empty()) st.opt_b = pack([](const Fragment& f) { return std::span<const float>(f.opt->state_b()); });
  if (frags_[0]->ef) st.ef = pack([](const Fragment& f) { return std::span<const float>(f.ef->residual()); });
  return st;
}

void Diloco::unpack_state(const ShardState& st) {
  for (auto& f : frags_) {
    gather_local(*f, st.global, f->global);
    if (!st.opt_a.empty()) gather_local(*f, st.opt_a, f->opt->state_a());
    if (!st.opt_b.empty()) gather_local(*f, st.opt_b, f->opt->state_b());
    if (!st.ef.empty() && f->ef) gather_local(*f, st.ef, f->ef->residual());
    f->hash = hash64(f->global.data(), f->global.size() * sizeof(float));
  }
}

void Diloco::set_schedule(const PlanDecision& d, std::span<const float> global) {
  verify_pending_checks();
  interval_ = d.interval;
  pcfg_ = plan_compression(ocfg_.compression, d);
  if (transport_) transport_->set_active_lanes(std::min(d.lanes, transport_->lanes()));
  build_fragments(d.fragments, global);
}

uint64_t Diloco::combined_hash() const {
  // One fragment: its hash (the whole shard's). Several: a hash of the fragments' hashes.
  if (frags_.size() == 1) return frags_[0]->hash;
  Hasher hs;
  for (const auto& f : frags_) hs.update(&f->hash, sizeof f->hash);
  return hs.digest();
}

bool Diloco::after_inner_step(int64_t step, trainer::SiteStrategy& strategy) {
  // Inner step time: from the end of the previous call to the start of this one.
  const auto now = Clock::now();
  if (last_hook_end_ != Clock::time_point{})
    step_times_.push_back(std::chrono::duration<double>(now - last_hook_end_).count());
  else
    first_step_ = step - 1;  // the step this run (segment) started from
  struct Stamp {
    Clock::time_point& t;
    ~Stamp() { t = Clock::now(); }
  } stamp{last_hook_end_};

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
  if (!planned_) {
    // outer.plan: auto times the first steps; nothing syncs before the plan. Rank 0 probes
    // the other sites in the background meanwhile (started here, not at construction, so a
    // run resumed with its plan restored never probes); joined at the plan.
    if (rank_ == 0 && !probe_thread_.joinable() && !probe_path_ && !probe_error_)
      probe_thread_ = std::thread([this] {
        try {
          probe_path_ = probe_sites();
        } catch (...) {
          probe_error_ = std::current_exception();
        }
      });
    if (step >= first_step_ + ocfg_.plan_measure_steps) initial_plan(step, strategy);
    return any;
  }
  const int64_t rel = step - epoch_start_;
  if (ocfg_.auto_plan() && cfg_.sites.size() > 1 && rel > 0 && rel % interval_ == 0 && plan_boundary(step, strategy))
    return true;
  for (auto& f : frags_) {
    if (!syncs_at(plans_[static_cast<size_t>(f->index)], rel, interval_)) continue;
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
  drain_plan_protocol();
  for (auto& f : frags_)
    if (f->pending_merge) complete(*f, strategy);
  for (auto& f : frags_)
    if (f->blocking_step != step) sync(*f, step, strategy);
  // Every site ends with the same weights, verified (the run's one blocking check).
  verify_pending_checks();
}

// ---- outer.plan: auto -------------------------------------------------------------------

PlanRequest Diloco::plan_request(const PathMeasurement& path, double step_time_s, double capacity_scale) const {
  PlanRequest r;
  r.params = static_cast<double>(layout_.total());
  r.sites = static_cast<int>(cfg_.sites.size());
  r.ranks = cfg_.sites[0].ranks;
  r.transport_lanes = transport_ ? transport_->lanes() : 1;
  if (cfg_.transport) {
    r.eager_bytes = static_cast<double>(cfg_.transport->eager_bytes);
    // The emulator delays whole chunks over loopback, where handshakes cost nothing.
    if (cfg_.transport->emulate.enabled()) r.rtts_per_round = 0.5;
  }
  r.n_layer = layout_.config().n_layer;
  r.path = path;
  r.step_time_s = step_time_s;
  r.capacity_scale = capacity_scale;
  r.outer = &ocfg_;
  return r;
}

std::vector<uint8_t> Diloco::site_broadcast(trainer::SiteStrategy& strategy, std::vector<uint8_t> mine) {
  auto* coll = strategy.collective();
  if (!coll || strategy.ranks() == 1) return mine;
  if (rank_ != 0) mine.clear();
  auto all = coll->all_gather_bytes(std::as_bytes(std::span<const uint8_t>(mine)));
  const auto& b = all.at(0);
  return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(b.data()), reinterpret_cast<const uint8_t*>(b.data()) + b.size());
}

void Diloco::send_control(int site, EnvelopeKind kind, uint64_t round, uint32_t shard, uint64_t value,
                          const std::string& body, std::vector<ControlOp>& into) {
  ControlOp op;
  op.site = site;
  op.buf = std::make_shared<std::vector<uint8_t>>();
  write_envelope({kind, round, static_cast<uint32_t>(site_), static_cast<uint32_t>(rank_), value,
                  std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(body.data()), body.size())},
                 *op.buf);
  op.op = transport_->send(peer_of_site_[static_cast<size_t>(site)], transport::FrameKind::kControl, round, shard, *op.buf);
  into.push_back(std::move(op));
}

void Diloco::post_control_recv(int site, uint64_t round, uint32_t shard, std::vector<ControlOp>& into) {
  ControlOp op;
  op.site = site;
  op.buf = std::make_shared<std::vector<uint8_t>>(kEnvelopeBytes + kMaxControlBody);
  op.op = transport_->recv(peer_of_site_[static_cast<size_t>(site)], transport::FrameKind::kControl, round, shard, *op.buf);
  into.push_back(std::move(op));
}

Envelope Diloco::read_control(ControlOp& op, EnvelopeKind kind, uint64_t round) const {
  op.op.wait();
  op.buf->resize(op.op.bytes());
  return read_envelope(*op.buf, kind, round, static_cast<uint32_t>(op.site), static_cast<uint32_t>(rank_), kMaxControlBody,
                       peer_name(op.site));
}

namespace {
nlohmann::json body_json(const Envelope& e, const std::string& who) {
  try {
    return nlohmann::json::parse(std::string(reinterpret_cast<const char*>(e.body.data()), e.body.size()));
  } catch (const nlohmann::json::exception& x) {
    throw Error(fmt::format("outer plan: malformed message from {}: {}", who, x.what()));
  }
}
std::string bytes_string(const std::vector<uint8_t>& b) { return std::string(b.begin(), b.end()); }
// A plan's JSON text (malformed JSON is reported by from_json, naming `source`).
PlanDecision parse_plan(const std::string& text, const std::string& source) {
  return PlanDecision::from_json(nlohmann::json::parse(text, nullptr, false), source);
}
}  // namespace

PathMeasurement Diloco::probe_sites() {
  // Every site pair this site belongs to, in one global order (no deadlock); the worst path.
  const int S = static_cast<int>(cfg_.sites.size());
  std::optional<PathMeasurement> worst;
  uint32_t pair = 0;
  for (int a = 0; a < S; ++a)
    for (int b = a + 1; b < S; ++b) {
      ++pair;
      if (a != site_ && b != site_) continue;
      const int other = a == site_ ? b : a;
      probe::ProbeOptions po;
      po.session = pair;
      po.seconds = ocfg_.plan_probe_seconds;
      po.ping_count = 20;
      po.ping_warmup = 3;
      spdlog::info("outer plan: probing {} ({:.1f} s per stream) while the first {} steps are timed", peer_name(other),
                   po.seconds, ocfg_.plan_measure_steps);
      auto r = probe::probe_peer(*transport_, peer_of_site_[static_cast<size_t>(other)],
                                 a == site_ ? probe::Role::kInitiator : probe::Role::kResponder, po);
      PathMeasurement m;
      m.rtt_s = r.rtt.median_ms / 1e3;
      m.rtt_p99_s = r.rtt.p99_ms / 1e3;
      m.per_connection_Bps = r.single ? r.single->gbps * 1e9 / 8 : 0;
      m.path_Bps = r.multi ? r.multi->gbps * 1e9 / 8 : m.per_connection_Bps;
      m.connections = r.multi ? r.multi->connections : 1;
      worst = worst ? PathMeasurement::worst(*worst, m) : m;
    }
  return *worst;
}

void Diloco::initial_plan(int64_t step, trainer::SiteStrategy& strategy) {
  const int S = static_cast<int>(cfg_.sites.size());
  // 1. The inner step time: this rank's median (the first step, with its start-up costs,
  //    left out), then the site's slowest rank.
  std::vector<double> times(step_times_.begin() + std::min<ptrdiff_t>(1, ptrdiff_t(step_times_.size())), step_times_.end());
  double step_s = median(times);
  if (auto* coll = strategy.collective(); coll && strategy.ranks() > 1) {
    auto all = coll->all_gather_bytes(std::as_bytes(std::span<const double>(&step_s, 1)));
    for (auto& b : all) {
      double v = 0;
      std::memcpy(&v, b.data(), sizeof v);
      step_s = std::max(step_s, v);
    }
  }
  std::vector<uint8_t> plan_bytes;
  if (rank_ == 0) {
    // 2. The probe ran on its own thread during the measured steps.
    if (probe_thread_.joinable()) probe_thread_.join();
    if (probe_error_) std::rethrow_exception(probe_error_);
    const std::optional<PathMeasurement> worst = probe_path_;
    if (!worst) throw Error("outer plan: the probe measured nothing");
    // 3. Site 0 plans from every site's report; the others receive the plan.
    const nlohmann::json report = {{"step_time_s", step_s}, {"path", worst->to_json()}};
    if (site_ == 0) {
      std::vector<ControlOp> recvs, sends;
      for (int s = 1; s < S; ++s) post_control_recv(s, 0, kStartReportShard, recvs);
      double max_step = step_s;
      PathMeasurement path = *worst;
      for (auto& op : recvs) {
        auto e = read_control(op, EnvelopeKind::kPlanReport, 0);
        auto j = body_json(e, peer_name(op.site));
        try {
          max_step = std::max(max_step, j.at("step_time_s").get<double>());
          path = PathMeasurement::worst(path, PathMeasurement::from_json(j.at("path")));
        } catch (const nlohmann::json::exception& x) {
          throw Error(fmt::format("outer plan: malformed report from {}: {}", peer_name(op.site), x.what()));
        }
      }
      PlanDecision d = choose_plan(plan_request(path, max_step, 1.0));
      d.epoch = 1;
      const std::string body = d.to_json().dump();
      for (int s = 1; s < S; ++s) send_control(s, EnvelopeKind::kPlanDecision, 0, kStartPlanShard, 0, body, sends);
      for (auto& op : sends) op.op.wait();
      plan_bytes.assign(body.begin(), body.end());
    } else {
      std::vector<ControlOp> sends, recvs;
      send_control(0, EnvelopeKind::kPlanReport, 0, kStartReportShard, 0, report.dump(), sends);
      post_control_recv(0, 0, kStartPlanShard, recvs);
      sends[0].op.wait();
      auto e = read_control(recvs[0], EnvelopeKind::kPlanDecision, 0);
      plan_bytes.assign(e.body.begin(), e.body.end());
    }
  }
  // 4. The same plan on every rank of the site.
  plan_bytes = site_broadcast(strategy, std::move(plan_bytes));
  const PlanDecision d = parse_plan(bytes_string(plan_bytes), site_ == 0 ? "this site" : peer_name(0));
  apply_plan(d, step, strategy, true);
}

bool Diloco::plan_boundary(int64_t step, trainer::SiteStrategy& strategy) {
  const int S = static_cast<int>(cfg_.sites.size());
  const uint64_t key = (static_cast<uint64_t>(plan_.epoch) << 32) | static_cast<uint64_t>(++boundary_);
  // A. The decision due at this boundary: site 0 made it one boundary ago, the others
  //    received it since.
  std::vector<uint8_t> due;
  if (rank_ == 0) {
    if (site_ == 0) {
      if (next_due_) {
        const std::string b = next_due_->to_json().dump();
        due.assign(b.begin(), b.end());
      }
      next_due_.reset();
      for (auto& op : decision_sends_) op.op.wait();
      decision_sends_.clear();
    } else {
      for (auto& op : decision_recvs_) {
        auto e = read_control(op, EnvelopeKind::kPlanDecision, key - 1);
        auto j = body_json(e, peer_name(0));
        if (j.value("change", false)) {
          const std::string b = j.at("plan").dump();
          due.assign(b.begin(), b.end());
        }
      }
      decision_recvs_.clear();
    }
  }
  due = site_broadcast(strategy, std::move(due));
  if (!due.empty()) {
    PlanDecision d = parse_plan(bytes_string(due), site_ == 0 ? "this site" : peer_name(0));
    if (!d.same_schedule(plan_)) {
      drain_plan_protocol();
      ++replans_;
      apply_plan(d, step, strategy, false);
      return true;
    }
    // Same schedule, recalibrated predictions: nothing to rebuild.
    if (rank_ == 0)
      spdlog::info("outer plan: recalibrated at step {} (fragment sync predicted {:.1f} ms, was {:.1f} ms); schedule "
                   "unchanged", step, d.predicted_fragment_sync_s * 1e3, plan_.predicted_fragment_sync_s * 1e3);
    d.epoch = plan_.epoch;
    plan_ = d;
    ++recalibrations_;
  }
  // B. This boundary's measurements (rank 0's stand for its site).
  double sync_s = median(boundary_syncs_);
  const double step_s = median(step_times_);
  // Test hook: GEOLOCO_PLAN_TEST_DRIFT="STEP:FACTOR" multiplies the sync times measured
  // after inner step STEP by FACTOR (a link that got slower), so tests can exercise the
  // re-plan protocol deterministically. Never set in production.
  if (const char* h = std::getenv("GEOLOCO_PLAN_TEST_DRIFT"); h && *h) {
    int64_t after = 0;
    double factor = 1;
    if (std::sscanf(h, "%" SCNd64 ":%lf", &after, &factor) != 2)
      throw InputError(fmt::format("GEOLOCO_PLAN_TEST_DRIFT='{}': expected STEP:FACTOR", h));
    if (step > after) sync_s *= factor;
  }
  boundary_syncs_.clear();
  step_times_.clear();
  const bool drift = drifted(plan_.predicted_fragment_sync_s, sync_s, ocfg_.replan_threshold) ||
                     drifted(plan_.step_time_s, step_s, ocfg_.replan_threshold);
  if (rank_ != 0) return false;
  const nlohmann::json report = {{"sync_s", sync_s}, {"step_s", step_s}, {"drift", drift}};
  if (site_ == 0) {
    // C. Decide from every site's report of the previous boundary.
    std::optional<PlanDecision> d;
    if (!own_report_.is_null()) {
      std::vector<nlohmann::json> reports = {own_report_};
      for (auto& op : report_recvs_) reports.push_back(body_json(read_control(op, EnvelopeKind::kPlanReport, key - 1), peer_name(op.site)));
      // Sync time: the smallest site's (a site that reached the sync first also waited for
      // the others; the last one to arrive measures the transfer). Step time: the slowest.
      bool any_drift = false;
      double max_sync = 0, max_step = 0;
      try {
        for (auto& r : reports) {
          any_drift = any_drift || r.at("drift").get<bool>();
          const double v = r.at("sync_s").get<double>();
          if (v > 0) max_sync = max_sync > 0 ? std::min(max_sync, v) : v;
          max_step = std::max(max_step, r.at("step_s").get<double>());
        }
      } catch (const nlohmann::json::exception& x) {
        throw Error(fmt::format("outer plan: malformed report at boundary {}: {}", boundary_, x.what()));
      }
      if (any_drift && max_step > 0) {
        PlanRequest req = plan_request(plan_.path, max_step, plan_.capacity_scale);
        const double scale = max_sync > 0 ? calibrated_capacity_scale(req, plan_, max_sync) : plan_.capacity_scale;
        PlanDecision n = choose_plan(plan_request(plan_.path, max_step, scale));
        n.epoch = n.same_schedule(plan_) ? plan_.epoch : plan_.epoch + 1;
        // A recalibration that moves the prediction by less than half the threshold is noise.
        const bool minor = n.same_schedule(plan_) &&
                           !drifted(plan_.predicted_fragment_sync_s, n.predicted_fragment_sync_s, ocfg_.replan_threshold / 2) &&
                           !drifted(plan_.step_time_s, n.step_time_s, ocfg_.replan_threshold / 2);
        n.reason = fmt::format("Re-planned at step {}: measured fragment sync {:.1f} ms (plan {:.1f} ms), step {:.1f} ms "
                               "(plan {:.1f} ms), threshold {:.0f}%. {}",
                               step, max_sync * 1e3, plan_.predicted_fragment_sync_s * 1e3, max_step * 1e3,
                               plan_.step_time_s * 1e3, ocfg_.replan_threshold * 100, n.reason);
        if (!minor) d = n;
      }
    }
    report_recvs_.clear();
    const nlohmann::json msg = {{"change", d.has_value()}, {"plan", d ? d->to_json() : nlohmann::json()}};
    for (int s = 1; s < S; ++s) send_control(s, EnvelopeKind::kPlanDecision, key, kPlanDecisionShard, 0, msg.dump(), decision_sends_);
    next_due_ = d;
    own_report_ = report;
    for (int s = 1; s < S; ++s) post_control_recv(s, key, kPlanReportShard, report_recvs_);
  } else {
    for (auto& op : report_sends_) op.op.wait();
    report_sends_.clear();
    send_control(0, EnvelopeKind::kPlanReport, key, kPlanReportShard, 0, report.dump(), report_sends_);
    post_control_recv(0, key, kPlanDecisionShard, decision_recvs_);
  }
  return false;
}

void Diloco::drain_plan_protocol() {
  // Every message posted has its counterpart posted at the same boundary on the other side,
  // so these waits end (bounded by the transport's timeouts if a peer died).
  for (auto* list : {&report_recvs_, &report_sends_, &decision_recvs_, &decision_sends_}) {
    for (auto& op : *list) op.op.wait();
    list->clear();
  }
  next_due_.reset();
  own_report_ = nullptr;
  boundary_ = 0;
}

void Diloco::apply_plan(const PlanDecision& d, int64_t step, trainer::SiteStrategy& strategy, bool initial) {
  if (!initial) {
    // Land everything under the old schedule: merges, then a blocking sync of every fragment.
    for (auto& f : frags_)
      if (f->pending_merge) complete(*f, strategy);
    for (auto& f : frags_)
      if (f->blocking_step != step) sync(*f, step, strategy);
  }
  // Carry the global weights, outer-optimizer state and error feedback across the new cut.
  const ShardState st = pack_state();
  int64_t opt_steps = 0;
  for (auto& f : frags_) opt_steps = std::max(opt_steps, f->opt->steps());
  set_schedule(d, st.global);
  unpack_state(st);
  for (auto& f : frags_) {
    f->opt->set_steps(opt_steps);
    f->last_sync_step = initial ? 0 : step;
    f->blocking_step = initial ? -1 : step;
  }
  epoch_start_ = step;
  plan_ = d;
  plan_history_.push_back(d);
  planned_ = true;
  boundary_ = 0;
  step_times_.clear();
  boundary_syncs_.clear();
  site_hash_ = combine_site_hash(strategy, combined_hash());
  log_plan(d, step);
}

void Diloco::log_plan(const PlanDecision& d, int64_t step) const {
  if (rank_ != 0) return;
  spdlog::info("outer plan (epoch {}, from step {}): H {}, {} fragment(s), {}, {} lane(s); predicted utilization {:.4f}. {}",
               d.epoch, step, d.interval, d.fragments, d.codec, d.lanes, d.predicted_utilization, d.reason);
  if (site_ != 0) return;
  nlohmann::json all = nlohmann::json::array();
  for (const auto& p : plan_history_) all.push_back(p.to_json());
  std::error_code ec;
  std::filesystem::create_directories(cfg_.run.output_dir, ec);
  trainer::write_text_atomically((std::filesystem::path(cfg_.run.output_dir) / "plan.json").string(),
                                 nlohmann::json({{"format", "geoloco-plan"}, {"version", 1}, {"plans", all}}).dump(2) + "\n");
}

namespace {
// Runs one round's exchange; a failure (peer lost, timeout, bad frame) names the round.
template <class F>
auto in_outer_step(uint64_t round, int64_t step, F&& run) {
  try {
    return run();
  } catch (Error& e) {
    e.add_context(fmt::format("outer step {} (inner step {})", round, step));
    throw;
  }
}
}  // namespace

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
  const ExchangeResult r = in_outer_step(round, step, [&] {
    return exchange(f, step, round, tokens_since(step, f.last_sync_step), f.snapshot,
                    trainer::TraceRecorder::kMainThread);
  });
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
      fp->result =
          in_outer_step(round, step, [&] { return exchange(*fp, step, round, tokens, fp->snapshot, trace_tid(*fp)); });
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
  boundary_syncs_.push_back(seconds);
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

  // The check of this fragment's previous round: its replies arrived long ago (the peers
  // sent them right after that round's outer step), so this rarely waits.
  if (f.check) {
    trainer::TraceSpan sp(trace_, "hash_check", tid);
    verify_hash_check(*f.check);
    f.check.reset();
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
  // Test hook (never set in production): GEOLOCO_TEST_PERTURB_GLOBAL="SITE:ROUND" nudges one
  // global weight at that site after that round's outer step, so tests can see the
  // cross-site check stop a run whose sites diverged.
  if (const char* hook = std::getenv("GEOLOCO_TEST_PERTURB_GLOBAL"); hook && *hook && f.n > 0) {
    int hs = -1;
    uint64_t hr = 0;
    if (std::sscanf(hook, "%d:%" SCNu64, &hs, &hr) != 2)
      throw InputError(fmt::format("GEOLOCO_TEST_PERTURB_GLOBAL='{}': expected SITE:ROUND", hook));
    if (hs == site_ && hr == round) f.global[0] = std::nextafter(f.global[0], INFINITY);
  }
  r.hash = hash64(f.global.data(), f.global.size() * sizeof(float));
  // Posted now, verified at this fragment's next round (or a checkpoint, re-plan, the end).
  if (ocfg_.check_hash && transport_) f.check = post_hash_check(r.hash, round);
  r.envelope_bytes = mine.size();
  r.frame_bytes = info.frame_bytes;
  r.elements = info.elements;
  r.ratio = info.ratio();
  return r;
}

Diloco::HashCheck Diloco::post_hash_check(uint64_t h, uint64_t round) {
  const int S = static_cast<int>(cfg_.sites.size());
  HashCheck c;
  c.round = round;
  c.hash = h;
  c.mine = std::make_shared<std::vector<uint8_t>>();
  write_envelope({EnvelopeKind::kWeightsHash, round, static_cast<uint32_t>(site_), static_cast<uint32_t>(rank_), h, {}},
                 *c.mine);
  for (int s = 0; s < S; ++s) {
    if (s == site_) continue;
    const int p = peer_of_site_[static_cast<size_t>(s)];
    ControlOp op;
    op.site = s;
    op.buf = std::make_shared<std::vector<uint8_t>>(kEnvelopeBytes);
    op.op = transport_->recv(p, transport::FrameKind::kControl, round, static_cast<uint32_t>(rank_), *op.buf);
    c.recvs.emplace_back(s, std::move(op));
    c.sends.push_back(transport_->send(p, transport::FrameKind::kControl, round, static_cast<uint32_t>(rank_), *c.mine));
  }
  return c;
}

void Diloco::verify_hash_check(HashCheck& c) {
  try {
    for (auto& op : c.sends) op.wait();
    for (auto& [s, op] : c.recvs) {
      op.op.wait();
      auto& buf = *op.buf;
      buf.resize(op.op.bytes());
      auto e = read_envelope(buf, EnvelopeKind::kWeightsHash, c.round, static_cast<uint32_t>(s),
                             static_cast<uint32_t>(rank_), 0, peer_name(s));
      if (e.value != c.hash) {
        const std::string& here = cfg_.sites[static_cast<size_t>(site_)].name;
        const std::string& there = cfg_.sites[static_cast<size_t>(s)].name;
        // Round 0 is the start: nothing has trained yet, so the inputs of the init differ.
        if (c.round == 0)
          throw Error(fmt::format(
              "initial weights differ between sites: shard {} hash {} here (site {}) but {} at site {} ({}); every "
              "site must start from the same weights: same run.seed and, with train.init_from, the same file "
              "contents ({} here)",
              rank_, hex64(c.hash), here, hex64(e.value), there, peer_name(s),
              cfg_.train.init_from.empty() ? std::string("none") : cfg_.train.init_from));
        throw Error(fmt::format("outer round {}: global weights diverged: shard {} hash {} here (site {}) but {} at site "
                                "{} ({}); stopping",
                                c.round, rank_, hex64(c.hash), here, hex64(e.value), there, peer_name(s)));
      }
    }
  } catch (...) {
    keep_until_exit(c);  // other replies may still be in flight (the constructor's check too)
    throw;
  }
}

void Diloco::verify_pending_checks() {
  for (auto& f : frags_) {
    if (!f->check || f->in_flight) continue;  // in flight: the worker verifies it
    trainer::TraceSpan sp(trace_, "hash_check", trainer::TraceRecorder::kMainThread);
    verify_hash_check(*f->check);
    f->check.reset();
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
  j["outer_interval"] = interval_;
  j["outer_fragments"] = frags_.size();
  j["outer_overlap_steps"] = tau();
  j["outer_delayed_update"] = ocfg_.delayed_update;
  j["outer_optimizer"] = ocfg_.optimizer.kind;
  j["compression"] = pcfg_.describe();
  j["outer_plan"] = ocfg_.plan;
  if (ocfg_.auto_plan()) {
    nlohmann::json plans = nlohmann::json::array();
    for (const auto& p : plan_history_) plans.push_back(p.to_json());
    j["plans"] = plans;
    j["replans"] = replans_;
    j["plan_recalibrations"] = recalibrations_;
  }
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


Diloco::State Diloco::save_state() {
  // Syncs in flight: wait for their results (global weights, outer optimizer and error
  // feedback state all advance in the worker) and checkpoint the merges still due, so a
  // resumed run merges at the same steps as an uninterrupted one.
  for (auto& f : frags_) join(*f);
  // A checkpoint holds weights every site agreed on.
  verify_pending_checks();
  ShardState st = pack_state();
  State s;
  s.tensors["global"] = std::move(st.global);
  if (!st.opt_a.empty()) s.tensors["opt_a"] = std::move(st.opt_a);
  if (!st.opt_b.empty()) s.tensors["opt_b"] = std::move(st.opt_b);
  if (!st.ef.empty()) s.tensors["ef_residual"] = std::move(st.ef);
  drain_plan_protocol();
  s.metadata["round"] = std::to_string(round_);
  s.metadata["fragments"] = std::to_string(frags_.size());
  if (ocfg_.auto_plan()) {
    // The plan in effect and where its schedule starts; the protocol restarts after a
    // checkpoint (drained above, in the uninterrupted run as in the resumed one).
    s.metadata["planned"] = std::to_string(planned_ ? 1 : 0);
    s.metadata["plan"] = plan_.to_json().dump();
    s.metadata["epoch_start"] = std::to_string(epoch_start_);
    s.metadata["replans"] = std::to_string(replans_);
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
    }
  }
  return s;
}

void Diloco::restore_state(const trainer::SafetensorsFile& file) {
  const std::vector<int64_t> shape = {static_cast<int64_t>(n_)};
  if (ocfg_.auto_plan() && file.metadata().count("outer.planned") && file.meta("outer.planned") == "1") {
    // Rebuild the fragments of the saved plan before reading their state.
    PlanDecision d = parse_plan(file.meta("outer.plan"), file.path());
    set_schedule(d, std::vector<float>(n_, 0.0f));
    epoch_start_ = std::stoll(file.meta("outer.epoch_start"));
    replans_ = std::stoi(file.meta("outer.replans"));
    plan_ = d;
    plan_history_ = {d};
    planned_ = true;
  }
  const std::string saved_f = file.meta("outer.fragments");
  if (saved_f != std::to_string(frags_.size()))
    throw FileError(file.path(), fmt::format("holds outer state for {} fragment(s), but this run has outer.fragments: {}",
                                             saved_f, frags_.size()));
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
  if (frags_[0]->ef) st.ef = read("outer.ef_residual");
  unpack_state(st);
  round_ = std::stoll(file.meta("outer.round"));
  for (auto& f : frags_) {
    const std::string p = fmt::format("outer.f{}.", f->index);
    f->last_sync_step = std::stoll(file.meta(p + "last_sync_step"));
    f->blocking_step = std::stoll(file.meta(p + "blocking_step"));
    f->opt->set_steps(std::stoll(file.meta(p + "opt_steps")));
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
