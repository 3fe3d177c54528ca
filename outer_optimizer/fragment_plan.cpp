// Streaming fragments: the partition of the parameters and the staggered schedule (fragment_plan.hpp).
#include "outer_optimizer/fragment_plan.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.hpp"

namespace geoloco::outer {

int64_t FragmentPlan::elements() const {
  int64_t n = 0;
  for (const auto& r : ranges) n += r.size();
  return n;
}

std::string FragmentPlan::describe() const {
  return fmt::format("fragment {} (offset {}): blocks {} + embedding rows, {} params", index, offset,
                     blocks.empty() ? std::string("none") : fmt::format("{}", fmt::join(blocks, ",")), elements());
}

namespace {

// Sorts and merges adjacent ranges.
std::vector<Range> normalize(std::vector<Range> v) {
  std::sort(v.begin(), v.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  std::vector<Range> out;
  for (const auto& r : v) {
    if (r.size() <= 0) continue;
    if (!out.empty() && out.back().end == r.begin)
      out.back().end = r.end;
    else
      out.push_back(r);
  }
  return out;
}

// Rows [f*R/F, (f+1)*R/F) of a (R, C) table at `offset`.
Range rows(int64_t offset, int64_t R, int64_t C, int f, int F) {
  const int64_t r0 = R * f / F, r1 = R * (f + 1) / F;
  return {offset + r0 * C, offset + r1 * C};
}

}  // namespace

std::vector<FragmentPlan> plan_fragments(const ModelParams& params, int F, int64_t interval) {
  const int blocks = params.blocks();
  if (F < 1) throw ConfigError(fmt::format("outer.fragments: got {}, expected at least 1", F));
  if (F > std::max(blocks, 1))
    throw ConfigError(fmt::format(
        "outer.fragments: got {}, but the model has {} blocks (a fragment holds at least one block)", F, blocks));
  if (F > interval)
    throw ConfigError(
        fmt::format("outer.fragments: got {}, but outer.interval is {} (fragments sync at distinct steps "
                    "of each period)",
                    F, interval));
  std::vector<FragmentPlan> plans(static_cast<size_t>(F));
  for (int f = 0; f < F; ++f) {
    auto& p = plans[static_cast<size_t>(f)];
    p.index = f;
    p.offset = (static_cast<int64_t>(f + 1) * interval / F) % interval;
  }
  // Matrices outside the blocks: F chunks of whole rows each.
  for (const auto& t : params.tensors)
    if (t.block < 0 && t.rows > 1)
      for (int f = 0; f < F; ++f) plans[static_cast<size_t>(f)].ranges.push_back(rows(t.offset, t.rows, t.cols, f, F));
  // Blocks, strided over depth.
  for (const auto& t : params.tensors) {
    if (t.block < 0) continue;
    auto& p = plans[static_cast<size_t>(t.block % F)];
    p.ranges.push_back({t.offset, t.offset + t.numel()});
    if (p.blocks.empty() || p.blocks.back() != t.block) p.blocks.push_back(t.block);
  }
  // The vectors outside the blocks, together, to the smallest fragment; ties to the lowest index.
  auto smallest = std::min_element(plans.begin(), plans.end(), [](const FragmentPlan& a, const FragmentPlan& b) {
    return a.elements() < b.elements();
  });
  for (const auto& t : params.tensors)
    if (t.block < 0 && t.rows <= 1 && t.numel() > 0) smallest->ranges.push_back({t.offset, t.offset + t.numel()});
  for (auto& p : plans) p.ranges = normalize(std::move(p.ranges));
  return plans;
}

std::vector<Range> intersect(const std::vector<Range>& ranges, ShardRange shard) {
  std::vector<Range> out;
  for (const auto& r : ranges) {
    const int64_t b = std::max(r.begin, shard.offset), e = std::min(r.end, shard.end());
    if (b < e) out.push_back({b - shard.offset, e - shard.offset});
  }
  return out;
}

bool syncs_at(const FragmentPlan& plan, int64_t step, int64_t interval) {
  return step > 0 && step % interval == plan.offset;
}

}  // namespace geoloco::outer
