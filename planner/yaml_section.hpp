// section(): Node::child that tolerates an absent key.
//
// core's Node::child assigns to yaml-cpp's "zombie" node when the key is absent,
// which throws YAML::InvalidNode (reported to the core owner). Until that is fixed, the
// planner asks has() first and builds the empty mapping itself, keeping the file name so
// "missing key" errors inside an absent section still say where.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "core/config_node.hpp"

namespace geoloco::planner {

inline config::Node section(const config::Node& parent, std::string_view key) {
  if (parent.has(key)) return parent.child(key);
  // where() is "file:line:col" (or just "file"); keep the file part.
  std::string file = parent.where();
  for (int i = 0; i < 2; ++i) {
    auto colon = file.rfind(':');
    if (colon == std::string::npos) break;
    const std::string tail = file.substr(colon + 1);
    if (tail.empty() || tail.find_first_not_of("0123456789") != std::string::npos) break;
    file.resize(colon);
  }
  auto src = std::make_shared<config::Source>();
  src->file = file;
  return config::Node(YAML::Node(YAML::NodeType::Map), src, parent.key_path(key));
}

}  // namespace geoloco::planner
