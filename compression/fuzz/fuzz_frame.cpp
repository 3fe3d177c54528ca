// libFuzzer target: the frame decoder on arbitrary bytes (see frame_harness.hpp).
// Built with -DGEOLOCO_FUZZ=ON and clang; run by tools/fuzz_frames.sh.
#include <cstddef>
#include <cstdint>

#include "compression/fuzz/frame_harness.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  geoloco::compression::fuzz::run_frame_input({data, size});
  return 0;
}
