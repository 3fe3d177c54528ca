// The rules of a site's checkpoint directory, shared by every inner loop's checkpoints (the
// native trainer's rank_checkpoints.hpp, the Python package's python/native/session_checkpoints.hpp):
// step directories and their names, pruning to the newest, the steps every rank of the site
// holds, and the directory --resume restores (the newest every site holds; newer ones moved
// aside into discarded/, `latest` rewritten).
//
//   checkpoints/<site>/step_<N>/...       one checkpoint (N zero-padded to 8 digits)
//   checkpoints/<site>/latest             the newest complete one's directory name
//   checkpoints/<site>/discarded/         newer checkpoints --resume set aside
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace geoloco::trainer {

std::string step_dir_name(int64_t step);
// The step a directory name is for (step_dir_name's inverse), or nothing.
std::optional<int64_t> step_of_dir_name(const std::string& name);

// Removes the oldest step directories under `dir` beyond the newest `keep`.
void prune_step_dirs(const std::filesystem::path& dir, int keep);

// The steps whose directory under `dir` holds `state_file` (this rank's), ascending.
std::vector<int64_t> local_steps(const std::filesystem::path& dir, const std::string& state_file);
// The steps in `mine` and in every part of `gathered` (each rank's local_steps as int64 bytes).
std::vector<int64_t> common_steps(std::vector<int64_t> mine, const std::vector<std::vector<std::byte>>& gathered);

// What choosing the --resume directory needs of the rank's site and of the other sites.
struct ResumeChoice {
  bool several_sites = false;
  int rank = 0;
  // The steps every rank of the site holds (collective over the site).
  std::function<std::vector<int64_t>()> site_steps;
  // The newest of these steps every site holds, or -1 (the outer loop's agreement; collective).
  std::function<int64_t(const std::vector<int64_t>&)> agree;
  std::function<void()> barrier;                // over the site's ranks
  std::function<void(const std::string&)> log;  // a line (the site's rank 0 logs)
};
// The checkpoint --resume restores under `dir` (checkpoints/<site>): `latest`, or with other
// sites the newest step every site holds; empty: none. Throws FileError for a `latest` that
// names no checkpoint directory.
std::filesystem::path resume_directory(const std::filesystem::path& dir, const ResumeChoice& c);

}  // namespace geoloco::trainer
