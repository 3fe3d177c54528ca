// Slurm task -> (site, rank in site): SLURM_* variables read and checked against the sites'
// rank counts (slurm_env.hpp).
#include "trainer/launch/slurm_env.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <charconv>
#include <cstdlib>
#include <optional>

#include "core/error.hpp"

namespace geoloco::launch {

SitePlacement site_of_global_rank(int global_rank, std::span<const int> counts) {
  int64_t total = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (counts[i] < 1) throw InputError(fmt::format("site {} has {} ranks; every site needs at least 1", i, counts[i]));
    total += counts[i];
  }
  if (global_rank < 0 || global_rank >= total)
    throw InputError(fmt::format("global rank {} is outside [0, {}) (sites have {} ranks)", global_rank, total,
                                 fmt::join(counts, " + ")));
  int g = global_rank;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (g < counts[i]) return {static_cast<int>(i), g};
    g -= counts[i];
  }
  throw InputError("unreachable: global rank mapping");  // total check above makes this impossible
}

namespace {

std::optional<int> read_int(const EnvLookup& env, const char* name, bool required) {
  const char* v = env ? env(name) : std::getenv(name);
  if (v == nullptr || *v == '\0') {
    if (required)
      throw InputError(fmt::format("not running as a Slurm task: {} is not set (start ranks with srun)", name));
    return std::nullopt;
  }
  int out = 0;
  const char* end = v + std::char_traits<char>::length(v);
  auto [p, ec] = std::from_chars(v, end, out);
  if (ec != std::errc() || p != end || out < 0)
    throw InputError(fmt::format("Slurm variable {}='{}' is not a non-negative integer", name, v));
  return out;
}

}  // namespace

SlurmPlacement env_rank_from_slurm(std::span<const int> counts, const EnvLookup& env) {
  SlurmPlacement p;
  p.global_rank = *read_int(env, "SLURM_PROCID", true);
  p.world_size = *read_int(env, "SLURM_NTASKS", true);
  p.local_id = read_int(env, "SLURM_LOCALID", false).value_or(-1);
  p.node_id = read_int(env, "SLURM_NODEID", false).value_or(-1);
  int64_t total = 0;
  for (int c : counts) total += c;
  if (p.world_size != total)
    throw InputError(
        fmt::format("Slurm started {} tasks (SLURM_NTASKS) but the config's sites have {} = {} ranks; "
                    "use srun -n {}",
                    p.world_size, fmt::join(counts, " + "), total, total));
  SitePlacement s = site_of_global_rank(p.global_rank, counts);
  p.site_index = s.site_index;
  p.rank_in_site = s.rank_in_site;
  return p;
}

}  // namespace geoloco::launch
