// make_device_site in a build without CUDA: site.device: cuda is a configuration this binary
// cannot run (run_config.cpp refuses it at load time already; this is the second line).
#include "core/error.hpp"
#include "trainer/loop/device_site.hpp"

namespace geoloco::trainer {

bool built_with_cuda() { return false; }

namespace {
[[noreturn]] void no_cuda() {
  throw ConfigError(
      "site.device: cuda, but this geoloco binary was built without CUDA (configure with -DGEOLOCO_CUDA=ON on a "
      "machine with nvcc and NCCL), or use site.device: cpu");
}
}  // namespace

std::unique_ptr<DeviceSite> make_device_site(const RunConfig&, int, const ParamLayout&, parallel::Collective*,
                                             std::span<const float>, const DeviceSiteOptions&) {
  no_cuda();
}

int select_rank_device(const RunConfig&, int, int, int) { no_cuda(); }

}  // namespace geoloco::trainer
