// Mapping a Slurm task to (site, rank in site). One Slurm task = one rank. Global rank g
// enumerates the sites in config order with each site's ranks contiguous:
//
//   sites: [paris: 2 ranks, tokyo: 3 ranks]
//   g = SLURM_PROCID:   0        1        2        3        4
//   (site, rank):       paris/0  paris/1  tokyo/0  tokyo/1  tokyo/2
//
// SLURM_NTASKS must equal the total rank count. SLURM_LOCALID (the task's index on its node,
// used to pick the GPU) and SLURM_NODEID are reported as-is (-1 when unset).
// See trainer/launch/README.md for an sbatch example.
#pragma once

#include <functional>
#include <span>
#include <string>

namespace geoloco::launch {

struct SitePlacement {
  int site_index = 0;    // index into the config's site list
  int rank_in_site = 0;
};

struct SlurmPlacement {
  int global_rank = 0;   // SLURM_PROCID
  int world_size = 0;    // SLURM_NTASKS
  int site_index = 0;
  int rank_in_site = 0;
  int local_id = -1;     // SLURM_LOCALID
  int node_id = -1;      // SLURM_NODEID
};

// Pure mapping. Throws InputError when g is outside [0, sum of counts) or a count is < 1.
SitePlacement site_of_global_rank(int global_rank, std::span<const int> site_rank_counts);

using EnvLookup = std::function<const char*(const char*)>;

// Reads SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID / SLURM_NODEID via `env` (the process
// environment by default). Throws InputError naming the variable when one is missing or not
// an integer, or when SLURM_NTASKS differs from the config's total rank count.
SlurmPlacement env_rank_from_slurm(std::span<const int> site_rank_counts, const EnvLookup& env = {});

}  // namespace geoloco::launch
