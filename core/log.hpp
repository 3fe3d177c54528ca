// Logging: spdlog, one process-wide logger whose prefix names the site and rank
// ("[paris/1]"), so interleaved output from a launch stays readable.
#pragma once

#include <spdlog/spdlog.h>

#include <string>

namespace geoloco::log {

// Sets the prefix (e.g. "paris/1"); empty for single-process commands. Level: "info" etc.
void init(const std::string& prefix, const std::string& level = "info");
const std::string& prefix();

}  // namespace geoloco::log
