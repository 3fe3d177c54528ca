// EncodeError: a value could not be put on the wire. Thrown before any byte is produced for
// non-finite values (a NaN or inf pseudo-gradient means the site diverged: sending it would
// poison every site's average, so the outer step stops here with the index that is bad),
// for |x| > kMaxAbsValue, and for values beyond the fp16 range with the fp16 codec.
#pragma once

#include <cstdint>
#include <string>

#include "core/error.hpp"

namespace geoloco::compression {

class EncodeError : public Error {
 public:
  EncodeError(uint64_t index, const std::string& what) : Error(what), index_(index) {}
  // Index of the first offending element within the encoded span.
  uint64_t index() const { return index_; }

 private:
  uint64_t index_;
};

}  // namespace geoloco::compression
