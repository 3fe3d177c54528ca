// OuterState: one rank's outer-loop state for a checkpoint (Diloco::save_state), as named
// tensors and metadata the driver writes into its checkpoint under an "outer." prefix; the
// driver hands the file back to Diloco::restore_state on --resume.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace geoloco::outer {

struct OuterState {
  std::map<std::string, std::vector<float>> tensors;
  // f32 tensors as parts of the outer loop's own buffers, in order (no copy at real size);
  // valid until the next call into the outer loop. A name is in `tensors` or here, not both.
  std::map<std::string, std::vector<std::span<const float>>> views;
  std::map<std::string, std::vector<uint8_t>> bytes;
  std::map<std::string, std::string> metadata;
};

}  // namespace geoloco::outer
