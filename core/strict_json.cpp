#include "core/strict_json.hpp"

#include <set>
#include <vector>

namespace geoloco {

nlohmann::json parse_json_rejecting_duplicates(std::string_view text, std::string* duplicate) {
  using json = nlohmann::json;
  duplicate->clear();
  std::vector<std::set<std::string>> open_objects;  // the keys seen in each enclosing object
  auto on_event = [&](int, json::parse_event_t ev, json& parsed) {
    if (ev == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (ev == json::parse_event_t::object_end) {
      if (!open_objects.empty()) open_objects.pop_back();
    } else if (ev == json::parse_event_t::key && !open_objects.empty()) {
      const auto& k = parsed.get_ref<const std::string&>();
      if (!open_objects.back().insert(k).second && duplicate->empty()) *duplicate = k;
    }
    return true;
  };
  return json::parse(text.begin(), text.end(), on_event);
}

}  // namespace geoloco
