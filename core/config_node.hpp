// geoloco::config::Node: typed, validated access to one YAML mapping, used by every
// component's `from_yaml`. YAML is parsed once, at the edge (config::load_file); each
// component reads its own section through a Node and owns the resulting struct.
//
// Every error names file:line:col (or, for a key that came from the command line, the
// override: "(--set a.b=v)"), the key path, the bad value and what is allowed.
// Every key a parser asks for is recorded; `finish()` rejects the keys nobody asked for,
// so a typo ("micro_bach") is an error naming the allowed keys, never silently ignored.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <initializer_list>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <array>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/error.hpp"

namespace geoloco::config {

// Where a document came from, plus the --set overrides applied to it (so an error about a
// key that came from the command line names the override, never a file position).
struct Source {
  std::string file;  // path as given by the user
  // Key path -> "--set a.b=v" for each path an override set; a later override of the same
  // path replaces the entry.
  std::map<std::string, std::string> overrides;
  // Key path -> "--set a.b=v" for each mapping an override created on the way to its path
  // ("--set modle.n_layer=2" on a file without `modle:` creates "modle"). Names the
  // override in errors about that key itself (an unknown "modle"); a key missing from such a
  // mapping is not the override's doing, so it is located as before (the file).
  std::map<std::string, std::string> created;

  // The override a key path's value came from: the set path that is the path itself or its
  // closest ancestor ("model" covers "model.n_layer", "sites[1]" covers "sites[1].port");
  // nullopt when it came from the file.
  std::optional<std::string> origin(std::string_view key_path) const;
  // origin(), or the override that created the mapping at exactly this path. For keys that
  // exist in the document.
  std::optional<std::string> origin_of_present(std::string_view key_path) const;
};

class Node {
 public:
  Node(YAML::Node node, std::shared_ptr<const Source> source, std::string path);

  // Key path of this node ("" at the root, "train.optimizer", "sites[1]").
  const std::string& path() const { return path_; }
  std::string key_path(std::string_view key) const;
  bool has(std::string_view key) const;

  // Scalars. `get` returns the default when the key is absent; `require` fails.
  // Supported T: bool, int, int64_t, uint64_t, double, std::string, std::vector<double>,
  // std::vector<int>.
  template <class T>
  T get(std::string_view key, T default_value) const;
  template <class T>
  T require(std::string_view key) const;

  // Range-checked numbers: fail unless lo <= v <= hi.
  int64_t get_int(std::string_view key, int64_t default_value, int64_t lo, int64_t hi) const;
  double get_double(std::string_view key, double default_value, double lo, double hi) const;
  // A string from a closed set.
  std::string get_choice(std::string_view key, std::string_view default_value,
                         std::initializer_list<std::string_view> allowed) const;
  // The same, as the index of the word in `words` (`default_index` when absent): parse a choice
  // into an enum once (get_enum).
  size_t get_choice_index(std::string_view key, size_t default_index, std::span<const char* const> words) const;
  template <class E, size_t N>
  E get_enum(std::string_view key, E default_value, const std::array<const char*, N>& words) const {
    return static_cast<E>(get_choice_index(key, static_cast<size_t>(default_value), words));
  }

  // Sub-mapping; an absent key gives an empty mapping (so every default applies).
  Node child(std::string_view key) const;
  // Elements of a sequence of mappings; absent gives an empty vector.
  std::vector<Node> items(std::string_view key) const;

  // Fail with a located message about `key` (or this node when key is empty).
  [[noreturn]] void fail(std::string_view key, std::string_view problem) const;
  // Convenience: fail with "got <value>, expected <expected>".
  [[noreturn]] void fail_value(std::string_view key, std::string_view expected) const;

  // Rejects keys of this mapping that no parser asked for (call after reading all keys).
  void finish() const;

  // "file:line:col" of a key's value (or of this node), or "(--set a.b=v)" when the key
  // (or this node) came from an override.
  std::string where(std::string_view key = {}) const;

 private:
  YAML::Node value_node(std::string_view key) const;
  std::string scalar_text(std::string_view key) const;
  void mark_used(std::string_view key) const;

  YAML::Node node_;
  std::shared_ptr<const Source> source_;
  std::string path_;
  std::shared_ptr<std::set<std::string>> used_;
};

// A parsed document: root Node plus the source it came from.
struct Document {
  std::shared_ptr<Source> source;
  YAML::Node root;
  Node node() const { return Node(root, source, ""); }
};

// Parse a YAML file (FileError if unreadable, ConfigError with line:col on syntax errors),
// then apply `--set a.b.c=value` overrides (value parsed as YAML; "sites.1.port=7000"
// indexes sequences).
Document load_file(const std::string& path, const std::vector<std::string>& overrides = {});
Document load_string(const std::string& text, const std::string& name, const std::vector<std::string>& overrides = {});

// Edit distance based suggestion used in unknown-key messages ("did you mean ...").
std::optional<std::string> closest(std::string_view word, const std::set<std::string>& candidates);

}  // namespace geoloco::config
