#include "trainer/parallel/collective.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>

#include "trainer/parallel/errors.hpp"

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

std::unique_ptr<Collective> Collective::split(int, int, const std::string& label) {
  throw CollectiveError(fmt::format("site {} rank {}: the {} backend cannot split into subgroups ({})", site(), rank(),
                                    backend(), label));
}

SplitMembers split_members(Collective& parent, int color, int key) {
  if (color < 0)
    throw CollectiveError(
        fmt::format("site {} rank {}: split color {} is negative", parent.site(), parent.rank(), color));
  const int32_t mine[2] = {color, key};
  const auto all = parent.all_gather_bytes(std::as_bytes(std::span<const int32_t>(mine, 2)));
  std::vector<std::pair<int32_t, int>> same;  // (key, parent rank)
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].size() != sizeof(mine))
      throw CollectiveError(fmt::format("site {} rank {}: split: rank {} sent {} bytes, expected {}", parent.site(),
                                        parent.rank(), r, all[r].size(), sizeof(mine)));
    int32_t theirs[2];
    std::memcpy(theirs, all[r].data(), sizeof(theirs));
    if (theirs[0] == color) same.emplace_back(theirs[1], static_cast<int>(r));
  }
  std::sort(same.begin(), same.end());
  SplitMembers m;
  for (const auto& [k, r] : same) {
    if (r == parent.rank()) m.index = static_cast<int>(m.parent_ranks.size());
    m.parent_ranks.push_back(r);
  }
  return m;
}

}  // namespace geoloco::parallel
