// ErrorFeedback: per-rank residual of a lossy pipeline. After each encode it holds
// (value + previous residual) - (what the receivers will decode), and the next encode adds
// it back, so over many outer steps the transmitted sum tracks the true sum and the error
// stays bounded by one step's quantization/sparsification error instead of growing.
//
// The residual is training state: checkpoints must save it (save()/load(), or the raw fp32
// bytes through residual()/bytes() when the checkpoint stores it as a tensor).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace geoloco::compression {

inline constexpr uint8_t kResidualMagic[4] = {'G', 'L', 'E', 'F'};
inline constexpr uint16_t kResidualVersion = 1;

class ErrorFeedback {
 public:
  explicit ErrorFeedback(size_t elements) : residual_(elements, 0.0f) {}

  size_t size() const { return residual_.size(); }
  std::span<const float> residual() const { return residual_; }
  std::span<float> residual() { return residual_; }
  // The residual as little-endian fp32 bytes (size() * 4), e.g. for a safetensors tensor.
  std::span<const uint8_t> bytes() const {
    return {reinterpret_cast<const uint8_t*>(residual_.data()), residual_.size() * sizeof(float)};
  }
  void reset();

  // Self-describing blob: "GLEF", version u16, 2 reserved bytes, elements u64, fp32 values,
  // XXH3-64 of everything before it.
  std::vector<uint8_t> save() const;
  // Throws FileError(`what`, ...) unless `blob` is a valid residual of expected_elements
  // finite values. `what` names the source (checkpoint path and tensor) for the message.
  static ErrorFeedback load(std::span<const uint8_t> blob, size_t expected_elements, const std::string& what);

 private:
  std::vector<float> residual_;
};

}  // namespace geoloco::compression
