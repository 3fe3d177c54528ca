#include "core/log.hpp"

#include <spdlog/sinks/stdout_sinks.h>

namespace geoloco::log {
namespace {
std::string g_prefix;
}

void init(const std::string& p, const std::string& level) {
  g_prefix = p;
  spdlog::drop("geoloco");
  auto logger = spdlog::stderr_logger_mt("geoloco");
  std::string pattern = p.empty() ? "%^%l%$ %v" : "[" + p + "] %^%l%$ %v";
  logger->set_pattern(pattern);
  logger->set_level(spdlog::level::from_str(level));
  spdlog::set_default_logger(logger);
}

const std::string& prefix() { return g_prefix; }

}  // namespace geoloco::log
