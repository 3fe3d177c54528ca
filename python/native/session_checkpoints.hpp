// SessionCheckpoints: the checkpoints of one rank whose inner loop is another program's (the
// Python package): its shard of the parameters, the program's inner state as it gave it (bytes:
// its optimizer's and scheduler's state_dict), and the outer loop's state; on --resume the step
// every site holds (the outer loop's agreement) restored. The native trainer's layout and rules
// (trainer/loop/rank_checkpoints.hpp):
//
//   checkpoints/<site>/step_<N>/state.r<r>.safetensors   params.shard, inner, outer.* (checksummed)
//   checkpoints/<site>/latest                             the newest complete checkpoint
//   checkpoints/<site>/discarded/                         newer checkpoints --resume set aside
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "python/native/host_site.hpp"

namespace geoloco {
namespace trainer {
struct RunConfig;
struct SiteConfig;
}  // namespace trainer
namespace outer {
class Diloco;
}

namespace python {

class SessionCheckpoints {
 public:
  // Everything outlives this; `layout` is the parameters' layout hash (a checkpoint of other
  // parameters is refused); `log` prints a line (the site's rank 0 logs).
  SessionCheckpoints(const trainer::RunConfig& cfg, int site, int rank, HostSite& host, uint64_t layout,
                     std::function<void(const std::string&)> log);

  // A checkpoint at `step` (every rank of the site: collectives inside).
  void save(int64_t step, std::span<const uint8_t> inner, outer::Diloco& outer);

  struct Restored {
    int64_t step = 0;
    std::vector<uint8_t> inner;
  };
  // --resume: the checkpoint every site holds, restored into the parameters and the outer
  // loop; nothing when there is none (a fresh start). Collective over the site and the sites.
  std::optional<Restored> restore(outer::Diloco& outer);

 private:
  std::string state_file(const std::filesystem::path& dir) const;
  void barrier();
  void prune();
  std::vector<int64_t> site_steps();
  std::filesystem::path resume_directory(outer::Diloco& outer);

  const trainer::RunConfig& cfg_;
  const trainer::SiteConfig& site_;
  int rank_;
  HostSite& host_;
  uint64_t layout_;
  std::function<void(const std::string&)> log_;
  std::filesystem::path dir_;  // checkpoints/<site>
};

}  // namespace python
}  // namespace geoloco
