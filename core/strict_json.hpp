// JSON parsing for files we do not trust (a safetensors header, a Hugging Face config.json):
// nlohmann::json keeps the last of two equal keys silently, so a file could say one thing to
// us and another to a reader that keeps the first; this parse reports the duplicate instead.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace geoloco {

// nlohmann::json::parse(text), plus the first key that appears twice in one object (any
// depth) in *duplicate (left empty when there is none). Throws nlohmann::json::exception on
// a syntax error.
nlohmann::json parse_json_rejecting_duplicates(std::string_view text, std::string* duplicate);

}  // namespace geoloco
