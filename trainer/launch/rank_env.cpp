// The launcher->worker environment contract: the GEOLOCO_* variables a worker reads and
// local_processes() sets (rank_env.hpp).
#include "trainer/launch/rank_env.hpp"

#include <fmt/format.h>

#include <charconv>
#include <cstdlib>
#include <set>

#include "core/error.hpp"

namespace geoloco::launch {
namespace {

const char* lookup(const EnvLookup& env, const char* name) {
  const char* v = env ? env(name) : std::getenv(name);
  if (v == nullptr || *v == '\0')
    throw InputError(fmt::format("{} is not set: start workers with `geoloco launch` (or srun)", name));
  return v;
}

int lookup_int(const EnvLookup& env, const char* name) {
  const char* v = lookup(env, name);
  int out = 0;
  const char* end = v + std::char_traits<char>::length(v);
  auto [p, ec] = std::from_chars(v, end, out);
  if (ec != std::errc() || p != end || out < 0)
    throw InputError(fmt::format("{}='{}' is not a non-negative integer", name, v));
  return out;
}

}  // namespace

std::vector<std::pair<std::string, std::string>> RankEnv::to_env() const {
  return {{"GEOLOCO_SITE", site},
          {"GEOLOCO_SITE_INDEX", std::to_string(site_index)},
          {"GEOLOCO_RANK", std::to_string(rank)},
          {"GEOLOCO_SITE_SIZE", std::to_string(site_size)},
          {"GEOLOCO_GLOBAL_RANK", std::to_string(global_rank)},
          {"GEOLOCO_WORLD_SIZE", std::to_string(world_size)},
          {"GEOLOCO_LOCAL_RANK", std::to_string(local_rank)}};
}

RankEnv RankEnv::from_env(const EnvLookup& env) {
  RankEnv r;
  r.site = lookup(env, "GEOLOCO_SITE");
  r.site_index = lookup_int(env, "GEOLOCO_SITE_INDEX");
  r.rank = lookup_int(env, "GEOLOCO_RANK");
  r.site_size = lookup_int(env, "GEOLOCO_SITE_SIZE");
  r.global_rank = lookup_int(env, "GEOLOCO_GLOBAL_RANK");
  r.world_size = lookup_int(env, "GEOLOCO_WORLD_SIZE");
  r.local_rank = lookup_int(env, "GEOLOCO_LOCAL_RANK");
  if (r.site_size < 1 || r.rank >= r.site_size)
    throw InputError(fmt::format("GEOLOCO_RANK={} is outside [0, GEOLOCO_SITE_SIZE={})", r.rank, r.site_size));
  if (r.world_size < r.site_size || r.global_rank >= r.world_size)
    throw InputError(fmt::format("GEOLOCO_GLOBAL_RANK={} / GEOLOCO_WORLD_SIZE={} are inconsistent with site size {}",
                                 r.global_rank, r.world_size, r.site_size));
  return r;
}

std::vector<ProcessSpec> local_processes(const std::vector<SiteRanks>& sites, const std::vector<std::string>& argv) {
  if (sites.empty()) throw InputError("launch: the config names no sites");
  if (argv.empty()) throw InputError("launch: empty worker command line");
  std::set<std::string> names;
  int world = 0;
  for (const auto& s : sites) {
    if (s.name.empty() || s.name.find('/') != std::string::npos)
      throw InputError(fmt::format("launch: site name '{}' must be non-empty and contain no '/'", s.name));
    if (!names.insert(s.name).second) throw InputError(fmt::format("launch: site name '{}' is used twice", s.name));
    if (s.ranks < 1)
      throw InputError(fmt::format("launch: site {} has {} ranks; it needs at least 1", s.name, s.ranks));
    world += s.ranks;
  }
  std::vector<ProcessSpec> out;
  int g = 0;
  for (size_t i = 0; i < sites.size(); ++i) {
    for (int r = 0; r < sites[i].ranks; ++r, ++g) {
      RankEnv e{sites[i].name, static_cast<int>(i), r, sites[i].ranks, g, world, g};
      out.push_back({fmt::format("{}/{}", sites[i].name, r), argv, e.to_env(), sites[i].name, {}, {}});
    }
  }
  return out;
}

}  // namespace geoloco::launch
