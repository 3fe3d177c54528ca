// The seam's small parts: ModelParams' checks, a one-rank site's exchange, OuterOptions'
// validation (site.hpp, outer_options.hpp).
#include "outer_optimizer/outer_options.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.hpp"

namespace geoloco::outer {

int ModelParams::blocks() const {
  int b = 0;
  for (const auto& t : tensors) b = std::max(b, t.block + 1);
  return b;
}

void ModelParams::validate() const {
  int64_t at = 0;
  for (const auto& t : tensors) {
    if (t.rows < 1 || t.cols < 0 || t.block < -1)
      throw Error(
          fmt::format("model parameters: tensor '{}' has {} rows of {} (block {})", t.name, t.rows, t.cols, t.block));
    if (t.offset != at)
      throw Error(fmt::format("model parameters: tensor '{}' starts at {}, but the tensors before it end at {}", t.name,
                              t.offset, at));
    at += t.numel();
  }
  if (at != total) throw Error(fmt::format("model parameters: the tensors cover {} elements of {}", at, total));
}

std::vector<std::vector<std::byte>> Site::all_gather(std::span<const std::byte> mine) {
  GEOLOCO_CHECK_EQ(ranks(), 1, "a site of several ranks without an all-gather");
  return {std::vector<std::byte>(mine.begin(), mine.end())};
}

void OuterOptions::validate() const {
  if (sites.empty()) throw ConfigError("outer loop: no site");
  if (sites.size() > 64) throw ConfigError(fmt::format("outer loop: {} sites, at most 64", sites.size()));
  for (const auto& s : sites)
    if (s.ranks < 1) throw ConfigError(fmt::format("outer loop: site {} has {} ranks", s.name, s.ranks));
  if (site < 0 || site >= site_count()) throw ConfigError(fmt::format("outer loop: site {} of {}", site, sites.size()));
  if (rank < 0 || rank >= sites[static_cast<size_t>(site)].ranks)
    throw ConfigError(
        fmt::format("outer loop: rank {} of site {} ({} ranks)", rank, name(), sites[static_cast<size_t>(site)].ranks));
  if (total_steps < 1) throw ConfigError(fmt::format("outer loop: {} inner steps", total_steps));
  params.validate();
}

}  // namespace geoloco::outer
