#include "trainer/data/data_config.hpp"

#include <fmt/format.h>

namespace geoloco::trainer {

const char* to_string(DataSourceConfig::Kind kind) {
  switch (kind) {
    case DataSourceConfig::Kind::Text: return "text";
    case DataSourceConfig::Kind::Shards: return "shards";
    case DataSourceConfig::Kind::Synthetic: return "synthetic";
  }
  return "?";
}

DataSourceConfig DataSourceConfig::from_yaml(const config::Node& n) {
  DataSourceConfig c;
  if (!n.has("kind")) n.fail("kind", "missing; expected one of text | shards | synthetic");
  const std::string kind = n.get_choice("kind", "", {"text", "shards", "synthetic"});
  c.kind = kind == "text" ? Kind::Text : kind == "shards" ? Kind::Shards : Kind::Synthetic;
  static constexpr const char* kSyntheticKeys[] = {"vocab", "branching", "seed", "tokens"};
  if (c.kind == Kind::Synthetic) {
    if (n.has("path")) n.fail("path", "applies only to kind text or shards");
    c.vocab = static_cast<int>(n.get_int("vocab", c.vocab, 2, 65536));
    c.branching = static_cast<int>(n.get_int("branching", c.branching, 2, 65536));
    if (c.branching > c.vocab)
      n.fail("branching", fmt::format("got {}, expected at most vocab ({})", c.branching, c.vocab));
    c.seed = n.get<uint64_t>("seed", c.seed);
    c.tokens = static_cast<uint64_t>(n.get_int("tokens", static_cast<int64_t>(c.tokens), 2, int64_t{1} << 50));
  } else {
    for (const char* k : kSyntheticKeys)
      if (n.has(k)) n.fail(k, fmt::format("applies only to kind synthetic (this source is {})", kind));
    c.path = n.require<std::string>("path");
    if (c.path.empty()) n.fail("path", "must not be empty");
  }
  n.finish();
  return c;
}

DataConfig DataConfig::from_yaml(const config::Node& n) {
  DataConfig c;
  if (!n.has("train")) n.fail("train", "missing; expected a source such as {kind: text, path: train.txt}");
  c.train = DataSourceConfig::from_yaml(n.child("train"));
  if (n.has("val")) {
    c.val = DataSourceConfig::from_yaml(n.child("val"));
    if (n.has("val_fraction")) n.fail("val_fraction", "applies only when data.val is absent");
  } else {
    c.val_fraction = n.get_double("val_fraction", c.val_fraction, 0.0, 0.9);
  }
  c.across_sites = n.get_choice("across_sites", c.across_sites, {"disjoint", "identical"});
  c.windows = n.get_choice("windows", c.windows, {"aligned", "random"});
  if (c.windows == "random" && c.train.kind == DataSourceConfig::Kind::Synthetic)
    n.fail("windows",
           "random shifts windows within a token stream (text or shards); synthetic windows are "
           "independent draws of the chain already: use aligned");
  n.finish();
  return c;
}

}  // namespace geoloco::trainer
