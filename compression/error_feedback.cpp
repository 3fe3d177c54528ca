#include "compression/error_feedback.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "compression/bytes.hpp"
#include "core/error.hpp"
#include "core/hash.hpp"

namespace geoloco::compression {
namespace {
constexpr size_t kBlobHeader = 16;
constexpr size_t kBlobTrailer = 8;
constexpr uint64_t kBlobSeed = 0x474c4546'00000001ULL;
}  // namespace

void ErrorFeedback::reset() { std::fill(residual_.begin(), residual_.end(), 0.0f); }

std::vector<uint8_t> ErrorFeedback::save() const {
  const size_t payload = residual_.size() * sizeof(float);
  std::vector<uint8_t> blob(kBlobHeader + payload + kBlobTrailer, 0);
  std::memcpy(blob.data(), kResidualMagic, 4);
  bytes::store<uint16_t>(blob.data() + 4, kResidualVersion);
  bytes::store<uint64_t>(blob.data() + 8, residual_.size());
  if (payload) std::memcpy(blob.data() + kBlobHeader, residual_.data(), payload);
  bytes::store<uint64_t>(blob.data() + kBlobHeader + payload, hash64(blob.data(), kBlobHeader + payload, kBlobSeed));
  return blob;
}

ErrorFeedback ErrorFeedback::load(std::span<const uint8_t> blob, size_t expected_elements, const std::string& what) {
  if (blob.size() < kBlobHeader + kBlobTrailer)
    throw FileError(what, fmt::format("error-feedback residual: {} bytes, too short", blob.size()));
  if (std::memcmp(blob.data(), kResidualMagic, 4) != 0)
    throw FileError(what, "error-feedback residual: bad magic, expected 'GLEF'");
  const uint16_t version = bytes::load<uint16_t>(blob.data() + 4);
  if (version != kResidualVersion)
    throw FileError(what,
                    fmt::format("error-feedback residual: version {}, this build reads {}", version, kResidualVersion));
  const uint64_t n = bytes::load<uint64_t>(blob.data() + 8);
  if (n != expected_elements)
    throw FileError(what,
                    fmt::format("error-feedback residual holds {} elements, the shard has {}", n, expected_elements));
  // n == expected_elements, a size the caller can allocate, so n * 4 does not overflow.
  if (blob.size() != kBlobHeader + n * sizeof(float) + kBlobTrailer)
    throw FileError(what, fmt::format("error-feedback residual: {} bytes, {} elements need {}", blob.size(), n,
                                      kBlobHeader + n * sizeof(float) + kBlobTrailer));
  const size_t body = kBlobHeader + n * sizeof(float);
  if (bytes::load<uint64_t>(blob.data() + body) != hash64(blob.data(), body, kBlobSeed))
    throw FileError(what, "error-feedback residual: checksum mismatch");
  ErrorFeedback ef(n);
  if (n) std::memcpy(ef.residual_.data(), blob.data() + kBlobHeader, n * sizeof(float));
  for (size_t i = 0; i < n; ++i)
    if (!std::isfinite(ef.residual_[i]))
      throw FileError(what, fmt::format("error-feedback residual: non-finite value at element {}", i));
  return ef;
}

}  // namespace geoloco::compression
