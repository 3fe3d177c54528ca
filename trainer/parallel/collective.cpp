#include "trainer/parallel/collective.hpp"

#include <nlohmann/json.hpp>

namespace geoloco::parallel {

const char* kind_name(CollectiveKind k) {
  switch (k) {
    case CollectiveKind::kAllReduce: return "all_reduce";
    case CollectiveKind::kReduceScatter: return "reduce_scatter";
    case CollectiveKind::kAllGather: return "all_gather";
    case CollectiveKind::kBroadcast: return "broadcast";
    case CollectiveKind::kBarrier: return "barrier";
    case CollectiveKind::kAllGatherBytes: return "all_gather_bytes";
    case CollectiveKind::kCount: break;
  }
  return "?";
}

uint64_t CollectiveStats::total_bytes_sent() const {
  uint64_t t = 0;
  for (const auto& k : by_kind) t += k.bytes_sent;
  return t;
}

nlohmann::json CollectiveStats::to_json() const {
  nlohmann::json j = nlohmann::json::object();
  for (int i = 0; i < static_cast<int>(CollectiveKind::kCount); ++i) {
    const auto& s = by_kind[static_cast<size_t>(i)];
    j[kind_name(static_cast<CollectiveKind>(i))] = {
        {"calls", s.calls}, {"bytes_sent", s.bytes_sent}, {"payload_bytes", s.payload_bytes}, {"seconds", s.seconds}};
  }
  j["total_bytes_sent"] = total_bytes_sent();
  return j;
}

}  // namespace geoloco::parallel
