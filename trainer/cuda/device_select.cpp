#include "trainer/cuda/device_select.hpp"

#include "trainer/cuda/cuda_error.hpp"

namespace geoloco::cuda {

int device_for_local_rank(int local_rank, int local_ranks, int device_count, int requested) {
  GEOLOCO_CHECK(local_ranks >= 1 && local_rank >= 0 && local_rank < local_ranks,
                "local rank {} is outside [0, {})", local_rank, local_ranks);
  if (device_count <= 0)
    throw_cuda_error(CudaErrorKind::NoDevice, "CUDA", "device selection", -1, codes::kNoDevice, "cudaErrorNoDevice",
                     fmt::format("local rank {} needs a GPU but none is visible", local_rank));
  if (requested >= 0) {
    if (requested >= device_count)
      throw ConfigError(fmt::format("site.cuda_device {} is not visible: this node shows {} GPU(s) (0..{})", requested,
                                    device_count, device_count - 1));
    return requested;
  }
  // Sharing a GPU between ranks would silently halve each rank's memory and time-slice
  // its compute: refuse and say why instead.
  if (local_ranks > device_count)
    throw ConfigError(fmt::format("{} ranks on this node but only {} visible GPU(s): run at most one rank per GPU "
                                  "(local rank {} has none)",
                                  local_ranks, device_count, local_rank));
  return local_rank;
}

}  // namespace geoloco::cuda

#include <charconv>

namespace geoloco::cuda {

bool arch_compatible(int major, int minor, std::string_view built) {
  const int cc = major * 10 + minor;
  bool ok = false;
  size_t pos = 0;
  while (pos <= built.size()) {
    size_t end = built.find(';', pos);
    if (end == std::string_view::npos) end = built.size();
    std::string_view e = built.substr(pos, end - pos);
    pos = end + 1;
    if (e.empty()) continue;
    bool sass = true, ptx = true;
    if (e.ends_with("-real")) {
      ptx = false;
      e.remove_suffix(5);
    } else if (e.ends_with("-virtual")) {
      sass = false;
      e.remove_suffix(8);
    }
    // "90a" style arch-specific targets run only on exactly that capability.
    bool specific = false;
    if (!e.empty() && (e.back() == 'a' || e.back() == 'f')) {
      specific = true;
      e.remove_suffix(1);
    }
    int arch = 0;
    auto r = std::from_chars(e.data(), e.data() + e.size(), arch);
    if (e.empty() || r.ec != std::errc() || r.ptr != e.data() + e.size() || arch < 10)
      throw Error(fmt::format("CUDA architecture list '{}' has an entry that is not a number[-real|-virtual]", built));
    if (specific) {
      ok = ok || cc == arch;
      continue;
    }
    if (sass && major == arch / 10 && minor >= arch % 10) ok = true;
    if (ptx && cc >= arch) ok = true;
  }
  return ok;
}

}  // namespace geoloco::cuda
