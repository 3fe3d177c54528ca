// Transport counters as JSON for summary.json (stats.hpp).
#include "transport/stats.hpp"

#include <nlohmann/json.hpp>

namespace geoloco::transport {

nlohmann::json TransportStats::to_json() const {
  nlohmann::json j;
  j["handshakes_refused"] = handshakes_refused;
  j["gate_refused"] = gate_refused;
  j["frames_rejected_unauthenticated"] = frames_rejected_unauthenticated;
  j["peers"] = nlohmann::json::array();
  for (const auto& p : peers) {
    j["peers"].push_back({{"site", p.site},
                          {"rank", p.rank},
                          {"bytes_sent", p.bytes_sent},
                          {"bytes_received", p.bytes_received},
                          {"frames_sent", p.frames_sent},
                          {"frames_received", p.frames_received},
                          {"frames_rejected", p.frames_rejected},
                          {"frames_received_rndv", p.frames_received_rndv},
                          {"frames_discarded", p.frames_discarded},
                          {"messages_sent_eager", p.messages_sent_eager},
                          {"eager_bytes_outstanding", p.eager_bytes_outstanding},
                          {"ops_cancelled", p.ops_cancelled},
                          {"lane_bytes_sent", p.lane_bytes_sent},
                          {"failure", p.failure}});
  }
  return j;
}

}  // namespace geoloco::transport
