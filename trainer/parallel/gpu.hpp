// GPU presence, usable from any build: false when CUDA was not compiled in, and false when
// the CUDA runtime reports an error (no driver, "driver version is insufficient", no device).
#pragma once

#include <string>

namespace geoloco::parallel {

// Number of usable CUDA devices (0 when none or when CUDA is not compiled in).
int gpu_count();
bool gpu_available();
// Why there is no GPU ("built without CUDA", the runtime's error text, "0 devices"), or ""
// when one is present. Tests print it in GTEST_SKIP.
std::string gpu_unavailable_reason();

}  // namespace geoloco::parallel
