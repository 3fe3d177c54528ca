// Helpers shared by the checkpoint tests: parameter values a loader must reproduce exactly,
// and the text of the FileError a call throws.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "core/error.hpp"
#include "trainer/model/param_layout.hpp"

namespace geoloco::trainer::test {

// Exactly representable values, distinct per position (so Python can recompute them bit-exactly).
inline std::vector<float> filled(const ParamLayout& L) {
  std::vector<float> p(static_cast<size_t>(L.total()));
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<float>(i % 4093) * 0.125f - 100.0f;
  return p;
}

// The message of the FileError `f` throws, or "<no FileError>".
inline std::string file_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const FileError& e) {
    return e.what();
  }
  return "<no FileError>";
}

}  // namespace geoloco::trainer::test
