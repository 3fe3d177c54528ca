// The outer.plan: auto protocol between sites: start-up plan, period boundaries (plan_coordinator.hpp).
#include "outer_optimizer/plan_coordinator.hpp"
#include "outer_optimizer/local_cost.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "transport/probe/probe.hpp"

namespace geoloco::outer {

namespace {

// Keys of the plan protocol's control messages (FrameKind::kControl; the hash check uses
// shard = rank, far below these).
constexpr uint32_t kStartReportShard = 0xFFFF0003u, kStartPlanShard = 0xFFFF0004u;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

std::span<const uint8_t> text_bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

nlohmann::json body_json(const Envelope& e, const std::string& who) {
  try {
    return nlohmann::json::parse(std::string(reinterpret_cast<const char*>(e.body.data()), e.body.size()));
  } catch (const nlohmann::json::exception& x) {
    throw Error(fmt::format("outer plan: malformed message from {}: {}", who, x.what()));
  }
}

// A plan's JSON text (malformed JSON is reported by from_json, naming `source`).
PlanDecision parse_plan(const std::vector<uint8_t>& bytes, const std::string& source) {
  return PlanDecision::from_json(nlohmann::json::parse(std::string(bytes.begin(), bytes.end()), nullptr, false),
                                 source);
}

// Site 0's rank 0 decides, every other site's rank 0 receives: rank 0's bytes on every rank.
std::vector<uint8_t> site_broadcast(Site& site, int rank, std::vector<uint8_t> mine) {
  if (site.ranks() == 1) return mine;
  if (rank != 0) mine.clear();
  auto all = site.all_gather(std::as_bytes(std::span<const uint8_t>(mine)));
  const auto& b = all.at(0);
  return std::vector<uint8_t>(reinterpret_cast<const uint8_t*>(b.data()),
                              reinterpret_cast<const uint8_t*>(b.data()) + b.size());
}

}  // namespace

PlanCoordinator::PlanCoordinator(const OuterOptions& o, const SitePeers& peers)
    : opt_(o), ocfg_(o.outer), peers_(peers), hooks_(o.hooks) {}

PlanCoordinator::~PlanCoordinator() {
  // A run that failed while probing: the probe's waits are bounded by the transport's timeouts.
  if (probe_thread_.joinable()) probe_thread_.join();
}

PlanRequest PlanCoordinator::request(const PathMeasurement& path, double step_time_s, double capacity_scale,
                                     const std::map<int, double>& local_sync_s) const {
  PlanRequest r;
  r.local_sync_s = local_sync_s;
  r.params = static_cast<double>(opt_.params.total);
  r.sites = opt_.site_count();
  // Rank pairs that carry the exchange in parallel: the smallest site's rank count (each of its
  // ranks holds 1/ranks of the model and sends it all).
  r.ranks = opt_.sites[0].ranks;
  for (const auto& s : opt_.sites) r.ranks = std::min(r.ranks, s.ranks);
  r.transport_lanes = peers_.transport() ? peers_.transport()->lanes() : 1;
  r.eager_bytes = static_cast<double>(opt_.eager_bytes);
  // The emulator delays whole chunks over loopback, where handshakes cost nothing.
  if (opt_.emulated_link) r.rtts_per_round = 0.5;
  r.n_layer = std::max(opt_.params.blocks(), 1);
  r.path = path;
  r.step_time_s = step_time_s;
  r.capacity_scale = capacity_scale;
  r.outer = &ocfg_;
  return r;
}

void PlanCoordinator::start_probe() {
  if (peers_.rank() != 0 || probe_thread_.joinable() || probe_path_ || probe_error_) return;
  probe_thread_ = std::thread([this] {
    try {
      probe_path_ = probe_sites();
    } catch (...) {
      probe_error_ = std::current_exception();
    }
  });
}

PathMeasurement PlanCoordinator::probe_sites() {
  // Every site pair this site belongs to, in one global order (no deadlock); the worst path.
  const int S = peers_.sites(), self = peers_.site();
  std::optional<PathMeasurement> worst;
  uint32_t pair = 0;
  for (int a = 0; a < S; ++a)
    for (int b = a + 1; b < S; ++b) {
      ++pair;
      if (a != self && b != self) continue;
      const int other = a == self ? b : a;
      probe::ProbeOptions po;
      po.session = pair;
      po.seconds = ocfg_.plan_probe_seconds;
      po.ping_count = 20;
      po.ping_warmup = 3;
      spdlog::info("outer plan: probing {} ({:.1f} s per stream) while the first {} steps are timed",
                   peers_.name(other), po.seconds, ocfg_.plan_measure_steps);
      auto r = probe::probe_peer(*peers_.transport(), peers_.peer(other),
                                 a == self ? probe::Role::kInitiator : probe::Role::kResponder, po);
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

PlanDecision PlanCoordinator::initial(Site& site, const std::vector<double>& step_times) {
  const int S = peers_.sites();
  // 1. The inner step time: this rank's median (the first step, with its start-up costs,
  //    left out), then the site's slowest rank.
  std::vector<double> times(step_times.begin() + std::min<ptrdiff_t>(1, ptrdiff_t(step_times.size())),
                            step_times.end());
  double step_s = median(times);
  if (site.ranks() > 1) {
    auto all = site.all_gather(std::as_bytes(std::span<const double>(&step_s, 1)));
    for (auto& b : all) {
      double v = 0;
      std::memcpy(&v, b.data(), sizeof v);
      step_s = std::max(step_s, v);
    }
  }
  // The outer loop's own cost per sync of this rank's shard, by codec width (local_cost.hpp),
  // then the site's slowest rank's.
  const auto measured =
      measure_local_sync_s(ocfg_.compression, ocfg_.plan_bits, S, static_cast<size_t>(site.shard().count));
  std::vector<double> local_v;
  for (int b : ocfg_.plan_bits) local_v.push_back(measured.at(b));
  if (site.ranks() > 1) {
    auto all = site.all_gather(std::as_bytes(std::span<const double>(local_v)));
    for (auto& bytes : all) {
      GEOLOCO_CHECK(bytes.size() == local_v.size() * sizeof(double), "outer plan: a rank's local costs of {} bytes",
                    bytes.size());
      for (size_t i = 0; i < local_v.size(); ++i) {
        double v = 0;
        std::memcpy(&v, bytes.data() + i * sizeof(double), sizeof v);
        local_v[i] = std::max(local_v[i], v);
      }
    }
  }
  std::map<int, double> local;
  for (size_t i = 0; i < local_v.size(); ++i) local[ocfg_.plan_bits[i]] = local_v[i];
  auto local_json = [](const std::map<int, double>& m) {
    nlohmann::json j = nlohmann::json::object();
    for (const auto& [b, sec] : m) j[std::to_string(b)] = sec;
    return j;
  };
  std::vector<uint8_t> plan_bytes;
  if (peers_.rank() == 0) {
    // 2. The probe ran on its own thread during the measured steps.
    if (probe_thread_.joinable()) probe_thread_.join();
    if (probe_error_) std::rethrow_exception(probe_error_);
    if (!probe_path_) throw Error("outer plan: the probe measured nothing");
    const PathMeasurement worst = *probe_path_;
    // 3. Site 0 plans from every site's report; the others receive the plan.
    if (peers_.site() == 0) {
      std::vector<std::pair<int, transport::RecvHandle>> recvs;
      for (int s = 1; s < S; ++s) recvs.emplace_back(s, peers_.post_recv(s, 0, kStartReportShard));
      double max_step = step_s;
      PathMeasurement path = worst;
      for (auto& [s, op] : recvs) {
        std::vector<uint8_t> bytes;
        auto j = body_json(peers_.read(op, s, EnvelopeKind::kPlanReport, 0, bytes), peers_.name(s));
        try {
          max_step = std::max(max_step, j.at("step_time_s").get<double>());
          path = PathMeasurement::worst(path, PathMeasurement::from_json(j.at("path")));
          for (const auto& [k, v] : j.at("local_sync_s").items()) {
            const auto it =
                std::find_if(local.begin(), local.end(), [&](const auto& e) { return std::to_string(e.first) == k; });
            if (it != local.end()) it->second = std::max(it->second, v.get<double>());
          }
        } catch (const nlohmann::json::exception& x) {
          throw Error(fmt::format("outer plan: malformed report from {}: {}", peers_.name(s), x.what()));
        }
      }
      PlanDecision d = choose_plan(request(path, max_step, 1.0, local));
      d.epoch = 1;
      const std::string body = d.to_json().dump();
      std::vector<transport::SendHandle> sends;
      for (int s = 1; s < S; ++s)
        sends.push_back(peers_.send(s, EnvelopeKind::kPlanDecision, 0, kStartPlanShard, 0, text_bytes(body)));
      for (auto& op : sends) op.wait();
      plan_bytes.assign(body.begin(), body.end());
    } else {
      const nlohmann::json report = {
          {"step_time_s", step_s}, {"path", worst.to_json()}, {"local_sync_s", local_json(local)}};
      auto sent = peers_.send(0, EnvelopeKind::kPlanReport, 0, kStartReportShard, 0, text_bytes(report.dump()));
      auto got = peers_.post_recv(0, 0, kStartPlanShard);
      sent.wait();
      std::vector<uint8_t> bytes;
      auto e = peers_.read(got, 0, EnvelopeKind::kPlanDecision, 0, bytes);
      plan_bytes.assign(e.body.begin(), e.body.end());
    }
  }
  // 4. The same plan on every rank of the site.
  plan_bytes = site_broadcast(site, peers_.rank(), std::move(plan_bytes));
  return parse_plan(plan_bytes, peers_.site() == 0 ? "this site" : peers_.name(0));
}

std::optional<PlanDecision> PlanCoordinator::boundary(int64_t step, int64_t index, Site& site, PlanDecision& plan,
                                                      const std::vector<double>& sync_times,
                                                      const std::vector<double>& step_times) {
  const bool rank0 = peers_.rank() == 0;
  // A. The decision due at this boundary (a committed round carried it: every member has it).
  std::vector<uint8_t> due;
  if (rank0 && due_) {
    if (due_->epoch == plan.epoch) {
      const std::string b = due_->plan.to_json().dump();
      due.assign(b.begin(), b.end());
    }
    due_.reset();
  }
  due = site_broadcast(site, peers_.rank(), std::move(due));
  if (!due.empty()) {
    PlanDecision d = parse_plan(due, "the decision a committed round carried");
    if (!d.same_schedule(plan)) {
      ++replans_;
      return d;
    }
    // Same schedule, recalibrated predictions: nothing to rebuild.
    if (rank0)
      spdlog::info(
          "outer plan: recalibrated at step {} (fragment sync predicted {:.1f} ms, was {:.1f} ms); schedule "
          "unchanged",
          step, d.predicted_fragment_sync_s * 1e3, plan.predicted_fragment_sync_s * 1e3);
    d.epoch = plan.epoch;
    plan = d;
    ++recalibrations_;
  }
  // B. This boundary's measurements (rank 0's stand for its site), attached from now on.
  if (!rank0) return std::nullopt;
  Report r;
  r.epoch = plan.epoch;
  r.boundary = index;
  r.sync_s = median(sync_times);
  r.step_s = median(step_times);
  if (hooks_.drift && step > hooks_.drift->after_step) r.sync_s *= hooks_.drift->factor;
  r.drift = drifted(plan.predicted_fragment_sync_s, r.sync_s, ocfg_.replan_threshold) ||
            drifted(plan.step_time_s, r.step_s, ocfg_.replan_threshold);
  report_ = r;
  return std::nullopt;
}

nlohmann::json PlanCoordinator::Report::to_json() const {
  return {{"epoch", epoch}, {"boundary", boundary}, {"sync_s", sync_s}, {"step_s", step_s}, {"drift", drift}};
}

PlanCoordinator::Report PlanCoordinator::Report::from_json(const nlohmann::json& j) {
  return Report{j.at("epoch").get<int64_t>(), j.at("boundary").get<int64_t>(), j.at("sync_s").get<double>(),
                j.at("step_s").get<double>(), j.at("drift").get<bool>()};
}

nlohmann::json PlanCoordinator::Decided::to_json() const {
  return {{"epoch", epoch}, {"boundary", boundary}, {"plan", plan.to_json()}};
}

PlanCoordinator::Decided PlanCoordinator::Decided::from_json(const nlohmann::json& j, const std::string& source) {
  return Decided{j.at("epoch").get<int64_t>(), j.at("boundary").get<int64_t>(),
                 PlanDecision::from_json(j.at("plan"), source)};
}

std::vector<uint8_t> PlanCoordinator::attachment() const {
  if (peers_.rank() != 0 || (!report_ && !decision_)) return {};
  nlohmann::json j = {{"format", "geoloco-plan-attachment"}, {"version", 1}};
  if (report_) j["report"] = report_->to_json();
  if (decision_) j["decision"] = decision_->to_json();
  const std::string text = j.dump();
  return std::vector<uint8_t>(text.begin(), text.end());
}

void PlanCoordinator::committed(uint64_t round, const std::vector<std::vector<uint8_t>>& attachments,
                                SiteMask contributors, const PlanDecision& plan) {
  if (peers_.rank() != 0) return;
  const int S = peers_.sites(), self = peers_.site();
  // Every member reads the same attachments: a malformed one is left out by all of them alike.
  std::vector<nlohmann::json> att(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) {
    if (!((contributors >> s) & 1) || static_cast<size_t>(s) >= attachments.size()) continue;
    const auto& b = attachments[static_cast<size_t>(s)];
    if (b.empty()) continue;
    auto j = nlohmann::json::parse(b.begin(), b.end(), nullptr, false);
    if (!j.is_object() || j.value("format", "") != "geoloco-plan-attachment" || j.value("version", 0) != 1) {
      spdlog::warn("outer round {}: the plan attachment of {} is not one this site reads; left out", round,
                   peers_.name(s));
      continue;
    }
    att[static_cast<size_t>(s)] = std::move(j);
  }
  try {
    // 1. A decision, in site order: the first for a boundary after the last one decided is due.
    for (int s = 0; s < S; ++s) {
      const auto& j = att[static_cast<size_t>(s)];
      if (j.is_null() || !j.contains("decision")) continue;
      Decided d = Decided::from_json(j.at("decision"), peers_.name(s) + "'s plan decision");
      if (d.epoch != plan.epoch || d.boundary <= committed_boundary_) continue;
      committed_boundary_ = d.boundary;
      due_ = std::move(d);
      break;
    }
  } catch (const std::exception& e) {
    // Deterministic as well: every member reads the same bytes and skips the same decision.
    spdlog::warn("outer round {}: a plan decision it carried is malformed ({}); left out", round, e.what());
  }
  if (decision_ && decision_->boundary <= committed_boundary_) decision_.reset();  // in, or overtaken
  // 2. The decider: the lowest-index contributor, in the first round carrying its own report
  //    of the current boundary, decides from every report of that boundary in the round.
  if (!report_ || report_->epoch != plan.epoch || report_->boundary <= decided_boundary_ ||
      report_->boundary <= committed_boundary_)
    return;
  const int lowest = contributors ? std::countr_zero(contributors) : -1;
  if (lowest != self) return;
  const auto& mine = att[static_cast<size_t>(self)];
  if (mine.is_null() || !mine.contains("report") ||
      mine["report"].value("boundary", int64_t{-1}) != report_->boundary ||
      mine["report"].value("epoch", int64_t{-1}) != report_->epoch)
    return;  // a round launched before this boundary
  std::vector<nlohmann::json> reports;
  for (int s = 0; s < S; ++s) {
    const auto& j = att[static_cast<size_t>(s)];
    if (j.is_null() || !j.contains("report")) continue;
    const auto& r = j["report"];
    if (r.value("epoch", int64_t{-1}) == report_->epoch && r.value("boundary", int64_t{-1}) == report_->boundary)
      reports.push_back(r);
  }
  decided_boundary_ = report_->boundary;
  if (auto d = decide(reports, report_->boundary, plan)) decision_ = Decided{plan.epoch, report_->boundary, *d};
}

std::optional<PlanDecision> PlanCoordinator::decide(const std::vector<nlohmann::json>& reports, int64_t index,
                                                    const PlanDecision& plan) const {
  // Sync time: the smallest site's (a site that reached the sync first also waited for the
  // others; the last one to arrive measures the transfer). Step time: the slowest.
  bool any_drift = false;
  double min_sync = 0, max_step = 0;
  try {
    for (const auto& r : reports) {
      any_drift = any_drift || r.at("drift").get<bool>();
      const double v = r.at("sync_s").get<double>();
      if (v > 0) min_sync = min_sync > 0 ? std::min(min_sync, v) : v;
      max_step = std::max(max_step, r.at("step_s").get<double>());
    }
  } catch (const nlohmann::json::exception& x) {
    spdlog::warn("outer plan: a malformed report at boundary {} ({}); no decision", index, x.what());
    return std::nullopt;
  }
  if (!any_drift || max_step <= 0) return std::nullopt;
  PlanRequest req = request(plan.path, max_step, plan.capacity_scale, plan.local_sync_s);
  const double scale = min_sync > 0 ? calibrated_capacity_scale(req, plan, min_sync) : plan.capacity_scale;
  PlanDecision n = choose_plan(request(plan.path, max_step, scale, plan.local_sync_s));
  n.epoch = n.same_schedule(plan) ? plan.epoch : plan.epoch + 1;
  // A recalibration that moves the prediction by less than half the threshold is noise.
  const bool minor =
      n.same_schedule(plan) &&
      !drifted(plan.predicted_fragment_sync_s, n.predicted_fragment_sync_s, ocfg_.replan_threshold / 2) &&
      !drifted(plan.step_time_s, n.step_time_s, ocfg_.replan_threshold / 2);
  if (minor) return std::nullopt;
  n.reason = fmt::format(
      "Re-planned by {} at boundary {} from {} site report(s): measured fragment sync {:.1f} ms (plan {:.1f} ms), "
      "step {:.1f} ms (plan {:.1f} ms), threshold {:.0f}%. {}",
      opt_.name(), index, reports.size(), min_sync * 1e3, plan.predicted_fragment_sync_s * 1e3, max_step * 1e3,
      plan.step_time_s * 1e3, ocfg_.replan_threshold * 100, n.reason);
  return n;
}

void PlanCoordinator::restart() {
  report_.reset();
  decision_.reset();
  due_.reset();
  committed_boundary_ = 0;
  decided_boundary_ = 0;
}

std::string PlanCoordinator::save(bool shared) const {
  if (peers_.rank() != 0) return "";
  nlohmann::json j = {{"committed_boundary", committed_boundary_}};
  if (due_) j["due"] = due_->to_json();
  if (shared) return j.dump();
  j["decided_boundary"] = decided_boundary_;
  if (report_) j["report"] = report_->to_json();
  if (decision_) j["decision"] = decision_->to_json();
  return j.dump();
}

void PlanCoordinator::restore(const std::string& text, const std::string& source, bool joining) {
  restart();
  if (text.empty()) return;
  const auto j = nlohmann::json::parse(text, nullptr, false);
  auto fail = [&](const std::string& why) { throw FileError(source, "outer.plan_protocol: " + why); };
  if (!j.is_object()) fail("not a JSON object");
  try {
    committed_boundary_ = j.at("committed_boundary").get<int64_t>();
    if (j.contains("due")) due_ = Decided::from_json(j["due"], source);
    if (joining) return;  // what every member knows; the donor's own report and decision stay its own
    decided_boundary_ = j.at("decided_boundary").get<int64_t>();
    if (j.contains("decision")) decision_ = Decided::from_json(j["decision"], source);
    if (j.contains("report")) report_ = Report::from_json(j["report"]);
  } catch (const nlohmann::json::exception& e) {
    fail(e.what());
  }
}

}  // namespace geoloco::outer
