#include "core/config_node.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <sstream>

namespace geoloco::config {
namespace {

std::string describe(const YAML::Node& n) {
  if (!n.IsDefined() || n.IsNull()) return "null";
  if (n.IsScalar()) return "'" + n.Scalar() + "'";
  if (n.IsSequence()) return "a list";
  return "a mapping";
}

std::string mark_text(const std::string& file, const YAML::Mark& m) {
  if (m.is_null()) return file;
  return fmt::format("{}:{}:{}", file, m.line + 1, m.column + 1);
}

// Where the YAML node at `path` came from: the override that gave it, else its file
// position. (Nodes an override made carry marks into the override's value text, or none,
// so their marks must never be printed as positions in the file.)
std::string locate(const Source& source, const std::string& path, const YAML::Mark& m) {
  if (auto o = source.origin_of_present(path)) return "(" + *o + ")";
  return mark_text(source.file, m);
}

}  // namespace

std::optional<std::string> Source::origin(std::string_view key_path) const {
  // Walk from the path itself up through its ancestors: "a.b[2].c", "a.b[2]", "a.b", "a".
  std::string p(key_path);
  while (!p.empty()) {
    if (auto it = overrides.find(p); it != overrides.end()) return it->second;
    auto cut = p.find_last_of(".[");
    if (cut == std::string::npos) break;
    p.resize(cut);
  }
  return std::nullopt;
}

std::optional<std::string> Source::origin_of_present(std::string_view key_path) const {
  if (auto o = origin(key_path)) return o;
  if (auto it = created.find(std::string(key_path)); it != created.end()) return it->second;
  return std::nullopt;
}

Node::Node(YAML::Node node, std::shared_ptr<const Source> source, std::string path)
    : node_(std::move(node)),
      source_(std::move(source)),
      path_(std::move(path)),
      used_(std::make_shared<std::set<std::string>>()) {
  if (node_.IsDefined() && !node_.IsNull() && !node_.IsMap()) {
    throw ConfigError(
        fmt::format("{}: {}: got {}, expected a mapping", where(), path_.empty() ? "<root>" : path_, describe(node_)));
  }
}

std::string Node::key_path(std::string_view key) const {
  if (path_.empty()) return std::string(key);
  if (key.empty()) return path_;
  return path_ + "." + std::string(key);
}

bool Node::has(std::string_view key) const {
  mark_used(key);
  return node_.IsMap() && node_[std::string(key)].IsDefined() && !node_[std::string(key)].IsNull();
}

void Node::mark_used(std::string_view key) const { used_->insert(std::string(key)); }

YAML::Node Node::value_node(std::string_view key) const {
  mark_used(key);
  if (!node_.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
  // const access: does not insert.
  const YAML::Node& cn = node_;
  return cn[std::string(key)];
}

std::string Node::where(std::string_view key) const {
  if (!key.empty()) {
    const std::string kp = key_path(key);
    YAML::Node v =
        node_.IsMap() ? static_cast<const YAML::Node&>(node_)[std::string(key)] : YAML::Node(YAML::NodeType::Undefined);
    if (v.IsDefined()) return locate(*source_, kp, v.Mark());
    // Absent: inside a value an override gave, that override; else where this mapping is.
    if (auto o = source_->origin(kp)) return "(" + *o + ")";
  }
  if (auto o = source_->origin(path_)) return "(" + *o + ")";
  return mark_text(source_->file, node_.Mark());
}

void Node::fail(std::string_view key, std::string_view problem) const {
  std::string kp = key_path(key);
  throw ConfigError(fmt::format("{}: {}: {}", where(key), kp.empty() ? "<root>" : kp, problem));
}

void Node::fail_value(std::string_view key, std::string_view expected) const {
  fail(key, fmt::format("got {}, expected {}", describe(value_node(key)), expected));
}

std::string Node::scalar_text(std::string_view key) const {
  YAML::Node v = value_node(key);
  if (!v.IsScalar()) fail_value(key, "a scalar");
  return v.Scalar();
}

namespace {

template <class T>
bool parse_scalar(const YAML::Node& v, T& out) {
  if (!v.IsScalar()) return false;
  if constexpr (std::is_same_v<T, std::string>) {
    out = v.Scalar();
    return true;
  } else if constexpr (std::is_same_v<T, bool>) {
    const std::string& s = v.Scalar();
    if (s == "true" || s == "True" || s == "yes" || s == "on") {
      out = true;
      return true;
    }
    if (s == "false" || s == "False" || s == "no" || s == "off") {
      out = false;
      return true;
    }
    return false;
  } else if constexpr (std::is_integral_v<T>) {
    const std::string& s = v.Scalar();
    if (s.empty()) return false;
    try {
      size_t pos = 0;
      if constexpr (std::is_unsigned_v<T>) {
        if (s[0] == '-') return false;
        unsigned long long x = std::stoull(s, &pos, 0);
        if (pos != s.size() || x > std::numeric_limits<T>::max()) return false;
        out = static_cast<T>(x);
      } else {
        long long x = std::stoll(s, &pos, 0);
        if (pos != s.size() || x > std::numeric_limits<T>::max() || x < std::numeric_limits<T>::min()) return false;
        out = static_cast<T>(x);
      }
      return true;
    } catch (...) {
      return false;
    }
  } else if constexpr (std::is_floating_point_v<T>) {
    const std::string& s = v.Scalar();
    if (s.empty()) return false;
    try {
      size_t pos = 0;
      double x = std::stod(s, &pos);
      if (pos != s.size() || !std::isfinite(x)) return false;
      out = static_cast<T>(x);
      return true;
    } catch (...) {
      return false;
    }
  } else {
    static_assert(sizeof(T) == 0, "unsupported config type");
  }
}

template <class T>
const char* type_name() {
  if constexpr (std::is_same_v<T, std::string>)
    return "a string";
  else if constexpr (std::is_same_v<T, bool>)
    return "true or false";
  else if constexpr (std::is_unsigned_v<T>)
    return "a non-negative integer";
  else if constexpr (std::is_integral_v<T>)
    return "an integer";
  else if constexpr (std::is_floating_point_v<T>)
    return "a finite number";
  else
    return "a list";
}

template <class T>
struct is_vector : std::false_type {};
template <class E>
struct is_vector<std::vector<E>> : std::true_type {};

}  // namespace

template <class T>
T Node::get(std::string_view key, T default_value) const {
  YAML::Node v = value_node(key);
  if (!v.IsDefined() || v.IsNull()) return default_value;
  if constexpr (is_vector<T>::value) {
    using E = typename T::value_type;
    if (!v.IsSequence()) fail_value(key, fmt::format("a list of {}", type_name<E>()));
    T out;
    for (size_t i = 0; i < v.size(); ++i) {
      E e{};
      if (!parse_scalar(v[i], e))
        fail(key, fmt::format("element {} is {}, expected {}", i, describe(v[i]), type_name<E>()));
      out.push_back(e);
    }
    return out;
  } else {
    T out{};
    if (!parse_scalar(v, out)) fail_value(key, type_name<T>());
    return out;
  }
}

template <class T>
T Node::require(std::string_view key) const {
  if (!has(key)) fail(key, "missing required key");
  return get<T>(key, T{});
}

#define GEOLOCO_INSTANTIATE(T)                        \
  template T Node::get<T>(std::string_view, T) const; \
  template T Node::require<T>(std::string_view) const;
GEOLOCO_INSTANTIATE(bool)
GEOLOCO_INSTANTIATE(int)
GEOLOCO_INSTANTIATE(int64_t)
GEOLOCO_INSTANTIATE(uint64_t)
GEOLOCO_INSTANTIATE(double)
GEOLOCO_INSTANTIATE(std::string)
GEOLOCO_INSTANTIATE(std::vector<double>)
GEOLOCO_INSTANTIATE(std::vector<int>)
GEOLOCO_INSTANTIATE(std::vector<std::string>)
#undef GEOLOCO_INSTANTIATE

int64_t Node::get_int(std::string_view key, int64_t default_value, int64_t lo, int64_t hi) const {
  int64_t v = get<int64_t>(key, default_value);
  if (v < lo || v > hi) {
    if (hi == std::numeric_limits<int64_t>::max()) fail_value(key, fmt::format("an integer >= {}", lo));
    fail_value(key, fmt::format("an integer in [{}, {}]", lo, hi));
  }
  return v;
}

double Node::get_double(std::string_view key, double default_value, double lo, double hi) const {
  double v = get<double>(key, default_value);
  if (v < lo || v > hi) {
    if (hi == std::numeric_limits<double>::infinity() || hi == std::numeric_limits<double>::max())
      fail_value(key, fmt::format("a number >= {}", lo));
    fail_value(key, fmt::format("a number in [{}, {}]", lo, hi));
  }
  return v;
}

std::string Node::get_choice(std::string_view key, std::string_view default_value,
                             std::initializer_list<std::string_view> allowed) const {
  std::string v = get<std::string>(key, std::string(default_value));
  for (auto a : allowed)
    if (v == a) return v;
  fail_value(key, fmt::format("one of {}", fmt::join(allowed, " | ")));
}

size_t Node::get_choice_index(std::string_view key, size_t default_index, std::span<const char* const> words) const {
  GEOLOCO_CHECK(default_index < words.size(), "{}: default choice {} of {}", key_path(key), default_index,
                words.size());
  const std::string v = get<std::string>(key, std::string(words[default_index]));
  for (size_t i = 0; i < words.size(); ++i)
    if (v == words[i]) return i;
  fail_value(key, fmt::format("one of {}", fmt::join(words, " | ")));
}

Node Node::child(std::string_view key) const {
  YAML::Node v = value_node(key);
  if (v.IsDefined() && !v.IsNull() && !v.IsMap()) fail_value(key, "a mapping");
  // (yaml-cpp nodes have reference semantics: never assign to `v`, build a fresh node.)
  if (!v.IsDefined() || v.IsNull()) return Node(YAML::Node(YAML::NodeType::Map), source_, key_path(key));
  return Node(v, source_, key_path(key));
}

std::vector<Node> Node::items(std::string_view key) const {
  YAML::Node v = value_node(key);
  std::vector<Node> out;
  if (!v.IsDefined() || v.IsNull()) return out;
  if (!v.IsSequence()) fail_value(key, "a list of mappings");
  for (size_t i = 0; i < v.size(); ++i) {
    std::string p = fmt::format("{}[{}]", key_path(key), i);
    if (!v[i].IsMap())
      throw ConfigError(
          fmt::format("{}: {}: got {}, expected a mapping", locate(*source_, p, v[i].Mark()), p, describe(v[i])));
    out.emplace_back(v[i], source_, p);
  }
  return out;
}

void Node::finish() const {
  if (!node_.IsMap()) return;
  for (auto it = node_.begin(); it != node_.end(); ++it) {
    std::string k = it->first.Scalar();
    if (used_->count(k)) continue;
    const std::string kp = key_path(k);
    std::string msg = fmt::format("{}: {}: unknown key", locate(*source_, kp, it->first.Mark()), kp);
    if (auto c = closest(k, *used_)) msg += fmt::format(" (did you mean '{}'?)", *c);
    msg += fmt::format("; allowed keys: {}", fmt::join(*used_, ", "));
    throw ConfigError(msg);
  }
}

std::optional<std::string> closest(std::string_view word, const std::set<std::string>& candidates) {
  std::optional<std::string> best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    // Levenshtein distance, O(n*m) on short keys.
    std::vector<size_t> prev(c.size() + 1), cur(c.size() + 1);
    for (size_t j = 0; j <= c.size(); ++j) prev[j] = j;
    for (size_t i = 1; i <= word.size(); ++i) {
      cur[0] = i;
      for (size_t j = 1; j <= c.size(); ++j)
        cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (word[i - 1] != c[j - 1])});
      std::swap(prev, cur);
    }
    if (prev[c.size()] < best_d) {
      best_d = prev[c.size()];
      best = c;
    }
  }
  return best;
}

namespace {

void apply_override(YAML::Node root, const std::string& spec, Source& source) {
  auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0) throw ConfigError(fmt::format("--set {}: expected key.path=value", spec));
  std::string path = spec.substr(0, eq);
  std::string value = spec.substr(eq + 1);
  std::vector<std::string> parts;
  std::stringstream ss(path);
  for (std::string p; std::getline(ss, p, '.');) {
    if (p.empty()) throw ConfigError(fmt::format("--set {}: empty component in key path", spec));
    parts.push_back(p);
  }
  YAML::Node parsed;
  try {
    parsed = YAML::Load(value);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("--set {}: value is not valid YAML: {}", spec, e.msg));
  }
  // Walk and create intermediate maps. Sequences are indexed by number.
  std::vector<YAML::Node> chain{root};
  std::string canonical;
  std::vector<std::string> created;
  for (size_t i = 0; i < parts.size(); ++i) {
    YAML::Node cur = chain.back();
    const std::string& p = parts[i];
    bool last = i + 1 == parts.size();
    bool is_index = !p.empty() && std::all_of(p.begin(), p.end(), ::isdigit);
    if (cur.IsSequence()) {
      if (!is_index) throw ConfigError(fmt::format("--set {}: '{}' is a list; index it by number", spec, canonical));
      size_t idx = std::stoul(p);
      if (idx >= cur.size())
        throw ConfigError(
            fmt::format("--set {}: index {} out of range ({} has {} elements)", spec, idx, canonical, cur.size()));
      canonical += fmt::format("[{}]", idx);
      if (last)
        cur[idx] = parsed;
      else
        chain.push_back(cur[idx]);
      continue;
    }
    if (cur.IsDefined() && !cur.IsNull() && !cur.IsMap())
      throw ConfigError(fmt::format("--set {}: '{}' is a scalar, cannot set a key inside it", spec, canonical));
    canonical += (canonical.empty() ? "" : ".") + p;
    if (last) {
      cur[p] = parsed;
    } else {
      const YAML::Node& ccur = cur;
      if (!ccur[p].IsDefined() || ccur[p].IsNull()) {
        // This override creates the mapping, so a key in it (a typo like "modle") is its doing.
        cur[p] = YAML::Node(YAML::NodeType::Map);
        created.push_back(canonical);
      }
      chain.push_back(cur[p]);
    }
  }
  // The value replaced whatever an earlier override put below this path.
  auto below = [&](const std::string& k) {
    return k.size() > canonical.size() && k.compare(0, canonical.size(), canonical) == 0 &&
           (k[canonical.size()] == '.' || k[canonical.size()] == '[');
  };
  std::erase_if(source.overrides, [&](const auto& kv) { return below(kv.first); });
  std::erase_if(source.created, [&](const auto& kv) { return below(kv.first) || kv.first == canonical; });
  for (const auto& c : created) source.created[c] = "--set " + spec;
  source.overrides[canonical] = "--set " + spec;
}

Document finish_load(YAML::Node loaded, std::shared_ptr<Source> src, const std::vector<std::string>& overrides) {
  YAML::Node root = (!loaded.IsDefined() || loaded.IsNull()) ? YAML::Node(YAML::NodeType::Map) : loaded;
  if (!root.IsMap()) throw ConfigError(fmt::format("{}: the document must be a mapping of sections", src->file));
  for (const auto& o : overrides) apply_override(root, o, *src);
  return Document{std::move(src), root};
}

}  // namespace

Document load_string(const std::string& text, const std::string& name, const std::vector<std::string>& overrides) {
  auto src = std::make_shared<Source>();
  src->file = name;
  YAML::Node root;
  try {
    root = YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}: YAML syntax error: {}", mark_text(name, e.mark), e.msg));
  }
  return finish_load(root, src, overrides);
}

Document load_file(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw FileError(path, "cannot open config file");
  std::stringstream ss;
  ss << in.rdbuf();
  return load_string(ss.str(), path, overrides);
}

}  // namespace geoloco::config
