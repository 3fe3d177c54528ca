// The contract between the launcher and a worker process: which site and rank it is. The
// launcher passes it in GEOLOCO_* environment variables (like torchrun's RANK/WORLD_SIZE);
// under Slurm the same placement comes from env_rank_from_slurm() instead.
//
//   GEOLOCO_SITE         site name            GEOLOCO_SITE_INDEX   index in the config's site list
//   GEOLOCO_RANK         rank in the site     GEOLOCO_SITE_SIZE    ranks in the site
//   GEOLOCO_GLOBAL_RANK  rank over all sites  GEOLOCO_WORLD_SIZE   ranks over all sites
//   GEOLOCO_LOCAL_RANK   index on this machine (GPU choice)
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "trainer/launch/launcher.hpp"
#include "trainer/launch/slurm_env.hpp"

namespace geoloco::launch {

struct RankEnv {
  std::string site;
  int site_index = 0;
  int rank = 0;
  int site_size = 1;
  int global_rank = 0;
  int world_size = 1;
  int local_rank = 0;

  std::vector<std::pair<std::string, std::string>> to_env() const;
  // Reads the variables above (the process environment by default). Throws InputError naming
  // a missing or malformed variable, or inconsistent values (rank >= site size, ...).
  static RankEnv from_env(const EnvLookup& env = {});
};

struct SiteRanks {
  std::string name;
  int ranks = 1;
};

// One ProcessSpec per rank of every site, all on this machine: label "site/rank", argv as
// given, GEOLOCO_* variables set; global ranks enumerate sites in order (as under Slurm),
// local rank = global rank. Throws InputError for an empty site list, a site with < 1 rank,
// an empty or duplicate site name, or a name with '/' (it would make labels ambiguous).
std::vector<ProcessSpec> local_processes(const std::vector<SiteRanks>& sites, const std::vector<std::string>& argv);

}  // namespace geoloco::launch
