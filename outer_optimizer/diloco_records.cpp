// What Diloco reports: the fields of each metrics line, each finished round's record, the
// summary and the outer loop's memory, from its books (outer_books.hpp) and its schedule.
#include "core/hash.hpp"
#include "outer_optimizer/diloco.hpp"

namespace geoloco::outer {

nlohmann::json Diloco::metrics() {
  nlohmann::json j;
  j["outer_step"] = round_;
  j["sync_s"] = books_.last_sync_s();
  j["global_hash"] = hex64(site_hash_);
  if (auto* t = peers_.transport()) {
    uint64_t sent = 0;
    for (auto& p : t->stats().peers) sent += p.bytes_sent;
    j["wan_bytes_sent"] = sent;
  }
  return j;
}

void Diloco::record_round(const Fragment& f, int64_t step, uint64_t round, double seconds, const ExchangeResult& r) {
  nlohmann::json j = {{"round", round},
                      {"fragment", f.state.index},
                      {"step", step},
                      {"sync_s", seconds},
                      {"bytes_per_peer", r.envelope_bytes},
                      {"sent_bytes", r.sent_bytes},
                      {"frame_bytes", r.frame_bytes},
                      {"elements", r.elements},
                      {"compression_ratio", r.ratio},
                      {"err2", r.err2},
                      {"ref2", r.ref2},
                      {"plan_epoch", plan_.epoch},
                      {"members", books_.member_names(r.members)},
                      {"joiners", books_.member_names(r.joiners)},
                      {"wait_s", r.wait_s},
                      {"membership_s", r.membership_s},
                      {"tokens", r.tokens},
                      {"global_hash", hex64(site_hash_)}};
  if (pace_.enabled()) {
    j["pace"] = pace_.json(interval_);
    j["pace"]["step_us"] = r.step_us;
  }
  if (plan_.predicted_fragment_sync_s > 0) j["predicted_sync_s"] = plan_.predicted_fragment_sync_s;
  if (auto* t = peers_.transport()) {
    nlohmann::json peers = nlohmann::json::array();
    for (const auto& p : t->stats().peers)
      peers.push_back({{"site", p.site},
                       {"rank", p.rank},
                       {"bytes_sent", p.bytes_sent},
                       {"bytes_received", p.bytes_received},
                       {"lane_bytes_sent", p.lane_bytes_sent}});
    j["peers"] = std::move(peers);
  }
  books_.record(std::move(j));
}

nlohmann::json Diloco::summary() {
  nlohmann::json j;
  j["outer_steps"] = round_;
  j["outer_interval"] = interval_;
  j["outer_fragments"] = frags_.size();
  j["outer_overlap_steps"] = tau();
  j["outer_delayed_update"] = ocfg_.delayed_update;
  j["outer_optimizer"] = name(ocfg_.optimizer.kind);
  j["compression"] = pcfg_.describe();
  j["outer_plan"] = name(ocfg_.plan);
  if (ocfg_.auto_plan()) {
    nlohmann::json plans = nlohmann::json::array();
    for (const auto& p : plan_history_) plans.push_back(p.to_json());
    j["plans"] = plans;
    j["replans"] = planner_.replans();
    j["plan_recalibrations"] = planner_.recalibrations();
  }
  j["outer_pace"] = name(ocfg_.pace);
  j["outer_exchange"] = name(exchange_->kind());  // in force at the end (exchange: auto: the plan's)
  if (pace_.enabled()) {
    j["pace"] = pace_.json(interval_);
    j["pace"]["trained_steps"] = books_.trained_steps();
    j["pace"]["decisions"] = pace_.history();
  }
  j.update(books_.sync_json(round_, frags_.size()));
  nlohmann::json fr = nlohmann::json::array();
  for (size_t i = 0; i < plans_.size(); ++i)
    fr.push_back({{"index", plans_[i].index},
                  {"offset", plans_[i].offset},
                  {"blocks", plans_[i].blocks},
                  {"params", plans_[i].elements()},
                  {"shard_elements", frags_[i]->state.n}});
  j["fragments"] = fr;
  uint64_t sent = 0, recv = 0;
  if (auto* t = peers_.transport()) {
    auto st = t->stats();
    for (auto& p : st.peers) {
      sent += p.bytes_sent;
      recv += p.bytes_received;
    }
    j["transport"] = st.to_json();
  }
  j["wan_bytes_sent"] = sent;
  j["wan_bytes_received"] = recv;
  j["global_weights_hash"] = hex64(site_hash_);
  j["outer_memory"] = memory_json();
  if (gpu_site_) {
    // What the rounds' snapshots copied from the device: scales and codes (quantized there),
    // or the fp32 shard part; and what fp32 staging copies for the same rounds.
    j["outer_quantize_on"] = store_->on_device() ? "device" : "host";
    j.update(books_.snapshot_json());
  }
  nlohmann::json ev = nlohmann::json::array();
  for (const auto& e : membership_.evictions())
    ev.push_back({{"round", e.round}, {"step", e.step}, {"site", opt_.site_name(e.site)}, {"why", e.why}});
  j["membership"] = {{"min_sites", membership_.quorum()},
                     {"members", books_.member_names(membership_.members())},
                     {"evictions", ev},
                     {"joins", joins_json()},
                     {"tokens", books_.tokens_json()}};
  if (!joins_.own.is_null()) j["membership"]["joined"] = joins_.own;
  return j;
}

nlohmann::json Diloco::memory_json() const {
  // Host bytes the outer loop holds for this rank's shard, by what they are: kept between
  // rounds (global weights, the outer optimizer's state, the error-feedback residual) and, at
  // their peak, the rounds' own buffers (round_buffers.hpp: 12 bytes per element of a fragment
  // in flight).
  uint64_t elements = 0, global = 0, optimizer = 0, residual = 0;
  for (const auto& frag : frags_) {
    const FragmentState& f = frag->state;
    elements += f.n;
    global += f.global.capacity();
    if (f.opt) optimizer += f.opt->state_size();
    if (f.ef) residual += f.ef->residual().size();
    // outer.exchange: owner: the owners' residual and the round's (owner_next) while it is decided.
    if (f.owner_ef) residual += f.owner_ef->residual().size() + frag->round.owner_next.capacity();
  }
  const uint64_t kept = (global + optimizer + residual) * sizeof(float), round = buffers_.peak_bytes();
  const double per = elements ? 1.0 / double(elements) : 0.0;
  return {{"shard_elements", elements},
          {"global_bytes", global * sizeof(float)},
          {"optimizer_bytes", optimizer * sizeof(float)},
          {"error_feedback_bytes", residual * sizeof(float)},
          {"round_buffer_bytes", round},
          {"kept_bytes_per_param", double(kept) * per},
          {"round_bytes_per_param", double(round) * per},
          {"bytes_per_param", double(kept + round) * per},
          // Quantized on the device (outer.quantize_on): the fragments' global weights and
          // residuals there, and the round's scratch (device_outer.hpp).
          {"device_bytes", device_ ? device_->device_bytes() : 0},
          {"device_bytes_per_param", device_ ? double(device_->device_bytes()) * per : 0.0}};
}

}  // namespace geoloco::outer
