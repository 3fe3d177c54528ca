#include "core/error.hpp"

namespace geoloco::detail {

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  throw Error(fmt::format("{}:{}: check '{}' failed: {}", file, line, expr, msg));
}

void check_failed(const char* expr, const char* file, int line, const std::string& operands, const std::string& msg) {
  throw Error(
      fmt::format("{}:{}: check '{}' failed ({}){}{}", file, line, expr, operands, msg.empty() ? "" : ": ", msg));
}

}  // namespace geoloco::detail
