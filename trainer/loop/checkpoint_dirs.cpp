// A site's checkpoint directory: names, pruning, common steps, the --resume choice
// (checkpoint_dirs.hpp).
#include "trainer/loop/checkpoint_dirs.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/atomic_file.hpp"
#include "core/error.hpp"

namespace fs = std::filesystem;

namespace geoloco::trainer {

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }

std::optional<int64_t> step_of_dir_name(const std::string& n) {
  if (n.size() < 6 || n.size() > 23 || n.rfind("step_", 0) != 0 ||
      n.find_first_not_of("0123456789", 5) != std::string::npos)
    return std::nullopt;
  return std::stoll(n.substr(5));
}

void prune_step_dirs(const fs::path& dir, int keep) {
  std::vector<fs::path> dirs;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && step_of_dir_name(e.path().filename().string())) dirs.push_back(e.path());
  std::sort(dirs.begin(), dirs.end());
  while (static_cast<int>(dirs.size()) > keep) {
    fs::remove_all(dirs.front());
    dirs.erase(dirs.begin());
  }
}

std::vector<int64_t> local_steps(const fs::path& dir, const std::string& state_file) {
  std::vector<int64_t> steps;
  for (const auto& e : fs::directory_iterator(dir))
    if (const auto at = step_of_dir_name(e.path().filename().string());
        at && e.is_directory() && fs::exists(e.path() / state_file))
      steps.push_back(*at);
  std::sort(steps.begin(), steps.end());
  return steps;
}

std::vector<int64_t> common_steps(std::vector<int64_t> common, const std::vector<std::vector<std::byte>>& gathered) {
  for (const auto& b : gathered) {
    std::vector<int64_t> theirs(b.size() / sizeof(int64_t));
    std::memcpy(theirs.data(), b.data(), theirs.size() * sizeof(int64_t));
    std::vector<int64_t> both;
    std::set_intersection(common.begin(), common.end(), theirs.begin(), theirs.end(), std::back_inserter(both));
    common = std::move(both);
  }
  return common;
}

// After a site died, the others may hold later checkpoints (written at a lost quorum) than it:
// newer checkpoints of this site are moved aside (their rounds were never committed by every
// site), and `latest` names the one restored.
fs::path resume_directory(const fs::path& dir, const ResumeChoice& c) {
  const fs::path latest = dir / "latest";
  std::string name;
  if (fs::exists(latest)) {
    std::ifstream in(latest);
    std::getline(in, name);
    if (!step_of_dir_name(name) || !fs::is_directory(dir / name))
      throw FileError(latest.string(), fmt::format("names '{}', which is not a checkpoint directory", name));
  }
  if (!c.several_sites) return name.empty() ? fs::path() : dir / name;
  std::vector<int64_t> steps = c.site_steps();
  // Nothing past `latest` counts: a directory written after it is a checkpoint cut short.
  const std::optional<int64_t> latest_step = step_of_dir_name(name);
  std::erase_if(steps, [&](int64_t s) { return !latest_step || s > *latest_step; });
  const int64_t chosen = c.agree(steps);
  if (chosen < 0) return {};
  const std::string chosen_name = step_dir_name(chosen);
  if (chosen_name != name) {
    c.log(fmt::format(
        "--resume: step {} is the newest checkpoint every site holds; this site's newer ones ({}) are moved to {}",
        chosen, name, (dir / "discarded").string()));
    c.barrier();
    if (c.rank == 0) {
      fs::create_directories(dir / "discarded");
      for (const auto& e : fs::directory_iterator(dir))
        if (const auto at = step_of_dir_name(e.path().filename().string()); at && *at > chosen && e.is_directory())
          fs::rename(e.path(), dir / "discarded" / e.path().filename());
      write_text_atomically(latest.string(), chosen_name + "\n");
    }
    c.barrier();
  }
  return dir / chosen_name;
}

}  // namespace geoloco::trainer
