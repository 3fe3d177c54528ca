#include "trainer/model/blas_setup.hpp"

#include <cblas.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/log.hpp"

namespace geoloco::trainer {

void prefer_avx512_blas(char** argv) {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;  // the user chose (or we already did)
  if (const char* v = std::getenv("GEOLOCO_BLAS_REEXEC"); v != nullptr && std::string_view(v) == "0") return;
  __builtin_cpu_init();
  if (!(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512vl")))
    return;
  const std::string_view core = openblas_get_corename();
  if (core != "Haswell" && core != "Zen" && core != "haswell" && core != "zen") return;
  // Setting the variable first also stops any loop: the re-executed process sees it.
  if (setenv("OPENBLAS_CORETYPE", "SkylakeX", 1) != 0) return;
  execv("/proc/self/exe", argv);
  spdlog::warn("re-executing with OPENBLAS_CORETYPE=SkylakeX failed ({}); using OpenBLAS's {} kernels",
               std::strerror(errno), core);
  unsetenv("OPENBLAS_CORETYPE");
}

std::string blas_description() { return std::string(openblas_get_config()) + ", core " + openblas_get_corename(); }

}  // namespace geoloco::trainer
