#include "trainer/core/error.hpp"

namespace geoloco::detail {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  throw Error(fmt::format("{}:{}: check '{}' failed: {}", file, line, expr, msg));
}

}  // namespace geoloco::detail
